/* test_ops_diff.c - the fast CPU backend against the double reference backend ("ref"),
 * op by op, forward and backward, on the same random float inputs.
 *
 * Each op runs on each backend through the vtable (alloc, copy_to_device, op,
 * copy_to_host), so the test would run unchanged against a device backend. Outputs an
 * op writes are pre-filled with NaN (an element the fast op forgets to write fails);
 * outputs it accumulates into are pre-filled with the same random values on both
 * backends (an op that overwrites instead of adding fails). So that agreement cannot
 * come from both backends overwriting, every backward also runs a third time, on ref
 * with zeroed gradients, and ref(prefill) = prefill + ref(zeros) is checked. Backward
 * ops get the forward results of their own backend (mean/rstd, out/lse), as in training.
 *
 * Tolerances, per element: |fast - ref| <= atol * max|ref| + rtol * |ref|, where the
 * absolute part is scaled by the array's largest magnitude so it means "relative to
 * the size of this tensor" (gradients are small numbers). ref is computed in double
 * from the float inputs and rounded once, so the difference is the fast backend's own
 * float rounding: ~eps_f32 = 6e-8 per operation, growing like sqrt(K) for K-term sums.
 *   elementwise (encoder, residual, gelu):   atol 1e-6, rtol 1e-5
 *   gelu backward:                           atol 1e-5, rtol 1e-5: in float the
 *       derivative's 1 - sigmoid(2u) cancels for x ~ 5, leaving ~2e-6 absolute error
 *       on a derivative of ~1 (measured: x = 4.96, fast 1.0000039 vs ref 1.0000020)
 *   layernorm, cross-entropy:                atol 1e-5, rtol 1e-4
 *   matmul, every sum length K <= 256:       atol 1e-5, rtol 1e-4
 *   matmul with some K > 256 (C for out, OC for dinp, N for dw; up to 1024):
 *                                            atol 3e-5, rtol 1e-4
 *   attention (T up to 128, exp/softmax):    atol 3e-5, rtol 3e-4
 * Set STRATA_TEST_VERBOSE=1 to print each comparison's worst error as a fraction of
 * its tolerance (the margin; a healthy backend sits well below 1).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "strata/backend.h"
#include "strata/core.h"
#include "testutil.h"

#define TOL_EW_ATOL 1e-6
#define TOL_EW_RTOL 1e-5
#define TOL_GELU_BWD_ATOL 1e-5
#define TOL_GELU_BWD_RTOL 1e-5
#define TOL_LN_ATOL 1e-5
#define TOL_LN_RTOL 1e-4
#define TOL_MM_ATOL 1e-5
#define TOL_MM_RTOL 1e-4
#define TOL_MMK_ATOL 3e-5
#define TOL_MMK_RTOL 1e-4
#define TOL_ATT_ATOL 3e-5
#define TOL_ATT_RTOL 3e-4

#define OPS_DIFF_NAME "test_ops_diff"
#include "ops_diff_common.h"

static float *zero_buf; /* ZERO_N zeros on the host */
#define ZERO_N ((size_t)1 << 20)

/* The host values an accumulated (+=) output starts from in this run. */
static const float *prefill(int run, const float *g, size_t n) {
    if (run != REF0) return g;
    if (n > ZERO_N) {
        fprintf(stderr, "test_ops_diff: zero buffer too small for %zu\n", n);
        exit(1);
    }
    return zero_buf;
}

/* ---------------------------------------------------------------- encoder */

