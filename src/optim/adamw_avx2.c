/* adamw_avx2.c - the optimizer kernels for AVX2 + FMA + F16C, 8 lanes.
 *
 * Compiled with a target pragma (the build has no -march) and chosen at run time by
 * st_optim_isa_best(); the kernel bodies are adamw_simd_body.h. Masks are vectors of
 * all-ones lanes, as AVX2 compares produce them.
 */
#pragma GCC target("avx2,fma,f16c,prfchw")
#include <immintrin.h>
#include <stdint.h>

#include "optim/adamw_kernels.h"

#define W 8
#define SUMSQ_GROUP 1 /* parts streamed side by side (accumulators must fit the registers) */
#define WD 4
typedef __m256 V;
typedef __m256i VI;
typedef __m256 M;
typedef __m256i VB;
typedef __m256d VD;
#define KERNELS_NAME adamw_kernels_avx2

#define HELPER static inline __attribute__((always_inline))
HELPER V v_set1(float x) { return _mm256_set1_ps(x); }
HELPER V v_load(const float *p) { return _mm256_loadu_ps(p); }
HELPER void v_store(float *p, V x) { _mm256_storeu_ps(p, x); }
HELPER V v_sub(V a, V b) { return _mm256_sub_ps(a, b); }
HELPER V v_mul(V a, V b) { return _mm256_mul_ps(a, b); }
HELPER V v_div(V a, V b) { return _mm256_div_ps(a, b); }
HELPER V v_fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
HELPER V v_sqrt(V a) { return _mm256_sqrt_ps(a); }
HELPER V v_abs(V a) { return _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))); }
HELPER V v_min(V a, V b) { return _mm256_min_ps(a, b); }
HELPER V v_max(V a, V b) { return _mm256_max_ps(a, b); }
HELPER VI v_bits(V a) { return _mm256_castps_si256(a); }
HELPER V v_from_bits(VI a) { return _mm256_castsi256_ps(a); }
HELPER M v_cmp_lt(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
HELPER float v_reduce_max(V a) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}
HELPER VI vi_set1(int x) { return _mm256_set1_epi32(x); }
HELPER VI vi_add(VI a, VI b) { return _mm256_add_epi32(a, b); }
HELPER VI vi_sub(VI a, VI b) { return _mm256_sub_epi32(a, b); }
HELPER VI vi_min(VI a, VI b) { return _mm256_min_epi32(a, b); }
HELPER VI vi_sllv(VI a, VI b) { return _mm256_sllv_epi32(a, b); }
HELPER VI vi_and(VI a, VI b) { return _mm256_and_si256(a, b); }
HELPER VI vi_or(VI a, VI b) { return _mm256_or_si256(a, b); }
HELPER VI vi_slli(VI a, const unsigned n) { return _mm256_slli_epi32(a, n); } /* n: a constant once inlined */
HELPER VI vi_srli(VI a, const unsigned n) { return _mm256_srli_epi32(a, n); }
HELPER VI vi_xor(VI a, VI b) { return _mm256_xor_si256(a, b); }
HELPER VI vi_blend(M m, VI a, VI b) {
    return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b), m));
}
HELPER VI vi_load_u8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
HELPER void vi_store_u8(uint8_t *p, VI x) { /* low 8 bits of each lane, as vpmovdb: byte shuffle, lane join */
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    x = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(x, pick), _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1));
    _mm_storel_epi64((__m128i *)p, _mm256_castsi256_si128(x));
}

HELPER V v_load_grad(const void *g, int dt, size_t i) {
    if (dt == ST_BF16) {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)g + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    if (dt == ST_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)g + i)));
    return _mm256_loadu_ps((const float *)g + i);
}

