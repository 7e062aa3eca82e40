/* llama_model.c - the Llama family behind the architecture-independent st_model
 * interface (include/strata/model.h), so the training loop, benchmarks and checkpoints
 * can drive it as they drive GPT-2. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"
#include "strata/llama.h"

static st_llama_model *as_llama(const st_model *m) { return (st_llama_model *)m->impl; }

static int is_file_path(const char *path) {
    size_t n = strlen(path), k = strlen(".safetensors");
    return n >= k && !strcmp(path + n - k, ".safetensors");
}

static st_status l_alloc_acts(st_model *m, int B, int T, st_err *err) {
    st_status s = st_llama_alloc_acts(as_llama(m), B, T, err);
    m->row_losses = st_llama_row_losses(as_llama(m));
    return s;
}
static float l_forward(st_model *m, const int32_t *in, const int32_t *tg, float dloss) {
    return st_llama_forward_hooked(as_llama(m), in, tg, dloss, m->weight_hook, m->weight_hook_ctx);
}
static void l_backward(st_model *m) { st_llama_backward_hooked(as_llama(m), m->grad_hook, m->grad_hook_ctx); }
static void l_init_random(st_model *m, uint64_t seed) { st_llama_init_random(as_llama(m), seed); }
static st_status l_save(const st_model *m, const char *path, st_err *err) {
    return is_file_path(path) ? st_llama_save_safetensors(as_llama(m), path, err)
                              : st_llama_save_hf(as_llama(m), path, ST_F32, 0, err);
}
static st_status l_load(st_model *m, const char *path, st_err *err) {
    return is_file_path(path) ? st_llama_load_safetensors(as_llama(m), path, err) : st_llama_load_hf(as_llama(m), path, err);
}
static double l_flops(const st_model *m, int T) { return st_llama_flops_per_token(&as_llama(m)->cfg, T); }
static void l_describe(const st_model *m, char *buf, size_t cap) {
    const st_llama_config *c = &as_llama(m)->cfg;
    snprintf(buf, cap, "%s L=%d C=%d NH=%d NKV=%d hs=%d F=%d V=%d maxT=%d%s%s%s", c->model_type, c->n_layer,
             c->hidden_size, c->n_head, c->n_kv_head, c->head_dim, c->intermediate_size, c->vocab_size, c->max_seq,
             c->qkv_bias ? " qkv-bias" : "", c->qk_norm ? " qk-norm" : "", c->tie_word_embeddings ? " tied" : "");
}
static void l_destroy(st_model *m) {
    st_llama_free(as_llama(m));
    free(m->impl);
    free(m);
}

static int l_step_gemms(const st_model *m, int B, int T, st_gemm_shape *out, int max) {
    st_llama_gemm g[ST_LLAMA_STEP_GEMMS];
    st_llama_step_gemms(&st_model_llama(m)->cfg, B, T, g);
    int n = ST_LLAMA_STEP_GEMMS < max ? ST_LLAMA_STEP_GEMMS : max;
    for (int i = 0; i < n; i++) out[i] = (st_gemm_shape){g[i].M, g[i].N, g[i].K, g[i].ta, g[i].tb, g[i].count};
    return n;
}

static st_status l_get_arch(const st_model *m, st_arch **out, st_err *err) {
    return st_arch_llama(out, &as_llama(m)->cfg, err);
}

static st_status l_save_hf(const st_model *m, const char *dir, st_dtype dtype, st_err *err) {
    return st_llama_save_hf(as_llama(m), dir, dtype, 0, err);
}
static const float *l_logits(const st_model *m) { return st_llama_logits(as_llama(m)); }
static void l_decode_info(const st_model *m, st_decode_info *d) {
    const st_llama_config *c = &as_llama(m)->cfg;
    memset(d, 0, sizeof *d);
    d->kind = ST_DECODE_RMS_SWIGLU;
    d->n_layer = c->n_layer, d->n_embd = c->hidden_size, d->n_head = c->n_head, d->n_kv_head = c->n_kv_head;
    d->head_size = c->head_dim;
    d->mlp_act_width = c->intermediate_size, d->mlp_width = 2 * c->intermediate_size;
    d->eps = (float)c->rms_norm_eps;
    d->sliding_window = c->sliding_window;
}
static void l_rope_tables(const st_model *m, int max_T, float *cos, float *sin) {
    st_llama_rope_tables(&as_llama(m)->cfg, max_T, cos, sin);
}

static st_status l_set_docs(st_model *m, const int32_t *positions, const int32_t *doc_start, st_err *err) {
    return st_llama_set_docs(as_llama(m), positions, doc_start, err);
}

static const st_model_ops llama_ops = {"llama", l_alloc_acts, l_forward, l_backward, l_init_random, l_save,
                                       l_load, l_flops, l_describe, l_destroy, l_step_gemms, l_get_arch,
                                       l_save_hf, l_logits, l_decode_info, l_rope_tables, l_set_docs};

st_llama_model *st_model_llama(const st_model *m) { return m && m->ops == &llama_ops ? as_llama(m) : NULL; }

st_status st_model_create_llama(st_model **out, const st_llama_config *cfg, st_backend *be, st_err *err) {
    return model_create_llama(out, cfg, 1, be, err);
}

st_status model_create_llama(st_model **out, const st_llama_config *cfg, int with_grads, st_backend *be,
                             st_err *err) {
    *out = NULL;
    st_llama_model *l = calloc(1, sizeof *l);
    st_model *m = calloc(1, sizeof *m);
    if (!l || !m) {
        free(l);
        free(m);
        return st_errf(err, ST_ERR_NOMEM, "out of memory");
    }
    st_status s = model_llama_create(l, cfg, with_grads, be, err);
    if (s) {
        free(l);
        free(m);
        return s;
    }
    m->ops = &llama_ops;
    m->be = be;
    m->n_params = l->n_params;
    m->params = l->params;
    m->grads = l->grads;
    m->n_tensors = l->n_tensors;
    m->tensors = l->tensors;
    m->max_seq = cfg->max_seq;
    m->vocab_size = cfg->vocab_size;
    m->impl = l;
    *out = m;
    return ST_OK;
}

st_status st_model_create_hf(st_model **out, const char *dir, st_backend *be, st_err *err) {
    return model_create_llama_hf(out, dir, 1, be, err);
}

st_status model_create_llama_hf(st_model **out, const char *dir, int with_grads, st_backend *be, st_err *err) {
    *out = NULL;
    st_llama_config cfg;
    st_status s = st_hf_config_read(dir, &cfg, err);
    if (s) return s;
    st_model *m;
    if ((s = model_create_llama(&m, &cfg, with_grads, be, err))) return s;
    if ((s = st_llama_load_hf(as_llama(m), dir, err))) {
        st_model_free(m);
        return s;
    }
    *out = m;
    return ST_OK;
}
