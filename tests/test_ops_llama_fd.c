/* test_ops_llama_fd.c - the double reference of the Llama-family ops: hand-computed
 * forward values, properties against independent code (GQA against the MHA reference
 * with repeated key/value heads, the Llama-3 rotary frequencies against their three
 * cases), and every backward against central finite differences through the forward.
 *
 * Objective L = sum(out * R) for a fixed random R; gradient buffers are pre-filled with
 * random values and the prefill subtracted afterwards, so += is tested with the math.
 * Strided operands use ld wider than the data, with the gaps filled with sentinels that
 * must survive untouched.
 *
 * Tolerances as in test_ops_fd.c (double, h = 1e-6): |analytic - numeric| <= 1e-6 *
 * max|numeric| + 1e-8 per element: truncation ~h^2 |L'''| ~ 1e-12 and rounding
 * ~eps |L| / h ~ 1e-9 sit far inside; a wrong term misses by orders of magnitude.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/ref/ops_ref.h"
#include "strata/core.h"
#include "testutil.h"

#define OPS_FD_NAME "test_ops_llama_fd"
#include "ops_fd_common.h"

#define SENTINEL 12345.0

/* Set the columns [w, ld) of each row to SENTINEL (the gaps a strided op must not touch). */
static void fill_gaps(double *p, size_t rows, int col0, int col1, int ld) {
    for (size_t r = 0; r < rows; r++)
        for (int c = 0; c < ld; c++)
            if (c < col0 || c >= col1) p[r * ld + c] = SENTINEL;
}

static int gaps_intact(const double *p, size_t rows, int col0, int col1, int ld) {
    for (size_t r = 0; r < rows; r++)
        for (int c = 0; c < ld; c++)
            if ((c < col0 || c >= col1) && p[r * ld + c] != SENTINEL) return 0;
    return 1;
}

/* ---------------- hand-computed values and properties ---------------- */

static void test_forward_values(void) {
    /* rmsnorm [1,2,3], w [1,2,0.5]: mean square 14/3 */
    double x[3] = {1, 2, 3}, w[3] = {1, 2, 0.5}, y[3], r;
    ref_rmsnorm_forward(y, &r, x, w, 1, 1, 3, 3, 1e-6);
    double rr = 1 / sqrt(14.0 / 3 + 1e-6), want[3] = {rr, 4 * rr, 1.5 * rr};
    check_close_f64("rmsnorm [1,2,3]", y, want, 3, 1e-15, 1e-14);
    CHECK(fabs(r - rr) < 1e-15, "rmsnorm rstd %.17g want %.17g", r, rr);

    /* swiglu: silu(1) * 2, silu(-2) * 0.5 */
    double gu[4] = {1, -2, 2, 0.5}, so[2];
    ref_swiglu_forward(so, gu, 1, 2);
    double want_s[2] = {2.0 / (1 + exp(-1.0)), 0.5 * -2.0 / (1 + exp(2.0))};
    check_close_f64("swiglu", so, want_s, 2, 1e-15, 1e-14);

    /* rope, hs = 4 (pairs (0,2), (1,3)), theta 100: inv_freq [1, 0.1]; position 1 rotates
     * pair 0 by 1 rad and pair 1 by 0.1 rad; position 0 is the identity */
    double ct[4], st[4];
    ref_rope_tables(ct, st, 2, 4, 100.0, 0, 0, 0, 0, 0);
    double xr[8] = {1, 2, 3, 4, 1, 2, 3, 4};
    ref_rope_forward(xr, ct, st, 1, 2, 1, 4, 4);
    double want_r[8] = {1, 2, 3, 4, cos(1.0) - 3 * sin(1.0), 2 * cos(0.1) - 4 * sin(0.1),
                        3 * cos(1.0) + sin(1.0), 4 * cos(0.1) + 2 * sin(0.1)};
    check_close_f64("rope hs=4", xr, want_r, 8, 1e-15, 1e-14);

    /* Llama-3 frequencies: hs 8, theta 100 -> inv_freq 100^(-i/4), wavelengths 2 pi / f =
     * 6.28, 19.9, 62.8, 198.7. With original 32, low 1, high 4 (wavelength bounds 32 and 8)
     * and factor 8: i=0 high frequency, unchanged; i=1 medium, blended with
     * smooth = (32 / wl - 1) / 3; i=2, 3 low frequency, divided by 8. Read back from the
     * table at t = 1, where the angle is the frequency. */
    double c8[2 * 4], s8[2 * 4];
    ref_rope_tables(c8, s8, 2, 8, 100.0, 1, 8.0, 1.0, 4.0, 32.0);
    double f1 = pow(100.0, -0.25), wl1 = 2 * M_PI / f1, sm = (32.0 / wl1 - 1.0) / 3.0;
    double want_f[4] = {1.0, (1 - sm) * f1 / 8 + sm * f1, pow(100.0, -0.5) / 8, pow(100.0, -0.75) / 8};
    for (int i = 0; i < 4; i++)
        CHECK(fabs(atan2(s8[4 + i], c8[4 + i]) - want_f[i]) < 1e-14, "llama3 freq %d: %.17g want %.17g", i,
              atan2(s8[4 + i], c8[4 + i]), want_f[i]);
    CHECK(c8[0] == 1 && s8[0] == 0, "position 0 must not rotate");

    /* embedding */
    int32_t tok[3] = {2, 0, 2};
    double wte[6] = {1, 2, 3, 4, 5, 6}, eo[6], want_e[6] = {5, 6, 1, 2, 5, 6};
    ref_embedding_forward(eo, tok, wte, 1, 3, 2);
    check_close_f64("embedding", eo, want_e, 6, 0, 0);
}

