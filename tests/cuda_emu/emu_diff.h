/* emu_diff.h - what the emulated differential tests of the CUDA kernels share
 * (tests/test_cuda_emu_*.cpp): host buffers in fp32 or bf16 storage, the CPU backend
 * as the reference, and the checks.
 *
 * Each op is checked three ways:
 *   1. fp32 storage against the CPU backend on the same random inputs, per element
 *      |cuda - cpu| <= atol * max|cpu| + rtol * |cpu| (the tolerance of tests/test_ops_diff.c
 *      for that op: both sides round in fp32, in different orders);
 *   2. bf16 storage, on inputs rounded to bf16, equals the fp32-storage kernel on the same
 *      rounded values with each bf16 output rounded once, bit for bit: the arithmetic and
 *      accumulation are fp32 whatever the storage (fp32 outputs such as mean, rstd, dw
 *      are equal bit for bit);
 *   3. bf16 storage against the CPU backend on the rounded inputs, rtol 2^-8 (half a bf16
 *      ulp) on top of the fp32 tolerance.
 * Outputs an op writes start as NaN (an element left unwritten fails); outputs it adds
 * into start from random values (an op that overwrites fails). */
#ifndef STRATA_EMU_DIFF_H
#define STRATA_EMU_DIFF_H

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_compat.cuh"

extern "C" {
#include "strata/backend.h"
#include "strata/core.h"
#include "strata/tensor.h"
#include "testutil.h"
}

typedef std::vector<float> vecf;

#define BF16_RTOL 3.90625e-3 /* 2^-8: half a bf16 ulp, relative */

static st_rng emu_rng;
static st_backend *cpu; /* the reference */
static int emu_verbose;

inline void emu_setup(uint64_t seed) {
    st_rng_seed(&emu_rng, seed);
    st_err err = {};
    if (st_backend_cpu_create(&cpu, 1, &err) != ST_OK) {
        fprintf(stderr, "st_backend_cpu_create: %s\n", err.msg);
        exit(1);
    }
    emu_verbose = getenv("STRATA_TEST_VERBOSE") != NULL;
}

inline vecf randn(size_t n, float scale, float offset = 0) {
    vecf v(n);
    for (auto &x : v) x = offset + scale * st_rng_normal(&emu_rng);
    return v;
}

/* the values as bf16 would hold them */
inline vecf round_bf16(const vecf &v) {
    vecf r(v.size());
    for (size_t i = 0; i < v.size(); i++) r[i] = st_bf16_to_f32(st_f32_to_bf16(v[i]));
    return r;
}

/* host copies in the kernels' storage T, and back to fp32 */
template <class T> std::vector<T> store(const vecf &v);
template <> inline std::vector<float> store<float>(const vecf &v) { return v; }
template <> inline std::vector<__nv_bfloat16> store<__nv_bfloat16>(const vecf &v) {
    std::vector<__nv_bfloat16> r(v.size());
    for (size_t i = 0; i < v.size(); i++) r[i] = __float2bfloat16_rn(v[i]);
    return r;
}
inline vecf load(const std::vector<float> &v) { return v; }
inline vecf load(const std::vector<__nv_bfloat16> &v) {
    vecf r(v.size());
    for (size_t i = 0; i < v.size(); i++) r[i] = __bfloat162float(v[i]);
    return r;
}

/* check 1 and 3 of the header: a against the reference, atol scaled by max|ref| */
inline void compare(const char *what, const vecf &a, const vecf &ref, double atol, double rtol) {
    double maxabs = 0;
    for (float r : ref) maxabs = fmax(maxabs, fabs((double)r));
    double atol_eff = atol * (maxabs > 0 ? maxabs : 1.0);
    if (emu_verbose) {
        double worst = 0;
        for (size_t i = 0; i < a.size(); i++) {
            double d = fabs((double)a[i] - ref[i]), lim = atol_eff + rtol * fabs((double)ref[i]);
            worst = fmax(worst, d != d ? INFINITY : d / lim);
        }
        fprintf(stderr, "  %-64s n=%-7zu err/tol %.3g\n", what, a.size(), worst);
    }
    CHECK(a.size() == ref.size(), "%s: %zu values, reference has %zu", what, a.size(), ref.size());
    check_close_f32(what, a.data(), ref.data(), a.size(), atol_eff, rtol);
}

/* check 2: bf16 storage's output == the fp32 kernel's rounded once (round = 1), or == it
 * (round = 0, an fp32 output), bit for bit */
inline void same_bits(const char *what, const vecf &bf, const vecf &f32, int round) {
    vecf want = round ? round_bf16(f32) : f32;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < bf.size(); i++)
        if (memcmp(&bf[i], &want[i], 4) != 0 && !bad++) first = i;
    CHECK(bf.size() == want.size() && bad == 0,
          "%s: bf16 storage differs from the fp32 kernel%s in %zu of %zu (first [%zu]: %.9g vs %.9g)", what,
          round ? " rounded once" : "", bad, bf.size(), first, bad ? bf[first] : 0.0, bad ? want[first] : 0.0);
}

#endif
