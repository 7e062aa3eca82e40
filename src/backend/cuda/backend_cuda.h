/* backend_cuda.h - the CUDA backend's C interface inside libstrata (built with
 * -DSTRATA_CUDA=ON; STRATA_HAVE_CUDA is defined then). Internal: what lies above
 * the backend reaches it by name through st_backend_device_create ("cuda", "cuda:N";
 * src/backend/device.c) and st_backend_status (include/strata/backend.h). */
#ifndef STRATA_BACKEND_CUDA_H
#define STRATA_BACKEND_CUDA_H

#include "strata/core.h"

/* the tests' g++ build of backend_cuda.cu (tests/cuda_emu, -DST_CUDA_EMU) has its own
 * names, so that it never meets the nvcc-built backend inside libstrata */
#ifdef ST_CUDA_EMU
#define st_backend_cuda_set_matmul st_backend_cuda_emu_set_matmul
#define st_backend_cuda_matmul_workspace st_backend_cuda_emu_matmul_workspace
#define st_backend_cuda_matmul_stats st_backend_cuda_emu_matmul_stats
#define st_backend_cuda_set_attention st_backend_cuda_emu_set_attention
#define st_backend_cuda_attention_stats st_backend_cuda_emu_attention_stats
#define st_backend_cuda_attention_built st_backend_cuda_emu_attention_built
#endif

#ifdef __cplusplus
extern "C" {
#endif
#include "strata/backend.h" /* st_matmul_mode */

/* The CUDA runtime and cuBLAS versions this library is linked against (1000 * major +
 * 10 * minor, as cudaRuntimeGetVersion reports), read without touching a device. */
st_status st_cuda_versions(int *runtime, int *cublas, st_err *err);

struct st_backend;
/* The CUDA backend on device `device` (backend_cuda.cu): one compute stream, and every
 * allocation carved from one cudaMalloc of arena_bytes, the hard device budget the
 * executor plans against. Implements today: memory and copies, synchronize, and in fp32
 * (forward and backward) matmul (cuBLASLt), encoder, embedding, layernorm, rmsnorm, gelu,
 * residual, swiglu, rope, the four attentions, and to_bf16; the classifier's entries are
 * NULL until their kernels exist (issue 15).
 * The matmuls' cuBLASLt workspace is carved from the arena here, once:
 * st_backend_cuda_matmul_workspace(arena_bytes) bytes (32 MiB, at most an eighth of the
 * arena), so the arena is all the device memory the backend's work uses and
 * arena_bytes minus that is what allocations get. (Callers today: the tests only; an
 * executor that sizes the arena from its device budget plans with budget minus that.)
 * ST_ERR_UNSUPPORTED where there is no such device, ST_ERR_NOMEM where the arena does
 * not fit in its free memory. */
st_status st_backend_cuda_create(struct st_backend **out, int device, size_t arena_bytes, st_err *err);
/* The bytes of an arena of arena_bytes that st_backend_cuda_create gives cuBLASLt as its
 * workspace: min(32 MiB, arena_bytes / 8 rounded down to 256 bytes). */
size_t st_backend_cuda_matmul_workspace(size_t arena_bytes);
/* The ops return nothing: the first CUDA error one meets is kept, and this returns it
 * (after synchronizing the stream); ST_OK when there was none. */
st_status st_backend_cuda_status(struct st_backend *be, st_err *err);
/* The precision of the fp32 matmuls (matmul_forward/_backward), for the backend's later
 * calls: ST_MATMUL_FP32 (the default: fp32 products and sums, CUBLAS_COMPUTE_32F),
 * ST_MATMUL_TF32 (CUBLAS_COMPUTE_32F_FAST_TF32: inputs rounded to 10-bit mantissas on the
 * tensor cores) or ST_MATMUL_BF16 (CUBLAS_COMPUTE_32F_FAST_16BF: fp32 in and out, bf16
 * products, fp32 sums). Names are read by st_backend_matmul_parse; a value outside the
 * enum is refused (ST_ERR_INVALID) naming it. */
st_status st_backend_cuda_set_matmul(struct st_backend *be, st_matmul_mode mode, st_err *err);
/* What the backend's matmuls ran since it was made: gemms per compute type actually used
 * (calls[ST_MATMUL_FP32], [_TF32], [_BF16]), gemms of a reduced mode computed in fp32
 * because cuBLASLt offered no algorithm for their shape (fallbacks: also logged once per
 * shape), and biases added as rows because their pointer was under the bias epilogue's
 * 16-byte alignment (bias_rows). */
typedef struct st_cuda_matmul_stats {
    uint64_t calls[3], fallbacks, bias_rows;
} st_cuda_matmul_stats;
void st_backend_cuda_matmul_stats(struct st_backend *be, st_cuda_matmul_stats *out);

/* Which attention the backend's eight attention ops run (issue 30):
 * ST_CUDA_ATTENTION_AUTO (the default): cuDNN's fused scaled-dot-product attention while
 *   the matmul mode is ST_MATMUL_BF16 (the run asked for bf16 arithmetic), the own fp32
 *   kernels (kernels_attn.cuh) otherwise, so that fp32 runs keep their fp32 attention;
 * ST_CUDA_ATTENTION_OWN: always the own kernels;
 * ST_CUDA_ATTENTION_CUDNN: cuDNN whatever the matmul mode (refused, ST_ERR_UNSUPPORTED,
 *   where this strata was built without cuDNN).
 * cuDNN computes in bf16 with fp32 scores, softmax and statistics (q, k, v, out, dout are
 * rounded to bf16; out and the gradients come back as fp32). Documents (the *_doc_* ops)
 * always run the own kernels. A cuDNN failure at run time (no libcudnn, a graph it
 * refuses, no engine, no scratch beside the arena, an execution error) is logged once and
 * that direction runs the own kernels from then on: the run goes on. The environment
 * variable STRATA_CUDA_ATTENTION (auto, own or cudnn) sets the mode st_backend_cuda_create
 * starts with; another value, or cudnn where it is not built, fails the create. */
typedef enum st_cuda_attention {
    ST_CUDA_ATTENTION_AUTO = 0,
    ST_CUDA_ATTENTION_OWN = 1,
    ST_CUDA_ATTENTION_CUDNN = 2
} st_cuda_attention;
st_status st_backend_cuda_set_attention(struct st_backend *be, st_cuda_attention mode, st_err *err);
/* What this library was built with: "cuDNN 9.19.0 fused attention (loaded at first use)"
 * or "own kernels (built without cuDNN)". */
const char *st_backend_cuda_attention_built(void);
/* Attention calls since the backend was made, [0] forward, [1] backward: by cuDNN, by the
 * own kernels; fallbacks: calls that asked for cuDNN and ran the own kernels (documents,
 * a failure); why: the last reason cuDNN was not used ("" when it always was). */
typedef struct st_cuda_attention_stats {
    uint64_t cudnn[2], own[2], fallbacks;
    char why[256];
} st_cuda_attention_stats;
void st_backend_cuda_attention_stats(struct st_backend *be, st_cuda_attention_stats *out);

#ifdef __cplusplus
}
#endif
#endif
