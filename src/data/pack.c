/* pack.c - writing Megatron .bin/.idx datasets one document at a time, their sidecar
 * PREFIX.json (read back here too), and the byte-level tokenizer of `strata data pack`.
 *
 * All files are written under temporary names and renamed at close, so a crash
 * never leaves an .idx that disagrees with its .bin. The index is byte-for-byte the
 * layout Megatron-LM's _IndexWriter produces (one sequence per document). Megatron's
 * .idx has no field for the vocabulary or the end-of-document id, so they go into the
 * sidecar, which Megatron never opens: the pair stays readable by its reader.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <json-c/json.h>

#include "data/data_internal.h"

#define SIDECAR_FORMAT "strata-pack-sidecar"
#define SIDECAR_VERSION 1

struct st_data_pack_writer {
    char bin_path[DATA_PATH_MAX], idx_path[DATA_PATH_MAX];
    char bin_tmp[DATA_PATH_MAX + 8], idx_tmp[DATA_PATH_MAX + 8];
    FILE *bin;
    int dtype, itemsize;
    int32_t *sizes; /* tokens per document, kept until close: 4 bytes a document */
    uint64_t n_docs, cap;
    uint64_t n_tokens;
    int has_meta; /* write PREFIX.json at close; without it a stale one is removed */
    st_data_pack_meta meta;
    char tok_name[256];
    char *pattern, *pattern_name; /* meta's, copied */
    char json_path[DATA_PATH_MAX], json_tmp[DATA_PATH_MAX + 8];
    /* PREFIX.mask: one byte a token (1 = a target to train on), when documents come with masks */
    char mask_path[DATA_PATH_MAX], mask_tmp[DATA_PATH_MAX + 8];
    FILE *mask;
    int masked; /* documents come with masks (mask is open until close) */
    uint8_t buf[1 << 16];
};

void st_data_tokenize_bytes(const void *text, size_t n, int32_t *out) {
    const uint8_t *p = text;
    for (size_t i = 0; i < n; i++) out[i] = p[i];
}

st_status st_data_pack_open(st_data_pack_writer **out, const char *prefix, int dtype, st_err *err) {
    *out = NULL;
    if (dtype != ST_DATA_DTYPE_U16 && dtype != ST_DATA_DTYPE_I32 && dtype != ST_DATA_DTYPE_U8)
        return st_errf(err, ST_ERR_INVALID, "data pack: token dtype %s (%d); use uint16, int32 or uint8",
                       st_data_dtype_name(dtype), dtype);
    st_data_pack_writer *w = calloc(1, sizeof *w);
    if (!w) return st_errf(err, ST_ERR_NOMEM, "data pack: out of memory");
    w->dtype = dtype;
    w->itemsize = st_data_dtype_size(dtype);
    snprintf(w->bin_path, sizeof w->bin_path, "%s.bin", prefix);
    snprintf(w->idx_path, sizeof w->idx_path, "%s.idx", prefix);
    snprintf(w->bin_tmp, sizeof w->bin_tmp, "%s.tmp", w->bin_path);
    snprintf(w->idx_tmp, sizeof w->idx_tmp, "%s.tmp", w->idx_path);
    snprintf(w->json_path, sizeof w->json_path, "%s.json", prefix);
    snprintf(w->json_tmp, sizeof w->json_tmp, "%s.tmp", w->json_path);
    snprintf(w->mask_path, sizeof w->mask_path, "%s.mask", prefix);
    snprintf(w->mask_tmp, sizeof w->mask_tmp, "%s.tmp", w->mask_path);
    w->bin = fopen(w->bin_tmp, "wb");
    if (!w->bin) {
        st_status rc = st_errf(err, ST_ERR_IO, "%s: cannot create: %s", w->bin_tmp, strerror(errno));
        free(w);
        return rc;
    }
    *out = w;
    return ST_OK;
}

st_status st_data_pack_add(st_data_pack_writer *w, const int32_t *tokens, size_t n, st_err *err) {
    return st_data_pack_add_masked(w, tokens, NULL, n, err);
}

