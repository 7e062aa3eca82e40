/* test_matmul_bf16.c - the CPU backend's matmul bf16 (oneDNN) against fp64 references,
 * and its fp32 mode unchanged.
 *
 * For every shape, both weight layouts, with and without bias, the forward and both
 * backward products (accumulating into non-zero gradients) are checked three ways:
 *   1. against fp64 over the bf16-rounded inputs (st_f32_to_bf16, nearest even): only
 *      fp32 accumulation may differ, |err| <= (K + 2) 2^-24 sum|a b|: this is what shows
 *      that both operands, and only they, were rounded, and rounded to nearest even;
 *   2. against fp64 over the fp32 inputs, within bf16's rounding as it grows with K:
 *      |err| <= 6 u ||a o b||_2 (u = 2^-8, bf16's unit roundoff; the two roundings of a
 *      product have standard deviation u sqrt(2/3), so this is a 7-sigma bound that is
 *      <= 6 u sqrt(K) max|a b|) plus the fp32 accumulation bound; and that the result is
 *      NOT fp32's, so a path that forgot to round would fail 1;
 *   0. the operands' conversion (cpu_bf16_operand, vectorised) equal bit for bit to
 *      st_f32_to_bf16 over random bit patterns, NaNs, infinities, denormals and ties;
 *   4. attention under bf16 against the fp32 path, normwise (attention_bf16 below);
 *   3. fp32 mode (the default, and again after bf16 was switched off) equal bit for bit to
 *      OpenBLAS sgemm called as the backend called it before matmul bf16 existed.
 * Skips (77) in a build without oneDNN or on a CPU without bf16 matrix units. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/matmul_bf16.h"
#include "strata/backend.h"
#include "strata/tensor.h"
#include "testutil.h"

static double u_bf16 = 1.0 / 256, u_f32 = 1.0 / 16777216;

static void fill(float *x, size_t n, unsigned seed, float scale) {
    unsigned s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = scale * ((float)(s >> 8) / 16777216.0f * 2.0f - 1.0f);
    }
}

static void round_bf16(float *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = st_bf16_to_f32(st_f32_to_bf16(src[i]));
}

/* C (M,N) = init + sum_k A(m,k) B(k,n), A(m,k) = a[m*sam + k*sak], B(k,n) = b[k*sbk + n*sbn];
 * also sum |A B| and sqrt(sum (A B)^2) per element (from the unrounded af, bf) */
typedef struct ref_out { double *c, *abs, *l2; } ref_out;
static void ref_gemm(ref_out *r, const float *init, const float *bias, const float *a, const float *b, const float *af,
                     const float *bf, int M, int N, int K, int sam, int sak, int sbk, int sbn) {
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = init ? init[(size_t)m * N + n] : 0, sa = 0, s2 = 0;
            if (bias) s += bias[n];
            for (int k = 0; k < K; k++) {
                s += (double)a[(size_t)m * sam + (size_t)k * sak] * b[(size_t)k * sbk + (size_t)n * sbn];
                double p = (double)af[(size_t)m * sam + (size_t)k * sak] * bf[(size_t)k * sbk + (size_t)n * sbn];
                sa += fabs(p);
                s2 += p * p;
            }
            r->c[(size_t)m * N + n] = s;
            r->abs[(size_t)m * N + n] = sa;
            r->l2[(size_t)m * N + n] = sqrt(s2);
        }
}

static double worst_rounded = 0, worst_unrounded = 0; /* err / tol, over everything */

