/* test_optim_q8.c - the 8-bit blockwise state format and the 8-bit AdamW step.
 *
 * - The maps hold bitsandbytes' dynamic-map values, rebuilt here independently in double
 *   the way its create_dynamic_map describes them (midpoints of linspace(0.1, 1) per decade).
 * - Quantisation picks the nearest code (brute force over all 256), and every block's
 *   error is within the documented bound st_optim_q8_max_error * absmax.
 * - One 8-bit step equals an independent reference (decode table, float AdamW, brute-force
 *   nearest requantisation); state buffers restore a run bit-exactly; 8-bit training on a
 *   noisy least-squares problem reduces the loss nearly as much as fp32; state bytes per parameter.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optim_q8_common.h"
#include "strata/optim.h"
#include "testutil.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* bitsandbytes' create_dynamic_map(signed, max_exponent_bits=7, total_bits=8), sorted. */
static void bnb_map(int is_signed, double out[256]) {
    int k = 0;
    for (int i = 0; i < 7; i++) {
        int items = is_signed ? (1 << i) + 1 : (1 << (i + 1)) + 1; /* linspace points */
        for (int j = 0; j + 1 < items; j++) {
            double lo = 0.1 + 0.9 * j / (items - 1), hi = 0.1 + 0.9 * (j + 1) / (items - 1);
            double mean = pow(10.0, i - 6) * (lo + hi) / 2;
            out[k++] = mean;
            if (is_signed) out[k++] = -mean;
        }
    }
    out[k++] = 0;
    out[k++] = 1;
    qsort(out, 256, sizeof(double), cmp_double);
}

static void check_maps(void) {
    for (int s = 0; s < 2; s++) {
        double ref[256], ours[256];
        float code[256];
        bnb_map(s, ref);
        st_optim_q8_map(s, code);
        for (int i = 0; i < 256; i++) ours[i] = code[i];
        qsort(ours, 256, sizeof(double), cmp_double);
        double worst = 0;
        for (int i = 0; i < 256; i++) {
            double e = fabs(ours[i] - ref[i]) / (fabs(ref[i]) > 0 ? fabs(ref[i]) : 1);
            if (e > worst) worst = e;
        }
        CHECK(worst < 3e-7, "%s map differs from bitsandbytes' by %.3e relative", s ? "signed" : "unsigned", worst);
        double bound = st_optim_q8_max_error(s);
        printf("%s map: 256 codes match bitsandbytes (worst %.1e relative); max error %.6f x absmax\n",
               s ? "signed" : "unsigned", worst, bound);
        CHECK(bound <= (s ? 0.00704 : 0.00352), "documented bound %.6f", bound);
    }
}

static float sample(st_rng *r, int kind) {
    switch (kind) {
    case 0: return st_rng_normal(r);
    case 1: return st_rng_normal(r) * powf(10.0f, -9.0f * st_rng_uniform(r)); /* log-uniform magnitudes */
    case 2: return st_rng_uniform(r) < 0.3f ? 0.0f : st_rng_normal(r) * 1e-3f;
    default: return (st_rng_uniform(r) < 0.5f ? -1.0f : 1.0f) * (1.0f + 0.01f * st_rng_uniform(r)); /* near +-absmax */
    }
}

