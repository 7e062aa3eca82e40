/* test_optim_lr_class.c - the optimizer's two learning-rate classes (method poetx's Q at
 * poetx_lr, the rest at lr) and st_optim_reset_class (Adam restarted for Q at a merge).
 *
 * - f32 state: 50 steps over four segments, two of each class, each with its own weight decay,
 *   against AdamW in double with the segment's class's rate (lr or lr2): parameters within 1e-5
 *   relative (to |p| + 0.1, the steps' scale) of the double trajectory;
 * - every state format (f32, 8bit, 8bit-fp): lr2 = 0 leaves every second-class element as it
 *   was, bit for bit, while every first-class one moves; lr = 0 the other way round;
 * - st_optim_reset_class(1) after 7 steps: the next step's second-class elements equal a fresh
 *   optimizer's first step from the same parameters (zero moments, the same step number),
 *   bit for bit, and its first-class elements equal the unreset optimizer's, bit for bit;
 *   the count of elements reset is the second class's;
 * - a segment of class 2 or -1 refused at create; reset of class 5 and of an unbound
 *   optimizer refused.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "strata/optim.h"
#include "testutil.h"

#define N 3000
/* embeddings-like (decay), a bias (no decay), then two "Q" segments (no decay / some) */
static const st_optim_segment SEGS[4] = {
    {.offset = 0, .n = 1100, .weight_decay = 0.1f, .lr_class = ST_OPTIM_LR_MAIN},
    {.offset = 1100, .n = 300, .weight_decay = 0.0f, .lr_class = ST_OPTIM_LR_MAIN},
    {.offset = 1400, .n = 1000, .weight_decay = 0.0f, .lr_class = ST_OPTIM_LR_SECOND},
    {.offset = 2400, .n = 600, .weight_decay = 0.05f, .lr_class = ST_OPTIM_LR_SECOND}};
#define N_SECOND 1600

static const st_optim_segment *seg_of(size_t i) {
    for (int s = 0; s < 4; s++)
        if (i >= SEGS[s].offset && i < SEGS[s].offset + SEGS[s].n) return &SEGS[s];
    return NULL;
}

static void rand_fill(st_rng *r, float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = scale * st_rng_normal(r);
}

static st_adamw_params hp_at(long step, float lr, float lr2) {
    return (st_adamw_params){.lr = lr, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = step, .grad_scale = 1.0f,
                             .lr2 = lr2};
}

/* AdamW in double, each element at its segment's class's rate. */
static void ref_step(double *p, double *m, double *v, const float *g, const st_adamw_params *hp) {
    double b1 = hp->beta1, b2 = hp->beta2, bc1 = 1 - pow(b1, (double)hp->step), bc2 = 1 - pow(b2, (double)hp->step);
    for (size_t i = 0; i < N; i++) {
        const st_optim_segment *sg = seg_of(i);
        double lr = sg->lr_class == ST_OPTIM_LR_SECOND ? hp->lr2 : hp->lr, gi = g[i];
        m[i] = b1 * m[i] + (1 - b1) * gi;
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        double u = (m[i] / bc1) / (sqrt(v[i] / bc2) + (double)hp->eps);
        p[i] -= lr * (u + sg->weight_decay * p[i]);
    }
}

