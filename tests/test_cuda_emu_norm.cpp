/* test_cuda_emu_norm.cpp - the CUDA LayerNorm and RMSNorm kernels (src/backend/cuda/
 * kernels_norm.cuh), forward and backward, fp32 and bf16 storage, run under the CUDA
 * emulation against the CPU backend (the checks are described in cuda_emu/emu_diff.h).
 * Shapes: rows of 1, 31, 33, 64, 257 and 768 columns, more rows than the 4 blocks the
 * emulated grid is capped at (so blocks loop over rows), more than 8 rows (every row
 * phase of the weight-gradient kernel), more than 4 x 32 columns (its blocks loop over
 * columns), and RMSNorm per head with rows wider than the heads (elements between the
 * groups must stay untouched). At the shapes with more than 8 rows the backward runs
 * twice: the same bits (the emulated threads' timing differs from run to run). */
#include "backend/cuda/kernels_norm.cuh"
#include "emu_diff.h"

#define TOL_LN_ATOL 1e-5
#define TOL_LN_RTOL 1e-4

typedef __nv_bfloat16 bf16;

/* ---------------------------------------------------------------- layernorm */

struct LnIn {
    vecf x, w, b, dout, gx, gw, gb; /* gx, gw, gb: what dinp, dw, db hold before backward */
};
struct LnOut {
    vecf out, mean, rstd, dx, dw, db;
};

template <class T> static LnOut ln_cuda(const LnIn &in, int N, int C) {
    auto x = store<T>(in.x), w = store<T>(in.w), b = store<T>(in.b), dout = store<T>(in.dout);
    auto dx = store<T>(in.gx), out = store<T>(vecf((size_t)N * C, NAN));
    vecf mean(N, NAN), rstd(N, NAN), dw = in.gw, db = in.gb;
    cu_layernorm_forward<T>(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, nullptr);
    cu_layernorm_backward<T>(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(),
                             rstd.data(), N, C, nullptr);
    return {load(out), mean, rstd, load(dx), dw, db};
}

static LnOut ln_cpu(const LnIn &in, int N, int C) {
    vecf out((size_t)N * C, NAN), mean(N, NAN), rstd(N, NAN), dx = in.gx, dw = in.gw, db = in.gb;
    cpu->ops->layernorm_forward(cpu, out.data(), mean.data(), rstd.data(), in.x.data(), in.w.data(), in.b.data(), N,
                                C);
    cpu->ops->layernorm_backward(cpu, dx.data(), dw.data(), db.data(), in.dout.data(), in.x.data(), in.w.data(),
                                 mean.data(), rstd.data(), N, C);
    return {out, mean, rstd, dx, dw, db};
}

static void ln_compare(const char *tag, const LnOut &k, const LnOut &ref, double out_rtol) {
    const char *names[6] = {"out", "mean", "rstd", "dinp (+=)", "dw (+=)", "db (+=)"};
    const vecf *a[6] = {&k.out, &k.mean, &k.rstd, &k.dx, &k.dw, &k.db};
    const vecf *r[6] = {&ref.out, &ref.mean, &ref.rstd, &ref.dx, &ref.dw, &ref.db};
    for (int i = 0; i < 6; i++) {
        char what[160];
        snprintf(what, sizeof what, "%s %s", tag, names[i]);
        /* out and dinp are stored as T; mean, rstd, dw, db are fp32 */
        compare(what, *a[i], *r[i], TOL_LN_ATOL, TOL_LN_RTOL + (i == 0 || i == 3 ? out_rtol : 0));
    }
}

static void test_layernorm(int N, int C, int twice) {
    size_t n = (size_t)N * C;
    LnIn in = {randn(n, 1.5f, 0.3f), randn(C, 0.2f, 1.0f), randn(C, 0.2f), randn(n, 1), randn(n, 1), randn(C, 1),
               randn(C, 1)};
    char tag[96];
    snprintf(tag, sizeof tag, "layernorm N=%d C=%d fp32", N, C);
    LnOut k = ln_cuda<float>(in, N, C);
    ln_compare(tag, k, ln_cpu(in, N, C), 0);
    if (twice) {
        LnOut again = ln_cuda<float>(in, N, C);
        snprintf(tag, sizeof tag, "layernorm N=%d C=%d fp32 run twice: dinp, dw, db", N, C);
        same_bits(tag, again.dx, k.dx, 0), same_bits(tag, again.dw, k.dw, 0), same_bits(tag, again.db, k.db, 0);
    }

    LnIn r = {round_bf16(in.x), round_bf16(in.w), round_bf16(in.b), round_bf16(in.dout), round_bf16(in.gx), in.gw,
              in.gb};
    LnOut k32 = ln_cuda<float>(r, N, C), k16 = ln_cuda<bf16>(r, N, C);
    snprintf(tag, sizeof tag, "layernorm N=%d C=%d bf16", N, C);
    ln_compare(tag, k16, ln_cpu(r, N, C), BF16_RTOL);
    same_bits(tag, k16.out, k32.out, 1), same_bits(tag, k16.mean, k32.mean, 0);
    same_bits(tag, k16.rstd, k32.rstd, 0), same_bits(tag, k16.dx, k32.dx, 1);
    same_bits(tag, k16.dw, k32.dw, 0), same_bits(tag, k16.db, k32.db, 0);
}

/* ---------------------------------------------------------------- rmsnorm */

struct RmsIn {
    vecf x, w, dout, gx, gw;
};
struct RmsOut {
    vecf out, rstd, dx, dw;
};
struct RmsShape {
    int N, H, hs, ld;
    float eps;
};

