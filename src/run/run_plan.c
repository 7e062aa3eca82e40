/* run_plan.c - the plan a run takes: layer streaming's executor opened on the plan the
 * planner makes (or a plan file, or a resumed run's plan), and plan_state auto's placement. */
#include <dirent.h>
#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fileutil.h"
#include "run/run_internal.h"
#include "strata/lora.h"
#include "strata/poetx.h"

/* ------------------------------------------------------------------ layer streaming */


/* key 'plan' a file: its plan, when it was made for this model at this batch and seq and
 * fits this run's budget with this run's configuration (st_stream_device_bytes: an 8-bit or
 * disk state, or ranks, may need other bytes than the run it was made for). pred: the
 * file's prediction, if it has one (has_pred). */
static st_status plan_from_file(const st_train_config *c, const char *path, st_plan_file *loaded, const st_arch *arch,
                                const st_stream_config *sc, size_t budget, st_stream_plan *plan, st_plan_prediction *pred,
                                int *has_pred, unsigned long long *state_budget, st_err *err) {
    st_plan_file *pf = loaded ? loaded : malloc(sizeof *pf); /* loaded: path read and checked already (taken) */
    if (!pf) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    st_status s = loaded ? ST_OK : st_plan_file_load(path, pf, err);
    if (!s && !loaded) s = st_plan_file_check(path, pf, arch, c->batch, c->seq, err);
    size_t need = s ? 0 : st_stream_device_bytes(sc, &pf->plan);
    if (!s && need > budget)
        s = st_errf(err, ST_ERR_NOMEM, "plan file %s needs %zu device bytes in this run, device_budget is %zu: %zu bytes "
                    "missing; give --device_budget %zu or more, or make a plan for this budget (strata plan "
                    "--device_budget %zu ... -o FILE)", path, need, budget, need - budget, need, budget);
    if (!s) {
        *plan = pf->plan;
        *pred = pf->pred;
        *has_pred = pf->has_prediction;
        *state_budget = pf->state_budget;
        int n[3] = {0, 0, 0};
        for (int l = 0; l < plan->n_layer; l++) n[plan->act[l]]++;
        st_log(1, "plan: %s (%d keep, %d offload, %d recompute, prefetch depth %d, vocab_chunk %d; %zu device bytes of "
               "the budget %zu; made for a budget of %zu%s)\n", path, n[ST_STREAM_ACT_KEEP], n[ST_STREAM_ACT_OFFLOAD],
               n[ST_STREAM_ACT_RECOMPUTE], plan->prefetch_depth, plan->vocab_chunk, need, budget, pf->device_budget,
               pf->has_prediction ? ", as saved" : ", no prediction");
    }
    free(pf);
    return s ? st_err_prefix(err, "key 'plan'") : ST_OK;
}

/* A resume under plan auto runs the plan its run ran (RUN_DIR/plan.json) where that was made
 * for this model, batch, seq and device budget and keeps the act choices given: planned
 * anew from a profile measured again, the vocabulary could be chunked otherwise, and the
 * chunked classifier equals the resident one (and another chunk size) only to float
 * rounding, so the resumed steps would not be the uninterrupted run's bit for bit. One
 * process only (under ranks each rank plans for itself). Returns the plan file read from
 * path (checked; the caller frees it), or NULL having logged why the run plans anew. */
static st_plan_file *resume_plan(const st_train_config *c, const st_arch *arch, const st_stream_config *sc,
                                 size_t budget, const unsigned char *fixed, char *path, size_t cap) {
    st_run_path(path, cap, c->run_dir, ST_RUN_PLAN);
    st_plan_file *pf = malloc(sizeof *pf);
    st_err e = {0};
    const char *why = NULL;
    st_dtype act_dtype = ST_F32;
    st_train_config_act_dtype(c, &act_dtype, NULL); /* checked before */
    if (!pf || st_plan_file_load(path, pf, &e) || st_plan_file_check(path, pf, arch, c->batch, c->seq, &e))
        why = pf ? e.msg : "out of memory";
    else if (pf->plan.act_dtype != act_dtype)
        why = "key 'act_dtype' asks other activations (force_resume)";
    else if (pf->device_budget != (size_t)c->device_budget)
        why = "it was made for another device_budget";
    else if (st_stream_device_bytes(sc, &pf->plan) > budget)
        why = "it does not fit this run's device";
    else
        for (int l = 0; l < pf->plan.n_layer && !why; l++)
            if (fixed[l] != ST_PLAN_ACT_FREE && pf->plan.act[l] != fixed[l]) why = "key 'act' asks other choices";
    if (why)
        st_log(1, "plan: the resumed run plans anew (its last plan, %s: %s); the vocabulary's chunking may differ "
               "from the steps before, to float rounding\n", path, why);
    if (!why) return pf;
    free(pf);
    return NULL;
}

