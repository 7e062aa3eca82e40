/* backend_cuda.cu - the CUDA backend behind st_backend_ops, as far as its kernels go today
 * (issue 15): memory from one device arena (one cudaMalloc of the device budget, carved
 * by cuda_arena.h), copies, matmul through cuBLASLt (cuda_matmul.cuh: row-major as the
 * CPU backend's cblas calls, fp32, tf32 or bf16 products), and the fp32 embedding, layernorm, rmsnorm,
 * gelu, residual, swiglu, rope, attention, classifier (cross-entropy and the chunked
 * softmax) and to_bf16 of kernels_*.cuh, all on one compute stream in order: every
 * entry of st_backend_ops.
 *
 * The ops return nothing, so a failed launch, copy or cuBLAS call is kept (the first one,
 * with the op's name) and st_backend_cuda_status reports it. copy_to_device/_host are
 * synchronous, as the CPU backend's: the host buffer may be reused when copy_to_device
 * returns, and holds the data when copy_to_host returns. copy_async is not: it queues on
 * an h2d or a d2h copy stream, so copies overlap compute, and the host waits on its
 * ticket (the ordering rule is at the head of the asynchronous copies' section), with
 * host_alloc's page-locked memory for the host side. A freed block may be handed out
 * again at once: every op is queued on the one compute stream, so work that used the
 * block runs before work that reuses it (copies in flight are waited for first).
 * cuBLASLt's workspace is a block of the arena, carved at creation.
 *
 * Also compiled by g++ against the tests' emulation of the CUDA runtime, cuBLAS (as
 * OpenBLAS) and execution model (tests/cuda_emu: cuda_runtime.h, cublas_v2.h,
 * cuda_emu.h), so that test_cuda_backend_emu runs this file's glue without a GPU. */
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <mutex>
#include <new>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "strata/backend.h"
}
#include "backend/cuda/backend_cuda.h"
#include "backend/cuda/cuda_arena.h"
#include "backend/cuda/kernels_attn.cuh"
#include "backend/cuda/kernels_eltwise.cuh"
#include "backend/cuda/kernels_embed.cuh"
#include "backend/cuda/kernels_norm.cuh"
#include "backend/cuda/kernels_poetx.cuh"
#include "backend/cuda/kernels_rope.cuh"
#include "backend/cuda/kernels_xent.cuh"
/* cuDNN's fused attention (cudnn_attn.cu) in the nvcc build only: the emulated tests' g++
 * build of this file has no device for it and runs the own kernels */
#ifndef ST_CUDA_EMU
#define CU_SDPA 1
#include "backend/cuda/cudnn_attn.h"
#ifdef STRATA_HAVE_CUDNN
#include <cudnn_version.h>
#endif
#else
#define CU_SDPA 0
#endif

/* events per direction: a ring slot is recorded again only once the ticket that used it
 * is known complete (copy_async waits for it in the rare case it is not) */
#define CU_COPY_RING 256
/* timing events (timer_mark): a mark's event is recorded again 4096 marks later */
#define CU_TIMER_RING 4096
/* device memory left beside the arena (st_backend_cuda_create) */
#define CU_DEVICE_HEADROOM ((size_t)512 << 20)

struct cuda_ctx {
    int device = 0;
    cudaStream_t stream = nullptr;
    char *base = nullptr; /* the arena's one cudaMalloc */
    CuArena arena;
    struct CuLtMatmul *mm = nullptr; /* cuBLASLt: handle, workspace in the arena, algorithms (cuda_matmul.cuh) */
    int matmul_mode = ST_MATMUL_FP32; /* index into cu_lt_compute: st_backend_cuda_set_matmul */
    /* the first error, kept by note() from any thread (the step's, the optimizer's waits,
     * the trace's observer): under err_mu */
    std::mutex err_mu;
    cudaError_t first = cudaSuccess; /* the first error an op met */
    cublasStatus_t first_blas = CUBLAS_STATUS_SUCCESS; /* or the first cuBLAS error, if that came first */
    const char *first_op = "";
    const char *first_after = ""; /* an asynchronous fault: the last op queued before it surfaced */
    std::atomic<const char *> last_op{"(none)"}; /* the last op queued on the compute stream */
    /* asynchronous copies (copy_async): a stream per direction ([0] h2d, [1] d2h), each
     * copy's completion event in a fixed ring per direction; tickets count per direction */
    cudaStream_t copy_stream[2] = {nullptr, nullptr};
    cudaEvent_t compute_mark = nullptr; /* recorded on `stream` before each copy, waited by its copy stream */
    cudaEvent_t copy_ev[2][CU_COPY_RING] = {};
    uint64_t copy_issued[2] = {0, 0}, copy_done[2] = {0, 0}; /* last ticket queued; known complete */
    std::mutex copy_mu; /* the copy state above: the copy engine's waits come from any thread */
    /* device timing: mark i is event timer_ev[i % CU_TIMER_RING] on the compute stream */
    cudaEvent_t timer_ev[CU_TIMER_RING] = {};
    uint64_t timer_issued = 0;
    /* attention: st_backend_cuda_set_attention; cuDNN opened at its first use (sdpa_tried),
     * a direction ([0] forward, [1] backward) turned off for good at its first failure */
    int attention = ST_CUDA_ATTENTION_AUTO;
#if CU_SDPA
    struct CuSdpa *sdpa = nullptr;
    bool sdpa_tried = false, sdpa_off[2] = {false, false}, said_docs = false;
#endif
    st_cuda_attention_stats astats = {};
    bool said_own = false; /* the own kernels' line, once */
};

static cuda_ctx *ctx_of(st_backend *be) { return (cuda_ctx *)be->ctx; }

static bool failed(const cuda_ctx *c) { return c->first != cudaSuccess || c->first_blas != CUBLAS_STATUS_SUCCESS; }
/* A fault on the device (an illegal or misaligned address, a trap, a failed launch): the
 * context is lost, the error is sticky, and it surfaces at whatever call comes next,
 * often a copy's wait on another thread, not at the kernel that raised it. */
static bool async_fault(cudaError_t e) {
    switch ((int)e) {
    case 700: case 710: case 714: case 715: case 716: case 717: case 718: case 719: return true;
    }
    return false;
}
static void note(cuda_ctx *c, cudaError_t e, const char *op) {
    if (e == cudaSuccess) return;
    std::lock_guard<std::mutex> g(c->err_mu);
    if (!failed(c)) c->first = e, c->first_op = op, c->first_after = c->last_op.load();
}
static void note_blas(cuda_ctx *c, cublasStatus_t e, const char *op) {
    if (e == CUBLAS_STATUS_SUCCESS) return;
    std::lock_guard<std::mutex> g(c->err_mu);
    if (!failed(c)) c->first_blas = e, c->first_op = op, c->first_after = c->last_op.load();
}
/* after queuing op on the compute stream: its launch error, and op as the last one queued */
#define LAUNCHED(be, op) (ctx_of(be)->last_op.store(op), note(ctx_of(be), cudaGetLastError(), op))

/* ---------------------------------------------------------------- memory */

