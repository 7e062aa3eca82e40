/* train.c - the training loop: data -> forward/backward -> clip -> AdamW -> checkpoint.
 *
 * Determinism: for a fixed configuration and thread count every step is bit-for-bit
 * reproducible (the backend's reductions have a fixed order), and a checkpoint holds
 * everything a step depends on (weights, moments, step counters, RNG, data cursor),
 * so stopping and resuming continues exactly as if nothing had stopped.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fileutil.h"
#include "strata/ckpt.h"
#include "strata/stream.h"
#include "strata/tier.h"
#include "strata/data.h"
#include "strata/prof.h"
#include "strata/store.h"
#include "strata/train.h"
#include "strata/generate.h"

/* ------------------------------------------------------------------ data
 * The data pipeline (strata/data.h) feeds the loop: the embedded corpus as an
 * in-memory source, or token files given as "path[:weight],path[:weight],...". Its
 * state (a few integers) goes into every checkpoint. */

typedef struct train_data {
    data_loader *dl;
    uint16_t *corpus; /* the embedded corpus, when used; outlives the loader */
    char *spec;       /* copy of the data key, cut into paths */
} train_data;

static void data_close(train_data *d) {
    if (d->dl) data_loader_close(d->dl);
    free(d->corpus);
    free(d->spec);
    memset(d, 0, sizeof *d);
}

static st_status data_open(train_data *d, const train_config *c, int vocab, st_err *err) {
    memset(d, 0, sizeof *d);
    data_loader_config dc;
    data_loader_config_init(&dc);
    dc.T = c->seq;
    dc.B = c->batch;
    dc.seed = c->seed;
    dc.vocab_size = vocab;
    if (!strcmp(c->data, "embedded")) {
        size_t cap = 4u << 20; /* 4 MiB of text; the default run reads a fifth of it */
        uint8_t *text = malloc(cap);
        d->corpus = malloc(cap * sizeof(uint16_t));
        if (!text || !d->corpus) {
            free(text);
            return st_errf(err, ST_ERR_NOMEM, "out of memory for the embedded corpus");
        }
        size_t n = corpus_embedded_generate(text, cap, 20261129);
        for (size_t i = 0; i < n; i++) d->corpus[i] = text[i];
        free(text);
        dc.n_sources = 1;
        dc.sources[0] = (data_source_config){.path = "embedded", .weight = 1.0, .format = DATA_FORMAT_MEMORY,
                                             .mem = d->corpus, .mem_tokens = n, .mem_itemsize = 2};
    } else {
        d->spec = strdup(c->data);
        if (!d->spec) return st_errf(err, ST_ERR_NOMEM, "out of memory");
        char *save = NULL;
        for (char *tok = strtok_r(d->spec, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            if (dc.n_sources == DATA_MAX_SOURCES)
                return st_errf(err, ST_ERR_INVALID, "key 'data': more than %d sources", DATA_MAX_SOURCES);
            double w = 1.0;
            char *colon = strrchr(tok, ':');
            if (colon) {
                char *end;
                w = strtod(colon + 1, &end);
                if (end == colon + 1 || *end || !(w > 0))
                    return st_errf(err, ST_ERR_INVALID, "key 'data': weight '%s' of source '%.*s' must be a positive "
                                   "number", colon + 1, (int)(colon - tok), tok);
                *colon = 0;
            }
            dc.sources[dc.n_sources++] = (data_source_config){.path = tok, .weight = w};
        }
        if (!dc.n_sources) return st_errf(err, ST_ERR_INVALID, "key 'data' is empty; give \"embedded\" or token files");
    }
    st_status s = data_loader_open(&d->dl, &dc, err);
    return s ? st_err_prefix(err, "key 'data'") : ST_OK;
}

static st_status data_next(train_data *d, int B, int T, int32_t *inputs, int32_t *targets, st_err *err) {
    data_batch b;
    st_status s = data_loader_next(d->dl, &b, err);
    if (s) return s;
    for (int r = 0; r < B; r++) {
        const int32_t *row = b.tokens + (size_t)r * (T + 1);
        memcpy(inputs + (size_t)r * T, row, sizeof(int32_t) * T);
        memcpy(targets + (size_t)r * T, row + 1, sizeof(int32_t) * T);
    }
    return ST_OK;
}

static void data_save_state(const train_data *d, train_state_header *h) {
    data_loader_state st;
    data_loader_get_state(d->dl, &st);
    h->data_state_bytes = sizeof st;
    memcpy(h->data_state, &st, sizeof st);
}

static st_status data_restore_state(train_data *d, const train_state_header *h, const char *path, st_err *err) {
    data_loader_state st;
    if (h->data_state_bytes != sizeof st)
        return st_errf(err, ST_ERR_FORMAT, "%s: data state has %llu bytes, this strata's has %zu", path,
                       (unsigned long long)h->data_state_bytes, sizeof st);
    memcpy(&st, h->data_state, sizeof st);
    st_status s = data_loader_set_state(d->dl, &st, err);
    return s ? st_err_prefix(err, "%s", path) : ST_OK;
}

/* ------------------------------------------------------------------ checkpoints */

static st_status resolve_resume(const char *path, char *ckpt_dir, size_t cap, st_err *err) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s/checkpoints/latest", path);
    FILE *f = fopen(buf, "r");
    if (f) {
        char name[256] = "";
        if (!fgets(name, sizeof name, f)) name[0] = 0;
        fclose(f);
        name[strcspn(name, "\n")] = 0;
        if (!name[0]) return st_errf(err, ST_ERR_FORMAT, "%s is empty; name a checkpoint directory instead", buf);
        snprintf(ckpt_dir, cap, "%s/checkpoints/%s", path, name);
        return ST_OK;
    }
    snprintf(buf, sizeof buf, "%s/train_state.bin", path);
    if (access(buf, R_OK) == 0) {
        snprintf(ckpt_dir, cap, "%s", path);
        return ST_OK;
    }
    return st_errf(err, ST_ERR_IO, "key 'resume': %s has neither checkpoints/latest nor train_state.bin; give a run "
                   "directory or a checkpoint directory", path);
}

