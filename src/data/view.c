/* view.c - views: a selection of a Megatron dataset's documents (ids and order, no token
 * copied) with its own versioned header bound to the base dataset's identity. select
 * writes one from score files (keep a fraction by score, drop duplicates, order by
 * score); the source layer opens one as a source (data_view_open), so every data option
 * of the loader takes it, mixing with weights included.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileutil.h"
#include "data/data_internal.h"

#define VW_RULE_BYTES 512
#define VW_PATH_BYTES 4096
#define VW_HEADER_BYTES (8 + 4 + 4 + sizeof(st_data_ident) + 8 + 8 + 4 + 4 + VW_RULE_BYTES + VW_PATH_BYTES)
#define VW_PACE_BYTES (4 + 4 + 8 + 8 + 8)
#define VW_HEADER_BYTES_PACED (VW_HEADER_BYTES + VW_PACE_BYTES)

/* A pacing read back or asked for: ST_OK, or what is wrong with it naming the key. */
static st_status pace_check(const st_data_pacing *p, const char *path, st_err *err) {
    if (p->kind < ST_DATA_PACE_LINEAR || p->kind > ST_DATA_PACE_STEP)
        return st_errf(err, ST_ERR_INVALID, "%s: key 'pace' is %u; it is linear, root or step", path, p->kind);
    if (!(p->start > 0 && p->start <= 1))
        return st_errf(err, ST_ERR_INVALID, "%s: key 'pace_start' (--pace_start C0) is %g; the share of the documents "
                       "drawn from at the start is in (0, 1]", path, p->start);
    if (!(p->length > 0 && p->length <= 1e6))
        return st_errf(err, ST_ERR_INVALID, "%s: key 'pace_length' (--pace_length L) is %g; pacing lasts L times the "
                       "view's documents in draws, L in (0, 1e6]", path, p->length);
    if (!(p->band >= 0 && p->band < 1))
        return st_errf(err, ST_ERR_INVALID, "%s: key 'pace_band' (--pace_band W) is %g; 0 paces the easiest prefix, a "
                       "band's width is in (0, 1)", path, p->band);
    if (p->kind == ST_DATA_PACE_STEP && (p->steps < 2 || p->steps > 1000))
        return st_errf(err, ST_ERR_INVALID, "%s: key 'pace_steps' (--pace_steps K) is %u; a stepwise pacing has 2 to "
                       "1000 steps", path, p->steps);
    return ST_OK;
}

static const char *pace_name(uint32_t k) {
    return k == ST_DATA_PACE_LINEAR ? "linear" : k == ST_DATA_PACE_ROOT ? "root" : k == ST_DATA_PACE_STEP ? "step" : "none";
}

