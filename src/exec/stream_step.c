/* stream_step.c - the layer-streaming executor's schedule (strata/stream.h draws it): one
 * step over its micro-batches (st_stream_step_accum), the forward alone (st_stream_eval), the
 * block fetches, and the embedding's and head's weights sent after each update.
 *
 * Three threads meet here: the step thread computes on the device, the copy engine's
 * worker moves bytes between host and device, and the optimizer worker updates blocks
 * on the host as their gradients land. They synchronise only through copy tickets and
 * the optimizer's job counter, so every ordering rule is visible at the call sites:
 *   - a weight slot is refilled only after the block that used it has finished;
 *   - a gradient slot is zeroed only after its previous drain's ticket completed;
 *   - an offloaded activation slot is rewritten only after its drain completed;
 *   - a block is updated only after its drain ticket, and host parameters are fetched
 *     again only for blocks whose update cannot have started (or after the step).
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>

#include "exec/stream_internal.h"
#include "strata/step.h"

/* ------------------------------------------------------------------ resident weights */

/* ------------------------------------------------------------------ placement
 * Where the schedule's weights and gradients are and what moves them: device slots filled
 * and drained by the copy engine, or, resident (plan.resident), the host vectors themselves,
 * where a fetch and a drain are nothing (ticket 0: done). The schedule below asks only
 * these functions. */

/* The embedding and head weights live on the device between steps: send them after
 * every change of the host copy (resident: they are the host copy). */
static void send_nonblock(st_stream_exec *x) {
    if (x->plan.resident) {
        x->embed_w_ticket = 0;
        return;
    }
    if (!x->vocab_chunk) h2d(x, x->d_pre_w, x->host_params, x->emb_numel * 4);
    x->embed_w_ticket = h2d(x, x->d_post_w, x->host_params + x->post_offset, x->post_numel * 4);
}

void st_stream_set_params(st_stream_exec *x, const float *host_params) {
    if (host_params != x->host_params) memcpy(x->host_params, host_params, x->n_params * 4); /* also: "I edited st_stream_params" */
    x->fresh = 0;
    x->w16_valid = 0;
    x->slots_warm = 0;
    send_nonblock(x);
    st_copy_wait(x->ce, x->embed_w_ticket);
}

void st_stream_init_random(st_stream_exec *x, uint64_t seed) {
    x->arch->ops->init(x->arch, x->host_params, seed); /* the values of the model's init_random */
    x->w16_valid = 0;
    x->slots_warm = 0;
    send_nonblock(x);
    st_copy_wait(x->ce, x->embed_w_ticket);
}

/* ------------------------------------------------------------------ compute timing
 * On a device that runs ops asynchronously (CUDA) the host's clock around a span measures
 * its enqueueing: the device's time lands in whatever waits next. There the device's marks
 * time each span (timer_mark before and after), read once per step (stream_compute_flush:
 * compute_s is the device's, and the trace draws each span on the GPU track at the time
 * the device ran it). */
enum { GSPAN_FLUSH = 1024 }; /* spans kept before a flush: the CUDA ring holds 4096 marks */

void stream_compute_begin(st_stream_exec *x, stream_tspan *t, st_prof_cat cat, const char *name, int index) {
    t->sp = st_prof_begin(cat, name, index);
    t->t0 = st_now();
    t->m0 = x->dev->ops->timer_mark && x->dev->ops->timer_seconds ? x->dev->ops->timer_mark(x->dev) : 0;
}

void stream_compute_end(st_stream_exec *x, stream_tspan *t, double *compute_s) {
    uint64_t m1 = t->m0 ? x->dev->ops->timer_mark(x->dev) : 0;
    st_prof_end(&t->sp);
    if (m1 && x->n_gspans == x->cap_gspans) {
        int cap = x->cap_gspans ? 2 * x->cap_gspans : 64;
        void *g = realloc(x->gspans, sizeof *x->gspans * (size_t)cap);
        if (g) x->gspans = g, x->cap_gspans = cap;
    }
    if (!m1 || x->n_gspans == x->cap_gspans) { /* no marks (or no room): the host's clock */
        *compute_s += st_now() - t->t0;
        return;
    }
    x->gspans[x->n_gspans++] = (struct stream_gspan){t->m0, m1, t->sp.name, t->sp.index, t->sp.cat};
    if (x->n_gspans >= GSPAN_FLUSH) stream_compute_flush(x, compute_s);
}

int stream_compute_flush(st_stream_exec *x, double *compute_s) {
    int n = x->n_gspans;
    if (!n) return 0;
    st_backend *dev = x->dev;
    /* the clocks' anchor: a mark behind the last span, waited for now, ran about now (the
     * compute stream has nothing else queued) */
    uint64_t anchor = dev->ops->timer_mark(dev);
    double last = anchor ? dev->ops->timer_seconds(dev, x->gspans[n - 1].m1, anchor) : -1;
    uint64_t now_ns = st_prof_now_ns();
    int trace = st_prof_trace_active() && last >= 0;
    for (int i = 0; i < n; i++) {
        const struct stream_gspan *g = &x->gspans[i];
        double d = dev->ops->timer_seconds(dev, g->m0, g->m1);
        if (d < 0) continue;
        *compute_s += d;
        if (trace) {
            double before = dev->ops->timer_seconds(dev, g->m1, anchor); /* from the span's end to the anchor */
            if (before < 0) continue;
            uint64_t t1 = now_ns - (uint64_t)(before * 1e9), t0 = t1 - (uint64_t)(d * 1e9);
            st_prof_span_gpu((st_prof_cat)g->cat, g->name, g->index, t0, t1);
        }
    }
    x->n_gspans = 0;
    return n;
}

/* ------------------------------------------------------------------ the step */

/* The disk state store's views (st_store_step_args): it reads the gradients and updates the
 * parameters in place. */
static void *ext_work_at(void *ctx, size_t first, size_t n) {
    (void)n;
    return ((st_stream_exec *)ctx)->host_params + first;
}
/* The gradients as they landed: fp32, or with a bf16 drain the blocks' as bf16. */
static st_dtype ext_grad_dtype_of(void *ctx, size_t i) {
    st_stream_exec *x = ctx;
    return x->bf16 && i >= x->block_offset0 && i < x->post_offset ? ST_BF16 : ST_F32;
}
static const void *ext_grads_as(void *ctx, size_t first, size_t n, st_dtype dt) {
    st_stream_exec *x = ctx;
    (void)n;
    return dt == ST_BF16 ? (const void *)(x->host_grads_bf16 + first) : (const void *)(x->host_grads + first);
}
/* The update beside the backward: a subgroup waits for its gradients (the blocks land from
 * the last to the first, the embedding's and the head's with the last job), the subgroups
 * go in that order, and the commit waits for the step's verdict. */
