/* cublas_v2.h (tests/cuda_emu) - the cuBLAS calls of the CUDA backend
 * (src/backend/cuda/backend_cuda.cu) mapped to OpenBLAS, for the emulated backend test
 * only (test_cuda_backend_emu, issue 15). cuBLAS is column-major, so cublasSgemm becomes
 * cblas_sgemm(CblasColMajor, ...) with the same arguments: the backend's row-major
 * bookkeeping (which operand first, which transposed, which leading dimension) is what
 * the test then checks against the CPU backend. Alpha and beta are host pointers
 * (CUBLAS_POINTER_MODE_HOST, cuBLAS's default, the only mode emulated). C++ linkage. */
#ifndef STRATA_CUDA_EMU_CUBLAS_H
#define STRATA_CUDA_EMU_CUBLAS_H

#include <cblas.h>

#include "cuda_runtime.h"

enum cublasStatus_t {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 };
enum cublasMath_t { CUBLAS_DEFAULT_MATH = 0, CUBLAS_PEDANTIC_MATH = 2 };
struct st_emu_cublas {
    cudaStream_t stream;
};
typedef st_emu_cublas *cublasHandle_t;

inline const char *cublasGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    }
    return "unknown error";
}
inline const char *cublasGetStatusName(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}
inline cublasStatus_t cublasCreate(cublasHandle_t *h) {
    *h = new st_emu_cublas{nullptr};
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasDestroy(cublasHandle_t h) {
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m) {
    (void)m;
    return h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

/* C (m, n) = alpha op(A) (m, k) op(B) (k, n) + beta C, column-major, as cuBLAS; its
 * argument checks (cuBLAS returns INVALID_VALUE for these, computing nothing) */
inline cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                  const float *alpha, const float *A, int lda, const float *B, int ldb,
                                  const float *beta, float *C, int ldc) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    int rows_a = ta == CUBLAS_OP_N ? m : k, rows_b = tb == CUBLAS_OP_N ? k : n;
    if (m < 0 || n < 0 || k < 0 || lda < (rows_a > 1 ? rows_a : 1) || ldb < (rows_b > 1 ? rows_b : 1) ||
        ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    cblas_sgemm(CblasColMajor, ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, m, n, k, *alpha, A, lda, B, ldb, *beta, C, ldc);
    return CUBLAS_STATUS_SUCCESS;
}

#endif