/* Parse a view file held in memory (b, n bytes): header into info, ids pointed at. */
static st_status view_parse(const char *path, const uint8_t *b, size_t n, st_data_view_info *info,
                            const uint8_t **ids, st_err *err) {
    memset(info, 0, sizeof *info);
    if (n < 16 || memcmp(b, ST_DATA_VIEW_MAGIC, 8) != 0)
        return st_errf(err, ST_ERR_FORMAT, "%s: offset 0: not a strata view (magic \"" ST_DATA_VIEW_MAGIC "\")", path);
    uint32_t v, hb;
    memcpy(&v, b + 8, 4);
    memcpy(&hb, b + 12, 4);
    if (!(v == ST_DATA_VIEW_VERSION && hb == VW_HEADER_BYTES) &&
        !(v == ST_DATA_VIEW_VERSION_PACED && hb == VW_HEADER_BYTES_PACED))
        return st_errf(err, ST_ERR_FORMAT, "%s: offset 8: view version %u (header %u bytes); this strata reads version "
                       "%u (%zu bytes) and %u (paced, %zu bytes): make the view again with strata data select", path, v,
                       hb, ST_DATA_VIEW_VERSION, (size_t)VW_HEADER_BYTES, ST_DATA_VIEW_VERSION_PACED,
                       (size_t)VW_HEADER_BYTES_PACED);
    if (n < (size_t)hb + 4)
        return st_errf(err, ST_ERR_TRUNCATED, "%s: %zu bytes, shorter than the %u-byte view header; the file is "
                       "truncated, make it again", path, n, hb + 4);
    size_t o = 16;
    uint32_t ordered, reserved;
    memcpy(&info->base, b + o, sizeof info->base), o += sizeof info->base;
    memcpy(&info->n_kept, b + o, 8), o += 8;
    memcpy(&info->kept_tokens, b + o, 8), o += 8;
    memcpy(&ordered, b + o, 4), o += 4;
    memcpy(&reserved, b + o, 4), o += 4;
    memcpy(info->rule, b + o, VW_RULE_BYTES - 1), o += VW_RULE_BYTES;
    memcpy(info->base_path, b + o, VW_PATH_BYTES - 1), o += VW_PATH_BYTES;
    info->ordered = ordered == 0 ? 0 : v == ST_DATA_VIEW_VERSION_PACED ? 2 : 1;
    if (v == ST_DATA_VIEW_VERSION_PACED) {
        memcpy(&info->pace.kind, b + o, 4), memcpy(&info->pace.steps, b + o + 4, 4);
        memcpy(&info->pace.start, b + o + 8, 8), memcpy(&info->pace.length, b + o + 16, 8);
        memcpy(&info->pace.band, b + o + 24, 8);
        uint32_t crc, want = st_crc32c(0, b, n - 4);
        memcpy(&crc, b + n - 4, 4);
        st_status rc = crc == want ? pace_check(&info->pace, path, err) : ST_OK; /* a damaged file: said below */
        if (rc) return st_err_prefix(err, "offset %zu (the pacing)", o);
    }
    if (info->n_kept == 0 || info->n_kept > info->base.n_docs || n != hb + 8 * info->n_kept + 4)
        return st_errf(err, ST_ERR_TRUNCATED, "%s: %zu bytes, but its header (offset %zu: %llu of %llu documents kept) "
                       "needs %llu; the file is truncated or damaged, make it again", path, n,
                       (size_t)16 + sizeof info->base, (unsigned long long)info->n_kept,
                       (unsigned long long)info->base.n_docs,
                       (unsigned long long)(hb + 8 * info->n_kept + 4));
    uint32_t crc, want = st_crc32c(0, b, n - 4);
    memcpy(&crc, b + n - 4, 4);
    if (crc != want)
        return st_errf(err, ST_ERR_FORMAT, "%s: offset %zu: CRC-32C %08x, the content gives %08x; the view is damaged, "
                       "make it again", path, n - 4, crc, want);
    *ids = b + hb;
    return ST_OK;
}

/* The base's identity now, against the one the view was made for. */
static st_status view_check_base(st_data_source *base, const st_data_view_info *info, const char *path, st_err *err) {
    st_data_ident have;
    st_status rc = data_source_ident(base, &have, err);
    if (!rc) rc = st_data_ident_check(&info->base, &have, path, info->base_path, err);
    return rc;
}

st_status data_view_open(st_data_source *s, const char *path, st_err *err) {
    uint8_t *b;
    size_t n;
    st_data_view_info info;
    const uint8_t *ids;
    st_status rc = data_read_file(path, &b, &n, err);
    if (rc) return rc;
    rc = view_parse(path, b, n, &info, &ids, err);
    if (!rc) {
        rc = data_source_open_megatron(s, info.base_path, err);
        if (rc) st_err_prefix(err, "%s: its base dataset %s", path, info.base_path);
    }
    if (!rc) rc = view_check_base(s, &info, path, err);
    if (!rc) {
        s->view_docs = malloc(sizeof *s->view_docs * info.n_kept);
        if (!s->view_docs) rc = st_errf(err, ST_ERR_NOMEM, "%s: out of memory for %llu document ids", path,
                                        (unsigned long long)info.n_kept);
    }
    uint64_t tokens = 0;
    for (uint64_t i = 0; !rc && i < info.n_kept; i++) {
        uint64_t d;
        memcpy(&d, ids + 8 * i, 8);
        if (d >= s->n_docs) {
            rc = st_errf(err, ST_ERR_FORMAT, "%s: offset %zu: document %llu of a base of %llu documents; the view is "
                         "damaged, make it again", path, (size_t)(ids - b) + 8 * (size_t)i,
                         (unsigned long long)d, (unsigned long long)s->n_docs);
            break;
        }
        int32_t len;
        memcpy(&len, s->idx_map + DATA_IDX_HEADER_BYTES + 4 * d, 4);
        tokens += (uint64_t)(len > 0 ? len : 0);
        s->view_docs[i] = d;
    }
    if (!rc && tokens != info.kept_tokens)
        rc = st_errf(err, ST_ERR_FORMAT, "%s: says %llu tokens kept, its documents hold %llu; the view is damaged, "
                     "make it again", path, (unsigned long long)info.kept_tokens, (unsigned long long)tokens);
    free(b);
    if (rc) return rc;
    s->n_view = info.n_kept;
    s->view_crc = st_crc32c(0, s->view_docs, sizeof *s->view_docs * info.n_kept);
    s->n_tokens = tokens;
    s->view_ordered = info.ordered != 0;
    s->view_pace = info.pace;
    s->view_base = info.base;
    if (info.ordered == 2) /* the pacing too is in the loader state's fingerprint */
        s->view_crc = st_crc32c((uint32_t)s->view_crc, &info.pace, sizeof info.pace);
    snprintf(s->view_path, sizeof s->view_path, "%s", path);
    return ST_OK;
}

