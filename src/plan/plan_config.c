/* plan_config.c - the planner's pieces of a configuration's prediction that need no run: the
 * disk state store's host budget chosen by predicted step (st_plan_state_budget), the update's
 * time per parameter by state format, the figures' JSON and one-line descriptions. The run
 * layer (src/run/plan_state.c) puts them together for a run's configuration. */
#include <json-c/json.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include "strata/io.h"
#include "strata/model.h"
#include "strata/optim.h"
#include "strata/plan.h"
#include "strata/prof.h"
#include "strata/store.h"

_Static_assert(sizeof ((st_plan_config_disk *)0)->mixed_bytes_per_s / sizeof(double) >= ST_STORE_MAX_PATHS,
               "st_plan_config_disk holds a bandwidth for every path the store takes");

int st_plan_store_beside(const st_plan_profile *hw) {
    return hw->host_work_slowdown < ST_PLAN_STORE_BESIDE_BELOW;
}

/* Candidate budget b predicted: the cost and its summary in k. */
static st_status budget_predict(const st_arch *a, int B, int T, const st_plan_profile *hw, const st_stream_plan *p,
                                const st_plan_disk *disk, unsigned long long b, st_plan_prediction *pred,
                                st_plan_disk_cost *dc, st_plan_state_budget_cand *k, st_err *err) {
    st_plan_disk d = *disk;
    d.host_budget = b;
    st_status s = st_plan_predict_disk(a, B, T, hw, p, &d, pred, dc, err);
    if (s) return s;
    memset(k, 0, sizeof *k);
    k->budget = b;
    k->step_s = pred->step_s;
    k->hits = dc->cache_hits;
    k->n_subgroups = dc->n_subgroups;
    k->read_bytes = dc->read_bytes;
    k->store_host_bytes = dc->store_host_bytes;
    return ST_OK;
}

st_status st_plan_state_budget(const st_arch *a, int B, int T, const st_plan_profile *hw, const st_stream_plan *p,
                               const st_plan_disk *disk, double host_cap, st_plan_prediction *pred,
                               st_plan_config_disk *cd, st_err *err) {
    st_plan_prediction pr;
    st_plan_disk_cost dc;
    st_plan_state_budget_cand *k = cd->budgets;
    cd->n_budgets = 0;
    cd->host_cap = host_cap;
    /* the default always (a smaller host leaves it to the memory check), doubled while it fits */
    unsigned long long b = ST_STORE_HOST_BUDGET_DEFAULT;
    st_status s = budget_predict(a, B, T, hw, p, disk, b, &pr, &dc, &k[cd->n_budgets++], err);
    if (s) return s;
    int whole_known = dc.cache_hits == dc.n_subgroups;
    /* the budget that caches every subgroup: the buffers of a layout's every region, again for
     * the layout that budget makes (its region size follows the budget), a few times */
    unsigned long long whole = 0;
    unsigned long long try_b = dc.write_bytes > b ? dc.write_bytes : (unsigned long long)dc.n_subgroups * dc.region_bytes;
    for (int it = 0; it < 6 && !whole_known && (double)try_b <= host_cap; it++) {
        st_plan_state_budget_cand t;
        st_err e = {0};
        if (budget_predict(a, B, T, hw, p, disk, try_b, &pr, &dc, &t, &e)) break; /* too few buffers: not a candidate */
        if (t.hits == t.n_subgroups) {
            whole = try_b;
            break;
        }
        unsigned long long next = (unsigned long long)t.n_subgroups * dc.region_bytes;
        try_b = next > try_b ? next : try_b + dc.region_bytes;
    }
    /* the doubled budgets below the whole state's, then that one */
    for (b *= 2; !whole_known && (double)b <= host_cap && cd->n_budgets < ST_PLAN_STATE_BUDGETS - 1; b *= 2) {
        if (whole && whole <= b) break;
        if ((s = budget_predict(a, B, T, hw, p, disk, b, &pr, &dc, &k[cd->n_budgets++], err))) return s;
        whole_known = dc.cache_hits == dc.n_subgroups;
    }
    if (whole && !whole_known) {
        if ((s = budget_predict(a, B, T, hw, p, disk, whole, &pr, &dc, &k[cd->n_budgets], err))) return s;
        k[cd->n_budgets++].whole = 1;
    }
    int pick = 0;
    for (int i = 1; i < cd->n_budgets; i++)
        if (k[i].step_s < k[pick].step_s * (1 - ST_PLAN_STATE_BUDGET_TIE)) pick = i;
    cd->budget_pick = pick;
    cd->budget_chosen = 1;
    int was_whole = k[pick].whole;
    if ((s = budget_predict(a, B, T, hw, p, disk, k[pick].budget, pred, &cd->dc, &k[pick], err))) return s;
    k[pick].whole = was_whole;
    return ST_OK;
}

void st_plan_state_budget_describe(const st_plan_config_disk *cd, int i, char *buf, size_t cap) {
    const st_plan_state_budget_cand *k = &cd->budgets[i];
    snprintf(buf, cap, "state_budget %llu%s: predicted step %.6f s, %g of %d subgroups cached, %llu bytes read a step%s",
             k->budget, k->whole ? " (the whole state cached)" : i == 0 ? " (the default)" : "", k->step_s, k->hits,
             k->n_subgroups, k->read_bytes, i == cd->budget_pick ? ": chosen" : "");
}

