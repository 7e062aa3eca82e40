/* comm.c - the communication interface (strata/dist.h) over MPI, or a world of one.
 *
 * Over MPI every operation is non-blocking underneath (point-to-point Isend/Irecv for the
 * ranged reductions and gathers, MPI_Ibarrier/Ibcast/Iallgather for the small ones) and
 * every wait polls MPI_Testsome against a deadline, so a lost peer is an error naming it,
 * not a hang. The communicator is a duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN.
 * Tags: one sequence number per operation, the same on every rank because every rank
 * issues the same operations in the same order. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dist/nccl_internal.h"
#include "strata/dist.h"

#ifdef STRATA_HAVE_MPI
#include <mpi.h>
#endif

enum { REQ_REDUCE = 1, REQ_GATHER = 2, REQ_SMALL = 3, REQ_NCCL = 4 };

/* An operation queued for the communication thread: a reduction (st_comm_async_reduce), a
 * gather (st_comm_async_gather) or a small collective a caller waits on (small_exchange
 * while the thread runs). Each has a ticket, in queue order. */
enum { TASK_REDUCE = 1, TASK_GATHER = 2, TASK_SMALL = 3 };
typedef struct async_task {
    int kind;
    uint64_t ticket;
    const float *in; /* reduce: the gradient */
    float *x;        /* gather: the vector */
    size_t lo, hi;
    const size_t *bounds;
    float *out;
    int accumulate;
    const void *send; /* small */
    size_t bytes;
    void *recv;
    int root;
    const char *phase;
    double queued_at;
} async_task;

static void async_stop(st_comm *c);
static st_status settle(st_comm *c, st_err *err);

struct st_comm {
    int rank, size, local_size, mpi;
    double timeout_s;
    uint64_t sent, received;
    unsigned seq, seq_small; /* tags: 1..30000 for most operations; 30001..32000 for the small ones
                                the communication thread posts ahead of queued ones */
    /* the communication thread (started at the first st_comm_async_reduce) */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int started, stop;
    async_task *tasks;   /* queued, not yet posted */
    int n_tasks, cap_tasks, busy; /* busy: tasks queued or posted and not complete */
    uint64_t next_ticket;
    long test_delay_us;  /* STRATA_COMM_DELAY_MS (tests): each queued gather posted that much later */
    uint64_t *inflight;  /* the tickets taken by the thread and not complete */
    int n_inflight, cap_inflight;
    st_status async_status;
    st_err async_err;
    nccl_comm *nccl;     /* st_comm_open_nccl: the ranged operations on device memory */
    st_comm *boot;       /* ... and the small ones through this one */
#ifdef STRATA_HAVE_MPI
    MPI_Comm comm;
#endif
};

struct st_comm_req {
    int kind;
    int n;           /* MPI requests */
    int *peer;       /* the peer of each request (-1: a collective) */
    int *done;       /* completed requests */
#ifdef STRATA_HAVE_MPI
    MPI_Request *r;
#endif
    /* a reduction's sum, done at the wait */
    const float *in;
    float *out;
    size_t a, e;     /* this rank's part of the range: flat [a, e) */
    size_t out_base; /* flat index of out[0] */
    float **recv;    /* per rank: its piece of [a, e) (NULL: none or this rank) */
    int accumulate;
    int serial;      /* sum on this thread only (the communication thread) */
    int left;        /* requests not complete (from the first poll) */
    int polled;
    int *idx;        /* MPI_Testsome's scratch */
    double t0;       /* posted at */
    uint64_t bytes_in, bytes_out;
};


static int env_set(const char *k) {
    const char *v = getenv(k);
    return v && *v;
}

/* A launcher started this process: OpenMPI's mpirun, or PMI/PMIx (srun, other MPIs). */
static int launched(void) {
    return env_set("OMPI_COMM_WORLD_SIZE") || env_set("PMIX_RANK") || env_set("PMI_RANK") || env_set("PMI_SIZE");
}

int st_comm_launched_size(void) {
    const char *v = getenv("OMPI_COMM_WORLD_SIZE");
    if (!v || !*v) v = getenv("PMI_SIZE");
    if (v && *v) return atoi(v) > 0 ? atoi(v) : 0;
    return launched() ? 0 : 1;
}

int st_comm_rank(const st_comm *c) { return c ? c->rank : 0; }
int st_comm_size(const st_comm *c) { return c ? c->size : 1; }
int st_comm_local_size(const st_comm *c) { return c ? c->local_size : 1; }
const char *st_comm_engine(const st_comm *c) { return !c ? "self" : c->nccl ? "nccl" : c->mpi ? "mpi" : "self"; }
int st_comm_threads(const st_comm *c) {
    long n = sysconf(_SC_NPROCESSORS_ONLN) / st_comm_local_size(c);
    return n < 1 ? 1 : (int)n;
}
void st_comm_set_timeout(st_comm *c, double t) { c->timeout_s = t > 0 ? t : 300.0; }
void st_comm_bytes(const st_comm *c, uint64_t *sent, uint64_t *received) {
    if (sent) *sent = c->sent;
    if (received) *received = c->received;
}