st_status st_data_view_inspect(const char *path, int check_base, st_data_view_info *info, st_err *err) {
    uint8_t *b;
    size_t n;
    const uint8_t *ids;
    st_status rc = data_read_file(path, &b, &n, err);
    if (rc) return rc;
    rc = view_parse(path, b, n, info, &ids, err);
    free(b);
    if (rc || !check_base) return rc;
    st_data_ident have;
    rc = st_data_ident_compute(info->base_path, &have, err);
    if (rc) return st_err_prefix(err, "%s: its base dataset", path);
    return st_data_ident_check(&info->base, &have, path, info->base_path, err);
}

/* ------------------------------------------------------------------ select */

typedef struct ranked {
    double score;
    uint64_t doc;
} ranked;
static int ranked_cmp(const void *x, const void *y) {
    const ranked *a = x, *b = y;
    if (a->score != b->score) return a->score < b->score ? -1 : 1;
    return a->doc < b->doc ? -1 : a->doc > b->doc;
}
static int ranked_cmp_desc(const void *x, const void *y) {
    const ranked *a = x, *b = y;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    return a->doc < b->doc ? -1 : a->doc > b->doc;
}
static int doc_cmp(const void *x, const void *y) {
    const ranked *a = x, *b = y;
    return a->doc < b->doc ? -1 : a->doc > b->doc;
}

static const char *keep_name(st_data_keep k) {
    return k == ST_DATA_KEEP_LOWEST ? "lowest" : k == ST_DATA_KEEP_HIGHEST ? "highest" : k == ST_DATA_KEEP_BAND ? "band" : "all";
}