/* GQA against the MHA reference (ops_ref.c) with every kv head repeated G times, as
 * Hugging Face's repeat_kv does: independent code, same numbers. Also lse, and the
 * backward with dk/dv summed over each group. */
static void test_gqa_vs_mha(int B, int T, int NH, int NKV, int hs) {
    int G = NH / NKV, C = NH * hs, W = (NH + 2 * NKV) * hs;
    size_t rows = (size_t)B * T;
    double *qkv = randn(rows * W, 1, 0), *rep = alloc_f64(rows * 3 * C);
    for (size_t r = 0; r < rows; r++)
        for (int h = 0; h < NH; h++)
            for (int d = 0; d < hs; d++) {
                rep[r * 3 * C + h * hs + d] = qkv[r * W + h * hs + d];
                rep[r * 3 * C + C + h * hs + d] = qkv[r * W + C + (h / G) * hs + d];
                rep[r * 3 * C + 2 * C + h * hs + d] = qkv[r * W + C + NKV * hs + (h / G) * hs + d];
            }
    size_t no = rows * C, nl = (size_t)B * NH * T;
    double *o1 = alloc_f64(no), *l1 = alloc_f64(nl), *o2 = alloc_f64(no), *l2 = alloc_f64(nl);
    ref_attention_gqa_forward(o1, l1, qkv, qkv + C, qkv + C + NKV * hs, W, B, T, NH, NKV, hs);
    ref_attention_forward(o2, l2, rep, B, T, C, NH);
    char what[96];
    snprintf(what, sizeof what, "gqa vs mha+repeat_kv out NH=%d NKV=%d", NH, NKV);
    check_close_f64(what, o1, o2, no, 1e-13, 1e-12);
    check_close_f64("gqa vs mha lse", l1, l2, nl, 1e-13, 1e-12);
    double *dout = randn(no, 1, 0), *g1 = alloc_f64(rows * W), *g2 = alloc_f64(rows * 3 * C);
    ref_attention_gqa_backward(g1, g1 + C, g1 + C + NKV * hs, dout, qkv, qkv + C, qkv + C + NKV * hs, o1, l1, W, B,
                               T, NH, NKV, hs);
    ref_attention_backward(g2, dout, rep, o2, l2, B, T, C, NH);
    double *g2r = alloc_f64(rows * W); /* g2 with each group's dk, dv summed into its kv head */
    for (size_t r = 0; r < rows; r++)
        for (int h = 0; h < NH; h++)
            for (int d = 0; d < hs; d++) {
                g2r[r * W + h * hs + d] = g2[r * 3 * C + h * hs + d];
                g2r[r * W + C + (h / G) * hs + d] += g2[r * 3 * C + C + h * hs + d];
                g2r[r * W + C + NKV * hs + (h / G) * hs + d] += g2[r * 3 * C + 2 * C + h * hs + d];
            }
    check_close_f64("gqa vs mha dq|dk|dv", g1, g2r, rows * W, 1e-12, 1e-11);
    free(qkv), free(rep), free(o1), free(l1), free(o2), free(l2), free(dout), free(g1), free(g2), free(g2r);
}

