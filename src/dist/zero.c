/* zero.c - the ranks' side of a data-parallel step (dist.h, ZeRO 0, 1 and 2): each block's
 * gradient reduced onto the shards as backward completes it, the norm summed across the
 * shards in the one process's order, the updated weights gathered part by part. The step
 * (exec/step.c) computes and updates; everything here moves or sums over ranks. */
#include <stdlib.h>
#include <string.h>

#include "strata/dist.h"
#include "strata/prof.h"

struct st_zero {
    st_comm *comm;
    int stage;                 /* 0, 1 or 2 */
    size_t n;                  /* the flat vector's elements */
    size_t *bounds;            /* the ranks' shards (st_zero_bounds) */
    size_t lo, hi;             /* this rank's shard */
    float *shard;              /* the summed gradient on the shard */
    double *chunk_sumsq;       /* the norm's partial sums, one per ST_OPTIM_SUMSQ_CHUNK */
    int overlap_gather;
    /* the parts the updated weights are gathered in: the blocks' offsets as the backward
     * hook reports them, sorted, then n */
    size_t *cuts;
    int n_cuts, cap_cuts;
    uint64_t *gather_ticket;   /* per part: the gather in flight (0: none) */
    int next_part;             /* the first part the forward has not yet waited for; -1: none in flight */
    double gather_wait_s;      /* the forward's waits for the weights, this step */
    st_status gather_st;       /* the first error of such a wait */
    st_err gather_err;
};

st_status st_zero_create(st_zero **out, st_comm *c, int stage, const size_t *bounds, size_t n, int overlap_gather,
                         st_err *err) {
    *out = NULL;
    if (stage < 0 || stage > 2) return st_errf(err, ST_ERR_INVALID, "key 'zero': %d; give 0, 1 or 2", stage);
    int W = st_comm_size(c), r = st_comm_rank(c);
    size_t nchunks = (n + ST_OPTIM_SUMSQ_CHUNK - 1) / ST_OPTIM_SUMSQ_CHUNK;
    st_zero *z = calloc(1, sizeof *z);
    if (!z) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    z->comm = c;
    z->stage = stage;
    z->n = n;
    z->overlap_gather = overlap_gather;
    z->next_part = -1;
    z->bounds = malloc(sizeof(size_t) * (size_t)(W + 1));
    z->chunk_sumsq = calloc(nchunks ? nchunks : 1, sizeof(double));
    if (!z->bounds || !z->chunk_sumsq) {
        st_zero_destroy(z);
        return st_errf(err, ST_ERR_NOMEM, "out of memory");
    }
    memcpy(z->bounds, bounds, sizeof(size_t) * (size_t)(W + 1));
    z->lo = bounds[r];
    z->hi = bounds[r + 1];
    size_t sb = (z->hi - z->lo) * sizeof(float);
    if (!(z->shard = st_alloc(sb ? sb : sizeof(float)))) {
        st_zero_destroy(z);
        return st_errf(err, ST_ERR_NOMEM, "rank %d: %zu bytes for the gradient shard", r, sb);
    }
    *out = z;
    return ST_OK;
}

void st_zero_destroy(st_zero *z) {
    if (!z) return;
    st_free(z->shard);
    free(z->bounds);
    free(z->chunk_sumsq);
    free(z->cuts);
    free(z->gather_ticket);
    free(z);
}

int st_zero_stage(const st_zero *z) { return z->stage; }
void st_zero_shard_range(const st_zero *z, size_t *lo, size_t *hi) {
    *lo = z->lo;
    *hi = z->hi;
}
float *st_zero_shard(st_zero *z) { return z->shard; }

/* ---- the gradient: each block's range reduced as backward completes it ---- */

/* g += add over [0, n) (the running sum of the earlier micro-batches onto the last one's
 * gradient: a + b == b + a exactly, so the bits of the step's own accumulation). */
static void add_into(float *g, const float *add, size_t n) {
    const size_t piece = 1u << 18;
    long np = (long)((n + piece - 1) / piece);
#pragma omp parallel for schedule(static)
    for (long i = 0; i < np; i++) {
        size_t a = (size_t)i * piece, e = a + piece < n ? a + piece : n;
        for (size_t j = a; j < e; j++) g[j] += add[j];
    }
}

static void reduce_range(st_zero_pass *p, size_t lo, size_t hi) {
    st_zero *z = p->z;
    if (p->st || hi <= lo) return;
    if (p->add) add_into(p->grads + lo, p->add + lo, hi - lo);
    p->st = st_comm_async_reduce(z->comm, p->grads, lo, hi, z->bounds, z->shard, p->accumulate, p->err);
}

/* A part boundary of the weights' gather (the blocks' offsets, as the backward hook reports
 * them, from the last block down), kept sorted. */
