/* hf_io.c - Llama-family weights to and from a Hugging Face model directory.
 *
 * Reading: DIR/model.safetensors, or the shards that DIR/model.safetensors.index.json's
 * weight_map names, in F32, BF16 or F16 (the safetensors reader validates each header).
 * Every tensor the configuration defines must be present with its exact shape, and every
 * tensor in the files must be one the configuration defines (a bias the config does not
 * mention means the config and weights disagree), except a tied lm_head.weight and the
 * rotary inv_freq buffers old checkpoints carry. Every tensor is checked before the first
 * weight is written (a failed load leaves the model's weights as they were), then read straight
 * into the model's vector where the backend's memory is the host's (model_params_load).
 * Writing: config.json and either one model.safetensors or shards plus the index, under
 * the same names, each file written atomically (temporary + fsync + rename).
 */
#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fileutil.h"
#include "model/hf_internal.h"
#include "model/model_internal.h"
#include "strata/llama.h"
#include "strata/safetensors.h"


#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"

/* The shard files of a checkpoint, opened on first use. */
typedef struct shard_set {
    int n;
    char **names;
    st_safetensors **st;
} shard_set;

static void shards_free(shard_set *s) {
    for (int i = 0; i < s->n; i++) {
        free(s->names[i]);
        if (s->st[i]) st_safetensors_close(s->st[i]);
    }
    free(s->names);
    free(s->st);
    memset(s, 0, sizeof *s);
}

static st_status shard_get(shard_set *s, const char *dir, const char *name, st_safetensors **out, st_err *err) {
    int i;
    for (i = 0; i < s->n; i++)
        if (!strcmp(s->names[i], name)) break;
    if (i == s->n) {
        char **nn = realloc(s->names, sizeof *nn * (size_t)(s->n + 1));
        if (nn) s->names = nn;
        st_safetensors **ns = realloc(s->st, sizeof *ns * (size_t)(s->n + 1));
        if (ns) s->st = ns;
        if (!nn || !ns) return st_errf(err, ST_ERR_NOMEM, "out of memory");
        s->names[i] = strdup(name);
        s->st[i] = NULL;
        s->n++;
        if (!s->names[i]) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    }
    if (!s->st[i]) {
        if (strchr(name, '/'))
            return st_errf(err, ST_ERR_FORMAT, "%s/%s: shard name '%s' must be a file in the directory", dir,
                           INDEX_NAME, name);
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        st_status st = st_safetensors_open(&s->st[i], path, err);
        if (st) return st;
    }
    *out = s->st[i];
    return ST_OK;
}

/* Tensors a file may carry that the model does not use. */
static int ignorable(const st_llama_model *m, const char *name) {
    if (m->cfg.tie_word_embeddings && !strcmp(name, "lm_head.weight")) return 1;
    size_t n = strlen(name), k = strlen("rotary_emb.inv_freq");
    return n >= k && !strcmp(name + n - k, "rotary_emb.inv_freq");
}

static st_status llama_load_hf_each(st_llama_model *m, const char *dir, const model_load_each *each, st_err *err);

st_status st_llama_load_hf(st_llama_model *m, const char *dir, st_err *err) {
    return llama_load_hf_each(m, dir, NULL, err);
}

st_status model_load_hf(st_model *m, const char *dir, const model_load_each *each, st_err *err) {
    if (strcmp(m->ops->arch, "gpt2")) return llama_load_hf_each(m->impl, dir, each, err);
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (access(path, R_OK) != 0)
        return st_errf(err, ST_ERR_IO, "%s: cannot read: %s (a GPT-2 directory holds one model.safetensors)", path,
                       strerror(errno));
    return model_gpt2_load_safetensors(m->impl, path, each, err);
}

