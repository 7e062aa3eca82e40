/* test_ops_llama_diff.c - the fast CPU backend's Llama-family ops against the double
 * reference backend ("ref"), forward and backward, on the same random float inputs.
 *
 * As test_ops_diff.c: every op runs through the vtable on each backend; outputs an op
 * writes start as NaN, outputs it accumulates into start from the same random prefill
 * on both backends, and a third run (ref from zeros) checks ref(prefill) = prefill +
 * ref(zeros). Strided operands sit in packed rows with other data around them; those
 * other elements must come back bit-identical (an op that writes outside its groups
 * fails). Backward ops get their own backend's forward results (rstd, out, lse).
 *
 * Tolerances, per element: |fast - ref| <= atol * max|ref| + rtol * |ref| (the absolute
 * part scaled by the tensor's largest magnitude), the fast backend's float rounding:
 *   embedding, rope, swiglu (elementwise):  atol 1e-6, rtol 1e-5
 *   swiglu backward:                        atol 1e-5, rtol 1e-5 (one more product and
 *                                           a sigmoid whose complement is kept exact)
 *   rmsnorm (row sums up to 896 terms):     atol 1e-5, rtol 1e-4
 *   GQA attention (T up to 160):            atol 3e-5, rtol 3e-4, as the MHA attention
 * STRATA_TEST_VERBOSE=1 prints each comparison's worst error as a fraction of tolerance.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/ref/ops_ref.h"
#include "strata/backend.h"
#include "strata/core.h"
#include "testutil.h"

#define TOL_EW_ATOL 1e-6
#define TOL_EW_RTOL 1e-5
#define TOL_SWB_ATOL 1e-5
#define TOL_SWB_RTOL 1e-5
#define TOL_RMS_ATOL 1e-5
#define TOL_RMS_RTOL 1e-4
#define TOL_ATT_ATOL 3e-5
#define TOL_ATT_RTOL 3e-4

#define OPS_DIFF_NAME "test_ops_llama_diff"
#include "ops_diff_common.h"

static float *host_zeros(size_t n) {
    float *p = xmalloc(n * sizeof *p);
    memset(p, 0, n * sizeof *p);
    return p;
}

/* The prefill of an accumulated output in this run: g, or zeros for REF0. */
static const float *prefill(int run, const float *g, const float *zeros) { return run == REF0 ? zeros : g; }

/* Every element outside columns [c0, c1) of rows ld wide equals the original. */
static int outside_intact(const float *got, const float *orig, size_t rows, int c0, int c1, int ld) {
    for (size_t r = 0; r < rows; r++)
        for (int c = 0; c < ld; c++)
            if ((c < c0 || c >= c1) && memcmp(&got[r * ld + c], &orig[r * ld + c], sizeof(float))) return 0;
    return 1;
}

/* ---------------------------------------------------------------- embedding */

static void test_embedding(int B, int T, int C, int V) {
    size_t n = (size_t)B * T * C, nv = (size_t)V * C;
    int32_t *tok = xmalloc((size_t)B * T * sizeof *tok);
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)(st_rng_u64(&rng) % (uint64_t)V);
    for (int i = 0; i < B * T; i += 4) tok[i] = 5; /* one row of dwte from many positions */
    tok[B * T - 1] = V - 1;
    float *wte = host_randn(nv, 0.1f, 0), *dout = host_randn(n, 1, 0), *g = host_randn(nv, 1, 0);
    float *z = host_zeros(nv), *nan_o = host_nan(n), *out[RUNS], *dw[RUNS];
    for (int k = 0; k < RUNS; k++) {
        st_backend *be = be_of(k);
        int32_t *d_tok = UPI(be, tok, (size_t)B * T);
        float *d_out = UPF(be, nan_o, n), *d_wte = UPF(be, wte, nv), *d_dout = UPF(be, dout, n);
        float *d_g = UPF(be, prefill(k, g, z), nv);
        be->ops->embedding_forward(be, d_out, d_tok, d_wte, B, T, C);
        be->ops->embedding_backward(be, d_g, d_dout, d_tok, B, T, C);
        out[k] = down(be, d_out, n), dw[k] = down(be, d_g, nv);
        be->ops->dealloc(be, d_tok), be->ops->dealloc(be, d_wte), be->ops->dealloc(be, d_dout);
    }
    compare("embedding_forward out", out[FAST], out[REF], n, TOL_EW_ATOL, TOL_EW_RTOL);
    compare("embedding_backward dwte (+=)", dw[FAST], dw[REF], nv, TOL_EW_ATOL, TOL_EW_RTOL);
    check_accum("embedding dwte", dw[REF], g, dw[REF0], nv);
    free_runs(out), free_runs(dw);
    free(tok), free(wte), free(dout), free(g), free(z), free(nan_o);
}