static st_status save_checkpoint(const train_config *c, st_model *m, optim *o, const train_state_header *h,
                                 st_err *err) {
    char dir[2048], tmp[2100], path[2200], old[2100];
    snprintf(dir, sizeof dir, "%s/checkpoints/step_%08llu", c->run_dir, (unsigned long long)h->step);
    snprintf(tmp, sizeof tmp, "%s.partial", dir);
    snprintf(old, sizeof old, "%s.old", dir);
    /* leftovers of an interrupted save are incomplete by construction */
    st_status s = st_rmtree(tmp, err);
    if (!s) s = st_rmtree(old, err);
    if (!s) s = st_mkdirs(tmp, err);
    if (s) return s;
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    if ((s = m->ops->save(m, path, err))) return s;
    snprintf(path, sizeof path, "%s/train_state.bin", tmp);
    if ((s = train_state_save(path, h, o, err))) return s;
    snprintf(path, sizeof path, "%s/config.json", tmp);
    if ((s = train_config_save_json(c, path, err))) return s;
    struct stat sb;
    if (stat(dir, &sb) == 0 && rename(dir, old) != 0)
        return st_errf(err, ST_ERR_IO, "cannot move aside %s: %s", dir, strerror(errno));
    if (rename(tmp, dir) != 0) return st_errf(err, ST_ERR_IO, "cannot rename %s into place: %s", tmp, strerror(errno));
    st_err rerr = {0};
    if (st_rmtree(old, &rerr)) st_log(1, "warning: %s\n", rerr.msg);
    char ckdir[2100];
    snprintf(ckdir, sizeof ckdir, "%s/checkpoints", c->run_dir);
    if ((s = st_fsync_dir(ckdir, err))) return s;
    snprintf(path, sizeof path, "%s/checkpoints/latest", c->run_dir);
    st_file_writer w;
    if ((s = st_file_writer_open(&w, path, err))) return s;
    char name[64];
    int n = snprintf(name, sizeof name, "step_%08llu\n", (unsigned long long)h->step);
    s = st_file_writer_put(&w, name, (size_t)n, err);
    return st_file_writer_close(&w, s, err);
}

