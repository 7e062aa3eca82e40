/* safetensors.c - validated reader (mmap; the pages of what it has checked or read given back
 * to the page cache) and atomic writer for safetensors files. */
#include "strata/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fileutil.h"

#define HEADER_MAX (100u << 20) /* the format caps headers at 100 MB */

struct st_safetensors {
    char *path;
    void *map;
    size_t map_len;
    const uint8_t *data; /* start of the data section */
    size_t data_len;
    st_tensor_entry *entries;
    int n;
    json_object *meta;   /* owned copy of __metadata__, or NULL */
};

static int cmp_begin(const void *a, const void *b) {
    const st_tensor_entry *x = *(const st_tensor_entry *const *)a, *y = *(const st_tensor_entry *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static st_status parse_entry(st_safetensors *st, const char *name, json_object *obj, st_tensor_entry *e, st_err *err) {
    const char *path = st->path;
    json_object *jd, *js, *jo;
    if (!json_object_is_type(obj, json_type_object) || !json_object_object_get_ex(obj, "dtype", &jd) ||
        !json_object_object_get_ex(obj, "shape", &js) || !json_object_object_get_ex(obj, "data_offsets", &jo))
        return st_errf(err, ST_ERR_FORMAT, "%s: tensor '%s' must have dtype, shape and data_offsets", path, name);
    if (!json_object_is_type(jd, json_type_string) || st_dtype_from_name(json_object_get_string(jd), &e->dtype))
        return st_errf(err, ST_ERR_FORMAT, "%s: tensor '%s' has dtype '%s', which strata does not know "
                       "(known: F32 BF16 F16 F64 I32 I64 U16 U8)", path, name, json_object_get_string(jd));
    if (!json_object_is_type(js, json_type_array) || json_object_array_length(js) > ST_MAX_DIMS)
        return st_errf(err, ST_ERR_FORMAT, "%s: tensor '%s' shape must be an array of at most %d sizes", path, name,
                       ST_MAX_DIMS);
    e->ndim = (int)json_object_array_length(js);
    size_t numel = 1;
    for (int i = 0; i < e->ndim; i++) {
        json_object *d = json_object_array_get_idx(js, (size_t)i);
        int64_t v = json_object_get_int64(d);
        if (!json_object_is_type(d, json_type_int) || v < 0 || v > (1ll << 40))
            return st_errf(err, ST_ERR_FORMAT, "%s: tensor '%s' dimension %d is not a valid size", path, name, i);
        e->shape[i] = v;
        if (v && numel > (SIZE_MAX >> 8) / (size_t)v)
            return st_errf(err, ST_ERR_FORMAT, "%s: tensor '%s' shape overflows", path, name);
        numel *= (size_t)v;
    }
    e->numel = numel;
    /* integers only: json-c would read "8" or 8.5 as 8 */
    if (!json_object_is_type(jo, json_type_array) || json_object_array_length(jo) != 2 ||
        !json_object_is_type(json_object_array_get_idx(jo, 0), json_type_int) ||
        !json_object_is_type(json_object_array_get_idx(jo, 1), json_type_int))
        return st_errf(err, ST_ERR_FORMAT, "%s: tensor '%s' data_offsets must be [begin, end], two integers", path,
                       name);
    int64_t b = json_object_get_int64(json_object_array_get_idx(jo, 0));
    int64_t en = json_object_get_int64(json_object_array_get_idx(jo, 1));
    if (b < 0 || en < b || (uint64_t)en > st->data_len)
        return st_errf(err, ST_ERR_FORMAT, "%s: tensor '%s' data_offsets [%lld, %lld] lie outside the %zu-byte data "
                       "section (file offset %zu); the file is truncated or its header is wrong", path, name,
                       (long long)b, (long long)en, st->data_len, (size_t)(st->data - (const uint8_t *)st->map));
    e->begin = (size_t)b;
    e->end = (size_t)en;
    if (e->end - e->begin != numel * st_dtype_size(e->dtype))
        return st_errf(err, ST_ERR_FORMAT, "%s: tensor '%s' has shape of %zu %s elements (%zu bytes) but "
                       "data_offsets span %zu bytes", path, name, numel, st_dtype_name(e->dtype),
                       numel * st_dtype_size(e->dtype), e->end - e->begin);
    e->name = strdup(name);
    return e->name ? ST_OK : st_errf(err, ST_ERR_NOMEM, "out of memory");
}

/* The whole pages of [p, p + len) of the read-only mapping given back: a reader's pages would
 * otherwise stay in the process (resident, counted in its RSS) until the close, a second copy of
 * every weight loaded beside the model's own. The file's pages stay in the page cache, and a later
 * read of them maps them again. */
static void give_back_pages(const void *p, size_t len) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)p + page - 1) / page * page,
              b = ((uintptr_t)p + len) / page * page;
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

