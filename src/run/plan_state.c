/* plan_state.c - the plan a run's configuration gets: its prediction (the one strata plan
 * prints and strata train logs and saves as RUN_DIR/plan.json, so the plan printed is the plan
 * run, predicted alike: with the training state in RAM st_plan_stream's, on disk
 * st_plan_predict_disk's from the paths' measured bandwidth), and plan_state auto (the
 * optimizer state's format and tier chosen by the same predictions). It reads the run's
 * configuration and asks the planner (src/plan), which knows nothing of a run. */
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include "run/run_lora_internal.h"
#include "run/run_poetx_internal.h"
#include "strata/io.h"
#include "strata/model.h"
#include "strata/optim.h"
#include "strata/plan.h"
#include "strata/poetx.h" /* st_frozen_held_block_bytes */
#include "strata/prof.h"
#include "strata/store.h"
#include "strata/train.h"

/* The "disk" figures of plan file path when they are for state_paths, n of them (a previous
 * start's: strata train saves them in RUN_DIR/plan.json): 1 and bps filled, else 0. */
static int reuse_figures(const char *path, const char *state_paths, int n, double *bps) {
    json_object *root = path ? json_object_from_file(path) : NULL, *disk, *sp, *bw;
    int ok = root && json_object_object_get_ex(root, "disk", &disk) && json_object_is_type(disk, json_type_object) &&
             json_object_object_get_ex(disk, "state_paths", &sp) && json_object_is_type(sp, json_type_string) &&
             !strcmp(json_object_get_string(sp), state_paths) &&
             json_object_object_get_ex(disk, "mixed_bytes_per_s", &bw) && json_object_is_type(bw, json_type_array) &&
             (int)json_object_array_length(bw) == n;
    for (int i = 0; ok && i < n; i++) {
        json_object *v = json_object_array_get_idx(bw, (size_t)i);
        double x = json_object_is_type(v, json_type_double) || json_object_is_type(v, json_type_int)
                       ? json_object_get_double(v) : 0;
        ok = isfinite(x) && x > 0;
        bps[i] = x;
    }
    if (root) json_object_put(root);
    return ok;
}

/* *bytes: the host buffers the store of a method's n trained elements takes (st_store_plan:
 * its regions and buffers do not depend on the paths, which need not exist yet: laid out on
 * one, "/"); left as given where it cannot be laid out. */
static void method_store_buffers(const st_train_config *c, size_t n, double *bytes) {
    const char *root[1] = {"/"};
    uint64_t need[1], host = 0;
    st_optim_segment seg = {.offset = 0, .n = n, .weight_decay = (float)c->weight_decay};
    st_store_config sc = {.paths = root, .n_paths = 1, .segs = &seg, .n_segs = 1, .fmt = st_train_config_state_format(c),
                          .host_budget = c->state_budget > 0 ? (uint64_t)c->state_budget : ST_STORE_HOST_BUDGET_DEFAULT};
    st_err e = {0};
    if (n && !st_store_plan(&sc, need, &host, &e) && host > 0) *bytes = (double)host;
}