static st_status store_wait(void *ctx, size_t first, size_t n, st_err *err) {
    st_stream_exec *x = ctx;
    pthread_mutex_lock(&x->mu);
    while (!x->store_cancel && !x->land_all && !(first >= x->land_lo && first + n <= x->post_offset))
        pthread_cond_wait(&x->cv_done, &x->mu);
    int cancel = x->store_cancel;
    pthread_mutex_unlock(&x->mu);
    return cancel ? st_errf(err, ST_ERR_INVALID, "stream: the step stopped before its gradients landed; its "
                            "disk-state update was abandoned (the store holds the previous step)")
                  : ST_OK;
}
double st_stream_store_order(size_t first, size_t end, size_t blocks_first, size_t blocks_end) {
    if (first >= blocks_first && end <= blocks_end) return -(double)end;
    return (double)first; /* with the embedding's or the head's gradient: after every block */
}
static double store_order(void *ctx, size_t first, size_t end) {
    st_stream_exec *x = ctx;
    return st_stream_store_order(first, end, x->block_offset0, x->post_offset);
}
static int store_commit(void *ctx) {
    st_stream_exec *x = ctx;
    pthread_mutex_lock(&x->mu);
    while (x->store_gate < 0 && !x->store_cancel) pthread_cond_wait(&x->cv_done, &x->mu);
    int commit = x->store_gate == 1 && !x->store_cancel;
    pthread_mutex_unlock(&x->mu);
    return commit;
}
static void *store_thread(void *arg) {
    st_stream_exec *x = arg;
    omp_set_num_threads(x->plan.optim_threads > 0 ? x->plan.optim_threads : 1); /* beside the compute */
    st_prof_thread_name("state store");
    x->store_status = st_store_step(x->store, &x->store_args, &x->store_hp, &x->store_err);
    return NULL;
}
/* The verdict (1 commit, 0 abandon, -1 the step failed) and the thread's end: its status. */
static st_status store_finish(st_stream_exec *x, int verdict, st_err *err) {
    pthread_mutex_lock(&x->mu);
    if (verdict < 0) x->store_cancel = 1;
    else x->store_gate = verdict;
    pthread_cond_broadcast(&x->cv_done);
    pthread_mutex_unlock(&x->mu);
    pthread_join(x->store_th, NULL);
    x->store_spec = 0;
    if (x->store_status && verdict >= 0) *err = x->store_err;
    return verdict >= 0 ? x->store_status : ST_OK;
}
static st_store_step_args store_args(st_stream_exec *x, double ss) {
    return (st_store_step_args){.grad_dtype_of = ext_grad_dtype_of, .grads_as = ext_grads_as,
                                .work = ext_work_at, .work_dtype = ST_F32, .ctx = x, .grad_sumsq = ss,
                                .blob = x->store_blob, .blob_bytes = x->store_blob_bytes};
}

static float *wslot(st_stream_exec *x, int l) {
    if (x->plan.resident) return x->d_w + (size_t)l * x->block_numel;
    return (float *)(void *)((unsigned char *)x->d_w + (size_t)(l % x->n_slots) * x->slot_bytes);
}
/* Block l's gradient buffer: a device slot (two, alternating), or resident its place in
 * this micro-batch's host gradient. */
static float *gslot(st_stream_exec *x, int l) {
    return x->plan.resident ? x->grad_dest + x->block_offset0 + (size_t)l * x->block_numel
                            : x->d_g + (size_t)(l % 2) * x->block_numel;
}
void stream_bind_grads(st_stream_exec *x, float *dest) {
    x->grad_dest = dest;
    if (!x->plan.resident) return;
    x->d_pre_g = dest;
    x->d_post_g = dest + x->post_offset;
}
/* A device buffer's bytes to the host gradient (resident: already there). */
static uint64_t drain(st_stream_exec *x, float *dst, const float *src, size_t n) {
    return x->plan.resident ? 0 : d2h(x, dst, src, n * 4);
}
static const float *block_in(st_stream_exec *x, int l) {
    return l == 0 ? x->d_emb_out : x->d_outs + (size_t)(l - 1) * x->resid_numel;
}
static float *block_out(st_stream_exec *x, int l) { return x->d_outs + (size_t)l * x->resid_numel; }
static uint64_t fetch_block(st_stream_exec *x, int l) {
    stream_weights_at(x, x->block_offset0 + (size_t)l * x->block_numel, x->block_numel);
    if (x->plan.resident) return 0;
    const float *host = x->host_params + x->block_offset0 + (size_t)l * x->block_numel;
    if (!x->held) return h2d(x, wslot(x, l), host, x->block_numel * 4);
    /* a held slab: the 1-D tensors (not the matmul weights' fp32, given back), then the held run;
     * the copies complete in order, so the last one's ticket is the block's */
    float *slot = wslot(x, l);
    st_linear_hook *hk = x->cfg.hook;
    for (int i = 0; i < x->n_held_runs; i++)
        h2d(x, slot + x->held_runs[i].dst, host + x->held_runs[i].src, x->held_runs[i].n * 4);
    return h2d(x, (unsigned char *)slot + x->held_at, hk->held_host(hk, l), hk->held_block_bytes);
}

/* Where block l's activations are stored for its backward (offloaded: slot ord % 2), fp32
 * or bf16 (act_set_bytes each). */
static void *block_acts(st_stream_exec *x, int l) {
    switch (x->plan.act[l]) {
    case ST_STREAM_ACT_KEEP: return x->d_keep + (size_t)x->act_slot[l] * x->act_set_bytes;
    case ST_STREAM_ACT_OFFLOAD: return x->d_offload + (size_t)(x->act_slot[l] % 2) * x->act_set_bytes;
    default: return x->d_recompute;
    }
}
/* The fp32 set block l's forward writes and its backward reads: the stored one, or under
 * bf16 the working set (widened from the stored one, from_bf16, before the backward). */
static float *block_set(st_stream_exec *x, int l) { return x->act16 ? x->d_act_work : (float *)block_acts(x, l); }

void st_stream_set_row_hook(st_stream_exec *x, st_row_loss_hook hook, void *ctx) {
    x->row_hook = hook;
    x->row_hook_ctx = ctx;
}

const float *st_stream_row_losses(const st_stream_exec *x) { return x->h_losses; }

