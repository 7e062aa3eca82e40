/* test_optim.c - the fp32-state AdamW engine against a double-precision reference.
 *
 * For each gradient dtype (f32, bf16, f16), 1000 steps on random data over three
 * segments with their own weight decay: after every step, the engine's parameters and
 * moments equal one double-precision AdamW step from the engine's previous state within
 * 1e-6 relative (relative to the size of the terms being combined, so cancellation near
 * zero is not mistaken for error); the working copy is the new master weight rounded
 * exactly as st_f32_to_bf16 / st_f32_to_f16 do. A free-running double trajectory bounds
 * the accumulated drift. Also: the legacy st_optim_step against st_adamw_ref_f32, the same bits
 * for 1 and 2 threads, a non-finite gradient skips the step with nothing written, the
 * segment range with per-range buffers, and the gradient sum of squares.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "strata/optim.h"
#include "testutil.h"

#define N_ELEMS 6000
static const st_optim_segment SEGS[3] = {{.offset = 0, .n = 2500, .weight_decay = 0.1f},
                                         {.offset = 2500, .n = 1499, .weight_decay = 0.0f},
                                         {.offset = 3999, .n = 2001, .weight_decay = 0.01f}};

static float rand_grad(st_rng *r) {
    /* magnitudes over four decades, so moments and the update span a wide range */
    return st_rng_normal(r) * powf(10.0f, 3.0f * st_rng_uniform(r) - 2.0f);
}

static void make_grad(st_rng *r, st_dtype dt, void *g, double *gd, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = rand_grad(r);
        if (dt == ST_BF16) { ((uint16_t *)g)[i] = st_f32_to_bf16(x); gd[i] = st_bf16_to_f32(((uint16_t *)g)[i]); }
        else if (dt == ST_F16) { ((uint16_t *)g)[i] = st_f32_to_f16(x); gd[i] = st_f16_to_f32(((uint16_t *)g)[i]); }
        else { ((float *)g)[i] = x; gd[i] = x; }
    }
}

static float seg_wd(size_t i) {
    for (int s = 0; s < 3; s++)
        if (i >= SEGS[s].offset && i < SEGS[s].offset + SEGS[s].n) return SEGS[s].weight_decay;
    return 0;
}

/* One AdamW step in double: the oracle. hp's float values are the specification. */
static void adamw_double(double *p, double *m, double *v, const double *g, size_t n, const st_adamw_params *hp,
                         double *scale_p, double *scale_m) {
    double b1 = hp->beta1, b2 = hp->beta2, bc1 = 1 - pow(b1, (double)hp->step), bc2 = 1 - pow(b2, (double)hp->step);
    for (size_t i = 0; i < n; i++) {
        double wd = seg_wd(i), gi = g[i] * (double)hp->grad_scale;
        double m1 = b1 * m[i] + (1 - b1) * gi, v1 = b2 * v[i] + (1 - b2) * gi * gi;
        double u = (m1 / bc1) / (sqrt(v1 / bc2) + (double)hp->eps);
        if (scale_m) scale_m[i] = fabs(b1 * m[i]) + fabs((1 - b1) * gi);
        if (scale_p) scale_p[i] = fabs(p[i]) + (double)hp->lr * (fabs(u) + wd * fabs(p[i]));
        p[i] = p[i] - (double)hp->lr * (u + wd * p[i]);
        m[i] = m1;
        v[i] = v1;
    }
}

