/* step.c - one optimizer step, in memory or streamed (strata/step.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "strata/dist.h"
#include "strata/poetx.h"
#include "strata/prof.h"
#include "strata/step.h"
#include "strata/store.h"
#include "strata/stream.h"

float st_step_dloss(const int32_t *targets, size_t n, long *n_targets) {
    long c = 0;
    for (size_t i = 0; i < n; i++) c += targets[i] >= 0;
    if (n_targets) *n_targets = c;
    if (c == (long)n) return 1.0f / (float)n; /* nothing masked: the mean over every position */
    return c ? 1.0f / (float)c : 0.0f;
}

double st_step_micro_loss(float mean, const int32_t *targets, size_t n, int n_micro, long total) {
    if (total == (long)n * n_micro) return mean / n_micro; /* nothing masked: each weighs the same */
    long count = 0;
    for (size_t i = 0; i < n; i++) count += targets[i] >= 0;
    return total ? (double)mean * ((double)count / (double)total) : 0.0;
}

/* The step (strata/step.h): what it runs on, and the ranks' side (dist.h's st_zero). */
struct st_step {
    st_model *m;               /* in memory: the model (its params and grads in host memory) */
    st_optim *opt;             /* in memory with the state in RAM */
    st_store *store;           /* in memory with the disk state (opt unused) */
    st_stream_exec *sx;        /* streamed: the executor holds the rest; resident: the step's own */
    int hook_base;             /* streamed LoRA or POET-X: sx runs the hook's base, the step updates m (opt
                                  or store) */
    int resident;              /* in memory through the block executor, every block resident in
                                  the model's vectors (made at the first step, for its B x T) */
    st_arch *arch;             /* resident: the model as blocks */
    int B, T;                  /* resident: the executor's shape */
    st_dtype act_dtype;        /* resident: its activation sets' dtype (st_step_setup) */
    float *grad_sum;           /* in memory, more than one micro-batch: the running sum */
    int max_micro;
    st_comm *comm;             /* data parallel */
    st_zero *zero;             /* the ranks' shards, reductions and gathers */
    const int32_t *positions, *doc_start; /* packed documents (st_step_set_docs) */
    st_row_loss_hook row_hook; /* st_step_set_row_hook */
    void *row_hook_ctx;
};

st_status st_step_create(st_step **out, const st_step_setup *su, st_err *err) {
    *out = NULL;
    int zero = su->comm ? su->zero : 0;
    if (su->comm && !su->m)
        return st_errf(err, ST_ERR_INVALID, "data parallel: the step has no model (the model's host vectors are what "
                       "the ranks reduce and gather, streamed or not)");
    if (!su->sx && !su->m) return st_errf(err, ST_ERR_INVALID, "step: neither a model nor an executor");
    int hook_base = su->sx && st_stream_hook_base(su->sx);
    /* a hook's base hands no gradient of its own: the hook's land in m->grads (hook_micro) */
    if (su->comm && su->sx && !hook_base && !st_stream_can_hand_grads(su->sx))
        return st_errf(err, ST_ERR_UNSUPPORTED, "data parallel with layer streaming: the executor must drain fp32 "
                       "gradients and take one micro-batch at a time (st_stream_config.grad_accum 1)");
    if (zero < 0 || zero > 2) return st_errf(err, ST_ERR_INVALID, "key 'zero': %d; give 0, 1 or 2", zero);
    if (!su->sx && !su->comm && !su->opt && !su->store)
        return st_errf(err, ST_ERR_INVALID, "step: in memory, neither an optimizer nor a state store");
    /* the executor forms the method's gradient (hook_micro); the step updates the method's vector,
     * m->n_params, with its optimizer or through the store, which is never the executor's (its
     * vector is the base's); under ranks the same, each rank over its own copy of the base */
    if (hook_base && (!su->m || !su->opt == !su->store))
        return st_errf(err, ST_ERR_UNSUPPORTED, "step: a hook's executor over a base (LoRA or POET-X streamed) needs the "
                       "model and one of its optimizer in RAM (a rank's: its shard's) or its state store");
    if (su->act_dtype != ST_F32 && su->act_dtype != ST_BF16)
        return st_errf(err, ST_ERR_INVALID, "key 'act_dtype': activation dtype %s (f32 or bf16)",
                       st_dtype_name(su->act_dtype));
    st_step *s = calloc(1, sizeof *s);
    if (!s) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    s->act_dtype = su->act_dtype;
    s->m = su->m;
    s->opt = su->opt;
    s->store = su->store;
    s->sx = su->sx;
    s->hook_base = hook_base;
    s->comm = su->comm;
    s->max_micro = su->max_micro < 1 ? 1 : su->max_micro;
    /* the executor updates tensor by tensor: the optimizer's segments must be the model's */
    s->resident = !s->sx && st_step_in_blocks(s->m) &&
                  (s->comm || s->store || st_optim_segment_count(s->opt) == s->m->n_tensors);
    if (!s->resident && !s->sx && s->act_dtype == ST_BF16) {
        st_step_destroy(s);
        return st_errf(err, ST_ERR_UNSUPPORTED, "key 'act_dtype': bf16 activations are the block executor's; this "
                       "model trains through its own forward (LoRA, POET-X) and keeps fp32 ones: use act_dtype f32");
    }
    if (s->resident) {
        st_status sa = st_arch_of_model(&s->arch, s->m, err);
        if (sa) {
            st_step_destroy(s);
            return sa;
        }
    }
    /* the running sum of the micro-batches: under ranks unless ZeRO 2 keeps only its shard's,
     * and in memory through the model's own forward (the executor keeps its own) */
    int in_memory = s->comm || (!s->sx && !s->resident) || s->hook_base;
    if (in_memory && s->max_micro > 1 && !(s->comm && zero == 2) &&
        !(s->grad_sum = st_alloc(s->m->n_params * sizeof(float)))) {
        size_t bytes = s->m->n_params * sizeof(float);
        st_step_destroy(s);
        return st_errf(err, ST_ERR_NOMEM, "key 'grad_accum': %d micro-batches need one more fp32 gradient, %zu bytes, "
                       "that the host cannot give; use grad_accum 1", su->max_micro, bytes);
    }
    st_status st;
    if (s->comm && (st = st_zero_create(&s->zero, s->comm, zero, su->bounds, s->m->n_params, su->overlap_gather, err))) {
        st_step_destroy(s);
        return st;
    }
    *out = s;
    return ST_OK;
}