st_status st_comm_open(st_comm **out, double timeout_s, st_err *err) {
    *out = NULL;
    st_comm *c = calloc(1, sizeof *c);
    if (!c) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    c->size = c->local_size = 1;
    st_comm_set_timeout(c, timeout_s);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    const char *delay = getenv("STRATA_COMM_DELAY_MS");
    if (delay && atol(delay) > 0 && atol(delay) < 10000) c->test_delay_us = atol(delay) * 1000;
    if (!launched()) {
        *out = c;
        return ST_OK;
    }
#ifdef STRATA_HAVE_MPI
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (!inited && MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
        free(c);
        return st_errf(err, ST_ERR_IO, "MPI_Init failed: the launcher's environment is set (mpirun or srun) but MPI "
                       "could not start; run without the launcher for one process");
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &c->comm);
    MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->comm, &c->rank);
    MPI_Comm_size(c->comm, &c->size);
    MPI_Comm local;
    if (MPI_Comm_split_type(c->comm, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &local) == MPI_SUCCESS) {
        MPI_Comm_size(local, &c->local_size);
        MPI_Comm_free(&local);
    }
    c->mpi = 1;
    if (c->size > ST_DIST_MAX_RANKS) {
        int n = c->size;
        st_comm_close(c);
        return st_errf(err, ST_ERR_UNSUPPORTED, "%d ranks; this strata runs at most %d", n, ST_DIST_MAX_RANKS);
    }
    *out = c;
    return ST_OK;
#else
    free(c);
    return st_errf(err, ST_ERR_UNSUPPORTED, "this process was started by an MPI launcher (mpirun or srun) but this "
                   "strata was built without MPI; install libopenmpi-dev (tools/setup.sh) and rebuild");
#endif
}

st_status st_comm_open_nccl(st_comm **out, st_comm *boot, int device, st_err *err) {
    *out = NULL;
    st_comm *c = calloc(1, sizeof *c);
    if (!c) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    c->rank = boot->rank;
    c->size = boot->size;
    c->local_size = boot->local_size;
    c->timeout_s = boot->timeout_s;
    c->boot = boot;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    st_status s = nccl_open(&c->nccl, boot, device, err);
    if (s) {
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->cv);
        free(c);
        return s;
    }
    *out = c;
    return ST_OK;
}

void st_comm_close(st_comm *c) {
    if (!c) return;
    async_stop(c);
    if (c->nccl) {
        nccl_close(c->nccl, 0);
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->cv);
        free(c->tasks);
        free(c->inflight);
        free(c);
        return;
    }
#ifdef STRATA_HAVE_MPI
    if (c->mpi) {
        MPI_Comm_free(&c->comm);
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin) MPI_Finalize();
    }
#endif
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c->tasks);
    free(c->inflight);
    free(c);
}

void st_comm_abort(st_comm *c, int code) {
    if (c && c->nccl) { /* the NCCL communicator aborted (a lost peer must not hang its close); boot is the caller's */
        nccl_close(c->nccl, 1);
        c->nccl = NULL;
        c->boot = NULL;
        st_comm_close(c);
        return;
    }
#ifdef STRATA_HAVE_MPI
    if (c && c->mpi && c->size > 1) MPI_Abort(MPI_COMM_WORLD, code ? code : 1);
#endif
    (void)code;
    st_comm_close(c);
}

/* ------------------------------------------------------------------ requests */

static void req_free(st_comm_req *q) {
    if (!q) return;
    if (q->recv) {
        /* the pieces share one allocation: the first non-NULL one */
        free(q->recv[ST_DIST_MAX_RANKS]);
        free(q->recv);
    }
    free(q->peer);
    free(q->done);
    free(q->idx);
#ifdef STRATA_HAVE_MPI
    free(q->r);
#endif
    free(q);
}

static st_comm_req *req_new(int kind, int cap) {
    st_comm_req *q = calloc(1, sizeof *q);
    if (!q) return NULL;
    q->kind = kind;
    q->t0 = st_now();
    q->peer = calloc((size_t)cap + 1, sizeof *q->peer);
    q->done = calloc((size_t)cap + 1, sizeof *q->done);
#ifdef STRATA_HAVE_MPI
    q->r = calloc((size_t)cap + 1, sizeof *q->r);
    if (!q->r) q->peer = (free(q->peer), NULL);
#endif
    if (!q->peer || !q->done) {
        req_free(q);
        return NULL;
    }
    return q;
}

/* The sum of a reduction, once every piece is here: rank order, elementwise (so the
 * thread count does not matter). */
static void reduce_finish(st_comm *c, st_comm_req *q) {
    size_t n = q->e - q->a;
    if (!n) return;
    float *out = q->out + (q->a - q->out_base);
    int first = !q->accumulate;
    for (int r = 0; r < c->size; r++) {
        const float *src = r == c->rank ? q->in + q->a : q->recv[r];
        if (first) {
            memcpy(out, src, n * sizeof(float));
            first = 0;
            continue;
        }
        const size_t piece = 1u << 16;
        long np = (long)((n + piece - 1) / piece);
#pragma omp parallel for schedule(static) if (np > 4 && !q->serial)
        for (long i = 0; i < np; i++) {
            size_t lo = (size_t)i * piece, hi = lo + piece < n ? lo + piece : n;
            for (size_t j = lo; j < hi; j++) out[j] += src[j];
        }
    }
}