static void test_encoder(int B, int T, int C, int V) {
    int maxT = T + 3; /* wpe has more rows (block size) than the batch uses */
    size_t n = (size_t)B * T * C, nte = (size_t)V * C, npe = (size_t)maxT * C;
    int32_t *tok = xmalloc((size_t)B * T * sizeof *tok);
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)(st_rng_u64(&rng) % (uint64_t)V);
    for (int i = 0; i < B * T; i += 5) tok[i] = 3; /* many positions share one row of dwte */
    tok[B * T - 1] = V - 1;                        /* the last row is reachable */
    float *wte = host_randn(nte, 0.1f, 0), *wpe = host_randn(npe, 0.02f, 0), *dout = host_randn(n, 1, 0);
    float *g_te = host_randn(nte, 1, 0), *g_pe = host_randn(npe, 1, 0), *nan_out = host_nan(n);
    float *out[RUNS], *dwte[RUNS], *dwpe[RUNS];
    for (int k = 0; k < RUNS; k++) {
        st_backend *be = be_of(k);
        int32_t *d_tok = UPI(be, tok, (size_t)B * T);
        float *d_out = UPF(be, nan_out, n), *d_wte = UPF(be, wte, nte), *d_wpe = UPF(be, wpe, npe);
        be->ops->encoder_forward(be, d_out, d_tok, d_wte, d_wpe, B, T, C);
        float *d_dout = UPF(be, dout, n), *d_gte = UPF(be, prefill(k, g_te, nte), nte);
        float *d_gpe = UPF(be, prefill(k, g_pe, npe), npe);
        be->ops->encoder_backward(be, d_gte, d_gpe, d_dout, d_tok, B, T, C);
        out[k] = down(be, d_out, n);
        dwte[k] = down(be, d_gte, nte);
        dwpe[k] = down(be, d_gpe, npe);
        be->ops->dealloc(be, d_tok), be->ops->dealloc(be, d_wte), be->ops->dealloc(be, d_wpe);
        be->ops->dealloc(be, d_dout);
    }
    char what[128];
    snprintf(what, sizeof what, "encoder_forward out B=%d T=%d C=%d", B, T, C);
    compare(what, out[FAST], out[REF], n, TOL_EW_ATOL, TOL_EW_RTOL);
    snprintf(what, sizeof what, "encoder_backward dwte (+=) V=%d", V);
    compare(what, dwte[FAST], dwte[REF], nte, TOL_EW_ATOL, TOL_EW_RTOL);
    compare("encoder_backward dwpe (+=, rows >= T untouched)", dwpe[FAST], dwpe[REF], npe, TOL_EW_ATOL,
            TOL_EW_RTOL);
    /* rows of wpe past T must keep their prefill exactly */
    CHECK(memcmp(dwpe[FAST] + (size_t)T * C, g_pe + (size_t)T * C, (size_t)(maxT - T) * C * sizeof(float)) == 0,
          "encoder_backward wrote dwpe rows past T");
    check_accum("encoder dwte", dwte[REF], g_te, dwte[REF0], nte);
    check_accum("encoder dwpe", dwpe[REF], g_pe, dwpe[REF0], npe);
    free_runs(out), free_runs(dwte), free_runs(dwpe);
    free(tok), free(wte), free(wpe), free(dout), free(g_te), free(g_pe), free(nan_out);
}

/* ---------------------------------------------------------------- layernorm */

static void test_layernorm(int N, int C) {
    size_t n = (size_t)N * C;
    float *x = host_randn(n, 1.5f, 0.3f), *w = host_randn(C, 0.2f, 1.0f), *b = host_randn(C, 0.2f, 0);
    float *dout = host_randn(n, 1, 0), *g_x = host_randn(n, 1, 0), *g_w = host_randn(C, 1, 0);
    float *g_b = host_randn(C, 1, 0), *nan_n = host_nan(n), *nan_N = host_nan(N);
    float *out[RUNS], *mean[RUNS], *rstd[RUNS], *dx[RUNS], *dw[RUNS], *db[RUNS];
    for (int k = 0; k < RUNS; k++) {
        st_backend *be = be_of(k);
        float *d_x = UPF(be, x, n), *d_w = UPF(be, w, C), *d_b = UPF(be, b, C);
        float *d_out = UPF(be, nan_n, n), *d_mean = UPF(be, nan_N, N), *d_rstd = UPF(be, nan_N, N);
        be->ops->layernorm_forward(be, d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C);
        float *d_dout = UPF(be, dout, n), *d_gx = UPF(be, prefill(k, g_x, n), n);
        float *d_gw = UPF(be, prefill(k, g_w, C), C), *d_gb = UPF(be, prefill(k, g_b, C), C);
        be->ops->layernorm_backward(be, d_gx, d_gw, d_gb, d_dout, d_x, d_w, d_mean, d_rstd, N, C);
        out[k] = down(be, d_out, n), mean[k] = down(be, d_mean, N), rstd[k] = down(be, d_rstd, N);
        dx[k] = down(be, d_gx, n), dw[k] = down(be, d_gw, C), db[k] = down(be, d_gb, C);
        be->ops->dealloc(be, d_x), be->ops->dealloc(be, d_w), be->ops->dealloc(be, d_b);
        be->ops->dealloc(be, d_dout);
    }
    char what[128];
    snprintf(what, sizeof what, "layernorm_forward out N=%d C=%d", N, C);
    compare(what, out[FAST], out[REF], n, TOL_LN_ATOL, TOL_LN_RTOL);
    compare("layernorm_forward mean", mean[FAST], mean[REF], N, TOL_LN_ATOL, TOL_LN_RTOL);
    compare("layernorm_forward rstd", rstd[FAST], rstd[REF], N, TOL_LN_ATOL, TOL_LN_RTOL);
    compare("layernorm_backward dinp (+=)", dx[FAST], dx[REF], n, TOL_LN_ATOL, TOL_LN_RTOL);
    compare("layernorm_backward dw (+=)", dw[FAST], dw[REF], C, TOL_LN_ATOL, TOL_LN_RTOL);
    compare("layernorm_backward db (+=)", db[FAST], db[REF], C, TOL_LN_ATOL, TOL_LN_RTOL);
    check_accum("layernorm dinp", dx[REF], g_x, dx[REF0], n);
    check_accum("layernorm dw", dw[REF], g_w, dw[REF0], C);
    check_accum("layernorm db", db[REF], g_b, db[REF0], C);
    free_runs(out), free_runs(mean), free_runs(rstd), free_runs(dx), free_runs(dw), free_runs(db);
    free(x), free(w), free(b), free(dout), free(g_x), free(g_w), free(g_b), free(nan_n), free(nan_N);
}

