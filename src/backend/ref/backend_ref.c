/* backend_ref.c - the "ref" backend: the float vtable over the double reference ops.
 *
 * Each op widens its float inputs to double, calls the ref_ function from ops_ref.c and
 * narrows the results back. Outputs the vtable accumulates into (+=) are widened too,
 * so the accumulation happens in double and is rounded to float once. Memory is plain
 * host memory. Used as the oracle in differential tests of the fast backends.
 *
 * The ops return void, so a failed scratch allocation cannot be reported as a status:
 * the op logs it and fills its outputs with NaN, so no test can pass on stale data.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../cpu/backend_cpu_chunk.h"
#include "backend/ref/ops_ref.h"
#include "strata/backend.h"

typedef struct ref_ctx {
    size_t failed_ops; /* ops that could not get scratch memory; reported at free */
} ref_ctx;

/* One malloc per op holds every double copy; take() hands out consecutive slices. */
typedef struct ref_arena {
    double *base;
    size_t used;
} ref_arena;

static int arena_init(ref_arena *a, size_t n_doubles) {
    a->used = 0;
    /* calloc, not malloc: a zero-size op then hands the ref_ functions defined memory */
    a->base = calloc(n_doubles ? n_doubles : 1, sizeof(double));
    return a->base != NULL;
}

static double *take(ref_arena *a, size_t n) {
    double *p = a->base + a->used;
    a->used += n;
    return p;
}

/* A double copy of n floats (NULL stays NULL, for the optional matmul arguments). */
static double *take_f64(ref_arena *a, const float *src, size_t n) {
    if (!src) return NULL;
    double *p = take(a, n);
    for (size_t i = 0; i < n; i++) p[i] = src[i];
    return p;
}

static void store_f32(float *dst, const double *src, size_t n) {
    if (!dst) return;
    for (size_t i = 0; i < n; i++) dst[i] = (float)src[i];
}

static void fill_nan(float *dst, size_t n) {
    if (!dst) return;
    for (size_t i = 0; i < n; i++) dst[i] = NAN;
}

static void op_failed(st_backend *be, const char *op) {
    ((ref_ctx *)be->ctx)->failed_ops++;
    st_log(0, "ref backend: out of memory for scratch in %s; outputs set to NaN\n", op);
}

/* ---- memory: host RAM ---- */

static void ref_free(st_backend *be) {
    if (!be) return;
    ref_ctx *ctx = be->ctx;
    if (ctx && ctx->failed_ops)
        st_log(0, "ref backend: %zu ops failed for lack of memory\n", ctx->failed_ops);
    free(ctx);
    free(be);
}

static void *ref_alloc(st_backend *be, size_t bytes) {
    (void)be;
    return calloc(1, bytes ? bytes : 1);
}

static void ref_dealloc(st_backend *be, void *p) {
    (void)be;
    free(p);
}

static void ref_memset0(st_backend *be, void *p, size_t bytes) {
    (void)be;
    memset(p, 0, bytes);
}

static void ref_copy(st_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    memcpy(dst, src, bytes);
}

static void ref_synchronize(st_backend *be) { (void)be; }

/* ---- ops ---- */

/* The encoder is not told V; the rows of wte it touches are those up to the largest id. */
static size_t rows_used(const int32_t *inp, size_t n) {
    int32_t m = -1;
    for (size_t i = 0; i < n; i++)
        if (inp[i] > m) m = inp[i];
    return (size_t)(m + 1);
}

static void ref_encoder_forward_f32(st_backend *be, float *out, const int32_t *inp, const float *wte,
                                    const float *wpe, int B, int T, int C) {
    size_t n = (size_t)B * T * C, v = rows_used(inp, (size_t)B * T);
    ref_arena a;
    if (!arena_init(&a, n + v * C + (size_t)T * C)) {
        op_failed(be, "encoder_forward");
        fill_nan(out, n);
        return;
    }
    double *o = take(&a, n), *te = take_f64(&a, wte, v * C), *pe = take_f64(&a, wpe, (size_t)T * C);
    ref_encoder_forward(o, inp, te, pe, B, T, C);
    store_f32(out, o, n);
    free(a.base);
}

