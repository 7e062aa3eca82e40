/* train_state.c - write and validate train_state.bin (layout in ckpt.h). */
#include "strata/ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fileutil.h"

#define MAGIC "STRATAts"
#define MAX_BUFS 16

st_status train_state_save(const char *path, const train_state_header *h, optim *o, st_err *err) {
    int k = optim_state_count(o);
    if (k > MAX_BUFS) return st_errf(err, ST_ERR_INVALID, "optimizer has %d state buffers (max %d)", k, MAX_BUFS);
    uint8_t head[64] = {0};
    memcpy(head, MAGIC, 8);
    uint32_t u32 = ST_TRAIN_STATE_VERSION;
    memcpy(head + 8, &u32, 4);
    u32 = (uint32_t)optim_format(o);
    memcpy(head + 12, &u32, 4);
    if (h->data_state_bytes > ST_DATA_STATE_MAX)
        return st_errf(err, ST_ERR_INVALID, "data state of %llu bytes exceeds %d", (unsigned long long)h->data_state_bytes,
                       ST_DATA_STATE_MAX);
    uint64_t f[5] = {h->step, h->adam_step, h->rng, h->data_state_bytes, h->n_params};
    memcpy(head + 16, f, sizeof f);
    u32 = (uint32_t)k;
    memcpy(head + 56, &u32, 4);
    uint64_t sizes[MAX_BUFS];
    for (int i = 0; i < k; i++) {
        size_t b;
        optim_state_buffer(o, i, &b);
        sizes[i] = b;
    }
    st_file_writer w;
    st_status s = st_file_writer_open(&w, path, err);
    if (s) return s;
    s = st_file_writer_put(&w, head, sizeof head, err);
    if (!s) s = st_file_writer_put(&w, sizes, sizeof(uint64_t) * (size_t)k, err);
    if (!s) s = st_file_writer_put(&w, h->data_state, h->data_state_bytes, err);
    for (int i = 0; i < k && !s; i++) {
        size_t b;
        void *p = optim_state_buffer(o, i, &b);
        s = st_file_writer_put(&w, p, b, err);
    }
    if (!s) {
        uint32_t crc = w.crc;
        s = st_file_writer_put(&w, &crc, 4, err);
    }
    return st_file_writer_close(&w, s, err);
}

st_status train_state_load(const char *path, train_state_header *h, optim *o, st_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return st_errf(err, ST_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb)) {
        close(fd);
        return st_errf(err, ST_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    }
    size_t len = (size_t)sb.st_size;
    if (len < 64 + 4) {
        close(fd);
        return st_errf(err, ST_ERR_TRUNCATED, "%s: %zu bytes is shorter than the 68-byte minimum; the file is truncated",
                       path, len);
    }
    uint8_t *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return st_errf(err, ST_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
    st_status s = ST_OK;
    uint32_t version, fmt, k;
    memcpy(&version, map + 8, 4);
    memcpy(&fmt, map + 12, 4);
    memcpy(&k, map + 56, 4);
    if (memcmp(map, MAGIC, 8)) {
        s = st_errf(err, ST_ERR_FORMAT, "%s: offset 0: wrong magic (not a strata train_state.bin)", path);
        goto out;
    }
    if (version != ST_TRAIN_STATE_VERSION) {
        s = st_errf(err, ST_ERR_FORMAT, "%s: offset 8: version %u, this strata reads version %u; use a matching strata",
                    path, version, ST_TRAIN_STATE_VERSION);
        goto out;
    }
    if (k > MAX_BUFS || 64 + 8ull * k + 4 > len) {
        s = st_errf(err, ST_ERR_TRUNCATED, "%s: offset 56: %u buffers do not fit in %zu bytes; the file is truncated or "
                    "corrupt", path, k, len);
        goto out;
    }
    uint64_t sizes[MAX_BUFS], total = 64 + 8ull * k + 4, dbytes;
    memcpy(sizes, map + 64, 8ull * k);
    memcpy(&dbytes, map + 40, 8);
    if (dbytes > ST_DATA_STATE_MAX) {
        s = st_errf(err, ST_ERR_FORMAT, "%s: offset 40: data state of %llu bytes exceeds %d; the file is corrupt", path,
                    (unsigned long long)dbytes, ST_DATA_STATE_MAX);
        goto out;
    }
    total += dbytes;
    for (uint32_t i = 0; i < k; i++) {
        if (sizes[i] > len) { /* also keeps the sum from wrapping around to the file's size */
            s = st_errf(err, ST_ERR_FORMAT, "%s: offset %llu: buffer %u of %llu bytes is larger than the file (%zu "
                        "bytes); the file is corrupt", path, (unsigned long long)(64 + 8ull * i), i,
                        (unsigned long long)sizes[i], len);
            goto out;
        }
        total += sizes[i];
    }
    if (total != len) {
        s = st_errf(err, total > len ? ST_ERR_TRUNCATED : ST_ERR_FORMAT,
                    "%s: the header describes %llu bytes but the file has %zu; it is %s", path,
                    (unsigned long long)total, len, total > len ? "truncated" : "corrupt");
        goto out;
    }
    uint32_t stored, crc = st_crc32c(0, map, len - 4);
    memcpy(&stored, map + len - 4, 4);
    if (crc != stored) {
        s = st_errf(err, ST_ERR_CHECKSUM, "%s: checksum mismatch (stored %08x, computed %08x over bytes 0..%zu); the "
                    "file is corrupt, resume from an earlier checkpoint", path, stored, crc, len - 4);
        goto out;
    }
    uint64_t f[5];
    memcpy(f, map + 16, sizeof f);
    if (fmt != (uint32_t)optim_format(o) || (int)k != optim_state_count(o) || f[4] != optim_numel(o)) {
        s = st_errf(err, ST_ERR_SHAPE, "%s: optimizer state is format %u with %u buffers for %llu parameters, but this "
                    "run has format %d with %d buffers for %zu parameters; resume with the same model and optim_state",
                    path, fmt, k, (unsigned long long)f[4], optim_format(o), optim_state_count(o), optim_numel(o));
        goto out;
    }
    size_t off = 64 + 8ull * k + dbytes;
    for (uint32_t i = 0; i < k; i++) {
        size_t b;
        optim_state_buffer(o, (int)i, &b);
        if (b != sizes[i]) {
            s = st_errf(err, ST_ERR_SHAPE, "%s: offset %zu: buffer %u has %llu bytes, this run needs %zu", path,
                        (size_t)(64 + 8 * i), i, (unsigned long long)sizes[i], b);
            goto out;
        }
    }
    for (uint32_t i = 0; i < k; i++) {
        size_t b;
        void *p = optim_state_buffer(o, (int)i, &b);
        memcpy(p, map + off, b);
        off += b;
    }
    h->step = f[0];
    h->adam_step = f[1];
    h->rng = f[2];
    h->data_state_bytes = dbytes;
    memcpy(h->data_state, map + 64 + 8ull * k, dbytes);
    h->n_params = f[4];
out:
    munmap(map, len);
    return s;
}
