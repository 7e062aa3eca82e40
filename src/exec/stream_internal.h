/* stream_internal.h - the layer-streaming executor's state and the functions its files
 * share (public API: strata/stream.h). The executor is five files, one concept each:
 *   stream_plan.c   the plan's defaults; the table of device allocations that both
 *                   st_stream_device_bytes and st_stream_exec_create read; create and free;
 *   stream_optim.c  the optimizer worker: its jobs, the gradient norm's chunk partials,
 *                   the speculative update's backups and rollback, accumulation adds;
 *   stream_head.c   the model's ends: the embedding forward and the generic head, whole
 *                   on the device or in vocabulary chunks (online softmax);
 *   stream_step.c   the schedule: st_stream_step_accum, st_stream_eval, block and weight fetches;
 *   stream_w16.c    the weights' bf16 copy that matmul bf16 on the CPU reads, kept by the optimizer.
 * The ordering rules between the step thread, the copy engine and the optimizer worker
 * are listed at the head of stream_step.c. Not installed: only these files include it. */
#ifndef STRATA_STREAM_INTERNAL_H
#define STRATA_STREAM_INTERNAL_H

#include <pthread.h>

#include "strata/prof.h"
#include "strata/store.h"
#include "strata/stream.h"
#include "strata/tier.h"

/* The copy engine's backend: the device's ops with the copies traced (stream_plan.c). */
typedef struct traced_be {
    st_backend base; /* first: the engine passes &base */
    st_backend_ops ops;
    st_backend *inner;
} traced_be;

/* block -1: the embedding and what follows the blocks. add: the gradient landed in the
 * micro-batch buffer, add it to the accumulated one first; final: the step's last
 * micro-batch (norm partials, speculative update). */
typedef struct opt_job { int block; uint64_t ticket; unsigned char add, final; } opt_job;

struct st_stream_exec {
    st_stream_config cfg;
    st_stream_plan plan;
    st_backend *dev;
    traced_be tbe;
    st_copy_engine *ce;
    const st_arch *arch; /* the model, as blocks (block.h) */
    const st_arch_layout *ly;
    st_blocks *dev_blocks;  /* the arch bound to the device: token ids, block scratch */
    st_blocks *host_blocks; /* ... and to the host (chunked vocabulary: the embedding runs there) */
    /* chunked classifier (plan.vocab_chunk > 0): the head's rows stay on the host and cross
     * in chunks of vocab_chunk rows, twice per step; the embedding runs on the host */
    int vocab_chunk, n_vocab_chunks;
    st_backend *host_be, *own_host_be;
    float *d_vocab_w, *d_vocab_g, *d_logits, *d_rmax, *d_tlogit;
    double *d_rsum;
    int32_t *d_tgt;
    /* the head and the residual stream's ends, on the device */
    float *d_emb_out, *d_dres, *d_xn, *d_dxn, *d_nstats, *d_losses;
    float *h_losses, *h_rmax, *h_tlogit; /* the row statistics, read back for the loss */
    double *h_rsum;
    float *h_enc, *h_dres;
    float *h_logits;          /* chunked classifier: every chunk's forward logits (N x V), so
                                 backward fetches them instead of recomputing the GEMM */
    uint64_t *vocab_w_ticket, vocab_g_ticket[2];
    int n_blocks, depth, n_slots, n_keep, n_off, has_rc;
    size_t n_params;       /* the flat vector's elements */
    size_t block_numel;    /* one block's parameters */
    size_t block_offset0;  /* block 0's first parameter */
    size_t emb_numel;      /* the embedding's parameters, before the blocks */
    size_t post_offset, post_numel; /* the device-resident part after the blocks (the norm, an untied head) */
    size_t resid_numel;    /* one residual-stream tensor: B x T x C */
    size_t act_set_floats; /* one block's activation set */
    size_t act_set_bytes;  /* ... as stored for the backward: 4 or (plan.act_dtype bf16) 2 an element */
    int act16;             /* plan.act_dtype bf16: sets stored rounded, computed in act_work */

    /* host tier */
    float *host_params, *host_grads;
    int host_params_registered, host_grads_registered; /* the caller's vectors page-locked by the device (host_register) */
    /* device-timed compute spans (stream_compute_*): marks, names, until the step's flush */
    struct stream_gspan {
        uint64_t m0, m1;
        const char *name;
        int index, cat;
    } *gspans;
    int n_gspans, cap_gspans;
    float *host_grads_micro;   /* gradient accumulation: micro-batches 2.. land here, then host_grads += it */
    float *grad_dest;          /* where this micro-batch's gradients land: host_grads or host_grads_micro */
    uint16_t *host_grads_bf16; /* bf16 drain: block gradients as drained (flat index) */
    int bf16;
    st_optim *opt;
    st_optim_segment *segs;
    float *backup_params, *backup_m, *backup_v; /* speculative backups, n_params each */
    unsigned char *host_acts;  /* offloaded activation sets, n_off x act_set_bytes */
    int *act_slot;             /* per block: its index among the kept or the offloaded blocks */