static st_status llama_load_hf_each(st_llama_model *m, const char *dir, const model_load_each *each, st_err *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, INDEX_NAME);
    json_object *index = NULL, *wmap = NULL;
    shard_set shards = {0};
    st_status s = ST_OK;
    if (access(path, F_OK) == 0) {
        char *text = hf_read_text(path, err);
        if (!text) return err ? err->code : ST_ERR_IO;
        index = json_tokener_parse(text);
        free(text);
        if (!index || !json_object_object_get_ex(index, "weight_map", &wmap) ||
            !json_object_is_type(wmap, json_type_object)) {
            if (index) json_object_put(index);
            return st_errf(err, ST_ERR_FORMAT, "%s: not JSON with a 'weight_map' object of tensor name -> file",
                           path);
        }
        json_object_object_foreach(wmap, key, val) {
            if (!json_object_is_type(val, json_type_string)) {
                s = st_errf(err, ST_ERR_FORMAT, "%s: weight_map['%s'] must be a file name", path, key);
                break;
            }
            if (!st_llama_find_tensor(m, key) && !ignorable(m, key)) {
                s = st_errf(err, ST_ERR_SHAPE, "%s: weight_map lists '%s', which this configuration does not have "
                            "(config.json and the weights disagree)", path, key);
                break;
            }
        }
    } else {
        st_safetensors *one;
        snprintf(path, sizeof path, "%s/%s", dir, SINGLE_NAME);
        if (access(path, F_OK) != 0)
            return st_errf(err, ST_ERR_IO, "%s: no %s or %s; is this a Hugging Face model directory?", dir, SINGLE_NAME,
                           INDEX_NAME);
        s = shard_get(&shards, dir, SINGLE_NAME, &one, err);
        for (int i = 0; !s && i < st_safetensors_count(one); i++) {
            const char *name = st_safetensors_entry(one, i)->name;
            if (!st_llama_find_tensor(m, name) && !ignorable(m, name))
                s = st_errf(err, ST_ERR_SHAPE, "%s: tensor '%s' is not part of this configuration (config.json and "
                            "the weights disagree)", path, name);
        }
    }
    st_safetensors **src = s ? NULL : malloc((size_t)m->n_tensors * sizeof *src);
    if (!s && !src) s = st_errf(err, ST_ERR_NOMEM, "out of memory loading %s", dir);
    /* every shard opened and every tensor found before the first weight is written */
    for (int i = 0; i < m->n_tensors && !s; i++) {
        const st_param_info *t = &m->tensors[i];
        const char *file = SINGLE_NAME;
        if (wmap) {
            json_object *f;
            if (!json_object_object_get_ex(wmap, t->name, &f)) {
                s = st_errf(err, ST_ERR_SHAPE, "%s/%s: weight_map has no entry for '%s', which the configuration "
                            "needs", dir, INDEX_NAME, t->name);
                break;
            }
            file = json_object_get_string(f);
        }
        st_safetensors *st;
        if ((s = shard_get(&shards, dir, file, &st, err))) break;
        if (!st_safetensors_find(st, t->name)) {
            s = st_errf(err, ST_ERR_SHAPE, "%s: tensor '%s' is missing (the configuration needs it, shape [%d, %d])",
                        st_safetensors_path(st), t->name, t->shape[0], t->shape[1]);
            break;
        }
        src[i] = st;
    }
    if (!s) s = model_params_load_each(m->be, m->params, m->tensors, m->n_tensors, src, NULL, each, err);
    free(src);
    shards_free(&shards);
    if (index) json_object_put(index);
    return s;
}

static const char *torch_dtype_name(st_dtype t) {
    return t == ST_BF16 ? "bfloat16" : t == ST_F16 ? "float16" : "float32";
}

/* Write text to path atomically. */
/* Remove the shards an earlier index listed (other than those just written) and the
 * index itself: after a single-file save, a stale index would win on the next load. */
static void remove_old_shards(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, INDEX_NAME);
    char *text = hf_read_text(path, NULL);
    if (!text) return;
    json_object *idx = json_tokener_parse(text), *wm;
    free(text);
    if (idx && json_object_object_get_ex(idx, "weight_map", &wm) && json_object_is_type(wm, json_type_object)) {
        json_object_object_foreach(wm, key, val) {
            (void)key;
            const char *f = json_object_get_string(val);
            if (f && !strchr(f, '/') && strcmp(f, SINGLE_NAME)) {
                char p2[4096];
                snprintf(p2, sizeof p2, "%s/%s", dir, f);
                unlink(p2);
            }
        }
    }
    if (idx) json_object_put(idx);
    unlink(path);
}