void train_decay_segments(const st_param_info *t, int n, float weight_decay, optim_segment *out) {
    for (int i = 0; i < n; i++) {
        st_role r = t[i].role;
        out[i] = (optim_segment){t[i].offset, t[i].numel,
                                 (r == ST_ROLE_MATMUL_WEIGHT || r == ST_ROLE_EMBEDDING) ? weight_decay : 0.0f};
    }
}

/* ------------------------------------------------------------------ layer streaming */

/* The plan strata train gives the streaming executor: the whole vocabulary on the
 * device if it fits, else 2048-row chunks; activations kept if they fit, else
 * offloaded, else recomputed (the cheapest first, on this backend). */
static st_status open_streamed(const train_config *c, const gpt2_config *mc, int is_llama, st_backend *be,
                               st_backend **dev, stream_exec **sx, st_err *err) {
    int external = c->state_paths[0] != 0; /* the moments live in the disk state store */
    if (is_llama) return st_errf(err, ST_ERR_UNSUPPORTED, "key 'device_budget': layer streaming runs GPT-2 models so far");
    if (c->grad_accum != 1)
        return st_errf(err, ST_ERR_UNSUPPORTED, "key 'device_budget': layer streaming does not accumulate gradients "
                       "yet; use grad_accum 1");
    if (strcmp(c->optim_state, "f32") && !external)
        return st_errf(err, ST_ERR_UNSUPPORTED, "key 'device_budget': layer streaming keeps fp32 optimizer states in "
                       "host memory; 8-bit states need the disk state (state_paths)");
    stream_config sc = {.model = *mc, .B = c->batch, .T = c->seq, .weight_decay = (float)c->weight_decay,
                        .external_optimizer = external};
    stream_plan plan;
    stream_plan_default(&plan, mc->n_layer);
    size_t budget = (size_t)c->device_budget;
    static const stream_act order[] = {STREAM_ACT_KEEP, STREAM_ACT_OFFLOAD, STREAM_ACT_RECOMPUTE};
    int found = 0;
    for (int chunk = 0; chunk < 2 && !found; chunk++) {
        plan.vocab_chunk = chunk ? 2048 : 0;
        for (int a = 0; a < 3 && !found; a++) {
            stream_plan_set_all(&plan, order[a]);
            found = stream_device_bytes(&sc, &plan) <= budget;
        }
    }
    if (!found) plan.vocab_chunk = 2048; /* recompute + chunks: create reports the bytes missing */
    st_status s = st_backend_with_budget(dev, be, budget, err);
    if (s) return st_err_prefix(err, "key 'device_budget'");
    if ((s = stream_exec_create(sx, &sc, &plan, *dev, err))) return st_err_prefix(err, "key 'device_budget'");
    st_log(1, "layer streaming: device budget %.1f MiB, activations %s, vocabulary %s\n", budget / 1048576.0,
           plan.act[0] == STREAM_ACT_KEEP ? "kept" : plan.act[0] == STREAM_ACT_OFFLOAD ? "offloaded" : "recomputed",
           plan.vocab_chunk ? "in 2048-row chunks" : "resident");
    return ST_OK;
}

static st_status streamed_step(const train_config *c, stream_exec *sx, st_store *store, train_data *td,
                               train_state_header *hs, long step, int32_t *inputs, int32_t *targets, double *loss,
                               double *norm, int *skipped, st_err *err) {
    prof_span pd = prof_begin(PROF_CAT_DATA, "data wait", -1);
    st_status s = data_next(td, c->batch, c->seq, inputs, targets, err);
    prof_end(&pd);
    if (s) return s;
    adamw_params hp = {(float)train_lr_at(c, step), (float)c->beta1, (float)c->beta2, (float)c->eps,
                       (long)hs->adam_step + 1, 1.0f};
    if (store) { /* the state after this step: the executor commits it with the update */
        hs->step = (uint64_t)step;
        data_save_state(td, hs);
        hs->adam_step++;
    }
    stream_step_stats st;
    if ((s = stream_step(sx, inputs, targets, &hp, (float)c->grad_clip, &st, err))) return s;
    *loss = st.loss;
    *norm = st.grad_norm;
    *skipped = st.skipped;
    if (!store && !st.skipped) hs->adam_step++;
    if (store && st.skipped) { /* no update: only the loop's state moves on */
        hs->adam_step--;
        if ((s = st_store_commit_blob(store, hs, sizeof *hs, err))) return s;
    }
    return ST_OK;
}