static void note_cut(st_zero *z, size_t at) {
    for (int i = 0; i < z->n_cuts; i++)
        if (z->cuts[i] == at) return;
    if (z->n_cuts == z->cap_cuts) {
        int cap = z->cap_cuts ? 2 * z->cap_cuts : 64;
        size_t *c = realloc(z->cuts, sizeof *c * (size_t)cap);
        if (!c) return; /* fewer parts: a coarser overlap, the same weights */
        z->cuts = c;
        z->cap_cuts = cap;
    }
    size_t i = (size_t)z->n_cuts++;
    for (; i > 0 && z->cuts[i - 1] > at; i--) z->cuts[i] = z->cuts[i - 1];
    z->cuts[i] = at;
}

void st_zero_pass_begin(st_zero_pass *p, st_zero *z, float *grads, const float *add, int accumulate, st_err *err) {
    *p = (st_zero_pass){.z = z, .grads = grads, .add = add, .accumulate = accumulate, .done_lo = z->n, .err = err};
}

void st_zero_grad_ready(void *pass, size_t offset, size_t n) {
    st_zero_pass *p = pass;
    if (p->z->overlap_gather) {
        note_cut(p->z, offset);
        note_cut(p->z, offset + n);
    }
    reduce_range(p, offset, offset + n);
    if (offset < p->done_lo) p->done_lo = offset;
    if (offset + n > p->done_hi) p->done_hi = offset + n;
}

st_status st_zero_pass_end(st_zero_pass *p, double *wait_s) {
    size_t n = p->z->n;
    size_t first = p->done_lo < p->done_hi ? p->done_lo : n, last = p->done_hi;
    if (first > 0) reduce_range(p, 0, first);
    if (last < n && p->done_lo < p->done_hi) reduce_range(p, last, n);
    if (p->st) return p->st;
    double t = st_now();
    st_prof_span pw = st_prof_begin(ST_PROF_CAT_OTHER, "gradient reduce wait", -1);
    st_status st = st_comm_async_wait(p->z->comm, "gradient reduce", p->err);
    st_prof_end(&pw);
    *wait_s += st_now() - t;
    return st;
}

/* A blocking collective's wait, counted as the step's exposed communication. */
static st_status timed_wait(st_zero *z, st_comm_req *q, const char *phase, double *wait_s, st_err *err) {
    double t = st_now();
    st_prof_span pw = st_prof_begin(ST_PROF_CAT_OTHER, phase, -1);
    st_status st = st_comm_wait(z->comm, q, phase, err);
    st_prof_end(&pw);
    *wait_s += st_now() - t;
    return st;
}

st_status st_zero_summed(st_zero *z, float *grads, const float **g, size_t *lo, size_t *hi, double *wait_s,
                         st_err *err) {
    *g = z->shard;
    *lo = z->lo;
    *hi = z->hi;
    if (z->stage != 0) return ST_OK;
    /* ZeRO 0: the summed gradient on every rank, then the whole update everywhere */
    memcpy(grads + z->lo, z->shard, (z->hi - z->lo) * sizeof(float));
    st_comm_req *q;
    st_status st = st_comm_iallgather_f32(z->comm, grads, 0, z->n, z->bounds, &q, err);
    if (!st) st = timed_wait(z, q, "gradient gather", wait_s, err);
    *g = grads;
    *lo = 0;
    *hi = z->n;
    return st;
}

/* ---- the norm ---- */

/* The end of the last chunk that starts in rank r's shard (it may reach into later ranks'). */
static size_t chunk_need_end(const st_zero *z, int r) {
    const size_t CH = ST_OPTIM_SUMSQ_CHUNK, *b = z->bounds;
    if (!(b[r + 1] > b[r] && (b[r + 1] - 1) / CH * CH >= b[r])) return b[r + 1];
    size_t e = (b[r + 1] - 1) / CH * CH + CH;
    return e < z->n ? e : z->n;
}

/* The squared norm of the summed gradient g on [lo, hi): chunk c of ST_OPTIM_SUMSQ_CHUNK
 * elements is summed by the rank holding its first element (which receives the end of a
 * chunk crossing into the next shards), the partial sums gathered and added in chunk order:
 * the bits st_optim_grad_sumsq gives on the whole vector, whatever the cuts. */