/* ---------------- rmsnorm ---------------- */

typedef struct rms_ctx {
    int N, H, hs, ld;
    double *inp, *w, *R, *out, *rstd;
} rms_ctx;

static double rms_loss(void *p) {
    rms_ctx *c = p;
    ref_rmsnorm_forward(c->out, c->rstd, c->inp, c->w, c->N, c->H, c->hs, c->ld, 1e-5);
    double s = 0;
    for (int n = 0; n < c->N; n++) s += dot_f64(c->out + (size_t)n * c->ld, c->R + (size_t)n * c->ld, (size_t)c->H * c->hs);
    return s;
}

/* col0: where the normed groups start in each row of ld */
static void test_rmsnorm(int N, int H, int hs, int ld, int col0) {
    size_t n = (size_t)N * ld;
    rms_ctx c = {N, H, hs, ld, randn(n, 1.5, 0.2), randn(hs, 0.3, 1.0), randn(n, 1, 0), alloc_f64(n),
                 alloc_f64((size_t)N * H)};
    int col1 = col0 + H * hs;
    fill_gaps(c.out, N, col0, col1, ld);
    /* the op is called on the group start: shift the pointers */
    rms_ctx cs = c;
    cs.inp += col0, cs.out += col0, cs.R += col0;
    rms_loss(&cs);
    CHECK(gaps_intact(c.out, N, col0, col1, ld), "rmsnorm forward wrote outside its groups");
    double *pre = randn(n, 1, 0), *dx = dup(pre, n), *prew = randn(hs, 1, 0), *dw = dup(prew, hs);
    fill_gaps(pre, N, col0, col1, ld);
    fill_gaps(dx, N, col0, col1, ld);
    ref_rmsnorm_backward(dx + col0, dw, cs.R, cs.inp, c.w, c.rstd, N, H, hs, ld);
    CHECK(gaps_intact(dx, N, col0, col1, ld), "rmsnorm backward wrote outside its groups");
    subtract_prefill(dx, pre, n);
    subtract_prefill(dw, prew, hs);
    double *num = alloc_f64(n);
    numeric_grad(num, c.inp, n, rms_loss, &cs); /* gaps get 0 numerically and 0 analytically */
    char what[96];
    snprintf(what, sizeof what, "rmsnorm dinp N=%d H=%d hs=%d ld=%d", N, H, hs, ld);
    check_grad(what, dx, num, n);
    {   /* the comparison can fail: a backward without the term through rstd (r w dout only) */
        double *wrong = alloc_f64(n);
        size_t wi;
        for (int r = 0; r < N; r++)
            for (int h = 0; h < H; h++)
                for (int i = 0; i < hs; i++) {
                    size_t o = (size_t)r * ld + col0 + (size_t)h * hs + i;
                    wrong[o] = c.rstd[(size_t)r * H + h] * c.w[i] * c.R[o];
                }
        CHECK(grad_excess(wrong, num, n, &wi) > 0, "mutation sanity: a wrong rmsnorm backward passed");
        free(wrong);
    }
    numeric_grad(num, c.w, hs, rms_loss, &cs);
    check_grad("rmsnorm dw", dw, num, hs);
    free(num), free(pre), free(dx), free(prew), free(dw);
    free(c.inp), free(c.w), free(c.R), free(c.out), free(c.rstd);
}

/* ---------------- rope ---------------- */

typedef struct rope_ctx {
    int B, T, H, hs, ld, col0;
    double *x, *cos, *sin, *R, *y;
} rope_ctx;

static double rope_loss(void *p) {
    rope_ctx *c = p;
    size_t n = (size_t)c->B * c->T * c->ld;
    memcpy(c->y, c->x, n * sizeof(double));
    ref_rope_forward(c->y + c->col0, c->cos, c->sin, c->B, c->T, c->H, c->hs, c->ld);
    return dot_f64(c->y, c->R, n);
}

/* heads start at column col0 of rows ld wide; the other columns pass through, so their
 * gradient is R itself and the in-place backward must leave them alone */