st_status st_data_pack_add_masked(st_data_pack_writer *w, const int32_t *tokens, const uint8_t *mask, size_t n,
                               st_err *err) {
    if (!mask != !w->masked && (w->n_docs || !mask))
        return st_errf(err, ST_ERR_INVALID, "data pack: document %llu %s a loss mask but the documents before it "
                       "%s: a dataset's documents all have masks or none do", (unsigned long long)w->n_docs,
                       mask ? "has" : "has no", mask ? "have none" : "have one");
    if (mask && !w->masked) {
        if (!(w->mask = fopen(w->mask_tmp, "wb")))
            return st_errf(err, ST_ERR_IO, "%s: cannot create: %s", w->mask_tmp, strerror(errno));
        w->masked = 1;
    }
    if (n > (size_t)INT32_MAX)
        return st_errf(err, ST_ERR_INVALID, "data pack: a document of %zu tokens exceeds the index's "
                       "int32 sizes; split it", n);
    int64_t hi = w->dtype == ST_DATA_DTYPE_U16 ? 65535 : w->dtype == ST_DATA_DTYPE_U8 ? 255 : INT32_MAX;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] > hi)
            return st_errf(err, ST_ERR_INVALID,
                           "data pack: document %llu token %zu is %d, which does not fit %s; pack with a "
                           "wider dtype", (unsigned long long)w->n_docs, i, tokens[i], st_data_dtype_name(w->dtype));
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
    if (mask) {
        int fault = st_iofault("file.write", w->mask_path);
        if (fault) errno = fault > 0 ? fault : ENOSPC;
        if (fault || fwrite(mask, 1, n, w->mask) != n)
            return st_errf(err, errno == ENOSPC ? ST_ERR_NOSPACE : ST_ERR_IO, "%s: write failed at token %llu: %s; %s "
                           "is unchanged", w->mask_tmp, (unsigned long long)w->n_tokens, strerror(errno), w->mask_path);
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

/* One file close puts in place: tmp renamed over path, or (tmp NULL) path removed: a
 * sidecar left by an earlier pack would describe other data. */
typedef struct commit_file {
    const char *tmp, *path;
    char keep[DATA_PATH_MAX + 32]; /* hard link to the file path held before */
    int existed, kept;
} commit_file;

/* Put files[0..n) in place in order. Each file there before is first kept through a hard
 * link; if any step fails, the ones done are undone, so the prefix holds the old set or
 * the new set. */
static st_status commit_files(commit_file *f, int n, st_err *err) {
    for (int i = 0; i < n; i++) {
        snprintf(f[i].keep, sizeof f[i].keep, "%s.old.%d", f[i].path, (int)getpid());
        unlink(f[i].keep);
        f[i].existed = access(f[i].path, F_OK) == 0;
        f[i].kept = f[i].existed && link(f[i].path, f[i].keep) == 0;
    }
    int failed = -1, e = 0;
    for (int i = 0; i < n && failed < 0; i++) {
        int r = f[i].tmp ? rename_into_place(f[i].tmp, f[i].path) : f[i].existed ? unlink(f[i].path) : 0;
        if (r != 0) failed = i, e = errno;
    }
    int back = 1;
    for (int j = failed - 1; j >= 0; j--) {
        if (f[j].kept) back &= rename(f[j].keep, f[j].path) == 0;
        else if (!f[j].existed) back &= !f[j].tmp || unlink(f[j].path) == 0;
        else back = 0; /* it existed but could not be kept */
    }
    for (int i = 0; i < n; i++)
        if (f[i].kept) unlink(f[i].keep);
    if (failed < 0) return ST_OK;
    int any_before = 0;
    for (int j = 0; j < failed; j++) any_before |= f[j].existed;
    return st_errf(err, ST_ERR_IO, "%s: %s failed: %s; %s", f[failed].path,
                   f[failed].tmp ? "rename into place" : "removing the stale file", strerror(e),
                   failed == 0 ? "the previous dataset is unchanged"
                   : !back     ? "the previous files could not all be kept: pack again"
                   : any_before ? "the previous dataset is restored"
                                : "no dataset was there before, none is now");
}

st_status st_data_pack_set_meta(st_data_pack_writer *w, const st_data_pack_meta *m, st_err *err) {
    if (m->vocab_size <= 0 || m->eod < 0 || m->eod >= m->vocab_size)
        return st_errf(err, ST_ERR_INVALID, "data pack: end-of-document id %lld is outside the vocabulary [0, %lld)",
                       (long long)m->eod, (long long)m->vocab_size);
    free(w->pattern);
    free(w->pattern_name);
    w->pattern = m->pattern ? strdup(m->pattern) : NULL;
    w->pattern_name = m->pattern_name ? strdup(m->pattern_name) : NULL;
    if ((m->pattern && !w->pattern) || (m->pattern_name && !w->pattern_name))
        return st_errf(err, ST_ERR_NOMEM, "data pack: out of memory");
    w->meta = *m;
    snprintf(w->tok_name, sizeof w->tok_name, "%s", m->tokenizer ? m->tokenizer : "");
    w->meta.tokenizer = w->tok_name;
    w->meta.pattern = w->pattern;
    w->meta.pattern_name = w->pattern_name;
    w->has_meta = 1;
    return ST_OK;
}

/* PREFIX.json.tmp, durable. */
static st_status write_sidecar(st_data_pack_writer *w, st_err *err) {
    json_object *o = json_object_new_object(), *t = json_object_new_object();
    json_object_object_add(o, "format", json_object_new_string(SIDECAR_FORMAT));
    json_object_object_add(o, "version", json_object_new_int(SIDECAR_VERSION));
    json_object_object_add(o, "vocab_size", json_object_new_int64(w->meta.vocab_size));
    json_object_object_add(o, "eod", json_object_new_int64(w->meta.eod));
    json_object_object_add(o, "dtype", json_object_new_string(st_data_dtype_name(w->dtype)));
    json_object_object_add(o, "documents", json_object_new_int64((int64_t)w->n_docs));
    json_object_object_add(o, "tokens", json_object_new_int64((int64_t)w->n_tokens));
    json_object_object_add(t, "name", json_object_new_string(w->tok_name));
    if (w->meta.has_digest) {
        char hex[16];
        snprintf(hex, sizeof hex, "%08x", w->meta.tokenizer_crc32c);
        json_object_object_add(t, "crc32c", json_object_new_string(hex));
        json_object_object_add(t, "bytes", json_object_new_int64((int64_t)w->meta.tokenizer_bytes));
    }
    if (w->pattern) { /* a rank file's split: the ids depend on it as on the ranks */
        json_object_object_add(t, "pattern", json_object_new_string(w->pattern));
        if (w->pattern_name) json_object_object_add(t, "pattern_name", json_object_new_string(w->pattern_name));
    }
    json_object_object_add(o, "tokenizer", t);
    if (w->masked) { /* the mask file by its name beside the sidecar, and what it keeps */
        const char *slash = strrchr(w->mask_path, '/');
        json_object_object_add(o, "mask", json_object_new_string(slash ? slash + 1 : w->mask_path));
        json_object_object_add(o, "mask_kind", json_object_new_string(w->meta.mask_kind ? w->meta.mask_kind : ""));
    }
    const char *text = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE);
    size_t len = strlen(text);
    int fault = st_iofault("file.open", w->json_path);
    FILE *f = fault > 0 ? NULL : fopen(w->json_tmp, "wb");
    if (fault > 0) errno = fault;
    int ok = 0;
    st_status rc = ST_OK;
    if (!f) {
        rc = st_errf(err, ST_ERR_IO, "%s: cannot create: %s; the previous dataset is unchanged", w->json_tmp, strerror(errno));
    } else {
        fault = st_iofault("file.write", w->json_path);
        ok = !fault && put(f, text, len) && put(f, "\n", 1);
        if (fault) errno = fault > 0 ? fault : ENOSPC;
        if (!ok) {
            int e = errno;
            fclose(f);
            errno = e;
        } else {
            ok = finish_tmp(f, w->json_path);
        }
        if (!ok)
            rc = st_errf(err, errno == ENOSPC ? ST_ERR_NOSPACE : ST_ERR_IO, "%s: write failed: %s; the previous dataset is "
                    "unchanged", w->json_tmp, strerror(errno));
    }
    json_object_put(o);
    return rc;
}