/* ---------------------------------------------------------------- matmul */

/* grads: bit 0 dinp, bit 1 dw, bit 2 dbias (the others are passed as NULL). */
static void test_matmul(int N, int C, int OC, st_wlayout layout, int with_bias, int grads) {
    size_t ni = (size_t)N * C, nw = (size_t)C * OC, no = (size_t)N * OC;
    int large_k = C > 256 || OC > 256 || N > 256;
    double atol = large_k ? TOL_MMK_ATOL : TOL_MM_ATOL, rtol = large_k ? TOL_MMK_RTOL : TOL_MM_RTOL;
    float *x = host_randn(ni, 1, 0), *w = host_randn(nw, 0.05f, 0), *bias = host_randn(OC, 0.5f, 0);
    float *dout = host_randn(no, 1, 0), *g_x = host_randn(ni, 1, 0), *g_w = host_randn(nw, 1, 0);
    float *g_b = host_randn(OC, 1, 0), *nan_o = host_nan(no);
    float *out[RUNS], *dx[RUNS] = {0}, *dw[RUNS] = {0}, *db[RUNS] = {0};
    for (int k = 0; k < RUNS; k++) {
        st_backend *be = be_of(k);
        float *d_x = UPF(be, x, ni), *d_w = UPF(be, w, nw), *d_bias = with_bias ? UPF(be, bias, OC) : NULL;
        float *d_out = UPF(be, nan_o, no);
        be->ops->matmul_forward(be, d_out, d_x, d_w, d_bias, N, C, OC, layout);
        float *d_dout = UPF(be, dout, no);
        float *d_gx = grads & 1 ? UPF(be, prefill(k, g_x, ni), ni) : NULL;
        float *d_gw = grads & 2 ? UPF(be, prefill(k, g_w, nw), nw) : NULL;
        float *d_gb = grads & 4 ? UPF(be, prefill(k, g_b, OC), OC) : NULL;
        be->ops->matmul_backward(be, d_gx, d_gw, d_gb, d_dout, d_x, d_w, N, C, OC, layout);
        out[k] = down(be, d_out, no);
        if (d_gx) dx[k] = down(be, d_gx, ni);
        if (d_gw) dw[k] = down(be, d_gw, nw);
        if (d_gb) db[k] = down(be, d_gb, OC);
        be->ops->dealloc(be, d_x), be->ops->dealloc(be, d_w), be->ops->dealloc(be, d_dout);
        if (d_bias) be->ops->dealloc(be, d_bias);
    }
    char what[160], tag[96];
    snprintf(tag, sizeof tag, "matmul %s N=%d C=%d OC=%d bias=%d grads=%d",
             layout == ST_W_IN_OUT ? "in_out" : "out_in", N, C, OC, with_bias, grads);
    snprintf(what, sizeof what, "%s out", tag);
    compare(what, out[FAST], out[REF], no, atol, rtol);
    if (grads & 1) {
        snprintf(what, sizeof what, "%s dinp (+=)", tag);
        compare(what, dx[FAST], dx[REF], ni, atol, rtol);
        check_accum(what, dx[REF], g_x, dx[REF0], ni);
    }
    if (grads & 2) {
        snprintf(what, sizeof what, "%s dw (+=)", tag);
        compare(what, dw[FAST], dw[REF], nw, atol, rtol);
        check_accum(what, dw[REF], g_w, dw[REF0], nw);
    }
    if (grads & 4) {
        snprintf(what, sizeof what, "%s dbias (+=)", tag);
        compare(what, db[FAST], db[REF], OC, atol, rtol);
        check_accum(what, db[REF], g_b, db[REF0], OC);
    }
    free_runs(out), free_runs(dx), free_runs(dw), free_runs(db);
    free(x), free(w), free(bias), free(dout), free(g_x), free(g_w), free(g_b), free(nan_o);
}

/* ---------------------------------------------------------------- attention */