st_status st_train_mem_plan(const st_train_config *c, const st_stream_plan *plan, st_mem_plan *out, st_err *err) {
    int lora = 0;
    st_status ms = st_train_config_method(c, &lora, err); /* method and frozen_dtype, as strata train refuses them */
    if (ms) return ms;
    st_model_overrides ov = st_train_config_overrides(c);
    st_model_shape shape;
    st_arch *a = NULL;
    st_status s = st_model_resolve(c->model, c->init_from, &ov, c->batch, c->seq, &shape, &a, err);
    if (s) return s;
    int cuda_index = -1;
    if (c->device_budget > 0 && (s = st_backend_device_parse(c->device, &cuda_index, err))) {
        st_arch_free(a);
        return st_err_prefix(err, "key 'device'");
    }
    /* method lora or poetx (checked by st_train_config_method): the model's own forward, the
     * base's weights frozen (no gradient), only what the method trains with gradients and moments */
    st_train_method method = st_train_config_method_of(c);
    int own_forward = method != ST_TRAIN_METHOD_FULL;
    /* LoRA and POET-X under layer streaming run their base's blocks through the executor, whose
     * tables count the activations (the hook's own bytes besides: hook_bytes) */
    int exec_acts = (method == ST_TRAIN_METHOD_LORA || method == ST_TRAIN_METHOD_POETX) && c->device_budget > 0;
    size_t trainable = 0;
    run_poetx_bytes pb = {0}; /* LoRA: its frozen base as held only */
    if (method == ST_TRAIN_METHOD_LORA && !(s = run_lora_trainable(c, a, shape.arch, &trainable, err))) {
        pb.frozen = run_lora_frozen_bytes(c, a, shape.arch); /* 0 for fp32: 4 bytes a base parameter */
        pb.start = run_lora_start_bytes(c, a, shape.arch, trainable);
    }
    if (method == ST_TRAIN_METHOD_POETX && !(s = run_poetx_trainable(c, a, shape.arch, &trainable, err)))
        s = run_poetx_bytes_of(c, a, shape.arch, c->batch, c->seq, &pb, err);
    if (s) {
        st_arch_free(a);
        return s;
    }
    /* the disk state of what a method trains: the store's buffers are what its layout of that
     * vector takes (one region where the vector is small), not the whole state_budget */
    double state_buffers = c->state_budget;
    if (own_forward && c->state_paths[0]) method_store_buffers(c, trainable, &state_buffers);
    st_matmul_mode mm = ST_MATMUL_FP32; /* matmul auto is resolved before the run's account */
    st_backend_matmul_parse(c->matmul, &mm, NULL);
    st_mem_request rq = {.trainable_params = own_forward ? (double)trainable : 0,
                         .bf16_weights = mm == ST_MATMUL_BF16 && cuda_index < 0,.arch = a, .B = c->batch, .T = c->seq, .grad_accum = (int)c->grad_accum,
                         .state_format = st_train_config_state_format(c), .streamed = c->device_budget > 0,
                         .plan = plan, .device_is_host = cuda_index < 0, .state_on_disk = c->state_paths[0] != 0,
                         .state_budget = state_buffers, .model_act_bytes = own_forward && !exec_acts ? shape.act_bytes : 0,
                         /* POET-X: its kept h (poetx_recompute 0) and scratch are activations too */
                         .method_start = pb.start, .method_staging = pb.save_staging, .frozen_bytes = pb.frozen,
                         .method_disk = pb.disk,
                         .frozen_dtype = own_forward && st_train_config_frozen_dtype(c) > 0
                                             ? st_train_config_frozen_dtype(c) : 0};
    /* streamed, the hook's (the executor's tables with the embedding's and head's gradients) */
    if (own_forward && exec_acts && method == ST_TRAIN_METHOD_POETX) rq.hook_bytes = pb.kept_h + pb.scratch;
    else if (exec_acts && method == ST_TRAIN_METHOD_LORA) rq.frozen_hook_bytes = run_lora_hook_bytes(c, a, shape.arch);
    else if (own_forward) rq.model_act_bytes += pb.kept_h + pb.scratch;
    if (exec_acts && st_train_config_frozen_dtype(c) > 0) /* the weight slots carry the held weights */
        rq.held_block_bytes = st_frozen_held_block_bytes(a->lay.tensors, a->lay.n_tensors, a->ops->name,
                                                         (st_frozen_dtype)st_train_config_frozen_dtype(c));
    st_train_config_act_dtype(c, &rq.act_dtype, NULL); /* checked by st_train_config_resolve; else f32 */
    s = st_plan_memory(&rq, out, err);
    st_arch_free(a);
    return s;
}