#ifdef STRATA_HAVE_MPI
#define MPI_PIECE ((size_t)1 << 28) /* floats per message: MPI counts are int */

static st_status mpi_fail(st_comm *c, int rc, const char *what, int peer, st_err *err) {
    (void)c;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    if (peer >= 0)
        return st_errf(err, ST_ERR_IO, "%s with rank %d failed: %s; that rank may have died", what, peer, msg);
    return st_errf(err, ST_ERR_IO, "%s failed: %s", what, msg);
}

static st_status post_send(st_comm *c, st_comm_req *q, const float *p, size_t n, int peer, int tag, st_err *err) {
    for (size_t o = 0; o < n; o += MPI_PIECE) {
        int k = (int)(n - o < MPI_PIECE ? n - o : MPI_PIECE);
        int rc = MPI_Isend(p + o, k, MPI_FLOAT, peer, tag, c->comm, &q->r[q->n]);
        if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "a send", peer, err);
        q->peer[q->n++] = peer;
        q->bytes_out += (uint64_t)k * sizeof(float);
    }
    return ST_OK;
}

static st_status post_recv(st_comm *c, st_comm_req *q, float *p, size_t n, int peer, int tag, st_err *err) {
    for (size_t o = 0; o < n; o += MPI_PIECE) {
        int k = (int)(n - o < MPI_PIECE ? n - o : MPI_PIECE);
        int rc = MPI_Irecv(p + o, k, MPI_FLOAT, peer, tag, c->comm, &q->r[q->n]);
        if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "a receive", peer, err);
        q->peer[q->n++] = peer;
        q->bytes_in += (uint64_t)k * sizeof(float);
    }
    return ST_OK;
}

static int msgs(size_t n) { return (int)((n + MPI_PIECE - 1) / MPI_PIECE); }
#endif

static int next_tag(st_comm *c) { return (int)(c->seq++ % 30000u) + 1; }

void dist_part_of(const size_t *bounds, int r, size_t lo, size_t hi, size_t *a, size_t *e) {
    *a = bounds[r] > lo ? bounds[r] : lo;
    *e = bounds[r + 1] < hi ? bounds[r + 1] : hi;
    if (*e < *a) *e = *a;
}

/* The MPI messages of a ranged operation on this rank: each peer's part out (or in) and this
 * rank's part in (or out). */
static int ranged_msgs(const st_comm *c, const size_t *bounds, size_t lo, size_t hi) {
    int cap = 0;
#ifdef STRATA_HAVE_MPI
    size_t a, e;
    dist_part_of(bounds, c->rank, lo, hi, &a, &e);
    for (int r = 0; r < c->size; r++) {
        size_t pa, pe;
        dist_part_of(bounds, r, lo, hi, &pa, &pe);
        if (r != c->rank) cap += msgs(pe - pa) + msgs(e - a);
    }
#else
    (void)c, (void)bounds, (void)lo, (void)hi;
#endif
    return cap;
}

/* An NCCL operation: enqueued on the comm's stream; the request's wait completes it. */
static st_status nccl_req(st_comm *c, st_status s, uint64_t in, uint64_t out, st_comm_req **req, st_err *err) {
    if (s) return s;
    st_comm_req *q = req_new(REQ_NCCL, 0);
    if (!q) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    q->bytes_in = in;
    q->bytes_out = out;
    (void)c;
    *req = q;
    return ST_OK;
}

/* Bytes this rank sends and receives in a ranged operation. */
static void ranged_bytes(const st_comm *c, const size_t *bounds, size_t lo, size_t hi, int gather, uint64_t *in,
                         uint64_t *out) {
    size_t a = bounds[c->rank] > lo ? bounds[c->rank] : lo, e = bounds[c->rank + 1] < hi ? bounds[c->rank + 1] : hi;
    size_t mine = e > a ? e - a : 0, others = (hi - lo) - mine;
    *in = (uint64_t)(gather ? others : mine * (size_t)(c->size - 1)) * sizeof(float);
    *out = (uint64_t)(gather ? mine * (size_t)(c->size - 1) : others) * sizeof(float);
}