static void *be_alloc(st_backend *be, size_t bytes) {
    cuda_ctx *c = ctx_of(be);
    size_t off;
    if (!c->arena.alloc(bytes, &off)) return nullptr; /* over the device budget */
    char *p = c->base + off;
    cudaError_t e = cudaMemsetAsync(p, 0, bytes, c->stream); /* alloc's contract: zeroed */
    if (e != cudaSuccess) {
        note(c, e, "alloc");
        c->arena.release(off);
        return nullptr;
    }
    return p;
}
static void copies_drain(cuda_ctx *c);
static void be_dealloc(st_backend *be, void *p) {
    if (!p) return;
    copies_drain(ctx_of(be)); /* an asynchronous copy still in flight may touch the block */
    ctx_of(be)->arena.release((size_t)((char *)p - ctx_of(be)->base));
}
static void be_memset0(st_backend *be, void *p, size_t bytes) {
    note(ctx_of(be), cudaMemsetAsync(p, 0, bytes, ctx_of(be)->stream), "memset0");
}
static void be_copy(st_backend *be, void *dst, const void *src, size_t bytes, const char *op) {
    cuda_ctx *c = ctx_of(be);
    note(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, c->stream), op);
    note(c, cudaStreamSynchronize(c->stream), op);
}
static void be_copy_to_device(st_backend *be, void *dst, const void *host_src, size_t bytes) {
    be_copy(be, dst, host_src, bytes, "copy_to_device");
}
static void be_copy_to_host(st_backend *be, void *host_dst, const void *src, size_t bytes) {
    be_copy(be, host_dst, src, bytes, "copy_to_host");
}
/* the arena's figures: every block it carved, cuBLASLt's workspace among them */
static void be_memory(st_backend *be, size_t *used, size_t *peak, size_t *capacity) {
    const CuArena &a = ctx_of(be)->arena;
    *used = a.used, *peak = a.peak, *capacity = a.cap;
}
static void be_synchronize(st_backend *be) { note(ctx_of(be), cudaStreamSynchronize(ctx_of(be)->stream), "synchronize"); }

/* ---------------------------------------------------------------- asynchronous copies
 * Ordering rule. A copy_async is queued on its direction's copy stream (h2d or d2h,
 * non-blocking streams) behind an event recorded on the compute stream at that moment,
 * so it runs after every op queued before it, and a completion event is recorded behind
 * it. Nothing on the GPU orders a LATER compute op after the copy: the host does, by
 * waiting for the copy's ticket (copy_sync: cudaEventSynchronize) before it queues an op
 * that reads the copied bytes or overwrites a copy's source, and before it reads a
 * device-to-host destination or reuses a host-to-device source. That is the copy engine's
 * contract (st_copy_wait) and the executor's (it waits on a ticket before using weights;
 * stream_step.c lists its rules). Copies of one direction complete in order, so a ticket
 * covers every earlier one of its direction. A block freed while copies are in flight
 * waits for them (be_dealloc), since the arena hands it out again at once. Pageable host
 * memory works but the driver stages it, so the copy is slower and may return later:
 * host_alloc gives page-locked memory. */

static const char *copy_op(int d) { return d ? "copy_async d2h" : "copy_async h2d"; }

static void *be_host_alloc(st_backend *be, size_t bytes) {
    (void)be;
    void *p = nullptr;
    if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError(); /* a refused allocation is the caller's NULL, not the next op's error */
        return nullptr;
    }
    memset(p, 0, bytes);
    return p;
}
static void be_host_free(st_backend *be, void *p) {
    if (!p) return;
    copies_drain(ctx_of(be)); /* a copy still queued may read or write the block */
    note(ctx_of(be), cudaFreeHost(p), "host_free");
}

static int be_host_register(st_backend *be, void *p, size_t bytes) {
    (void)be;
    if (!p || !bytes) return -1;
    if (cudaHostRegister(p, bytes, cudaHostRegisterDefault) != cudaSuccess) {
        cudaGetLastError(); /* refused (no error of an op): the memory stays pageable */
        return -1;
    }
    return 0;
}
static void be_host_unregister(st_backend *be, void *p) {
    if (!p) return;
    copies_drain(ctx_of(be)); /* a copy still queued may read or write the range */
    note(ctx_of(be), cudaHostUnregister(p), "host_unregister");
}

static uint64_t be_copy_async(st_backend *be, int d2h, void *dst, const void *src, size_t bytes) {
    cuda_ctx *c = ctx_of(be);
    int d = d2h ? 1 : 0;
    std::lock_guard<std::mutex> g(c->copy_mu);
    uint64_t t = c->copy_issued[d] + 1;
    cudaEvent_t ev = c->copy_ev[d][t % CU_COPY_RING];
    cudaError_t e = cudaSuccess;
    if (t > CU_COPY_RING && c->copy_done[d] < t - CU_COPY_RING) { /* the slot's last ticket */
        if ((e = cudaEventSynchronize(ev)) != cudaSuccess) return note(c, e, copy_op(d)), 0;
        c->copy_done[d] = t - CU_COPY_RING;
    }
    if ((e = cudaEventRecord(c->compute_mark, c->stream)) == cudaSuccess &&
        (e = cudaStreamWaitEvent(c->copy_stream[d], c->compute_mark, 0)) == cudaSuccess &&
        (e = cudaMemcpyAsync(dst, src, bytes, d ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice,
                             c->copy_stream[d])) == cudaSuccess)
        e = cudaEventRecord(ev, c->copy_stream[d]);
    if (e != cudaSuccess) return note(c, e, copy_op(d)), 0;
    c->copy_issued[d] = t;
    return t;
}
/* the event of a ticket not yet known complete, or nullptr when it is (or is unknown) */
static cudaEvent_t copy_event(cuda_ctx *c, int d, uint64_t ticket) {
    std::lock_guard<std::mutex> g(c->copy_mu);
    if (ticket <= c->copy_done[d]) return nullptr;
    if (ticket > c->copy_issued[d]) return note(c, cudaErrorInvalidValue, copy_op(d)), nullptr;
    /* the slot still holds this ticket's record: it is recorded again only once
     * copy_done reaches the ticket. If another thread records it again between here and
     * the wait, the wait covers a later copy of the same stream: later, not wrong. */
    return c->copy_ev[d][ticket % CU_COPY_RING];
}
static void copy_mark_done(cuda_ctx *c, int d, uint64_t ticket) {
    std::lock_guard<std::mutex> g(c->copy_mu);
    if (ticket > c->copy_done[d]) c->copy_done[d] = ticket;
}
static void be_copy_sync(st_backend *be, int d2h, uint64_t ticket) {
    cuda_ctx *c = ctx_of(be);
    int d = d2h ? 1 : 0;
    cudaEvent_t ev = copy_event(c, d, ticket);
    if (!ev) return;
    cudaError_t e = cudaEventSynchronize(ev); /* outside the lock: other threads queue meanwhile */
    if (e != cudaSuccess) return note(c, e, copy_op(d));
    copy_mark_done(c, d, ticket);
}
static int be_copy_query(st_backend *be, int d2h, uint64_t ticket) {
    cuda_ctx *c = ctx_of(be);
    int d = d2h ? 1 : 0;
    cudaEvent_t ev = copy_event(c, d, ticket);
    if (!ev) return 1;
    cudaError_t e = cudaEventQuery(ev);
    if (e == cudaErrorNotReady) {
        cudaGetLastError(); /* not an error: never let it reach the next op's check */
        return 0;
    }
    if (e != cudaSuccess) return note(c, e, copy_op(d)), 0; /* copy_sync will return, failed */
    copy_mark_done(c, d, ticket);
    return 1;
}
/* wait for every copy queued so far, both directions */
static void copies_drain(cuda_ctx *c) {
    uint64_t last[2];
    {
        std::lock_guard<std::mutex> g(c->copy_mu);
        last[0] = c->copy_issued[0], last[1] = c->copy_issued[1];
    }
    st_backend tmp = {nullptr, c};
    for (int d = 0; d < 2; d++) be_copy_sync(&tmp, d, last[d]);
}