static void test_rope(int B, int T, int H, int hs, int ld, int col0, int llama3) {
    size_t n = (size_t)B * T * ld, nt = (size_t)T * hs / 2;
    rope_ctx c = {B, T, H, hs, ld, col0, randn(n, 1, 0), alloc_f64(nt), alloc_f64(nt), randn(n, 1, 0),
                  alloc_f64(n)};
    ref_rope_tables(c.cos, c.sin, T, hs, 10000.0, llama3, 8.0, 1.0, 4.0, 8.0);
    double *dx = dup(c.R, n), *num = alloc_f64(n);
    ref_rope_backward(dx + col0, c.cos, c.sin, B, T, H, hs, ld);
    numeric_grad(num, c.x, n, rope_loss, &c);
    char what[96];
    snprintf(what, sizeof what, "rope dx B=%d T=%d H=%d hs=%d ld=%d llama3=%d", B, T, H, hs, ld, llama3);
    check_grad(what, dx, num, n);
    /* backward then forward is the identity (the rotation is orthogonal) */
    double *z = randn(n, 1, 0), *z0 = dup(z, n);
    ref_rope_forward(z + col0, c.cos, c.sin, B, T, H, hs, ld);
    ref_rope_backward(z + col0, c.cos, c.sin, B, T, H, hs, ld);
    check_close_f64("rope backward(forward(x)) == x", z, z0, n, 1e-14, 1e-14);
    free(z), free(z0), free(num), free(dx);
    free(c.x), free(c.cos), free(c.sin), free(c.R), free(c.y);
}

/* ---------------- swiglu ---------------- */

typedef struct sw_ctx {
    int N, F;
    double *inp, *R, *out;
} sw_ctx;

static double sw_loss(void *p) {
    sw_ctx *c = p;
    ref_swiglu_forward(c->out, c->inp, c->N, c->F);
    return dot_f64(c->out, c->R, (size_t)c->N * c->F);
}

static void test_swiglu(int N, int F) {
    size_t n = (size_t)N * F;
    sw_ctx c = {N, F, randn(2 * n, 2.0, 0), randn(n, 1, 0), alloc_f64(n)};
    c.inp[0] = 0, c.inp[1] = -8, c.inp[2] = 8; /* the middle and both tails of silu */
    double *pre = randn(2 * n, 1, 0), *dx = dup(pre, 2 * n), *num = alloc_f64(2 * n);
    ref_swiglu_backward(dx, c.inp, c.R, N, F);
    subtract_prefill(dx, pre, 2 * n);
    numeric_grad(num, c.inp, 2 * n, sw_loss, &c);
    check_grad("swiglu dinp", dx, num, 2 * n);
    free(pre), free(dx), free(num), free(c.inp), free(c.R), free(c.out);
}

/* ---------------- embedding ---------------- */

typedef struct emb_ctx {
    int B, T, C;
    int32_t *inp;
    double *wte, *R, *out;
} emb_ctx;

static double emb_loss(void *p) {
    emb_ctx *c = p;
    ref_embedding_forward(c->out, c->inp, c->wte, c->B, c->T, c->C);
    return dot_f64(c->out, c->R, (size_t)c->B * c->T * c->C);
}

static void test_embedding(int B, int T, int C, int V) {
    size_t n = (size_t)B * T * C, nv = (size_t)V * C;
    emb_ctx c = {B, T, C, malloc(sizeof(int32_t) * B * T), randn(nv, 1, 0), randn(n, 1, 0), alloc_f64(n)};
    for (int i = 0; i < B * T; i++) c.inp[i] = (int32_t)(st_rng_u64(&rng) % (uint64_t)(V / 2 + 1));
    c.inp[B * T - 1] = c.inp[0];
    double *pre = randn(nv, 1, 0), *dw = dup(pre, nv), *num = alloc_f64(nv);
    ref_embedding_backward(dw, c.R, c.inp, B, T, C);
    subtract_prefill(dw, pre, nv);
    numeric_grad(num, c.wte, nv, emb_loss, &c);
    check_grad("embedding dwte", dw, num, nv);
    free(pre), free(dw), free(num), free(c.inp), free(c.wte), free(c.R), free(c.out);
}

/* ---------------- grouped-query attention ---------------- */

typedef struct gqa_ctx {
    int B, T, NH, NKV, hs, ld;
    double *buf, *R, *out, *lse; /* buf rows: [pad | q | k | v | pad], q at column 1 */
} gqa_ctx;

#define GQA_COL0 1

static double gqa_loss(void *p) {
    gqa_ctx *c = p;
    const double *q = c->buf + GQA_COL0, *k = q + c->NH * c->hs, *v = k + c->NKV * c->hs;
    ref_attention_gqa_forward(c->out, c->lse, q, k, v, c->ld, c->B, c->T, c->NH, c->NKV, c->hs);
    return dot_f64(c->out, c->R, (size_t)c->B * c->T * c->NH * c->hs);
}

