/* rundir.c - the run directory: checkpoints (step_N.partial -> rename -> step_N, the
 * newest complete ones kept), resume from a run or checkpoint directory, metrics.jsonl cut
 * back on resume, config.json, and the ranks' agreement on each part of that work. */
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
    st_run_path(ckdir, sizeof ckdir, run_dir, ST_RUN_CHECKPOINTS);
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
st_status run_resolve_resume(const char *path, char *ckpt_dir, size_t cap, st_err *err) {
    char buf[4096], shards[4096];
    snprintf(buf, sizeof buf, "%s/train_state.bin", path);
    snprintf(shards, sizeof shards, "%s/" ST_SHARDS_JSON, path);
    if (access(buf, R_OK) == 0 || access(shards, R_OK) == 0) {
        snprintf(ckpt_dir, cap, "%s", path);
        return ST_OK;
    }
    char ckdir[2100];
    st_run_path(ckdir, sizeof ckdir, path, ST_RUN_CHECKPOINTS);
    unsigned long long *steps;
    int n = list_checkpoints(path, &steps);
    unsigned long long newest = n ? steps[n - 1] : 0;
    free(steps);
    unsigned long long latest_step = 0;
    int latest_ok = 0;
    st_run_path(buf, sizeof buf, path, ST_RUN_LATEST);
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
    st_run_checkpoint_path(ckpt_dir, cap, path, use);
    return ST_OK;
}

/* The config.json of the run that RESUME belongs to: RESUME/config.json for a run
 * directory; for a checkpoint directory (train_state.bin or shards.json in it, and a
 * config.json of the model's, not the run's) RUN/checkpoints/step_N, RUN/config.json; 0
 * where there is none (a checkpoint elsewhere). */
static int resume_config_path(const char *resume, char *out, size_t cap) {
    char r[2048];
    snprintf(r, sizeof r, "%s", resume);
    size_t n = strlen(r);
    while (n > 1 && r[n - 1] == '/') r[--n] = 0;
    snprintf(out, cap, "%s/train_state.bin", r);
    int ckpt = access(out, F_OK) == 0;
    snprintf(out, cap, "%s/" ST_SHARDS_JSON, r);
    ckpt = ckpt || access(out, F_OK) == 0;
    if (!ckpt) {
        snprintf(out, cap, "%s/config.json", r);
        return access(out, R_OK) == 0;
    }
    char *slash = strrchr(r, '/');
    if (!slash) return 0; /* a bare step_N: not known to be a run's */
    *slash = 0;
    const char *parent = strrchr(r, '/') ? strrchr(r, '/') + 1 : r;
    snprintf(out, cap, "%s/../config.json", r);
    return !strcmp(parent, "checkpoints") && access(out, R_OK) == 0;
}

st_status run_resumed_config(const st_train_config *c, st_train_config **out, char *path, size_t cap, st_err *err) {
    *out = NULL;
    if (!c->resume[0] || !resume_config_path(c->resume, path, cap)) return ST_OK;
    st_train_config *was = malloc(sizeof *was); /* large: not on the stack */
    if (!was)
        return st_errf(err, ST_ERR_NOMEM, "resume %s: out of memory reading %s (%zu bytes) to check what the resume may "
                       "not change", c->resume, path, sizeof *was);
    st_train_config_defaults(was); /* a config.json from before a key: its default */
    if (st_train_config_load_json(was, path, NULL)) {
        free(was);
        return ST_OK; /* unreadable: the resume itself says what is wrong with the run */
    }
    *out = was;
    return ST_OK;
}

static st_status check_resume_matmul(const st_train_config *c, const st_train_config *was, const char *path,
                                     int forced, st_err *err) {
    st_matmul_mode a, b;
    if (st_backend_matmul_parse(was->matmul, &a, NULL) || st_backend_matmul_parse(c->matmul, &b, NULL)) return ST_OK;
    if (a == ST_MATMUL_AUTO) a = st_backend_matmul_auto(c->device, NULL, 0);
    if (b == ST_MATMUL_AUTO) b = st_backend_matmul_auto(c->device, NULL, 0);
    if (a == b) return ST_OK;
    if (forced) {
        st_log(1, "warning: key 'matmul': %s was trained with matmul %s and this resume computes %s, as force_resume "
               "1 asks: the run's numerics change from the resumed step on\n", c->resume, st_backend_matmul_name(a),
               st_backend_matmul_name(b));
        return ST_OK;
    }
    return st_errf(err, ST_ERR_INVALID, "key 'matmul': %s was trained with matmul %s (%s) and this resume gives %s: "
                   "the run's numerics would change; resume with matmul %s, or give force_resume 1 to change it "
                   "anyway", c->resume, st_backend_matmul_name(a), path, st_backend_matmul_name(b),
                   st_backend_matmul_name(a));
}

/* act_dtype as the matmul mode: whether the activations the backward reads are rounded. */
static st_status check_resume_act_dtype(const st_train_config *c, const st_train_config *was, const char *path,
                                        int forced, st_err *err) {
    if (!strcmp(was->act_dtype, c->act_dtype)) return ST_OK;
    if (forced) {
        st_log(1, "warning: key 'act_dtype': %s was trained with act_dtype %s and this resume keeps %s activations, as "
               "force_resume 1 asks: the run's numerics change from the resumed step on\n", c->resume, was->act_dtype,
               c->act_dtype);
        return ST_OK;
    }
    return st_errf(err, ST_ERR_INVALID, "key 'act_dtype': %s was trained with act_dtype %s (%s) and this resume gives "
                   "%s: the run's numerics would change; resume with act_dtype %s, or give force_resume 1 to change it "
                   "anyway", c->resume, was->act_dtype, path, c->act_dtype, was->act_dtype);
}