static void ref_encoder_backward_f32(st_backend *be, float *dwte, float *dwpe, const float *dout,
                                     const int32_t *inp, int B, int T, int C) {
    size_t n = (size_t)B * T * C, v = rows_used(inp, (size_t)B * T);
    ref_arena a;
    if (!arena_init(&a, n + v * C + (size_t)T * C)) {
        op_failed(be, "encoder_backward");
        fill_nan(dwte, v * C);
        fill_nan(dwpe, (size_t)T * C);
        return;
    }
    double *d = take_f64(&a, dout, n), *dte = take_f64(&a, dwte, v * C), *dpe = take_f64(&a, dwpe, (size_t)T * C);
    ref_encoder_backward(dte, dpe, d, inp, B, T, C);
    store_f32(dwte, dte, v * C);
    store_f32(dwpe, dpe, (size_t)T * C);
    free(a.base);
}

static void ref_layernorm_forward_f32(st_backend *be, float *out, float *mean, float *rstd, const float *inp,
                                      const float *w, const float *b, int N, int C) {
    size_t n = (size_t)N * C;
    ref_arena a;
    if (!arena_init(&a, 2 * n + 2 * (size_t)N + 2 * (size_t)C)) {
        op_failed(be, "layernorm_forward");
        fill_nan(out, n);
        fill_nan(mean, N);
        fill_nan(rstd, N);
        return;
    }
    double *o = take(&a, n), *m = take(&a, N), *r = take(&a, N);
    double *x = take_f64(&a, inp, n), *wd = take_f64(&a, w, C), *bd = take_f64(&a, b, C);
    ref_layernorm_forward(o, m, r, x, wd, bd, N, C);
    store_f32(out, o, n);
    store_f32(mean, m, N);
    store_f32(rstd, r, N);
    free(a.base);
}

static void ref_layernorm_backward_f32(st_backend *be, float *dinp, float *dw, float *db, const float *dout,
                                       const float *inp, const float *w, const float *mean, const float *rstd,
                                       int N, int C) {
    size_t n = (size_t)N * C;
    ref_arena a;
    if (!arena_init(&a, 3 * n + 3 * (size_t)C + 2 * (size_t)N)) {
        op_failed(be, "layernorm_backward");
        fill_nan(dinp, n);
        fill_nan(dw, C);
        fill_nan(db, C);
        return;
    }
    double *dx = take_f64(&a, dinp, n), *dwd = take_f64(&a, dw, C), *dbd = take_f64(&a, db, C);
    double *d = take_f64(&a, dout, n), *x = take_f64(&a, inp, n), *wd = take_f64(&a, w, C);
    double *m = take_f64(&a, mean, N), *r = take_f64(&a, rstd, N);
    ref_layernorm_backward(dx, dwd, dbd, d, x, wd, m, r, N, C);
    store_f32(dinp, dx, n);
    store_f32(dw, dwd, C);
    store_f32(db, dbd, C);
    free(a.base);
}

static void ref_matmul_forward_f32(st_backend *be, float *out, const float *inp, const float *w,
                                   const float *bias, int N, int C, int OC, st_wlayout layout) {
    size_t no = (size_t)N * OC, ni = (size_t)N * C, nw = (size_t)C * OC;
    ref_arena a;
    if (!arena_init(&a, no + ni + nw + (size_t)OC)) {
        op_failed(be, "matmul_forward");
        fill_nan(out, no);
        return;
    }
    double *o = take(&a, no), *x = take_f64(&a, inp, ni), *wd = take_f64(&a, w, nw);
    double *bd = take_f64(&a, bias, OC);
    ref_matmul_forward(o, x, wd, bd, N, C, OC, layout);
    store_f32(out, o, no);
    free(a.base);
}

static void ref_matmul_backward_f32(st_backend *be, float *dinp, float *dw, float *dbias, const float *dout,
                                    const float *inp, const float *w, int N, int C, int OC,
                                    st_wlayout layout) {
    size_t no = (size_t)N * OC, ni = (size_t)N * C, nw = (size_t)C * OC;
    ref_arena a;
    if (!arena_init(&a, 2 * ni + 2 * nw + (size_t)OC + no)) {
        op_failed(be, "matmul_backward");
        fill_nan(dinp, ni);
        fill_nan(dw, nw);
        fill_nan(dbias, OC);
        return;
    }
    double *dx = take_f64(&a, dinp, ni), *dwd = take_f64(&a, dw, nw), *dbd = take_f64(&a, dbias, OC);
    double *d = take_f64(&a, dout, no), *x = take_f64(&a, inp, ni), *wd = take_f64(&a, w, nw);
    ref_matmul_backward(dx, dwd, dbd, d, x, wd, N, C, OC, layout);
    store_f32(dinp, dx, ni);
    store_f32(dw, dwd, nw);
    store_f32(dbias, dbd, OC);
    free(a.base);
}