void st_step_destroy(st_step *s) {
    if (!s) return; /* the caller's executor, perhaps freed already: not touched */
    if (s->resident) {
        st_stream_exec_free(s->sx);
        st_arch_free(s->arch);
    }
    st_free(s->grad_sum);
    st_zero_destroy(s->zero);
    free(s);
}

void st_step_set_row_hook(st_step *s, st_row_loss_hook hook, void *ctx) {
    s->row_hook = hook;
    s->row_hook_ctx = ctx;
    /* the executor runs the micro-batches (streamed LoRA: one a call, the step calls the hook) */
    if (s->sx && !s->comm && !s->hook_base) st_stream_set_row_hook(s->sx, hook, ctx);
}

int st_step_in_blocks(const st_model *m) { return m && m->ops->get_arch && st_backend_host_memory(m->be); }

/* Resident: the block executor over the model's own vectors, every block's weights and
 * gradients in place, every block's activations kept (as the model's forward keeps them),
 * the update after the backward (clip deferred: no speculative backups, no memory beyond
 * the model's), for B x T; made again if the shape changes. The optimizer (or the store)
 * is the caller's; under ranks the step updates and the executor hands each micro-batch's
 * gradient over. */
static st_status step_resident(st_step *s, int B, int T, st_err *err) {
    if (s->sx && s->B == B && s->T == T) return ST_OK;
    st_stream_exec_free(s->sx);
    s->sx = NULL;
    st_model *m = s->m;
    st_stream_config sc = {.arch = s->arch, .host_params = m->params, .host_grads = m->grads, .B = B, .T = T,
                           .grad_accum = s->comm ? 1 : s->max_micro,
                           .state_format = s->opt ? st_optim_format(s->opt) : ST_OPTIM_STATE_F32,
                           .optim = s->comm ? NULL : s->opt, .external_optimizer = s->comm || s->store};
    st_stream_plan plan;
    st_stream_plan_resident(&plan, s->arch->lay.n_blocks);
    plan.act_dtype = s->act_dtype;
    st_status st = st_stream_exec_create(&s->sx, &sc, &plan, m->be, err);
    if (st) return st;
    s->B = B, s->T = T;
    if (!s->comm && s->row_hook) st_stream_set_row_hook(s->sx, s->row_hook, s->row_hook_ctx);
    return ST_OK;
}

