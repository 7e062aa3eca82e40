/* step.c - one optimizer step, in memory or streamed (strata/step.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "strata/dist.h"
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

st_status st_step_init_memory(st_step *s, st_model *m, st_optim *opt, st_store *store, int max_micro, st_err *err) {
    memset(s, 0, sizeof *s);
    s->m = m;
    s->opt = opt;
    s->store = store;
    s->max_micro = max_micro < 1 ? 1 : max_micro;
    if (s->max_micro > 1 && !(s->gacc = st_alloc(m->n_params * sizeof(float))))
        return st_errf(err, ST_ERR_NOMEM, "key 'grad_accum': %d micro-batches need one more fp32 gradient, %zu bytes, "
                       "that the host cannot give; use grad_accum 1", s->max_micro, m->n_params * sizeof(float));
    return ST_OK;
}

void st_step_init_streamed(st_step *s, st_stream_exec *sx, int max_micro) {
    memset(s, 0, sizeof *s);
    s->sx = sx;
    s->max_micro = max_micro < 1 ? 1 : max_micro;
}

void st_step_free(st_step *s) {
    st_free(s->gacc);
    s->gacc = NULL;
    st_free(s->shard);
    s->shard = NULL;
    free(s->bounds);
    s->bounds = NULL;
    free(s->parts);
    s->parts = NULL;
    free(s->cuts);
    s->cuts = NULL;
    free(s->gticket);
    s->gticket = NULL;
}

st_status st_step_set_dist(st_step *s, st_comm *comm, int zero, const size_t *bounds, st_err *err) {
    if (!s->m) return st_errf(err, ST_ERR_INVALID, "data parallel: the step has no model (st_step_init_memory, then "
                              "set sx to stream it)");
    if (s->sx && !st_stream_can_hand_grads(s->sx))
        return st_errf(err, ST_ERR_UNSUPPORTED, "data parallel with layer streaming: the executor must drain fp32 "
                       "gradients and take one micro-batch at a time (st_stream_config.grad_accum 1)");
    if (zero < 0 || zero > 2) return st_errf(err, ST_ERR_INVALID, "key 'zero': %d; give 0, 1 or 2", zero);
    int n = st_comm_size(comm), r = st_comm_rank(comm);
    size_t np = s->m->n_params, nchunks = (np + ST_OPTIM_SUMSQ_CHUNK - 1) / ST_OPTIM_SUMSQ_CHUNK;
    s->comm = comm;
    s->zero = zero;
    s->bounds = malloc(sizeof(size_t) * (size_t)(n + 1));
    s->parts = calloc(nchunks ? nchunks : 1, sizeof(double));
    if (!s->bounds || !s->parts) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    memcpy(s->bounds, bounds, sizeof(size_t) * (size_t)(n + 1));
    s->lo = bounds[r];
    s->hi = bounds[r + 1];
    size_t sb = (s->hi - s->lo) * sizeof(float);
    if (!(s->shard = st_alloc(sb ? sb : sizeof(float))))
        return st_errf(err, ST_ERR_NOMEM, "rank %d: %zu bytes for the gradient shard", r, sb);
    if (zero == 2) { /* the running sum is the shard's: no whole-vector sum */
        st_free(s->gacc);
        s->gacc = NULL;
    }
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
    return s->comm && s->zero ? s->shard + first : s->m->grads + first;
}
static void *store_work_at(void *ctx, size_t first, size_t n) {
    (void)n;
    st_step *s = ctx;
    return s->m->params + (s->comm && s->zero ? s->lo : 0) + first;
}

/* A reduction or gather, its wait counted as the step's exposed communication. */
static st_status dist_wait(st_step *s, st_comm_req *q, const char *phase, st_step_result *r, st_err *err) {
    double t = st_now();
    st_prof_span pw = st_prof_begin(ST_PROF_CAT_OTHER, phase, -1);
    st_status st = st_comm_wait(s->comm, q, phase, err);
    st_prof_end(&pw);
    r->comm_wait_s += st_now() - t;
    return st;
}