    /* device tier */
    float *d_pre_w, *d_post_w, *d_pre_g, *d_post_g, *d_outs, *d_w, *d_g;
    /* the stored activation sets (act_set_bytes each, fp32 or bf16): kept ones, the shared
     * recompute set, two offload slots; under bf16 every block computes in act_work (fp32) */
    unsigned char *d_keep, *d_recompute, *d_offload;
    float *d_act_work;
    uint16_t *d_g16; /* bf16 drain: two staging slots */

    uint64_t *w_ticket, *act_ticket, g_ticket[2], off_slot_ticket[2], embed_w_ticket;
    uint64_t h2d_bytes, d2h_bytes; /* submitted, cumulative */
    uint64_t h2d_act_bytes, d2h_act_bytes; /* of which offloaded activations */
    double wait_s;

    /* optimizer worker */
    pthread_t worker;
    int th_started;
    pthread_mutex_t mu;
    pthread_cond_t cv_job, cv_done;
    opt_job *jobs;
    int n_jobs, jobs_done, stop;
    int speculate; /* this step's jobs update (1) or only sum norms (0) */
    st_store *store; /* external optimizer: the disk state store */
    const void *store_blob;
    size_t store_blob_bytes;
    /* the disk state's update beside the backward (stream_step.c): a thread per step runs
     * st_store_step, each subgroup updated (clip scale 1) once its gradients have landed,
     * committed only when the step turns out neither clipped nor skipped */
    int store_spec;            /* this step's store update runs beside the backward */
    pthread_t store_th;
    size_t land_lo;            /* under mu: the blocks from land_lo up have their final gradient */
    int land_all;              /* under mu: every gradient has landed (the last job is done) */
    int store_cancel, store_gate; /* under mu: the step failed; -1 undecided, 0 abandon, 1 commit */
    st_store_step_args store_args;
    st_adamw_params store_hp;
    st_status store_status;
    st_err store_err;
    int external;
    int last_clipped; /* the previous step clipped or skipped (ST_STREAM_CLIP_AUTO defers) */
    st_adamw_params job_hp;
    size_t nchunks, landed_lo;
    double *chunk_part;
    unsigned char *chunk_done;
    st_status worker_status;
    st_err worker_err;

    /* a hook's base (cfg.hook: LoRA's frozen one, or POET-X's, st_stream_hook_grads): the hook's
     * gradients only, no gradient slot or host gradient of the arch's, no optimizer; dist_dloss
     * is the micro-batch's dloss */
    int hook_base;
    /* cfg.hook with frozen 0 (POET-X, strata/poetx.h): besides, the embedding's and head's gradients
     * formed on the device and handed to the hook's grad_at after each backward, the blocks' norms
     * and biases to grad_at by the block functions (no gradient slots) */
    int ends;
    int slots_warm; /* frozen: the last backward left blocks 0..depth (and head chunks 0, 1) in their slots */
    /* a hook holding the base's matmul weights (hook->held_block_bytes > 0: LoRA's or POET-X's
     * frozen_dtype bf16, int8): each weight slot (slot_bytes) is a held slab (block.h: the block's
     * 1-D tensors packed, held_runs copying them from the host slab) and, from held_at, the block's
     * held run, which the hook reads through hook->held */
    int held;
    size_t slot_bytes, held_at;
    struct held_run { size_t src, dst, n; } *held_runs; /* floats: from the host slab, into the slot */
    int n_held_runs;
    /* data parallel (st_stream_micro_grads): one micro-batch's gradient, no norm, no update */
    int dist_mode;
    float dist_dloss;
    void (*grad_hook)(void *ctx, size_t offset, size_t n); /* a block's gradient has landed */
    void *grad_hook_ctx;
    void (*weight_hook)(void *ctx, size_t offset, size_t n); /* weights about to be read */
    void *weight_hook_ctx;
    int fresh; /* the host weights changed (st_stream_params_changed): the device copies are sent again */
    /* packed documents (st_stream_set_docs): every micro-batch's positions and doc_start, the
     * caller's; docs_on: the blocks hold some (NULL, NULL is then set once to clear them) */
    const int32_t *doc_positions, *doc_start;
    st_row_loss_hook row_hook; /* st_stream_set_row_hook: each micro-batch's per-row losses */
    void *row_hook_ctx;
    int docs_on;
    /* the weights' bf16 copy for a device whose bf16 matmuls read one (stream_w16.c):
     * w16_valid: it equals host_params rounded; w16_on: this step maps and keeps it */
    uint16_t *w16;
    int w16_valid, w16_on, w16_failed;
};

