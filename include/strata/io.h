/* io.h - the disk tier's io engine: one preallocated file per path, asynchronous
 * reads and writes split into 1-4 MiB pieces, io_uring (a ring per path, registered
 * buffers) or, where io_uring is unavailable, a pread/pwrite thread pool.
 *
 * Example:
 *
 *     st_err err = {0};
 *     const char *paths[] = {"/tmp"};              // a directory per disk: "/nvme0/strata", ...
 *     st_io_config cfg = {.paths = paths, .n_paths = 1, .file_bytes = 64u << 20};
 *     st_io_engine *io = NULL;
 *     if (st_io_engine_create(&io, &cfg, &err) != ST_OK) {   // ST_ERR_NOSPACE if full
 *         fprintf(stderr, "strata: %s\n", err.msg);
 *         return 1;
 *     }
 *     size_t bytes = 16u << 20;
 *     void *buf = st_io_alloc(bytes);                        // 4096-aligned, zeroed
 *     st_io_register_buffer(io, buf, bytes, &err);           // optional: fixed buffers
 *     uint64_t t;
 *     st_status s = st_io_write(io, 0, 0, buf, bytes, &t, &err);    // returns at once
 *     if (s == ST_OK) s = st_io_wait(io, t, &err);          // err names path and offset
 *     if (s == ST_OK) s = st_io_read(io, 0, 4u << 20, buf, 4u << 20, &t, &err);
 *     if (s == ST_OK) s = st_io_wait(io, t, &err);
 *     if (s != ST_OK) fprintf(stderr, "strata: %s\n", err.msg);
 *     st_io_free(buf);
 *     st_io_engine_destroy(io);                              // removes the file
 *
 * End of example.
 *
 * Offsets, sizes and buffers must be multiples of 4096 (O_DIRECT's rule, kept on every
 * filesystem so a request valid on tmpfs is valid on NVMe). Every ticket must be waited
 * exactly once. Environment: STRATA_IO=threads forces the thread pool, STRATA_IO=uring
 * refuses to start without io_uring. */
#ifndef STRATA_IO_H
#define STRATA_IO_H

#include <stddef.h>
#include <stdint.h>

#include "strata/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ST_IO_ALIGN 4096u
#define ST_IO_MIN_REQUEST (1u << 20)
#define ST_IO_MAX_REQUEST (4u << 20)
#define ST_IO_MIN_DEPTH 32

typedef enum st_io_kind { ST_IO_AUTO = 0, ST_IO_URING = 1, ST_IO_THREADS = 2 } st_io_kind;

typedef struct st_io_config {
    const char *const *paths; /* directories; one file is created in each */
    int n_paths;
    uint64_t file_bytes;      /* preallocated size of each path's file (rounded up to 4096) */
    const char *file_name;    /* file name inside each directory; NULL: "strata-io.bin" */
    size_t request_bytes;     /* piece size, 1-4 MiB; 0: 1 MiB */
    int depth;                /* pieces in flight per path, >= 32; 0: 32 */
    st_io_kind kind;          /* ST_IO_AUTO: io_uring when it works, else threads */
    int keep_files;           /* nonzero: leave the files on disk at destroy */
    const uint64_t *path_file_bytes; /* optional: each path's own file size (overrides
                                        file_bytes; 0 entries use file_bytes) */
    int open_existing;        /* nonzero: the files must already exist with at least their
                                 size (reopening a store); they are never created or cut */
} st_io_config;

typedef struct st_io_path_stats {
    uint64_t read_bytes, write_bytes; /* completed without error */
    uint64_t requests;                 /* pieces (1-4 MiB each) completed, failed ones too */
    double busy_s; /* wall time with at least one piece in flight on this path */
} st_io_path_stats;

typedef struct st_io_engine st_io_engine;

st_status st_io_engine_create(st_io_engine **out, const st_io_config *cfg, st_err *err);
/* Waits for every piece in flight, closes the files, removes them unless keep_files. */
void st_io_engine_destroy(st_io_engine *e);

st_io_kind st_io_engine_kind(const st_io_engine *e);
const char *st_io_kind_name(st_io_kind k);  /* "io_uring", "threads" */
int st_io_engine_direct(const st_io_engine *e, int path); /* 1 if O_DIRECT, 0 if buffered */
size_t st_io_engine_request_bytes(const st_io_engine *e);
int st_io_engine_depth(const st_io_engine *e);
uint64_t st_io_engine_file_bytes(const st_io_engine *e); /* the largest path's file */
const char *st_io_engine_file(const st_io_engine *e, int path); /* full file name */

/* 4096-aligned, zeroed allocation for I/O buffers; free with st_io_free. */
void *st_io_alloc(size_t bytes);
void st_io_free(void *p);
/* Register a buffer with every ring so pieces inside it use fixed-buffer reads and
 * writes (no per-request page pinning). A no-op for the thread pool. Up to 64 buffers. */
st_status st_io_register_buffer(st_io_engine *e, void *buf, size_t bytes, st_err *err);

/* Submit; returns at once with a ticket. ST_ERR_INVALID (misaligned, past the end of the
 * file, bad path index) is reported here and no ticket is issued. I/O errors (EIO,
 * ENOSPC, short transfers) are reported by st_io_wait. */
st_status st_io_read(st_io_engine *e, int path, uint64_t offset, void *buf, size_t bytes,
                     uint64_t *ticket, st_err *err);
st_status st_io_write(st_io_engine *e, int path, uint64_t offset, const void *buf, size_t bytes,
                      uint64_t *ticket, st_err *err);
/* Block until every piece of the ticket is done; the first error, with path and offset. */
st_status st_io_wait(st_io_engine *e, uint64_t ticket, st_err *err);

void st_io_get_stats(st_io_engine *e, int path, st_io_path_stats *s);
/* fdatasync one path's file: every completed write is on stable storage after this. */
st_status st_io_sync(st_io_engine *e, int path, st_err *err);
uint64_t st_io_engine_path_bytes(const st_io_engine *e, int path); /* that path's file size */

/* The disk probe (src/tier/probe.c; `strata probe`): one path's bandwidth through this
 * engine. A test file of `bytes` in PATH is written sequentially (timed with fdatasync),
 * read back (page cache dropped first), then passed over once more with even requests
 * reading and odd ones writing (as the optimizer streaming its state does), and removed.
 * request_bytes and depth 0: the engine's defaults. Bandwidths in GB/s (1e9 bytes/s). */
typedef struct st_io_probe_result {
    const char *engine; /* "io_uring" or "threads" (static string) */
    int direct;         /* 1: O_DIRECT, 0: buffered */
    int memory;         /* 1: tmpfs or ramfs, memory rather than a disk */
    double read_gbps, write_gbps, mixed_gbps;
    size_t request_bytes; /* the engine's piece size */
    int depth;            /* pieces in flight */
    uint64_t bytes;       /* the test file's size (rounded up to 4096) */
} st_io_probe_result;
st_status st_io_probe(const char *path, uint64_t bytes, size_t request_bytes, int depth, st_io_probe_result *r,
                      st_err *err);

#ifdef __cplusplus
}
#endif
#endif
