/* cublasLt.h (tests/cuda_emu) - the cuBLASLt calls of the CUDA backend's matmul
 * (src/backend/cuda/cuda_matmul.cuh) mapped to OpenBLAS, for the emulated tests only
 * (test_cuda_backend_emu, test_cuda_emu_model; issue 15). C++ linkage.
 *
 * D = alpha op(A) op(B) + beta C (+ bias per row of D in CUBLASLT_EPILOGUE_BIAS), fp32
 * in and out, column-major as cuBLASLt, computed by cblas_sgemm after rounding A and B
 * as the compute type lets the tensor cores: CUBLAS_COMPUTE_32F_FAST_TF32 to 10-bit
 * mantissas (round to nearest even), CUBLAS_COMPUTE_32F_FAST_16BF to bf16
 * (st_f32_to_bf16), so that the emulated tf32 and bf16 results differ from fp32 as a
 * GPU's do; the products of rounded inputs are exact in fp32 and summed in fp32.
 *
 * What it checks, as cuBLASLt would or worse: attribute sizes; layouts that agree with
 * op(A) (m, k), op(B) (k, n), C = D (m, n) and ld >= rows; fp32 types only; a heuristic
 * result's algorithm needs a workspace (min(1 MiB, the preference's maximum)) that the
 * call must pass, lying inside one cudaMalloc block, and the emulated algorithm writes
 * garbage over it, so a workspace that overlaps live data shows as wrong results; the
 * pointers must be as aligned as the preference said (the default, as cuBLASLt's, is
 * 256 bytes). Synchronous, as the rest of the emulation.
 *
 * Where the real library's answer depends on things the emulation cannot know, the
 * strictest answer it is documented to give (issue 30):
 *   - The bias epilogue is offered whatever the bias pointer's alignment (the preferences
 *     have no attribute for it, so the heuristic may pick a kernel that assumes 16
 *     bytes), and the matmul FAULTS on a bias under 16-byte alignment: it returns success,
 *     as a launch does, and the emulated context gets a sticky cudaErrorMisalignedAddress
 *     (cuda_runtime.h), which every later synchronisation returns.
 *   - The reduced-precision compute types (CUBLAS_COMPUTE_32F_FAST_TF32, _FAST_16BF) run
 *     on tensor-core kernels, which cuBLAS documents for leading dimensions and pointers
 *     that are multiples of 16 bytes: for any other leading dimension, or an alignment
 *     preference under 16 bytes, the heuristic offers no algorithm (NOT_SUPPORTED, no
 *     result), so the backend must answer for it (it falls back to fp32, counted). */
#ifndef STRATA_CUDA_EMU_CUBLASLT_H
#define STRATA_CUDA_EMU_CUBLASLT_H

#include <cblas.h>
#include <stdint.h>
#include <string.h>

#include <vector>

#include "cublas_v2.h"
#include "cuda_runtime.h"
extern "C" {
#include "strata/tensor.h"
}

#ifndef ST_EMU_CUBLASLT_TYPES
#define ST_EMU_CUBLASLT_TYPES
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16BF = 14 };
typedef cudaDataType_t cudaDataType;
enum cublasComputeType_t {
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_FAST_16BF = 75,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
};
#endif

enum cublasLtMatmulDescAttributes_t {
    CUBLASLT_MATMUL_DESC_TRANSA = 3,
    CUBLASLT_MATMUL_DESC_TRANSB = 4,
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
    CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
};
enum cublasLtEpilogue_t { CUBLASLT_EPILOGUE_DEFAULT = 1, CUBLASLT_EPILOGUE_BIAS = 4 };
enum cublasLtMatmulPreferenceAttributes_t {
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
};

struct st_emu_lt {
    int live;
};
typedef st_emu_lt *cublasLtHandle_t;
struct st_emu_lt_desc {
    cublasComputeType_t compute;
    int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
    uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const void *bias = nullptr;
};
typedef st_emu_lt_desc *cublasLtMatmulDesc_t;
struct st_emu_lt_layout {
    cudaDataType type;
    uint64_t rows, cols;
    int64_t ld;
};
typedef st_emu_lt_layout *cublasLtMatrixLayout_t;
struct st_emu_lt_pref {
    uint64_t max_ws = 0;
    uint32_t align[4] = {256, 256, 256, 256}; /* A, B, C, D: cuBLASLt's default */
};
typedef st_emu_lt_pref *cublasLtMatmulPreference_t;
typedef struct {
    uint64_t data[8]; /* [0] 0x1e, the emulated algorithm; [1] its workspace bytes; [2..5] alignments */
} cublasLtMatmulAlgo_t;
typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