st_status st_zero_grad_sumsq(st_zero *z, const float *g, size_t lo, size_t hi, double *sumsq, st_err *err) {
    const size_t CH = ST_OPTIM_SUMSQ_CHUNK;
    size_t np = z->n, nchunks = (np + CH - 1) / CH;
    memset(z->chunk_sumsq, 0, nchunks * sizeof(double));
    st_status st = ST_OK;
    st_prof_span pn = st_prof_begin(ST_PROF_CAT_OPTIM, "grad norm", -1);
    if (hi - lo == np) { /* the whole gradient is here (ZeRO 0) */
        st_optim_grad_sumsq_parts(g, ST_F32, np, z->chunk_sumsq);
    } else {
        int W = st_comm_size(z->comm), me = st_comm_rank(z->comm);
        const size_t *b = z->bounds;
        size_t first = (lo + CH - 1) / CH * CH, need = chunk_need_end(z, me);
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
            size_t e = chunk_need_end(z, r);
            size_t a = b[r + 1] > lo ? b[r + 1] : lo, ee = e < hi ? e : hi;
            if (e > b[r + 1] && ee > a) snd[ns++] = (st_comm_piece){r, (float *)g + (a - lo), ee - a};
        }
        if (!st) st = st_comm_exchange_f32(z->comm, snd, ns, rcv, nr, "gradient norm", err);
        if (!st) {
            size_t full_end = need > hi ? last : hi; /* the chunks wholly here */
            if (full_end > first)
                st_optim_grad_sumsq_parts(g + (first - lo), ST_F32, full_end - first, z->chunk_sumsq + first / CH);
            if (tail) st_optim_grad_sumsq_parts(tail, ST_F32, need - last, z->chunk_sumsq + last / CH);
        }
        free(tail);
        free(snd);
        free(rcv);
        /* every chunk is one rank's (the others add 0.0, which changes no bit) */
        if (!st) st = st_comm_allreduce_f64(z->comm, z->chunk_sumsq, (int)nchunks, "gradient norm", err);
    }
    st_prof_end(&pn);
    double t = 0;
    for (size_t c = 0; c < nchunks; c++) t += z->chunk_sumsq[c];
    *sumsq = t;
    return st;
}

/* ---- the weights after the update ---- */

/* Every rank's shard of the weights to every rank, part by part (parts: [0, cuts[0]),
 * [cuts[i], cuts[i+1]), ..., [last cut, n)) on the communication thread. */
static st_status gather_start(st_zero *z, float *params, st_err *err) {
    int nparts = z->n_cuts + 1;
    free(z->gather_ticket);
    if (!(z->gather_ticket = calloc((size_t)nparts, sizeof *z->gather_ticket)))
        return st_errf(err, ST_ERR_NOMEM, "out of memory");
    z->next_part = 0;
    for (int i = 0; i < nparts; i++) {
        size_t a = i ? z->cuts[i - 1] : 0, e = i < z->n_cuts ? z->cuts[i] : z->n;
        if (e <= a) continue;
        st_status st = st_comm_async_gather(z->comm, params, a, e, z->bounds, &z->gather_ticket[i], err);
        if (st) return st;
    }
    return ST_OK;
}

st_status st_zero_share_weights(st_zero *z, float *params, double *wait_s, st_err *err) {
    if (z->stage == 0) return ST_OK; /* every rank updated the whole vector */
    if (z->overlap_gather && z->n_cuts > 0) return gather_start(z, params, err); /* waited for by the next forward */
    st_comm_req *q;
    st_status st = st_comm_iallgather_f32(z->comm, params, 0, z->n, z->bounds, &q, err);
    return st ? st : timed_wait(z, q, "weights gather", wait_s, err);
}

int st_zero_gathering(const st_zero *z) { return z->gather_ticket && z->next_part >= 0; }

void st_zero_step_begin(st_zero *z) {
    z->gather_wait_s = 0;
    z->gather_st = ST_OK;
}

void st_zero_weights_ready(void *zero, size_t offset, size_t n) {
    st_zero *z = zero;
    int nparts = z->n_cuts + 1, last = -1;
    for (int i = z->next_part; i < nparts; i++) {
        size_t a = i ? z->cuts[i - 1] : 0;
        if (a >= offset + n) break;
        if (z->gather_ticket[i]) last = i;
        z->next_part = i + 1;
    }
    if (last < 0 || z->gather_st) return;
    double t = st_now();
    st_prof_span pw = st_prof_begin(ST_PROF_CAT_OTHER, "weights gather wait", last);
    z->gather_st = st_comm_async_wait_ticket(z->comm, z->gather_ticket[last], &z->gather_err);
    st_prof_end(&pw);
    z->gather_wait_s += st_now() - t;
}

st_status st_zero_weights_done(st_zero *z, double *wait_s, st_err *err) {
    *wait_s += z->gather_wait_s;
    if (z->gather_st) {
        *err = z->gather_err;
        return z->gather_st;
    }
    return st_zero_sync(z, err); /* every part was waited for: returns at once */
}

st_status st_zero_sync(st_zero *z, st_err *err) {
    if (!st_zero_gathering(z)) return ST_OK;
    double t = st_now();
    st_status st = st_comm_async_wait(z->comm, "weights gather", err);
    z->gather_wait_s += st_now() - t;
    z->next_part = -1; /* nothing in flight */
    return st;
}