st_status st_train_poetx_recompute_choose(st_train_config *c, char *why, size_t cap, st_err *err) {
    if (cap) why[0] = 0;
    if (st_train_config_method_of(c) != ST_TRAIN_METHOD_POETX || c->poetx_recompute >= 0) return ST_OK;
    c->poetx_recompute = 0; /* the account with the rotated inputs kept */
    st_mem_plan e;
    st_status s = st_train_mem_plan(c, NULL, &e, err);
    if (s) return s;
    double budgets[ST_MEM_TIER_COUNT] = {0, c->host_budget, 0}, kept = e.tier_need[ST_MEM_TIER_HOST];
    st_err fit = {0};
    if (st_mem_plan_check(&e, budgets, &fit) == ST_OK) {
        snprintf(why, cap, "poetx_recompute auto: 0, the rotated inputs kept for the backward (host memory %.1f MiB "
                 "with them fits %s)", kept / 1048576.0, c->host_budget > 0 ? "host_budget" : "MemAvailable");
        return ST_OK;
    }
    c->poetx_recompute = 1;
    if ((s = st_train_mem_plan(c, NULL, &e, err))) return s;
    snprintf(why, cap, "poetx_recompute auto: 1, the rotated inputs formed again in the backward (host memory %.1f "
             "MiB with them kept does not fit %s; %.1f MiB without: the same numbers, a slower step)",
             kept / 1048576.0, c->host_budget > 0 ? "host_budget" : "MemAvailable",
             e.tier_need[ST_MEM_TIER_HOST] / 1048576.0);
    return ST_OK;
}

/* The host bytes the store's buffers may take for c: host_budget less the rest of the run, the
 * larger of the memory plan's need without the buffers (what strata train checks, so a resume
 * with the budget chosen fits as this start did) and the executor's own for plan p
 * (st_plan_host_bytes_disk); without host_budget, half of what MemAvailable leaves after the
 * rest of the run: a cache is worth some speed, not the machine's last free bytes (the page
 * cache, the data pipeline, other processes). */
static st_status store_host_cap(const st_train_config *c, const st_arch *a, const st_stream_plan *p, double *cap,
                                st_err *err) {
    st_mem_plan e;
    st_status s = st_train_mem_plan(c, NULL, &e, err);
    if (s) return s;
    double rest = e.tier_need[ST_MEM_TIER_HOST] - e.state_buffers;
    double exec = (double)st_plan_host_bytes_disk(a, c->batch, c->seq, p);
    double host = c->host_budget > 0 ? c->host_budget : st_prof_host_available_bytes();
    *cap = host - (rest > exec ? rest : exec);
    if (!(c->host_budget > 0)) *cap /= 2;
    return ST_OK;
}

/* A method's (LoRA, POET-X) streamed step with the state on disk: the store holds what the method
 * trains, n elements, and the step updates it after the executor's backward (st_step_run), so
 * its time adds to the step unhidden: its reads and writes at each path's bandwidth, or its
 * update and CRC, whichever is longer (st_plan_predict_disk's rule), laid out as the run's store
 * at the key's state_budget (the vector is small: no budget is chosen). */
static st_status method_predict_disk(const st_train_config *c, const st_arch *a, const st_plan_profile *hw,
                                     const st_plan_disk *dk, st_plan_prediction *pred, st_plan_config_disk *cd,
                                     st_err *err) {
    size_t n = 0;
    st_status s = st_train_config_method_of(c) == ST_TRAIN_METHOD_LORA ? run_lora_trainable(c, a, a->ops->name, &n, err)
                                                                       : run_poetx_trainable(c, a, a->ops->name, &n, err);
    if (s) return s;
    st_optim_segment seg = {.offset = 0, .n = n, .weight_decay = dk->weight_decay};
    st_store_config sc = {.paths = dk->paths, .n_paths = dk->n_paths, .path_weight = dk->path_weight, .segs = &seg,
                          .n_segs = 1, .fmt = (st_optim_state_format)dk->fmt, .host_budget = dk->host_budget};
    st_store_layout lay;
    if ((s = st_store_plan_step(&sc, NULL, &lay, err))) return st_err_prefix(err, "key 'state_paths'");
    st_plan_disk_cost *k = &cd->dc;
    memset(k, 0, sizeof *k);
    for (int i = 0; i < dk->n_paths; i++) {
        uint64_t rd = (lay.read_bytes[0][i] + lay.read_bytes[1][i]) / 2; /* the cache's hits are not read */
        double t = (double)(rd + lay.write_bytes[i]) / dk->mixed_bytes_per_s[i];
        k->io_s = t > k->io_s ? t : k->io_s;
        k->disk_bytes += lay.path_bytes[i];
        k->read_bytes += rd;
        k->write_bytes += lay.write_bytes[i];
    }
    double mem = hw->mem_bytes_per_s > 0 ? hw->mem_bytes_per_s : 1e10;
    double crc = dk->crc_bytes_per_s > 0 ? dk->crc_bytes_per_s : mem;
    k->cpu_s = (double)n * dk->optim_ns_per_param * 1e-9 + ((double)k->read_bytes + (double)k->write_bytes) / crc +
               4.0 * (double)n / mem;
    k->store_s = k->io_s > k->cpu_s ? k->io_s : k->cpu_s;
    k->state_budget = dk->host_budget;
    k->n_subgroups = lay.n_subgroups;
    k->n_buffers = lay.n_buffers;
    k->cache_hits = (lay.hits[0] + lay.hits[1]) / 2.0;
    k->region_bytes = lay.region_bytes;
    k->store_host_bytes = lay.host_bytes;
    k->host_bytes = (size_t)lay.host_bytes; /* the executor's tables are the state in RAM's (the account's) */
    cd->beside = 0;
    pred->optim_exposed_s += k->store_s;
    pred->step_s += k->store_s;
    return ST_OK;
}

