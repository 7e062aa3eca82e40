/* stream.c - the layer-streaming executor (see strata/stream.h for the schedule).
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
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "optim/adamw_kernels.h" /* SUMSQ_CHUNK: partial norms in the engine's own order */
#include "strata/prof.h"
#include "strata/train.h"
#include "strata/store.h"
#include "strata/stream.h"
#include "strata/tier.h"

/* ------------------------------------------------------------------ plan */

void stream_plan_default(stream_plan *p, int n_layer) {
    memset(p, 0, sizeof *p);
    p->prefetch_depth = 1;
    p->overlap_optim = 1;
    p->clip = STREAM_CLIP_AUTO;
    p->grad_dtype = ST_F32;
    p->optim_threads = 1;
    p->n_layer = n_layer;
    stream_plan_set_all(p, STREAM_ACT_RECOMPUTE);
}

void stream_plan_set_all(stream_plan *p, stream_act a) {
    int L = p->n_layer < STREAM_MAX_LAYERS ? p->n_layer : STREAM_MAX_LAYERS;
    for (int l = 0; l < L; l++) p->act[l] = (unsigned char)a;
}

/* ------------------------------------------------------------------ a traced copy backend
 * The copy engine calls its backend's copy ops on its worker thread; wrapping them puts
 * every transfer in the trace as a COPY span with its bytes, on the copy thread (so it
 * is not counted as exposed transfer time of the step thread). */

typedef struct traced_be {
    st_backend base; /* first: the engine passes &base */
    st_backend_ops ops;
    st_backend *inner;
} traced_be;

static void traced_h2d(st_backend *be, void *dst, const void *src, size_t bytes) {
    traced_be *t = (traced_be *)be;
    prof_thread_name("copy engine");
    prof_span s = prof_begin(PROF_CAT_COPY, "h2d", -1);
    t->inner->ops->copy_to_device(t->inner, dst, src, bytes);
    prof_end_bytes(&s, (int64_t)bytes);
}

static void traced_d2h(st_backend *be, void *dst, const void *src, size_t bytes) {
    traced_be *t = (traced_be *)be;
    prof_thread_name("copy engine");
    prof_span s = prof_begin(PROF_CAT_COPY, "d2h", -1);
    t->inner->ops->copy_to_host(t->inner, dst, src, bytes);
    prof_end_bytes(&s, (int64_t)bytes);
}

/* ------------------------------------------------------------------ the executor */

typedef struct opt_job { int block; uint64_t ticket; } opt_job; /* block -1: embedding and head */

struct stream_exec {
    stream_config cfg;
    stream_plan plan;
    st_backend *dev;
    traced_be tbe;
    st_copy_engine *ce;
    gpt2_model m;   /* shell on the device: blocks, activations (vocabulary 2 when chunked) */
    gpt2_model lay; /* the real layout: tensor table, offsets of the host vectors */
    /* chunked classifier (plan.vocab_chunk > 0): wte stays on the host and crosses in
     * chunks of vc rows, twice per step; the embedding runs on the host */
    int vc, nvc;
    st_backend *host_be;
    float *d_vw, *d_vg, *d_logits, *d_lnfo, *d_dlnf, *d_lmean, *d_lrstd, *d_rmax, *d_tlogit;
    double *d_rsum;
    int32_t *d_tgt, *h_inp;
    float *h_enc, *h_dres;
    float *h_logits;          /* chunked classifier: every chunk's forward logits (N x V), so
                                 backward fetches them instead of recomputing the GEMM */
    uint64_t *vw_ticket, vg_ticket[2];
    int L, depth, nslots, n_keep, n_off, has_rc;
    size_t n, bn, b0, emb_n, lnf_off, NC, setf;

    /* host tier */
    float *hp, *hg;
    uint16_t *hg16;            /* bf16 drain: block gradients as drained (flat index) */
    int bf16;
    optim *opt;
    optim_segment *segs;
    float *bk_p, *bk_m, *bk_v; /* speculative backups, n each */
    float *host_acts;          /* offloaded activation sets, n_off x setf */
    int *ord;                  /* per block: index among kept or offloaded blocks */

    /* device tier */
    float *d_emb_w, *d_lnf_w, *d_emb_g, *d_lnf_g, *d_outs, *d_w, *d_g, *d_keep, *d_rc, *d_off;
    uint16_t *d_g16; /* bf16 drain: two staging slots */

    uint64_t *w_ticket, *act_ticket, g_ticket[2], off_slot_ticket[2], nb_ticket;
    uint64_t h2d_bytes, d2h_bytes; /* submitted, cumulative */
    uint64_t h2d_act_bytes, d2h_act_bytes; /* of which offloaded activations */
    double wait_s;

    /* optimizer worker */
    pthread_t th;
    int th_started;
    pthread_mutex_t mu;
    pthread_cond_t cv_job, cv_done;
    opt_job *jobs;
    int n_jobs, jobs_done, stop;
    int speculate; /* this step's jobs update (1) or only sum norms (0) */
    st_store *store; /* external optimizer: the disk state store */
    const void *store_blob;
    size_t store_blob_bytes;
    int external;
    int last_clipped; /* the previous step clipped or skipped (STREAM_CLIP_AUTO defers) */
    adamw_params job_hp;
    size_t nchunks, landed_lo;
    double *chunk_part;
    unsigned char *chunk_done;
    st_status worker_status;
    st_err worker_err;
};

static size_t rnd(size_t bytes) { return (bytes + ST_ARENA_ALIGN - 1) / ST_ARENA_ALIGN * ST_ARENA_ALIGN; }

static uint64_t h2d(stream_exec *x, void *dst, const void *src, size_t bytes) {
    x->h2d_bytes += bytes;
    return st_copy_h2d(x->ce, dst, src, bytes);
}

static uint64_t d2h(stream_exec *x, void *dst, const void *src, size_t bytes) {
    x->d2h_bytes += bytes;
    return st_copy_d2h(x->ce, dst, src, bytes);
}

/* Wait on the step thread; the wait (not the copy) is the exposed transfer time. */
static void wait_ticket(stream_exec *x, uint64_t t, const char *what, int index) {
    if (!t || st_copy_done(x->ce, t)) return;
    double t0 = st_now();
    prof_span s = prof_begin(PROF_CAT_COPY, what, index);
    st_copy_wait(x->ce, t);
    prof_end(&s);
    x->wait_s += st_now() - t0;
}

