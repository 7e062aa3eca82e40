/* copy_engine.c - host <-> device copies, completed in order, on one of two paths.
 *
 * The compute thread submits and goes on; it waits on a ticket only when it needs the
 * bytes. Tickets are 1-based submission counts over both directions: waiting for ticket t
 * waits for every copy submitted up to t.
 *   - A backend whose copies are host work (no copy_async: the CPU backend) gets a worker
 *     thread that runs copy_to_device/_host in submission order: a memcpy on another core.
 *   - A backend with copy_async (CUDA: two copy streams ordered by events) needs no
 *     thread: submit queues the copy on the backend and keeps, per engine ticket, the
 *     backend's last ticket of each direction at that point (a ring of QCAP marks, the
 *     same bound as the worker's queue). Waiting for ticket t is copy_sync of its two
 *     backend tickets; st_copy_done is copy_query of them. */
#include <pthread.h>
#include <stdlib.h>

#include "strata/tier.h"

#define QCAP 256

typedef struct copy_req { void *dst; const void *src; size_t bytes; int d2h; } copy_req;

/* the asynchronous path's record of engine ticket t, at m[t % QCAP] */
typedef struct async_mark {
    uint64_t bt[2]; /* the backend's last h2d and d2h tickets once t was queued */
    size_t bytes;
    int d2h;
} async_mark;

/* a copy the observer thread waits for (asynchronous path, when the observer wants it) */
typedef struct obs_req { uint64_t bt; size_t bytes; int d2h; double t_submit; } obs_req;

struct st_copy_engine {
    st_backend *dev;
    int async; /* dev->ops->copy_async: no worker thread */
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    copy_req q[QCAP];     /* worker path */
    async_mark m[QCAP];   /* asynchronous path */
    uint64_t bt[2];       /* asynchronous path: the backend's last ticket per direction */
    double busy_t0;       /* asynchronous path: when the engine last had a copy outstanding from none */
    uint64_t submitted, completed; /* tickets are 1-based submission counts */
    int stop;
    st_copy_stats stats;
    /* the observer (st_copy_engine_observe): its own thread, started at its first copy */
    st_copy_observer obs;
    pthread_t obs_thread;
    int obs_started, obs_stop;
    pthread_cond_t cv_obs;
    obs_req oq[QCAP];
    uint64_t oq_head, oq_tail;
};

static void *worker(void *arg) {
    st_copy_engine *ce = arg;
    pthread_mutex_lock(&ce->mu);
    for (;;) {
        while (ce->completed == ce->submitted && !ce->stop) pthread_cond_wait(&ce->cv_work, &ce->mu);
        if (ce->completed == ce->submitted && ce->stop) break;
        copy_req r = ce->q[ce->completed % QCAP];
        pthread_mutex_unlock(&ce->mu);
        double t0 = st_now();
        if (r.d2h) ce->dev->ops->copy_to_host(ce->dev, r.dst, r.src, r.bytes);
        else ce->dev->ops->copy_to_device(ce->dev, r.dst, r.src, r.bytes);
        double dt = st_now() - t0;
        pthread_mutex_lock(&ce->mu);
        ce->stats.busy_s += dt;
        ce->stats.copies++;
        if (r.d2h) ce->stats.d2h_bytes += r.bytes;
        else ce->stats.h2d_bytes += r.bytes;
        ce->completed++;
        pthread_cond_broadcast(&ce->cv_done);
    }
    pthread_mutex_unlock(&ce->mu);
    return NULL;
}

st_status st_copy_engine_create(st_copy_engine **out, st_backend *dev, st_err *err) {
    *out = NULL;
    st_copy_engine *ce = calloc(1, sizeof *ce);
    if (!ce) return st_errf(err, ST_ERR_NOMEM, "copy engine: out of memory");
    ce->dev = dev;
    ce->async = dev->ops->copy_async && dev->ops->copy_sync && dev->ops->copy_query;
    pthread_mutex_init(&ce->mu, NULL);
    pthread_cond_init(&ce->cv_work, NULL);
    pthread_cond_init(&ce->cv_done, NULL);
    pthread_cond_init(&ce->cv_obs, NULL);
    if (!ce->async) {
        if (pthread_create(&ce->thread, NULL, worker, ce) != 0) {
            st_copy_engine_destroy(ce);
            return st_errf(err, ST_ERR_NOMEM, "copy engine: cannot start its thread");
        }
        ce->thread_started = 1;
    }
    *out = ce;
    return ST_OK;
}