static void check_quant(void) {
    st_rng r;
    st_rng_seed(&r, 21);
    for (int s = 0; s < 2; s++) {
        float code[256];
        st_optim_q8_map(s, code);
        double bound = st_optim_q8_max_error(s);
        long not_nearest = 0, over_bound = 0, blocks = 0;
        for (int kind = 0; kind < 4; kind++)
            for (int rep = 0; rep < 200; rep++) {
                size_t n = rep % 5 == 0 ? 1 + rep % 256 : 256;
                float x[256], y[256];
                uint8_t q[256];
                for (size_t i = 0; i < n; i++) {
                    x[i] = sample(&r, kind);
                    if (!s) x[i] = fabsf(x[i]);
                }
                float amax = st_optim_q8_quantize_block(x, n, s, q);
                st_optim_q8_dequantize_block(q, n, amax, s, y);
                blocks++;
                double worst = 0;
                for (size_t i = 0; i < n; i++) {
                    double err = fabs((double)y[i] - x[i]);
                    if (err > worst) worst = err;
                    /* the best any code could do (negatives cannot use +1) */
                    double best = INFINITY;
                    for (int c = 0; c < 256; c++) {
                        if (x[i] < 0 && code[c] > 0) continue;
                        if (x[i] > 0 && code[c] < 0) continue;
                        double e = fabs((double)code[c] * amax - x[i]);
                        if (e < best) best = e;
                    }
                    if (err > best + 2e-7 * amax) not_nearest++;
                }
                if (worst > (bound + 3e-7) * amax) over_bound++; /* + float rounding of a and of code * absmax */
            }
        printf("%s: %ld blocks, %ld elements not rounded to the nearest code, %ld blocks over the bound\n",
               s ? "signed" : "unsigned", blocks, not_nearest, over_bound);
        CHECK(not_nearest == 0, "%ld elements not rounded to nearest", not_nearest);
        CHECK(over_bound == 0, "%ld blocks exceed the documented error bound", over_bound);
    }
}

/* One 8-bit step from a random 8-bit state against an independent reference. */
static void check_step_reference(void) {
    st_err err = {0};
    size_t n = 256 * 9 + 77;
    st_optim_segment seg = {.offset = 0, .n = n, .weight_decay = 0.1f};
    st_optim *o;
    CHECK(st_optim_create(&o, &seg, 1, ST_OPTIM_STATE_8BIT, &err) == ST_OK, "create: %s", err.msg);
    st_rng r;
    st_rng_seed(&r, 3);
    q8_state q = q8_state_random(o, &r);
    uint8_t *qm = q.qm, *qv = q.qv;
    float *am = q.am, *av = q.av;
    CHECK(q.nblocks == 10 && q.qb == 2560, "layout: %zu blocks, %zu bytes", q.nblocks, q.qb);
    float *p = malloc(n * 4), *g = malloc(n * 4), *pr = malloc(n * 4);
    for (size_t i = 0; i < n; i++) { pr[i] = p[i] = st_rng_normal(&r); g[i] = 0.01f * st_rng_normal(&r); }
    float cs[256], cu[256];
    st_optim_q8_map(1, cs);
    st_optim_q8_map(0, cu);
    /* the reference, from the state before the step */
    st_adamw_params hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = 7, .grad_scale = 1.0f};
    float *mr = malloc(n * 4), *vr = malloc(n * 4), amr[10], avr[10];
    q8_reference_step(&q, n, cs, cu, g, pr, mr, vr, amr, avr);
    st_optim_step_args a = {.params = p, .grads = g, .grad_dtype = ST_F32, .grad_sumsq = -1};
    CHECK(st_optim_step_ex(o, &a, &hp, &err) == ST_OK, "step: %s", err.msg);
    CHECK(memcmp(p, pr, n * 4) == 0, "8-bit step params differ from the reference");
    CHECK(memcmp(am, amr, sizeof amr) == 0 && memcmp(av, avr, sizeof avr) == 0, "absmax differs from the reference");
    long far = 0;
    for (size_t i = 0; i < n; i++) {
        size_t b = i / 256;
        double em = fabs(cs[qm[i]] * (double)amr[b] - mr[i]), ev = fabs(cu[qv[i]] * (double)avr[b] - vr[i]);
        double bm = INFINITY, bv = INFINITY;
        for (int c = 0; c < 256; c++) {
            if (!(mr[i] < 0 && cs[c] > 0) && !(mr[i] > 0 && cs[c] < 0)) bm = fmin(bm, fabs(cs[c] * (double)amr[b] - mr[i]));
            bv = fmin(bv, fabs(cu[c] * (double)avr[b] - vr[i]));
        }
        far += em > bm + 2e-7 * amr[b];
        far += ev > bv + 2e-7 * avr[b];
    }
    CHECK(far == 0, "%ld moments not requantised to the nearest code", far);
    CHECK(st_optim_state_bytes_per_param(o) < 2.25, "8-bit state bytes per parameter %.3f", st_optim_state_bytes_per_param(o));
    st_optim_free(o);
    free(p); free(g); free(pr); free(mr); free(vr);
}