/* got against the two references (rounded inputs: rr; fp32 inputs: rf); K the inner size */
static void check_product(const char *what, const float *got, const float *f32, const ref_out *rr, const ref_out *rf,
                          size_t n, int K, const float *init) {
    double wr = 0, wu = 0;
    size_t ir = 0, iu = 0, differs = 0;
    for (size_t i = 0; i < n; i++) {
        double init_abs = init ? fabs(init[i]) : 0; /* the sum post-op's one rounding of init + product */
        double tol_r = (K + 2) * u_f32 * (rr->abs[i] + init_abs) + 1e-30;
        double tol_u = 6 * u_bf16 * rf->l2[i] + (K + 2) * u_f32 * (rf->abs[i] * (1 + 2 * u_bf16) + init_abs) + 1e-30;
        double er = fabs(got[i] - rr->c[i]) / tol_r, eu = fabs(got[i] - rf->c[i]) / tol_u;
        if (er > wr) wr = er, ir = i;
        if (eu > wu) wu = eu, iu = i;
        differs += got[i] != f32[i];
    }
    CHECK(wr <= 1, "%s: element %zu is %.9g, fp64 over the bf16-rounded inputs %.9g: err/tol %.3f", what, ir, got[ir],
          rr->c[ir], wr);
    CHECK(wu <= 1, "%s: element %zu is %.9g, fp64 over the fp32 inputs %.9g: err/tol %.3f", what, iu, got[iu], rf->c[iu],
          wu);
    CHECK(K < 4 || differs > 0, "%s: equal to fp32's sgemm everywhere: the inputs were not rounded to bf16", what);
    if (wr > worst_rounded) worst_rounded = wr;
    if (wu > worst_unrounded) worst_unrounded = wu;
}

static void check_bits(const char *what, const float *got, const float *want, size_t n) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], 4)) first = bad++ ? first : i;
    CHECK(bad == 0, "%s: %zu elements differ from sgemm's bits (first %zu: %.9g vs %.9g)", what, bad, first, got[first],
          want[first]);
}

static void ref_alloc(ref_out *r, size_t n) {
    r->c = malloc(n * sizeof(double)), r->abs = malloc(n * sizeof(double)), r->l2 = malloc(n * sizeof(double));
}
static void ref_free(ref_out *r) { free(r->c), free(r->abs), free(r->l2); }

