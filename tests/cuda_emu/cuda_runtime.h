/* cuda_runtime.h (tests/cuda_emu) - the part of the CUDA runtime API that the CUDA backend
 * (src/backend/cuda/backend_cuda.cu) calls, emulated on the host for tests only, so that
 * the backend itself - its vtable glue, arena, copies and launches - runs without a GPU
 * (test_cuda_backend_emu, issue 15). Found before the toolkit's header because
 * tests/cuda_emu is an -I directory of that test and the toolkit's is -isystem.
 *
 * Device memory is host memory (cudaMalloc is calloc'd, so a read of memory the backend
 * never wrote is deterministic); every copy, whatever its kind, is a memcpy; streams and
 * events exist as handles but everything is synchronous (a launch finishes before it
 * returns, cuda_emu.h), so ordering holds trivially. What it checks that memcpy would
 * not: cudaMemset and a copy of kind HostToDevice/DeviceToHost/DeviceToDevice must stay
 * inside one live cudaMalloc block on their device side (cudaErrorInvalidValue
 * otherwise, kept for cudaGetLastError as the runtime does), cudaFree of a pointer that
 * cudaMalloc did not return fails, and a cudaMalloc over the emulated device's memory
 * (ST_EMU_DEVICE_BYTES, 1 GiB) fails with cudaErrorMemoryAllocation. One device.
 * C++ linkage, so these never clash with the real cudart the test also links. */
#ifndef STRATA_CUDA_EMU_RUNTIME_H
#define STRATA_CUDA_EMU_RUNTIME_H

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "cuda_emu.h"

#ifndef ST_EMU_DEVICE_BYTES
#define ST_EMU_DEVICE_BYTES ((size_t)1 << 30)
#endif

enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
};
typedef cudaError_t cudaError;
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};
#define cudaStreamDefault 0x0u
#define cudaStreamNonBlocking 0x1u
#define cudaEventDefault 0x0u
#define cudaEventDisableTiming 0x2u
#define cudaHostAllocDefault 0x0u
typedef struct st_emu_event *cudaEvent_t;

namespace st_emu {
struct Runtime {
    std::mutex mu;
    std::map<const char *, size_t> dev; /* live cudaMalloc blocks: base -> bytes */
    size_t dev_used = 0;
    cudaError_t last = cudaSuccess;     /* what cudaGetLastError returns and clears */
    int device = 0;
};
inline Runtime &rt() {
    static Runtime r;
    return r;
}
inline cudaError_t ret(cudaError_t e) {
    if (e != cudaSuccess) rt().last = e;
    return e;
}
/* true if [p, p + n) lies inside one live cudaMalloc block */
inline bool on_device(const void *p, size_t n) {
    Runtime &r = rt();
    std::lock_guard<std::mutex> g(r.mu);
    auto it = r.dev.upper_bound((const char *)p);
    if (it == r.dev.begin()) return false;
    --it;
    const char *q = (const char *)p;
    return q >= it->first && q + n <= it->first + it->second;
}
} // namespace st_emu

inline const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    }
    return "cudaErrorUnknown";
}
inline const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    }
    return "unknown error";
}
inline cudaError_t cudaGetLastError(void) {
    cudaError_t e = st_emu::rt().last;
    st_emu::rt().last = cudaSuccess;
    return e;
}
inline cudaError_t cudaPeekAtLastError(void) { return st_emu::rt().last; }

inline cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int d) {
    if (d != 0) return st_emu::ret(cudaErrorInvalidDevice);
    st_emu::rt().device = d;
    return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int *d) {
    *d = st_emu::rt().device;
    return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
inline cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b) {
    *total_b = ST_EMU_DEVICE_BYTES;
    *free_b = ST_EMU_DEVICE_BYTES - st_emu::rt().dev_used;
    return cudaSuccess;
}

/* ---------------------------------------------------------------- memory */
inline cudaError_t cudaMalloc(void **p, size_t bytes) {
    st_emu::Runtime &r = st_emu::rt();
    *p = nullptr;
    if (bytes > ST_EMU_DEVICE_BYTES - r.dev_used) return st_emu::ret(cudaErrorMemoryAllocation);
    char *m = (char *)calloc(1, bytes ? bytes : 1);
    if (!m) return st_emu::ret(cudaErrorMemoryAllocation);
    std::lock_guard<std::mutex> g(r.mu);
    r.dev[m] = bytes, r.dev_used += bytes;
    *p = m;
    return cudaSuccess;
}
inline cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    st_emu::Runtime &r = st_emu::rt();
    std::lock_guard<std::mutex> g(r.mu);
    auto it = r.dev.find((const char *)p);
    if (it == r.dev.end()) return st_emu::ret(cudaErrorInvalidValue);
    r.dev_used -= it->second;
    r.dev.erase(it);
    free(p);
    return cudaSuccess;
}
inline cudaError_t cudaMallocHost(void **p, size_t bytes) {
    *p = malloc(bytes ? bytes : 1);
    return *p ? cudaSuccess : st_emu::ret(cudaErrorMemoryAllocation);
}
inline cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags) {
    (void)flags;
    return cudaMallocHost(p, bytes);
}
inline cudaError_t cudaFreeHost(void *p) {
    free(p);
    return cudaSuccess;
}
inline cudaError_t cudaMemset(void *p, int v, size_t bytes) {
    if (bytes && !st_emu::on_device(p, bytes)) return st_emu::ret(cudaErrorInvalidValue);
    memset(p, v, bytes);
    return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s = nullptr) {
    (void)s;
    return cudaMemset(p, v, bytes);
}
inline cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    if (bytes && ((src_dev && !st_emu::on_device(src, bytes)) || (dst_dev && !st_emu::on_device(dst, bytes))))
        return st_emu::ret(cudaErrorInvalidValue);
    if (bytes) memmove(dst, src, bytes);
    return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                                   cudaStream_t s = nullptr) {
    (void)s;
    return cudaMemcpy(dst, src, bytes, kind);
}

/* ---------------------------------------------------------------- streams and events */
struct st_emu_stream {
    int id;
};
struct st_emu_event {
    int id;
};
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    (void)flags;
    *s = new st_emu_stream{1};
    return cudaSuccess;
}
inline cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
    delete s;
    return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    (void)s;
    return cudaSuccess;
}
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    (void)flags;
    *e = new st_emu_event{1};
    return cudaSuccess;
}
inline cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;
    return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr) {
    (void)s;
    return e ? cudaSuccess : st_emu::ret(cudaErrorInvalidResourceHandle);
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    return e ? cudaSuccess : st_emu::ret(cudaErrorInvalidResourceHandle);
}
inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0) {
    (void)s, (void)flags;
    return e ? cudaSuccess : st_emu::ret(cudaErrorInvalidResourceHandle);
}

#endif