/* The squared norm of the summed gradient: chunk c of ST_OPTIM_SUMSQ_CHUNK elements is summed by
 * the rank holding its first element (which receives the end of a chunk crossing into the
 * next shards), the partial sums gathered and added in chunk order: the bits
 * st_optim_grad_sumsq gives on the whole vector, whatever the cuts. */
static st_status dist_sumsq(st_step *s, const float *g, size_t lo, size_t hi, double *sumsq, st_err *err) {
    const size_t CH = ST_OPTIM_SUMSQ_CHUNK;
    size_t np = s->m->n_params, nchunks = (np + CH - 1) / CH;
    memset(s->parts, 0, nchunks * sizeof(double));
    st_status st = ST_OK;
    if (hi - lo == np) { /* the whole gradient is here (ZeRO 0) */
        st_optim_grad_sumsq_parts(g, ST_F32, np, s->parts);
    } else {
        int W = st_comm_size(s->comm), me = st_comm_rank(s->comm);
        /* rank r's chunks start in [b[r], b[r+1]); the last one ends at need(r) */
        const size_t *b = s->bounds;
#define NEED_END(r) (b[(r) + 1] > b[(r)] && (b[(r) + 1] - 1) / CH * CH >= b[(r)] \
                         ? ((b[(r) + 1] - 1) / CH * CH + CH < np ? (b[(r) + 1] - 1) / CH * CH + CH : np) : b[(r) + 1])
        size_t first = (lo + CH - 1) / CH * CH, need = NEED_END(me);
        float *tail = NULL;
        st_comm_piece *snd = calloc((size_t)W, sizeof *snd), *rcv = calloc((size_t)W, sizeof *rcv);
        int ns = 0, nr = 0;
        size_t last = hi > first ? (hi - 1) / CH * CH : hi; /* the crossing chunk's start */
        if (!snd || !rcv) st = st_errf(err, ST_ERR_NOMEM, "out of memory");
        if (!st && need > hi) { /* the end of my last chunk, from the next ranks */
            if (!(tail = malloc((need - last) * sizeof(float)))) st = st_errf(err, ST_ERR_NOMEM, "out of memory");
            else {
                memcpy(tail, g + (last - lo), (hi - last) * sizeof(float));
                for (int q = me + 1; q < W; q++) {
                    size_t a = b[q] > hi ? b[q] : hi, e = b[q + 1] < need ? b[q + 1] : need;
                    if (e > a) rcv[nr++] = (st_comm_piece){q, tail + (a - last), e - a};
                }
            }
        }
        for (int r = 0; r < me && !st; r++) { /* my first elements that end an earlier rank's chunk */
            size_t e = NEED_END(r);
            size_t a = b[r + 1] > lo ? b[r + 1] : lo, ee = e < hi ? e : hi;
            if (e > b[r + 1] && ee > a) snd[ns++] = (st_comm_piece){r, (float *)g + (a - lo), ee - a};
        }
#undef NEED_END
        if (!st) st = st_comm_exchange_f32(s->comm, snd, ns, rcv, nr, "gradient norm", err);
        if (!st) {
            size_t full_end = need > hi ? last : hi; /* the chunks wholly here */
            if (full_end > first) st_optim_grad_sumsq_parts(g + (first - lo), ST_F32, full_end - first, s->parts + first / CH);
            if (tail) st_optim_grad_sumsq_parts(tail, ST_F32, need - last, s->parts + last / CH);
        }
        free(tail);
        free(snd);
        free(rcv);
        /* every chunk is one rank's (the others add 0.0, which changes no bit) */
        if (!st) st = st_comm_allreduce_f64(s->comm, s->parts, (int)nchunks, "gradient norm", err);
    }
    double t = 0;
    for (size_t c = 0; c < nchunks; c++) t += s->parts[c];
    *sumsq = t;
    return st;
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
    st_status st = st_stream_micro_grads(s->sx, in, tg, dloss, m->grad_hook, m->grad_hook_ctx, m->weight_hook,
                                      m->weight_hook_ctx, mean, &ss, err);
    r->forward_s += ss.compute_s;
    r->stream.h2d_bytes += ss.h2d_bytes;
    r->stream.d2h_bytes += ss.d2h_bytes;
    r->stream.h2d_act_bytes += ss.h2d_act_bytes;
    r->stream.d2h_act_bytes += ss.d2h_act_bytes;
    r->stream.compute_s += ss.compute_s;
    r->stream.wait_s += ss.wait_s;
    r->stream.wall_s += ss.wall_s;
    r->stream.device_peak_bytes = ss.device_peak_bytes;
    r->stream.device_budget_bytes = ss.device_budget_bytes;
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

