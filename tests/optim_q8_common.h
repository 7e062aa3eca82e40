/* optim_q8_common.h - what the 8-bit optimizer-state tests share (test_optim_q8.c: the dynamic
 * map, test_optim_q8f.c: the float map): a random 8-bit state in an optimizer's buffers, the
 * reference step from it (decode, float AdamW with the engine's folded constants, the new
 * block absmax), and the resume property (state buffers copied at step 6 continue the run bit
 * for bit). Included by one test program each (everything is static). */
#ifndef STRATA_OPTIM_Q8_COMMON_H
#define STRATA_OPTIM_Q8_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "strata/optim.h"

/* An 8-bit optimizer's state buffers: codes of m and v (qb bytes each), the absmax of each of
 * nblocks blocks of 256. */
typedef struct q8_state {
    uint8_t *qm, *qv;
    float *am, *av;
    size_t qb, nblocks;
} q8_state;

/* o's state buffers filled from r: random codes, absmax uniform in [0, 0.01) for m and
 * [0, 1e-4) for v. */
static q8_state q8_state_random(st_optim *o, st_rng *r) {
    q8_state s;
    size_t ab;
    s.qm = st_optim_state_buffer(o, 0, &s.qb);
    s.qv = st_optim_state_buffer(o, 1, &s.qb);
    s.am = st_optim_state_buffer(o, 2, &ab);
    s.av = st_optim_state_buffer(o, 3, &ab);
    s.nblocks = ab / 4;
    for (size_t i = 0; i < s.qb; i++) { s.qm[i] = (uint8_t)st_rng_u64(r); s.qv[i] = (uint8_t)st_rng_u64(r); }
    for (size_t b = 0; b < s.nblocks; b++) { s.am[b] = 0.01f * st_rng_uniform(r); s.av[b] = 1e-4f * st_rng_uniform(r); }
    return s;
}

/* The step the engine must take from state s over n parameters pr (updated in place) with
 * gradients g: lr 1e-3, betas 0.9 / 0.95, eps 1e-8, step 7, weight decay 0.1; cs and cu the
 * signed and unsigned maps' 256 codes. mr, vr: the new moments before requantisation; amr,
 * avr: the new absmax of each block. */
static void q8_reference_step(const q8_state *s, size_t n, const float *cs, const float *cu, const float *g,
                              float *pr, float *mr, float *vr, float *amr, float *avr) {
    /* the engine's folded constants (adamw_kernels.h), computed in double */
    float c1 = (float)(1.0 - (double)0.9f), c2 = (float)(1.0 - (double)0.95f);
    double bc1 = 1.0 - pow(0.9f, 7), bc2 = 1.0 - pow(0.95f, 7);
    float sd = (float)(bc1 / sqrt(bc2)), epsd = (float)(bc1 * 1e-8f);
    for (size_t b = 0; b < s->nblocks; b++) {
        amr[b] = avr[b] = 0;
        for (size_t i = b * 256; i < n && i < (b + 1) * 256; i++) {
            float m = cs[s->qm[i]] * s->am[b], v = cu[s->qv[i]] * s->av[b], gi = g[i];
            m = fmaf(c1, gi, 0.9f * m);
            v = fmaf(c2 * gi, gi, 0.95f * v);
            pr[i] = fmaf(-1e-3f, fmaf(0.1f, pr[i], m / fmaf(sqrtf(v), sd, epsd)), pr[i]);
            mr[i] = m;
            vr[i] = v;
            amr[b] = fmaxf(amr[b], fabsf(m));
            avr[b] = fmaxf(avr[b], v);
        }
    }
}

/* 10 steps of an optimizer in format fmt, and a second one given the first's state buffers
 * (and parameters) after step 5 that takes steps 6 to 10: 1 when their parameters end equal. */
static int q8_resume_same(st_optim_state_format fmt) {
    st_err err = {0};
    st_optim_segment segs[2] = {{.offset = 0, .n = 3000, .weight_decay = 0.1f}, {.offset = 3000, .n = 1234, .weight_decay = 0.0f}};
    size_t n = 4234, bytes;
    st_optim *a, *b;
    st_optim_create(&a, segs, 2, fmt, &err);
    st_optim_create(&b, segs, 2, fmt, &err);
    float *p = malloc(n * 4), *ps = malloc(n * 4), *grads = malloc(10 * n * 4);
    st_rng r;
    st_rng_seed(&r, 17);
    for (size_t i = 0; i < n; i++) p[i] = st_rng_normal(&r);
    for (size_t i = 0; i < 10 * n; i++) grads[i] = st_rng_normal(&r);
    for (int s = 1; s <= 10; s++) {
        if (s == 6) {
            memcpy(ps, p, n * 4);
            for (int i = 0; i < st_optim_state_count(a); i++) {
                void *src = st_optim_state_buffer(a, i, &bytes), *dst = st_optim_state_buffer(b, i, &bytes);
                memcpy(dst, src, bytes);
            }
        }
        st_adamw_params hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = s, .grad_scale = 1.0f};
        st_optim_step(a, p, grads + (size_t)(s - 1) * n, &hp);
        if (s >= 6) st_optim_step(b, ps, grads + (size_t)(s - 1) * n, &hp);
    }
    int same = memcmp(p, ps, n * 4) == 0;
    st_optim_free(a);
    st_optim_free(b);
    free(p); free(ps); free(grads);
    return same;
}

#endif
