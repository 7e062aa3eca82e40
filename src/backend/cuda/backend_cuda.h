/* backend_cuda.h - the CUDA backend's C interface inside libstrata (built with
 * -DSTRATA_CUDA=ON; STRATA_HAVE_CUDA is defined then). Internal: not yet in
 * include/strata/backend.h, since nothing above the backend uses it yet (issue 15). */
#ifndef STRATA_BACKEND_CUDA_H
#define STRATA_BACKEND_CUDA_H

#include "strata/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The CUDA runtime and cuBLAS versions this library is linked against (1000 * major +
 * 10 * minor, as cudaRuntimeGetVersion reports), read without touching a device. */
st_status st_cuda_versions(int *runtime, int *cublas, st_err *err);

#ifdef __cplusplus
}
#endif
#endif