/* One micro-batch's gradient g into the running sum acc: mode 0 acc = g (the first),
 * 1 acc += g, 2 g += acc (the last: the sum lands in the model's gradient; a + b == b + a
 * exactly, so this is the same sum as the streaming executor's acc += g). */
static void accumulate(float *acc, float *g, size_t n, int mode) {
    const size_t piece = 1u << 18;
    long np = (long)((n + piece - 1) / piece);
#pragma omp parallel for schedule(static)
    for (long i = 0; i < np; i++) {
        size_t a = (size_t)i * piece, e = a + piece < n ? a + piece : n;
        if (mode == 0) memcpy(acc + a, g + a, (e - a) * sizeof(float));
        else if (mode == 1) for (size_t j = a; j < e; j++) acc[j] += g[j];
        else for (size_t j = a; j < e; j++) g[j] += acc[j];
    }
}

static const void *store_grads_at(void *ctx, size_t first, size_t n) {
    (void)n;
    st_step *s = ctx; /* ZeRO 1 and 2: the store holds the shard, its elements counted from its start */
    return s->zero && st_zero_stage(s->zero) ? st_zero_shard(s->zero) + first : s->m->grads + first;
}
static void *store_work_at(void *ctx, size_t first, size_t n) {
    (void)n;
    st_step *s = ctx;
    size_t lo = 0, hi;
    if (s->zero && st_zero_stage(s->zero)) st_zero_shard_range(s->zero, &lo, &hi);
    return s->m->params + lo + first;
}

/* One micro-batch's gradient, fresh from zero (the accumulation rule), its forward and
 * backward timed into r; its mean loss. */
static float micro_step(st_model *m, const int32_t *in, const int32_t *tg, float dloss, st_step_result *r);

void st_step_set_docs(st_step *s, const int32_t *positions, const int32_t *doc_start) {
    s->positions = positions;
    s->doc_start = doc_start;
}

/* Micro-batch k's documents onto the model before its forward (none set: nothing to do). */
static st_status step_docs(st_step *s, int k, size_t N, st_err *err) {
    if (!s->positions && !s->doc_start) return ST_OK;
    if (s->sx) { /* the executor sets them on its blocks before each micro-batch's forward (stream.h) */
        st_stream_set_docs(s->sx, s->positions ? s->positions + (size_t)k * N : NULL,
                        s->doc_start ? s->doc_start + (size_t)k * N : NULL);
        return ST_OK;
    }
    return st_model_set_docs(s->m, s->positions ? s->positions + (size_t)k * N : NULL,
                             s->doc_start ? s->doc_start + (size_t)k * N : NULL, err);
}

/* One micro-batch's executor figures added to the step's (the peak and the budget: the last). */
static void add_stream_stats(st_step_result *r, const st_stream_step_stats *ss) {
    r->forward_s += ss->compute_s;
    r->stream.h2d_bytes += ss->h2d_bytes;
    r->stream.d2h_bytes += ss->d2h_bytes;
    r->stream.h2d_act_bytes += ss->h2d_act_bytes;
    r->stream.d2h_act_bytes += ss->d2h_act_bytes;
    r->stream.compute_s += ss->compute_s;
    r->stream.wait_s += ss->wait_s;
    r->stream.wall_s += ss->wall_s;
    r->stream.device_peak_bytes = ss->device_peak_bytes;
    r->stream.device_budget_bytes = ss->device_budget_bytes;
}

static st_status hook_micro(st_step *s, const int32_t *in, const int32_t *tg, float dloss, float *mean,
                            st_step_result *r, st_err *err);

/* The ranks' micro-batch, in memory or streamed (the model's vectors are the executor's host
 * tier): the hooks are the model's (in memory) or handed to the executor. */
static st_status dist_micro(st_step *s, const int32_t *in, const int32_t *tg, float dloss, float *mean,
                            st_step_result *r, st_err *err) {
    st_model *m = s->m;
    if (!s->sx) {
        *mean = micro_step(m, in, tg, dloss, r);
        return ST_OK;
    }
    st_stream_step_stats ss;
    if (s->hook_base) { /* the hook's gradient into m's, whole: st_zero_pass_end reduces it */
        st_model_zero_grad(m);
        return hook_micro(s, in, tg, dloss, mean, r, err);
    }
    st_status st = st_stream_micro_grads(s->sx, in, tg, dloss, m->grad_hook, m->grad_hook_ctx, m->weight_hook,
                                      m->weight_hook_ctx, mean, &ss, err);
    add_stream_stats(r, &ss);
    return st;
}

