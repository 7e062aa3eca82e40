/* cuda_runtime.h (tests/cuda_emu) - the part of the CUDA runtime API that the CUDA backend
 * (src/backend/cuda/backend_cuda.cu) calls, emulated on the host for tests only, so that
 * the backend itself - its vtable glue, arena, copies and launches - runs without a GPU
 * (test_cuda_backend_emu, issue 15). Found before the toolkit's header because
 * tests/cuda_emu is an -I directory of that test and the toolkit's is -isystem.
 *
 * Device memory is host memory (cudaMalloc is calloc'd, so a read of memory the backend
 * never wrote is deterministic); every copy, whatever its kind, is a memmove. Kernels,
 * memsets and cuBLAS calls run when they are launched (cuda_emu.h). Copies do not:
 * cudaMemcpyAsync on a non-null stream is DEFERRED, queued on its stream and performed,
 * in order per stream, only when something waits for it: cudaEventSynchronize or
 * cudaEventQuery of an event recorded after it on that stream, cudaStreamWaitEvent of such
 * an event by any stream, cudaStreamSynchronize / cudaStreamQuery / cudaStreamDestroy of
 * its stream, cudaDeviceSynchronize, or a cudaMemsetAsync on the same stream (which runs
 * at once, so the stream's earlier copies go first). So a host thread that reads a
 * device-to-host destination, or rewrites a host-to-device source, before it waited for
 * the copy sees what a GPU could show it: stale bytes (test_cuda_emu_stream). A kernel
 * launch does not look at its stream (cuda_emu.h), so a stream that runs kernels must
 * have no copy pending when it launches one: the backend synchronizes its compute
 * stream after each copy it queues there (be_copy), and queues its asynchronous copies
 * on streams of their own (copy_async). cudaEventQuery and cudaStreamQuery therefore
 * never answer cudaErrorNotReady. The last error (cudaGetLastError) is per host thread,
 * as the runtime's.
 *
 * What it checks that memcpy would not: cudaMemset and a copy of kind
 * HostToDevice/DeviceToHost/DeviceToDevice must stay inside one live cudaMalloc block on
 * their device side when queued (cudaErrorInvalidValue otherwise, kept for
 * cudaGetLastError as the runtime does), cudaFree of a pointer that cudaMalloc did not
 * return fails, cudaFreeHost of one that cudaHostAlloc/cudaMallocHost did not return
 * fails, and a cudaMalloc over the emulated device's memory (ST_EMU_DEVICE_BYTES, 1 GiB)
 * fails with cudaErrorMemoryAllocation. One device. C++ linkage, so these never clash
 * with the real cudart the test also links.
 *
 * As strict as the real runtime where the backend could otherwise pass here and fail on a
 * GPU (issue 30):
 *   - Faults are sticky: st_emu::fault (the emulated cuBLASLt's misaligned bias, a test's
 *     injected fault) kills the emulated context, and from then on cudaGetLastError, every
 *     synchronisation, copy, memset and event call returns that error, as a GPU's
 *     asynchronous "misaligned address" or "illegal address" does.
 *   - A cudaMemcpyAsync whose host side is pageable (neither cudaHostAlloc'd nor inside a
 *     cudaHostRegister'd range) is performed, but counted in Runtime::pageable_copies and
 *     _bytes: on a GPU it is staged through the driver's buffers, synchronous for
 *     device-to-host, and overlaps nothing, so a test of the streamed path asserts zero.
 *   - cudaFreeHost or cudaHostUnregister of a block that a queued, not yet performed copy
 *     still touches is counted in Runtime::freed_in_flight (the copy would write freed
 *     memory on a GPU; the backend must wait for its copies first).
 *   - Events remember the host clock when recorded, so cudaEventElapsedTime answers in
 *     milliseconds (events made with cudaEventDisableTiming are refused, as the runtime
 *     refuses them); an event never recorded is refused too. */
#ifndef STRATA_CUDA_EMU_RUNTIME_H
#define STRATA_CUDA_EMU_RUNTIME_H

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <deque>
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
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorHostMemoryAlreadyRegistered = 712,
    cudaErrorHostMemoryNotRegistered = 713,
    cudaErrorMisalignedAddress = 716,
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
#define cudaEventBlockingSync 0x1u
#define cudaEventDisableTiming 0x2u
#define cudaHostAllocDefault 0x0u
#define cudaHostRegisterDefault 0x0u
#define cudaHostRegisterPortable 0x1u
typedef struct st_emu_event *cudaEvent_t;