static void one_shape(st_backend *bf, st_backend *f32, int N, int C, int OC, st_wlayout layout, int with_bias) {
    char what[160];
    const char *ln = layout == ST_W_IN_OUT ? "in_out" : "out_in";
    size_t nin = (size_t)N * C, nw = (size_t)C * OC, nout = (size_t)N * OC;
    float *inp = malloc(nin * 4), *w = malloc(nw * 4), *bias = malloc((size_t)OC * 4), *dout = malloc(nout * 4);
    float *inp_r = malloc(nin * 4), *w_r = malloc(nw * 4), *dout_r = malloc(nout * 4);
    float *out = malloc(nout * 4), *out32 = malloc(nout * 4), *want = malloc(nout * 4);
    float *dinp0 = malloc(nin * 4), *dw0 = malloc(nw * 4), *db0 = malloc((size_t)OC * 4);
    float *dinp = malloc(nin * 4), *dw = malloc(nw * 4), *db = malloc((size_t)OC * 4);
    float *dinp32 = malloc(nin * 4), *dw32 = malloc(nw * 4), *db32 = malloc((size_t)OC * 4);
    fill(inp, nin, N * 31 + C, 1.0f);
    fill(w, nw, C * 17 + OC, 0.05f);
    fill(bias, OC, OC, 0.1f);
    fill(dout, nout, N + OC, 0.01f);
    fill(dinp0, nin, 5, 0.01f);
    fill(dw0, nw, 6, 0.01f);
    fill(db0, OC, 7, 0.01f);
    round_bf16(inp_r, inp, nin);
    round_bf16(w_r, w, nw);
    round_bf16(dout_r, dout, nout);
    const float *b = with_bias ? bias : NULL;
    /* strides of w as the forward's B (K=C, N=OC) and the backward's (K=OC, N=C) */
    int fk = layout == ST_W_IN_OUT ? OC : 1, fn = layout == ST_W_IN_OUT ? 1 : C;
    ref_out rr, rf;

    /* forward */
    bf->ops->matmul_forward(bf, out, inp, w, b, N, C, OC, layout);
    f32->ops->matmul_forward(f32, out32, inp, w, b, N, C, OC, layout);
    ref_alloc(&rr, nout), ref_alloc(&rf, nout);
    ref_gemm(&rr, NULL, b, inp_r, w_r, inp, w, N, OC, C, C, 1, fk, fn);
    ref_gemm(&rf, NULL, b, inp, w, inp, w, N, OC, C, C, 1, fk, fn);
    snprintf(what, sizeof what, "forward %s N %d C %d OC %d%s", ln, N, C, OC, with_bias ? " bias" : "");
    check_product(what, out, out32, &rr, &rf, nout, C, NULL);
    ref_free(&rr), ref_free(&rf);
    /* fp32 mode: the former code's sgemm calls, bit for bit */
    float beta = 0;
    if (b) {
        for (int i = 0; i < N; i++) memcpy(want + (size_t)i * OC, b, sizeof(float) * OC);
        beta = 1;
    }
    if (layout == ST_W_IN_OUT)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, OC, C, 1.0f, inp, C, w, OC, beta, want, OC);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, w, C, beta, want, OC);
    snprintf(what, sizeof what, "fp32 forward %s N %d C %d OC %d", ln, N, C, OC);
    check_bits(what, out32, want, nout);

    /* backward: dinp, dw, dbias accumulate into non-zero values */
    memcpy(dinp, dinp0, nin * 4), memcpy(dw, dw0, nw * 4), memcpy(db, db0, (size_t)OC * 4);
    memcpy(dinp32, dinp0, nin * 4), memcpy(dw32, dw0, nw * 4), memcpy(db32, db0, (size_t)OC * 4);
    bf->ops->matmul_backward(bf, dinp, dw, with_bias ? db : NULL, dout, inp, w, N, C, OC, layout);
    f32->ops->matmul_backward(f32, dinp32, dw32, with_bias ? db32 : NULL, dout, inp, w, N, C, OC, layout);
    /* dinp (N,C) = dinp0 + dout (N,OC) x w^T: B(k=o, n=c) = w^T */
    int bk = layout == ST_W_IN_OUT ? 1 : C, bn = layout == ST_W_IN_OUT ? OC : 1;
    ref_alloc(&rr, nin), ref_alloc(&rf, nin);
    ref_gemm(&rr, dinp0, NULL, dout_r, w_r, dout, w, N, C, OC, OC, 1, bk, bn);
    ref_gemm(&rf, dinp0, NULL, dout, w, dout, w, N, C, OC, OC, 1, bk, bn);
    snprintf(what, sizeof what, "dinp %s N %d C %d OC %d", ln, N, C, OC);
    check_product(what, dinp, dinp32, &rr, &rf, nin, OC, dinp0);
    ref_free(&rr), ref_free(&rf);
    ref_alloc(&rr, nw), ref_alloc(&rf, nw);
    if (layout == ST_W_IN_OUT) { /* dw (C,OC) = dw0 + inp^T dout */
        ref_gemm(&rr, dw0, NULL, inp_r, dout_r, inp, dout, C, OC, N, 1, C, OC, 1);
        ref_gemm(&rf, dw0, NULL, inp, dout, inp, dout, C, OC, N, 1, C, OC, 1);
    } else { /* dw (OC,C) = dw0 + dout^T inp */
        ref_gemm(&rr, dw0, NULL, dout_r, inp_r, dout, inp, OC, C, N, 1, OC, C, 1);
        ref_gemm(&rf, dw0, NULL, dout, inp, dout, inp, OC, C, N, 1, OC, C, 1);
    }
    snprintf(what, sizeof what, "dw %s N %d C %d OC %d", ln, N, C, OC);
    check_product(what, dw, dw32, &rr, &rf, nw, N, dw0);
    ref_free(&rr), ref_free(&rf);
    if (with_bias) { /* dbias is a sum of dout, fp32 in both modes */
        snprintf(what, sizeof what, "dbias %s N %d C %d OC %d (fp32 in both modes)", ln, N, C, OC);
        check_bits(what, db, db32, (size_t)OC);
    }
    /* fp32 backward: the former code's calls */
    memcpy(dinp, dinp0, nin * 4), memcpy(dw, dw0, nw * 4);
    if (layout == ST_W_IN_OUT) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, C, OC, 1.0f, dout, OC, w, OC, 1.0f, dinp, C);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dw, OC);
    } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, w, C, 1.0f, dinp, C);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw, C);
    }
    snprintf(what, sizeof what, "fp32 dinp %s N %d C %d OC %d", ln, N, C, OC);
    check_bits(what, dinp32, dinp, nin);
    snprintf(what, sizeof what, "fp32 dw %s N %d C %d OC %d", ln, N, C, OC);
    check_bits(what, dw32, dw, nw);

    free(inp), free(w), free(bias), free(dout), free(inp_r), free(w_r), free(dout_r), free(out), free(out32), free(want);
    free(dinp0), free(dw0), free(db0), free(dinp), free(dw), free(db), free(dinp32), free(dw32), free(db32);
}