/* st_f32_to_bf16 on 8 lanes: round to nearest even, NaN kept quiet. */
HELPER void v_store_work(void *w, int dt, size_t i, V x) {
    if (dt == ST_BF16) {
        __m256i u = _mm256_castps_si256(x);
        __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                                         _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))));
        r = _mm256_srli_epi32(r, 16);
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
        r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40)), nan);
        _mm_storeu_si128((__m128i *)((uint16_t *)w + i),
                         _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
    } else if (dt == ST_F16) {
        /* NaN becomes the canonical quiet NaN with its sign, as st_f32_to_f16 does */
        __m256 canon = _mm256_or_ps(_mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u))),
                                    _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)));
        x = _mm256_blendv_ps(x, canon, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        _mm_storeu_si128((__m128i *)((uint16_t *)w + i), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else if (dt == ST_F32) {
        _mm256_storeu_ps((float *)w + i, x);
    }
}

HELPER VD vd_load(const double *p) { return _mm256_loadu_pd(p); }
HELPER void vd_store(double *p, VD x) { _mm256_storeu_pd(p, x); }
HELPER VD vd_fma(VD a, VD b, VD c) { return _mm256_fmadd_pd(a, b, c); }
HELPER VD vd_load_grad(const void *g, int dt, size_t i) {
    if (dt == ST_BF16) {
        __m128i h = _mm_loadl_epi64((const __m128i *)((const uint16_t *)g + i));
        return _mm256_cvtps_pd(_mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(h), 16)));
    }
    if (dt == ST_F16) return _mm256_cvtps_pd(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)((const uint16_t *)g + i))));
    return _mm256_cvtps_pd(_mm_loadu_ps((const float *)g + i));
}

/* W elements of esize bytes; a narrower load is repeated to fill the vector. */
HELPER VB vb_load(const void *p, size_t esize) {
    if (esize == 4) return _mm256_loadu_si256((const __m256i *)p);
    if (esize == 2) return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    return _mm256_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)p));
}
HELPER void vb_store(void *p, size_t esize, VB x) {
    if (esize == 4) _mm256_storeu_si256((__m256i *)p, x);
    else if (esize == 2) _mm_storeu_si128((__m128i *)p, _mm256_castsi256_si128(x));
    else _mm_storel_epi64((__m128i *)p, _mm256_castsi256_si128(x));
}
HELPER void vb_keep(VB x) { __asm__ volatile("" : : "x"(x)); }

HELPER VI v_cvt_rn(V a) { return _mm256_cvtps_epi32(a); } /* current rounding mode, as nearbyintf */
HELPER VI vi_abs(VI a) { return _mm256_abs_epi32(a); }
/* The inverse table's address as gathers index it: by absolute cell (bits >> 16). */
HELPER const int *q8_inv_base(const q8_map *q) {
    return (const int *)((uintptr_t)q->inv - ((uintptr_t)Q8_INV_EMIN << (23 - Q8_INV_SHIFT)) * 4);
}

/* A map's tables: the decode tables' first 8 entries (decades 0..7; the two levels outside
 * are patched) in registers, the inverse table for gathers. */
typedef struct simd_map {
    V t1, t2;
    const int *inv;
} simd_map;

HELPER simd_map simd_map_make(const q8_map *q) {
    simd_map s = {_mm256_loadu_ps(q->t1), _mm256_loadu_ps(q->t2), q8_inv_base(q)};
    return s;
}

HELPER VI vi_minu(VI a, VI b) { return _mm256_min_epu32(a, b); }
HELPER VI vi_maxu(VI a, VI b) { return _mm256_max_epu32(a, b); }
HELPER VI vi_max(VI a, VI b) { return _mm256_max_epi32(a, b); }
HELPER VI vi_srli16(VI a) { return _mm256_srli_epi32(a, 16); }
HELPER VI vi_gather(const int *base, VI idx) { return _mm256_i32gather_epi32(base, idx, 4); }

/* code of a level: k from the float exponent (no vector lzcnt); level 0 (signed zero,
 * unsigned byte 0 = one) falls outside the 8 entries and is patched */
HELPER V simd_code(VI level, const simd_map *q, int is_signed) {
    VI k = _mm256_sub_epi32(_mm256_srli_epi32(_mm256_castps_si256(_mm256_cvtepi32_ps(level)), 23), _mm256_set1_epi32(127));
    VI j = _mm256_sub_epi32(level, _mm256_sllv_epi32(_mm256_set1_epi32(1), k)); /* k < 0: shift gives 0 */
    V val = _mm256_fmadd_ps(_mm256_cvtepi32_ps(j), _mm256_permutevar8x32_ps(q->t2, k), _mm256_permutevar8x32_ps(q->t1, k));
    if (is_signed)
        return _mm256_blendv_ps(val, _mm256_setzero_ps(), _mm256_castsi256_ps(_mm256_cmpeq_epi32(level, _mm256_setzero_si256())));
    return _mm256_blendv_ps(val, _mm256_set1_ps(1.0f), _mm256_castsi256_ps(_mm256_cmpeq_epi32(level, _mm256_setzero_si256())));
}

