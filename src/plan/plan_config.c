/* plan_config.c - the prediction of a run's configuration: the one function strata plan
 * prints and strata train logs and saves (RUN_DIR/plan.json), so the plan printed is the
 * plan run, predicted alike. With the training state in RAM it is st_plan_stream's; with
 * the state on disk (state_paths) it is st_plan_predict_disk's, from the paths' measured
 * bandwidth (a strata probe profile, or a short probe now). */
#include <json-c/json.h>
#include <stdio.h>
#include <string.h>

#include "strata/io.h"
#include "strata/plan.h"
#include "strata/store.h"
#include "strata/train.h"

_Static_assert(sizeof ((st_plan_config_disk *)0)->mixed_bytes_per_s / sizeof(double) >= ST_STORE_MAX_PATHS,
               "st_plan_config_disk holds a bandwidth for every path the store takes");

int st_plan_store_beside(const st_plan_profile *hw) {
    return hw->host_work_slowdown < ST_PLAN_STORE_BESIDE_BELOW;
}

st_status st_plan_predict_config(const st_train_config *c, const st_arch *a, const st_plan_profile *hw,
                                 const st_stream_plan *p, unsigned long long probe_bytes, st_plan_prediction *pred,
                                 st_plan_config_disk *cd, st_err *err) {
    memset(cd, 0, sizeof *cd);
    if (!c->state_paths[0]) return ST_OK; /* the state in RAM: the solver's prediction is the model's */
    cd->on_disk = 1;
    char buf[sizeof c->state_paths];
    const char *paths[ST_STORE_MAX_PATHS];
    double w[ST_STORE_MAX_PATHS];
    int n = 0, weighted = 0;
    /* with state_profile, w: each path's GB/s from it (the mixed pass, what a step does),
     * which are also the store's split of the state (st_train_state_paths, as train opens it) */
    st_status s = st_train_state_paths(c, buf, sizeof buf, paths, &n, w, &weighted, err);
    if (s) return s;
    cd->n_paths = n;
    if (weighted) {
        for (int i = 0; i < n; i++) cd->mixed_bytes_per_s[i] = w[i] * 1e9;
    } else if (probe_bytes == 0) {
        return st_errf(err, ST_ERR_INVALID, "the state paths' bandwidth is unknown: give state_profile FILE (strata "
                       "probe --path DIR ... -o FILE measures it)");
    } else {
        for (int i = 0; i < n; i++) {
            st_io_probe_result r;
            if ((s = st_io_probe(paths[i], probe_bytes, 0, 0, &r, err)))
                return st_err_prefix(err, "key 'state_paths': probing the path's bandwidth");
            cd->mixed_bytes_per_s[i] = r.mixed_gbps * 1e9;
        }
        cd->probed = 1;
    }
    if ((s = st_plan_crc_bytes_per_s(&cd->crc_bytes_per_s, err))) return s;
    cd->beside = st_plan_store_beside(hw);
    st_plan_disk dk = {.paths = paths, .n_paths = n, .mixed_bytes_per_s = cd->mixed_bytes_per_s,
                       .path_weight = weighted ? w : NULL,
                       .fmt = strcmp(c->optim_state, "8bit") ? ST_OPTIM_STATE_F32 : ST_OPTIM_STATE_8BIT,
                       .optim_ns_per_param = hw->optim_ns_per_param,
                       .host_budget = c->state_budget > 0 ? (unsigned long long)c->state_budget
                                                          : ST_TRAIN_STATE_BUDGET_DEFAULT,
                       .beside = cd->beside, .weight_decay = (float)c->weight_decay,
                       .crc_bytes_per_s = cd->crc_bytes_per_s, .cpu_slowdown = 1.0};
    st_plan_prediction solved = *pred, dp;
    if ((s = st_plan_predict_disk(a, c->batch, c->seq, hw, p, &dk, &dp, &cd->dc, err))) return s;
    dp.solve_s = solved.solve_s;
    dp.program_s = solved.program_s;
    dp.optimal = solved.optimal;
    dp.device_budget = solved.device_budget;
    *pred = dp;
    return ST_OK;
}

struct json_object *st_plan_config_disk_to_json(const st_plan_config_disk *cd) {
    json_object *o = json_object_new_object(), *bw = json_object_new_array();
    json_object_object_add(o, "io_s", json_object_new_double(cd->dc.io_s));
    json_object_object_add(o, "cpu_s", json_object_new_double(cd->dc.cpu_s));
    json_object_object_add(o, "store_s", json_object_new_double(cd->dc.store_s));
    json_object_object_add(o, "hidden_s", json_object_new_double(cd->dc.hidden_s));
    json_object_object_add(o, "beside", json_object_new_boolean(cd->beside));
    json_object_object_add(o, "probed", json_object_new_boolean(cd->probed));
    for (int i = 0; i < cd->n_paths; i++) json_object_array_add(bw, json_object_new_double(cd->mixed_bytes_per_s[i]));
    json_object_object_add(o, "mixed_bytes_per_s", bw);
    json_object_object_add(o, "crc_bytes_per_s", json_object_new_double(cd->crc_bytes_per_s));
    json_object_object_add(o, "read_bytes", json_object_new_int64((int64_t)cd->dc.read_bytes));
    json_object_object_add(o, "write_bytes", json_object_new_int64((int64_t)cd->dc.write_bytes));
    json_object_object_add(o, "host_bytes", json_object_new_int64((int64_t)cd->dc.host_bytes));
    return o;
}
