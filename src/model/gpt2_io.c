/* gpt2_io.c - GPT-2 weights to and from safetensors, under Hugging Face's names. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/fileutil.h"
#include "strata/model.h"
#include "strata/safetensors.h"

st_status gpt2_save_safetensors(const gpt2_model *m, const char *path, st_err *err) {
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
    st_status s = safetensors_write(path, outs, m->n_tensors, meta, 7, err);
    free(host);
    free(outs);
    return s;
}

st_status gpt2_load_safetensors(gpt2_model *m, const char *path, st_err *err) {
    st_safetensors *st;
    st_status s = safetensors_open(&st, path, err);
    if (s) return s;
    float *host = malloc(m->n_params * sizeof(float));
    if (!host) {
        safetensors_close(st);
        return st_errf(err, ST_ERR_NOMEM, "out of memory loading %s", path);
    }
    for (int i = 0; i < m->n_tensors && !s; i++) {
        const st_param_info *t = &m->tensors[i];
        const char *name = t->name;
        /* GPT2Model files (the original hub checkpoint) have no "transformer." prefix */
        if (!safetensors_find(st, name) && !strncmp(name, "transformer.", 12) && safetensors_find(st, name + 12))
            name += 12;
        int64_t shape[2] = {t->shape[0], t->shape[1]};
        s = safetensors_read_f32(st, name, host + t->offset, t->numel, shape, t->ndim, err);
    }
    if (!s) m->be->ops->copy_to_device(m->be, m->params, host, m->n_params * sizeof(float));
    free(host);
    safetensors_close(st);
    return s;
}

st_status gpt2_save_hf(const gpt2_model *m, const char *dir, st_err *err) {
    st_status s = st_mkdirs(dir, err);
    if (s) return s;
    char path[4200], json[1024];
    const gpt2_config *c = &m->cfg;
    int n = snprintf(json, sizeof json,
                     "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
                     "  \"vocab_size\": %d,\n  \"n_positions\": %d,\n  \"n_ctx\": %d,\n  \"n_embd\": %d,\n"
                     "  \"n_layer\": %d,\n  \"n_head\": %d,\n  \"layer_norm_epsilon\": 1e-05,\n"
                     "  \"activation_function\": \"gelu_new\",\n  \"tie_word_embeddings\": true,\n"
                     "  \"torch_dtype\": \"float32\"\n}\n",
                     c->vocab_size, c->max_seq, c->max_seq, c->n_embd, c->n_layer, c->n_head);
    snprintf(path, sizeof path, "%s/config.json", dir);
    st_file_writer w;
    if ((s = st_file_writer_open(&w, path, err))) return s;
    s = st_file_writer_put(&w, json, (size_t)n, err);
    if ((s = st_file_writer_close(&w, s, err))) return s;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    return gpt2_save_safetensors(m, path, err);
}
