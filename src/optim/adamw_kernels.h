/* adamw_kernels.h - internal to src/optim: what the per-ISA kernels share.
 *
 * The AdamW update and the 8-bit quantiser are defined here once as scalar inline
 * functions; the SIMD kernels (adamw_simd_body.h, compiled for AVX2 and AVX-512) perform
 * the same float operations in the same order (fma = one rounding, sqrt and divide
 * correctly rounded), so every path gives bit-identical results and a checkpoint resumes
 * exactly whichever CPU it lands on.
 */
#ifndef STRATA_OPTIM_ADAMW_KERNELS_H
#define STRATA_OPTIM_ADAMW_KERNELS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "strata/optim.h"

#define Q8_BLOCK ST_OPTIM_Q8_BLOCK
/* Sum of squares order, fixed for every ISA and thread count: a chunk of SUMSQ_CHUNK
 * elements is cut into SUMSQ_PARTS consecutive parts (so a core can stream them side by
 * side: one stream per core cannot reach the memory bandwidth); in each part lane l sums
 * elements i = l mod SUMSQ_LANES in order; lanes and parts are combined in a fixed tree. */
#define SUMSQ_LANES 32
#define SUMSQ_PARTS 4
#define SUMSQ_CHUNK ST_OPTIM_SUMSQ_CHUNK /* elements per partial; partials are summed in chunk order */

/* Length of each part of a chunk of n elements (the last one may be shorter or empty). */
static inline size_t sumsq_part_len(size_t n) {
    size_t q = (n + SUMSQ_PARTS - 1) / SUMSQ_PARTS;
    return (q + SUMSQ_LANES - 1) / SUMSQ_LANES * SUMSQ_LANES;
}
#define WORK_NONE (-1)     /* no working copy */

/* Per-step constants of the update, derived once (in double) from st_adamw_params, folded so
 * that the pass does the fewest operations per element:
 *   m' = b1 m + (1-b1) s g             = fma(c1, g, b1 * m)          c1 = (1-b1) s
 *   v' = b2 v + (1-b2) (s g)^2         = fma(c2 * g, g, b2 * v)      c2 = (1-b2) s^2
 *   bc1 d = bc1 (sqrt(v' / bc2) + eps) = fma(sqrt(v'), sd, epsd)     sd = bc1/sqrt(bc2), epsd = bc1 eps
 *   p' = p - lr (m'/bc1 / d + wd p)    = fma(nlr, fma(wd, p, m' / (bc1 d)), p)
 * (s = grad_scale, bc = 1 - beta^t). p is rounded once, at the end: splitting the decay off
 * into its own rounding rounds the same slowly changing p the same way every step, a bias
 * that drifts p by ~3e-6 over 1000 steps instead of ~8e-7. */
typedef struct adamw_consts {
    float b1, c1, b2, c2, sd, epsd, nlr;
} adamw_consts;

/* One map of the 8-bit format. Levels are integers monotone in value: signed map (first
 * moment) 0 = zero, 1..127 the codes, 128 = one; unsigned map (second moment) 1 = zero,
 * 2..255 the codes, 256 = one. Decade k holds levels [2^k, 2^(k+1)) with equally spaced codes
 * (zero and one are one-level decades -1/0 and 7/8), so a level decodes from its bit length
 * with two 16-entry register tables, and a magnitude encodes (q8_level, the definition) by
 * finding its decade and rounding its position inside it. The decade thresholds are the
 * rounding boundaries between neighbouring decades' edge codes, not the powers of ten, so
 * that rounding inside the decade is the nearest code overall. The SIMD kernels encode
 * through the inverse table below instead (one gather replaces the decade search and three
 * table permutes: 1.2x the AVX-512 pass, 1.6x the AVX2 pass, docs/BENCHMARKS.md) and decode
 * with the register tables (a gather from dec is no faster there).
 * Bytes: signed 127 + level * sign; unsigned level & 255 (256, one, is byte 0). Tables by
 * decade use index k & 15. */
/* The inverse table's cells: every a below 2^(Q8_INV_EMIN - 127) (about 6e-8) quantises to
 * the zero level in both maps (their first boundaries are near 2.7e-7 and 1.6e-7); a cell
 * is 2^16 consecutive float bit patterns, 1/128 of a binade, narrower than the closest two
 * boundaries (0.7% apart, at the top of the unsigned map); the last cell is 1.0 alone. */
#define Q8_INV_EMIN 103
#define Q8_INV_SHIFT 16
#define Q8_INV_CELLS (((127 - Q8_INV_EMIN) << (23 - Q8_INV_SHIFT)) + 1)

