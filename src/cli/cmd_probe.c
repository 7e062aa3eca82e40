/* cmd_probe.c - strata probe: measure each disk path's sequential write and read
 * bandwidth through the io engine itself (its request size, its queue depth, O_DIRECT
 * where the filesystem takes it), so the plan's time model sees what training will get,
 * and write the figures as a hardware profile (JSON).
 *
 * Honesty about caches: the write time includes fdatasync, and before the read pass the
 * file's pages are dropped from the page cache (POSIX_FADV_DONTNEED), which matters only
 * when the engine fell back to buffered I/O. A tmpfs path is memory, not a disk: it is
 * measured and marked "memory": true. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/cli_probe.h"
#include "strata/io.h"

#define PROBE_MAX_PATHS 64
#define PROBE_BUF_BYTES (64u << 20) /* one buffer reused for every request */
#define FS_TMPFS_MAGIC 0x01021994
#define FS_RAMFS_MAGIC 0x858458f6

typedef struct probe_result {
    const char *path;
    const char *engine;
    int direct, memory;
    double read_gbps, write_gbps, mixed_gbps;
    size_t request_bytes;
    int depth;
    uint64_t bytes;
} probe_result;

static void probe_usage(FILE *f) {
    fputs("usage: strata probe --path DIR [--path DIR2 ...] [--bytes 1GiB] [--request 1MiB]\n"
          "                    [--depth 32] [--json] [-o profile.json]\n"
          "\n"
          "Writes a test file of --bytes in each path through the io engine (io_uring, or the\n"
          "thread pool with STRATA_IO=threads), times a sequential write (with fdatasync), a\n"
          "sequential read (page cache dropped) and a mixed pass (alternate requests read and\n"
          "write, as the optimizer streaming its state does), removes the file, and prints each\n"
          "path's bandwidth in GB/s (1e9 bytes/s). A tmpfs path is reported as memory. --json\n"
          "prints the profile, -o writes it to a file:\n"
          "  {\"paths\":[{\"path\",\"engine\",\"direct\",\"memory\",\"read_gbps\",\"write_gbps\",\n"
          "              \"mixed_gbps\",\"request_bytes\",\"depth\",\"bytes\"}]}\n",
          f);
}

/* Submit [0, bytes) as buffer-sized requests, all at once (the engine keeps `depth`
 * pieces in flight and blocks the submitter beyond that), then wait for every one. */
/* write: 0 read, 1 write, 2 mixed (even requests read, odd ones write: what an
 * optimizer step streaming its state does) */
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