/* Streamed LoRA's or POET-X's micro-batch: the hook's base's executor, the hook's gradients into m's. */
static st_status hook_micro(st_step *s, const int32_t *in, const int32_t *tg, float dloss, float *mean,
                            st_step_result *r, st_err *err) {
    st_stream_step_stats ss;
    st_status st = st_stream_hook_grads(s->sx, in, tg, dloss, mean, &ss, err);
    add_stream_stats(r, &ss);
    return st;
}

static float micro_step(st_model *m, const int32_t *in, const int32_t *tg, float dloss, st_step_result *r) {
    double t0 = st_now();
    st_model_zero_grad(m);
    float mean = m->ops->forward(m, in, tg, dloss);
    double t1 = st_now();
    m->ops->backward(m);
    r->forward_s += t1 - t0;
    r->backward_s += st_now() - t1;
    return mean;
}

/* The update of the summed gradient g (the whole vector, or this rank's shard), the norm
 * already known: the same for one process and for every rank. */
static st_status step_update(st_step *s, const float *g, double sumsq, const st_step_hp *hp, st_step_result *r,
                             st_err *err) {
    st_model *m = s->m;
    r->grad_norm = sqrt(sumsq);
    r->skipped = !isfinite(r->grad_norm);
    if (r->skipped) return ST_OK;
    st_adamw_params a = hp->adam;
    a.grad_scale = st_optim_clip_scale(sumsq, 1.0f, hp->grad_clip);
    r->clipped = a.grad_scale < 1.0f;
    st_status st;
    st_prof_span po = st_prof_begin(ST_PROF_CAT_OPTIM, s->store ? "optimizer (disk state)" : "optimizer", -1);
    if (s->store) { /* through the disk state, committed with the loop's state */
        st_store_step_args sa = {.grads = store_grads_at, .grad_dtype = ST_F32, .work = store_work_at,
                                 .work_dtype = ST_F32, .ctx = s, .grad_sumsq = sumsq, .blob = hp->blob,
                                 .blob_bytes = hp->blob_bytes, .reset_master = hp->reset_master,
                                 .reset_moments = hp->reset_moments, .reset_class = hp->reset_class};
        st = st_store_step(s->store, &sa, &a, err);
    } else {
        /* the sum of squares is already known: the engine need not read the gradients twice;
         * sharded (ZeRO 1 and 2), the optimizer's segments count from the shard's start */
        size_t lo = 0, hi = m->n_params;
        int sharded = s->zero && st_zero_stage(s->zero);
        if (sharded) st_zero_shard_range(s->zero, &lo, &hi);
        st_optim_step_args oa = {.params = m->params + lo, .grads = g, .grad_dtype = ST_F32, .grad_sumsq = sumsq};
        st = sharded && hi == lo ? ST_OK : st_optim_step_ex(s->opt, &oa, &a, err);
    }
    st_prof_end(&po);
    return st;
}

/* Streamed POET-X: the base's trainable tensors in the executor's host vector made the model's
 * (its optimizer updates its own vector; a load or a merge changes it, or W0), and the executor's
 * device copies sent again. Nothing for LoRA (its base never changes). */
static void base_follows(st_step *s) {
    if (!st_model_is_poetx(s->m)) return;
    st_poetx_to_base(s->m);
    st_stream_params_changed(s->sx);
}

void st_step_params_changed(st_step *s) {
    if (s && s->sx) st_stream_set_params(s->sx, st_stream_params(s->sx));
}

st_status st_step_sync(st_step *s, st_err *err) { return s && s->zero ? st_zero_sync(s->zero, err) : ST_OK; }

st_status st_step_eval(st_step *s, int B, int T, const int32_t *inputs, const int32_t *targets, const int32_t *positions,
                       const int32_t *doc_start, float *loss, st_err *err) {
    st_status st;
    if (s->resident && (st = step_resident(s, B, T, err))) return st;
    if (s->sx) {
        if (s->hook_base) base_follows(s);
        if (doc_start) st_stream_set_docs(s->sx, positions, doc_start); /* as in training */
        return st_stream_eval(s->sx, inputs, targets, loss, err);
    }
    if (doc_start && (st = st_model_set_docs(s->m, positions, doc_start, err))) return st;
    *loss = s->m->ops->forward(s->m, inputs, targets, 0.0f); /* dloss 0: the logits stay, no gradient */
    return ST_OK;
}