/* ---------------------------------------------------------------- rmsnorm */

/* Groups start at column c0 of rows ld wide: H groups of hs. */
static void test_rmsnorm(int N, int H, int hs, int ld, int c0, float eps) {
    size_t n = (size_t)N * ld, nr = (size_t)N * H;
    int c1 = c0 + H * hs;
    float *x = host_randn(n, 1.5f, 0.3f), *w = host_randn(hs, 0.2f, 1.0f), *dout = host_randn(n, 1, 0);
    float *o0 = host_randn(n, 1, 0), *g_x = host_randn(n, 1, 0), *g_w = host_randn(hs, 1, 0);
    float *z = host_zeros(n), *nan_r = host_nan(nr);
    for (size_t r = 0; r < (size_t)N; r++) /* NaN where the op must write */
        for (int c = c0; c < c1; c++) o0[r * ld + c] = NAN;
    float *out[RUNS], *rstd[RUNS], *dx[RUNS], *dw[RUNS];
    for (int k = 0; k < RUNS; k++) {
        st_backend *be = be_of(k);
        float *d_x = UPF(be, x, n), *d_w = UPF(be, w, hs), *d_out = UPF(be, o0, n), *d_r = UPF(be, nan_r, nr);
        be->ops->rmsnorm_forward(be, d_out + c0, d_r, d_x + c0, d_w, N, H, hs, ld, eps);
        float *d_dout = UPF(be, dout, n), *d_gx = UPF(be, k == REF0 ? z : g_x, n);
        float *d_gw = UPF(be, prefill(k, g_w, z), hs);
        be->ops->rmsnorm_backward(be, d_gx + c0, d_gw, d_dout + c0, d_x + c0, d_w, d_r, N, H, hs, ld);
        out[k] = down(be, d_out, n), rstd[k] = down(be, d_r, nr), dx[k] = down(be, d_gx, n);
        dw[k] = down(be, d_gw, hs);
        be->ops->dealloc(be, d_x), be->ops->dealloc(be, d_w), be->ops->dealloc(be, d_dout);
    }
    char what[128];
    snprintf(what, sizeof what, "rmsnorm_forward out N=%d H=%d hs=%d ld=%d", N, H, hs, ld);
    compare(what, out[FAST], out[REF], n, TOL_RMS_ATOL, TOL_RMS_RTOL);
    compare("rmsnorm_forward rstd", rstd[FAST], rstd[REF], nr, TOL_RMS_ATOL, TOL_RMS_RTOL);
    compare("rmsnorm_backward dinp (+=)", dx[FAST], dx[REF], n, TOL_RMS_ATOL, TOL_RMS_RTOL);
    compare("rmsnorm_backward dw (+=)", dw[FAST], dw[REF], hs, TOL_RMS_ATOL, TOL_RMS_RTOL);
    CHECK(outside_intact(out[FAST], o0, N, c0, c1, ld), "rmsnorm_forward (fast) wrote outside its groups");
    CHECK(outside_intact(dx[FAST], g_x, N, c0, c1, ld), "rmsnorm_backward (fast) wrote outside its groups");
    check_accum("rmsnorm dinp", dx[REF], g_x, dx[REF0], n);
    check_accum("rmsnorm dw", dw[REF], g_w, dw[REF0], hs);
    free_runs(out), free_runs(rstd), free_runs(dx), free_runs(dw);
    free(x), free(w), free(dout), free(o0), free(g_x), free(g_w), free(z), free(nan_r);
}