namespace st_emu {
struct Stream;
struct Runtime {
    std::mutex mu;
    std::map<const char *, size_t> dev; /* live cudaMalloc blocks: base -> bytes */
    size_t dev_used = 0;
    std::map<void *, size_t> pinned;    /* live cudaHostAlloc blocks: base -> bytes (tests read it) */
    std::map<void *, size_t> registered; /* live cudaHostRegister ranges: base -> bytes */
    /* pageable host sides of cudaMemcpyAsync, and blocks freed under a queued copy (see the
     * head of this file); tests read and reset them */
    uint64_t pageable_copies = 0, pageable_bytes = 0, freed_in_flight = 0;
    std::map<int, uint64_t> pageable_by_stream; /* stream id (0: the null stream) -> pageable bytes */
    cudaError_t sticky = cudaSuccess; /* a fault: every later call returns it */
    int device = 0;
    /* streams and their deferred copies: under qmu (recursive: performing a stream's
     * copies may be asked while holding it) */
    std::recursive_mutex qmu;
    std::map<int, Stream *> streams; /* live streams by id (an event names its stream by id) */
    int next_stream = 1;
};
inline Runtime &rt() {
    static Runtime r;
    return r;
}
/* what cudaGetLastError returns and clears: per host thread, as the runtime's */
inline cudaError_t &last_error() {
    static thread_local cudaError_t e = cudaSuccess;
    return e;
}
inline cudaError_t ret(cudaError_t e) {
    if (e != cudaSuccess) last_error() = e;
    return e;
}
/* the emulated context's sticky fault, or cudaSuccess */
inline cudaError_t sticky() { return rt().sticky; }
/* a fault on the device (asynchronous on a GPU): sticky from now on */
inline void fault(cudaError_t e) {
    if (rt().sticky == cudaSuccess) rt().sticky = e;
}
/* true if [p, p + n) lies inside one live page-locked block: cudaHostAlloc'd or registered
 * (under r.mu) */
inline bool page_locked_locked(Runtime &r, const void *p, size_t n) {
    for (std::map<void *, size_t> *m : {&r.pinned, &r.registered}) {
        auto it = m->upper_bound((void *)p);
        if (it == m->begin()) continue;
        --it;
        const char *b = (const char *)it->first, *q = (const char *)p;
        if (q >= b && q + n <= b + it->second) return true;
    }
    return false;
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

/* A stream: its deferred copies, in order. queued and performed count them; an event
 * recorded on the stream remembers `queued` then, and waiting for it performs up to it. */
struct Copy {
    void *dst;
    const void *src;
    size_t bytes;
};
struct Stream {
    int id;
    std::deque<Copy> pending;
    uint64_t queued = 0, performed = 0;
};
/* perform stream `id`'s deferred copies up to number `upto` (all: UINT64_MAX); a stream
 * destroyed since has performed them all */
inline void perform(int id, uint64_t upto) {
    Runtime &r = rt();
    std::lock_guard<std::recursive_mutex> g(r.qmu);
    auto it = r.streams.find(id);
    if (it == r.streams.end()) return;
    Stream *s = it->second;
    while (s->performed < upto && !s->pending.empty()) {
        Copy c = s->pending.front();
        s->pending.pop_front();
        if (c.bytes) memmove(c.dst, c.src, c.bytes);
        s->performed++;
    }
}
} // namespace st_emu

/* the handles: a stream is its id (its state lives in the runtime's table); an event is
 * the stream and copy count it was recorded at (stream 0: nothing to wait for) */
struct st_emu_stream {
    int id;
};
struct st_emu_event {
    int stream;
    uint64_t seq;
    unsigned flags;
    double t; /* the host clock (s) when last recorded; < 0: never recorded */
};

inline const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorHostMemoryAlreadyRegistered: return "cudaErrorHostMemoryAlreadyRegistered";
    case cudaErrorHostMemoryNotRegistered: return "cudaErrorHostMemoryNotRegistered";
    case cudaErrorMisalignedAddress: return "cudaErrorMisalignedAddress";
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
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorHostMemoryAlreadyRegistered: return "part or all of the requested memory range is already mapped";
    case cudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered memory region";
    case cudaErrorMisalignedAddress: return "misaligned address";
    }
    return "unknown error";
}
inline cudaError_t cudaGetLastError(void) {
    if (st_emu::sticky()) return st_emu::sticky(); /* not cleared: the context is lost */
    cudaError_t e = st_emu::last_error();
    st_emu::last_error() = cudaSuccess;
    return e;
}
inline cudaError_t cudaPeekAtLastError(void) { return st_emu::sticky() ? st_emu::sticky() : st_emu::last_error(); }

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
    if (!*p) return st_emu::ret(cudaErrorMemoryAllocation);
    std::lock_guard<std::mutex> g(st_emu::rt().mu);
    st_emu::rt().pinned[*p] = bytes;
    return cudaSuccess;
}
inline cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags) {
    (void)flags;
    return cudaMallocHost(p, bytes);
}
namespace st_emu {
/* whether a queued, not yet performed copy touches the host block [p, p + n) */
inline bool copy_pending_on(const void *p, size_t n) {
    Runtime &r = rt();
    std::lock_guard<std::recursive_mutex> g(r.qmu);
    const char *b = (const char *)p;
    for (auto &kv : r.streams)
        for (const Copy &c : kv.second->pending)
            for (const char *q : {(const char *)c.dst, (const char *)c.src})
                if (q < b + n && b < q + c.bytes) return true;
    return false;
}
} // namespace st_emu
inline cudaError_t cudaFreeHost(void *p) {
    if (!p) return cudaSuccess;
    size_t n = 0;
    {
        std::lock_guard<std::mutex> g(st_emu::rt().mu);
        auto it = st_emu::rt().pinned.find(p);
        if (it == st_emu::rt().pinned.end()) return st_emu::ret(cudaErrorInvalidValue);
        n = it->second;
    }
    if (st_emu::copy_pending_on(p, n ? n : 1)) { /* counted; performed first, so nothing writes freed memory */
        st_emu::rt().freed_in_flight++;
        std::lock_guard<std::recursive_mutex> g(st_emu::rt().qmu);
        for (auto &kv : st_emu::rt().streams) st_emu::perform(kv.first, UINT64_MAX);
    }
    {
        std::lock_guard<std::mutex> g(st_emu::rt().mu);
        st_emu::rt().pinned.erase(p);
    }
    free(p);
    return cudaSuccess;
}
/* page-locks [p, p + bytes) of pageable memory (host memory here: only the bookkeeping) */
inline cudaError_t cudaHostRegister(void *p, size_t bytes, unsigned flags) {
    (void)flags;
    if (!p || !bytes) return st_emu::ret(cudaErrorInvalidValue);
    if (st_emu::sticky()) return st_emu::sticky();
    st_emu::Runtime &r = st_emu::rt();
    std::lock_guard<std::mutex> g(r.mu);
    const char *b = (const char *)p;
    for (std::map<void *, size_t> *m : {&r.pinned, &r.registered})
        for (auto &kv : *m)
            if ((const char *)kv.first < b + bytes && b < (const char *)kv.first + kv.second)
                return st_emu::ret(cudaErrorHostMemoryAlreadyRegistered);
    r.registered[p] = bytes;
    return cudaSuccess;
}
inline cudaError_t cudaHostUnregister(void *p) {
    size_t n = 0;
    {
        std::lock_guard<std::mutex> g(st_emu::rt().mu);
        auto it = st_emu::rt().registered.find(p);
        if (it == st_emu::rt().registered.end()) return st_emu::ret(cudaErrorHostMemoryNotRegistered);
        n = it->second;
    }
    if (st_emu::copy_pending_on(p, n)) {
        st_emu::rt().freed_in_flight++;
        std::lock_guard<std::recursive_mutex> g(st_emu::rt().qmu);
        for (auto &kv : st_emu::rt().streams) st_emu::perform(kv.first, UINT64_MAX);
    }
    std::lock_guard<std::mutex> g(st_emu::rt().mu);
    st_emu::rt().registered.erase(p);
    return cudaSuccess;
}
inline cudaError_t cudaMemset(void *p, int v, size_t bytes) {
    if (st_emu::sticky()) return st_emu::sticky();
    if (bytes && !st_emu::on_device(p, bytes)) return st_emu::ret(cudaErrorInvalidValue);
    memset(p, v, bytes);
    return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s = nullptr) {
    if (s) st_emu::perform(s->id, UINT64_MAX); /* it runs now: the stream's earlier copies first */
    return cudaMemset(p, v, bytes);
}
namespace st_emu {
inline cudaError_t check_copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    if (bytes && ((src_dev && !on_device(src, bytes)) || (dst_dev && !on_device(dst, bytes))))
        return ret(cudaErrorInvalidValue);
    return cudaSuccess;
}
} // namespace st_emu
inline cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    if (st_emu::sticky()) return st_emu::sticky();
    cudaError_t e = st_emu::check_copy(dst, src, bytes, kind);
    if (e == cudaSuccess && bytes) memmove(dst, src, bytes);
    return e;
}
/* deferred on a non-null stream (see the head of this file), at once on the null stream */
inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                                   cudaStream_t s = nullptr) {
    if (st_emu::sticky()) return st_emu::sticky();
    st_emu::Runtime &r = st_emu::rt();
    if (bytes) { /* the host side, by kind (cudaMemcpyDefault: the side that is not device memory) */
        const void *host = nullptr;
        if (kind == cudaMemcpyHostToDevice) host = src;
        else if (kind == cudaMemcpyDeviceToHost) host = dst;
        else if (kind == cudaMemcpyDefault) host = !st_emu::on_device(src, bytes) ? src : !st_emu::on_device(dst, bytes) ? dst : nullptr;
        std::lock_guard<std::mutex> g(r.mu);
        if (host && !st_emu::page_locked_locked(r, host, bytes))
            r.pageable_copies++, r.pageable_bytes += bytes, r.pageable_by_stream[s ? s->id : 0] += bytes;
    }
    if (!s) return cudaMemcpy(dst, src, bytes, kind);
    cudaError_t e = st_emu::check_copy(dst, src, bytes, kind);
    if (e != cudaSuccess) return e;
    std::lock_guard<std::recursive_mutex> g(r.qmu);
    auto it = r.streams.find(s->id);
    if (it == r.streams.end()) return st_emu::ret(cudaErrorInvalidResourceHandle);
    it->second->pending.push_back(st_emu::Copy{dst, src, bytes});
    it->second->queued++;
    return cudaSuccess;
}