st_status st_comm_ireduce_scatter_f32(st_comm *c, const float *in, size_t lo, size_t hi, const size_t *bounds,
                                      float *out, int accumulate, st_comm_req **req, st_err *err) {
    *req = NULL;
    st_status s0 = settle(c, err);
    if (s0) return s0;
    if (c->nccl) {
        uint64_t bi, bo;
        ranged_bytes(c, bounds, lo, hi, 0, &bi, &bo);
        return nccl_req(c, nccl_reduce_scatter(c->nccl, in, lo, hi, bounds, out, accumulate, err), bi, bo, req, err);
    }
    int tag = next_tag(c), cap = ranged_msgs(c, bounds, lo, hi);
    size_t a, e;
    dist_part_of(bounds, c->rank, lo, hi, &a, &e);
    st_comm_req *q = req_new(REQ_REDUCE, cap);
    if (!q || !(q->recv = calloc(ST_DIST_MAX_RANKS + 1, sizeof *q->recv))) {
        req_free(q);
        return st_errf(err, ST_ERR_NOMEM, "out of memory for a reduction");
    }
    q->in = in;
    q->out = out;
    q->out_base = bounds[c->rank];
    q->a = a;
    q->e = e;
    q->accumulate = accumulate;
    size_t n = e - a;
    if (c->size > 1 && n) {
        float *buf = malloc((size_t)(c->size - 1) * n * sizeof(float));
        if (!buf) {
            req_free(q);
            return st_errf(err, ST_ERR_NOMEM, "rank %d: %zu bytes for the gradient pieces of %d ranks", c->rank,
                           (size_t)(c->size - 1) * n * sizeof(float), c->size - 1);
        }
        q->recv[ST_DIST_MAX_RANKS] = buf;
        for (int r = 0, k = 0; r < c->size; r++)
            if (r != c->rank) q->recv[r] = buf + (size_t)k++ * n;
    }
#ifdef STRATA_HAVE_MPI
    st_status s = ST_OK;
    for (int r = 0; r < c->size && !s; r++) {
        if (r == c->rank) continue;
        size_t pa, pe;
        dist_part_of(bounds, r, lo, hi, &pa, &pe);
        if (n) s = post_recv(c, q, q->recv[r], n, r, tag, err);
        if (!s && pe > pa) s = post_send(c, q, in + pa, pe - pa, r, tag, err);
    }
    if (s) {
        req_free(q); /* a post that failed: the job is ending (the peer is lost) */
        return s;
    }
#else
    (void)tag;
#endif
    *req = q;
    return ST_OK;
}

st_status st_comm_iallgather_f32(st_comm *c, float *x, size_t lo, size_t hi, const size_t *bounds,
                                 st_comm_req **req, st_err *err) {
    *req = NULL;
    st_status s0 = settle(c, err);
    if (s0) return s0;
    if (c->nccl) {
        uint64_t bi, bo;
        ranged_bytes(c, bounds, lo, hi, 1, &bi, &bo);
        return nccl_req(c, nccl_allgather(c->nccl, x, lo, hi, bounds, err), bi, bo, req, err);
    }
    int tag = next_tag(c), cap = ranged_msgs(c, bounds, lo, hi);
    size_t a, e;
    dist_part_of(bounds, c->rank, lo, hi, &a, &e);
    st_comm_req *q = req_new(REQ_GATHER, cap);
    if (!q) return st_errf(err, ST_ERR_NOMEM, "out of memory for a gather");
#ifdef STRATA_HAVE_MPI
    st_status s = ST_OK;
    for (int r = 0; r < c->size && !s; r++) {
        if (r == c->rank) continue;
        size_t pa, pe;
        dist_part_of(bounds, r, lo, hi, &pa, &pe);
        if (pe > pa) s = post_recv(c, q, x + pa, pe - pa, r, tag, err);
        if (!s && e > a) s = post_send(c, q, x + a, e - a, r, tag, err);
    }
    if (s) {
        req_free(q);
        return s;
    }
#else
    (void)tag;
    (void)x;
#endif
    *req = q;
    return ST_OK;
}

st_status st_comm_exchange_f32(st_comm *c, const st_comm_piece *sends, int ns, const st_comm_piece *recvs, int nr,
                               const char *phase, st_err *err) {
    if (c->boot) return st_comm_exchange_f32(c->boot, sends, ns, recvs, nr, phase, err); /* host memory */
    st_status s0 = settle(c, err);
    if (s0) return s0;
    int tag = next_tag(c);
    if (c->size == 1) return ST_OK;
#ifdef STRATA_HAVE_MPI
    int cap = 0;
    for (int i = 0; i < ns; i++) cap += msgs(sends[i].n);
    for (int i = 0; i < nr; i++) cap += msgs(recvs[i].n);
    st_comm_req *q = req_new(REQ_SMALL, cap);
    if (!q) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    st_status s = ST_OK;
    for (int i = 0; i < nr && !s; i++) s = post_recv(c, q, recvs[i].buf, recvs[i].n, recvs[i].peer, tag, err);
    for (int i = 0; i < ns && !s; i++) s = post_send(c, q, sends[i].buf, sends[i].n, sends[i].peer, tag, err);
    if (s) {
        req_free(q);
        return s;
    }
    return st_comm_wait(c, q, phase, err);
#else
    (void)tag, (void)sends, (void)ns, (void)recvs, (void)nr, (void)phase, (void)err;
    return ST_OK;
#endif
}

/* Progress q without blocking: 1 when complete (summed, counted: free it), 0 when not yet,
 * -1 on an error (a failed MPI call, or the timeout since it was posted, naming the peers
 * that sent nothing). */
