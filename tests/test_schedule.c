/* test_schedule.c - the learning-rate schedules (strata/schedule.h) against fp64 formulas
 * written here: the cosine is the same bits as the formula strata trained with before
 * schedules were a key (its copy below), WSD's three decay shapes, a decay started early,
 * the keys' refusals. */
#include <math.h>
#include <string.h>

#include "strata/schedule.h"
#include "strata/train.h"
#include "testutil.h"

/* the learning rate of strata before schedule.c, verbatim in its arithmetic */
static double old_cosine(double lr, double min_lr_frac, long steps, long warmup, long step) {
    if (warmup > 0 && step <= warmup) return lr * (double)step / (double)warmup;
    long decay = steps - warmup;
    if (decay <= 0) return lr;
    double progress = (double)(step - warmup) / (double)decay;
    if (progress > 1) progress = 1;
    double min_lr = lr * min_lr_frac;
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + cos(M_PI * progress));
}

/* WSD from its definition: warmup, lr until b, then the shape to min over d steps */
static double ref_wsd(int shape, double lr, double mf, long warmup, long b, long d, long step) {
    if (step <= warmup) return lr * step / (double)warmup;
    if (step <= b) return lr;
    double p = fmin(1.0, (step - b) / (double)d), f = shape == 0 ? 1 - p : shape == 1 ? 1 - sqrt(p) : (1 + cos(M_PI * p)) / 2;
    return lr * mf + (lr - lr * mf) * f;
}