/* All files are complete and durable under temporary names before any replaces an
 * existing dataset; then they go into place in order (commit_files), so PREFIX is the
 * old set or the new set. */
st_status st_data_pack_close(st_data_pack_writer *w, st_err *err) {
    st_status rc = ST_OK;
    FILE *bin = w->bin;
    w->bin = NULL;
    if (!finish_tmp(bin, w->bin_path)) {
        rc = st_errf(err, errno == ENOSPC ? ST_ERR_NOSPACE : ST_ERR_IO, "%s: flush failed: %s; %s is unchanged",
                     w->bin_tmp, strerror(errno), w->bin_path);
        st_data_pack_abort(w);
        return rc;
    }
    if (w->n_docs == 0) {
        rc = st_errf(err, ST_ERR_INVALID, "data pack: no documents were added; %s would be an empty "
                     "source", w->bin_path);
        st_data_pack_abort(w);
        return rc;
    }
    int fault = st_iofault("file.open", w->idx_path);
    FILE *f = fault > 0 ? NULL : fopen(w->idx_tmp, "wb");
    if (fault > 0) errno = fault;
    if (!f) {
        rc = st_errf(err, ST_ERR_IO, "%s: cannot create: %s", w->idx_tmp, strerror(errno));
        st_data_pack_abort(w);
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
        st_data_pack_abort(w);
        return rc;
    }
    if (w->mask) {
        FILE *m = w->mask;
        w->mask = NULL;
        if (!finish_tmp(m, w->mask_path)) {
            rc = st_errf(err, errno == ENOSPC ? ST_ERR_NOSPACE : ST_ERR_IO, "%s: flush failed: %s; %s is unchanged",
                         w->mask_tmp, strerror(errno), w->mask_path);
            st_data_pack_abort(w);
            return rc;
        }
    }
    if (w->masked && !w->has_meta) {
        rc = st_errf(err, ST_ERR_INVALID, "data pack: a loss mask needs the sidecar that names it (st_data_pack_set_meta)");
        st_data_pack_abort(w);
        return rc;
    }
    if (w->has_meta && (rc = write_sidecar(w, err))) {
        st_data_pack_abort(w);
        return rc;
    }
    /* .bin, .idx, the mask (or the removal of a stale one), then the sidecar (or the same) */
    commit_file files[4] = {{.tmp = w->bin_tmp, .path = w->bin_path}, {.tmp = w->idx_tmp, .path = w->idx_path},
                            {.tmp = w->masked ? w->mask_tmp : NULL, .path = w->mask_path},
                            {.tmp = w->has_meta ? w->json_tmp : NULL, .path = w->json_path}};
    rc = commit_files(files, 4, err);
    if (rc) {
        st_data_pack_abort(w);
        return rc;
    }
    free(w->sizes);
    free(w->pattern);
    free(w->pattern_name);
    free(w);
    return ST_OK;
}