st_status run_check_resume_numerics(st_train_config *c, st_err *err) {
    char path[2200];
    int forced = c->force_resume;
    c->force_resume = 0; /* recorded as 0: a later resume is checked again */
    st_train_config *was = NULL;
    st_status s = run_resumed_config(c, &was, path, sizeof path, err);
    if (s || !was) return s;
    s = check_resume_matmul(c, was, path, forced, err);
    if (!s) s = check_resume_act_dtype(c, was, path, forced, err);
    free(was);
    return s;
}

/* keep_checkpoints: after a new checkpoint is complete, the oldest complete ones beyond
 * the newest N go (with a recursive delete, never a shell). A failure is a warning: the
 * run's state is safe in the new checkpoint. */
void run_prune_checkpoints(const st_train_config *c) {
    if (c->keep_checkpoints <= 0) return;
    unsigned long long *steps;
    int n = list_checkpoints(c->run_dir, &steps);
    for (int i = 0; i + c->keep_checkpoints < n; i++) {
        char dir[2200];
        st_run_checkpoint_path(dir, sizeof dir, c->run_dir, steps[i]);
        st_err e = {0};
        if (st_rmtree(dir, &e)) st_log(1, "warning: keep_checkpoints: %s\n", e.msg);
    }
    free(steps);
}

/* A resumed run logs each step once: the lines of metrics.jsonl after the step it resumes
 * at (steps that ran after the checkpoint, before a crash or a kill) are replayed, so they
 * go, with a torn last line. */
st_status run_metrics_truncate(const char *run_dir, unsigned long long step, st_err *err) {
    char path[2200];
    st_run_path(path, sizeof path, run_dir, ST_RUN_METRICS);
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

/* Every rank's status of a part of the work done by all: ST_OK when all succeeded; else this
 * rank's own error, or one naming the first rank that failed. */
st_status run_agree(const run_dist *d, st_status mine, const char *what, st_err *err) {
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

st_status run_save_checkpoint(const st_train_config *c, const run_dist *d, st_model *m, st_optim *o,
                              const st_train_state_header *h, const run_ckpt_extra *extra, st_err *err) {
    char dir[2048], tmp[2100], path[2200], old[2100];
    st_run_checkpoint_path(dir, sizeof dir, c->run_dir, (unsigned long long)h->step);
    snprintf(tmp, sizeof tmp, "%s.partial", dir);
    snprintf(old, sizeof old, "%s.old", dir);
    st_status s = ST_OK;
    if (d->rank == 0) { /* leftovers of an interrupted save are incomplete by construction */
        s = st_rmtree(tmp, err);
        if (!s) s = st_rmtree(old, err);
        if (!s) s = st_mkdirs(tmp, err);
    }
    if ((s = run_agree(d, s, "preparing the checkpoint directory", err))) return s;
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
        st_run_path(path, sizeof path, tmp, ST_RUN_CONFIG);
        if (!s) s = st_train_config_save_json(c, path, err);
        if (!s && extra && extra->write) s = extra->write(extra->ctx, tmp, err);
    }
    if ((s = run_agree(d, s, "writing the checkpoint", err))) return s;
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
        st_run_path(ckdir, sizeof ckdir, c->run_dir, ST_RUN_CHECKPOINTS);
        if ((s = st_fsync_dir(ckdir, err))) goto commit;
        st_run_path(path, sizeof path, c->run_dir, ST_RUN_LATEST);
        char name[64];
        snprintf(name, sizeof name, "step_%08llu", (unsigned long long)h->step);
        s = st_write_text(path, name, err);
    }
commit:
    return run_agree(d, s, "committing the checkpoint", err);
}

/* Under mpirun: every rank runs the same configuration (the model, the seed, the data, every
 * key but threads, which may differ by machine); the first key that differs is named. */

st_status run_dist_check_config(const st_train_config *c, const run_dist *d, st_err *err) {
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

/* The run's configuration as RUN_DIR/config.json (what a resume reads). */
st_status run_save_config(const st_train_config *c, st_err *err) {
    char path[2200];
    if (st_run_path(path, sizeof path, c->run_dir, ST_RUN_CONFIG) >= (int)sizeof path)
        return st_errf(err, ST_ERR_INVALID, "key 'run_dir': %s is too long", c->run_dir);
    return st_train_config_save_json(c, path, err);
}

int st_run_path(char *buf, size_t cap, const char *run_dir, st_run_file f) {
    static const char *names[] = {"config.json", "metrics.jsonl", "plan.json", "plan_profile.json", "strata.lock",
                                  "model.safetensors", "report.html", "checkpoints", "checkpoints/latest"};
    _Static_assert(sizeof names / sizeof names[0] == ST_RUN_LATEST + 1, "a name for every st_run_file");
    return snprintf(buf, cap, "%s/%s", run_dir, (unsigned)f <= ST_RUN_LATEST ? names[f] : "?");
}

int st_run_checkpoint_path(char *buf, size_t cap, const char *run_dir, unsigned long long step) {
    return snprintf(buf, cap, "%s/checkpoints/step_%08llu", run_dir, step);
}

int st_run_rank_path(char *buf, size_t cap, const char *run_dir, int rank) {
    return snprintf(buf, cap, "%s/rank_%d", run_dir, rank);
}
