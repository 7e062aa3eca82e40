/* run_docs.h - per-document signals of a run (key doc_signals): from the step's per-row
 * losses and the loader's segments, every document a step trains on gets a record (its
 * loss summed and counted over its targets, the step, its visit); the ranks' records
 * gathered in sample order; RUN_DIR/doc_signals.bin appended by rank 0, bounded, cut back
 * to the step a run resumes from. Private to src/run. */
#ifndef STRATA_RUN_DOCS_H
#define STRATA_RUN_DOCS_H

#include "run/run_mix.h"
#include "strata/data.h"
#include "strata/dist.h"
#include "strata/train.h"

typedef struct run_docs {
    int on;
    int B, T, n_micro, lead;
    st_comm *comm;
    run_mix *mix;               /* the hook is chained to online mixing's when that is on */
    /* each micro-batch of the step being run: its rows' sources and segments */
    uint8_t *src;               /* [n_micro][B] */
    int32_t *cu;                /* [n_micro][B*T+1] */
    uint64_t *doc;              /* [n_micro][B*T] */
    uint32_t *visit;            /* [n_micro][B*T] */
    int *n_seqs;                /* [n_micro] */
    st_data_docsig *rec;        /* this step's records (this rank's) */
    size_t n_rec, cap_rec;
    FILE *f;                    /* rank 0: RUN_DIR/doc_signals.bin, appended */
    char path[4200];
    uint64_t written, max_records;
    int full_said;
} run_docs;

/* Off unless c->doc_signals > 0 (MiB of records at most). Rank 0 creates the file, or on a
 * resume (resumed 1, at step `step`) checks its header against this run's and cuts off the
 * records of steps after `step`. mix: online mixing's state (its hook is called from ours). */
st_status run_docs_open(run_docs *x, const st_train_config *c, st_data_loader *dl, st_comm *comm, int lead,
                        uint64_t step, int resumed, run_mix *mix, st_err *err);
void run_docs_close(run_docs *x);
/* After micro-batch k's batch was taken (st_data_loader_last_batch): its segments. */
void run_docs_note(run_docs *x, int k, const st_data_loader *dl);
/* The step's per-row loss hook (st_row_loss_hook; ctx the run_docs); calls online mixing's. */
void run_docs_row_hook(void *ctx, int k, const float *losses, const int32_t *targets, size_t n);
/* After step `step`: the ranks' records gathered in sample order and appended (rank 0). */
st_status run_docs_after_step(run_docs *x, long step, st_err *err);

#endif
