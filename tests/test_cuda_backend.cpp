/* test_cuda_backend.cpp - the CUDA backend (src/backend/cuda/backend_cuda.cu) through the
 * st_backend_ops vtable against the CPU backend: the arena (allocations are zeroed, one
 * past the budget fails), and every op it implements (matmul in both weight layouts with
 * and without bias, encoder, embedding, layernorm, rmsnorm, gelu, residual, swiglu, rope,
 * the four attentions, to_bf16, cross-entropy and the chunked classifier) at small odd
 * shapes, forward and backward, fp32, and the asynchronous copies (test_copy_async), with
 * tests/test_ops_diff.c's tolerances; matmul also in the tf32 and bf16 precision modes
 * (st_backend_cuda_set_matmul: a bound derived from the rounding, see test_matmul), a mode
 * outside st_matmul_mode refused, cuBLASLt's workspace inside the arena (the free bytes
 * less exactly st_backend_cuda_matmul_workspace), and the arena's used, peak and capacity
 * through st_backend_memory (the vtable's memory entry). Outputs an op writes start as NaN; outputs it adds
 * into start random. Last, a refused op (a head size over 128) must be the error
 * st_backend_cuda_status reports, by the op's name; a device index past the count
 * (cuda:1 on the emulation's one device) refused naming it and the count. Built twice:
 *   - test_cuda_backend: the nvcc-built backend in libstrata, on a GPU; exits 77 where
 *     there is no CUDA device. Not yet run on a GPU.
 *   - test_cuda_backend_emu (-DST_CUDA_EMU): backend_cuda.cu compiled by g++ against the
 *     emulated CUDA runtime, cuBLAS as OpenBLAS and the emulated execution model of
 *     tests/cuda_emu, so the backend's glue (argument order, strides, which kernel and
 *     which gemm each op calls, the arena, copies) runs here without a GPU. */
#include <cuda_runtime.h> /* cudaGetDeviceCount: the emulation's (one device) in test_cuda_backend_emu */
#include <stddef.h> /* offsetof */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

extern "C" {
#include "backend/cuda/backend_cuda.h"
#include "strata/backend.h"
#include "strata/core.h"
#include "testutil.h"
}

typedef std::vector<float> vecf;
static st_rng rng;
static st_backend *gpu, *cpu;

static vecf randn(size_t n, float scale, float offset = 0) {
    vecf v(n);
    for (auto &x : v) x = offset + scale * st_rng_normal(&rng);
    return v;
}

/* A device copy of v (freed by down, or by dealloc). */
template <class E> static E *up(const std::vector<E> &v) {
    E *d = (E *)gpu->ops->alloc(gpu, v.size() * sizeof(E));
    if (!d) {
        fprintf(stderr, "test_cuda_backend: arena full\n");
        exit(1);
    }
    gpu->ops->copy_to_device(gpu, d, v.data(), v.size() * sizeof(E));
    return d;
}
static vecf down(float *d, size_t n) {
    vecf v(n);
    gpu->ops->synchronize(gpu);
    gpu->ops->copy_to_host(gpu, v.data(), d, n * sizeof(float));
    gpu->ops->dealloc(gpu, d);
    return v;
}
static void compare(const char *what, const vecf &a, const vecf &ref, double atol, double rtol) {
    double m = 0;
    for (float r : ref) m = fmax(m, fabs((double)r));
    check_close_f32(what, a.data(), ref.data(), a.size(), atol * (m > 0 ? m : 1), rtol);
}

/* The write variants: the input gradient NaN on the device (a variant that reads it fails),
 * against the CPU backend's write variants (themselves held to the accumulating ops by
 * test_ops_diff). dw and dbias still accumulate from random values. */
static void test_write_variants(int B, int T, int C, int NH) {
    int N = B * T;
    size_t n = (size_t)N * C, n4 = 4 * n, nw = (size_t)C * 4 * C;
    vecf x = randn(n, 1), w = randn(nw, 0.05f), dout = randn(n4, 1), gw = randn(nw, 1), gb = randn(4 * C, 1);
    vecf dx(n, NAN), a = randn(n4, 2.5f), da(n4, NAN);
    float *d_x = up(x), *d_w = up(w), *d_dout = up(dout), *d_gw = up(gw), *d_gb = up(gb), *d_dx = up(dx);
    float *d_a = up(a), *d_da = up(da);
    gpu->ops->matmul_backward_write(gpu, d_dx, d_gw, d_gb, d_dout, d_x, d_w, N, C, 4 * C, ST_W_IN_OUT);
    gpu->ops->gelu_backward_write(gpu, d_da, d_a, d_dout, (int)n4);
    cpu->ops->matmul_backward_write(cpu, dx.data(), gw.data(), gb.data(), dout.data(), x.data(), w.data(), N, C, 4 * C,
                                    ST_W_IN_OUT);
    cpu->ops->gelu_backward_write(cpu, da.data(), a.data(), dout.data(), (int)n4);
    compare("matmul_backward_write dinp (=)", down(d_dx, n), dx, 3e-5, 1e-4);
    compare("matmul_backward_write dw (+=)", down(d_gw, nw), gw, 3e-5, 1e-4);
    compare("matmul_backward_write dbias (+=)", down(d_gb, 4 * C), gb, 3e-5, 1e-4);
    compare("gelu_backward_write dinp (=)", down(d_da, n4), da, 1e-5, 1e-5);
    gpu->ops->dealloc(gpu, d_x), gpu->ops->dealloc(gpu, d_w), gpu->ops->dealloc(gpu, d_dout);
    gpu->ops->dealloc(gpu, d_a);
    for (int docs = 0; docs < 2; docs++) {
        vecf qkv = randn(3 * n, 1), dy = randn(n, 1), o(n, NAN), l((size_t)B * NH * T, NAN), dq(3 * n, NAN);
        std::vector<int32_t> ds((size_t)N);
        for (int i = 0; i < N; i++) ds[i] = docs ? (i % T) / 5 * 5 : 0;
        float *d_q = up(qkv), *d_y = up(dy), *d_o = up(o), *d_l = up(l), *d_dq = up(dq);
        int32_t *d_ds = docs ? up(ds) : nullptr;
        gpu->ops->attention_doc_forward(gpu, d_o, d_l, d_q, d_ds, B, T, C, NH);
        gpu->ops->attention_backward_write(gpu, d_dq, d_y, d_q, d_o, d_l, d_ds, B, T, C, NH);
        cpu->ops->attention_doc_forward(cpu, o.data(), l.data(), qkv.data(), ds.data(), B, T, C, NH);
        cpu->ops->attention_backward_write(cpu, dq.data(), dy.data(), qkv.data(), o.data(), l.data(),
                                           docs ? ds.data() : nullptr, B, T, C, NH);
        compare(docs ? "attention_backward_write dqkv (=), documents" : "attention_backward_write dqkv (=)",
                down(d_dq, 3 * n), dq, 3e-5, 3e-4);
        gpu->ops->dealloc(gpu, d_q), gpu->ops->dealloc(gpu, d_y), gpu->ops->dealloc(gpu, d_o);
        gpu->ops->dealloc(gpu, d_l);
        if (d_ds) gpu->ops->dealloc(gpu, d_ds);
    }
}

