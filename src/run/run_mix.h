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
    void *region;            /* with the disk state: the part of the store's blob that is ours
                                (run_mix_bind); psum and pcnt then live in it */
} run_mix;

/* With the disk state the mixing state is committed with each step, in the store's blob after
 * the loop's header: the bandit before the step's update, and the step's per-micro-batch sums
 * (psum, pcnt: the row hook writes them there, complete before the store commits). The update
 * is made after the commit; a resume from the store replays it from the sums (every rank its
 * own, gathered again: the same numbers), so a run killed anywhere continues bit for bit. */
typedef struct run_mix_blob_head {
    uint64_t pending; /* 1: the sums below are a step's that the bandit has not seen yet */
    uint64_t reserved;
    st_data_mix_online bandit;
} run_mix_blob_head;
/* The bytes of that part (0 when mixing is off). */
size_t run_mix_blob_bytes(const run_mix *x);
/* Put the sums in `region` (run_mix_blob_bytes of it, zeroed) and the current bandit with no step
 * pending. */
void run_mix_bind(run_mix *x, void *region);
/* Before a step: the bandit as it is, the sums to come pending. After a step's update, before a
 * commit that holds no new sums (a skipped step's): the bandit updated, nothing pending. */
void run_mix_stage(run_mix *x, int pending);
/* After the blob was read back from the store: the bandit restored from it and a pending
 * step's update replayed (the ranks' sums gathered again); `where` names the store. */
st_status run_mix_resume_blob(run_mix *x, const char *where, st_err *err);

/* The run's keys: mix weights leaves x off (x->on 0); mix online opens it for the sources of
 * key 'data' (with state_paths its state is the store's, above; in checkpoints otherwise). */
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
