/* train.c - the training loop: data -> forward/backward -> clip -> AdamW -> checkpoint.
 *
 * Determinism: for a fixed configuration and thread count every step is bit-for-bit
 * reproducible (the backend's reductions have a fixed order), and a checkpoint holds
 * everything a step depends on (weights, moments, step counters, RNG, data cursor),
 * so stopping and resuming continues exactly as if nothing had stopped.
 */
#include <dirent.h>
#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fileutil.h"
#include "strata/ckpt.h"
#include "strata/dist.h"
#include "strata/block.h"
#include "strata/plan.h"
#include "strata/step.h"
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
    st_data_loader *dl;
    uint16_t *corpus; /* the embedded corpus, when used; outlives the loader */
    char *spec;       /* copy of the data key, cut into paths */
} train_data;

static void data_close(train_data *d) {
    if (d->dl) st_data_loader_close(d->dl);
    free(d->corpus);
    free(d->spec);
    memset(d, 0, sizeof *d);
}

/* KEY "data" (training) or "val_data" (validation: produced on the caller's thread, and
 * "embedded" is the corpus's held-out tail: the text that follows the training part, from
 * the same generator, so the training tokens are the same with or without validation). */
static st_status data_open(train_data *d, const st_train_config *c, const char *key, const char *spec, int vocab,
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
        dc.rank = st_comm_rank(c->comm);
        dc.world = st_comm_size(c->comm);
    }
    if (!strcmp(spec, "embedded")) {
        size_t cap = 4u << 20; /* 4 MiB of text; the default run reads a fifth of it */
        size_t held = val ? 512u << 10 : 0; /* validation: 512 KiB after it */
        uint8_t *text = malloc(cap + held);
        d->corpus = malloc((cap + held) * sizeof(uint16_t));
        if (!text || !d->corpus) {
            free(text);
            return st_errf(err, ST_ERR_NOMEM, "out of memory for the embedded corpus");
        }
        size_t n = st_corpus_embedded_generate(text, cap, 20261129), first = 0;
        if (val) { /* the generator is sequential: a longer text starts with the training text */
            first = n;
            n = st_corpus_embedded_generate(text, cap + held, 20261129);
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
        char *save = NULL;
        for (char *tok = strtok_r(d->spec, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            if (dc.n_sources == ST_DATA_MAX_SOURCES)
                return st_errf(err, ST_ERR_INVALID, "key '%s': more than %d sources", key, ST_DATA_MAX_SOURCES);
            double w = 1.0;
            char *colon = strrchr(tok, ':');
            if (colon) {
                char *end;
                w = strtod(colon + 1, &end);
                if (end == colon + 1 || *end || !(w > 0))
                    return st_errf(err, ST_ERR_INVALID, "key '%s': weight '%s' of source '%.*s' must be a positive "
                                   "number", key, colon + 1, (int)(colon - tok), tok);
                *colon = 0;
            }
            dc.sources[dc.n_sources++] = (st_data_source_config){.path = tok, .weight = w};
        }
        if (!dc.n_sources)
            return st_errf(err, ST_ERR_INVALID, "key '%s' is empty; give \"embedded\" or token files", key);
    }
    st_status s = st_data_loader_open(&d->dl, &dc, err);
    return s ? st_err_prefix(err, "key '%s'", key) : ST_OK;
}

/* positions, doc_start (B,T; NULL: not wanted): the packed documents of the batch
 * (strata/model.h), doc_start from the loader's segments (cu_seqlens: each ends at a
 * document start or its row's end, so none crosses a row). */
static st_status data_next(train_data *d, int B, int T, int32_t *inputs, int32_t *targets, int32_t *positions,
                           int32_t *doc_start, st_err *err) {
    st_data_batch b;
    st_status s = st_data_loader_next(d->dl, &b, err);
    if (s) return s;
    if (b.B != B || b.T != T)
        return st_errf(err, ST_ERR_INVALID, "data: batch %d x %d from the loader, %d x %d expected", b.B, b.T, B, T);
    /* a target whose loss mask is 0 (an SFT mask: not the assistant's) becomes -1, which
     * every loss ignores; the step's loss is the mean over the rest (strata/step.h) */
    st_data_batch_targets(&b, inputs, targets);
    if (positions) memcpy(positions, b.positions, sizeof(int32_t) * (size_t)B * T);
    if (doc_start)
        for (int i = 0; i < b.n_seqs; i++)
            for (int j = b.cu_seqlens[i]; j < b.cu_seqlens[i + 1]; j++)
                doc_start[j] = b.cu_seqlens[i] - j / T * T; /* the segment's start in its row */
    return ST_OK;
}

static void data_save_state(const train_data *d, st_train_state_header *h) {
    st_data_loader_state st;
    st_data_loader_get_state(d->dl, &st);
    h->data_state_bytes = sizeof st;
    memcpy(h->data_state, &st, sizeof st);
}

static st_status data_restore_state(train_data *d, const st_train_state_header *h, const char *path, st_err *err) {
    st_data_loader_state st;
    if (h->data_state_bytes != sizeof st)
        return st_errf(err, ST_ERR_FORMAT, "%s: data state has %llu bytes, this strata's has %zu", path,
                       (unsigned long long)h->data_state_bytes, sizeof st);
    memcpy(&st, h->data_state, sizeof st);
    st_status s = st_data_loader_set_state(d->dl, &st, err);
    return s ? st_err_prefix(err, "%s", path) : ST_OK;
}

/* ------------------------------------------------------------------ checkpoints */

/* A complete checkpoint: checkpoints/step_N exactly (not .partial or .old: those are
 * interrupted saves), holding the weights and the training state. *step = N. */
static int complete_checkpoint(const char *ckdir, const char *name, unsigned long long *step) {
    if (strncmp(name, "step_", 5) || strlen(name) < 13 || strspn(name + 5, "0123456789") != strlen(name + 5))
        return 0;
    char p[4400];
    snprintf(p, sizeof p, "%s/%s/train_state.bin", ckdir, name);
    if (access(p, R_OK) != 0) { /* or the ranks' shards and their description (ckpt.h) */
        snprintf(p, sizeof p, "%s/%s/" ST_SHARDS_JSON, ckdir, name);
        if (access(p, R_OK) != 0) return 0;
    }
    snprintf(p, sizeof p, "%s/%s/model.safetensors", ckdir, name);
    if (access(p, R_OK) != 0) return 0;
    *step = strtoull(name + 5, NULL, 10);
    return 1;
}

/* The complete checkpoints of RUN_DIR/checkpoints, by step (ascending), in *steps
 * (malloc'd, the caller frees); how many. 0 when the directory cannot be read. */
static int cmp_u64(const void *a, const void *b) {
    unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
    return x < y ? -1 : x > y;
}
static int list_checkpoints(const char *run_dir, unsigned long long **steps) {
    char ckdir[2100];
    snprintf(ckdir, sizeof ckdir, "%s/checkpoints", run_dir);
    *steps = NULL;
    DIR *d = opendir(ckdir);
    if (!d) return 0;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        unsigned long long st;
        if (!complete_checkpoint(ckdir, e->d_name, &st)) continue;
        if (n == cap) {
            unsigned long long *p = realloc(*steps, sizeof *p * (size_t)(cap = cap ? 2 * cap : 64));
            if (!p) break; /* out of memory: the ones listed so far */
            *steps = p;
        }
        (*steps)[n++] = st;
    }
    closedir(d);
    if (n) qsort(*steps, (size_t)n, sizeof **steps, cmp_u64);
    return n;
}

/* PATH is a checkpoint directory (train_state.bin in it: used as given) or a run
 * directory: its newest complete checkpoint, which is the one checkpoints/latest names
 * unless latest could not be written (missing, empty, or naming an older step after a
 * crash between a checkpoint's rename and latest's update). */
static st_status resolve_resume(const char *path, char *ckpt_dir, size_t cap, st_err *err) {
    char buf[4096], shards[4096];
    snprintf(buf, sizeof buf, "%s/train_state.bin", path);
    snprintf(shards, sizeof shards, "%s/" ST_SHARDS_JSON, path);
    if (access(buf, R_OK) == 0 || access(shards, R_OK) == 0) {
        snprintf(ckpt_dir, cap, "%s", path);
        return ST_OK;
    }
    char ckdir[2100];
    snprintf(ckdir, sizeof ckdir, "%s/checkpoints", path);
    unsigned long long *steps;
    int n = list_checkpoints(path, &steps);
    unsigned long long newest = n ? steps[n - 1] : 0;
    free(steps);
    unsigned long long latest_step = 0;
    int latest_ok = 0;
    snprintf(buf, sizeof buf, "%s/checkpoints/latest", path);
    FILE *f = fopen(buf, "r");
    int have_latest = f != NULL;
    if (f) {
        char name[256] = "";
        if (!fgets(name, sizeof name, f)) name[0] = 0;
        fclose(f);
        name[strcspn(name, "\n")] = 0;
        latest_ok = complete_checkpoint(ckdir, name, &latest_step);
        if (!latest_ok && !n)
            return st_errf(err, ST_ERR_FORMAT, "%s names '%s', which is not a complete checkpoint, and %s holds no "
                           "other; name a checkpoint directory instead", buf, name, ckdir);
    }
    if (!latest_ok && !n)
        return st_errf(err, ST_ERR_IO, "key 'resume': %s has no complete checkpoint (checkpoints/step_N) and no "
                       "train_state.bin; give a run directory or a checkpoint directory", path);
    unsigned long long use = latest_ok ? latest_step : 0;
    if (n && newest > use) {
        st_log(1, "%s: %s; resuming from the newest complete checkpoint, step_%08llu\n", buf,
               have_latest ? "names an older or incomplete checkpoint" : "is missing", newest);
        use = newest;
    }
    snprintf(ckpt_dir, cap, "%s/checkpoints/step_%08llu", path, use);
    return ST_OK;
}

/* keep_checkpoints: after a new checkpoint is complete, the oldest complete ones beyond
 * the newest N go (with a recursive delete, never a shell). A failure is a warning: the
 * run's state is safe in the new checkpoint. */
static void prune_checkpoints(const st_train_config *c) {
    if (c->keep_checkpoints <= 0) return;
    unsigned long long *steps;
    int n = list_checkpoints(c->run_dir, &steps);
    for (int i = 0; i + c->keep_checkpoints < n; i++) {
        char dir[2200];
        snprintf(dir, sizeof dir, "%s/checkpoints/step_%08llu", c->run_dir, steps[i]);
        st_err e = {0};
        if (st_rmtree(dir, &e)) st_log(1, "warning: keep_checkpoints: %s\n", e.msg);
    }
    free(steps);
}

/* A resumed run logs each step once: the lines of metrics.jsonl after the step it resumes
 * at (steps that ran after the checkpoint, before a crash or a kill) are replayed, so they
 * go, with a torn last line. */
