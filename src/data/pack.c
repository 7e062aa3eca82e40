/* pack.c - writing Megatron .bin/.idx datasets one document at a time, and the
 * byte-level tokenizer used by `strata data pack`.
 *
 * Both files are written under temporary names and renamed at close, so a crash
 * never leaves an .idx that disagrees with its .bin. The index is byte-for-byte the
 * layout Megatron-LM's _IndexWriter produces (one sequence per document).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/data_internal.h"

struct data_pack_writer {
    char bin_path[DATA_PATH_MAX], idx_path[DATA_PATH_MAX];
    char bin_tmp[DATA_PATH_MAX + 8], idx_tmp[DATA_PATH_MAX + 8];
    FILE *bin;
    int dtype, itemsize;
    int32_t *sizes; /* tokens per document, kept until close: 4 bytes a document */
    uint64_t n_docs, cap;
    uint64_t n_tokens;
    uint8_t buf[1 << 16];
};

void data_tokenize_bytes(const void *text, size_t n, int32_t *out) {
    const uint8_t *p = text;
    for (size_t i = 0; i < n; i++) out[i] = p[i];
}

st_status data_pack_open(data_pack_writer **out, const char *prefix, int dtype, st_err *err) {
    *out = NULL;
    if (dtype != DATA_DTYPE_U16 && dtype != DATA_DTYPE_I32 && dtype != DATA_DTYPE_U8)
        return st_errf(err, ST_ERR_INVALID, "data pack: token dtype %s (%d); use uint16, int32 or uint8",
                       data_dtype_name(dtype), dtype);
    data_pack_writer *w = calloc(1, sizeof *w);
    if (!w) return st_errf(err, ST_ERR_NOMEM, "data pack: out of memory");
    w->dtype = dtype;
    w->itemsize = data_dtype_size(dtype);
    snprintf(w->bin_path, sizeof w->bin_path, "%s.bin", prefix);
    snprintf(w->idx_path, sizeof w->idx_path, "%s.idx", prefix);
    snprintf(w->bin_tmp, sizeof w->bin_tmp, "%s.tmp", w->bin_path);
    snprintf(w->idx_tmp, sizeof w->idx_tmp, "%s.tmp", w->idx_path);
    w->bin = fopen(w->bin_tmp, "wb");
    if (!w->bin) {
        st_status rc = st_errf(err, ST_ERR_IO, "%s: cannot create: %s", w->bin_tmp, strerror(errno));
        free(w);
        return rc;
    }
    *out = w;
    return ST_OK;
}

st_status data_pack_add(data_pack_writer *w, const int32_t *tokens, size_t n, st_err *err) {
    if (n > (size_t)INT32_MAX)
        return st_errf(err, ST_ERR_INVALID, "data pack: a document of %zu tokens exceeds the index's "
                       "int32 sizes; split it", n);
    int64_t hi = w->dtype == DATA_DTYPE_U16 ? 65535 : w->dtype == DATA_DTYPE_U8 ? 255 : INT32_MAX;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] > hi)
            return st_errf(err, ST_ERR_INVALID,
                           "data pack: document %llu token %zu is %d, which does not fit %s; pack with a "
                           "wider dtype", (unsigned long long)w->n_docs, i, tokens[i], data_dtype_name(w->dtype));
    if (w->n_docs == w->cap) {
        uint64_t nc = w->cap ? w->cap * 2 : 1024;
        int32_t *ns = realloc(w->sizes, nc * sizeof *ns);
        if (!ns) return st_errf(err, ST_ERR_NOMEM, "data pack: out of memory at %llu documents",
                                (unsigned long long)w->n_docs);
        w->sizes = ns;
        w->cap = nc;
    }
    size_t per = sizeof w->buf / (size_t)w->itemsize;
    for (size_t i = 0; i < n;) {
        size_t k = n - i < per ? n - i : per;
        for (size_t j = 0; j < k; j++) {
            int32_t t = tokens[i + j];
            if (w->itemsize == 1) w->buf[j] = (uint8_t)t;
            else if (w->itemsize == 2) { uint16_t v = (uint16_t)t; memcpy(w->buf + 2 * j, &v, 2); }
            else memcpy(w->buf + 4 * j, &t, 4);
        }
        int fault = st_iofault("file.write", w->bin_path);
        if (fault) errno = fault > 0 ? fault : ENOSPC;
        if (fault || fwrite(w->buf, (size_t)w->itemsize, k, w->bin) != k)
            return st_errf(err, errno == ENOSPC ? ST_ERR_NOSPACE : ST_ERR_IO,
                           "%s: write failed at token %llu: %s; %s is unchanged", w->bin_tmp,
                           (unsigned long long)(w->n_tokens + i), strerror(errno), w->bin_path);
        i += k;
    }
    w->sizes[w->n_docs++] = (int32_t)n;
    w->n_tokens += n;
    return ST_OK;
}