/* ||a - b||_2 / ||b||_2 over n values */
static double rel_l2(const float *a, const float *b, size_t n) {
    double d = 0, w = 0;
    for (size_t i = 0; i < n; i++) d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), w += (double)b[i] * b[i];
    return sqrt(d / (w > 0 ? w : 1));
}

/* 4. attention under matmul bf16 (oneDNN batched products over bf16 q, k, v, P, dO, dS)
 * against the fp32 backend's blocked sgemm path: output, lse and the accumulated gradient
 * within bf16's rounding (normwise: a few units of 2^-8), and not fp32's bits (the bf16 path
 * ran). A causal mask lost, a head or a sequence misplaced, or a missing scale is O(1). */
static void attention_bf16(st_backend *bf, st_backend *f32, int B, int T, int C, int NH) {
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = malloc(nq * 4), *dout = malloc(no * 4), *o16 = malloc(no * 4), *o32 = malloc(no * 4);
    float *l16 = malloc(nl * 4), *l32 = malloc(nl * 4), *g16 = malloc(nq * 4), *g32 = malloc(nq * 4);
    fill(qkv, nq, 11, 1.5f), fill(dout, no, 12, 1), fill(g16, nq, 13, 0.5f);
    memcpy(g32, g16, nq * 4);
    bf->ops->attention_forward(bf, o16, l16, qkv, B, T, C, NH);
    f32->ops->attention_forward(f32, o32, l32, qkv, B, T, C, NH);
    bf->ops->attention_backward(bf, g16, dout, qkv, o16, l16, B, T, C, NH);
    f32->ops->attention_backward(f32, g32, dout, qkv, o32, l32, B, T, C, NH);
    double eo = rel_l2(o16, o32, no), el = rel_l2(l16, l32, nl), eg = 0, e0;
    for (int p = 0; p < 3; p++) { /* dq, dk, dv separately: the initial gradient would hide them */
        float *a = malloc(no * 4), *b = malloc(no * 4), *init = malloc(nq * 4);
        fill(init, nq, 13, 0.5f);
        for (size_t bt = 0; bt < (size_t)B * T; bt++)
            for (int c = 0; c < C; c++) {
                size_t i = bt * 3 * C + (size_t)p * C + c;
                a[bt * C + c] = g16[i] - init[i], b[bt * C + c] = g32[i] - init[i];
            }
        e0 = rel_l2(a, b, no);
        eg = e0 > eg ? e0 : eg;
        free(a), free(b), free(init);
    }
    printf("matmul_bf16: attention B %d T %d C %d NH %d: normwise error against fp32: out %.2e, lse %.2e, worst of "
           "dq, dk, dv %.2e\n", B, T, C, NH, eo, el, eg);
    CHECK(eo < 8 * u_bf16 && eo > 0, "attention out: normwise error %.3e against fp32 (want (0, %.3e))", eo, 8 * u_bf16);
    CHECK(el < 2 * u_bf16 && el > 0, "attention lse: normwise error %.3e against fp32 (want (0, %.3e))", el, 2 * u_bf16);
    CHECK(eg < 12 * u_bf16 && eg > 0, "attention dq/dk/dv: normwise error %.3e against fp32 (want (0, %.3e))", eg,
          12 * u_bf16);
    free(qkv), free(dout), free(o16), free(o32), free(l16), free(l32), free(g16), free(g32);
}