static void check_against_double(void) {
    st_err err = {0};
    st_optim *o = NULL;
    CHECK(st_optim_create(&o, SEGS, 4, ST_OPTIM_STATE_F32, &err) == ST_OK, "create: %s", err.msg);
    if (!o) return;
    float *p = malloc(N * 4), *g = malloc(N * 4);
    double *pd = malloc(N * 8), *md = calloc(N, 8), *vd = calloc(N, 8);
    st_rng r;
    st_rng_seed(&r, 11);
    rand_fill(&r, p, N, 0.5f);
    for (size_t i = 0; i < N; i++) pd[i] = p[i];
    for (long step = 1; step <= 50; step++) {
        rand_fill(&r, g, N, 0.1f);
        st_adamw_params hp = hp_at(step, 1e-3f, 3e-2f); /* Q's rate 30x the rest's */
        st_optim_step(o, p, g, &hp);
        ref_step(pd, md, vd, g, &hp);
    }
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < N; i++) {
        double e = fabs(p[i] - pd[i]) / (fabs(pd[i]) + 0.1); /* 0.1: the scale of the steps taken, near a zero crossing */
        if (e > worst) worst = e, at = i;
    }
    CHECK(worst < 1e-5, "50 steps with two rates: element %zu (segment class %d) is %.9g, double %.9g (rel %.3g)",
          at, seg_of(at)->lr_class, p[at], pd[at], worst);
    /* the rates are not swapped: a second-class element moved ~30x as far as the first class's */
    double moved[2] = {0, 0};
    st_rng_seed(&r, 11);
    for (size_t i = 0; i < N; i++) {
        float p0 = 0.5f * st_rng_normal(&r);
        moved[seg_of(i)->lr_class] += fabs(p[i] - p0);
    }
    CHECK(moved[1] / N_SECOND > 10 * moved[0] / (N - N_SECOND), "mean movement: lr2 class %.4g, lr class %.4g",
          moved[1] / N_SECOND, moved[0] / (N - N_SECOND));
    free(p), free(g), free(pd), free(md), free(vd);
    st_optim_free(o);
}

/* One rate zero: that class's elements keep their bits, the other class's all move. */
static void check_zero_rate(st_optim_state_format fmt, int zero_class) {
    st_err err = {0};
    st_optim *o = NULL;
    CHECK(st_optim_create(&o, SEGS, 4, fmt, &err) == ST_OK, "create %s: %s", st_optim_state_name(fmt), err.msg);
    if (!o) return;
    float *p = malloc(N * 4), *p0 = malloc(N * 4), *g = malloc(N * 4);
    st_rng r;
    st_rng_seed(&r, 5);
    rand_fill(&r, p, N, 0.5f);
    memcpy(p0, p, N * 4);
    for (long step = 1; step <= 5; step++) {
        rand_fill(&r, g, N, 0.1f);
        st_adamw_params hp = hp_at(step, zero_class == 0 ? 0.0f : 1e-2f, zero_class == 1 ? 0.0f : 1e-2f);
        st_optim_step(o, p, g, &hp);
    }
    size_t kept_bad = 0, still = 0;
    for (size_t i = 0; i < N; i++) {
        int same = !memcmp(&p[i], &p0[i], 4);
        if (seg_of(i)->lr_class == zero_class) kept_bad += !same;
        else still += same;
    }
    CHECK(kept_bad == 0 && still == 0, "%s, class %d at rate 0: %zu of its elements changed, %zu of the other "
          "class's did not", st_optim_state_name(fmt), zero_class, kept_bad, still);
    free(p), free(p0), free(g);
    st_optim_free(o);
}