/* The plan a run streams with, as RUN_DIR/plan.json (one process: under ranks each rank
 * plans for itself, and the run directory is rank 0's): --plan RUN_DIR/plan.json runs it
 * again exactly. */
static st_status save_run_plan(const st_train_config *c, const st_arch *arch, const st_stream_config *sc, size_t budget,
                               const st_stream_plan *plan, const st_plan_prediction *pred,
                               const st_plan_config_disk *cd, const st_plan_profile *hw, st_err *err) {
    char path[1100];
    st_run_path(path, sizeof path, c->run_dir, ST_RUN_PLAN);
    st_plan_file *pf = malloc(sizeof *pf);
    if (!pf) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    st_plan_file_init(pf, arch, c->init_from[0] ? c->init_from : c->model, c->batch, c->seq, budget, plan, pred);
    pf->device_bytes = pf->pred.device_bytes = st_stream_device_bytes(sc, plan);
    json_object *doc = st_plan_file_to_json(pf);
    free(pf);
    if (cd && cd->on_disk) json_object_object_add(doc, "disk", st_plan_config_disk_to_json(cd));
    st_status s = st_plan_file_save_json(path, doc, err);
    json_object_put(doc);
    /* the machine's figures the plan was made from: strata plan --profile RUN_DIR/plan_profile.json
     * (with this run's keys) makes and predicts the same plan */
    if (!s && hw) {
        st_run_path(path, sizeof path, c->run_dir, ST_RUN_PLAN_PROFILE);
        s = st_plan_profile_save(path, hw, err);
    }
    return s;
}

/* With the state on disk, pred (the plan's, the state in RAM) becomes the disk state's
 * (st_train_plan_predict_ex): each path's bandwidth from state_profile, else on a resume the
 * figures the run's last start saved in RUN_DIR/plan.json for the same state_paths, else a
 * short probe of each path now; logged under who. On failure pred is kept and cd zeroed. */
static void predict_disk(const st_train_config *c, const st_arch *arch, const st_plan_profile *hw,
                         const st_stream_plan *plan, const char *who, st_plan_prediction *pred, st_plan_config_disk *cd) {
    char prev[1100];
    st_run_path(prev, sizeof prev, c->run_dir, ST_RUN_PLAN);
    st_err derr = {0};
    st_plan_prediction in_ram = *pred;
    if (st_train_plan_predict_ex(c, arch, hw, plan, ST_PLAN_PROBE_BYTES, c->resume[0] ? prev : NULL, pred, cd,
                                  &derr)) {
        st_log(2, "%s: the disk state's time is not predicted (%s); the prediction is the state in RAM's\n", who,
               derr.msg);
        *pred = in_ram;
        memset(cd, 0, sizeof *cd);
        return;
    }
    st_log(1, "%s: the disk state: %s; the store %.3f s a step (io %.3f s, cpu %.3f s), %s the backward, %.3f s of "
           "it hidden\n", who,
           cd->reused ? "each path's bandwidth as the run's last start probed it (RUN_DIR/plan.json, the same "
                        "state_paths: a resume probes no path)"
           : cd->probed ? "each path's bandwidth probed now (no state_profile)"
                        : "the paths' bandwidth from state_profile",
           cd->dc.store_s, cd->dc.io_s, cd->dc.cpu_s, cd->beside ? "beside" : "after", cd->dc.hidden_s);
    char line[256];
    for (int i = 0; i < cd->n_budgets; i++) { /* key state_budget left 0: the planner's choice */
        st_plan_state_budget_describe(cd, i, line, sizeof line);
        st_log(1, "%s:   %s\n", who, line);
    }
}