/* ---------------------------------------------------------------- device timing
 * A mark is a timing event recorded on the compute stream; the seconds between two are
 * cudaEventElapsedTime's, so a span of ops is timed as the device ran it, not as the host
 * queued it (the executor's compute_s and its trace's GPU spans). Marks are made by the
 * thread that queues the ops; the ring keeps the last CU_TIMER_RING. */
static uint64_t be_timer_mark(st_backend *be) {
    cuda_ctx *c = ctx_of(be);
    uint64_t t = c->timer_issued + 1;
    cudaError_t e = cudaEventRecord(c->timer_ev[t % CU_TIMER_RING], c->stream);
    if (e != cudaSuccess) return note(c, e, "timer_mark"), 0;
    c->timer_issued = t;
    return t;
}
static double be_timer_seconds(st_backend *be, uint64_t from, uint64_t to) {
    cuda_ctx *c = ctx_of(be);
    uint64_t last = c->timer_issued;
    if (!from || from > to || to > last || last - from >= CU_TIMER_RING) return -1;
    cudaEvent_t a = c->timer_ev[from % CU_TIMER_RING], b = c->timer_ev[to % CU_TIMER_RING];
    float ms = 0;
    cudaError_t e = cudaEventSynchronize(b);
    if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, a, b);
    if (e != cudaSuccess) return note(c, e, "timer_seconds"), -1;
    return ms * 1e-3;
}

/* ---------------------------------------------------------------- matmul (cuBLASLt) */

#include "backend/cuda/cuda_matmul.cuh"

extern "C" size_t st_backend_cuda_matmul_workspace(size_t arena_bytes) { return cu_lt_workspace_bytes(arena_bytes); }
static_assert(sizeof cu_lt_compute / sizeof cu_lt_compute[0] == ST_MATMUL_BF16 + 1, "a compute type per st_matmul_mode");
extern "C" st_status st_backend_cuda_set_matmul(st_backend *be, st_matmul_mode mode, st_err *err) {
    if ((int)mode < 0 || (size_t)mode >= sizeof cu_lt_compute / sizeof cu_lt_compute[0])
        return st_errf(err, ST_ERR_INVALID, "cuda backend: matmul mode %d is not ST_MATMUL_FP32, _TF32 or _BF16 "
                       "(st_backend_matmul_parse reads the names)", (int)mode);
    ctx_of(be)->matmul_mode = (int)mode;
    return ST_OK;
}
extern "C" st_status st_backend_cuda_set_attention(st_backend *be, st_cuda_attention mode, st_err *err) {
    if (mode != ST_CUDA_ATTENTION_AUTO && mode != ST_CUDA_ATTENTION_OWN && mode != ST_CUDA_ATTENTION_CUDNN)
        return st_errf(err, ST_ERR_INVALID, "cuda backend: attention mode %d is not ST_CUDA_ATTENTION_AUTO, _OWN or "
                       "_CUDNN", (int)mode);
#if !CU_SDPA || !defined(STRATA_HAVE_CUDNN)
    if (mode == ST_CUDA_ATTENTION_CUDNN)
        return st_errf(err, ST_ERR_UNSUPPORTED, "cuda backend: attention through cuDNN asked for, but this strata was "
                       "built without cuDNN (%s): install cuDNN 9 (cudnn.h) and rebuild, or use the own kernels",
                       st_backend_cuda_attention_built());
#endif
    ctx_of(be)->attention = (int)mode;
    return ST_OK;
}
extern "C" const char *st_backend_cuda_attention_built(void) {
#if CU_SDPA && defined(STRATA_HAVE_CUDNN)
#define CU_STR2(x) #x
#define CU_STR(x) CU_STR2(x)
    return "cuDNN " CU_STR(CUDNN_MAJOR) "." CU_STR(CUDNN_MINOR) "." CU_STR(CUDNN_PATCHLEVEL)
           " fused attention (libcudnn loaded at first use), own kernels as the fallback";
#elif CU_SDPA
    return "own kernels (built without cuDNN: CMake found no cudnn.h)";
#else
    return "own kernels (the emulation has no cuDNN)";
#endif
}
extern "C" void st_backend_cuda_attention_stats(st_backend *be, st_cuda_attention_stats *out) {
    *out = ctx_of(be)->astats;
}
extern "C" void st_backend_cuda_matmul_stats(st_backend *be, st_cuda_matmul_stats *out) {
    const CuLtMatmul *L = ctx_of(be)->mm;
    for (int i = 0; i < 3; i++) out->calls[i] = L->calls[i];
    out->fallbacks = L->fallbacks, out->bias_rows = L->bias_rows;
}
/* out (N, OC) rows = bias (OC): the biased matmul starts from it with beta 1, as the CPU's */
static __global__ void k_bias_rows(float *out, const float *bias, int N, int OC) {
    size_t n = (size_t)N * OC, step = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) out[i] = bias[i % OC];
}
/* dbias (OC) += the rows of dout (N, OC): a thread per column adds the rows in order, the
 * CPU backend's order, so the bits are its bits (no atomics). The fallback of the two
 * kernels below, where cuBLASLt's workspace cannot hold their partial sums. */
static __global__ void k_bias_grad(float *dbias, const float *dout, int N, int OC) {
    for (int o = blockIdx.x * blockDim.x + threadIdx.x; o < OC; o += gridDim.x * blockDim.x) {
        float acc = dbias[o];
        for (int i = 0; i < N; i++) acc += dout[(size_t)i * OC + o];
        dbias[o] = acc;
    }
}
/* The bias gradient spread over the device: block (bx, by) of 32 x 8 threads sums columns
 * [32 bx, 32 bx + 32) over the rows i = 8 r + ty (r = by, by + R, ...) in order, then its 8
 * row lanes in order, into part[by][col]; k_bias_grad_sum adds the R partial sums of each
 * column in order. A fixed order, so the same bits every run (not the CPU's: within the
 * fp32 tolerance of its sum). One thread per column gave 3 blocks for 768 columns. */
enum { CU_BG_X = 32, CU_BG_Y = 8 };
static __global__ void k_bias_grad_part(float *part, const float *dout, int N, int OC, int R) {
    __shared__ float acc[CU_BG_Y][CU_BG_X];
    int tx = threadIdx.x, ty = threadIdx.y;
    for (int cb = blockIdx.x; cb * CU_BG_X < OC; cb += gridDim.x) {
        int o = cb * CU_BG_X + tx;
        for (int r = blockIdx.y; r < R; r += gridDim.y) {
            float a = 0;
            if (o < OC)
                for (int i = r * CU_BG_Y + ty; i < N; i += R * CU_BG_Y) a += dout[(size_t)i * OC + o];
            acc[ty][tx] = a;
            __syncthreads();
            if (ty == 0 && o < OC) {
                float t = acc[0][tx];
                for (int y = 1; y < CU_BG_Y; y++) t += acc[y][tx];
                part[(size_t)r * OC + o] = t;
            }
            __syncthreads();
        }
    }
}
static __global__ void k_bias_grad_sum(float *dbias, const float *part, int OC, int R) {
    for (int o = blockIdx.x * blockDim.x + threadIdx.x; o < OC; o += gridDim.x * blockDim.x) {
        float t = 0;
        for (int r = 0; r < R; r++) t += part[(size_t)r * OC + o];
        dbias[o] += t;
    }
}
/* dbias (OC) += column sums of dout (N, OC), on the compute stream; the partial sums in
 * cuBLASLt's workspace, which only the gemms on this stream use */