/* ------------------------------------------------------------------ asynchronous path */

/* Under mu: tickets up to t (> completed, <= submitted) are complete; count them. */
static void advance(st_copy_engine *ce, uint64_t t) {
    if (t <= ce->completed) return;
    for (uint64_t k = ce->completed + 1; k <= t; k++) {
        const async_mark *mk = &ce->m[k % QCAP];
        ce->stats.copies++;
        if (mk->d2h) ce->stats.d2h_bytes += mk->bytes;
        else ce->stats.h2d_bytes += mk->bytes;
    }
    ce->completed = t;
    if (ce->completed == ce->submitted) ce->stats.busy_s += st_now() - ce->busy_t0;
    pthread_cond_broadcast(&ce->cv_done);
}

/* Block until ticket t is complete; called and returns with mu held. */
static void async_wait_locked(st_copy_engine *ce, uint64_t t) {
    if (t > ce->submitted) t = ce->submitted;
    while (ce->completed < t) {
        async_mark mk = ce->m[t % QCAP];
        pthread_mutex_unlock(&ce->mu);
        ce->dev->ops->copy_sync(ce->dev, 0, mk.bt[0]);
        ce->dev->ops->copy_sync(ce->dev, 1, mk.bt[1]);
        pthread_mutex_lock(&ce->mu);
        advance(ce, t);
    }
}

/* The observer's thread: waits for each wanted copy in submission order and reports it. */
static void *observer(void *arg) {
    st_copy_engine *ce = arg;
    pthread_mutex_lock(&ce->mu);
    for (;;) {
        while (ce->oq_head == ce->oq_tail && !ce->obs_stop) pthread_cond_wait(&ce->cv_obs, &ce->mu);
        if (ce->oq_head == ce->oq_tail) break;
        obs_req r = ce->oq[ce->oq_tail % QCAP];
        pthread_mutex_unlock(&ce->mu);
        ce->dev->ops->copy_sync(ce->dev, r.d2h, r.bt);
        ce->obs.done(ce->obs.ctx, r.d2h, r.bytes, r.t_submit, st_now());
        pthread_mutex_lock(&ce->mu);
        ce->oq_tail++;
    }
    pthread_mutex_unlock(&ce->mu);
    return NULL;
}

/* Under mu: hand a just-queued copy to the observer if it wants it (a full queue drops it:
 * the observer only traces). */
static void observe(st_copy_engine *ce, uint64_t bt, size_t bytes, int d2h, double t_submit) {
    if (!ce->obs.done || !bt || (ce->obs.want && !ce->obs.want()) || ce->oq_head - ce->oq_tail >= QCAP) return;
    if (!ce->obs_started) {
        if (pthread_create(&ce->obs_thread, NULL, observer, ce) != 0) return;
        ce->obs_started = 1;
    }
    ce->oq[ce->oq_head++ % QCAP] = (obs_req){bt, bytes, d2h, t_submit};
    pthread_cond_signal(&ce->cv_obs);
}

static uint64_t async_submit(st_copy_engine *ce, void *dst, const void *src, size_t bytes, int d2h) {
    pthread_mutex_lock(&ce->mu);
    while (ce->submitted - ce->completed >= QCAP) async_wait_locked(ce, ce->submitted - QCAP + 1); /* ring full */
    /* under mu, so that backend tickets and engine tickets are handed out in one order */
    double now = st_now();
    uint64_t bt = ce->dev->ops->copy_async(ce->dev, d2h, dst, src, bytes);
    if (bt) ce->bt[d2h] = bt; /* 0: refused, the backend keeps the error; nothing to wait for */
    if (ce->submitted == ce->completed) ce->busy_t0 = now;
    uint64_t ticket = ++ce->submitted;
    ce->m[ticket % QCAP] = (async_mark){{ce->bt[0], ce->bt[1]}, bytes, d2h};
    observe(ce, bt, bytes, d2h, now);
    pthread_mutex_unlock(&ce->mu);
    return ticket;
}