int main(void) {
    st_err err = {0};
    st_backend *bf = NULL, *f32 = NULL;
    char why[200];
    if (st_backend_matmul_auto("cpu", why, sizeof why) != ST_MATMUL_BF16) {
        printf("matmul_bf16: skipped: %s\n", why);
        return 77;
    }
    CHECK(st_backend_cpu_create(&bf, 0, &err) == ST_OK && st_backend_cpu_create(&f32, 0, &err) == ST_OK, "%s", err.msg);
    if (!bf || !f32) return test_finish("matmul_bf16");
    CHECK(st_backend_set_matmul(bf, "bf16", &err) == ST_OK, "set bf16: %s", err.msg);
    CHECK(st_backend_set_matmul(f32, "tf32", &err) == ST_ERR_UNSUPPORTED && strstr(err.msg, "matmul"),
          "tf32 on the cpu refused naming the key: %s", err.msg);
    CHECK(st_backend_matmul_check("cpu", "tf32", &err) == ST_ERR_UNSUPPORTED, "the key's check refuses tf32 on cpu");
    CHECK(st_backend_matmul_check("cpu", "bf16", &err) == ST_OK, "the key's check takes bf16 on cpu: %s", err.msg);
    { /* 0: the conversion, every class of float, lengths with tails, over the threads */
        cpu_bf16 *b16 = NULL;
        CHECK(cpu_bf16_create(&b16, &err) == ST_OK, "cpu_bf16_create: %s", err.msg);
        size_t n = (1u << 20) + 7;
        float *x = malloc(n * 4);
        unsigned s = 12345;
        for (size_t i = 0; i < n; i++) {
            s = s * 1664525u + 1013904223u;
            uint32_t u = s;
            if (i % 7 == 1) u = (u & 0x807fffffu);                        /* denormal or zero */
            if (i % 7 == 2) u = (u & 0xffff0000u) | 0x8000u;               /* a tie */
            if (i % 7 == 3) u = (u | 0x7f800000u);                        /* inf or NaN */
            if (i % 7 == 4) u = (u & 0x80000000u) | 0x7f7fffffu;          /* the largest finite: rounds to inf */
            memcpy(&x[i], &u, 4);
        }
        for (size_t len = 1; len <= n && b16; len = len < 64 ? len + 1 : len * 8 + 3) {
            size_t off = n - len, bad = 0, first = 0;
            cpu_bf16_lock(b16);
            const uint16_t *h = cpu_bf16_operand(b16, 1, x + off, len);
            for (size_t i = 0; h && i < len; i++)
                if (h[i] != st_f32_to_bf16(x[off + i])) first = bad++ ? first : i;
            cpu_bf16_unlock(b16);
            CHECK(h && bad == 0, "conversion of %zu floats: %zu differ from st_f32_to_bf16 (first %zu)", len, bad, first);
        }
        free(x);
        cpu_bf16_free(b16);
    }
    /* odd shapes, shapes of GPT-2's blocks cut down, a head-like wide one; K from 1 to 768 */
    static const int shapes[][3] = {{1, 1, 1},   {3, 5, 7},     {17, 33, 9},   {64, 64, 64},
                                    {37, 96, 288}, {128, 768, 64}, {96, 300, 257}, {256, 64, 768}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int layout = 0; layout < 2; layout++)
            for (int bias = 0; bias < 2; bias++)
                one_shape(bf, f32, shapes[i][0], shapes[i][1], shapes[i][2], (st_wlayout)layout, bias);
    attention_bf16(bf, f32, 2, 37, 96, 3);
    attention_bf16(bf, f32, 3, 128, 256, 4);
    /* back to fp32 on the backend that ran bf16: sgemm's bits again */
    CHECK(st_backend_set_matmul(bf, "fp32", &err) == ST_OK, "set fp32: %s", err.msg);
    {
        enum { N = 33, C = 70, OC = 45 };
        static float inp[N * C], w[C * OC], out[N * OC], want[N * OC];
        fill(inp, N * C, 1, 1), fill(w, C * OC, 2, 1);
        bf->ops->matmul_forward(bf, out, inp, w, NULL, N, C, OC, ST_W_OUT_IN);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, w, C, 0.0f, want, OC);
        check_bits("fp32 after bf16", out, want, N * OC);
    }
    printf("matmul_bf16: worst err/tol %.3f against fp64 over bf16-rounded inputs, %.3f against fp64 over fp32 "
           "inputs (%s)\n", worst_rounded, worst_unrounded, why);
    st_backend_free(bf);
    st_backend_free(f32);
    return test_finish("matmul_bf16");
}
