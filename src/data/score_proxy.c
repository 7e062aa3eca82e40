/* score_proxy.c - proxy-loss scores (strata data score --proxy): a small model run forward
 * only over every document of a Megatron dataset, packed back to back into B x T batches
 * with document attention (no document sees another's tokens), the per-position losses
 * (the model's row_losses) summed per document; the score is the document's mean loss in
 * nats per predicted token. The model computes on its backend's threads.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_internal.h"
#include "strata/model.h"

enum { PROXY_CHUNK = 1 << 16 }; /* tokens of a document read at once */

void st_data_proxy_config_init(st_data_proxy_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->B = 8;
}

typedef struct proxy_batch {
    int B, T, n;              /* n: positions filled, row after row */
    int piece;                /* column where the current piece of a document starts in its row */
    int32_t *in, *tgt, *pos, *ds;
    int64_t *doc;             /* [B*T] the document each position belongs to; -1: padding */
} proxy_batch;

static void batch_reset(proxy_batch *b) { b->n = 0, b->piece = 0; }

/* Start a piece of a document at the current position (a new document, or one that
 * continues on a fresh row). */
static void batch_new_piece(proxy_batch *b) { b->piece = b->n % b->T; }

static void batch_put(proxy_batch *b, int32_t in, int32_t tgt, int64_t doc) {
    int c = b->n % b->T;
    if (c == 0) b->piece = 0; /* a row starts a piece */
    b->in[b->n] = in, b->tgt[b->n] = tgt, b->doc[b->n] = doc;
    b->pos[b->n] = c - b->piece, b->ds[b->n] = b->piece;
    b->n++;
}

/* Run the batch (padded to B x T) and add its losses to the documents'. */
static st_status batch_run(proxy_batch *b, st_model *m, double *sum, uint64_t *cnt, st_data_proxy_stats *st,
                           st_err *err) {
    if (!b->n) return ST_OK;
    batch_new_piece(b);
    while (b->n < b->B * b->T) batch_put(b, 0, -1, -1);
    st_status rc = st_model_set_docs(m, b->pos, b->ds, err);
    if (rc) return st_err_prefix(err, "proxy model (packed documents need document attention)");
    double t0 = st_now();
    float mean = m->ops->forward(m, b->in, b->tgt, 0.0f);
    st->forward_s += st_now() - t0;
    const float *loss = m->row_losses;
    if (!loss) return st_errf(err, ST_ERR_UNSUPPORTED, "proxy model (%s) gives no per-position losses", m->ops->arch);
    if (!isfinite(mean))
        return st_errf(err, ST_ERR_INVALID, "proxy model: the forward's loss is %g (not finite); the model's weights "
                       "are broken (a diverged run?): give another checkpoint", (double)mean);
    for (int i = 0; i < b->n; i++)
        if (b->tgt[i] >= 0) sum[b->doc[i]] += loss[i], cnt[b->doc[i]]++;
    st->forwards++;
    batch_reset(b);
    return ST_OK;
}

static void progress(const st_data_proxy_stats *st, uint64_t done, uint64_t n, double t0, int last) {
    double s = st_now() - t0;
    fprintf(stderr, "\rscore: %llu/%llu documents (%.0f%%), %.3g tokens, %.3g tokens/s, %.3g GFLOP/s%s",
            (unsigned long long)done, (unsigned long long)n, n ? 100.0 * (double)done / (double)n : 100.0,
            (double)st->n_tokens, s > 0 ? (double)st->n_tokens / s : 0.0, s > 0 ? st->flops / s * 1e-9 : 0.0,
            last ? "\n" : "");
    fflush(stderr);
}