static int req_poll(st_comm *c, st_comm_req *q, const char *phase, st_err *err) {
    if (q->kind == REQ_NCCL) { /* the stream, polled against the timeout */
        if (nccl_wait(c->nccl, c->timeout_s, phase, err)) return -1;
        c->sent += q->bytes_out;
        c->received += q->bytes_in;
        return 1;
    }
#ifdef STRATA_HAVE_MPI
    if (!q->polled) {
        q->polled = 1;
        q->left = q->n;
    }
    if (q->left > 0) {
        if (!q->idx && !(q->idx = malloc(sizeof(int) * (size_t)q->n))) {
            st_errf(err, ST_ERR_NOMEM, "out of memory");
            return -1;
        }
        int outcount = 0;
        int rc = MPI_Testsome(q->n, q->r, &outcount, q->idx, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) {
            int peer = -1;
            for (int i = 0; i < q->n && peer < 0; i++)
                if (!q->done[i]) peer = q->peer[i];
            mpi_fail(c, rc, phase, peer, err);
            return -1;
        }
        if (outcount == MPI_UNDEFINED) q->left = 0;
        for (int i = 0; i < outcount && outcount != MPI_UNDEFINED; i++) q->done[q->idx[i]] = 1;
        if (outcount != MPI_UNDEFINED) q->left -= outcount;
        if (q->left > 0) {
            if (st_now() - q->t0 <= c->timeout_s) return 0;
            char who[256] = "";
            size_t w = 0;
            int last = -2;
            for (int i = 0; i < q->n && w + 16 < sizeof who; i++)
                if (!q->done[i] && q->peer[i] != last) {
                    last = q->peer[i];
                    w += (size_t)snprintf(who + w, sizeof who - w, "%s%d", w ? ", " : "", q->peer[i]);
                }
            st_errf(err, ST_ERR_IO, "%s: nothing from rank %s within %.0f s (key 'dist_timeout'): that rank died "
                    "or hangs; every rank stops; the last committed checkpoint is intact", phase, who[0] ? who : "?",
                    c->timeout_s);
            return -1;
        }
    }
#else
    (void)phase, (void)err;
#endif
    if (q->kind == REQ_REDUCE) reduce_finish(c, q);
    c->sent += q->bytes_out;
    c->received += q->bytes_in;
    return 1;
}

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

st_status st_comm_wait(st_comm *c, st_comm_req *q, const char *phase, st_err *err) {
    if (!q) return ST_OK;
    int spins = 0, rc;
    while ((rc = req_poll(c, q, phase, err)) == 0)
        if (++spins > 64) sleep_us(spins > 4096 ? 200 : 20);
    req_free(q);
    return rc < 0 ? (err->code ? err->code : ST_ERR_IO) : ST_OK;
}

/* ------------------------------------------------------------------ the communication thread
 * The compute thread queues reductions (each as its range of the gradient is complete) and
 * gathers (each block's updated weights, waited for as the next forward reaches the block)
 * and goes on computing; this thread posts them in queue order, progresses them and sums
 * each reduction as it arrives. While it has work, every other operation either goes
 * through it (the small collectives: queued, then waited for alone) or waits until it is
 * idle (settle), so MPI is never entered by two threads at once (MPI_THREAD_SERIALIZED)
 * and every rank posts the same operations in the same order (the tags agree). */

static int on_thread(const st_comm *c) { return c->started && pthread_equal(pthread_self(), c->thread); }

static st_status small_post(st_comm *c, const void *send, size_t bytes, void *recv, int root, const char *phase,
                            int own_tags, st_comm_req **out, st_err *err);

/* Post one queued task (on the thread). */
static st_status task_post(st_comm *c, const async_task *t, st_comm_req **q, st_err *e) {
    st_status s;
    switch (t->kind) {
    case TASK_REDUCE: s = st_comm_ireduce_scatter_f32(c, t->in, t->lo, t->hi, t->bounds, t->out, t->accumulate, q, e);
        break;
    case TASK_GATHER: s = st_comm_iallgather_f32(c, t->x, t->lo, t->hi, t->bounds, q, e); break;
    default: return small_post(c, t->send, t->bytes, t->recv, t->root, t->phase, 1, q, e);
    }
    if (!s && *q) (*q)->bytes_in = (*q)->bytes_out = 0; /* counted when queued */
    return s;
}

static void inflight_drop(st_comm *c, uint64_t t) {
    for (int i = 0; i < c->n_inflight; i++)
        if (c->inflight[i] == t) {
            c->inflight[i] = c->inflight[--c->n_inflight];
            return;
        }
}

/* Room for one more in flight. */
static int fly_room(st_comm_req ***fly, async_task **flyt, int nfly, int *capfly) {
    if (nfly < *capfly) return 1;
    int cap = *capfly ? 2 * *capfly : 64;
    st_comm_req **p = realloc(*fly, sizeof *p * (size_t)cap);
    if (p) *fly = p;
    async_task *pt = p ? realloc(*flyt, sizeof *pt * (size_t)cap) : NULL;
    if (pt) *flyt = pt;
    if (!p || !pt) return 0;
    *capfly = cap;
    return 1;
}