/* ---------------------------------------------------------------- rope */

static void test_rope(int B, int T, int H, int hs, int ld, int c0, int llama3) {
    size_t n = (size_t)B * T * ld, nt = (size_t)T * hs / 2;
    double *cd = xmalloc(nt * sizeof *cd), *sd = xmalloc(nt * sizeof *sd);
    ref_rope_tables(cd, sd, T, hs, 500000.0, llama3, 32.0, 1.0, 4.0, 64.0);
    float *cs = xmalloc(nt * sizeof *cs), *sn = xmalloc(nt * sizeof *sn);
    for (size_t i = 0; i < nt; i++) cs[i] = (float)cd[i], sn[i] = (float)sd[i];
    float *x = host_randn(n, 1, 0), *dx = host_randn(n, 1, 0), *fw[2], *bw[2];
    for (int k = 0; k < 2; k++) {
        st_backend *be = bes[k];
        float *d_x = UPF(be, x, n), *d_dx = UPF(be, dx, n), *d_c = UPF(be, cs, nt), *d_s = UPF(be, sn, nt);
        be->ops->rope_forward(be, d_x + c0, d_c, d_s, B, T, H, hs, ld);
        be->ops->rope_backward(be, d_dx + c0, d_c, d_s, B, T, H, hs, ld);
        fw[k] = down(be, d_x, n), bw[k] = down(be, d_dx, n);
        be->ops->dealloc(be, d_c), be->ops->dealloc(be, d_s);
    }
    char what[128];
    snprintf(what, sizeof what, "rope_forward (in place) B=%d T=%d H=%d hs=%d ld=%d llama3=%d", B, T, H, hs, ld,
             llama3);
    compare(what, fw[FAST], fw[REF], n, TOL_EW_ATOL, TOL_EW_RTOL);
    compare("rope_backward (in place)", bw[FAST], bw[REF], n, TOL_EW_ATOL, TOL_EW_RTOL);
    CHECK(outside_intact(fw[FAST], x, (size_t)B * T, c0, c0 + H * hs, ld), "rope_forward wrote outside its heads");
    CHECK(outside_intact(bw[FAST], dx, (size_t)B * T, c0, c0 + H * hs, ld), "rope_backward wrote outside its heads");
    for (int k = 0; k < 2; k++) free(fw[k]), free(bw[k]);
    free(cd), free(sd), free(cs), free(sn), free(x), free(dx);
}

/* ---------------------------------------------------------------- swiglu */

static void test_swiglu(int N, int F) {
    size_t n = (size_t)N * F;
    float *x = host_randn(2 * n, 2.5f, 0), *dout = host_randn(n, 1, 0), *g = host_randn(2 * n, 1, 0);
    float *z = host_zeros(2 * n), *nan_o = host_nan(n), *out[RUNS], *dx[RUNS];
    x[0] = 0, x[1] = -30, x[2] = 30, x[3] = -5, x[4] = 1e-4f; /* saturated tails, the middle */
    for (int k = 0; k < RUNS; k++) {
        st_backend *be = be_of(k);
        float *d_x = UPF(be, x, 2 * n), *d_out = UPF(be, nan_o, n), *d_dout = UPF(be, dout, n);
        float *d_g = UPF(be, prefill(k, g, z), 2 * n);
        be->ops->swiglu_forward(be, d_out, d_x, N, F);
        be->ops->swiglu_backward(be, d_g, d_x, d_dout, N, F);
        out[k] = down(be, d_out, n), dx[k] = down(be, d_g, 2 * n);
        be->ops->dealloc(be, d_x), be->ops->dealloc(be, d_dout);
    }
    char what[96];
    snprintf(what, sizeof what, "swiglu_forward out N=%d F=%d", N, F);
    compare(what, out[FAST], out[REF], n, TOL_EW_ATOL, TOL_EW_RTOL);
    compare("swiglu_backward dinp (+=)", dx[FAST], dx[REF], 2 * n, TOL_SWB_ATOL, TOL_SWB_RTOL);
    check_accum("swiglu dinp", dx[REF], g, dx[REF0], 2 * n);
    free_runs(out), free_runs(dx);
    free(x), free(dout), free(g), free(z), free(nan_o);
}