st_status st_train_plan_predict(const st_train_config *c, const st_arch *a, const st_plan_profile *hw,
                                 const st_stream_plan *p, unsigned long long probe_bytes, st_plan_prediction *pred,
                                 st_plan_config_disk *cd, st_err *err) {
    return st_train_plan_predict_ex(c, a, hw, p, probe_bytes, NULL, pred, cd, err);
}

st_status st_train_plan_predict_ex(const st_train_config *c, const st_arch *a, const st_plan_profile *hw,
                                    const st_stream_plan *p, unsigned long long probe_bytes, const char *reuse_plan,
                                    st_plan_prediction *pred, st_plan_config_disk *cd, st_err *err) {
    memset(cd, 0, sizeof *cd);
    if (!c->state_paths[0]) return ST_OK; /* the state in RAM: the solver's prediction is the model's */
    cd->on_disk = 1;
    snprintf(cd->state_paths, sizeof cd->state_paths, "%s", c->state_paths);
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
    } else if (reuse_figures(reuse_plan, c->state_paths, n, cd->mixed_bytes_per_s)) {
        cd->probed = cd->reused = 1;
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
    int fmt = st_train_config_state_format(c);
    double ns = 0;
    if ((s = st_plan_optim_ns_per_param(hw, fmt, &ns, err))) return s;
    st_plan_disk dk = {.paths = paths, .n_paths = n, .mixed_bytes_per_s = cd->mixed_bytes_per_s,
                       .path_weight = weighted ? w : NULL, .fmt = fmt, .optim_ns_per_param = ns,
                       .host_budget = c->state_budget > 0 ? (unsigned long long)c->state_budget
                                                          : ST_STORE_HOST_BUDGET_DEFAULT,
                       .beside = cd->beside, .weight_decay = (float)c->weight_decay,
                       .crc_bytes_per_s = cd->crc_bytes_per_s, .cpu_slowdown = 1.0};
    st_plan_prediction solved = *pred, dp;
    if (st_train_config_method_of(c) != ST_TRAIN_METHOD_FULL)
        return method_predict_disk(c, a, hw, &dk, pred, cd, err);
    if (!(c->state_budget > 0) && !st_train_config_plan_file(c)) { /* the store's cache: the planner's choice */
        double cap = 0;
        if (!(s = store_host_cap(c, a, p, &cap, err))) s = st_plan_state_budget(a, c->batch, c->seq, hw, p, &dk, cap, &dp, cd, err);
    } else {
        s = st_plan_predict_disk(a, c->batch, c->seq, hw, p, &dk, &dp, &cd->dc, err);
    }
    if (s) return s;
    dp.solve_s = solved.solve_s;
    dp.program_s = solved.program_s;
    dp.optimal = solved.optimal;
    dp.device_budget = solved.device_budget;
    *pred = dp;
    return ST_OK;
}

/* Free bytes on the filesystems of the comma-separated paths, each filesystem counted once
 * (0 where none can be read). */