st_status st_data_select(const char *out, const st_data_select_config *cfg, st_data_view_info *info, st_err *err) {
    memset(info, 0, sizeof *info);
    const int paced = cfg->pace.kind != ST_DATA_PACE_NONE;
    st_data_order order = paced && cfg->order == ST_DATA_ORDER_BASE ? ST_DATA_ORDER_ASCENDING : cfg->order;
    if (paced) {
        st_status pr = pace_check(&cfg->pace, out, err);
        if (pr) return pr;
    }
    const int need_scores = cfg->keep != ST_DATA_KEEP_ALL || order != ST_DATA_ORDER_BASE;
    if ((cfg->keep == ST_DATA_KEEP_LOWEST || cfg->keep == ST_DATA_KEEP_HIGHEST) &&
        !(cfg->fraction > 0 && cfg->fraction <= 1))
        return st_errf(err, ST_ERR_INVALID, "%s: key 'fraction' (--keep lowest|highest F) is %g; it must be in (0, 1]: the share of "
                       "the documents kept", out, cfg->fraction);
    if (cfg->keep == ST_DATA_KEEP_BAND) {
        if (!(cfg->band_lo >= 0 && cfg->band_lo <= 1 && cfg->band_hi >= 0 && cfg->band_hi <= 1))
            return st_errf(err, ST_ERR_INVALID, "%s: key 'band' (--keep band LO HI) is [%g, %g); both ends are quantiles of "
                           "the ranked scores, in [0, 1]", out, cfg->band_lo, cfg->band_hi);
        if (cfg->band_lo > cfg->band_hi)
            return st_errf(err, ST_ERR_INVALID, "%s: key 'band' (--keep band LO HI): low %g > high %g; give the lower "
                           "quantile first", out, cfg->band_lo, cfg->band_hi);
    }
    if (need_scores && !cfg->scores)
        return st_errf(err, ST_ERR_INVALID, "%s: keeping by %s or ordering by score needs a score file (key 'scores', "
                       "--scores FILE)", out, keep_name(cfg->keep));
    if (!need_scores && !cfg->dedup)
        return st_errf(err, ST_ERR_INVALID, "%s: no rule: give --keep lowest|highest|band with --scores, "
                       "--drop-duplicates DEDUP, or --order", out);
    st_data_ident ident;
    st_status rc = st_data_ident_compute(cfg->dataset, &ident, err);
    if (rc) return rc;
    char abs[VW_PATH_BYTES];
    rc = data_dataset_abspath(cfg->dataset, abs, sizeof abs, err);
    if (rc) return rc;
    st_data_scores sc = {0}, dd = {0};
    ranked *r = NULL;
    uint64_t *ids = NULL;
    st_data_source *base = NULL;
    char rule[VW_RULE_BYTES] = "";
    size_t rl = 0;
    if (cfg->dedup) {
        rc = st_data_scores_read(cfg->dedup, cfg->dataset, &dd, err);
        if (!rc && strcmp(dd.kind, "dedup"))
            rc = st_errf(err, ST_ERR_INVALID, "%s: key 'drop-duplicates' names a score file of kind '%s', not a "
                         "deduplication (strata data dedup)", cfg->dedup, dd.kind);
        if (rc) goto done;
    }
    if (cfg->scores) {
        rc = st_data_scores_read(cfg->scores, cfg->dataset, &sc, err);
        if (rc) goto done;
    }
    r = malloc(sizeof *r * (ident.n_docs ? ident.n_docs : 1));
    if (!r) {
        rc = st_errf(err, ST_ERR_NOMEM, "out of memory");
        goto done;
    }
    uint64_t m = 0, dropped = 0;
    for (uint64_t d = 0; d < ident.n_docs; d++) {
        if (cfg->dedup && dd.dup[d]) {
            dropped++;
            continue;
        }
        double x = cfg->scores ? sc.score[d] : 0;
        if (need_scores && isnan(x)) {
            rc = st_errf(err, ST_ERR_INVALID, "%s: the score of document %llu is NaN; scores must be numbers: make the "
                         "score file again (or leave that document out of it)", cfg->scores, (unsigned long long)d);
            goto done;
        }
        r[m++] = (ranked){x, d};
    }
    if (cfg->dedup)
        rl += (size_t)snprintf(rule + rl, sizeof rule - rl, "drop %llu duplicates (%s); ", (unsigned long long)dropped,
                               dd.params);
    uint64_t first = 0, count = m;
    if (cfg->keep != ST_DATA_KEEP_ALL) {
        qsort(r, m, sizeof *r, ranked_cmp);
        if (cfg->keep == ST_DATA_KEEP_LOWEST) count = (uint64_t)llround(cfg->fraction * (double)m);
        else if (cfg->keep == ST_DATA_KEEP_HIGHEST) {
            count = (uint64_t)llround(cfg->fraction * (double)m);
            first = m - count;
        } else {
            first = (uint64_t)floor(cfg->band_lo * (double)m);
            uint64_t end = (uint64_t)floor(cfg->band_hi * (double)m);
            count = end > first ? end - first : 0;
        }
        if (cfg->keep == ST_DATA_KEEP_BAND)
            rl += (size_t)snprintf(rule + rl, sizeof rule - rl, "keep band [%g, %g) of scores ranked ascending", cfg->band_lo,
                                   cfg->band_hi);
        else
            rl += (size_t)snprintf(rule + rl, sizeof rule - rl, "keep %s %g by score", keep_name(cfg->keep), cfg->fraction);
        rl += (size_t)snprintf(rule + rl, sizeof rule - rl, " (%s: %s); ", sc.kind, sc.params);
    }
    if (count == 0) {
        rc = st_errf(err, ST_ERR_INVALID, "%s: the selection is empty (0 of %llu documents%s); %s", out,
                     (unsigned long long)ident.n_docs, dropped ? " after dropping duplicates" : "",
                     cfg->keep == ST_DATA_KEEP_BAND ? "widen key 'band' (--keep band LO HI)"
                                                    : "raise key 'fraction' (--keep lowest|highest F)");
        goto done;
    }
    ranked *kept = r + first;
    if (order == ST_DATA_ORDER_BASE) qsort(kept, count, sizeof *kept, doc_cmp);
    else qsort(kept, count, sizeof *kept, order == ST_DATA_ORDER_ASCENDING ? ranked_cmp : ranked_cmp_desc);
    rl += (size_t)snprintf(rule + rl, sizeof rule - rl, "order %s",
                           order == ST_DATA_ORDER_BASE ? "of the base (shuffled by the loader)"
                           : order == ST_DATA_ORDER_ASCENDING ? "by score ascending, read in order"
                                                                   : "by score descending, read in order");
    if (paced)
        rl += (size_t)snprintf(rule + rl, sizeof rule - rl, ", paced %s from %g over %g x the documents%s",
                               pace_name(cfg->pace.kind), cfg->pace.start, cfg->pace.length,
                               cfg->pace.band > 0 ? " in a sliding band" : "");
    if (paced && cfg->pace.band > 0) rl += (size_t)snprintf(rule + rl, sizeof rule - rl, " of %g", cfg->pace.band);
    if (paced && cfg->pace.kind == ST_DATA_PACE_STEP)
        rl += (size_t)snprintf(rule + rl, sizeof rule - rl, " (%u steps)", cfg->pace.steps);
    (void)rl;
    /* kept tokens from the base's index */
    st_data_source_config bc = {.path = cfg->dataset, .format = ST_DATA_FORMAT_MEGATRON};
    rc = st_data_source_open(&base, &bc, err);
    if (rc) goto done;
    ids = malloc(sizeof *ids * count);
    if (!ids) {
        rc = st_errf(err, ST_ERR_NOMEM, "out of memory");
        goto done;
    }
    uint64_t tokens = 0;
    for (uint64_t i = 0; i < count; i++) {
        int32_t len;
        memcpy(&len, base->idx_map + DATA_IDX_HEADER_BYTES + 4 * kept[i].doc, 4);
        tokens += (uint64_t)(len > 0 ? len : 0);
        ids[i] = kept[i].doc;
    }
    info->base = ident;
    snprintf(info->base_path, sizeof info->base_path, "%s", abs);
    snprintf(info->rule, sizeof info->rule, "%s", rule);
    info->n_kept = count;
    info->kept_tokens = tokens;
    info->ordered = paced ? 2 : order != ST_DATA_ORDER_BASE;
    if (paced) info->pace = cfg->pace;
    {
        const size_t HB = paced ? VW_HEADER_BYTES_PACED : VW_HEADER_BYTES;
        uint8_t *h = calloc(1, HB);
        if (!h) {
            rc = st_errf(err, ST_ERR_NOMEM, "out of memory");
            goto done;
        }
        size_t o = 0;
        uint32_t v = paced ? ST_DATA_VIEW_VERSION_PACED : ST_DATA_VIEW_VERSION, hb = (uint32_t)HB;
        uint32_t ordered = (uint32_t)(info->ordered != 0), res = 0;
        memcpy(h + o, ST_DATA_VIEW_MAGIC, 8), o += 8;
        memcpy(h + o, &v, 4), o += 4;
        memcpy(h + o, &hb, 4), o += 4;
        memcpy(h + o, &ident, sizeof ident), o += sizeof ident;
        memcpy(h + o, &count, 8), o += 8;
        memcpy(h + o, &tokens, 8), o += 8;
        memcpy(h + o, &ordered, 4), o += 4;
        memcpy(h + o, &res, 4), o += 4;
        memcpy(h + o, info->rule, strlen(info->rule)), o += VW_RULE_BYTES;
        memcpy(h + o, abs, strlen(abs)), o += VW_PATH_BYTES;
        if (paced) {
            memcpy(h + o, &cfg->pace.kind, 4), memcpy(h + o + 4, &cfg->pace.steps, 4);
            memcpy(h + o + 8, &cfg->pace.start, 8), memcpy(h + o + 16, &cfg->pace.length, 8);
            memcpy(h + o + 24, &cfg->pace.band, 8), o += VW_PACE_BYTES;
        }
        st_file_writer w;
        rc = st_file_writer_open(&w, out, err);
        if (!rc) rc = st_file_writer_put(&w, h, HB, err);
        if (!rc) rc = st_file_writer_put(&w, ids, sizeof *ids * count, err);
        uint32_t crc = w.crc;
        if (!rc) rc = st_file_writer_put(&w, &crc, 4, err);
        rc = st_file_writer_close(&w, rc, err);
        free(h);
    }
done:
    st_data_source_close(base);
    st_data_scores_free(&sc);
    st_data_scores_free(&dd);
    free(r);
    free(ids);
    return rc;
}