/* The backward hook of the ranks' step: each block's range of the gradient, once complete,
 * queued for reduction on the communication thread (the sum of the earlier micro-batches
 * added first where ZeRO 0 and 1 kept it here). */
typedef struct dist_hook {
    st_step *s;
    int accumulate, add_gacc;
    size_t done_lo, done_hi; /* the ranges queued so far: blocks, from the last down, contiguous */
    st_status st;
    st_err *err;
} dist_hook;

static void reduce_range(dist_hook *h, size_t lo, size_t hi) {
    st_step *s = h->s;
    if (h->st || hi <= lo) return;
    if (h->add_gacc) accumulate(s->gacc + lo, s->m->grads + lo, hi - lo, 2);
    h->st = st_comm_async_reduce(s->comm, s->m->grads, lo, hi, s->bounds, s->shard, h->accumulate, h->err);
}

/* The parts of the weights gathered after the update: the blocks' offsets, as the backward
 * hook reports them (from the last block down), and the ends. */
static void note_cut(st_step *s, size_t at) {
    for (int i = 0; i < s->n_cuts; i++)
        if (s->cuts[i] == at) return;
    if (s->n_cuts == s->cap_cuts) {
        int cap = s->cap_cuts ? 2 * s->cap_cuts : 64;
        size_t *p = realloc(s->cuts, sizeof *p * (size_t)cap);
        if (!p) return; /* fewer parts: a coarser overlap, the same weights */
        s->cuts = p;
        s->cap_cuts = cap;
    }
    size_t i = (size_t)s->n_cuts++;
    for (; i > 0 && s->cuts[i - 1] > at; i--) s->cuts[i] = s->cuts[i - 1];
    s->cuts[i] = at;
}

static void dist_grad_ready(void *ctx, size_t offset, size_t n) {
    dist_hook *h = ctx;
    if (h->s->overlap_gather) {
        note_cut(h->s, offset);
        note_cut(h->s, offset + n);
    }
    reduce_range(h, offset, offset + n);
    if (offset < h->done_lo) h->done_lo = offset;
    if (offset + n > h->done_hi) h->done_hi = offset + n;
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
                                 .blob_bytes = hp->blob_bytes};
        st = st_store_step(s->store, &sa, &a, err);
    } else {
        /* the sum of squares is already known: the engine need not read the gradients twice */
        int sharded = s->comm && s->zero;
        st_optim_step_args oa = {.params = m->params + (sharded ? s->lo : 0), .grads = g, .grad_dtype = ST_F32,
                              .grad_sumsq = sumsq}; /* sharded: the optimizer's segments count from lo */
        st = sharded && s->hi == s->lo ? ST_OK : st_optim_step_ex(s->opt, &oa, &a, err);
    }
    st_prof_end(&po);
    return st;
}

/* After the update: every rank's shard of the weights to every rank, part by part (parts:
 * [0, cuts[0]), [cuts[i], cuts[i+1]), ..., [last cut, n)) on the communication thread. */
static st_status gather_start(st_step *s, st_err *err) {
    size_t np = s->m->n_params;
    int nparts = s->n_cuts + 1;
    free(s->gticket);
    if (!(s->gticket = calloc((size_t)nparts, sizeof *s->gticket))) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    for (int i = 0; i < nparts; i++) {
        size_t a = i ? s->cuts[i - 1] : 0, e = i < s->n_cuts ? s->cuts[i] : np;
        if (e <= a) continue;
        st_status st = st_comm_async_gather(s->comm, s->m->params, a, e, s->bounds, &s->gticket[i], err);
        if (st) return st;
    }
    s->g_next = 0;
    return ST_OK;
}