/* ---------------------------------------------------------------- GQA attention */

/* q, k, v packed in rows [pad | q | k | v | pad] of ld floats, as the model lays them out
 * (with a pad so that offsets and ld are not multiples of anything convenient). */
static void test_gqa(int B, int T, int NH, int NKV, int hs, float qk_scale) {
    int W = (NH + 2 * NKV) * hs, pad = 3, ld = W + 2 * pad, C = NH * hs;
    size_t rows = (size_t)B * T, n = rows * ld, no = rows * C, nl = (size_t)B * NH * T;
    float *buf = host_randn(n, 1, 0);
    for (size_t r = 0; r < rows; r++) /* q and k larger than v: peaked and flat softmax rows */
        for (int c = pad; c < pad + (NH + NKV) * hs; c++) buf[r * ld + c] *= qk_scale;
    float *dout = host_randn(no, 1, 0), *g = host_randn(n, 1, 0), *z = host_zeros(n);
    float *nan_o = host_nan(no), *nan_l = host_nan(nl), *out[RUNS], *lse[RUNS], *dg[RUNS];
    for (int k = 0; k < RUNS; k++) {
        st_backend *be = be_of(k);
        float *d_buf = UPF(be, buf, n), *d_out = UPF(be, nan_o, no), *d_lse = UPF(be, nan_l, nl);
        const float *q = d_buf + pad, *kk = q + NH * hs, *v = kk + NKV * hs;
        be->ops->attention_gqa_forward(be, d_out, d_lse, q, kk, v, ld, B, T, NH, NKV, hs);
        float *d_dout = UPF(be, dout, no), *d_g = UPF(be, k == REF0 ? z : g, n);
        float *dq = d_g + pad, *dk = dq + NH * hs, *dv = dk + NKV * hs;
        be->ops->attention_gqa_backward(be, dq, dk, dv, d_dout, q, kk, v, d_out, d_lse, ld, B, T, NH, NKV, hs);
        out[k] = down(be, d_out, no), lse[k] = down(be, d_lse, nl), dg[k] = down(be, d_g, n);
        be->ops->dealloc(be, d_buf), be->ops->dealloc(be, d_dout);
    }
    char what[128];
    snprintf(what, sizeof what, "attention_gqa_forward out B=%d T=%d NH=%d NKV=%d hs=%d qk*%.1f", B, T, NH, NKV, hs,
             qk_scale);
    compare(what, out[FAST], out[REF], no, TOL_ATT_ATOL, TOL_ATT_RTOL);
    compare("attention_gqa_forward lse", lse[FAST], lse[REF], nl, TOL_ATT_ATOL, TOL_ATT_RTOL);
    compare("attention_gqa_backward dq|dk|dv (+=)", dg[FAST], dg[REF], n, TOL_ATT_ATOL, TOL_ATT_RTOL);
    CHECK(outside_intact(dg[FAST], g, rows, pad, pad + W, ld), "attention_gqa_backward wrote outside q, k, v");
    check_accum("attention_gqa dq|dk|dv", dg[REF], g, dg[REF0], n);
    free_runs(out), free_runs(lse), free_runs(dg);
    free(buf), free(dout), free(g), free(z), free(nan_o), free(nan_l);
}

/* The fast op is deterministic: a second run is bit-identical (the group sums of dk, dv
 * are in a fixed order whatever the thread schedule). */
