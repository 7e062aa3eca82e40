/* run_poetx_internal.h - strata train's method poetx (run_poetx.c): the keys checked before
 * anything is written, the model wrapped as POET-X, the merges after each merge interval. */
#ifndef STRATA_RUN_POETX_INTERNAL_H
#define STRATA_RUN_POETX_INTERNAL_H

#include "strata/model.h"
#include "strata/optim.h"
#include "strata/train.h"

/* method poetx's keys against the model's tensor table, allocating no weights: layer streaming,
 * the disk state, 8-bit optimizer state or several ranks (not yet), a block size that divides
 * no dimension of some weight (naming the key and the tensor), a resume with another
 * poetx_block or poetx_terms. Nothing for other methods. world: the ranks of the run. */
st_status run_poetx_check(const st_train_config *c, int world, st_err *err);
/* The parameters method poetx trains for c over the model a of family (the packed Q's, the
 * embeddings, norms and biases). */
st_status run_poetx_trainable(const st_train_config *c, const st_arch *a, const char *family, size_t *n, st_err *err);
/* method poetx: *m (the base: init_from's weights, or uninitialised where
 * run_poetx_initialises, then initialised here from the seed after the wrap) becomes the POET-X
 * model over it, its activations the run's to allocate; *m is NULL on failure (the base
 * freed). Otherwise nothing. */
st_status run_poetx_open(const st_train_config *c, st_model **m, st_err *err);
/* 1 where run_poetx_open initialises the model from the seed (method poetx without init_from):
 * the caller leaves the base uninitialised, so the base's gradient vector is freed by the wrap
 * before the initialisation's staging buffer is allocated. */
int run_poetx_initialises(const st_train_config *c);
/* After the update of step `step`: every poetx_merge_every steps, the merge (R and P folded into
 * W0, Q reset, the permutations redrawn from the seed and the step) and Q's Adam moments reset
 * in o. Nothing for other models. */
st_status run_poetx_after_step(const st_train_config *c, st_model *m, st_optim *o, long step, st_err *err);

#endif
