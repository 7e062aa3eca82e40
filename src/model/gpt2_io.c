/* gpt2_io.c - GPT-2 weights to and from safetensors, under Hugging Face's names, and Hugging
 * Face GPT-2 directories (config.json + model.safetensors) both ways. */
#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fileutil.h"
#include "model/model_internal.h"
#include "strata/model.h"
#include "strata/safetensors.h"

st_status st_gpt2_save_safetensors(const st_gpt2_model *m, const char *path, st_err *err) {
    float *host = malloc(m->n_params * sizeof(float));
    st_tensor_out *outs = calloc((size_t)m->n_tensors, sizeof *outs);
    if (!host || !outs) {
        free(host);
        free(outs);
        return st_errf(err, ST_ERR_NOMEM, "out of memory saving %s", path);
    }
    m->be->ops->copy_to_host(m->be, host, m->params, m->n_params * sizeof(float));
    for (int i = 0; i < m->n_tensors; i++) {
        const st_param_info *t = &m->tensors[i];
        outs[i].name = t->name;
        outs[i].dtype = ST_F32;
        outs[i].ndim = t->ndim;
        outs[i].shape[0] = t->shape[0];
        outs[i].shape[1] = t->shape[1];
        outs[i].data = host + t->offset;
    }
    char v[5][16];
    snprintf(v[0], 16, "%d", m->cfg.vocab_size);
    snprintf(v[1], 16, "%d", m->cfg.max_seq);
    snprintf(v[2], 16, "%d", m->cfg.n_layer);
    snprintf(v[3], 16, "%d", m->cfg.n_head);
    snprintf(v[4], 16, "%d", m->cfg.n_embd);
    const char *meta[] = {"format", "pt", "model", "gpt2", "vocab_size", v[0], "n_positions", v[1],
                          "n_layer", v[2], "n_head", v[3], "n_embd", v[4]};
    st_status s = st_safetensors_write(path, outs, m->n_tensors, meta, 7, err);
    free(host);
    free(outs);
    return s;
}

st_status st_gpt2_load_safetensors(st_gpt2_model *m, const char *path, st_err *err) {
    return model_gpt2_load_safetensors(m, path, NULL, err);
}

st_status model_gpt2_load_safetensors(st_gpt2_model *m, const char *path, const model_load_each *each, st_err *err) {
    st_safetensors *st;
    st_status s = st_safetensors_open(&st, path, err);
    if (s) return s;
    st_safetensors **src = malloc((size_t)m->n_tensors * sizeof *src);
    const char **names = malloc((size_t)m->n_tensors * sizeof *names);
    if (!src || !names) s = st_errf(err, ST_ERR_NOMEM, "out of memory loading %s", path);
    for (int i = 0; i < m->n_tensors && !s; i++) {
        const char *name = m->tensors[i].name;
        /* GPT2Model files (the original hub checkpoint) have no "transformer." prefix */
        if (!st_safetensors_find(st, name) && !strncmp(name, "transformer.", 12) && st_safetensors_find(st, name + 12))
            name += 12;
        src[i] = st;
        names[i] = name;
    }
    if (!s) s = model_params_load_each(m->be, m->params, m->tensors, m->n_tensors, src, names, each, err);
    free(src);
    free(names);
    st_safetensors_close(st);
    return s;
}

st_status st_gpt2_save_hf(const st_gpt2_model *m, const char *dir, st_err *err) {
    st_status s = st_mkdirs(dir, err);
    if (s) return s;
    char path[4200], json[1024];
    const st_gpt2_config *c = &m->cfg;
    int n = snprintf(json, sizeof json,
                     "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
                     "  \"vocab_size\": %d,\n  \"n_positions\": %d,\n  \"n_ctx\": %d,\n  \"n_embd\": %d,\n"
                     "  \"n_layer\": %d,\n  \"n_head\": %d,\n  \"layer_norm_epsilon\": 1e-05,\n"
                     "  \"activation_function\": \"gelu_new\",\n  \"tie_word_embeddings\": true,\n"
                     "  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0,\n"
                     "  \"torch_dtype\": \"float32\"\n}\n",
                     c->vocab_size, c->max_seq, c->max_seq, c->n_embd, c->n_layer, c->n_head);
    snprintf(path, sizeof path, "%s/config.json", dir);
    st_file_writer w;
    if ((s = st_file_writer_open(&w, path, err))) return s;
    s = st_file_writer_put(&w, json, (size_t)n, err);
    if ((s = st_file_writer_close(&w, s, err))) return s;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    return st_gpt2_save_safetensors(m, path, err);
}

/* ------------------------------------------------------------------ Hugging Face directories
 * config.json of GPT2LMHeadModel (or GPT2Model, or model_type "gpt2") with
 * model.safetensors beside it, as st_gpt2_save_hf writes it and as the hub's gpt2 ships.
 * Fields that would change the equations strata computes are refused by name; dropout is
 * accepted (strata trains without it) and said once. */

static int json_int(json_object *o, const char *key, int def, int *ok) {
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || json_object_is_type(v, json_type_null)) return def;
    if (!json_object_is_type(v, json_type_int)) {
        *ok = 0;
        return def;
    }
    return json_object_get_int(v);
}

static int gpt2_arch_named(json_object *root) {
    json_object *v;
    if (json_object_object_get_ex(root, "architectures", &v) && json_object_is_type(v, json_type_array) &&
        json_object_array_length(v) == 1) {
        const char *a = json_object_get_string(json_object_array_get_idx(v, 0));
        return a && (!strcmp(a, "GPT2LMHeadModel") || !strcmp(a, "GPT2Model"));
    }
    return json_object_object_get_ex(root, "model_type", &v) && json_object_is_type(v, json_type_string) &&
           !strcmp(json_object_get_string(v), "gpt2");
}