static void bias_grad(st_backend *be, float *dbias, const float *dout, int N, int OC, const char *op) {
    cuda_ctx *c = ctx_of(be);
    size_t cap = c->mm->ws ? c->mm->ws_bytes / ((size_t)OC * 4) : 0;
    int R = (N + CU_BG_Y - 1) / CU_BG_Y;
    if (R > 64) R = 64;
    if ((size_t)R > cap) R = (int)cap;
    if (R < 2) {
        ST_CUDA_LAUNCH(k_bias_grad, st_cuda_grid((size_t)OC, 256), 256, 0, c->stream, dbias, dout, N, OC);
        LAUNCHED(be, op);
        return;
    }
    float *part = (float *)c->mm->ws;
    unsigned gx = st_cuda_grid((size_t)OC, CU_BG_X), gy = st_cuda_grid((size_t)R, 1);
    ST_CUDA_LAUNCH(k_bias_grad_part, dim3(gx, gy), dim3(CU_BG_X, CU_BG_Y), 0, c->stream, part, dout, N, OC, R);
    LAUNCHED(be, op);
    ST_CUDA_LAUNCH(k_bias_grad_sum, st_cuda_grid((size_t)OC, 256), 256, 0, c->stream, dbias, part, OC, R);
    LAUNCHED(be, op);
}
/* Row-major C (M, N) = op(A) (M, K) op(B) (K, N) + beta C (+ bias, N floats, on every
 * row: only with beta 0 and ldc N), the CPU backend's cblas_sgemm(CblasRowMajor, ...) call
 * for call, in the precision set by st_backend_cuda_set_matmul (cu_lt_gemm). The bias is
 * added in cuBLASLt's epilogue where it has an algorithm for it, else as the CPU adds
 * it: its rows first, then the product with beta 1. */
static void mm_gemm(st_backend *be, bool ta, bool tb, int M, int N, int K, const float *A, int lda, const float *B,
                    int ldb, float beta, const float *bias, float *C, int ldc, const char *op) {
    cuda_ctx *c = ctx_of(be);
    bool added = false;
    c->last_op.store(op);
    cublasStatus_t s =
        cu_lt_gemm(c->mm, c->matmul_mode, c->stream, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, bias, &added);
    if (s == CUBLAS_STATUS_SUCCESS && bias && !added) {
        ST_CUDA_LAUNCH(k_bias_rows, st_cuda_grid((size_t)M * N, 256), 256, 0, c->stream, C, bias, M, N);
        LAUNCHED(be, op);
        s = cu_lt_gemm(c->mm, c->matmul_mode, c->stream, ta, tb, M, N, K, A, lda, B, ldb, 1.0f, C, ldc, nullptr,
                       nullptr);
    }
    note_blas(c, s, op);
}
static void be_matmul_forward(st_backend *be, float *out, const float *inp, const float *w, const float *bias, int N,
                              int C, int OC, st_wlayout layout) {
    if (layout == ST_W_IN_OUT)
        mm_gemm(be, false, false, N, OC, C, inp, C, w, OC, 0.0f, bias, out, OC, "matmul_forward");
    else
        mm_gemm(be, false, true, N, OC, C, inp, C, w, C, 0.0f, bias, out, OC, "matmul_forward");
}
/* dinp += (beta 1, matmul_backward) or = (beta 0, matmul_backward_write) the product */
static void mm_backward(st_backend *be, float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                        const float *w, int N, int C, int OC, st_wlayout layout, float beta, const char *op) {
    if (layout == ST_W_IN_OUT) {
        if (dinp) mm_gemm(be, false, true, N, C, OC, dout, OC, w, OC, beta, nullptr, dinp, C, op);
        if (dw) mm_gemm(be, true, false, C, OC, N, inp, C, dout, OC, 1.0f, nullptr, dw, OC, op);
    } else {
        if (dinp) mm_gemm(be, false, false, N, C, OC, dout, OC, w, C, beta, nullptr, dinp, C, op);
        if (dw) mm_gemm(be, true, false, OC, C, N, dout, OC, inp, C, 1.0f, nullptr, dw, C, op);
    }
    if (dbias) bias_grad(be, dbias, dout, N, OC, op);
}
static void be_matmul_backward(st_backend *be, float *dinp, float *dw, float *dbias, const float *dout,
                               const float *inp, const float *w, int N, int C, int OC, st_wlayout layout) {
    mm_backward(be, dinp, dw, dbias, dout, inp, w, N, C, OC, layout, 1.0f, "matmul_backward");
}
static void be_matmul_backward_write(st_backend *be, float *dinp, float *dw, float *dbias, const float *dout,
                                     const float *inp, const float *w, int N, int C, int OC, st_wlayout layout) {
    mm_backward(be, dinp, dw, dbias, dout, inp, w, N, C, OC, layout, 0.0f, "matmul_backward_write");
}

/* ---------------------------------------------------------------- ops (fp32 storage) */

static void be_encoder_forward(st_backend *be, float *out, const int32_t *inp, const float *wte, const float *wpe,
                               int B, int T, int C) {
    cu_embed_forward<float>(out, inp, wte, wpe, B, T, C, ctx_of(be)->stream);
    LAUNCHED(be, "encoder_forward");
}
static void be_encoder_backward(st_backend *be, float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                                int T, int C) {
    cu_embed_backward<float>(dwte, dwpe, dout, inp, B, T, C, ctx_of(be)->stream);
    LAUNCHED(be, "encoder_backward");
}
static void be_embedding_forward(st_backend *be, float *out, const int32_t *inp, const float *wte, int B, int T,
                                 int C) {
    cu_embed_forward<float>(out, inp, wte, nullptr, B, T, C, ctx_of(be)->stream);
    LAUNCHED(be, "embedding_forward");
}
static void be_embedding_backward(st_backend *be, float *dwte, const float *dout, const int32_t *inp, int B, int T,
                                  int C) {
    cu_embed_backward<float>(dwte, nullptr, dout, inp, B, T, C, ctx_of(be)->stream);
    LAUNCHED(be, "embedding_backward");
}
static void be_layernorm_forward(st_backend *be, float *out, float *mean, float *rstd, const float *inp,
                                 const float *w, const float *b, int N, int C) {
    cu_layernorm_forward<float>(out, mean, rstd, inp, w, b, N, C, ctx_of(be)->stream);
    LAUNCHED(be, "layernorm_forward");
}
static void be_layernorm_backward(st_backend *be, float *dinp, float *dw, float *db, const float *dout,
                                  const float *inp, const float *w, const float *mean, const float *rstd, int N,
                                  int C) {
    cuda_ctx *c = ctx_of(be); /* the weight gradients' partial sums in cuBLASLt's workspace (stream-ordered) */
    cu_layernorm_backward<float>(dinp, dw, db, dout, inp, w, mean, rstd, N, C, c->stream, (float *)c->mm->ws,
                                 c->mm->ws ? c->mm->ws_bytes / 4 : 0);
    LAUNCHED(be, "layernorm_backward");
}
static void be_rmsnorm_forward(st_backend *be, float *out, float *rstd, const float *inp, const float *w, int N,
                               int H, int hs, int ld, float eps) {
    cu_rmsnorm_forward<float>(out, rstd, inp, w, N, H, hs, ld, eps, ctx_of(be)->stream);
    LAUNCHED(be, "rmsnorm_forward");
}
static void be_rmsnorm_backward(st_backend *be, float *dinp, float *dw, const float *dout, const float *inp,
                                const float *w, const float *rstd, int N, int H, int hs, int ld) {
    cuda_ctx *c = ctx_of(be);
    cu_rmsnorm_backward<float>(dinp, dw, dout, inp, w, rstd, N, H, hs, ld, c->stream, (float *)c->mm->ws,
                               c->mm->ws ? c->mm->ws_bytes / 4 : 0);
    LAUNCHED(be, "rmsnorm_backward");
}
static void be_gelu_forward(st_backend *be, float *out, const float *inp, int n) {
    cu_gelu_forward<float>(out, inp, (size_t)n, ctx_of(be)->stream);
    LAUNCHED(be, "gelu_forward");
}
static void be_gelu_backward(st_backend *be, float *dinp, const float *inp, const float *dout, int n) {
    cu_gelu_backward<float>(dinp, inp, dout, (size_t)n, ctx_of(be)->stream);
    LAUNCHED(be, "gelu_backward");
}
/* written: cleared on the stream, then the accumulating kernel (the CPU backend's saving is
 * a pass over host memory; here the clear is one more small launch) */