void st_copy_engine_observe(st_copy_engine *ce, const st_copy_observer *obs) {
    pthread_mutex_lock(&ce->mu);
    ce->obs = *obs;
    pthread_mutex_unlock(&ce->mu);
}

/* ------------------------------------------------------------------ both paths */

void st_copy_engine_destroy(st_copy_engine *ce) {
    if (!ce) return;
    pthread_mutex_lock(&ce->mu);
    if (ce->async) async_wait_locked(ce, ce->submitted);
    ce->stop = 1;
    ce->obs_stop = 1;
    pthread_cond_broadcast(&ce->cv_work);
    pthread_cond_broadcast(&ce->cv_obs);
    pthread_mutex_unlock(&ce->mu);
    if (ce->thread_started) pthread_join(ce->thread, NULL);
    if (ce->obs_started) pthread_join(ce->obs_thread, NULL);
    pthread_mutex_destroy(&ce->mu);
    pthread_cond_destroy(&ce->cv_work);
    pthread_cond_destroy(&ce->cv_done);
    pthread_cond_destroy(&ce->cv_obs);
    free(ce);
}

static uint64_t submit(st_copy_engine *ce, void *dst, const void *src, size_t bytes, int d2h) {
    if (ce->async) return async_submit(ce, dst, src, bytes, d2h);
    pthread_mutex_lock(&ce->mu);
    while (ce->submitted - ce->completed >= QCAP) pthread_cond_wait(&ce->cv_done, &ce->mu); /* queue full */
    ce->q[ce->submitted % QCAP] = (copy_req){dst, src, bytes, d2h};
    uint64_t ticket = ++ce->submitted;
    pthread_cond_signal(&ce->cv_work);
    pthread_mutex_unlock(&ce->mu);
    return ticket;
}

uint64_t st_copy_h2d(st_copy_engine *ce, void *dst, const void *src, size_t bytes) { return submit(ce, dst, src, bytes, 0); }
uint64_t st_copy_d2h(st_copy_engine *ce, void *dst, const void *src, size_t bytes) { return submit(ce, dst, src, bytes, 1); }

void st_copy_wait(st_copy_engine *ce, uint64_t ticket) {
    pthread_mutex_lock(&ce->mu);
    if (ce->async) async_wait_locked(ce, ticket);
    else
        while (ce->completed < ticket) pthread_cond_wait(&ce->cv_done, &ce->mu);
    pthread_mutex_unlock(&ce->mu);
}

int st_copy_done(st_copy_engine *ce, uint64_t ticket) {
    pthread_mutex_lock(&ce->mu);
    int done = ce->completed >= ticket;
    if (!done && ce->async) {
        if (ticket > ce->submitted) ticket = ce->submitted;
        async_mark mk = ce->m[ticket % QCAP];
        pthread_mutex_unlock(&ce->mu);
        done = ce->dev->ops->copy_query(ce->dev, 0, mk.bt[0]) && ce->dev->ops->copy_query(ce->dev, 1, mk.bt[1]);
        pthread_mutex_lock(&ce->mu);
        if (done) advance(ce, ticket);
    }
    pthread_mutex_unlock(&ce->mu);
    return done;
}

void st_copy_get_stats(st_copy_engine *ce, st_copy_stats *s) {
    pthread_mutex_lock(&ce->mu);
    *s = ce->stats;
    if (ce->async && ce->submitted > ce->completed) s->busy_s += st_now() - ce->busy_t0;
    pthread_mutex_unlock(&ce->mu);
}