int main(void) {
    st_err err = {0};
    st_schedule sc;
    /* cosine: the default configuration's learning rates, bit for bit, through the config */
    st_train_config c;
    st_train_config_defaults(&c);
    CHECK(!strcmp(c.schedule, "cosine"), "default schedule %s", c.schedule);
    long bad = 0;
    for (long s = 0; s <= c.steps + 5; s++) {
        double a = st_train_lr_at(&c, s), b = old_cosine(c.lr, c.min_lr_frac, c.steps, c.warmup_steps, s);
        if (memcmp(&a, &b, sizeof a)) bad++;
    }
    CHECK(bad == 0, "%ld cosine learning rates differ from the old formula's bits", bad);
    /* other cosine shapes: no warmup, warmup == steps */
    long cases[][2] = {{100, 0}, {50, 50}, {7, 3}, {1000, 100}};
    for (int k = 0; k < 4; k++) {
        CHECK(!st_schedule_init(&sc, "cosine", "1-sqrt", 1e-3, 0.05, 0.2, cases[k][0], cases[k][1], &err), "%s", err.msg);
        for (long s = 1; s <= cases[k][0]; s++) {
            double a = st_schedule_lr_at(&sc, s), b = old_cosine(1e-3, 0.05, cases[k][0], cases[k][1], s);
            if (memcmp(&a, &b, sizeof a)) bad++;
        }
    }
    CHECK(bad == 0, "%ld cosine learning rates differ", bad);

    /* wsd: each shape against the reference; planned decay: 400 steps, 20% -> 80 steps after 320 */
    const char *shapes[] = {"linear", "1-sqrt", "cosine"};
    for (int sh = 0; sh < 3; sh++) {
        CHECK(!st_schedule_init(&sc, "wsd", shapes[sh], 3e-3, 0.1, 0.2, 400, 20, &err), "%s", err.msg);
        CHECK(st_schedule_decay_steps(&sc) == 80 && st_schedule_decay_begin(&sc) == 320 && st_schedule_end(&sc) == 400,
              "%s: decay %ld begin %ld end %ld", shapes[sh], st_schedule_decay_steps(&sc), st_schedule_decay_begin(&sc),
              st_schedule_end(&sc));
        double worst = 0;
        for (long s = 1; s <= 400; s++)
            worst = fmax(worst, fabs(st_schedule_lr_at(&sc, s) - ref_wsd(sh, 3e-3, 0.1, 20, 320, 80, s)));
        CHECK(worst < 1e-15, "%s: worst difference %g", shapes[sh], worst);
        CHECK(st_schedule_lr_at(&sc, 320) == 3e-3 && fabs(st_schedule_lr_at(&sc, 400) - 3e-4) < 1e-18,
              "%s: stable end %g, final %g", shapes[sh], st_schedule_lr_at(&sc, 320), st_schedule_lr_at(&sc, 400));
        /* the decay started early, after step 150: 80 steps, the run ends at 230 */
        sc.decay_start = 150;
        CHECK(st_schedule_end(&sc) == 230 && st_schedule_decay_begin(&sc) == 150, "early end %ld", st_schedule_end(&sc));
        worst = 0;
        for (long s = 1; s <= 260; s++)
            worst = fmax(worst, fabs(st_schedule_lr_at(&sc, s) - ref_wsd(sh, 3e-3, 0.1, 20, 150, 80, s)));
        CHECK(worst < 1e-15, "%s early: worst difference %g", shapes[sh], worst);
    }
    /* 1-sqrt falls faster than linear at the start of the decay */
    st_schedule lin, sq;
    st_schedule_init(&lin, "wsd", "linear", 1, 0, 0.5, 100, 0, &err);
    st_schedule_init(&sq, "wsd", "1-sqrt", 1, 0, 0.5, 100, 0, &err);
    CHECK(st_schedule_lr_at(&sq, 55) < st_schedule_lr_at(&lin, 55), "1-sqrt %g linear %g", st_schedule_lr_at(&sq, 55),
          st_schedule_lr_at(&lin, 55));
    /* constant */
    CHECK(!st_schedule_init(&sc, "constant", "linear", 2e-3, 0.1, 0.2, 100, 10, &err), "%s", err.msg);
    CHECK(st_schedule_lr_at(&sc, 5) == 1e-3 && st_schedule_lr_at(&sc, 11) == 2e-3 && st_schedule_lr_at(&sc, 100) == 2e-3,
          "constant");
    /* the config's keys: wsd through st_train_lr_at */
    CHECK(!st_train_config_set(&c, "schedule", "wsd", &err) && !st_train_config_set(&c, "decay_frac", "0.25", &err) &&
              !st_train_config_set(&c, "decay_shape", "cosine", &err), "%s", err.msg);
    CHECK(st_train_lr_at(&c, 300) == c.lr && st_train_lr_at(&c, 400) < c.lr * 0.100001, "wsd by key: %g %g",
          st_train_lr_at(&c, 300), st_train_lr_at(&c, 400));

    /* refusals, each naming its key */
    struct { const char *kind, *shape; double frac; long steps, warmup; const char *key; } bads[] = {
        {"cosin", "linear", 0.2, 100, 0, "'schedule'"},   {"", "linear", 0.2, 100, 0, "'schedule'"},
        {"wsd", "sqrt", 0.2, 100, 0, "'decay_shape'"},    {"wsd", "linear", 0, 100, 0, "'decay_frac'"},
        {"wsd", "linear", NAN, 100, 0, "'decay_frac'"},   {"wsd", "linear", 1.5, 100, 0, "'decay_frac'"},
        {"wsd", "linear", 0.5, 100, 60, "'warmup_steps'"},
    };
    for (size_t i = 0; i < sizeof bads / sizeof bads[0]; i++) {
        err.msg[0] = 0;
        st_status s = st_schedule_init(&sc, bads[i].kind, bads[i].shape, 1e-3, 0.1, bads[i].frac, bads[i].steps,
                                       bads[i].warmup, &err);
        CHECK(s != ST_OK && strstr(err.msg, bads[i].key), "case %zu: status %d, '%s' lacks %s", i, s, err.msg,
              bads[i].key);
    }
    CHECK(st_train_config_set(&c, "schedule", "warmup", &err) == ST_OK, "a string key is set as text");
    CHECK(st_train_config_resolve(&c, NULL, &err) != ST_OK && strstr(err.msg, "'schedule'"), "resolve: %s", err.msg);
    return test_finish("schedule");
}
