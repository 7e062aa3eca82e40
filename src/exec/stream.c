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

/* block -1: the embedding and what follows the blocks. add: the gradient landed in the
 * micro-batch buffer, add it to the accumulated one first; final: the step's last
 * micro-batch (norm partials, speculative update). */
typedef struct opt_job { int block; uint64_t ticket; unsigned char add, final; } opt_job;

struct stream_exec {
    stream_config cfg;
    stream_plan plan;
    st_backend *dev;
    traced_be tbe;
    st_copy_engine *ce;
    const st_arch *arch; /* the model, as blocks (block.h) */
    const st_arch_layout *ly;
    st_blocks *db;       /* the arch bound to the device: token ids, block scratch */
    st_blocks *hb;       /* ... and to the host (chunked vocabulary: the embedding runs there) */
    /* chunked classifier (plan.vocab_chunk > 0): the head's rows stay on the host and cross
     * in chunks of vc rows, twice per step; the embedding runs on the host */
    int vc, nvc;
    st_backend *host_be, *own_host_be;
    float *d_vw, *d_vg, *d_logits, *d_rmax, *d_tlogit;
    double *d_rsum;
    int32_t *d_tgt;
    /* the head and the residual stream's ends, on the device */
    float *d_emb_out, *d_dres, *d_xn, *d_dxn, *d_nstats, *d_losses;
    float *h_losses, *h_rmax, *h_tlogit; /* the row statistics, read back for the loss */
    double *h_rsum;
    float *h_enc, *h_dres;
    float *h_logits;          /* chunked classifier: every chunk's forward logits (N x V), so
                                 backward fetches them instead of recomputing the GEMM */
    uint64_t *vw_ticket, vg_ticket[2];
    int L, depth, nslots, n_keep, n_off, has_rc;
    size_t n, bn, b0, emb_n, post_off, post_n, NC, setf; /* post: the device-resident part after
                                                            the blocks (the norm, an untied head) */

    /* host tier */
    float *hp, *hg;
    float *hg2;                /* gradient accumulation: micro-batches 2.. land here, then hg += hg2 */
    float *tgv;                /* where this micro-batch's gradients land: hg or hg2 */
    uint16_t *hg16;            /* bf16 drain: block gradients as drained (flat index) */
    int bf16;
    optim *opt;
    optim_segment *segs;
    float *bk_p, *bk_m, *bk_v; /* speculative backups, n each */
    float *host_acts;          /* offloaded activation sets, n_off x setf */
    int *ord;                  /* per block: index among kept or offloaded blocks */