static st_status metrics_truncate(const char *run_dir, unsigned long long step, st_err *err) {
    char path[2200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    FILE *f = fopen(path, "r");
    if (!f) return ST_OK; /* nothing logged yet */
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    long dropped = 0;
    st_file_writer w;
    st_status s = st_file_writer_open(&w, path, err);
    while (!s && (len = getline(&line, &lcap, f)) > 0) {
        json_object *o = line[len - 1] == '\n' ? json_tokener_parse(line) : NULL;
        json_object *js;
        int keep = o && json_object_object_get_ex(o, "step", &js) && json_object_get_int64(js) >= 0 &&
                   (unsigned long long)json_object_get_int64(js) <= step;
        json_object_put(o);
        if (keep) s = st_file_writer_put(&w, line, (size_t)len, err);
        else dropped++;
    }
    free(line);
    fclose(f);
    if (!s && !dropped) { /* unchanged: leave the file as it was */
        st_file_writer_close(&w, ST_ERR_INVALID, NULL);
        return ST_OK;
    }
    s = st_file_writer_close(&w, s, err);
    if (!s) st_log(1, "%s: %ld line%s after step %llu removed (those steps run again)\n", path, dropped,
                   dropped == 1 ? "" : "s", step);
    return s;
}

/* The ranks of a run under mpirun (one process: world 1, comm NULL-safe). */
typedef struct train_dist {
    st_comm *comm;
    int rank, world, zero;
    size_t *bounds;          /* the shards (zero 1 and 2) */
    size_t lo, hi;           /* this rank's: [0, n_params) when the state is not sharded */
} train_dist;

/* Every rank's status of a part of the work done by all: ST_OK when all succeeded; else this
 * rank's own error, or one naming the first rank that failed. */
static st_status agree(const train_dist *d, st_status mine, const char *what, st_err *err) {
    if (d->world == 1) return mine;
    int *all = malloc(sizeof(int) * (size_t)d->world);
    if (!all) return mine ? mine : st_errf(err, ST_ERR_NOMEM, "out of memory");
    int m = (int)mine;
    st_err cerr = {0};
    st_status s = st_comm_allgather(d->comm, &m, sizeof m, all, what, &cerr);
    if (s && !mine) mine = st_errf(err, s, "%s", cerr.msg);
    for (int r = 0; r < d->world && !s && !mine; r++)
        if (all[r]) mine = st_errf(err, (st_status)all[r], "rank %d: %s failed (its message is in its output); every rank "
                                   "stops", r, what);
    free(all);
    return mine;
}

static st_status save_checkpoint(const st_train_config *c, const train_dist *d, st_model *m, st_optim *o,
                                 const st_train_state_header *h, st_err *err) {
    char dir[2048], tmp[2100], path[2200], old[2100];
    snprintf(dir, sizeof dir, "%s/checkpoints/step_%08llu", c->run_dir, (unsigned long long)h->step);
    snprintf(tmp, sizeof tmp, "%s.partial", dir);
    snprintf(old, sizeof old, "%s.old", dir);
    st_status s = ST_OK;
    if (d->rank == 0) { /* leftovers of an interrupted save are incomplete by construction */
        s = st_rmtree(tmp, err);
        if (!s) s = st_rmtree(old, err);
        if (!s) s = st_mkdirs(tmp, err);
    }
    if ((s = agree(d, s, "preparing the checkpoint directory", err))) return s;
    int sharded = d->world > 1 && d->zero > 0;
    if (sharded && o) { /* each rank its shard of the optimizer state */
        s = st_train_state_save_shard(tmp, d->rank, h, o, err);
    }
    if (!s && d->rank == 0) { /* the weights (the same on every rank), the description, the configuration */
        snprintf(path, sizeof path, "%s/model.safetensors", tmp);
        s = m->ops->save(m, path, err);
        if (!s && sharded)
            s = st_train_state_save_shards_json(tmp, d->world, d->zero, st_optim_format(o), m->n_params, d->bounds, err);
        snprintf(path, sizeof path, "%s/train_state.bin", tmp);
        if (!s && !sharded) s = st_train_state_save(path, h, o, err);
        snprintf(path, sizeof path, "%s/config.json", tmp);
        if (!s) s = st_train_config_save_json(c, path, err);
    }
    if ((s = agree(d, s, "writing the checkpoint", err))) return s;
    if (d->rank == 0) {
        struct stat sb;
        if ((s = st_fsync_dir(tmp, err))) goto commit;
        if (stat(dir, &sb) == 0 && rename(dir, old) != 0) {
            s = st_errf(err, ST_ERR_IO, "cannot move aside %s: %s", dir, strerror(errno));
            goto commit;
        }
        if (rename(tmp, dir) != 0) {
            s = st_errf(err, ST_ERR_IO, "cannot rename %s into place: %s", tmp, strerror(errno));
            goto commit;
        }
        st_err rerr = {0};
        if (st_rmtree(old, &rerr)) st_log(1, "warning: %s\n", rerr.msg);
        char ckdir[2100];
        snprintf(ckdir, sizeof ckdir, "%s/checkpoints", c->run_dir);
        if ((s = st_fsync_dir(ckdir, err))) goto commit;
        snprintf(path, sizeof path, "%s/checkpoints/latest", c->run_dir);
        char name[64];
        snprintf(name, sizeof name, "step_%08llu", (unsigned long long)h->step);
        s = st_write_text(path, name, err);
    }
commit:
    return agree(d, s, "committing the checkpoint", err);
}

/* Under mpirun: every rank runs the same configuration (the model, the seed, the data, every
 * key but threads, which may differ by machine); the first key that differs is named. */
static st_status dist_check_config(const st_train_config *c, const train_dist *d, st_err *err) {
    enum { MAXK = 128 };
    uint32_t mine[MAXK] = {0};
    int n = st_train_config_key_crcs(c, mine, MAXK);
    uint32_t *all = malloc(sizeof mine * (size_t)d->world);
    if (!all) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    st_status s = st_comm_allgather(d->comm, mine, sizeof mine, all, "configuration check", err);
    for (int r = 1; r < d->world && !s; r++)
        for (int i = 0; i < n && !s; i++)
            if (all[(size_t)r * MAXK + i] != all[i] && strcmp(st_train_config_key_name(i), "threads"))
                s = st_errf(err, ST_ERR_INVALID, "rank %d's key '%s' differs from rank 0's: every rank of a run must "
                            "be given the same configuration (start them with one mpirun command line)", r,
                            st_train_config_key_name(i));
    free(all);
    return s;
}

void st_train_decay_segments(const st_param_info *t, int n, float weight_decay, st_optim_segment *out) {
    for (int i = 0; i < n; i++) {
        st_role r = t[i].role;
        out[i] = (st_optim_segment){t[i].offset, t[i].numel,
                                 (r == ST_ROLE_MATMUL_WEIGHT || r == ST_ROLE_EMBEDDING) ? weight_decay : 0.0f};
    }
}

/* ------------------------------------------------------------------ layer streaming */

/* The plan strata train gives the streaming executor: the whole vocabulary on the
 * device if it fits, else 2048-row chunks; activations kept if they fit, else
 * offloaded, else recomputed (the cheapest first, on this backend). */
/* The machine's profile for the planner, measured on the device be the run computes on
 * (the CPU backend, or the CUDA backend's arena: plan_profile.c synchronizes before reading
 * the clock), once per process and kind of device, and the model's shape once per shape (a
 * second run in the same process, as tests and sweeps make, plans from the same figures at
 * no cost). */
static st_status machine_profile(st_backend *be, const st_arch *arch, int B, int T, st_plan_profile *hw, st_err *err) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static st_plan_profile cached[2]; /* [0] the CPU, [1] a GPU: a run on one never plans from the other's figures */
    static int have[2];
    int k = strcmp(be->ops->name, "cpu") != 0;
    st_status s = ST_OK;
    pthread_mutex_lock(&mu);
    if (!have[k] && !(s = st_plan_profile_measure(be, &cached[k], err))) have[k] = 1;
    /* the model's own block and classifier timed at this batch and sequence (once per shape
     * per process): the prediction from the real ops at this shape, not reference rates */
    st_err serr = {0};
    if (have[k] && !st_plan_profile_shape(&cached[k], arch, B, T) &&
        st_plan_profile_measure_shape(be, arch, B, T, &cached[k], &serr))
        st_log(2, "planner: the model's shape could not be timed on %s (%s); predicting from the reference rates\n",
               be->ops->name, serr.msg);
    if (have[k]) *hw = cached[k];
    pthread_mutex_unlock(&mu);
    return s;
}

/* key 'plan' a file: its plan, when it was made for this model at this batch and seq and
 * fits this run's budget with this run's configuration (st_stream_device_bytes: an 8-bit or
 * disk state, or ranks, may need other bytes than the run it was made for). pred: the
 * file's prediction, if it has one (has_pred). */
static st_status plan_from_file(const st_train_config *c, const char *path, st_plan_file *loaded, const st_arch *arch,
                                const st_stream_config *sc, size_t budget, st_stream_plan *plan, st_plan_prediction *pred,
                                int *has_pred, unsigned long long *state_budget, st_err *err) {
    st_plan_file *pf = loaded ? loaded : malloc(sizeof *pf); /* loaded: path read and checked already (taken) */
    if (!pf) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    st_status s = loaded ? ST_OK : st_plan_file_load(path, pf, err);
    if (!s && !loaded) s = st_plan_file_check(path, pf, arch, c->batch, c->seq, err);
    size_t need = s ? 0 : st_stream_device_bytes(sc, &pf->plan);
    if (!s && need > budget)
        s = st_errf(err, ST_ERR_NOMEM, "plan file %s needs %zu device bytes in this run, device_budget is %zu: %zu bytes "
                    "missing; give --device_budget %zu or more, or make a plan for this budget (strata plan "
                    "--device_budget %zu ... -o FILE)", path, need, budget, need - budget, need, budget);
    if (!s) {
        *plan = pf->plan;
        *pred = pf->pred;
        *has_pred = pf->has_prediction;
        *state_budget = pf->state_budget;
        int n[3] = {0, 0, 0};
        for (int l = 0; l < plan->n_layer; l++) n[plan->act[l]]++;
        st_log(1, "plan: %s (%d keep, %d offload, %d recompute, prefetch depth %d, vocab_chunk %d; %zu device bytes of "
               "the budget %zu; made for a budget of %zu%s)\n", path, n[ST_STREAM_ACT_KEEP], n[ST_STREAM_ACT_OFFLOAD],
               n[ST_STREAM_ACT_RECOMPUTE], plan->prefetch_depth, plan->vocab_chunk, need, budget, pf->device_budget,
               pf->has_prediction ? ", as saved" : ", no prediction");
    }
    free(pf);
    return s ? st_err_prefix(err, "key 'plan'") : ST_OK;
}

/* A resume under plan auto runs the plan its run ran (RUN_DIR/plan.json) where that was made
 * for this model, batch, seq and device budget and keeps the act choices given: planned
 * anew from a profile measured again, the vocabulary could be chunked otherwise, and the
 * chunked classifier equals the resident one (and another chunk size) only to float
 * rounding, so the resumed steps would not be the uninterrupted run's bit for bit. One
 * process only (under ranks each rank plans for itself). Returns the plan file read from
 * path (checked; the caller frees it), or NULL having logged why the run plans anew. */
static st_plan_file *resume_plan(const st_train_config *c, const st_arch *arch, const st_stream_config *sc,
                                 size_t budget, const unsigned char *fixed, char *path, size_t cap) {
    snprintf(path, cap, "%s/plan.json", c->run_dir);
    st_plan_file *pf = malloc(sizeof *pf);
    st_err e = {0};
    const char *why = NULL;
    if (!pf || st_plan_file_load(path, pf, &e) || st_plan_file_check(path, pf, arch, c->batch, c->seq, &e))
        why = pf ? e.msg : "out of memory";
    else if (pf->device_budget != (size_t)c->device_budget)
        why = "it was made for another device_budget";
    else if (st_stream_device_bytes(sc, &pf->plan) > budget)
        why = "it does not fit this run's device";
    else
        for (int l = 0; l < pf->plan.n_layer && !why; l++)
            if (fixed[l] != ST_PLAN_ACT_FREE && pf->plan.act[l] != fixed[l]) why = "key 'act' asks other choices";
    if (why)
        st_log(1, "plan: the resumed run plans anew (its last plan, %s: %s); the vocabulary's chunking may differ "
               "from the steps before, to float rounding\n", path, why);
    if (!why) return pf;
    free(pf);
    return NULL;
}

