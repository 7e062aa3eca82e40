/* stream_optim.c - the streaming executor's optimizer worker: a host thread that takes one
 * job per block as its gradient lands (a copy ticket), adds a later micro-batch's gradient
 * onto the accumulated one, sums the gradient norm's chunk partials in the engine's order,
 * and, when the step speculates, backs a block up and updates it with clip scale 1 (the
 * step thread restores the backups when the step turns out clipped or non-finite).
 */
#include <omp.h>
#include <pthread.h>
#include <string.h>

#include "exec/stream_internal.h"
#include "optim/adamw_kernels.h" /* SUMSQ_CHUNK: partial norms in the engine's own order */

/* ------------------------------------------------------------------ optimizer worker */

/* Sum-of-squares partials of every 65536-element chunk of [lo, hi) not yet taken. */
void stream_take_chunks(st_stream_exec *x, size_t lo, size_t hi) {
    for (size_t c = lo / SUMSQ_CHUNK; c < x->nchunks; c++) {
        size_t a = c * SUMSQ_CHUNK, b = a + SUMSQ_CHUNK < x->n_params ? a + SUMSQ_CHUNK : x->n_params;
        if (a < lo || b > hi || x->chunk_done[c]) continue;
        if (!x->bf16) {
            x->chunk_part[c] = st_optim_grad_sumsq(x->host_grads + a, ST_F32, b - a);
        } else {
            /* blocks are bf16, the embedding and ln_f fp32: split the chunk where they meet */
            size_t e = x->block_offset0 + (size_t)x->n_blocks * x->block_numel;
            double part = 0;
            for (size_t u = a; u < b;) {
                int blk = u >= x->block_offset0 && u < e;
                size_t w = blk ? (b < e ? b : e) : (u < x->block_offset0 ? (b < x->block_offset0 ? b : x->block_offset0) : b);
                part += blk ? st_optim_grad_sumsq(x->host_grads_bf16 + u, ST_BF16, w - u)
                            : st_optim_grad_sumsq(x->host_grads + u, ST_F32, w - u);
                u = w;
            }
            x->chunk_part[c] = part;
        }
        x->chunk_done[c] = 1;
    }
}

double stream_chunks_total(const st_stream_exec *x) {
    double total = 0; /* in chunk order, as st_optim_grad_sumsq adds its partials */
    for (size_t c = 0; c < x->nchunks; c++) total += x->chunk_part[c];
    return total;
}

static void backup_range(st_stream_exec *x, size_t lo, size_t hi) {
    size_t b;
    float *m = st_optim_state_buffer(x->opt, 0, &b), *v = st_optim_state_buffer(x->opt, 1, &b);
    size_t o = lo - x->block_offset0; /* backups hold [b0, post_off) */
    memcpy(x->backup_params + o, x->host_params + lo, (hi - lo) * sizeof(float));
    memcpy(x->backup_m + o, m + lo, (hi - lo) * sizeof(float));
    memcpy(x->backup_v + o, v + lo, (hi - lo) * sizeof(float));
}

/* On the step thread after backward, when the device is idle: every core copies. */
void stream_restore_range(st_stream_exec *x, size_t lo, size_t hi) {
    size_t b;
    float *m = st_optim_state_buffer(x->opt, 0, &b), *v = st_optim_state_buffer(x->opt, 1, &b);
    const size_t piece = 1u << 18;
    long np = (long)((hi - lo + piece - 1) / piece);
    x->w16_valid = 0; /* the weights' bf16 copy holds the update: rounded again when next read */
#pragma omp parallel for schedule(static)
    for (long i = 0; i < np; i++) {
        size_t a = lo + (size_t)i * piece, e = a + piece < hi ? a + piece : hi;
        memcpy(x->host_params + a, x->backup_params + (a - x->block_offset0), (e - a) * sizeof(float));
        memcpy(m + a, x->backup_m + (a - x->block_offset0), (e - a) * sizeof(float));
        memcpy(v + a, x->backup_v + (a - x->block_offset0), (e - a) * sizeof(float));
    }
}

static st_status update_range(st_stream_exec *x, int s0, int s1, const st_adamw_params *hp, double sumsq, int blocks,
                              st_err *err) {
    int b16 = blocks && x->bf16;
    st_optim_step_args a = {.params = x->host_params, .grads = b16 ? (const void *)x->host_grads_bf16 : (const void *)x->host_grads,
                         .grad_dtype = b16 ? ST_BF16 : ST_F32, .seg_begin = s0, .seg_end = s1, .grad_sumsq = sumsq,
                         /* the weights' bf16 copy written in the same pass (stream_w16.c) */
                         .work = x->w16_on ? x->w16 : NULL, .work_dtype = ST_BF16};
    return st_optim_step_ex(x->opt, &a, hp, err);
}

/* Segments [s0, s1): the embedding's tensors, the blocks' (whose gradients are bf16 when
 * the plan drains bf16), the norm's and an untied head's. */
