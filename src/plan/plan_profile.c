/* plan_profile.c - the machine figures the planner's cost model needs: measured on the
 * device backend (matmul, copies each way, a reference block and classifier chunk, and
 * the model's own block and classifier at its shape), the host (memcpy) and the
 * optimizer, and kept as a versioned JSON object {"strata_plan_profile": 2, ...}. */
#include <json-c/json.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/block.h"
#include "strata/model.h"
#include "strata/optim.h"
#include "strata/plan.h"

/* Small enough that a streamed strata train can measure at every start (tens of ms),
 * large enough to leave the caches: */
#define PROF_C 512        /* the matmul shape: (N, C) x (C, 4C), an MLP's first layer */
#define PROF_N 512
#define PROF_COPY (16u << 20) /* bytes per copy */
#define PROF_OPT_N (1u << 21) /* parameters of the optimizer run */
/* The reference block and classifier of st_plan_profile_measure: a GPT-2 block of width
 * 512 at batch 1 x seq 256 (a small model's real shape; about 0.2 s in all) */
#define PROF_REF_C 512
#define PROF_REF_NH 8
#define PROF_REF_T 256
#define PROF_SHAPE_REPS 3 /* timed runs after a warm-up: the median (the machine may be shared) */

static double median3(double *v) {
    double a = v[0], b = v[1], c = v[2];
    return a > b ? (b > c ? b : (a > c ? c : a)) : (a > c ? a : (b > c ? c : b));
}

/* A deterministic fill of small normal values through a host buffer (any backend). */
static void fill_dev(st_backend *be, float *d, size_t n, float scale, float *host, size_t host_n, st_rng *rng) {
    for (size_t off = 0; off < n; off += host_n) {
        size_t k = n - off < host_n ? n - off : host_n;
        for (size_t i = 0; i < k; i++) host[i] = scale * st_rng_normal(rng);
        be->ops->copy_to_device(be, d + off, host, k * 4);
    }
}

/* One block's forward and backward and a ST_PLAN_HEAD_ROWS classifier chunk (forward logits,
 * online-softmax statistics, dlogits, both backward products) of a at B x T, timed on
 * dev: medians of PROF_SHAPE_REPS runs after one warm-up. */