static void ref_attention_doc_forward_f32(st_backend *be, float *out, float *lse, const float *qkv,
                                          const int32_t *doc_start, int B, int T, int C, int NH) {
    size_t no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    ref_arena a;
    if (!arena_init(&a, no + nl + 3 * no)) {
        op_failed(be, "attention_forward");
        fill_nan(out, no);
        fill_nan(lse, nl);
        return;
    }
    double *o = take(&a, no), *l = take(&a, nl), *q = take_f64(&a, qkv, 3 * no);
    ref_attention_doc_forward(o, l, q, doc_start, B, T, C, NH);
    store_f32(out, o, no);
    store_f32(lse, l, nl);
    free(a.base);
}

static void ref_attention_forward_f32(st_backend *be, float *out, float *lse, const float *qkv, int B, int T,
                                      int C, int NH) {
    ref_attention_doc_forward_f32(be, out, lse, qkv, NULL, B, T, C, NH);
}

static void ref_attention_doc_backward_f32(st_backend *be, float *dqkv, const float *dout, const float *qkv,
                                           const float *out, const float *lse, const int32_t *doc_start, int B,
                                           int T, int C, int NH) {
    size_t no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    ref_arena a;
    if (!arena_init(&a, 3 * no + no + 3 * no + no + nl)) {
        op_failed(be, "attention_backward");
        fill_nan(dqkv, 3 * no);
        return;
    }
    double *dq = take_f64(&a, dqkv, 3 * no), *d = take_f64(&a, dout, no), *q = take_f64(&a, qkv, 3 * no);
    double *o = take_f64(&a, out, no), *l = take_f64(&a, lse, nl);
    ref_attention_doc_backward(dq, d, q, o, l, doc_start, B, T, C, NH);
    store_f32(dqkv, dq, 3 * no);
    free(a.base);
}

static void ref_attention_backward_f32(st_backend *be, float *dqkv, const float *dout, const float *qkv,
                                       const float *out, const float *lse, int B, int T, int C, int NH) {
    ref_attention_doc_backward_f32(be, dqkv, dout, qkv, out, lse, NULL, B, T, C, NH);
}

static void ref_gelu_forward_f32(st_backend *be, float *out, const float *inp, int n) {
    ref_arena a;
    if (!arena_init(&a, 2 * (size_t)n)) {
        op_failed(be, "gelu_forward");
        fill_nan(out, n);
        return;
    }
    double *o = take(&a, n), *x = take_f64(&a, inp, n);
    ref_gelu_forward(o, x, n);
    store_f32(out, o, n);
    free(a.base);
}

static void ref_gelu_backward_f32(st_backend *be, float *dinp, const float *inp, const float *dout, int n) {
    ref_arena a;
    if (!arena_init(&a, 3 * (size_t)n)) {
        op_failed(be, "gelu_backward");
        fill_nan(dinp, n);
        return;
    }
    double *dx = take_f64(&a, dinp, n), *x = take_f64(&a, inp, n), *d = take_f64(&a, dout, n);
    ref_gelu_backward(dx, x, d, n);
    store_f32(dinp, dx, n);
    free(a.base);
}

static void ref_residual_forward_f32(st_backend *be, float *out, const float *x, const float *y, int n) {
    ref_arena a;
    if (!arena_init(&a, 3 * (size_t)n)) {
        op_failed(be, "residual_forward");
        fill_nan(out, n);
        return;
    }
    double *o = take(&a, n), *xd = take_f64(&a, x, n), *yd = take_f64(&a, y, n);
    ref_residual_forward(o, xd, yd, n);
    store_f32(out, o, n);
    free(a.base);
}

static void ref_residual_backward_f32(st_backend *be, float *da, float *db, const float *dout, int n) {
    ref_arena a;
    if (!arena_init(&a, 3 * (size_t)n)) {
        op_failed(be, "residual_backward");
        fill_nan(da, n);
        fill_nan(db, n);
        return;
    }
    double *dad = take_f64(&a, da, n), *dbd = take_f64(&a, db, n), *d = take_f64(&a, dout, n);
    ref_residual_backward(dad, dbd, d, n);
    store_f32(da, dad, n);
    store_f32(db, dbd, n);
    free(a.base);
}

