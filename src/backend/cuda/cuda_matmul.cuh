/* cuda_matmul.cuh - the CUDA backend's matmuls through cuBLASLt (issue 15): one
 * row-major gemm, C (M, N) = op(A) (M, K) op(B) (K, N) + beta C (+ a bias row), in the
 * precision the backend was set to (st_backend_cuda_set_matmul), with the algorithm
 * chosen by cuBLASLt's heuristic once per shape and kept in a small table, and one
 * workspace carved from the device arena when the backend is created, so that the
 * arena (the device budget) is all the device memory the backend's work uses.
 *
 * Row-major to cuBLASLt's column-major as mm_gemm did for cublasSgemm: a row-major
 * (r, c) matrix with leading dimension ld reads as its column-major (c, r) transpose,
 * so C^T (N, M) = op(B)^T (N, K) op(A)^T (K, M): cuBLASLt's A is our B (transposed if
 * ours is), its B our A, m = N, n = M. A row-major bias of N columns is a bias over
 * cuBLASLt's m rows, which is what CUBLASLT_EPILOGUE_BIAS adds.
 *
 * Included by backend_cuda.cu only (nvcc, or g++ with tests/cuda_emu/cublasLt.h, where
 * cuBLASLt is OpenBLAS with the inputs rounded as the compute type would round them). */
#ifndef STRATA_CUDA_MATMUL_CUH
#define STRATA_CUDA_MATMUL_CUH

#include <cublasLt.h>
#include <cublas_v2.h>
#include <stddef.h>
#include <stdint.h>

/* The cuBLASLt workspace the backend carves from an arena of arena_bytes at creation:
 * 32 MiB (what cuBLASLt's large-K and split-K kernels ask for on sm_90), but at most an
 * eighth of the arena (rounded down to 256 bytes), so that a small test arena still has
 * room; the heuristic only picks algorithms that fit it. */
#define CU_LT_WORKSPACE ((size_t)32 << 20)
static inline size_t cu_lt_workspace_bytes(size_t arena_bytes) {
    size_t w = arena_bytes / 8 / 256 * 256;
    return w < CU_LT_WORKSPACE ? w : CU_LT_WORKSPACE;
}

/* the compute types of the precision modes, indexed by st_matmul_mode (fp32, tf32, bf16) */
static const cublasComputeType_t cu_lt_compute[] = {CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32,
                                                    CUBLAS_COMPUTE_32F_FAST_16BF};

/* What the heuristic's choice depends on: the operation, the shape, the compute type, the
 * epilogue and the pointers' alignments (cuBLASLt assumes 256-byte aligned operands
 * unless told less, and reads the bias pointer's alignment from the descriptor). */
struct CuLtKey {
    int ta, tb, m, n, k, lda, ldb, ldc, compute, bias;
    unsigned align_a, align_b, align_c, align_bias; /* bytes, powers of two up to 256 */
};
struct CuLtEntry {
    CuLtKey key;
    bool found; /* false: the heuristic offered nothing (kept, so it is not asked again) */
    cublasLtMatmulAlgo_t algo;
};
enum { CU_LT_CACHE = 64 }; /* shapes: a model has a handful per layer kind */

struct CuLtMatmul {
    cublasLtHandle_t lt = nullptr;
    void *ws = nullptr; /* inside the device arena */
    size_t ws_bytes = 0;
    CuLtEntry cache[CU_LT_CACHE];
    int n_cache = 0, next = 0; /* entries used; the one to replace next when full */
    /* what ran: gemms per compute type actually used (fp32, tf32, bf16: st_matmul_mode's
     * order), gemms of a reduced mode computed in fp32 for want of an algorithm, and biases
     * added as rows because their pointer was under the epilogue's 16 bytes */
    uint64_t calls[3] = {0, 0, 0}, fallbacks = 0, bias_rows = 0;
};

/* The bias epilogue's kernels load the bias vector 16 bytes at a time; cuBLASLt's
 * preferences have no alignment attribute for it, so the heuristic may pick such a kernel
 * for any pointer and a bias under 16-byte alignment faults on the device ("misaligned
 * address", sticky). The epilogue is used only for an aligned bias. */