    /* device tier */
    float *d_pre_w, *d_post_w, *d_pre_g, *d_post_g, *d_outs, *d_w, *d_g, *d_keep, *d_rc, *d_off;
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

/* Every device allocation of a plan, in one table: stream_device_bytes sums it (with
 * the arch's bound state) and stream_exec_create allocates it, so the two cannot differ.
 * x NULL: sizes only. */
typedef struct dev_alloc {
    void **ptr;
    size_t bytes;
} dev_alloc;
#define MAX_ALLOCS 32

static int alloc_table(const stream_config *c, const stream_plan *p, stream_exec *x, dev_alloc *t) {
    const st_arch_layout *y = &c->arch->lay;
    size_t N = (size_t)c->B * c->T, C = (size_t)y->n_embd, L = (size_t)y->n_blocks, V = (size_t)y->vocab_size;
    size_t NC = N * C, bn = y->block_numel, setf = st_block_act_floats(c->arch, c->B, c->T);
    size_t n_keep = 0, n_off = 0, rc = 0;
    for (size_t l = 0; l < L; l++) {
        if (p->act[l] == STREAM_ACT_KEEP) n_keep++;
        else if (p->act[l] == STREAM_ACT_OFFLOAD) n_off++;
        else rc = 1;
    }
    int k = 0;
#define A(field, nbytes) t[k++] = (dev_alloc){x ? (void **)&x->field : NULL, (nbytes)}
    A(d_emb_out, NC * 4);                                   /* block 0's input */
    A(d_dres, NC * 4);                                      /* the residual stream's gradient */
    A(d_xn, NC * 4);                                        /* the final norm's output */
    A(d_dxn, NC * 4);                                       /* ... and its gradient */
    A(d_nstats, N * (size_t)y->norm_stat_floats * 4);       /* the final norm's row statistics */
    A(d_tgt, N * 4);                                        /* targets */
    if (p->vocab_chunk > 0) {
        size_t vc = (size_t)p->vocab_chunk < V ? (size_t)p->vocab_chunk : V, nvc = (V + vc - 1) / vc;
        A(d_vw, 2 * vc * C * 4);                            /* head chunk slots: weights */
        A(d_vg, 2 * vc * C * 4);                            /* ... and gradients */
        A(d_logits, (nvc < 2 ? 1 : 2) * N * vc * 4);        /* logits chunk slots */
        A(d_rmax, N * 4);                                   /* online-softmax row statistics */
        A(d_tlogit, N * 4);
        A(d_rsum, N * 8);
        A(d_post_w, y->norm_numel * 4);                     /* the norm (the head streams) */
        A(d_post_g, y->norm_numel * 4);
    } else {
        A(d_pre_w, y->emb_numel * 4);                       /* the embedding */
        A(d_pre_g, y->emb_numel * 4);
        A(d_logits, N * V * 4);
        A(d_losses, N * 4);
        A(d_post_w, (y->n_params - y->norm_offset) * 4);    /* the norm and an untied head */
        A(d_post_g, (y->n_params - y->norm_offset) * 4);
    }
    A(d_outs, L * NC * 4);                                  /* block outputs (checkpoints) */
    A(d_w, (size_t)(p->prefetch_depth + 1) * bn * 4);       /* weight slots */
    A(d_g, 2 * bn * 4);                                     /* gradient slots */
    if (p->grad_dtype == ST_BF16) A(d_g16, 2 * bn * 2);     /* their bf16 staging */
    if (n_keep) A(d_keep, n_keep * setf * 4);
    if (rc) A(d_rc, setf * 4);
    if (n_off) A(d_off, (n_off < 2 ? n_off : 2) * setf * 4);
#undef A
    return k;
}

size_t stream_device_bytes(const stream_config *c, const stream_plan *p) {
    dev_alloc t[MAX_ALLOCS];
    int k = alloc_table(c, p, NULL, t);
    size_t b = c->arch->ops->bind_bytes(c->arch, c->B, c->T); /* token ids, block scratch */
    for (int i = 0; i < k; i++) b += rnd(t[i].bytes);
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
    size_t o = lo - x->b0; /* backups hold [b0, post_off) */
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

/* Segments [s0, s1): the embedding's tensors, the blocks' (whose gradients are bf16 when
 * the plan drains bf16), the norm's and an untied head's. */
static st_status update_segs(stream_exec *x, int s0, int s1, const adamw_params *hp, double sumsq, st_err *err) {
    int nt = x->ly->n_tensors, cuts[4] = {0, x->ly->n_pre_tensors, nt - x->ly->n_post_tensors, nt};
    for (int i = 0; i < 3; i++) {
        int a = s0 > cuts[i] ? s0 : cuts[i], b = s1 < cuts[i + 1] ? s1 : cuts[i + 1];
        if (a >= b) continue;
        st_status st = update_range(x, a, b, hp, sumsq, i == 1, err);
        if (st) return st;
    }
    return ST_OK;
}

/* hg[lo, hi) += hg2[lo, hi): one micro-batch's gradient onto the sum of the earlier ones
 * (the one accumulation rule, strata/stream.h). */
static void add_range(stream_exec *x, size_t lo, size_t hi) {
    float *a = x->hg;
    const float *b = x->hg2;
    for (size_t i = lo; i < hi; i++) a[i] += b[i];
}

/* The parts of the vector that are not blocks: the embedding, the norm and an untied head. */
static void add_nonblock(stream_exec *x) {
    add_range(x, 0, x->b0);
    add_range(x, x->post_off, x->n);
}

static void run_job(stream_exec *x, const opt_job *j) {
    st_copy_wait(x->ce, j->ticket); /* the gradient has landed on the host */
    int l = j->block, pre = x->ly->n_pre_tensors, per = x->ly->tensors_per_block;
    prof_span s = prof_begin(PROF_CAT_OPTIM, l >= 0 ? "optim block" : "optim embed+head", l);
    if (j->add) {
        if (l >= 0) add_range(x, x->b0 + (size_t)l * x->bn, x->b0 + (size_t)(l + 1) * x->bn);
        else add_nonblock(x);
    }
    if (!j->final) {
        prof_end(&s);
        return;
    }
    if (l >= 0) {
        size_t lo = x->b0 + (size_t)l * x->bn;
        if (lo < x->landed_lo) x->landed_lo = lo;
        take_chunks(x, x->landed_lo, x->post_off); /* the norm lands last, with the embedding */
    } else {
        take_chunks(x, 0, x->n);
    }
    if (x->speculate && l >= 0) {
        /* clip scale 1 and a finite sum (the real one is checked after the last block).
         * The embedding and ln_f (the last job) are not speculated: once they land the
         * whole norm is known, and the step thread updates them with every core. */
        size_t lo = x->b0 + (size_t)l * x->bn;
        backup_range(x, lo, lo + x->bn);
        st_status st = update_segs(x, pre + l * per, pre + (l + 1) * per, &x->job_hp, 0.0, &x->worker_err);
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

static void push_job(stream_exec *x, int block, uint64_t ticket, int add, int final) {
    pthread_mutex_lock(&x->mu);
    x->jobs[x->n_jobs++] = (opt_job){block, ticket, (unsigned char)add, (unsigned char)final};
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
    st_status s = ST_OK;
    if (!c->arch) return st_errf(err, ST_ERR_INVALID, "stream: no model (stream_config.arch)");
    int L = c->arch->lay.n_blocks;
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
    if (c->B < 1 || c->T < 1 || c->T > c->arch->lay.max_seq)
        return st_errf(err, ST_ERR_INVALID, "stream: batch %d x seq %d (max_seq %d)", c->B, c->T, c->arch->lay.max_seq);
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
    x->arch = c->arch;
    x->ly = &c->arch->lay;
    const st_arch_layout *y = x->ly;
    size_t N = (size_t)c->B * c->T, C = (size_t)y->n_embd;
    if (p->vocab_chunk > 0) {
        x->vc = p->vocab_chunk < y->vocab_size ? p->vocab_chunk : y->vocab_size;
        x->nvc = (y->vocab_size + x->vc - 1) / x->vc;
    }
    x->n = y->n_params;
    x->bn = y->block_numel;
    x->b0 = y->block_offset0;
    x->emb_n = y->emb_numel;
    x->post_off = y->norm_offset;
    x->post_n = x->vc ? y->norm_numel : x->n - y->norm_offset;
    x->NC = N * C;
    x->setf = st_block_act_floats(c->arch, c->B, c->T);
    if ((s = st_blocks_bind(&x->db, c->arch, dev, c->B, c->T, err))) goto fail;
    x->host_be = c->host_be;
    if (x->vc) {
        /* the embedding runs on the host: its own CPU backend unless the caller gave one
         * (a budgeted device must not hold the host side's token ids) */
        if (!x->host_be) {
            if ((s = st_backend_cpu_create(&x->own_host_be, 0, err))) goto fail;
            x->host_be = x->own_host_be;
        }
        if ((s = st_blocks_bind(&x->hb, c->arch, x->host_be, c->B, c->T, err))) goto fail;
    }

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

    /* device tier: the table stream_device_bytes sums */
    dev_alloc tab[MAX_ALLOCS];
    int na = alloc_table(c, p, x, tab);
    for (int i = 0; i < na; i++) {
        *tab[i].ptr = dev->ops->alloc(dev, tab[i].bytes);
        if (!*tab[i].ptr) FAIL(ST_ERR_NOMEM, "stream: device allocation %d (%zu bytes) of the plan's %zu failed", i,
                               tab[i].bytes, need);
    }
    x->bf16 = p->grad_dtype == ST_BF16;
    if (x->bf16 && !(x->hg16 = st_alloc(x->n * 2))) FAIL(ST_ERR_NOMEM, "stream: cannot allocate the bf16 gradients");
    x->h_losses = malloc(N * 4);
    x->h_rmax = malloc(N * 4);
    x->h_tlogit = malloc(N * 4);
    x->h_rsum = malloc(N * 8);
    if (!x->h_losses || !x->h_rmax || !x->h_tlogit || !x->h_rsum) FAIL(ST_ERR_NOMEM, "stream: out of memory");
    if (x->vc) {
        x->h_enc = st_alloc(N * C * 4);
        x->h_dres = st_alloc(N * C * 4);
        /* only chunks 0..nvc-3 leave the device (the last two stay in their slots) */
        x->h_logits = x->nvc > 2 ? st_alloc(N * (size_t)(x->nvc - 2) * (size_t)x->vc * 4) : NULL;
        x->vw_ticket = calloc((size_t)x->nvc, sizeof *x->vw_ticket);
        if (!x->h_enc || !x->h_dres || (x->nvc > 2 && !x->h_logits) || !x->vw_ticket)
            FAIL(ST_ERR_NOMEM, "stream: out of memory");
    }

    /* host tier */
    x->hp = c->host_params ? c->host_params : st_alloc(x->n * 4);
    x->hg = c->host_grads ? c->host_grads : st_alloc(x->n * 4);
    if (c->grad_accum > 1) {
        if (x->bf16)
            FAIL(ST_ERR_UNSUPPORTED, "stream: gradient accumulation adds fp32 gradients; drain them as fp32, not bf16");
        if (!(x->hg2 = st_alloc(x->n * 4)))
            FAIL(ST_ERR_NOMEM, "stream: grad_accum %d needs %zu more host bytes (one more fp32 gradient) than the "
                 "machine gives; use grad_accum 1 or a larger host", c->grad_accum, x->n * 4);
    }
    if (!x->hp || !x->hg) FAIL(ST_ERR_NOMEM, "stream: cannot allocate %zu host bytes of parameters and gradients",
                               x->n * 8);
    if (x->n_off) {
        x->host_acts = st_alloc((size_t)x->n_off * x->setf * 4);
        if (!x->host_acts) FAIL(ST_ERR_NOMEM, "stream: cannot allocate host memory for offloaded activations");
    }
    x->segs = calloc((size_t)y->n_tensors, sizeof *x->segs);
    if (!x->segs) FAIL(ST_ERR_NOMEM, "stream: out of memory");
    train_decay_segments(y->tensors, y->n_tensors, c->weight_decay, x->segs);
    x->external = c->external_optimizer;
    if (!x->external && (s = optim_create(&x->opt, x->segs, y->n_tensors, c->state_format, err))) goto fail;
    if (!x->external && p->overlap_optim && p->clip != STREAM_CLIP_DEFER && c->state_format == OPTIM_STATE_F32) {
        /* only the blocks are updated speculatively: backups of [b0, post_off), indexed from b0 */
        size_t nb = x->post_off - x->b0;
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
    dev_alloc tab[MAX_ALLOCS];
    int na = alloc_table(&x->cfg, &x->plan, x, tab);
    for (int i = 0; i < na; i++)
        if (*tab[i].ptr) dev->ops->dealloc(dev, *tab[i].ptr);
    st_blocks_free(x->db);
    st_blocks_free(x->hb);
    st_backend_free(x->own_host_be);
    free(x->h_losses);
    free(x->h_rmax);
    free(x->h_tlogit);
    free(x->h_rsum);
    if (x->hp != x->cfg.host_params) st_free(x->hp);
    if (x->hg != x->cfg.host_grads) st_free(x->hg);
    st_free(x->hg2);
    st_free(x->hg16);
    st_free(x->bk_p);
    st_free(x->bk_m);
    st_free(x->bk_v);
    st_free(x->host_acts);
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
const st_arch *stream_arch(const stream_exec *x) { return x->arch; }
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
    if (!x->vc) h2d(x, x->d_pre_w, x->hp, x->emb_n * 4);
    x->nb_ticket = h2d(x, x->d_post_w, x->hp + x->post_off, x->post_n * 4);
}

void stream_set_params(stream_exec *x, const float *host_params) {
    if (host_params != x->hp) memcpy(x->hp, host_params, x->n * 4); /* also: "I edited stream_params" */
    send_nonblock(x);
    st_copy_wait(x->ce, x->nb_ticket);
}

void stream_init_random(stream_exec *x, uint64_t seed) {
    x->arch->ops->init(x->arch, x->hp, seed); /* the values of the model's init_random */
    send_nonblock(x);
    st_copy_wait(x->ce, x->nb_ticket);
}

/* ------------------------------------------------------------------ the head
 * The same for every architecture (block.h): the arch's final norm, then logits = xn W^T
 * over the head's rows W (V, C), cross-entropy, and back. Whole on the device, or in
 * chunks of vc rows (online softmax) when W does not fit. */

/* Where the head's rows live on the device when they are resident (unchunked). */
static float *head_w(stream_exec *x) {
    return x->ly->tied ? x->d_pre_w + x->ly->head_offset : x->d_post_w + (x->ly->head_offset - x->post_off);
}
static float *head_g(stream_exec *x) {
    return x->ly->tied ? x->d_pre_g + x->ly->head_offset : x->d_post_g + (x->ly->head_offset - x->post_off);
}

/* The mean over targets >= 0 of per-row losses (host), as the models' own heads take it. */
static float mean_loss(const float *losses, const int32_t *targets, int N) {
    double sum = 0;
    int counted = 0;
    for (int i = 0; i < N; i++)
        if (targets[i] >= 0) {
            sum += losses[i];
            counted++;
        }
    return counted ? (float)(sum / counted) : 0.0f;
}

static float head_forward(stream_exec *x, const float *xin, const int32_t *targets, float dloss) {
    st_backend *dev = x->dev;
    int N = x->cfg.B * x->cfg.T, C = x->ly->n_embd, V = x->ly->vocab_size;
    x->arch->ops->norm_forward(x->db, x->d_post_w, xin, x->d_xn, x->d_nstats);
    dev->ops->matmul_forward(dev, x->d_logits, x->d_xn, head_w(x), NULL, N, C, V, ST_W_OUT_IN);
    dev->ops->crossentropy_forward_backward(dev, x->d_logits, x->d_losses, x->d_tgt, N, V, dloss);
    dev->ops->copy_to_host(dev, x->h_losses, x->d_losses, sizeof(float) * (size_t)N);
    return mean_loss(x->h_losses, targets, N);
}

static void head_backward(stream_exec *x, const float *xin) {
    st_backend *dev = x->dev;
    int N = x->cfg.B * x->cfg.T, C = x->ly->n_embd, V = x->ly->vocab_size;
    /* the logits buffer holds dlogits */
    dev->ops->memset0(dev, x->d_dxn, x->NC * 4);
    dev->ops->matmul_backward(dev, x->d_dxn, head_g(x), NULL, x->d_logits, x->d_xn, head_w(x), N, C, V, ST_W_OUT_IN);
    dev->ops->memset0(dev, x->d_dres, x->NC * 4);
    x->arch->ops->norm_backward(x->db, x->d_dres, x->d_post_g, x->d_dxn, xin, x->d_post_w, x->d_nstats);
}

static int vchunk_rows(const stream_exec *x, int c) {
    int r0 = c * x->vc;
    return r0 + x->vc <= x->ly->vocab_size ? x->vc : x->ly->vocab_size - r0;
}

static void fetch_vchunk(stream_exec *x, int c) {
    size_t C = (size_t)x->ly->n_embd, r0 = (size_t)c * x->vc;
    x->vw_ticket[c] = h2d(x, x->d_vw + (size_t)(c % 2) * x->vc * C, x->hp + x->ly->head_offset + r0 * C,
                          (size_t)vchunk_rows(x, c) * C * 4);
}

static float *logits_slot(stream_exec *x, int c) {
    return x->d_logits + (size_t)(c % 2) * (size_t)x->cfg.B * x->cfg.T * x->vc;
}

static float chunked_head_forward(stream_exec *x, const float *xin, const int32_t *targets, double *compute_s) {
    st_backend *dev = x->dev;
    int N = x->cfg.B * x->cfg.T, C = x->ly->n_embd;
    double t0 = st_now();
    prof_span sp = prof_begin(PROF_CAT_COMPUTE, "forward head norm", -1);
    x->arch->ops->norm_forward(x->db, x->d_post_w, xin, x->d_xn, x->d_nstats);
    dev->ops->softmax_chunk_init(dev, x->d_rmax, x->d_rsum, x->d_tlogit, N);
    prof_end(&sp);
    *compute_s += st_now() - t0;
    uint64_t lg[2] = {0, 0}; /* each slot's logits on their way to the host */
    for (int c = 0; c < x->nvc; c++) {
        wait_ticket(x, x->vw_ticket[c], "wait head chunk", c);
        wait_ticket(x, lg[c % 2], "wait logits slot", c);
        int nr = vchunk_rows(x, c);
        float *lo = logits_slot(x, c);
        t0 = st_now();
        sp = prof_begin(PROF_CAT_COMPUTE, "forward head chunk", c);
        dev->ops->matmul_forward(dev, lo, x->d_xn, x->d_vw + (size_t)(c % 2) * x->vc * C, NULL, N, C, nr,
                                 ST_W_OUT_IN);
        /* kept for backward (the last two chunks stay in their slots); the stats only read */
        lg[c % 2] = 0;
        if (c + 2 < x->nvc) {
            x->d2h_act_bytes += (size_t)N * nr * 4; /* activations, not weights */
            lg[c % 2] = d2h(x, x->h_logits + (size_t)c * N * x->vc, lo, (size_t)N * nr * 4);
        }
        dev->ops->softmax_chunk_stats(dev, lo, x->d_tgt, N, nr, c * x->vc, x->d_rmax, x->d_rsum, x->d_tlogit);
        prof_end(&sp);
        *compute_s += st_now() - t0;
        if (c + 2 < x->nvc) fetch_vchunk(x, c + 2);
    }
    dev->ops->copy_to_host(dev, x->h_rmax, x->d_rmax, (size_t)N * 4);
    dev->ops->copy_to_host(dev, x->h_rsum, x->d_rsum, (size_t)N * 8);
    dev->ops->copy_to_host(dev, x->h_tlogit, x->d_tlogit, (size_t)N * 4);
    for (int i = 0; i < N; i++)
        x->h_losses[i] = targets[i] >= 0 ? (float)(x->h_rmax[i] + log(x->h_rsum[i]) - x->h_tlogit[i]) : 0.0f;
    return mean_loss(x->h_losses, targets, N);
}

static void chunked_head_backward(stream_exec *x, const float *xin, float dloss, double *compute_s) {
    st_backend *dev = x->dev;
    int N = x->cfg.B * x->cfg.T, C = x->ly->n_embd;
    size_t vcC = (size_t)x->vc * C;
    dev->ops->memset0(dev, x->d_dxn, x->NC * 4);
    x->vg_ticket[0] = x->vg_ticket[1] = 0;
    uint64_t lgt[2] = {0, 0};
    /* in reverse: the last two chunks of the first pass are still in their slots */
    for (int c = x->nvc - 1; c >= 0; c--) {
        wait_ticket(x, x->vw_ticket[c], "wait head chunk", c);
        wait_ticket(x, x->vg_ticket[c % 2], "wait head grad slot", c);
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
        dev->ops->softmax_chunk_grad(dev, lo, x->d_tgt, N, nr, c * x->vc, x->d_rmax, x->d_rsum, dloss);
        dev->ops->memset0(dev, g, (size_t)nr * C * 4);
        dev->ops->matmul_backward(dev, x->d_dxn, g, NULL, lo, x->d_xn, w, N, C, nr, ST_W_OUT_IN);
        prof_end(&sp);
        *compute_s += st_now() - t0;
        x->vg_ticket[c % 2] = d2h(x, x->tgv + x->ly->head_offset + (size_t)c * vcC, g, (size_t)nr * C * 4);
        if (c - 2 >= 0) fetch_vchunk(x, c - 2);
    }
    double t0 = st_now();
    prof_span sp = prof_begin(PROF_CAT_COMPUTE, "backward head norm", -1);
    dev->ops->memset0(dev, x->d_dres, x->NC * 4);
    x->arch->ops->norm_backward(x->db, x->d_dres, x->d_post_g, x->d_dxn, xin, x->d_post_w, x->d_nstats);
    prof_end(&sp);
    *compute_s += st_now() - t0;
}

/* The embedding forward: on the device, or (chunked vocabulary) on the host from its
 * master copy, the output crossing to the device. Returns that copy's ticket (0: none). */
static uint64_t embed_forward(stream_exec *x, const int32_t *inputs) {
    if (!x->vc) {
        x->arch->ops->embed_forward(x->db, x->d_pre_w, inputs, x->d_emb_out);
        return 0;
    }
    prof_span e = prof_begin(PROF_CAT_OTHER, "forward embed (host)", -1);
    x->arch->ops->embed_forward(x->hb, x->hp, inputs, x->h_enc);
    prof_end(&e);
    return h2d(x, x->d_emb_out, x->h_enc, x->NC * 4);
}

/* ------------------------------------------------------------------ the step */

static float *wslot(stream_exec *x, int l) { return x->d_w + (size_t)(l % x->nslots) * x->bn; }
static const float *block_in(stream_exec *x, int l) {
    return l == 0 ? x->d_emb_out : x->d_outs + (size_t)(l - 1) * x->NC;
}
static float *block_out(stream_exec *x, int l) { return x->d_outs + (size_t)l * x->NC; }
static uint64_t fetch_block(stream_exec *x, int l) {
    return h2d(x, wslot(x, l), x->hp + x->b0 + (size_t)l * x->bn, x->bn * 4);
}

/* Where block l's activations live (offloaded: slot ord % 2). */
static float *block_acts(stream_exec *x, int l) {
    switch (x->plan.act[l]) {
    case STREAM_ACT_KEEP: return x->d_keep + (size_t)x->ord[l] * x->setf;
    case STREAM_ACT_OFFLOAD: return x->d_off + (size_t)(x->ord[l] % 2) * x->setf;
    default: return x->d_rc;
    }
}

st_status stream_step(stream_exec *x, const int32_t *inputs, const int32_t *targets, const adamw_params *hp,
                      float max_norm, stream_step_stats *stats, st_err *err) {
    return stream_step_accum(x, 1, inputs, targets, hp, max_norm, stats, err);
}

st_status stream_step_accum(stream_exec *x, int n_micro, const int32_t *inputs_all, const int32_t *targets_all,
                            const adamw_params *hp, float max_norm, stream_step_stats *stats, st_err *err) {
    const st_arch_ops *ao = x->arch->ops;
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
    int speculate = overlap && !x->external && x->cfg.state_format == OPTIM_STATE_F32 &&
                    (x->plan.clip == STREAM_CLIP_SPECULATE || (x->plan.clip == STREAM_CLIP_AUTO && !x->last_clipped));
    if (x->external && !x->store)
        return st_errf(err, ST_ERR_INVALID, "stream: external optimizer but no state store attached");
    if (n_micro < 1 || (n_micro > 1 && !x->hg2))
        return st_errf(err, ST_ERR_INVALID, "stream: %d micro-batches in a step; the executor was made for %d "
                       "(stream_config.grad_accum)", n_micro, x->cfg.grad_accum > 1 ? x->cfg.grad_accum : 1);
    pthread_mutex_lock(&x->mu);
    x->n_jobs = x->jobs_done = 0;
    x->speculate = speculate;
    x->job_hp = *hp;
    x->job_hp.grad_scale = 1.0f;
    x->landed_lo = x->n;
    x->worker_status = ST_OK;
    pthread_mutex_unlock(&x->mu);
    memset(x->chunk_done, 0, x->nchunks);

    /* Micro-batches: each one's gradient is computed fresh (device slots and the
     * embedding's and head's gradients zeroed), the first lands in hg, the later ones in
     * hg2 and are added to hg block by block as they land, in micro-batch order: the one
     * accumulation rule of every executor (see stream.h). */
    double loss_sum = 0;
    float dloss = 1.0f / ((float)x->cfg.B * x->cfg.T * n_micro);
    uint64_t last = 0;
    size_t V = (size_t)x->ly->vocab_size, C = (size_t)x->ly->n_embd;
    for (int mb = 0; mb < n_micro; mb++) {
    const int32_t *inputs = inputs_all + (size_t)mb * N, *targets = targets_all + (size_t)mb * N;
    int add = mb > 0, final = mb == n_micro - 1;
    if (add && overlap) { /* hg2 is rewritten below: the previous micro-batch's adds are done */
        wait_jobs(x);
        pthread_mutex_lock(&x->mu);
        x->n_jobs = x->jobs_done = 0;
        pthread_mutex_unlock(&x->mu);
    }
    x->tgv = add ? x->hg2 : x->hg;
    /* the previous micro-batch's drains (device gradient slots, the embedding's and head's
     * gradients) have left the device before anything rewrites them (in-order engine) */
    wait_ticket(x, last, "wait previous micro-batch", mb);

    /* ---- forward */
    dev->ops->copy_to_device(dev, x->d_tgt, targets, sizeof(int32_t) * (size_t)N);
    uint64_t enc_ticket = x->vc ? embed_forward(x, inputs) : 0;
    /* after a micro-batch's backward, blocks 0..depth (and head chunks 0, 1) are still in
     * their slots, and the weights do not change until the update */
    if (mb == 0) {
        for (int l = 0; l <= D && l < L; l++) x->w_ticket[l] = fetch_block(x, l);
        if (x->vc && L <= D + 1) {
            for (int c = 0; c < 2 && c < x->nvc; c++) fetch_vchunk(x, c);
        }
    }
    COMPUTE_(PROF_CAT_COMPUTE, "zero grads", -1, {
        if (!x->vc) dev->ops->memset0(dev, x->d_pre_g, x->emb_n * 4);
        dev->ops->memset0(dev, x->d_post_g, x->post_n * 4);
    });
    wait_ticket(x, x->nb_ticket, "wait embed weights", -1);
    if (x->vc) wait_ticket(x, enc_ticket, "wait embedding", -1);
    else COMPUTE_(PROF_CAT_COMPUTE, "forward embed", -1, embed_forward(x, inputs));
    x->off_slot_ticket[0] = x->off_slot_ticket[1] = 0;
    int rc_holds = -1; /* the block whose activations the recompute set holds */
    for (int l = 0; l < L; l++) {
        wait_ticket(x, x->w_ticket[l], "wait weights", l);
        int off = x->plan.act[l] == STREAM_ACT_OFFLOAD, k = x->ord[l];
        if (off) wait_ticket(x, x->off_slot_ticket[k % 2], "wait act slot", l);
        float *a = block_acts(x, l);
        COMPUTE_(PROF_CAT_COMPUTE, "forward block", l, ao->block_forward(x->db, wslot(x, l), block_in(x, l), a, block_out(x, l)));
        if (x->plan.act[l] == STREAM_ACT_RECOMPUTE) rc_holds = l;
        if (l + D + 1 < L) {
            x->w_ticket[l + D + 1] = fetch_block(x, l + D + 1);
            /* the classifier's first chunks queue behind the last block */
            if (x->vc && l + D + 1 == L - 1 && mb == 0)
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
    float *dres = x->d_dres;
    if (x->vc) {
        loss = chunked_head_forward(x, block_out(x, L - 1), targets, &compute_s);
        chunked_head_backward(x, block_out(x, L - 1), dloss, &compute_s);
    } else {
        COMPUTE_(PROF_CAT_COMPUTE, "forward head", -1, loss = head_forward(x, block_out(x, L - 1), targets, dloss));
        COMPUTE_(PROF_CAT_COMPUTE, "backward head", -1, head_backward(x, block_out(x, L - 1)));
    }

    /* ---- backward */
    x->g_ticket[0] = x->g_ticket[1] = 0;
    for (int l = L - 1; l >= 0; l--) {
        wait_ticket(x, x->w_ticket[l], "wait weights", l);
        int act = x->plan.act[l], k = x->ord[l];
        float *a = block_acts(x, l);
        /* the last recomputed block's forward is still in the set: nothing to redo */
        if (act == STREAM_ACT_RECOMPUTE && rc_holds != l) {
            COMPUTE_(PROF_CAT_RECOMPUTE, "recompute block", l,
                     ao->block_forward(x->db, wslot(x, l), block_in(x, l), a, block_out(x, l)));
            rc_holds = l;
        }
        if (act == STREAM_ACT_OFFLOAD && k < x->n_off - 2) wait_ticket(x, x->act_ticket[k], "wait acts", l);
        float *g = x->d_g + (size_t)(l % 2) * x->bn;
        wait_ticket(x, x->g_ticket[l % 2], "wait grad slot", l);
        COMPUTE_(PROF_CAT_COMPUTE, "backward block", l, {
            dev->ops->memset0(dev, g, x->bn * 4);
            ao->block_backward(x->db, wslot(x, l), g, block_in(x, l), a, dres);
        });
        if (x->bf16) {
            /* round on the device (on the CPU backend its memory is addressable; CUDA: a
             * kernel), drain half the bytes; the optimizer reads bf16 gradients natively */
            uint16_t *g16 = x->d_g16 + (size_t)(l % 2) * x->bn;
            COMPUTE_(PROF_CAT_COMPUTE, "grad to bf16", l, dev->ops->to_bf16(dev, g16, g, x->bn));
            x->g_ticket[l % 2] = d2h(x, x->hg16 + x->b0 + (size_t)l * x->bn, g16, x->bn * 2);
        } else {
            x->g_ticket[l % 2] = d2h(x, x->tgv + x->b0 + (size_t)l * x->bn, g, x->bn * 4);
        }
        if (overlap && (add || final)) push_job(x, l, x->g_ticket[l % 2], add, final);
        if (l - D - 1 >= 0) x->w_ticket[l - D - 1] = fetch_block(x, l - D - 1);
        if (act == STREAM_ACT_OFFLOAD && k - 2 >= 0) {
            x->h2d_act_bytes += x->setf * 4;
            x->act_ticket[k - 2] = h2d(x, x->d_off + (size_t)(k % 2) * x->setf,
                                       x->host_acts + (size_t)(k - 2) * x->setf,
                                       x->setf * 4);
        }
    }
    if (x->vc) {
        /* the residual gradient goes to the host, which scatters it into the embedding; a
         * tied head's gradient (landed chunk by chunk, earlier in order) is already in its
         * first V rows, the rest starts from zero */
        wait_ticket(x, d2h(x, x->h_dres, dres, x->NC * 4), "wait residual grad", -1);
        prof_span e = prof_begin(PROF_CAT_OTHER, "backward embed (host)", -1);
        size_t z0 = x->ly->tied ? V * C : 0;
        memset(x->tgv + z0, 0, (x->emb_n - z0) * 4);
        ao->embed_backward(x->hb, x->tgv, x->h_dres);
        prof_end(&e);
    } else {
        COMPUTE_(PROF_CAT_COMPUTE, "backward embed", -1, ao->embed_backward(x->db, x->d_pre_g, dres));
        d2h(x, x->tgv, x->d_pre_g, x->emb_n * 4);
    }
    last = d2h(x, x->tgv + x->post_off, x->d_post_g, x->post_n * 4);
    loss_sum += loss / n_micro; /* as strata train sums the micro-batches' losses */
    if (!final && add && overlap) push_job(x, -1, last, 1, 0);
    if (add && !overlap) { /* on the step thread, every core */
        wait_ticket(x, last, "wait grads", -1);
        prof_span ap = prof_begin(PROF_CAT_OPTIM, "accumulate", mb);
        const size_t piece = 1u << 18;
        long np = (long)((x->n + piece - 1) / piece);
#pragma omp parallel for schedule(static)
        for (long i = 0; i < np; i++) {
            size_t a0 = (size_t)i * piece, e = a0 + piece < x->n ? a0 + piece : x->n;
            add_range(x, a0, e);
        }
        prof_end(&ap);
    }
    } /* micro-batches */
    float loss = (float)loss_sum;
    double t_tail = st_now();

    /* ---- norm, clip, update */
    st_status s = ST_OK;
    double ss;
    if (overlap) {
        push_job(x, -1, last, n_micro > 1, 1);
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
        restore_range(x, x->b0, x->post_off);
        prof_end(&r);
        stats->rolled_back = 1;
        need_update = 1;
    } else if (speculate && !stats->skipped) {
        /* not clipped: the blocks are done; the embedding and ln_f, with the true sum */
        adamw_params h = *hp;
        h.grad_scale = 1.0f;
        int nt = x->ly->n_tensors;
        prof_span u = prof_begin(PROF_CAT_OPTIM, "optim embed+head", -1);
        s = update_segs(x, 0, x->ly->n_pre_tensors, &h, ss, err);
        if (!s) s = update_segs(x, nt - x->ly->n_post_tensors, nt, &h, ss, err);
        prof_end(&u);
        if (s) { /* never half a step: the blocks' speculative updates go too */
            restore_range(x, x->b0, x->post_off);
            goto out;
        }
    }
    if (need_update && !stats->skipped) {
        adamw_params h = *hp;
        h.grad_scale = stats->clipped ? (float)(max_norm / norm) : 1.0f;
        prof_span u = prof_begin(PROF_CAT_OPTIM, "optim step", -1);
        s = update_segs(x, 0, x->ly->n_tensors, &h, ss, err);
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
    const st_arch_ops *ao = x->arch->ops;
    st_backend *dev = x->dev;
    int L = x->L, D = x->depth, N = x->cfg.B * x->cfg.T;
    double compute_s = 0;
    if (!inputs || !targets) return st_errf(err, ST_ERR_INVALID, "stream_eval: inputs and targets are required");
    prof_span span = prof_begin(PROF_CAT_OTHER, "stream eval", -1);
    dev->ops->copy_to_device(dev, x->d_tgt, targets, sizeof(int32_t) * (size_t)N);
    uint64_t enc_ticket = x->vc ? embed_forward(x, inputs) : 0;
    for (int l = 0; l <= D && l < L; l++) x->w_ticket[l] = fetch_block(x, l);
    if (x->vc && L <= D + 1)
        for (int c = 0; c < 2 && c < x->nvc; c++) fetch_vchunk(x, c);
    wait_ticket(x, x->nb_ticket, "wait embed weights", -1);
    if (x->vc) wait_ticket(x, enc_ticket, "wait embedding", -1);
    else embed_forward(x, inputs);
    for (int l = 0; l < L; l++) {
        wait_ticket(x, x->w_ticket[l], "wait weights", l);
        ao->block_forward(x->db, wslot(x, l), block_in(x, l), block_acts(x, l), block_out(x, l));
        if (l + D + 1 < L) {
            x->w_ticket[l + D + 1] = fetch_block(x, l + D + 1);
            if (x->vc && l + D + 1 == L - 1)
                for (int c = 0; c < 2 && c < x->nvc; c++) fetch_vchunk(x, c);
        }
    }
    if (x->vc) *loss = chunked_head_forward(x, block_out(x, L - 1), targets, &compute_s);
    else *loss = head_forward(x, block_out(x, L - 1), targets, 0.0f);
    /* copies still queued (the logits' drain, head chunks) complete before anything the
     * next step waits on: the copy engine completes in order */
    prof_end(&span);
    return ST_OK;
}