static void test_attention(int B, int T, int C, int NH, float qk_scale) {
    size_t n = (size_t)B * T * C, nq = 3 * n, nl = (size_t)B * NH * T;
    float *qkv = host_randn(nq, 1, 0);
    /* q and k larger than v, so some softmax rows are peaked and others flat */
    for (size_t r = 0; r < (size_t)B * T; r++)
        for (int c = 0; c < 2 * C; c++) qkv[r * 3 * C + c] *= qk_scale;
    float *dout = host_randn(n, 1, 0), *g_q = host_randn(nq, 1, 0), *nan_o = host_nan(n), *nan_l = host_nan(nl);
    float *out[RUNS], *lse[RUNS], *dq[RUNS];
    for (int k = 0; k < RUNS; k++) {
        st_backend *be = be_of(k);
        float *d_qkv = UPF(be, qkv, nq), *d_out = UPF(be, nan_o, n), *d_lse = UPF(be, nan_l, nl);
        be->ops->attention_forward(be, d_out, d_lse, d_qkv, B, T, C, NH);
        float *d_dout = UPF(be, dout, n), *d_gq = UPF(be, prefill(k, g_q, nq), nq);
        be->ops->attention_backward(be, d_gq, d_dout, d_qkv, d_out, d_lse, B, T, C, NH);
        out[k] = down(be, d_out, n), lse[k] = down(be, d_lse, nl), dq[k] = down(be, d_gq, nq);
        be->ops->dealloc(be, d_qkv), be->ops->dealloc(be, d_dout);
    }
    char what[128];
    snprintf(what, sizeof what, "attention_forward out B=%d T=%d C=%d NH=%d qk*%.1f", B, T, C, NH, qk_scale);
    compare(what, out[FAST], out[REF], n, TOL_ATT_ATOL, TOL_ATT_RTOL);
    compare("attention_forward lse", lse[FAST], lse[REF], nl, TOL_ATT_ATOL, TOL_ATT_RTOL);
    compare("attention_backward dqkv (+=)", dq[FAST], dq[REF], nq, TOL_ATT_ATOL, TOL_ATT_RTOL);
    check_accum("attention dqkv", dq[REF], g_q, dq[REF0], nq);
    free_runs(out), free_runs(lse), free_runs(dq);
    free(qkv), free(dout), free(g_q), free(nan_o), free(nan_l);
}

/* ---------------------------------------------------------------- gelu, residual */

static void test_elementwise(int n) {
    float *x = host_randn(n, 2.5f, 0), *y = host_randn(n, 1, 0), *dout = host_randn(n, 1, 0);
    float *g_x = host_randn(n, 1, 0), *g_y = host_randn(n, 1, 0), *nan_n = host_nan(n);
    x[0] = 0, x[1] = -12, x[2] = 12, x[3] = -3, x[4] = 1e-4f; /* saturated tails, the middle */
    float *gout[RUNS], *gdx[RUNS], *rout[RUNS], *rda[RUNS], *rdb[RUNS];
    for (int k = 0; k < RUNS; k++) {
        st_backend *be = be_of(k);
        float *d_x = UPF(be, x, n), *d_y = UPF(be, y, n), *d_dout = UPF(be, dout, n);
        float *d_gout = UPF(be, nan_n, n), *d_gdx = UPF(be, prefill(k, g_x, n), n);
        be->ops->gelu_forward(be, d_gout, d_x, n);
        be->ops->gelu_backward(be, d_gdx, d_x, d_dout, n);
        float *d_rout = UPF(be, nan_n, n), *d_ra = UPF(be, prefill(k, g_x, n), n);
        float *d_rb = UPF(be, prefill(k, g_y, n), n);
        be->ops->residual_forward(be, d_rout, d_x, d_y, n);
        be->ops->residual_backward(be, d_ra, d_rb, d_dout, n);
        gout[k] = down(be, d_gout, n), gdx[k] = down(be, d_gdx, n);
        rout[k] = down(be, d_rout, n), rda[k] = down(be, d_ra, n), rdb[k] = down(be, d_rb, n);
        be->ops->dealloc(be, d_x), be->ops->dealloc(be, d_y), be->ops->dealloc(be, d_dout);
    }
    char what[96];
    snprintf(what, sizeof what, "gelu_forward out n=%d", n);
    compare(what, gout[FAST], gout[REF], n, TOL_EW_ATOL, TOL_EW_RTOL);
    compare("gelu_backward dinp (+=)", gdx[FAST], gdx[REF], n, TOL_GELU_BWD_ATOL, TOL_GELU_BWD_RTOL);
    compare("residual_forward out", rout[FAST], rout[REF], n, TOL_EW_ATOL, TOL_EW_RTOL);
    compare("residual_backward da (+=)", rda[FAST], rda[REF], n, TOL_EW_ATOL, TOL_EW_RTOL);
    compare("residual_backward db (+=)", rdb[FAST], rdb[REF], n, TOL_EW_ATOL, TOL_EW_RTOL);
    check_accum("gelu dinp", gdx[REF], g_x, gdx[REF0], n);
    check_accum("residual da", rda[REF], g_x, rda[REF0], n);
    check_accum("residual db", rdb[REF], g_y, rdb[REF0], n);
    free_runs(gout), free_runs(gdx), free_runs(rout), free_runs(rda), free_runs(rdb);
    free(x), free(y), free(dout), free(g_x), free(g_y), free(nan_n);
}