void st_stream_set_docs(st_stream_exec *x, const int32_t *positions_all, const int32_t *doc_start_all) {
    x->doc_positions = positions_all;
    x->doc_start = doc_start_all;
}

/* Micro-batch mb's documents onto the blocks (the host's too: a chunked vocabulary's
 * embedding runs there); none set and none held: nothing to do (today's calls). */
static st_status docs_apply(st_stream_exec *x, int mb, st_err *err) {
    if (!x->doc_positions && !x->doc_start && !x->docs_on) return ST_OK;
    size_t N = (size_t)x->cfg.B * x->cfg.T;
    const int32_t *pos = x->doc_positions ? x->doc_positions + (size_t)mb * N : NULL;
    const int32_t *ds = x->doc_start ? x->doc_start + (size_t)mb * N : NULL;
    st_status s = st_blocks_set_docs(x->dev_blocks, pos, ds, err);
    if (!s && x->host_blocks) s = st_blocks_set_docs(x->host_blocks, pos, ds, err);
    if (s) return st_err_prefix(err, "stream: micro-batch %d's documents", mb);
    x->docs_on = pos || ds;
    return ST_OK;
}

st_status st_stream_step(st_stream_exec *x, const int32_t *inputs, const int32_t *targets, const st_adamw_params *hp,
                      float max_norm, st_stream_step_stats *stats, st_err *err) {
    return st_stream_step_accum(x, 1, inputs, targets, hp, max_norm, stats, err);
}

/* One step of st_stream_step_accum across its phases: what the step's schedule decided at its
 * start (overlap, speculation), what carries from one micro-batch to the next, and its time. */
typedef struct step_run {
    st_stream_exec *x;
    int n_micro, N;
    int overlap;           /* the optimizer worker takes each block's gradient as it lands */
    int speculate;         /* the blocks updated in RAM before the norm is known (fp32 states) */
    int store_spec;        /* the disk state updated beside the backward, committed after it */
    float dloss;           /* 1 / the step's targets >= 0 (the ranks': all of theirs) */
    long n_targets;
    double loss_sum;       /* the micro-batches' losses, as st_step_micro_loss sums them */
    double compute_s;      /* the device's compute (CUDA events where the backend has them) */
    uint64_t last;         /* the ticket of the micro-batch's last drain */
    int rc_holds;          /* the block whose activations the recompute set holds (-1: none) */
    st_status docs_st;     /* a later micro-batch's documents refused (checked at the start) */
    st_err docs_err;
} step_run;

/* stmt timed as the device's compute, into r->compute_s, and drawn in the trace. */
#define COMPUTE_(cat, name, idx, stmt)                     \
    do {                                                   \
        stream_tspan ts_;                                  \
        stream_compute_begin(r->x, &ts_, cat, name, idx);  \
        stmt;                                              \
        stream_compute_end(r->x, &ts_, &r->compute_s);     \
    } while (0)

/* The step's start: its schedule chosen (overlap, speculation), the micro-batches' documents
 * checked, the optimizer worker's jobs reset and, beside the backward, the store's thread
 * started; the step's dloss. */
static st_status step_begin(step_run *r, const int32_t *targets_all, const st_adamw_params *hp, st_err *err) {
    st_stream_exec *x = r->x;
    int n_micro = r->n_micro;
    /* this step's optimizer jobs (a frozen base has none: overlap is off there) */
    r->overlap = x->plan.overlap_optim;
    /* the clip policy allows an update before the norm is known (in RAM, or the disk state's) */
    int spec_ok = r->overlap && !x->dist_mode &&
                  (x->plan.clip == ST_STREAM_CLIP_SPECULATE || (x->plan.clip == ST_STREAM_CLIP_AUTO && !x->last_clipped));
    r->speculate = spec_ok && !x->external && x->cfg.state_format == ST_OPTIM_STATE_F32;
    r->store_spec = spec_ok && x->cfg.store_beside && x->store && !st_store_in_place(x->store);
    if (x->external && !x->store && !x->dist_mode)
        return st_errf(err, ST_ERR_INVALID, "stream: external optimizer but no state store attached");
    if (n_micro < 1 || (n_micro > 1 && !x->host_grads_micro))
        return st_errf(err, ST_ERR_INVALID, "stream: %d micro-batches in a step; the executor was made for %d "
                       "(st_stream_config.grad_accum)", n_micro, x->cfg.grad_accum > 1 ? x->cfg.grad_accum : 1);
    /* every micro-batch's documents checked (and their device buffers made) before anything
     * starts; the loop sets each again before its forward, which then cannot fail */
    for (int mb = n_micro - 1; mb >= 0; mb--) {
        st_status ds = docs_apply(x, mb, err);
        if (ds) return ds;
    }
    pthread_mutex_lock(&x->mu);
    x->n_jobs = x->jobs_done = 0;
    x->speculate = r->speculate;
    x->job_hp = *hp;
    x->job_hp.grad_scale = 1.0f;
    x->landed_lo = x->n_params;
    x->worker_status = ST_OK;
    x->land_lo = x->n_params;
    x->land_all = x->store_cancel = 0;
    x->store_gate = -1;
    pthread_mutex_unlock(&x->mu);
    if (r->store_spec) { /* reads start during the forward; updates as the backward's gradients land */
        x->store_hp = *hp;
        x->store_hp.grad_scale = 1.0f;
        x->store_args = store_args(x, 0.0);
        x->store_args.wait = store_wait;
        x->store_args.order_key = store_order;
        x->store_args.commit = store_commit;
        x->store_status = ST_OK;
        x->store_spec = pthread_create(&x->store_th, NULL, store_thread, x) == 0; /* else: after backward */
    }
    memset(x->chunk_done, 0, x->nchunks);
    stream_w16_begin(x); /* the weights' bf16 copy, where the matmuls read one */
    /* the step's loss is the mean over all its targets >= 0 (strata/step.h) */
    r->dloss = st_step_dloss(targets_all, (size_t)r->N * n_micro, &r->n_targets);
    if (x->dist_mode || x->hook_base) r->dloss = x->dist_dloss; /* the step's, over every rank's targets, or
                                                                 over the caller's micro-batches */
    return ST_OK;
}

/* Micro-batch mb's forward: the embedding, every block (weights fetched depth ahead,
 * activations kept, offloaded or left to recompute), and the head with its backward. */