typedef struct q8_map {
    float t1[16], t2[16];   /* by k: code(2^k + j) = fma((float)j, t2[k], t1[k]) */
    float t1z[16], t2z[16]; /* the same by lzcnt(level) & 15 (AVX-512 decodes with lzcnt) */
    float ia[16], ib[16];   /* by k: level of a, 2^k + its position in decade k: fma(a, ia[k], ib[k]) */
    int32_t lmax[16];       /* by k: the last level of decade k */
    float thr[8];           /* decade boundaries, ascending: k = #{thr <= a} - koff */
    int koff;
    int32_t klo[32];        /* the same k from a's float exponent e in [96, 127] (index e & 31): */
    float kthr[32];         /*   k = klo + (a >= kthr) */
    int off;                /* level = byte + off (unsigned byte 0 is level 256) */
    float dec[256];         /* byte -> code */
    /* The quantiser's inverse table (what the SIMD kernels use): a in [0, 1] as float bits
     * b, clamped below to Q8_INV_EMIN << 23, falls in cell b >> Q8_INV_SHIFT; every cell
     * holds at most one rounding boundary of q8_level, so its entry E gives the result as
     * (E + b) >> 16 (mod 2^32): E = (out << 16) + 0x10000 - thr - (cell << 16), out the
     * result at the cell's start, thr the offset of the first bits past the boundary
     * (0x10000: none). The result is the level (unsigned map) or 127 + level (signed map,
     * a positive value's byte). Built from q8_level by binary search at init. */
    uint32_t inv[Q8_INV_CELLS]; /* by cell - (Q8_INV_EMIN << (23 - Q8_INV_SHIFT)) */
    int inv_ok;                 /* every cell has at most one boundary (a test checks) */
} q8_map;

/* The float map (ST_OPTIM_STATE_8BIT_FP): codes computed from their bits, no tables.
 * A magnitude a in [0, 1] (|x| / absmax) is shifted by delta, a' = a + delta, and a' in
 * [delta, 1] is rounded to a tiny float: its fp32 bits, less the base bits Q8F_BASE (the bits
 * of delta), rounded to a multiple of 2^sh; the code is that multiple (0 .. top). Decoding
 * is the reverse: fp32 bits (code << sh) + base, less delta. So code 0 is exactly zero,
 * the top code is 1 - delta, and between them the codes are a float format with 23 - sh
 * mantissa bits whose lowest binades run linearly into zero (delta acts as subnormals):
 *   first moment (signed): sign bit 7, magnitude code 0..127, sh 20 (3 mantissa bits, 16
 *     binades: delta = 1.125 * 2^-16 ~ 1.7e-5), relative rounding error <= 2^-4;
 *   second moment (unsigned): code 0..255, sh 20 (3 mantissa bits, 32 binades: delta =
 *     1.125 * 2^-32 ~ 2.6e-10), relative rounding error <= 2^-4.
 * Encode: code = (bits(min(fma(|x|, inv, delta), 1)) - base + 2^(sh-1)) >> sh (nearest,
 * ties up; the unsigned min also sends NaN to the top code); decode: code -> (bits - delta)
 * * absmax. q8f_code/q8f_quant_elem are the definitions; the SIMD kernels mirror them. */
#define Q8F_SH 20
#define Q8F_TOP_S 127u
#define Q8F_TOP_U 255u
#define Q8F_ONE 0x3f800000u
#define Q8F_BASE(top) (Q8F_ONE - ((top) << Q8F_SH))

static inline float q8f_bits_float(uint32_t b) {
    float f;
    memcpy(&f, &b, 4);
    return f;
}

/* delta of a map: the float whose bits are the base */
static inline float q8f_delta(int is_signed) { return q8f_bits_float(Q8F_BASE(is_signed ? Q8F_TOP_S : Q8F_TOP_U)); }

/* the code value (fraction of absmax) of a byte */
static inline float q8f_code(uint8_t byte, int is_signed) {
    uint32_t c = is_signed ? byte & 127u : byte, base = Q8F_BASE(is_signed ? Q8F_TOP_S : Q8F_TOP_U);
    float a = q8f_bits_float((c << Q8F_SH) + base) - q8f_bits_float(base);
    return is_signed && (byte & 128u) ? -a : a;
}

static inline uint8_t q8f_quant_elem(float x, float inv, int is_signed) {
    uint32_t base = Q8F_BASE(is_signed ? Q8F_TOP_S : Q8F_TOP_U), b;
    float a = fmaf(fabsf(x), inv, q8f_bits_float(base));
    memcpy(&b, &a, 4);
    if (b > Q8F_ONE) b = Q8F_ONE;
    uint32_t c = (b - base + (1u << (Q8F_SH - 1))) >> Q8F_SH;
    return (uint8_t)(is_signed && x < 0 ? c | 128u : c);
}

