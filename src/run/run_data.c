/* run_data.c - the run's data: the training loader (the embedded corpus or token files),
 * its state in every checkpoint, and validation's loader and loss. */
#include <dirent.h>
#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fileutil.h"
#include "run/run_internal.h"

/* ------------------------------------------------------------------ data
 * The data pipeline (strata/data.h) feeds the loop: the embedded corpus as an
 * in-memory source, or token files given as "path[:weight],path[:weight],...". Its
 * state (a few integers) goes into every checkpoint. */

void run_data_close(run_data *d) {
    if (d->dl) st_data_loader_close(d->dl);
    free(d->corpus);
    free(d->spec);
    memset(d, 0, sizeof *d);
}

/* KEY "data" (training) or "val_data" (validation: produced on the caller's thread, and
 * "embedded" is the corpus's held-out tail: the text that follows the training part, from
 * the same generator, so the training tokens are the same with or without validation). */
st_status run_data_open(run_data *d, const st_train_config *c, const run_dist *dist, const char *key, const char *spec, int vocab,
                           st_err *err) {
    memset(d, 0, sizeof *d);
    int val = strcmp(key, "data") != 0;
    st_data_loader_config dc;
    st_data_loader_config_init(&dc);
    dc.T = c->seq;
    dc.B = c->batch;
    dc.seed = c->seed;
    dc.vocab_size = vocab;
    if (val) dc.prefetch = 0;
    else { /* under mpirun rank r reads its rows of each global batch (the loader's global order) */
        dc.rank = dist ? dist->rank : 0;
        dc.world = dist ? dist->world : 1;
        dc.online_mix = st_train_config_mix_online(c); /* each step's weights from the run (run_mix.c) */
        dc.online_group = (int)c->grad_accum;
    }
    if (st_train_config_data_embedded(spec)) {
        size_t cap = 4u << 20; /* 4 MiB of text; the default run reads a fifth of it */
        size_t held = val ? 512u << 10 : 0; /* validation: 512 KiB after it */
        uint8_t *text = malloc(cap + held);
        d->corpus = malloc((cap + held) * sizeof(uint16_t));
        if (!text || !d->corpus) {
            free(text);
            return st_errf(err, ST_ERR_NOMEM, "out of memory for the embedded corpus");
        }
        size_t n = st_data_embedded_generate(text, cap, 20261129), first = 0;
        if (val) { /* the generator is sequential: a longer text starts with the training text */
            first = n;
            n = st_data_embedded_generate(text, cap + held, 20261129);
        }
        for (size_t i = first; i < n; i++) d->corpus[i - first] = text[i];
        free(text);
        dc.n_sources = 1;
        dc.sources[0] = (st_data_source_config){.path = val ? "embedded (held out)" : "embedded", .weight = 1.0,
                                             .format = ST_DATA_FORMAT_MEMORY, .mem = d->corpus, .mem_tokens = n - first,
                                             .mem_itemsize = 2};
    } else {
        d->spec = strdup(spec);
        if (!d->spec) return st_errf(err, ST_ERR_NOMEM, "out of memory");
        st_status ls = st_data_list_parse(&dc, d->spec, key, err); /* the loader keeps the paths in d->spec */
        if (ls) return ls;
    }
    st_status s = st_data_loader_open(&d->dl, &dc, err);
    return s ? st_err_prefix(err, "key '%s'", key) : ST_OK;
}

/* positions, doc_start (B,T; NULL: not wanted): the packed documents of the batch
 * (strata/model.h), doc_start from the loader's segments (cu_seqlens: each ends at a
 * document start or its row's end, so none crosses a row). */
st_status run_data_next(run_data *d, int B, int T, int32_t *inputs, int32_t *targets, int32_t *positions,
                           int32_t *doc_start, st_err *err) {
    st_data_batch b;
    st_status s = st_data_loader_next(d->dl, &b, err);
    if (s) return s;
    if (b.B != B || b.T != T)
        return st_errf(err, ST_ERR_INVALID, "data: batch %d x %d from the loader, %d x %d expected", b.B, b.T, B, T);
    /* a target whose loss mask is 0 (an SFT mask: not the assistant's) becomes -1, which
     * every loss ignores; the step's loss is the mean over the rest (strata/step.h) */
    st_data_batch_targets(&b, inputs, targets);
    d->source = b.source;
    if (positions) memcpy(positions, b.positions, sizeof(int32_t) * (size_t)B * T);
    if (doc_start)
        for (int i = 0; i < b.n_seqs; i++)
            for (int j = b.cu_seqlens[i]; j < b.cu_seqlens[i + 1]; j++)
                doc_start[j] = b.cu_seqlens[i] - j / T * T; /* the segment's start in its row */
    return ST_OK;
}

void run_data_save_state(const run_data *d, st_train_state_header *h) {
    st_data_loader_state st;
    st_data_loader_get_state(d->dl, &st);
    h->data_state_bytes = sizeof st;
    memcpy(h->data_state, &st, sizeof st);
}

st_status run_data_restore_state(run_data *d, const st_train_state_header *h, const char *path, st_err *err) {
    st_data_loader_state st;
    if (h->data_state_bytes != sizeof st)
        return st_errf(err, ST_ERR_FORMAT, "%s: data state has %llu bytes, this strata's has %zu", path,
                       (unsigned long long)h->data_state_bytes, sizeof st);
    memcpy(&st, h->data_state, sizeof st);
    st_status s = st_data_loader_set_state(d->dl, &st, err);
    return s ? st_err_prefix(err, "%s", path) : ST_OK;
}

/* ------------------------------------------------------------------ validation
 * The mean loss over the same eval_tokens of val_data at every evaluation (the loader goes
 * back to its start each time), forward only: no parameter, gradient, moment or training
 * data position changes, so a run is bit-identical with and without validation. The step's
 * body runs it (st_step_eval: the executor's forward-only pass, streamed or resident). */

/* val_data, or the embedded corpus's held-out tail for the embedded corpus; NULL: none. */
const char *run_val_spec(const st_train_config *c) {
    if (c->eval_every <= 0 || !st_train_config_has_val(c)) return NULL;
    return c->val_data[0] ? c->val_data : "embedded";
}

st_status run_eval_loss(const st_train_config *c, st_model *m, st_step *stp, run_eval *ev, int32_t *inputs,
                           int32_t *targets, int32_t *positions, int32_t *doc_start, double *out, st_err *err) {
    st_status s;
    if (!ev->vd.dl) {
        if ((s = run_data_open(&ev->vd, c, NULL, "val_data", ev->spec, m->vocab_size, err))) return s;
        st_data_loader_get_state(ev->vd.dl, &ev->start);
    }
    s = st_data_loader_set_state(ev->vd.dl, &ev->start, err);
    if (s) return st_err_prefix(err, "key 'val_data'");
    long per = (long)c->batch * c->seq, n = c->eval_tokens > 0 ? (c->eval_tokens + per - 1) / per : 8;
    double sum = 0;
    for (long i = 0; i < n; i++) {
        if ((s = run_data_next(&ev->vd, c->batch, c->seq, inputs, targets, positions, doc_start, err)))
            return st_err_prefix(err, "key 'val_data'");
        float l;
        if ((s = st_step_eval(stp, c->batch, c->seq, inputs, targets, positions, doc_start, &l, err))) return s;
        sum += l;
    }
    *out = sum / (double)n;
    return ST_OK;
}