static float micro_forward(step_run *r, int mb, const int32_t *inputs, const int32_t *targets) {
    st_stream_exec *x = r->x;
    const st_arch_ops *ao = x->arch->ops;
    st_backend *dev = x->dev;
    int L = x->n_blocks, D = x->depth;
    size_t N = (size_t)r->N;
    st_prof_span fw = st_prof_begin(ST_PROF_CAT_COMPUTE, "forward", -1);
    /* the micro-batch's ids in one traced copy: the targets, and the inputs where the
     * embedding runs on the device (a chunked vocabulary's runs on the host) */
    st_prof_span tc = st_prof_begin(ST_PROF_CAT_COPY, "copy h2d tokens", -1);
    dev->ops->copy_to_device(dev, x->d_tgt, targets, sizeof(int32_t) * N);
    if (!x->vocab_chunk) dev->ops->copy_to_device(dev, ao->token_ids(x->dev_blocks), inputs, sizeof(int32_t) * N);
    st_prof_end_bytes(&tc, (int64_t)(sizeof(int32_t) * N * (x->vocab_chunk ? 1 : 2)));
    stream_weights_at(x, 0, x->block_offset0);
    if (x->fresh && !x->vocab_chunk && !x->plan.resident)
        x->embed_w_ticket = h2d(x, x->d_pre_w, x->host_params, x->emb_numel * 4); /* the ranks' update */
    uint64_t enc_ticket = x->vocab_chunk ? stream_embed_forward(x, inputs) : 0;
    /* after a micro-batch's backward, blocks 0..depth (and head chunks 0, 1) are still in
     * their slots, and the weights do not change until the update (a frozen base's never: its
     * next call finds them there, unless an eval or new weights came between) */
    int first = mb == 0 && !(x->hook_base && x->slots_warm);
    x->slots_warm = 0;
    if (first) {
        for (int l = 0; l <= D && l < L; l++) x->w_ticket[l] = fetch_block(x, l);
        if (x->vocab_chunk && L <= D + 1) {
            for (int c = 0; c < 2 && c < x->n_vocab_chunks; c++) stream_fetch_vchunk(x, c);
        }
    }
    COMPUTE_(ST_PROF_CAT_COMPUTE, "zero grads", -1, {
        if (!x->vocab_chunk && (!x->hook_base || x->ends)) dev->ops->memset0(dev, x->d_pre_g, x->emb_numel * 4);
        /* frozen: the final norm's dropped gradient only */
        dev->ops->memset0(dev, x->d_post_g, (x->hook_base && !x->ends ? x->ly->norm_numel : x->post_numel) * 4);
    });
    wait_ticket(x, x->embed_w_ticket, "wait embed weights", -1);
    if (x->vocab_chunk) wait_ticket(x, enc_ticket, "wait embedding", -1);
    else COMPUTE_(ST_PROF_CAT_COMPUTE, "embedding", -1, stream_embed_forward(x, NULL)); /* the ids are there */
    x->off_slot_ticket[0] = x->off_slot_ticket[1] = 0;
    r->rc_holds = -1;
    for (int l = 0; l < L; l++) {
        wait_ticket(x, x->w_ticket[l], "wait weights", l);
        int off = x->plan.act[l] == ST_STREAM_ACT_OFFLOAD, k = x->act_slot[l];
        if (off) wait_ticket(x, x->off_slot_ticket[k % 2], "wait act slot", l);
        float *a = block_set(x, l);
        stream_w16_block(x, wslot(x, l), l);
        stream_hook_layer(x, l, wslot(x, l));
        COMPUTE_(ST_PROF_CAT_COMPUTE, "forward block", l, ao->block_forward(x->dev_blocks, wslot(x, l), block_in(x, l), a, block_out(x, l)));
        if (x->act16) /* stored rounded: what every kind of block's backward reads */
            COMPUTE_(ST_PROF_CAT_COMPUTE, "acts to bf16", l, dev->ops->to_bf16(dev, block_acts(x, l), a, x->act_set_floats));
        if (x->plan.act[l] == ST_STREAM_ACT_RECOMPUTE) r->rc_holds = l;
        if (l + D + 1 < L) {
            x->w_ticket[l + D + 1] = fetch_block(x, l + D + 1);
            /* the classifier's first chunks queue behind the last block */
            if (x->vocab_chunk && l + D + 1 == L - 1 && first)
                for (int c = 0; c < 2 && c < x->n_vocab_chunks; c++) stream_fetch_vchunk(x, c);
        }
        /* the last two offloaded blocks stay resident until their backward */
        if (off && k < x->n_off - 2) {
            x->d2h_act_bytes += x->act_set_bytes;
            x->off_slot_ticket[k % 2] = d2h(x, x->host_acts + (size_t)k * x->act_set_bytes, block_acts(x, l), x->act_set_bytes);
        }
    }
    float loss;
    if (x->fresh) { /* the rest (the norm, an untied head), once the ranks' gather has brought it */
        stream_weights_at(x, x->post_offset, x->n_params - x->post_offset);
        if (!x->plan.resident)
            wait_ticket(x, h2d(x, x->d_post_w, x->host_params + x->post_offset, x->post_numel * 4), "wait head weights", -1);
        x->fresh = 0;
    }
    if (x->vocab_chunk) loss = stream_chunked_head_forward(x, block_out(x, L - 1), targets, &r->compute_s);
    else COMPUTE_(ST_PROF_CAT_COMPUTE, "classifier", -1, loss = stream_head_forward(x, block_out(x, L - 1), targets, r->dloss));
    st_prof_end(&fw);
    return loss;
}

/* A hook that trains the ends (x->ends): the gradients of the tensors outside the blocks (the
 * embedding's and the head's device buffers) copied where its grad_at says, tensor by tensor.
 * A chunked vocabulary's device holds the final norm's only: the embedding's were formed on the
 * host and the head's handed chunk by chunk, both into grad_at already. */
static void hand_ends(st_stream_exec *x) {
    st_linear_hook *hk = x->cfg.hook;
    const st_arch_layout *y = x->ly;
    for (int i = 0; i < y->n_tensors; i++) {
        const st_param_info *t = &y->tensors[i];
        if (t->offset >= x->block_offset0 && t->offset < x->post_offset) continue; /* a block's: grad_at already */
        if (x->vocab_chunk && (t->offset < x->block_offset0 || t->offset >= x->post_offset + x->post_numel)) continue;
        float *dst = hk->grad_at(hk, -1, t->offset);
        if (!dst) continue;
        const float *src = t->offset < x->block_offset0 ? x->d_pre_g + t->offset : x->d_post_g + (t->offset - x->post_offset);
        x->dev->ops->copy_to_host(x->dev, dst, src, t->numel * 4);
    }
}