st_status stream_update_segs(st_stream_exec *x, int s0, int s1, const st_adamw_params *hp, double sumsq, st_err *err) {
    int nt = x->ly->n_tensors, cuts[4] = {0, x->ly->n_pre_tensors, nt - x->ly->n_post_tensors, nt};
    for (int i = 0; i < 3; i++) {
        int a = s0 > cuts[i] ? s0 : cuts[i], b = s1 < cuts[i + 1] ? s1 : cuts[i + 1];
        if (a >= b) continue;
        st_status st = update_range(x, a, b, hp, sumsq, i == 1, err);
        if (st) return st;
    }
    return ST_OK;
}

/* host_grads[lo, hi) += host_grads_micro[lo, hi): one micro-batch's gradient onto the sum of the earlier ones
 * (the one accumulation rule, strata/stream.h). */
void stream_add_range(st_stream_exec *x, size_t lo, size_t hi) {
    float *a = x->host_grads;
    const float *b = x->host_grads_micro;
    for (size_t i = lo; i < hi; i++) a[i] += b[i];
}

/* The parts of the vector that are not blocks: the embedding, the norm and an untied head. */
static void add_nonblock(st_stream_exec *x) {
    stream_add_range(x, 0, x->block_offset0);
    stream_add_range(x, x->post_offset, x->n_params);
}

static void run_job(st_stream_exec *x, const opt_job *j) {
    st_copy_wait(x->ce, j->ticket); /* the gradient has landed on the host */
    int l = j->block, pre = x->ly->n_pre_tensors, per = x->ly->tensors_per_block;
    st_prof_span s = st_prof_begin(ST_PROF_CAT_OPTIM, l >= 0 ? "optim block" : "optim embed+head", l);
    if (j->add) {
        if (l >= 0) stream_add_range(x, x->block_offset0 + (size_t)l * x->block_numel, x->block_offset0 + (size_t)(l + 1) * x->block_numel);
        else add_nonblock(x);
    }
    if (!j->final || (x->dist_mode && l < 0)) {
        st_prof_end(&s);
        return;
    }
    if (x->dist_mode) { /* the ranks reduce it (st_stream_micro_grads; no hook: a micro-batch the
                         * ranks' step sums before it reduces, ZeRO 0 and 1 with grad_accum > 1) */
        if (x->grad_hook) x->grad_hook(x->grad_hook_ctx, x->block_offset0 + (size_t)l * x->block_numel, x->block_numel);
        st_prof_end(&s);
        return;
    }
    if (l >= 0) {
        size_t lo = x->block_offset0 + (size_t)l * x->block_numel;
        if (lo < x->landed_lo) x->landed_lo = lo;
        stream_take_chunks(x, x->landed_lo, x->post_offset); /* the norm lands last, with the embedding */
    } else {
        stream_take_chunks(x, 0, x->n_params);
    }
    if (x->speculate && l >= 0) {
        /* clip scale 1 and a finite sum (the real one is checked after the last block).
         * The embedding and ln_f (the last job) are not speculated: once they land the
         * whole norm is known, and the step thread updates them with every core. */
        size_t lo = x->block_offset0 + (size_t)l * x->block_numel;
        backup_range(x, lo, lo + x->block_numel);
        st_status st = stream_update_segs(x, pre + l * per, pre + (l + 1) * per, &x->job_hp, 0.0, &x->worker_err);
        if (st && !x->worker_status) x->worker_status = st;
    }
    st_prof_end(&s);
}

void *stream_opt_worker(void *arg) {
    st_stream_exec *x = arg;
    /* the step thread's compute keeps its own OpenMP team; this one is small on purpose */
    omp_set_num_threads(x->plan.optim_threads > 0 ? x->plan.optim_threads : 1);
    st_prof_thread_name("optimizer");

    pthread_mutex_lock(&x->mu);
    for (;;) {
        while (x->jobs_done == x->n_jobs && !x->stop) pthread_cond_wait(&x->cv_job, &x->mu);
        if (x->jobs_done == x->n_jobs && x->stop) break;
        opt_job j = x->jobs[x->jobs_done];
        pthread_mutex_unlock(&x->mu);
        run_job(x, &j);
        pthread_mutex_lock(&x->mu);
        if (j.final && !x->dist_mode) { /* what a disk-state update beside the backward waits for */
            size_t lo = x->block_offset0 + (size_t)(j.block >= 0 ? j.block : 0) * x->block_numel;
            if (j.block < 0) x->land_all = 1;
            else if (lo < x->land_lo) x->land_lo = lo;
        }
        x->jobs_done++;
        pthread_cond_broadcast(&x->cv_done);
    }
    pthread_mutex_unlock(&x->mu);
    return NULL;
}

void stream_push_job(st_stream_exec *x, int block, uint64_t ticket, int add, int final) {
    pthread_mutex_lock(&x->mu);
    x->jobs[x->n_jobs++] = (opt_job){block, ticket, (unsigned char)add, (unsigned char)final};
    pthread_cond_signal(&x->cv_job);
    pthread_mutex_unlock(&x->mu);
}

void stream_wait_jobs(st_stream_exec *x) {
    pthread_mutex_lock(&x->mu);
    while (x->jobs_done < x->n_jobs) pthread_cond_wait(&x->cv_done, &x->mu);
    pthread_mutex_unlock(&x->mu);
}
