/* optim_q8.c - the 8-bit blockwise state format: the dynamic quantisation maps and the
 * public per-block quantise/dequantise the tests use to check the format's error bound.
 *
 * The value set is bitsandbytes' dynamic map with 7 exponent "decades" (Dettmers, "8-bit
 * approximations for parallelism in deep learning"): decade i in 0..6 holds codes
 * 10^(i-6) * (0.1 + 0.9 (j + 0.5) / n_i), the midpoints of n_i equal steps of [0.1, 1];
 * n_i = 2^i for the signed map (mirrored for negatives), 2^(i+1) for the unsigned map;
 * plus 0 and 1. We number the levels so that decade k holds levels [2^k, 2^(k+1)), which
 * makes a level an integer monotone in value whose decade is its bit length (see
 * adamw_kernels.h for how the kernels decode with register tables and encode through the
 * inverse table built here).
 */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "optim/adamw_kernels.h"

_Static_assert(Q8_INV_SHIFT == 16, "the inverse table's entries give the result as (E + bits) >> 16");

/* Decade k's table entries: signed codes in k = 0..6 (scale 10^(k-6)), unsigned in
 * k = 1..7 (scale 10^(k-7)); both code(2^k + j) = P (0.1 + 0.9 (j + 0.5) / 2^k), computed as
 * fma(j, t2, t1) with both terms positive, within ~1.5e-7 relative of the exact value. The
 * zero and one levels are table entries too (t2 = 0). */
static void decade_entries(int is_signed, int k, float *t1, float *t2) {
    int kmin = is_signed ? 0 : 1, kmax = is_signed ? 6 : 7;
    *t1 = *t2 = 0.0f;
    if (k == kmax + 1) *t1 = 1.0f;
    if (k < kmin || k > kmax) return;
    double p = pow(10.0, k - (is_signed ? 6 : 7)), n = (double)(1 << k);
    *t2 = (float)(p * 0.9 / n);
    *t1 = (float)(p * 0.1 + p * 0.45 / n);
}

static float level_code(int is_signed, int level) {
    int k = level ? 31 - __builtin_clz((unsigned)level) : -1;
    float t1, t2;
    decade_entries(is_signed, k, &t1, &t2);
    return fmaf((float)(level - (level ? 1 << k : 0)), t2, t1);
}

/* q8_level of the float with these bits, as the inverse table's result: the level, or
 * 127 + level for the signed map. */
static int inv_out(const q8_map *q, int is_signed, uint32_t bits) {
    float a;
    memcpy(&a, &bits, 4);
    return q8_level(a, q) + (is_signed ? 127 : 0);
}

/* The inverse table (adamw_kernels.h) from the scalar quantiser itself: each cell's result
 * at its start and end, and where they differ, the first bits past the boundary by binary
 * search (q8_level is monotone in a: tests/test_optim_q8_simd.c compares every float). */
static void inv_init(q8_map *q, int is_signed) {
    const uint32_t first = (uint32_t)Q8_INV_EMIN << (23 - Q8_INV_SHIFT), one = 0x3f800000u;
    int zero = is_signed ? 127 : 1;
    /* everything the clamp folds into the first cell's start must give the zero level */
    q->inv_ok = inv_out(q, is_signed, 0) == zero && inv_out(q, is_signed, first << Q8_INV_SHIFT) == zero;
    for (uint32_t c = 0; c < Q8_INV_CELLS; c++) {
        uint32_t cell = first + c, lo = cell << Q8_INV_SHIFT, hi = lo + ((1u << Q8_INV_SHIFT) - 1);
        if (hi > one) hi = one;
        int out = inv_out(q, is_signed, lo), top = inv_out(q, is_signed, hi);
        uint32_t thr = 1u << Q8_INV_SHIFT;
        if (top == out + 1) {
            uint32_t a = lo, b = hi; /* out at a, top at b */
            while (b - a > 1) {
                uint32_t mid = a + (b - a) / 2;
                if (inv_out(q, is_signed, mid) == out) a = mid;
                else b = mid;
            }
            thr = b - lo;
        } else if (top != out) {
            q->inv_ok = 0; /* two boundaries in one cell: the kernels would round wrongly */
        }
        q->inv[c] = ((uint32_t)out << 16) + (1u << Q8_INV_SHIFT) - thr - (cell << 16);
    }
}

