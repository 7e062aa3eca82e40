/* run_poetx_internal.h - strata train's method poetx (run_poetx.c): the keys checked before
 * anything is written, the model wrapped as POET-X, the merges after each merge interval. */
#ifndef STRATA_RUN_POETX_INTERNAL_H
#define STRATA_RUN_POETX_INTERNAL_H

#include "strata/dist.h"
#include "strata/model.h"
#include "strata/optim.h"
#include "strata/step.h"
#include "strata/train.h"

/* method poetx's keys against the model's tensor table, allocating no weights: with layer
 * streaming frozen_dtype other than fp32, device cuda or state_paths; a block size that divides no dimension of some weight (naming the key and the
 * tensor), a resume with another poetx_block or poetx_terms. Nothing for other methods. */
st_status run_poetx_check(const st_train_config *c, st_err *err);
/* poetx_init auto (method poetx) made what the run does, recorded in config.json as if given:
 * orthogonal from scratch, model with init_from; on a resume the run's own (poetx_init and its
 * gain from its config.json; model for a run that predates the key). Out of memory: an error. */
st_status run_poetx_resolve_init(st_train_config *c, st_err *err);
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
    double frozen;       /* the base's weights as held: fp32 4 bytes a parameter; with frozen_dtype
                            bf16 or int8, W0 in it (st_frozen_bytes) and the panel buffer, the rest
                            of the base fp32 */
    double disk;         /* with state_paths, a process's: W0 as held and the permutations, twice
                            (the file of the last merge stays until the next one's is in place),
                            three times under ranks (the merge before kept too: a rank's store may
                            return to the step before); the ranks the launcher's
                            (st_comm_launched_size) */
    double start;        /* the start (run_poetx_open): the base's weights and gradient vector
                            allocated (8 bytes a parameter), then, wrapped (the gradients freed), its
                            weights, the initialisation's staging, the trained vector and its
                            gradients, G and the permutations; with poetx_init orthogonal the
                            threads' QRs in place of the staging where they are larger */
} run_poetx_bytes;
st_status run_poetx_bytes_of(const st_train_config *c, const st_arch *a, const char *family, int B, int T,
                             run_poetx_bytes *out, st_err *err);
/* method poetx: *m (the base: init_from's weights, or uninitialised where
 * run_poetx_initialises, then initialised here from the seed after the wrap) becomes the POET-X
 * model over it, its activations the run's to allocate; *m is NULL on failure (the base
 * freed). Otherwise nothing. comm (NULL: one process): the ranks' (collective then), which
 * share the orthogonal initialisation's QRs and broadcast them, so that every rank starts from
 * the same W0. */
st_status run_poetx_open(const st_train_config *c, st_comm *comm, st_model **m, st_err *err);
/* 1 where run_poetx_open initialises the model from the seed (method poetx without init_from):
 * the caller leaves the base uninitialised, so the base's gradient vector is freed by the wrap
 * before the initialisation's staging buffer is allocated. */
int run_poetx_initialises(const st_train_config *c);
/* 1 when c is method poetx over init_from: its base is built without weights, which run_poetx_open
 * reads (st_poetx_model_create_from: each W0 into the store as it is read, each tensor checked
 * finite); 0: the base comes with its weights, or a preset's are drawn. */
int run_poetx_loads_base(const st_train_config *c);
/* 1 when c is method poetx over a preset with frozen_dtype bf16 or int8: its base is built without
 * weights, which run_poetx_open draws (st_poetx_model_create_drawn: each W0 into the store as it is
 * drawn, with poetx_init orthogonal a batch of them at a time); 0: init_from's are read, or fp32's
 * drawn whole once wrapped (draw_start). */
int run_poetx_draws_base(const st_train_config *c);
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

