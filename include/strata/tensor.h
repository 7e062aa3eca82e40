/* tensor.h - element types and conversions between them.
 *
 * bf16 and fp16 are stored as uint16_t bit patterns. Conversions to them round to
 * nearest even; NaN stays NaN. Sizes are in elements unless a name says bytes.
 *
 * Example:
 *
 *     float x[3] = {1.0f, 3.14159f, -65504.0f}, back[3];
 *     uint16_t h[3];                           // bf16 bit patterns
 *     st_convert(h, ST_BF16, x, ST_F32, 3);    // rounds to nearest even
 *     st_convert(back, ST_F32, h, ST_BF16, 3); // exact
 *     printf("%s (%zu bytes): %g -> %g\n", st_dtype_name(ST_BF16), st_dtype_size(ST_BF16), x[1], back[1]);
 *
 * End of example.
 */
#ifndef STRATA_TENSOR_H
#define STRATA_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum st_dtype {
    ST_F32 = 0,
    ST_BF16 = 1,
    ST_F16 = 2,
    ST_I32 = 3,
    ST_U8 = 4,
    ST_I64 = 5,
    ST_U16 = 6,
    ST_F64 = 7
} st_dtype;

size_t st_dtype_size(st_dtype t);
const char *st_dtype_name(st_dtype t);  /* safetensors spelling: F32, BF16, F16, I32, ... */
int st_dtype_from_name(const char *name, st_dtype *out); /* 0 on success */

static inline float st_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t st_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                          /* round to nearest even */
    return (uint16_t)(u >> 16);
}

float st_f16_to_f32(uint16_t h);
uint16_t st_f32_to_f16(float f);

/* Whole-array conversions (OpenMP-parallel, vectorised by the compiler). */
void st_convert(void *dst, st_dtype dst_t, const void *src, st_dtype src_t, size_t n);

#endif
