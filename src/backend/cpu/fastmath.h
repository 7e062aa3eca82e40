/* fastmath.h - vectorisable exp for the CPU kernels.
 *
 * libm's expf is a scalar call that stops the compiler from vectorising a loop; the
 * GELU, softmax and cross-entropy loops spend most of their time in it. This version
 * is branch-free C that gcc vectorises: Cody-Waite range reduction x = n ln2 + r,
 * |r| <= ln2/2, a degree-7 Taylor polynomial for e^r (truncation error < 6e-9
 * relative, below float's 6e-8), and 2^n built from the exponent bits.
 * Inputs below -87.3 give ~0 (clamped), above 88.0 give e^88 (finite), NaN gives NaN.
 */
#ifndef STRATA_FASTMATH_H
#define STRATA_FASTMATH_H

#include <stdint.h>
#include <string.h>

static inline float st_fast_expf(float x) {
    x = x < -87.3f ? -87.3f : (x > 88.0f ? 88.0f : x);
    /* round(x / ln2) with the 1.5*2^23 trick: exact for |t| < 2^22, no libm call */
    float t = x * 1.44269504088896341f;
    float n = (t + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693145751953125f; /* ln2 split in two for an exact product */
    r = r - n * 1.428606765330187e-06f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    /* a NaN x passes both clamps: converting it to int is undefined (x86 gives INT_MIN,
     * whose shift is undefined too), so its exponent is taken as 0; p is NaN, so is e^x */
    n = n == n ? n : 0.0f;
    int32_t e = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &e, 4);
    return p * scale;
}

#endif