typedef struct q8_tables {
    q8_map s; /* signed, first moment */
    q8_map u; /* unsigned, second moment */
    float fs[256], fu[256]; /* the float map's codes (q8f_code), for the scalar paths */
} q8_tables;

void q8_tables_init(q8_tables *t);

/* A contiguous run of one segment: the unit of work a kernel call updates. */
typedef struct adamw_chunk {
    float *p;
    const void *g;
    void *w;
    float *m, *v;        /* fp32 states */
    uint8_t *qm, *qv;    /* 8-bit states: byte 0 starts a block */
    float *am, *av;      /* absmax of each block */
    size_t n;
    float wd; /* weight decay of the chunk's segment */
} adamw_chunk;

typedef struct adamw_kernels {
    void (*step_f32)(const adamw_chunk *c, const adamw_consts *k, int gdt, int wdt);
    void (*step_q8)(const adamw_chunk *c, const adamw_consts *k, const q8_tables *q, int gdt, int wdt);
    /* the same with the float map (ST_OPTIM_STATE_8BIT_FP) */
    void (*step_q8f)(const adamw_chunk *c, const adamw_consts *k, const q8_tables *q, int gdt, int wdt);
    /* one chunk: lanes[part * SUMSQ_LANES + i % SUMSQ_LANES] += g^2, part by part, in order */
    void (*sumsq)(const void *g, int dt, size_t n, double *lanes);
    /* the bandwidth ceiling: same arrays, same traffic, no arithmetic */
    void (*ceiling)(const adamw_chunk *c, int q8, int gdt, int wdt);
    /* quantise one block of n <= Q8_BLOCK values with this absmax's reciprocal */
    void (*quant)(const float *x, size_t n, float inv, const q8_map *q, int is_signed, uint8_t *out);
    void (*quantf)(const float *x, size_t n, float inv, int is_signed, uint8_t *out); /* the float map */
} adamw_kernels;

extern const adamw_kernels adamw_kernels_portable;
extern const adamw_kernels adamw_kernels_avx2;
extern const adamw_kernels adamw_kernels_avx512;
extern const adamw_kernels adamw_kernels_avx512bf16;

/* ---- scalar definitions (the portable kernel, and the SIMD kernels' tails) ---- */

static inline float adamw_load_grad(const void *g, int dt, size_t i) {
    if (dt == ST_BF16) return st_bf16_to_f32(((const uint16_t *)g)[i]);
    if (dt == ST_F16) return st_f16_to_f32(((const uint16_t *)g)[i]);
    return ((const float *)g)[i];
}

static inline void adamw_store_work(void *w, int dt, size_t i, float x) {
    if (dt == ST_BF16) ((uint16_t *)w)[i] = st_f32_to_bf16(x);
    else if (dt == ST_F16) ((uint16_t *)w)[i] = st_f32_to_f16(x);
    else if (dt == ST_F32) ((float *)w)[i] = x;
}

/* The update of one element; the SIMD kernels mirror it operation by operation. */
static inline void adamw_elem(float *p, float *m, float *v, float g, const adamw_consts *k, float wd) {
    float mm = fmaf(k->c1, g, k->b1 * *m);
    float vv = fmaf(k->c2 * g, g, k->b2 * *v);
    float d = fmaf(sqrtf(vv), k->sd, k->epsd);
    *p = fmaf(k->nlr, fmaf(wd, *p, mm / d), *p);
    *m = mm;
    *v = vv;
}

/* Nearest level of a magnitude a in [0, 1] (already divided by absmax, never NaN). */
static inline int q8_level(float a, const q8_map *q) {
    uint32_t bits;
    memcpy(&bits, &a, 4);
    int e = (int)(bits >> 23) < 96 ? 96 : (int)(bits >> 23);
    int k = q->klo[e & 31] + (a >= q->kthr[e & 31]);
    /* inside decade k the position is >= -0.36 (the lower boundary is nearer the first code
     * than -0.5) but can pass the last code by up to 1.5 before the next boundary: clamp above */
    return (int)fminf(nearbyintf(fmaf(a, q->ia[k & 15], q->ib[k & 15])), (float)q->lmax[k & 15]);
}

static inline uint8_t q8_quant_elem(float x, float inv, const q8_map *q, int is_signed) {
    float a = fminf(fabsf(x) * inv, 1.0f);
    int l = q8_level(a, q);
    if (is_signed && x < 0) l = -(l < 127 ? l : 127); /* the signed map has +1 but not -1 */
    return (uint8_t)(l - q->off);
}

#endif
