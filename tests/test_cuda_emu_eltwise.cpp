/* test_cuda_emu_eltwise.cpp - the CUDA elementwise kernels (src/backend/cuda/
 * kernels_eltwise.cuh): residual add, GELU-tanh and SwiGLU forward and backward in fp32
 * and bf16 storage, fp32 -> bf16 rounding and bf16 -> fp32, run under the CUDA emulation against the
 * CPU backend (the checks are described in cuda_emu/emu_diff.h; the tolerances are
 * tests/test_ops_diff.c's and test_ops_llama_diff.c's for the same ops). Sizes: 1, 31,
 * 33, 257 and 2309 elements (the last is more than the 4 x 256 threads of the capped
 * emulated grid: every kernel's grid-stride loop runs three times). */
#include "backend/cuda/kernels_eltwise.cuh"
#include "emu_diff.h"

#define TOL_EW_ATOL 1e-6
#define TOL_EW_RTOL 1e-5
#define TOL_BWD_ATOL 1e-5 /* gelu and swiglu backward: one more product, 1 - sigmoid */
#define TOL_BWD_RTOL 1e-5

typedef __nv_bfloat16 bf16;

/* One elementwise op: `fwd` writes one output from the inputs, `bwd` adds into the
 * gradients. Inputs, outputs and gradients are all stored as T. */
struct EwCase {
    std::vector<vecf> in;    /* forward inputs (bwd also reads them), then dout */
    std::vector<vecf> grads; /* what the gradients hold before backward */
    size_t nout;
};
struct EwOut {
    vecf out;
    std::vector<vecf> grads;
};

enum Op { RESIDUAL, GELU, SWIGLU };
static const char *op_name[] = {"residual", "gelu", "swiglu"};

template <class T> static EwOut ew_cuda(Op op, const EwCase &c, int N, int F) {
    std::vector<std::vector<T>> in, g;
    for (auto &v : c.in) in.push_back(store<T>(v));
    for (auto &v : c.grads) g.push_back(store<T>(v));
    std::vector<T> out = store<T>(vecf(c.nout, NAN));
    size_t n = c.nout;
    switch (op) {
    case RESIDUAL:
        cu_residual_forward<T>(out.data(), in[0].data(), in[1].data(), n, nullptr);
        cu_residual_backward<T>(g[0].data(), g[1].data(), in[2].data(), n, nullptr);
        break;
    case GELU:
        cu_gelu_forward<T>(out.data(), in[0].data(), n, nullptr);
        cu_gelu_backward<T>(g[0].data(), in[0].data(), in[1].data(), n, nullptr);
        break;
    case SWIGLU:
        cu_swiglu_forward<T>(out.data(), in[0].data(), N, F, nullptr);
        cu_swiglu_backward<T>(g[0].data(), in[0].data(), in[1].data(), N, F, nullptr);
        break;
    }
    EwOut r = {load(out), {}};
    for (auto &v : g) r.grads.push_back(load(v));
    return r;
}

static EwOut ew_cpu(Op op, const EwCase &c, int N, int F) {
    EwOut r = {vecf(c.nout, NAN), c.grads};
    int n = (int)c.nout;
    const st_backend_ops *o = cpu->ops;
    switch (op) {
    case RESIDUAL:
        o->residual_forward(cpu, r.out.data(), c.in[0].data(), c.in[1].data(), n);
        o->residual_backward(cpu, r.grads[0].data(), r.grads[1].data(), c.in[2].data(), n);
        break;
    case GELU:
        o->gelu_forward(cpu, r.out.data(), c.in[0].data(), n);
        o->gelu_backward(cpu, r.grads[0].data(), c.in[0].data(), c.in[1].data(), n);
        break;
    case SWIGLU:
        o->swiglu_forward(cpu, r.out.data(), c.in[0].data(), N, F);
        o->swiglu_backward(cpu, r.grads[0].data(), c.in[0].data(), c.in[1].data(), N, F);
        break;
    }
    return r;
}

static void ew_compare(const char *tag, const EwOut &k, const EwOut &ref, double bwd_atol, double bwd_rtol,
                       double extra_rtol) {
    char what[160];
    snprintf(what, sizeof what, "%s forward out", tag);
    compare(what, k.out, ref.out, TOL_EW_ATOL, TOL_EW_RTOL + extra_rtol);
    for (size_t i = 0; i < k.grads.size(); i++) {
        snprintf(what, sizeof what, "%s backward grad %zu (+=)", tag, i);
        compare(what, k.grads[i], ref.grads[i], bwd_atol, bwd_rtol + extra_rtol);
    }
}

