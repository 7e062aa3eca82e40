/* store.h - the tiered state store: fp32 master weights and optimizer moments on one or
 * more disk paths, streamed through a few host buffers and updated by the optimizer
 * engine, one consistent step at a time.
 *
 * Example:
 *
 *     st_err err = {0};
 *     const char *paths[] = {"/tmp"};                   // e.g. "/nvme0/run", "/nvme1/run"
 *     st_optim_segment segs[] = {{.offset = 0, .n = 1 << 20, .weight_decay = 0.1f}}; // one tensor of 1 Mi parameters
 *     st_store_config sc = {.paths = paths, .n_paths = 1, .segs = segs, .n_segs = 1,
 *                           .fmt = ST_OPTIM_STATE_F32, .host_budget = 64u << 20,
 *                           .name = "example-state"};
 *     uint64_t disk[1], host;
 *     if (st_store_plan(&sc, disk, &host, &err) == ST_OK)   // the capacity check, nothing created
 *         printf("%llu disk bytes, %llu host bytes\n", (unsigned long long)disk[0],
 *                (unsigned long long)host);
 *     st_store *st = NULL;
 *     st_status s = st_store_exists(&sc) ? st_store_open(&st, &sc, &err)    // resume
 *                                        : st_store_create(&st, &sc, NULL, NULL, &err); // zeros
 *     float *master = malloc(sizeof(float) << 20);
 *     if (s == ST_OK && master) s = st_store_read_master(st, master, &err);  // CRC-checked
 *     if (s != ST_OK) fprintf(stderr, "strata: %s\n", err.msg);
 *     free(master);
 *     st_store_close(st);
 *
 * End of example.
 *
 * A step (the gradient of each subgroup comes from a callback, grads_at(ctx, first, n)):
 *
 *     st_store_step_args a = {.grads = grads_at, .grad_dtype = ST_BF16, .work = work_at,
 *                             .work_dtype = ST_BF16, .ctx = model, .grad_sumsq = ss,
 *                             .blob = &loader_state, .blob_bytes = sizeof loader_state};
 *     st_store_step(st, &a, &hp, &err);                  // committed when it returns ST_OK
 *
 * Layout. The flat parameter vector is cut into subgroups of whole ST_OPTIM_CHUNK_ELEMS chunks
 * of its segments (so the 8-bit blocks and the optimizer's chunks are those of the
 * in-memory optimizer, and results are bit-identical to it). A subgroup's region on disk
 * is its fp32 master weights, then its moment buffers (st_optim_state_buffer's layout),
 * each padded to 4096 bytes. Subgroups go to paths in proportion to path_weight (the
 * probed bandwidth), so every path finishes its share of a step at the same time.
 *
 * A step never tears. Each subgroup has two regions (A and B); a step reads the current
 * one and writes the other, then, once every write is on stable storage (fdatasync on
 * each path), replaces NAME.manifest in paths[0] atomically (temporary, fsync, rename,
 * fsync of the directory). The manifest holds the step, which region is current for each
 * subgroup, a CRC-32C of every MiB of every current region, and the caller's blob (the
 * data loader's position): a crash at any instant leaves the last committed step, whole.
 * Reads check every MiB against its CRC; a mismatch is an error naming the file and the
 * byte range. in_place = 1 keeps one region per subgroup (half the disk): the manifest
 * is marked dirty while a step writes, and a store found dirty is refused (torn), never
 * silently used.
 *
 * Readers. st_store_open_readonly opens a store to read it (a share of NAME.lock: any number
 * of readers at once, never beside a writer, and a writer is refused while one reads), with
 * one host buffer. st_store_read_range copies the master weights and the raw moment bytes
 * of any element range (8-bit: cut on the 8-bit blocks, so the bytes are the range's own and
 * are copied, never re-quantized), each region checked against its CRCs; with
 * st_store_create_filled the ranges of old stores become a new store's subgroups: a state
 * re-sharded for another number of data-parallel ranks, exactly.
 *
 * Pipeline. The step visits subgroups in an order that alternates every step (up, then
 * down), reading ahead while the optimizer updates the current one and earlier ones are
 * written. Buffers not needed for staging form a cache: the subgroups updated last in one
 * step stay resident and are the first ones of the next, so they are not read again
 * (the hit rate is in the stats). Host memory: n_buffers x region_bytes, within
 * host_budget.
 */
#ifndef STRATA_STORE_H
#define STRATA_STORE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "strata/core.h"
#include "strata/io.h"
#include "strata/optim.h"