st_status run_open_streamed(const st_train_config *c, st_model *m, const st_arch *arch, st_backend *be, int ranks,
                               st_backend **dev, st_stream_exec **sx, double *state_budget, st_stream_plan *chosen,
                               st_err *err) {
    /* the moments live in the disk state store; under ranks the step updates the rank's shard
     * (the executor hands over each micro-batch's gradient: no optimizer, one micro-batch) */
    int external = c->state_paths[0] != 0 || ranks > 1;
    /* the model's own vectors (CPU backend: host memory) are the host tier */
    st_stream_config sc = {.arch = arch, .host_params = m->params, .host_grads = m->grads, .B = c->batch, .T = c->seq,
                        .grad_accum = ranks > 1 ? 1 : (int)c->grad_accum, .weight_decay = (float)c->weight_decay,
                        .state_format = st_train_config_state_format(c),
                        .external_optimizer = external};
    st_status s;
    int lora = st_model_is_lora(m);
    if (lora || st_model_is_poetx(m)) {
        /* LoRA: the frozen base streams, the adapters are the hook's; POET-X: W0 streams in the base's
         * blocks, the hook trains Q and the base's ends; the step's optimizer updates the method's
         * vector */
        /* state_paths: the step updates the method's vector through its store, this executor is the
         * one of the state in RAM (train.c's open_model gives it the configuration without them).
         * Under ranks each rank streams its own copy of the base; the step reduces the hook's
         * gradient (step.c's step_run_dist) */
        if (c->state_paths[0])
            return st_errf(err, ST_ERR_INVALID, "key 'state_paths': method %s streams its base with the executor of "
                           "the state in RAM; the step updates %s vector through the store (give the configuration "
                           "without state_paths here)", lora ? "lora" : "poetx",
                           lora ? "the adapters'" : "the trained");
        sc.host_params = (lora ? st_lora_base(m) : st_poetx_base(m))->params;
        sc.host_grads = NULL;
        sc.external_optimizer = 0;
        s = lora ? st_lora_hook_bind(m, c->batch, c->seq, &sc.hook, err)
                 : st_poetx_hook_bind(m, c->batch, c->seq, &sc.hook, err);
        if (s) return s;
    }
    st_stream_plan plan;
    st_stream_plan_default(&plan, arch->lay.n_blocks);
    size_t budget = (size_t)c->device_budget;
    /* the planner (plan.h: the fastest predicted plan within the budget on this machine,
     * measured now; the head resident where no slower, as strata plan chooses); without
     * GLPK, or when it finds none, the fixed rule below */
    st_plan_profile hw;
    st_plan_prediction pred;
    st_plan_config_disk cdisk;
    memset(&cdisk, 0, sizeof cdisk);
    int have_hw = 0;
    /* LoRA: a frozen base's tables; POET-X: a hook's that trains the ends (frozen_base 2), the
     * head resident or in chunks (each chunk's gradient handed to the hook) */
    st_plan_options po = {.mip_gap = -1, .allow_vocab_chunk = 1,
                          .prefer_resident_head = st_train_config_plan_head(c),
                          .frozen_base = !sc.hook ? 0 : sc.hook->frozen ? 1 : 2,
                          .held_block_bytes = sc.hook ? sc.hook->held_block_bytes : 0};
    st_err perr = {0};
    int found = 0, has_pred = 0, n_fixed = 0, L = arch->lay.n_blocks;
    /* key 'act': choices every plan must make (the program's constraints, the rule's too) */
    unsigned char fixed[ST_STREAM_MAX_LAYERS];
    if ((s = st_train_config_act(c, L, fixed, &n_fixed, err))) return s;
    if (n_fixed) po.fixed_act = fixed;
    /* key 'act_dtype': every plan's sets (the program's bytes and costs, the rule's candidates) */
    if ((s = st_train_config_act_dtype(c, &po.act_dtype, err))) return s;
    plan.act_dtype = po.act_dtype;
    /* a GPU (key 'device') exists before the plan: the planner measures it. The CPU device,
     * the host's cores, is measured through the host backend (the profile's buffers outside
     * the budget), and its arena carved once the plan is known, below. */
    int cuda_index = -1;
    if ((s = st_backend_device_parse(c->device, &cuda_index, err))) return st_err_prefix(err, "key 'device'");
    if (cuda_index >= 0 && (s = st_backend_device_create(dev, c->device, be, budget, err)))
        return st_err_prefix(err, s == ST_ERR_NOMEM ? "key 'device_budget'" : "key 'device'");
    /* key 'matmul': set before the planner times the device (a CPU device takes fp32 only) */
    if ((s = st_backend_set_matmul(*dev, c->matmul, err))) return st_err_prefix(err, "key 'matmul'");
    budget = st_backend_device_usable_bytes(c->device, budget); /* what the plan gets (a GPU: less cuBLASLt's) */
    char resumed[1100];
    const char *plan_path = st_train_config_plan_file(c);
    st_plan_file *resumed_pf = NULL;
    if (!plan_path && c->resume[0] && ranks <= 1 &&
        (resumed_pf = resume_plan(c, arch, &sc, budget, fixed, resumed, sizeof resumed)))
        plan_path = resumed;
    if (plan_path) { /* a saved plan, run exactly (or refused) */
        unsigned long long file_state_budget = 0;
        if ((s = plan_from_file(c, plan_path, resumed_pf, arch, &sc, budget, &plan, &pred, &has_pred, &file_state_budget,
                                err)))
            return s;
        if (plan.act_dtype != po.act_dtype)
            return st_errf(err, ST_ERR_INVALID, "key 'act_dtype': %s, but plan file %s keeps %s activations: give "
                           "act_dtype %s to run the file, or make a plan with it (strata plan --act_dtype %s ... -o "
                           "FILE)", c->act_dtype, plan_path, po.act_dtype == ST_BF16 ? "f32" : "bf16",
                           po.act_dtype == ST_BF16 ? "f32" : "bf16", c->act_dtype);
        for (int l = 0; l < L; l++)
            if (fixed[l] != ST_PLAN_ACT_FREE && plan.act[l] != fixed[l])
                return st_errf(err, ST_ERR_INVALID, "key 'act': block %d %s, but plan file %s has it %s: give act auto "
                               "to run the file, or make a plan with the choices (strata plan --act %s ... -o FILE)", l,
                               st_plan_act_name(fixed[l]), plan_path, st_plan_act_name(plan.act[l]), c->act);
        found = 1;
        /* the file's plan predicted again on this machine (the file's figures are the machine's it
         * was made on, perhaps another), as the planner predicts: saved in RUN_DIR/plan.json */
        st_plan_prediction filed = pred;
        int filed_has = has_pred;
        if ((s = st_plan_profile_cached(*dev ? *dev : be, arch, c->batch, c->seq, &hw, &perr)) == ST_OK) {
            have_hw = 1;
            if (external && ranks <= 1) sc.store_beside = st_plan_store_beside(&hw);
            s = st_plan_predict_frozen(arch, c->batch, c->seq, &hw, &plan, po.frozen_base, po.held_block_bytes, &pred,
                                       &perr);
        }
        if (s) {
            st_log(2, "plan: %s is not predicted on this machine (%s)\n", plan_path, perr.msg);
            pred = filed;
        } else {
            has_pred = 1;
            pred.device_budget = budget;
            pred.solve_s = 0;
            if (ranks <= 1 && c->state_paths[0]) {
                /* the store's host budget the file was predicted with, where the key leaves it 0 */
                st_train_config fc = *c;
                if (!(c->state_budget > 0) && file_state_budget > 0) fc.state_budget = (double)file_state_budget;
                predict_disk(&fc, arch, &hw, &plan, "plan", &pred, &cdisk);
                if (fc.state_budget != c->state_budget && cdisk.on_disk) {
                    *state_budget = fc.state_budget;
                    st_log(1, "plan: the state store's host budget %llu bytes, as %s was predicted with\n",
                           file_state_budget, plan_path);
                }
            }
            char was[64] = "no prediction";
            if (filed_has) snprintf(was, sizeof was, "%.3f s a step", filed.step_s);
            st_log(1, "plan: %s predicted on this machine %.3f s a step%s (the file: %s)\n", plan_path, pred.step_s,
                   cdisk.on_disk ? " with the state on disk" : "", was);
        }
    } else { /* the plan request (plan.h): the machine measured, the program, the fixed rule */
        st_plan_request rq = {.arch = arch, .B = c->batch, .T = c->seq, .budget = budget, .sc = &sc,
                              .measure_on = *dev ? *dev : be, .with_shape = 1, .solve = 1, .options = po, .rule = 1,
                              .vocab_chunk = -1};
        st_plan_result res;
        s = st_plan_for_run(&rq, &res, err);
        if (s && !res.by_rule) return s; /* key 'act': the choices given do not fit */
        if (s) /* the smallest plan strata train makes (recompute, chunks) is the last one tried */
            return st_errf(err, ST_ERR_NOMEM, "key 'device_budget': %.0f bytes is too small for this model at batch "
                           "%d x seq %d: the smallest plan (every block recomputed, the vocabulary in 2048-row "
                           "chunks) needs %zu device bytes, %.0f bytes missing; give at least that, or a smaller "
                           "batch or seq", c->device_budget, c->batch, c->seq, st_stream_device_bytes(&sc, &res.plan),
                           (double)st_stream_device_bytes(&sc, &res.plan) - (double)budget);
        plan = res.plan;
        pred = res.pred;
        hw = res.hw;
        have_hw = res.have_hw;
        found = has_pred = !res.by_rule;
        /* the disk state's update beside the backward pays only where host work leaves the
         * device's compute alone (not on the CPU backend, whose device is the host's cores) */
        if (have_hw && external && ranks <= 1) {
            sc.store_beside = st_plan_store_beside(&hw);
            st_log(1, "disk state: the store's update runs %s the backward (measured host_work_slowdown %.2f)\n",
                   sc.store_beside ? "beside" : "after", hw.host_work_slowdown);
        }
        /* the prediction strata plan prints for this configuration: with the state on disk,
         * the store's time from state_profile or a short probe of each path now */
        if (found && ranks <= 1 && c->state_paths[0]) predict_disk(c, arch, &hw, &plan, "planner", &pred, &cdisk);
        if (found)
            st_log(1, "planner: %d keep, %d offload, %d recompute, prefetch depth %d, vocab_chunk %d: predicted %.3f s "
                   "a step%s, %zu device bytes (solved in %.3f s)\n", pred.n_keep, pred.n_offload, pred.n_recompute,
                   plan.prefetch_depth, plan.vocab_chunk, pred.step_s, cdisk.on_disk ? " with the state on disk" : "",
                   pred.device_bytes, pred.solve_s);
        else
            st_log(2, "planner: %s; the fixed rule chooses the plan\n", res.why_rule.msg);
    }
    if (ranks > 1) plan.grad_dtype = ST_F32; /* the ranks reduce fp32 gradients */
    if (!*dev && (s = st_backend_device_create(dev, c->device, be, budget, err)))
        return st_err_prefix(err, "key 'device_budget'");
    if ((s = st_stream_exec_create(sx, &sc, &plan, *dev, err))) return st_err_prefix(err, "key 'device_budget'");
    *chosen = plan;
    char usable[96] = "";
    if (cuda_index >= 0)
        snprintf(usable, sizeof usable, " (%.1f MiB of it for the plan, the rest cuBLASLt's workspace)",
                 budget / 1048576.0);
    char acts[256]; /* every block's choice, as runs: "blocks 0-2 recompute" */
    st_plan_act_describe(plan.act, L, acts, sizeof acts);
    st_log(1, "layer streaming: device budget %.1f MiB on %s%s, activations (%s), vocabulary %s (%d rows a chunk)\n",
           c->device_budget / 1048576.0, cuda_index >= 0 ? c->device : "the CPU", usable, acts,
           plan.vocab_chunk ? "chunked" : "resident", plan.vocab_chunk);
    /* the store's host budget the planner chose (key state_budget left 0): the run's */
    if (cdisk.on_disk && cdisk.budget_chosen) *state_budget = (double)cdisk.dc.state_budget;
    /* the file's budget is the one given, so that --plan RUN_DIR/plan.json alone sizes the device alike */
    return ranks > 1 ? ST_OK
                     : save_run_plan(c, arch, &sc, (size_t)c->device_budget, &plan, has_pred ? &pred : NULL, &cdisk,
                                     have_hw ? &hw : NULL, err);
}