/* Method poetx with the disk state (state_paths). The store holds the trained vector (Q's, the
 * embeddings, norms, biases) and its moments as any run's; W0 and the permutations, which change
 * at each merge, are written after the merge of step k (the store's commit of step k, which holds
 * Q before the merge, comes first) to NAME.poetx-w0-STEP.safetensors in the store's first path
 * (st_poetx_save_w0: temporary, fsync, rename), the older ones removed after (under ranks the
 * merge before the last one kept too: a rank's store may return to the step before). Q's reset (its
 * master weights zero, with poetx_adam_restart its moments) goes into the store with the next
 * update, committed with it (st_step_hp.reset_*); the blob each commit carries holds, after the
 * loop's state and the mixture's, the merge whose reset the store has taken (w0_step) and the
 * run's id, which every W0 file carries in its fingerprint (metadata poetx_run). A resume at
 * store step j with m the last merge at or before j loads W0@m; where a kill came between the
 * store's commit of m and W0@m's rename (j == m, no file), the merge is made again, bit for bit,
 * from W0 of the merge before and the store's Q. */
typedef struct run_poetx_disk {
    int on;
    char dir[2048];          /* the store's first path */
    unsigned char *region;   /* w0_step (uint64_t) in the blob: the merge the store's Q is relative to
                                (the low 32 bits), the run's id (the high 32; 0: none) */
    uint32_t run_id;         /* drawn at the run's start (rank 0's), committed with every step */
    char run[160];           /* the fingerprint each W0 file carries (metadata poetx_run): the run's
                                id, poetx_init and the trained vector's size; a file of another
                                run's is refused, one without the key (older) loads unchecked */
    st_status bind_status;   /* the id's broadcast under ranks (run_poetx_bind), said by open_disk */
    st_err bind_err;
    uint64_t committed;      /* w0_step of the last commit */
    long merged;             /* the merge W0 in memory is (0: the base); > committed: Q's reset pending */
    st_comm *comm;           /* under ranks (NULL: one process): each rank's store in its own directory
                                with its own W0 files, the same bits on every rank */
} run_poetx_disk;
/* The blob bytes method poetx with the disk state adds (8; else 0). */
size_t run_poetx_blob_bytes(const st_train_config *c);
/* x on (method poetx with the disk state) with its w0_step at region (zero; a new run: its id
 * drawn, under ranks rank 0's broadcast, collective then); else off. */
void run_poetx_bind(run_poetx_disk *x, const st_train_config *c, void *region, st_comm *comm);
/* After the store is opened (created: fresh 1, its leftover W0 files removed) and its master
 * weights read into m and its blob into the region: W0 and the permutations of the store's step
 * (hs_step) in m, Q zero where the store's reset is pending; W0 files of merges after hs_step (a
 * timeline the store returned from) removed; a store the re-shard made takes the merge's file
 * of this run from beside a store of the old layout (copied beside its own), passing over another
 * run's. A W0 file whose poetx_run is another run's is refused naming it. Under ranks collective where a
 * store never stepped (every rank draws the start's W0 again if any rank lacks its file). */
st_status run_poetx_open_disk(run_poetx_disk *x, const st_train_config *c, st_model *m, const char *manifest,
                              long hs_step, int fresh, st_err *err);
/* Before a step's update: Q's reset asked of the store where pending (hp), the blob's w0_step the
 * merge it comes from. */
void run_poetx_stage(run_poetx_disk *x, const st_train_config *c, st_step_hp *hp);
/* After run_poetx_after_step of step `step` (skipped: no update committed, the blob's w0_step as it
 * was): with the merge of that step, W0's file written and the older ones removed (under ranks
 * the one before kept). */
st_status run_poetx_after_disk(run_poetx_disk *x, const st_train_config *c, const st_model *m, long step,
                               int skipped, st_err *err);

/* strata sample from a POET-X run: *m, a plain model of the run's base, wrapped by a POET-X model,
 * the checkpoint at weights (a POET-X model's file) loaded into it and merged into the base's own
 * vector (R W0 P folded, W0 out of its permutations' frame: the model save_hf writes); *m the
 * base again, without its gradient vector (forwards only), or NULL on failure (freed). One base in
 * memory at a time. */
st_status run_poetx_load_merged(const st_train_config *c, st_model **m, const char *weights, st_err *err);

#endif
