/* plan_cost.h - the planner's cost model, shared by the closed-form prediction
 * (st_plan_predict) and the mixed-integer program (st_plan_stream): one set of terms, so the
 * program's objective for a plan is the prediction of that plan. */
#ifndef STRATA_PLAN_COST_H
#define STRATA_PLAN_COST_H

#include "strata/plan.h"

typedef struct plan_cost {
    int L, B, T;
    double fwd, bwd;        /* one block's forward, backward (s) */
    double tw, tg;          /* one block's weight fetch (h2d), gradient drain (d2h) (s) */
    double ta_out, ta_in;   /* one block's activation set: drain, fetch (s) */
    double opt_block;       /* the optimizer over one block (s) */
    double head_compute;    /* the classifier's forward and backward (s), resident (one chunk) */
    double head_chunk;      /* what each more chunk of the vocabulary adds (s) */
    double opt_nonblock;    /* the optimizer over the embedding, norm and untied head (s) */
    double mem_bps, h2d, d2h;
    int measured_shape;     /* 1: fwd, bwd, head_compute are the profile's times at this shape */
    double slow;            /* the profile's host_work_slowdown */
    int frozen_ends;        /* LoRA (plan_cost_frozen): the embedding, norm and head frozen too:
                               sent once, no gradient drained, no optimizer over them */
    const st_arch *a;
} plan_cost;

/* Fills c; fails on a profile with a missing or non-positive figure. */
st_status plan_cost_init(plan_cost *c, const st_arch *a, int B, int T, const st_plan_profile *hw, st_err *err);

/* The activation sets of a plan in dt: under ST_BF16 an offloaded set's copies take half the
 * time, and each block's forward and backward one conversion more (to bf16 after the
 * forward and its recompute, back to fp32 before the backward: 4 bytes read and 2 written an
 * element, or the reverse, at the profile's memory bandwidth). ST_F32: unchanged. */
void plan_cost_act(plan_cost *c, st_dtype dt);

/* A frozen base's block (st_plan_options.frozen_base: LoRA 1, POET-X 2; the run's hook over
 * it): no gradient slab is drained and no optimizer runs over the block (what the method
 * trains is small and updated beside); a held base (held_block_bytes > 0: frozen_dtype bf16 or
 * int8) fetches its held run and the block's 1-D tensors, not the fp32 slab. LoRA forms no
 * gradient of the block's matmul weights: its backward is the measured (or rated) one less
 * those gradients' share of the block's backward FLOPs (2 N FLOPs a matmul weight); POET-X's
 * rotations cost about what they save, its backward is the measured one. LoRA's ends are
 * frozen too (frozen_ends: no optimizer, no gradient of them drained, sent once); POET-X trains
 * them. The hooks' own work
 * and the held panels' dequantising are not timed. frozen_base 0: unchanged. */
void plan_cost_frozen(plan_cost *c, int frozen_base, size_t held_block_bytes);

/* The exposed and compute time that depend only on the vocabulary chunk (the head, the
 * embedding's and head's copies, the first block's fetch and the last gradient's drain,
 * the non-block optimizer). */
void plan_cost_const(const plan_cost *c, int vchunk, double *compute_s, double *exposed_s, double *optim_s);

/* The compute lost to host work that does not depend on the activation choices, at vocabulary
 * chunk vchunk and prefetch depth d: slow x (every block's weight fetches and gradient drain,
 * the embedding's and head's copies, the optimizer's seconds). Each offloaded block that moves
 * adds slow x (ta_out + ta_in). */
double plan_cost_host_work(const plan_cost *c, int vchunk, int d);

/* Weight-fetch seconds that land in forward window w (fwd) or backward window w (bwd) at
 * prefetch depth d. */
double plan_cost_wfetch_fwd(const plan_cost *c, int d, int w);
double plan_cost_wfetch_bwd(const plan_cost *c, int d, int w);

#endif