void st_data_pack_abort(st_data_pack_writer *w) {
    if (!w) return;
    if (w->bin) fclose(w->bin);
    if (w->mask) fclose(w->mask);
    unlink(w->mask_tmp);
    unlink(w->bin_tmp);
    unlink(w->idx_tmp);
    unlink(w->json_tmp);
    free(w->sizes);
    free(w->pattern);
    free(w->pattern_name);
    free(w);
}

/* ---- the sidecar, read back by the source (source.c) ------------------------------- */

static int sidecar_int(json_object *o, const char *key, int64_t *v) {
    json_object *x;
    if (!json_object_object_get_ex(o, key, &x) || !json_object_is_type(x, json_type_int)) return 0;
    *v = json_object_get_int64(x);
    return 1;
}

st_status data_sidecar_read(st_data_source *s, const char *prefix, st_err *err) {
    snprintf(s->sidecar_path, sizeof s->sidecar_path, "%s.json", prefix);
    if (access(s->sidecar_path, F_OK) != 0) { /* a pair from Megatron's tools: none */
        s->sidecar_path[0] = 0;
        return ST_OK;
    }
    json_object *o = json_object_from_file(s->sidecar_path);
    int64_t version = 0, vocab = 0, eod = -1, docs = -1, tokens = -1;
    json_object *fmt = NULL;
    int ok = o && json_object_is_type(o, json_type_object) && json_object_object_get_ex(o, "format", &fmt) &&
             json_object_is_type(fmt, json_type_string) && !strcmp(json_object_get_string(fmt), SIDECAR_FORMAT);
    if (!ok) {
        json_object_put(o);
        return st_errf(err, ST_ERR_FORMAT,
                       "%s: not a strata pack sidecar (a JSON object with \"format\": \"" SIDECAR_FORMAT "\"); "
                       "it sits beside %s as its description: re-pack with strata data pack, or move it away",
                       s->sidecar_path, s->idx_path);
    }
    const char *missing = !sidecar_int(o, "version", &version) ? "version"
                          : !sidecar_int(o, "vocab_size", &vocab) ? "vocab_size"
                          : !sidecar_int(o, "eod", &eod) ? "eod"
                          : !sidecar_int(o, "documents", &docs) ? "documents"
                          : !sidecar_int(o, "tokens", &tokens) ? "tokens" : NULL;
    json_object *mk = NULL; /* optional: the loss mask's file name, beside the sidecar */
    char mask_name[256] = "";
    int mask_bad = json_object_object_get_ex(o, "mask", &mk) &&
                   (!json_object_is_type(mk, json_type_string) || !json_object_get_string_len(mk) ||
                    json_object_get_string_len(mk) >= (int)sizeof mask_name || strchr(json_object_get_string(mk), '/'));
    if (mk && !mask_bad) snprintf(mask_name, sizeof mask_name, "%s", json_object_get_string(mk));
    json_object_put(o);
    if (mask_bad)
        return st_errf(err, ST_ERR_FORMAT, "%s: \"mask\" is not the name of a file beside it; the sidecar is damaged: "
                       "re-pack %s", s->sidecar_path, s->bin_path);
    if (missing)
        return st_errf(err, ST_ERR_FORMAT, "%s: no integer field \"%s\"; the sidecar is damaged: re-pack %s",
                       s->sidecar_path, missing, s->bin_path);
    if (version != SIDECAR_VERSION)
        return st_errf(err, ST_ERR_FORMAT, "%s: sidecar version %lld, only %d is known; re-pack with this strata",
                       s->sidecar_path, (long long)version, SIDECAR_VERSION);
    if (vocab <= 0 || vocab > (int64_t)INT32_MAX + 1 || eod < 0 || eod >= vocab)
        return st_errf(err, ST_ERR_FORMAT, "%s: vocab_size %lld / eod %lld are not a vocabulary and an id in it; "
                       "the sidecar is damaged: re-pack %s", s->sidecar_path, (long long)vocab, (long long)eod,
                       s->bin_path);
    if ((uint64_t)docs != s->n_docs || (uint64_t)tokens != s->n_tokens)
        return st_errf(err, ST_ERR_FORMAT,
                       "%s describes %lld documents and %lld tokens, but %s has %llu and %llu: it was left by "
                       "another pack; re-pack, or delete the sidecar if the pair is right",
                       s->sidecar_path, (long long)docs, (long long)tokens, s->idx_path,
                       (unsigned long long)s->n_docs, (unsigned long long)s->n_tokens);
    s->sidecar_vocab = vocab;
    s->sidecar_eod = eod;
    return mask_name[0] ? data_mask_open(s, mask_name, err) : ST_OK;
}

