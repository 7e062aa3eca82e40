/* convert_bf16.c - the CPU backend's to_bf16 and from_bf16 (backend.h): the bf16 gradient
 * drain and the block executor's bf16 activation sets (st_stream_plan.act_dtype), on
 * host-addressable memory. AVX-512 where the CPU has it (chosen at run time), else plain
 * loops; both bit for bit st_f32_to_bf16 / st_bf16_to_f32 (nearest even, a NaN kept quiet
 * with 0x40 set in its top half; denormals rounded as any number). Large arrays are cut
 * into chunks of 16 Ki elements over the OpenMP threads: an activation set of gpt2-124m at
 * B4 T256 is 11.8 M elements, converted twice a block a step. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CONV_HAVE_AVX512 1
#endif

#include "backend_cpu_chunk.h"
#include "strata/tensor.h"

#define CONV_CHUNK 16384

#ifdef CONV_HAVE_AVX512
__attribute__((target("avx512f"))) static void to_bf16_avx512(uint16_t *dst, const float *src, size_t n) {
    const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1), abs = _mm512_set1_epi32(0x7fffffff),
                  inf = _mm512_set1_epi32(0x7f800000), quiet = _mm512_set1_epi32(0x400000);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i u = _mm512_loadu_si512((const void *)(src + i));
        __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs), inf);
        __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
        r = _mm512_mask_or_epi32(r, nan, u, quiet);
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
    }
    for (; i < n; i++) dst[i] = st_f32_to_bf16(src[i]);
}

__attribute__((target("avx512f"))) static void from_bf16_avx512(float *dst, const uint16_t *src, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(src + i));
        _mm512_storeu_si512((void *)(dst + i), _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    for (; i < n; i++) dst[i] = st_bf16_to_f32(src[i]);
}
#endif

static void to_bf16_plain(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = st_f32_to_bf16(src[i]);
}

static void from_bf16_plain(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        memcpy(dst + i, &u, 4);
    }
}

/* 1 where the CPU has AVX-512F and STRATA_CPU_CONVERT does not say "plain" (the tests run
 * both paths on one machine). */
static int use_avx512(void) {
#ifdef CONV_HAVE_AVX512
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("STRATA_CPU_CONVERT");
        on = __builtin_cpu_supports("avx512f") && !(e && !strcmp(e, "plain"));
    }
    return on;
#else
    return 0;
#endif
}

void st_cpu_to_bf16_serial(uint16_t *dst, const float *src, size_t n) {
#ifdef CONV_HAVE_AVX512
    if (use_avx512()) {
        to_bf16_avx512(dst, src, n);
        return;
    }
#endif
    to_bf16_plain(dst, src, n);
}

void st_cpu_to_bf16(st_backend *be, uint16_t *dst, const float *src, size_t n) {
    (void)be;
    void (*f)(uint16_t *, const float *, size_t) = to_bf16_plain;
#ifdef CONV_HAVE_AVX512
    if (use_avx512()) f = to_bf16_avx512;
#endif
    long nc = (long)((n + CONV_CHUNK - 1) / CONV_CHUNK);
#pragma omp parallel for schedule(static) if (nc > 4)
    for (long c = 0; c < nc; c++) {
        size_t i0 = (size_t)c * CONV_CHUNK, m = n - i0 < CONV_CHUNK ? n - i0 : CONV_CHUNK;
        f(dst + i0, src + i0, m);
    }
}

void st_cpu_from_bf16(st_backend *be, float *dst, const uint16_t *src, size_t n) {
    (void)be;
    void (*f)(float *, const uint16_t *, size_t) = from_bf16_plain;
#ifdef CONV_HAVE_AVX512
    if (use_avx512()) f = from_bf16_avx512;
#endif
    long nc = (long)((n + CONV_CHUNK - 1) / CONV_CHUNK);
#pragma omp parallel for schedule(static) if (nc > 4)
    for (long c = 0; c < nc; c++) {
        size_t i0 = (size_t)c * CONV_CHUNK, m = n - i0 < CONV_CHUNK ? n - i0 : CONV_CHUNK;
        f(dst + i0, src + i0, m);
    }
}
