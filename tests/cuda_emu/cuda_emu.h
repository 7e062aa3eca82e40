/* cuda_emu.h - a small emulation of the CUDA execution model, for tests only: the kernels
 * of src/backend/cuda (kernels_*.cuh), compiled by g++ with this header, run on the CPU
 * so that their differential tests run in CI without a GPU (issue 15).
 *
 * What it emulates, and how:
 *   - A launch runs the grid's blocks one after another; the threads of a block are real
 *     threads (std::thread, one per CUDA thread, reused from block to block), so
 *     `__shared__` is `static`: one copy, shared by the block's threads, reused by the
 *     next block (as on a GPU, its contents do not survive the block).
 *   - threadIdx, blockIdx, blockDim, gridDim are thread_local; warpSize is 32; a warp is
 *     32 consecutive threads of the block (linear index x + y Dx + z Dx Dy).
 *   - __syncthreads is a barrier over the block's threads; a thread that has returned
 *     from the kernel no longer counts (as on sm_70 and later).
 *   - Warp shuffles and votes (__shfl_sync, __shfl_xor_sync, __shfl_down_sync,
 *     __shfl_up_sync, __ballot_sync, __any_sync, __all_sync, __syncwarp) go through a
 *     per-warp exchange of 32 slots and a barrier over the warp's lanes. Every
 *     lane of the warp must take part (the mask must name them all), as in the
 *     kernels here; a partial mask, or a lane reading a lane that does not exist, stops
 *     the test with a message instead of returning garbage.
 *   - atomicAdd, atomicMax, atomicCAS, atomicExch are GCC __atomic operations.
 *   - __nv_bfloat16 holds the bits; __float2bfloat16_rn rounds to nearest even exactly as
 *     the CPU's st_f32_to_bf16 (a NaN becomes a quiet NaN; the GPU's is 0x7fff).
 *   - A barrier that waits more than 30 s is a deadlock (a __syncthreads or shuffle
 *     that some threads never reach): the test aborts naming the barrier.
 * What it does not: memory spaces (pointers are host pointers), streams (a launch
 * finishes before it returns), dynamic shared memory, warp-synchronous code without
 * shuffles, timing. Blocks run one at a time, so a race between blocks is not seen. */
#ifndef STRATA_CUDA_EMU_H
#define STRATA_CUDA_EMU_H

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <climits>
#include <functional>
#include <thread>
#include <tuple>
#include <vector>

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
constexpr int warpSize = 32;
typedef struct st_emu_stream *cudaStream_t;

namespace st_emu {

[[noreturn]] inline void fail(const char *what) {
    fprintf(stderr, "cuda_emu: %s\n", what);
    abort();
}

/* A reusable barrier over a block's (or a warp's) threads. drop(): a thread leaves for
 * good (it returned from the kernel) and counts as arrived from then on. The last thread
 * to arrive runs on_release, resets the count and wakes the others (a futex on the
 * generation number: no mutex for the woken threads to fight over). While a barrier
 * releases, every thread that still uses it is waiting in it, so nothing races the reset. */
struct Barrier {
    std::atomic<int> alive{0}, remaining{0};
    std::atomic<uint32_t> gen{0};
    const char *name = "";

    void reset(int n) { alive.store(n), remaining.store(n); }
    void wait(const std::function<void()> &on_release = nullptr) {
        uint32_t g = gen.load(std::memory_order_acquire);
        if (remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) return release(on_release);
        for (int spin = 0; gen.load(std::memory_order_acquire) == g; spin++) {
            if (spin < 2) {
                sched_yield();
                continue;
            }
            struct timespec ts = {1, 0};
            syscall(SYS_futex, (uint32_t *)&gen, FUTEX_WAIT_PRIVATE, g, &ts, nullptr, 0);
            if (spin > 32) fail(name); /* 30 s: the name says which barrier never filled */
        }
    }
    void drop() {
        alive.fetch_sub(1);
        if (remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) release(nullptr);
    }