static void be_gelu_backward_write(st_backend *be, float *dinp, const float *inp, const float *dout, int n) {
    be_memset0(be, dinp, sizeof(float) * (size_t)n);
    be_gelu_backward(be, dinp, inp, dout, n);
}
static void be_axpy_rows(st_backend *be, float *y, int ldy, const float *x, int ldx, float alpha, int N, int W) {
    cu_axpy_rows<float>(y, ldy, x, ldx, alpha, N, W, ctx_of(be)->stream);
    LAUNCHED(be, "axpy_rows");
}
static void be_residual_forward(st_backend *be, float *out, const float *a, const float *b, int n) {
    cu_residual_forward<float>(out, a, b, (size_t)n, ctx_of(be)->stream);
    LAUNCHED(be, "residual_forward");
}
static void be_residual_backward(st_backend *be, float *da, float *db, const float *dout, int n) {
    cu_residual_backward<float>(da, db, dout, (size_t)n, ctx_of(be)->stream);
    LAUNCHED(be, "residual_backward");
}
static void be_swiglu_forward(st_backend *be, float *out, const float *inp, int N, int F) {
    cu_swiglu_forward<float>(out, inp, N, F, ctx_of(be)->stream);
    LAUNCHED(be, "swiglu_forward");
}
static void be_swiglu_backward(st_backend *be, float *dinp, const float *inp, const float *dout, int N, int F) {
    cu_swiglu_backward<float>(dinp, inp, dout, N, F, ctx_of(be)->stream);
    LAUNCHED(be, "swiglu_backward");
}
static void be_rope_forward(st_backend *be, float *x, const float *cos, const float *sin, int B, int T, int H, int hs,
                            int ld) {
    cu_rope_forward<float>(x, cos, sin, B, T, H, hs, ld, ctx_of(be)->stream);
    LAUNCHED(be, "rope_forward");
}
static void be_rope_backward(st_backend *be, float *dx, const float *cos, const float *sin, int B, int T, int H,
                             int hs, int ld) {
    cu_rope_backward<float>(dx, cos, sin, B, T, H, hs, ld, ctx_of(be)->stream);
    LAUNCHED(be, "rope_backward");
}
/* attention: GPT-2's packed qkv is the grouped case with NKV = NH, ld = 3C; doc_start NULL
 * without documents. A head size over CU_ATT_HS is refused as an invalid value. cuDNN's
 * fused attention (st_backend_cuda_set_attention) runs it where asked for and able; the
 * own kernels otherwise, and after any cuDNN failure (said once, on stderr). */