size_t stream_device_bytes(const stream_config *c, const stream_plan *p) {
    const gpt2_config *g = &c->model;
    size_t C = (size_t)g->n_embd, L = (size_t)g->n_layer, V = (size_t)g->vocab_size, maxT = (size_t)g->max_seq;
    size_t N = (size_t)c->B * c->T, NC = N * C, NH = (size_t)g->n_head;
    size_t bn = 12 * C * C + 13 * C, emb = (V + maxT) * C, setf = NC * 15 + N * 4 + NH * N;
    size_t n_keep = 0, n_off = 0, rc = 0;
    for (size_t l = 0; l < L; l++) {
        if (p->act[l] == STREAM_ACT_KEEP) n_keep++;
        else if (p->act[l] == STREAM_ACT_OFFLOAD) n_off++;
        else rc = 1;
    }
    size_t b = 0;
    gpt2_config dg = *g;
    if (p->vocab_chunk > 0) {
        size_t vc = (size_t)p->vocab_chunk < V ? (size_t)p->vocab_chunk : V;
        dg.vocab_size = 2;
        b += 4 * rnd(vc * C * 4);                               /* wte chunk slots, weights and grads */
        size_t nvc = (V + vc - 1) / vc, slots = nvc < 2 ? 1 : 2;
        b += rnd(slots * N * vc * 4) + 2 * rnd(NC * 4);          /* logits chunk slots, ln_f output and its grad */
        b += 5 * rnd(N * 4) + rnd(N * 8);                       /* row statistics, targets */
    } else {
        b += 2 * rnd(emb * 4);                                  /* embedding weights and grads */
    }
    b += 2 * rnd(2 * C * 4);                                    /* ln_f weights and grads */
    b += rnd(gpt2_act_bytes_layers(&dg, c->B, c->T, 0));        /* shared activations and scratch */
    b += rnd(L * NC * 4);                                       /* block outputs (checkpoints) */
    b += rnd((size_t)(p->prefetch_depth + 1) * bn * 4);         /* weight slots */
    b += rnd(2 * bn * 4);                                       /* gradient slots */
    if (p->grad_dtype == ST_BF16) b += rnd(2 * bn * 2);         /* their bf16 staging */
    if (n_keep) b += rnd(n_keep * setf * 4);
    if (rc) b += rnd(setf * 4);
    if (n_off) b += rnd((n_off < 2 ? n_off : 2) * setf * 4);
    return b;
}

/* ------------------------------------------------------------------ optimizer worker */

/* Sum-of-squares partials of every 65536-element chunk of [lo, hi) not yet taken. */
static void take_chunks(stream_exec *x, size_t lo, size_t hi) {
    for (size_t c = lo / SUMSQ_CHUNK; c < x->nchunks; c++) {
        size_t a = c * SUMSQ_CHUNK, b = a + SUMSQ_CHUNK < x->n ? a + SUMSQ_CHUNK : x->n;
        if (a < lo || b > hi || x->chunk_done[c]) continue;
        if (!x->bf16) {
            x->chunk_part[c] = optim_grad_sumsq(x->hg + a, ST_F32, b - a);
        } else {
            /* blocks are bf16, the embedding and ln_f fp32: split the chunk where they meet */
            size_t e = x->b0 + (size_t)x->L * x->bn;
            double part = 0;
            for (size_t u = a; u < b;) {
                int blk = u >= x->b0 && u < e;
                size_t w = blk ? (b < e ? b : e) : (u < x->b0 ? (b < x->b0 ? b : x->b0) : b);
                part += blk ? optim_grad_sumsq(x->hg16 + u, ST_BF16, w - u)
                            : optim_grad_sumsq(x->hg + u, ST_F32, w - u);
                u = w;
            }
            x->chunk_part[c] = part;
        }
        x->chunk_done[c] = 1;
    }
}

static double chunks_total(const stream_exec *x) {
    double total = 0; /* in chunk order, as optim_grad_sumsq adds its partials */
    for (size_t c = 0; c < x->nchunks; c++) total += x->chunk_part[c];
    return total;
}

static void backup_range(stream_exec *x, size_t lo, size_t hi) {
    size_t b;
    float *m = optim_state_buffer(x->opt, 0, &b), *v = optim_state_buffer(x->opt, 1, &b);
    size_t o = lo - x->b0; /* backups hold [b0, lnf_off) */
    memcpy(x->bk_p + o, x->hp + lo, (hi - lo) * sizeof(float));
    memcpy(x->bk_m + o, m + lo, (hi - lo) * sizeof(float));
    memcpy(x->bk_v + o, v + lo, (hi - lo) * sizeof(float));
}

/* On the step thread after backward, when the device is idle: every core copies. */
static void restore_range(stream_exec *x, size_t lo, size_t hi) {
    size_t b;
    float *m = optim_state_buffer(x->opt, 0, &b), *v = optim_state_buffer(x->opt, 1, &b);
    const size_t piece = 1u << 18;
    long np = (long)((hi - lo + piece - 1) / piece);
#pragma omp parallel for schedule(static)
    for (long i = 0; i < np; i++) {
        size_t a = lo + (size_t)i * piece, e = a + piece < hi ? a + piece : hi;
        memcpy(x->hp + a, x->bk_p + (a - x->b0), (e - a) * sizeof(float));
        memcpy(m + a, x->bk_m + (a - x->b0), (e - a) * sizeof(float));
        memcpy(v + a, x->bk_v + (a - x->b0), (e - a) * sizeof(float));
    }
}

static st_status update_range(stream_exec *x, int s0, int s1, const adamw_params *hp, double sumsq, int blocks,
                              st_err *err) {
    int b16 = blocks && x->bf16;
    optim_step_args a = {.params = x->hp, .grads = b16 ? (const void *)x->hg16 : (const void *)x->hg,
                         .grad_dtype = b16 ? ST_BF16 : ST_F32, .seg_begin = s0, .seg_end = s1, .grad_sumsq = sumsq};
    return optim_step_ex(x->opt, &a, hp, err);
}

/* Segments [s0, s1): tensors 0-1 are wte/wpe, the last two ln_f, the rest the blocks,
 * whose gradients are bf16 when the plan drains bf16. */
static st_status update_segs(stream_exec *x, int s0, int s1, const adamw_params *hp, double sumsq, st_err *err) {
    int nt = x->lay.n_tensors, cuts[4] = {0, 2, nt - 2, nt};
    for (int i = 0; i < 3; i++) {
        int a = s0 > cuts[i] ? s0 : cuts[i], b = s1 < cuts[i + 1] ? s1 : cuts[i + 1];
        if (a >= b) continue;
        st_status st = update_range(x, a, b, hp, sumsq, i == 1, err);
        if (st) return st;
    }
    return ST_OK;
}

static void run_job(stream_exec *x, const opt_job *j) {
    st_copy_wait(x->ce, j->ticket); /* the gradient has landed on the host */
    int l = j->block, nt = x->lay.n_tensors;
    prof_span s = prof_begin(PROF_CAT_OPTIM, l >= 0 ? "optim block" : "optim embed+head", l);
    if (l >= 0) {
        size_t lo = x->b0 + (size_t)l * x->bn;
        if (lo < x->landed_lo) x->landed_lo = lo;
        take_chunks(x, x->landed_lo, x->lnf_off); /* ln_f lands last, with the embedding */
    } else {
        take_chunks(x, 0, x->n);
    }
    if (x->speculate && l >= 0) {
        /* clip scale 1 and a finite sum (the real one is checked after the last block).
         * The embedding and ln_f (the last job) are not speculated: once they land the
         * whole norm is known, and the step thread updates them with every core. */
        size_t lo = x->b0 + (size_t)l * x->bn;
        backup_range(x, lo, lo + x->bn);
        int per = (nt - 4) / x->L; /* tensors per block */
        st_status st = update_segs(x, 2 + l * per, 2 + (l + 1) * per, &x->job_hp, 0.0, &x->worker_err);
        if (st && !x->worker_status) x->worker_status = st;
    }
    prof_end(&s);
}