/* The plan a run streams with, as RUN_DIR/plan.json (one process: under ranks each rank
 * plans for itself, and the run directory is rank 0's): --plan RUN_DIR/plan.json runs it
 * again exactly. */
static st_status save_run_plan(const st_train_config *c, const st_arch *arch, const st_stream_config *sc, size_t budget,
                               const st_stream_plan *plan, const st_plan_prediction *pred,
                               const st_plan_config_disk *cd, const st_plan_profile *hw, st_err *err) {
    char path[1100];
    snprintf(path, sizeof path, "%s/plan.json", c->run_dir);
    st_plan_file *pf = malloc(sizeof *pf);
    if (!pf) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    st_plan_file_init(pf, arch, c->init_from[0] ? c->init_from : c->model, c->batch, c->seq, budget, plan, pred);
    pf->device_bytes = pf->pred.device_bytes = st_stream_device_bytes(sc, plan);
    json_object *doc = st_plan_file_to_json(pf);
    free(pf);
    if (cd && cd->on_disk) json_object_object_add(doc, "disk", st_plan_config_disk_to_json(cd));
    st_status s = st_plan_file_save_json(path, doc, err);
    json_object_put(doc);
    /* the machine's figures the plan was made from: strata plan --profile RUN_DIR/plan_profile.json
     * (with this run's keys) makes and predicts the same plan */
    if (!s && hw) {
        snprintf(path, sizeof path, "%s/plan_profile.json", c->run_dir);
        s = st_plan_profile_save(path, hw, err);
    }
    return s;
}

/* With the state on disk, pred (the plan's, the state in RAM) becomes the disk state's
 * (st_plan_predict_config_ex): each path's bandwidth from state_profile, else on a resume the
 * figures the run's last start saved in RUN_DIR/plan.json for the same state_paths, else a
 * short probe of each path now; logged under who. On failure pred is kept and cd zeroed. */
static void predict_disk(const st_train_config *c, const st_arch *arch, const st_plan_profile *hw,
                         const st_stream_plan *plan, const char *who, st_plan_prediction *pred, st_plan_config_disk *cd) {
    char prev[1100];
    snprintf(prev, sizeof prev, "%s/plan.json", c->run_dir);
    st_err derr = {0};
    st_plan_prediction in_ram = *pred;
    if (st_plan_predict_config_ex(c, arch, hw, plan, ST_PLAN_PROBE_BYTES, c->resume[0] ? prev : NULL, pred, cd,
                                  &derr)) {
        st_log(2, "%s: the disk state's time is not predicted (%s); the prediction is the state in RAM's\n", who,
               derr.msg);
        *pred = in_ram;
        memset(cd, 0, sizeof *cd);
        return;
    }
    st_log(1, "%s: the disk state: %s; the store %.3f s a step (io %.3f s, cpu %.3f s), %s the backward, %.3f s of "
           "it hidden\n", who,
           cd->reused ? "each path's bandwidth as the run's last start probed it (RUN_DIR/plan.json, the same "
                        "state_paths: a resume probes no path)"
           : cd->probed ? "each path's bandwidth probed now (no state_profile)"
                        : "the paths' bandwidth from state_profile",
           cd->dc.store_s, cd->dc.io_s, cd->dc.cpu_s, cd->beside ? "beside" : "after", cd->dc.hidden_s);
    char line[256];
    for (int i = 0; i < cd->n_budgets; i++) { /* key state_budget left 0: the planner's choice */
        st_plan_state_budget_describe(cd, i, line, sizeof line);
        st_log(1, "%s:   %s\n", who, line);
    }
}

static st_status open_streamed(const st_train_config *c, st_model *m, const st_arch *arch, st_backend *be, int ranks,
                               st_backend **dev, st_stream_exec **sx, double *state_budget, st_err *err) {
    /* the moments live in the disk state store; under ranks the step updates the rank's shard
     * (the executor hands over each micro-batch's gradient: no optimizer, one micro-batch) */
    int external = c->state_paths[0] != 0 || ranks > 1;
    /* the model's own vectors (CPU backend: host memory) are the host tier */
    st_stream_config sc = {.arch = arch, .host_params = m->params, .host_grads = m->grads, .B = c->batch, .T = c->seq,
                        .grad_accum = ranks > 1 ? 1 : (int)c->grad_accum, .weight_decay = (float)c->weight_decay,
                        .state_format = strcmp(c->optim_state, "8bit") ? ST_OPTIM_STATE_F32 : ST_OPTIM_STATE_8BIT,
                        .external_optimizer = external};
    st_stream_plan plan;
    st_stream_plan_default(&plan, arch->lay.n_blocks);
    size_t budget = (size_t)c->device_budget;
    /* the planner (plan.h: the fastest predicted plan within the budget on this machine,
     * measured now; the head resident where no slower, as strata plan chooses); without
     * GLPK, or when it finds none, the fixed rule below */
    st_plan_profile hw;
    st_plan_prediction pred;
    st_plan_config_disk cdisk;
    memset(&cdisk, 0, sizeof cdisk);
    int have_hw = 0;
    st_plan_options po = {.mip_gap = -1, .allow_vocab_chunk = 1, .prefer_resident_head = st_train_config_plan_head(c)};
    st_err perr = {0};
    int found = 0, has_pred = 0, n_fixed = 0, L = arch->lay.n_blocks;
    st_status s;
    /* key 'act': choices every plan must make (the program's constraints, the rule's too) */
    unsigned char fixed[ST_STREAM_MAX_LAYERS];
    if (L > ST_STREAM_MAX_LAYERS || (s = st_plan_act_parse(c->act, L, fixed, &n_fixed, err)))
        return L > ST_STREAM_MAX_LAYERS ? st_errf(err, ST_ERR_INVALID, "key 'device_budget': %d blocks, layer streaming "
                                               "takes at most %d", L, ST_STREAM_MAX_LAYERS)
                                     : st_err_prefix(err, "key 'act'");
    if (n_fixed) po.fixed_act = fixed;
    /* a GPU (key 'device') exists before the plan: the planner measures it. The CPU device,
     * the host's cores, is measured through the host backend (the profile's buffers outside
     * the budget), and its arena carved once the plan is known, below. */
    int cuda_index = -1;
    if ((s = st_backend_device_parse(c->device, &cuda_index, err))) return st_err_prefix(err, "key 'device'");
    if (cuda_index >= 0 && (s = st_backend_device_create(dev, c->device, be, budget, err)))
        return st_err_prefix(err, s == ST_ERR_NOMEM ? "key 'device_budget'" : "key 'device'");
    /* key 'matmul': set before the planner times the device (a CPU device takes fp32 only) */
    if ((s = st_backend_set_matmul(*dev, c->matmul, err))) return st_err_prefix(err, "key 'matmul'");
    budget = st_backend_device_usable_bytes(c->device, budget); /* what the plan gets (a GPU: less cuBLASLt's) */
    char resumed[1100];
    const char *plan_path = strcmp(c->plan, "auto") ? c->plan : NULL;
    st_plan_file *resumed_pf = NULL;
    if (!plan_path && c->resume[0] && ranks <= 1 &&
        (resumed_pf = resume_plan(c, arch, &sc, budget, fixed, resumed, sizeof resumed)))
        plan_path = resumed;
    if (plan_path) { /* a saved plan, run exactly (or refused) */
        unsigned long long file_state_budget = 0;
        if ((s = plan_from_file(c, plan_path, resumed_pf, arch, &sc, budget, &plan, &pred, &has_pred, &file_state_budget,
                                err)))
            return s;
        for (int l = 0; l < L; l++)
            if (fixed[l] != ST_PLAN_ACT_FREE && plan.act[l] != fixed[l])
                return st_errf(err, ST_ERR_INVALID, "key 'act': block %d %s, but plan file %s has it %s: give act auto "
                               "to run the file, or make a plan with the choices (strata plan --act %s ... -o FILE)", l,
                               st_plan_act_name(fixed[l]), plan_path, st_plan_act_name(plan.act[l]), c->act);
        found = 1;
        /* the file's plan predicted again on this machine (the file's figures are the machine's it
         * was made on, perhaps another), as the planner predicts: saved in RUN_DIR/plan.json */
        st_plan_prediction filed = pred;
        int filed_has = has_pred;
        if ((s = machine_profile(*dev ? *dev : be, arch, c->batch, c->seq, &hw, &perr)) == ST_OK) {
            have_hw = 1;
            if (external && ranks <= 1) sc.store_beside = st_plan_store_beside(&hw);
            s = st_plan_predict(arch, c->batch, c->seq, &hw, &plan, &pred, &perr);
        }
        if (s) {
            st_log(2, "plan: %s is not predicted on this machine (%s)\n", plan_path, perr.msg);
            pred = filed;
        } else {
            has_pred = 1;
            pred.device_budget = budget;
            pred.solve_s = 0;
            if (ranks <= 1 && c->state_paths[0]) {
                /* the store's host budget the file was predicted with, where the key leaves it 0 */
                st_train_config fc = *c;
                if (!(c->state_budget > 0) && file_state_budget > 0) fc.state_budget = (double)file_state_budget;
                predict_disk(&fc, arch, &hw, &plan, "plan", &pred, &cdisk);
                if (fc.state_budget != c->state_budget && cdisk.on_disk) {
                    *state_budget = fc.state_budget;
                    st_log(1, "plan: the state store's host budget %llu bytes, as %s was predicted with\n",
                           file_state_budget, plan_path);
                }
            }
            char was[64] = "no prediction";
            if (filed_has) snprintf(was, sizeof was, "%.3f s a step", filed.step_s);
            st_log(1, "plan: %s predicted on this machine %.3f s a step%s (the file: %s)\n", plan_path, pred.step_s,
                   cdisk.on_disk ? " with the state on disk" : "", was);
        }
    } else {
        s = machine_profile(*dev ? *dev : be, arch, c->batch, c->seq, &hw, &perr);
        have_hw = s == ST_OK;
        /* the disk state's update beside the backward pays only where host work leaves the
         * device's compute alone (not on the CPU backend, whose device is the host's cores) */
        if (!s && external && ranks <= 1) {
            sc.store_beside = st_plan_store_beside(&hw);
            st_log(1, "disk state: the store's update runs %s the backward (measured host_work_slowdown %.2f)\n",
                   sc.store_beside ? "beside" : "after", hw.host_work_slowdown);
        }
        if (!s) s = st_plan_stream_ex(arch, c->batch, c->seq, budget, &hw, &po, &plan, &pred, &perr);
        if (s == ST_ERR_NOMEM && n_fixed) { /* the choices given do not fit: refused, not bypassed */
            *err = perr;
            return st_err_prefix(err, "key 'act'");
        }
        found = has_pred = s == ST_OK;
        /* the prediction strata plan prints for this configuration: with the state on disk,
         * the store's time from state_profile or a short probe of each path now */
        if (found && ranks <= 1 && c->state_paths[0]) predict_disk(c, arch, &hw, &plan, "planner", &pred, &cdisk);
        if (found)
            st_log(1, "planner: %d keep, %d offload, %d recompute, prefetch depth %d, vocab_chunk %d: predicted %.3f s "
                   "a step%s, %zu device bytes (solved in %.3f s)\n", pred.n_keep, pred.n_offload, pred.n_recompute,
                   plan.prefetch_depth, plan.vocab_chunk, pred.step_s, cdisk.on_disk ? " with the state on disk" : "",
                   pred.device_bytes, pred.solve_s);
        else
            st_log(2, "planner: %s; the fixed rule chooses the plan\n", perr.msg);
    }
    static const st_stream_act order[] = {ST_STREAM_ACT_KEEP, ST_STREAM_ACT_OFFLOAD, ST_STREAM_ACT_RECOMPUTE};
    for (int chunk = 0; chunk < 2 && !found; chunk++) {
        plan.vocab_chunk = chunk ? ST_PLAN_RULE_VOCAB_CHUNK : 0;
        for (int a = 0; a < 3 && !found; a++) {
            st_stream_plan_set_all(&plan, order[a]);
            for (int l = 0; l < L; l++)
                if (fixed[l] != ST_PLAN_ACT_FREE) plan.act[l] = fixed[l];
            found = st_stream_device_bytes(&sc, &plan) <= budget;
        }
    }
    if (!found) /* the smallest plan strata train makes (recompute, chunks) is the last one tried */
        return st_errf(err, ST_ERR_NOMEM, "key 'device_budget': %.0f bytes is too small for this model at batch %d x "
                       "seq %d: the smallest plan (every block recomputed, the vocabulary in 2048-row chunks) needs "
                       "%zu device bytes, %.0f bytes missing; give at least that, or a smaller batch or seq",
                       c->device_budget, c->batch, c->seq, st_stream_device_bytes(&sc, &plan),
                       (double)st_stream_device_bytes(&sc, &plan) - (double)budget);
    if (ranks > 1) plan.grad_dtype = ST_F32; /* the ranks reduce fp32 gradients */
    if (!*dev && (s = st_backend_device_create(dev, c->device, be, budget, err)))
        return st_err_prefix(err, "key 'device_budget'");
    if ((s = st_stream_exec_create(sx, &sc, &plan, *dev, err))) return st_err_prefix(err, "key 'device_budget'");
    char usable[96] = "";
    if (cuda_index >= 0)
        snprintf(usable, sizeof usable, " (%.1f MiB of it for the plan, the rest cuBLASLt's workspace)",
                 budget / 1048576.0);
    st_log(1, "layer streaming: device budget %.1f MiB on %s%s, block 0's activations %s, vocabulary %s (%d rows a "
           "chunk)\n", c->device_budget / 1048576.0, cuda_index >= 0 ? c->device : "the CPU", usable,
           plan.act[0] == ST_STREAM_ACT_KEEP ? "kept" : plan.act[0] == ST_STREAM_ACT_OFFLOAD ? "offloaded" : "recomputed",
           plan.vocab_chunk ? "chunked" : "resident", plan.vocab_chunk);
    /* the store's host budget the planner chose (key state_budget left 0): the run's */
    if (cdisk.on_disk && cdisk.budget_chosen) *state_budget = (double)cdisk.dc.state_budget;
    /* the file's budget is the one given, so that --plan RUN_DIR/plan.json alone sizes the device alike */
    return ranks > 1 ? ST_OK
                     : save_run_plan(c, arch, &sc, (size_t)c->device_budget, &plan, has_pred ? &pred : NULL, &cdisk,
                                     have_hw ? &hw : NULL, err);
}