/* The ranks' step. Each rank's micro-batches are its own; the step's target count and loss
 * are summed over the ranks, so the dloss and the loss are one process's with n_micro x
 * size micro-batches (rank r's k-th micro-batch is that process's (k size + r)-th, as the
 * loader's global order gives them). Each micro-batch's gradient is reduced as backward
 * completes each block (ZeRO 2: every micro-batch, onto the shard's running sum; 0 and 1:
 * the last, with the sum of the others added first); a hook's base (LoRA, POET-X streamed)
 * hands no block ranges: its gradient is reduced whole after its backward. */
static st_status step_run_dist(st_step *s, int n_micro, size_t N, const int32_t *inputs, const int32_t *targets,
                               const st_step_hp *hp, st_step_result *r, st_err *err) {
    st_model *m = s->m;
    st_comm *c = s->comm;
    st_zero *z = s->zero;
    int W = st_comm_size(c), stage = st_zero_stage(z);
    uint64_t sent0, recv0;
    st_comm_bytes(c, &sent0, &recv0);
    double cnt[1];
    st_step_dloss(targets, N * (size_t)n_micro, &r->n_targets);
    cnt[0] = (double)r->n_targets;
    st_status st = st_comm_allreduce_f64(c, cnt, 1, "target count", err);
    if (st) return st;
    long total = (long)cnt[0];
    size_t n_all = N * (size_t)n_micro * (size_t)W;
    float dloss = total == (long)n_all ? 1.0f / (float)n_all : total ? 1.0f / (float)total : 0.0f;
    double loss[1] = {0};
    int waiting = st_zero_gathering(z); /* the last update's weights still arriving */
    st_zero_step_begin(z);
    if (s->hook_base) {
        /* streamed LoRA or POET-X: the hook reads m's weights with no weight hook, so the gather
         * ends first (it is not overlapped: without a gradient hook there are no parts to wait
         * for one by one); then POET-X's trainables into the base, as in one process */
        if (waiting && (st = st_zero_weights_done(z, &r->comm_wait_s, err))) return st;
        waiting = 0;
        base_follows(s);
    }
    for (int k = 0; k < n_micro; k++) {
        const int32_t *in = inputs + (size_t)k * N, *tg = targets + (size_t)k * N;
        if (waiting) {
            m->weight_hook = k == 0 ? st_zero_weights_ready : NULL;
            m->weight_hook_ctx = z;
        }
        int reduce_now = stage == 2 || k == n_micro - 1;
        st_zero_pass pass;
        st_zero_pass_begin(&pass, z, m->grads, stage != 2 && n_micro > 1 ? s->grad_sum : NULL, stage == 2 && k > 0,
                           err);
        if (reduce_now && !s->hook_base) { /* a hook's gradient: reduced whole by st_zero_pass_end */
            m->grad_hook = st_zero_grad_ready;
            m->grad_hook_ctx = &pass;
        }
        float mean;
        if ((st = step_docs(s, k, N, err))) return st;
        st = dist_micro(s, in, tg, dloss, &mean, r, err);
        m->grad_hook = NULL;
        if (st) return st;
        if (s->row_hook) s->row_hook(s->row_hook_ctx, k, s->sx ? st_stream_row_losses(s->sx) : m->row_losses, tg, N);
        if (waiting && k == 0) {
            m->weight_hook = NULL;
            if ((st = st_zero_weights_done(z, &r->comm_wait_s, err))) return st;
        }
        st_failpoint("dist_backward_done"); /* tests: a rank lost mid-step */
        /* the step's loss: this micro-batch's share, the shares of all ranks summed in rank
         * order below (one micro-batch a rank: the one process's order exactly) */
        loss[0] += st_step_micro_loss(mean, tg, N, n_micro * W, total);
        if (!reduce_now && n_micro > 1) { /* ZeRO 0 and 1: summed here first, reduced with the last */
            st_prof_span pa = st_prof_begin(ST_PROF_CAT_OPTIM, "accumulate", k);
            accumulate(s->grad_sum, m->grads, m->n_params, k == 0 ? 0 : 1);
            st_prof_end(&pa);
        }
        if (reduce_now && (st = st_zero_pass_end(&pass, &r->comm_wait_s))) return st;
    }
    if ((st = st_comm_allreduce_f64(c, loss, 1, "loss", err))) return st;
    r->loss = loss[0];
    double t3 = st_now();
    const float *g;
    size_t glo, ghi;
    double sumsq;
    if ((st = st_zero_summed(z, m->grads, &g, &glo, &ghi, &r->comm_wait_s, err)) ||
        (st = st_zero_grad_sumsq(z, g, glo, ghi, &sumsq, err)))
        return st;
    st_failpoint("dist_before_update"); /* tests: a rank lost before its update (its store not committed) */
    if ((st = step_update(s, g, sumsq, hp, r, err))) return st;
    /* its device copies of the embedding and head (a hook's base: base_follows, before the next use) */
    if (s->sx && !s->hook_base && !r->skipped) st_stream_params_changed(s->sx);
    if (!r->skipped && (st = st_zero_share_weights(z, m->params, &r->comm_wait_s, err))) return st;
    r->optimizer_s = st_now() - t3;
    uint64_t sent1, recv1;
    st_comm_bytes(c, &sent1, &recv1);
    r->sent_bytes = sent1 - sent0;
    r->received_bytes = recv1 - recv0;
    return ST_OK;
}