static st_status probe_path(probe_result *r, const char *path, uint64_t bytes, size_t request, int depth, void *buf,
                            st_err *err) {
    const char *paths[1] = {path};
    st_io_config cfg = {.paths = paths, .n_paths = 1, .file_bytes = bytes, .file_name = "strata-probe.tmp",
                        .request_bytes = request, .depth = depth};
    st_io_engine *io;
    st_status s = st_io_engine_create(&io, &cfg, err);
    if (s != ST_OK) return s;
    st_io_register_buffer(io, buf, PROBE_BUF_BYTES, NULL); /* best effort: plain requests otherwise */
    struct statfs fs;
    r->path = path;
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

st_status cli_probe_measure(const char *path, uint64_t bytes, double *read_gbps, double *write_gbps,
                            double *mixed_gbps, int *memory, st_err *err) {
    void *buf = st_io_alloc(PROBE_BUF_BYTES);
    if (!buf) return st_errf(err, ST_ERR_NOMEM, "probe: out of memory");
    st_rng rng;
    st_rng_seed(&rng, 1);
    for (size_t i = 0; i < PROBE_BUF_BYTES; i += 8) {
        uint64_t x = st_rng_u64(&rng);
        memcpy((char *)buf + i, &x, 8);
    }
    probe_result r = {0};
    st_status s = probe_path(&r, path, bytes, 0, 0, buf, err);
    st_io_free(buf);
    if (s == ST_OK) {
        *read_gbps = r.read_gbps;
        *write_gbps = r.write_gbps;
        *mixed_gbps = r.mixed_gbps;
        if (memory) *memory = r.memory;
    }
    return s;
}

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static void write_json(FILE *f, const probe_result *r, int n) {
    fputs("{\"paths\": [", f);
    for (int i = 0; i < n; i++) {
        fputs(i ? ",\n  {\"path\": " : "\n  {\"path\": ", f);
        json_str(f, r[i].path);
        fprintf(f,
                ", \"engine\": \"%s\", \"direct\": %s, \"memory\": %s, \"read_gbps\": %.3f, \"write_gbps\": %.3f, "
                "\"mixed_gbps\": %.3f, \"request_bytes\": %zu, \"depth\": %d, \"bytes\": %llu}",
                r[i].engine, r[i].direct ? "true" : "false", r[i].memory ? "true" : "false", r[i].read_gbps,
                r[i].write_gbps, r[i].mixed_gbps, r[i].request_bytes, r[i].depth, (unsigned long long)r[i].bytes);
    }
    fputs("\n]}\n", f);
}

int cmd_probe(int argc, char **argv) {
    const char *paths[PROBE_MAX_PATHS];
    int n_paths = 0, json = 0, depth = 0;
    double bytes = 1073741824.0, request = 0;
    const char *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            probe_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "strata probe: '%s' needs a value or is unknown (see --help)\n", a);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--path")) {
            if (n_paths == PROBE_MAX_PATHS) {
                fprintf(stderr, "strata probe: at most %d paths\n", PROBE_MAX_PATHS);
                return 2;
            }
            paths[n_paths++] = v;
        } else if (!strcmp(a, "--bytes") || !strcmp(a, "--request")) {
            double b = cli_parse_bytes(v);
            if (b <= 0) {
                fprintf(stderr, "strata probe: %s '%s' is not a byte count (e.g. 1GiB, 64MiB)\n", a, v);
                return 2;
            }
            if (a[2] == 'b') bytes = b;
            else request = b;
        } else if (!strcmp(a, "--depth")) {
            depth = atoi(v);
        } else if (!strcmp(a, "-o")) {
            out = v;
        } else {
            fprintf(stderr, "strata probe: unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (n_paths == 0) {
        fprintf(stderr, "strata probe: give at least one --path DIR\n");
        probe_usage(stderr);
        return 2;
    }
    void *buf = st_io_alloc(PROBE_BUF_BYTES);
    probe_result *res = calloc((size_t)n_paths, sizeof *res);
    if (!buf || !res) {
        fprintf(stderr, "strata probe: out of memory\n");
        return 1;
    }
    /* Random bytes, so a compressing or deduplicating filesystem cannot shortcut. */
    st_rng rng;
    st_rng_seed(&rng, 1);
    for (size_t i = 0; i < PROBE_BUF_BYTES; i += 8) {
        uint64_t x = st_rng_u64(&rng);
        memcpy((char *)buf + i, &x, 8);
    }
    int rc = 0;
    for (int i = 0; i < n_paths; i++) {
        st_err err = {0};
        /* Paths one at a time: each figure is that path alone, not a share of a sum. */
        if (probe_path(&res[i], paths[i], (uint64_t)bytes, (size_t)request, depth, buf, &err) != ST_OK) {
            fprintf(stderr, "strata probe: %s\n", err.msg);
            rc = 1;
            break;
        }
        if (!json)
            printf("%-24s %-8s %-8s write %7.3f GB/s  read %7.3f GB/s  mixed %7.3f GB/s  (%llu MiB, %zu KiB x %d)%s\n",
                   paths[i], res[i].engine, res[i].direct ? "direct" : "buffered", res[i].write_gbps, res[i].read_gbps,
                   res[i].mixed_gbps,
                   (unsigned long long)(res[i].bytes >> 20), res[i].request_bytes >> 10, res[i].depth,
                   res[i].memory ? "  [tmpfs: memory, not a disk]" : "");
    }
    if (rc == 0) {
        if (json) write_json(stdout, res, n_paths);
        if (out) {
            FILE *f = fopen(out, "w");
            if (!f) {
                fprintf(stderr, "strata probe: cannot write %s\n", out);
                rc = 1;
            } else {
                write_json(f, res, n_paths);
                if (fclose(f) != 0) {
                    fprintf(stderr, "strata probe: writing %s failed\n", out);
                    rc = 1;
                }
            }
        }
    }
    free(res);
    st_io_free(buf);
    return rc;
}