/* ------------------------------------------------------------------ validation
 * The mean loss over the same eval_tokens of val_data at every evaluation (the loader goes
 * back to its start each time), forward only: no parameter, gradient, moment or training
 * data position changes, so a run is bit-identical with and without validation. Under
 * streaming the executor's forward-only pass runs it (st_stream_eval). */

typedef struct train_eval {
    train_data vd;            /* the embedded tail: generated at the first evaluation */
    st_data_loader_state start;
    const char *spec;         /* NULL: no validation */
} train_eval;

/* val_data, or the embedded corpus's held-out tail for the embedded corpus; NULL: none. */
static const char *val_spec(const st_train_config *c) {
    if (c->eval_every <= 0 || !strcmp(c->val_data, "none")) return NULL;
    if (c->val_data[0]) return c->val_data;
    return !strcmp(c->data, "embedded") ? "embedded" : NULL;
}

static st_status eval_loss(const st_train_config *c, st_model *m, st_stream_exec *sx, train_eval *ev, int32_t *inputs,
                           int32_t *targets, int32_t *positions, int32_t *doc_start, double *out, st_err *err) {
    st_status s;
    if (!ev->vd.dl) {
        if ((s = data_open(&ev->vd, c, "val_data", ev->spec, m->vocab_size, err))) return s;
        st_data_loader_get_state(ev->vd.dl, &ev->start);
    }
    s = st_data_loader_set_state(ev->vd.dl, &ev->start, err);
    if (s) return st_err_prefix(err, "key 'val_data'");
    long per = (long)c->batch * c->seq, n = c->eval_tokens > 0 ? (c->eval_tokens + per - 1) / per : 8;
    double sum = 0;
    for (long i = 0; i < n; i++) {
        if ((s = data_next(&ev->vd, c->batch, c->seq, inputs, targets, positions, doc_start, err)))
            return st_err_prefix(err, "key 'val_data'");
        float l;
        if (doc_start && sx) st_stream_set_docs(sx, positions, doc_start); /* as in training */
        else if (doc_start && (s = st_model_set_docs(m, positions, doc_start, err))) return s;
        if (sx) {
            if ((s = st_stream_eval(sx, inputs, targets, &l, err))) return s;
        } else {
            l = m->ops->forward(m, inputs, targets, 0.0f); /* dloss 0: the logits stay, no gradient */
        }
        sum += l;
    }
    *out = sum / (double)n;
    return ST_OK;
}

/* ------------------------------------------------------------------ state on disk
 * With state_paths, the fp32 master weights and the moments live in the state store
 * (strata/store.h); the model's fp32 weights are the working copy it writes each step.
 * The store commits every step with the loop's state (step, data position) as its blob,
 * so it is the checkpoint: a run killed at any instant resumes from the last commit. */


/* ------------------------------------------------------------------ re-sharding the disk state
 * A disk state written at W ranks resumed at M != W: each new rank makes its own store
 * (PATH/rankR-of-M; M == 1: PATH itself) from the old stores' ranges of its shard. The old
 * stores are opened to read (shared locks) and never changed; the new one is committed at
 * the old stores' step with their loop state, or not at all (a crash leaves it without a
 * manifest, and the next resume makes it again). */

#define RESHARD_OPEN 2 /* old stores open at once: a new subgroup spans at most two */

typedef struct reshard {
    const char *const *base; /* the state paths as given */
    int n_paths, W;
    const st_optim_segment *segs; /* the whole vector's */
    int n_segs;
    st_optim_state_format fmt;
    size_t lo;                 /* the new store's first element */
    size_t *qlo, *qhi;         /* each old store's elements */
    int *prev;                 /* read at its previous commit (it committed one step more) */
    uint64_t step;
    st_store *open[RESHARD_OPEN];
    int open_q[RESHARD_OPEN];
    long used[RESHARD_OPEN], clock;
    unsigned char *blob;       /* the old stores' loop state (the same in all of them) */
    size_t blob_bytes;
    int have_blob;
} reshard;

/* PATH/rankQ-of-W of every state path (W == 1: PATH). */
static void reshard_paths(const reshard *r, int q, char (*buf)[1200], const char **out) {
    for (int p = 0; p < r->n_paths; p++) {
        if (r->W == 1) snprintf(buf[p], sizeof buf[p], "%s", r->base[p]);
        else snprintf(buf[p], sizeof buf[p], "%s/rank%d-of-%d", r->base[p], q, r->W);
        out[p] = buf[p];
    }
}

#define RESHARD_MAX_WORLDS 8 /* disk states of other world sizes told apart in one path */

/* The numbers of ranks W != M whose disk states are in PATH (paths[0]): the plain store
 * (W = 1), or rank0-of-W directories holding a manifest; ascending, *n of them. */
static void reshard_worlds(const char *path, int M, int *found, int *n) {
    char m[1400];
    *n = 0;
    snprintf(m, sizeof m, "%s/strata-state.manifest", path);
    if (M != 1 && access(m, F_OK) == 0) found[(*n)++] = 1;
    DIR *dir = opendir(path);
    struct dirent *e;
    while (dir && (e = readdir(dir))) {
        int w, len = 0;
        if (sscanf(e->d_name, "rank0-of-%d%n", &w, &len) != 1 || e->d_name[len] || w < 2 || w == M) continue;
        snprintf(m, sizeof m, "%s/%s/strata-state.manifest", path, e->d_name);
        if (access(m, F_OK) == 0 && *n < RESHARD_MAX_WORLDS) found[(*n)++] = w;
    }
    if (dir) closedir(dir);
    for (int i = 1; i < *n; i++)
        for (int j = i; j > 0 && found[j - 1] > found[j]; j--) {
            int t = found[j];
            found[j] = found[j - 1];
            found[j - 1] = t;
        }
}

/* The one other number of ranks W whose disk state is in PATH, or an error naming what is there. */
static st_status reshard_find_world(const char *path, int M, int rank, int *W, st_err *err) {
    int found[RESHARD_MAX_WORLDS], n;
    reshard_worlds(path, M, found, &n);
    if (n == 1) {
        *W = found[0];
        return ST_OK;
    }
    char mine[64];
    if (M == 1) snprintf(mine, sizeof mine, "strata-state.manifest");
    else snprintf(mine, sizeof mine, "rank%d-of-%d/strata-state.manifest", rank, M);
    if (n == 0)
        return st_errf(err, ST_ERR_INVALID, "key 'state_paths': no state for rank %d of %d in %s (%s), nor a disk "
                       "state of another number of ranks there (strata-state.manifest or rank0-of-W/): give the state "
                       "paths the run was started with", rank, M, path, mine);
    char list[128] = "";
    for (int i = 0, at = 0; i < n && at < (int)sizeof list - 16; i++)
        at += snprintf(list + at, sizeof list - (size_t)at, "%s%d", i == 0 ? "" : i == n - 1 ? " and " : ", ",
                       found[i]);
    return st_errf(err, ST_ERR_INVALID, "key 'state_paths': %s holds the disk states of %s ranks: cannot tell which "
                   "one this run resumes; remove the ones that are not its latest (a re-sharded state's old stores "
                   "can go once the new run has committed a step)", path, list);
}

/* A store of this world size opened to resume at `step`: refused where PATH holds the whole
 * disk state of another number of ranks at a later step (the stores kept by a re-shard are
 * at its step or before; later ones are a run that went on at that size, whose steps a
 * resume here would silently drop). */
static st_status reshard_check_newer(const char *path, int M, uint64_t step, st_err *err) {
    int found[RESHARD_MAX_WORLDS], n;
    reshard_worlds(path, M, found, &n);
    for (int i = 0; i < n; i++) {
        uint64_t lo = UINT64_MAX;
        int whole = 1;
        for (int q = 0; q < found[i] && whole; q++) {
            char dir[1200];
            const char *pp[1] = {dir};
            if (found[i] == 1) snprintf(dir, sizeof dir, "%s", path);
            else snprintf(dir, sizeof dir, "%s/rank%d-of-%d", path, q, found[i]);
            st_store_config sc = {.paths = pp, .n_paths = 1};
            st_store_info in;
            st_err e2 = {0};
            if (st_store_peek(&sc, 0, &in, &e2)) whole = 0; /* not a whole state: nothing to resume there */
            else lo = in.step < lo ? in.step : lo;
        }
        if (!whole || lo <= step) continue;
        char which[64];
        if (found[i] == 1) snprintf(which, sizeof which, "strata-state.*");
        else snprintf(which, sizeof which, "rank*-of-%d", found[i]);
        return st_errf(err, ST_ERR_INVALID, "key 'state_paths': %s holds the disk state of %d ranks at step %llu, "
                       "after this one's (%d ranks, step %llu): resume at %d ranks, or remove those stores (%s/%s in "
                       "every state path) to go on from step %llu", path, found[i], (unsigned long long)lo, M,
                       (unsigned long long)step, found[i], path, which, (unsigned long long)step);
    }
    return ST_OK;
}

