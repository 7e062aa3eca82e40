/* step.h - one optimizer step, whatever the placement: micro-batches -> gradient ->
 * global norm -> clip -> AdamW update. One body, the block executor (stream.h), serves
 * every placement: in memory it runs with every block resident in the model's own vectors
 * (nothing copied; the optimizer in RAM or the disk state store), streamed it moves the
 * blocks through a device's budget, and under ranks it hands each block's gradient to dist's
 * reduction as it lands. A model without blocks (LoRA's adapters, POET-X) trains through its
 * own forward and backward in memory (st_step_in_blocks); streamed, through the executor over
 * its base with the method's hook (st_stream_hook_grads, below). strata train, strata bench step and strata bench
 * stream all run their steps through st_step_run, so what is benchmarked is what trains.
 *
 * The rules every placement follows (so that they agree bit for bit):
 *   - the loss of a step is the mean over its targets >= 0, over all its micro-batches
 *     together (as Hugging Face averages a batch whose masked labels are -100): each
 *     micro-batch's dloss is 1 / (the step's count of targets >= 0);
 *   - each micro-batch's gradient is computed fresh from zero and the micro-batches are
 *     summed in order, ((g1 + g2) + g3) + ... (st_step_dloss, st_stream_step_accum);
 *   - the global norm is summed over fixed chunks in a fixed order (st_optim_grad_sumsq);
 *     a non-finite norm skips the update and changes no state; above grad_clip the
 *     gradient is scaled by grad_clip / norm inside the update.
 *
 * One step of a model in memory with its optimizer in RAM:
 *
 * Example:
 *
 *     #include "strata/train.h"
 *
 *     st_err err = {0};
 *     st_backend *be = NULL;
 *     st_model *m = NULL;
 *     st_optim *opt = NULL;
 *     enum { B = 2, T = 16 };
 *     static int32_t inputs[B * T], targets[B * T];   // ids; a target < 0 is not counted
 *     if (st_backend_cpu_create(&be, 0, &err) || st_model_create(&m, "gpt2-tiny", NULL, be, &err) ||
 *         m->ops->alloc_acts(m, B, T, &err)) return 1;
 *     m->ops->init_random(m, 1337);
 *     st_optim_segment *segs = calloc((size_t)m->n_tensors, sizeof *segs);  // one per tensor
 *     if (!segs) return 1;
 *     st_params_decay_segments(m->tensors, m->n_tensors, 0.1f, segs);       // decay by role
 *     st_step *st = NULL;
 *     st_step_hp hp = {.adam = {.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = 1},
 *                      .grad_clip = 1.0f};
 *     st_step_result r;
 *     if (st_optim_create(&opt, segs, m->n_tensors, ST_OPTIM_STATE_F32, &err) == ST_OK &&
 *         st_step_create(&st, &(st_step_setup){.m = m, .opt = opt, .max_micro = 1}, &err) == ST_OK) {
 *         if (st_step_run(st, 1, B, T, inputs, targets, &hp, &r, &err) == ST_OK)
 *             printf("loss %.3f, norm %.3f, skipped %d\n", r.loss, r.grad_norm, r.skipped);
 *     }
 *     st_step_destroy(st);
 *     st_optim_free(opt);
 *     free(segs);
 *     st_model_free(m);
 *     st_backend_free(be);
 *
 * End of example.
 */
#ifndef STRATA_STEP_H
#define STRATA_STEP_H

#include "strata/core.h"
#include "strata/model.h"
#include "strata/optim.h"
#include "strata/stream.h"

struct st_store;
struct st_comm;

/* The step: opaque; made by st_step_create from its setup, freed by st_step_destroy. */
typedef struct st_step st_step;