static int put(FILE *f, const void *p, size_t n) { return fwrite(p, 1, n, f) == n; }

/* Flush, fsync and close a temporary file (faults injected under PATH, the final name). */
static int finish_tmp(FILE *f, const char *path) {
    int fault = st_iofault("file.fsync", path);
    int ok = !fault && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (fault) errno = fault > 0 ? fault : EIO;
    int e = errno;
    if (fclose(f) != 0 && ok) return 0;
    errno = e;
    return ok;
}

static int rename_into_place(const char *from, const char *to) {
    int fault = st_iofault("file.rename", to);
    if (fault) {
        errno = fault > 0 ? fault : EIO;
        return -1;
    }
    return rename(from, to);
}

/* Both files are complete and durable under temporary names before either replaces an
 * existing dataset; the .bin goes first, and if the .idx cannot follow, the old .bin (kept
 * through a hard link) is put back, so PREFIX is the old pair or the new pair. */
st_status data_pack_close(data_pack_writer *w, st_err *err) {
    st_status rc = ST_OK;
    FILE *bin = w->bin;
    w->bin = NULL;
    if (!finish_tmp(bin, w->bin_path)) {
        rc = st_errf(err, errno == ENOSPC ? ST_ERR_NOSPACE : ST_ERR_IO, "%s: flush failed: %s; %s is unchanged",
                     w->bin_tmp, strerror(errno), w->bin_path);
        data_pack_abort(w);
        return rc;
    }
    if (w->n_docs == 0) {
        rc = st_errf(err, ST_ERR_INVALID, "data pack: no documents were added; %s would be an empty "
                     "source", w->bin_path);
        data_pack_abort(w);
        return rc;
    }
    int fault = st_iofault("file.open", w->idx_path);
    FILE *f = fault > 0 ? NULL : fopen(w->idx_tmp, "wb");
    if (fault > 0) errno = fault;
    if (!f) {
        rc = st_errf(err, ST_ERR_IO, "%s: cannot create: %s", w->idx_tmp, strerror(errno));
        data_pack_abort(w);
        return rc;
    }
    static const char magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
    uint64_t version = 1, nd = w->n_docs, ndi = w->n_docs + 1;
    uint8_t code = (uint8_t)w->dtype;
    fault = st_iofault("file.write", w->idx_path);
    int ok = !fault && put(f, magic, 9) && put(f, &version, 8) && put(f, &code, 1) && put(f, &nd, 8) &&
             put(f, &ndi, 8);
    if (fault) errno = fault > 0 ? fault : ENOSPC;
    ok = ok && put(f, w->sizes, 4 * w->n_docs);
    uint64_t ptr = 0;
    for (uint64_t d = 0; ok && d < w->n_docs; d++) {
        ok = put(f, &ptr, 8);
        ptr += (uint64_t)w->sizes[d] * (uint64_t)w->itemsize;
    }
    for (uint64_t d = 0; ok && d <= w->n_docs; d++) ok = put(f, &d, 8);
    if (!ok) {
        int e = errno;
        fclose(f);
        errno = e;
    } else {
        ok = finish_tmp(f, w->idx_path);
    }
    if (!ok) {
        rc = st_errf(err, errno == ENOSPC ? ST_ERR_NOSPACE : ST_ERR_IO, "%s: write failed: %s; %s is unchanged",
                     w->idx_tmp, strerror(errno), w->idx_path);
        data_pack_abort(w);
        return rc;
    }
    char keep[DATA_PATH_MAX + 32];
    snprintf(keep, sizeof keep, "%s.old.%d", w->bin_path, (int)getpid());
    unlink(keep);
    int existed = access(w->bin_path, F_OK) == 0, kept = existed && link(w->bin_path, keep) == 0;
    if (rename_into_place(w->bin_tmp, w->bin_path) != 0) {
        rc = st_errf(err, ST_ERR_IO, "%s: rename into place failed: %s; the previous dataset is unchanged",
                     w->bin_path, strerror(errno));
        if (kept) unlink(keep);
        data_pack_abort(w);
        return rc;
    }
    if (rename_into_place(w->idx_tmp, w->idx_path) != 0) {
        int e = errno;
        int back = kept ? rename(keep, w->bin_path) == 0 : !existed && unlink(w->bin_path) == 0;
        rc = st_errf(err, ST_ERR_IO, "%s: rename into place failed: %s; %s", w->idx_path, strerror(e),
                     back ? (kept ? "the previous dataset is restored" : "no dataset was there before, none is now")
                          : "the previous .bin could not be kept: pack again");
        data_pack_abort(w);
        return rc;
    }
    if (kept) unlink(keep);
    free(w->sizes);
    free(w);
    return ST_OK;
}

void data_pack_abort(data_pack_writer *w) {
    if (!w) return;
    if (w->bin) fclose(w->bin);
    unlink(w->bin_tmp);
    unlink(w->idx_tmp);
    free(w->sizes);
    free(w);
}