/* ---------------------------------------------------------------- write variants
 * matmul_backward_write, gelu_backward_write, attention_backward_write: the input gradient
 * pre-filled with NaN, so a variant that reads (adds to) it fails; on the fast backend
 * equal element for element to the accumulating op run from a zeroed gradient (the bits the
 * model had when it cleared first), and within the op's tolerance of ref's write variant.
 * The parameter gradients (dw, dbias) still accumulate: pre-filled with random values. */

static void check_same(const char *what, const float *a, const float *b, size_t n) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (!(a[i] == b[i]) && !bad++) first = i;
    CHECK(!bad, "%s: %zu of %zu elements differ from the accumulating op (first %zu: %.9g vs %.9g)", what, bad, n,
          first, bad ? a[first] : 0.0, bad ? b[first] : 0.0);
}

static void test_write_matmul(int N, int C, int OC, st_wlayout layout) {
    size_t ni = (size_t)N * C, nw = (size_t)C * OC, no = (size_t)N * OC;
    int large_k = C > 256 || OC > 256 || N > 256;
    double atol = large_k ? TOL_MMK_ATOL : TOL_MM_ATOL, rtol = large_k ? TOL_MMK_RTOL : TOL_MM_RTOL;
    float *x = host_randn(ni, 1, 0), *w = host_randn(nw, 0.05f, 0), *dout = host_randn(no, 1, 0);
    float *g_w = host_randn(nw, 1, 0), *g_b = host_randn(OC, 1, 0), *nan_i = host_nan(ni), *zero_i = calloc(ni, 4);
    float *dx[3], *dw[3], *db[3]; /* fast write, ref write, fast accumulate from zeros */
    for (int k = 0; k < 3; k++) {
        st_backend *be = bes[k == 1 ? REF : FAST];
        float *d_x = UPF(be, x, ni), *d_w = UPF(be, w, nw), *d_dout = UPF(be, dout, no);
        float *d_gx = UPF(be, k == 2 ? zero_i : nan_i, ni), *d_gw = UPF(be, g_w, nw), *d_gb = UPF(be, g_b, OC);
        if (k < 2) be->ops->matmul_backward_write(be, d_gx, d_gw, d_gb, d_dout, d_x, d_w, N, C, OC, layout);
        else be->ops->matmul_backward(be, d_gx, d_gw, d_gb, d_dout, d_x, d_w, N, C, OC, layout);
        dx[k] = down(be, d_gx, ni), dw[k] = down(be, d_gw, nw), db[k] = down(be, d_gb, OC);
        be->ops->dealloc(be, d_x), be->ops->dealloc(be, d_w), be->ops->dealloc(be, d_dout);
    }
    char what[160], tag[96];
    snprintf(tag, sizeof tag, "matmul_backward_write %s N=%d C=%d OC=%d", layout == ST_W_IN_OUT ? "in_out" : "out_in",
             N, C, OC);
    snprintf(what, sizeof what, "%s dinp (=)", tag);
    compare(what, dx[0], dx[1], ni, atol, rtol);
    check_same(what, dx[0], dx[2], ni);
    snprintf(what, sizeof what, "%s dw (+=)", tag);
    compare(what, dw[0], dw[1], nw, atol, rtol);
    check_same(what, dw[0], dw[2], nw);
    snprintf(what, sizeof what, "%s dbias (+=)", tag);
    compare(what, db[0], db[1], OC, atol, rtol);
    check_same(what, db[0], db[2], OC);
    for (int k = 0; k < 3; k++) free(dx[k]), free(dw[k]), free(db[k]);
    free(x), free(w), free(dout), free(g_w), free(g_b), free(nan_i), free(zero_i);
}

static void test_write_gelu(int n) {
    float *x = host_randn(n, 2.5f, 0), *dout = host_randn(n, 1, 0), *nan_n = host_nan(n), *zero_n = calloc(n, 4);
    float *dx[3];
    for (int k = 0; k < 3; k++) {
        st_backend *be = bes[k == 1 ? REF : FAST];
        float *d_x = UPF(be, x, n), *d_dout = UPF(be, dout, n), *d_gx = UPF(be, k == 2 ? zero_n : nan_n, n);
        if (k < 2) be->ops->gelu_backward_write(be, d_gx, d_x, d_dout, n);
        else be->ops->gelu_backward(be, d_gx, d_x, d_dout, n);
        dx[k] = down(be, d_gx, n);
        be->ops->dealloc(be, d_x), be->ops->dealloc(be, d_dout);
    }
    char what[96];
    snprintf(what, sizeof what, "gelu_backward_write dinp (=) n=%d", n);
    compare(what, dx[0], dx[1], n, TOL_GELU_BWD_ATOL, TOL_GELU_BWD_RTOL);
    check_same(what, dx[0], dx[2], n);
    for (int k = 0; k < 3; k++) free(dx[k]);
    free(x), free(dout), free(nan_n), free(zero_n);
}