/* The forward's weight hook: the parts up to offset + n are here. */
static void dist_weights_ready(void *ctx, size_t offset, size_t n) {
    st_step *s = ctx;
    int nparts = s->n_cuts + 1, last = -1;
    for (int i = s->g_next; i < nparts; i++) {
        size_t a = i ? s->cuts[i - 1] : 0;
        if (a >= offset + n) break;
        if (s->gticket[i]) last = i;
        s->g_next = i + 1;
    }
    if (last < 0 || s->gst) return;
    double t = st_now();
    st_prof_span pw = st_prof_begin(ST_PROF_CAT_OTHER, "weights gather wait", last);
    s->gst = st_comm_async_wait_ticket(s->comm, s->gticket[last], &s->gerr);
    st_prof_end(&pw);
    s->gwait_s += st_now() - t;
}

st_status st_step_sync(st_step *s, st_err *err) {
    if (!s->comm || !s->gticket || s->g_next < 0) return ST_OK;
    double t = st_now();
    st_status st = st_comm_async_wait(s->comm, "weights gather", err);
    s->gwait_s += st_now() - t;
    s->g_next = -1; /* nothing in flight */
    return st;
}

/* The ranks' step (st_step_set_dist). Each rank's micro-batches are its own; the step's
 * target count and loss are summed over the ranks, so the dloss and the loss are one
 * process's with n_micro x size micro-batches (rank r's k-th micro-batch is that process's
 * (k size + r)-th, as the loader's global order gives them). */