inline cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    *h = new st_emu_lt{1};
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute,
                                               cudaDataType_t scale) {
    if (scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    *d = new st_emu_lt_desc();
    (*d)->compute = compute;
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                                     const void *buf, size_t bytes) {
    if (!d || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB:
        if (bytes != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(attr == CUBLASLT_MATMUL_DESC_TRANSA ? &d->transa : &d->transb, buf, bytes);
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
        if (bytes != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&d->epilogue, buf, bytes);
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        if (bytes != sizeof(void *)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&d->bias, buf, bytes);
        return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_INVALID_VALUE;
}
inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows,
                                                 uint64_t cols, int64_t ld) {
    *l = new st_emu_lt_layout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    *p = new st_emu_lt_pref();
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                           cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                           size_t bytes) {
    if (!p || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
        if (bytes != sizeof(uint64_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&p->max_ws, buf, bytes);
        return CUBLAS_STATUS_SUCCESS;
    }
    int i = (int)attr - (int)CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES;
    if (i < 0 || i > 3 || bytes != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&p->align[i], buf, bytes);
    return CUBLAS_STATUS_SUCCESS;
}

namespace st_emu {
/* the problem a descriptor and its layouts describe; false if they disagree */
inline bool lt_shape(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                     cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd, uint64_t *m, uint64_t *n, uint64_t *k) {
    if (!d || !a || !b || !c || !dd) return false;
    if (a->type != CUDA_R_32F || b->type != CUDA_R_32F || c->type != CUDA_R_32F || dd->type != CUDA_R_32F)
        return false;
    *m = d->transa == CUBLAS_OP_N ? a->rows : a->cols, *k = d->transa == CUBLAS_OP_N ? a->cols : a->rows;
    uint64_t kb = d->transb == CUBLAS_OP_N ? b->rows : b->cols;
    *n = d->transb == CUBLAS_OP_N ? b->cols : b->rows;
    for (cublasLtMatrixLayout_t l : {a, b, c, dd})
        if (l->ld < (int64_t)(l->rows > 1 ? l->rows : 1)) return false;
    return kb == *k && c->rows == *m && c->cols == *n && dd->rows == *m && dd->cols == *n && dd->ld == c->ld;
}
/* x rounded as the compute type rounds a tensor core's inputs */
inline float lt_round(float x, cublasComputeType_t ct) {
    if (ct == CUBLAS_COMPUTE_32F_FAST_16BF) return st_bf16_to_f32(st_f32_to_bf16(x));
    if (ct == CUBLAS_COMPUTE_32F_FAST_TF32) {
        uint32_t u;
        memcpy(&u, &x, 4);
        if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu; /* nearest even */
        memcpy(&x, &u, 4);
    }
    return x;
}
/* the (ld, cols) column-major extent of a layout, rounded for ct (the whole extent,
 * so the leading dimension means what it meant) */
inline std::vector<float> lt_rounded(const float *p, cublasLtMatrixLayout_t l, cublasComputeType_t ct) {
    size_t n = l->cols ? (size_t)l->ld * (l->cols - 1) + l->rows : 0;
    std::vector<float> v(p, p + n);
    for (float &x : v) x = lt_round(x, ct);
    return v;
}
inline unsigned lt_aligned(const void *p) {
    unsigned al = 256;
    while (al > 1 && (uintptr_t)p % al) al /= 2;
    return al;
}
} // namespace st_emu

inline cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
                                                     cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                     cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd,
                                                     cublasLtMatmulPreference_t pref, int requested,
                                                     cublasLtMatmulHeuristicResult_t results[], int *returned) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (requested <= 0 || !pref || !returned) return CUBLAS_STATUS_INVALID_VALUE;
    *returned = 0;
    uint64_t m, n, k;
    if (!st_emu::lt_shape(d, a, b, c, dd, &m, &n, &k)) return CUBLAS_STATUS_INVALID_VALUE;
    if (d->compute != CUBLAS_COMPUTE_32F && d->compute != CUBLAS_COMPUTE_32F_FAST_TF32 &&
        d->compute != CUBLAS_COMPUTE_32F_FAST_16BF)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (d->epilogue != CUBLASLT_EPILOGUE_DEFAULT && d->epilogue != CUBLASLT_EPILOGUE_BIAS)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    /* tensor-core compute types: leading dimensions and alignments of 16 bytes, or nothing */
    if (d->compute != CUBLAS_COMPUTE_32F) {
        bool ok = true;
        for (cublasLtMatrixLayout_t l : {a, b, c, dd}) ok &= l->ld * 4 % 16 == 0;
        for (int i = 0; i < 4; i++) ok &= pref->align[i] >= 16;
        if (!ok) return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    cublasLtMatmulHeuristicResult_t r = {};
    uint64_t ws = (uint64_t)1 << 20;
    r.workspaceSize = ws < pref->max_ws ? ws : pref->max_ws;
    r.algo.data[0] = 0x1e, r.algo.data[1] = r.workspaceSize;
    for (int i = 0; i < 4; i++) r.algo.data[2 + i] = pref->align[i];
    r.state = CUBLAS_STATUS_SUCCESS, r.wavesCount = 1.0f;
    results[0] = r, *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *A,
                                     cublasLtMatrixLayout_t a, const void *B, cublasLtMatrixLayout_t b,
                                     const void *beta, const void *C, cublasLtMatrixLayout_t c, void *D,
                                     cublasLtMatrixLayout_t dd, const cublasLtMatmulAlgo_t *algo, void *ws,
                                     size_t ws_bytes, cudaStream_t stream) {
    (void)stream; /* synchronous */
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    uint64_t m, n, k;
    if (!st_emu::lt_shape(d, a, b, c, dd, &m, &n, &k) || !algo || algo->data[0] != 0x1e || !alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    /* the workspace the algorithm needs, inside device memory; scribbled over */
    size_t need = (size_t)algo->data[1];
    if (ws_bytes < need || (need && (!ws || !st_emu::on_device(ws, need)))) return CUBLAS_STATUS_INVALID_VALUE;
    if (need) memset(ws, 0xa5, need);
    /* the alignments the heuristic was promised */
    const void *ptrs[4] = {A, B, C, D};
    for (int i = 0; i < 4; i++)
        if (st_emu::lt_aligned(ptrs[i]) < algo->data[2 + i]) return CUBLAS_STATUS_INVALID_VALUE;
    if (d->epilogue == CUBLASLT_EPILOGUE_BIAS && !d->bias) return CUBLAS_STATUS_INVALID_VALUE;
    if (st_emu::sticky()) return CUBLAS_STATUS_EXECUTION_FAILED;
    /* the kernel's vector loads of the bias: a misaligned address, found on the device */
    if (d->epilogue == CUBLASLT_EPILOGUE_BIAS && st_emu::lt_aligned(d->bias) < 16) {
        st_emu::fault(cudaErrorMisalignedAddress);
        return CUBLAS_STATUS_SUCCESS;
    }
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    float *Dp = (float *)D;
    const float *Cp = (const float *)C;
    float be = *(const float *)beta;
    if (Cp != Dp && be != 0.0f)
        for (uint64_t j = 0; j < n; j++) memmove(Dp + j * dd->ld, Cp + j * c->ld, m * sizeof(float));
    std::vector<float> ra = st_emu::lt_rounded((const float *)A, a, d->compute);
    std::vector<float> rb = st_emu::lt_rounded((const float *)B, b, d->compute);
    cblas_sgemm(CblasColMajor, d->transa == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                d->transb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, (int)m, (int)n, (int)k,
                *(const float *)alpha, ra.data(), (int)a->ld, rb.data(), (int)b->ld, be, Dp, (int)dd->ld);
    if (d->epilogue == CUBLASLT_EPILOGUE_BIAS) {
        const float *bias = (const float *)d->bias;
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t i = 0; i < m; i++) Dp[j * dd->ld + i] += bias[i];
    }
    return CUBLAS_STATUS_SUCCESS;
}

#endif
