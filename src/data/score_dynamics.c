/* score_dynamics.c - learning-dynamics scores (strata data score --dynamics): per document
 * of a dataset, from the per-document records a run wrote (RUN_DIR/doc_signals.bin, its
 * layout in strata/data.h): the first visit's mean loss, the drop from the first visit to
 * the last, or the forgetting events (visits whose mean loss rose over the visit before).
 * The run's source whose identity is the dataset's is scored; the scores go into the score
 * file format every selection reads.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_internal.h"

/* One document's visits so far: the current visit's sums and what came before. */
typedef struct dyn_doc {
    double sum, first_mean, prev_mean;
    uint64_t cnt;
    uint32_t visit, visits, forgets;
    int seen;
} dyn_doc;

/* Close the open visit of a document: its mean joins the document's history. */
static void close_visit(dyn_doc *d) {
    if (!d->cnt) return;
    double mean = d->sum / (double)d->cnt;
    if (!d->visits) d->first_mean = mean;
    else if (mean > d->prev_mean) d->forgets++;
    d->prev_mean = mean;
    d->visits++;
    d->sum = 0, d->cnt = 0;
}

st_status st_data_docsig_open(const char *run_dir, FILE **out, uint8_t *h, uint32_t *n_sources, st_err *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", run_dir, ST_DATA_DOCSIG_FILE);
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return st_errf(err, ST_ERR_IO, "%s: cannot open (%s); a run writes it with key doc_signals (strata train "
                       "--doc_signals MIB)", path, strerror(errno));
    st_status rc = ST_OK;
    uint32_t v = 0, hb = 0, rb = 0, ns = 0, crc = 0;
    size_t got = fread(h, 1, ST_DATA_DOCSIG_HEADER_BYTES, f);
    if (got >= 48) {
        memcpy(&v, h + 8, 4), memcpy(&hb, h + 12, 4), memcpy(&rb, h + 16, 4), memcpy(&ns, h + 20, 4);
        memcpy(&crc, h + 44, 4);
        memset(h + 44, 0, 4);
    }
    if (got != ST_DATA_DOCSIG_HEADER_BYTES || memcmp(h, ST_DATA_DOCSIG_MAGIC, 8))
        rc = st_errf(err, ST_ERR_FORMAT, "%s: offset 0: not a doc_signals file (magic \"" ST_DATA_DOCSIG_MAGIC
                     "\", %d header bytes)", path, ST_DATA_DOCSIG_HEADER_BYTES);
    else if (v != ST_DATA_DOCSIG_VERSION || hb != ST_DATA_DOCSIG_HEADER_BYTES || rb != sizeof(st_data_docsig) ||
             ns < 1 || ns > ST_DATA_MAX_SOURCES)
        rc = st_errf(err, ST_ERR_FORMAT, "%s: offset 8: version %u, header %u bytes, records of %u, %u sources; this "
                     "strata reads version %u (%d, %zu, 1-%d)", path, v, hb, rb, ns, ST_DATA_DOCSIG_VERSION,
                     ST_DATA_DOCSIG_HEADER_BYTES, sizeof(st_data_docsig), ST_DATA_MAX_SOURCES);
    else if (crc != st_crc32c(0, h, ST_DATA_DOCSIG_HEADER_BYTES))
        rc = st_errf(err, ST_ERR_FORMAT, "%s: offset 44: the header's CRC-32C %08x does not match it; the file is "
                     "damaged", path, crc);
    if (rc) {
        fclose(f);
        return rc;
    }
    *n_sources = ns;
    *out = f;
    return ST_OK;
}