static void *opt_worker(void *arg) {
    stream_exec *x = arg;
    /* the step thread's compute keeps its own OpenMP team; this one is small on purpose */
    omp_set_num_threads(x->plan.optim_threads > 0 ? x->plan.optim_threads : 1);
    prof_thread_name("optimizer");

    pthread_mutex_lock(&x->mu);
    for (;;) {
        while (x->jobs_done == x->n_jobs && !x->stop) pthread_cond_wait(&x->cv_job, &x->mu);
        if (x->jobs_done == x->n_jobs && x->stop) break;
        opt_job j = x->jobs[x->jobs_done];
        pthread_mutex_unlock(&x->mu);
        run_job(x, &j);
        pthread_mutex_lock(&x->mu);
        x->jobs_done++;
        pthread_cond_broadcast(&x->cv_done);
    }
    pthread_mutex_unlock(&x->mu);
    return NULL;
}

static void push_job(stream_exec *x, int block, uint64_t ticket) {
    pthread_mutex_lock(&x->mu);
    x->jobs[x->n_jobs++] = (opt_job){block, ticket};
    pthread_cond_signal(&x->cv_job);
    pthread_mutex_unlock(&x->mu);
}

static void wait_jobs(stream_exec *x) {
    pthread_mutex_lock(&x->mu);
    while (x->jobs_done < x->n_jobs) pthread_cond_wait(&x->cv_done, &x->mu);
    pthread_mutex_unlock(&x->mu);
}

/* ------------------------------------------------------------------ create / free */

st_status stream_exec_create(stream_exec **out, const stream_config *c, const stream_plan *p, st_backend *dev,
                             st_err *err) {
    *out = NULL;
    st_status s = gpt2_config_validate(&c->model, err);
    if (s) return s;
    int L = c->model.n_layer;
    if (p->n_layer != L)
        return st_errf(err, ST_ERR_INVALID, "stream plan is for %d blocks, the model has %d", p->n_layer, L);
    if ((int)p->clip < STREAM_CLIP_SPECULATE || p->clip > STREAM_CLIP_AUTO)
        return st_errf(err, ST_ERR_INVALID, "stream plan: clip mode %d unknown (speculate, defer or auto)", (int)p->clip);
    if (p->prefetch_depth < 1 || p->prefetch_depth > 64)
        return st_errf(err, ST_ERR_INVALID, "stream plan: prefetch depth %d out of range [1, 64]", p->prefetch_depth);
    if (p->grad_dtype != ST_F32 && p->grad_dtype != ST_BF16)
        return st_errf(err, ST_ERR_UNSUPPORTED,
                       "stream plan: gradient drain dtype %s is not supported (use F32 or BF16)",
                       st_dtype_name(p->grad_dtype));
    for (int l = 0; l < L; l++)
        if (p->act[l] > STREAM_ACT_OFFLOAD)
            return st_errf(err, ST_ERR_INVALID, "stream plan: block %d has unknown activation policy %d", l, p->act[l]);
    if (c->B < 1 || c->T < 1 || c->T > c->model.max_seq)
        return st_errf(err, ST_ERR_INVALID, "stream: batch %d x seq %d (max_seq %d)", c->B, c->T, c->model.max_seq);
    st_arena *arena = st_backend_arena(dev);
    size_t need = stream_device_bytes(c, p);
    if (arena && need > st_arena_budget(arena) - st_arena_used(arena))
        return st_errf(err, ST_ERR_NOMEM,
                       "stream plan needs %zu device bytes, the device has %zu free of a %zu budget: %zu bytes missing "
                       "(fewer prefetched blocks, recompute instead of keep, a smaller batch, or a larger budget)",
                       need, st_arena_budget(arena) - st_arena_used(arena), st_arena_budget(arena),
                       need - (st_arena_budget(arena) - st_arena_used(arena)));

    stream_exec *x = calloc(1, sizeof *x);
    if (!x) return st_errf(err, ST_ERR_NOMEM, "stream: out of memory");
    x->cfg = *c;
    x->plan = *p;
    x->dev = dev;
    x->L = L;
    x->depth = p->prefetch_depth;
    x->nslots = x->depth + 1;
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->cv_job, NULL);
    pthread_cond_init(&x->cv_done, NULL);