static void ref_crossentropy_f32(st_backend *be, float *logits, float *losses, const int32_t *targets, int N,
                                 int V, float dloss) {
    size_t nl = (size_t)N * V;
    ref_arena a;
    if (!arena_init(&a, nl + (size_t)N)) {
        op_failed(be, "crossentropy_forward_backward");
        fill_nan(losses, N);
        if (dloss != 0) fill_nan(logits, nl);
        return;
    }
    double *l = take_f64(&a, logits, nl), *loss = take(&a, N);
    ref_crossentropy_forward_backward(l, loss, targets, N, V, dloss);
    store_f32(losses, loss, N);
    if (dloss != 0) store_f32(logits, l, nl);
    free(a.base);
}

/* ---- Llama-family ops. Strided operands (rows ld floats apart, several operands possibly
 * in one packed buffer) are gathered into dense double arrays and scattered back
 * element by element, so an op touches exactly the elements it owns. */

static double *take_rows(ref_arena *a, const float *src, size_t rows, int width, int ld) {
    double *p = take(a, rows * (size_t)width);
    for (size_t r = 0; r < rows; r++)
        for (int i = 0; i < width; i++) p[r * width + i] = src[r * (size_t)ld + i];
    return p;
}

static void store_rows(float *dst, const double *src, size_t rows, int width, int ld) {
    for (size_t r = 0; r < rows; r++)
        for (int i = 0; i < width; i++) dst[r * (size_t)ld + i] = (float)src[r * width + i];
}

static void fill_nan_rows(float *dst, size_t rows, int width, int ld) {
    for (size_t r = 0; r < rows; r++)
        for (int i = 0; i < width; i++) dst[r * (size_t)ld + i] = NAN;
}

static void ref_embedding_forward_f32(st_backend *be, float *out, const int32_t *inp, const float *wte, int B,
                                      int T, int C) {
    size_t n = (size_t)B * T * C, v = rows_used(inp, (size_t)B * T);
    ref_arena a;
    if (!arena_init(&a, n + v * C)) {
        op_failed(be, "embedding_forward");
        fill_nan(out, n);
        return;
    }
    double *o = take(&a, n), *te = take_f64(&a, wte, v * C);
    ref_embedding_forward(o, inp, te, B, T, C);
    store_f32(out, o, n);
    free(a.base);
}

static void ref_embedding_backward_f32(st_backend *be, float *dwte, const float *dout, const int32_t *inp, int B,
                                       int T, int C) {
    size_t n = (size_t)B * T * C, v = rows_used(inp, (size_t)B * T);
    ref_arena a;
    if (!arena_init(&a, n + v * C)) {
        op_failed(be, "embedding_backward");
        fill_nan(dwte, v * C);
        return;
    }
    double *d = take_f64(&a, dout, n), *dte = take_f64(&a, dwte, v * C);
    ref_embedding_backward(dte, d, inp, B, T, C);
    store_f32(dwte, dte, v * C);
    free(a.base);
}

static void ref_rmsnorm_forward_f32(st_backend *be, float *out, float *rstd, const float *inp, const float *w,
                                    int N, int H, int hs, int ld, float eps) {
    int width = H * hs;
    size_t n = (size_t)N * width;
    ref_arena a;
    if (!arena_init(&a, 2 * n + (size_t)N * H + (size_t)hs)) {
        op_failed(be, "rmsnorm_forward");
        fill_nan_rows(out, N, width, ld);
        fill_nan(rstd, (size_t)N * H);
        return;
    }
    double *o = take(&a, n), *r = take(&a, (size_t)N * H), *x = take_rows(&a, inp, N, width, ld);
    double *wd = take_f64(&a, w, hs);
    ref_rmsnorm_forward(o, r, x, wd, N, H, hs, width, eps);
    store_rows(out, o, N, width, ld);
    store_f32(rstd, r, (size_t)N * H);
    free(a.base);
}