static void *async_main(void *arg) {
    st_comm *c = arg;
    st_comm_req **fly = NULL;
    async_task *flyt = NULL; /* the task of each request in flight */
    async_task *later = NULL; /* taken, not yet posted: the ranged operations, in queue order */
    int nfly = 0, capfly = 0, idle = 0, nlater = 0, caplater = 0;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->stop && !c->n_tasks && !nfly && !nlater) pthread_cond_wait(&c->cv, &c->mu);
        if (c->stop && !c->n_tasks && !nfly && !nlater) break;
        st_err e = {0};
        st_status s = ST_OK;
        int nt = c->n_tasks;
        async_task *tk = NULL;
        if (nt && (tk = malloc(sizeof *tk * (size_t)nt))) {
            uint64_t *p = c->inflight;
            if (c->n_inflight + nt > c->cap_inflight) {
                int cap = 2 * (c->n_inflight + nt);
                if ((p = realloc(c->inflight, sizeof *p * (size_t)cap))) {
                    c->inflight = p;
                    c->cap_inflight = cap;
                }
            }
            if (nlater + nt > caplater) {
                int cap = 2 * (nlater + nt);
                async_task *pl = realloc(later, sizeof *pl * (size_t)cap);
                if (pl) {
                    later = pl;
                    caplater = cap;
                } else p = NULL;
            }
            if (p) {
                memcpy(tk, c->tasks, sizeof *tk * (size_t)nt);
                for (int i = 0; i < nt; i++) c->inflight[c->n_inflight++] = tk[i].ticket;
                c->n_tasks = 0;
            } else {
                free(tk);
                tk = NULL;
                nt = 0;
            }
        } else nt = 0;
        pthread_mutex_unlock(&c->mu);
        /* the small collectives at once (their own tags; a caller waits on each), the ranged
         * operations in queue order behind the ones taken earlier */
        for (int i = 0; i < nt && !s; i++) {
            if (tk[i].kind != TASK_SMALL) {
                later[nlater++] = tk[i];
                continue;
            }
            st_comm_req *q;
            if (!fly_room(&fly, &flyt, nfly, &capfly)) s = st_errf(&e, ST_ERR_NOMEM, "out of memory");
            else if (!(s = task_post(c, &tk[i], &q, &e))) {
                if (q) {
                    q->serial = 1;
                    flyt[nfly] = tk[i];
                    fly[nfly++] = q;
                } else {
                    pthread_mutex_lock(&c->mu);
                    inflight_drop(c, tk[i].ticket);
                    pthread_mutex_unlock(&c->mu);
                }
            }
        }
        free(tk);
        int posted = 0;
        while (posted < nlater && !s) {
            async_task *t = &later[posted];
            /* tests (STRATA_COMM_DELAY_MS): a gather posted that long after it was queued, as
             * over a slow link; what follows it waits behind it, the small ones do not */
            if (t->kind == TASK_GATHER && c->test_delay_us && st_now() - t->queued_at < c->test_delay_us * 1e-6) break;
            st_comm_req *q;
            if (!fly_room(&fly, &flyt, nfly, &capfly)) {
                s = st_errf(&e, ST_ERR_NOMEM, "out of memory");
                break;
            }
            if ((s = task_post(c, t, &q, &e))) break;
            posted++;
            if (!q) { /* nothing to wait for */
                pthread_mutex_lock(&c->mu);
                inflight_drop(c, t->ticket);
                pthread_mutex_unlock(&c->mu);
                continue;
            }
            q->serial = 1;
            flyt[nfly] = *t;
            fly[nfly++] = q;
        }
        if (posted) memmove(later, later + posted, sizeof *later * (size_t)(nlater -= posted));
        int progressed = posted > 0, finished = 0;
        for (int i = 0; i < nfly && !s; i++) {
            const char *phase = flyt[i].kind == TASK_REDUCE   ? "gradient reduce"
                                : flyt[i].kind == TASK_GATHER ? "weights gather"
                                                              : flyt[i].phase;
            int rc = req_poll(c, fly[i], phase, &e);
            if (rc < 0) s = e.code ? e.code : ST_ERR_IO;
            else if (rc > 0) {
                req_free(fly[i]);
                pthread_mutex_lock(&c->mu);
                inflight_drop(c, flyt[i].ticket);
                pthread_mutex_unlock(&c->mu);
                flyt[i] = flyt[nfly - 1];
                fly[i--] = fly[--nfly];
                progressed = finished = 1;
            }
        }
        pthread_mutex_lock(&c->mu);
        if (s) { /* the first error stays; the tasks in flight are dropped (the job is ending) */
            if (!c->async_status) {
                c->async_status = s;
                c->async_err = e;
            }
            for (int i = 0; i < nfly; i++) req_free(fly[i]);
            nfly = nlater = 0;
            c->n_inflight = 0;
        }
        if (finished || s || nt) c->busy = c->n_inflight + c->n_tasks;
        if (finished || s || !c->busy) pthread_cond_broadcast(&c->cv);
        if ((nfly || nlater) && !progressed) { /* nothing arrived: let the compute run */
            pthread_mutex_unlock(&c->mu);
            /* the peers post as their backward reaches the same block: back off to 1 ms, so the
             * polling costs the compute core little (a few hundred wakeups a second) */
            sleep_us(++idle > 64 ? 1000 : idle > 16 ? 100 : 10);
            pthread_mutex_lock(&c->mu);
        } else idle = 0;
    }
    pthread_mutex_unlock(&c->mu);
    free(fly);
    free(flyt);
    free(later);
    return NULL;
}