static void run_dtype(st_dtype gdt, st_dtype wdt) {
    st_err err = {0};
    st_optim *o;
    CHECK(st_optim_create(&o, SEGS, 3, ST_OPTIM_STATE_F32, &err) == ST_OK, "create: %s", err.msg);
    size_t n = N_ELEMS, ms;
    float *p = malloc(n * 4), *w = malloc(n * 4);
    void *g = malloc(n * 4);
    double *gd = malloc(n * 8), *pd = malloc(n * 8), *md = malloc(n * 8), *vd = malloc(n * 8);
    double *fp = malloc(n * 8), *fm = calloc(n, 8), *fv = calloc(n, 8); /* free-running trajectory */
    double *sp = malloc(n * 8), *sm = malloc(n * 8);
    float *m = st_optim_state_buffer(o, 0, &ms), *v = st_optim_state_buffer(o, 1, &ms);
    st_rng r;
    st_rng_seed(&r, 1234 + (uint64_t)gdt);
    for (size_t i = 0; i < n; i++) fp[i] = p[i] = st_rng_normal(&r);
    double worst_p = 0, worst_m = 0, worst_v = 0;
    long bad_work = 0;
    for (long step = 1; step <= 1000; step++) {
        st_adamw_params hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = step < 500 ? 0.999f : 0.95f, .eps = 1e-8f,
                           .step = step, .grad_scale = 0.5f};
        make_grad(&r, gdt, g, gd, n);
        for (size_t i = 0; i < n; i++) { pd[i] = p[i]; md[i] = m[i]; vd[i] = v[i]; }
        st_optim_step_args a = {.params = p, .grads = g, .grad_dtype = gdt, .work = w, .work_dtype = wdt,
                             .grad_sumsq = st_optim_grad_sumsq(g, gdt, n)};
        st_status st = st_optim_step_ex(o, &a, &hp, &err);
        CHECK(st == ST_OK, "step %ld: %s", step, err.msg);
        adamw_double(pd, md, vd, gd, n, &hp, sp, sm);
        adamw_double(fp, fm, fv, gd, n, &hp, NULL, NULL);
        for (size_t i = 0; i < n; i++) {
            double ep = fabs(p[i] - pd[i]) / sp[i], em = sm[i] > 0 ? fabs(m[i] - md[i]) / sm[i] : fabs(m[i] - md[i]);
            double ev = vd[i] > 0 ? fabs(v[i] - vd[i]) / vd[i] : fabs(v[i]);
            if (ep > worst_p) worst_p = ep;
            if (em > worst_m) worst_m = em;
            if (ev > worst_v) worst_v = ev;
            if (wdt == ST_BF16) bad_work += ((uint16_t *)w)[i] != st_f32_to_bf16(p[i]);
            else if (wdt == ST_F16) bad_work += ((uint16_t *)w)[i] != st_f32_to_f16(p[i]);
            else bad_work += memcmp(&w[i], &p[i], 4) != 0;
        }
    }
    double num = 0, den = 0, worst_free = 0;
    for (size_t i = 0; i < n; i++) {
        num += (p[i] - fp[i]) * (p[i] - fp[i]);
        den += fp[i] * fp[i];
        double e = fabs(p[i] - fp[i]) / (fabs(fp[i]) + 1e-3);
        if (e > worst_free) worst_free = e;
    }
    printf("grad %s -> work %s: per-step worst relative error p %.2e m %.2e v %.2e; after 1000 free steps "
           "|p - p_double| / |p_double| = %.2e (worst element %.2e)\n",
           st_dtype_name(gdt), st_dtype_name(wdt), worst_p, worst_m, worst_v, sqrt(num / den), worst_free);
    CHECK(worst_p <= 1e-6, "%s: parameter error %.3e vs double", st_dtype_name(gdt), worst_p);
    CHECK(worst_m <= 1e-6, "%s: first moment error %.3e vs double", st_dtype_name(gdt), worst_m);
    CHECK(worst_v <= 1e-6, "%s: second moment error %.3e vs double", st_dtype_name(gdt), worst_v);
    CHECK(bad_work == 0, "%s: %ld working-copy elements differ from the rounded master", st_dtype_name(gdt), bad_work);
    /* fp32 rounding of p (~3e-8 per step) random-walks over 1000 steps; norm-wise it stays
     * within 1e-6 (single elements near zero drift further in relative terms) */
    CHECK(sqrt(num / den) <= 1e-6, "%s: free-running drift %.3e", st_dtype_name(gdt), sqrt(num / den));
    st_optim_free(o);
    free(p); free(w); free(g); free(gd); free(pd); free(md); free(vd); free(fp); free(fm); free(fv);
    free(sp); free(sm);
}