/* ------------------------------------------------------------------ state on disk
 * With state_paths, the fp32 master weights and the moments live in the state store
 * (strata/store.h); the model's fp32 weights are the working copy it writes each step.
 * The store commits every step with the loop's state (step, data position) as its blob,
 * so it is the checkpoint: a run killed at any instant resumes from the last commit. */

static const void *store_grads_at(void *ctx, size_t first, size_t n) {
    (void)n;
    return ((st_model *)ctx)->grads + first;
}
static void *store_work_at(void *ctx, size_t first, size_t n) {
    (void)n;
    return ((st_model *)ctx)->params + first;
}
static void store_init_from(void *ctx, size_t first, size_t n, float *dst) {
    memcpy(dst, ((st_model *)ctx)->params + first, n * sizeof(float));
}

static st_status open_store(const train_config *c, st_model *m, const optim_segment *segs, optim_state_format fmt,
                            train_data *td, train_state_header *hs, st_store **out, st_err *err) {
    char buf[sizeof c->state_paths];
    const char *paths[ST_STORE_MAX_PATHS];
    double weights[ST_STORE_MAX_PATHS];
    int n, weighted;
    st_status s = train_state_paths(c, buf, sizeof buf, paths, &n, weights, &weighted, err);
    if (s) return s;
    st_store_config sc = {.paths = paths, .n_paths = n, .path_weight = weighted ? weights : NULL,
                          .segs = segs, .n_segs = m->n_tensors, .fmt = fmt,
                          .host_budget = c->state_budget > 0 ? (uint64_t)c->state_budget : 256ull << 20};
    if (!c->resume[0]) {
        if (st_store_exists(&sc))
            return st_errf(err, ST_ERR_INVALID, "key 'state_paths': %s/strata-state.manifest already holds a run's "
                           "state; continue it with --resume %s, or remove the store to start over", paths[0],
                           c->run_dir);
        s = st_store_create(out, &sc, store_init_from, m, err);
        if (s) return st_err_prefix(err, "key 'state_paths'");
        st_failpoint("train_store_created");
        /* step 0 with the loop's state, so a run killed before its first step resumes */
        data_save_state(td, hs);
        return st_store_commit_blob(*out, hs, sizeof *hs, err);
    }
    if ((s = st_store_open(out, &sc, err))) return st_err_prefix(err, "key 'state_paths' (resume)");
    size_t bb;
    const void *blob = st_store_blob(*out, &bb);
    st_store_stats ss;
    st_store_get_stats(*out, &ss);
    if (!blob && ss.step == 0) {
        /* killed between creating the store and committing step 0's loop state: the store
         * holds the initial weights, and the data starts from the beginning */
        if ((s = st_store_read_master(*out, m->params, err))) return s;
        data_save_state(td, hs);
        st_log(1, "the state store %s was created but never stepped; starting at step 0\n",
               st_store_manifest_path(*out));
        return st_store_commit_blob(*out, hs, sizeof *hs, err);
    }
    if (!blob || bb != sizeof *hs)
        return st_errf(err, ST_ERR_FORMAT, "%s: the store's loop state has %zu bytes, this strata's %zu: resume with "
                       "the strata that wrote it", st_store_manifest_path(*out), bb, sizeof *hs);
    memcpy(hs, blob, sizeof *hs);
    if (hs->n_params != m->n_params)
        return st_errf(err, ST_ERR_SHAPE, "%s: the store was written for %llu parameters, the model has %zu",
                       st_store_manifest_path(*out), (unsigned long long)hs->n_params, m->n_params);
    if ((s = st_store_read_master(*out, m->params, err))) return s;
    if ((s = data_restore_state(td, hs, st_store_manifest_path(*out), err))) return s;
    st_log(1, "resumed from the state store %s at step %llu\n", st_store_manifest_path(*out),
           (unsigned long long)hs->step);
    return ST_OK;
}