/* Data parallel: the weights [lo, lo + n) are here before they are read (st_stream_micro_grads). */
static inline void stream_weights_at(st_stream_exec *x, size_t lo, size_t n) {
    if (x->weight_hook) x->weight_hook(x->weight_hook_ctx, lo, n);
}

static inline uint64_t h2d(st_stream_exec *x, void *dst, const void *src, size_t bytes) {
    x->h2d_bytes += bytes;
    return st_copy_h2d(x->ce, dst, src, bytes);
}

static inline uint64_t d2h(st_stream_exec *x, void *dst, const void *src, size_t bytes) {
    x->d2h_bytes += bytes;
    return st_copy_d2h(x->ce, dst, src, bytes);
}

/* Wait on the step thread; the wait (not the copy) is the exposed transfer time. */
static inline void wait_ticket(st_stream_exec *x, uint64_t t, const char *what, int index) {
    if (!t || st_copy_done(x->ce, t)) return;
    double t0 = st_now();
    st_prof_span s = st_prof_begin(ST_PROF_CAT_COPY, what, index);
    st_copy_wait(x->ce, t);
    st_prof_end(&s);
    x->wait_s += st_now() - t0;
}

/* The hook's layer (cfg.hook) before block l's forward, recompute or backward (slot: its weight
 * slot), and where the hook reads the layer's held weights (their copy in the slot). */
static inline void stream_hook_layer(st_stream_exec *x, int l, const float *slot) {
    if (!x->cfg.hook) return;
    x->cfg.hook->layer = l;
    if (x->held) x->cfg.hook->held = (const unsigned char *)slot + x->held_at;
}
/* After the blocks ran: the hook reads its own held weights again (the model's forward in memory). */
static inline void stream_hook_done(st_stream_exec *x) {
    if (x->cfg.hook) x->cfg.hook->held = NULL;
}

/* Where this micro-batch's gradients land (host_grads, or host_grads_micro for a later
 * micro-batch); resident (plan.resident): the device's gradient buffers are those host
 * vectors themselves. stream_step.c. */
void stream_bind_grads(st_stream_exec *x, float *dest);

/* stream_optim.c */
void *stream_opt_worker(void *arg);
void stream_push_job(st_stream_exec *x, int block, uint64_t ticket, int add, int final);
void stream_wait_jobs(st_stream_exec *x);
void stream_take_chunks(st_stream_exec *x, size_t lo, size_t hi);
double stream_chunks_total(const st_stream_exec *x);
void stream_restore_range(st_stream_exec *x, size_t lo, size_t hi);
st_status stream_update_segs(st_stream_exec *x, int s0, int s1, const st_adamw_params *hp, double sumsq, st_err *err);
void stream_add_range(st_stream_exec *x, size_t lo, size_t hi);

/* stream_w16.c: at a step's (or eval's) start: whether the copy is read this time (then it
 * is made valid, rounded whole if need be, and mapped); before a streamed block's compute:
 * its slot mapped; at the end: unmapped. Whoever writes host_params without writing the copy
 * sets w16_valid = 0; the optimizer's pass writes it where w16_on. */
int stream_w16_begin(st_stream_exec *x);
void stream_w16_block(st_stream_exec *x, const float *slot, int l);
void stream_w16_end(st_stream_exec *x);
void stream_w16_free(st_stream_exec *x);

/* stream_head.c */
uint64_t stream_embed_forward(st_stream_exec *x, const int32_t *inputs);
float stream_head_forward(st_stream_exec *x, const float *xin, const int32_t *targets, float dloss);
void stream_head_backward(st_stream_exec *x, const float *xin);
void stream_fetch_vchunk(st_stream_exec *x, int c);
/* A span of device work queued by the step thread: timed by the device's marks where it has
 * them (timer_mark: CUDA events, so the time is the device's, not the enqueueing's), else
 * by the host clock around it (the CPU backend computes when called). stream_step.c. */
typedef struct stream_tspan {
    st_prof_span sp;
    double t0;
    uint64_t m0; /* the device's mark before it; 0: host-timed */
} stream_tspan;
void stream_compute_begin(st_stream_exec *x, stream_tspan *t, st_prof_cat cat, const char *name, int index);
void stream_compute_end(st_stream_exec *x, stream_tspan *t, double *compute_s);
/* the device-timed spans since the last flush: their seconds added to *compute_s and drawn
 * on the trace's GPU track; returns how many there were */
int stream_compute_flush(st_stream_exec *x, double *compute_s);
float stream_chunked_head_forward(st_stream_exec *x, const float *xin, const int32_t *targets, double *compute_s);
void stream_chunked_head_backward(st_stream_exec *x, const float *xin, float dloss, double *compute_s);

#endif