st_status st_safetensors_open(st_safetensors **out, const char *path, st_err *err) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return st_errf(err, ST_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return st_errf(err, ST_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    }
    size_t len = (size_t)sb.st_size;
    if (len < 8) {
        close(fd);
        return st_errf(err, ST_ERR_TRUNCATED, "%s: %zu bytes is too short for a safetensors file (needs an 8-byte "
                       "header length)", path, len);
    }
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return st_errf(err, ST_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
    st_safetensors *st = calloc(1, sizeof *st);
    if (!st) { munmap(map, len); return st_errf(err, ST_ERR_NOMEM, "out of memory"); }
    st->path = strdup(path);
    st->map = map;
    st->map_len = len;
    uint64_t hlen;
    memcpy(&hlen, map, 8);
    st_status s = ST_OK;
    json_object *root = NULL;
    if (hlen > HEADER_MAX || hlen > len - 8) {
        s = st_errf(err, hlen > len - 8 ? ST_ERR_TRUNCATED : ST_ERR_FORMAT,
                    "%s: header length %llu at offset 0 exceeds the file (%zu bytes) or the 100 MB limit; "
                    "not a safetensors file, or truncated", path, (unsigned long long)hlen, len);
        goto fail;
    }
    st->data = (const uint8_t *)map + 8 + hlen;
    st->data_len = len - 8 - hlen;
    json_tokener *tok = json_tokener_new();
    root = json_tokener_parse_ex(tok, (const char *)map + 8, (int)hlen);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    size_t consumed = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    if (!root || jerr != json_tokener_success || !json_object_is_type(root, json_type_object)) {
        s = st_errf(err, ST_ERR_FORMAT, "%s: header (bytes 8..%llu) is not a JSON object: %s", path,
                    (unsigned long long)(8 + hlen), json_tokener_error_desc(jerr));
        goto fail;
    }
    for (size_t i = consumed; i < hlen; i++) {
        char c = ((const char *)map)[8 + i];
        if (c != ' ' && c != '\n' && c != '\t' && c != '\r' && c != 0) {
            s = st_errf(err, ST_ERR_FORMAT, "%s: trailing bytes after the JSON header at offset %zu", path, 8 + i);
            goto fail;
        }
    }
    int count = json_object_object_length(root);
    st->entries = calloc((size_t)count + 1, sizeof *st->entries);
    if (!st->entries) { s = st_errf(err, ST_ERR_NOMEM, "out of memory"); goto fail; }
    json_object_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) {
            st->meta = json_object_get(val);
            continue;
        }
        s = parse_entry(st, key, val, &st->entries[st->n], err);
        if (s) goto fail;
        st->n++;
    }
    /* overlapping tensors: sort by begin and check neighbours */
    if (st->n > 1) {
        st_tensor_entry **order = malloc(sizeof *order * (size_t)st->n);
        if (!order) { s = st_errf(err, ST_ERR_NOMEM, "out of memory"); goto fail; }
        for (int i = 0; i < st->n; i++) order[i] = &st->entries[i];
        qsort(order, (size_t)st->n, sizeof *order, cmp_begin);
        for (int i = 1; i < st->n; i++) {
            if (order[i]->begin < order[i - 1]->end && order[i]->end > order[i]->begin) {
                s = st_errf(err, ST_ERR_FORMAT, "%s: tensors '%s' [%zu, %zu) and '%s' [%zu, %zu) overlap in the data "
                            "section; the header is corrupt", path, order[i - 1]->name, order[i - 1]->begin,
                            order[i - 1]->end, order[i]->name, order[i]->begin, order[i]->end);
                free(order);
                goto fail;
            }
        }
        free(order);
    }
    json_object_put(root);
    root = NULL;
    const char *want = st_safetensors_meta(st, ST_SAFETENSORS_CRC_KEY);
    if (want) {
        uint32_t got = 0;
        for (size_t at = 0, piece = (size_t)8 << 20; at < st->data_len; at += piece) { /* 8 MiB mapped at a time */
            size_t k = st->data_len - at < piece ? st->data_len - at : piece;
            got = st_crc32c(got, st->data + at, k);
            give_back_pages(st->data + at, k);
        }
        char got_hex[16];
        snprintf(got_hex, sizeof got_hex, "%08x", got);
        if (strcmp(got_hex, want)) {
            s = st_errf(err, ST_ERR_CHECKSUM,
                        "%s: the data section (bytes %llu to %zu) has CRC-32C %s, its header records %s: the weights "
                        "were changed or damaged on disk; load another checkpoint",
                        path, (unsigned long long)(8 + hlen), len, got_hex, want);
            goto fail;
        }
    }
    *out = st;
    return ST_OK;