static void map_init(q8_map *q, int is_signed) {
    memset(q, 0, sizeof *q);
    int kmin = is_signed ? 0 : 1, kmax = is_signed ? 6 : 7;
    for (int k = -1; k <= kmax + 1; k++) {
        decade_entries(is_signed, k, &q->t1[k & 15], &q->t2[k & 15]);
        int lz = k < 0 || (!is_signed && k == kmax + 1) ? 32 : 31 - k; /* unsigned one is byte 0 */
        q->t1z[lz & 15] = q->t1[k & 15];
        q->t2z[lz & 15] = q->t2[k & 15];
    }
    for (int k = -1; k <= kmax + 1; k++) { /* zero and one decades: level = ib = 2^k (or 0) */
        double p2 = k < 0 ? 0.0 : (double)(1 << k);
        int code = k >= kmin && k <= kmax;
        q->ia[k & 15] = code ? (float)(1.0 / (double)q->t2[k]) : 0.0f;
        q->ib[k & 15] = (float)(p2 - (code ? (double)q->t1[k] / (double)q->t2[k] : 0.0));
        q->lmax[k & 15] = code ? (2 << k) - 1 : (int)p2;
    }
    /* decade boundaries: midpoints between the zero level and the first code, between each
     * decade's last code and the next decade's first, and between the last code and one */
    int t = 0;
    for (int k = kmin; k <= kmax + 1; k++)
        q->thr[t++] = (float)(((double)level_code(is_signed, (1 << k) - 1) + (double)level_code(is_signed, 1 << k)) / 2);
    q->koff = is_signed ? 1 : 0;
    for (int e = 96; e < 128; e++) {
        uint32_t bits = (uint32_t)e << 23;
        float lower;
        memcpy(&lower, &bits, 4);
        int c0 = 0;
        float inside = INFINITY;
        for (int i = 0; i < 8; i++) {
            if (q->thr[i] <= lower) c0++;
            else if (q->thr[i] < 2 * lower) inside = q->thr[i]; /* at most one: they are >2x apart */
        }
        q->klo[e & 31] = c0 - q->koff;
        q->kthr[e & 31] = inside;
    }
    q->off = is_signed ? -127 : 0;
    for (int byte = 0; byte < 256; byte++) {
        int level = is_signed || byte ? byte + q->off : 256;
        float c = level_code(is_signed, level < 0 ? -level : level);
        q->dec[byte] = level < 0 ? -c : c;
    }
    inv_init(q, is_signed);
}

/* The maps are constants: built once per process (the inverse tables' binary searches take
 * ~0.25 ms), copied into every optimizer (the state store makes one per subgroup). */
static q8_tables tables_once;
static pthread_once_t tables_once_flag = PTHREAD_ONCE_INIT;

static void tables_build(void) {
    map_init(&tables_once.s, 1);
    map_init(&tables_once.u, 0);
    for (int b = 0; b < 256; b++) {
        tables_once.fs[b] = q8f_code((uint8_t)b, 1);
        tables_once.fu[b] = q8f_code((uint8_t)b, 0);
    }
}

void q8_tables_init(q8_tables *t) {
    pthread_once(&tables_once_flag, tables_build);
    memcpy(t, &tables_once, sizeof *t);
}

void st_optim_q8_map(int is_signed, float code[256]) {
    pthread_once(&tables_once_flag, tables_build);
    memcpy(code, is_signed ? tables_once.s.dec : tables_once.u.dec, sizeof tables_once.s.dec);
}

/* Nearest rounding errs by at most half the gap between neighbouring codes; negatives
 * near -1 round to the largest negative code (the map has +1 only), a whole gap. */
double st_optim_q8_max_error(int is_signed) {
    int zero_level = is_signed ? 0 : 1, top_level = is_signed ? 128 : 256;
    double worst = 0;
    for (int b = zero_level; b < top_level; b++) {
        double gap = (double)level_code(is_signed, b + 1) - (double)level_code(is_signed, b);
        if (gap / 2 > worst) worst = gap / 2;
    }
    if (is_signed) {
        double below_one = 1.0 - (double)level_code(is_signed, 127);
        if (below_one > worst) worst = below_one;
    }
    return worst;
}

static const adamw_kernels *best_kernels(void) {
    switch (st_optim_isa_best()) {
    case ST_OPTIM_ISA_AVX512_BF16: return &adamw_kernels_avx512bf16;
    case ST_OPTIM_ISA_AVX512: return &adamw_kernels_avx512;
    case ST_OPTIM_ISA_AVX2: return &adamw_kernels_avx2;
    default: return &adamw_kernels_portable;
    }
}

float st_optim_q8_quantize_block(const float *x, size_t n, int is_signed, uint8_t *q) {
    q8_tables t;
    q8_tables_init(&t);
    float amax = 0;
    for (size_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    float inv = amax > 0 ? 1.0f / amax : 0.0f;
    const adamw_kernels *k = t.s.inv_ok && t.u.inv_ok ? best_kernels() : &adamw_kernels_portable;
    k->quant(x, n, inv, is_signed ? &t.s : &t.u, is_signed, q);
    return amax;
}

void st_optim_q8_dequantize_block(const uint8_t *q, size_t n, float absmax, int is_signed, float *x) {
    float code[256];
    st_optim_q8_map(is_signed, code);
    for (size_t i = 0; i < n; i++) x[i] = code[q[i]] * absmax;
}

void st_optim_q8_codes(st_optim_state_format fmt, int is_signed, float code[256]) {
    if (fmt != ST_OPTIM_STATE_8BIT_FP) {
        st_optim_q8_map(is_signed, code);
        return;
    }
    for (int b = 0; b < 256; b++) code[b] = q8f_code((uint8_t)b, is_signed);
}

float st_optim_q8_quantize(st_optim_state_format fmt, const float *x, size_t n, int is_signed, uint8_t *q) {
    if (fmt != ST_OPTIM_STATE_8BIT_FP) return st_optim_q8_quantize_block(x, n, is_signed, q);
    float amax = 0;
    for (size_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    best_kernels()->quantf(x, n, amax > 0 ? 1.0f / amax : 0.0f, is_signed, q);
    return amax;
}

void st_optim_q8_dequantize(st_optim_state_format fmt, const uint8_t *q, size_t n, float absmax, int is_signed,
                            float *x) {
    float code[256];
    st_optim_q8_codes(fmt, is_signed, code);
    for (size_t i = 0; i < n; i++) x[i] = code[q[i]] * absmax;
}