static st_status time_shape(st_backend *dev, const st_arch *a, int B, int T, double *fwd_s, double *bwd_s,
                            double *head_row_s, double *head_chunk_s, st_err *err) {
    const st_arch_layout *y = &a->lay;
    size_t N = (size_t)B * T, C = (size_t)y->n_embd, bn = y->block_numel, af = st_block_act_floats(a, B, T);
    int R = y->vocab_size < ST_PLAN_HEAD_ROWS ? y->vocab_size : ST_PLAN_HEAD_ROWS;
    st_blocks *b = NULL;
    st_status s = st_blocks_bind(&b, a, dev, B, T, err);
    if (s) return st_err_prefix(err, "plan: timing a block");
    enum { W, G, IN, OUT, ACTS, XN, DXN, HW, HG, LOGITS, RMAX, TLOGIT, RSUM, TGT, NBUF };
    size_t bytes[NBUF] = {bn * 4, bn * 4, N * C * 4, N * C * 4, af * 4, N * C * 4, N * C * 4, (size_t)R * C * 4,
                          (size_t)R * C * 4, N * (size_t)R * 4, N * 4, N * 4, N * 8, N * 4};
    void *buf[NBUF] = {0};
    size_t host_n = 1u << 16, total = 0;
    float *host = malloc(host_n * 4);
    int32_t *tgt = malloc(N * 4);
    for (int i = 0; i < NBUF; i++) {
        total += bytes[i];
        if (!(buf[i] = dev->ops->alloc(dev, bytes[i]))) s = ST_ERR_NOMEM;
    }
    if (s || !host || !tgt) {
        s = st_errf(err, ST_ERR_NOMEM, "plan: timing a block of %s at batch %d x seq %d needs %zu device bytes",
                    a->ops->name, B, T, total);
        goto done;
    }
    st_rng rng;
    st_rng_seed(&rng, 1);
    fill_dev(dev, buf[W], bn, 0.02f, host, host_n, &rng);
    fill_dev(dev, buf[IN], N * C, 1.0f, host, host_n, &rng);
    fill_dev(dev, buf[XN], N * C, 1.0f, host, host_n, &rng);
    fill_dev(dev, buf[HW], (size_t)R * C, 0.02f, host, host_n, &rng);
    for (size_t i = 0; i < N; i++) tgt[i] = (int32_t)(st_rng_u64(&rng) % (uint64_t)R);
    dev->ops->copy_to_device(dev, buf[TGT], tgt, N * 4);
    dev->ops->synchronize(dev);
    double tf[PROF_SHAPE_REPS], tb[PROF_SHAPE_REPS], th[PROF_SHAPE_REPS], tq[PROF_SHAPE_REPS];
    int R4 = R / 4 > 0 ? R / 4 : 1; /* the second chunk size: the line through both */
    for (int r = -1; r < PROF_SHAPE_REPS; r++) {
        double t0 = st_now();
        a->ops->block_forward(b, buf[W], buf[IN], buf[ACTS], buf[OUT]);
        dev->ops->synchronize(dev);
        double t1 = st_now();
        /* d(output): the forward's output itself, a dense gradient of the right scale */
        a->ops->block_backward(b, buf[W], buf[G], buf[IN], buf[ACTS], buf[OUT]);
        dev->ops->synchronize(dev);
        double t2 = st_now();
        double t3 = t2, t4 = t2;
        for (int q = 0; q < 2; q++) {
            int nr = q ? R4 : R;
            float *lo = buf[LOGITS];
            dev->ops->softmax_chunk_init(dev, buf[RMAX], buf[RSUM], buf[TLOGIT], (int)N);
            dev->ops->matmul_forward(dev, lo, buf[XN], buf[HW], NULL, (int)N, (int)C, nr, ST_W_OUT_IN);
            dev->ops->softmax_chunk_stats(dev, lo, buf[TGT], (int)N, nr, 0, buf[RMAX], buf[RSUM], buf[TLOGIT]);
            dev->ops->softmax_chunk_grad(dev, lo, buf[TGT], (int)N, nr, 0, buf[RMAX], buf[RSUM], 1.0f / (float)N);
            dev->ops->matmul_backward(dev, buf[DXN], buf[HG], NULL, lo, buf[XN], buf[HW], (int)N, (int)C, nr,
                                      ST_W_OUT_IN);
            dev->ops->synchronize(dev);
            t4 = st_now();
            if (!q) t3 = t4;
        }
        if (r >= 0) tf[r] = t1 - t0, tb[r] = t2 - t1, th[r] = t3 - t2, tq[r] = t4 - t3;
    }
    *fwd_s = median3(tf);
    *bwd_s = median3(tb);
    /* the line through (R, th) and (R4, tq); where the two do not give a rising line with a
     * non-negative start (noise, or R4 == R), all of it per row */
    double big = median3(th), small = median3(tq);
    double row = R > R4 ? (big - small) / (R - R4) : 0, chunk = big - row * R;
    if (!(row > 0) || !(chunk >= 0)) row = big / R, chunk = 0;
    *head_row_s = row;
    *head_chunk_s = chunk;
done:
    for (int i = 0; i < NBUF; i++)
        if (buf[i]) dev->ops->dealloc(dev, buf[i]);
    free(host);
    free(tgt);
    st_blocks_free(b);
    return s;
}

const st_plan_shape_time *st_plan_profile_shape(const st_plan_profile *hw, const st_arch *a, int B, int T) {
    for (int i = 0; i < hw->n_shapes && i < ST_PLAN_PROFILE_MAX_SHAPES; i++) {
        const st_plan_shape_time *e = &hw->shapes[i];
        if (!strcmp(e->arch, a->ops->name) && e->n_embd == a->lay.n_embd && e->block_numel == a->lay.block_numel &&
            e->B == B && e->T == T)
            return e;
    }
    return NULL;
}

