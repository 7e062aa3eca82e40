/* run_lora.c - strata train's method lora: LoRA adapters (strata/lora.h) over the frozen
 * base model (a preset, randomly initialised from the seed, or init_from's weights), the
 * optimizer over the adapters alone, checkpoints of the adapters alone (the base is rebuilt
 * from the same seed or directory on resume), and at the end save_adapter's PEFT directory and
 * save_hf's merged model. In memory, one process, for now. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "run/run_lora_internal.h"
#include "strata/block.h"
#include "strata/lora.h"

static void lora_config(const st_train_config *c, const char *arch, st_lora_config *lc) {
    memset(lc, 0, sizeof *lc);
    lc->rank = c->lora_rank;
    lc->alpha = c->lora_alpha;
    if (c->lora_targets[0]) snprintf(lc->targets, sizeof lc->targets, "%s", c->lora_targets);
    else snprintf(lc->targets, sizeof lc->targets, "%s", !strcmp(arch, "gpt2") ? "c_attn" : "q_proj,v_proj");
}

/* A resume continues the run's own method and adapters: the run directory's config.json
 * (written at its start) against c's method, lora_rank and lora_targets. */
static st_status check_resume(const st_train_config *c, st_err *err) {
    char path[2200];
    st_run_path(path, sizeof path, c->run_dir, ST_RUN_CONFIG);
    if (!c->resume[0] || access(path, R_OK)) return ST_OK;
    st_train_config *was = malloc(sizeof *was); /* large: not on the stack */
    if (!was) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    st_train_config_defaults(was);
    st_status s = ST_OK;
    if (!st_train_config_load_json(was, path, NULL)) {
        const char *key = strcmp(was->method, c->method) ? "method"
                          : strcmp(was->method, "lora") ? NULL
                          : was->lora_rank != c->lora_rank ? "lora_rank"
                          : strcmp(was->lora_targets, c->lora_targets) ? "lora_targets" : NULL;
        if (key)
            s = st_errf(err, ST_ERR_INVALID, "key '%s': the run in %s was trained with method %s (lora_rank %d, "
                        "lora_targets '%s'); a resume continues it as it was: leave %s out, or start a new run",
                        key, c->run_dir, was->method, was->lora_rank, was->lora_targets, key);
    }
    free(was);
    return s;
}

st_status run_lora_check(const st_train_config *c, int world, st_err *err) {
    int lora;
    st_status s = st_train_config_method(c, &lora, err);
    if (!s) s = check_resume(c, err);
    if (s) return s;
    if (!lora) {
        if (c->save_adapter[0])
            return st_errf(err, ST_ERR_INVALID, "key 'save_adapter' writes LoRA adapters: give --method lora too, or "
                           "leave save_adapter out");
        return ST_OK;
    }
    const char *why = NULL;
    if (c->device_budget > 0) why = "device_budget";
    else if (c->state_paths[0]) why = "state_paths";
    else if (!strcmp(c->plan_state, "auto")) why = "plan_state";
    if (why)
        return st_errf(err, ST_ERR_UNSUPPORTED, "key '%s': method lora trains in memory for now (no layer streaming, "
                       "no disk state: the adapters' state is small); leave %s out", why, why);
    if (world > 1)
        return st_errf(err, ST_ERR_UNSUPPORTED, "key 'method': method lora runs in one process for now, not under "
                       "mpirun (%d ranks); run it without mpirun", world);
    st_model_overrides ov = st_train_config_overrides(c);
    st_model_shape shape;
    st_arch *arch = NULL;
    if ((s = st_model_resolve(c->model, c->init_from, &ov, 0, 0, &shape, &arch, err))) return s;
    st_lora_config lc;
    lora_config(c, shape.arch, &lc);
    s = st_lora_check(arch->lay.tensors, arch->lay.n_tensors, shape.arch, &lc, NULL, err);
    st_arch_free(arch);
    return s;
}

st_status run_lora_open(const st_train_config *c, st_model **m, st_err *err) {
    int lora = 0;
    st_status s = st_train_config_method(c, &lora, err);
    if (s || !lora) return s;
    st_lora_config lc;
    lora_config(c, (*m)->ops->arch, &lc);
    st_model *lm = NULL;
    s = st_lora_model_create(&lm, *m, &lc, c->seed, err); /* takes the base, frees it on failure */
    *m = lm; /* its activations: the run's, as for any model the step trains through its own forward */
    return s;
}

st_status run_lora_finish(const st_train_config *c, const st_model *m, int quiet, st_err *err) {
    if (!c->save_adapter[0] || !st_model_is_lora(m)) return ST_OK;
    st_status s = st_lora_save_adapter(m, c->save_adapter, c->init_from[0] ? c->init_from : c->model, err);
    if (!s && !quiet) printf("wrote a PEFT adapter directory: %s\n", c->save_adapter);
    return s;
}