#define CU_LT_BIAS_ALIGN 16u

/* the largest power of two (at most 256) dividing the address */
static inline unsigned cu_lt_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    unsigned al = 256;
    while (al > 1 && a % al) al /= 2;
    return al;
}
static inline bool cu_lt_same(const CuLtKey &a, const CuLtKey &b) {
    return a.ta == b.ta && a.tb == b.tb && a.m == b.m && a.n == b.n && a.k == b.k && a.lda == b.lda &&
           a.ldb == b.ldb && a.ldc == b.ldc && a.compute == b.compute && a.bias == b.bias && a.align_a == b.align_a &&
           a.align_b == b.align_b && a.align_c == b.align_c && a.align_bias == b.align_bias;
}

/* The descriptors of one call (created per call: host-only and cheap; the algorithm,
 * which is not, is cached). */
struct CuLtCall {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    ~CuLtCall() {
        if (c) cublasLtMatrixLayoutDestroy(c);
        if (b) cublasLtMatrixLayoutDestroy(b);
        if (a) cublasLtMatrixLayoutDestroy(a);
        if (op) cublasLtMatmulDescDestroy(op);
    }
};

/* Row-major C (M, N) = op(A) (M, K) op(B) (K, N) + beta C, the CPU backend's
 * cblas_sgemm(CblasRowMajor, ...) arguments one for one, on `stream`, with the compute
 * type cu_lt_compute[mode] (alpha is 1). With bias (N
 * floats, or NULL): D = ... + bias added to every row in the epilogue, if cuBLASLt has
 * an algorithm for it; *bias_added says whether it did (if not, nothing was computed and
 * the caller adds the bias itself). CUBLAS_STATUS_NOT_SUPPORTED when the heuristic
 * offers no algorithm at all. */
static cublasStatus_t cu_lt_gemm_mode(CuLtMatmul *L, int mode, cudaStream_t stream, bool ta, bool tb, int M, int N,
                                      int K, const float *A, int lda, const float *B, int ldb, float beta, float *C,
                                      int ldc, const float *bias, bool *bias_added);
/* The gemm below in `mode`; a reduced mode (tf32, bf16) for which cuBLASLt offers no
 * algorithm (tensor-core kernels want leading dimensions and pointers of 16-byte
 * multiples; GPT-2's 50257-row head has neither) runs in fp32 instead, counted in
 * L->fallbacks and said once per shape (the algorithm table remembers it), so a run
 * neither fails nor stays fp32 unseen. */
static cublasStatus_t cu_lt_gemm(CuLtMatmul *L, int mode, cudaStream_t stream, bool ta, bool tb, int M, int N, int K,
                                 const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc,
                                 const float *bias, bool *bias_added) {
    if (bias && cu_lt_align(bias) < CU_LT_BIAS_ALIGN) { /* nothing computed: the caller adds it as rows */
        *bias_added = false;
        L->bias_rows++;
        return CUBLAS_STATUS_SUCCESS;
    }
    cublasStatus_t s = cu_lt_gemm_mode(L, mode, stream, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, bias, bias_added);
    if (bias) { /* no algorithm with the epilogue: the caller adds the rows and calls again without */
        if (s == CUBLAS_STATUS_SUCCESS && *bias_added) L->calls[mode]++;
        return s;
    }
    if (mode != 0 && s == CUBLAS_STATUS_NOT_SUPPORTED) {
        L->fallbacks++, mode = 0;
        s = cu_lt_gemm_mode(L, 0, stream, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, nullptr, nullptr);
    }
    if (s == CUBLAS_STATUS_SUCCESS) L->calls[mode]++;
    return s;
}