st_status st_plan_profile_measure_shape(st_backend *dev, const st_arch *a, int B, int T, st_plan_profile *hw, st_err *err) {
    if (B < 1 || T < 1 || T > a->lay.max_seq)
        return st_errf(err, ST_ERR_INVALID, "plan: batch %d x seq %d (max_seq %d)", B, T, a->lay.max_seq);
    st_plan_shape_time e = {0};
    snprintf(e.arch, sizeof e.arch, "%s", a->ops->name);
    e.n_embd = a->lay.n_embd;
    e.block_numel = a->lay.block_numel;
    e.B = B;
    e.T = T;
    st_status s = time_shape(dev, a, B, T, &e.block_fwd_s, &e.block_bwd_s, &e.head_s_per_row, &e.head_s_per_chunk, err);
    if (s) return s;
    const st_plan_shape_time *old = st_plan_profile_shape(hw, a, B, T);
    int i = old ? (int)(old - hw->shapes) : hw->n_shapes;
    if (i >= ST_PLAN_PROFILE_MAX_SHAPES) { /* full: the oldest goes */
        memmove(hw->shapes, hw->shapes + 1, sizeof hw->shapes[0] * (ST_PLAN_PROFILE_MAX_SHAPES - 1));
        i = ST_PLAN_PROFILE_MAX_SHAPES - 1;
    }
    hw->shapes[i] = e;
    if (i >= hw->n_shapes) hw->n_shapes = i + 1;
    return ST_OK;
}

/* The reference block's and classifier's effective rates: their FLOPs (the arch's own
 * count) over their measured times. */
static st_status measure_reference(st_backend *dev, st_plan_profile *hw, st_err *err) {
    st_gpt2_config cfg = {.vocab_size = 50257, .max_seq = PROF_REF_T, .n_layer = 1, .n_head = PROF_REF_NH,
                       .n_embd = PROF_REF_C};
    st_arch *a = NULL;
    st_status s = st_arch_gpt2(&a, &cfg, err);
    if (s) return s;
    double f, b, h, hc, N = PROF_REF_T;
    s = time_shape(dev, a, 1, PROF_REF_T, &f, &b, &h, &hc, err);
    if (!s) {
        double blk = a->ops->block_flops_per_token(a, PROF_REF_T) * N;
        hw->block_fwd_flops = blk / 3.0 / f;
        hw->block_bwd_flops = blk * 2.0 / 3.0 / b;
        hw->head_flops = a->ops->head_flops_per_token(a) * N / (h * cfg.vocab_size + hc);
    }
    st_arch_free(a);
    return s;
}

static double best_of(int reps, double (*run)(void *), void *ctx) {
    double best = INFINITY;
    for (int i = 0; i < reps; i++) {
        double t = run(ctx);
        if (t < best) best = t;
    }
    return best;
}

typedef struct mm_ctx {
    st_backend *be;
    float *out, *in, *w;
    void *host, *dev;
    float *p, *g;
    st_optim *o;
    int dir;
    long step;
} mm_ctx;

static double run_mm(void *v) {
    mm_ctx *c = v;
    double t = st_now();
    c->be->ops->matmul_forward(c->be, c->out, c->in, c->w, NULL, PROF_N, PROF_C, 4 * PROF_C, ST_W_OUT_IN);
    c->be->ops->synchronize(c->be);
    return st_now() - t;
}

static double run_copy(void *v) {
    mm_ctx *c = v;
    double t = st_now();
    if (c->dir == 0) c->be->ops->copy_to_device(c->be, c->dev, c->host, PROF_COPY);
    else if (c->dir == 1) c->be->ops->copy_to_host(c->be, c->host, c->dev, PROF_COPY);
    else memcpy(c->dev, c->host, PROF_COPY);
    c->be->ops->synchronize(c->be);
    return st_now() - t;
}

static double run_opt(void *v) {
    mm_ctx *c = v;
    st_adamw_params hp = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = ++c->step, .grad_scale = 1};
    double t = st_now();
    st_optim_step(c->o, c->p, c->g, &hp);
    return st_now() - t;
}

/* host_work_slowdown: a few matmuls on the device timed alone and with a host thread
 * copying memory beside them (the optimizer's and the copy engine's kind of work); the
 * compute's delay per second of host work done (bytes copied / the memcpy rate). Pairs
 * alternate; the median pair. */