/* doc: 0 causal, else documents starting every doc tokens of each row */
static void test_write_attention(int B, int T, int C, int NH, int doc) {
    size_t n = (size_t)B * T * C, nq = 3 * n, nl = (size_t)B * NH * T;
    float *qkv = host_randn(nq, 1, 0), *dout = host_randn(n, 1, 0), *nan_q = host_nan(nq), *zero_q = calloc(nq, 4);
    int32_t *ds = malloc(sizeof(int32_t) * (size_t)B * T);
    for (int i = 0; i < B * T; i++) ds[i] = doc ? (i % T) / doc * doc : 0;
    float *dq[3];
    for (int k = 0; k < 3; k++) {
        st_backend *be = bes[k == 1 ? REF : FAST];
        float *d_qkv = UPF(be, qkv, nq), *d_out = UPF(be, nan_q, n), *d_lse = UPF(be, nan_q, nl);
        int32_t *d_ds = doc ? UPI(be, ds, (size_t)B * T) : NULL;
        if (doc) be->ops->attention_doc_forward(be, d_out, d_lse, d_qkv, d_ds, B, T, C, NH);
        else be->ops->attention_forward(be, d_out, d_lse, d_qkv, B, T, C, NH);
        float *d_dout = UPF(be, dout, n), *d_gq = UPF(be, k == 2 ? zero_q : nan_q, nq);
        if (k < 2) be->ops->attention_backward_write(be, d_gq, d_dout, d_qkv, d_out, d_lse, d_ds, B, T, C, NH);
        else if (doc) be->ops->attention_doc_backward(be, d_gq, d_dout, d_qkv, d_out, d_lse, d_ds, B, T, C, NH);
        else be->ops->attention_backward(be, d_gq, d_dout, d_qkv, d_out, d_lse, B, T, C, NH);
        dq[k] = down(be, d_gq, nq);
        be->ops->dealloc(be, d_qkv), be->ops->dealloc(be, d_dout), be->ops->dealloc(be, d_out);
        be->ops->dealloc(be, d_lse);
        if (d_ds) be->ops->dealloc(be, d_ds);
    }
    char what[128];
    snprintf(what, sizeof what, "attention_backward_write dqkv (=) B=%d T=%d C=%d NH=%d doc=%d", B, T, C, NH, doc);
    compare(what, dq[0], dq[1], nq, TOL_ATT_ATOL, TOL_ATT_RTOL);
    check_same(what, dq[0], dq[2], nq);
    for (int k = 0; k < 3; k++) free(dq[k]);
    free(qkv), free(dout), free(nan_q), free(zero_q), free(ds);
}

/* ---------------------------------------------------------------- cross-entropy */

static void test_crossentropy(int N, int V, float logit_scale) {
    size_t nl = (size_t)N * V;
    float *logits = host_randn(nl, logit_scale, 0), *nan_N = host_nan(N);
    int32_t *tg = xmalloc((size_t)N * sizeof *tg);
    int unmasked = 0;
    for (int i = 0; i < N; i++) {
        tg[i] = (int32_t)(st_rng_u64(&rng) % (uint64_t)V);
        if (N > 2 && i % 7 == 2) tg[i] = -1; /* masked positions (e.g. padding) */
        unmasked += tg[i] >= 0;
    }
    tg[0] = V - 1;
    float dloss = 1.0f / (float)(unmasked > 0 ? unmasked : 1); /* the mean over unmasked tokens */
    float *loss[RUNS], *dl[RUNS], *loss0[RUNS], *l0[RUNS];
    for (int k = 0; k < RUNS; k++) {
        st_backend *be = be_of(k);
        int32_t *d_tg = UPI(be, tg, N);
        /* dloss = 0: losses only, logits must stay as they were */
        float *d_l0 = UPF(be, logits, nl), *d_loss0 = UPF(be, nan_N, N);
        be->ops->crossentropy_forward_backward(be, d_l0, d_loss0, d_tg, N, V, 0.0f);
        float *d_l = UPF(be, logits, nl), *d_loss = UPF(be, nan_N, N);
        be->ops->crossentropy_forward_backward(be, d_l, d_loss, d_tg, N, V, dloss);
        loss0[k] = down(be, d_loss0, N), l0[k] = down(be, d_l0, nl);
        loss[k] = down(be, d_loss, N), dl[k] = down(be, d_l, nl);
        be->ops->dealloc(be, d_tg);
    }
    char what[128];
    snprintf(what, sizeof what, "crossentropy losses N=%d V=%d scale %.0f", N, V, logit_scale);
    compare(what, loss[FAST], loss[REF], N, TOL_LN_ATOL, TOL_LN_RTOL);
    compare("crossentropy dlogits (in place)", dl[FAST], dl[REF], nl, TOL_LN_ATOL, TOL_LN_RTOL);
    compare("crossentropy losses (dloss 0)", loss0[FAST], loss0[REF], N, TOL_LN_ATOL, TOL_LN_RTOL);
    CHECK(memcmp(l0[FAST], logits, nl * sizeof(float)) == 0, "crossentropy with dloss 0 changed the logits");
    int masked_ok = 1;
    for (int i = 0; i < N; i++)
        if (tg[i] < 0) {
            masked_ok &= loss[FAST][i] == 0;
            for (int v = 0; v < V; v++) masked_ok &= dl[FAST][(size_t)i * V + v] == 0;
        }
    CHECK(masked_ok, "crossentropy: a masked row has nonzero loss or dlogits");
    free_runs(loss), free_runs(dl), free_runs(loss0), free_runs(l0);
    free(logits), free(nan_N), free(tg);
}