#define ST_STORE_MAX_PATHS 16
/* Host bytes for the store's buffers and cache where none is given (strata train's key
 * state_budget 0, the planner's first candidate, the benchmarks). */
#define ST_STORE_HOST_BUDGET_DEFAULT (256ull << 20)
#define ST_STORE_MAX_BLOB (64u << 10)
#define ST_STORE_CRC_BLOCK (1u << 20) /* one CRC-32C per MiB of a region */
#define ST_STORE_MAX_REGION (256u << 20) /* bytes: the largest subgroup region chosen from host_budget */
#define ST_STORE_MAX_MOMENTS 4 /* moment buffers of a state (st_optim_state_count: 2 fp32, 4 8-bit) */

typedef struct st_store_config {
    const char *const *paths; /* directories, which must exist */
    int n_paths;
    const double *path_weight; /* relative speed of each path (probed GB/s); NULL: equal */
    const st_optim_segment *segs;
    int n_segs;
    st_optim_state_format fmt;
    uint64_t host_budget;    /* bytes of host memory for the store's buffers; 0: 1 GiB */
    uint64_t region_bytes;   /* target disk bytes per subgroup; 0: from host_budget */
    int in_place;            /* 1: one region per subgroup (not crash-safe; see above) */
    const char *name;        /* NAME.bin in every path, NAME.manifest in paths[0];
                                NULL: "strata-state" */
    st_io_kind io_kind;
} st_store_config;

/* Fill dst[0..n) with the initial master weights of flat elements [first, first+n). */
typedef void (*st_store_init_fn)(void *ctx, size_t first, size_t n, float *dst);
/* The st_store_init_fn of a store whose master weights start as a vector in memory: ctx is
 * the fp32 weight of the store's element 0. */
void st_store_init_copy(void *ctx, size_t first, size_t n, float *dst);
/* Fill a subgroup of a new store, flat elements [first, first+n): master[n] and the moment
 * buffers moments[0..n_moments) (st_optim_state_buffer's layout for the store's segments
 * clipped to the range, counted from first; st_store_moment_offset places an element in
 * them), all zero on entry. An error stops the create (nothing is committed). */
typedef st_status (*st_store_fill_fn)(void *ctx, size_t first, size_t n, float *master, void *const moments[],
                                      int n_moments, st_err *err);

typedef struct st_store_step_args {
    /* The gradient of flat elements [first, first+n) (grad_dtype): the pointer is read
     * during this subgroup's update only, so one reused buffer will do. */
    const void *(*grads)(void *ctx, size_t first, size_t n);
    st_dtype grad_dtype;
    /* Optional: where the working copy of [first, first+n) goes (work_dtype). */
    void *(*work)(void *ctx, size_t first, size_t n);
    st_dtype work_dtype;
    void *ctx;
    /* Optional, gradients of two dtypes (a streamed model's blocks drained as bf16, the rest
     * fp32), each read as it is: grad_dtype_of(ctx, x) is the dtype of element x's gradient
     * (one per segment); grads_as(ctx, first, n, dt) the gradient of [first, first+n) in dt,
     * of which only the segments of that dtype are read. Where set, grads and grad_dtype are
     * not used. */
    st_dtype (*grad_dtype_of)(void *ctx, size_t x);
    const void *(*grads_as)(void *ctx, size_t first, size_t n, st_dtype dt);
    /* Optional, the update overlapped with the backward that computes the gradients:
     * wait(ctx, first, n) returns once the gradient of [first, first+n) has landed, before that
     * subgroup's update (reads ahead go on meanwhile); an error abandons the step (below) and
     * st_store_step returns it. order_key(ctx, first, end) orders the subgroups (ascending,
     * ties in element order) as their gradients land; NULL: alternating up and down, which
     * keeps the subgroups updated last cached for the next step. */
    st_status (*wait)(void *ctx, size_t first, size_t n, st_err *err);
    double (*order_key)(void *ctx, size_t first, size_t end);
    /* Optional, a speculative step (clip scale 1 before the whole norm is known): commit(ctx)
     * is called once every subgroup is updated and written to stable storage, before the
     * manifest switch; 1 commits, 0 abandons the step: st_store_step returns ST_OK with
     * nothing committed (stats.abandoned), the store at its last step, its buffers holding
     * only committed state, ready for the step again (with the clip scale) or the next one.
     * Refused for an in-place store, whose writes replace the committed state. */
    int (*commit)(void *ctx);
    double grad_sumsq; /* the whole step's, as optim_step_args.grad_sumsq; must be known (a
                          speculative step: any finite value; the caller checks the norm) */
    const void *blob;  /* committed with the step (<= ST_STORE_MAX_BLOB bytes) */
    size_t blob_bytes;
    /* Optional, before each subgroup's update: the master weights of the segments of
     * learning-rate class reset_class set to 0 (reset_master), and their moments zeroed as
     * st_optim_reset_class does (reset_moments); committed with the step, torn never (method
     * poetx: Q and its moments after a merge, in the update that follows it). */
    int reset_master, reset_moments, reset_class;
} st_store_step_args;

