/* tier.h - the memory hierarchy's moving parts: a device arena with a hard byte
 * budget, and a copy engine that moves bytes between host and device beside the
 * compute (on its own thread, or on the backend's copy streams).
 *
 * Example:
 *
 *     st_err err = {0};
 *     st_backend *cpu = NULL, *dev = NULL;
 *     st_copy_engine *ce = NULL;
 *     if (st_backend_cpu_create(&cpu, 0, &err) ||
 *         st_backend_with_budget(&dev, cpu, 256u << 20, &err) ||  // every alloc: a 256 MiB arena
 *         st_copy_engine_create(&ce, dev, &err)) {
 *         fprintf(stderr, "strata: %s\n", err.msg);
 *         return 1;
 *     }
 *     size_t bytes = 1u << 20;
 *     float *w = dev->ops->alloc(dev, bytes);            // NULL once the budget is spent
 *     float *host_w = calloc(1, bytes);
 *     if (w && host_w) {
 *         uint64_t t = st_copy_h2d(ce, w, host_w, bytes);  // returns at once
 *         // ...compute on something else...
 *         st_copy_wait(ce, t);                             // w is ready
 *         printf("%zu of %zu arena bytes used\n", st_arena_used(st_backend_arena(dev)),
 *                st_arena_budget(st_backend_arena(dev)));
 *     }
 *     if (w) dev->ops->dealloc(dev, w);
 *     free(host_w);
 *     st_copy_engine_destroy(ce);
 *     st_backend_free(dev);                                // before the backend inside it
 *     st_backend_free(cpu);
 *
 * End of example.
 */
#ifndef STRATA_TIER_H
#define STRATA_TIER_H

#include "strata/backend.h"
#include "strata/core.h"

/* ------------------------------------------------------------------ arena
 * First-fit allocator over one region, ST_ARENA_ALIGN-byte aligned blocks, neighbours
 * coalesced on free. Thread-safe. */
#define ST_ARENA_ALIGN 256 /* bytes: every block starts on it and its size is rounded up to it */
typedef struct st_arena st_arena;

st_status st_arena_create(st_arena **out, void *base, size_t bytes, st_err *err);
void st_arena_destroy(st_arena *a);
void *st_arena_alloc(st_arena *a, size_t bytes); /* NULL when no free block fits */
void st_arena_free(st_arena *a, void *p);
size_t st_arena_used(const st_arena *a);
size_t st_arena_peak(const st_arena *a);
size_t st_arena_budget(const st_arena *a);
void st_arena_reset_peak(st_arena *a);

/* A backend whose memory is one region of `budget` bytes taken from `inner`, handed
 * out by an arena: exceeding the budget is a failed allocation (NULL), never a silent
 * malloc. The ops are inner's. `inner` must outlive it (free this one first). */
st_status st_backend_with_budget(st_backend **out, st_backend *inner, size_t budget, st_err *err);
/* The arena behind a budgeted backend, or NULL for any other backend. */
st_arena *st_backend_arena(st_backend *be);
/* A device backend by name (strata train's key 'device', strata bench stream --device):
 * "cpu": the host's cores, every allocation from an arena of `budget` bytes carved over
 * `host` (st_backend_with_budget; host stays the caller's and must outlive it); "cuda" or
 * "cuda:N": the CUDA backend on device N (0 for "cuda"), one cudaMalloc of `budget` bytes
 * (host unused). ST_ERR_UNSUPPORTED for cuda in a strata built without the CUDA backend
 * (cmake -DSTRATA_CUDA=ON builds it) or without such a device; ST_ERR_INVALID for another
 * name (naming it and the accepted forms) or a budget of 0; ST_ERR_NOMEM where the budget
 * cannot be had. */
st_status st_backend_device_create(st_backend **out, const char *device, st_backend *host, size_t budget,
                                   st_err *err);

/* ------------------------------------------------------------------ copy engine
 * Copies in submission order. Each copy returns a ticket; waiting for ticket t waits for
 * every copy submitted up to t, both directions. On a backend whose copies are host work
 * (no copy_async: the CPU backend) one worker thread executes them; on a backend with
 * copy_async (CUDA) there is no thread: they queue on the backend's copy streams and a
 * wait is the backend's copy_sync. Any thread may wait. */
typedef struct st_copy_engine st_copy_engine;

typedef struct st_copy_stats {
    uint64_t h2d_bytes, d2h_bytes, copies; /* copies seen complete */
    double busy_s; /* worker: time spent copying; copy_async: wall time with a copy submitted and
                      not yet seen complete (an upper bound: the engine sees a completion when
                      someone waits or asks) */
} st_copy_stats;

st_status st_copy_engine_create(st_copy_engine **out, st_backend *dev, st_err *err);
void st_copy_engine_destroy(st_copy_engine *ce); /* waits for outstanding copies */
uint64_t st_copy_h2d(st_copy_engine *ce, void *dev_dst, const void *host_src, size_t bytes);
uint64_t st_copy_d2h(st_copy_engine *ce, void *host_dst, const void *dev_src, size_t bytes);
void st_copy_wait(st_copy_engine *ce, uint64_t ticket);
int st_copy_done(st_copy_engine *ce, uint64_t ticket);
void st_copy_get_stats(st_copy_engine *ce, st_copy_stats *s);

/* For tracing the copy_async path, whose copies run on no thread of ours: when want()
 * (may be NULL: always) is nonzero at a copy's submission, a thread of the engine (started
 * at the first such copy) waits for that copy and calls done(ctx, ...) on itself with
 * the copy's submission time and the time it saw it complete (st_now seconds). Set it
 * before the first copy; the worker path ignores it (wrap its backend's copy ops instead). */
typedef struct st_copy_observer {
    int (*want)(void);
    void (*done)(void *ctx, int d2h, size_t bytes, double t_submit, double t_done);
    void *ctx;
} st_copy_observer;
void st_copy_engine_observe(st_copy_engine *ce, const st_copy_observer *obs);

#endif
