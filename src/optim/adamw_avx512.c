/* adamw_avx512.c - the optimizer kernels for AVX-512F+CD+BW (+F16C), 16 lanes.
 *
 * Compiled with a target pragma (the build has no -march) and chosen at run time by
 * st_optim_isa_best(); the kernel bodies are adamw_simd_body.h. adamw_avx512bf16.c compiles
 * this file again with ADAMW_AVX512_BF16 for CPUs with the bf16 conversion instruction.
 */
#ifdef ADAMW_AVX512_BF16
#pragma GCC target("avx512f,avx512cd,avx512bw,avx512bf16,avx512vl,avx2,fma,f16c,prfchw")
#define KERNELS_NAME adamw_kernels_avx512bf16
#else
#pragma GCC target("avx512f,avx512cd,avx512bw,avx2,fma,f16c,prfchw")
#define KERNELS_NAME adamw_kernels_avx512
#endif
#include <immintrin.h>
#include <stdint.h>

#include "optim/adamw_kernels.h"

#define W 16
#define SUMSQ_GROUP 4 /* parts streamed side by side (accumulators must fit the registers) */
#define WD 8
typedef __m512 V;
typedef __m512i VI;
typedef __mmask16 M;
typedef __m512i VB;
typedef __m512d VD;

#define HELPER static inline __attribute__((always_inline))
HELPER V v_set1(float x) { return _mm512_set1_ps(x); }
HELPER V v_load(const float *p) { return _mm512_loadu_ps(p); }
HELPER void v_store(float *p, V x) { _mm512_storeu_ps(p, x); }
HELPER V v_sub(V a, V b) { return _mm512_sub_ps(a, b); }
HELPER V v_mul(V a, V b) { return _mm512_mul_ps(a, b); }
HELPER V v_div(V a, V b) { return _mm512_div_ps(a, b); }
HELPER V v_fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
HELPER V v_sqrt(V a) { return _mm512_sqrt_ps(a); }
HELPER V v_abs(V a) { return _mm512_abs_ps(a); }
HELPER V v_min(V a, V b) { return _mm512_min_ps(a, b); }
HELPER V v_max(V a, V b) { return _mm512_max_ps(a, b); }
HELPER VI v_bits(V a) { return _mm512_castps_si512(a); }
HELPER V v_from_bits(VI a) { return _mm512_castsi512_ps(a); }
HELPER M v_cmp_lt(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
HELPER float v_reduce_max(V a) { return _mm512_reduce_max_ps(a); }
HELPER VI vi_set1(int x) { return _mm512_set1_epi32(x); }
HELPER VI vi_add(VI a, VI b) { return _mm512_add_epi32(a, b); }
HELPER VI vi_sub(VI a, VI b) { return _mm512_sub_epi32(a, b); }
HELPER VI vi_min(VI a, VI b) { return _mm512_min_epi32(a, b); }
HELPER VI vi_sllv(VI a, VI b) { return _mm512_sllv_epi32(a, b); }
HELPER VI vi_and(VI a, VI b) { return _mm512_and_si512(a, b); }
HELPER VI vi_or(VI a, VI b) { return _mm512_or_si512(a, b); }
HELPER VI vi_slli(VI a, const unsigned n) { return _mm512_slli_epi32(a, n); } /* n: a constant once inlined */
HELPER VI vi_srli(VI a, const unsigned n) { return _mm512_srli_epi32(a, n); }
HELPER VI vi_xor(VI a, VI b) { return _mm512_xor_si512(a, b); }
HELPER VI vi_blend(M m, VI a, VI b) { return _mm512_mask_blend_epi32(m, a, b); }
HELPER VI vi_load_u8(const uint8_t *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }
HELPER void vi_store_u8(uint8_t *p, VI x) { _mm_storeu_si128((__m128i *)p, _mm512_cvtepi32_epi8(x)); }

HELPER V v_load_grad(const void *g, int dt, size_t i) {
    if (dt == ST_BF16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)g + i));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    if (dt == ST_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)g + i)));
    return _mm512_loadu_ps((const float *)g + i);
}

/* st_f32_to_bf16 on 16 lanes: round to nearest even, NaN kept quiet. */
HELPER __m256i bf16_round_int(V x) {
    __m512i u = _mm512_castps_si512(x);
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                                     _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
    r = _mm512_srli_epi32(r, 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_blend_epi32(nan, r, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
}

HELPER void v_store_work(void *w, int dt, size_t i, V x) {
    if (dt == ST_BF16) {
#ifdef ADAMW_AVX512_BF16
        /* vcvtneps2bf16 rounds the same way but reads subnormal inputs as zero: those lanes
         * (never in practice) take the integer rounding */
        __m512i u = _mm512_castps_si512(x);
        __mmask16 sub = _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000)) &
                        _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x007fffff));
        __m256i r = __builtin_expect(sub != 0, 0) ? bf16_round_int(x) : (__m256i)_mm512_cvtneps_pbh(x);
        _mm256_storeu_si256((__m256i *)((uint16_t *)w + i), r);