#define FAIL(code, ...) do { s = st_errf(err, code, __VA_ARGS__); goto fail; } while (0)
    gpt2_config dcfg = c->model;
    if (p->vocab_chunk > 0) {
        dcfg.vocab_size = 2; /* the device shell never holds wte or the full logits (2: the least valid) */
        x->vc = p->vocab_chunk < c->model.vocab_size ? p->vocab_chunk : c->model.vocab_size;
        x->nvc = (c->model.vocab_size + x->vc - 1) / x->vc;
    }
    x->host_be = c->host_be ? c->host_be : dev;
    if ((s = gpt2_create_shell(&x->lay, &c->model, dev, err))) goto fail;
    if ((s = gpt2_create_shell(&x->m, &dcfg, dev, err))) goto fail;
    x->n = x->lay.n_params;
    x->bn = x->lay.block_numel;
    x->b0 = x->lay.block_offset0;
    x->emb_n = x->b0;
    x->lnf_off = x->n - 2 * (size_t)c->model.n_embd;
    if ((s = gpt2_alloc_acts_layers(&x->m, c->B, c->T, 0, err))) goto fail;
    x->NC = (size_t)c->B * c->T * c->model.n_embd;
    x->setf = gpt2_block_act_floats(&x->m);

    x->ord = calloc((size_t)L, sizeof *x->ord);
    x->w_ticket = calloc((size_t)L, sizeof *x->w_ticket);
    x->act_ticket = calloc((size_t)L, sizeof *x->act_ticket);
    x->jobs = calloc((size_t)L + 1, sizeof *x->jobs);
    if (!x->ord || !x->w_ticket || !x->act_ticket || !x->jobs) FAIL(ST_ERR_NOMEM, "stream: out of memory");
    for (int l = 0; l < L; l++) {
        if (p->act[l] == STREAM_ACT_KEEP) x->ord[l] = x->n_keep++;
        else if (p->act[l] == STREAM_ACT_OFFLOAD) x->ord[l] = x->n_off++;
        else x->has_rc = 1;
    }

    /* device tier */
    st_backend_ops const *o = dev->ops;
    size_t N = (size_t)c->B * c->T, C = (size_t)c->model.n_embd;
    if (x->vc) {
        x->d_vw = o->alloc(dev, 2 * (size_t)x->vc * C * 4);
        x->d_vg = o->alloc(dev, 2 * (size_t)x->vc * C * 4);
        /* two slots (one fills while one is used), one when the vocabulary is one chunk */
        x->d_logits = o->alloc(dev, (x->nvc < 2 ? 1 : 2) * N * (size_t)x->vc * 4);
        x->d_lnfo = o->alloc(dev, N * C * 4);
        x->d_dlnf = o->alloc(dev, N * C * 4);
        x->d_lmean = o->alloc(dev, N * 4);
        x->d_lrstd = o->alloc(dev, N * 4);
        x->d_rmax = o->alloc(dev, N * 4);
        x->d_tlogit = o->alloc(dev, N * 4);
        x->d_rsum = o->alloc(dev, N * 8);
        x->d_tgt = o->alloc(dev, N * 4);
        if (!x->d_vw || !x->d_vg || !x->d_logits || !x->d_lnfo || !x->d_dlnf || !x->d_lmean || !x->d_lrstd ||
            !x->d_rmax || !x->d_tlogit || !x->d_rsum || !x->d_tgt)
            FAIL(ST_ERR_NOMEM, "stream: device allocation of the plan's %zu bytes failed", need);
        x->h_inp = malloc(N * 4);
        x->h_enc = st_alloc(N * C * 4);
        x->h_dres = st_alloc(N * C * 4);
        /* only chunks 0..nvc-3 leave the device (the last two stay in their slots) */
        x->h_logits = x->nvc > 2 ? st_alloc(N * (size_t)(x->nvc - 2) * (size_t)x->vc * 4) : NULL;
        x->vw_ticket = calloc((size_t)x->nvc, sizeof *x->vw_ticket);
        if (!x->h_inp || !x->h_enc || !x->h_dres || (x->nvc > 2 && !x->h_logits) || !x->vw_ticket)
            FAIL(ST_ERR_NOMEM, "stream: out of memory");
    } else {
        x->d_emb_w = o->alloc(dev, x->emb_n * 4);
        x->d_emb_g = o->alloc(dev, x->emb_n * 4);
    }
    x->d_lnf_w = o->alloc(dev, 2 * (size_t)c->model.n_embd * 4);
    x->d_lnf_g = o->alloc(dev, 2 * (size_t)c->model.n_embd * 4);
    x->d_outs = o->alloc(dev, (size_t)L * x->NC * 4);
    x->d_w = o->alloc(dev, (size_t)x->nslots * x->bn * 4);
    x->d_g = o->alloc(dev, 2 * x->bn * 4);
    x->bf16 = p->grad_dtype == ST_BF16;
    if (x->bf16) {
        x->d_g16 = o->alloc(dev, 2 * x->bn * 2);
        x->hg16 = st_alloc(x->n * 2);
        if (!x->d_g16 || !x->hg16) FAIL(ST_ERR_NOMEM, "stream: cannot allocate the bf16 gradient buffers");
    }
    if (x->n_keep) x->d_keep = o->alloc(dev, (size_t)x->n_keep * x->setf * 4);
    if (x->has_rc) x->d_rc = o->alloc(dev, x->setf * 4);
    if (x->n_off) x->d_off = o->alloc(dev, (size_t)(x->n_off < 2 ? x->n_off : 2) * x->setf * 4);
    if ((!x->vc && (!x->d_emb_w || !x->d_emb_g)) || !x->d_lnf_w || !x->d_lnf_g || !x->d_outs || !x->d_w || !x->d_g ||
        (x->n_keep && !x->d_keep) || (x->has_rc && !x->d_rc) || (x->n_off && !x->d_off))
        FAIL(ST_ERR_NOMEM, "stream: device allocation of the plan's %zu bytes failed", need);
    x->m.emb_w = x->d_emb_w;
    x->m.emb_g = x->d_emb_g;
    x->m.lnf_w = x->d_lnf_w;
    x->m.lnf_g = x->d_lnf_g;

    /* host tier */
    x->hp = st_alloc(x->n * 4);
    x->hg = st_alloc(x->n * 4);
    if (!x->hp || !x->hg) FAIL(ST_ERR_NOMEM, "stream: cannot allocate %zu host bytes of parameters and gradients",
                               x->n * 8);
    if (x->n_off) {
        x->host_acts = st_alloc((size_t)x->n_off * x->setf * 4);
        if (!x->host_acts) FAIL(ST_ERR_NOMEM, "stream: cannot allocate host memory for offloaded activations");
    }
    x->segs = calloc((size_t)x->lay.n_tensors, sizeof *x->segs);
    if (!x->segs) FAIL(ST_ERR_NOMEM, "stream: out of memory");
    train_decay_segments(x->lay.tensors, x->lay.n_tensors, c->weight_decay, x->segs);
    x->external = c->external_optimizer;
    if (!x->external && (s = optim_create(&x->opt, x->segs, x->lay.n_tensors, OPTIM_STATE_F32, err))) goto fail;
    if (!x->external && p->overlap_optim && p->clip != STREAM_CLIP_DEFER) {
        /* only the blocks are updated speculatively: backups of [b0, lnf_off), indexed from b0 */
        size_t nb = x->lnf_off - x->b0;
        x->bk_p = st_alloc(nb * 4);
        x->bk_m = st_alloc(nb * 4);
        x->bk_v = st_alloc(nb * 4);
        if (!x->bk_p || !x->bk_m || !x->bk_v)
            FAIL(ST_ERR_NOMEM, "stream: cannot allocate %zu host bytes of speculative-update backups", x->n * 12);
    }
    x->nchunks = (x->n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    x->chunk_part = calloc(x->nchunks, sizeof *x->chunk_part);
    x->chunk_done = calloc(x->nchunks, 1);
    if (!x->chunk_part || !x->chunk_done) FAIL(ST_ERR_NOMEM, "stream: out of memory");

    /* engines */
    x->tbe.inner = dev;
    x->tbe.ops = *dev->ops;
    x->tbe.ops.copy_to_device = traced_h2d;
    x->tbe.ops.copy_to_host = traced_d2h;
    x->tbe.base.ops = &x->tbe.ops;
    x->tbe.base.ctx = dev->ctx;
    if ((s = st_copy_engine_create(&x->ce, &x->tbe.base, err))) goto fail;
    if (p->overlap_optim) {
        if (pthread_create(&x->th, NULL, opt_worker, x) != 0)
            FAIL(ST_ERR_NOMEM, "stream: cannot start the optimizer thread");
        x->th_started = 1;
    }
#undef FAIL
    *out = x;
    return ST_OK;
fail:
    stream_exec_free(x);
    return s;
}

void stream_exec_free(stream_exec *x) {
    if (!x) return;
    if (x->th_started) {
        pthread_mutex_lock(&x->mu);
        x->stop = 1;
        pthread_cond_broadcast(&x->cv_job);
        pthread_mutex_unlock(&x->mu);
        pthread_join(x->th, NULL);
    }
    st_copy_engine_destroy(x->ce); /* waits for outstanding copies before buffers go */
    st_backend *dev = x->dev;
    void *dbufs[] = {x->d_emb_w, x->d_emb_g, x->d_lnf_w, x->d_lnf_g, x->d_outs, x->d_w, x->d_g, x->d_keep, x->d_rc,
                     x->d_off, x->d_vw, x->d_vg, x->d_logits, x->d_lnfo, x->d_dlnf, x->d_lmean, x->d_lrstd,
                     x->d_rmax, x->d_tlogit, x->d_rsum, x->d_tgt, x->d_g16};
    for (size_t i = 0; i < sizeof dbufs / sizeof dbufs[0]; i++)
        if (dbufs[i]) dev->ops->dealloc(dev, dbufs[i]);
    gpt2_free(&x->m);
    gpt2_free(&x->lay);
    st_free(x->hp);
    st_free(x->hg);
    st_free(x->hg16);
    st_free(x->bk_p);
    st_free(x->bk_m);
    st_free(x->bk_v);
    st_free(x->host_acts);
    free(x->h_inp);
    st_free(x->h_enc);
    st_free(x->h_dres);
    st_free(x->h_logits);
    free(x->vw_ticket);
    optim_free(x->opt);
    free(x->segs);
    free(x->ord);
    free(x->w_ticket);
    free(x->act_ticket);
    free(x->jobs);
    free(x->chunk_part);
    free(x->chunk_done);
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->cv_job);
    pthread_cond_destroy(&x->cv_done);
    free(x);
}