/* The legacy entry point equals the plain reference closely, per segment. */
static void check_legacy(void) {
    st_err err = {0};
    st_optim *o;
    st_optim_create(&o, SEGS, 3, ST_OPTIM_STATE_F32, &err);
    size_t n = N_ELEMS, ms;
    float *p = malloc(n * 4), *g = malloc(n * 4), *pr = malloc(n * 4), *mr = calloc(n, 4), *vr = calloc(n, 4);
    st_rng r;
    st_rng_seed(&r, 7);
    for (size_t i = 0; i < n; i++) pr[i] = p[i] = st_rng_normal(&r);
    for (long step = 1; step <= 50; step++) {
        st_adamw_params hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = step, .grad_scale = 1.0f};
        for (size_t i = 0; i < n; i++) g[i] = rand_grad(&r);
        st_optim_step(o, p, g, &hp);
        for (int s = 0; s < 3; s++) {
            size_t off = SEGS[s].offset;
            st_adamw_ref_f32(pr + off, g + off, mr + off, vr + off, SEGS[s].n, SEGS[s].weight_decay, &hp);
        }
    }
    check_close_f32("legacy optim_step vs adamw_ref_f32 (params)", p, pr, n, 1e-6, 1e-5);
    check_close_f32("legacy optim_step vs adamw_ref_f32 (v)", st_optim_state_buffer(o, 1, &ms), vr, n, 1e-12, 1e-4);
    CHECK(st_optim_state_bytes_per_param(o) == 8.0, "fp32 moments are 8 bytes per parameter");
    st_optim_free(o);
    free(p); free(g); free(pr); free(mr); free(vr);
}

/* Run `steps` steps with `threads` threads on fresh state; return params + moments. */
static float *run_threads(st_optim_state_format fmt, int threads, int steps, size_t *total_out) {
    st_err err = {0};
    st_optim *o;
    size_t n = 70000, bytes;
    st_optim_segment segs[2] = {{.offset = 0, .n = 40000, .weight_decay = 0.1f}, {.offset = 40000, .n = 30000, .weight_decay = 0.0f}};
    st_optim_create(&o, segs, 2, fmt, &err);
    float *p = malloc(n * 4);
    uint16_t *g = malloc(n * 2);
    st_rng r;
    st_rng_seed(&r, 99);
    for (size_t i = 0; i < n; i++) p[i] = st_rng_normal(&r);
    omp_set_num_threads(threads);
    for (int s = 1; s <= steps; s++) {
        for (size_t i = 0; i < n; i++) g[i] = st_f32_to_bf16(rand_grad(&r));
        st_adamw_params hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = s, .grad_scale = 1.0f};
        st_optim_step_args a = {.params = p, .grads = g, .grad_dtype = ST_BF16, .grad_sumsq = -1};
        st_optim_step_ex(o, &a, &hp, &err);
    }
    omp_set_num_threads(2);
    size_t total = n * 4;
    for (int i = 0; i < st_optim_state_count(o); i++) { st_optim_state_buffer(o, i, &bytes); total += bytes; }
    float *out = malloc(total);
    *total_out = total;
    memcpy(out, p, n * 4);
    char *at = (char *)out + n * 4;
    for (int i = 0; i < st_optim_state_count(o); i++) {
        void *b = st_optim_state_buffer(o, i, &bytes);
        memcpy(at, b, bytes);
        at += bytes;
    }
    st_optim_free(o);
    free(p);
    free(g);
    return out;
}

static void check_threads(void) {
    for (int f = 0; f < 2; f++) {
        st_optim_state_format fmt = f ? ST_OPTIM_STATE_8BIT : ST_OPTIM_STATE_F32;
        size_t total, total2;
        float *a = run_threads(fmt, 1, 5, &total), *b = run_threads(fmt, 2, 5, &total2);
        CHECK(total == total2 && memcmp(a, b, total) == 0, "format %d: 1 and 2 threads give different bits", f);
        free(a);
        free(b);
    }
}