static void ref_rmsnorm_backward_f32(st_backend *be, float *dinp, float *dw, const float *dout, const float *inp,
                                     const float *w, const float *rstd, int N, int H, int hs, int ld) {
    int width = H * hs;
    size_t n = (size_t)N * width;
    ref_arena a;
    if (!arena_init(&a, 3 * n + 2 * (size_t)hs + (size_t)N * H)) {
        op_failed(be, "rmsnorm_backward");
        fill_nan_rows(dinp, N, width, ld);
        fill_nan(dw, hs);
        return;
    }
    double *dx = take_rows(&a, dinp, N, width, ld), *dwd = take_f64(&a, dw, hs);
    double *d = take_rows(&a, dout, N, width, ld), *x = take_rows(&a, inp, N, width, ld);
    double *wd = take_f64(&a, w, hs), *r = take_f64(&a, rstd, (size_t)N * H);
    ref_rmsnorm_backward(dx, dwd, d, x, wd, r, N, H, hs, width);
    store_rows(dinp, dx, N, width, ld);
    store_f32(dw, dwd, hs);
    free(a.base);
}

static void ref_rope_f32(st_backend *be, float *x, const float *cos, const float *sin, int B, int T, int H,
                         int hs, int ld, int backward) {
    int width = H * hs;
    size_t rows = (size_t)B * T, nt = (size_t)T * (hs / 2);
    ref_arena a;
    if (!arena_init(&a, rows * width + 2 * nt)) {
        op_failed(be, backward ? "rope_backward" : "rope_forward");
        fill_nan_rows(x, rows, width, ld);
        return;
    }
    double *xd = take_rows(&a, x, rows, width, ld), *c = take_f64(&a, cos, nt), *s = take_f64(&a, sin, nt);
    if (backward) ref_rope_backward(xd, c, s, B, T, H, hs, width);
    else ref_rope_forward(xd, c, s, B, T, H, hs, width);
    store_rows(x, xd, rows, width, ld);
    free(a.base);
}

static void ref_rope_forward_f32(st_backend *be, float *x, const float *cos, const float *sin, int B, int T, int H,
                                 int hs, int ld) {
    ref_rope_f32(be, x, cos, sin, B, T, H, hs, ld, 0);
}

static void ref_rope_backward_f32(st_backend *be, float *dx, const float *cos, const float *sin, int B, int T,
                                  int H, int hs, int ld) {
    ref_rope_f32(be, dx, cos, sin, B, T, H, hs, ld, 1);
}

static void ref_swiglu_forward_f32(st_backend *be, float *out, const float *inp, int N, int F) {
    size_t no = (size_t)N * F;
    ref_arena a;
    if (!arena_init(&a, 3 * no)) {
        op_failed(be, "swiglu_forward");
        fill_nan(out, no);
        return;
    }
    double *o = take(&a, no), *x = take_f64(&a, inp, 2 * no);
    ref_swiglu_forward(o, x, N, F);
    store_f32(out, o, no);
    free(a.base);
}

static void ref_swiglu_backward_f32(st_backend *be, float *dinp, const float *inp, const float *dout, int N, int F) {
    size_t no = (size_t)N * F;
    ref_arena a;
    if (!arena_init(&a, 5 * no)) {
        op_failed(be, "swiglu_backward");
        fill_nan(dinp, 2 * no);
        return;
    }
    double *dx = take_f64(&a, dinp, 2 * no), *x = take_f64(&a, inp, 2 * no), *d = take_f64(&a, dout, no);
    ref_swiglu_backward(dx, x, d, N, F);
    store_f32(dinp, dx, 2 * no);
    free(a.base);
}

/* q, k, v gathered into one dense [q | k | v] row of W = (NH + 2 NKV) hs doubles. */
static double *take_qkv(ref_arena *a, const float *q, const float *k, const float *v, size_t rows, int ld,
                        int NH, int NKV, int hs) {
    int W = (NH + 2 * NKV) * hs, wq = NH * hs, wk = NKV * hs;
    double *p = take(a, rows * W);
    for (size_t r = 0; r < rows; r++) {
        for (int i = 0; i < wq; i++) p[r * W + i] = q[r * ld + i];
        for (int i = 0; i < wk; i++) p[r * W + wq + i] = k[r * ld + i];
        for (int i = 0; i < wk; i++) p[r * W + wq + wk + i] = v[r * ld + i];
    }
    return p;
}