/* ------------------------------------------------------------------ the loop */

st_status train_run(const train_config *c, train_result *res, st_err *err) {
    gpt2_config mc;
    llama_config lc;
    int is_llama;
    st_status s = train_config_resolve_llama(c, &lc, &is_llama, err);
    if (!s && !is_llama) s = train_config_resolve(c, &mc, err);
    if (s) return s;
    /* the memory plan, checked before anything is allocated or written */
    prof_mem_estimate mem;
    if (is_llama)
        prof_mem_estimate_generic((double)llama_param_count(&lc), (double)llama_act_bytes(&lc, c->batch, c->seq),
                                  c->batch, c->seq, !strcmp(c->optim_state, "8bit"), &mem);
    else
        prof_mem_estimate_gpt2(&mc, c->batch, c->seq, !strcmp(c->optim_state, "8bit"), &mem);
    train_mem_state_on_disk(c, &mem);
    double budgets[PROF_TIER_COUNT] = {0, c->host_budget, 0};
    if ((s = prof_mem_check(&mem, budgets, err))) return s;
    if (!c->run_dir[0]) return st_errf(err, ST_ERR_INVALID, "key 'run_dir' is empty; name a directory for the run");
    if ((s = st_mkdirs(c->run_dir, err))) return s;
    char path[2200];
    /* one process per run directory: a second would interleave metrics and mix one
     * process's weights with the other's optimizer state in a checkpoint */
    st_lock run_lock;
    snprintf(path, sizeof path, "%s/strata.lock", c->run_dir);
    if ((s = st_lock_acquire(&run_lock, path, "run directory", err))) return s;
    snprintf(path, sizeof path, "%s/config.json", c->run_dir);
    if ((s = train_config_save_json(c, path, err))) {
        st_lock_release(&run_lock);
        return s;
    }

    st_backend *be = NULL;
    st_model *m = NULL;
    optim *opt = NULL;
    optim_segment *segs = NULL;
    int32_t *inputs = NULL, *targets = NULL;
    FILE *metrics = NULL;
    prof_tb *tb = NULL; /* TensorBoard events: the scalars of metrics.jsonl */
    train_data td = {0};
    train_state_header *hs = NULL;
    prof_run *pr = NULL;
    st_store *store = NULL;
    int B = c->batch, T = c->seq;
    /* layer streaming (device_budget > 0): the executor owns the host vectors and the
     * optimizer; the loop sees them through a GPT-2 view for checkpoints */
    st_backend *dev = NULL;
    stream_exec *sx = NULL;
    gpt2_model sview;
    st_model swrap;

    if ((s = st_backend_cpu_create(&be, c->threads, err))) goto done;
    if (c->device_budget > 0) {
        if ((s = open_streamed(c, &mc, is_llama, be, &dev, &sx, err))) goto done;
        sview = *stream_model(sx);
        sview.params = stream_params(sx);
        sview.grads = stream_grads(sx);
        sview.be = be;
        st_model_wrap_gpt2(&swrap, &sview);
        m = &swrap;
        opt = stream_optim(sx);
        stream_init_random(sx, c->seed);
    } else {
        st_model_overrides ov = {c->vocab_size, c->max_seq, c->n_layer, c->n_head, c->n_embd};
        if (c->init_from[0]) s = st_model_create_hf(&m, c->init_from, be, err); /* shape and weights */
        else if (is_llama) s = st_model_create_llama(&m, &lc, be, err);
        else s = st_model_create(&m, c->model, &ov, be, err);
        if (s) goto done;
        if ((s = m->ops->alloc_acts(m, B, T, err))) goto done;
        if (!c->init_from[0]) m->ops->init_random(m, c->seed);
    }

    /* weight decay by role, which comes from each tensor's name */
    segs = calloc((size_t)m->n_tensors, sizeof *segs);
    if (!segs) { s = st_errf(err, ST_ERR_NOMEM, "out of memory"); goto done; }
    train_decay_segments(m->tensors, m->n_tensors, (float)c->weight_decay, segs);
    optim_state_format fmt = strcmp(c->optim_state, "8bit") ? OPTIM_STATE_F32 : OPTIM_STATE_8BIT;
    if (!sx && !c->state_paths[0] && (s = optim_create(&opt, segs, m->n_tensors, fmt, err))) goto done;
    if ((s = data_open(&td, c, m->vocab_size, err))) goto done;

    hs = calloc(1, sizeof *hs); /* 4 KiB of data state: not on the stack */
    if (!hs) { s = st_errf(err, ST_ERR_NOMEM, "out of memory"); goto done; }
    hs->n_params = m->n_params;
    if (c->state_paths[0]) {
        if ((s = open_store(c, m, segs, fmt, &td, hs, &store, err))) goto done;
        if (sx) { /* the executor updates through the store; its device copies follow the host */
            if ((s = stream_attach_store(sx, store, hs, sizeof *hs, err))) goto done;
            stream_set_params(sx, stream_params(sx));
        }
    } else if (c->resume[0]) {
        char ck[2048];
        if ((s = resolve_resume(c->resume, ck, sizeof ck, err))) goto done;
        snprintf(path, sizeof path, "%s/model.safetensors", ck);
        if ((s = m->ops->load(m, path, err))) goto done;
        snprintf(path, sizeof path, "%s/train_state.bin", ck);
        if ((s = train_state_load(path, hs, opt, err))) goto done;
        if ((s = data_restore_state(&td, hs, path, err))) goto done;
        if (sx) stream_set_params(sx, stream_params(sx)); /* the device copies follow the host */
        st_log(1, "resumed from %s at step %llu\n", ck, (unsigned long long)hs->step);
    }

    inputs = malloc(sizeof(int32_t) * (size_t)B * T);
    targets = malloc(sizeof(int32_t) * (size_t)B * T);
    snprintf(path, sizeof path, "%s/metrics.jsonl", c->run_dir);
    metrics = fopen(path, "a");
    if (!inputs || !targets || !metrics) {
        s = !metrics ? st_errf(err, ST_ERR_IO, "%s: cannot open: %s", path, strerror(errno))
                     : st_errf(err, ST_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((s = prof_tb_open(&tb, c->run_dir, err))) goto done;
    if (!c->quiet) {
        char desc[256];
        m->ops->describe(m, desc, sizeof desc);
        printf("model %s: %zu parameters (%s), batch %d x seq %d x accum %d, %ld steps, run dir %s\n", c->model,
               m->n_params, desc, B, T, c->grad_accum, c->steps, c->run_dir);
    }

    double flops_per_step = m->ops->flops_per_token(m, T) * (double)B * T * c->grad_accum;
    long end = c->stop_at > 0 && c->stop_at < c->steps ? c->stop_at : c->steps;
    char label[128];
    snprintf(label, sizeof label, "strata train %s", c->model);
    prof_run_config pc = {.run_dir = c->run_dir, .trace = c->trace, .label = label, .flops_per_step = flops_per_step,
                          .tokens_per_step = (double)B * T * c->grad_accum, .last_step = end,
                          .host_plan_bytes = mem.tier_need[PROF_TIER_HOST], .progress = !c->quiet};
    if ((s = prof_run_open(&pr, &pc, err))) goto done;
    double tok_s_sum = 0;
    long timed = 0;
    float last_loss = NAN;
    int saved_at_end = 0, last_skipped = 0;
    double last_norm = 0;
    while ((long)hs->step < end) {
        double t0 = st_now();
        long step = (long)hs->step + 1;
        prof_step_begin(pr, step);
        double loss = 0;
        if (sx) {
            if ((s = streamed_step(c, sx, store, &td, hs, step, inputs, targets, &loss, &last_norm, &last_skipped,
                                   err)))
                goto done;
            goto step_done;
        }
        st_model_zero_grad(m);
        float dloss = 1.0f / ((float)B * T * c->grad_accum);
        for (int micro = 0; micro < c->grad_accum; micro++) {
            prof_span pd = prof_begin(PROF_CAT_DATA, "data wait", -1);
            s = data_next(&td, B, T, inputs, targets, err);
            prof_end(&pd);
            if (s) goto done;
            loss += m->ops->forward(m, inputs, targets, dloss) / c->grad_accum;
            m->ops->backward(m);
        }
        prof_span pn = prof_begin(PROF_CAT_OPTIM, "grad norm", -1);
        double sumsq = optim_grad_sumsq_f32(m->grads, m->n_params);
        last_norm = sqrt(sumsq);
        prof_end(&pn);
        last_skipped = !isfinite(last_norm);
        if (store) { /* the loop's state after this step: committed with it */
            hs->step = (uint64_t)step;
            data_save_state(&td, hs);
        }
        if (last_skipped) {
            st_log(1, "step %ld: non-finite gradient norm; update skipped, no state changed\n", step);
            if (store && (s = st_store_commit_blob(store, hs, sizeof *hs, err))) goto done;
        } else {
            float scale = optim_clip_scale(sumsq, 1.0f, (float)c->grad_clip);
            hs->adam_step++;
            adamw_params hp = {(float)train_lr_at(c, step), (float)c->beta1, (float)c->beta2, (float)c->eps,
                               (long)hs->adam_step, scale};
            prof_span po = prof_begin(PROF_CAT_OPTIM, store ? "optimizer (disk state)" : "optimizer", -1);
            if (store) { /* through the disk state, committed with the loop's state */
                st_store_step_args sa = {.grads = store_grads_at, .grad_dtype = ST_F32, .work = store_work_at,
                                         .work_dtype = ST_F32, .ctx = m, .grad_sumsq = sumsq, .blob = hs,
                                         .blob_bytes = sizeof *hs};
                s = st_store_step(store, &sa, &hp, err);
            } else {
                /* the sum of squares is already known: the engine need not read the gradients twice */
                optim_step_args oa = {.params = m->params, .grads = m->grads, .grad_dtype = ST_F32,
                                      .grad_sumsq = sumsq};
                s = optim_step_ex(opt, &oa, &hp, err);
            }
            prof_end(&po);
            if (s) goto done;
            if (store) st_failpoint("train_step_committed"); /* committed, not yet logged */
        }
    step_done:;
        double norm = last_norm, lr = train_lr_at(c, step);
        int skipped = last_skipped;
        hs->step = (uint64_t)step;
        data_save_state(&td, hs);
        double dt = st_now() - t0;
        prof_step_end(pr);
        double tok_s = (double)B * T * c->grad_accum / dt, gflops = flops_per_step / dt / 1e9;
        last_loss = (float)loss;
        if (step > 1) { tok_s_sum += tok_s; timed++; }
        prof_progress_clear(pr);
        if (!c->quiet && (step % c->log_every == 0 || step == end))
            printf("step %6ld/%ld | loss %.4f | lr %.2e | norm %.3f | %7.1f ms | %8.0f tok/s | %6.1f GFLOP/s%s\n", step,
                   c->steps, loss, lr, norm, dt * 1e3, tok_s, gflops, skipped ? " | SKIPPED" : "");
        char disk[256] = "";
        if (store && !skipped) { /* the disk state's share of the step */
            st_store_stats ss;
            st_store_get_stats(store, &ss);
            snprintf(disk, sizeof disk,
                     ",\"state_ms\":%.3f,\"state_read_bytes\":%llu,\"state_write_bytes\":%llu,"
                     "\"state_hit_rate\":%.3f,\"state_wait_ms\":%.3f",
                     ss.step_s * 1e3, (unsigned long long)ss.read_bytes, (unsigned long long)ss.write_bytes,
                     ss.n_subgroups ? (double)ss.hits / ss.n_subgroups : 0.0,
                     (ss.read_wait_s + ss.write_wait_s) * 1e3);
        }
        fprintf(metrics,
                "{\"step\":%ld,\"loss\":%.6f,\"lr\":%.6e,\"grad_norm\":%.6f,\"step_ms\":%.3f,\"tokens_per_s\":%.1f,"
                "\"achieved_gflops\":%.3f,\"tokens\":%llu,\"skipped\":%s%s%s}\n",
                step, loss, lr, norm, dt * 1e3, tok_s, gflops,
                (unsigned long long)step * (unsigned long long)B * T * c->grad_accum, skipped ? "true" : "false", disk,
                prof_step_json(pr));
        fflush(metrics);
        {
            const prof_step_stats *ps = prof_step_last(pr);
            const char *tags[] = {"train/loss", "train/lr", "train/grad_norm", "perf/step_ms", "perf/tokens_per_s",
                                  "perf/achieved_gflops", "memory/host_rss_bytes", "memory/host_peak_bytes",
                                  "memory/host_plan_bytes"};
            double vals[] = {loss, lr, norm, dt * 1e3, tok_s, gflops, ps ? ps->host_rss_bytes : 0,
                             ps ? ps->host_peak_bytes : 0, mem.tier_need[PROF_TIER_HOST]};
            if ((s = prof_tb_scalars(tb, step, tags, vals, (int)(sizeof vals / sizeof vals[0]), err))) goto done;
        }
        if (c->sample_every > 0 && !c->quiet && (step % c->sample_every == 0 || step == end)) {
            /* what the model writes now, after the first tokens of this step's batch; the host
             * weights (also under streaming), untouched activations, its own RNG */
            char label[64];
            snprintf(label, sizeof label, "sample at step %ld: ", step);
            st_err serr = {0};
            if (st_generate_print_sample(m, inputs, T < 16 ? T : 16, 96, c->seed + (uint64_t)step, label, stdout,
                                         &serr))
                st_log(1, "step %ld: no sample: %s\n", step, serr.msg);
        }
        prof_progress(pr, step, loss);
        int stop = c->stop_flag && *c->stop_flag;
        if (!store && ((c->ckpt_every > 0 && step % c->ckpt_every == 0) || step == end || stop)) {
            prof_span pw = prof_begin(PROF_CAT_IO, "checkpoint write", -1);
            if ((s = save_checkpoint(c, m, opt, hs, err))) goto done;
            snprintf(path, sizeof path, "%s/checkpoints/step_%08ld", c->run_dir, step);
            prof_end_bytes(&pw, prof_dir_bytes(path));
            saved_at_end = step == end || stop;
        }
        if (stop) {
            st_log(1, "stopped at step %ld; resume with: strata train --resume %s\n", step, c->run_dir);
            break;
        }
    }
    if (!store && !saved_at_end && hs->step > 0 && c->resume[0] == 0 && (long)hs->step == end)
        s = save_checkpoint(c, m, opt, hs, err);
    if (store && !s) { /* the store is the checkpoint; the weights go beside it for users */
        snprintf(path, sizeof path, "%s/model.safetensors", c->run_dir);
        s = m->ops->save(m, path, err);
    }
    if (!s && c->save_hf[0]) {
        if (is_llama)
            s = llama_save_hf(st_model_llama(m), c->save_hf, strcmp(c->save_hf_dtype, "bf16") ? ST_F32 : ST_BF16, 0,
                              err);
        else
            s = gpt2_save_hf((gpt2_model *)m->impl, c->save_hf, err);
        if (s) goto done;
        if (!c->quiet) printf("wrote a Hugging Face model directory: %s\n", c->save_hf);
    }
    if (res) {
        res->steps_done = (long)hs->step;
        res->final_loss = last_loss;
        res->tokens_per_s = timed ? tok_s_sum / timed : 0;
    }
done:
    if (pr) { /* a trace that cannot be finished fails the run only if nothing else did */
        st_err perr = {0};
        st_status ps = prof_run_close(pr, &perr);
        if (ps && !s) s = st_errf(err, ps, "%s", perr.msg);
    }
    st_store_close(store);
    free(hs);
    if (metrics) fclose(metrics);
    if (tb) { /* an event file that cannot be finished fails the run only if nothing else did */
        st_err terr = {0};
        st_status ts = prof_tb_close(tb, &terr);
        if (ts && !s) s = st_errf(err, ts, "%s", terr.msg);
    }
    free(inputs);
    free(targets);
    data_close(&td);
    free(segs);
    if (sx) {
        stream_exec_free(sx); /* owns the optimizer and the host vectors the view used */
    } else {
        optim_free(opt);
        st_model_free(m);
    }
    st_backend_free(dev); /* also when the executor could not be created on it */
    st_backend_free(be);
    st_lock_release(&run_lock);
    return s;
}