static st_status step_run_dist(st_step *s, int n_micro, size_t N, const int32_t *inputs, const int32_t *targets,
                               const st_step_hp *hp, st_step_result *r, st_err *err) {
    st_model *m = s->m;
    st_comm *c = s->comm;
    int W = st_comm_size(c);
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
    int waiting = s->gticket && s->g_next >= 0; /* the last update's weights still arriving */
    s->gwait_s = 0;
    s->gst = ST_OK;
    for (int k = 0; k < n_micro; k++) {
        const int32_t *in = inputs + (size_t)k * N, *tg = targets + (size_t)k * N;
        if (waiting) {
            m->weight_hook = k == 0 ? dist_weights_ready : NULL;
            m->weight_hook_ctx = s;
        }
        /* this micro-batch's gradient is reduced as backward completes each block (ZeRO 2:
         * every micro-batch, onto the shard's running sum; 0 and 1: the last, with the sum
         * of the others added first) */
        int reduce_now = s->zero == 2 || k == n_micro - 1;
        dist_hook dh = {.s = s, .accumulate = s->zero == 2 && k > 0, .add_gacc = s->zero != 2 && n_micro > 1,
                        .done_lo = m->n_params, .err = err};
        if (reduce_now) {
            m->grad_hook = dist_grad_ready;
            m->grad_hook_ctx = &dh;
        }
        float mean;
        if ((st = step_docs(s, k, N, err))) return st;
        st = dist_micro(s, in, tg, dloss, &mean, r, err);
        m->grad_hook = NULL;
        if (st) return st;
        if (waiting && k == 0) {
            m->weight_hook = NULL;
            r->comm_wait_s += s->gwait_s;
            if (s->gst) {
                *err = s->gerr;
                return s->gst;
            }
            if ((st = st_step_sync(s, err))) return st; /* every part was waited for: returns at once */
        }
        st_failpoint("dist_backward_done"); /* tests: a rank lost mid-step */
        /* the step's loss: this micro-batch's share, the shares of all ranks summed in rank
         * order below (one micro-batch a rank: the one process's order exactly) */
        loss[0] += st_step_micro_loss(mean, tg, N, n_micro * W, total);
        if (!reduce_now && n_micro > 1) { /* ZeRO 0 and 1: summed here first, reduced with the last */
            st_prof_span pa = st_prof_begin(ST_PROF_CAT_OPTIM, "accumulate", k);
            accumulate(s->gacc, m->grads, m->n_params, k == 0 ? 0 : 1);
            st_prof_end(&pa);
        }
        if (reduce_now) { /* the ranges the hook did not reduce during backward, then the wait */
            m->grad_hook = NULL;
            size_t first = dh.done_lo < dh.done_hi ? dh.done_lo : m->n_params, last = dh.done_hi;
            if (first > 0) reduce_range(&dh, 0, first);
            if (last < m->n_params && dh.done_lo < dh.done_hi) reduce_range(&dh, last, m->n_params);
            if (dh.st) return dh.st;
            double tw = st_now();
            st_prof_span pw = st_prof_begin(ST_PROF_CAT_OTHER, "gradient reduce wait", -1);
            st = st_comm_async_wait(c, "gradient reduce", err);
            st_prof_end(&pw);
            r->comm_wait_s += st_now() - tw;
            if (st) return st;
        }
    }
    if ((st = st_comm_allreduce_f64(c, loss, 1, "loss", err))) return st;
    r->loss = loss[0];
    double t3 = st_now();
    const float *g = s->shard;
    size_t glo = s->lo, ghi = s->hi;
    if (s->zero == 0) { /* the summed gradient on every rank, then the whole update everywhere */
        memcpy(m->grads + s->lo, s->shard, (s->hi - s->lo) * sizeof(float));
        st_comm_req *q;
        if ((st = st_comm_iallgather_f32(c, m->grads, 0, m->n_params, s->bounds, &q, err)) ||
            (st = dist_wait(s, q, "gradient gather", r, err)))
            return st;
        g = m->grads;
        glo = 0;
        ghi = m->n_params;
    }
    double sumsq;
    st_prof_span pn = st_prof_begin(ST_PROF_CAT_OPTIM, "grad norm", -1);
    st = dist_sumsq(s, g, glo, ghi, &sumsq, err);
    st_prof_end(&pn);
    if (st) return st;
    st_failpoint("dist_before_update"); /* tests: a rank lost before its update (its store not committed) */
    if ((st = step_update(s, g, sumsq, hp, r, err))) return st;
    if (s->sx && !r->skipped) st_stream_params_changed(s->sx); /* its device copies of the embedding and head */
    if (s->zero && !r->skipped && s->overlap_gather && s->n_cuts > 0) { /* waited for by the next forward */
        if ((st = gather_start(s, err))) return st;
    } else if (s->zero && !r->skipped) { /* every rank's updated shard to every rank */
        st_comm_req *q;
        if ((st = st_comm_iallgather_f32(c, m->params, 0, m->n_params, s->bounds, &q, err)) ||
            (st = dist_wait(s, q, "weights gather", r, err)))
            return st;
    }
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
    if (s->comm) return step_run_dist(s, n_micro, N, inputs, targets, hp, r, err);
    if (s->sx) {
        if ((st = step_docs(s, 0, N, err))) return st; /* every micro-batch's, from the first */
        st_stream_step_stats *ss = &r->stream;
        st_adamw_params a = hp->adam;
        if ((st = st_stream_step_accum(s->sx, n_micro, inputs, targets, &a, hp->grad_clip, ss, err))) return st;
        st_step_dloss(targets, N * (size_t)n_micro, &r->n_targets);
        r->loss = ss->loss;
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
    for (int k = 0; k < n_micro; k++) {
        const int32_t *in = inputs + (size_t)k * N, *tg = targets + (size_t)k * N;
        if ((st = step_docs(s, k, N, err))) return st;
        float mean = micro_step(m, in, tg, dloss, r);
        if (n_micro > 1) {
            st_prof_span pa = st_prof_begin(ST_PROF_CAT_OPTIM, "accumulate", k);
            accumulate(s->gacc, m->grads, m->n_params, k == 0 ? 0 : k < n_micro - 1 ? 1 : 2);
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
