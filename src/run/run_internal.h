/* run_internal.h - what the files of the run layer (src/run) share: the run's data, its
 * ranks, its directory, its plan and its disk state, each opened by one file and used by the
 * loop (train.c). Private to src/run. */
#ifndef STRATA_RUN_INTERNAL_H
#define STRATA_RUN_INTERNAL_H

#include "strata/block.h"
#include "strata/ckpt.h"
#include "strata/data.h"
#include "strata/dist.h"
#include "strata/plan.h"
#include "strata/prof.h"
#include "strata/step.h"
#include "strata/store.h"
#include "strata/stream.h"
#include "strata/tier.h"
#include "strata/train.h"

typedef struct run_data {
    st_data_loader *dl;
    uint16_t *corpus; /* the embedded corpus, when used; outlives the loader */
    char *spec;       /* copy of the data key, cut into paths */
    const uint8_t *source; /* the last batch's rows' sources (the loader's, until the next batch) */
} run_data;

typedef struct run_dist {
    st_comm *comm;
    int rank, world, zero;
    size_t *bounds;          /* the shards (zero 1 and 2) */
    size_t lo, hi;           /* this rank's: [0, n_params) when the state is not sharded */
} run_dist;

typedef struct run_eval {
    run_data vd;            /* the embedded tail: generated at the first evaluation */
    st_data_loader_state start;
    const char *spec;         /* NULL: no validation */
} run_eval;

void run_data_close(run_data *d);
st_status run_data_open(run_data *d, const st_train_config *c, const run_dist *dist, const char *key, const char *spec, int vocab, st_err *err);
st_status run_data_next(run_data *d, int B, int T, int32_t *inputs, int32_t *targets, int32_t *positions, int32_t *doc_start, st_err *err);
void run_data_save_state(const run_data *d, st_train_state_header *h);
st_status run_data_restore_state(run_data *d, const st_train_state_header *h, const char *path, st_err *err);
st_status run_resolve_resume(const char *path, char *ckpt_dir, size_t cap, st_err *err);
/* The configuration a resume (c->resume) continues: the config.json of the run directory,
 * or of RUN for RUN/checkpoints/step_N (its path in path), loaded over the defaults (a key
 * the file predates: its default), in *out, malloc'ed: the caller frees it. *out NULL where
 * there is no resume, no such file, or it is unreadable (the resume itself then says what is
 * wrong): ST_OK. Out of memory: an error (the checks must not be skipped then). Every check of
 * a key a resume may not change reads it here. */
st_status run_resumed_config(const st_train_config *c, st_train_config **out, char *path, size_t cap, st_err *err);
/* A resume (c->resume) whose matmul or act_dtype differs from the one its run recorded
 * (run_resumed_config; a file from before the key: its default, fp32, f32): refused naming
 * the key and both values, or, with force_resume 1, warned (force_resume then set to 0: it
 * is for this resume only). Call before anything is written. */
st_status run_check_resume_numerics(st_train_config *c, st_err *err);
void run_prune_checkpoints(const st_train_config *c);
st_status run_metrics_truncate(const char *run_dir, unsigned long long step, st_err *err);
st_status run_agree(const run_dist *d, st_status mine, const char *what, st_err *err);
/* What else a checkpoint holds (the online mixture's state): written by rank 0 into the
 * checkpoint's directory before it is committed, so it is whole or the checkpoint is not. */
typedef struct run_ckpt_extra {
    st_status (*write)(void *ctx, const char *dir, st_err *err);
    void *ctx;
} run_ckpt_extra;
st_status run_save_checkpoint(const st_train_config *c, const run_dist *d, st_model *m, st_optim *o,
                              const st_train_state_header *h, const run_ckpt_extra *extra, st_err *err);
st_status run_dist_check_config(const st_train_config *c, const run_dist *d, st_err *err);
st_status run_open_streamed(const st_train_config *c, st_model *m, const st_arch *arch, st_backend *be, int ranks, st_backend **dev, st_stream_exec **sx, double *state_budget, st_stream_plan *chosen, st_err *err);
const char *run_val_spec(const st_train_config *c);
st_status run_eval_loss(const st_train_config *c, st_model *m, st_step *stp, run_eval *ev, int32_t *inputs, int32_t *targets, int32_t *positions, int32_t *doc_start, double *out, st_err *err);
st_status run_open_store(const st_train_config *c, const run_dist *d, st_model *m, const st_optim_segment *segs, int n_segs, st_optim_state_format fmt, run_data *td, st_train_state_header *hs, size_t blob_bytes, st_store **out, st_err *err);

st_status run_place_state(st_train_config *c, int world, st_err *err);
st_status run_save_config(const st_train_config *c, st_err *err);

#endif