/* ---------------------------------------------------------------- streams and events */
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    (void)flags;
    st_emu::Runtime &r = st_emu::rt();
    std::lock_guard<std::recursive_mutex> g(r.qmu);
    int id = r.next_stream++;
    st_emu::Stream *st = new st_emu::Stream();
    st->id = id;
    r.streams[id] = st;
    *s = new st_emu_stream{id};
    return cudaSuccess;
}
inline cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (s) st_emu::perform(s->id, UINT64_MAX);
    return st_emu::sticky();
}
inline cudaError_t cudaStreamQuery(cudaStream_t s) { return cudaStreamSynchronize(s); }
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s) return st_emu::ret(cudaErrorInvalidResourceHandle);
    st_emu::perform(s->id, UINT64_MAX);
    st_emu::Runtime &r = st_emu::rt();
    {
        std::lock_guard<std::recursive_mutex> g(r.qmu);
        auto it = r.streams.find(s->id);
        if (it != r.streams.end()) {
            delete it->second;
            r.streams.erase(it);
        }
    }
    delete s;
    return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize(void) {
    st_emu::Runtime &r = st_emu::rt();
    std::lock_guard<std::recursive_mutex> g(r.qmu);
    for (auto &kv : r.streams) st_emu::perform(kv.first, UINT64_MAX);
    return st_emu::sticky();
}
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    *e = new st_emu_event{0, 0, flags, -1};
    return cudaSuccess;
}
inline cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;
    return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr) {
    if (!e) return st_emu::ret(cudaErrorInvalidResourceHandle);
    if (st_emu::sticky()) return st_emu::sticky();
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    e->t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    if (!s) {
        e->stream = 0, e->seq = 0;
        return cudaSuccess;
    }
    st_emu::Runtime &r = st_emu::rt();
    std::lock_guard<std::recursive_mutex> g(r.qmu);
    auto it = r.streams.find(s->id);
    if (it == r.streams.end()) return st_emu::ret(cudaErrorInvalidResourceHandle);
    e->stream = s->id, e->seq = it->second->queued;
    return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (!e) return st_emu::ret(cudaErrorInvalidResourceHandle);
    st_emu::Runtime &r = st_emu::rt();
    std::lock_guard<std::recursive_mutex> g(r.qmu); /* the event may be recorded again meanwhile */
    st_emu::perform(e->stream, e->seq);
    return st_emu::sticky();
}
/* milliseconds between two recorded events (the host clock when each was recorded: every
 * launch here finishes before it returns, so that is when the work before it was done) */
inline cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    if (!ms || !start || !end) return st_emu::ret(cudaErrorInvalidValue);
    if (st_emu::sticky()) return st_emu::sticky();
    if ((start->flags | end->flags) & cudaEventDisableTiming) return st_emu::ret(cudaErrorInvalidResourceHandle);
    if (start->t < 0 || end->t < 0) return st_emu::ret(cudaErrorInvalidResourceHandle);
    if (cudaEventSynchronize(end) != cudaSuccess) return st_emu::sticky();
    *ms = (float)((end->t - start->t) * 1e3);
    return cudaSuccess;
}
/* performs, so never cudaErrorNotReady (see the head of this file) */
inline cudaError_t cudaEventQuery(cudaEvent_t e) { return cudaEventSynchronize(e); }
/* performs the event's stream up to it now: the waiting stream's later copies run later
 * anyway, so this is one order a GPU could choose */
inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0) {
    (void)s, (void)flags;
    return cudaEventSynchronize(e);
}

#endif
