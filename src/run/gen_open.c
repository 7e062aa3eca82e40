/* gen_open.c - the model strata sample reads (strata/generate.h, st_train_open_model): a
 * run directory, a checkpoint directory or a Hugging Face model directory, told apart
 * by their config.json (a training configuration, or a Hugging Face one). */
#include <json-c/json.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "run/run_poetx_internal.h"
#include "strata/generate.h"
#include "strata/train.h"

static int readable(const char *path) { return access(path, R_OK) == 0; }

/* A run directory (config.json of strata train; checkpoints/latest or, after a disk-state
 * run, model.safetensors) or one of its checkpoint directories. */
static st_status open_run(st_model **out, const char *dir, const char *cfg_path, st_backend *be, char *weights,
                          size_t cap, st_err *err) {
    st_train_config c;
    st_train_config_defaults(&c);
    st_status s = st_train_config_load_json(&c, cfg_path, err);
    if (s) return s;
    char latest[4200];
    st_run_path(latest, sizeof latest, dir, ST_RUN_LATEST);
    FILE *f = fopen(latest, "r");
    if (f) {
        char name[256] = "";
        if (!fgets(name, sizeof name, f)) name[0] = 0;
        fclose(f);
        name[strcspn(name, "\n")] = 0;
        if (!name[0]) return st_errf(err, ST_ERR_FORMAT, "%s is empty; give a checkpoint directory instead", latest);
        snprintf(weights, cap, "%s/checkpoints/%s/model.safetensors", dir, name);
    } else {
        snprintf(weights, cap, "%s/model.safetensors", dir);
    }
    if (!readable(weights))
        return st_errf(err, ST_ERR_IO, "%s: no weights (%s); a run has weights after its first checkpoint", dir,
                       weights);
    if ((s = st_train_config_check(&c, err))) return st_err_prefix(err, "%s", cfg_path);
    st_model_overrides ov = st_train_config_overrides(&c); /* an init_from directory fixes the shape itself */
    ov.no_grads = 1; /* forwards only */
    s = st_model_create_from(out, c.model, c.init_from, &ov, 0, be, err); /* the run's weights are loaded below */
    if (s) return st_err_prefix(err, "%s", cfg_path);
    /* a POET-X run's checkpoint holds W0 in its permutations' frame and R, P apart: merged */
    if (st_train_config_method_of(&c) == ST_TRAIN_METHOD_POETX) s = run_poetx_load_merged(&c, out, weights, err);
    else s = (*out)->ops->load(*out, weights, err);
    if (s) {
        st_model_free(*out);
        *out = NULL;
    }
    return s;
}

st_status st_train_open_model(st_model **out, const char *from, st_backend *be, char *desc, size_t desc_cap,
                            st_err *err) {
    *out = NULL;
    char cfg_path[4200], weights[4400] = "";
    st_run_path(cfg_path, sizeof cfg_path, from, ST_RUN_CONFIG);
    json_object *root = json_object_from_file(cfg_path);
    if (!root)
        return st_errf(err, ST_ERR_IO, "%s: cannot read config.json (%s); give a run directory, a checkpoint "
                       "directory or a Hugging Face model directory", from, json_util_get_last_err());
    json_object *v;
    int is_hf = json_object_object_get_ex(root, "architectures", &v) ||
                json_object_object_get_ex(root, "model_type", &v);
    st_status s;
    if (is_hf) {
        /* GPT2LMHeadModel (config.json, model.safetensors) or the Llama family (config.json, then the weights) */
        st_model_overrides ov = {.no_grads = 1}; /* forwards only; the directory fixes the shape */
        s = st_model_create_from(out, NULL, from, &ov, 1, be, err);
        if (!s && !strcmp((*out)->ops->arch, "gpt2")) snprintf(weights, sizeof weights, "%s/model.safetensors", from);
        else snprintf(weights, sizeof weights, "%s (Hugging Face directory)", from);
    } else {
        s = open_run(out, from, cfg_path, be, weights, sizeof weights, err);
    }
    json_object_put(root);
    if (s) return s;
    if (desc) {
        char d[256];
        (*out)->ops->describe(*out, d, sizeof d);
        snprintf(desc, desc_cap, "%s: %s", weights, d);
    }
    return ST_OK;
}