#else
        _mm256_storeu_si256((__m256i *)((uint16_t *)w + i), bf16_round_int(x));
#endif
    } else if (dt == ST_F16) {
        /* NaN becomes the canonical quiet NaN with its sign, as st_f32_to_f16 does */
        __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
        x = _mm512_mask_mov_ps(x, nan, _mm512_castsi512_ps(_mm512_or_si512(
                                           _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u)),
                                           _mm512_set1_epi32(0x7fc00000))));
        _mm256_storeu_si256((__m256i *)((uint16_t *)w + i),
                            _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else if (dt == ST_F32) {
        _mm512_storeu_ps((float *)w + i, x);
    }
}

HELPER VD vd_load(const double *p) { return _mm512_loadu_pd(p); }
HELPER void vd_store(double *p, VD x) { _mm512_storeu_pd(p, x); }
HELPER VD vd_fma(VD a, VD b, VD c) { return _mm512_fmadd_pd(a, b, c); }
HELPER VD vd_load_grad(const void *g, int dt, size_t i) {
    if (dt == ST_BF16) {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)g + i));
        return _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
    }
    if (dt == ST_F16) return _mm512_cvtps_pd(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)g + i))));
    return _mm512_cvtps_pd(_mm256_loadu_ps((const float *)g + i));
}

/* W elements of esize bytes; a narrower load is repeated to fill the vector. */
HELPER VB vb_load(const void *p, size_t esize) {
    if (esize == 4) return _mm512_loadu_si512(p);
    if (esize == 2) {
        __m256i h = _mm256_loadu_si256((const __m256i *)p);
        return _mm512_inserti64x4(_mm512_castsi256_si512(h), h, 1);
    }
    return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)p));
}
HELPER void vb_store(void *p, size_t esize, VB x) {
    if (esize == 4) _mm512_storeu_si512(p, x);
    else if (esize == 2) _mm256_storeu_si256((__m256i *)p, _mm512_castsi512_si256(x));
    else _mm_storeu_si128((__m128i *)p, _mm512_castsi512_si128(x));
}
HELPER void vb_keep(VB x) { __asm__ volatile("" : : "v"(x)); }

HELPER VI v_cvt_rn(V a) { return _mm512_cvtps_epi32(a); } /* current rounding mode, as nearbyintf */
HELPER VI vi_abs(VI a) { return _mm512_abs_epi32(a); }

/* The inverse table's address as gathers index it: by absolute cell (bits >> 16). */
HELPER const int *q8_inv_base(const q8_map *q) {
    return (const int *)((uintptr_t)q->inv - ((uintptr_t)Q8_INV_EMIN << (23 - Q8_INV_SHIFT)) * 4);
}

/* A map's tables: the decode tables by lzcnt in registers, the inverse table for gathers. */
typedef struct simd_map {
    V t1z, t2z;
    const int *inv;
} simd_map;

HELPER simd_map simd_map_make(const q8_map *q) {
    simd_map s = {_mm512_loadu_ps(q->t1z), _mm512_loadu_ps(q->t2z), q8_inv_base(q)};
    return s;
}

HELPER VI vi_minu(VI a, VI b) { return _mm512_min_epu32(a, b); }
HELPER VI vi_maxu(VI a, VI b) { return _mm512_max_epu32(a, b); }
HELPER VI vi_max(VI a, VI b) { return _mm512_max_epi32(a, b); }
HELPER VI vi_srli16(VI a) { return _mm512_srli_epi32(a, 16); }
HELPER VI vi_gather(const int *base, VI idx) { return _mm512_i32gather_epi32(idx, base, 4); }


/* The float map's codes (0..255 in each lane) of 4 vectors: two saturating packs to bytes
 * in lane order, one dword permute back to element order, one store (vpmovdb is 2 uops a
 * vector on Intel: 8 for a group, against 4 here). */
#define Q8F_STORE_GROUP 1
HELPER void vi_store_group_u8f(uint8_t *out, const __m512i c[4]) {
    __m512i b = _mm512_packus_epi16(_mm512_packus_epi32(c[0], c[1]), _mm512_packus_epi32(c[2], c[3]));
    /* dword 4L + j (128-bit lane L) holds elements 4L..4L+3 of vector j: to dword 4j + L */
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_si512(out, _mm512_permutexvar_epi32(idx, b));
}

/* code of a level: tables by lzcnt & 15 (level 0: lzcnt 32, entry 0: zero, or one for the
 * unsigned map, whose byte 0 is level 256) */
HELPER V simd_code(VI level, const simd_map *q, int is_signed) {
    (void)is_signed;
    VI lz = _mm512_lzcnt_epi32(level);
    VI j = _mm512_sub_epi32(level, _mm512_srlv_epi32(_mm512_set1_epi32((int)0x80000000u), lz));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(j), _mm512_permutexvar_ps(lz, q->t2z), _mm512_permutexvar_ps(lz, q->t1z));
}

#include "optim/adamw_simd_body.h"
