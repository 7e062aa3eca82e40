/* adamw_avx512bf16.c - the AVX-512 kernels again, with the bf16 working copy converted by
 * the AVX512-BF16 instruction instead of integer rounding: same bits, fewer operations. */
#define ADAMW_AVX512_BF16 1
#include "adamw_avx512.c"