/* plan_state auto: the placements that fit, each predicted with the machine's profile (the
 * one the planner then uses: st_plan_profile_cached, measured once per process) where two or more
 * can be timed, as strata plan chooses (st_train_state_choose). Under mpirun the ranks'
 * measured profiles may differ, so they take the first that fits, alike. */
st_status run_place_state(st_train_config *c, int world, st_err *err) {
    st_plan_state_choice ch;
    st_status s = st_train_state_fit(c, &ch, err);
    if (s) return s;
    st_plan_profile hw;
    int have_hw = 0;
    st_arch *arch = NULL;
    if (ch.needs_profile && world <= 1) {
        st_model_overrides ov = st_train_config_overrides(c);
        st_model_shape shape;
        st_backend *tmp = NULL;
        if ((s = st_model_resolve(c->model, c->init_from, &ov, c->batch, c->seq, &shape, &arch, err))) return s;
        if (!(s = st_backend_cpu_create(&tmp, c->threads, err))) s = st_plan_profile_cached(tmp, arch, c->batch, c->seq, &hw, err);
        if (tmp) st_backend_free(tmp);
        if (s) {
            st_arch_free(arch);
            return st_err_prefix(err, "key 'plan_state': measuring the machine to predict each placement");
        }
        have_hw = 1;
    }
    char why[1024], line[512];
    s = st_train_state_choose(c, arch, have_hw ? &hw : NULL, &ch, why, sizeof why, err);
    st_arch_free(arch);
    if (s) return s;
    st_log(1, "%s\n", why);
    for (int i = 0; i < ch.n; i++) {
        st_train_state_describe(&ch, i, line, sizeof line);
        st_log(1, "  %s\n", line);
    }
    return ST_OK;
}