/* The old stores: their steps (one apart at most after a crash; the ahead ones are read at
 * their previous commit) and the elements each holds (a shard, or all of them at ZeRO 0). */
static st_status reshard_plan(reshard *r, size_t n_params, st_err *err) {
    char buf[ST_STORE_MAX_PATHS][1200];
    const char *paths[ST_STORE_MAX_PATHS];
    st_store_config sc = {.paths = paths, .n_paths = r->n_paths, .segs = r->segs, .n_segs = r->n_segs, .fmt = r->fmt};
    size_t *bounds = malloc(sizeof(size_t) * (size_t)(r->W + 1));
    uint64_t *steps = malloc(sizeof(uint64_t) * (size_t)r->W), lo = UINT64_MAX, hi = 0;
    r->qlo = calloc((size_t)r->W, sizeof *r->qlo);
    r->qhi = calloc((size_t)r->W, sizeof *r->qhi);
    r->prev = calloc((size_t)r->W, sizeof *r->prev);
    st_status s = ST_OK;
    if (!bounds || !steps || !r->qlo || !r->qhi || !r->prev) s = st_errf(err, ST_ERR_NOMEM, "out of memory");
    if (!s) st_zero_bounds(r->segs, r->n_segs, n_params, r->W, bounds);
    for (int q = 0; q < r->W && !s; q++) {
        st_store_info in;
        reshard_paths(r, q, buf, paths);
        if ((s = st_store_peek(&sc, 0, &in, err))) {
            st_err_prefix(err, "key 'state_paths': re-sharding the disk state of %d ranks, which reads every one's "
                          "store (all state paths visible to every rank)", r->W);
            break;
        }
        if (in.fmt != r->fmt || in.n_paths != r->n_paths)
            s = st_errf(err, ST_ERR_SHAPE, "key 'state_paths': %s/strata-state.manifest holds %s states on %d paths; "
                        "this run has %s states on %d: resume with the same optim_state and state paths", paths[0],
                        in.fmt ? "8bit" : "f32", in.n_paths, r->fmt ? "8bit" : "f32", r->n_paths);
        else if (in.numel == n_params) { /* ZeRO 0 (every rank a copy) or one rank */
            r->qlo[q] = 0;
            r->qhi[q] = n_params;
        } else if (in.numel == bounds[q + 1] - bounds[q]) {
            r->qlo[q] = bounds[q];
            r->qhi[q] = bounds[q + 1];
        } else
            s = st_errf(err, ST_ERR_SHAPE, "key 'state_paths': %s/strata-state.manifest holds %llu parameters; rank "
                        "%d of %d holds %zu of this model's %zu (or all of them): resume with the same model", paths[0],
                        (unsigned long long)in.numel, q, r->W, bounds[q + 1] - bounds[q], n_params);
        if (!s) {
            steps[q] = in.step;
            lo = in.step < lo ? in.step : lo;
            hi = in.step > hi ? in.step : hi;
        }
    }
    if (!s && hi > lo + 1)
        s = st_errf(err, ST_ERR_FORMAT, "key 'state_paths': the %d ranks' stores are at steps %llu to %llu; they can be "
                    "one step apart after a crash, never more: these stores are not one run's", r->W,
                    (unsigned long long)lo, (unsigned long long)hi);
    for (int q = 0; q < r->W && !s; q++) {
        if (steps[q] == lo) continue;
        st_store_info in;
        reshard_paths(r, q, buf, paths);
        r->prev[q] = 1;
        if ((s = st_store_peek(&sc, 1, &in, err))) st_err_prefix(err, "key 'state_paths': rank %d of %d committed "
                                                                 "step %llu, another only %llu", q, r->W,
                                                                 (unsigned long long)steps[q], (unsigned long long)lo);
        else if (in.step != lo)
            s = st_errf(err, ST_ERR_FORMAT, "key 'state_paths': %s/strata-state.manifest.prev is at step %llu, the "
                        "other ranks' stores at %llu", paths[0], (unsigned long long)in.step, (unsigned long long)lo);
    }
    r->step = lo;
    free(bounds);
    free(steps);
    return s;
}

/* Old store q, open to read (kept among the last RESHARD_OPEN used); its blob must be the
 * first one's. */
static st_status reshard_open(reshard *r, int q, st_store **out, st_err *err) {
    int k = 0;
    for (int i = 0; i < RESHARD_OPEN; i++) {
        if (r->open[i] && r->open_q[i] == q) {
            r->used[i] = ++r->clock;
            *out = r->open[i];
            return ST_OK;
        }
        if (!r->open[i] || (r->open[k] && r->used[i] < r->used[k])) k = i;
    }
    st_store_close(r->open[k]);
    r->open[k] = NULL;
    char buf[ST_STORE_MAX_PATHS][1200];
    const char *paths[ST_STORE_MAX_PATHS];
    reshard_paths(r, q, buf, paths);
    st_optim_segment *clip = malloc(sizeof *clip * (size_t)r->n_segs);
    if (!clip) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    st_store_config sc = {.paths = paths, .n_paths = r->n_paths, .segs = clip, .fmt = r->fmt,
                          .n_segs = st_zero_clip_segments(r->segs, r->n_segs, r->qlo[q], r->qhi[q], clip)};
    st_status s = st_store_open_readonly(&r->open[k], &sc, r->prev[q], err);
    free(clip);
    if (s) return st_err_prefix(err, "key 'state_paths': re-sharding (reading rank %d of %d's store)", q, r->W);
    size_t bb;
    const void *blob = st_store_blob(r->open[k], &bb);
    if (!r->have_blob) {
        if (bb && !(r->blob = malloc(bb))) return st_errf(err, ST_ERR_NOMEM, "out of memory");
        if (bb) memcpy(r->blob, blob, bb);
        r->blob_bytes = bb;
        r->have_blob = 1;
    } else if (bb != r->blob_bytes || (bb && memcmp(blob, r->blob, bb)))
        return st_errf(err, ST_ERR_FORMAT, "key 'state_paths': %s holds another loop state (data position, step) "
                       "than the other ranks' stores at the same step: these stores are not one run's",
                       st_store_manifest_path(r->open[k]));
    r->open_q[k] = q;
    r->used[k] = ++r->clock;
    *out = r->open[k];
    return ST_OK;
}

/* st_store_fill_fn: the new store's elements [first, first + n) from the old stores. */
static st_status reshard_fill(void *ctx, size_t first, size_t n, float *master, void *const moments[], int n_moments,
                              st_err *err) {
    reshard *r = ctx;
    size_t a = r->lo + first, b = a + n, pos = a; /* the whole vector's elements */
    while (pos < b) {
        int q = 0;
        while (q < r->W && !(r->qlo[q] <= pos && pos < r->qhi[q])) q++;
        if (q == r->W)
            return st_errf(err, ST_ERR_FORMAT, "key 'state_paths': no store of the %d ranks holds element %zu", r->W,
                           pos);
        size_t e = b < r->qhi[q] ? b : r->qhi[q];
        void *dst[ST_STORE_MAX_MOMENTS];
        for (int i = 0; i < n_moments; i++)
            dst[i] = (char *)moments[i] + st_store_moment_offset(r->segs, r->n_segs, r->fmt, a, pos, i);
        st_store *old;
        st_status s = reshard_open(r, q, &old, err);
        if (!s) s = st_store_read_range(old, pos - r->qlo[q], e - pos, master + (pos - a), dst, err);
        if (s) return s;
        pos = e;
    }
    return ST_OK;
}

/* This rank's store at this world size, made from the disk state of another (sc: its
 * configuration, the directories made here), committed and open. */
static st_status reshard_store(const st_train_config *c, const train_dist *d, st_model *m, const char *const *base,
                               const st_store_config *sc, st_store **out, st_err *err) {
    reshard r = {.base = base, .n_paths = sc->n_paths, .fmt = sc->fmt, .lo = d->lo, .n_segs = m->n_tensors};
    st_optim_segment *segs = calloc((size_t)m->n_tensors, sizeof *segs);
    if (!segs) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    st_train_decay_segments(m->tensors, m->n_tensors, (float)c->weight_decay, segs);
    r.segs = segs;
    st_status s = reshard_find_world(base[0], d->world, d->rank, &r.W, err);
    if (!s) s = reshard_plan(&r, m->n_params, err);
    st_store *first = NULL; /* the loop state, before the new store is made: from the first old store read */
    for (int q = 0; q < r.W && !s && !first; q++)
        if (r.qlo[q] <= d->lo && d->lo < r.qhi[q]) s = reshard_open(&r, q, &first, err);
    for (int p = 0; p < sc->n_paths && !s && d->world > 1; p++)
        if ((s = st_mkdirs(sc->paths[p], err))) st_err_prefix(err, "key 'state_paths'");
    if (!s && (s = st_store_create_filled(out, sc, reshard_fill, &r, r.step, r.blob, r.blob_bytes, err)))
        st_err_prefix(err, "key 'state_paths': re-sharding the disk state of %d ranks to %d", r.W, d->world);
    if (!s && d->rank == 0) {
        char which[64];
        if (r.W == 1) snprintf(which, sizeof which, "strata-state.*");
        else snprintf(which, sizeof which, "rank*-of-%d", r.W);
        st_log(1, "re-sharded the disk state of %d ranks to %d ranks (step %llu); the old stores (%s/%s in every "
               "state path) are unchanged and can be removed once this run has committed a step\n", r.W, d->world,
               (unsigned long long)r.step, base[0], which);
    }
    for (int i = 0; i < RESHARD_OPEN; i++) st_store_close(r.open[i]);
    free(r.qlo);
    free(r.qhi);
    free(r.prev);
    free(r.blob);
    free(segs);
    return s;
}

/* The store of this rank: under mpirun each rank keeps its shard (its segments, counted from
 * the shard's start) in its own directory PATH/rankR-of-W of every state path. A resume at
 * another number of ranks than the state's re-shards it (above). */