float *stream_params(stream_exec *x) { return x->hp; }
float *stream_grads(stream_exec *x) { return x->hg; }
const gpt2_model *stream_model(const stream_exec *x) { return &x->lay; }
optim *stream_optim(stream_exec *x) { return x->opt; }

st_status stream_attach_store(stream_exec *x, st_store *store, const void *blob, size_t blob_bytes, st_err *err) {
    if (!x->external)
        return st_errf(err, ST_ERR_INVALID, "stream: a state store needs stream_config.external_optimizer = 1");
    if (x->bf16)
        return st_errf(err, ST_ERR_UNSUPPORTED, "stream: the disk state takes fp32 gradients; drain them as fp32");
    if (st_store_numel(store) != x->n)
        return st_errf(err, ST_ERR_SHAPE, "stream: the state store holds %zu parameters, the model %zu",
                       st_store_numel(store), x->n);
    x->store = store;
    x->store_blob = blob;
    x->store_blob_bytes = blob_bytes;
    return ST_OK;
}

static const void *ext_grads_at(void *ctx, size_t first, size_t n) {
    (void)n;
    return ((stream_exec *)ctx)->hg + first;
}
static void *ext_work_at(void *ctx, size_t first, size_t n) {
    (void)n;
    return ((stream_exec *)ctx)->hp + first;
}

/* The embedding and head weights live on the device between steps: send them after
 * every change of the host copy. */
static void send_nonblock(stream_exec *x) {
    if (!x->vc) h2d(x, x->d_emb_w, x->hp, x->emb_n * 4);
    x->nb_ticket = h2d(x, x->d_lnf_w, x->hp + x->lnf_off, (x->n - x->lnf_off) * 4);
}

void stream_set_params(stream_exec *x, const float *host_params) {
    if (host_params != x->hp) memcpy(x->hp, host_params, x->n * 4); /* also: "I edited stream_params" */
    send_nonblock(x);
    st_copy_wait(x->ce, x->nb_ticket);
}

void stream_init_random(stream_exec *x, uint64_t seed) {
    /* gpt2_init_random fills params through its backend's copy; a host-side shell with
     * the host vector as its params gives the same values as an in-memory model */
    gpt2_model tmp;
    st_err err = {0};
    st_backend *cpu = NULL;
    /* threads 0: a positive count would set the calling thread's OpenMP team size */
    if (st_backend_cpu_create(&cpu, 0, &err) || gpt2_create_shell(&tmp, &x->cfg.model, cpu, &err)) {
        st_log(1, "stream: init failed: %s\n", err.msg);
        st_backend_free(cpu);
        return;
    }
    tmp.params = x->hp;
    gpt2_init_random(&tmp, seed);
    tmp.params = NULL;
    gpt2_free(&tmp);
    st_backend_free(cpu);
    send_nonblock(x);
    st_copy_wait(x->ce, x->nb_ticket);
}

/* ------------------------------------------------------------------ chunked classifier
 * The row statistics below are plain loops over device memory: on the CPU backend the
 * device arena is host-addressable; a CUDA backend gives them as kernels. */

static void fetch_vchunk(stream_exec *x, int c) {
    size_t C = (size_t)x->cfg.model.n_embd, r0 = (size_t)c * x->vc;
    size_t nr = r0 + x->vc <= (size_t)x->cfg.model.vocab_size ? (size_t)x->vc : x->cfg.model.vocab_size - r0;
    x->vw_ticket[c] = h2d(x, x->d_vw + (size_t)(c % 2) * x->vc * C, x->hp + r0 * C, nr * C * 4);
}

static int vchunk_rows(const stream_exec *x, int c) {
    int r0 = c * x->vc;
    return r0 + x->vc <= x->cfg.model.vocab_size ? x->vc : x->cfg.model.vocab_size - r0;
}

/* Pass 1 on one chunk of logits (N, nr) for vocabulary rows [r0, r0 + nr): running
 * max and sum of exponentials per row (online softmax), and the target's logit. */
static float *logits_slot(stream_exec *x, int c) {
    return x->d_logits + (size_t)(c % 2) * (size_t)x->cfg.B * x->cfg.T * x->vc;
}

static void ce_chunk_stats(stream_exec *x, const float *logits, int r0, int nr) {
    int N = x->cfg.B * x->cfg.T;
    const int32_t *tgt = x->d_tgt;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        int t = tgt[i];
        if (t < 0) continue;
        const float *l = logits + (size_t)i * nr;
        float mx = -INFINITY;
        for (int j = 0; j < nr; j++) mx = l[j] > mx ? l[j] : mx;
        if (mx > x->d_rmax[i]) {
            x->d_rsum[i] *= exp((double)x->d_rmax[i] - (double)mx); /* rescale the sum so far */
            x->d_rmax[i] = mx;
        }
        double sum = 0;
        float m = x->d_rmax[i];
        for (int j = 0; j < nr; j++) sum += expf(l[j] - m);
        x->d_rsum[i] += sum;
        if (t >= r0 && t < r0 + nr) x->d_tlogit[i] = l[t - r0];
    }
}

/* Pass 2: the chunk's logits become dlogits = (softmax - onehot) * dloss in place (0 for
 * masked rows), as the unchunked fused cross-entropy writes them. */
static void ce_chunk_grad(stream_exec *x, float *logits, int r0, int nr, float dloss) {
    int N = x->cfg.B * x->cfg.T;
    const int32_t *tgt = x->d_tgt;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *l = logits + (size_t)i * nr;
        int t = tgt[i];
        if (t < 0) { memset(l, 0, sizeof(float) * (size_t)nr); continue; }
        float m = x->d_rmax[i], sc = (float)(dloss / x->d_rsum[i]);
        for (int j = 0; j < nr; j++) l[j] = expf(l[j] - m) * sc;
        if (t >= r0 && t < r0 + nr) l[t - r0] -= dloss;
    }
}