static st_status queue_task(st_comm *c, async_task t, uint64_t *ticket, st_err *err) {
    pthread_mutex_lock(&c->mu);
    st_status s = ST_OK;
    if (!c->started) {
        c->stop = 0;
        if (pthread_create(&c->thread, NULL, async_main, c)) s = st_errf(err, ST_ERR_NOMEM, "cannot start the "
                                                                         "communication thread");
        else c->started = 1;
    }
    if (!s && c->n_tasks == c->cap_tasks) {
        int cap = c->cap_tasks ? 2 * c->cap_tasks : 64;
        async_task *p = realloc(c->tasks, sizeof *p * (size_t)cap);
        if (!p) s = st_errf(err, ST_ERR_NOMEM, "out of memory");
        else {
            c->tasks = p;
            c->cap_tasks = cap;
        }
    }
    if (!s && t.kind != TASK_SMALL && c->size > 1) {
        /* a reduction's or gather's bytes count when queued, on the caller's thread: a step's
         * figures hold its own operations, wherever their completion falls */
        uint64_t in, out;
        ranged_bytes(c, t.bounds, t.lo, t.hi, t.kind == TASK_GATHER, &in, &out);
        c->sent += out;
        c->received += in;
    }
    if (!s) {
        t.ticket = ++c->next_ticket;
        t.queued_at = st_now();
        if (ticket) *ticket = t.ticket;
        c->tasks[c->n_tasks++] = t;
        c->busy++;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    return s;
}

st_status st_comm_async_reduce(st_comm *c, const float *in, size_t lo, size_t hi, const size_t *bounds, float *out,
                               int accumulate, st_err *err) {
    return queue_task(c, (async_task){.kind = TASK_REDUCE, .in = in, .lo = lo, .hi = hi, .bounds = bounds, .out = out,
                                      .accumulate = accumulate}, NULL, err);
}

st_status st_comm_async_gather(st_comm *c, float *x, size_t lo, size_t hi, const size_t *bounds, uint64_t *ticket,
                               st_err *err) {
    return queue_task(c, (async_task){.kind = TASK_GATHER, .x = x, .lo = lo, .hi = hi, .bounds = bounds}, ticket, err);
}

/* Is a task with ticket t (upto: any ticket <= t) still queued or in flight? Under c->mu. */
static int pending(const st_comm *c, uint64_t t, int upto) {
    for (int i = 0; i < c->n_tasks; i++)
        if (upto ? c->tasks[i].ticket <= t : c->tasks[i].ticket == t) return 1;
    for (int i = 0; i < c->n_inflight; i++)
        if (upto ? c->inflight[i] <= t : c->inflight[i] == t) return 1;
    return 0;
}

static st_status wait_ticket(st_comm *c, uint64_t t, int upto, st_err *err) {
    pthread_mutex_lock(&c->mu);
    while (!c->async_status && pending(c, t, upto)) pthread_cond_wait(&c->cv, &c->mu);
    st_status s = c->async_status;
    if (s) *err = c->async_err; /* stays: the job is ending */
    pthread_mutex_unlock(&c->mu);
    return s;
}

st_status st_comm_async_wait_ticket(st_comm *c, uint64_t ticket, st_err *err) {
    return ticket ? wait_ticket(c, ticket, 1, err) : ST_OK;
}

st_status st_comm_async_wait(st_comm *c, const char *phase, st_err *err) {
    pthread_mutex_lock(&c->mu);
    while (c->busy && !c->async_status) pthread_cond_wait(&c->cv, &c->mu);
    st_status s = c->async_status;
    if (s) *err = c->async_err;
    c->async_status = ST_OK;
    pthread_mutex_unlock(&c->mu);
    (void)phase;
    return s;
}

/* Before an operation posted from the caller's thread: the communication thread idle. */
static st_status settle(st_comm *c, st_err *err) {
    if (!c->started || on_thread(c)) return ST_OK;
    pthread_mutex_lock(&c->mu);
    int busy = c->busy || c->async_status;
    pthread_mutex_unlock(&c->mu);
    return busy ? st_comm_async_wait(c, "settle", err) : ST_OK;
}

static void async_stop(st_comm *c) {
    if (!c->started) return;
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thread, NULL);
    c->started = 0;
}

st_status st_comm_reduce_scatter_f32(st_comm *c, const float *in, size_t lo, size_t hi, const size_t *bounds,
                                     float *out, int accumulate, const char *phase, st_err *err) {
    st_comm_req *q;
    st_status s = st_comm_ireduce_scatter_f32(c, in, lo, hi, bounds, out, accumulate, &q, err);
    return s ? st_err_prefix(err, "%s", phase) : st_comm_wait(c, q, phase, err);
}

st_status st_comm_allgather_f32(st_comm *c, float *x, size_t lo, size_t hi, const size_t *bounds, const char *phase,
                                st_err *err) {
    st_comm_req *q;
    st_status s = st_comm_iallgather_f32(c, x, lo, hi, bounds, &q, err);
    return s ? st_err_prefix(err, "%s", phase) : st_comm_wait(c, q, phase, err);
}

/* ------------------------------------------------------------------ small collectives
 * Point to point to and from every peer (not MPI's collectives), so that a wait that ends
 * at the timeout knows, and names, the ranks that sent nothing. Small data only. */

/* Post a small exchange (root < 0: every rank sends to every other, recv: size x bytes in
 * rank order; else root sends to the others); *out NULL when there is nothing to wait for. */