static st_status open_store(const st_train_config *c, const train_dist *d, st_model *m, const st_optim_segment *segs,
                            int n_segs, st_optim_state_format fmt, train_data *td, st_train_state_header *hs, st_store **out,
                            st_err *err) {
    char buf[sizeof c->state_paths], rbuf[ST_STORE_MAX_PATHS][1200];
    const char *paths[ST_STORE_MAX_PATHS];
    double weights[ST_STORE_MAX_PATHS];
    int n, weighted;
    st_status s = st_train_state_paths(c, buf, sizeof buf, paths, &n, weights, &weighted, err);
    if (s) return s;
    const char *base[ST_STORE_MAX_PATHS]; /* the paths as given: a re-shard reads other ranks' stores there */
    memcpy(base, paths, sizeof(const char *) * (size_t)n);
    if (d->world > 1)
        for (int p = 0; p < n; p++) {
            snprintf(rbuf[p], sizeof rbuf[p], "%s/rank%d-of-%d", paths[p], d->rank, d->world);
            if (!c->resume[0] && (s = st_mkdirs(rbuf[p], err))) return st_err_prefix(err, "key 'state_paths'");
            paths[p] = rbuf[p];
        }
    float *mine = m->params + d->lo; /* this rank's first element */
    st_store_config sc = {.paths = paths, .n_paths = n, .path_weight = weighted ? weights : NULL,
                          .segs = segs, .n_segs = n_segs, .fmt = fmt,
                          .host_budget = c->state_budget > 0 ? (uint64_t)c->state_budget : ST_TRAIN_STATE_BUDGET_DEFAULT};
    if (!c->resume[0]) {
        s = st_store_exists(&sc) ? st_errf(err, ST_ERR_INVALID, "key 'state_paths': %s/strata-state.manifest already "
                                           "holds a run's state; continue it with --resume %s, or remove the store to "
                                           "start over", paths[0], c->run_dir) : ST_OK;
        if ((s = agree(d, s, "checking the state paths", err))) return s;
        s = st_store_create(out, &sc, st_store_init_copy, mine, err);
        if (s) st_err_prefix(err, "key 'state_paths'");
        if ((s = agree(d, s, "creating the state stores", err))) return s;
        st_failpoint("train_store_created");
        /* step 0 with the loop's state, so a run killed before its first step resumes */
        data_save_state(td, hs);
        return agree(d, st_store_commit_blob(*out, hs, sizeof *hs, err), "committing step 0", err);
    }
    /* no store for this rank at this world size: the state written at another one, re-sharded
     * (a rank whose new store a failed attempt already committed opens it) */
    if (!st_store_exists(&sc)) s = reshard_store(c, d, m, base, &sc, out, err);
    else if ((s = st_store_open(out, &sc, err))) st_err_prefix(err, "key 'state_paths' (resume)");
    else { /* the stores of another world size a re-shard kept must not be a later state */
        st_store_stats ss;
        st_store_get_stats(*out, &ss);
        s = reshard_check_newer(base[0], d->world, ss.step, err);
    }
    if ((s = agree(d, s, "opening the state stores", err))) return s;
    if (d->world > 1) {
        /* each rank's store committed on its own: a crash between two commits leaves them one
         * step apart; the ahead ones return to their previous commit, whose regions are
         * intact (no rank can write step k + 2 before every rank has committed k + 1) */
        st_store_stats ss;
        st_store_get_stats(*out, &ss);
        uint64_t *steps = malloc(sizeof(uint64_t) * (size_t)d->world), lo = UINT64_MAX, hi = 0;
        if (!steps) return st_errf(err, ST_ERR_NOMEM, "out of memory");
        s = st_comm_allgather(d->comm, &ss.step, sizeof ss.step, steps, "the stores' steps", err);
        for (int r = 0; r < d->world && !s; r++) {
            lo = steps[r] < lo ? steps[r] : lo;
            hi = steps[r] > hi ? steps[r] : hi;
        }
        free(steps);
        if (!s && hi > lo + 1)
            s = st_errf(err, ST_ERR_FORMAT, "key 'state_paths': the ranks' stores are at steps %llu to %llu; they can be "
                        "one step apart after a crash, never more: these stores are not one run's",
                        (unsigned long long)lo, (unsigned long long)hi);
        if (!s && ss.step > lo) {
            st_log(1, "rank %d: the state store committed step %llu, another rank only %llu: returning to it\n",
                   d->rank, (unsigned long long)ss.step, (unsigned long long)lo);
            st_store_close(*out);
            *out = NULL;
            if (!(s = st_store_rollback(&sc, err))) s = st_store_open(out, &sc, err);
        }
        if ((s = agree(d, s, "agreeing on the stores' step", err))) return s;
    }
    size_t bb;
    const void *blob = st_store_blob(*out, &bb);
    st_store_stats ss;
    st_store_get_stats(*out, &ss);
    if (!blob && ss.step == 0) {
        /* killed between creating the store and committing step 0's loop state: the store
         * holds the initial weights, and the data starts from the beginning */
        s = st_store_read_master(*out, mine, err);
        if (!s) {
            data_save_state(td, hs);
            st_log(1, "the state store %s was created but never stepped; starting at step 0\n",
                   st_store_manifest_path(*out));
            s = st_store_commit_blob(*out, hs, sizeof *hs, err);
        }
    } else if (!blob || bb != sizeof *hs) {
        s = st_errf(err, ST_ERR_FORMAT, "%s: the store's loop state has %zu bytes, this strata's %zu: resume with "
                    "the strata that wrote it", st_store_manifest_path(*out), bb, sizeof *hs);
    } else {
        memcpy(hs, blob, sizeof *hs);
        if (hs->n_params != m->n_params)
            s = st_errf(err, ST_ERR_SHAPE, "%s: the store was written for %llu parameters, the model has %zu",
                        st_store_manifest_path(*out), (unsigned long long)hs->n_params, m->n_params);
        if (!s) s = st_store_read_master(*out, mine, err);
        if (!s) s = data_restore_state(td, hs, st_store_manifest_path(*out), err);
        if (!s && d->rank == 0)
            st_log(1, "resumed from the state store %s at step %llu\n", st_store_manifest_path(*out),
                   (unsigned long long)hs->step);
    }
    if ((s = agree(d, s, "reading the state stores", err))) return s;
    if (d->world > 1 && d->zero > 0) /* every rank's master shard to every rank */
        s = st_comm_allgather_f32(d->comm, m->params, 0, m->n_params, d->bounds, "weights gather", err);
    return s;
}

/* ------------------------------------------------------------------ the loop */

/* A number for a JSON document: JSON has no NaN or infinity, so those are null. */
static const char *json_num(char buf[32], double v, const char *fmt) {
    if (!isfinite(v)) return "null";
    snprintf(buf, 32, fmt, v);
    return buf;
}

/* plan_state auto: the placements that fit, each predicted with the machine's profile (the
 * one the planner then uses: machine_profile, measured once per process) where two or more
 * can be timed, as strata plan chooses (st_plan_state_choose). Under mpirun the ranks'
 * measured profiles may differ, so they take the first that fits, alike. */
static st_status place_state(st_train_config *c, st_err *err) {
    st_plan_state_choice ch;
    st_status s = st_plan_state_fit(c, &ch, err);
    if (s) return s;
    st_plan_profile hw;
    int have_hw = 0;
    st_arch *arch = NULL;
    if (ch.needs_profile && st_comm_size(c->comm) <= 1) {
        st_model_overrides ov = st_train_config_overrides(c);
        st_model_shape shape;
        st_backend *tmp = NULL;
        if ((s = st_model_resolve(c->model, c->init_from, &ov, c->batch, c->seq, &shape, &arch, err))) return s;
        if (!(s = st_backend_cpu_create(&tmp, c->threads, err))) s = machine_profile(tmp, arch, c->batch, c->seq, &hw, err);
        if (tmp) st_backend_free(tmp);
        if (s) {
            st_arch_free(arch);
            return st_err_prefix(err, "key 'plan_state': measuring the machine to predict each placement");
        }
        have_hw = 1;
    }
    char why[1024], line[512];
    s = st_plan_state_choose(c, arch, have_hw ? &hw : NULL, &ch, why, sizeof why, err);
    st_arch_free(arch);
    if (s) return s;
    st_log(1, "%s\n", why);
    for (int i = 0; i < ch.n; i++) {
        st_plan_state_describe(&ch, i, line, sizeof line);
        st_log(1, "  %s\n", line);
    }
    return ST_OK;
}

/* The run's configuration as RUN_DIR/config.json (what a resume reads). */
static st_status save_run_config(const st_train_config *c, st_err *err) {
    char path[2200];
    if (snprintf(path, sizeof path, "%s/config.json", c->run_dir) >= (int)sizeof path)
        return st_errf(err, ST_ERR_INVALID, "key 'run_dir': %s is too long", c->run_dir);
    return st_train_config_save_json(c, path, err);
}