static double paths_free_bytes(const char *list) {
    char buf[sizeof ((st_train_config *)0)->state_paths], *save = NULL;
    dev_t seen[ST_STORE_MAX_PATHS];
    int n_seen = 0;
    double sum = 0;
    snprintf(buf, sizeof buf, "%s", list);
    for (char *tok = strtok_r(buf, ",", &save); tok && n_seen < ST_STORE_MAX_PATHS; tok = strtok_r(NULL, ",", &save)) {
        struct stat st;
        struct statvfs vf;
        if (stat(tok, &st) || statvfs(tok, &vf)) continue;
        int dup = 0;
        for (int i = 0; i < n_seen; i++) dup |= seen[i] == st.st_dev;
        if (dup) continue;
        seen[n_seen++] = st.st_dev;
        sum += (double)vf.f_bavail * (double)vf.f_frsize;
    }
    return sum;
}

static const char *fmt_name(int fmt) { return st_optim_state_name((st_optim_state_format)fmt); }

static const char *tier_name(int on_disk) { return on_disk ? "on state_paths" : "in host memory"; }

/* c with candidate k's placement */
static void placed_config(const st_train_config *c, const st_plan_state_candidate *k, st_train_config *t) {
    *t = *c;
    snprintf(t->optim_state, sizeof t->optim_state, "%s", fmt_name(k->fmt));
    if (!k->on_disk) t->state_paths[0] = 0;
}

st_status st_train_state_fit(const st_train_config *c, st_plan_state_choice *ch, st_err *err) {
    memset(ch, 0, sizeof *ch);
    ch->chosen = -1;
    st_model_overrides ov = st_train_config_overrides(c);
    st_model_shape shape;
    st_status s = st_model_resolve(c->model, c->init_from, &ov, 0, 0, &shape, NULL, err);
    if (s) return s;
    char last[ST_ERR_MSG_MAX] = "";
    const int tiers = c->state_paths[0] ? 2 : 1;
    const double disk_free = tiers > 1 ? paths_free_bytes(c->state_paths) : 0;
    int timeable = 0;
    for (int tier = 0; tier < tiers; tier++)
        for (int f = 0; f < 2; f++) {
            st_plan_state_candidate *k = &ch->cand[ch->n++];
            k->fmt = f ? ST_OPTIM_STATE_8BIT : ST_OPTIM_STATE_F32;
            k->on_disk = tier;
            st_train_config t;
            placed_config(c, k, &t);
            st_mem_plan e;
            if ((s = st_train_mem_plan(&t, NULL, &e, err))) return s;
            double budgets[ST_MEM_TIER_COUNT] = {0, t.host_budget, 0};
            st_err fit = {0};
            int host_ok = st_mem_plan_check(&e, budgets, &fit) == ST_OK;
            /* the store's two regions (the committed step and the one being written) */
            k->disk_bytes = tier ? 2.0 * shape.n_params * st_store_bytes_per_param(k->fmt) : 0;
            k->disk_free = disk_free;
            k->host_bytes = e.tier_need[ST_MEM_TIER_HOST];
            int disk_ok = !tier || k->disk_bytes <= disk_free;
            k->fits = host_ok && disk_ok;
            if (!host_ok)
                snprintf(k->note, sizeof k->note, "%s %s needs %.0f host bytes", fmt_name(k->fmt), tier_name(tier),
                         k->host_bytes);
            else if (!disk_ok)
                snprintf(k->note, sizeof k->note, "%s on state_paths needs about %.0f disk bytes, %.0f free",
                         fmt_name(k->fmt), k->disk_bytes, disk_free);
            if (!k->fits)
                snprintf(last + strlen(last), sizeof last - strlen(last), "%s%s", last[0] ? "; " : "", k->note);
            else
                timeable += !tier || c->state_profile[0];
        }
    ch->needs_profile = timeable >= 2;
    for (int i = 0; i < ch->n; i++)
        if (ch->cand[i].fits) return ST_OK;
    return st_errf(err, ST_ERR_NOMEM, "key 'plan_state': auto found no placement of the optimizer state that fits the "
                   "host budget (host_budget %.0f; 0: MemAvailable)%s: %s. Lower batch or seq, raise host_budget%s",
                   c->host_budget, c->state_paths[0] ? " and the state_paths' free space" : "", last,
                   c->state_paths[0] ? ", or free disk space" : ", or give state_paths (directories on disk)");
}

