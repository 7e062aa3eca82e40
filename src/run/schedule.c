/* schedule.c - the learning-rate schedules (strata/schedule.h): cosine, WSD with a decay
 * that can start at any step, constant. The cosine is the formula strata trained with
 * before schedules were a key, operation for operation, so its learning rates are the
 * same bits. */
#include "strata/schedule.h"

#include <math.h>
#include <string.h>

static const char *kind_names[] = {"cosine", "wsd", "constant"};
static const char *shape_names[] = {"linear", "1-sqrt", "cosine"};

st_status st_schedule_kind_parse(const char *name, st_schedule_kind *out, st_err *err) {
    for (int i = 0; i < 3; i++)
        if (name && !strcmp(name, kind_names[i])) {
            *out = (st_schedule_kind)i;
            return ST_OK;
        }
    return st_errf(err, ST_ERR_INVALID, "key 'schedule': '%s' is not cosine, wsd or constant", name ? name : "");
}

st_status st_schedule_shape_parse(const char *name, st_decay_shape *out, st_err *err) {
    for (int i = 0; i < 3; i++)
        if (name && !strcmp(name, shape_names[i])) {
            *out = (st_decay_shape)i;
            return ST_OK;
        }
    return st_errf(err, ST_ERR_INVALID, "key 'decay_shape': '%s' is not linear, 1-sqrt or cosine", name ? name : "");
}

const char *st_schedule_kind_name(st_schedule_kind k) { return (unsigned)k < 3 ? kind_names[k] : "?"; }
const char *st_schedule_shape_name(st_decay_shape s) { return (unsigned)s < 3 ? shape_names[s] : "?"; }

st_status st_schedule_init(st_schedule *sc, const char *kind, const char *shape, double lr, double min_lr_frac,
                           double decay_frac, long steps, long warmup_steps, st_err *err) {
    memset(sc, 0, sizeof *sc);
    st_status s = st_schedule_kind_parse(kind, &sc->kind, err);
    if (!s) s = st_schedule_shape_parse(shape, &sc->shape, err);
    if (s) return s;
    sc->lr = lr;
    sc->min_lr_frac = min_lr_frac;
    sc->decay_frac = decay_frac;
    sc->steps = steps;
    sc->warmup_steps = warmup_steps;
    if (!(lr >= 0) || !isfinite(lr)) return st_errf(err, ST_ERR_INVALID, "key 'lr': %g is not a learning rate", lr);
    if (!(min_lr_frac >= 0 && min_lr_frac <= 1))
        return st_errf(err, ST_ERR_INVALID, "key 'min_lr_frac': %g is not within [0, 1]", min_lr_frac);
    if (sc->kind == ST_SCHEDULE_WSD) {
        if (!(decay_frac > 0 && decay_frac <= 1))
            return st_errf(err, ST_ERR_INVALID, "key 'decay_frac': %g is not within (0, 1]: the WSD decay's length as a "
                           "fraction of steps (for example 0.2)", decay_frac);
        if (warmup_steps + st_schedule_decay_steps(sc) > steps)
            return st_errf(err, ST_ERR_INVALID, "key 'decay_frac': the WSD decay's %ld steps and key 'warmup_steps' %ld "
                           "exceed key 'steps' %ld; lower decay_frac or warmup_steps", st_schedule_decay_steps(sc),
                           warmup_steps, steps);
    }
    return ST_OK;
}

long st_schedule_decay_steps(const st_schedule *sc) {
    if (sc->kind != ST_SCHEDULE_WSD) return 0;
    long d = lround(sc->decay_frac * (double)sc->steps);
    return d < 1 ? 1 : d;
}

long st_schedule_decay_begin(const st_schedule *sc) {
    if (sc->kind != ST_SCHEDULE_WSD) return sc->steps;
    return sc->decay_start > 0 ? sc->decay_start : sc->steps - st_schedule_decay_steps(sc);
}

long st_schedule_end(const st_schedule *sc) {
    if (sc->kind != ST_SCHEDULE_WSD || sc->decay_start <= 0) return sc->steps;
    return sc->decay_start + st_schedule_decay_steps(sc);
}

/* wsd's decay factor at progress p in [0, 1]: 1 at the start, 0 at the end */
static double decay_factor(st_decay_shape shape, double p) {
    switch (shape) {
    case ST_DECAY_1_SQRT: return 1.0 - sqrt(p);
    case ST_DECAY_COSINE: return 0.5 * (1.0 + cos(M_PI * p));
    default: return 1.0 - p;
    }
}

double st_schedule_lr_at(const st_schedule *sc, long step) {
    if (sc->warmup_steps > 0 && step <= sc->warmup_steps) return sc->lr * (double)step / (double)sc->warmup_steps;
    double min_lr = sc->lr * sc->min_lr_frac;
    if (sc->kind == ST_SCHEDULE_CONSTANT) return sc->lr;
    if (sc->kind == ST_SCHEDULE_WSD) {
        long b = st_schedule_decay_begin(sc), d = st_schedule_decay_steps(sc);
        if (step <= b) return sc->lr;
        double p = (double)(step - b) / (double)d;
        if (p > 1) p = 1;
        return min_lr + (sc->lr - min_lr) * decay_factor(sc->shape, p);
    }
    /* cosine: the expression order of the formula before this file, for the same bits */
    long decay = sc->steps - sc->warmup_steps;
    if (decay <= 0) return sc->lr;
    double progress = (double)(step - sc->warmup_steps) / (double)decay;
    if (progress > 1) progress = 1;
    return min_lr + 0.5 * (sc->lr - min_lr) * (1.0 + cos(M_PI * progress));
}