typedef struct hog_ctx {
    void *dst, *src;
    size_t bytes;
    atomic_int stop;
    long copies; /* read after the join */
} hog_ctx;

static void *hog_run(void *v) {
    hog_ctx *h = v;
    while (!atomic_load(&h->stop)) {
        memcpy(h->dst, h->src, h->bytes);
        h->copies++;
    }
    return NULL;
}

static double run_mm4(mm_ctx *c) {
    double t = 0;
    for (int i = 0; i < 4; i++) t += run_mm(c);
    return t;
}

static st_status measure_host_work(st_backend *dev, st_plan_profile *hw, st_err *err) {
    mm_ctx c = {.be = dev};
    size_t mm_floats = (size_t)PROF_N * 4 * PROF_C + (size_t)PROF_N * PROF_C + (size_t)4 * PROF_C * PROF_C;
    float *mm = dev->ops->alloc(dev, mm_floats * 4);
    size_t hb = 4u << 20; /* a copy the size of a weight slab's share, out of the caches */
    hog_ctx h = {.dst = st_alloc(hb), .src = st_alloc(hb), .bytes = hb};
    st_status s = ST_OK;
    if (!mm || !h.dst || !h.src) {
        s = st_errf(err, ST_ERR_NOMEM, "plan: the host-work probe needs %zu device and %zu host bytes", mm_floats * 4,
                    2 * hb);
        goto done;
    }
    memset(h.src, 3, hb);
    memset(h.dst, 0, hb);
    c.out = mm;
    c.in = mm + (size_t)PROF_N * 4 * PROF_C;
    c.w = c.in + (size_t)PROF_N * PROF_C;
    run_mm(&c);
    double k[PROF_SHAPE_REPS];
    for (int r = 0; r < PROF_SHAPE_REPS; r++) {
        double alone = run_mm4(&c);
        pthread_t th;
        atomic_store(&h.stop, 0);
        h.copies = 0;
        if (pthread_create(&th, NULL, hog_run, &h) != 0) {
            s = st_errf(err, ST_ERR_NOMEM, "plan: cannot start the host-work probe's thread");
            goto done;
        }
        double with = run_mm4(&c);
        atomic_store(&h.stop, 1);
        pthread_join(th, NULL);
        double work = (double)h.copies * (double)hb / hw->mem_bytes_per_s;
        double v = work > 0 ? (with - alone) / work : 0;
        k[r] = v < 0 ? 0 : v > 1 ? 1 : v;
    }
    hw->host_work_slowdown = median3(k);
done:
    if (mm) dev->ops->dealloc(dev, mm);
    st_free(h.dst);
    st_free(h.src);
    return s;
}

/* The host side of the timed copies: page-locked where the device gives it (host_alloc, the
 * CUDA backend), as the executor's copy buffers are (stream_plan.c), so that h2d and d2h are
 * the rates a streamed step sees and not the driver's staging of pageable memory. */
static void *copy_host_alloc(st_backend *dev, size_t bytes) {
    return dev->ops->host_alloc && dev->ops->host_free ? dev->ops->host_alloc(dev, bytes) : st_alloc(bytes);
}

static void copy_host_free(st_backend *dev, void *p) {
    if (!p) return;
    if (dev->ops->host_alloc && dev->ops->host_free) dev->ops->host_free(dev, p);
    else st_free(p);
}