fail:
    if (root) json_object_put(root);
    st_safetensors_close(st);
    return s;
}

void st_safetensors_close(st_safetensors *st) {
    if (!st) return;
    for (int i = 0; i < st->n; i++) free(st->entries[i].name);
    free(st->entries);
    if (st->meta) json_object_put(st->meta);
    if (st->map) munmap(st->map, st->map_len);
    free(st->path);
    free(st);
}

int st_safetensors_count(const st_safetensors *st) { return st->n; }
const st_tensor_entry *st_safetensors_entry(const st_safetensors *st, int i) { return &st->entries[i]; }
const char *st_safetensors_path(const st_safetensors *st) { return st->path; }

const st_tensor_entry *st_safetensors_find(const st_safetensors *st, const char *name) {
    for (int i = 0; i < st->n; i++)
        if (!strcmp(st->entries[i].name, name)) return &st->entries[i];
    return NULL;
}

const void *st_safetensors_data(const st_safetensors *st, const st_tensor_entry *e) { return st->data + e->begin; }

const char *st_safetensors_meta(const st_safetensors *st, const char *key) {
    json_object *v;
    if (!st->meta || !json_object_object_get_ex(st->meta, key, &v)) return NULL;
    return json_object_get_string(v);
}

st_status st_safetensors_check_f32(const st_safetensors *st, const char *name, size_t numel, const int64_t *shape,
                                   int ndim, st_err *err) {
    const st_tensor_entry *e = st_safetensors_find(st, name);
    if (!e) return st_errf(err, ST_ERR_SHAPE, "%s: tensor '%s' is missing", st->path, name);
    if (e->numel != numel || (shape && (e->ndim != ndim || memcmp(e->shape, shape, sizeof(int64_t) * (size_t)ndim)))) {
        char got[128] = "", want[128] = "";
        for (int i = 0; i < e->ndim; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "", (long long)e->shape[i]);
        if (shape)
            for (int i = 0; i < ndim; i++)
                snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", i ? ", " : "", (long long)shape[i]);
        else snprintf(want, sizeof want, "%zu elements", numel);
        return st_errf(err, ST_ERR_SHAPE, "%s: tensor '%s' has shape [%s] but the model expects [%s]; the checkpoint "
                       "is for a different model configuration", st->path, name, got, want);
    }
    if (e->dtype != ST_F32 && e->dtype != ST_BF16 && e->dtype != ST_F16 && e->dtype != ST_F64)
        return st_errf(err, ST_ERR_FORMAT, "%s: tensor '%s' has dtype %s; a float type is needed", st->path, name,
                       st_dtype_name(e->dtype));
    return ST_OK;
}