/* What a step runs on. In memory: m and the optimizer opt (RAM) or the store (the disk
 * state); the executor over m's vectors is made at the first step, for its B x T (m's own
 * activations are needed only where st_step_in_blocks says the model's forward runs). Streamed, one process: sx (made with
 * stream_config.grad_accum >= max_micro), m unused. Data parallel (comm, in memory or,
 * with sx, streamed: the model's vectors are the executor's host tier): every rank runs
 * the same step on its own micro-batches, and the gradients of all ranks are summed in rank
 * order (dist.h), so N ranks step as one process with N times the micro-batches. zero 0:
 * the gradient all-reduced, opt (or the store) holds the whole state on every rank; zero 1
 * and 2: opt (or the store) holds the shard [bounds[rank], bounds[rank + 1]) only (its
 * segments clipped to it, st_zero_clip_segments, counted from the shard's start), the
 * updated weights gathered after the update (overlap_gather: during the next forward);
 * zero 2 keeps only the shard of the running gradient sum, reducing each micro-batch as it
 * ends, so it is also bit-identical to one process at grad_accum N x max_micro.
 * Streamed LoRA: m the LoRA model, opt its optimizer over the adapters (or store,
 * the disk state of the adapters' vector, never attached to the executor), sx a frozen executor
 * over its base (st_stream_config.hook, st_lora_hook_bind): each micro-batch's forward and
 * backward are the executor's (st_stream_hook_grads), the rest is the in-memory step's (the
 * adapters' gradient summed, its norm, clip and update by opt or the store): the same steps as
 * in memory, bit for bit where the executor's arithmetic is the model's (no vocabulary chunks).
 * Streamed POET-X likewise (st_poetx_hook_bind; opt or store over the POET-X vector): before each step and
 * each eval the base's trainables are copied from m into the executor's host vector
 * (st_poetx_to_base) and the device copies sent again, so the update and a merge's W0 are
 * what the executor reads; the same steps as in memory bit for bit (the head resident).
 * Under ranks (comm) either method likewise, each rank's sx over its own copy of the base: each
 * micro-batch's hook gradient (m's, zeroed first) is reduced whole after its backward (no block
 * ranges to overlap), summed and reduced as the in-memory ranks' step sums and reduces, and the
 * weights gathered after the update before the next step reads them: 2 ranks are one process
 * streamed at grad_accum 2 bit for bit. */
typedef struct st_step_setup {
    st_model *m;
    st_optim *opt;
    struct st_store *store;
    struct st_stream_exec *sx;
    int max_micro;              /* micro-batches per step, at most (> 1 in memory: one more fp32 gradient) */
    struct st_comm *comm;       /* NULL: one process */
    int zero;
    const size_t *bounds;       /* the ranks' shards (st_zero_bounds) */
    int overlap_gather;
    st_dtype act_dtype;         /* in memory: the activations kept for the backward, ST_F32 (0, the
                                   default) or ST_BF16 (st_stream_plan.act_dtype of the executor over
                                   m's vectors; refused for a model that trains through its own
                                   forward). Streamed: sx's plan says it. */
} st_step_setup;

typedef struct st_step_hp {
    st_adamw_params adam;     /* .step: this update's Adam step; .grad_scale is ignored (the clip sets it) */
    float grad_clip;       /* <= 0: no clipping */
    const void *blob;      /* the disk state: committed with the update (the loop's state after it) */
    size_t blob_bytes;
    /* the disk state in memory (st_store_step_args' keys of the same names): before the update,
     * the master weights (reset_master) and moments (reset_moments) of the segments of class
     * reset_class reset, committed with it; elsewhere not read */
    int reset_master, reset_moments, reset_class;
} st_step_hp;

typedef struct st_step_result {
    double loss;           /* mean over the step's targets >= 0 */
    double grad_norm;      /* before clipping */
    int clipped, skipped;  /* skipped: non-finite norm, nothing updated, nothing committed */
    long n_targets;        /* targets >= 0 in the step */
    double forward_s, backward_s, optimizer_s; /* in memory; streamed: forward_s holds the
                                                  executor's compute, optimizer_s its tail */
    st_stream_step_stats stream; /* streamed: the executor's figures (bytes moved, overlap, peak) */
    double comm_wait_s;    /* data parallel: time this rank waited on the other ranks (exposed communication) */
    uint64_t sent_bytes, received_bytes; /* data parallel: this rank's bytes in this step */
} st_step_result;