st_status st_plan_profile_measure(st_backend *dev, st_plan_profile *hw, st_err *err) {
    memset(hw, 0, sizeof *hw);
    hw->version = ST_PLAN_PROFILE_VERSION;
    mm_ctx c = {.be = dev};
    size_t mm_floats = (size_t)PROF_N * 4 * PROF_C + (size_t)PROF_N * PROF_C + (size_t)4 * PROF_C * PROF_C;
    float *mm = dev->ops->alloc(dev, mm_floats * 4);
    if (!mm) return st_errf(err, ST_ERR_NOMEM, "plan: the profile's matmul needs %zu device bytes", mm_floats * 4);
    c.out = mm;
    c.in = mm + (size_t)PROF_N * 4 * PROF_C;
    c.w = c.in + (size_t)PROF_N * PROF_C;
    run_mm(&c); /* warm: threads, pages */
    double t = best_of(3, run_mm, &c);
    hw->sgemm_flops = 2.0 * PROF_N * PROF_C * 4.0 * PROF_C / t;
    dev->ops->dealloc(dev, mm);

    c.dev = dev->ops->alloc(dev, PROF_COPY);
    c.host = copy_host_alloc(dev, PROF_COPY);
    void *host2 = st_alloc(PROF_COPY);
    if (!c.dev || !c.host || !host2) {
        if (c.dev) dev->ops->dealloc(dev, c.dev);
        copy_host_free(dev, c.host);
        st_free(host2);
        return st_errf(err, ST_ERR_NOMEM, "plan: the profile's copies need %u device and %u host bytes", PROF_COPY,
                       2 * PROF_COPY);
    }
    memset(c.host, 1, PROF_COPY);
    memset(host2, 2, PROF_COPY);
    for (c.dir = 0; c.dir < 2; c.dir++) {
        run_copy(&c);
        double s = best_of(3, run_copy, &c);
        if (c.dir == 0) hw->h2d_bytes_per_s = PROF_COPY / s;
        else hw->d2h_bytes_per_s = PROF_COPY / s;
    }
    dev->ops->dealloc(dev, c.dev);
    c.dev = host2;
    c.dir = 2;
    run_copy(&c);
    hw->mem_bytes_per_s = PROF_COPY / best_of(3, run_copy, &c);
    copy_host_free(dev, c.host);
    st_free(host2);

    st_optim_segment seg = {.offset = 0, .n = PROF_OPT_N, .weight_decay = 0.1f};
    c.p = st_alloc((size_t)PROF_OPT_N * 4);
    c.g = st_alloc((size_t)PROF_OPT_N * 4);
    st_status s = ST_OK;
    if (!c.p || !c.g) s = st_errf(err, ST_ERR_NOMEM, "plan: the profile's optimizer run is out of host memory");
    else if (!(s = st_optim_create(&c.o, &seg, 1, ST_OPTIM_STATE_F32, err))) {
        for (size_t i = 0; i < PROF_OPT_N; i++) c.p[i] = 0.01f, c.g[i] = 1e-3f;
        run_opt(&c);
        hw->optim_ns_per_param = best_of(3, run_opt, &c) * 1e9 / PROF_OPT_N;
        st_optim_free(c.o);
    }
    st_free(c.p);
    st_free(c.g);
    if (!s) s = measure_reference(dev, hw, err);
    if (!s) s = measure_host_work(dev, hw, err);
    return s;
}

st_status st_plan_profile_save(const char *path, const st_plan_profile *hw, st_err *err) {
    FILE *f = fopen(path, "w");
    if (!f) return st_errf(err, ST_ERR_IO, "%s: cannot write the plan profile", path);
    fprintf(f,
            "{\"strata_plan_profile\": %d, \"sgemm_flops\": %.17g, \"h2d_bytes_per_s\": %.17g, "
            "\"d2h_bytes_per_s\": %.17g, \"mem_bytes_per_s\": %.17g, \"optim_ns_per_param\": %.17g,\n"
            " \"block_fwd_flops\": %.17g, \"block_bwd_flops\": %.17g, \"head_flops\": %.17g, "
            "\"host_work_slowdown\": %.17g,\n \"shapes\": [",
            hw->version, hw->sgemm_flops, hw->h2d_bytes_per_s, hw->d2h_bytes_per_s, hw->mem_bytes_per_s,
            hw->optim_ns_per_param, hw->block_fwd_flops, hw->block_bwd_flops, hw->head_flops,
            hw->host_work_slowdown);
    for (int i = 0; i < hw->n_shapes && i < ST_PLAN_PROFILE_MAX_SHAPES; i++) {
        const st_plan_shape_time *e = &hw->shapes[i];
        fprintf(f,
                "%s\n  {\"arch\": \"%s\", \"n_embd\": %d, \"block_numel\": %zu, \"batch\": %d, \"seq\": %d, "
                "\"block_fwd_s\": %.17g, \"block_bwd_s\": %.17g, \"head_s_per_row\": %.17g, \"head_s_per_chunk\": %.17g}",
                i ? "," : "", e->arch, e->n_embd, e->block_numel, e->B, e->T, e->block_fwd_s, e->block_bwd_s,
                e->head_s_per_row, e->head_s_per_chunk);
    }
    fprintf(f, "]}\n");
    if (fclose(f) != 0) return st_errf(err, ST_ERR_IO, "%s: writing the plan profile failed", path);
    return ST_OK;
}