static cublasStatus_t cu_lt_gemm_mode(CuLtMatmul *L, int mode, cudaStream_t stream, bool ta, bool tb, int M, int N,
                                      int K, const float *A, int lda, const float *B, int ldb, float beta, float *C,
                                      int ldc, const float *bias, bool *bias_added) {
    if (bias_added) *bias_added = false;
    /* cuBLASLt's operands: its A is our B, its B our A (see the top of this file) */
    cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    int m = N, n = M, k = K;
    CuLtKey key = {opa, opb, m, n, k, ldb, lda, ldc, (int)cu_lt_compute[mode], bias != nullptr,
                   cu_lt_align(B), cu_lt_align(A), cu_lt_align(C), bias ? cu_lt_align(bias) : 256u};
    CuLtCall call;
    cublasStatus_t s = cublasLtMatmulDescCreate(&call.op, cu_lt_compute[mode], CUDA_R_32F);
    int32_t t32a = opa, t32b = opb;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(call.op, CUBLASLT_MATMUL_DESC_TRANSA, &t32a, sizeof t32a);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(call.op, CUBLASLT_MATMUL_DESC_TRANSB, &t32b, sizeof t32b);
    if (s == CUBLAS_STATUS_SUCCESS && bias) {
        uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
        s = cublasLtMatmulDescSetAttribute(call.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasLtMatmulDescSetAttribute(call.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    }
    /* column-major layouts: its A is (m, k) stored as op(A) says, ld = our ldb; its B
     * (k, n), ld = our lda; C and D (m, n), ld = ldc */
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutCreate(&call.a, CUDA_R_32F, opa == CUBLAS_OP_N ? m : k, opa == CUBLAS_OP_N ? k : m,
                                       ldb);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutCreate(&call.b, CUDA_R_32F, opb == CUBLAS_OP_N ? k : n, opb == CUBLAS_OP_N ? n : k,
                                       lda);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&call.c, CUDA_R_32F, m, n, ldc);
    if (s != CUBLAS_STATUS_SUCCESS) return s;

    CuLtEntry *e = nullptr;
    for (int i = 0; i < L->n_cache && !e; i++)
        if (cu_lt_same(L->cache[i].key, key)) e = &L->cache[i];
    if (!e) {
        cublasLtMatmulPreference_t pref = nullptr;
        cublasLtMatmulHeuristicResult_t res = {};
        int found = 0;
        uint64_t ws = L->ws_bytes;
        uint32_t al[4] = {key.align_a, key.align_b, key.align_c, key.align_c};
        s = cublasLtMatmulPreferenceCreate(&pref);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
        const cublasLtMatmulPreferenceAttributes_t al_attr[4] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        for (int i = 0; i < 4 && s == CUBLAS_STATUS_SUCCESS; i++)
            s = cublasLtMatmulPreferenceSetAttribute(pref, al_attr[i], &al[i], sizeof al[i]);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasLtMatmulAlgoGetHeuristic(L->lt, call.op, call.a, call.b, call.c, call.c, pref, 1, &res, &found);
        if (pref) cublasLtMatmulPreferenceDestroy(pref);
        /* NOT_SUPPORTED here means no heuristic for the configuration: no algorithm */
        if (s != CUBLAS_STATUS_SUCCESS && s != CUBLAS_STATUS_NOT_SUPPORTED) return s;
        if (L->n_cache < CU_LT_CACHE)
            e = &L->cache[L->n_cache++];
        else /* full: replace the oldest */
            e = &L->cache[L->next], L->next = (L->next + 1) % CU_LT_CACHE;
        e->key = key;
        e->found = s == CUBLAS_STATUS_SUCCESS && found > 0 && res.state == CUBLAS_STATUS_SUCCESS;
        e->algo = res.algo;
        if (!e->found && mode != 0 && !bias)
            st_log(1, "cuda backend: cuBLASLt has no %s algorithm for the gemm m %d n %d k %d (ld %d %d %d%s): "
                   "computed in fp32 there\n", mode == 1 ? "tf32" : "bf16", m, n, k, ldb, lda, ldc, "");
    }
    if (!e->found) return bias ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED; /* with bias: caller adds it */
    const float one = 1.0f;
    s = cublasLtMatmul(L->lt, call.op, &one, B, call.a, A, call.b, &beta, C, call.c, C, call.c, &e->algo, L->ws,
                       L->ws_bytes, stream);
    if (s == CUBLAS_STATUS_SUCCESS && bias_added) *bias_added = bias != nullptr;
    return s;
}

#endif