static bool att_want_cudnn(cuda_ctx *c) {
    bool want = c->attention == ST_CUDA_ATTENTION_CUDNN ||
                (c->attention == ST_CUDA_ATTENTION_AUTO && c->matmul_mode == ST_MATMUL_BF16);
    if (!want && !c->said_own) /* which attention a run uses, said once (cuDNN's line: att_sdpa) */
        st_log(1, "cuda backend: attention through the own fp32 kernels (%s)\n",
               c->attention == ST_CUDA_ATTENTION_OWN ? "asked for"
                                                     : "auto with fp32 or tf32 matmuls; bf16 matmuls take cuDNN's fused "
                                                       "attention where it is built");
    c->said_own |= !want;
    return want;
}
#if CU_SDPA
static void att_why(cuda_ctx *c, const char *why) { snprintf(c->astats.why, sizeof c->astats.why, "%s", why); }
/* cuDNN for direction dir, opened at the first call (and said once either way) */
static CuSdpa *att_sdpa(cuda_ctx *c, int dir) {
    if (c->sdpa_off[dir]) return nullptr;
    if (!c->sdpa_tried) {
        char why[256] = "";
        c->sdpa_tried = true;
        c->sdpa = cu_sdpa_open(c->stream, why, sizeof why);
        if (c->sdpa)
            st_log(1, "cuda backend: attention through cuDNN %d's fused scaled-dot-product attention (bf16, fp32 "
                   "statistics); documents through the own kernels\n", cu_sdpa_version(c->sdpa));
        else {
            st_log(1, "cuda backend: cuDNN's attention is not available (%s): the own kernels run attention\n", why);
            att_why(c, why);
            c->sdpa_off[0] = c->sdpa_off[1] = true;
        }
    }
    return c->sdpa;
}
/* a cuDNN call failed: said once for the direction, which runs the own kernels from now on */
static void att_failed(cuda_ctx *c, int dir, const char *why, int B, int T, int NH, int NKV, int hs) {
    st_log(1, "cuda backend: cuDNN attention %s (B %d, T %d, %d heads over %d kv heads, head size %d) failed: %s; the "
           "own kernels run it from here on\n", dir ? "backward" : "forward", B, T, NH, NKV, hs, why);
    att_why(c, why);
    c->sdpa_off[dir] = true;
}
/* documents: cuDNN is not asked (the packed-document mask is not expressed), said once */
static void att_docs(cuda_ctx *c) {
    if (!c->said_docs)
        st_log(1, "cuda backend: attention over documents runs the own kernels (cuDNN's fused attention is not "
               "given the document mask)\n");
    c->said_docs = true;
    att_why(c, "documents run the own kernels");
}
#endif
static void att_fwd(st_backend *be, float *out, float *lse, const float *q, const float *k, const float *v,
                    const int32_t *ds, int ld, int B, int T, int NH, int NKV, int hs, const char *op) {
    cuda_ctx *c = ctx_of(be);
    if (!cu_attn_supported(hs)) return note(c, cudaErrorInvalidValue, op);
    if (att_want_cudnn(c)) {
#if CU_SDPA
        char why[256] = "";
        CuSdpa *s = ds ? nullptr : att_sdpa(c, 0);
        if (ds) att_docs(c);
        if (s && cu_sdpa_forward(s, out, lse, q, k, v, ld, B, T, NH, NKV, hs, why, sizeof why) == 0) {
            c->astats.cudnn[0]++;
            return LAUNCHED(be, op);
        }
        if (s) att_failed(c, 0, why, B, T, NH, NKV, hs);
#endif
        c->astats.fallbacks++;
    }
    c->astats.own[0]++;
    cu_attn_forward<float>(out, lse, q, k, v, ds, ld, B, T, NH, NKV, hs, c->stream);
    LAUNCHED(be, op);
}
static void att_bwd(st_backend *be, float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                    const float *v, const float *out, const float *lse, const int32_t *ds, int ld, int B, int T, int NH,
                    int NKV, int hs, const char *op) {
    cuda_ctx *c = ctx_of(be);
    if (!cu_attn_supported(hs)) return note(c, cudaErrorInvalidValue, op);
    if (att_want_cudnn(c)) {
#if CU_SDPA
        char why[256] = "";
        CuSdpa *s = ds ? nullptr : att_sdpa(c, 1);
        if (ds) att_docs(c);
        if (s && cu_sdpa_backward(s, dq, dk, dv, dout, q, k, v, out, lse, ld, B, T, NH, NKV, hs, why, sizeof why) == 0) {
            c->astats.cudnn[1]++;
            return LAUNCHED(be, op);
        }
        if (s) att_failed(c, 1, why, B, T, NH, NKV, hs);
#endif
        c->astats.fallbacks++;
    }
    c->astats.own[1]++;
    /* delta once per row, in cuBLASLt's workspace (stream-ordered) */
    cu_attn_backward<float>(dq, dk, dv, dout, q, k, v, out, lse, ds, ld, B, T, NH, NKV, hs, c->stream,
                            (float *)c->mm->ws, c->mm->ws ? c->mm->ws_bytes / 4 : 0);
    LAUNCHED(be, op);
}
static void be_attention_forward(st_backend *be, float *out, float *lse, const float *qkv, int B, int T, int C,
                                 int NH) {
    att_fwd(be, out, lse, qkv, qkv + C, qkv + 2 * C, nullptr, 3 * C, B, T, NH, NH, C / NH, "attention_forward");
}
static void be_attention_backward(st_backend *be, float *dqkv, const float *dout, const float *qkv, const float *out,
                                  const float *lse, int B, int T, int C, int NH) {
    att_bwd(be, dqkv, dqkv + C, dqkv + 2 * C, dout, qkv, qkv + C, qkv + 2 * C, out, lse, nullptr, 3 * C, B, T, NH, NH,
            C / NH, "attention_backward");
}
static void be_attention_doc_forward(st_backend *be, float *out, float *lse, const float *qkv,
                                     const int32_t *doc_start, int B, int T, int C, int NH) {
    att_fwd(be, out, lse, qkv, qkv + C, qkv + 2 * C, doc_start, 3 * C, B, T, NH, NH, C / NH, "attention_doc_forward");
}
static void be_attention_doc_backward(st_backend *be, float *dqkv, const float *dout, const float *qkv,
                                      const float *out, const float *lse, const int32_t *doc_start, int B, int T,
                                      int C, int NH) {
    att_bwd(be, dqkv, dqkv + C, dqkv + 2 * C, dout, qkv, qkv + C, qkv + 2 * C, out, lse, doc_start, 3 * C, B, T, NH,
            NH, C / NH, "attention_doc_backward");
}
static void be_attention_backward_write(st_backend *be, float *dqkv, const float *dout, const float *qkv,
                                        const float *out, const float *lse, const int32_t *doc_start, int B, int T,
                                        int C, int NH) {
    be_memset0(be, dqkv, sizeof(float) * 3 * (size_t)B * T * C);
    if (doc_start) be_attention_doc_backward(be, dqkv, dout, qkv, out, lse, doc_start, B, T, C, NH);
    else be_attention_backward(be, dqkv, dout, qkv, out, lse, B, T, C, NH);
}
static void be_attention_gqa_forward(st_backend *be, float *out, float *lse, const float *q, const float *k,
                                     const float *v, int ld, int B, int T, int NH, int NKV, int hs) {
    att_fwd(be, out, lse, q, k, v, nullptr, ld, B, T, NH, NKV, hs, "attention_gqa_forward");
}
static void be_attention_gqa_backward(st_backend *be, float *dq, float *dk, float *dv, const float *dout,
                                      const float *q, const float *k, const float *v, const float *out,
                                      const float *lse, int ld, int B, int T, int NH, int NKV, int hs) {
    att_bwd(be, dq, dk, dv, dout, q, k, v, out, lse, nullptr, ld, B, T, NH, NKV, hs, "attention_gqa_backward");
}
static void be_attention_gqa_doc_forward(st_backend *be, float *out, float *lse, const float *q, const float *k,
                                         const float *v, const int32_t *doc_start, int ld, int B, int T, int NH,
                                         int NKV, int hs) {
    att_fwd(be, out, lse, q, k, v, doc_start, ld, B, T, NH, NKV, hs, "attention_gqa_doc_forward");
}
static void be_attention_gqa_doc_backward(st_backend *be, float *dq, float *dk, float *dv, const float *dout,
                                          const float *q, const float *k, const float *v, const float *out,
                                          const float *lse, const int32_t *doc_start, int ld, int B, int T, int NH,
                                          int NKV, int hs) {
    att_bwd(be, dq, dk, dv, dout, q, k, v, out, lse, doc_start, ld, B, T, NH, NKV, hs, "attention_gqa_doc_backward");
}
/* POET-X (kernels_poetx.cuh): the polynomial and its gradient take their scratch from
 * cuBLASLt's workspace (stream-ordered, as the bias and norm gradients do), the blocks in
 * batches that fit it; a block size over CU_POET_MAXB, or one block's scratch over the
 * workspace, is refused as an invalid value */
static float *poet_scratch(cuda_ctx *c, size_t *floats) {
    *floats = c->mm->ws ? c->mm->ws_bytes / 4 : 0;
    return (float *)c->mm->ws;
}
static void be_poet_cayley_forward(st_backend *be, float *G, const float *q, int nb, int b, int k) {
    cuda_ctx *c = ctx_of(be);
    size_t n;
    float *ws = poet_scratch(c, &n);
    if (!cu_poet_supported(b) || k < 0 || !cu_poet_cayley_forward(G, q, nb, b, k, ws, n, c->stream))
        return note(c, cudaErrorInvalidValue, "poet_cayley_forward");
    LAUNCHED(be, "poet_cayley_forward");
}
static void be_poet_cayley_backward(st_backend *be, float *dq, const float *dG, const float *q, int nb, int b, int k) {
    cuda_ctx *c = ctx_of(be);
    size_t n;
    float *ws = poet_scratch(c, &n);
    if (!cu_poet_supported(b) || k < 0 || !cu_poet_cayley_backward(dq, dG, q, nb, b, k, ws, n, c->stream))
        return note(c, cudaErrorInvalidValue, "poet_cayley_backward");
    LAUNCHED(be, "poet_cayley_backward");
}
static void be_poet_apply_forward(st_backend *be, float *y, const float *x, const float *G, const int32_t *perm, int N,
                                  int d, int b, int trans) {
    if (!cu_poet_supported(b) || d % b) return note(ctx_of(be), cudaErrorInvalidValue, "poet_apply_forward");
    cu_poet_apply_forward(y, x, G, perm, N, d, b, trans, ctx_of(be)->stream);
    LAUNCHED(be, "poet_apply_forward");
}
static void be_poet_permute(st_backend *be, float *y, int ldy, const float *x, int ldx, const int32_t *perm, int N,
                            int d, int mode) {
    cu_poet_permute(y, ldy, x, ldx, perm, N, d, mode, ctx_of(be)->stream);
    LAUNCHED(be, "poet_permute");
}
static void be_poet_apply_backward(st_backend *be, float *dx, float *dG, const float *dy, const float *x,
                                   const float *G, const int32_t *perm, int N, int d, int b, int trans) {
    if (!cu_poet_supported(b) || d % b) return note(ctx_of(be), cudaErrorInvalidValue, "poet_apply_backward");
    cu_poet_apply_backward(dx, dG, dy, x, G, perm, N, d, b, trans, ctx_of(be)->stream);
    LAUNCHED(be, "poet_apply_backward");
}
/* the classifier: the fused cross-entropy over full rows and the chunked online softmax
 * (kernels_xent.cuh), rows with target < 0 masked */
