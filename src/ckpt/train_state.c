/* train_state.c - write and validate train_state.bin (layout in ckpt.h). */
#include "strata/ckpt.h"
#include "strata/dist.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <json-c/json.h>
#include <stdio.h>

#include "core/fileutil.h"

#define MAGIC "STRATAts"
#define MAX_BUFS 16

st_status st_train_state_save(const char *path, const st_train_state_header *h, st_optim *o, st_err *err) {
    int k = st_optim_state_count(o);
    if (k > MAX_BUFS) return st_errf(err, ST_ERR_INVALID, "optimizer has %d state buffers (max %d)", k, MAX_BUFS);
    uint8_t head[64] = {0};
    memcpy(head, MAGIC, 8);
    uint32_t u32 = ST_TRAIN_STATE_VERSION;
    memcpy(head + 8, &u32, 4);
    u32 = (uint32_t)st_optim_format(o);
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
        st_optim_state_buffer(o, i, &b);
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
        void *p = st_optim_state_buffer(o, i, &b);
        s = st_file_writer_put(&w, p, b, err);
    }
    if (!s) {
        uint32_t crc = w.crc;
        s = st_file_writer_put(&w, &crc, 4, err);
    }
    return st_file_writer_close(&w, s, err);
}

/* A train_state.bin mapped and checked (magic, version, sizes, CRC): what it holds. */
typedef struct ts_file {
    uint8_t *map;
    size_t len;
    uint32_t fmt, k;
    uint64_t sizes[MAX_BUFS], f[5], dbytes;
    size_t data_off; /* the first buffer */
} ts_file;

static void ts_unmap(ts_file *t) {
    if (t->map) munmap(t->map, t->len);
    t->map = NULL;
}

static st_status ts_map(const char *path, ts_file *t, st_err *err) {
    memset(t, 0, sizeof *t);
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
    t->map = map;
    t->len = len;
    t->fmt = fmt;
    t->k = k;
    memcpy(t->sizes, sizes, sizeof(uint64_t) * k);
    memcpy(t->f, map + 16, sizeof t->f);
    t->dbytes = dbytes;
    t->data_off = 64 + 8ull * k + dbytes;
    return ST_OK;
out:
    munmap(map, len);
    return s;
}

static void ts_header(const ts_file *t, st_train_state_header *h) {
    h->step = t->f[0];
    h->adam_step = t->f[1];
    h->rng = t->f[2];
    h->data_state_bytes = t->dbytes;
    memcpy(h->data_state, t->map + 64 + 8ull * t->k, t->dbytes);
    h->n_params = t->f[4];
}

st_status st_train_state_load(const char *path, st_train_state_header *h, st_optim *o, st_err *err) {
    ts_file t;
    st_status s = ts_map(path, &t, err);
    if (s) return s;
    if (t.fmt != (uint32_t)st_optim_format(o) || (int)t.k != st_optim_state_count(o) || t.f[4] != st_optim_numel(o)) {
        s = st_errf(err, ST_ERR_SHAPE, "%s: optimizer state is format %u with %u buffers for %llu parameters, but this "
                    "run has format %d with %d buffers for %zu parameters; resume with the same model and optim_state",
                    path, t.fmt, t.k, (unsigned long long)t.f[4], st_optim_format(o), st_optim_state_count(o),
                    st_optim_numel(o));
        goto out;
    }
    for (uint32_t i = 0; i < t.k; i++) {
        size_t b;
        st_optim_state_buffer(o, (int)i, &b);
        if (b != t.sizes[i]) {
            s = st_errf(err, ST_ERR_SHAPE, "%s: offset %zu: buffer %u has %llu bytes, this run needs %zu", path,
                        (size_t)(64 + 8 * i), i, (unsigned long long)t.sizes[i], b);
            goto out;
        }
    }
    size_t off = t.data_off;
    for (uint32_t i = 0; i < t.k; i++) {
        size_t b;
        void *p = st_optim_state_buffer(o, (int)i, &b);
        memcpy(p, t.map + off, b);
        off += b;
    }
    ts_header(&t, h);
out:
    ts_unmap(&t);
    return s;
}

/* ------------------------------------------------------------------ shards */

