/* probe.c - the disk probe: one path's sequential write and read bandwidth, and a mixed
 * pass, through the io engine itself (its request size, its queue depth, O_DIRECT where
 * the filesystem takes it), so the plan's time model sees what training will get.
 * `strata probe` (src/cli/cmd_probe.c) prints and writes the figures; `strata bench
 * offload` measures its paths with it in the same run.
 *
 * Honesty about caches: the write time includes fdatasync, and before the read pass the
 * file's pages are dropped from the page cache (POSIX_FADV_DONTNEED), which matters only
 * when the engine fell back to buffered I/O. A tmpfs path is memory, not a disk: it is
 * measured and marked memory = 1. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "strata/io.h"

#define PROBE_BUF_BYTES (64u << 20) /* one buffer reused for every request */
#define FS_TMPFS_MAGIC 0x01021994
#define FS_RAMFS_MAGIC 0x858458f6

/* Submit [0, bytes) as buffer-sized requests, all at once (the engine keeps `depth`
 * pieces in flight and blocks the submitter beyond that), then wait for every one.
 * write: 0 read, 1 write, 2 mixed (even requests read, odd ones write: what an
 * optimizer step streaming its state does). */
static st_status probe_pass(st_io_engine *io, int write, void *buf, uint64_t bytes, st_err *err) {
    size_t n = (size_t)((bytes + PROBE_BUF_BYTES - 1) / PROBE_BUF_BYTES);
    uint64_t *t = calloc(n, sizeof *t);
    if (!t) return st_errf(err, ST_ERR_NOMEM, "probe: out of memory");
    st_status s = ST_OK;
    size_t issued = 0;
    for (; issued < n; issued++) {
        uint64_t off = (uint64_t)issued * PROBE_BUF_BYTES;
        size_t len = bytes - off < PROBE_BUF_BYTES ? (size_t)(bytes - off) : PROBE_BUF_BYTES;
        int w = write == 2 ? (int)(issued & 1) : write;
        s = w ? st_io_write(io, 0, off, buf, len, &t[issued], err) : st_io_read(io, 0, off, buf, len, &t[issued], err);
        if (s != ST_OK) break;
    }
    for (size_t i = 0; i < issued; i++) {
        st_err e2 = {0};
        st_status s2 = st_io_wait(io, t[i], &e2);
        if (s2 != ST_OK && s == ST_OK) {
            s = s2;
            if (err) *err = e2;
        }
    }
    free(t);
    return s;
}

static st_status probe_path(st_io_probe_result *r, const char *path, uint64_t bytes, size_t request, int depth,
                            void *buf, st_err *err) {
    const char *paths[1] = {path};
    st_io_config cfg = {.paths = paths, .n_paths = 1, .file_bytes = bytes, .file_name = "strata-probe.tmp",
                        .request_bytes = request, .depth = depth};
    st_io_engine *io;
    st_status s = st_io_engine_create(&io, &cfg, err);
    if (s != ST_OK) return s;
    st_io_register_buffer(io, buf, PROBE_BUF_BYTES, NULL); /* best effort: plain requests otherwise */
    struct statfs fs;
    r->memory = statfs(path, &fs) == 0 && (fs.f_type == FS_TMPFS_MAGIC || fs.f_type == FS_RAMFS_MAGIC);
    r->engine = st_io_kind_name(st_io_engine_kind(io));
    r->direct = st_io_engine_direct(io, 0);
    r->request_bytes = st_io_engine_request_bytes(io);
    r->depth = st_io_engine_depth(io);
    r->bytes = st_io_engine_file_bytes(io);
    /* A second descriptor for fdatasync and the cache drop: both act on the file. */
    int fd = open(st_io_engine_file(io, 0), O_RDONLY | O_CLOEXEC);

    double t0 = st_now();
    s = probe_pass(io, 1, buf, r->bytes, err);
    if (s == ST_OK && fd >= 0 && fdatasync(fd) != 0)
        s = st_errf(err, ST_ERR_IO, "%s: fdatasync failed", st_io_engine_file(io, 0));
    double tw = st_now() - t0;
    if (s == ST_OK) {
        if (fd >= 0) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        t0 = st_now();
        s = probe_pass(io, 0, buf, r->bytes, err);
        double tr = st_now() - t0;
        r->write_gbps = (double)r->bytes / tw / 1e9;
        r->read_gbps = (double)r->bytes / tr / 1e9;
    }
    if (s == ST_OK) {
        t0 = st_now();
        s = probe_pass(io, 2, buf, r->bytes, err);
        if (s == ST_OK && fd >= 0 && fdatasync(fd) != 0)
            s = st_errf(err, ST_ERR_IO, "%s: fdatasync failed", st_io_engine_file(io, 0));
        r->mixed_gbps = (double)r->bytes / (st_now() - t0) / 1e9;
    }
    if (fd >= 0) close(fd);
    st_io_engine_destroy(io); /* removes the test file */
    return s;
}

st_status st_io_probe(const char *path, uint64_t bytes, size_t request_bytes, int depth, st_io_probe_result *r,
                      st_err *err) {
    memset(r, 0, sizeof *r);
    void *buf = st_io_alloc(PROBE_BUF_BYTES);
    if (!buf) return st_errf(err, ST_ERR_NOMEM, "probe of %s: out of memory (a %u MiB buffer)", path,
                             PROBE_BUF_BYTES >> 20);
    /* Random bytes, so a compressing or deduplicating filesystem cannot shortcut. */
    st_rng rng;
    st_rng_seed(&rng, 1);
    for (size_t i = 0; i < PROBE_BUF_BYTES; i += 8) {
        uint64_t x = st_rng_u64(&rng);
        memcpy((char *)buf + i, &x, 8);
    }
    st_status s = probe_path(r, path, bytes, request_bytes, depth, buf, err);
    st_io_free(buf);
    return s;
}