  private:
    void release(const std::function<void()> &on_release) {
        if (on_release) on_release();
        remaining.store(alive.load());
        gen.fetch_add(1, std::memory_order_release);
        syscall(SYS_futex, (uint32_t *)&gen, FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
    }
};

struct Warp {
    Barrier bar;
    int lanes = 0;          /* threads in this warp (the last warp of a block may be short) */
    uint64_t slot[2][32];   /* one value per lane; two halves used in turn, so one barrier
                               per exchange: a lane writing a half again has passed the
                               barrier of the exchange between, so all have read it */
};

/* One launch: its block-wide barrier, its warps, and the barrier between two blocks. */
struct Launch {
    Barrier sync, end;
    Warp warp[32];
    int nthreads = 0;
};

inline thread_local Launch *cur;
inline thread_local int lane_id, warp_id;

inline Warp &warp_of(unsigned mask) {
    Warp &w = cur->warp[warp_id];
    uint32_t present = w.lanes == 32 ? 0xffffffffu : ((1u << w.lanes) - 1);
    if ((mask & present) != present)
        fail("a warp shuffle or vote whose mask leaves out lanes of the warp (partial masks are not emulated)");
    return w;
}

inline thread_local int parity; /* this lane's next half of Warp::slot */

/* Lane `src` of the warp's values v (every lane passes its own). */
template <class T> inline T exchange(unsigned mask, T v, int src) {
    static_assert(sizeof(T) <= 8, "shuffle of a value wider than 8 bytes");
    Warp &w = warp_of(mask);
    uint64_t *slot = w.slot[parity];
    parity ^= 1;
    memcpy(&slot[lane_id], &v, sizeof v);
    w.bar.wait();
    if (src < 0 || src >= w.lanes) fail("a warp shuffle reads a lane that does not exist");
    T r;
    memcpy(&r, &slot[src], sizeof r);
    return r;
}

template <class... P, class... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t shmem, cudaStream_t stream, A... args) {
    (void)stream;
    int n = (int)(block.x * block.y * block.z);
    if (n < 1 || n > 1024) fail("a block of 0 or more than 1024 threads");
    if (grid.x * grid.y * grid.z < 1) fail("an empty grid");
    if (shmem) fail("dynamic shared memory is not emulated");
    std::tuple<P...> params(args...); /* by value, converted to the kernel's parameter types */
    Launch L;
    L.nthreads = n;
    L.sync.name = "__syncthreads never reached by all the block's threads";
    L.end.name = "a block's threads never all finished";
    auto reset = [&] {
        L.sync.reset(n);
        for (int w = 0; w * 32 < n; w++) {
            L.warp[w].lanes = n - w * 32 < 32 ? n - w * 32 : 32;
            L.warp[w].bar.name = "a warp shuffle or vote never reached by all the warp's lanes";
            L.warp[w].bar.reset(L.warp[w].lanes);
        }
    };
    reset();
    L.end.reset(n);
    std::vector<std::thread> threads;
    threads.reserve(n);
    for (int t = 0; t < n; t++)
        threads.emplace_back([&, t] {
            cur = &L, lane_id = t % 32, warp_id = t / 32;
            threadIdx = dim3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
            blockDim = block, gridDim = grid;
            for (unsigned bz = 0; bz < grid.z; bz++)
                for (unsigned by = 0; by < grid.y; by++)
                    for (unsigned bx = 0; bx < grid.x; bx++) {
                        blockIdx = dim3(bx, by, bz), parity = 0;
                        std::apply(kernel, params);
                        L.sync.drop();
                        L.warp[warp_id].bar.drop();
                        L.end.wait(reset); /* the next block starts with every thread back */
                    }
        });
    for (auto &th : threads) th.join();
}

} // namespace st_emu

#define ST_CUDA_LAUNCH(kernel, grid, block, shmem, stream, ...) \
    st_emu::launch(kernel, dim3(grid), dim3(block), (shmem), (stream), __VA_ARGS__)

inline void __syncthreads() { st_emu::cur->sync.wait(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { st_emu::warp_of(mask).bar.wait(); }

template <class T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return st_emu::exchange(mask, v, (st_emu::lane_id & ~(width - 1)) + (src & (width - 1)));
}
template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    int src = st_emu::lane_id ^ lane_mask;
    if ((src & ~(width - 1)) != (st_emu::lane_id & ~(width - 1))) src = st_emu::lane_id; /* outside its segment */
    return st_emu::exchange(mask, v, src);
}
template <class T> inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    int l = st_emu::lane_id, src = (l & (width - 1)) + (int)delta < width ? l + (int)delta : l;
    return st_emu::exchange(mask, v, src);
}
template <class T> inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    int l = st_emu::lane_id, src = (l & (width - 1)) >= (int)delta ? l - (int)delta : l;
    return st_emu::exchange(mask, v, src);
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
    st_emu::Warp &w = st_emu::warp_of(mask);
    uint64_t *slot = w.slot[st_emu::parity];
    st_emu::parity ^= 1;
    slot[st_emu::lane_id] = pred != 0;
    w.bar.wait();
    unsigned bits = 0;
    for (int i = 0; i < w.lanes; i++) bits |= (unsigned)slot[i] << i;
    return bits;
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) {
    st_emu::Warp &w = st_emu::warp_of(mask);
    unsigned all = w.lanes == 32 ? 0xffffffffu : (1u << w.lanes) - 1;
    return __ballot_sync(mask, pred) == all;
}
/* the set bits of a word (CUDA's integer intrinsic; with __ballot_sync, a warp's ranks) */
inline int __popc(unsigned x) { return __builtin_popcount(x); }

/* ---------------------------------------------------------------- atomics */
inline float atomicAdd(float *p, float v) {
    uint32_t old = __atomic_load_n((uint32_t *)p, __ATOMIC_RELAXED), upd;
    float f;
    do {
        memcpy(&f, &old, 4);
        f += v;
        memcpy(&upd, &f, 4);
    } while (!__atomic_compare_exchange_n((uint32_t *)p, &old, upd, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    memcpy(&f, &old, 4);
    return f;
}
inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline int atomicMax(int *p, int v) {
    int old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}
inline int atomicExch(int *p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
inline int atomicCAS(int *p, int cmp, int v) {
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return cmp; /* the old value, whether or not it was replaced */
}

/* ---------------------------------------------------------------- bf16 and math */
struct __nv_bfloat16 {
    uint16_t __x;
};
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{(uint16_t)((u >> 16) | 0x40)};
    u += 0x7fffu + ((u >> 16) & 1u);
    return __nv_bfloat16{(uint16_t)(u >> 16)};
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline float __bfloat162float(__nv_bfloat16 h) {
    uint32_t u = (uint32_t)h.__x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }

#endif