typedef struct st_store_stats {
    uint64_t step;          /* updates committed */
    int n_subgroups, n_buffers, cache_buffers;
    uint64_t region_bytes;  /* the largest subgroup region */
    uint64_t disk_bytes;    /* all paths' files together */
    uint64_t host_bytes;    /* the buffers */
    /* the last step */
    double step_s, update_s, crc_s, read_wait_s, write_wait_s, commit_s;
    double grad_wait_s, gate_wait_s; /* waiting in args.wait and args.commit */
    int abandoned;          /* args.commit returned 0, or args.wait an error */
    uint64_t read_bytes, write_bytes;
    int hits, misses;
} st_store_stats;

typedef struct st_store st_store;

/* A store's manifest header, read without opening the store (st_store_peek). */
typedef struct st_store_info {
    uint64_t step;          /* updates committed */
    uint64_t numel;         /* elements of the store's flat vector */
    st_optim_state_format fmt;
    int n_paths;
    int dirty;              /* an in-place update was interrupted: torn */
} st_store_info;

/* The disk bytes a store of this configuration needs on each path (path_bytes[n_paths]),
 * without creating anything: the plan's capacity check. */
st_status st_store_plan(const st_store_config *cfg, uint64_t *path_bytes, uint64_t *host_bytes, st_err *err);
/* A step of a store of this configuration, predicted without creating or reading anything
 * (the planner's disk term): the layout and buffers st_store_create would make, and what
 * steps read and write once the cache is warm (the steps before took the same order rule).
 * Alternating, the two orders hit alike in count but not in bytes (the subgroups at the two
 * ends differ in size): [0] is a step of the store's even steps (visiting up), [1] odd. */
typedef struct st_store_layout {
    int n_subgroups, n_buffers;
    uint64_t region_bytes;                    /* the largest subgroup region */
    uint64_t host_bytes;                      /* the buffers: n_buffers x region_bytes */
    uint64_t path_bytes[ST_STORE_MAX_PATHS];  /* each path's file, as st_store_plan */
    int hits[2];                              /* subgroups still resident from the step before: not read */
    uint64_t read_bytes[2][ST_STORE_MAX_PATHS]; /* a step's reads on each path (st_store_stats.read_bytes) */
    uint64_t write_bytes[ST_STORE_MAX_PATHS]; /* its writes: every subgroup's region, cached or not */
} st_store_layout;
/* a: the step's arguments as st_store_step gets them, of which only order_key and whether
 * wait is set are looked at (NULL: neither, the order alternating up and down); the
 * pipeline's own buffer choices, run on the layout alone. Fails as st_store_create would
 * for a host budget below the pipeline's buffers. */
st_status st_store_plan_step(const st_store_config *cfg, const st_store_step_args *a, st_store_layout *out,
                             st_err *err);
/* Disk bytes per parameter of the state: fp32 master weights plus the moments (fp32: 12;
 * 8-bit: 6.03 with one fp32 absmax per 256), before padding and the second region. */
double st_store_bytes_per_param(st_optim_state_format fmt);
/* Free space for need[p] bytes on each path: avail[p] is the free bytes of the path's
 * filesystem (plus the blocks a leftover NAME.bin there already holds), fs_need[p] what
 * all the paths on that filesystem need together; short when fs_need[p] > avail[p]. */
st_status st_store_space(const st_store_config *cfg, const uint64_t *need, uint64_t *avail, uint64_t *fs_need,
                         st_err *err);
/* 1 if NAME.manifest exists in paths[0]. */
int st_store_exists(const st_store_config *cfg);
/* A new store: checks every path's free space against the plan first (ST_ERR_NOSPACE
 * with the bytes missing), preallocates, writes step 0 (master from init, or zeros when
 * init is NULL; moments zero). Refuses to replace an existing manifest. */
st_status st_store_create(st_store **out, const st_store_config *cfg, st_store_init_fn init, void *ctx,
                          st_err *err);