/* Groups of 4 vectors (32 elements): the inverse table's results (bits 16-23 of E + bits)
 * packed to bytes by one in-lane byte shuffle per vector (vector j's lane-L results to bytes
 * 4j..4j+3 of lane L), ORs and one dword permute; negatives of the signed map take
 * max(254 - byte, 0) as one saturating byte subtraction, blended by their masks packed the
 * same way. (Per vector this was a shift, a shuffle and a permute.) */
#define Q8_STORE_GROUP 1

/* The bf16 working copy of 4 vectors: without NaNs (one unordered compare per vector, one
 * test per group) the rounding alone, two vectors per saturating pack (the rounded values
 * fit 16 bits); with a NaN, v_store_work's vector path. */
#define WORK_STORE_GROUP 1
HELPER __m256i bf16_round_nonan(V x) {
    __m256i u = _mm256_castps_si256(x);
    return _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
                                              _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))),
                             16);
}

HELPER void v_store_work_group(void *w, int dt, size_t e, const V pp[4]) {
    if (dt == ST_BF16) {
        V nan = _mm256_or_ps(_mm256_or_ps(_mm256_cmp_ps(pp[0], pp[0], _CMP_UNORD_Q), _mm256_cmp_ps(pp[1], pp[1], _CMP_UNORD_Q)),
                             _mm256_or_ps(_mm256_cmp_ps(pp[2], pp[2], _CMP_UNORD_Q), _mm256_cmp_ps(pp[3], pp[3], _CMP_UNORD_Q)));
        if (__builtin_expect(_mm256_testz_ps(nan, nan), 1)) {
            for (int j = 0; j < 4; j += 2) {
                __m256i r = _mm256_packus_epi32(bf16_round_nonan(pp[j]), bf16_round_nonan(pp[j + 1]));
                _mm256_storeu_si256((__m256i *)((uint16_t *)w + e + (size_t)j * 8), _mm256_permute4x64_epi64(r, 0xd8));
            }
            return;
        }
    }
    for (int j = 0; j < 4; j++) v_store_work(w, dt, e + (size_t)j * 8, pp[j]);
}
/* The float map's codes (0..255 in each lane) of 4 vectors: two saturating packs to bytes
 * in lane order, one dword permute back to element order. */
#define Q8F_STORE_GROUP 1
HELPER void vi_store_group_u8f(uint8_t *out, const __m256i c[4]) {
    __m256i b = _mm256_packus_epi16(_mm256_packus_epi32(c[0], c[1]), _mm256_packus_epi32(c[2], c[3]));
    _mm256_storeu_si256((__m256i *)out, _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

HELPER __m256i pack_group(const __m256i r[4]) {
    __m256i acc = _mm256_setzero_si256();
    for (int j = 0; j < 4; j++) {
        char m[16];
        for (int b = 0; b < 16; b++) m[b] = (char)0x80;
        for (int d = 0; d < 4; d++) m[4 * j + d] = (char)(4 * d + 2);
        __m256i pick = _mm256_setr_epi8(m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7], m[8], m[9], m[10], m[11], m[12],
                                        m[13], m[14], m[15], m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7], m[8], m[9],
                                        m[10], m[11], m[12], m[13], m[14], m[15]);
        acc = _mm256_or_si256(acc, _mm256_shuffle_epi8(r[j], pick));
    }
    /* dword 4L + j of the lanes holds elements 8j + 4L .. + 3: to dword 2j + L */
    return _mm256_permutevar8x32_epi32(acc, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

HELPER void vi_store_group_u8(uint8_t *out, const VI raw[4], const M neg[4], int is_signed) {
    __m256i b = pack_group(raw);
    if (is_signed) {
        __m256i n[4];
        for (int j = 0; j < 4; j++) n[j] = _mm256_castps_si256(neg[j]);
        b = _mm256_blendv_epi8(b, _mm256_subs_epu8(_mm256_set1_epi8((char)254), b), pack_group(n));
    }
    _mm256_storeu_si256((__m256i *)out, b);
}

#include "optim/adamw_simd_body.h"
