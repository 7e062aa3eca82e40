/* schedule.h - the learning-rate schedule: cosine (the default), warmup-stable-decay (WSD)
 * and constant, as one value a run computes every step's learning rate from.
 *
 * Example:
 *
 *     st_schedule sc;
 *     st_err err = {0};
 *     if (st_schedule_init(&sc, "wsd", "1-sqrt", 3e-3, 0.1, 0.2, 400, 20, &err)) return 1;
 *     double lr = st_schedule_lr_at(&sc, 100);   // the stable phase: 3e-3
 *     sc.decay_start = 200;                      // a stopping rule starts the decay after step 200
 *     long last = st_schedule_end(&sc);          // 280: the decay's 80 steps, then the end
 *     printf("lr %g, last step %ld\n", lr, last);
 *
 * End of example.
 *
 * Steps are 1-based (the first optimizer step is step 1). Every schedule warms up linearly
 * over warmup_steps (lr * step / warmup_steps). Then:
 *   cosine    min + (lr - min) * (1 + cos(pi * p)) / 2, p = (step - warmup) / (steps - warmup),
 *             held at min past steps (min = min_lr_frac * lr);
 *   wsd       lr until the decay begins after step b, then over D = decay steps
 *             min + (lr - min) * f((step - b) / D) with f linear 1 - p, 1-sqrt 1 - sqrt(p) or
 *             cosine (1 + cos(pi p)) / 2, and min after b + D. D = round(decay_frac * steps)
 *             (at least 1); b = steps - D as planned, or decay_start where a stopping rule
 *             moved it (the run then ends at decay_start + D);
 *   constant  lr after the warmup.
 */
#ifndef STRATA_SCHEDULE_H
#define STRATA_SCHEDULE_H

#include "strata/core.h"

typedef enum { ST_SCHEDULE_COSINE = 0, ST_SCHEDULE_WSD = 1, ST_SCHEDULE_CONSTANT = 2 } st_schedule_kind;
typedef enum { ST_DECAY_LINEAR = 0, ST_DECAY_1_SQRT = 1, ST_DECAY_COSINE = 2 } st_decay_shape;

typedef struct st_schedule {
    st_schedule_kind kind;
    st_decay_shape shape;  /* wsd's decay */
    double lr;             /* the peak learning rate */
    double min_lr_frac;    /* the final learning rate as a fraction of lr (cosine and wsd) */
    double decay_frac;     /* wsd: the decay's length as a fraction of steps */
    long steps;            /* the run's planned optimizer steps */
    long warmup_steps;
    long decay_start;      /* wsd: the decay begins after this step; 0: as planned (steps - D) */
} st_schedule;

/* Names as the keys give them: schedule cosine|wsd|constant, decay_shape linear|1-sqrt|cosine. */
st_status st_schedule_kind_parse(const char *name, st_schedule_kind *out, st_err *err);
st_status st_schedule_shape_parse(const char *name, st_decay_shape *out, st_err *err);
const char *st_schedule_kind_name(st_schedule_kind k);
const char *st_schedule_shape_name(st_decay_shape s);

/* A schedule from the keys' values, checked: the names, decay_frac in (0, 1] for wsd, the
 * warmup and the decay within steps. Each refusal names its key. */
st_status st_schedule_init(st_schedule *sc, const char *kind, const char *shape, double lr, double min_lr_frac,
                           double decay_frac, long steps, long warmup_steps, st_err *err);

/* wsd's decay length D in steps (0 for the other kinds). */
long st_schedule_decay_steps(const st_schedule *sc);
/* wsd: the last step before the decay (decay_start, or steps - D); the others: steps. */
long st_schedule_decay_begin(const st_schedule *sc);
/* The run's last step: steps, or decay_start + D where the decay was started early. */
long st_schedule_end(const st_schedule *sc);
/* The learning rate of step (1-based). */
double st_schedule_lr_at(const st_schedule *sc, long step);

#endif