/* A new store whose subgroups come from fill (master weights and moments), committed at
 * `step` (the updates the state has had) with the caller's blob: a state moved from other
 * stores (a re-shard). Space, layout and the refusal of an existing manifest as
 * st_store_create; a failure (of fill too) leaves no manifest, and the files it made are
 * removed; a crash leaves files without a manifest, which the next create replaces. */
st_status st_store_create_filled(st_store **out, const st_store_config *cfg, st_store_fill_fn fill, void *ctx,
                                 uint64_t step, const void *blob, size_t blob_bytes, st_err *err);
/* Return a closed store to its previous commit (NAME.manifest.prev: kept by every commit
 * of a two-region store, its regions intact until the next step writes them). Ranks of a
 * data-parallel run whose stores committed different steps before a crash use it to agree
 * on the older one. */
st_status st_store_rollback(const st_store_config *cfg, st_err *err);
/* An existing store; the segments and format must match the manifest's. */
st_status st_store_open(st_store **out, const st_store_config *cfg, st_err *err);
/* An existing store to read (st_store_read_range, st_store_read_master, st_store_blob): a
 * shared lock (ST_ERR_BUSY while a process has it open to write), one host buffer, nothing
 * on disk changed; step and commit are refused. previous = 1 opens the commit before the
 * last (NAME.manifest.prev, as st_store_rollback would return to, without changing the
 * store); host_budget is not used. */
st_status st_store_open_readonly(st_store **out, const st_store_config *cfg, int previous, st_err *err);
/* The header of the store's manifest in paths[0] (previous = 1: of NAME.manifest.prev),
 * CRC-checked, without opening the store or taking its lock. */
st_status st_store_peek(const st_store_config *cfg, int previous, st_store_info *info, st_err *err);
void st_store_close(st_store *s);

/* One AdamW step over every subgroup, committed before it returns. ST_ERR_NONFINITE
 * when grad_sumsq is not finite (nothing is read or written). After any other error the
 * store's buffers may hold uncommitted data: close it and open it again (the disk holds
 * the last committed step). */
st_status st_store_step(st_store *s, const st_store_step_args *a, const st_adamw_params *hp, st_err *err);
/* Commit a new blob without an update (a skipped step still moves the data on). */
st_status st_store_commit_blob(st_store *s, const void *blob, size_t bytes, st_err *err);
/* The blob of the last commit (NULL, 0 if none). */
const void *st_store_blob(const st_store *s, size_t *bytes);
/* The master weights of every element into dst[numel] (resume), checked against the CRCs. */
st_status st_store_read_master(st_store *s, float *dst, st_err *err);
/* The state of elements [first, first+n) of the store's vector, checked against the CRCs:
 * master[n] (gaps between segments too), and for each moment buffer i (st_optim_state_count:
 * fp32 m, v; 8-bit m codes, v codes, m absmax, v absmax) its bytes of the range into
 * moments[i], laid out as a state whose vector starts at first (st_store_moment_offset(segs,
 * .., first, first + n, i) bytes). An 8-bit range starts and ends on the 8-bit blocks of the
 * segments it cuts (ST_ERR_INVALID otherwise). */
st_status st_store_read_range(st_store *s, size_t first, size_t n, float *master, void *const moments[],
                              st_err *err);
/* Where element x's state starts in moment buffer i of a state of the flat elements from
 * `first` of a vector with these segments (sorted, not overlapping): the bytes of buffer i
 * that the elements [first, x) take (fp32: 4 each; 8-bit: whole blocks of each segment, one
 * byte (codes) or one float per block (absmax)). first and x on the 8-bit block grid. */
size_t st_store_moment_offset(const st_optim_segment *segs, int n_segs, st_optim_state_format fmt, size_t first, size_t x,
                              int i);

/* Per-path weights from a `strata probe -o FILE` profile (mixed_gbps, else read and write
 * combined), matched by the path as written; an error names a path it lacks. */
st_status st_store_weights_from_profile(const char *profile, const char *const *paths, int n_paths, double *weights,
                                        st_err *err);

/* Describe a store from its manifest alone (strata inspect): id, step, format, layout. */
st_status st_store_inspect(const char *manifest, FILE *out, st_err *err);

void st_store_get_stats(const st_store *s, st_store_stats *out);
size_t st_store_numel(const st_store *s);
int st_store_in_place(const st_store *s); /* 1: one region per subgroup (no step can be abandoned) */
int st_store_n_paths(const st_store *s);
/* Bytes of state (both regions) assigned to path p, and the io engine (its per-path stats). */
uint64_t st_store_path_bytes(const st_store *s, int p);
st_io_engine *st_store_io(st_store *s);
const char *st_store_manifest_path(const st_store *s);

#endif