static st_status field(json_object *o, const char *path, const char *key, double *out, st_err *err) {
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v))
        return st_errf(err, ST_ERR_FORMAT, "%s: plan profile has no \"%s\" (measure it again: strata plan "
                       "--save_profile %s)", path, key, path);
    double d = json_object_get_double(v);
    if ((!json_object_is_type(v, json_type_double) && !json_object_is_type(v, json_type_int)) || !isfinite(d) ||
        d < 0 || (d == 0 && strcmp(key, "optim_ns_per_param") && strcmp(key, "host_work_slowdown") &&
                  strcmp(key, "head_s_per_chunk")))
        return st_errf(err, ST_ERR_FORMAT, "%s: plan profile \"%s\" is %s; it must be a finite positive number", path,
                       key, json_object_to_json_string(v));
    *out = d;
    return ST_OK;
}

st_status st_plan_profile_load(const char *path, st_plan_profile *hw, st_err *err) {
    memset(hw, 0, sizeof *hw);
    json_object *root = json_object_from_file(path), *v, *o;
    if (!root) return st_errf(err, ST_ERR_FORMAT, "%s: not a readable JSON plan profile", path);
    /* a plan profile, or a strata probe profile holding one under "plan" */
    o = json_object_object_get_ex(root, "plan", &v) && json_object_is_type(v, json_type_object) ? v : root;
    st_status s = ST_OK;
    if (!json_object_object_get_ex(o, "strata_plan_profile", &v) || !json_object_is_type(v, json_type_int))
        s = st_errf(err, ST_ERR_FORMAT, "%s: no \"strata_plan_profile\" version; is it a plan profile?", path);
    else if ((hw->version = json_object_get_int(v)) != ST_PLAN_PROFILE_VERSION)
        s = st_errf(err, ST_ERR_FORMAT, "%s: plan profile version %d, this strata reads version %d (version 1 had "
                    "no measured block or classifier times); measure it again: strata plan --save_profile %s",
                    path, hw->version, ST_PLAN_PROFILE_VERSION, path);
    if (!s) s = field(o, path, "sgemm_flops", &hw->sgemm_flops, err);
    if (!s) s = field(o, path, "h2d_bytes_per_s", &hw->h2d_bytes_per_s, err);
    if (!s) s = field(o, path, "d2h_bytes_per_s", &hw->d2h_bytes_per_s, err);
    if (!s) s = field(o, path, "mem_bytes_per_s", &hw->mem_bytes_per_s, err);
    if (!s) s = field(o, path, "optim_ns_per_param", &hw->optim_ns_per_param, err);
    if (!s) s = field(o, path, "block_fwd_flops", &hw->block_fwd_flops, err);
    if (!s) s = field(o, path, "block_bwd_flops", &hw->block_bwd_flops, err);
    if (!s) s = field(o, path, "head_flops", &hw->head_flops, err);
    if (!s) s = field(o, path, "host_work_slowdown", &hw->host_work_slowdown, err);
    json_object *arr = NULL;
    if (!s && json_object_object_get_ex(o, "shapes", &arr)) {
        if (!json_object_is_type(arr, json_type_array))
            s = st_errf(err, ST_ERR_FORMAT, "%s: plan profile \"shapes\" is not an array", path);
        size_t n = s ? 0 : json_object_array_length(arr);
        for (size_t i = 0; i < n && !s; i++) {
            json_object *e = json_object_array_get_idx(arr, i), *x;
            char key[64];
            if (i >= ST_PLAN_PROFILE_MAX_SHAPES) break; /* the first ones are kept */
            st_plan_shape_time *t = &hw->shapes[i];
            double d[5];
            static const char *const nums[] = {"n_embd", "block_numel", "batch", "seq", "block_fwd_s"};
            snprintf(key, sizeof key, "shapes[%zu]", i);
            if (!json_object_is_type(e, json_type_object) || !json_object_object_get_ex(e, "arch", &x) ||
                !json_object_is_type(x, json_type_string)) {
                s = st_errf(err, ST_ERR_FORMAT, "%s: plan profile %s has no \"arch\" string", path, key);
                break;
            }
            snprintf(t->arch, sizeof t->arch, "%s", json_object_get_string(x));
            for (int k = 0; k < 5 && !s; k++) s = field(e, path, nums[k], &d[k], err);
            if (!s) s = field(e, path, "block_bwd_s", &t->block_bwd_s, err);
            if (!s) s = field(e, path, "head_s_per_row", &t->head_s_per_row, err);
            if (!s) s = field(e, path, "head_s_per_chunk", &t->head_s_per_chunk, err);
            if (s) {
                st_err_prefix(err, "%s", key);
                break;
            }
            t->n_embd = (int)d[0];
            t->block_numel = (size_t)d[1];
            t->B = (int)d[2];
            t->T = (int)d[3];
            t->block_fwd_s = d[4];
            hw->n_shapes = (int)i + 1;
        }
    }
    json_object_put(root);
    return s;
}

