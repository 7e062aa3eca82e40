/* run_poetx_internal.h - strata train's method poetx (run_poetx.c): the keys checked before
 * anything is written, the model wrapped as POET-X, the merges after each merge interval. */
#ifndef STRATA_RUN_POETX_INTERNAL_H
#define STRATA_RUN_POETX_INTERNAL_H

#include "strata/model.h"
#include "strata/optim.h"
#include "strata/step.h"
#include "strata/train.h"

/* method poetx's keys against the model's tensor table, allocating no weights: layer streaming,
 * the disk state, 8-bit optimizer state or several ranks (not yet), a block size that divides
 * no dimension of some weight (naming the key and the tensor), a resume with another
 * poetx_block or poetx_terms. Nothing for other methods. world: the ranks of the run. */
st_status run_poetx_check(const st_train_config *c, int world, st_err *err);
/* The parameters method poetx trains for c over the model a of family (the packed Q's, the
 * embeddings, norms and biases). */
st_status run_poetx_trainable(const st_train_config *c, const st_arch *a, const char *family, size_t *n, st_err *err);
/* What method poetx holds besides the base's weights and the trained vector's state, in bytes,
 * counted from the tensor table as src/model/poetx.c allocates it (nothing allocated here). */
typedef struct run_poetx_bytes {
    double kept_h;       /* recompute 0: every matmul weight's h = u W0^T (N x d_out floats) kept from
                            the forward for the backward; 0 with poetx_recompute 1 */
    double scratch;      /* u | h | dy | dh | du (5 N max_d floats), dG_in | dG_out (2 max_nb b^2),
                            one weight's G_in | G_out ((d_in + d_out) b at most), the permutations */
    double save_staging; /* a checkpoint's staging: the trained vector, every W0, the permutations */
    double start;        /* the start (run_poetx_open): the base's weights and gradient vector
                            allocated (8 bytes a parameter), then, wrapped (the gradients freed), its
                            weights, the initialisation's staging, the trained vector and its
                            gradients, G and the permutations */
} run_poetx_bytes;
st_status run_poetx_bytes_of(const st_train_config *c, const st_arch *a, const char *family, int B, int T,
                             run_poetx_bytes *out, st_err *err);
/* method poetx: *m (the base: init_from's weights, or uninitialised where
 * run_poetx_initialises, then initialised here from the seed after the wrap) becomes the POET-X
 * model over it, its activations the run's to allocate; *m is NULL on failure (the base
 * freed). Otherwise nothing. */
st_status run_poetx_open(const st_train_config *c, st_model **m, st_err *err);
/* 1 where run_poetx_open initialises the model from the seed (method poetx without init_from):
 * the caller leaves the base uninitialised, so the base's gradient vector is freed by the wrap
 * before the initialisation's staging buffer is allocated. */
int run_poetx_initialises(const st_train_config *c);
/* Q's peak learning rate: poetx_lr, or lr where it is -1 (any method: only method poetx's
 * optimizer has segments of the second class). */
double run_poetx_lr(const st_train_config *c);
/* The gradient clip threshold of step (1-based): grad_clip, except on method poetx's steps
 * j = 1 .. poetx_clip_ramp after a merge (steps every+1 .., 2 every+1 .., ...), where it is
 * grad_clip * (poetx_clip_start + (1 - poetx_clip_start) (j - 1) / poetx_clip_ramp). */
double run_poetx_clip_at(const st_train_config *c, long step);
/* The segments of a POET-X model's Q's (offset at or past st_poetx_q_offset) made the
 * optimizer's second learning-rate class; nothing for other models. segs: the whole vector's,
 * before ZeRO clips them. */
void run_poetx_lr_classes(const st_model *m, st_optim_segment *segs, int n);
/* After the update of step `step`: every poetx_merge_every steps, the merge (R and P folded into
 * W0, Q reset, the permutations redrawn from the seed and the step) and, with
 * poetx_adam_restart, Q's Adam moments zeroed in o (the second class's segments: a rank's ZeRO
 * shard of them, or all; f32 or 8-bit). Under ranks every rank merges its whole copy alike,
 * after the step's weights are gathered (stp: st_step_sync). Nothing for other models. */
st_status run_poetx_after_step(const st_train_config *c, st_model *m, st_optim *o, st_step *stp, long step,
                               st_err *err);

#endif
