/* run_mix.c - the run's side of online mixing (run_mix.h): per-source loss sums of a step
 * from the step's per-row losses and the rows' sources, gathered over the ranks and added
 * in rank order, the bandit's update, the loader's weights delay steps ahead, and the
 * state as a file of the checkpoint.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileutil.h"
#include "run/run_mix.h"
#include "strata/ckpt.h"
#include "strata/store.h"

st_status run_mix_open(run_mix *x, int K, int n_micro, int B, int T, double alpha, int delay, st_comm *comm,
                       st_err *err) {
    memset(x, 0, sizeof *x);
    st_status s = st_data_mix_online_init(&x->bandit, K, alpha, delay, err);
    if (s) return s;
    x->src = calloc((size_t)n_micro * (size_t)B, 1);
    x->psum = calloc((size_t)n_micro * K, sizeof(double));
    x->pcnt = calloc((size_t)n_micro * K, sizeof(double));
    if (!x->src || !x->psum || !x->pcnt) {
        run_mix_close(x);
        return st_errf(err, ST_ERR_NOMEM, "mix online: out of memory");
    }
    x->on = 1, x->K = K, x->B = B, x->T = T, x->n_micro = n_micro, x->comm = comm;
    return ST_OK;
}

st_status run_mix_open_run(run_mix *x, const st_train_config *c, st_comm *comm, st_err *err) {
    memset(x, 0, sizeof *x);
    if (!st_train_config_mix_online(c)) return ST_OK;
    char list[sizeof c->data];
    snprintf(list, sizeof list, "%s", c->data);
    st_data_loader_config dc;
    st_data_loader_config_init(&dc);
    int embedded = st_train_config_data_embedded(list);
    st_status s = embedded ? ST_OK : st_data_list_parse(&dc, list, "data", err);
    if (s) return s;
    if (embedded) dc.n_sources = 1;
    s = run_mix_open(x, dc.n_sources, (int)c->grad_accum, c->batch, c->seq, c->mix_smoothing, c->mix_delay, comm, err);
    if (s) return st_err_prefix(err, "key 'mix'");
    if (c->state_paths[0] && sizeof(st_train_state_header) + run_mix_blob_bytes(x) > ST_STORE_MAX_BLOB) {
        size_t b = run_mix_blob_bytes(x);
        run_mix_close(x);
        return st_errf(err, ST_ERR_UNSUPPORTED, "key 'mix': online mixing with state_paths commits %zu bytes of "
                       "state a step (grad_accum %ld x %d sources), past the store's %u with the loop's header; lower "
                       "grad_accum", b, (long)c->grad_accum, dc.n_sources, ST_STORE_MAX_BLOB);
    }
    return ST_OK;
}

void run_mix_close(run_mix *x) {
    free(x->src);
    if (!x->region) free(x->psum), free(x->pcnt);
    memset(x, 0, sizeof *x);
}

st_status run_mix_start(run_mix *x, st_data_loader *dl, st_err *err) {
    for (uint64_t q = x->bandit.t; q < x->bandit.t + x->bandit.delay; q++) {
        st_status s = st_data_loader_set_step_weights(dl, q, st_data_mix_online_weights_for(&x->bandit, q), err);
        if (s) return st_err_prefix(err, "mix online");
    }
    return ST_OK;
}

void run_mix_note_sources(run_mix *x, int k, const uint8_t *source) {
    if (x->on && k >= 0 && k < x->n_micro) memcpy(x->src + (size_t)k * x->B, source, (size_t)x->B);
}

void run_mix_row_hook(void *ctx, int k, const float *losses, const int32_t *targets, size_t n) {
    run_mix *x = ctx;
    if (!x->on || k < 0 || k >= x->n_micro || n != (size_t)x->B * x->T) return;
    for (int r = 0; r < x->B; r++) {
        int i = x->src[(size_t)k * x->B + r];
        if (i >= x->K) continue;
        double sum = 0, cnt = 0;
        for (int t = 0; t < x->T; t++) {
            size_t j = (size_t)r * x->T + t;
            if (targets[j] >= 0) sum += losses[j], cnt++;
        }
        x->psum[(size_t)k * x->K + i] += sum, x->pcnt[(size_t)k * x->K + i] += cnt;
    }
}

size_t run_mix_blob_bytes(const run_mix *x) {
    return x->on ? sizeof(run_mix_blob_head) + 2 * sizeof(double) * (size_t)x->n_micro * (size_t)x->K : 0;
}

void run_mix_bind(run_mix *x, void *region) {
    if (!x->on || !region) return;
    size_t n = (size_t)x->n_micro * (size_t)x->K;
    double *ps = (double *)((char *)region + sizeof(run_mix_blob_head)), *pc = ps + n;
    memcpy(ps, x->psum, sizeof(double) * n), memcpy(pc, x->pcnt, sizeof(double) * n);
    if (!x->region) free(x->psum), free(x->pcnt);
    x->psum = ps, x->pcnt = pc, x->region = region;
    run_mix_stage(x, 0);
}

void run_mix_stage(run_mix *x, int pending) {
    if (!x->region) return;
    run_mix_blob_head *h = x->region;
    h->pending = pending ? 1 : 0;
    h->reserved = 0;
    st_data_mix_online_seal(&x->bandit);
    h->bandit = x->bandit;
}

/* This rank's micro-batches' sums in order, the ranks' in rank order, the bandit updated;
 * the sums cleared for the next step. */