st_status st_safetensors_read_f32(const st_safetensors *st, const char *name, float *dst, size_t numel,
                               const int64_t *shape, int ndim, st_err *err) {
    st_status s = st_safetensors_check_f32(st, name, numel, shape, ndim, err);
    if (s) return s;
    const st_tensor_entry *e = st_safetensors_find(st, name);
    const uint8_t *src = st->data + e->begin;
    size_t es = st_dtype_size(e->dtype);
    if ((uintptr_t)src % es == 0) {
        st_convert(dst, ST_F32, src, e->dtype, numel);
        give_back_pages(src, numel * es);
        return ST_OK;
    }
    /* The format packs tensors back to back and lets the header have any length: an F64
     * after a tensor of odd size, or anything after an odd-length header, is misaligned.
     * Such a tensor goes through an aligned bounce buffer, a chunk at a time. */
    double bounce[4096];
    for (size_t i = 0; i < numel;) {
        size_t k = numel - i < sizeof bounce / es ? numel - i : sizeof bounce / es;
        memcpy(bounce, src + i * es, k * es);
        st_convert(dst + i, ST_F32, bounce, e->dtype, k);
        i += k;
    }
    give_back_pages(src, numel * es);
    return ST_OK;
}

static int cmp_out_name(const void *a, const void *b) {
    return strcmp((*(const st_tensor_out *const *)a)->name, (*(const st_tensor_out *const *)b)->name);
}

st_status st_safetensors_write(const char *path, const st_tensor_out *tensors, int n, const char *const *meta,
                            int n_meta, st_err *err) {
    const st_tensor_out **order = malloc(sizeof *order * (size_t)(n ? n : 1));
    if (!order) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) order[i] = &tensors[i];
    qsort(order, (size_t)n, sizeof *order, cmp_out_name);
    json_object *root = json_object_new_object();
    /* a checksum of the data section, in the header's metadata: a flipped byte in the
     * weights is found when the file is opened (Hugging Face ignores unknown keys) */
    uint32_t crc = 0;
    for (int i = 0; i < n; i++) {
        size_t numel = 1;
        for (int d = 0; d < order[i]->ndim; d++) numel *= (size_t)order[i]->shape[d];
        crc = st_crc32c(crc, order[i]->data, numel * st_dtype_size(order[i]->dtype));
    }
    char crc_hex[16];
    snprintf(crc_hex, sizeof crc_hex, "%08x", crc);
    json_object *m = json_object_new_object();
    for (int i = 0; i < n_meta; i++) json_object_object_add(m, meta[2 * i], json_object_new_string(meta[2 * i + 1]));
    json_object_object_add(m, ST_SAFETENSORS_CRC_KEY, json_object_new_string(crc_hex));
    json_object_object_add(root, "__metadata__", m);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        const st_tensor_out *t = order[i];
        size_t numel = 1;
        json_object *o = json_object_new_object(), *shp = json_object_new_array(), *offs = json_object_new_array();
        json_object_object_add(o, "dtype", json_object_new_string(st_dtype_name(t->dtype)));
        for (int d = 0; d < t->ndim; d++) {
            json_object_array_add(shp, json_object_new_int64(t->shape[d]));
            numel *= (size_t)t->shape[d];
        }
        json_object_object_add(o, "shape", shp);
        size_t bytes = numel * st_dtype_size(t->dtype);
        json_object_array_add(offs, json_object_new_int64((int64_t)off));
        json_object_array_add(offs, json_object_new_int64((int64_t)(off + bytes)));
        json_object_object_add(o, "data_offsets", offs);
        json_object_object_add(root, t->name, o);
        off += bytes;
    }
    const char *hjson = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PLAIN);
    size_t hlen = strlen(hjson), padded = (hlen + 7) & ~(size_t)7;
    st_file_writer w;
    st_status s = st_file_writer_open(&w, path, err);
    if (!s) {
        uint64_t h64 = padded;
        char pad[8] = "        ";
        s = st_file_writer_put(&w, &h64, 8, err);
        if (!s) s = st_file_writer_put(&w, hjson, hlen, err);
        if (!s) s = st_file_writer_put(&w, pad, padded - hlen, err);
        for (int i = 0; i < n && !s; i++) {
            size_t numel = 1;
            for (int d = 0; d < order[i]->ndim; d++) numel *= (size_t)order[i]->shape[d];
            s = st_file_writer_put(&w, order[i]->data, numel * st_dtype_size(order[i]->dtype), err);
        }
        s = st_file_writer_close(&w, s, err);
    }
    json_object_put(root);
    free(order);
    return s;
}
