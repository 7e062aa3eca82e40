/* optim.c - AdamW over segments of a flat vector (fp32 states; scalar loop, OpenMP). */
#include "strata/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct optim {
    optim_segment *segs;
    int n_segs;
    size_t numel;
    optim_state_format fmt;
    float *m, *v;
};

st_status optim_create(optim **out, const optim_segment *segs, int n_segs, optim_state_format fmt,
                       st_err *err) {
    *out = NULL;
    if (n_segs <= 0) return st_errf(err, ST_ERR_INVALID, "optimizer: no parameter segments");
    if (fmt != OPTIM_STATE_F32)
        return st_errf(err, ST_ERR_UNSUPPORTED, "optimizer: state format %d is not built yet; use f32", fmt);
    optim *o = calloc(1, sizeof *o);
    if (!o) return st_errf(err, ST_ERR_NOMEM, "optimizer: out of memory");
    o->segs = malloc(sizeof *segs * (size_t)n_segs);
    if (!o->segs) { free(o); return st_errf(err, ST_ERR_NOMEM, "optimizer: out of memory"); }
    memcpy(o->segs, segs, sizeof *segs * (size_t)n_segs);
    o->n_segs = n_segs;
    for (int i = 0; i < n_segs; i++) {
        size_t end = segs[i].offset + segs[i].n;
        if (end > o->numel) o->numel = end;
    }
    o->fmt = fmt;
    o->m = st_alloc(o->numel * sizeof(float));
    o->v = st_alloc(o->numel * sizeof(float));
    if (!o->m || !o->v) {
        size_t want = 2 * o->numel * sizeof(float);
        optim_free(o);
        return st_errf(err, ST_ERR_NOMEM, "optimizer: cannot allocate %zu bytes of moments", want);
    }
    *out = o;
    return ST_OK;
}

void optim_free(optim *o) {
    if (!o) return;
    st_free(o->m);
    st_free(o->v);
    free(o->segs);
    free(o);
}

size_t optim_numel(const optim *o) { return o->numel; }
optim_state_format optim_format(const optim *o) { return o->fmt; }

void adamw_ref_f32(float *p, const float *g, float *m, float *v, size_t n, float wd,
                   const adamw_params *hp) {
    float b1 = hp->beta1, b2 = hp->beta2;
    float bc1 = 1.0f - powf(b1, (float)hp->step), bc2 = 1.0f - powf(b2, (float)hp->step);
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * hp->grad_scale;
        m[i] = b1 * m[i] + (1.0f - b1) * gi;
        v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
        float mhat = m[i] / bc1, vhat = v[i] / bc2;
        p[i] -= hp->lr * (mhat / (sqrtf(vhat) + hp->eps) + wd * p[i]);
    }
}

void optim_step(optim *o, float *params, const float *grads, const adamw_params *hp) {
    for (int s = 0; s < o->n_segs; s++) {
        const optim_segment *sg = &o->segs[s];
        long n = (long)sg->n, chunk = 1 << 14;
#pragma omp parallel for schedule(static)
        for (long c = 0; c < n; c += chunk) {
            long len = n - c < chunk ? n - c : chunk;
            size_t off = sg->offset + (size_t)c;
            adamw_ref_f32(params + off, grads + off, o->m + off, o->v + off, (size_t)len,
                          sg->weight_decay, hp);
        }
    }
}

int optim_state_count(const optim *o) { (void)o; return 2; }

void *optim_state_buffer(optim *o, int i, size_t *bytes) {
    *bytes = o->numel * sizeof(float);
    return i == 0 ? (void *)o->m : i == 1 ? (void *)o->v : NULL;
}

double optim_state_bytes_per_param(const optim *o) { (void)o; return 8.0; }

/* Deterministic sum of squares: fixed chunks, partials summed in chunk order, so the
 * result does not depend on thread timing (bit-exact resume depends on it). */
#define SUMSQ_CHUNK 65536
#define SUMSQ_BODY(LOAD)                                                              \
    long nchunks = (long)((n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK);                      \
    double stackbuf[64], *part = nchunks <= 64 ? stackbuf : malloc(sizeof(double) * (size_t)nchunks); \
    if (!part) return NAN;                                                           \
    _Pragma("omp parallel for schedule(static)")                                     \
    for (long c = 0; c < nchunks; c++) {                                             \
        size_t lo = (size_t)c * SUMSQ_CHUNK, hi = lo + SUMSQ_CHUNK < n ? lo + SUMSQ_CHUNK : n; \
        double s = 0;                                                                \
        for (size_t i = lo; i < hi; i++) { double x = LOAD; s += x * x; }           \
        part[c] = s;                                                                 \
    }                                                                                \
    double total = 0;                                                                \
    for (long c = 0; c < nchunks; c++) total += part[c];                             \
    if (part != stackbuf) free(part);                                                \
    return total;

double optim_grad_sumsq_f32(const float *g, size_t n) { SUMSQ_BODY((double)g[i]) }
double optim_grad_sumsq_bf16(const uint16_t *g, size_t n) { SUMSQ_BODY((double)st_bf16_to_f32(g[i])) }