static float chunked_head_forward(stream_exec *x, const float *xin, const int32_t *targets, double *compute_s) {
    st_backend *dev = x->dev;
    int N = x->cfg.B * x->cfg.T, C = x->cfg.model.n_embd;
    double t0 = st_now();
    prof_span sp = prof_begin(PROF_CAT_COMPUTE, "forward head ln_f", -1);
    dev->ops->layernorm_forward(dev, x->d_lnfo, x->d_lmean, x->d_lrstd, xin, x->d_lnf_w, x->d_lnf_w + C, N, C);
    for (int i = 0; i < N; i++) { x->d_rmax[i] = -INFINITY; x->d_rsum[i] = 0; x->d_tlogit[i] = 0; }
    prof_end(&sp);
    *compute_s += st_now() - t0;
    uint64_t lg[2] = {0, 0}; /* each slot's logits on their way to the host */
    for (int c = 0; c < x->nvc; c++) {
        wait_ticket(x, x->vw_ticket[c], "wait wte chunk", c);
        wait_ticket(x, lg[c % 2], "wait logits slot", c);
        int nr = vchunk_rows(x, c);
        float *lo = logits_slot(x, c);
        t0 = st_now();
        sp = prof_begin(PROF_CAT_COMPUTE, "forward head chunk", c);
        dev->ops->matmul_forward(dev, lo, x->d_lnfo, x->d_vw + (size_t)(c % 2) * x->vc * C, NULL, N, C, nr,
                                 ST_W_OUT_IN);
        /* kept for backward (the last two chunks stay in their slots); the stats only read */
        lg[c % 2] = 0;
        if (c + 2 < x->nvc) {
            x->d2h_act_bytes += (size_t)N * nr * 4; /* activations, not weights */
            lg[c % 2] = d2h(x, x->h_logits + (size_t)c * N * x->vc, lo, (size_t)N * nr * 4);
        }
        ce_chunk_stats(x, lo, c * x->vc, nr);
        prof_end(&sp);
        *compute_s += st_now() - t0;
        if (c + 2 < x->nvc) fetch_vchunk(x, c + 2);
    }
    double sum = 0;
    int counted = 0;
    for (int i = 0; i < N; i++)
        if (targets[i] >= 0) {
            sum += (float)(x->d_rmax[i] + log(x->d_rsum[i]) - x->d_tlogit[i]);
            counted++;
        }
    return counted ? (float)(sum / counted) : 0.0f;
}

static void chunked_head_backward(stream_exec *x, const float *xin, float *dres, float dloss, double *compute_s) {
    st_backend *dev = x->dev;
    int N = x->cfg.B * x->cfg.T, C = x->cfg.model.n_embd;
    size_t NC = (size_t)N * C, vcC = (size_t)x->vc * C;
    dev->ops->memset0(dev, x->d_dlnf, NC * 4);
    x->vg_ticket[0] = x->vg_ticket[1] = 0;
    uint64_t lgt[2] = {0, 0};
    /* in reverse: the last two chunks of the first pass are still in their slots */
    for (int c = x->nvc - 1; c >= 0; c--) {
        wait_ticket(x, x->vw_ticket[c], "wait wte chunk", c);
        wait_ticket(x, x->vg_ticket[c % 2], "wait wte grad slot", c);
        int nr = vchunk_rows(x, c);
        float *w = x->d_vw + (size_t)(c % 2) * vcC, *g = x->d_vg + (size_t)(c % 2) * vcC;
        /* the forward's logits: the last two chunks never left their slots; the one after
         * this one comes back into the other slot while this one computes */
        if (c - 1 >= 0 && c - 1 + 2 < x->nvc) {
            x->h2d_act_bytes += (size_t)N * vchunk_rows(x, c - 1) * 4;
            lgt[(c - 1) % 2] = h2d(x, logits_slot(x, c - 1), x->h_logits + (size_t)(c - 1) * N * x->vc,
                                   (size_t)N * vchunk_rows(x, c - 1) * 4);
        }
        wait_ticket(x, lgt[c % 2], "wait logits", c);
        float *lo = logits_slot(x, c);
        double t0 = st_now();
        prof_span sp = prof_begin(PROF_CAT_COMPUTE, "backward head chunk", c);
        ce_chunk_grad(x, lo, c * x->vc, nr, dloss);
        dev->ops->memset0(dev, g, (size_t)nr * C * 4);
        dev->ops->matmul_backward(dev, x->d_dlnf, g, NULL, lo, x->d_lnfo, w, N, C, nr, ST_W_OUT_IN);
        prof_end(&sp);
        *compute_s += st_now() - t0;
        x->vg_ticket[c % 2] = d2h(x, x->hg + (size_t)c * vcC, g, (size_t)nr * C * 4);
        if (c - 2 >= 0) fetch_vchunk(x, c - 2);
    }
    double t0 = st_now();
    prof_span sp = prof_begin(PROF_CAT_COMPUTE, "backward head ln_f", -1);
    dev->ops->memset0(dev, dres, NC * 4);
    dev->ops->layernorm_backward(dev, dres, x->d_lnf_g, x->d_lnf_g + C, x->d_dlnf, xin, x->d_lnf_w, x->d_lmean,
                                 x->d_lrstd, N, C);
    prof_end(&sp);
    *compute_s += st_now() - t0;
}

/* ------------------------------------------------------------------ the step */

static float *wslot(stream_exec *x, int l) { return x->d_w + (size_t)(l % x->nslots) * x->bn; }
static const float *block_in(stream_exec *x, int l) {
    return l == 0 ? gpt2_layer_input(&x->m, 0) : x->d_outs + (size_t)(l - 1) * x->NC;
}
static float *block_out(stream_exec *x, int l) { return x->d_outs + (size_t)l * x->NC; }
static uint64_t fetch_block(stream_exec *x, int l) {
    return h2d(x, wslot(x, l), x->hp + x->b0 + (size_t)l * x->bn, x->bn * 4);
}

/* Where block l's activations live (offloaded: slot ord % 2). */
static gpt2_block_acts block_acts(stream_exec *x, int l) {
    float *buf;
    switch (x->plan.act[l]) {
    case STREAM_ACT_KEEP: buf = x->d_keep + (size_t)x->ord[l] * x->setf; break;
    case STREAM_ACT_OFFLOAD: buf = x->d_off + (size_t)(x->ord[l] % 2) * x->setf; break;
    default: buf = x->d_rc; break;
    }
    return gpt2_block_acts_at(&x->m, buf, block_out(x, l));
}

