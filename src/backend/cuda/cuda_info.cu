/* cuda_info.cu - what the linked CUDA libraries are, asked without a device: the proof
 * that libstrata links cudart and cuBLAS (test_cuda_build checks it). */
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "backend/cuda/backend_cuda.h"

extern "C" st_status st_cuda_versions(int *runtime, int *cublas, st_err *err) {
    cudaError_t ce = cudaRuntimeGetVersion(runtime);
    if (ce != cudaSuccess)
        return st_errf(err, ST_ERR_UNSUPPORTED, "cudaRuntimeGetVersion: %s", cudaGetErrorString(ce));
    int major = 0, minor = 0;
    if (cublasGetProperty(MAJOR_VERSION, &major) != CUBLAS_STATUS_SUCCESS ||
        cublasGetProperty(MINOR_VERSION, &minor) != CUBLAS_STATUS_SUCCESS)
        return st_errf(err, ST_ERR_UNSUPPORTED, "cublasGetProperty failed: is libcublas installed?");
    *cublas = 1000 * major + 10 * minor;
    return ST_OK;
}