static void shard_name(char *buf, size_t cap, const char *dir, int rank) {
    snprintf(buf, cap, "%s/train_state.rank%05d.bin", dir, rank);
}

st_status st_train_state_save_shard(const char *dir, int rank, const st_train_state_header *h, st_optim *o, st_err *err) {
    char path[4200];
    shard_name(path, sizeof path, dir, rank);
    st_train_state_header *hs = malloc(sizeof *hs);
    if (!hs) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    *hs = *h;
    hs->n_params = st_optim_numel(o); /* the file describes its shard's elements */
    st_status s = st_train_state_save(path, hs, o, err);
    free(hs);
    return s;
}

st_status st_train_state_save_shards_json(const char *dir, int world, int zero, st_optim_state_format fmt, size_t n_params,
                                       const size_t *bounds, st_err *err) {
    json_object *root = json_object_new_object(), *b = json_object_new_array();
    json_object_object_add(root, "format", json_object_new_string("strata-shards"));
    json_object_object_add(root, "version", json_object_new_int(1));
    json_object_object_add(root, "world", json_object_new_int(world));
    json_object_object_add(root, "zero", json_object_new_int(zero));
    json_object_object_add(root, "optim_state", json_object_new_string(st_optim_state_name(fmt)));
    json_object_object_add(root, "n_params", json_object_new_uint64(n_params));
    for (int r = 0; r <= world; r++) json_object_array_add(b, json_object_new_uint64(bounds[r]));
    json_object_object_add(root, "bounds", b);
    const char *text = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY);
    char path[4200];
    snprintf(path, sizeof path, "%s/" ST_SHARDS_JSON, dir);
    st_status s = st_write_text(path, text, err);
    json_object_put(root);
    return s;
}

