/* copy_engine.c - host <-> device copies on a worker thread, completed in order.
 *
 * The compute thread submits and goes on; it waits on a ticket only when it needs
 * the bytes. On the CPU backend a copy is a memcpy on another core; on CUDA the same
 * interface will sit on copy streams and events. */
#include <pthread.h>
#include <stdlib.h>

#include "strata/tier.h"

#define QCAP 256

typedef struct copy_req { void *dst; const void *src; size_t bytes; int d2h; } copy_req;

struct st_copy_engine {
    st_backend *dev;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    copy_req q[QCAP];
    uint64_t submitted, completed; /* tickets are 1-based submission counts */
    int stop;
    st_copy_stats stats;
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
    pthread_mutex_init(&ce->mu, NULL);
    pthread_cond_init(&ce->cv_work, NULL);
    pthread_cond_init(&ce->cv_done, NULL);
    if (pthread_create(&ce->thread, NULL, worker, ce) != 0) {
        free(ce);
        return st_errf(err, ST_ERR_NOMEM, "copy engine: cannot start its thread");
    }
    *out = ce;
    return ST_OK;
}

void st_copy_engine_destroy(st_copy_engine *ce) {
    if (!ce) return;
    pthread_mutex_lock(&ce->mu);
    ce->stop = 1;
    pthread_cond_broadcast(&ce->cv_work);
    pthread_mutex_unlock(&ce->mu);
    pthread_join(ce->thread, NULL);
    pthread_mutex_destroy(&ce->mu);
    pthread_cond_destroy(&ce->cv_work);
    pthread_cond_destroy(&ce->cv_done);
    free(ce);
}

static uint64_t submit(st_copy_engine *ce, void *dst, const void *src, size_t bytes, int d2h) {
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
    while (ce->completed < ticket) pthread_cond_wait(&ce->cv_done, &ce->mu);
    pthread_mutex_unlock(&ce->mu);
}

int st_copy_done(st_copy_engine *ce, uint64_t ticket) {
    pthread_mutex_lock(&ce->mu);
    int done = ce->completed >= ticket;
    pthread_mutex_unlock(&ce->mu);
    return done;
}

void st_copy_get_stats(st_copy_engine *ce, st_copy_stats *s) {
    pthread_mutex_lock(&ce->mu);
    *s = ce->stats;
    pthread_mutex_unlock(&ce->mu);
}
