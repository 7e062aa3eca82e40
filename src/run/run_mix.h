/* run_mix.h - the run's side of online mixing (--mix online): the rows' sources of each
 * micro-batch, their losses from the step's per-row hook, the sums of all ranks, the
 * bandit's update (strata/data.h, st_data_mix_online) and the loader's weights for the
 * step delay steps on; its state as a file of the checkpoint. Private to src/run. */
#ifndef STRATA_RUN_MIX_H
#define STRATA_RUN_MIX_H

#include "strata/data.h"
#include "strata/dist.h"
#include "strata/train.h"

#define RUN_MIX_FILE "mix_online.bin" /* in a checkpoint directory */

typedef struct run_mix {
    int on;                  /* 0: mixing by the data list's weights (nothing below is used) */
    int K, B, T, n_micro;
    st_data_mix_online bandit;
    uint8_t *src;            /* [n_micro][B] the rows' sources of the step being run */
    double *psum, *pcnt;     /* [n_micro][K] this rank's, per micro-batch of this step: added in
                                micro-batch order after the step, then the ranks' in rank order,
                                so N ranks sum as one process with N times the micro-batches */
    st_comm *comm;           /* the ranks (NULL: one process) */
    double used[ST_DATA_MAX_SOURCES]; /* the weights of the step last run */
} run_mix;

/* The run's keys: mix weights leaves x off (x->on 0); mix online opens it for the sources of
 * key 'data' (refused with state_paths: the state lives in checkpoints). */
st_status run_mix_open_run(run_mix *x, const st_train_config *c, st_comm *comm, st_err *err);

/* K sources, n_micro micro-batches of B x T a step; alpha in [0, 1), delay >= 1. */
st_status run_mix_open(run_mix *x, int K, int n_micro, int B, int T, double alpha, int delay, st_comm *comm,
                       st_err *err);
void run_mix_close(run_mix *x);
/* Give the loader the weights of steps [t, t + delay) (after open, or a restore). */
st_status run_mix_start(run_mix *x, st_data_loader *dl, st_err *err);
/* The sources of micro-batch k's rows (the loader's batch.source, B of them). */
void run_mix_note_sources(run_mix *x, int k, const uint8_t *source);
/* The step's per-row loss hook (st_row_loss_hook; ctx the run_mix). */
void run_mix_row_hook(void *ctx, int k, const float *losses, const int32_t *targets, size_t n);
/* After the step: this rank's micro-batches' sums added in order, the ranks' gathered and
 * added in rank order (every rank the same numbers, and one process's with the ranks'
 * micro-batches as its own), the bandit updated, the loader given the weights of the step delay steps on
 * (steps counted from 0 by the bandit; the loader's position is checked against it). */
st_status run_mix_after_step(run_mix *x, st_data_loader *dl, st_err *err);
/* ,"mix_weights":[...] of the step just run (for metrics.jsonl); "" when off. */
void run_mix_weights_json(const run_mix *x, char *buf, size_t cap);
/* The state as CKPT_DIR/mix_online.bin (temporary + fsync + rename) and back (checked). */
st_status run_mix_save(run_mix *x, const char *ckpt_dir, st_err *err);
st_status run_mix_load(run_mix *x, const char *ckpt_dir, st_err *err);

#endif
