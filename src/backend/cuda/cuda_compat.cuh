/* cuda_compat.cuh - what the kernel headers (kernels_*.cuh) take from CUDA, so that one
 * kernel source compiles two ways: under nvcc into the CUDA backend, and under g++ with
 * the tests' emulation of the CUDA execution model (tests/cuda_emu/cuda_emu.h, selected
 * by -DST_CUDA_EMU), where the differential tests run the same kernels on the CPU.
 *
 * Every launch goes through ST_CUDA_LAUNCH(kernel, grid, block, shmem, stream, args...):
 * `kernel<<<grid, block, shmem, stream>>>(args...)` under nvcc, the emulator's launch in
 * the tests. Kernels use static __shared__ memory only (shmem is 0). A kernel name with
 * template arguments is one macro argument only with a single template argument, as
 * kernels here have. */
#ifndef STRATA_CUDA_COMPAT_CUH
#define STRATA_CUDA_COMPAT_CUH

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#define ST_CUDA_LAUNCH(kernel, grid, block, shmem, stream, ...) \
    kernel<<<(grid), (block), (shmem), (stream)>>>(__VA_ARGS__)
#elif defined(ST_CUDA_EMU)
#include "cuda_emu.h" /* defines ST_CUDA_LAUNCH */
#else
#error "cuda_compat.cuh: compile with nvcc, or with -DST_CUDA_EMU and tests/cuda_emu on the include path"
#endif

#include <stddef.h>
#include <stdint.h>

/* The most blocks a grid-stride kernel is launched with; the kernels loop over what is
 * left. The emulated tests set it to 4, so that every kernel's loop runs more than once. */
#ifndef ST_CUDA_GRID_CAP
#define ST_CUDA_GRID_CAP 4096
#endif

/* Blocks for n items at `per_block` items a block, at least 1, at most ST_CUDA_GRID_CAP. */
static inline unsigned st_cuda_grid(size_t n, unsigned per_block) {
    size_t g = (n + per_block - 1) / per_block;
    return g < 1 ? 1u : g > ST_CUDA_GRID_CAP ? (unsigned)ST_CUDA_GRID_CAP : (unsigned)g;
}

#endif