/* Reset of the second class after 7 steps against a fresh optimizer and an unreset one. */
static void check_reset(st_optim_state_format fmt) {
    st_err err = {0};
    st_optim *a = NULL, *b = NULL, *c = NULL;
    CHECK(st_optim_create(&a, SEGS, 4, fmt, &err) == ST_OK && st_optim_create(&b, SEGS, 4, fmt, &err) == ST_OK &&
          st_optim_create(&c, SEGS, 4, fmt, &err) == ST_OK, "create %s: %s", st_optim_state_name(fmt), err.msg);
    if (!a || !b || !c) goto out;
    float *pa = malloc(N * 4), *pc = malloc(N * 4), *pb = malloc(N * 4), *g = malloc(N * 4);
    st_rng r;
    st_rng_seed(&r, 9);
    rand_fill(&r, pa, N, 0.5f);
    for (long step = 1; step <= 7; step++) {
        rand_fill(&r, g, N, 0.1f);
        st_adamw_params hp = hp_at(step, 1e-3f, 1e-2f);
        st_optim_step(a, pa, g, &hp);
    }
    /* c: a's state without the reset (the same 7 steps replayed) */
    st_rng_seed(&r, 9);
    rand_fill(&r, pc, N, 0.5f);
    for (long step = 1; step <= 7; step++) {
        rand_fill(&r, g, N, 0.1f);
        st_adamw_params hp = hp_at(step, 1e-3f, 1e-2f);
        st_optim_step(c, pc, g, &hp);
    }
    size_t n_reset = 0;
    CHECK(st_optim_reset_class(a, ST_OPTIM_LR_SECOND, &n_reset, &err) == ST_OK && n_reset == N_SECOND,
          "%s: reset: %zu elements (want %d): %s", st_optim_state_name(fmt), n_reset, N_SECOND, err.msg);
    memcpy(pb, pa, N * 4);
    rand_fill(&r, g, N, 0.1f);
    st_adamw_params hp = hp_at(8, 1e-3f, 1e-2f);
    st_optim_step(a, pa, g, &hp);
    st_optim_step(b, pb, g, &hp); /* fresh moments everywhere, step 8's bias correction */
    st_optim_step(c, pc, g, &hp);
    size_t bad_second = 0, bad_first = 0, first_as_fresh = 0;
    for (size_t i = 0; i < N; i++) {
        if (seg_of(i)->lr_class == ST_OPTIM_LR_SECOND) bad_second += memcmp(&pa[i], &pb[i], 4) != 0;
        else bad_first += memcmp(&pa[i], &pc[i], 4) != 0, first_as_fresh += !memcmp(&pa[i], &pb[i], 4);
    }
    CHECK(bad_second == 0, "%s: after the reset %zu second-class elements differ from a fresh optimizer's step",
          st_optim_state_name(fmt), bad_second);
    CHECK(bad_first == 0, "%s: after the reset %zu first-class elements differ from the unreset optimizer's",
          st_optim_state_name(fmt), bad_first);
    CHECK(first_as_fresh < (N - N_SECOND) / 10, "%s: %zu first-class elements equal a fresh step (their moments "
          "should have been kept)", st_optim_state_name(fmt), first_as_fresh);
    free(pa), free(pb), free(pc), free(g);
out:
    st_optim_free(a);
    st_optim_free(b);
    st_optim_free(c);
}

static void check_refusals(void) {
    st_err err = {0};
    st_optim *o = NULL;
    st_optim_segment bad[2] = {{.offset = 0, .n = 10, .lr_class = 2}, {.offset = 10, .n = 10, .lr_class = -1}};
    CHECK(st_optim_create(&o, bad, 1, ST_OPTIM_STATE_F32, &err) == ST_ERR_INVALID && strstr(err.msg, "class 2") && !o,
          "class 2 refused: %s", err.msg);
    CHECK(st_optim_create(&o, bad + 1, 1, ST_OPTIM_STATE_8BIT, &err) == ST_ERR_INVALID && !o, "class -1 refused: %s",
          err.msg);
    CHECK(st_optim_create(&o, SEGS, 4, ST_OPTIM_STATE_F32, &err) == ST_OK, "create: %s", err.msg);
    if (o) CHECK(st_optim_reset_class(o, 5, NULL, &err) == ST_ERR_INVALID, "reset of class 5 refused: %s", err.msg);
    st_optim_free(o);
    o = NULL;
    CHECK(st_optim_create_unbound(&o, SEGS, 4, ST_OPTIM_STATE_F32, &err) == ST_OK, "create unbound: %s", err.msg);
    if (o) CHECK(st_optim_reset_class(o, 1, NULL, &err) == ST_ERR_INVALID, "reset unbound refused: %s", err.msg);
    st_optim_free(o);
}

int main(void) {
    check_against_double();
    st_optim_state_format fmts[3] = {ST_OPTIM_STATE_F32, ST_OPTIM_STATE_8BIT, ST_OPTIM_STATE_8BIT_FP};
    for (int f = 0; f < 3; f++) {
        check_zero_rate(fmts[f], 0);
        check_zero_rate(fmts[f], 1);
        check_reset(fmts[f]);
    }
    check_refusals();
    return test_finish("optim_lr_class");
}