template <class T> static RmsOut rms_cuda(const RmsIn &in, RmsShape s) {
    auto x = store<T>(in.x), w = store<T>(in.w), dout = store<T>(in.dout), dx = store<T>(in.gx);
    auto out = store<T>(vecf(in.x.size(), NAN));
    vecf rstd((size_t)s.N * s.H, NAN), dw = in.gw;
    cu_rmsnorm_forward<T>(out.data(), rstd.data(), x.data(), w.data(), s.N, s.H, s.hs, s.ld, s.eps, nullptr);
    cu_rmsnorm_backward<T>(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), s.N, s.H, s.hs, s.ld,
                           nullptr);
    return {load(out), rstd, load(dx), dw};
}

static RmsOut rms_cpu(const RmsIn &in, RmsShape s) {
    vecf out(in.x.size(), NAN), rstd((size_t)s.N * s.H, NAN), dx = in.gx, dw = in.gw;
    cpu->ops->rmsnorm_forward(cpu, out.data(), rstd.data(), in.x.data(), in.w.data(), s.N, s.H, s.hs, s.ld, s.eps);
    cpu->ops->rmsnorm_backward(cpu, dx.data(), dw.data(), in.dout.data(), in.x.data(), in.w.data(), rstd.data(), s.N,
                               s.H, s.hs, s.ld);
    return {out, rstd, dx, dw};
}

/* the normed elements of a (N, ld) buffer, group after group (gap = 0), or the others (gap = 1) */
static vecf pick(const vecf &v, RmsShape s, int gap) {
    vecf r;
    for (int n = 0; n < s.N; n++)
        for (int i = 0; i < s.ld; i++)
            if ((i < s.H * s.hs) != gap) r.push_back(v[(size_t)n * s.ld + i]);
    return r;
}

static void rms_compare(const char *tag, const RmsOut &k, const RmsOut &ref, RmsShape s, double out_rtol) {
    char what[160];
    snprintf(what, sizeof what, "%s out", tag);
    compare(what, pick(k.out, s, 0), pick(ref.out, s, 0), TOL_LN_ATOL, TOL_LN_RTOL + out_rtol);
    snprintf(what, sizeof what, "%s rstd", tag);
    compare(what, k.rstd, ref.rstd, TOL_LN_ATOL, TOL_LN_RTOL);
    snprintf(what, sizeof what, "%s dinp (+=)", tag);
    compare(what, pick(k.dx, s, 0), pick(ref.dx, s, 0), TOL_LN_ATOL, TOL_LN_RTOL + out_rtol);
    snprintf(what, sizeof what, "%s dw (+=)", tag);
    compare(what, k.dw, ref.dw, TOL_LN_ATOL, TOL_LN_RTOL);
}

static void test_rmsnorm(RmsShape s) {
    size_t n = (size_t)s.N * s.ld;
    RmsIn in = {randn(n, 1.5f, 0.3f), randn(s.hs, 0.2f, 1.0f), randn(n, 1), randn(n, 1), randn(s.hs, 1)};
    char tag[128];
    snprintf(tag, sizeof tag, "rmsnorm N=%d H=%d hs=%d ld=%d fp32", s.N, s.H, s.hs, s.ld);
    RmsOut k = rms_cuda<float>(in, s);
    rms_compare(tag, k, rms_cpu(in, s), s, 0);
    /* between and after the groups: out never written, dinp keeps what it held */
    vecf gap_out = pick(k.out, s, 1), gap_dx = pick(k.dx, s, 1), gap_gx = pick(in.gx, s, 1);
    size_t wrote = 0;
    for (float v : gap_out) wrote += v == v;
    CHECK(wrote == 0, "%s: %zu elements outside the groups written in out", tag, wrote);
    same_bits("rmsnorm dinp outside the groups", gap_dx, gap_gx, 0);
    if (s.N * s.H > 8) {
        RmsOut again = rms_cuda<float>(in, s);
        snprintf(tag, sizeof tag, "rmsnorm N=%d H=%d hs=%d ld=%d fp32 run twice: dinp, dw", s.N, s.H, s.hs, s.ld);
        same_bits(tag, again.dx, k.dx, 0), same_bits(tag, again.dw, k.dw, 0);
    }

    RmsIn r = {round_bf16(in.x), round_bf16(in.w), round_bf16(in.dout), round_bf16(in.gx), in.gw};
    RmsOut k32 = rms_cuda<float>(r, s), k16 = rms_cuda<bf16>(r, s);
    snprintf(tag, sizeof tag, "rmsnorm N=%d H=%d hs=%d ld=%d bf16", s.N, s.H, s.hs, s.ld);
    rms_compare(tag, k16, rms_cpu(r, s), s, BF16_RTOL);
    same_bits(tag, pick(k16.out, s, 0), pick(k32.out, s, 0), 1), same_bits(tag, k16.rstd, k32.rstd, 0);
    same_bits(tag, k16.dx, k32.dx, 1), same_bits(tag, k16.dw, k32.dw, 0);
}

int main(void) {
    emu_setup(15);
    int ln[][2] = {{5, 1}, {6, 31}, {5, 33}, {9, 64}, {5, 257}, {3, 768}};
    for (auto &s : ln) test_layernorm(s[0], s[1], s[0] > 8);
    RmsShape rms[] = {{5, 1, 1, 1, 1e-5f},      {6, 1, 31, 31, 1e-6f},    {5, 1, 33, 33, 1e-5f},
                      {3, 1, 257, 257, 1e-6f},  {2, 1, 768, 768, 1e-5f},  {9, 2, 33, 80, 1e-6f},
                      {3, 4, 128, 640, 1e-6f}};
    for (auto &s : rms) test_rmsnorm(s);
    st_backend_free(cpu);
    return test_finish("test_cuda_emu_norm");
}
