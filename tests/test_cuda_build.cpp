/* test_cuda_build.cpp - the CUDA build links what it says: the CUDA runtime and cuBLAS
 * that libstrata reports (asked without a device) are the versions of the headers it
 * was compiled against. Runs on any machine of a -DSTRATA_CUDA=ON build, GPU or not. */
#include <cublas_api.h>
#include <cuda_runtime_api.h>

extern "C" {
#include "backend/cuda/backend_cuda.h"
#include "testutil.h"
}

int main(void) {
    st_err err = {};
    int runtime = 0, cublas = 0;
    st_status s = st_cuda_versions(&runtime, &cublas, &err);
    CHECK(s == ST_OK, "st_cuda_versions: %s", err.msg);
    CHECK(runtime / 1000 == CUDART_VERSION / 1000, "cudart %d linked, headers of %d", runtime, CUDART_VERSION);
    CHECK(cublas / 1000 == CUBLAS_VER_MAJOR, "cuBLAS %d linked, headers of major %d", cublas, CUBLAS_VER_MAJOR);
    printf("cudart %d, cuBLAS %d (headers: cudart %d, cuBLAS %d.%d)\n", runtime, cublas, CUDART_VERSION,
           CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR);
    return test_finish("test_cuda_build");
}