/* Noisy least squares: minimise 0.5 |A x - y|^2 with minibatch-like gradient noise. */
static double train(st_optim_state_format fmt, int steps, float *x_out, size_t dim) {
    st_err err = {0};
    st_optim_segment segs[2] = {{.offset = 0, .n = dim / 2, .weight_decay = 0.0f}, {.offset = dim / 2, .n = dim - dim / 2, .weight_decay = 0.01f}};
    st_optim *o;
    st_optim_create(&o, segs, 2, fmt, &err);
    float *x = malloc(dim * 4), *target = malloc(dim * 4);
    uint16_t *g = malloc(dim * 2), *w = malloc(dim * 2);
    st_rng r;
    st_rng_seed(&r, 2024);
    for (size_t i = 0; i < dim; i++) { x[i] = 0.02f * st_rng_normal(&r); target[i] = 0.5f * st_rng_normal(&r); }
    double loss = 0;
    for (int s = 1; s <= steps; s++) {
        loss = 0;
        for (size_t i = 0; i < dim; i++) {
            double d = x[i] - target[i];
            loss += 0.5 * d * d / (double)dim;
            float curv = 0.5f + (float)(i % 5); /* per-coordinate curvature */
            g[i] = st_f32_to_bf16(curv * (float)d + 0.3f * st_rng_normal(&r));
        }
        float lr = 1e-2f * 0.5f * (1.0f + cosf(3.14159265f * (float)(s - 1) / (float)steps)); /* cosine to 0 */
        st_adamw_params hp = {.lr = lr, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = s, .grad_scale = 1.0f};
        st_optim_step_args a = {.params = x, .grads = g, .grad_dtype = ST_BF16, .work = w, .work_dtype = ST_BF16,
                             .grad_sumsq = -1};
        st_optim_step_ex(o, &a, &hp, &err);
    }
    if (x_out) memcpy(x_out, x, dim * 4);
    st_optim_free(o);
    free(x); free(target); free(g); free(w);
    return loss;
}

static void check_training(void) {
    size_t dim = 20000;
    double l32 = train(ST_OPTIM_STATE_F32, 300, NULL, dim), l8 = train(ST_OPTIM_STATE_8BIT, 300, NULL, dim);
    double l0 = train(ST_OPTIM_STATE_F32, 1, NULL, dim);
    printf("noisy least squares, 300 steps: start %.5f, fp32 states %.5f, 8-bit states %.5f (%.2f%%)\n", l0, l32,
           l8, 100 * (l8 - l32) / l32);
    CHECK(l32 < 0.1 * l0, "fp32 training reduced the loss: %.4f -> %.4f", l0, l32);
    /* This problem has no irreducible loss, so it ends at the optimiser's own noise floor,
     * where 8-bit moments (a few % relative error each) show most; the language-model
     * criterion (final loss within 2%) is checked on the tiny model by the training tests.
     * Here: 8-bit states achieve at least 98% of fp32 states' loss reduction. */
    CHECK(l0 - l8 >= 0.98 * (l0 - l32), "8-bit loss reduction %.5f below 98%% of fp32's %.5f", l0 - l8, l0 - l32);
}

/* Save the state buffers at step 5, continue to 10; restore into a fresh optimizer, same bits. */
static void check_resume(void) {
    for (int f = 0; f < 2; f++)
        CHECK(q8_resume_same(f ? ST_OPTIM_STATE_8BIT : ST_OPTIM_STATE_F32),
              "format %d: a run restored from its state buffers diverges", f);
}

int main(void) {
    check_maps();
    check_quant();
    check_step_reference();
    check_resume();
    check_training();
    return test_finish("optim_q8");
}
