/* step.c - one optimizer step, in memory or streamed (strata/step.h). */
#include <math.h>
#include <string.h>

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

st_status st_step_init_memory(st_step *s, st_model *m, optim *opt, st_store *store, int max_micro, st_err *err) {
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

void st_step_init_streamed(st_step *s, stream_exec *sx, int max_micro) {
    memset(s, 0, sizeof *s);
    s->sx = sx;
    s->max_micro = max_micro < 1 ? 1 : max_micro;
}

void st_step_free(st_step *s) {
    st_free(s->gacc);
    s->gacc = NULL;
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
    return ((st_model *)ctx)->grads + first;
}
static void *store_work_at(void *ctx, size_t first, size_t n) {
    (void)n;
    return ((st_model *)ctx)->params + first;
}

st_status st_step_run(st_step *s, int n_micro, int B, int T, const int32_t *inputs, const int32_t *targets,
                      const st_step_hp *hp, st_step_result *r, st_err *err) {
    memset(r, 0, sizeof *r);
    if (n_micro < 1 || n_micro > s->max_micro)
        return st_errf(err, ST_ERR_INVALID, "step: %d micro-batches; this step was set up for 1 to %d", n_micro,
                       s->max_micro);
    size_t N = (size_t)B * T;
    st_status st = ST_OK;
    if (s->sx) {
        stream_step_stats *ss = &r->stream;
        adamw_params a = hp->adam;
        if ((st = stream_step_accum(s->sx, n_micro, inputs, targets, &a, hp->grad_clip, ss, err))) return st;
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
        double t0 = st_now();
        st_model_zero_grad(m);
        float mean = m->ops->forward(m, in, tg, dloss);
        double t1 = st_now();
        m->ops->backward(m);
        double t2 = st_now();
        r->forward_s += t1 - t0;
        r->backward_s += t2 - t1;
        if (n_micro > 1) {
            prof_span pa = prof_begin(PROF_CAT_OPTIM, "accumulate", k);
            accumulate(s->gacc, m->grads, m->n_params, k == 0 ? 0 : k < n_micro - 1 ? 1 : 2);
            prof_end(&pa);
        }
        loss += st_step_micro_loss(mean, tg, N, n_micro, r->n_targets);
    }
    r->loss = loss;
    double t3 = st_now();
    prof_span pn = prof_begin(PROF_CAT_OPTIM, "grad norm", -1);
    double sumsq = optim_grad_sumsq_f32(m->grads, m->n_params);
    prof_end(&pn);
    r->grad_norm = sqrt(sumsq);
    r->skipped = !isfinite(r->grad_norm);
    if (r->skipped) {
        r->optimizer_s = st_now() - t3;
        return ST_OK;
    }
    adamw_params a = hp->adam;
    a.grad_scale = optim_clip_scale(sumsq, 1.0f, hp->grad_clip);
    r->clipped = a.grad_scale < 1.0f;
    prof_span po = prof_begin(PROF_CAT_OPTIM, s->store ? "optimizer (disk state)" : "optimizer", -1);
    if (s->store) { /* through the disk state, committed with the loop's state */
        st_store_step_args sa = {.grads = store_grads_at, .grad_dtype = ST_F32, .work = store_work_at,
                                 .work_dtype = ST_F32, .ctx = m, .grad_sumsq = sumsq, .blob = hp->blob,
                                 .blob_bytes = hp->blob_bytes};
        st = st_store_step(s->store, &sa, &a, err);
    } else {
        /* the sum of squares is already known: the engine need not read the gradients twice */
        optim_step_args oa = {.params = m->params, .grads = m->grads, .grad_dtype = ST_F32, .grad_sumsq = sumsq};
        st = optim_step_ex(s->opt, &oa, &a, err);
    }
    prof_end(&po);
    r->optimizer_s = st_now() - t3;
    return st;
}