/* A chunked vocabulary's embedding backward: the residual gradient goes to the host, which
 * scatters it into eg, the embedding's gradient in the arch's layout (the arch's vector, or the
 * hook's: st_stream_exec_create checked that grad_at keeps them so). A tied head's gradient
 * (its chunks landed first: waited for) is already in eg's first V rows, the rest starts from
 * zero: the head's gradient, then the scatter added, as the resident head's order. */
static void embed_backward_host(st_stream_exec *x, float *eg, const float *dres) {
    size_t V = (size_t)x->ly->vocab_size, C = (size_t)x->ly->n_embd;
    wait_ticket(x, d2h(x, x->h_dres, dres, x->resid_numel * 4), "wait residual grad", -1);
    for (int i = 0; i < 2; i++) wait_ticket(x, x->vocab_g_ticket[i], "wait head grads", -1);
    st_prof_span e = st_prof_begin(ST_PROF_CAT_OTHER, "backward embed (host)", -1);
    size_t z0 = x->ly->tied ? V * C : 0;
    memset(eg + z0, 0, (x->emb_numel - z0) * 4);
    x->arch->ops->embed_backward(x->host_blocks, eg, x->h_dres);
    st_prof_end(&e);
}

/* Micro-batch mb's backward: every block from the last (recomputed where the plan says, its
 * gradient drained as it completes and, overlapped, handed to the optimizer worker), then the
 * embedding; r->last the last drain's ticket. */
static void micro_backward(step_run *r, int add, int final) {
    st_stream_exec *x = r->x;
    const st_arch_ops *ao = x->arch->ops;
    st_backend *dev = x->dev;
    int L = x->n_blocks, D = x->depth;
    float *dres = x->d_dres;
    st_prof_span bw = st_prof_begin(ST_PROF_CAT_COMPUTE, "backward", -1);
    /* the head's backward (the forward left dlogits) */
    if (x->vocab_chunk) stream_chunked_head_backward(x, block_out(x, L - 1), r->dloss, &r->compute_s);
    else COMPUTE_(ST_PROF_CAT_COMPUTE, "classifier backward", -1, stream_head_backward(x, block_out(x, L - 1)));
    x->g_ticket[0] = x->g_ticket[1] = 0;
    for (int l = L - 1; l >= 0; l--) {
        wait_ticket(x, x->w_ticket[l], "wait weights", l);
        int act = x->plan.act[l], k = x->act_slot[l];
        float *a = block_set(x, l);
        /* the last recomputed block's forward is still in the set: nothing to redo */
        stream_w16_block(x, wslot(x, l), l);
        stream_hook_layer(x, l, wslot(x, l));
        if (act == ST_STREAM_ACT_RECOMPUTE && r->rc_holds != l) {
            COMPUTE_(ST_PROF_CAT_RECOMPUTE, "recompute block", l, {
                ao->block_forward(x->dev_blocks, wslot(x, l), block_in(x, l), a, block_out(x, l));
                if (x->act16) dev->ops->to_bf16(dev, block_acts(x, l), a, x->act_set_floats); /* the forward's rounding */
            });
            r->rc_holds = l;
        }
        if (act == ST_STREAM_ACT_OFFLOAD && k < x->n_off - 2) wait_ticket(x, x->act_ticket[k], "wait acts", l);
        if (x->act16) /* the backward reads the stored bits, whichever way they were kept */
            COMPUTE_(ST_PROF_CAT_COMPUTE, "acts from bf16", l, dev->ops->from_bf16(dev, a, block_acts(x, l), x->act_set_floats));
        if (x->hook_base) { /* the hook's gradients only (its own vector: grad_at), dres through the block */
            COMPUTE_(ST_PROF_CAT_COMPUTE, "backward block", l,
                     ao->block_backward(x->dev_blocks, wslot(x, l), NULL, block_in(x, l), a, dres));
        } else {
            float *g = gslot(x, l);
            wait_ticket(x, x->g_ticket[l % 2], "wait grad slot", l);
            COMPUTE_(ST_PROF_CAT_COMPUTE, "backward block", l, {
                dev->ops->memset0(dev, g, x->block_numel * 4);
                ao->block_backward(x->dev_blocks, wslot(x, l), g, block_in(x, l), a, dres);
            });
            if (x->bf16) {
                /* round on the device (on the CPU backend its memory is addressable; CUDA: a
                 * kernel), drain half the bytes; the optimizer reads bf16 gradients natively */
                uint16_t *g16 = x->d_g16 + (size_t)(l % 2) * x->block_numel;
                COMPUTE_(ST_PROF_CAT_COMPUTE, "grad to bf16", l, dev->ops->to_bf16(dev, g16, g, x->block_numel));
                x->g_ticket[l % 2] = d2h(x, x->host_grads_bf16 + x->block_offset0 + (size_t)l * x->block_numel, g16, x->block_numel * 2);
            } else {
                x->g_ticket[l % 2] = drain(x, x->grad_dest + x->block_offset0 + (size_t)l * x->block_numel, g, x->block_numel);
            }
            if (r->overlap && (add || final)) stream_push_job(x, l, x->g_ticket[l % 2], add, final);
        }
        if (l - D - 1 >= 0) x->w_ticket[l - D - 1] = fetch_block(x, l - D - 1);
        if (act == ST_STREAM_ACT_OFFLOAD && k - 2 >= 0) {
            x->h2d_act_bytes += x->act_set_bytes;
            x->act_ticket[k - 2] = h2d(x, x->d_offload + (size_t)(k % 2) * x->act_set_bytes,
                                       x->host_acts + (size_t)(k - 2) * x->act_set_bytes, x->act_set_bytes);
        }
    }
    if (x->hook_base) {
        r->last = 0; /* a frozen embedding: nothing formed, nothing drained */
        if (x->ends && x->vocab_chunk) { /* the embedding's on the host, the head's landed: both the hook's */
            float *eg = x->cfg.hook->grad_at(x->cfg.hook, -1, 0);
            if (eg) embed_backward_host(x, eg, dres);
            for (int i = 0; i < 2; i++) wait_ticket(x, x->vocab_g_ticket[i], "wait head grads", -1);
            hand_ends(x); /* the final norm's */
        } else if (x->ends) { /* the hook's: the embedding's, the final norm's and the head's into its grad_at */
            COMPUTE_(ST_PROF_CAT_COMPUTE, "embedding backward", -1, ao->embed_backward(x->dev_blocks, x->d_pre_g, dres));
            hand_ends(x);
        }
    } else if (x->vocab_chunk) {
        embed_backward_host(x, x->grad_dest, dres);
    } else {
        COMPUTE_(ST_PROF_CAT_COMPUTE, "embedding backward", -1, ao->embed_backward(x->dev_blocks, x->d_pre_g, dres));
        drain(x, x->grad_dest, x->d_pre_g, x->emb_numel);
    }
    if (!x->hook_base) r->last = drain(x, x->grad_dest + x->post_offset, x->d_post_g, x->post_numel);
    else x->slots_warm = 1; /* blocks 0..depth and head chunks 0, 1 in their slots for the next call */
    st_prof_end(&bw);
}

