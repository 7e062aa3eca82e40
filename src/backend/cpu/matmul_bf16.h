/* matmul_bf16.h - the CPU backend's bf16 matrix products (internal to src/backend): the
 * CPU's bf16 matrix units as cpuid reports them, and oneDNN's matmul primitive over bf16
 * operands with fp32 accumulation and an fp32 result, one primitive per shape, cached.
 * Built only where oneDNN was found (STRATA_HAVE_DNNL); elsewhere cpu_bf16_create
 * refuses, naming the key 'matmul' and how to build it. */
#ifndef STRATA_BACKEND_CPU_MATMUL_BF16_H
#define STRATA_BACKEND_CPU_MATMUL_BF16_H

#include <stddef.h>
#include <stdint.h>

#include "strata/backend.h"

/* The bf16 matrix units of this CPU, best first, as cpuid and the OS's saved state
 * (XCR0) say: AMX-BF16 tiles, the AVX512-BF16 dot products, or none (oneDNN then
 * emulates bf16 with fp32 arithmetic). The environment STRATA_CPU_BF16=none makes a CPU
 * with units behave as one without them (and caps oneDNN at AVX-512 without bf16), so
 * that the emulated path can be tested on any machine. */
typedef enum cpu_bf16_units { CPU_BF16_NONE = 0, CPU_BF16_AVX512 = 1, CPU_BF16_AMX = 2 } cpu_bf16_units;
cpu_bf16_units cpu_bf16_detect(void);
const char *cpu_bf16_units_name(cpu_bf16_units u); /* "AMX-BF16", "AVX512-BF16", "none" */
/* 1 where this strata was built with oneDNN, else 0. */
int cpu_bf16_built(void);

typedef struct cpu_bf16 cpu_bf16; /* oneDNN's engine and stream, the primitive cache, scratch */

/* ST_ERR_UNSUPPORTED in a build without oneDNN (the message names the key 'matmul' and
 * the package and build to use), ST_ERR_NOMEM, or oneDNN's failure to make its engine. */
st_status cpu_bf16_create(cpu_bf16 **out, st_err *err);
void cpu_bf16_free(cpu_bf16 *b);

/* A bf16 copy (round to nearest even: st_convert's rounding) of src (n floats) in the
 * scratch buffer `slot` (0..CPU_BF16_SLOTS-1), valid until that slot is used again;
 * NULL where memory ran out. Call between cpu_bf16_lock and cpu_bf16_unlock: the
 * scratch and the primitives are one caller's at a time. */
#define CPU_BF16_SLOTS 6
uint16_t *cpu_bf16_operand(cpu_bf16 *b, int slot, const float *src, size_t n);
void cpu_bf16_lock(cpu_bf16 *b);
void cpu_bf16_unlock(cpu_bf16 *b);

/* C (M,N) row-major = op(A) op(B) (+ bias (N), may be NULL) (+ C when accumulate), the
 * products of bf16 operands summed in fp32. A is stored (M,K), or (K,M) when ta; B is
 * (K,N), or (N,K) when tb; all dense (leading dimension = stored columns). The primitive
 * for (M, N, K, ta, tb, bias, accumulate) is made on the first call and kept. */
st_status cpu_bf16_gemm(cpu_bf16 *b, int ta, int tb, int M, int N, int K, const uint16_t *A, const uint16_t *B,
                        const float *bias, int accumulate, float *C, st_err *err);
/* A batch of nb0 x nb1 products C[i][j] (M,N) (+)= op(A[i][j]) op(B[i][j]), bf16 operands
 * and fp32 results at any strides: matrix (i, j) of X starts at X + i sx[0] + j sx[1]; ld*
 * are the stored matrices' row strides (A stored (M,K), or (K,M) when ta; B (K,N), or (N,K)
 * when tb; C (M,N)). Attention's products over batch x heads, reading q, k and v in place
 * in the (B, T, 3C) activations. Cached per shape, strides and options as cpu_bf16_gemm. */
typedef struct cpu_bf16_batch {
    int nb0, nb1, M, N, K, ta, tb, accumulate;
    int64_t lda, ldb, ldc, sa[2], sb[2], sc[2];
} cpu_bf16_batch;
st_status cpu_bf16_gemm_batched(cpu_bf16 *b, const cpu_bf16_batch *g, const uint16_t *A, const uint16_t *B, float *C,
                                st_err *err);
/* Makes (or finds) the primitive of that batch without running it: ST_OK where it runs. */
st_status cpu_bf16_batched_ready(cpu_bf16 *b, const cpu_bf16_batch *g, st_err *err);
/* The scratch buffer `slot` grown to n bf16 values, not written (NULL: out of memory). */
uint16_t *cpu_bf16_scratch(cpu_bf16 *b, int slot, size_t n);
/* dst = src rounded to bf16 (st_f32_to_bf16 bit for bit) over the OpenMP threads, its time
 * counted as slot's conversion (the CPU backend: slot 1, the weights); takes the lock. */
void cpu_bf16_round_into(cpu_bf16 *b, int slot, uint16_t *dst, const float *src, size_t n);
/* Adds s seconds to slot's conversion time (a conversion made by the caller, under the lock). */
void cpu_bf16_add_convert_s(cpu_bf16 *b, int slot, double s);
/* dst = src rounded to bf16 (st_f32_to_bf16 bit for bit), on the calling thread. */
void cpu_bf16_round(uint16_t *dst, const float *src, size_t n);
/* Seconds spent since creation converting operands, by slot (the CPU backend's matmuls put
 * the weight in slot 1, activations and their gradients in 0 and 2), and in oneDNN's
 * matmuls (gemm_s); calls counts cpu_bf16_gemm. For the step benchmark's breakdown. */
typedef struct cpu_bf16_stats { double convert_s[CPU_BF16_SLOTS], gemm_s; unsigned long long calls; } cpu_bf16_stats;
void cpu_bf16_get_stats(cpu_bf16 *b, cpu_bf16_stats *out);
/* oneDNN's implementation of that shape's primitive ("brg:avx512_core_amx", ...), made if
 * needed; "" where it cannot be made. */
const char *cpu_bf16_impl(cpu_bf16 *b, int ta, int tb, int M, int N, int K, int bias, int accumulate);

/* ---- the CPU backend's matmul mode (backend_cpu.c), for st_backend_set_matmul */
/* Sets the CPU backend's matmul precision: fp32 (OpenBLAS sgemm, the default) or bf16
 * (oneDNN); tf32 refused. On a CPU without bf16 units bf16 runs emulated: the first such
 * call in a process measures the emulated rate against sgemm and logs it once. */
st_status cpu_backend_set_matmul(st_backend *be, st_matmul_mode mode, st_err *err);
st_matmul_mode cpu_backend_matmul(const st_backend *be);
/* The CPU backend's bf16 engine (NULL until matmul bf16 was set on it). */
cpu_bf16 *cpu_backend_bf16(const st_backend *be);
/* st_backend_bf16_weights_read, _map and _round (strata/backend.h) on the CPU backend. */
int cpu_backend_bf16_weights_read(const st_backend *be);
void cpu_backend_bf16_weights_map(st_backend *be, int region, const float *base, const uint16_t *copy, size_t n);
void cpu_backend_bf16_weights_round(st_backend *be, uint16_t *dst, const float *src, size_t n);

#endif
