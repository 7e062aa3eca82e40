/* run_state.c - the optimizer state on disk: the state store opened, created, resumed, or
 * re-sharded from another world size. */
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
                        st_optim_state_name(in.fmt), in.n_paths, st_optim_state_name(r->fmt), r->n_paths);
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
static st_status reshard_store(const st_train_config *c, const run_dist *d, st_model *m, const char *const *base,
                               const st_store_config *sc, st_store **out, st_err *err) {
    reshard r = {.base = base, .n_paths = sc->n_paths, .fmt = sc->fmt, .lo = d->lo, .n_segs = m->n_tensors};
    st_optim_segment *segs = calloc((size_t)m->n_tensors, sizeof *segs);
    if (!segs) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    st_params_decay_segments(m->tensors, m->n_tensors, (float)c->weight_decay, segs);
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
st_status run_open_store(const st_train_config *c, const run_dist *d, st_model *m, const st_optim_segment *segs,
                            int n_segs, st_optim_state_format fmt, run_data *td, st_train_state_header *hs,
                            size_t blob_bytes, st_store **out, st_err *err) {
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
                          .host_budget = c->state_budget > 0 ? (uint64_t)c->state_budget : ST_STORE_HOST_BUDGET_DEFAULT};
    if (!c->resume[0]) {
        s = st_store_exists(&sc) ? st_errf(err, ST_ERR_INVALID, "key 'state_paths': %s/strata-state.manifest already "
                                           "holds a run's state; continue it with --resume %s, or remove the store to "
                                           "start over", paths[0], c->run_dir) : ST_OK;
        if ((s = run_agree(d, s, "checking the state paths", err))) return s;
        s = st_store_create(out, &sc, st_store_init_copy, mine, err);
        if (s) st_err_prefix(err, "key 'state_paths'");
        if ((s = run_agree(d, s, "creating the state stores", err))) return s;
        st_failpoint("train_store_created");
        /* step 0 with the loop's state, so a run killed before its first step resumes */
        run_data_save_state(td, hs);
        return run_agree(d, st_store_commit_blob(*out, hs, blob_bytes, err), "committing step 0", err);
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
    if ((s = run_agree(d, s, "opening the state stores", err))) return s;
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
        if ((s = run_agree(d, s, "agreeing on the stores' step", err))) return s;
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
            run_data_save_state(td, hs);
            st_log(1, "the state store %s was created but never stepped; starting at step 0\n",
                   st_store_manifest_path(*out));
            s = st_store_commit_blob(*out, hs, blob_bytes, err);
        }
    } else if (!blob || bb != blob_bytes) {
        s = st_errf(err, ST_ERR_FORMAT, "%s: the store's loop state has %zu bytes, this run's %zu: resume with the "
                    "strata that wrote it and the same keys mix and grad_accum (online mixing commits its state "
                    "there)", st_store_manifest_path(*out), bb, blob_bytes);
    } else {
        memcpy(hs, blob, blob_bytes);
        if (hs->n_params != m->n_params)
            s = st_errf(err, ST_ERR_SHAPE, "%s: the store was written for %llu parameters, the model has %zu",
                        st_store_manifest_path(*out), (unsigned long long)hs->n_params, m->n_params);
        if (!s) s = st_store_read_master(*out, mine, err);
        if (!s) s = run_data_restore_state(td, hs, st_store_manifest_path(*out), err);
        if (!s && d->rank == 0)
            st_log(1, "resumed from the state store %s at step %llu\n", st_store_manifest_path(*out),
                   (unsigned long long)hs->step);
    }
    if ((s = run_agree(d, s, "reading the state stores", err))) return s;
    if (d->world > 1 && d->zero > 0) /* every rank's master shard to every rank */
        s = st_comm_allgather_f32(d->comm, m->params, 0, m->n_params, d->bounds, "weights gather", err);
    return s;
}