struct json_object *st_plan_config_disk_to_json(const st_plan_config_disk *cd) {
    json_object *o = json_object_new_object(), *bw = json_object_new_array();
    json_object_object_add(o, "io_s", json_object_new_double(cd->dc.io_s));
    json_object_object_add(o, "cpu_s", json_object_new_double(cd->dc.cpu_s));
    json_object_object_add(o, "store_s", json_object_new_double(cd->dc.store_s));
    json_object_object_add(o, "hidden_s", json_object_new_double(cd->dc.hidden_s));
    json_object_object_add(o, "beside", json_object_new_boolean(cd->beside));
    json_object_object_add(o, "probed", json_object_new_boolean(cd->probed));
    json_object_object_add(o, "reused", json_object_new_boolean(cd->reused));
    json_object_object_add(o, "state_paths", json_object_new_string(cd->state_paths));
    for (int i = 0; i < cd->n_paths; i++) json_object_array_add(bw, json_object_new_double(cd->mixed_bytes_per_s[i]));
    json_object_object_add(o, "mixed_bytes_per_s", bw);
    json_object_object_add(o, "crc_bytes_per_s", json_object_new_double(cd->crc_bytes_per_s));
    json_object_object_add(o, "read_bytes", json_object_new_int64((int64_t)cd->dc.read_bytes));
    json_object_object_add(o, "write_bytes", json_object_new_int64((int64_t)cd->dc.write_bytes));
    json_object_object_add(o, "host_bytes", json_object_new_int64((int64_t)cd->dc.host_bytes));
    json_object_object_add(o, "state_budget", json_object_new_int64((int64_t)cd->dc.state_budget));
    json_object_object_add(o, "state_budget_chosen", json_object_new_boolean(cd->budget_chosen));
    json_object_object_add(o, "cache_hits", json_object_new_double(cd->dc.cache_hits));
    json_object_object_add(o, "n_subgroups", json_object_new_int(cd->dc.n_subgroups));
    return o;
}

/* ------------------------------------------------------------------ the update per format */

#define OPT_RATIO_N (1u << 20) /* parameters of each timed update: 4 MiB a vector, every core */

static double time_update(st_optim *o, float *p, const float *g, long step) {
    st_adamw_params hp = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = step, .grad_scale = 1};
    double t = st_now();
    st_optim_step(o, p, g, &hp);
    return st_now() - t;
}

/* The best of OPT_RATIO_REPS updates in each format, the two taken in turns (after one each
 * to warm the pages and threads), so that a busy machine slows both alike. */
#define OPT_RATIO_REPS 7
static st_status best_updates_s(float *p, const float *g, st_optim_state_format fmt, double *t32, double *t8,
                                st_err *err) {
    st_optim_segment seg = {.offset = 0, .n = OPT_RATIO_N, .weight_decay = 0.1f};
    st_optim *o[2] = {NULL, NULL};
    st_status s = st_optim_create(&o[0], &seg, 1, ST_OPTIM_STATE_F32, err);
    if (!s) s = st_optim_create(&o[1], &seg, 1, fmt, err);
    double best[2] = {1e30, 1e30};
    for (long k = 0; !s && k <= OPT_RATIO_REPS; k++)
        for (int f = 0; f < 2; f++) {
            double t = time_update(o[f], p, g, k + 1);
            if (k > 0 && t < best[f]) best[f] = t;
        }
    st_optim_free(o[0]);
    st_optim_free(o[1]);
    *t32 = best[0];
    *t8 = best[1];
    return s;
}

st_status st_plan_optim_ns_per_param(const st_plan_profile *hw, int fmt, double *ns, st_err *err) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static double ratios[3]; /* each 8-bit format's update time over fp32's, once per process */
    *ns = hw->optim_ns_per_param;
    if (fmt == ST_OPTIM_STATE_F32) return ST_OK;
    if (fmt != ST_OPTIM_STATE_8BIT && fmt != ST_OPTIM_STATE_8BIT_FP)
        return st_errf(err, ST_ERR_INVALID, "plan: unknown state format %d", fmt);
    st_status s = ST_OK;
    pthread_mutex_lock(&mu);
    double *ratio = &ratios[fmt];
    if (!(*ratio > 0)) {
        float *p = st_alloc((size_t)OPT_RATIO_N * sizeof(float)), *g = st_alloc((size_t)OPT_RATIO_N * sizeof(float));
        double t32 = 0, t8 = 0;
        if (!p || !g) s = st_errf(err, ST_ERR_NOMEM, "plan: timing the 8-bit update needs %u host bytes", 8u * OPT_RATIO_N);
        for (size_t i = 0; !s && i < OPT_RATIO_N; i++) p[i] = 0.01f, g[i] = 1e-3f * (float)(i % 7 + 1);
        if (!s) s = best_updates_s(p, g, (st_optim_state_format)fmt, &t32, &t8, err);
        if (!s && t32 > 0 && t8 > 0) *ratio = t8 / t32;
        else if (!s) s = st_errf(err, ST_ERR_INVALID, "plan: the timed updates took no time (fp32 %g s, 8-bit %g s)", t32, t8);
        st_free(p);
        st_free(g);
    }
    if (!s) *ns = hw->optim_ns_per_param * *ratio;
    pthread_mutex_unlock(&mu);
    return s;
}

/* ------------------------------------------------------------------ plan_state auto */
