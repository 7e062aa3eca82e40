/* test_io.c - the io engine: random writes and reads round-trip byte for byte through
 * io_uring (skipped with a message where unavailable) and the thread pool, with many
 * requests in flight; errors name the path and offset (past the end, misaligned, a
 * missing directory, a full disk on a 1 MiB tmpfs when mounting one is allowed); the disk
 * probe (st_io_probe) reports positive bandwidths for the whole test file, removes it, and
 * names a missing directory. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "strata/io.h"
#include "testutil.h"

#define FILE_BYTES (24u << 20)
#define NREADS 160

/* Random 4096-multiple in [lo, hi] pages. */
static size_t rnd_pages(st_rng *r, size_t lo, size_t hi) { return (lo + st_rng_u64(r) % (hi - lo + 1)) * ST_IO_ALIGN; }

static void round_trip(const char *engine, const char *dir) {
    setenv("STRATA_IO", engine, 1);
    const char *paths[1] = {dir};
    char name[64];
    snprintf(name, sizeof name, "io-%s.bin", engine);
    st_io_config cfg = {.paths = paths, .n_paths = 1, .file_bytes = FILE_BYTES, .file_name = name,
                        .request_bytes = 1u << 20, .depth = 32};
    st_err err = {0};
    st_io_engine *io;
    st_status s = st_io_engine_create(&io, &cfg, &err);
    if (s == ST_ERR_UNSUPPORTED && !strcmp(engine, "uring")) {
        printf("io_uring unavailable, skipping that half: %s\n", err.msg);
        return;
    }
    CHECK(s == ST_OK, "%s: create: %s", engine, err.msg);
    if (s != ST_OK) return;
    CHECK(!strcmp(st_io_kind_name(st_io_engine_kind(io)), strcmp(engine, "uring") ? "threads" : "io_uring"),
          "%s: engine is %s", engine, st_io_kind_name(st_io_engine_kind(io)));
    printf("%s: direct=%d file=%s\n", engine, st_io_engine_direct(io, 0), st_io_engine_file(io, 0));

    unsigned char *ref = st_io_alloc(FILE_BYTES), *back = st_io_alloc(FILE_BYTES);
    st_rng r;
    st_rng_seed(&r, 42);
    for (size_t i = 0; i < FILE_BYTES; i += 8) {
        uint64_t v = st_rng_u64(&r);
        memcpy(ref + i, &v, 8);
    }
    /* Fixed buffers for the writes, plain ones for the reads: both ring paths run. */
    CHECK(st_io_register_buffer(io, ref, FILE_BYTES, &err) == ST_OK, "register: %s", err.msg);

    /* Writes: the file cut into random-sized pieces (4 KiB to 6 MiB, so requests split
     * into 1 MiB pieces and a remainder), all in flight before the first wait. */
    uint64_t tickets[NREADS];
    int nt = 0;
    size_t off = 0;
    while (off < FILE_BYTES && nt < NREADS) {
        size_t n = rnd_pages(&r, 1, 1536);
        if (n > FILE_BYTES - off || nt == NREADS - 1) n = FILE_BYTES - off;
        s = st_io_write(io, 0, off, ref + off, n, &tickets[nt], &err);
        CHECK(s == ST_OK, "%s: write at %zu: %s", engine, off, err.msg);
        if (s != ST_OK) break;
        nt++;
        off += n;
    }
    for (int i = 0; i < nt; i++) {
        s = st_io_wait(io, tickets[i], &err);
        CHECK(s == ST_OK, "%s: write wait: %s", engine, err.msg);
    }
    /* Reads: the file cut into other random-sized pieces, issued in a shuffled order
     * (random offsets) with all of them in flight; disjoint, so no two requests write
     * the same bytes of the destination. */
    size_t roff[NREADS], rlen[NREADS];
    int nr = 0;
    off = 0;
    while (off < FILE_BYTES && nr < NREADS) {
        size_t n = rnd_pages(&r, 1, 1024);
        if (n > FILE_BYTES - off || nr == NREADS - 1) n = FILE_BYTES - off;
        roff[nr] = off;
        rlen[nr++] = n;
        off += n;
    }
    for (int i = nr - 1; i > 0; i--) {
        int j = (int)(st_rng_u64(&r) % (uint64_t)(i + 1));
        size_t a = roff[i], b = rlen[i];
        roff[i] = roff[j], rlen[i] = rlen[j];
        roff[j] = a, rlen[j] = b;
    }
    memset(back, 0, FILE_BYTES);
    uint64_t read_bytes = 0;
    for (int i = 0; i < nr; i++) {
        s = st_io_read(io, 0, roff[i], back + roff[i], rlen[i], &tickets[i], &err);
        CHECK(s == ST_OK, "%s: read: %s", engine, err.msg);
        read_bytes += rlen[i];
    }
    for (int i = 0; i < nr; i++) CHECK(st_io_wait(io, tickets[i], &err) == ST_OK, "%s: read wait: %s", engine, err.msg);
    CHECK(read_bytes == FILE_BYTES && !memcmp(back, ref, FILE_BYTES), "%s: %d shuffled reads do not read back byte for byte",
          engine, nr);
    /* And the whole file in one request (24 pieces in flight from one ticket). */
    uint64_t t;
    memset(back, 0, FILE_BYTES);
    CHECK(st_io_read(io, 0, 0, back, FILE_BYTES, &t, &err) == ST_OK, "%s: full read: %s", engine, err.msg);
    CHECK(st_io_wait(io, t, &err) == ST_OK, "%s: full read wait: %s", engine, err.msg);
    CHECK(!memcmp(back, ref, FILE_BYTES), "%s: the whole file does not read back byte for byte", engine);

    st_io_path_stats ps;
    st_io_get_stats(io, 0, &ps);
    CHECK(ps.write_bytes == FILE_BYTES, "%s: stats write_bytes %llu", engine, (unsigned long long)ps.write_bytes);
    CHECK(ps.read_bytes == read_bytes + FILE_BYTES, "%s: stats read_bytes %llu, expected %llu", engine,
          (unsigned long long)ps.read_bytes, (unsigned long long)(read_bytes + FILE_BYTES));
    CHECK(ps.busy_s > 0, "%s: busy time %g", engine, ps.busy_s);

    /* Errors at submit: past the end, misaligned, a bad path index, a bad ticket. */
    err.msg[0] = 0;
    s = st_io_read(io, 0, FILE_BYTES - ST_IO_ALIGN, back, 2 * ST_IO_ALIGN, &t, &err);
    CHECK(s == ST_ERR_INVALID && strstr(err.msg, name) && strstr(err.msg, "past the end"),
          "%s: read past the end: %d %s", engine, s, err.msg);
    s = st_io_write(io, 0, 100, ref, ST_IO_ALIGN, &t, &err);
    CHECK(s == ST_ERR_INVALID && strstr(err.msg, "4096"), "%s: misaligned: %s", engine, err.msg);
    s = st_io_read(io, 3, 0, back, ST_IO_ALIGN, &t, &err);
    CHECK(s == ST_ERR_INVALID, "%s: bad path index accepted", engine);
    CHECK(st_io_wait(io, 987654321, &err) == ST_ERR_INVALID, "%s: unknown ticket accepted", engine);

    char file[4096];
    snprintf(file, sizeof file, "%s", st_io_engine_file(io, 0));
    /* An error at completion: the file shrinks behind the engine's back, so a read of
     * its tail comes back short; the message names the file and the offset. */
    CHECK(truncate(file, FILE_BYTES / 2) == 0, "truncate: %s", strerror(errno));
    s = st_io_read(io, 0, FILE_BYTES - 2 * ST_IO_ALIGN, back, 2 * ST_IO_ALIGN, &t, &err);
    CHECK(s == ST_OK, "%s: submit: %s", engine, err.msg);
    if (s == ST_OK) {
        s = st_io_wait(io, t, &err);
        char offs[32];
        snprintf(offs, sizeof offs, "%u", FILE_BYTES - 2 * ST_IO_ALIGN);
        CHECK(s == ST_ERR_TRUNCATED && strstr(err.msg, file) && strstr(err.msg, offs) && strstr(err.msg, "short read"),
              "%s: short read: %d %s", engine, s, err.msg);
    }
    st_io_engine_destroy(io);
    CHECK(access(file, F_OK) != 0, "%s: %s not removed at destroy", engine, file);
    st_io_free(ref);
    st_io_free(back);
}

