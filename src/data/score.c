/* score.c - a dataset's identity (what binds a score file or a view to the Megatron pair
 * it was made from) and score files: one score per document, with a versioned header,
 * written crash-safe (temporary + fsync + rename), refused for another dataset.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fileutil.h"
#include "data/data_internal.h"

/* ------------------------------------------------------------------ identity */

static st_status pread_all(int fd, void *buf, size_t n, uint64_t off, const char *path, st_err *err) {
    for (size_t got = 0; got < n;) {
        ssize_t r = pread(fd, (uint8_t *)buf + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return st_errf(err, r == 0 ? ST_ERR_TRUNCATED : ST_ERR_IO, "%s: reading %zu bytes at offset %llu: %s", path,
                           n - got, (unsigned long long)(off + got), r == 0 ? "end of file" : strerror(errno));
        got += (size_t)r;
    }
    return ST_OK;
}

st_status data_source_ident(st_data_source *s, st_data_ident *id, st_err *err) {
    memset(id, 0, sizeof *id);
    if (!s->idx_map || s->view_docs)
        return st_errf(err, ST_ERR_INVALID,
                       "%s: scores and views are made over a Megatron dataset (PREFIX.bin + PREFIX.idx); pack the "
                       "tokens with strata data pack",
                       s->bin_path);
    id->n_docs = s->n_docs;
    id->n_tokens = s->bin_bytes / (uint64_t)s->itemsize;
    id->idx_bytes = s->idx_bytes;
    id->bin_bytes = s->bin_bytes;
    id->dtype = (uint32_t)s->dtype;
    id->idx_crc32c = st_crc32c(0, s->idx_map, s->idx_bytes);
    uint32_t crc = 0;
    const uint64_t blk = ST_DATA_IDENT_BLOCK_BYTES, nb = ST_DATA_IDENT_BLOCKS;
    uint8_t *buf = malloc(blk);
    if (!buf) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    st_status rc = ST_OK;
    if (s->bin_bytes <= blk * nb) {
        for (uint64_t o = 0; o < s->bin_bytes && !rc; o += blk) {
            size_t k = (size_t)(s->bin_bytes - o < blk ? s->bin_bytes - o : blk);
            rc = pread_all(s->fd, buf, k, o, s->bin_path, err);
            if (!rc) crc = st_crc32c(crc, buf, k);
        }
    } else { /* block i starts at i * (bytes - blk) / (nb - 1): the first and the last included */
        for (uint64_t i = 0; i < nb && !rc; i++) {
            uint64_t o = i * (s->bin_bytes - blk) / (nb - 1);
            rc = pread_all(s->fd, buf, blk, o, s->bin_path, err);
            if (!rc) crc = st_crc32c(crc, buf, blk);
        }
    }
    free(buf);
    id->bin_crc32c = crc;
    return rc;
}

st_status data_refuse_view(const char *dataset, st_err *err) {
    char magic[8];
    FILE *f = fopen(dataset, "rb");
    size_t got = f ? fread(magic, 1, 8, f) : 0;
    if (f) fclose(f);
    if (got == 8 && !memcmp(magic, ST_DATA_VIEW_MAGIC, 8))
        return st_errf(err, ST_ERR_INVALID, "%s is a view; scores, deduplication and views are made over a Megatron "
                       "dataset: give the view's base (strata data inspect %s names it)", dataset, dataset);
    return ST_OK;
}

st_status st_data_ident_compute(const char *dataset, st_data_ident *id, st_err *err) {
    st_status vrc = data_refuse_view(dataset, err);
    if (vrc) return vrc;
    st_data_source *s;
    st_data_source_config c = {.path = dataset, .format = ST_DATA_FORMAT_MEGATRON};
    st_status rc = st_data_source_open(&s, &c, err);
    if (rc) return rc;
    rc = data_source_ident(s, id, err);
    st_data_source_close(s);
    return rc;
}

st_status st_data_ident_check(const st_data_ident *want, const st_data_ident *have, const char *file,
                              const char *dataset, st_err *err) {
#define FIELD(f, what)                                                                                             \
    if (want->f != have->f)                                                                                        \
        return st_errf(err, ST_ERR_INVALID,                                                                        \
                       "%s was made for another dataset than %s: %s %llu there, %llu now; the dataset changed "   \
                       "since (or is another one): make %s again from this dataset, or give the one it was made " \
                       "from",                                                                                     \
                       file, dataset, what, (unsigned long long)want->f, (unsigned long long)have->f, file);
    FIELD(n_docs, "documents")
    FIELD(n_tokens, "tokens")
    FIELD(dtype, "dtype code")
    FIELD(idx_bytes, ".idx bytes")
    FIELD(bin_bytes, ".bin bytes")
    FIELD(idx_crc32c, ".idx CRC-32C")
    FIELD(bin_crc32c, ".bin sampled CRC-32C")
#undef FIELD
    return ST_OK;
}

/* PREFIX of a dataset named as PREFIX, PREFIX.bin or PREFIX.idx, made absolute. */
st_status data_dataset_abspath(const char *dataset, char *out, size_t cap, st_err *err) {
    char p[DATA_PATH_MAX + 8], idx[DATA_PATH_MAX + 16], real[PATH_MAX];
    snprintf(p, sizeof p, "%s", dataset);
    size_t n = strlen(p);
    if (n > 4 && (!strcmp(p + n - 4, ".bin") || !strcmp(p + n - 4, ".idx"))) p[n - 4] = 0;
    snprintf(idx, sizeof idx, "%s.idx", p);
    if (!realpath(idx, real))
        return st_errf(err, ST_ERR_IO, "%s: cannot resolve the dataset's index %s: %s", dataset, idx, strerror(errno));
    n = strlen(real);
    if (n < 4 || n - 4 >= cap) return st_errf(err, ST_ERR_INVALID, "%s: path too long", real);
    real[n - 4] = 0;
    snprintf(out, cap, "%s", real);
    return ST_OK;
}

/* ------------------------------------------------------------------ score files */

#define SC_KIND_BYTES 32
#define SC_PARAMS_BYTES 256
#define SC_PATH_BYTES 4096
#define SC_HEADER_BYTES (8 + 4 + 4 + sizeof(st_data_ident) + 8 + SC_KIND_BYTES + SC_PARAMS_BYTES + SC_PATH_BYTES)

st_status st_data_scores_alloc(st_data_scores *sc, uint64_t n, st_err *err) {
    memset(sc, 0, sizeof *sc);
    sc->n_docs = n;
    sc->score = calloc(n ? n : 1, sizeof *sc->score);
    sc->ref = malloc((n ? n : 1) * sizeof *sc->ref);
    sc->dup = calloc(n ? n : 1, 1);
    if (!sc->score || !sc->ref || !sc->dup) {
        st_data_scores_free(sc);
        return st_errf(err, ST_ERR_NOMEM, "out of memory for the scores of %llu documents", (unsigned long long)n);
    }
    for (uint64_t i = 0; i < n; i++) sc->ref[i] = -1;
    return ST_OK;
}

void st_data_scores_free(st_data_scores *sc) {
    if (!sc) return;
    free(sc->score);
    free(sc->ref);
    free(sc->dup);
    sc->score = NULL, sc->ref = NULL, sc->dup = NULL;
}

st_status st_data_scores_write(const char *path, const st_data_scores *sc, st_err *err) {
    uint8_t *h = calloc(1, SC_HEADER_BYTES);
    if (!h) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    size_t o = 0;
    uint32_t v = ST_DATA_SCORES_VERSION, hb = (uint32_t)SC_HEADER_BYTES;
    memcpy(h + o, ST_DATA_SCORES_MAGIC, 8), o += 8;
    memcpy(h + o, &v, 4), o += 4;
    memcpy(h + o, &hb, 4), o += 4;
    memcpy(h + o, &sc->ident, sizeof sc->ident), o += sizeof sc->ident;
    memcpy(h + o, &sc->n_docs, 8), o += 8;
    snprintf((char *)h + o, SC_KIND_BYTES, "%s", sc->kind), o += SC_KIND_BYTES;
    snprintf((char *)h + o, SC_PARAMS_BYTES, "%s", sc->params), o += SC_PARAMS_BYTES;
    snprintf((char *)h + o, SC_PATH_BYTES, "%s", sc->dataset), o += SC_PATH_BYTES;
    st_file_writer w;
    st_status rc = st_file_writer_open(&w, path, err);
    if (!rc) rc = st_file_writer_put(&w, h, SC_HEADER_BYTES, err);
    if (!rc) rc = st_file_writer_put(&w, sc->score, sc->n_docs * sizeof *sc->score, err);
    if (!rc) rc = st_file_writer_put(&w, sc->ref, sc->n_docs * sizeof *sc->ref, err);
    if (!rc) rc = st_file_writer_put(&w, sc->dup, sc->n_docs, err);
    uint32_t crc = w.crc;
    if (!rc) rc = st_file_writer_put(&w, &crc, 4, err);
    rc = st_file_writer_close(&w, rc, err);
    free(h);
    return rc;
}

/* Read a whole small file (a score file or a view) into memory. */
st_status data_read_file(const char *path, uint8_t **out, size_t *n, st_err *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return st_errf(err, ST_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return st_errf(err, ST_ERR_IO, "%s: cannot seek: %s", path, strerror(errno));
    }
    long sz = ftell(f);
    rewind(f);
    uint8_t *b = malloc(sz > 0 ? (size_t)sz : 1);
    if (!b) {
        fclose(f);
        return st_errf(err, ST_ERR_NOMEM, "%s: out of memory for %ld bytes", path, sz);
    }
    if (sz > 0 && fread(b, 1, (size_t)sz, f) != (size_t)sz) {
        fclose(f);
        free(b);
        return st_errf(err, ST_ERR_IO, "%s: read failed: %s", path, strerror(errno));
    }
    fclose(f);
    *out = b;
    *n = (size_t)sz;
    return ST_OK;
}

st_status st_data_scores_read(const char *path, const char *dataset, st_data_scores *sc, st_err *err) {
    memset(sc, 0, sizeof *sc);
    uint8_t *b;
    size_t n;
    st_status rc = data_read_file(path, &b, &n, err);
    if (rc) return rc;
    uint32_t v = 0, hb = 0;
    if (n < 16 || memcmp(b, ST_DATA_SCORES_MAGIC, 8) != 0) {
        free(b);
        return st_errf(err, ST_ERR_FORMAT, "%s: offset 0: not a strata score file (magic \"" ST_DATA_SCORES_MAGIC
                       "\"); give a file written by strata data dedup or strata data score", path);
    }
    memcpy(&v, b + 8, 4);
    memcpy(&hb, b + 12, 4);
    if (v != ST_DATA_SCORES_VERSION || hb != SC_HEADER_BYTES) {
        free(b);
        return st_errf(err, ST_ERR_FORMAT, "%s: offset 8: score file version %u (header %u bytes); this strata reads "
                       "version %u (%zu bytes): make the scores again with this strata", path, v, hb,
                       ST_DATA_SCORES_VERSION, (size_t)SC_HEADER_BYTES);
    }
    size_t o = 16;
    memcpy(&sc->ident, b + o, sizeof sc->ident), o += sizeof sc->ident;
    memcpy(&sc->n_docs, b + o, 8), o += 8;
    memcpy(sc->kind, b + o, SC_KIND_BYTES - 1), o += SC_KIND_BYTES;
    memcpy(sc->params, b + o, SC_PARAMS_BYTES - 1), o += SC_PARAMS_BYTES;
    memcpy(sc->dataset, b + o, SC_PATH_BYTES - 1), o += SC_PATH_BYTES;
    uint64_t nd = sc->n_docs;
    if (nd != sc->ident.n_docs || nd > (n - SC_HEADER_BYTES) / 17 || n != SC_HEADER_BYTES + 17 * nd + 4) {
        free(b);
        return st_errf(err, ST_ERR_TRUNCATED, "%s: %zu bytes, but its header (offset %zu: %llu documents) needs %llu; "
                       "the file is truncated or damaged, make it again", path, n, (size_t)16 + sizeof sc->ident,
                       (unsigned long long)nd, (unsigned long long)(SC_HEADER_BYTES + 17 * nd + 4));
    }
    uint32_t crc, want = st_crc32c(0, b, n - 4);
    memcpy(&crc, b + n - 4, 4);
    if (crc != want) {
        free(b);
        return st_errf(err, ST_ERR_FORMAT, "%s: offset %zu: CRC-32C %08x, the content gives %08x; the file is "
                       "damaged, make it again", path, n - 4, crc, want);
    }
    uint64_t ndocs = nd;
    rc = st_data_scores_alloc(sc, ndocs, err);
    /* alloc cleared the header fields read above: read them again */
    if (!rc) {
        o = 16;
        memcpy(&sc->ident, b + o, sizeof sc->ident), o += sizeof sc->ident;
        o += 8;
        memcpy(sc->kind, b + o, SC_KIND_BYTES - 1), o += SC_KIND_BYTES;
        memcpy(sc->params, b + o, SC_PARAMS_BYTES - 1), o += SC_PARAMS_BYTES;
        memcpy(sc->dataset, b + o, SC_PATH_BYTES - 1), o += SC_PATH_BYTES;
        memcpy(sc->score, b + o, 8 * ndocs), o += 8 * ndocs;
        memcpy(sc->ref, b + o, 8 * ndocs), o += 8 * ndocs;
        memcpy(sc->dup, b + o, ndocs);
        for (uint64_t d = 0; d < ndocs && !rc; d++)
            if (sc->ref[d] < -1 || sc->ref[d] >= (int64_t)d || sc->dup[d] > ST_DATA_DUP_NEAR ||
                (sc->ref[d] >= 0) != (sc->dup[d] != 0))
                rc = st_errf(err, ST_ERR_FORMAT, "%s: document %llu: duplicate kind %u of document %lld is not one "
                             "an earlier document can have; the file is damaged", path, (unsigned long long)d,
                             sc->dup[d], (long long)sc->ref[d]);
    }
    free(b);
    if (!rc && dataset) {
        st_data_ident have;
        rc = st_data_ident_compute(dataset, &have, err);
        if (!rc) rc = st_data_ident_check(&sc->ident, &have, path, dataset, err);
    }
    if (rc) st_data_scores_free(sc);
    return rc;
}

st_status st_data_scores_from_text(const char *text_path, const char *dataset, st_data_scores *sc, st_err *err) {
    memset(sc, 0, sizeof *sc);
    st_data_ident id;
    st_status rc = st_data_ident_compute(dataset, &id, err);
    if (rc) return rc;
    char abs[SC_PATH_BYTES];
    rc = data_dataset_abspath(dataset, abs, sizeof abs, err);
    if (rc) return rc;
    FILE *f = fopen(text_path, "r");
    if (!f) return st_errf(err, ST_ERR_IO, "%s: cannot open: %s", text_path, strerror(errno));
    rc = st_data_scores_alloc(sc, id.n_docs, err);
    if (rc) {
        fclose(f);
        return rc;
    }
    sc->ident = id;
    snprintf(sc->dataset, sizeof sc->dataset, "%s", abs);
    snprintf(sc->kind, sizeof sc->kind, "external");
    snprintf(sc->params, sizeof sc->params, "from %s", text_path);
    char line[256];
    uint64_t d = 0, ln = 0;
    while (!rc && fgets(line, sizeof line, f)) {
        ln++;
        char *end;
        errno = 0;
        double x = strtod(line, &end);
        while (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n') end++;
        if (end == line || *end || !isfinite(x)) {
            line[strcspn(line, "\r\n")] = 0;
            rc = st_errf(err, ST_ERR_INVALID, "%s: line %llu: score '%s' of document %llu is not a finite number; "
                         "give one finite score per line", text_path, (unsigned long long)ln, line,
                         (unsigned long long)d);
            break;
        }
        if (d >= id.n_docs) {
            rc = st_errf(err, ST_ERR_INVALID, "%s: line %llu: more scores than the %llu documents of %s; give one "
                         "score per document, in order", text_path, (unsigned long long)ln,
                         (unsigned long long)id.n_docs, dataset);
            break;
        }
        sc->score[d++] = x;
    }
    fclose(f);
    if (!rc && d != id.n_docs)
        rc = st_errf(err, ST_ERR_INVALID, "%s: %llu scores for the %llu documents of %s; give one score per "
                     "document, in order", text_path, (unsigned long long)d, (unsigned long long)id.n_docs, dataset);
    if (rc) st_data_scores_free(sc);
    return rc;
}