static void be_crossentropy(st_backend *be, float *logits, float *losses, const int32_t *targets, int N, int V,
                            float dloss) {
    cu_crossentropy<float>(logits, losses, targets, N, V, dloss, ctx_of(be)->stream);
    LAUNCHED(be, "crossentropy_forward_backward");
}
static void be_softmax_chunk_init(st_backend *be, float *rmax, double *rsum, float *tlogit, int N) {
    cu_softmax_chunk_init(rmax, rsum, tlogit, N, ctx_of(be)->stream);
    LAUNCHED(be, "softmax_chunk_init");
}
static void be_softmax_chunk_stats(st_backend *be, const float *logits, const int32_t *targets, int N, int nr, int r0,
                                   float *rmax, double *rsum, float *tlogit) {
    cu_softmax_chunk_stats<float>(logits, targets, N, nr, r0, rmax, rsum, tlogit, ctx_of(be)->stream);
    LAUNCHED(be, "softmax_chunk_stats");
}
static void be_softmax_chunk_grad(st_backend *be, float *logits, const int32_t *targets, int N, int nr, int r0,
                                  const float *rmax, const double *rsum, float dloss) {
    cu_softmax_chunk_grad<float>(logits, targets, N, nr, r0, rmax, rsum, dloss, ctx_of(be)->stream);
    LAUNCHED(be, "softmax_chunk_grad");
}
static void be_to_bf16(st_backend *be, uint16_t *dst, const float *src, size_t n) {
    cu_to_bf16<float>((__nv_bfloat16 *)dst, src, n, ctx_of(be)->stream);
    LAUNCHED(be, "to_bf16");
}
static void be_from_bf16(st_backend *be, float *dst, const uint16_t *src, size_t n) {
    cu_from_bf16<float>(dst, (const __nv_bfloat16 *)src, n, ctx_of(be)->stream);
    LAUNCHED(be, "from_bf16");
}

/* ---------------------------------------------------------------- lifetime */

static void be_free(st_backend *be) {
    if (!be) return;
    cuda_ctx *c = ctx_of(be);
    if (c) {
        if (c->stream) cudaStreamSynchronize(c->stream);
        for (int d = 0; d < 2; d++) {
            if (c->copy_stream[d]) cudaStreamSynchronize(c->copy_stream[d]);
            for (int i = 0; i < CU_COPY_RING; i++)
                if (c->copy_ev[d][i]) cudaEventDestroy(c->copy_ev[d][i]);
            if (c->copy_stream[d]) cudaStreamDestroy(c->copy_stream[d]);
        }
        if (c->compute_mark) cudaEventDestroy(c->compute_mark);
        for (int i = 0; i < CU_TIMER_RING; i++)
            if (c->timer_ev[i]) cudaEventDestroy(c->timer_ev[i]);
#if CU_SDPA
        cu_sdpa_close(c->sdpa);
#endif
        if (c->mm && c->mm->lt) cublasLtDestroy(c->mm->lt);
        delete c->mm; /* its workspace is a block of the arena */
        if (c->stream) cudaStreamDestroy(c->stream);
        if (c->base) cudaFree(c->base);
        delete c;
    }
    free(be);
}

static st_backend_ops make_ops(void) {
    st_backend_ops o = {};
    o.name = "cuda";
    o.free = be_free;
    o.alloc = be_alloc;
    o.dealloc = be_dealloc;
    o.memset0 = be_memset0;
    o.copy_to_device = be_copy_to_device;
    o.copy_to_host = be_copy_to_host;
    o.synchronize = be_synchronize;
    o.host_alloc = be_host_alloc;
    o.host_free = be_host_free;
    o.copy_async = be_copy_async;
    o.copy_sync = be_copy_sync;
    o.copy_query = be_copy_query;
    o.matmul_forward = be_matmul_forward;
    o.matmul_backward = be_matmul_backward;
    o.encoder_forward = be_encoder_forward;
    o.encoder_backward = be_encoder_backward;
    o.embedding_forward = be_embedding_forward;
    o.embedding_backward = be_embedding_backward;
    o.layernorm_forward = be_layernorm_forward;
    o.layernorm_backward = be_layernorm_backward;
    o.gelu_forward = be_gelu_forward;
    o.gelu_backward = be_gelu_backward;
    o.residual_forward = be_residual_forward;
    o.axpy_rows = be_axpy_rows;
    o.residual_backward = be_residual_backward;
    o.rmsnorm_forward = be_rmsnorm_forward;
    o.rmsnorm_backward = be_rmsnorm_backward;
    o.swiglu_forward = be_swiglu_forward;
    o.swiglu_backward = be_swiglu_backward;
    o.rope_forward = be_rope_forward;
    o.rope_backward = be_rope_backward;
    o.to_bf16 = be_to_bf16;
    o.from_bf16 = be_from_bf16;
    o.crossentropy_forward_backward = be_crossentropy;
    o.softmax_chunk_init = be_softmax_chunk_init;
    o.softmax_chunk_stats = be_softmax_chunk_stats;
    o.softmax_chunk_grad = be_softmax_chunk_grad;
    o.attention_forward = be_attention_forward;
    o.attention_backward = be_attention_backward;
    o.attention_gqa_forward = be_attention_gqa_forward;
    o.attention_gqa_backward = be_attention_gqa_backward;
    o.attention_doc_forward = be_attention_doc_forward;
    o.attention_doc_backward = be_attention_doc_backward;
    o.attention_gqa_doc_forward = be_attention_gqa_doc_forward;
    o.attention_gqa_doc_backward = be_attention_gqa_doc_backward;
    o.memory = be_memory;
    o.poet_cayley_forward = be_poet_cayley_forward;
    o.poet_cayley_backward = be_poet_cayley_backward;
    o.poet_apply_forward = be_poet_apply_forward;
    o.poet_apply_backward = be_poet_apply_backward;
    o.poet_permute = be_poet_permute;
    o.host_register = be_host_register;
    o.host_unregister = be_host_unregister;
    o.timer_mark = be_timer_mark;
    o.timer_seconds = be_timer_seconds;
    o.matmul_backward_write = be_matmul_backward_write;
    o.gelu_backward_write = be_gelu_backward_write;
    o.attention_backward_write = be_attention_backward_write;
    return o;
}
static const st_backend_ops cuda_ops = make_ops();