static st_status mix_update(run_mix *x, st_err *err) {
    double sum[ST_DATA_MAX_SOURCES] = {0}, cnt[ST_DATA_MAX_SOURCES] = {0};
    double lsum[ST_DATA_MAX_SOURCES] = {0}, lcnt[ST_DATA_MAX_SOURCES] = {0}; /* this rank's */
    const int K = x->K;
    for (int k = 0; k < x->n_micro; k++)
        for (int i = 0; i < K; i++) lsum[i] += x->psum[(size_t)k * K + i], lcnt[i] += x->pcnt[(size_t)k * K + i];
    memset(x->psum, 0, sizeof(double) * (size_t)x->n_micro * K);
    memset(x->pcnt, 0, sizeof(double) * (size_t)x->n_micro * K);
    if (x->comm && st_comm_size(x->comm) > 1) {
        int n = st_comm_size(x->comm);
        double mine[2 * ST_DATA_MAX_SOURCES];
        memcpy(mine, lsum, sizeof(double) * K), memcpy(mine + K, lcnt, sizeof(double) * K);
        double *g = malloc(sizeof(double) * 2 * K * (size_t)n);
        if (!g) return st_errf(err, ST_ERR_NOMEM, "mix online: out of memory");
        st_status s = st_comm_allgather(x->comm, mine, sizeof(double) * 2 * K, g, "mix online losses", err);
        if (!s)
            for (int r = 0; r < n; r++) /* rank order: the same sums on every rank */
                for (int i = 0; i < K; i++) sum[i] += g[(size_t)r * 2 * K + i], cnt[i] += g[(size_t)r * 2 * K + K + i];
        free(g);
        if (s) return s;
    } else {
        memcpy(sum, lsum, sizeof(double) * K), memcpy(cnt, lcnt, sizeof(double) * K);
    }
    return st_data_mix_online_update(&x->bandit, sum, cnt, err);
}

st_status run_mix_resume_blob(run_mix *x, const char *where, st_err *err) {
    if (!x->region) return ST_OK;
    run_mix_blob_head *h = x->region;
    st_status s = st_data_mix_online_check(&h->bandit, x->K, where, err);
    if (s) return st_err_prefix(err, "mix online (the state store's loop state)");
    if (h->pending > 1)
        return st_errf(err, ST_ERR_FORMAT, "%s: the online-mixing state's pending flag is %llu (0 or 1): the store's "
                       "loop state is not this strata's", where, (unsigned long long)h->pending);
    x->bandit = h->bandit;
    if (h->pending && (s = mix_update(x, err))) return st_err_prefix(err, "mix online, replaying the last step");
    run_mix_stage(x, 0);
    return ST_OK;
}

st_status run_mix_after_step(run_mix *x, st_data_loader *dl, st_err *err) {
    if (!x->on) return ST_OK;
    uint64_t step = x->bandit.t;
    st_data_loader_state ls;
    st_data_loader_get_state(dl, &ls);
    if (ls.step != (step + 1) * (uint64_t)x->n_micro)
        return st_errf(err, ST_ERR_INVALID, "mix online: the bandit has seen %llu steps, the loader has given %llu "
                       "batches (%d a step); the mixing state does not belong to this checkpoint",
                       (unsigned long long)step, (unsigned long long)ls.step, x->n_micro);
    const double *u = st_data_mix_online_weights_for(&x->bandit, step);
    if (u) memcpy(x->used, u, sizeof(double) * (size_t)x->K);
    st_status s = mix_update(x, err);
    if (s) return s;
    uint64_t q = step + x->bandit.delay;
    s = st_data_loader_set_step_weights(dl, q, st_data_mix_online_weights_for(&x->bandit, q), err);
    return s ? st_err_prefix(err, "mix online") : ST_OK;
}

void run_mix_weights_json(const run_mix *x, char *buf, size_t cap) {
    buf[0] = 0;
    if (!x->on) return;
    size_t n = (size_t)snprintf(buf, cap, ",\"mix_weights\":[");
    for (int i = 0; i < x->K && n < cap; i++) n += (size_t)snprintf(buf + n, cap - n, "%s%.6f", i ? "," : "", x->used[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

st_status run_mix_save(run_mix *x, const char *ckpt_dir, st_err *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", ckpt_dir, RUN_MIX_FILE);
    st_data_mix_online_seal(&x->bandit);
    st_file_writer w;
    st_status s = st_file_writer_open(&w, path, err);
    if (s) return s;
    s = st_file_writer_put(&w, &x->bandit, sizeof x->bandit, err);
    return st_file_writer_close(&w, s, err);
}

st_status run_mix_load(run_mix *x, const char *ckpt_dir, st_err *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", ckpt_dir, RUN_MIX_FILE);
    FILE *f = fopen(path, "rb");
    if (!f)
        return st_errf(err, ST_ERR_IO, "%s: cannot open (%s); a run with --mix online resumes from a checkpoint "
                       "it wrote", path, strerror(errno));
    st_data_mix_online b;
    size_t got = fread(&b, 1, sizeof b, f);
    int extra = fgetc(f) != EOF;
    fclose(f);
    if (got != sizeof b || extra)
        return st_errf(err, ST_ERR_FORMAT, "%s: %zu bytes%s, an online-mixing state has %zu", path, got,
                       extra ? " and more" : "", sizeof b);
    st_status s = st_data_mix_online_check(&b, x->K, path, err);
    if (s) return s;
    x->bandit = b;
    return ST_OK;
}