static void test_gqa(int B, int T, int NH, int NKV, int hs) {
    int W = (NH + 2 * NKV) * hs, ld = W + 3;
    size_t rows = (size_t)B * T, n = rows * ld, no = rows * NH * hs;
    gqa_ctx c = {B, T, NH, NKV, hs, ld, randn(n, 1, 0), randn(no, 1, 0), alloc_f64(no),
                 alloc_f64((size_t)B * NH * T)};
    gqa_loss(&c);
    double *pre = randn(n, 1, 0), *g = dup(pre, n);
    fill_gaps(pre, rows, GQA_COL0, GQA_COL0 + W, ld);
    fill_gaps(g, rows, GQA_COL0, GQA_COL0 + W, ld);
    double *dq = g + GQA_COL0, *dk = dq + NH * hs, *dv = dk + NKV * hs;
    const double *q = c.buf + GQA_COL0, *k = q + NH * hs, *v = k + NKV * hs;
    ref_attention_gqa_backward(dq, dk, dv, c.R, q, k, v, c.out, c.lse, ld, B, T, NH, NKV, hs);
    CHECK(gaps_intact(g, rows, GQA_COL0, GQA_COL0 + W, ld), "gqa backward wrote outside q, k, v");
    subtract_prefill(g, pre, n);
    double *num = alloc_f64(n);
    numeric_grad(num, c.buf, n, gqa_loss, &c);
    char what[96];
    snprintf(what, sizeof what, "gqa dq|dk|dv B=%d T=%d NH=%d NKV=%d hs=%d", B, T, NH, NKV, hs);
    check_grad(what, g, num, n);
    if (NH > NKV) { /* the comparison can fail: dk, dv from only the last query head of each group */
        double *wrong = dup(g, n);
        size_t wi;
        for (size_t r = 0; r < rows; r++)
            for (int i = 0; i < 2 * NKV * hs; i++) wrong[r * ld + GQA_COL0 + NH * hs + i] = 0;
        int G = NH / NKV;
        /* rerun with every query head but the last of each group masked out of dout */
        double *R1 = dup(c.R, no);
        for (size_t r = 0; r < rows; r++)
            for (int h = 0; h < NH; h++)
                if (h % G != G - 1)
                    for (int d = 0; d < hs; d++) R1[r * NH * hs + h * hs + d] = 0;
        double *dq1 = alloc_f64(n);
        ref_attention_gqa_backward(dq1 + GQA_COL0, dq1 + GQA_COL0 + NH * hs, dq1 + GQA_COL0 + (NH + NKV) * hs, R1, q,
                                   k, v, c.out, c.lse, ld, B, T, NH, NKV, hs);
        for (size_t r = 0; r < rows; r++)
            for (int i = 0; i < 2 * NKV * hs; i++)
                wrong[r * ld + GQA_COL0 + NH * hs + i] = dq1[r * ld + GQA_COL0 + NH * hs + i];
        CHECK(grad_excess(wrong, num, n, &wi) > 0, "mutation sanity: dk/dv without the group sum passed");
        free(wrong), free(R1), free(dq1);
    }
    free(pre), free(g), free(num), free(c.buf), free(c.R), free(c.out), free(c.lse);
}

int main(void) {
    st_rng_seed(&rng, 20241129);
    test_forward_values();
    test_gqa_vs_mha(2, 7, 4, 2, 3);
    test_gqa_vs_mha(1, 9, 3, 1, 4); /* multi-query */
    test_gqa_vs_mha(2, 5, 2, 2, 4); /* NKV == NH: plain MHA */

    test_embedding(2, 5, 6, 11);
    test_rmsnorm(7, 1, 10, 10, 0);  /* per token */
    test_rmsnorm(5, 3, 4, 19, 2);   /* per head, strided, offset in the row */
    test_rope(2, 6, 2, 8, 16 + 5, 3, 0);
    test_rope(1, 9, 3, 4, 12, 0, 1);
    test_swiglu(5, 7);
    test_gqa(2, 6, 4, 2, 3);
    test_gqa(1, 11, 3, 1, 4); /* multi-query, T spans many masked pairs */
    test_gqa(2, 4, 2, 2, 2);  /* no sharing */
    return test_finish("ops_llama_fd");
}