/* NaN or Inf anywhere: ST_ERR_NONFINITE, and no parameter, moment or working copy changes. */
static void check_nonfinite(void) {
    for (int f = 0; f < 2; f++) {
        st_err err = {0};
        st_optim *o;
        st_optim_create(&o, SEGS, 3, f ? ST_OPTIM_STATE_8BIT : ST_OPTIM_STATE_F32, &err);
        size_t n = N_ELEMS;
        float *p = malloc(n * 4), *p0 = malloc(n * 4);
        uint16_t *g = malloc(n * 2), *w = malloc(n * 2), *w0 = malloc(n * 2);
        st_rng r;
        st_rng_seed(&r, 5);
        for (size_t i = 0; i < n; i++) { p[i] = st_rng_normal(&r); g[i] = st_f32_to_bf16(rand_grad(&r)); w[i] = 0; }
        st_adamw_params hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = 1, .grad_scale = 1.0f};
        st_optim_step_args a = {.params = p, .grads = g, .grad_dtype = ST_BF16, .work = w, .work_dtype = ST_BF16,
                             .grad_sumsq = -1};
        CHECK(st_optim_step_ex(o, &a, &hp, &err) == ST_OK, "finite step: %s", err.msg);
        size_t nb = 0;
        int nbuf = st_optim_state_count(o);
        char *saved[4];
        for (int i = 0; i < nbuf; i++) {
            void *b = st_optim_state_buffer(o, i, &nb);
            saved[i] = malloc(nb);
            memcpy(saved[i], b, nb);
        }
        memcpy(p0, p, n * 4);
        memcpy(w0, w, n * 2);
        g[4321] = st_f32_to_bf16(NAN);
        hp.step = 2;
        st_status st = st_optim_step_ex(o, &a, &hp, &err);
        CHECK(st == ST_ERR_NONFINITE, "NaN gradient: status %s", st_status_name(st));
        g[4321] = st_f32_to_bf16(INFINITY);
        a.grad_sumsq = st_optim_grad_sumsq(g, ST_BF16, n);
        CHECK(isinf(a.grad_sumsq), "sum of squares with an Inf: %g", a.grad_sumsq);
        st = st_optim_step_ex(o, &a, &hp, &err);
        CHECK(st == ST_ERR_NONFINITE, "Inf gradient: status %s", st_status_name(st));
        CHECK(strstr(err.msg, "skipped") != NULL, "message says the step was skipped: %s", err.msg);
        CHECK(st_optim_skipped_steps(o) == 2, "skipped steps counted: %ld", st_optim_skipped_steps(o));
        CHECK(memcmp(p, p0, n * 4) == 0, "params untouched by a skipped step");
        CHECK(memcmp(w, w0, n * 2) == 0, "working copy untouched by a skipped step");
        for (int i = 0; i < nbuf; i++) {
            void *b = st_optim_state_buffer(o, i, &nb);
            CHECK(memcmp(b, saved[i], nb) == 0, "state buffer %d untouched by a skipped step", i);
            free(saved[i]);
        }
        st_optim_free(o);
        free(p); free(p0); free(g); free(w); free(w0);
    }
}

