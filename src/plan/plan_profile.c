/* plan_profile.c - the machine figures the planner's cost model needs: measured on the
 * device backend (matmul, copies each way), the host (memcpy) and the optimizer, and kept
 * as a versioned JSON object {"strata_plan_profile": 1, ...}. */
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/optim.h"
#include "strata/plan.h"

/* Small enough that a streamed strata train can measure at every start (tens of ms),
 * large enough to leave the caches: */
#define PROF_C 512        /* the matmul shape: (N, C) x (C, 4C), an MLP's first layer */
#define PROF_N 512
#define PROF_COPY (16u << 20) /* bytes per copy */
#define PROF_OPT_N (1u << 21) /* parameters of the optimizer run */

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
    optim *o;
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
    adamw_params hp = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = ++c->step, .grad_scale = 1};
    double t = st_now();
    optim_step(c->o, c->p, c->g, &hp);
    return st_now() - t;
}

st_status plan_profile_measure(st_backend *dev, plan_profile *hw, st_err *err) {
    memset(hw, 0, sizeof *hw);
    hw->version = PLAN_PROFILE_VERSION;
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
    c.host = st_alloc(PROF_COPY);
    void *host2 = st_alloc(PROF_COPY);
    if (!c.dev || !c.host || !host2) {
        if (c.dev) dev->ops->dealloc(dev, c.dev);
        st_free(c.host);
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
    st_free(c.host);
    st_free(host2);

    optim_segment seg = {0, PROF_OPT_N, 0.1f};
    c.p = st_alloc((size_t)PROF_OPT_N * 4);
    c.g = st_alloc((size_t)PROF_OPT_N * 4);
    st_status s = ST_OK;
    if (!c.p || !c.g) s = st_errf(err, ST_ERR_NOMEM, "plan: the profile's optimizer run is out of host memory");
    else if (!(s = optim_create(&c.o, &seg, 1, OPTIM_STATE_F32, err))) {
        for (size_t i = 0; i < PROF_OPT_N; i++) c.p[i] = 0.01f, c.g[i] = 1e-3f;
        run_opt(&c);
        hw->optim_ns_per_param = best_of(3, run_opt, &c) * 1e9 / PROF_OPT_N;
        optim_free(c.o);
    }
    st_free(c.p);
    st_free(c.g);
    return s;
}

st_status plan_profile_save(const char *path, const plan_profile *hw, st_err *err) {
    FILE *f = fopen(path, "w");
    if (!f) return st_errf(err, ST_ERR_IO, "%s: cannot write the plan profile", path);
    fprintf(f,
            "{\"strata_plan_profile\": %d, \"sgemm_flops\": %.6g, \"h2d_bytes_per_s\": %.6g, "
            "\"d2h_bytes_per_s\": %.6g, \"mem_bytes_per_s\": %.6g, \"optim_ns_per_param\": %.6g}\n",
            hw->version, hw->sgemm_flops, hw->h2d_bytes_per_s, hw->d2h_bytes_per_s, hw->mem_bytes_per_s,
            hw->optim_ns_per_param);
    if (fclose(f) != 0) return st_errf(err, ST_ERR_IO, "%s: writing the plan profile failed", path);
    return ST_OK;
}

static st_status field(json_object *o, const char *path, const char *key, double *out, st_err *err) {
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v))
        return st_errf(err, ST_ERR_FORMAT, "%s: plan profile has no \"%s\" (measure it again: strata plan "
                       "--measure_profile %s)", path, key, path);
    double d = json_object_get_double(v);
    if ((!json_object_is_type(v, json_type_double) && !json_object_is_type(v, json_type_int)) || !isfinite(d) ||
        d < 0 || (d == 0 && strcmp(key, "optim_ns_per_param")))
        return st_errf(err, ST_ERR_FORMAT, "%s: plan profile \"%s\" is %s; it must be a finite positive number", path,
                       key, json_object_to_json_string(v));
    *out = d;
    return ST_OK;
}

st_status plan_profile_load(const char *path, plan_profile *hw, st_err *err) {
    memset(hw, 0, sizeof *hw);
    json_object *root = json_object_from_file(path), *v, *o;
    if (!root) return st_errf(err, ST_ERR_FORMAT, "%s: not a readable JSON plan profile", path);
    /* a plan profile, or a strata probe profile holding one under "plan" */
    o = json_object_object_get_ex(root, "plan", &v) && json_object_is_type(v, json_type_object) ? v : root;
    st_status s = ST_OK;
    if (!json_object_object_get_ex(o, "strata_plan_profile", &v) || !json_object_is_type(v, json_type_int))
        s = st_errf(err, ST_ERR_FORMAT, "%s: no \"strata_plan_profile\" version; is it a plan profile?", path);
    else if ((hw->version = json_object_get_int(v)) != PLAN_PROFILE_VERSION)
        s = st_errf(err, ST_ERR_FORMAT, "%s: plan profile version %d, this strata reads version %d", path, hw->version,
                    PLAN_PROFILE_VERSION);
    if (!s) s = field(o, path, "sgemm_flops", &hw->sgemm_flops, err);
    if (!s) s = field(o, path, "h2d_bytes_per_s", &hw->h2d_bytes_per_s, err);
    if (!s) s = field(o, path, "d2h_bytes_per_s", &hw->d2h_bytes_per_s, err);
    if (!s) s = field(o, path, "mem_bytes_per_s", &hw->mem_bytes_per_s, err);
    if (!s) s = field(o, path, "optim_ns_per_param", &hw->optim_ns_per_param, err);
    json_object_put(root);
    return s;
}