st_status st_llama_save_hf(const st_llama_model *m, const char *dir, st_dtype dtype, size_t max_shard_bytes, st_err *err) {
    if (dtype != ST_F32 && dtype != ST_BF16 && dtype != ST_F16)
        return st_errf(err, ST_ERR_INVALID, "st_llama_save_hf: dtype %s; use F32, BF16 or F16", st_dtype_name(dtype));
    st_status s = st_mkdirs(dir, err);
    if (s) return s;
    size_t esz = st_dtype_size(dtype), total = m->n_params * esz;
    float *host = malloc(m->n_params * sizeof(float));
    void *conv = dtype == ST_F32 ? (void *)host : malloc(total ? total : 1);
    st_tensor_out *outs = calloc((size_t)m->n_tensors, sizeof *outs);
    int *shard_of = calloc((size_t)m->n_tensors, sizeof *shard_of);
    if (!host || !conv || !outs || !shard_of) {
        s = st_errf(err, ST_ERR_NOMEM, "out of memory saving %s", dir);
        goto done;
    }
    m->be->ops->copy_to_host(m->be, host, m->params, m->n_params * sizeof(float));
    if (dtype != ST_F32) st_convert(conv, dtype, host, ST_F32, m->n_params);
    /* shards: tensors in layout order, a new shard when the next tensor would overflow */
    int n_shards = 1;
    size_t in_shard = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const st_param_info *t = &m->tensors[i];
        size_t bytes = t->numel * esz;
        if (max_shard_bytes && in_shard > 0 && in_shard + bytes > max_shard_bytes) {
            n_shards++;
            in_shard = 0;
        }
        in_shard += bytes;
        shard_of[i] = n_shards - 1;
        outs[i] = (st_tensor_out){.name = t->name, .dtype = dtype, .ndim = t->ndim,
                                  .data = (const char *)conv + t->offset * esz};
        outs[i].shape[0] = t->shape[0];
        outs[i].shape[1] = t->shape[1];
    }
    const char *meta[] = {"format", "pt"};
    char path[4096];
    if (n_shards == 1) {
        snprintf(path, sizeof path, "%s/%s", dir, SINGLE_NAME);
        s = st_safetensors_write(path, outs, m->n_tensors, meta, 1, err);
        if (!s) remove_old_shards(dir);
    } else {
        json_object *idx = json_object_new_object(), *md = json_object_new_object(), *wm = json_object_new_object();
        json_object_object_add(md, "total_size", json_object_new_int64((int64_t)total));
        json_object_object_add(idx, "metadata", md);
        json_object_object_add(idx, "weight_map", wm);
        for (int k = 0, first = 0; k < n_shards && !s; k++) {
            int last = first;
            while (last < m->n_tensors && shard_of[last] == k) last++;
            char fname[64];
            snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", k + 1, n_shards);
            snprintf(path, sizeof path, "%s/%s", dir, fname);
            s = st_safetensors_write(path, outs + first, last - first, meta, 1, err);
            for (int i = first; i < last; i++) json_object_object_add(wm, outs[i].name, json_object_new_string(fname));
            first = last;
        }
        if (!s) {
            snprintf(path, sizeof path, "%s/%s", dir, INDEX_NAME);
            s = st_write_text(path, json_object_to_json_string_ext(idx, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED |
                                                                    JSON_C_TO_STRING_NOSLASHESCAPE), err);
        }
        json_object_put(idx);
        if (!s) {
            snprintf(path, sizeof path, "%s/%s", dir, SINGLE_NAME);
            unlink(path); /* a stale single file next to an index would confuse other readers */
        }
    }
    if (!s) {
        char *cfg = st_hf_config_to_json(&m->cfg, torch_dtype_name(dtype));
        snprintf(path, sizeof path, "%s/config.json", dir);
        /* NULL: a non-finite number (JSON cannot hold one), or out of memory */
        s = cfg ? st_write_text(path, cfg, err)
                : st_errf(err, ST_ERR_INVALID, "%s not written: the model configuration holds a non-finite number "
                          "(rms_norm_eps, rope_theta or rope_scaling), which JSON cannot hold; or memory ran out", path);
        free(cfg);
    }
done:
    if (conv != host) free(conv);
    free(host);
    free(outs);
    free(shard_of);
    return s;
}

st_status st_llama_save_safetensors(const st_llama_model *m, const char *path, st_err *err) {
    float *host = malloc(m->n_params * sizeof(float));
    st_tensor_out *outs = calloc((size_t)m->n_tensors, sizeof *outs);
    char *cfg = st_hf_config_to_json(&m->cfg, "float32");
    st_status s;
    if (!host || !outs || !cfg) {
        s = !cfg && host && outs ? st_errf(err, ST_ERR_INVALID, "%s not written: the model configuration holds a "
                                           "non-finite number, which JSON cannot hold", path)
                                 : st_errf(err, ST_ERR_NOMEM, "out of memory saving %s", path);
    } else {
        m->be->ops->copy_to_host(m->be, host, m->params, m->n_params * sizeof(float));
        for (int i = 0; i < m->n_tensors; i++) {
            const st_param_info *t = &m->tensors[i];
            outs[i] = (st_tensor_out){.name = t->name, .dtype = ST_F32, .ndim = t->ndim, .data = host + t->offset};
            outs[i].shape[0] = t->shape[0];
            outs[i].shape[1] = t->shape[1];
        }
        const char *meta[] = {"format", "pt", "model", m->cfg.model_type, "config", cfg};
        s = st_safetensors_write(path, outs, m->n_tensors, meta, 3, err);
    }
    free(cfg);
    free(outs);
    free(host);
    return s;
}

st_status st_llama_load_safetensors(st_llama_model *m, const char *path, st_err *err) {
    st_safetensors *st;
    st_status s = st_safetensors_open(&st, path, err);
    if (s) return s;
    for (int i = 0; !s && i < st_safetensors_count(st); i++) {
        const char *name = st_safetensors_entry(st, i)->name;
        if (!st_llama_find_tensor(m, name) && !ignorable(m, name))
            s = st_errf(err, ST_ERR_SHAPE, "%s: tensor '%s' is not part of this configuration", path, name);
    }
    st_safetensors **src = s ? NULL : malloc((size_t)m->n_tensors * sizeof *src);
    if (!s && !src) s = st_errf(err, ST_ERR_NOMEM, "out of memory loading %s", path);
    for (int i = 0; i < m->n_tensors && !s; i++) {
        const st_param_info *t = &m->tensors[i];
        if (!st_safetensors_find(st, t->name)) {
            s = st_errf(err, ST_ERR_SHAPE, "%s: tensor '%s' is missing (the configuration needs it)", path, t->name);
            break;
        }
        src[i] = st;
    }
    if (!s) s = model_params_load(m->be, m->params, m->tensors, m->n_tensors, src, NULL, err);
    free(src);
    st_safetensors_close(st);
    return s;
}