extern "C" st_status st_backend_cuda_create(st_backend **out, int device, size_t arena_bytes, st_err *err) {
    *out = nullptr;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) count = 0;
    if (e != cudaSuccess || device < 0 || device >= count) {
        char give[64] = "give device cpu"; /* the devices there are, as the key takes them */
        if (count == 1) snprintf(give, sizeof give, "give device cuda:0 or cpu");
        if (count > 1) snprintf(give, sizeof give, "give device cuda:0 to cuda:%d, or cpu", count - 1);
        const char *vis = getenv("CUDA_VISIBLE_DEVICES"); /* what hides devices from the count */
        return st_errf(err, ST_ERR_UNSUPPORTED, "cuda backend: no CUDA device %d (%d found%s%s%s%s): %s", device,
                       count, e != cudaSuccess ? ": " : "", e != cudaSuccess ? cudaGetErrorString(e) : "",
                       vis ? "; CUDA_VISIBLE_DEVICES=" : "", vis ? vis : "", give);
    }
    if ((e = cudaSetDevice(device)) != cudaSuccess)
        return st_errf(err, ST_ERR_UNSUPPORTED, "cuda backend: cudaSetDevice(%d): %s", device, cudaGetErrorString(e));
    st_backend *be = (st_backend *)calloc(1, sizeof *be);
    cuda_ctx *c = new (std::nothrow) cuda_ctx();
    if (!be || !c) {
        free(be);
        delete c;
        return st_errf(err, ST_ERR_NOMEM, "cuda backend: out of host memory");
    }
    be->ops = &cuda_ops, be->ctx = c, c->device = device;
    if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        be_free(be);
        return st_errf(err, ST_ERR_UNSUPPORTED, "cuda backend: cudaStreamCreate: %s", cudaGetErrorString(e));
    }
    /* the copy streams and their events (blocking sync: a waiting host thread sleeps, so the
     * optimizer's thread keeps its core while it waits for a gradient) */
    for (int d = 0; d < 2 && e == cudaSuccess; d++) {
        e = cudaStreamCreateWithFlags(&c->copy_stream[d], cudaStreamNonBlocking);
        for (int i = 0; i < CU_COPY_RING && e == cudaSuccess; i++)
            e = cudaEventCreateWithFlags(&c->copy_ev[d][i], cudaEventDisableTiming | cudaEventBlockingSync);
    }
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->compute_mark, cudaEventDisableTiming);
    for (int i = 0; i < CU_TIMER_RING && e == cudaSuccess; i++) /* timing events; a waiting thread sleeps */
        e = cudaEventCreateWithFlags(&c->timer_ev[i], cudaEventBlockingSync);
    if (e != cudaSuccess) {
        be_free(be);
        return st_errf(err, ST_ERR_UNSUPPORTED, "cuda backend: the copy streams and their events: %s",
                       cudaGetErrorString(e));
    }
    if (!(c->mm = new (std::nothrow) CuLtMatmul())) {
        be_free(be);
        return st_errf(err, ST_ERR_NOMEM, "cuda backend: out of host memory");
    }
    cublasStatus_t bs = cublasLtCreate(&c->mm->lt);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        be_free(be);
        return st_errf(err, ST_ERR_UNSUPPORTED, "cuda backend: cublasLtCreate: %s", cublasGetStatusString(bs));
    }
    /* the arena must leave room beside it: CUDA loads kernels lazily (ours, cuBLASLt's) into
     * device memory at their first launch, and the runtime allocates for itself; an arena
     * of nearly all the free memory fails there, at a later op, not here */
    size_t free0 = 0, total0 = 0;
    if (cudaMemGetInfo(&free0, &total0) == cudaSuccess && (free0 < CU_DEVICE_HEADROOM ||
                                                          arena_bytes > free0 - CU_DEVICE_HEADROOM)) {
        size_t most = free0 > CU_DEVICE_HEADROOM ? free0 - CU_DEVICE_HEADROOM : 0;
        be_free(be);
        return st_errf(err, ST_ERR_NOMEM,
                       "cuda backend: a device budget of %zu bytes leaves less than the %zu bytes that lazily loaded "
                       "kernels and the CUDA runtime need beside it on device %d (%zu of %zu bytes free): give a "
                       "device budget of at most %zu bytes",
                       arena_bytes, CU_DEVICE_HEADROOM, device, free0, total0, most);
    }
    if ((e = cudaMalloc((void **)&c->base, arena_bytes)) != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        cudaGetLastError(); /* the failed cudaMalloc is reported here, not by the next op */
        cudaMemGetInfo(&free_b, &total_b);
        be_free(be);
        return st_errf(err, ST_ERR_NOMEM,
                       "cuda backend: a device arena of %zu bytes does not fit on device %d (%zu of %zu bytes free): "
                       "give a smaller device budget",
                       arena_bytes, device, free_b, total_b);
    }
    /* STRATA_CUDA_ATTENTION=auto|own|cudnn: the attention's starting mode (as
     * st_backend_cuda_set_attention), so that a run can be kept off cuDNN without a key;
     * tests/gpu/run.sh sets it to own for its later stages where the probe found cuDNN's
     * attention failing */
    if (const char *am = getenv("STRATA_CUDA_ATTENTION")) {
        st_cuda_attention mode = !strcmp(am, "auto") ? ST_CUDA_ATTENTION_AUTO
                                 : !strcmp(am, "own") ? ST_CUDA_ATTENTION_OWN
                                 : !strcmp(am, "cudnn") ? ST_CUDA_ATTENTION_CUDNN : (st_cuda_attention)-1;
        st_status as;
        if ((int)mode < 0) {
            be_free(be);
            return st_errf(err, ST_ERR_INVALID, "cuda backend: STRATA_CUDA_ATTENTION='%s' is not auto, own or cudnn "
                           "(or unset it)", am);
        }
        if ((as = st_backend_cuda_set_attention(be, mode, err)) != ST_OK) {
            be_free(be);
            return as;
        }
    }
    c->arena.reset(arena_bytes);
    /* cuBLASLt's workspace, carved once: the arena is all the device memory the ops use */
    size_t ws_off = 0;
    c->mm->ws_bytes = st_backend_cuda_matmul_workspace(arena_bytes);
    if (c->mm->ws_bytes && c->arena.alloc(c->mm->ws_bytes, &ws_off))
        c->mm->ws = c->base + ws_off;
    else
        c->mm->ws_bytes = 0;
    *out = be;
    return ST_OK;
}

extern "C" st_status st_backend_cuda_status(st_backend *be, st_err *err) {
    cuda_ctx *c = ctx_of(be);
    note(c, cudaStreamSynchronize(c->stream), "synchronize");
    std::lock_guard<std::mutex> g(c->err_mu);
    if (!failed(c)) return ST_OK;
    if (c->first_blas != CUBLAS_STATUS_SUCCESS)
        return st_errf(err, ST_ERR_INVALID, "cuda backend: %s: cuBLAS: %s", c->first_op,
                       cublasGetStatusString(c->first_blas));
    if (async_fault(c->first))
        return st_errf(err, ST_ERR_INVALID,
                       "cuda backend: an asynchronous fault on device %d, %s (%s), surfaced at %s: a kernel, copy or "
                       "cuBLAS call queued before it raised it (the last op queued on the compute stream was %s); "
                       "the device is unusable until the process ends; rerun under compute-sanitizer or with "
                       "CUDA_LAUNCH_BLOCKING=1 to name the op",
                       c->device, cudaGetErrorName(c->first), cudaGetErrorString(c->first), c->first_op,
                       c->first_after);
    return st_errf(err, c->first == cudaErrorMemoryAllocation ? ST_ERR_NOMEM : ST_ERR_INVALID,
                   "cuda backend: %s: %s (%s)", c->first_op, cudaGetErrorName(c->first), cudaGetErrorString(c->first));
}