static void ref_attention_gqa_doc_forward_f32(st_backend *be, float *out, float *lse, const float *q, const float *k,
                                              const float *v, const int32_t *doc_start, int ld, int B, int T, int NH,
                                              int NKV, int hs) {
    size_t rows = (size_t)B * T, no = rows * NH * hs, nl = (size_t)B * NH * T;
    int W = (NH + 2 * NKV) * hs;
    ref_arena a;
    if (!arena_init(&a, no + nl + rows * W)) {
        op_failed(be, "attention_gqa_forward");
        fill_nan(out, no);
        fill_nan(lse, nl);
        return;
    }
    double *o = take(&a, no), *l = take(&a, nl), *x = take_qkv(&a, q, k, v, rows, ld, NH, NKV, hs);
    ref_attention_gqa_doc_forward(o, l, x, x + NH * hs, x + (NH + NKV) * hs, doc_start, W, B, T, NH, NKV, hs);
    store_f32(out, o, no);
    store_f32(lse, l, nl);
    free(a.base);
}

static void ref_attention_gqa_forward_f32(st_backend *be, float *out, float *lse, const float *q, const float *k,
                                          const float *v, int ld, int B, int T, int NH, int NKV, int hs) {
    ref_attention_gqa_doc_forward_f32(be, out, lse, q, k, v, NULL, ld, B, T, NH, NKV, hs);
}

static void ref_attention_gqa_doc_backward_f32(st_backend *be, float *dq, float *dk, float *dv, const float *dout,
                                               const float *q, const float *k, const float *v, const float *out,
                                               const float *lse, const int32_t *doc_start, int ld, int B, int T,
                                               int NH, int NKV, int hs) {
    size_t rows = (size_t)B * T, no = rows * NH * hs, nl = (size_t)B * NH * T;
    int W = (NH + 2 * NKV) * hs, wq = NH * hs, wk = NKV * hs;
    ref_arena a;
    if (!arena_init(&a, 2 * rows * W + 2 * no + nl)) {
        op_failed(be, "attention_gqa_backward");
        fill_nan_rows(dq, rows, wq, ld);
        fill_nan_rows(dk, rows, wk, ld);
        fill_nan_rows(dv, rows, wk, ld);
        return;
    }
    double *g = take_qkv(&a, dq, dk, dv, rows, ld, NH, NKV, hs), *x = take_qkv(&a, q, k, v, rows, ld, NH, NKV, hs);
    double *d = take_f64(&a, dout, no), *o = take_f64(&a, out, no), *l = take_f64(&a, lse, nl);
    ref_attention_gqa_doc_backward(g, g + wq, g + wq + wk, d, x, x + wq, x + wq + wk, o, l, doc_start, W, B, T, NH,
                                   NKV, hs);
    /* scatter back: three disjoint column ranges of the dense rows */
    for (size_t r = 0; r < rows; r++) {
        for (int i = 0; i < wq; i++) dq[r * ld + i] = (float)g[r * W + i];
        for (int i = 0; i < wk; i++) dk[r * ld + i] = (float)g[r * W + wq + i];
        for (int i = 0; i < wk; i++) dv[r * ld + i] = (float)g[r * W + wq + wk + i];
    }
    free(a.base);
}

static void ref_attention_gqa_backward_f32(st_backend *be, float *dq, float *dk, float *dv, const float *dout,
                                           const float *q, const float *k, const float *v, const float *out,
                                           const float *lse, int ld, int B, int T, int NH, int NKV, int hs) {
    ref_attention_gqa_doc_backward_f32(be, dq, dk, dv, dout, q, k, v, out, lse, NULL, ld, B, T, NH, NKV, hs);
}

/* ---- POET-X: ops_ref_poetx.c in double ---- */

static void ref_poet_cayley_forward_f32(st_backend *be, float *G, const float *q, int nb, int b, int k) {
    size_t nq = (size_t)nb * b * (b - 1) / 2, ng = (size_t)nb * b * b;
    ref_arena a;
    if (!arena_init(&a, nq + ng)) {
        op_failed(be, "poet_cayley_forward");
        fill_nan(G, ng);
        return;
    }
    double *qd = take_f64(&a, q, nq), *g = take(&a, ng);
    ref_poet_cayley_forward(g, qd, nb, b, k);
    store_f32(G, g, ng);
    free(a.base);
}

static void ref_poet_cayley_backward_f32(st_backend *be, float *dq, const float *dG, const float *q, int nb, int b,
                                         int k) {
    size_t nq = (size_t)nb * b * (b - 1) / 2, ng = (size_t)nb * b * b;
    ref_arena a;
    if (!arena_init(&a, 2 * nq + ng)) {
        op_failed(be, "poet_cayley_backward");
        fill_nan(dq, nq);
        return;
    }
    double *dqd = take_f64(&a, dq, nq), *qd = take_f64(&a, q, nq), *dg = take_f64(&a, dG, ng);
    ref_poet_cayley_backward(dqd, dg, qd, nb, b, k);
    store_f32(dq, dqd, nq);
    free(a.base);
}