/* Candidate k's predicted step for c (k->timed, k->step_s; else k->note says why not): the
 * plan strata plan and strata train would make and predict with that placement. */
static st_status predict_candidate(const st_train_config *c, const st_arch *a, const st_plan_profile *hw,
                                   st_plan_state_candidate *k, st_err *err) {
    if (k->on_disk && !c->state_profile[0]) {
        snprintf(k->note, sizeof k->note, "time unknown: no state_profile (strata plan probes no disk; strata probe "
                 "--path DIR -o FILE measures it)");
        return ST_OK;
    }
    st_train_config t;
    placed_config(c, k, &t);
    st_plan_profile h = *hw; /* in host memory: the update of this format in the program */
    st_status s = k->on_disk ? ST_OK : st_plan_optim_ns_per_param(hw, k->fmt, &h.optim_ns_per_param, err);
    if (s) return s;
    st_stream_plan *p = malloc(sizeof *p);
    if (!p) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    st_plan_prediction pred;
    st_err e = {0};
    int L = a->lay.n_blocks;
    if (c->device_budget > 0) { /* the program at the budget, as both commands run it */
        unsigned char fixed[ST_STREAM_MAX_LAYERS];
        int n_fixed = 0;
        st_plan_options po = {.mip_gap = -1, .allow_vocab_chunk = 1, .prefer_resident_head = st_train_config_plan_head(c)};
        s = st_train_config_act(c, L, fixed, &n_fixed, &e);
        if (!s && n_fixed) po.fixed_act = fixed;
        st_plan_request rq = {.arch = a, .B = c->batch, .T = c->seq, .budget = (size_t)c->device_budget,
                              .profile = &h, .solve = 1, .options = po}; /* the program, as both commands run it */
        st_plan_result *res = s ? NULL : malloc(sizeof *res);
        if (!s && !res) s = st_errf(&e, ST_ERR_NOMEM, "out of memory");
        if (!s && !(s = st_plan_for_run(&rq, res, &e))) {
            *p = res->plan;
            pred = res->pred;
        }
        free(res);
    } else { /* in memory: every block kept, the head resident */
        st_stream_plan_default(p, L);
        st_stream_plan_set_all(p, ST_STREAM_ACT_KEEP);
        s = st_plan_predict(a, c->batch, c->seq, &h, p, &pred, &e);
    }
    st_plan_config_disk cd;
    if (!s && k->on_disk) s = st_train_plan_predict(&t, a, hw, p, 0, &pred, &cd, &e);
    free(p);
    if (s == ST_ERR_NOMEM && !e.msg[0]) return st_errf(err, s, "out of memory");
    if (s) {
        snprintf(k->note, sizeof k->note, "time unknown: %.280s", e.msg);
        return ST_OK;
    }
    k->timed = 1;
    k->step_s = pred.step_s;
    return ST_OK;
}

/* A step in the printed units (%.4f s, ST_PLAN_STATE_TIE_S): two steps that print alike tie. */
static long long tie_units(double step_s) {
    char buf[64];
    snprintf(buf, sizeof buf, "%.4f", step_s);
    return llround(strtod(buf, NULL) / ST_PLAN_STATE_TIE_S);
}