/* n elements (N rows of F for swiglu, whose input rows are 2F wide) */
static void test_ew(Op op, int N, int F) {
    size_t n = (size_t)N * F;
    EwCase c;
    double bwd_atol = TOL_BWD_ATOL, bwd_rtol = TOL_BWD_RTOL;
    switch (op) {
    case RESIDUAL:
        c = {{randn(n, 1), randn(n, 1), randn(n, 1)}, {randn(n, 1), randn(n, 1)}, n};
        bwd_atol = TOL_EW_ATOL, bwd_rtol = TOL_EW_RTOL;
        break;
    case GELU: /* scale 2.5: x out to ~8, both tails of tanh */
        c = {{randn(n, 2.5f), randn(n, 1)}, {randn(n, 1)}, n};
        break;
    case SWIGLU:
        c = {{randn(2 * n, 2.0f), randn(n, 1)}, {randn(2 * n, 1)}, n};
        break;
    }
    char tag[96];
    snprintf(tag, sizeof tag, "%s N=%d F=%d fp32", op_name[op], N, F);
    ew_compare(tag, ew_cuda<float>(op, c, N, F), ew_cpu(op, c, N, F), bwd_atol, bwd_rtol, 0);

    EwCase r = c;
    for (auto &v : r.in) v = round_bf16(v);
    for (auto &v : r.grads) v = round_bf16(v);
    EwOut k32 = ew_cuda<float>(op, r, N, F), k16 = ew_cuda<bf16>(op, r, N, F);
    snprintf(tag, sizeof tag, "%s N=%d F=%d bf16", op_name[op], N, F);
    ew_compare(tag, k16, ew_cpu(op, r, N, F), bwd_atol, bwd_rtol, BF16_RTOL);
    same_bits(tag, k16.out, k32.out, 1);
    for (size_t i = 0; i < k16.grads.size(); i++) same_bits(tag, k16.grads[i], k32.grads[i], 1);
}

/* fp32 -> bf16: the CPU backend's to_bf16 bit for bit on random bit patterns, rounding
 * ties, the largest finite value (rounds to infinity), infinities, subnormals and signed
 * zeros; a NaN stays a NaN (its payload is the GPU's own: 0x7fff there). */
static void test_to_bf16(size_t n) {
    std::vector<float> src(n);
    uint32_t specials[] = {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0x7f800000u,
                           0xff800000u, 0x00000001u, 0x80000000u, 0x007fffffu, 0x7fc00001u};
    for (size_t i = 0; i < n; i++) {
        uint32_t u = i < 10 ? specials[i] : (uint32_t)st_rng_u64(&emu_rng);
        memcpy(&src[i], &u, 4);
    }
    std::vector<bf16> dst(n, __nv_bfloat16{0xdead});
    std::vector<uint16_t> want(n);
    cu_to_bf16<float>(dst.data(), src.data(), n, nullptr);
    cpu->ops->to_bf16(cpu, want.data(), src.data(), n);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        int ok = src[i] != src[i] ? (dst[i].__x & 0x7fff) > 0x7f80 : dst[i].__x == want[i];
        if (!ok && !bad++) first = i;
    }
    CHECK(bad == 0, "to_bf16 n=%zu: %zu of %zu differ from the CPU backend's (first [%zu]: %#06x, want %#06x)", n,
          bad, n, first, bad ? dst[first].__x : 0, bad ? want[first] : 0);
}

/* bf16 -> fp32: the CPU backend's from_bf16 bit for bit on every one of the 65536 bf16
 * patterns (NaNs with their payloads, infinities, subnormals, signed zeros), in fp32 storage;
 * in bf16 storage the widened value stored again is the pattern itself. */
static void test_from_bf16(void) {
    size_t n = 65536;
    std::vector<bf16> src(n);
    for (size_t i = 0; i < n; i++) src[i].__x = (uint16_t)i;
    std::vector<float> dst(n, NAN), want(n, NAN);
    std::vector<bf16> dst16(n, __nv_bfloat16{0xdead});
    cu_from_bf16<float>(dst.data(), src.data(), n, nullptr);
    cu_from_bf16<bf16>(dst16.data(), src.data(), n, nullptr);
    std::vector<uint16_t> src_bits(n);
    for (size_t i = 0; i < n; i++) src_bits[i] = src[i].__x;
    cpu->ops->from_bf16(cpu, want.data(), src_bits.data(), n);
    CHECK(memcmp(dst.data(), want.data(), n * 4) == 0, "from_bf16: bits differ from the CPU backend's");
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += (src[i].__x & 0x7fff) <= 0x7f80 && dst16[i].__x != src[i].__x;
    CHECK(bad == 0, "from_bf16 into bf16 storage: %zu of the non-NaN patterns changed", bad);
}

int main(void) {
    emu_setup(29);
    int shapes[][2] = {{1, 1}, {1, 31}, {1, 33}, {1, 257}, {1, 2309}};
    for (int op = RESIDUAL; op <= GELU; op++)
        for (auto &s : shapes) test_ew((Op)op, s[0], s[1]);
    int sw[][2] = {{1, 1}, {3, 31}, {2, 33}, {3, 257}, {3, 768}};
    for (auto &s : sw) test_ew(SWIGLU, s[0], s[1]);
    for (size_t n : {10, 33, 257, 2309}) test_to_bf16(n);
    test_from_bf16();
    st_backend_free(cpu);
    return test_finish("test_cuda_emu_eltwise");
}