st_status st_step_create(st_step **out, const st_step_setup *setup, st_err *err);
void st_step_destroy(st_step *s);
/* Packed documents: positions and doc_start (n_micro x B x T int32 each, model.h's
 * st_model_set_docs) of the micro-batches that st_step_run's inputs hold, read by every
 * following st_step_run (the caller refills them with the inputs); NULL, NULL: one
 * sequence a row. Streamed (one process or the ranks' step), the executor takes them
 * (st_stream_set_docs) and sets each micro-batch's before its forward. */
void st_step_set_docs(st_step *s, const int32_t *positions, const int32_t *doc_start);
/* Called after each micro-batch's forward with its per-row losses (host, n = B x T; a row
 * whose target is < 0 carries no loss): micro-batch k of the step, in memory, streamed and
 * under ranks (each rank its own micro-batches). NULL: none. Streamed in one process the
 * hook is set on the executor (st_stream_set_row_hook), where it stays after
 * st_step_destroy: clear it first if the executor runs on without the step. */
void st_step_set_row_hook(st_step *s, st_row_loss_hook hook, void *ctx);
/* Data parallel with overlap_gather: wait until the weights gathered after the last update
 * are all here. Call it before anything but the next st_step_run reads the model's weights
 * (an evaluation, a checkpoint, an export) and before st_step_destroy. Otherwise a no-op. */
st_status st_step_sync(st_step *s, st_err *err);

/* 1 when st_step trains m in memory through the block executor (stream.h's resident plan:
 * every block's weights and gradients are the model's own vectors, nothing copied): a model
 * with a block interface (block.h) on a backend whose memory is the host's. The model's own
 * activations (alloc_acts) are then unused by the step. st_step_create takes that body when
 * its optimizer has one segment per model tensor (st_params_decay_segments), or the state
 * is a store, or ranks update; otherwise, and for a model without blocks (LoRA's adapters
 * over a frozen base), the model's own forward and backward. */
int st_step_in_blocks(const st_model *m);

/* The model's weights were written other than by the step (a load, an edit) between steps:
 * the step's executor forgets what it derived from them (the bf16 copy that matmul bf16's
 * products read, stream.h; a streamed device's copies of the embedding and head). */
void st_step_params_changed(st_step *s);
/* Forward only (validation) of one (B, T) batch with the current weights, through the body
 * that trains (the executor's st_stream_eval, or the model's forward): the mean loss over
 * targets >= 0. positions and doc_start: packed documents (NULL, NULL: none). Changes no
 * parameter, gradient or moment: the steps after it are those without it. */
st_status st_step_eval(st_step *s, int B, int T, const int32_t *inputs, const int32_t *targets, const int32_t *positions,
                       const int32_t *doc_start, float *loss, st_err *err);

/* One step over n_micro micro-batches of B x T (inputs and targets n_micro x B x T ids,
 * micro-batch after micro-batch; a target < 0 is ignored). */
st_status st_step_run(st_step *s, int n_micro, int B, int T, const int32_t *inputs, const int32_t *targets,
                      const st_step_hp *hp, st_step_result *r, st_err *err);

/* The dloss of every micro-batch of a step whose targets (n ids, all micro-batches) are
 * given: 1 / (count of targets >= 0); 1 / n when none is masked (0 when all are). */
float st_step_dloss(const int32_t *targets, size_t n, long *n_targets);
/* One micro-batch's part of its step's loss, from its mean over its own n targets >= 0:
 * mean / n_micro when nothing in the step is masked (total == n * n_micro), else weighed by
 * its share of the step's total targets >= 0. Summed over the micro-batches in order. */
double st_step_micro_loss(float mean, const int32_t *targets, size_t n, int n_micro, long total);

#endif
