/* backend_cuda_emu.cpp - the CUDA backend (src/backend/cuda/backend_cuda.cu) compiled by
 * g++ as C++ for test_cuda_backend_emu: with -DST_CUDA_EMU and tests/cuda_emu first on the
 * include path, its <cuda_runtime.h> and <cublas_v2.h> are the emulations here (host
 * memory, synchronous streams, cuBLAS as OpenBLAS) and its kernels run under cuda_emu.h.
 * tests/CMakeLists.txt renames st_backend_cuda_create/_status for this build
 * (st_backend_cuda_emu_*), so it never meets the nvcc-built backend inside libstrata. */
#include "backend/cuda/backend_cuda.cu"