/* ------------------------------------------------------------------ the state store's CRC */

#define PROF_CRC_BYTES (64u << 20)
#define PROF_CRC_BLOCK (1u << 20) /* ST_STORE_CRC_BLOCK: one CRC per MiB, the blocks on every core */

static double run_crc(void *ctx) {
    const unsigned char *d = ctx;
    volatile uint32_t sink = 0;
    uint32_t acc = 0;
    double t0 = st_now();
#pragma omp parallel for schedule(static) reduction(^ : acc)
    for (int k = 0; k < (int)(PROF_CRC_BYTES / PROF_CRC_BLOCK); k++)
        acc ^= st_crc32c(0, d + (size_t)k * PROF_CRC_BLOCK, PROF_CRC_BLOCK);
    double t = st_now() - t0;
    sink = acc;
    (void)sink;
    return t;
}

st_status st_plan_crc_bytes_per_s(double *bytes_per_s, st_err *err) {
    unsigned char *d = st_alloc(PROF_CRC_BYTES);
    if (!d) return st_errf(err, ST_ERR_NOMEM, "plan: the CRC-32C timing needs %u host bytes", PROF_CRC_BYTES);
    for (size_t i = 0; i < PROF_CRC_BYTES; i++) d[i] = (unsigned char)(i * 131u + (i >> 12));
    run_crc(d); /* warm: pages, threads */
    *bytes_per_s = PROF_CRC_BYTES / best_of(3, run_crc, d);
    st_free(d);
    return ST_OK;
}

st_status st_plan_profile_cached(st_backend *be, const st_arch *arch, int B, int T, st_plan_profile *hw, st_err *err) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static st_plan_profile cached[2]; /* [0] the CPU, [1] a GPU: a run on one never plans from the other's figures */
    static int have[2];
    int k = strcmp(be->ops->name, "cpu") != 0;
    st_status s = ST_OK;
    pthread_mutex_lock(&mu);
    if (!have[k] && !(s = st_plan_profile_measure(be, &cached[k], err))) have[k] = 1;
    /* the model's own block and classifier timed at this batch and sequence (once per shape
     * per process): the prediction from the real ops at this shape, not reference rates */
    st_err serr = {0};
    if (have[k] && arch && !st_plan_profile_shape(&cached[k], arch, B, T) &&
        st_plan_profile_measure_shape(be, arch, B, T, &cached[k], &serr))
        st_log(2, "planner: the model's shape could not be timed on %s (%s); predicting from the reference rates\n",
               be->ops->name, serr.msg);
    if (have[k]) *hw = cached[k];
    pthread_mutex_unlock(&mu);
    return s;
}