static void ref_poet_apply_forward_f32(st_backend *be, float *y, const float *x, const float *G, const int32_t *perm,
                                       int N, int d, int b, int trans) {
    size_t n = (size_t)N * d, ng = (size_t)d * b;
    ref_arena a;
    if (!arena_init(&a, 2 * n + ng)) {
        op_failed(be, "poet_apply_forward");
        fill_nan(y, n);
        return;
    }
    double *xd = take_f64(&a, x, n), *g = take_f64(&a, G, ng), *yd = take(&a, n);
    ref_poet_apply_forward(yd, xd, g, perm, N, d, b, trans);
    store_f32(y, yd, n); /* after reading x: y may be x */
    free(a.base);
}

static void ref_poet_apply_backward_f32(st_backend *be, float *dx, float *dG, const float *dy, const float *x,
                                        const float *G, const int32_t *perm, int N, int d, int b, int trans) {
    size_t n = (size_t)N * d, ng = (size_t)d * b;
    ref_arena a;
    if (!arena_init(&a, 3 * n + 2 * ng)) {
        op_failed(be, "poet_apply_backward");
        fill_nan(dx, n);
        fill_nan(dG, ng);
        return;
    }
    double *dxd = take_f64(&a, dx, n), *dg = take_f64(&a, dG, ng), *dyd = take_f64(&a, dy, n);
    double *xd = take_f64(&a, x, n), *g = take_f64(&a, G, ng);
    ref_poet_apply_backward(dxd, dg, dyd, xd, g, perm, N, d, b, trans);
    store_f32(dx, dxd, n);
    store_f32(dG, dg, ng);
    free(a.base);
}

/* columns of rows through a permutation: copies (the add in double, rounded once, as one float add) */
static void ref_poet_permute(st_backend *be, float *y, int ldy, const float *x, int ldx, const int32_t *perm, int N,
                             int d, int mode) {
    (void)be;
    for (int n = 0; n < N; n++)
        for (int i = 0; i < d; i++) {
            float *yp = mode == ST_PERMUTE_GATHER ? y + (size_t)n * ldy + i : y + (size_t)n * ldy + perm[i];
            double v = mode == ST_PERMUTE_GATHER ? x[(size_t)n * ldx + perm[i]] : x[(size_t)n * ldx + i];
            *yp = mode == ST_PERMUTE_SCATTER_ADD ? (float)((double)*yp + v) : (float)v;
        }
}

/* y rows += alpha x rows, each element in double (the sum of two floats rounds once, as
 * the CPU backend's fused-free float add may not: the differential test allows that) */
static void ref_axpy_rows(st_backend *be, float *y, int ldy, const float *x, int ldx, float alpha, int N, int W) {
    (void)be;
    for (int n = 0; n < N; n++)
        for (int i = 0; i < W; i++) {
            float *yp = y + (size_t)n * ldy + i;
            *yp = (float)((double)*yp + (double)alpha * (double)x[(size_t)n * ldx + i]);
        }
}

/* The write variants: the input gradient cleared, then the accumulating op (the contract's
 * own definition, so the differential tests hold the CPU backend's variants to it). */
static void ref_matmul_backward_write_f32(st_backend *be, float *dinp, float *dw, float *dbias, const float *dout,
                                          const float *inp, const float *w, int N, int C, int OC,
                                          st_wlayout layout) {
    if (dinp) memset(dinp, 0, sizeof(float) * (size_t)N * C);
    ref_matmul_backward_f32(be, dinp, dw, dbias, dout, inp, w, N, C, OC, layout);
}

static void ref_gelu_backward_write_f32(st_backend *be, float *dinp, const float *inp, const float *dout, int n) {
    memset(dinp, 0, sizeof(float) * (size_t)n);
    ref_gelu_backward_f32(be, dinp, inp, dout, n);
}

static void ref_attention_backward_write_f32(st_backend *be, float *dqkv, const float *dout, const float *qkv,
                                             const float *out, const float *lse, const int32_t *doc_start, int B,
                                             int T, int C, int NH) {
    memset(dqkv, 0, sizeof(float) * 3 * (size_t)B * T * C);
    ref_attention_doc_backward_f32(be, dqkv, dout, qkv, out, lse, doc_start, B, T, C, NH);
}