/* A later micro-batch's gradient added into the step's: handed to the worker with its last
 * drain (overlapped), or summed on the step thread over every core. */
static void micro_accumulate(step_run *r, int mb, int add, int final) {
    st_stream_exec *x = r->x;
    if (!final && add && r->overlap) stream_push_job(x, -1, r->last, 1, 0);
    if (add && !r->overlap) { /* on the step thread, every core */
        wait_ticket(x, r->last, "wait grads", -1);
        st_prof_span ap = st_prof_begin(ST_PROF_CAT_OPTIM, "accumulate", mb);
        const size_t piece = 1u << 18;
        long np = (long)((x->n_params + piece - 1) / piece);
#pragma omp parallel for schedule(static)
        for (long i = 0; i < np; i++) {
            size_t a0 = (size_t)i * piece, e = a0 + piece < x->n_params ? a0 + piece : x->n_params;
            stream_add_range(x, a0, e);
        }
        st_prof_end(&ap);
    }
}

/* Micro-batches: each one's gradient is computed fresh (device slots and the embedding's and
 * head's gradients zeroed), the first lands in host_grads, the later ones in
 * host_grads_micro and are added to host_grads block by block as they land, in micro-batch
 * order: the one accumulation rule of every executor (see stream.h). */
static void step_micro_batches(step_run *r, const int32_t *inputs_all, const int32_t *targets_all) {
    st_stream_exec *x = r->x;
    int n_micro = r->n_micro, N = r->N;
    for (int mb = 0; mb < n_micro; mb++) {
        const int32_t *inputs = inputs_all + (size_t)mb * N, *targets = targets_all + (size_t)mb * N;
        int add = mb > 0, final = mb == n_micro - 1;
        if (add && r->overlap) { /* host_grads_micro is rewritten below: the previous micro-batch's adds are done */
            stream_wait_jobs(x);
            pthread_mutex_lock(&x->mu);
            x->n_jobs = x->jobs_done = 0;
            pthread_mutex_unlock(&x->mu);
        }
        stream_bind_grads(x, add ? x->host_grads_micro : x->host_grads);
        /* the previous micro-batch's drains (device gradient slots, the embedding's and head's
         * gradients) have left the device before anything rewrites them (in-order engine) */
        wait_ticket(x, r->last, "wait previous micro-batch", mb);
        if (mb > 0 && !r->docs_st) r->docs_st = docs_apply(x, mb, &r->docs_err); /* mb 0's: set in step_begin */
        float loss = micro_forward(r, mb, inputs, targets);
        if (x->row_hook) x->row_hook(x->row_hook_ctx, mb, x->h_losses, targets, (size_t)N);
        micro_backward(r, add, final);
        r->loss_sum += st_step_micro_loss(loss, targets, (size_t)N, n_micro, r->n_targets);
        micro_accumulate(r, mb, add, final);
    }
}

/* The ranks' step: every block's gradient landed and handed over, the rest with the last copy;
 * the ranks' step reduces and updates. */
static st_status update_dist(step_run *r, st_err *err) {
    st_stream_exec *x = r->x;
    st_status s = ST_OK;
    if (r->overlap) {
        stream_wait_jobs(x);
        if (x->worker_status) { *err = x->worker_err; s = x->worker_status; }
    }
    wait_ticket(x, r->last, "wait grads", -1);
    if (!r->overlap && x->grad_hook)
        for (int l = x->n_blocks - 1; l >= 0; l--) x->grad_hook(x->grad_hook_ctx, x->block_offset0 + (size_t)l * x->block_numel, x->block_numel);
    return s;
}

/* The disk tier: the update and its commit, through the store (beside the backward: commit it,
 * or abandon it and redo it with the clip scale). */
static st_status update_store(step_run *r, const st_adamw_params *hp, float max_norm, double ss, double norm,
                              st_stream_step_stats *stats, st_err *err) {
    st_stream_exec *x = r->x;
    st_status s = ST_OK;
    x->w16_valid = 0; /* the store writes the weights, not their bf16 copy */
    if (x->store_spec) { /* updated beside the backward with clip scale 1: commit it, or not */
        stats->store_beside = 1;
        int commit = !stats->skipped && !stats->clipped;
        st_prof_span w = st_prof_begin(ST_PROF_CAT_OPTIM, commit ? "wait state commit" : "abandon state step", -1);
        s = store_finish(x, commit, err);
        st_prof_end(&w);
        if (s) return s;
        if (commit) {
            send_nonblock(x);
            return ST_OK;
        }
        stats->rolled_back = 1; /* nothing committed; the host weights hold the speculation */
        if (stats->skipped) {
            st_prof_span rb = st_prof_begin(ST_PROF_CAT_OPTIM, "rollback", -1);
            s = st_store_read_master(x->store, x->host_params, err);
            st_prof_end(&rb);
            return s;
        }
    }
    if (!stats->skipped) { /* redone with the clip scale: every host weight rewritten */
        st_adamw_params h = *hp;
        h.grad_scale = stats->clipped ? (float)(max_norm / norm) : 1.0f;
        st_store_step_args sa = store_args(x, ss);
        st_prof_span u = st_prof_begin(ST_PROF_CAT_OPTIM, "optimizer (disk state)", -1);
        s = st_store_step(x->store, &sa, &h, err);
        st_prof_end(&u);
        if (!s) send_nonblock(x);
    }
    return s;
}

/* The state in RAM: where the blocks were updated speculatively, kept (the embedding and
 * ln_f then updated with the true sum) or rolled back and redone with the clip scale. */