/* Two paths at once, each its own file and ring/pool, in flight together. */
static void two_paths(const char *engine, const char *dir) {
    setenv("STRATA_IO", engine, 1);
    char d1[4096], d2[4096];
    snprintf(d1, sizeof d1, "%s/p1", dir);
    snprintf(d2, sizeof d2, "%s/p2", dir);
    mkdir(d1, 0755);
    mkdir(d2, 0755);
    const char *paths[2] = {d1, d2};
    st_io_config cfg = {.paths = paths, .n_paths = 2, .file_bytes = 8u << 20, .request_bytes = 2u << 20, .depth = 64};
    st_err err = {0};
    st_io_engine *io;
    st_status s = st_io_engine_create(&io, &cfg, &err);
    if (s == ST_ERR_UNSUPPORTED) return;
    CHECK(s == ST_OK, "%s: two paths: %s", engine, err.msg);
    if (s != ST_OK) return;
    unsigned char *a = st_io_alloc(8u << 20), *b = st_io_alloc(8u << 20), *ra = st_io_alloc(8u << 20),
                  *rb = st_io_alloc(8u << 20);
    memset(a, 0xA5, 8u << 20);
    memset(b, 0x5A, 8u << 20);
    uint64_t t[4];
    CHECK(st_io_write(io, 0, 0, a, 8u << 20, &t[0], &err) == ST_OK, "w0 %s", err.msg);
    CHECK(st_io_write(io, 1, 0, b, 8u << 20, &t[1], &err) == ST_OK, "w1 %s", err.msg);
    CHECK(st_io_wait(io, t[1], &err) == ST_OK, "wait out of order: %s", err.msg);
    CHECK(st_io_wait(io, t[0], &err) == ST_OK, "wait: %s", err.msg);
    CHECK(st_io_read(io, 0, 0, ra, 8u << 20, &t[2], &err) == ST_OK, "r0 %s", err.msg);
    CHECK(st_io_read(io, 1, 0, rb, 8u << 20, &t[3], &err) == ST_OK, "r1 %s", err.msg);
    CHECK(st_io_wait(io, t[2], &err) == ST_OK && st_io_wait(io, t[3], &err) == ST_OK, "read waits: %s", err.msg);
    CHECK(!memcmp(a, ra, 8u << 20) && !memcmp(b, rb, 8u << 20), "%s: two paths do not read back", engine);
    st_io_engine_destroy(io);
    st_io_free(a); st_io_free(b); st_io_free(ra); st_io_free(rb);
}