/* bf16 -> fp32 from the format's definition (sign, 8-bit exponent, 7-bit mantissa), not by
 * the bit shift the CPU backend uses: the differential test's oracle. */
static void ref_from_bf16(st_backend *be, float *dst, const uint16_t *src, size_t n) {
    (void)be;
    for (size_t i = 0; i < n; i++) {
        unsigned h = src[i], e = (h >> 7) & 0xffu, m = h & 0x7fu;
        double v = e == 0 ? ldexp((double)m, -133) : e == 255 ? (m ? NAN : INFINITY) : ldexp(128.0 + m, (int)e - 134);
        dst[i] = (float)((h & 0x8000u) ? -v : v);
    }
}

static const st_backend_ops ref_ops = {
    .name = "ref",
    .free = ref_free,
    .alloc = ref_alloc,
    .dealloc = ref_dealloc,
    .memset0 = ref_memset0,
    .copy_to_device = ref_copy,
    .copy_to_host = ref_copy,
    .synchronize = ref_synchronize,
    .encoder_forward = ref_encoder_forward_f32,
    .encoder_backward = ref_encoder_backward_f32,
    .layernorm_forward = ref_layernorm_forward_f32,
    .layernorm_backward = ref_layernorm_backward_f32,
    .matmul_forward = ref_matmul_forward_f32,
    .matmul_backward = ref_matmul_backward_f32,
    .attention_forward = ref_attention_forward_f32,
    .attention_backward = ref_attention_backward_f32,
    .gelu_forward = ref_gelu_forward_f32,
    .gelu_backward = ref_gelu_backward_f32,
    .residual_forward = ref_residual_forward_f32,
    .residual_backward = ref_residual_backward_f32,
    .crossentropy_forward_backward = ref_crossentropy_f32,
    .embedding_forward = ref_embedding_forward_f32,
    .embedding_backward = ref_embedding_backward_f32,
    .rmsnorm_forward = ref_rmsnorm_forward_f32,
    .rmsnorm_backward = ref_rmsnorm_backward_f32,
    .rope_forward = ref_rope_forward_f32,
    .rope_backward = ref_rope_backward_f32,
    .swiglu_forward = ref_swiglu_forward_f32,
    .swiglu_backward = ref_swiglu_backward_f32,
    .attention_gqa_forward = ref_attention_gqa_forward_f32,
    .attention_gqa_backward = ref_attention_gqa_backward_f32,
    .softmax_chunk_init = st_host_softmax_chunk_init,
    .softmax_chunk_stats = st_host_softmax_chunk_stats,
    .softmax_chunk_grad = st_host_softmax_chunk_grad,
    .to_bf16 = st_host_to_bf16,
    .attention_doc_forward = ref_attention_doc_forward_f32,
    .attention_doc_backward = ref_attention_doc_backward_f32,
    .attention_gqa_doc_forward = ref_attention_gqa_doc_forward_f32,
    .attention_gqa_doc_backward = ref_attention_gqa_doc_backward_f32,
    .poet_cayley_forward = ref_poet_cayley_forward_f32,
    .poet_cayley_backward = ref_poet_cayley_backward_f32,
    .poet_apply_forward = ref_poet_apply_forward_f32,
    .poet_apply_backward = ref_poet_apply_backward_f32,
    .poet_permute = ref_poet_permute,
    .axpy_rows = ref_axpy_rows,
    .from_bf16 = ref_from_bf16,
    .matmul_backward_write = ref_matmul_backward_write_f32,
    .gelu_backward_write = ref_gelu_backward_write_f32,
    .attention_backward_write = ref_attention_backward_write_f32,
};

st_status st_backend_ref_create(st_backend **out, st_err *err) {
    if (!out) return st_errf(err, ST_ERR_INVALID, "st_backend_ref_create: out is NULL");
    *out = NULL;
    st_backend *be = calloc(1, sizeof *be);
    ref_ctx *ctx = calloc(1, sizeof *ctx);
    if (!be || !ctx) {
        free(be);
        free(ctx);
        return st_errf(err, ST_ERR_NOMEM, "st_backend_ref_create: out of host memory for the backend struct");
    }
    be->ops = &ref_ops;
    be->ctx = ctx;
    *out = be;
    return ST_OK;
}
