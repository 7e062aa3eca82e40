/* dtype.c - element sizes, names and conversions. */
#include "strata/tensor.h"

#include <math.h>
#include <string.h>

static const struct { const char *name; size_t size; } dtypes[] = {
    [ST_F32] = {"F32", 4}, [ST_BF16] = {"BF16", 2}, [ST_F16] = {"F16", 2}, [ST_I32] = {"I32", 4},
    [ST_U8] = {"U8", 1},   [ST_I64] = {"I64", 8},   [ST_U16] = {"U16", 2}, [ST_F64] = {"F64", 8},
};
#define N_DTYPES (sizeof dtypes / sizeof dtypes[0])

size_t st_dtype_size(st_dtype t) { return (unsigned)t < N_DTYPES ? dtypes[t].size : 0; }
const char *st_dtype_name(st_dtype t) { return (unsigned)t < N_DTYPES ? dtypes[t].name : "?"; }

int st_dtype_from_name(const char *name, st_dtype *out) {
    for (unsigned i = 0; i < N_DTYPES; i++)
        if (strcmp(name, dtypes[i].name) == 0) { *out = (st_dtype)i; return 0; }
    return -1;
}

float st_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) u = sign;
        else { /* subnormal: renormalise */
            int e = -1;
            do { e++; man <<= 1; } while (!(man & 0x400));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) u = sign | 0x7f800000u | (man << 13);
    else u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t st_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00);  /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* overflow to Inf (incl. rounding) */
    if (a < 0x38800000u) {                                   /* subnormal or zero in f16 */
        float af;
        memcpy(&af, &a, 4);
        /* scale so the f16 subnormal unit (2^-24) becomes 1, then round to nearest even */
        float scaled = af * 16777216.0f;
        uint32_t m = (uint32_t)nearbyintf(scaled);
        return (uint16_t)(sign | m);
    }
    uint32_t mant = a & 0x7fffff, exp = (a >> 23) - 127 + 15;
    uint32_t h = (exp << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

void st_convert(void *dst, st_dtype dt, const void *src, st_dtype stype, size_t n) {
    if (dt == stype) { memcpy(dst, src, n * st_dtype_size(dt)); return; }
    long nn = (long)n;
    if (stype == ST_F32) {
        const float *s = src;
        if (dt == ST_BF16) { uint16_t *d = dst;
#pragma omp parallel for schedule(static) if (n > 1 << 16)
            for (long i = 0; i < nn; i++) d[i] = st_f32_to_bf16(s[i]); return; }
        if (dt == ST_F16) { uint16_t *d = dst;
#pragma omp parallel for schedule(static) if (n > 1 << 16)
            for (long i = 0; i < nn; i++) d[i] = st_f32_to_f16(s[i]); return; }
        if (dt == ST_F64) { double *d = dst; for (long i = 0; i < nn; i++) d[i] = s[i]; return; }
    }
    if (dt == ST_F32) {
        float *d = dst;
        if (stype == ST_BF16) { const uint16_t *s = src;
#pragma omp parallel for schedule(static) if (n > 1 << 16)
            for (long i = 0; i < nn; i++) d[i] = st_bf16_to_f32(s[i]); return; }
        if (stype == ST_F16) { const uint16_t *s = src;
#pragma omp parallel for schedule(static) if (n > 1 << 16)
            for (long i = 0; i < nn; i++) d[i] = st_f16_to_f32(s[i]); return; }
        if (stype == ST_F64) { const double *s = src; for (long i = 0; i < nn; i++) d[i] = (float)s[i]; return; }
    }
    /* Other pairs of float types go through f32 element by element; integer types only copy. */
    int floaty = (dt == ST_BF16 || dt == ST_F16 || dt == ST_F64) && (stype == ST_BF16 || stype == ST_F16 || stype == ST_F64);
    for (size_t i = 0; floaty && i < n; i++) {
        float f;
        st_convert(&f, ST_F32, (const char *)src + i * st_dtype_size(stype), stype, 1);
        st_convert((char *)dst + i * st_dtype_size(dt), dt, &f, ST_F32, 1);
    }
}