st_status stream_step(stream_exec *x, const int32_t *inputs, const int32_t *targets, const adamw_params *hp,
                      float max_norm, stream_step_stats *stats, st_err *err) {
    gpt2_model *m = &x->m;
    st_backend *dev = x->dev;
    int L = x->L, D = x->depth, N = x->cfg.B * x->cfg.T;
    double compute_s = 0;
    double t_start = st_now();
    uint64_t h2d0 = x->h2d_bytes, d2h0 = x->d2h_bytes, ha0 = x->h2d_act_bytes, da0 = x->d2h_act_bytes;
    x->wait_s = 0;
    memset(stats, 0, sizeof *stats);
    prof_span step_span = prof_begin(PROF_CAT_STEP, "stream step", (int)hp->step);
#define COMPUTE_(cat, name, idx, stmt)                     \
    do {                                                   \
        double t0_ = st_now();                             \
        prof_span sp_ = prof_begin(cat, name, idx);        \
        stmt;                                              \
        prof_end(&sp_);                                    \
        compute_s += st_now() - t0_;                       \
    } while (0)

    /* this step's optimizer jobs */
    int overlap = x->plan.overlap_optim;
    int speculate = overlap && !x->external &&
                    (x->plan.clip == STREAM_CLIP_SPECULATE || (x->plan.clip == STREAM_CLIP_AUTO && !x->last_clipped));
    if (x->external && !x->store)
        return st_errf(err, ST_ERR_INVALID, "stream: external optimizer but no state store attached");
    pthread_mutex_lock(&x->mu);
    x->n_jobs = x->jobs_done = 0;
    x->speculate = speculate;
    x->job_hp = *hp;
    x->job_hp.grad_scale = 1.0f;
    x->landed_lo = x->n;
    x->worker_status = ST_OK;
    pthread_mutex_unlock(&x->mu);
    memset(x->chunk_done, 0, x->nchunks);

    /* ---- forward */
    uint64_t enc_ticket = 0;
    size_t V = (size_t)x->cfg.model.vocab_size, C = (size_t)x->cfg.model.n_embd;
    if (x->vc) {
        /* the embedding is a gather from the host's wte and wpe: run it there */
        prof_span e = prof_begin(PROF_CAT_OTHER, "forward embed (host)", -1);
        memcpy(x->h_inp, inputs, sizeof(int32_t) * (size_t)N);
        x->host_be->ops->encoder_forward(x->host_be, x->h_enc, x->h_inp, x->hp, x->hp + V * C, x->cfg.B, x->cfg.T,
                                         (int)C);
        prof_end(&e);
        h2d(x, x->d_tgt, targets, sizeof(int32_t) * (size_t)N);
        enc_ticket = h2d(x, (float *)gpt2_layer_input(m, 0), x->h_enc, x->NC * 4);
    }
    for (int l = 0; l <= D && l < L; l++) x->w_ticket[l] = fetch_block(x, l);
    if (x->vc && L <= D + 1) {
        for (int c = 0; c < 2 && c < x->nvc; c++) fetch_vchunk(x, c);
    }
    COMPUTE_(PROF_CAT_COMPUTE, "zero grads", -1, {
        if (!x->vc) dev->ops->memset0(dev, x->d_emb_g, x->emb_n * 4);
        dev->ops->memset0(dev, x->d_lnf_g, (x->n - x->lnf_off) * 4);
    });
    wait_ticket(x, x->nb_ticket, "wait embed weights", -1);
    if (x->vc) wait_ticket(x, enc_ticket, "wait embedding", -1);
    else COMPUTE_(PROF_CAT_COMPUTE, "forward embed", -1, gpt2_embed_forward(m, inputs, targets));
    x->off_slot_ticket[0] = x->off_slot_ticket[1] = 0;
    int rc_holds = -1; /* the block whose activations the recompute set holds */
    for (int l = 0; l < L; l++) {
        wait_ticket(x, x->w_ticket[l], "wait weights", l);
        int off = x->plan.act[l] == STREAM_ACT_OFFLOAD, k = x->ord[l];
        if (off) wait_ticket(x, x->off_slot_ticket[k % 2], "wait act slot", l);
        gpt2_block_acts a = block_acts(x, l);
        COMPUTE_(PROF_CAT_COMPUTE, "forward block", l, gpt2_block_forward(m, wslot(x, l), block_in(x, l), &a));
        if (x->plan.act[l] == STREAM_ACT_RECOMPUTE) rc_holds = l;
        if (l + D + 1 < L) {
            x->w_ticket[l + D + 1] = fetch_block(x, l + D + 1);
            /* the classifier's first chunks queue behind the last block */
            if (x->vc && l + D + 1 == L - 1)
                for (int c = 0; c < 2 && c < x->nvc; c++) fetch_vchunk(x, c);
        }
        /* the last two offloaded blocks stay resident until their backward */
        if (off && k < x->n_off - 2) {
            x->d2h_act_bytes += x->setf * 4;
            x->off_slot_ticket[k % 2] = d2h(x, x->host_acts + (size_t)k * x->setf, x->d_off + (size_t)(k % 2) * x->setf,
                                            x->setf * 4);
        }
    }
    float loss;
    float *dres = gpt2_dresidual(m);
    if (x->vc) {
        loss = chunked_head_forward(x, block_out(x, L - 1), targets, &compute_s);
        chunked_head_backward(x, block_out(x, L - 1), dres, 1.0f / N, &compute_s);
    } else {
        COMPUTE_(PROF_CAT_COMPUTE, "forward head", -1,
                 loss = gpt2_head_forward(m, block_out(x, L - 1), targets, 1.0f / N));
        COMPUTE_(PROF_CAT_COMPUTE, "backward head", -1, gpt2_head_backward(m, block_out(x, L - 1), dres));
    }

    /* ---- backward */
    x->g_ticket[0] = x->g_ticket[1] = 0;
    for (int l = L - 1; l >= 0; l--) {
        wait_ticket(x, x->w_ticket[l], "wait weights", l);
        int act = x->plan.act[l], k = x->ord[l];
        gpt2_block_acts a = block_acts(x, l);
        /* the last recomputed block's forward is still in the set: nothing to redo */
        if (act == STREAM_ACT_RECOMPUTE && rc_holds != l) {
            COMPUTE_(PROF_CAT_RECOMPUTE, "recompute block", l, gpt2_block_forward(m, wslot(x, l), block_in(x, l), &a));
            rc_holds = l;
        }
        if (act == STREAM_ACT_OFFLOAD && k < x->n_off - 2) wait_ticket(x, x->act_ticket[k], "wait acts", l);
        float *g = x->d_g + (size_t)(l % 2) * x->bn;
        wait_ticket(x, x->g_ticket[l % 2], "wait grad slot", l);
        COMPUTE_(PROF_CAT_COMPUTE, "backward block", l, {
            dev->ops->memset0(dev, g, x->bn * 4);
            gpt2_block_backward(m, wslot(x, l), g, block_in(x, l), &a, dres);
        });
        if (x->bf16) {
            /* round on the device (on the CPU backend its memory is addressable; CUDA: a
             * kernel), drain half the bytes; the optimizer reads bf16 gradients natively */
            uint16_t *g16 = x->d_g16 + (size_t)(l % 2) * x->bn;
            COMPUTE_(PROF_CAT_COMPUTE, "grad to bf16", l, st_convert(g16, ST_BF16, g, ST_F32, x->bn));
            x->g_ticket[l % 2] = d2h(x, x->hg16 + x->b0 + (size_t)l * x->bn, g16, x->bn * 2);
        } else {
            x->g_ticket[l % 2] = d2h(x, x->hg + x->b0 + (size_t)l * x->bn, g, x->bn * 4);
        }
        if (overlap) push_job(x, l, x->g_ticket[l % 2]);
        if (l - D - 1 >= 0) x->w_ticket[l - D - 1] = fetch_block(x, l - D - 1);
        if (act == STREAM_ACT_OFFLOAD && k - 2 >= 0) {
            x->h2d_act_bytes += x->setf * 4;
            x->act_ticket[k - 2] = h2d(x, x->d_off + (size_t)(k % 2) * x->setf,
                                       x->host_acts + (size_t)(k - 2) * x->setf,
                                       x->setf * 4);
        }
    }
    if (x->vc) {
        /* the residual gradient goes to the host, which scatters it into wte and wpe on
         * top of the classifier's wte gradient (landed chunk by chunk, earlier in order) */
        wait_ticket(x, d2h(x, x->h_dres, dres, x->NC * 4), "wait residual grad", -1);
        prof_span e = prof_begin(PROF_CAT_OTHER, "backward embed (host)", -1);
        memset(x->hg + V * C, 0, (x->b0 - V * C) * 4);
        x->host_be->ops->encoder_backward(x->host_be, x->hg, x->hg + V * C, x->h_dres, x->h_inp, x->cfg.B, x->cfg.T,
                                          (int)C);
        prof_end(&e);
    } else {
        COMPUTE_(PROF_CAT_COMPUTE, "backward embed", -1, gpt2_embed_backward(m, dres));
        d2h(x, x->hg, x->d_emb_g, x->emb_n * 4);
    }
    uint64_t last = d2h(x, x->hg + x->lnf_off, x->d_lnf_g, (x->n - x->lnf_off) * 4);
    double t_tail = st_now();

    /* ---- norm, clip, update */
    st_status s = ST_OK;
    double ss;
    if (overlap) {
        push_job(x, -1, last);
        prof_span w = prof_begin(PROF_CAT_OPTIM, "wait optimizer", -1);
        wait_jobs(x);
        prof_end(&w);
        ss = chunks_total(x);
        if (x->worker_status) { *err = x->worker_err; s = x->worker_status; goto out; }
    } else {
        wait_ticket(x, last, "wait grads", -1);
        prof_span w = prof_begin(PROF_CAT_OPTIM, "grad norm", -1);
        take_chunks(x, 0, x->n);
        ss = chunks_total(x);
        prof_end(&w);
    }
    double norm = sqrt(ss);
    stats->grad_norm = norm;
    stats->skipped = !isfinite(norm);
    stats->clipped = !stats->skipped && max_norm > 0 && norm > max_norm;
    x->last_clipped = stats->clipped || stats->skipped;
    if (x->store) { /* the disk tier: the update and its commit, through the store */
        if (!stats->skipped) {
            adamw_params h = *hp;
            h.grad_scale = stats->clipped ? (float)(max_norm / norm) : 1.0f;
            st_store_step_args sa = {.grads = ext_grads_at, .grad_dtype = ST_F32, .work = ext_work_at,
                                     .work_dtype = ST_F32, .ctx = x, .grad_sumsq = ss, .blob = x->store_blob,
                                     .blob_bytes = x->store_blob_bytes};
            prof_span u = prof_begin(PROF_CAT_OPTIM, "optim step (disk state)", -1);
            s = st_store_step(x->store, &sa, &h, err);
            prof_end(&u);
            if (!s) send_nonblock(x);
        }
        goto out;
    }
    int need_update = !speculate;
    if (speculate && (stats->skipped || stats->clipped)) {
        /* only the blocks were updated speculatively */
        prof_span r = prof_begin(PROF_CAT_OPTIM, "rollback", -1);
        restore_range(x, x->b0, x->lnf_off);
        prof_end(&r);
        stats->rolled_back = 1;
        need_update = 1;
    } else if (speculate && !stats->skipped) {
        /* not clipped: the blocks are done; the embedding and ln_f, with the true sum */
        adamw_params h = *hp;
        h.grad_scale = 1.0f;
        int nt = x->lay.n_tensors;
        prof_span u = prof_begin(PROF_CAT_OPTIM, "optim embed+head", -1);
        s = update_segs(x, 0, 2, &h, ss, err);
        if (!s) s = update_segs(x, nt - 2, nt, &h, ss, err);
        prof_end(&u);
        if (s) { /* never half a step: the blocks' speculative updates go too */
            restore_range(x, x->b0, x->lnf_off);
            goto out;
        }
    }
    if (need_update && !stats->skipped) {
        adamw_params h = *hp;
        h.grad_scale = stats->clipped ? (float)(max_norm / norm) : 1.0f;
        prof_span u = prof_begin(PROF_CAT_OPTIM, "optim step", -1);
        s = update_segs(x, 0, x->lay.n_tensors, &h, ss, err);
        prof_end(&u);
        if (s) goto out;
    }
    if (!stats->skipped) send_nonblock(x);
out:
    if (s) x->last_clipped = 1; /* after a failure, the next step does not speculate */
    stats->optim_tail_s = st_now() - t_tail;
    prof_end(&step_span);
    stats->loss = loss;
    stats->h2d_bytes = x->h2d_bytes - h2d0;
    stats->d2h_bytes = x->d2h_bytes - d2h0;
    stats->h2d_act_bytes = x->h2d_act_bytes - ha0;
    stats->d2h_act_bytes = x->d2h_act_bytes - da0;
    st_arena *ar = st_backend_arena(dev);
    stats->device_peak_bytes = ar ? st_arena_peak(ar) : 0;
    stats->device_budget_bytes = ar ? st_arena_budget(ar) : 0;
    stats->compute_s = compute_s;
    stats->wait_s = x->wait_s;
    stats->wall_s = st_now() - t_start;
    stats->overlap_efficiency = stats->wall_s > 0 ? compute_s / stats->wall_s : 0;
#undef COMPUTE_
    return s;
}