st_status st_data_score_proxy(const char *dataset, struct st_model *m, const st_data_proxy_config *cfg_in,
                              st_data_scores *out, st_data_proxy_stats *stats, st_err *err) {
    st_data_proxy_config cfg = *cfg_in;
    memset(out, 0, sizeof *out);
    memset(stats, 0, sizeof *stats);
    if (cfg.B <= 0) cfg.B = 8;
    if (cfg.T <= 0) cfg.T = m->max_seq < 256 ? m->max_seq : 256;
    if (cfg.T > m->max_seq)
        return st_errf(err, ST_ERR_INVALID, "proxy: seq %d is longer than the model's context (%d): give --seq <= %d",
                       cfg.T, m->max_seq, m->max_seq);
    if (cfg.B > 65536 || (int64_t)cfg.B * cfg.T > (1 << 26))
        return st_errf(err, ST_ERR_INVALID, "proxy: batch %d x seq %d is too large", cfg.B, cfg.T);
    st_status rc = data_refuse_view(dataset, err);
    if (rc) return rc;
    st_data_source *s;
    st_data_source_config sc = {.path = dataset, .format = ST_DATA_FORMAT_MEGATRON};
    if ((rc = st_data_source_open(&s, &sc, err))) return rc;
    st_data_ident ident;
    char abs[sizeof out->dataset];
    rc = data_source_ident(s, &ident, err);
    if (!rc) rc = data_dataset_abspath(dataset, abs, sizeof abs, err);
    if (!rc) rc = m->ops->alloc_acts(m, cfg.B, cfg.T, err);
    if (rc) {
        st_data_source_close(s);
        return rc;
    }
    const uint64_t N = ident.n_docs;
    stats->B = cfg.B, stats->T = cfg.T;
    const size_t BT = (size_t)cfg.B * cfg.T;
    proxy_batch b = {.B = cfg.B, .T = cfg.T};
    b.in = malloc(sizeof(int32_t) * BT), b.tgt = malloc(sizeof(int32_t) * BT);
    b.pos = malloc(sizeof(int32_t) * BT), b.ds = malloc(sizeof(int32_t) * BT);
    b.doc = malloc(sizeof(int64_t) * BT);
    int32_t *tok = malloc(sizeof(int32_t) * (PROXY_CHUNK + 1));
    double *sum = calloc(N ? N : 1, sizeof *sum);
    uint64_t *cnt = calloc(N ? N : 1, sizeof *cnt);
    if (!b.in || !b.tgt || !b.pos || !b.ds || !b.doc || !tok || !sum || !cnt) {
        rc = st_errf(err, ST_ERR_NOMEM, "proxy: out of memory for %llu documents", (unsigned long long)N);
        goto done;
    }
    if ((rc = st_data_scores_alloc(out, N, err))) goto done;
    out->ident = ident;
    snprintf(out->dataset, sizeof out->dataset, "%s", abs);
    snprintf(out->kind, sizeof out->kind, "proxy");
    {
        char desc[160] = "";
        m->ops->describe(m, desc, sizeof desc);
        snprintf(out->params, sizeof out->params, "mean loss (nats/token) of %s (%s), batch %d x seq %d",
                 cfg.model_name ? cfg.model_name : m->ops->arch, desc, cfg.B, cfg.T);
    }
    const double fwd_flops = m->ops->flops_per_token(m, cfg.T) / 3.0 * (double)BT; /* forward: a third of a step */
    double t0 = st_now(), last = t0;
    batch_reset(&b);
    for (uint64_t d = 0; d < N && !rc; d++) {
        uint64_t len;
        if ((rc = st_data_source_doc_len(s, d, &len, err))) break;
        stats->n_tokens += len;
        if (len < 2) { stats->empty_docs++; continue; } /* nothing to predict: score 0 */
        batch_new_piece(&b);
        for (uint64_t o = 0; o + 1 < len && !rc;) {
            uint64_t k = len - o < PROXY_CHUNK + 1 ? len - o : PROXY_CHUNK + 1; /* tokens [o, o + k) */
            rc = st_data_source_read(s, d, o, k, tok, m->vocab_size, err);
            if (rc) {
                st_err_prefix(err, "the proxy model's vocabulary (%d) does not cover %s (document %llu): give a "
                              "proxy with the dataset's tokenizer", m->vocab_size, dataset, (unsigned long long)d);
                break;
            }
            for (uint64_t j = 0; j + 1 < k && !rc; j++) {
                batch_put(&b, tok[j], tok[j + 1], (int64_t)d);
                if ((size_t)b.n == BT) {
                    rc = batch_run(&b, m, sum, cnt, stats, err);
                    stats->flops += fwd_flops;
                    if (cfg.progress && st_now() - last >= 1.0) last = st_now(), progress(stats, d, N, t0, 0);
                }
            }
            o += k - 1;
        }
    }
    if (!rc && b.n) {
        rc = batch_run(&b, m, sum, cnt, stats, err);
        stats->flops += fwd_flops;
    }
    if (rc) goto done;
    for (uint64_t d = 0; d < N; d++) {
        out->score[d] = cnt[d] ? sum[d] / (double)cnt[d] : 0.0;
        stats->n_targets += cnt[d];
    }
    stats->n_docs = N;
    stats->seconds = st_now() - t0;
    if (cfg.progress) progress(stats, N, N, t0, 1);
done:
    if (rc) st_data_scores_free(out);
    st_model_set_docs(m, NULL, NULL, NULL);
    free(b.in), free(b.tgt), free(b.pos), free(b.ds), free(b.doc), free(tok), free(sum), free(cnt);
    st_data_source_close(s);
    return rc;
}

/* Reducible loss (Mindermann et al. 2022's RHO-LOSS, per document): m's mean loss minus the
 * reference's, both from st_data_score_proxy over the same packing, so a document's score is
 * what m has still to learn of it that a model trained on held-out data already predicts.
 * High: learnable, not yet learnt; low or negative: learnt, or noise the reference cannot
 * predict either. */
st_status st_data_score_reducible(const char *dataset, struct st_model *m, struct st_model *ref,
                                  const st_data_proxy_config *cfg, const char *ref_name, st_data_scores *out,
                                  st_data_proxy_stats *stats, st_err *err) {
    st_data_scores rs = {0};
    st_data_proxy_stats rst;
    st_status rc = st_data_score_proxy(dataset, m, cfg, out, stats, err);
    if (rc) return rc;
    st_data_proxy_config rcfg = *cfg;
    rcfg.model_name = ref_name;
    if ((rc = st_data_score_proxy(dataset, ref, &rcfg, &rs, &rst, err))) {
        st_data_scores_free(out);
        return st_err_prefix(err, "the reference model");
    }
    for (uint64_t d = 0; d < out->n_docs; d++) out->score[d] -= rs.score[d];
    snprintf(out->kind, sizeof out->kind, "reducible");
    char was[sizeof out->params];
    snprintf(was, sizeof was, "%s", out->params);
    snprintf(out->params, sizeof out->params, "%.120s minus the reference %.100s", was,
             ref_name ? ref_name : ref->ops->arch);
    stats->flops += rst.flops, stats->seconds += rst.seconds, stats->forward_s += rst.forward_s;
    stats->forwards += rst.forwards;
    st_data_scores_free(&rs);
    return ST_OK;
}