static void test_gqa_determinism(void) {
    int B = 1, T = 100, NH = 6, NKV = 2, hs = 16, ld = (NH + 2 * NKV) * hs;
    size_t n = (size_t)B * T * ld, no = (size_t)B * T * NH * hs;
    float *buf = host_randn(n, 1, 0), *dout = host_randn(no, 1, 0), *res[2];
    st_backend *be = bes[FAST];
    for (int r = 0; r < 2; r++) {
        float *d_buf = UPF(be, buf, n), *d_out = UPF(be, dout, no), *d_lse = UPF(be, dout, (size_t)B * NH * T);
        float *d_dout = UPF(be, dout, no), *d_g = UPF(be, buf, n);
        be->ops->attention_gqa_forward(be, d_out, d_lse, d_buf, d_buf + NH * hs, d_buf + (NH + NKV) * hs, ld, B, T,
                                       NH, NKV, hs);
        be->ops->attention_gqa_backward(be, d_g, d_g + NH * hs, d_g + (NH + NKV) * hs, d_dout, d_buf, d_buf + NH * hs,
                                        d_buf + (NH + NKV) * hs, d_out, d_lse, ld, B, T, NH, NKV, hs);
        res[r] = down(be, d_g, n);
        be->ops->dealloc(be, d_buf), be->ops->dealloc(be, d_out), be->ops->dealloc(be, d_lse);
        be->ops->dealloc(be, d_dout);
    }
    CHECK(memcmp(res[0], res[1], n * sizeof(float)) == 0, "attention_gqa_backward is not bit-reproducible");
    free(res[0]), free(res[1]), free(buf), free(dout);
}

int main(void) {
    verbose = getenv("STRATA_TEST_VERBOSE") != NULL;
    st_err err = {0};
    if (st_backend_cpu_create(&bes[FAST], 2, &err) != ST_OK) {
        fprintf(stderr, "ops_llama_diff: cpu backend: %s\n", err.msg);
        return err.code == ST_ERR_UNSUPPORTED ? 77 : 1;
    }
    if (st_backend_ref_create(&bes[REF], &err) != ST_OK) {
        fprintf(stderr, "ops_llama_diff: ref backend: %s\n", err.msg);
        return 1;
    }
    st_rng_seed(&rng, 4242);

    test_embedding(2, 33, 64, 97);
    test_rmsnorm(66, 1, 64, 64, 0, 1e-5f);      /* per token */
    test_rmsnorm(7, 1, 896, 896, 0, 1e-6f);     /* Qwen2.5-0.5B width */
    test_rmsnorm(33, 4, 16, 4 * 16 + 2 * 32 + 5, 2, 1e-6f); /* Qwen3 per-head q norm in a packed row */
    test_rope(2, 33, 4, 16, 4 * 16 + 2 * 32, 0, 0);          /* q heads of a packed qkv */
    test_rope(2, 33, 2, 16, 4 * 16 + 2 * 32, 64, 1);         /* k heads, Llama-3 scaling */
    test_rope(1, 70, 1, 64, 64 + 7, 3, 0);                   /* head size 64, long T */
    test_swiglu(66, 96);
    test_swiglu(3, 17); /* shorter than a vector */

    test_gqa(2, 33, 4, 2, 16, 1.0f);
    test_gqa(2, 33, 4, 2, 16, 2.5f);
    test_gqa(1, 70, 3, 1, 32, 1.5f);   /* multi-query, two query blocks */
    test_gqa(2, 20, 4, 4, 8, 1.0f);    /* no sharing: the direct path */
    test_gqa(1, 160, 14, 2, 64, 1.0f); /* Qwen2.5-0.5B heads, three query blocks */
    test_gqa(3, 1, 4, 2, 8, 1.0f);     /* T = 1 */
    test_gqa_determinism();

    st_backend_free(bes[FAST]);
    st_backend_free(bes[REF]);
    return test_finish("ops_llama_diff");
}