st_status st_data_score_dynamics(const char *dataset, const char *run_dir, const char *metric, int unseen_ok,
                                 double unseen, st_data_scores *out, st_data_dynamics_stats *stats, st_err *err) {
    memset(out, 0, sizeof *out);
    memset(stats, 0, sizeof *stats);
    int which = !strcmp(metric, "first") ? 0 : !strcmp(metric, "drop") ? 1 : !strcmp(metric, "forget") ? 2 : -1;
    if (which < 0)
        return st_errf(err, ST_ERR_INVALID, "key 'metric' (--metric) is '%s'; it is first (the first visit's mean "
                       "loss), drop (first visit's minus last visit's) or forget (forgetting events)", metric);
    st_data_ident id;
    st_status rc = st_data_ident_compute(dataset, &id, err);
    if (rc) return rc;
    char abs[4096], path[4200];
    rc = data_dataset_abspath(dataset, abs, sizeof abs, err);
    if (rc) return rc;
    snprintf(path, sizeof path, "%s/%s", run_dir, ST_DATA_DOCSIG_FILE);
    uint8_t *h = malloc(ST_DATA_DOCSIG_HEADER_BYTES);
    dyn_doc *dd = NULL;
    if (!h) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    uint32_t ns = 0;
    FILE *f = NULL;
    rc = st_data_docsig_open(run_dir, &f, h, &ns, err);
    if (rc) {
        free(h);
        return rc;
    }
    int src = -1;
    for (uint32_t i = 0; !rc && i < ns && src < 0; i++) {
        st_data_ident have;
        memcpy(&have, h + 64 + (size_t)i * (48 + ST_DATA_DOCSIG_PATH_BYTES), 48);
        if (!memcmp(&have, &id, sizeof id)) src = (int)i;
    }
    if (!rc && src < 0) {
        char names[1024] = "";
        size_t o = 0;
        for (uint32_t i = 0; i < ns && o < sizeof names; i++)
            o += (size_t)snprintf(names + o, sizeof names - o, "%s%s", i ? ", " : "",
                                  (char *)h + 64 + (size_t)i * (48 + ST_DATA_DOCSIG_PATH_BYTES) + 48);
        rc = st_errf(err, ST_ERR_INVALID, "%s: the run trained on %s; none of them is %s as it is now (sizes and "
                     "checksums): score the dataset the run read, or run again on this one", path, names, dataset);
    }
    if (!rc && !(dd = calloc(id.n_docs ? id.n_docs : 1, sizeof *dd))) rc = st_errf(err, ST_ERR_NOMEM, "out of memory");
    st_data_docsig r[1024];
    size_t n;
    uint64_t at = 0;
    while (!rc && (n = fread(r, sizeof *r, 1024, f)) > 0) {
        for (size_t i = 0; i < n; i++, at++) {
            if (r[i].source != src) continue;
            if (r[i].doc >= id.n_docs) {
                rc = st_errf(err, ST_ERR_FORMAT, "%s: record %llu: document %llu of a dataset of %llu; the file is "
                             "damaged or another dataset's", path, (unsigned long long)at,
                             (unsigned long long)r[i].doc, (unsigned long long)id.n_docs);
                break;
            }
            dyn_doc *d = &dd[r[i].doc];
            if (d->seen && r[i].visit != d->visit) close_visit(d);
            d->seen = 1, d->visit = r[i].visit;
            d->sum += r[i].loss_sum, d->cnt += r[i].count;
            stats->records++;
        }
    }
    if (!rc && ferror(f)) rc = st_errf(err, ST_ERR_IO, "%s: read error: %s", path, strerror(errno));
    fclose(f);
    if (!rc) rc = st_data_scores_alloc(out, id.n_docs, err);
    for (uint64_t k = 0; !rc && k < id.n_docs; k++) {
        dyn_doc *d = &dd[k];
        close_visit(d);
        if (!d->visits) {
            stats->unseen++;
            out->score[k] = unseen;
            continue;
        }
        stats->docs_seen++;
        if (d->visits > stats->max_visits) stats->max_visits = d->visits;
        out->score[k] = which == 0 ? d->first_mean : which == 1 ? d->first_mean - d->prev_mean : (double)d->forgets;
    }
    if (!rc && stats->unseen && !unseen_ok)
        rc = st_errf(err, ST_ERR_INVALID, "%s: %llu of the %llu documents of %s have no record (the run did not reach "
                     "them, or the bound of key doc_signals cut its records); give --unseen VALUE to score them so, or "
                     "train longer", path, (unsigned long long)stats->unseen, (unsigned long long)id.n_docs, dataset);
    if (!rc) {
        out->ident = id;
        snprintf(out->dataset, sizeof out->dataset, "%s", abs);
        snprintf(out->kind, sizeof out->kind, "dynamics");
        snprintf(out->params, sizeof out->params, "%s from %.180s (source %d)%s", metric, run_dir, src,
                 stats->unseen ? ", unseen documents given --unseen" : "");
        stats->source = src;
    } else {
        st_data_scores_free(out);
    }
    free(dd);
    free(h);
    return rc;
}