/* shards.json: the world and the bounds (malloc'd world + 1), checked. */
static st_status read_shards_json(const char *path, int *world, size_t **bounds, size_t n_params, st_err *err) {
    json_object *root = json_object_from_file(path), *v, *b;
    st_status s = ST_OK;
    *bounds = NULL;
    if (!root) return st_errf(err, ST_ERR_FORMAT, "%s: not readable JSON (%s)", path, json_util_get_last_err());
    if (!json_object_object_get_ex(root, "format", &v) || strcmp(json_object_get_string(v), "strata-shards")) {
        s = st_errf(err, ST_ERR_FORMAT, "%s: key 'format' is not \"strata-shards\"", path);
        goto out;
    }
    if (!json_object_object_get_ex(root, "world", &v) || (*world = json_object_get_int(v)) < 1 || *world > 1 << 20 ||
        !json_object_object_get_ex(root, "bounds", &b) || !json_object_is_type(b, json_type_array) ||
        (int)json_object_array_length(b) != *world + 1) {
        s = st_errf(err, ST_ERR_FORMAT, "%s: keys 'world' and 'bounds' must give W >= 1 and W + 1 bounds", path);
        goto out;
    }
    if (!json_object_object_get_ex(root, "n_params", &v) || json_object_get_uint64(v) != n_params) {
        s = st_errf(err, ST_ERR_SHAPE, "%s: key 'n_params' is %llu, the model has %zu parameters; resume with the "
                    "same model", path, v ? (unsigned long long)json_object_get_uint64(v) : 0ull, n_params);
        goto out;
    }
    if (!(*bounds = malloc(sizeof(size_t) * (size_t)(*world + 1)))) {
        s = st_errf(err, ST_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int r = 0; r <= *world; r++) {
        (*bounds)[r] = (size_t)json_object_get_uint64(json_object_array_get_idx(b, (size_t)r));
        if ((r == 0 && (*bounds)[0] != 0) || (r > 0 && (*bounds)[r] < (*bounds)[r - 1]) ||
            (r == *world && (*bounds)[r] != n_params)) {
            s = st_errf(err, ST_ERR_FORMAT, "%s: key 'bounds': entry %d (%zu) is out of order or does not end at %zu",
                        path, r, (*bounds)[r], n_params);
            goto out;
        }
    }
out:
    if (s) {
        free(*bounds);
        *bounds = NULL;
    }
    json_object_put(root);
    return s;
}

/* Bytes of state buffer i that the elements [0, x) of the vector take in one process's
 * layout: the state of the segments clipped to [0, x). */
static st_status prefix_bytes(const st_optim_segment *segs, int n_segs, st_optim_state_format fmt, size_t x, int i,
                              size_t *out, st_err *err) {
    *out = 0;
    if (!x) return ST_OK;
    st_optim_segment *clip = malloc(sizeof *clip * (size_t)n_segs);
    if (!clip) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    int k = st_zero_clip_segments(segs, n_segs, 0, x, clip);
    st_optim *o = NULL;
    st_status s = k ? st_optim_create_unbound(&o, clip, k, fmt, err) : ST_OK;
    if (!s && o) *out = st_optim_state_buffer_bytes(o, i);
    st_optim_free(o);
    free(clip);
    return s;
}

st_status st_train_state_load_shard(const char *dir, st_train_state_header *h, st_optim *o, const st_optim_segment *segs,
                                 int n_segs, size_t lo, size_t hi, st_err *err) {
    char path[4200];
    size_t n_params = 0;
    for (int j = 0; j < n_segs; j++)
        if (segs[j].offset + segs[j].n > n_params) n_params = segs[j].offset + segs[j].n;
    int world = 1;
    size_t one[2] = {0, n_params}, *bounds = one, *owned = NULL;
    snprintf(path, sizeof path, "%s/" ST_SHARDS_JSON, dir);
    int sharded = access(path, R_OK) == 0;
    st_status s = ST_OK;
    if (sharded && (s = read_shards_json(path, &world, &owned, n_params, err))) return s;
    if (owned) bounds = owned;
    int k = st_optim_state_count(o);
    size_t mine[MAX_BUFS], got[MAX_BUFS] = {0};
    for (int i = 0; i < k && !s; i++) s = prefix_bytes(segs, n_segs, st_optim_format(o), lo, i, &mine[i], err);
    int have_header = 0;
    for (int q = 0; q < world && !s; q++) {
        size_t qlo = bounds[q], qhi = bounds[q + 1];
        /* the shards this rank's elements come from (and the first one for the header) */
        if (qhi <= qlo || ((qhi <= lo || qlo >= hi) && have_header)) continue;
        if (sharded) shard_name(path, sizeof path, dir, q);
        else snprintf(path, sizeof path, "%s/train_state.bin", dir);
        ts_file t;
        if ((s = ts_map(path, &t, err))) break;
        if (t.fmt != (uint32_t)st_optim_format(o) || (int)t.k != k || t.f[4] != qhi - qlo) {
            s = st_errf(err, ST_ERR_SHAPE, "%s: optimizer state is format %u with %u buffers for %llu parameters, but "
                        "this run has format %d with %d buffers and the checkpoint's description gives the file %zu "
                        "parameters; resume with the same model and optim_state", path, t.fmt, t.k,
                        (unsigned long long)t.f[4], st_optim_format(o), k, qhi - qlo);
            ts_unmap(&t);
            break;
        }
        if (!have_header) {
            ts_header(&t, h);
            h->n_params = n_params;
            have_header = 1;
        }
        size_t off = t.data_off;
        for (int i = 0; i < k && !s; i++) {
            size_t gq = 0, mb;
            uint8_t *dst = st_optim_state_buffer(o, i, &mb);
            s = prefix_bytes(segs, n_segs, st_optim_format(o), qlo, i, &gq, err);
            size_t a = gq > mine[i] ? gq : mine[i];
            size_t e = gq + t.sizes[i] < mine[i] + mb ? gq + t.sizes[i] : mine[i] + mb;
            if (!s && e > a) {
                memcpy(dst + (a - mine[i]), t.map + off + (a - gq), e - a);
                got[i] += e - a;
            }
            off += t.sizes[i];
        }
        ts_unmap(&t);
    }
    for (int i = 0; i < k && !s; i++) {
        size_t mb;
        st_optim_state_buffer(o, i, &mb);
        if (got[i] != mb)
            s = st_errf(err, ST_ERR_FORMAT, "%s: the shards give %zu of the %zu bytes of state buffer %d for elements "
                        "[%zu, %zu); the checkpoint is incomplete or its shards were cut elsewhere", dir, got[i], mb,
                        i, lo, hi);
    }
    free(owned);
    return s;
}