st_status st_train_state_choose(st_train_config *c, const st_arch *a, const st_plan_profile *hw,
                               st_plan_state_choice *ch, char *why, size_t why_cap, st_err *err) {
    if (why && why_cap) why[0] = 0;
    int n_fit = 0, first = -1, best = -1, unknown_disk = 0;
    for (int i = 0; i < ch->n; i++)
        if (ch->cand[i].fits) {
            n_fit++;
            if (first < 0) first = i;
        }
    if (first < 0) return st_errf(err, ST_ERR_NOMEM, "key 'plan_state': no placement fits");
    const char *reason = "the only placement that fits";
    if (n_fit > 1 && ch->needs_profile && hw && a) {
        for (int i = 0; i < ch->n; i++) {
            st_plan_state_candidate *k = &ch->cand[i];
            if (!k->fits) continue;
            st_status s = predict_candidate(c, a, hw, k, err);
            if (s) return s;
            unknown_disk |= k->on_disk && !k->timed;
            if (k->timed && (best < 0 || tie_units(k->step_s) < tie_units(ch->cand[best].step_s))) best = i;
        }
        reason = "the fastest predicted of the placements that fit (a tie to the earlier of f32, 8bit in host memory, "
                 "then on state_paths)";
    } else if (n_fit > 1) {
        for (int i = 0; i < ch->n; i++) {
            st_plan_state_candidate *k = &ch->cand[i];
            if (k->fits && k->on_disk && !c->state_profile[0]) {
                unknown_disk = 1;
                snprintf(k->note, sizeof k->note, "time unknown: no state_profile (strata plan probes no disk; strata "
                         "probe --path DIR -o FILE measures it)");
            } else if (k->fits) {
                snprintf(k->note, sizeof k->note, "not predicted (%s)", ch->needs_profile ? "no machine profile"
                         : "one placement that fits can be timed");
            }
        }
        reason = ch->needs_profile ? "the first that fits (no machine profile to predict the step)"
                                   : "the first that fits";
    }
    if (best < 0 && n_fit > 1 && ch->cand[first].on_disk && unknown_disk)
        reason = c->state_profile[0] ? "the first that fits: only disk placements fit and their time is unknown"
                                     : "the first that fits: only disk placements fit and their time is unknown (no "
                                       "state_profile)";
    int pick = best >= 0 ? best : first;
    if (best >= 0 && unknown_disk && !ch->cand[pick].on_disk)
        reason = "the fastest predicted in host memory (a tie to f32); a disk placement's time is unknown (no "
                 "state_profile), so one is taken only where no host-memory placement fits";
    ch->chosen = pick;
    st_plan_state_candidate *k = &ch->cand[pick];
    if (why && why_cap) {
        char step[64] = "";
        if (k->timed) snprintf(step, sizeof step, ", predicted %.4f s a step", k->step_s);
        if (k->on_disk)
            snprintf(why, why_cap, "plan_state auto: the optimizer state %s on state_paths (%.0f host bytes; about %.0f "
                     "disk bytes of %.0f free)%s: %s", fmt_name(k->fmt), k->host_bytes, k->disk_bytes, k->disk_free, step,
                     reason);
        else
            snprintf(why, why_cap, "plan_state auto: the optimizer state %s in host memory (%.0f host bytes)%s: %s",
                     fmt_name(k->fmt), k->host_bytes, step, reason);
    }
    snprintf(c->optim_state, sizeof c->optim_state, "%s", fmt_name(k->fmt));
    if (!k->on_disk) c->state_paths[0] = 0;
    snprintf(c->plan_state, sizeof c->plan_state, "fixed");
    return ST_OK;
}

void st_train_state_describe(const st_plan_state_choice *ch, int i, char *buf, size_t cap) {
    const st_plan_state_candidate *k = &ch->cand[i];
    const char *mark = i == ch->chosen ? ": chosen" : "";
    char bytes[96];
    if (k->on_disk) snprintf(bytes, sizeof bytes, "%.0f host bytes, about %.0f disk bytes", k->host_bytes, k->disk_bytes);
    else snprintf(bytes, sizeof bytes, "%.0f host bytes", k->host_bytes);
    if (!k->fits)
        snprintf(buf, cap, "%s %s: does not fit: %s", fmt_name(k->fmt), tier_name(k->on_disk), k->note);
    else if (k->timed)
        snprintf(buf, cap, "%s %s: predicted step %.4f s (%s)%s", fmt_name(k->fmt), tier_name(k->on_disk), k->step_s,
                 bytes, mark);
    else
        snprintf(buf, cap, "%s %s: fits (%s), %s%s", fmt_name(k->fmt), tier_name(k->on_disk), bytes,
                 k->note[0] ? k->note : "not predicted (one placement fits)", mark);
}