static st_status update_ram(step_run *r, const st_adamw_params *hp, float max_norm, double ss, double norm,
                            st_stream_step_stats *stats, st_err *err) {
    st_stream_exec *x = r->x;
    st_status s = ST_OK;
    int need_update = !r->speculate;
    if (r->speculate && (stats->skipped || stats->clipped)) {
        /* only the blocks were updated speculatively */
        st_prof_span rb = st_prof_begin(ST_PROF_CAT_OPTIM, "rollback", -1);
        stream_restore_range(x, x->block_offset0, x->post_offset);
        st_prof_end(&rb);
        stats->rolled_back = 1;
        need_update = 1;
    } else if (r->speculate && !stats->skipped) {
        /* not clipped: the blocks are done; the embedding and ln_f, with the true sum */
        st_adamw_params h = *hp;
        h.grad_scale = 1.0f;
        int nt = x->ly->n_tensors;
        st_prof_span u = st_prof_begin(ST_PROF_CAT_OPTIM, "optim embed+head", -1);
        s = stream_update_segs(x, 0, x->ly->n_pre_tensors, &h, ss, err);
        if (!s) s = stream_update_segs(x, nt - x->ly->n_post_tensors, nt, &h, ss, err);
        st_prof_end(&u);
        if (s) { /* never half a step: the blocks' speculative updates go too */
            stream_restore_range(x, x->block_offset0, x->post_offset);
            return s;
        }
    }
    if (need_update && !stats->skipped) {
        st_adamw_params h = *hp;
        h.grad_scale = stats->clipped ? (float)(max_norm / norm) : 1.0f;
        st_prof_span u = st_prof_begin(ST_PROF_CAT_OPTIM, "optimizer", -1);
        s = stream_update_segs(x, 0, x->ly->n_tensors, &h, ss, err);
        st_prof_end(&u);
        if (s) return s;
    }
    if (!stats->skipped) send_nonblock(x);
    return ST_OK;
}

/* Norm, clip and update, once every micro-batch's gradient has landed: the ranks', the disk
 * state's or the one in RAM. */
static st_status step_update(step_run *r, const st_adamw_params *hp, float max_norm, st_stream_step_stats *stats,
                             st_err *err) {
    st_stream_exec *x = r->x;
    if (x->hook_base) return ST_OK; /* the caller updates the hook's parameters */
    if (x->dist_mode) return update_dist(r, err);
    double ss;
    if (r->overlap) {
        stream_push_job(x, -1, r->last, r->n_micro > 1, 1);
        /* deferred, the worker has only summed the norm's partials as the gradients landed */
        st_prof_span w = st_prof_begin(ST_PROF_CAT_OPTIM, r->speculate ? "wait optimizer" : "grad norm", -1);
        stream_wait_jobs(x);
        st_prof_end(&w);
        ss = stream_chunks_total(x);
        if (x->worker_status) {
            *err = x->worker_err;
            return x->worker_status;
        }
    } else {
        wait_ticket(x, r->last, "wait grads", -1);
        st_prof_span w = st_prof_begin(ST_PROF_CAT_OPTIM, "grad norm", -1);
        stream_take_chunks(x, 0, x->n_params);
        ss = stream_chunks_total(x);
        st_prof_end(&w);
    }
    double norm = sqrt(ss);
    stats->grad_norm = norm;
    stats->skipped = !isfinite(norm);
    stats->clipped = !stats->skipped && max_norm > 0 && norm > max_norm;
    x->last_clipped = stats->clipped || stats->skipped;
    return x->store ? update_store(r, hp, max_norm, ss, norm, stats, err)
                    : update_ram(r, hp, max_norm, ss, norm, stats, err);
}

static st_status step_accum(st_stream_exec *x, int n_micro, const int32_t *inputs_all, const int32_t *targets_all,
                            const st_adamw_params *hp, float max_norm, st_stream_step_stats *stats, st_err *err);

st_status st_stream_step_accum(st_stream_exec *x, int n_micro, const int32_t *inputs_all, const int32_t *targets_all,
                            const st_adamw_params *hp, float max_norm, st_stream_step_stats *stats, st_err *err) {
    if (x->hook_base)
        return st_errf(err, ST_ERR_INVALID, "stream: this executor runs a hook's base (st_stream_config.hook); its "
                       "step is st_stream_hook_grads, and the caller's optimizer updates the hook's parameters");
    return step_accum(x, n_micro, inputs_all, targets_all, hp, max_norm, stats, err);
}

static st_status step_accum(st_stream_exec *x, int n_micro, const int32_t *inputs_all, const int32_t *targets_all,
                            const st_adamw_params *hp, float max_norm, st_stream_step_stats *stats, st_err *err) {
    step_run run = {.x = x, .n_micro = n_micro, .N = x->cfg.B * x->cfg.T}, *r = &run;
    double t_start = st_now();
    uint64_t h2d0 = x->h2d_bytes, d2h0 = x->d2h_bytes, ha0 = x->h2d_act_bytes, da0 = x->d2h_act_bytes;
    x->wait_s = 0;
    memset(stats, 0, sizeof *stats);
    st_prof_span step_span = st_prof_begin(ST_PROF_CAT_STEP, "stream step", (int)hp->step);
    st_status s = step_begin(r, targets_all, hp, err);
    if (s) return s;
    step_micro_batches(r, inputs_all, targets_all);
    float loss = (float)r->loss_sum;
    double t_tail = st_now();
    if (r->docs_st) { /* not reached: checked in step_begin */
        *err = r->docs_err;
        s = r->docs_st;
    } else {
        s = step_update(r, hp, max_norm, stats, err);
    }
    if (x->store_spec) { /* the step failed before its verdict: nothing committed, and the host
                            weights some subgroups' updates reached are the committed ones again */
        store_finish(x, -1, NULL);
        st_err e2 = {0};
        if (st_store_read_master(x->store, x->host_params, &e2)) st_log(2, "stream: %s\n", e2.msg);
    }
    stream_w16_end(x);
    if (s) x->last_clipped = 1, x->w16_valid = 0; /* after a failure, the next step does not speculate
                                                     and rounds the weights' bf16 copy again */
    stats->optim_tail_s = st_now() - t_tail;
    st_prof_end(&step_span);
    stats->loss = loss;
    stats->loss_sum = r->loss_sum;
    stats->h2d_bytes = x->h2d_bytes - h2d0;
    stats->d2h_bytes = x->d2h_bytes - d2h0;
    stats->h2d_act_bytes = x->h2d_act_bytes - ha0;
    stats->d2h_act_bytes = x->d2h_act_bytes - da0;
    size_t peak = 0, cap = 0; /* the budgeted arena's, or the GPU's own (0s where unbounded) */
    (void)st_backend_memory(x->dev, NULL, &peak, &cap, NULL);
    stats->device_peak_bytes = peak;
    stats->device_budget_bytes = cap;
    stats->compute_on_device = stream_compute_flush(x, &r->compute_s) > 0;
    stats->compute_s = r->compute_s;
    stats->wait_s = x->wait_s;
    stats->wall_s = st_now() - t_start;
    stats->overlap_efficiency = stats->wall_s > 0 ? r->compute_s / stats->wall_s : 0;
    return s;
}
#undef COMPUTE_

