/* run_lora.c - strata train's method lora: LoRA adapters (strata/lora.h) over the frozen
 * base model (a preset, randomly initialised from the seed, or init_from's weights), the
 * optimizer over the adapters alone, checkpoints of the adapters alone (the base is rebuilt
 * from the same seed or directory on resume), and at the end save_adapter's PEFT directory and
 * save_hf's merged model. The adapters start as PEFT's (A random, B zero) or from a saved
 * adapter directory (init_adapter, or an init_from that is one). The base's block matmul weights
 * held in frozen_dtype (fp32, bf16 or int8: st_lora_config), rounded again from the same base on
 * resume. In memory or with the disk state, under mpirun too; or with layer streaming
 * (device_budget, one process, the CPU device): the frozen base's blocks (their matmul weights
 * as held with bf16 or int8) stream through the budget, the adapters' hook runs on them and the optimizer over the adapters is the one
 * in memory (strata/step.h). */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>
#include <unistd.h>

#include "run/run_internal.h"
#include "run/run_lora_internal.h"
#include "strata/block.h"
#include "strata/lora.h"

static void lora_config(const st_train_config *c, const char *arch, st_lora_config *lc) {
    memset(lc, 0, sizeof *lc);
    lc->rank = c->lora_rank;
    lc->alpha = c->lora_alpha;
    if (c->lora_targets[0]) snprintf(lc->targets, sizeof lc->targets, "%s", c->lora_targets);
    else snprintf(lc->targets, sizeof lc->targets, "%s", !strcmp(arch, "gpt2") ? "c_attn" : "q_proj,v_proj");
    int fd = st_train_config_frozen_dtype(c); /* checked by st_train_config_method */
    lc->frozen_dtype = fd < 0 ? ST_FROZEN_F32 : (st_frozen_dtype)fd;
}

/* A resume continues the run's own method, adapters and base: the run directory's config.json
 * (written at its start) against c's method, lora_rank, lora_targets and frozen_dtype (the
 * checkpoint holds the adapters only: the base is rounded again from init_from or the seed, and
 * another precision would continue another model). */
static st_status check_resume(const st_train_config *c, st_err *err) {
    char path[2200];
    st_train_config *was = NULL;
    st_status s = run_resumed_config(c, &was, path, sizeof path, err);
    if (was) {
        st_train_method m = st_train_config_method_of(was);
        const char *key = m != st_train_config_method_of(c) ? "method"
                          : m != ST_TRAIN_METHOD_LORA ? NULL
                          : was->lora_rank != c->lora_rank ? "lora_rank"
                          : strcmp(was->lora_targets, c->lora_targets) ? "lora_targets"
                          : strcmp(was->frozen_dtype, c->frozen_dtype) ? "frozen_dtype" : NULL;
        if (key)
            s = st_errf(err, ST_ERR_INVALID, "key '%s': the run in %s was trained with method %s (lora_rank %d, "
                        "lora_targets '%s', frozen_dtype %s); a resume continues it as it was: leave %s out, or "
                        "start a new run", key, c->resume, was->method, was->lora_rank, was->lora_targets,
                        was->frozen_dtype, key);
    }
    free(was);
    return s;
}