/* ------------------------------------------------------------------ forward only
 * The step's forward with nothing kept for a backward: each block runs in its plan's
 * activation set (nothing is offloaded, nothing recomputed), the weights arrive as in the
 * step (prefetch_depth ahead), and the head computes the loss only. No gradient, moment,
 * parameter or speculation state is touched: a step after it is the step it would have
 * been. The chunked classifier's first pass also drains logits to the host scratch a
 * backward would read; nothing reads them. */
st_status stream_eval(stream_exec *x, const int32_t *inputs, const int32_t *targets, float *loss, st_err *err) {
    gpt2_model *m = &x->m;
    int L = x->L, D = x->depth, N = x->cfg.B * x->cfg.T;
    double compute_s = 0;
    if (!inputs || !targets) return st_errf(err, ST_ERR_INVALID, "stream_eval: inputs and targets are required");
    prof_span span = prof_begin(PROF_CAT_OTHER, "stream eval", -1);
    uint64_t enc_ticket = 0;
    size_t V = (size_t)x->cfg.model.vocab_size, C = (size_t)x->cfg.model.n_embd;
    if (x->vc) {
        memcpy(x->h_inp, inputs, sizeof(int32_t) * (size_t)N);
        x->host_be->ops->encoder_forward(x->host_be, x->h_enc, x->h_inp, x->hp, x->hp + V * C, x->cfg.B, x->cfg.T,
                                         (int)C);
        h2d(x, x->d_tgt, targets, sizeof(int32_t) * (size_t)N);
        enc_ticket = h2d(x, (float *)gpt2_layer_input(m, 0), x->h_enc, x->NC * 4);
    }
    for (int l = 0; l <= D && l < L; l++) x->w_ticket[l] = fetch_block(x, l);
    if (x->vc && L <= D + 1)
        for (int c = 0; c < 2 && c < x->nvc; c++) fetch_vchunk(x, c);
    wait_ticket(x, x->nb_ticket, "wait embed weights", -1);
    if (x->vc) wait_ticket(x, enc_ticket, "wait embedding", -1);
    else gpt2_embed_forward(m, inputs, targets);
    for (int l = 0; l < L; l++) {
        wait_ticket(x, x->w_ticket[l], "wait weights", l);
        gpt2_block_acts a = block_acts(x, l);
        gpt2_block_forward(m, wslot(x, l), block_in(x, l), &a);
        if (l + D + 1 < L) {
            x->w_ticket[l + D + 1] = fetch_block(x, l + D + 1);
            if (x->vc && l + D + 1 == L - 1)
                for (int c = 0; c < 2 && c < x->nvc; c++) fetch_vchunk(x, c);
        }
    }
    if (x->vc) *loss = chunked_head_forward(x, block_out(x, L - 1), targets, &compute_s);
    else *loss = gpt2_head_forward(m, block_out(x, L - 1), targets, 0.0f);
    /* copies still queued (the logits' drain, wte chunks) complete before anything the
     * next step waits on: the copy engine completes in order */
    prof_end(&span);
    return ST_OK;
}