st_status st_gpt2_hf_config_read(const char *dir, st_gpt2_config *cfg, st_err *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_object *root = json_object_from_file(path);
    if (!root) return st_errf(err, ST_ERR_IO, "%s: cannot read as JSON: %s", path, json_util_get_last_err());
    st_status s = ST_OK;
    if (!json_object_is_type(root, json_type_object) || !gpt2_arch_named(root)) {
        s = st_errf(err, ST_ERR_UNSUPPORTED, "%s: not a GPT-2 config (architectures GPT2LMHeadModel or model_type "
                    "gpt2)", path);
        goto out;
    }
    int ok = 1;
    cfg->vocab_size = json_int(root, "vocab_size", 50257, &ok);
    cfg->max_seq = json_int(root, "n_positions", json_int(root, "n_ctx", 1024, &ok), &ok);
    cfg->n_embd = json_int(root, "n_embd", 768, &ok);
    cfg->n_layer = json_int(root, "n_layer", 12, &ok);
    cfg->n_head = json_int(root, "n_head", 12, &ok);
    int n_inner = json_int(root, "n_inner", 0, &ok);
    if (!ok) {
        s = st_errf(err, ST_ERR_FORMAT, "%s: vocab_size, n_positions, n_embd, n_layer, n_head and n_inner must be "
                    "integers", path);
        goto out;
    }
    json_object *v;
    const char *act = json_object_object_get_ex(root, "activation_function", &v) ? json_object_get_string(v) : NULL;
    if (act && strcmp(act, "gelu_new") && strcmp(act, "gelu_pytorch_tanh")) {
        s = st_errf(err, ST_ERR_UNSUPPORTED, "%s: field 'activation_function' is '%s'; strata's GPT-2 computes "
                    "gelu_new (the tanh approximation)", path, act);
        goto out;
    }
    if (n_inner && n_inner != 4 * cfg->n_embd) {
        s = st_errf(err, ST_ERR_UNSUPPORTED, "%s: field 'n_inner' is %d; strata's GPT-2 has 4 * n_embd = %d", path,
                    n_inner, 4 * cfg->n_embd);
        goto out;
    }
    static const char *must_be_false[] = {"add_cross_attention", "scale_attn_by_inverse_layer_idx"};
    for (size_t i = 0; i < sizeof must_be_false / sizeof must_be_false[0]; i++)
        if (json_object_object_get_ex(root, must_be_false[i], &v) && json_object_get_boolean(v)) {
            s = st_errf(err, ST_ERR_UNSUPPORTED, "%s: field '%s' is true; strata's GPT-2 does not compute it", path,
                        must_be_false[i]);
            goto out;
        }
    if (json_object_object_get_ex(root, "tie_word_embeddings", &v) && !json_object_is_type(v, json_type_null) &&
        !json_object_get_boolean(v)) {
        s = st_errf(err, ST_ERR_UNSUPPORTED, "%s: field 'tie_word_embeddings' is false; strata's GPT-2 ties the "
                    "classifier to wte", path);
        goto out;
    }
    if (json_object_object_get_ex(root, "layer_norm_epsilon", &v) &&
        fabs(json_object_get_double(v) - 1e-5) > 1e-12) {
        s = st_errf(err, ST_ERR_UNSUPPORTED, "%s: field 'layer_norm_epsilon' is %g; strata's GPT-2 uses 1e-05", path,
                    json_object_get_double(v));
        goto out;
    }
    static const char *drops[] = {"resid_pdrop", "embd_pdrop", "attn_pdrop"};
    for (size_t i = 0; i < sizeof drops / sizeof drops[0]; i++)
        if (json_object_object_get_ex(root, drops[i], &v) && json_object_get_double(v) != 0) {
            st_log(1, "%s: %s is %g; strata trains without dropout\n", path, drops[i], json_object_get_double(v));
            break;
        }
    if ((s = st_gpt2_config_validate(cfg, err))) st_err_prefix(err, "%s", path);
out:
    json_object_put(root);
    return s;
}

int st_gpt2_hf_is_dir(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_object *root = json_object_from_file(path);
    if (!root) return 0;
    int yes = json_object_is_type(root, json_type_object) && gpt2_arch_named(root);
    json_object_put(root);
    return yes;
}

st_status st_gpt2_model_create_hf(st_model **out, const char *dir, st_backend *be, st_err *err) {
    return model_create_gpt2_hf(out, dir, 1, be, err);
}

st_status model_create_gpt2_hf(st_model **out, const char *dir, int with_grads, st_backend *be, st_err *err) {
    *out = NULL;
    st_gpt2_config cfg;
    st_status s = st_gpt2_hf_config_read(dir, &cfg, err);
    if (s) return s;
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (access(path, R_OK) != 0)
        return st_errf(err, ST_ERR_IO, "%s: cannot read: %s (a GPT-2 directory holds one model.safetensors)", path,
                       strerror(errno));
    st_model *m;
    if ((s = model_create_gpt2(&m, &cfg, with_grads, be, err))) return s;
    if ((s = model_gpt2_load_safetensors(m->impl, path, NULL, err))) { /* path checked above */
        st_model_free(m);
        return s;
    }
    *out = m;
    return ST_OK;
}