/* ---------------------------------------------------------------- bf16 conversions
 * to_bf16 on n fp32 patterns (random bits, ties both ways, the largest finite value, which
 * rounds to infinity, infinities, subnormals, signed zeros, NaNs) and from_bf16 on all 65536
 * bf16 patterns: the fast backend bit for bit the reference's (which decodes a bf16 from
 * its fields), NaN for NaN; and every finite normal x within 2^-8 |x| of from(to(x))
 * (half an ulp of 8 significant bits). n crosses the CPU's vector width and its
 * 16 Ki-element chunks. STRATA_CPU_CONVERT=plain runs the CPU's plain loops instead of
 * AVX-512 (ctest ops_diff_convert_plain). */
static int is_nan_bits(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

static void test_bf16_convert(size_t n) {
    uint32_t specials[] = {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0x7f800000u, 0xff800000u,
                           0x00000001u, 0x80000000u, 0x007fffffu, 0x7fc00001u, 0xff800001u, 0x00000000u};
    size_t ns = sizeof specials / sizeof specials[0];
    uint32_t *bits = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) bits[i] = i < ns ? specials[i] : (uint32_t)st_rng_u64(&rng);
    uint16_t *h16[2];
    float *back[2];
    size_t m = 65536;
    uint16_t *all = xmalloc(m * 2);
    for (size_t i = 0; i < m; i++) all[i] = (uint16_t)i;
    float *wide[2];
    for (int k = 0; k < 2; k++) {
        st_backend *be = bes[k];
        CHECK(be->ops->to_bf16 && be->ops->from_bf16, "%s: no to_bf16/from_bf16", be->ops->name);
        if (!be->ops->to_bf16 || !be->ops->from_bf16) return;
        float *d_x = up(be, bits, n * 4), *d_back = be->ops->alloc(be, n * 4), *d_w = be->ops->alloc(be, m * 4);
        uint16_t *d_h = be->ops->alloc(be, n * 2), *d_all = up(be, all, m * 2);
        CHECK(d_back && d_w && d_h, "%s: alloc failed", be->ops->name);
        if (!d_back || !d_w || !d_h) exit(1);
        be->ops->to_bf16(be, d_h, d_x, n);
        be->ops->from_bf16(be, d_back, d_h, n);
        be->ops->from_bf16(be, d_w, d_all, m);
        be->ops->synchronize(be);
        h16[k] = xmalloc(n * 2);
        be->ops->copy_to_host(be, h16[k], d_h, n * 2);
        back[k] = down(be, d_back, n);
        wide[k] = down(be, d_w, m);
        be->ops->dealloc(be, d_x), be->ops->dealloc(be, d_h), be->ops->dealloc(be, d_all);
    }
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (h16[FAST][i] != h16[REF][i] && !bad++) first = i;
    CHECK(bad == 0, "to_bf16 n=%zu: %zu differ from ref (first [%zu] %#010x: %#06x, ref %#06x)", n, bad, first,
          bits[first], h16[FAST][first], h16[REF][first]);
    bad = 0;
    for (size_t i = 0; i < m; i++) {
        uint32_t a, b;
        memcpy(&a, &wide[FAST][i], 4), memcpy(&b, &wide[REF][i], 4);
        int ok = is_nan_bits(b) ? is_nan_bits(a) && a == (uint32_t)i << 16 : a == b;
        if (!ok && !bad++) first = i;
    }
    CHECK(bad == 0, "from_bf16: %zu of 65536 patterns differ from ref (first %#06zx)", bad, first);
    bad = 0;
    for (size_t i = ns; i < n; i++) {
        float x, y = back[FAST][i];
        memcpy(&x, &bits[i], 4);
        if (!isfinite(x) || fabsf(x) < 1.1754944e-38f || fabsf(x) > 3.38e38f) continue; /* normal, not rounding up to inf */
        if (!(fabs((double)y - x) <= ldexp(fabs((double)x), -8)) && !bad++) first = i;
    }
    CHECK(bad == 0, "from_bf16(to_bf16(x)) n=%zu: %zu beyond 2^-8 |x| (first [%zu])", n, bad, first);
    for (int k = 0; k < 2; k++) free(h16[k]), free(back[k]), free(wide[k]);
    free(bits), free(all);
}