static int has_file(const char *dir, const char *name) {
    char path[2200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat st;
    return !stat(path, &st) && S_ISREG(st.st_mode);
}

st_status run_lora_init_from(st_train_config *c, st_err *err) {
    if (!c->init_from[0] || !has_file(c->init_from, "adapter_config.json") || has_file(c->init_from, "config.json"))
        return ST_OK;
    if (c->init_adapter[0])
        return st_errf(err, ST_ERR_INVALID, "key 'init_from' is the adapter directory %s and key 'init_adapter' is %s: "
                       "give the adapter once (init_from ADAPTER, or init_from BASE with init_adapter ADAPTER)",
                       c->init_from, c->init_adapter);
    st_lora_config was;
    char base[1024];
    st_status s = st_lora_read_adapter_config(c->init_from, &was, base, sizeof base, err);
    if (s) return s;
    if (!base[0] || !has_file(base, "config.json")) {
        st_model_overrides ov = {0};
        st_model_shape shape;
        st_err e2 = {0};
        int preset = base[0] && !st_model_resolve(base, "", &ov, 0, 0, &shape, NULL, &e2);
        if (preset)
            return st_errf(err, ST_ERR_INVALID, "key 'init_from': the adapter in %s was trained over preset %s, whose "
                           "weights a run draws from its seed and overrides; give --model %s --init_adapter %s with "
                           "that run's seed and overrides", c->init_from, base, base, c->init_from);
        return st_errf(err, ST_ERR_INVALID, "key 'init_from': %s/adapter_config.json names base_model_name_or_path "
                       "'%s', which is no model directory (config.json) from here; give the base as --init_from BASE "
                       "and the adapter as --init_adapter %s", c->init_from, base, c->init_from);
    }
    snprintf(c->init_adapter, sizeof c->init_adapter, "%s", c->init_from);
    snprintf(c->init_from, sizeof c->init_from, "%s", base);
    st_log(1, "strata train: init_from %s is a LoRA adapter (r %d, lora_alpha %g, target_modules %s): its base %s, "
           "the adapters from it (init_adapter)\n", c->init_adapter, was.rank, was.alpha, was.targets, c->init_from);
    return ST_OK;
}

st_status run_lora_check(const st_train_config *c, st_err *err) {
    int lora;
    st_status s = st_train_config_method(c, &lora, err);
    if (!s) s = check_resume(c, err);
    if (s) return s;
    if (!lora) {
        if (c->save_adapter[0])
            return st_errf(err, ST_ERR_INVALID, "key 'save_adapter' writes LoRA adapters: give --method lora too, or "
                           "leave save_adapter out");
        if (c->init_adapter[0])
            return st_errf(err, ST_ERR_INVALID, "key 'init_adapter' starts LoRA adapters from %s: give --method lora "
                           "too, or leave init_adapter out", c->init_adapter);
        return ST_OK;
    }
    /* the held base is dequantised by the host: said before layer streaming, which a device needs */
    int cuda_index = -1;
    if (st_train_config_frozen_dtype(c) > 0 && !st_backend_device_parse(c->device, &cuda_index, NULL) &&
        cuda_index >= 0)
        return st_errf(err, ST_ERR_UNSUPPORTED, "key 'frozen_dtype': %s base weights are dequantised by the host; "
                       "device %s keeps the weights elsewhere: train on device cpu, or give frozen_dtype fp32",
                       c->frozen_dtype, c->device);
    /* the disk state and ranks hold the adapters' vector as any run's (test_lora_dist.sh); layer
     * streaming (device_budget) moves the frozen base's blocks (held weights as held) through the budget on the CPU
     * device, the adapters' hook on its blocks in host memory, their state in RAM or on state_paths (the step
     * updates the adapters' vector through the store after the executor's backward), one process */
    if (c->device_budget > 0 && !st_backend_device_parse(c->device, &cuda_index, NULL) && cuda_index >= 0)
        return st_errf(err, ST_ERR_UNSUPPORTED, "key 'device': method lora with device_budget streams the base "
                       "to the cpu device (the adapters' hook and its memory are the host's); device %s is not "
                       "taken: give device cpu, or leave device_budget out", c->device);
    if (st_train_config_places_state(c))
        return st_errf(err, ST_ERR_UNSUPPORTED, "key 'plan_state': method lora trains its adapters with their state "
                       "as given (the adapters' state is small; state_paths and mpirun are taken); leave plan_state "
                       "out");
    st_model_overrides ov = st_train_config_overrides(c);
    st_model_shape shape;
    st_arch *arch = NULL;
    if ((s = st_model_resolve(c->model, c->init_from, &ov, 0, 0, &shape, &arch, err))) return s;
    st_lora_config lc;
    lora_config(c, shape.arch, &lc);
    s = st_lora_check(arch->lay.tensors, arch->lay.n_tensors, shape.arch, &lc, NULL, err);
    if (!s && c->init_adapter[0] && !c->resume[0]) /* a resume's adapters come from its checkpoint */
        s = st_lora_check_adapter(arch->lay.tensors, arch->lay.n_tensors, shape.arch, &lc, c->init_adapter, err);
    st_arch_free(arch);
    return s;
}

st_status run_lora_trainable(const st_train_config *c, const st_arch *a, const char *family, size_t *n, st_err *err) {
    st_lora_config lc;
    lora_config(c, family, &lc);
    return st_lora_check(a->lay.tensors, a->lay.n_tensors, family, &lc, n, err);
}

double run_lora_hook_bytes(const st_train_config *c, const st_arch *a, const char *family) {
    st_lora_config lc;
    lora_config(c, family, &lc);
    return (double)st_lora_hook_scratch_bytes(a->lay.tensors, a->lay.n_tensors, family, &lc, c->batch, c->seq);
}

double run_lora_frozen_bytes(const st_train_config *c, const st_arch *a, const char *family) {
    st_lora_config lc;
    lora_config(c, family, &lc);
    if (lc.frozen_dtype == ST_FROZEN_F32) return 0;
    size_t numel = 0, held = 0, panel = 0, row = 0;
    st_lora_held_bytes(a->lay.tensors, a->lay.n_tensors, family, lc.frozen_dtype, &numel, &held, &panel, &row);
    /* the held matmuls' scratch (B x T rows) with the panel: the store's own working memory */
    return 4.0 * ((double)a->lay.n_params - (double)numel) + (double)held + (double)panel +
           4.0 * (double)c->batch * (double)c->seq * (double)row;
}

double run_lora_start_bytes(const st_train_config *c, const st_arch *a, const char *family, size_t n_tr) {
    st_lora_config lc;
    lora_config(c, family, &lc);
    double n = (double)a->lay.n_params, adapters = 12.0 * (double)n_tr; /* their weights, gradients, staging */
    size_t numel = 0, held = 0, panel = 0, row = 0;
    if (lc.frozen_dtype != ST_FROZEN_F32)
        st_lora_held_bytes(a->lay.tensors, a->lay.n_tensors, family, lc.frozen_dtype, &numel, &held, &panel, &row);
    /* init_from: the adapters (and a store's panel) made first, then the loader reads into the base's
     * vector in place (pages taken as written), one tensor's file pages beside it; bf16, int8: each
     * block matmul weight rounded into the store and its fp32 pages given back as it is read */
    if (c->init_from[0])
        return adapters + (double)panel +
               (double)st_lora_load_peak_bytes(a->lay.tensors, a->lay.n_tensors, family, lc.frozen_dtype);
    /* a preset with bf16, int8: the adapters and the store first, then the base drawn a tensor at
     * a time into its vector (pages taken as written), each block matmul weight rounded into the
     * store and its fp32 pages given back before the next is drawn */
    if (lc.frozen_dtype != ST_FROZEN_F32)
        return adapters + (double)panel +
               (double)st_lora_draw_peak_bytes(a->lay.tensors, a->lay.n_tensors, family, lc.frozen_dtype);
    return 4.0 * n + adapters; /* fp32: the base drawn whole in place, then wrapped */
}

int run_lora_draws_base(const st_train_config *c) {
    st_lora_config lc;
    lora_config(c, "gpt2", &lc); /* its frozen_dtype alone */
    return st_train_config_method_of(c) == ST_TRAIN_METHOD_LORA && !c->init_from[0] &&
           lc.frozen_dtype != ST_FROZEN_F32;
}

int run_lora_loads_base(const st_train_config *c) {
    return st_train_config_method_of(c) == ST_TRAIN_METHOD_LORA && c->init_from[0];
}

st_status run_lora_open(const st_train_config *c, st_model **m, st_err *err) {
    int lora = 0;
    st_status s = st_train_config_method(c, &lora, err);
    if (s || !lora) return s;
    st_lora_config lc;
    lora_config(c, (*m)->ops->arch, &lc);
    st_model *lm = NULL;
    /* each takes the base, and frees it on failure; init_from's weights read into it here, or a
     * preset's drawn with bf16 or int8, each block weight rounded into the held store as it is read
     * or drawn (the base is never whole in fp32) */
    s = run_lora_loads_base(c)   ? st_lora_model_create_from(&lm, *m, c->init_from, &lc, c->seed, err)
        : run_lora_draws_base(c) ? st_lora_model_create_drawn(&lm, *m, &lc, c->seed, err)
                                 : st_lora_model_create(&lm, *m, &lc, c->seed, err);
    if (!s && c->init_adapter[0] && !c->resume[0]) s = st_lora_load_adapter(lm, c->init_adapter, err);
    *m = lm; /* its activations: the run's, as for any model the step trains through its own forward */
    return s;
}

st_status run_lora_finish(const st_train_config *c, const st_model *m, int quiet, st_err *err) {
    if (!c->save_adapter[0] || !st_model_is_lora(m)) return ST_OK;
    st_status s = st_lora_save_adapter(m, c->save_adapter, c->init_from[0] ? c->init_from : c->model, err);
    if (!s && !quiet) printf("wrote a PEFT adapter directory: %s\n", c->save_adapter);
    return s;
}