/* ------------------------------------------------------------------ data parallel */

void st_stream_params_changed(st_stream_exec *x) {
    x->fresh = 1;
    x->slots_warm = 0;
    x->w16_valid = 0;
}

int st_stream_can_hand_grads(const st_stream_exec *x) { return !x->bf16 && !x->host_grads_micro && !x->hook_base; }

int st_stream_hook_base(const st_stream_exec *x) { return x && x->hook_base; }

st_status st_stream_hook_grads(st_stream_exec *x, const int32_t *inputs, const int32_t *targets, float dloss,
                               float *loss, st_stream_step_stats *stats, st_err *err) {
    if (!x->hook_base)
        return st_errf(err, ST_ERR_INVALID, "stream: st_stream_hook_grads needs a hook's base "
                       "(st_stream_config.hook); this executor trains the arch (st_stream_step)");
    static const st_adamw_params none = {0};
    x->dist_dloss = dloss;
    st_status s = step_accum(x, 1, inputs, targets, &none, 0.0f, stats, err);
    if (s) x->slots_warm = 0;
    /* a hook that trains the ends: the caller changes the host weights next (its update), which
     * the copies of the next call's first blocks must not be reading */
    for (int l = 0; x->ends && l <= x->depth && l < x->n_blocks; l++) wait_ticket(x, x->w_ticket[l], "wait weights", l);
    stream_hook_done(x);
    *loss = stats->loss;
    return s;
}

st_status st_stream_micro_grads(st_stream_exec *x, const int32_t *inputs, const int32_t *targets, float dloss,
                             void (*grad_hook)(void *ctx, size_t offset, size_t n), void *grad_ctx,
                             void (*weight_hook)(void *ctx, size_t offset, size_t n), void *weight_ctx, float *loss,
                             st_stream_step_stats *stats, st_err *err) {
    if (!st_stream_can_hand_grads(x))
        return st_errf(err, ST_ERR_UNSUPPORTED, "stream: the ranks' micro-batches need an fp32 drain and "
                       "st_stream_config.grad_accum 1 (the step sums the micro-batches)");
    static const st_adamw_params none = {0};
    x->dist_mode = 1;
    x->dist_dloss = dloss;
    x->grad_hook = grad_hook;
    x->grad_hook_ctx = grad_ctx;
    x->weight_hook = weight_hook;
    x->weight_hook_ctx = weight_ctx;
    st_status s = st_stream_step_accum(x, 1, inputs, targets, &none, 0.0f, stats, err);
    x->dist_mode = 0;
    x->grad_hook = x->weight_hook = NULL;
    *loss = stats->loss;
    return s;
}

/* ------------------------------------------------------------------ forward only
 * The step's forward with nothing kept for a backward: each block runs in its plan's
 * activation set (nothing is offloaded, nothing recomputed), the weights arrive as in the
 * step (prefetch_depth ahead), and the head computes the loss only. No gradient, moment,
 * parameter or speculation state is touched: a step after it is the step it would have
 * been. The chunked classifier's first pass also drains logits to the host scratch a
 * backward would read; nothing reads them. */
st_status st_stream_eval(st_stream_exec *x, const int32_t *inputs, const int32_t *targets, float *loss, st_err *err) {
    const st_arch_ops *ao = x->arch->ops;
    st_backend *dev = x->dev;
    int L = x->n_blocks, D = x->depth, N = x->cfg.B * x->cfg.T;
    double compute_s = 0;
    if (!inputs || !targets) return st_errf(err, ST_ERR_INVALID, "st_stream_eval: inputs and targets are required");
    st_status ds = docs_apply(x, 0, err); /* the first micro-batch's documents, as the step in memory */
    if (ds) return ds;
    if (x->fresh) { /* the ranks' update (their gather waited for by the caller) */
        send_nonblock(x);
        x->fresh = 0;
    }
    x->slots_warm = 0; /* the eval's blocks take the slots */
    st_prof_span span = st_prof_begin(ST_PROF_CAT_OTHER, "stream eval", -1);
    stream_w16_begin(x); /* the weights' bf16 copy, where the matmuls read one: unchanged by the eval */
    dev->ops->copy_to_device(dev, x->d_tgt, targets, sizeof(int32_t) * (size_t)N);
    uint64_t enc_ticket = x->vocab_chunk ? stream_embed_forward(x, inputs) : 0;
    for (int l = 0; l <= D && l < L; l++) x->w_ticket[l] = fetch_block(x, l);
    if (x->vocab_chunk && L <= D + 1)
        for (int c = 0; c < 2 && c < x->n_vocab_chunks; c++) stream_fetch_vchunk(x, c);
    wait_ticket(x, x->embed_w_ticket, "wait embed weights", -1);
    if (x->vocab_chunk) wait_ticket(x, enc_ticket, "wait embedding", -1);
    else stream_embed_forward(x, inputs);
    for (int l = 0; l < L; l++) {
        wait_ticket(x, x->w_ticket[l], "wait weights", l);
        stream_w16_block(x, wslot(x, l), l);
        stream_hook_layer(x, l, wslot(x, l));
        ao->block_forward(x->dev_blocks, wslot(x, l), block_in(x, l), block_set(x, l), block_out(x, l));
        if (l + D + 1 < L) {
            x->w_ticket[l + D + 1] = fetch_block(x, l + D + 1);
            if (x->vocab_chunk && l + D + 1 == L - 1)
                for (int c = 0; c < 2 && c < x->n_vocab_chunks; c++) stream_fetch_vchunk(x, c);
        }
    }
    if (x->vocab_chunk) *loss = stream_chunked_head_forward(x, block_out(x, L - 1), targets, &compute_s);
    else *loss = stream_head_forward(x, block_out(x, L - 1), targets, 0.0f);
    stream_compute_flush(x, &compute_s); /* the head's spans, drawn on the trace */
    stream_w16_end(x);
    stream_hook_done(x);
    /* copies still queued (the logits' drain, head chunks) complete before anything the
     * next step waits on: the copy engine completes in order */
    st_prof_end(&span);
    return ST_OK;
}