st_status data_mask_open(st_data_source *s, const char *name, st_err *err) {
    const char *slash = strrchr(s->sidecar_path, '/');
    int dir = slash ? (int)(slash - s->sidecar_path + 1) : 0;
    snprintf(s->mask_path, sizeof s->mask_path, "%.*s%s", dir, s->sidecar_path, name);
    int fd = open(s->mask_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return st_errf(err, ST_ERR_IO, "%s: cannot open the loss mask %s names: %s; re-pack %s, or move the sidecar "
                       "away to train on every token", s->mask_path, s->sidecar_path, strerror(errno), s->bin_path);
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != s->n_tokens) {
        close(fd);
        return st_errf(err, ST_ERR_FORMAT, "%s: %lld bytes, but the loss mask has one byte a token and %s has %llu "
                       "tokens; re-pack", s->mask_path, (long long)st.st_size, s->bin_path,
                       (unsigned long long)s->n_tokens);
    }
    s->mask_fd = fd;
    s->has_mask = 1;
    return ST_OK;
}

st_status data_sidecar_check(const st_data_source *s, int64_t vocab_size, st_err *err) {
    if (vocab_size <= 0 || !s->sidecar_path[0] || s->sidecar_vocab <= vocab_size) return ST_OK;
    return st_errf(err, ST_ERR_INVALID,
                   "%s: the data was packed with a tokenizer of vocab_size %lld, but this run's vocab_size is "
                   "%lld: ids at or past %lld would be out of range. Train a model whose vocab_size is at least "
                   "%lld, or re-pack the data with the model's own tokenizer",
                   s->sidecar_path, (long long)s->sidecar_vocab, (long long)vocab_size, (long long)vocab_size,
                   (long long)s->sidecar_vocab);
}