static st_status small_post(st_comm *c, const void *send, size_t bytes, void *recv, int root, const char *phase,
                            int own_tags, st_comm_req **out, st_err *err) {
    *out = NULL;
#ifdef STRATA_HAVE_MPI
    if (bytes > (size_t)1 << 30)
        return st_errf(err, ST_ERR_INVALID, "%s: %zu bytes a rank; at most 1 GiB", phase, bytes);
    int tag = own_tags ? 30001 + (int)(c->seq_small++ % 2000u) : next_tag(c);
    st_comm_req *q = req_new(REQ_SMALL, 2 * c->size);
    if (!q) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    int rc = MPI_SUCCESS;
    for (int r = 0; r < c->size && rc == MPI_SUCCESS; r++) {
        if (r == c->rank) continue;
        if (root < 0 || root == c->rank) {
            rc = MPI_Isend(send, (int)bytes, MPI_BYTE, r, tag, c->comm, &q->r[q->n]);
            q->peer[q->n++] = r;
            q->bytes_out += bytes;
        }
        if (rc == MPI_SUCCESS && (root < 0 || r == root)) {
            void *dst = root < 0 ? (char *)recv + (size_t)r * bytes : recv;
            rc = MPI_Irecv(dst, (int)bytes, MPI_BYTE, r, tag, c->comm, &q->r[q->n]);
            q->peer[q->n++] = r;
            q->bytes_in += bytes;
        }
    }
    if (rc != MPI_SUCCESS) {
        req_free(q);
        return mpi_fail(c, rc, phase, -1, err);
    }
    *out = q;
#else
    (void)c, (void)send, (void)bytes, (void)recv, (void)root, (void)phase, (void)own_tags, (void)err;
#endif
    return ST_OK;
}

static st_status small_exchange(st_comm *c, const void *send, size_t bytes, void *recv, int root, const char *phase,
                                st_err *err) {
    if (c->started && !on_thread(c)) { /* the communication thread has (or may have) work: through it */
        uint64_t t;
        st_status s = queue_task(c, (async_task){.kind = TASK_SMALL, .send = send, .bytes = bytes, .recv = recv,
                                                 .root = root, .phase = phase}, &t, err);
        return s ? s : wait_ticket(c, t, 0, err);
    }
    st_comm_req *q;
    st_status s = small_post(c, send, bytes, recv, root, phase, 0, &q, err);
    return s ? s : st_comm_wait(c, q, phase, err);
}

st_status st_comm_barrier(st_comm *c, const char *phase, st_err *err) {
    if (c->boot) return st_comm_barrier(c->boot, phase, err);
    if (c->size == 1) return ST_OK;
    char one = 1, *all = malloc((size_t)c->size);
    if (!all) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    st_status s = small_exchange(c, &one, 1, all, -1, phase, err);
    free(all);
    return s;
}

st_status st_comm_bcast(st_comm *c, void *buf, size_t bytes, int root, const char *phase, st_err *err) {
    if (c->boot) return st_comm_bcast(c->boot, buf, bytes, root, phase, err);
    if (c->size == 1) return ST_OK;
    return small_exchange(c, buf, bytes, buf, root, phase, err);
}

st_status st_comm_allgather(st_comm *c, const void *mine, size_t bytes, void *all, const char *phase, st_err *err) {
    if (c->boot) return st_comm_allgather(c->boot, mine, bytes, all, phase, err);
    memcpy((char *)all + (size_t)c->rank * bytes, mine, bytes);
    if (c->size == 1) return ST_OK;
    return small_exchange(c, mine, bytes, all, -1, phase, err);
}

st_status st_comm_allreduce_f64(st_comm *c, double *x, int n, const char *phase, st_err *err) {
    if (c->size == 1 || n <= 0) return ST_OK;
    double *all = malloc(sizeof(double) * (size_t)n * (size_t)c->size);
    if (!all) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    st_status s = st_comm_allgather(c, x, sizeof(double) * (size_t)n, all, phase, err);
    if (!s)
        for (int i = 0; i < n; i++) {
            double t = all[i];
            for (int r = 1; r < c->size; r++) t += all[(size_t)r * n + i];
            x[i] = t;
        }
    free(all);
    return s;
}

/* ------------------------------------------------------------------ ZeRO's shards */

int st_zero_clip_segments(const st_optim_segment *segs, int n_segs, size_t lo, size_t hi, st_optim_segment *out) {
    int k = 0;
    for (int i = 0; i < n_segs; i++) {
        size_t a = segs[i].offset, e = a + segs[i].n;
        if (a < lo) a = lo;
        if (e > hi) e = hi;
        if (e > a) {
            out[k] = segs[i]; /* its weight decay and learning-rate class */
            out[k].offset = a - lo;
            out[k++].n = e - a;
        }
    }
    return k;
}

void st_zero_bounds(const st_optim_segment *segs, int n_segs, size_t n, int size, size_t *bounds) {
    bounds[0] = 0;
    bounds[size] = n;
    for (int r = 1; r < size; r++) {
        /* r n / size, moved to the nearest whole 8-bit block of the segment it falls in */
        size_t want = (size_t)((double)n * r / size), x = want;
        for (int i = 0; i < n_segs; i++) {
            size_t off = segs[i].offset, e = off + segs[i].n;
            if (want <= off || want >= e) continue;
            size_t k = (want - off + ST_OPTIM_Q8_BLOCK / 2) / ST_OPTIM_Q8_BLOCK;
            x = off + k * ST_OPTIM_Q8_BLOCK;
            if (x > e) x = e;
            break;
        }
        if (x < bounds[r - 1]) x = bounds[r - 1];
        bounds[r] = x;
    }
}