static void test_layernorm(int N, int C) {
    size_t n = (size_t)N * C;
    vecf x = randn(n, 1.5f, 0.3f), w = randn(C, 0.2f, 1), b = randn(C, 0.2f), dout = randn(n, 1);
    vecf out(n, NAN), mean(N, NAN), rstd(N, NAN), dx = randn(n, 1), dw = randn(C, 1), db = randn(C, 1);
    float *d_x = up(x), *d_w = up(w), *d_b = up(b), *d_dout = up(dout), *d_out = up(out), *d_mean = up(mean);
    float *d_rstd = up(rstd), *d_dx = up(dx), *d_dw = up(dw), *d_db = up(db);
    gpu->ops->layernorm_forward(gpu, d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C);
    gpu->ops->layernorm_backward(gpu, d_dx, d_dw, d_db, d_dout, d_x, d_w, d_mean, d_rstd, N, C);
    cpu->ops->layernorm_forward(cpu, out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    cpu->ops->layernorm_backward(cpu, dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(),
                                 rstd.data(), N, C);
    compare("layernorm out", down(d_out, n), out, 1e-5, 1e-4);
    compare("layernorm mean", down(d_mean, N), mean, 1e-5, 1e-4);
    compare("layernorm rstd", down(d_rstd, N), rstd, 1e-5, 1e-4);
    compare("layernorm dinp", down(d_dx, n), dx, 1e-5, 1e-4);
    compare("layernorm dw", down(d_dw, C), dw, 1e-5, 1e-4);
    compare("layernorm db", down(d_db, C), db, 1e-5, 1e-4);
    for (float *p : {d_x, d_w, d_b, d_dout}) gpu->ops->dealloc(gpu, p);
}

static void test_rmsnorm(int N, int H, int hs, int ld) {
    size_t n = (size_t)N * ld;
    vecf x = randn(n, 1.5f, 0.3f), w = randn(hs, 0.2f, 1), dout = randn(n, 1);
    vecf out = randn(n, 1), rstd((size_t)N * H, NAN), dx = randn(n, 1), dw = randn(hs, 1);
    float *d_x = up(x), *d_w = up(w), *d_dout = up(dout), *d_out = up(out), *d_rstd = up(rstd), *d_dx = up(dx);
    float *d_dw = up(dw);
    gpu->ops->rmsnorm_forward(gpu, d_out, d_rstd, d_x, d_w, N, H, hs, ld, 1e-6f);
    gpu->ops->rmsnorm_backward(gpu, d_dx, d_dw, d_dout, d_x, d_w, d_rstd, N, H, hs, ld);
    cpu->ops->rmsnorm_forward(cpu, out.data(), rstd.data(), x.data(), w.data(), N, H, hs, ld, 1e-6f);
    cpu->ops->rmsnorm_backward(cpu, dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, H, hs, ld);
    compare("rmsnorm out (elements outside the groups kept)", down(d_out, n), out, 1e-5, 1e-4);
    compare("rmsnorm rstd", down(d_rstd, (size_t)N * H), rstd, 1e-5, 1e-4);
    compare("rmsnorm dinp", down(d_dx, n), dx, 1e-5, 1e-4);
    compare("rmsnorm dw", down(d_dw, hs), dw, 1e-5, 1e-4);
    for (float *p : {d_x, d_w, d_dout}) gpu->ops->dealloc(gpu, p);
}

static void test_eltwise(int N, int F) {
    size_t n = (size_t)N * F;
    vecf a = randn(n, 2.5f), b = randn(2 * n, 2), dout = randn(n, 1), da = randn(n, 1), db = randn(2 * n, 1);
    vecf out(n, NAN), sw(n, NAN);
    float *d_a = up(a), *d_b = up(b), *d_dout = up(dout), *d_da = up(da), *d_db = up(db), *d_out = up(out);
    float *d_sw = up(sw);
    gpu->ops->gelu_forward(gpu, d_out, d_a, (int)n);
    gpu->ops->gelu_backward(gpu, d_da, d_a, d_dout, (int)n);
    gpu->ops->swiglu_forward(gpu, d_sw, d_b, N, F);
    gpu->ops->swiglu_backward(gpu, d_db, d_b, d_dout, N, F);
    cpu->ops->gelu_forward(cpu, out.data(), a.data(), (int)n);
    cpu->ops->gelu_backward(cpu, da.data(), a.data(), dout.data(), (int)n);
    cpu->ops->swiglu_forward(cpu, sw.data(), b.data(), N, F);
    cpu->ops->swiglu_backward(cpu, db.data(), b.data(), dout.data(), N, F);
    compare("gelu out", down(d_out, n), out, 1e-6, 1e-5);
    compare("gelu dinp", down(d_da, n), da, 1e-5, 1e-5);
    compare("swiglu out", down(d_sw, n), sw, 1e-6, 1e-5);
    compare("swiglu dinp", down(d_db, 2 * n), db, 1e-5, 1e-5);
    /* residual: out = a + b[:n]; da, db[:n] += dout */
    vecf r(n, NAN), ra = randn(n, 1), rb = randn(n, 1);
    float *d_r = up(r), *d_ra = up(ra), *d_rb = up(rb);
    gpu->ops->residual_forward(gpu, d_r, d_a, d_dout, (int)n);
    gpu->ops->residual_backward(gpu, d_ra, d_rb, d_dout, (int)n);
    cpu->ops->residual_forward(cpu, r.data(), a.data(), dout.data(), (int)n);
    cpu->ops->residual_backward(cpu, ra.data(), rb.data(), dout.data(), (int)n);
    compare("residual out", down(d_r, n), r, 1e-6, 1e-5);
    compare("residual da", down(d_ra, n), ra, 1e-6, 1e-5);
    compare("residual db", down(d_rb, n), rb, 1e-6, 1e-5);
    /* axpy_rows: W columns of a packed (N, ldy) output += alpha x (N, ldx), and back */
    {
        int W = F / 2, ldy = F + 3, ldx = W + 1;
        vecf y = randn((size_t)N * ldy, 1), x = randn((size_t)N * ldx, 1), y_ref = y;
        float *d_y = up(y), *d_x = up(x);
        gpu->ops->axpy_rows(gpu, d_y + 2, ldy, d_x, ldx, 0.375f, N, W);
        cpu->ops->axpy_rows(cpu, y_ref.data() + 2, ldy, x.data(), ldx, 0.375f, N, W);
        compare("axpy_rows", down(d_y, (size_t)N * ldy), y_ref, 1e-6, 1e-6);
    }
    /* to_bf16: the CPU's bits */
    std::vector<uint16_t> h(n), want(n);
    uint16_t *d_h = (uint16_t *)gpu->ops->alloc(gpu, n * 2);
    gpu->ops->to_bf16(gpu, d_h, d_a, n);
    gpu->ops->synchronize(gpu);
    gpu->ops->copy_to_host(gpu, h.data(), d_h, n * 2);
    cpu->ops->to_bf16(cpu, want.data(), a.data(), n);
    CHECK(memcmp(h.data(), want.data(), n * 2) == 0, "to_bf16: bits differ from the CPU backend's");
    /* from_bf16: the CPU's bits (widened back from the rounded values) */
    vecf wide(n, NAN), wide_want(n, NAN);
    float *d_wide = up(wide);
    gpu->ops->from_bf16(gpu, d_wide, d_h, n);
    gpu->ops->synchronize(gpu);
    gpu->ops->copy_to_host(gpu, wide.data(), d_wide, n * 4);
    cpu->ops->from_bf16(cpu, wide_want.data(), want.data(), n);
    CHECK(memcmp(wide.data(), wide_want.data(), n * 4) == 0, "from_bf16: bits differ from the CPU backend's");
    for (void *p : {(void *)d_a, (void *)d_b, (void *)d_dout, (void *)d_h, (void *)d_wide}) gpu->ops->dealloc(gpu, p);
}

/* The precision modes of st_backend_cuda_set_matmul and the relative error of one
 * rounded input: bf16 keeps 8 significant bits, tf32 11, so rounding to nearest errs by
 * at most u = 2^-8 or 2^-11 (2^-7, 2^-10 if the tensor cores truncate: allowed for). */
struct MatmulMode {
    const char *name;
    st_matmul_mode mode;
    double u;
};
static const MatmulMode mm_fp32 = {"fp32", ST_MATMUL_FP32, 0}, mm_tf32 = {"tf32", ST_MATMUL_TF32, 0x1p-10},
                        mm_bf16 = {"bf16", ST_MATMUL_BF16, 0x1p-7};

/* |a - ref| <= c * bound + atol max|ref| + rtol |ref| elementwise; the worst use of it
 * goes to *worst. How many elements fail. */
static size_t count_outside(const vecf &a, const vecf &ref, const vecf &bound, double c, double atol, double rtol,
                            double *worst) {
    double m = 0;
    for (float r : ref) m = fmax(m, fabs((double)r));
    size_t bad = 0;
    for (size_t i = 0; i < a.size(); i++) {
        double tol = c * bound[i] + atol * (m > 0 ? m : 1) + rtol * fabs((double)ref[i]);
        double e = fabs((double)a[i] - ref[i]) / tol;
        if (!(e <= 1)) bad++;
        if (e > *worst || e != e) *worst = e;
    }
    return bad;
}

/* matmul: out (N, OC) = inp (N, C) x w (+ bias); backward into dinp, dw, dbias (+=), any
 * of which may be NULL. fp32: every sum is at most a few hundred long, test_ops_diff's
 * matmul tolerance (1e-5 max|ref| + 1e-4 |ref|). tf32, bf16: each product of two inputs
 * rounded by at most u relative errs by at most 2u + u^2 of |a b|, so an output errs by
 * at most (2u + u^2) (|A| |B|)_ij (the CPU backend's matmul of the absolute values) plus
 * fp32's summation differences (the fp32 tolerance again), whatever K. The rounded modes
 * must also differ from fp32 (under the emulation, which rounds what it is told to; a
 * GPU may run an fp32 kernel for a small shape, so there it is only printed). */
static void test_matmul(int N, int C, int OC, st_wlayout layout, bool bias, bool all_grads,
                        const MatmulMode &mode = mm_fp32) {
    size_t ni = (size_t)N * C, nw = (size_t)C * OC, no = (size_t)N * OC;
    vecf x = randn(ni, 1), w = randn(nw, 0.3f), b = randn(OC, 0.5f), dout = randn(no, 1);
    vecf out(no, NAN), dx = randn(ni, 1), dw = randn(nw, 1), db = randn(OC, 1);
    st_err err = {};
    CHECK(st_backend_cuda_set_matmul(gpu, mode.mode, &err) == ST_OK, "set_matmul %s: %s", mode.name, err.msg);
    float *d_x = up(x), *d_w = up(w), *d_b = up(b), *d_dout = up(dout), *d_out = up(out), *d_dx = up(dx);
    float *d_dw = up(dw), *d_db = up(db);
    /* the dw-only cases' bias sits 4 bytes past an aligned block: cuBLASLt may have no
     * epilogue for it (the emulation has none), and then the backend adds it as rows */
    vecf bpad(OC + 1, 0);
    memcpy(bpad.data() + 1, b.data(), OC * sizeof(float));
    float *d_bpad = up(bpad);
    const float *gb = bias ? (all_grads ? d_b : d_bpad + 1) : nullptr, *cb = bias ? b.data() : nullptr;
    st_cuda_matmul_stats ms0, ms1;
    st_backend_cuda_matmul_stats(gpu, &ms0);
    gpu->ops->matmul_forward(gpu, d_out, d_x, d_w, gb, N, C, OC, layout);
    cpu->ops->matmul_forward(cpu, out.data(), x.data(), w.data(), cb, N, C, OC, layout);
    if (bias && !all_grads) { /* a fault is sticky on a GPU: find it here, not at the end */
        err = {};
        CHECK(st_backend_cuda_status(gpu, &err) == ST_OK,
              "matmul %s: a bias 4 bytes past an aligned block (under the 16 bytes cuBLASLt's bias epilogue "
              "assumes) must be added without the epilogue: %s", mode.name, err.msg);
    }
    /* all_grads 0: dinp and dbias NULL, dw only */
    gpu->ops->matmul_backward(gpu, all_grads ? d_dx : nullptr, d_dw, all_grads ? d_db : nullptr, d_dout, d_x, d_w, N,
                              C, OC, layout);
    cpu->ops->matmul_backward(cpu, all_grads ? dx.data() : nullptr, dw.data(), all_grads ? db.data() : nullptr,
                              dout.data(), x.data(), w.data(), N, C, OC, layout);
    char what[160];
    snprintf(what, sizeof what, "matmul %s N %d C %d OC %d %s%s", mode.name, N, C, OC,
             layout == ST_W_IN_OUT ? "(C,OC)" : "(OC,C)", bias ? " bias" : "");
    std::string w0 = what;
    vecf g_out = down(d_out, no), g_dx = down(d_dx, ni), g_dw = down(d_dw, nw), g_db = down(d_db, OC);
    st_backend_cuda_matmul_stats(gpu, &ms1);
    compare((w0 + " dbias (+=)").c_str(), g_db, db, 1e-5, 1e-4); /* fp32 columns sums in every mode */
    /* a reduced mode with a leading dimension that is not a multiple of 16 bytes: cuBLASLt
     * may offer no tensor-core algorithm (the emulation offers none), and the backend then
     * computes in fp32 and counts it, never failing the op */
    bool fell = ms1.fallbacks > ms0.fallbacks;
#ifdef ST_CUDA_EMU
    bool odd_ld = C % 4 || OC % 4;
    if (mode.u != 0)
        CHECK(fell == odd_ld, "%s: %llu fp32 fallbacks counted, want them %s (leading dimensions %d and %d)", what,
              (unsigned long long)(ms1.fallbacks - ms0.fallbacks), odd_ld ? "> 0" : "0", C, OC);
#endif
    CHECK(mode.u != 0 || !fell, "%s: an fp32 matmul counted as a fallback", what);
    if (fell) printf("%s: fp32 fallbacks %llu (no tensor-core algorithm for its leading dimensions)\n", what,
                     (unsigned long long)(ms1.fallbacks - ms0.fallbacks));
    if (mode.u == 0 || fell) {
        compare((w0 + " out").c_str(), g_out, out, 1e-5, 1e-4);
        compare((w0 + " dinp (+=)").c_str(), g_dx, dx, 1e-5, 1e-4);
        compare((w0 + " dw (+=)").c_str(), g_dw, dw, 1e-5, 1e-4);
    } else {
        /* the bounds: the same products of the absolute values, from zero */
        vecf ax(ni), aw(nw), ad(no), b_out(no), b_dx(ni, 0), b_dw(nw, 0);
        for (size_t i = 0; i < ni; i++) ax[i] = fabsf(x[i]);
        for (size_t i = 0; i < nw; i++) aw[i] = fabsf(w[i]);
        for (size_t i = 0; i < no; i++) ad[i] = fabsf(dout[i]);
        cpu->ops->matmul_forward(cpu, b_out.data(), ax.data(), aw.data(), nullptr, N, C, OC, layout);
        cpu->ops->matmul_backward(cpu, b_dx.data(), b_dw.data(), nullptr, ad.data(), ax.data(), aw.data(), N, C, OC,
                                  layout);
        double c = 2 * mode.u + mode.u * mode.u, worst = 0, worst32 = 0;
        size_t bad = count_outside(g_out, out, b_out, c, 1e-5, 1e-4, &worst);
        size_t bad32 = count_outside(g_out, out, b_out, 0, 1e-5, 1e-4, &worst32);
        if (all_grads) {
            bad += count_outside(g_dx, dx, b_dx, c, 1e-5, 1e-4, &worst);
            bad32 += count_outside(g_dx, dx, b_dx, 0, 1e-5, 1e-4, &worst32);
        }
        bad += count_outside(g_dw, dw, b_dw, c, 1e-5, 1e-4, &worst);
        bad32 += count_outside(g_dw, dw, b_dw, 0, 1e-5, 1e-4, &worst32);
        CHECK(bad == 0, "%s: %zu outputs outside (2u + u^2) |A||B| + the fp32 tolerance (worst err/tol %.3g)",
              what, bad, worst);
        printf("%s: worst err/tol %.3g (against the fp32 tolerance: %.3g)\n", what, worst, worst32);
        /* the mode was applied: under the emulation always; on a GPU where the sums are long
         * enough (K >= 256) that a reduced mode must show beyond fp32's tolerance */
        bool must_differ = true;
#ifndef ST_CUDA_EMU
        must_differ = (C > N ? C : N) >= 256; /* the longest sum: out's K = C, dw's K = N */
#endif
        if (must_differ)
            CHECK(bad32 > 0, "%s: equal to fp32 within its tolerance (err/tol %.3g) and no fallback counted: the "
                  "mode was not applied", what, worst32);
    }
    for (float *p : {d_x, d_w, d_b, d_dout, d_bpad}) gpu->ops->dealloc(gpu, p);
    CHECK(st_backend_cuda_set_matmul(gpu, ST_MATMUL_FP32, &err) == ST_OK, "set_matmul fp32: %s", err.msg);
}

/* encoder (GPT-2: wte + wpe) and embedding (Llama: wte), with repeated ids, rows of wte
 * no token names and rows of wpe >= T (both kept by the backward) */
static void test_embed(int B, int T, int C, int V, int maxT) {
    size_t n = (size_t)B * T * C;
    std::vector<int32_t> ids((size_t)B * T);
    for (size_t i = 0; i < ids.size(); i++) ids[i] = (int32_t)((i * 7 + i / 3) % (size_t)(V - 2)); /* V-2, V-1 unused */
    vecf wte = randn((size_t)V * C, 1), wpe = randn((size_t)maxT * C, 1), dout = randn(n, 1);
    vecf out(n, NAN), out2(n, NAN), dwte = randn((size_t)V * C, 1), dwpe = randn((size_t)maxT * C, 1), dwte2 = dwte;
    int32_t *d_ids = up(ids);
    float *d_wte = up(wte), *d_wpe = up(wpe), *d_dout = up(dout), *d_out = up(out), *d_out2 = up(out2);
    float *d_dwte = up(dwte), *d_dwpe = up(dwpe), *d_dwte2 = up(dwte2);
    gpu->ops->encoder_forward(gpu, d_out, d_ids, d_wte, d_wpe, B, T, C);
    gpu->ops->encoder_backward(gpu, d_dwte, d_dwpe, d_dout, d_ids, B, T, C);
    gpu->ops->embedding_forward(gpu, d_out2, d_ids, d_wte, B, T, C);
    gpu->ops->embedding_backward(gpu, d_dwte2, d_dout, d_ids, B, T, C);
    cpu->ops->encoder_forward(cpu, out.data(), ids.data(), wte.data(), wpe.data(), B, T, C);
    cpu->ops->encoder_backward(cpu, dwte.data(), dwpe.data(), dout.data(), ids.data(), B, T, C);
    cpu->ops->embedding_forward(cpu, out2.data(), ids.data(), wte.data(), B, T, C);
    cpu->ops->embedding_backward(cpu, dwte2.data(), dout.data(), ids.data(), B, T, C);
    compare("encoder out", down(d_out, n), out, 1e-6, 1e-5);
    compare("encoder dwte (+=)", down(d_dwte, (size_t)V * C), dwte, 1e-6, 1e-5);
    compare("encoder dwpe (+=, rows >= T kept)", down(d_dwpe, (size_t)maxT * C), dwpe, 1e-6, 1e-5);
    compare("embedding out", down(d_out2, n), out2, 1e-6, 1e-5);
    compare("embedding dwte (+=)", down(d_dwte2, (size_t)V * C), dwte2, 1e-6, 1e-5);
    for (void *p : {(void *)d_ids, (void *)d_wte, (void *)d_wpe, (void *)d_dout}) gpu->ops->dealloc(gpu, p);
}

/* rope in place on H heads of hs starting c0 floats into rows of ld (the rest kept), and
 * its backward in place on a gradient */
static void test_rope(int B, int T, int H, int hs, int ld) {
    size_t n = (size_t)B * T * ld, nt = (size_t)T * (hs / 2);
    vecf ang = randn(nt, 2), cs(nt), sn(nt), x = randn(n, 1), dx = randn(n, 1);
    for (size_t i = 0; i < nt; i++) cs[i] = cosf(ang[i]), sn[i] = sinf(ang[i]);
    float *d_cs = up(cs), *d_sn = up(sn), *d_x = up(x), *d_dx = up(dx);
    gpu->ops->rope_forward(gpu, d_x, d_cs, d_sn, B, T, H, hs, ld);
    gpu->ops->rope_backward(gpu, d_dx, d_cs, d_sn, B, T, H, hs, ld);
    cpu->ops->rope_forward(cpu, x.data(), cs.data(), sn.data(), B, T, H, hs, ld);
    cpu->ops->rope_backward(cpu, dx.data(), cs.data(), sn.data(), B, T, H, hs, ld);
    compare("rope forward (in place; outside the heads kept)", down(d_x, n), x, 1e-6, 1e-5);
    compare("rope backward (in place)", down(d_dx, n), dx, 1e-6, 1e-5);
    for (float *p : {d_cs, d_sn}) gpu->ops->dealloc(gpu, p);
}

/* The four attentions: GPT-2's packed qkv (NKV = NH, gpt2) or grouped q, k, v inside rows
 * of ld = (NH + 2 NKV) hs; with documents (doc_start: documents of 5, 1, 9, 3, 12 tokens
 * in turn, restarting at each row) or without. */
static void test_attention(int B, int T, int NH, int NKV, int hs, bool gpt2, bool docs, double atol = 3e-5,
                           double rtol = 3e-4, const char *tag = "") {
    int ld = (NH + 2 * NKV) * hs, C = NH * hs;
    size_t nq = (size_t)B * T * ld, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    vecf qkv = randn(nq, 1), dout = randn(no, 1), dqkv = randn(nq, 1), out(no, NAN), lse(nl, NAN);
    std::vector<int32_t> ds((size_t)B * T);
    int lens[] = {5, 1, 9, 3, 12};
    for (int b = 0; b < B; b++)
        for (int t = 0, start = 0, d = 0; t < T; t++) {
            if (t - start == lens[d % 5]) start = t, d++;
            ds[(size_t)b * T + t] = docs ? start : 0;
        }
    int32_t *d_ds = up(ds);
    float *d_qkv = up(qkv), *d_dout = up(dout), *d_dqkv = up(dqkv), *d_out = up(out), *d_lse = up(lse);
    int ko = NH * hs, vo = (NH + NKV) * hs;
    st_backend *bes[2] = {gpu, cpu};
    for (int i = 0; i < 2; i++) {
        st_backend *be = bes[i];
        const float *q = i ? qkv.data() : d_qkv, *dy = i ? dout.data() : d_dout;
        float *o = i ? out.data() : d_out, *l = i ? lse.data() : d_lse, *dq = i ? dqkv.data() : d_dqkv;
        const int32_t *dst = i ? ds.data() : d_ds;
        if (gpt2 && docs) {
            be->ops->attention_doc_forward(be, o, l, q, dst, B, T, C, NH);
            be->ops->attention_doc_backward(be, dq, dy, q, o, l, dst, B, T, C, NH);
        } else if (gpt2) {
            be->ops->attention_forward(be, o, l, q, B, T, C, NH);
            be->ops->attention_backward(be, dq, dy, q, o, l, B, T, C, NH);
        } else if (docs) {
            be->ops->attention_gqa_doc_forward(be, o, l, q, q + ko, q + vo, dst, ld, B, T, NH, NKV, hs);
            be->ops->attention_gqa_doc_backward(be, dq, dq + ko, dq + vo, dy, q, q + ko, q + vo, o, l, dst, ld, B, T,
                                                NH, NKV, hs);
        } else {
            be->ops->attention_gqa_forward(be, o, l, q, q + ko, q + vo, ld, B, T, NH, NKV, hs);
            be->ops->attention_gqa_backward(be, dq, dq + ko, dq + vo, dy, q, q + ko, q + vo, o, l, ld, B, T, NH, NKV,
                                            hs);
        }
    }
    char what[160];
    snprintf(what, sizeof what, "attention%s%s B %d T %d NH %d NKV %d hs %d%s", gpt2 ? "" : "_gqa", docs ? "_doc" : "",
             B, T, NH, NKV, hs, tag);
    std::string w0 = what;
    compare((w0 + " out").c_str(), down(d_out, no), out, atol, rtol);
    compare((w0 + " lse").c_str(), down(d_lse, nl), lse, atol, rtol);
    compare((w0 + " dqkv (+=)").c_str(), down(d_dqkv, nq), dqkv, atol, rtol);
    for (void *p : {(void *)d_ds, (void *)d_qkv, (void *)d_dout}) gpu->ops->dealloc(gpu, p);
}

/* Which attention runs (st_backend_cuda_set_attention, issue 30): a value outside the enum
 * refused; cuDNN refused where the build has none (the emulation), else run on a GQA and a
 * GPT-2 shape against the CPU at bf16 tolerances, saying whether cuDNN ran or the own
 * kernels took over (and why); documents always the own kernels; auto follows the matmul
 * mode (bf16: cuDNN asked for, fp32: the own kernels, nothing asked). */
static void test_attention_select(void) {
    st_err err = {};
    st_cuda_attention_stats a0, a1;
    printf("attention built: %s\n", st_backend_cuda_attention_built());
    CHECK(st_backend_cuda_set_attention(gpu, (st_cuda_attention)7, &err) == ST_ERR_INVALID,
          "attention mode 7 accepted");
    st_status s = st_backend_cuda_set_attention(gpu, ST_CUDA_ATTENTION_CUDNN, &err);
#ifdef ST_CUDA_EMU
    CHECK(s == ST_ERR_UNSUPPORTED && strstr(err.msg, "without cuDNN"),
          "the emulation has no cuDNN, yet attention through it was accepted: %d %s", (int)s, err.msg);
#endif
    if (s == ST_OK) {
        st_backend_cuda_attention_stats(gpu, &a0);
        test_attention(1, 40, 4, 2, 64, false, false, 2e-2, 2e-2, " (cuDNN, bf16)");
        test_attention(2, 33, 2, 2, 64, true, false, 2e-2, 2e-2, " (cuDNN, bf16)");
        st_backend_cuda_attention_stats(gpu, &a1);
        printf("attention through cuDNN: %llu of 2 forwards, %llu of 2 backwards%s%s\n",
               (unsigned long long)(a1.cudnn[0] - a0.cudnn[0]), (unsigned long long)(a1.cudnn[1] - a0.cudnn[1]),
               a1.why[0] ? "; own kernels because: " : "", a1.why);
        CHECK(a1.cudnn[0] + a1.own[0] == a0.cudnn[0] + a0.own[0] + 2 && a1.cudnn[1] + a1.own[1] == a0.cudnn[1] +
              a0.own[1] + 2, "attention stats do not count the 4 calls");
    }
    /* documents: the own kernels, counted as a fallback where cuDNN was asked for */
    st_backend_cuda_set_attention(gpu, ST_CUDA_ATTENTION_AUTO, &err);
    st_backend_cuda_set_matmul(gpu, ST_MATMUL_BF16, &err);
    st_backend_cuda_attention_stats(gpu, &a0);
    test_attention(1, 21, 4, 2, 24, false, true, 3e-5, 3e-4, " (auto, bf16 matmul: documents)");
    st_backend_cuda_attention_stats(gpu, &a1);
    CHECK(a1.own[0] == a0.own[0] + 1 && a1.own[1] == a0.own[1] + 1 && a1.fallbacks == a0.fallbacks + 2 &&
          a1.cudnn[0] == a0.cudnn[0], "auto with a bf16 matmul over documents: own %llu/%llu more, fallbacks %llu "
          "more (want 1, 1 and 2)", (unsigned long long)(a1.own[0] - a0.own[0]),
          (unsigned long long)(a1.own[1] - a0.own[1]), (unsigned long long)(a1.fallbacks - a0.fallbacks));
    /* STRATA_CUDA_ATTENTION: a bad value fails the create naming it; own starts there (so a
     * bf16 matmul no longer asks for cuDNN) */
    {
        st_backend *b2 = nullptr;
        setenv("STRATA_CUDA_ATTENTION", "flash", 1);
        st_status s2 = st_backend_cuda_create(&b2, 0, (size_t)64 << 20, &err);
        CHECK(s2 == ST_ERR_INVALID && !b2 && strstr(err.msg, "STRATA_CUDA_ATTENTION='flash'"),
              "STRATA_CUDA_ATTENTION=flash: create gave %d: %s", (int)s2, err.msg);
        setenv("STRATA_CUDA_ATTENTION", "own", 1);
        s2 = st_backend_cuda_create(&b2, 0, (size_t)64 << 20, &err);
        CHECK(s2 == ST_OK, "STRATA_CUDA_ATTENTION=own: %s", err.msg);
        if (s2 == ST_OK) {
            st_backend_cuda_set_matmul(b2, ST_MATMUL_BF16, &err);
            st_backend *keep = gpu;
            gpu = b2;
            st_backend_cuda_attention_stats(gpu, &a0);
            test_attention(1, 21, 4, 2, 24, false, false, 3e-5, 3e-4, " (STRATA_CUDA_ATTENTION=own, bf16 matmul)");
            st_backend_cuda_attention_stats(gpu, &a1);
            CHECK(a1.own[0] == 1 && a1.own[1] == 1 && a1.fallbacks == 0 && a1.cudnn[0] == 0,
                  "STRATA_CUDA_ATTENTION=own with a bf16 matmul: own %llu, fallbacks %llu, cuDNN %llu",
                  (unsigned long long)a1.own[0], (unsigned long long)a1.fallbacks, (unsigned long long)a1.cudnn[0]);
            gpu = keep;
            st_backend_free(b2);
        }
        unsetenv("STRATA_CUDA_ATTENTION");
    }
    /* auto with fp32 matmuls: the own kernels, cuDNN not asked */
    st_backend_cuda_set_matmul(gpu, ST_MATMUL_FP32, &err);
    st_backend_cuda_attention_stats(gpu, &a0);
    test_attention(1, 21, 4, 2, 24, false, false, 3e-5, 3e-4, " (auto, fp32 matmul)");
    st_backend_cuda_attention_stats(gpu, &a1);
    CHECK(a1.own[0] == a0.own[0] + 1 && a1.fallbacks == a0.fallbacks && a1.cudnn[0] == a0.cudnn[0],
          "auto with fp32 matmuls did not run the own kernels alone");
}

/* POET-X through the vtable (issue 30: NULL before): the polynomial and its gradient, the
 * permuted apply and its gradients, against the CPU */
static void test_poetx(int nb, int b, int k, int N) {
    int d = nb * b;
    size_t bb = (size_t)b * b, nq = (size_t)b * (b - 1) / 2, n = (size_t)N * d;
    vecf q = randn(nb * nq, 0.3f / b), dG = randn(nb * bb, 1), dq = randn(nb * nq, 1), G(nb * bb, NAN);
    vecf x = randn(n, 1), dy = randn(n, 1), dx = randn(n, 1), y(n, NAN), dGa = randn(nb * bb, 1);
    std::vector<int32_t> perm(d);
    for (int i = 0; i < d; i++) perm[i] = (i * 7 + 3) % d; /* 7 is prime to the d used here */
    float *d_q = up(q), *d_dG = up(dG), *d_dq = up(dq), *d_G = up(G), *d_x = up(x), *d_dy = up(dy), *d_dx = up(dx);
    float *d_y = up(y), *d_dGa = up(dGa);
    int32_t *d_perm = up(perm);
    gpu->ops->poet_cayley_forward(gpu, d_G, d_q, nb, b, k);
    gpu->ops->poet_cayley_backward(gpu, d_dq, d_dG, d_q, nb, b, k);
    cpu->ops->poet_cayley_forward(cpu, G.data(), q.data(), nb, b, k);
    cpu->ops->poet_cayley_backward(cpu, dq.data(), dG.data(), q.data(), nb, b, k);
    gpu->ops->poet_apply_forward(gpu, d_y, d_x, d_G, d_perm, N, d, b, 0);
    gpu->ops->poet_apply_backward(gpu, d_dx, d_dGa, d_dy, d_x, d_G, d_perm, N, d, b, 1);
    cpu->ops->poet_apply_forward(cpu, y.data(), x.data(), G.data(), perm.data(), N, d, b, 0);
    cpu->ops->poet_apply_backward(cpu, dx.data(), dGa.data(), dy.data(), x.data(), G.data(), perm.data(), N, d, b, 1);
    char w[96];
    snprintf(w, sizeof w, "poet nb %d b %d k %d N %d", nb, b, k, N);
    std::string w0 = w;
    compare((w0 + " cayley G").c_str(), down(d_G, nb * bb), G, 1e-5, 1e-4);
    compare((w0 + " cayley dq (+=)").c_str(), down(d_dq, nb * nq), dq, 1e-5, 1e-4);
    compare((w0 + " apply y").c_str(), down(d_y, n), y, 1e-5, 1e-4);
    compare((w0 + " apply dx (+=, trans)").c_str(), down(d_dx, n), dx, 1e-5, 1e-4);
    compare((w0 + " apply dG (+=, trans)").c_str(), down(d_dGa, nb * bb), dGa, 1e-5, 1e-4);
    for (void *p : {(void *)d_q, (void *)d_dG, (void *)d_x, (void *)d_dy, (void *)d_perm}) gpu->ops->dealloc(gpu, p);
}

/* the classifier: crossentropy_forward_backward over full rows, then softmax_chunk_init,
 * _stats and _grad over chunks [0, 40), [40, 41), [41, V) of the same logits (r0 > 0);
 * every fourth row masked; targets in each chunk and outside it */
static void test_classifier(int N, int V) {
    size_t nl = (size_t)N * V;
    vecf logits = randn(nl, 3), loss(N, NAN);
    std::vector<int32_t> tg(N);
    for (int i = 0; i < N; i++) tg[i] = i % 4 == 1 ? -1 : (int32_t)((i * 37 + 3) % V);
    tg[0] = 40; /* the one-row chunk */
    float dloss = 1.0f / N;
    int32_t *d_tg = up(tg);
    float *d_l = up(logits), *d_loss = up(loss);
    gpu->ops->crossentropy_forward_backward(gpu, d_l, d_loss, d_tg, N, V, dloss);
    vecf dl = logits;
    cpu->ops->crossentropy_forward_backward(cpu, dl.data(), loss.data(), tg.data(), N, V, dloss);
    compare("crossentropy losses", down(d_loss, N), loss, 1e-5, 1e-4);
    compare("crossentropy dlogits (in place)", down(d_l, nl), dl, 1e-5, 1e-4);
    vecf rmax(N, NAN), tl(N, NAN), grads(nl, NAN), cgrads(nl, NAN), crmax(N, NAN), ctl(N, NAN);
    std::vector<double> rsum(N, NAN), crsum(N, NAN);
    float *d_rmax = up(rmax), *d_tl = up(tl);
    double *d_rsum = up(rsum);
    gpu->ops->softmax_chunk_init(gpu, d_rmax, d_rsum, d_tl, N);
    cpu->ops->softmax_chunk_init(cpu, crmax.data(), crsum.data(), ctl.data(), N);
    int bounds[] = {0, 40, 41, V};
    for (int pass = 0; pass < 2; pass++)
        for (int c = 0; c < 3; c++) {
            int r0 = bounds[c], nr = bounds[c + 1] - r0;
            vecf ch((size_t)N * nr);
            for (int i = 0; i < N; i++)
                for (int j = 0; j < nr; j++) ch[(size_t)i * nr + j] = logits[(size_t)i * V + r0 + j];
            float *d_ch = up(ch);
            if (pass == 0) {
                gpu->ops->softmax_chunk_stats(gpu, d_ch, d_tg, N, nr, r0, d_rmax, d_rsum, d_tl);
                cpu->ops->softmax_chunk_stats(cpu, ch.data(), tg.data(), N, nr, r0, crmax.data(), crsum.data(),
                                              ctl.data());
                gpu->ops->dealloc(gpu, d_ch);
                continue;
            }
            gpu->ops->softmax_chunk_grad(gpu, d_ch, d_tg, N, nr, r0, d_rmax, d_rsum, dloss);
            cpu->ops->softmax_chunk_grad(cpu, ch.data(), tg.data(), N, nr, r0, crmax.data(), crsum.data(), dloss);
            vecf g = down(d_ch, ch.size());
            for (int i = 0; i < N; i++)
                for (int j = 0; j < nr; j++) {
                    size_t k = (size_t)i * nr + j;
                    grads[(size_t)i * V + r0 + j] = g[k], cgrads[(size_t)i * V + r0 + j] = ch[k];
                }
        }
    compare("softmax_chunk_grad (in place)", grads, cgrads, 1e-5, 1e-4);
    vecf gm = down(d_rmax, N), gt = down(d_tl, N); /* the CPU's bits; masked rows keep -inf and 0 */
    CHECK(memcmp(gm.data(), crmax.data(), sizeof(float) * N) == 0, "softmax_chunk_stats rmax: not the CPU's bits");
    CHECK(memcmp(gt.data(), ctl.data(), sizeof(float) * N) == 0, "softmax_chunk_stats tlogit: not the CPU's bits");
    std::vector<double> rs(N);
    gpu->ops->synchronize(gpu);
    gpu->ops->copy_to_host(gpu, rs.data(), d_rsum, sizeof(double) * N);
    gpu->ops->dealloc(gpu, d_rsum);
    int bad = 0;
    for (int i = 0; i < N; i++) bad += !(fabs(rs[i] - crsum[i]) <= 1e-6 * fabs(crsum[i]));
    CHECK(bad == 0, "softmax_chunk_stats rsum: %d of %d rows differ from the CPU backend's", bad, N);
    gpu->ops->dealloc(gpu, d_tg);
}

/* The asynchronous copies: host_alloc's memory is zeroed; copy_async in both directions,
 * tickets counted per direction from 1; a d2h copy is ordered after the op queued before
 * it; after copy_sync the destination holds the bytes and a rewritten source no longer
 * matters; copy_query answers done after copy_sync; more copies than the event ring (256)
 * reuse its slots; a ticket older than the last is done once the last is. Under the
 * emulation the copies are deferred until waited for, so a missing wait reads stale bytes. */
static void test_copy_async(void) {
    const size_t n = 600; /* floats */
    float *h = (float *)gpu->ops->host_alloc(gpu, 2 * n * sizeof(float));
    CHECK(h != nullptr, "host_alloc of %zu bytes failed", 2 * n * sizeof(float));
    if (!h) return;
    size_t nz = 0;
    for (size_t i = 0; i < 2 * n; i++) nz += h[i] != 0;
    CHECK(nz == 0, "host_alloc is not zeroed: %zu of %zu nonzero", nz, 2 * n);
    float *hin = h, *hout = h + n;
    for (size_t i = 0; i < n; i++) hin[i] = 0.5f * (float)i + 1;
    float *d = (float *)gpu->ops->alloc(gpu, n * sizeof(float)), *d2 = (float *)gpu->ops->alloc(gpu, n * sizeof(float));
    uint64_t t1 = gpu->ops->copy_async(gpu, 0, d, hin, n * sizeof(float));
    CHECK(t1 == 1, "the first h2d ticket is %llu, want 1", (unsigned long long)t1);
    gpu->ops->copy_sync(gpu, 0, t1);
    CHECK(gpu->ops->copy_query(gpu, 0, t1), "copy_query: h2d ticket %llu not done after copy_sync",
          (unsigned long long)t1);
    for (size_t i = 0; i < n; i++) hin[i] = -7; /* the copy is done: the device keeps the old values */
    gpu->ops->residual_forward(gpu, d2, d, d, (int)n); /* queued before the d2h: d2 = 2 d */
    uint64_t t2 = gpu->ops->copy_async(gpu, 1, hout, d2, n * sizeof(float));
    CHECK(t2 == 1, "the first d2h ticket is %llu, want 1 (tickets count per direction)", (unsigned long long)t2);
    gpu->ops->copy_sync(gpu, 1, t2);
    CHECK(gpu->ops->copy_query(gpu, 1, t2), "copy_query: d2h ticket %llu not done after copy_sync",
          (unsigned long long)t2);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += hout[i] != 2 * (0.5f * (float)i + 1);
    CHECK(bad == 0, "copy_async d2h after residual_forward: %zu of %zu floats wrong (%g, want %g)", bad, n,
          (double)hout[0], 2.0);
    /* 300 one-float copies, more than the event ring: element i of d becomes i + 0.25 */
    for (size_t i = 0; i < n; i++) hin[i] = (float)i + 0.25f;
    uint64_t last = 0, prev = t1;
    int increasing = 1;
    for (size_t i = 0; i < 300; i++) {
        last = gpu->ops->copy_async(gpu, 0, d + i, hin + i, sizeof(float));
        increasing &= last == prev + 1;
        prev = last;
    }
    CHECK(increasing && last == t1 + 300, "h2d tickets after 300 more copies: last %llu, want %llu, each +1",
          (unsigned long long)last, (unsigned long long)(t1 + 300));
    gpu->ops->copy_sync(gpu, 0, last);
    CHECK(gpu->ops->copy_query(gpu, 0, last - 299), "an older h2d ticket is not done after the last one");
    uint64_t t3 = gpu->ops->copy_async(gpu, 1, hout, d, n * sizeof(float));
    gpu->ops->copy_sync(gpu, 1, t3);
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += hout[i] != (i < 300 ? (float)i + 0.25f : 0.5f * (float)i + 1);
    CHECK(t3 == 2 && bad == 0, "300 one-float copies through the event ring: %zu of %zu floats wrong (d2h ticket %llu)",
          bad, n, (unsigned long long)t3);
    /* host_free waits for the copies still queued on the block (the emulation counts a
     * block freed under a queued copy) */
#ifdef ST_CUDA_EMU
    uint64_t fif = st_emu::rt().freed_in_flight;
#endif
    gpu->ops->copy_async(gpu, 1, hout, d, n * sizeof(float)); /* not waited for */
    gpu->ops->host_free(gpu, h);
    gpu->ops->dealloc(gpu, d);
    gpu->ops->dealloc(gpu, d2);
#ifdef ST_CUDA_EMU
    CHECK(st_emu::rt().freed_in_flight == fif, "host_free freed a block under a queued copy (%llu)",
          (unsigned long long)(st_emu::rt().freed_in_flight - fif));
#endif
}

#ifdef ST_CUDA_EMU
#include <thread>
/* An asynchronous fault (the emulation's sticky fault after a gelu, as a GPU's illegal
 * address) met first by another thread's copy wait: st_backend_cuda_status says it was
 * asynchronous, where it surfaced and the last op queued before it. Several threads
 * waiting at once keep one error (note() is locked). Last: the emulated context is lost. */
static void test_async_fault(void) {
    st_err err = {};
    st_backend *b = nullptr;
    CHECK(st_backend_cuda_create(&b, 0, (size_t)1 << 20, &err) == ST_OK, "st_backend_cuda_create: %s", err.msg);
    if (!b) return;
    float *d = (float *)b->ops->alloc(b, 64 * sizeof(float));
    float *h = (float *)b->ops->host_alloc(b, 64 * sizeof(float));
    b->ops->gelu_forward(b, d, d, 64);
    st_emu::fault(cudaErrorIllegalAddress); /* what the gelu did, on a GPU */
    uint64_t t = b->ops->copy_async(b, 1, h, d, 64 * sizeof(float));
    std::vector<std::thread> th;
    for (int i = 0; i < 4; i++) th.emplace_back([b, t] { b->ops->copy_sync(b, 1, t); b->ops->copy_query(b, 1, t); });
    for (auto &x : th) x.join();
    err = {};
    st_status s = st_backend_cuda_status(b, &err);
    CHECK(s == ST_ERR_INVALID && strstr(err.msg, "asynchronous") && strstr(err.msg, "gelu_forward") &&
              strstr(err.msg, "cudaErrorIllegalAddress") && strstr(err.msg, "compute-sanitizer"),
          "an asynchronous fault seen first by a copy's wait on another thread should be reported as asynchronous, "
          "naming the last op queued (gelu_forward) and how to find it: status %d: %s", (int)s, err.msg);
    b->ops->host_free(b, h);
    st_backend_free(b);
}
#endif

int main(void) {
    st_err err = {};
    size_t budget = (size_t)64 << 20;
    st_status s = st_backend_cuda_create(&gpu, 0, budget, &err);
    if (s == ST_ERR_UNSUPPORTED) {
        printf("test_cuda_backend: %s: skipped (needs a CUDA device)\n", err.msg);
        return 77;
    }
    CHECK(s == ST_OK, "st_backend_cuda_create: %s", err.msg);
    if (s != ST_OK) return test_finish("test_cuda_backend");
    if (st_backend_cpu_create(&cpu, 1, &err) != ST_OK) return 1;
    st_rng_seed(&rng, 15);
    /* the whole vtable: st_backend_ops is a name and function pointers, none of them NULL
     * (the POET-X entries included, since issue 30) */
    {
        void *e[sizeof(st_backend_ops) / sizeof(void *)];
        static_assert(sizeof e == sizeof(st_backend_ops), "st_backend_ops is not all pointers");
        memcpy(e, gpu->ops, sizeof e);
        size_t nnull = 0, first = 0, upto = sizeof e / sizeof e[0];
        for (size_t i = 0; i < upto; i++)
            if (!e[i] && !nnull++) first = i;
        CHECK(nnull == 0, "%zu entries of st_backend_ops are NULL (the first is pointer %zu)", nnull, first);
    }
    /* st_backend_memory through the vtable's memory entry: the arena's figures, cuBLASLt's
     * workspace a block of it from the start (bench stream's device_peak_bytes) */
    size_t used = 0, peak = 0, cap = 0, ws0 = st_backend_cuda_matmul_workspace(budget);
    CHECK(st_backend_memory(gpu, &used, &peak, &cap, &err) == ST_OK && used == ws0 && peak == ws0 && cap == budget,
          "a fresh arena: used %zu, peak %zu (want the workspace, %zu), capacity %zu (want %zu): %s", used, peak, ws0,
          cap, budget, err.msg);
    /* the arena: zeroed blocks, nothing past the budget */
    float *z = (float *)gpu->ops->alloc(gpu, 4096 * sizeof(float));
    vecf zh = down(z, 4096);
    size_t nz = 0;
    for (float v : zh) nz += v != 0;
    CHECK(nz == 0, "alloc is not zeroed: %zu of 4096 nonzero", nz);
    /* cuBLASLt's workspace is a block of the arena since creation: the free bytes are the
     * budget less exactly it (8 MiB of 64: an eighth, under the 32 MiB cap) */
    size_t ws = st_backend_cuda_matmul_workspace(budget);
    CHECK(ws == budget / 8 && st_backend_cuda_matmul_workspace((size_t)1 << 30) == (size_t)32 << 20,
          "the matmul workspace: %zu bytes of a 64 MiB arena (want 8 MiB), %zu of 1 GiB (want 32 MiB)", ws,
          st_backend_cuda_matmul_workspace((size_t)1 << 30));
    void *over = gpu->ops->alloc(gpu, budget - ws + 1);
    CHECK(!over, "budget - workspace + 1 bytes should not fit in the arena");
    gpu->ops->dealloc(gpu, over);
    void *all = gpu->ops->alloc(gpu, budget - ws), *more = gpu->ops->alloc(gpu, 1);
    CHECK(all && !more, "budget - workspace fits once, and then nothing more (%p, %p)", all, more);
    gpu->ops->dealloc(gpu, all);
    void *blk = gpu->ops->alloc(gpu, 1000); /* a block of 1024 */
    CHECK(st_backend_memory(gpu, &used, &peak, &cap, &err) == ST_OK && used == ws + 1024 && peak == budget &&
              cap == budget,
          "after the whole arena was taken and given back, 1000 bytes held: used %zu (want %zu), peak %zu, capacity "
          "%zu (want %zu both)", used, ws + 1024, peak, cap, budget);
    gpu->ops->dealloc(gpu, blk);
    /* a value outside st_matmul_mode is refused naming it (the names are st_backend_matmul_parse's,
     * checked by test_device) */
    for (int bad : {-1, 3, 99}) {
        err = {};
        s = st_backend_cuda_set_matmul(gpu, (st_matmul_mode)bad, &err);
        char want[32];
        snprintf(want, sizeof want, "matmul mode %d ", bad);
        CHECK(s == ST_ERR_INVALID && strstr(err.msg, want), "set_matmul(%d) should be refused naming it (status %d: %s)",
              bad, (int)s, err.msg);
    }
    test_layernorm(5, 768);
    test_layernorm(67, 257);
    test_rmsnorm(3, 4, 128, 640);
    test_rmsnorm(33, 1, 4096, 4096);
    test_eltwise(3, 2309);
    test_write_variants(2, 19, 48, 3);
    for (int lay = 0; lay < 2; lay++) {
        test_matmul(7, 33, 19, (st_wlayout)lay, true, true);
        test_matmul(5, 24, 41, (st_wlayout)lay, false, true);
        test_matmul(3, 17, 9, (st_wlayout)lay, true, false);
        test_matmul(300, 24, 768, (st_wlayout)lay, true, true); /* the bias gradient over 64 row groups */
        for (const MatmulMode *m : {&mm_tf32, &mm_bf16}) { /* K up to 300 */
            test_matmul(7, 33, 19, (st_wlayout)lay, true, true, *m);
            test_matmul(260, 37, 23, (st_wlayout)lay, false, true, *m);
            test_matmul(9, 300, 40, (st_wlayout)lay, true, false, *m);
            test_matmul(12, 36, 20, (st_wlayout)lay, true, true, *m); /* leading dimensions of 16-byte multiples */
            test_matmul(260, 512, 64, (st_wlayout)lay, false, true, *m); /* K 512 (and 260): a GPU must differ too */
        }
    }
    test_embed(2, 13, 37, 29, 16);
    test_rope(2, 11, 3, 16, 70); /* heads in the first 48 of 70 floats */
    for (int docs = 0; docs < 2; docs++) {
        test_attention(2, 19, 3, 3, 16, true, docs);
        test_attention(1, 21, 4, 2, 24, false, docs);
        test_attention(2, 17, 4, 1, 16, false, docs);
    }
    test_attention_select();
    test_poetx(4, 8, 2, 13);
    test_poetx(2, 32, 3, 5);
    test_classifier(7, 53);
    test_classifier(6, 300);
    test_copy_async();
    /* device timing: marks increase; the seconds between two bound the work queued between
     * them (a gelu over 1M floats: > 0); reversed, or older than the ring's 4096, unknown */
    {
        size_t n = (size_t)1 << 20;
        float *d = (float *)gpu->ops->alloc(gpu, n * sizeof(float));
        uint64_t m0 = gpu->ops->timer_mark(gpu);
        gpu->ops->gelu_forward(gpu, d, d, (int)n);
        uint64_t m1 = gpu->ops->timer_mark(gpu);
        double sec = gpu->ops->timer_seconds(gpu, m0, m1), rev = gpu->ops->timer_seconds(gpu, m1, m0);
        for (int i = 0; i < 4100; i++) gpu->ops->timer_mark(gpu);
        double old = gpu->ops->timer_seconds(gpu, m0, m1);
        CHECK(m0 > 0 && m1 == m0 + 1 && sec > 0 && sec < 10 && rev < 0 && old < 0,
              "timer marks %llu, %llu: %g s around a gelu of 1M floats (want > 0), reversed %g, after 4100 more "
              "marks %g (want < 0 both)", (unsigned long long)m0, (unsigned long long)m1, sec, rev, old);
        printf("timer: a gelu over 1M floats took %.3g ms on the device\n", sec * 1e3);
        gpu->ops->dealloc(gpu, d);
    }
    s = st_backend_cuda_status(gpu, &err);
    CHECK(s == ST_OK, "the backend kept an error: %s", err.msg);
    st_backend_free(gpu);
    /* an op the backend refuses (a head size over its attention kernels' 128) is kept and
     * reported by st_backend_cuda_status with the op's name; a later good op does not clear it */
    CHECK(st_backend_cuda_create(&gpu, 0, (size_t)1 << 20, &err) == ST_OK, "st_backend_cuda_create: %s", err.msg);
    {
        int T = 3, hs = 136;
        float *q = (float *)gpu->ops->alloc(gpu, sizeof(float) * 3 * T * hs);
        float *o = (float *)gpu->ops->alloc(gpu, sizeof(float) * T * hs), *l = (float *)gpu->ops->alloc(gpu, 4 * T);
        gpu->ops->attention_gqa_forward(gpu, o, l, q, q + hs, q + 2 * hs, 3 * hs, 1, T, 1, 1, hs);
        gpu->ops->gelu_forward(gpu, o, q, T);
        err = {};
        s = st_backend_cuda_status(gpu, &err);
        CHECK(s == ST_ERR_INVALID && strstr(err.msg, "attention_gqa_forward"),
              "a head size of 136 should be kept as attention_gqa_forward's error (status %d: %s)", (int)s, err.msg);
        for (float *p : {q, o, l}) gpu->ops->dealloc(gpu, p);
    }
    st_backend_free(gpu);
    gpu = nullptr;
    /* an arena that leaves under 512 MiB of the device's free memory is refused, naming the
     * largest budget that fits: lazily loaded kernels and the runtime need room beside it */
    {
        size_t fr = 0, tot = 0;
        CHECK(cudaMemGetInfo(&fr, &tot) == cudaSuccess && fr > ((size_t)600 << 20), "cudaMemGetInfo: %zu free", fr);
        err = {};
        s = st_backend_cuda_create(&gpu, 0, fr - ((size_t)128 << 20), &err);
        CHECK(s == ST_ERR_NOMEM && !gpu && strstr(err.msg, "at most"),
              "an arena of all but 128 MiB of the free device memory should be refused naming the largest budget "
              "(status %d: %s)", (int)s, err.msg);
        if (gpu) st_backend_free(gpu), gpu = nullptr;
    }
    /* cuda:N past the devices there are (cuda:1 on the emulation's one device) is refused
     * naming the device, the count and the devices to give; cuda:0 worked above */
    int count = 0;
    CHECK(cudaGetDeviceCount(&count) == cudaSuccess && count >= 1, "cudaGetDeviceCount: %d devices", count);
    for (int dev : {count, count + 7, -1}) {
        err = {};
        s = st_backend_cuda_create(&gpu, dev, (size_t)1 << 20, &err);
        char want[64], give[64];
        snprintf(want, sizeof want, "no CUDA device %d (%d found", dev, count);
        snprintf(give, sizeof give, count == 1 ? "give device cuda:0 or cpu" : "cuda:0 to cuda:%d, or cpu", count - 1);
        CHECK(s == ST_ERR_UNSUPPORTED && !gpu && strstr(err.msg, want) && strstr(err.msg, give),
              "device %d of %d refused naming it, the count and the devices there are (status %d: %s)", dev, count,
              (int)s, err.msg);
        if (gpu) st_backend_free(gpu), gpu = nullptr;
    }
    st_backend_free(cpu);
#ifdef ST_CUDA_EMU
    test_async_fault(); /* last: the emulated device is lost after it */
#endif
    return test_finish("test_cuda_backend");
}