st_status st_train_run(const st_train_config *c, st_train_result *res, st_err *err) {
    st_status s = st_train_config_check(c, err);
    if (s) return s;
    /* a device this build lacks (cuda without the CUDA backend) is refused before anything
     * is planned or written: no run directory, no config.json */
    if ((s = st_backend_device_built(c->device, err))) return st_err_prefix(err, "key 'device'");
    /* plan_state auto: the state's format and tier chosen now, and run (and recorded in
     * config.json) as if given */
    st_train_config placed, budgeted;
    double chosen_budget = 0; /* the store's host budget, where the planner chose it */
    if (!strcmp(c->plan_state, "auto")) {
        placed = *c;
        if ((s = place_state(&placed, err))) return s;
        c = &placed;
    }
    /* matmul auto: the precision this machine takes (bf16 where it has bf16 matrix units),
     * logged, and run and recorded in config.json as if given */
    st_train_config matmul_chosen;
    if (!strcmp(c->matmul, "auto")) {
        char why[200];
        matmul_chosen = *c;
        snprintf(matmul_chosen.matmul, sizeof matmul_chosen.matmul, "%s",
                 st_backend_matmul_name(st_backend_matmul_auto(c->device, why, sizeof why)));
        st_log(1, "matmul auto: %s (%s)\n", matmul_chosen.matmul, why);
        c = &matmul_chosen;
    }
    st_model_overrides ov = st_train_config_overrides(c);
    /* the memory plan, checked before anything is allocated or written */
    st_prof_mem_estimate mem;
    if ((s = st_model_mem_estimate(c->model, c->init_from, &ov, c->batch, c->seq, !strcmp(c->optim_state, "8bit"),
                                   &mem, err)))
        return s;
    st_train_mem_state_on_disk(c, &mem);
    double budgets[ST_PROF_TIER_COUNT] = {0, c->host_budget, 0};
    if ((s = st_prof_mem_check(&mem, budgets, err))) return s;
    if (!c->run_dir[0]) return st_errf(err, ST_ERR_INVALID, "key 'run_dir' is empty; name a directory for the run");
    /* the ranks under mpirun (one process: a world of one) */
    train_dist dist = {.comm = c->comm, .rank = st_comm_rank(c->comm), .world = st_comm_size(c->comm),
                       .zero = c->zero};
    int lead = dist.rank == 0; /* under mpirun rank 0 writes what is the run's, not a rank's */
    if (dist.world > 1) {
        st_comm_set_timeout(dist.comm, c->dist_timeout);
        if ((s = dist_check_config(c, &dist, err))) return s;
    }
    char path[2200];
    /* one process per run directory: a second would interleave metrics and mix one
     * process's weights with the other's optimizer state in a checkpoint (under mpirun
     * rank 0 holds it for the job, and writes what is the run's, not a rank's) */
    st_lock run_lock = {0};
    if (dist.rank == 0) {
        s = st_mkdirs(c->run_dir, err);
        snprintf(path, sizeof path, "%s/strata.lock", c->run_dir);
        if (!s) s = st_lock_acquire(&run_lock, path, "run directory", err);
        if (!s && (s = save_run_config(c, err))) st_lock_release(&run_lock);
    }
    if ((s = agree(&dist, s, "opening the run directory", err))) return s;

    st_backend *be = NULL;
    st_model *m = NULL;
    st_optim *opt = NULL;
    st_optim_segment *segs = NULL;
    int32_t *inputs = NULL, *targets = NULL;
    int32_t *positions = NULL, *doc_start = NULL; /* doc_mask: each micro-batch's documents */
    st_step stp = {0}; /* the step: in memory or streamed */
    FILE *metrics = NULL;
    st_prof_tb *tb = NULL; /* TensorBoard events: the scalars of metrics.jsonl */
    train_data td = {0};
    train_eval ev = {0};
    st_train_state_header *hs = NULL;
    st_prof_run *pr = NULL;
    st_store *store = NULL;
    int B = c->batch, T = c->seq;
    /* layer streaming (device_budget > 0): the model's vectors on the CPU backend are the
     * executor's host tier (no activations are allocated for them); the executor owns the
     * optimizer; checkpoints save and load the model as in memory */
    st_backend *dev = NULL;
    st_stream_exec *sx = NULL;
    st_arch *arch = NULL;
    st_optim_segment *opt_segs = NULL; /* the optimizer's (and the store's) segments: this rank's shard under ZeRO */
    int n_opt_segs = 0;

    int threads = c->threads;
    if (!threads && dist.world > 1) threads = st_comm_threads(dist.comm); /* the cores shared by the ranks here */
    if ((s = st_backend_cpu_create(&be, threads, err))) goto done;
    if ((s = st_backend_set_matmul(be, c->matmul, err))) goto done; /* key 'matmul' on the host's cores (named) */
    {
        /* a preset with overrides, or init_from's shape and weights (GPT-2 or the Llama family) */
        if ((s = st_model_create_from(&m, c->model, c->init_from, &ov, 1, be, err))) goto done;
        if (c->device_budget <= 0 && (s = m->ops->alloc_acts(m, B, T, err))) goto done;
        if (!c->init_from[0]) m->ops->init_random(m, c->seed);
        else if ((s = st_model_check_finite(m, c->init_from, err))) goto done;
    }
    if (c->device_budget > 0) {
        if ((s = st_arch_of_model(&arch, m, err)) || (s = open_streamed(c, m, arch, be, dist.world, &dev, &sx, &chosen_budget, err))) goto done;
        if (chosen_budget > 0 && !(c->state_budget > 0)) { /* run it, and resume with it (config.json) */
            budgeted = *c;
            budgeted.state_budget = chosen_budget;
            c = &budgeted;
            if (lead && (s = save_run_config(c, err))) goto done;
        }
        opt = st_stream_optim(sx);
        st_stream_set_params(sx, m->params); /* the device copies of the embedding and head */
    }

    /* weight decay by role, which comes from each tensor's name */
    segs = calloc((size_t)m->n_tensors, sizeof *segs);
    if (!segs) { s = st_errf(err, ST_ERR_NOMEM, "out of memory"); goto done; }
    st_train_decay_segments(m->tensors, m->n_tensors, (float)c->weight_decay, segs);
    st_optim_state_format fmt = strcmp(c->optim_state, "8bit") ? ST_OPTIM_STATE_F32 : ST_OPTIM_STATE_8BIT;
    dist.hi = m->n_params;
    n_opt_segs = m->n_tensors;
    opt_segs = segs;
    if (dist.world > 1) { /* ZeRO 1 and 2: the optimizer holds this rank's shard */
        if (!(dist.bounds = malloc(sizeof(size_t) * (size_t)(dist.world + 1)))) {
            s = st_errf(err, ST_ERR_NOMEM, "out of memory");
            goto done;
        }
        st_zero_bounds(segs, m->n_tensors, m->n_params, dist.world, dist.bounds);
        if (dist.zero > 0) {
            for (int r = 0; r < dist.world; r++)
                if (dist.bounds[r + 1] == dist.bounds[r]) {
                    s = st_errf(err, ST_ERR_INVALID, "key 'zero': %zu parameters are too few to shard over %d ranks "
                                "(each shard is whole %d-element chunks; rank %d would hold none); use --zero 0",
                                m->n_params, dist.world, ST_OPTIM_SUMSQ_CHUNK, r);
                    goto done;
                }
            dist.lo = dist.bounds[dist.rank];
            dist.hi = dist.bounds[dist.rank + 1];
            if (!(opt_segs = calloc((size_t)m->n_tensors, sizeof *opt_segs))) {
                s = st_errf(err, ST_ERR_NOMEM, "out of memory");
                goto done;
            }
            n_opt_segs = st_zero_clip_segments(segs, m->n_tensors, dist.lo, dist.hi, opt_segs);
        }
    }
    if ((!sx || dist.world > 1) && !c->state_paths[0] && (s = st_optim_create(&opt, opt_segs, n_opt_segs, fmt, err)))
        goto done;
    if ((s = data_open(&td, c, "data", c->data, m->vocab_size, err))) goto done;
    ev.spec = val_spec(c);
    if (ev.spec && strcmp(ev.spec, "embedded")) { /* token files: a bad one is said now, not at step 50 */
        if ((s = data_open(&ev.vd, c, "val_data", ev.spec, m->vocab_size, err))) goto done;
        st_data_loader_get_state(ev.vd.dl, &ev.start);
    }

    hs = calloc(1, sizeof *hs); /* 4 KiB of data state: not on the stack */
    if (!hs) { s = st_errf(err, ST_ERR_NOMEM, "out of memory"); goto done; }
    hs->n_params = m->n_params;
    if (c->state_paths[0]) {
        if ((s = open_store(c, &dist, m, opt_segs, n_opt_segs, fmt, &td, hs, &store, err))) goto done;
        if (sx && dist.world == 1) { /* the executor updates through the store; its device copies follow the host */
            if ((s = st_stream_attach_store(sx, store, hs, sizeof *hs, err))) goto done;
            st_stream_set_params(sx, st_stream_params(sx));
        }
    } else if (c->resume[0]) {
        char ck[2048];
        if ((s = resolve_resume(c->resume, ck, sizeof ck, err))) goto done;
        snprintf(path, sizeof path, "%s/model.safetensors", ck);
        if ((s = m->ops->load(m, path, err)) || (s = st_model_check_finite(m, path, err))) goto done;
        /* written at any number of ranks: this rank's shard (or the whole state) of it */
        if ((s = st_train_state_load_shard(ck, hs, opt, segs, m->n_tensors, dist.lo, dist.hi, err))) goto done;
        if ((s = data_restore_state(&td, hs, path, err))) goto done;
        if (sx) st_stream_set_params(sx, st_stream_params(sx)); /* the device copies follow the host */
        st_log(1, "resumed from %s at step %llu\n", ck, (unsigned long long)hs->step);
    }
    if (dist.rank == 0 && c->resume[0] && (s = metrics_truncate(c->run_dir, hs->step, err))) goto done;
    {
        long last = c->stop_at > 0 && c->stop_at < c->steps ? c->stop_at : c->steps;
        if (hs->step > 0 && (long)hs->step >= last) /* said, never a silent zero-step run */
            st_log(1, "nothing to train: the run is at step %llu and %s is %ld; give --steps N with N > %llu to "
                   "train further\n", (unsigned long long)hs->step, last == c->steps ? "steps" : "stop_at", last,
                   (unsigned long long)hs->step);
    }

    if (sx && dist.world == 1) st_step_init_streamed(&stp, sx, (int)c->grad_accum);
    else if ((s = st_step_init_memory(&stp, m, opt, store, (int)c->grad_accum, err))) goto done;
    stp.sx = sx; /* under ranks the executor computes each micro-batch's gradient, the step does the rest */
    if (dist.world > 1 && (s = st_step_set_dist(&stp, dist.comm, dist.zero, dist.bounds, err))) goto done;
    /* the updated weights are gathered while the next step's forward runs; whatever else
     * reads them (validation, a sample, a checkpoint, the saved model) waits for them first */
    stp.overlap_gather = 1;
    if (c->doc_mask != 0) { /* document-aware packing (unset: on), in memory and streamed */
        positions = malloc(sizeof(int32_t) * (size_t)B * T * (size_t)c->grad_accum);
        doc_start = malloc(sizeof(int32_t) * (size_t)B * T * (size_t)c->grad_accum);
        if (!positions || !doc_start) { s = st_errf(err, ST_ERR_NOMEM, "out of memory"); goto done; }
        st_step_set_docs(&stp, positions, doc_start);
    } else if (lead) {
        st_log(1, "doc_mask 0: rows are attended whole (positions 0..seq-1), packed documents see each other\n");
    }
    /* under mpirun rank 0 writes what is the run's (metrics, events, lines); each rank its trace */
    int quiet = c->quiet || !lead;
    /* a step takes its micro-batches at once */
    inputs = malloc(sizeof(int32_t) * (size_t)B * T * (size_t)c->grad_accum);
    targets = malloc(sizeof(int32_t) * (size_t)B * T * (size_t)c->grad_accum);
    snprintf(path, sizeof path, "%s/metrics.jsonl", c->run_dir);
    if (lead) metrics = fopen(path, "a");
    if (!inputs || !targets || (lead && !metrics)) {
        s = !metrics ? st_errf(err, ST_ERR_IO, "%s: cannot open: %s", path, strerror(errno))
                     : st_errf(err, ST_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (lead && (s = st_prof_tb_open(&tb, c->run_dir, err))) goto done;
    if (!quiet) {
        char desc[256];
        m->ops->describe(m, desc, sizeof desc);
        printf("model %s: %zu parameters (%s), batch %d x seq %d x accum %d, %ld steps, run dir %s\n",
               c->init_from[0] ? c->init_from : c->model, m->n_params, desc, B, T, c->grad_accum, c->steps,
               c->run_dir);
        if (dist.world > 1)
            printf("%d ranks over %s, ZeRO stage %d, %d threads a rank: a global batch of %d x %d x %d sequences\n",
                   dist.world, st_comm_engine(dist.comm), dist.zero, threads, dist.world, B, c->grad_accum);
    }
    /* tokens of one step over all ranks */
    double step_tokens = (double)B * T * c->grad_accum * dist.world;

    double flops_per_step = m->ops->flops_per_token(m, T) * step_tokens;
    long end = c->stop_at > 0 && c->stop_at < c->steps ? c->stop_at : c->steps;
    char label[128];
    snprintf(label, sizeof label, "strata train %s", c->model);
    char rank_dir[2200];
    snprintf(rank_dir, sizeof rank_dir, "%s/rank_%d", c->run_dir, dist.rank);
    if (!lead && c->trace && (s = st_mkdirs(rank_dir, err))) goto done; /* rank r's trace: RUN_DIR/rank_r/ */
    if (!lead) snprintf(label, sizeof label, "strata train %s rank %d", c->model, dist.rank);
    st_prof_run_config pc = {.run_dir = lead ? c->run_dir : rank_dir, .trace = c->trace, .label = label,
                          .flops_per_step = flops_per_step, .tokens_per_step = step_tokens, .last_step = end,
                          .host_plan_bytes = mem.tier_need[ST_PROF_TIER_HOST],
                          .progress = !quiet && dist.world == 1}; /* mpirun's forwarding garbles a live line */
    if ((s = st_prof_run_open(&pr, &pc, err))) goto done;
    double tok_s_sum = 0;
    long timed = 0, skipped_run = 0; /* consecutive skipped steps */
    float last_loss = NAN;
    long steps_run = 0;
    int saved_at_end = 0, last_skipped = 0;
    double last_norm = 0;
    while ((long)hs->step < end) {
        double t0 = st_now();
        long step = (long)hs->step + 1;
        st_prof_step_begin(pr, step);
        /* the step's micro-batches, in order, then one step (strata/step.h) */
        for (long k = 0; k < c->grad_accum && !s; k++) {
            st_prof_span pd = st_prof_begin(ST_PROF_CAT_DATA, "data wait", -1);
            s = data_next(&td, B, T, inputs + k * (size_t)B * T, targets + k * (size_t)B * T,
                          positions ? positions + k * (size_t)B * T : NULL, doc_start ? doc_start + k * (size_t)B * T : NULL,
                          err);
            st_prof_end(&pd);
        }
        if (s) goto done;
        st_step_hp shp = {.adam = {(float)st_train_lr_at(c, step), (float)c->beta1, (float)c->beta2, (float)c->eps,
                                   (long)hs->adam_step + 1, 1.0f},
                          .grad_clip = (float)c->grad_clip};
        if (store) { /* the loop's state after this step: committed with the update */
            hs->step = (uint64_t)step;
            data_save_state(&td, hs);
            hs->adam_step++;
            shp.blob = hs;
            shp.blob_bytes = sizeof *hs;
        }
        st_step_result sr;
        if ((s = st_step_run(&stp, (int)c->grad_accum, B, T, inputs, targets, &shp, &sr, err))) goto done;
        /* a GPU's ops report nothing when they fail: a failed kernel or copy stops the run
         * here, before this step is logged or checkpointed, not trained on as garbage */
        if (dev && (s = st_backend_status(dev, err))) {
            st_err_prefix(err, "step %ld on device %s", step, c->device);
            goto done;
        }
        double loss = sr.loss;
        last_norm = sr.grad_norm;
        last_skipped = sr.skipped;
        if (!store && !sr.skipped) hs->adam_step++;
        if (sr.skipped) {
            st_log(1, "step %ld: non-finite gradient norm; update skipped, no state changed\n", step);
            if (store) { /* no update: only the loop's state moves on */
                hs->adam_step--;
                if ((s = st_store_commit_blob(store, hs, sizeof *hs, err))) goto done;
            }
        } else if (store) {
            st_failpoint("train_step_committed"); /* committed, not yet logged */
        }
        double norm = last_norm, lr = st_train_lr_at(c, step);
        int skipped = last_skipped;
        hs->step = (uint64_t)step;
        data_save_state(&td, hs);
        double dt = st_now() - t0;
        st_prof_step_end(pr);
        double tok_s = step_tokens / dt, gflops = flops_per_step / dt / 1e9;
        last_loss = (float)loss;
        if (step > 1) { tok_s_sum += tok_s; timed++; }
        steps_run++;
        st_prof_progress_clear(pr);
        double val = NAN, eval_s = 0; /* validation: after the step, outside its time */
        char vtxt[64] = "", vjson[128] = "";
        if (lead && ev.spec && (step % c->eval_every == 0 || step == end)) {
            if ((s = st_step_sync(&stp, err))) goto done;
            double te = st_now();
            st_prof_span pv = st_prof_begin(ST_PROF_CAT_OTHER, "validation", -1);
            s = eval_loss(c, m, sx, &ev, inputs, targets, positions, doc_start, &val, err);
            st_prof_end(&pv);
            if (s) goto done;
            eval_s = st_now() - te;
            snprintf(vtxt, sizeof vtxt, " | val %.4f (ppl %.2f)", val, exp(val));
            char jv[32], jp[32]; /* a diverged model's loss is not a JSON number */
            snprintf(vjson, sizeof vjson, ",\"val_loss\":%s,\"val_ppl\":%s,\"eval_ms\":%.3f",
                     json_num(jv, val, "%.6f"), json_num(jp, exp(val), "%.4f"), eval_s * 1e3);
            if ((s = st_prof_tb_scalar(tb, "val/loss", step, val, err))) goto done;
        }
        if (!quiet && (step % c->log_every == 0 || step == end || vtxt[0]))
            printf("step %6ld/%ld | loss %.4f | lr %.2e | norm %.3f | %7.1f ms | %8.0f tok/s | %6.1f GFLOP/s%s%s\n", step,
                   c->steps, loss, lr, norm, dt * 1e3, tok_s, gflops, vtxt, skipped ? " | SKIPPED" : "");
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
        char jloss[32], jnorm[32], jdist[160] = "";
        if (dist.world > 1) /* this step's communication, rank 0's view */
            snprintf(jdist, sizeof jdist, ",\"ranks\":%d,\"comm_wait_ms\":%.3f,\"comm_sent_bytes\":%llu,"
                     "\"comm_received_bytes\":%llu", dist.world, sr.comm_wait_s * 1e3,
                     (unsigned long long)sr.sent_bytes, (unsigned long long)sr.received_bytes);
        snprintf(path, sizeof path, "%s/metrics.jsonl", c->run_dir);
        int mfault = 0, mn = 0;
        if (lead) {
        mfault = st_iofault("file.write", path);
        if (mfault) errno = mfault > 0 ? mfault : ENOSPC;
        mn = mfault ? -1 : fprintf(metrics,
                         "{\"step\":%ld,\"loss\":%s,\"lr\":%.6e,\"grad_norm\":%s,\"step_ms\":%.3f,\"tokens_per_s\":%.1f,"
                         "\"achieved_gflops\":%.3f,\"tokens\":%llu,\"skipped\":%s%s%s%s%s}\n",
                         step, json_num(jloss, loss, "%.6f"), lr, json_num(jnorm, norm, "%.6f"), dt * 1e3, tok_s, gflops,
                         (unsigned long long)step * (unsigned long long)step_tokens,
                         skipped ? "true" : "false", vjson, disk, jdist, st_prof_step_json(pr));
        }
        if (lead && (mn < 0 || fflush(metrics) != 0)) { /* a run whose metrics are lost is not a run users can read */
            int e = errno ? errno : EIO;
            s = st_errf(err, e == ENOSPC ? ST_ERR_NOSPACE : ST_ERR_IO,
                        "%s: cannot write step %ld's metrics: %s; %s", path, step, strerror(e),
                        store ? "the state store holds the last committed step: free space, then --resume"
                              : "the last checkpoint is intact: free space, then --resume");
            goto done;
        }
        {
            const st_prof_step_stats *ps = st_prof_step_last(pr);
            const char *tags[] = {"train/loss", "train/lr", "train/grad_norm", "perf/step_ms", "perf/tokens_per_s",
                                  "perf/achieved_gflops", "memory/host_rss_bytes", "memory/host_peak_bytes",
                                  "memory/host_plan_bytes"};
            double vals[] = {loss, lr, norm, dt * 1e3, tok_s, gflops, ps ? ps->host_rss_bytes : 0,
                             ps ? ps->host_peak_bytes : 0, mem.tier_need[ST_PROF_TIER_HOST]};
            if (lead && (s = st_prof_tb_scalars(tb, step, tags, vals, (int)(sizeof vals / sizeof vals[0]), err))) goto done;
        }
        if (c->sample_every > 0 && !quiet && (step % c->sample_every == 0 || step == end)) {
            /* what the model writes now, after the first tokens of this step's batch; the host
             * weights (also under streaming), untouched activations, its own RNG */
            char label[64];
            snprintf(label, sizeof label, "sample at step %ld: ", step);
            st_err serr = {0};
            if ((s = st_step_sync(&stp, err))) goto done;
            if (st_generate_print_sample(m, inputs, T < 16 ? T : 16, 96, c->seed + (uint64_t)step, label, stdout,
                                         &serr))
                st_log(1, "step %ld: no sample: %s\n", step, serr.msg);
        }
        st_prof_progress(pr, step, loss);
        skipped_run = skipped ? skipped_run + 1 : 0;
        if (skipped_run >= c->max_skipped_steps) {
            s = st_errf(err, ST_ERR_NONFINITE,
                        "steps %ld to %ld all had a non-finite gradient norm (key 'max_skipped_steps' is %ld): the "
                        "model or the data produces NaN or Inf; lower 'lr', check the data, or resume from the last "
                        "checkpoint in %s",
                        step - skipped_run + 1, step, c->max_skipped_steps, c->run_dir);
            goto done;
        }
        int stop = c->stop_flag && *c->stop_flag;
        if (dist.world > 1) { /* a signal reaches the ranks at different steps: they stop at the same one */
            double st1[1] = {stop};
            if ((s = st_comm_allreduce_f64(dist.comm, st1, 1, "stop flag", err))) goto done;
            stop = st1[0] > 0;
        }
        if (!store && ((c->ckpt_every > 0 && step % c->ckpt_every == 0) || step == end || stop)) {
            st_prof_span pw = st_prof_begin(ST_PROF_CAT_IO, "checkpoint write", -1);
            if ((s = st_step_sync(&stp, err)) || (s = save_checkpoint(c, &dist, m, opt, hs, err))) goto done;
            snprintf(path, sizeof path, "%s/checkpoints/step_%08ld", c->run_dir, step);
            st_prof_end_bytes(&pw, st_prof_dir_bytes(path));
            if (lead) prune_checkpoints(c);
            saved_at_end = step == end || stop;
        }
        if (stop) {
            if (lead) st_log(1, "stopped at step %ld; resume with: strata train --resume %s\n", step, c->run_dir);
            break;
        }
    }
    if (!s) s = st_step_sync(&stp, err); /* the last update's weights, on every rank */
    if (!s && !store && !saved_at_end && hs->step > 0 && c->resume[0] == 0 && (long)hs->step == end)
        s = save_checkpoint(c, &dist, m, opt, hs, err);
    if (store && !s && lead) { /* the store is the checkpoint; the weights go beside it for users */
        snprintf(path, sizeof path, "%s/model.safetensors", c->run_dir);
        s = m->ops->save(m, path, err);
    }
    if (!s && c->save_hf[0] && lead) { /* the whole model is on every rank after the gather */
        if ((s = m->ops->save_hf(m, c->save_hf, strcmp(c->save_hf_dtype, "bf16") ? ST_F32 : ST_BF16, err))) goto done;
        if (!quiet) printf("wrote a Hugging Face model directory: %s\n", c->save_hf);
    }
    if (res) {
        res->steps_done = (long)hs->step;
        res->steps_run = steps_run;
        res->final_loss = last_loss;
        res->tokens_per_s = timed ? tok_s_sum / timed : 0;
        res->n_params = m->n_params;
    }
done:
    if (pr) { /* a trace that cannot be finished fails the run only if nothing else did */
        st_err perr = {0};
        st_status ps = st_prof_run_close(pr, &perr);
        if (ps && !s) s = st_errf(err, ps, "%s", perr.msg);
    }
    st_store_close(store);
    free(hs);
    if (metrics) fclose(metrics);
    if (tb) { /* an event file that cannot be finished fails the run only if nothing else did */
        st_err terr = {0};
        st_status ts = st_prof_tb_close(tb, &terr);
        if (ts && !s) s = st_errf(err, ts, "%s", terr.msg);
    }
    free(inputs);
    free(targets);
    free(positions);
    free(doc_start);
    if (s) { /* nothing may still be landing in the weights when they are freed */
        st_err ignored = {0};
        st_step_sync(&stp, &ignored);
    }
    st_step_free(&stp);
    data_close(&td);
    data_close(&ev.vd);
    free(segs);
    if (sx && opt == st_stream_optim(sx)) opt = NULL; /* the executor's own (one process) */
    st_optim_free(opt); /* in memory, or a rank's shard under streaming */
    if (sx) st_stream_exec_free(sx); /* the host vectors are the model's */
    st_model_free(m);
    st_arch_free(arch);
    st_backend_free(dev); /* also when the executor could not be created on it */
    st_backend_free(be);
    free(dist.bounds);
    if (opt_segs != segs) free(opt_segs);
    if (lead) st_lock_release(&run_lock);
    return s;
}
