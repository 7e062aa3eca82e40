/* backend_cpu_chunk.h - the chunked classifier's row statistics and the bf16 drain on
 * host-addressable memory (the CPU and reference backends share them). */
#ifndef STRATA_BACKEND_CPU_CHUNK_H
#define STRATA_BACKEND_CPU_CHUNK_H

#include "strata/backend.h"

void st_host_softmax_chunk_init(st_backend *be, float *rmax, double *rsum, float *tlogit, int N);
void st_host_softmax_chunk_stats(st_backend *be, const float *logits, const int32_t *targets, int N, int nr, int r0,
                                 float *rmax, double *rsum, float *tlogit);
void st_host_softmax_chunk_grad(st_backend *be, float *logits, const int32_t *targets, int N, int nr, int r0,
                                const float *rmax, const double *rsum, float dloss);
void st_host_to_bf16(st_backend *be, uint16_t *dst, const float *src, size_t n);
/* convert_bf16.c: the CPU backend's conversions, AVX-512 where present, over the OpenMP
 * threads; the same bits as st_f32_to_bf16 and st_bf16_to_f32. */
void st_cpu_to_bf16(st_backend *be, uint16_t *dst, const float *src, size_t n);
/* The same rounding on the calling thread alone (inside another parallel region). */
void st_cpu_to_bf16_serial(uint16_t *dst, const float *src, size_t n);
void st_cpu_from_bf16(st_backend *be, float *dst, const uint16_t *src, size_t n);

#endif