static void errors(const char *dir) {
    setenv("STRATA_IO", "auto", 1);
    st_err err = {0};
    st_io_engine *io = NULL;
    char missing[4096];
    snprintf(missing, sizeof missing, "%s/does/not/exist", dir);
    const char *paths[1] = {missing};
    st_io_config cfg = {.paths = paths, .n_paths = 1, .file_bytes = 1u << 20};
    st_status s = st_io_engine_create(&io, &cfg, &err);
    CHECK(s == ST_ERR_IO && strstr(err.msg, missing) && !io, "missing directory: %d %s", s, err.msg);
    cfg.paths = (const char *const[]){dir};
    cfg.request_bytes = 8u << 20;
    CHECK(st_io_engine_create(&io, &cfg, &err) == ST_ERR_INVALID, "8 MiB requests accepted");
    cfg.request_bytes = 0;
    cfg.depth = 8;
    CHECK(st_io_engine_create(&io, &cfg, &err) == ST_ERR_INVALID, "depth 8 accepted");
    cfg.depth = 0;

    /* per-path sizes: each file its own; a path with no size at all is refused */
    char d1[4096], d2[4096];
    snprintf(d1, sizeof d1, "%s/sz1", dir);
    snprintf(d2, sizeof d2, "%s/sz2", dir);
    mkdir(d1, 0755);
    mkdir(d2, 0755);
    const char *two[2] = {d1, d2};
    uint64_t sizes[2] = {8u << 20, 0};
    st_io_config pc = {.paths = two, .n_paths = 2, .path_file_bytes = sizes};
    s = st_io_engine_create(&io, &pc, &err);
    CHECK(s == ST_ERR_INVALID && strstr(err.msg, "no file size") && strstr(err.msg, d2) && !io,
          "a path without a size: %d %s", s, err.msg);
    sizes[1] = 4u << 20;
    CHECK(st_io_engine_create(&io, &pc, &err) == ST_OK, "per-path sizes: %s", err.msg);
    if (io) {
        CHECK(st_io_engine_path_bytes(io, 0) == (8u << 20) && st_io_engine_path_bytes(io, 1) == (4u << 20) &&
                  st_io_engine_file_bytes(io) == (8u << 20),
              "sizes %llu %llu, largest %llu", (unsigned long long)st_io_engine_path_bytes(io, 0),
              (unsigned long long)st_io_engine_path_bytes(io, 1), (unsigned long long)st_io_engine_file_bytes(io));
        void *b = st_io_alloc(1u << 20);
        uint64_t t;
        CHECK(st_io_write(io, 1, 4u << 20, b, 1u << 20, &t, &err) == ST_ERR_INVALID && strstr(err.msg, "past the end"),
              "a write past path 1's 4 MiB: %s", err.msg);
        CHECK(st_io_write(io, 0, 4u << 20, b, 1u << 20, &t, &err) == ST_OK && st_io_wait(io, t, &err) == ST_OK,
              "a write inside path 0's 8 MiB: %s", err.msg);
        st_io_free(b);
        st_io_engine_destroy(io);
        io = NULL;
    }

    /* A full disk: a 1 MiB tmpfs asked for 4 MiB. Needs mount rights; skip otherwise. */
    char small[4096];
    snprintf(small, sizeof small, "%s/small", dir);
    mkdir(small, 0755);
    if (mount("tmpfs", small, "tmpfs", 0, "size=1M") != 0) {
        printf("cannot mount a 1 MiB tmpfs (%s): ENOSPC check skipped\n", strerror(errno));
        return;
    }
    cfg.paths = (const char *const[]){small};
    cfg.depth = 0;
    cfg.file_bytes = 4u << 20;
    s = st_io_engine_create(&io, &cfg, &err);
    CHECK(s == ST_ERR_NOSPACE && strstr(err.msg, small) && strstr(err.msg, "missing"), "full disk: %d %s", s,
          err.msg);
    printf("full disk: %s\n", err.msg);
    umount(small);
}