st_status st_step_run(st_step *s, int n_micro, int B, int T, const int32_t *inputs, const int32_t *targets,
                      const st_step_hp *hp, st_step_result *r, st_err *err) {
    memset(r, 0, sizeof *r);
    if (n_micro < 1 || n_micro > s->max_micro)
        return st_errf(err, ST_ERR_INVALID, "step: %d micro-batches; this step was set up for 1 to %d", n_micro,
                       s->max_micro);
    size_t N = (size_t)B * T;
    st_status st = ST_OK;
    if (s->resident && (st = step_resident(s, B, T, err))) return st;
    if (s->resident && s->store && !s->comm && /* the blob committed with this update */
        (st = st_stream_attach_store(s->sx, s->store, hp->blob, hp->blob_bytes, err)))
        return st;
    if (s->comm) return step_run_dist(s, n_micro, N, inputs, targets, hp, r, err);
    if (s->sx && !s->hook_base) {
        if ((st = step_docs(s, 0, N, err))) return st; /* every micro-batch's, from the first */
        st_stream_step_stats *ss = &r->stream;
        st_adamw_params a = hp->adam;
        if ((st = st_stream_step_accum(s->sx, n_micro, inputs, targets, &a, hp->grad_clip, ss, err))) return st;
        st_step_dloss(targets, N * (size_t)n_micro, &r->n_targets);
        r->loss = ss->loss_sum;
        r->grad_norm = ss->grad_norm;
        r->clipped = ss->clipped;
        r->skipped = ss->skipped;
        r->forward_s = ss->compute_s;
        r->optimizer_s = ss->optim_tail_s;
        return ST_OK;
    }
    st_model *m = s->m;
    float dloss = st_step_dloss(targets, N * (size_t)n_micro, &r->n_targets);
    double loss = 0;
    if (s->hook_base) base_follows(s); /* POET-X: the base's trainables as the last update left them */
    for (int k = 0; k < n_micro; k++) {
        const int32_t *in = inputs + (size_t)k * N, *tg = targets + (size_t)k * N;
        if ((st = step_docs(s, k, N, err))) return st;
        float mean;
        if (s->hook_base) { /* streamed LoRA or POET-X: the executor's forward and backward into m's gradient */
            st_model_zero_grad(m);
            if ((st = hook_micro(s, in, tg, dloss, &mean, r, err))) return st;
        } else {
            mean = micro_step(m, in, tg, dloss, r);
        }
        if (s->row_hook) s->row_hook(s->row_hook_ctx, k, s->hook_base ? st_stream_row_losses(s->sx) : m->row_losses, tg, N);
        if (n_micro > 1) {
            st_prof_span pa = st_prof_begin(ST_PROF_CAT_OPTIM, "accumulate", k);
            accumulate(s->grad_sum, m->grads, m->n_params, k == 0 ? 0 : k < n_micro - 1 ? 1 : 2);
            st_prof_end(&pa);
        }
        loss += st_step_micro_loss(mean, tg, N, n_micro, r->n_targets);
    }
    r->loss = loss;
    double t3 = st_now();
    st_prof_span pn = st_prof_begin(ST_PROF_CAT_OPTIM, "grad norm", -1);
    double sumsq = st_optim_grad_sumsq_f32(m->grads, m->n_params);
    st_prof_end(&pn);
    st = step_update(s, m->grads, sumsq, hp, r, err);
    r->optimizer_s = st_now() - t3;
    return st;
}