/* Stepping segment ranges with buffers holding only that range equals one whole step. */
static void check_ranges(void) {
    for (int f = 0; f < 2; f++) {
        st_err err = {0};
        st_optim *a, *b;
        st_optim_state_format fmt = f ? ST_OPTIM_STATE_8BIT : ST_OPTIM_STATE_F32;
        st_optim_create(&a, SEGS, 3, fmt, &err);
        st_optim_create(&b, SEGS, 3, fmt, &err);
        size_t n = N_ELEMS;
        float *pa = malloc(n * 4), *pb = malloc(n * 4), *g = malloc(n * 4);
        uint16_t *wa = malloc(n * 2), *wb = malloc(n * 2);
        st_rng r;
        st_rng_seed(&r, 11);
        for (size_t i = 0; i < n; i++) pa[i] = pb[i] = st_rng_normal(&r);
        for (long step = 1; step <= 3; step++) {
            for (size_t i = 0; i < n; i++) g[i] = rand_grad(&r);
            st_adamw_params hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = step, .grad_scale = 1.0f};
            double ss = st_optim_grad_sumsq_f32(g, n);
            st_optim_step_args whole = {.params = pa, .grads = g, .grad_dtype = ST_F32, .work = wa,
                                     .work_dtype = ST_F16, .grad_sumsq = ss};
            CHECK(st_optim_step_ex(a, &whole, &hp, &err) == ST_OK, "whole: %s", err.msg);
            for (int s = 2; s >= 0; s--) { /* reverse order, as backward produces them */
                size_t off = SEGS[s].offset, len = SEGS[s].n;
                float *pl = malloc(len * 4), *gl = malloc(len * 4);
                uint16_t *wl = malloc(len * 2);
                memcpy(pl, pb + off, len * 4);
                memcpy(gl, g + off, len * 4);
                st_optim_step_args part = {.params = pl, .grads = gl, .grad_dtype = ST_F32, .work = wl,
                                        .work_dtype = ST_F16, .base = off, .seg_begin = s, .seg_end = s + 1,
                                        .grad_sumsq = ss};
                CHECK(st_optim_step_ex(b, &part, &hp, &err) == ST_OK, "range: %s", err.msg);
                memcpy(pb + off, pl, len * 4);
                memcpy(wb + off, wl, len * 2);
                free(pl); free(gl); free(wl);
            }
        }
        CHECK(memcmp(pa, pb, n * 4) == 0, "format %d: ranged steps differ from whole steps (params)", f);
        CHECK(memcmp(wa, wb, n * 2) == 0, "format %d: ranged steps differ from whole steps (work)", f);
        st_optim_step_args bad = {.params = pa, .grads = g, .grad_dtype = ST_F32, .base = 100, .grad_sumsq = 1};
        st_adamw_params hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = 4, .grad_scale = 1.0f};
        CHECK(st_optim_step_ex(a, &bad, &hp, &err) == ST_ERR_INVALID, "base after a segment's start is refused");
        st_optim_free(a);
        st_optim_free(b);
        free(pa); free(pb); free(g); free(wa); free(wb);
    }
}

static void check_sumsq(void) {
    size_t n = 1000003;
    float *g = malloc(n * 4);
    uint16_t *h = malloc(n * 2), *b = malloc(n * 2);
    st_rng r;
    st_rng_seed(&r, 3);
    long double ref = 0, refh = 0, refb = 0;
    for (size_t i = 0; i < n; i++) {
        g[i] = rand_grad(&r);
        h[i] = st_f32_to_f16(g[i]);
        b[i] = st_f32_to_bf16(g[i]);
        ref += (long double)g[i] * g[i];
        refh += (long double)st_f16_to_f32(h[i]) * st_f16_to_f32(h[i]);
        refb += (long double)st_bf16_to_f32(b[i]) * st_bf16_to_f32(b[i]);
    }
    double s = st_optim_grad_sumsq_f32(g, n), sh = st_optim_grad_sumsq(h, ST_F16, n), sb = st_optim_grad_sumsq_bf16(b, n);
    CHECK(fabsl(s - ref) <= 1e-12L * ref, "f32 sumsq %.17g vs %.17Lg", s, ref);
    CHECK(fabsl(sh - refh) <= 1e-12L * refh, "f16 sumsq %.17g vs %.17Lg", sh, refh);
    CHECK(fabsl(sb - refb) <= 1e-12L * refb, "bf16 sumsq %.17g vs %.17Lg", sb, refb);
    omp_set_num_threads(1);
    double s1 = st_optim_grad_sumsq_f32(g, n);
    omp_set_num_threads(2);
    CHECK(s1 == s, "sumsq differs between 1 and 2 threads: %.17g %.17g", s1, s);
    float scale = st_optim_clip_scale(400.0, 2.0f, 5.0f); /* norm 20/2 = 10 > 5: clip 0.5, unscale 0.5 */
    CHECK(fabsf(scale - 0.25f) < 1e-7f, "clip scale %g", scale);
    CHECK(st_optim_clip_scale(4.0, 1.0f, 5.0f) == 1.0f, "no clip below max_norm");
    free(g); free(h); free(b);
}

int main(void) {
    run_dtype(ST_F32, ST_BF16);
    run_dtype(ST_BF16, ST_F16);
    run_dtype(ST_F16, ST_F32);
    check_legacy();
    check_threads();
    check_nonfinite();
    check_ranges();
    check_sumsq();
    return test_finish("optim");
}