/* The tier's disk probe: figures for the file it was asked for, the file gone after. */
static void probe(const char *dir) {
    st_err err = {0};
    st_io_probe_result r;
    st_status s = st_io_probe(dir, 8u << 20, 0, 0, &r, &err);
    CHECK(s == ST_OK, "probe of %s: %s", dir, err.msg);
    if (s != ST_OK) return;
    CHECK(r.bytes == 8u << 20 && r.read_gbps > 0 && r.write_gbps > 0 && r.mixed_gbps > 0 && r.depth >= ST_IO_MIN_DEPTH &&
              r.request_bytes >= ST_IO_MIN_REQUEST && r.engine && (r.direct == 0 || r.direct == 1),
          "probe figures: bytes %llu, read %g, write %g, mixed %g GB/s, depth %d, request %zu",
          (unsigned long long)r.bytes, r.read_gbps, r.write_gbps, r.mixed_gbps, r.depth, r.request_bytes);
    char file[4200];
    snprintf(file, sizeof file, "%s/strata-probe.tmp", dir);
    CHECK(access(file, F_OK) != 0, "probe left %s behind", file);
    char missing[4200];
    snprintf(missing, sizeof missing, "%s/no-such-dir", dir);
    s = st_io_probe(missing, 8u << 20, 0, 0, &r, &err);
    CHECK(s != ST_OK && strstr(err.msg, missing), "probe of a missing directory: %s (%s)", st_status_name(s), err.msg);
}

int main(void) {
    st_log_set_level(1);
    const char *dir = test_tmpdir();
    round_trip("uring", dir);
    round_trip("threads", dir);
    /* tmpfs: buffered where it refuses O_DIRECT (kernels before 6.6), same results. */
    char shm[] = "/dev/shm/strata-test-io-XXXXXX";
    if (mkdtemp(shm)) {
        round_trip("uring", shm);
        rmdir(shm);
    }
    two_paths("uring", dir);
    two_paths("threads", dir);
    errors(dir);
    probe(dir);
    return test_finish("io");
}