int main(void) {
    verbose = getenv("STRATA_TEST_VERBOSE") != NULL;
    st_err err = {0};
    if (st_backend_cpu_create(&bes[FAST], 2, &err) != ST_OK) {
        fprintf(stderr, "ops_diff: cpu backend: %s\n", err.msg);
        return err.code == ST_ERR_UNSUPPORTED ? 77 : 1;
    }
    if (st_backend_ref_create(&bes[REF], &err) != ST_OK) {
        fprintf(stderr, "ops_diff: ref backend: %s\n", err.msg);
        return 1;
    }
    CHECK(strcmp(bes[REF]->ops->name, "ref") == 0, "ref backend name '%s'", bes[REF]->ops->name);
    if (verbose) fprintf(stderr, "ops_diff: %s vs %s\n", bes[FAST]->ops->name, bes[REF]->ops->name);
    zero_buf = calloc(ZERO_N, sizeof *zero_buf);
    if (!zero_buf) return 1;
    st_rng_seed(&rng, 777);

    const int B = 2, T = 33, C = 64, NH = 4, V = 97;
    test_encoder(B, T, C, V);
    test_layernorm(B * T, C);
    test_layernorm(7, 768); /* GPT-2 width: longer row sums */

    for (int layout = 0; layout < 2; layout++) {
        st_wlayout lay = (st_wlayout)layout;
        for (int bias = 0; bias < 2; bias++) test_matmul(B * T, C, 3 * C, lay, bias, 7);
        test_matmul(B * T, C, V, lay, 0, 1 | 2);   /* lm-head shape, no bias */
        test_matmul(B * T, C, 4 * C, lay, 1, 2 | 4); /* dinp NULL */
        test_matmul(B * T, C, 4 * C, lay, 1, 1);     /* dw, dbias NULL */
        test_matmul(B * T, 768, 64, lay, 1, 7);      /* large K forward and dinp... */
        test_matmul(B * T, 64, 1024, lay, 1, 7);     /* ...and K = OC in the dinp product */
        test_matmul(333, 48, 40, lay, 1, 7);         /* dw sums over N = 333 rows */
        test_matmul(1, 3, 5, lay, 1, 7);             /* degenerate sizes */
    }

    test_attention(B, T, C, NH, 1.0f);
    test_attention(B, T, C, NH, 2.5f);
    test_attention(1, 128, 64, 2, 1.5f);  /* hs 32, long rows */
    test_attention(1, 128, 128, 2, 1.0f); /* hs 64, the GPT-2 head size */
    test_attention(3, 1, 16, 2, 1.0f);    /* T = 1: each row sees only itself */

    test_elementwise(B * T * 4 * C);
    test_elementwise(17); /* shorter than any vector width */

    for (int layout = 0; layout < 2; layout++) {
        test_write_matmul(B * T, C, 3 * C, (st_wlayout)layout);
        test_write_matmul(B * T, 64, 1024, (st_wlayout)layout); /* K = OC long in the dinp product */
        test_write_matmul(1, 3, 5, (st_wlayout)layout);
    }
    test_write_gelu(B * T * 4 * C);
    test_write_gelu(17);
    test_write_attention(B, T, C, NH, 0);
    test_write_attention(1, 128, 128, 2, 0);
    test_write_attention(2, 70, 64, 4, 24); /* documents of 24 tokens */

    test_crossentropy(B * T, V, 3.0f);
    test_crossentropy(4, 50257, 10.0f); /* GPT-2 vocabulary, large logits: must not overflow */
    test_crossentropy(2, 2, 1.0f);

    test_bf16_convert(12);
    test_bf16_convert(5 * 16384 + 7); /* over the OpenMP chunks, a tail past the vector width */

    st_backend_free(bes[FAST]);
    st_backend_free(bes[REF]);
    free(zero_buf);
    return test_finish("ops_diff");
}
