/* llama.c - Llama-family configurations, and the model that trains in memory: its
 * parameters, gradients and activations on one backend, with st_llama_forward and
 * st_llama_backward run as the block interface's pieces (llama_arch.c, strata/block.h) over
 * them: the embedding, L blocks (block l's activation set and output each in its own
 * place), the final RMSNorm and block.h's generic head. The classifier has one (N,V)
 * buffer that holds the logits and then, in place, their gradient.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"
#include "strata/llama.h"

/* ------------------------------------------------------------------ configs */

static st_llama_config preset(const char *type, int V, int C, int F, int L, int NH, int NKV, int hs, int maxT,
                           double theta, double eps, int qkv_bias, int qk_norm, int tied) {
    st_llama_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.model_type, sizeof c.model_type, "%s", type);
    c.vocab_size = V, c.hidden_size = C, c.intermediate_size = F, c.n_layer = L;
    c.n_head = NH, c.n_kv_head = NKV, c.head_dim = hs, c.max_seq = maxT;
    c.rope_theta = theta, c.rms_norm_eps = eps;
    c.qkv_bias = qkv_bias, c.qk_norm = qk_norm, c.tie_word_embeddings = tied;
    return c;
}

static void with_llama3_rope(st_llama_config *c, double factor, double low, double high, int orig) {
    c->rope_llama3 = 1;
    c->rope_factor = factor, c->rope_low_freq_factor = low, c->rope_high_freq_factor = high;
    c->rope_original_max_pos = orig;
}

st_status st_llama_config_preset(const char *name, st_llama_config *cfg, st_err *err) {
    if (!strcmp(name, "llama-tiny")) {
        /* theta 100 with hs 8 puts the four frequencies in all three Llama-3 bands */
        *cfg = preset("llama", 64, 32, 48, 2, 4, 2, 8, 16, 100.0, 1e-5, 1, 0, 0);
        cfg->o_bias = 1; /* attention_bias: q/k/v and o biases */
        with_llama3_rope(cfg, 8.0, 1.0, 4.0, 32);
    } else if (!strcmp(name, "qwen2-tiny")) {
        *cfg = preset("qwen2", 64, 32, 64, 2, 4, 1, 8, 16, 1e6, 1e-6, 1, 0, 1);
    } else if (!strcmp(name, "qwen3-tiny")) {
        *cfg = preset("qwen3", 64, 32, 64, 2, 4, 2, 16, 16, 1e6, 1e-6, 0, 1, 1);
    } else if (!strcmp(name, "qwen2.5-0.5b")) {
        *cfg = preset("qwen2", 151936, 896, 4864, 24, 14, 2, 64, 32768, 1e6, 1e-6, 1, 0, 1);
    } else if (!strcmp(name, "llama3.2-1b")) {
        *cfg = preset("llama", 128256, 2048, 8192, 16, 32, 8, 64, 131072, 500000.0, 1e-5, 0, 0, 1);
        with_llama3_rope(cfg, 32.0, 1.0, 4.0, 8192);
    } else {
        return st_errf(err, ST_ERR_INVALID, "unknown model '%s'; known Llama-family models: %s", name,
                       st_llama_preset_names());
    }
    return ST_OK;
}

const char *st_llama_preset_names(void) { return "llama-tiny, qwen2-tiny, qwen3-tiny, qwen2.5-0.5b, llama3.2-1b"; }

st_status st_llama_config_validate(const st_llama_config *c, st_err *err) {
#define RANGE(field, lo, hi)                                                                                 \
    if (c->field < (lo) || c->field > (hi))                                                                 \
        return st_errf(err, ST_ERR_INVALID, "llama config: " #field " %d is out of range [%d, %d]", (int)c->field, \
                       (int)(lo), (int)(hi));
    RANGE(vocab_size, 2, 1 << 24)
    RANGE(hidden_size, 1, 65536)
    RANGE(intermediate_size, 1, 1 << 20)
    RANGE(n_layer, 1, 4096)
    RANGE(n_head, 1, 4096)
    RANGE(n_kv_head, 1, 4096)
    RANGE(head_dim, 2, 4096)
    RANGE(max_seq, 1, 1 << 24)
#undef RANGE
    if (c->n_head % c->n_kv_head)
        return st_errf(err, ST_ERR_INVALID, "llama config: num_key_value_heads %d must divide num_attention_heads %d",
                       c->n_kv_head, c->n_head);
    if (c->head_dim % 2)
        return st_errf(err, ST_ERR_INVALID, "llama config: head_dim %d must be even (rotary pairs)", c->head_dim);
    if (!(c->rope_theta > 0))
        return st_errf(err, ST_ERR_INVALID, "llama config: rope_theta %g must be > 0", c->rope_theta);
    if (!(c->rms_norm_eps >= 0))
        return st_errf(err, ST_ERR_INVALID, "llama config: rms_norm_eps %g must be >= 0", c->rms_norm_eps);
    if (c->rope_llama3 && !(c->rope_factor > 0 && c->rope_high_freq_factor > c->rope_low_freq_factor &&
                            c->rope_low_freq_factor > 0 && c->rope_original_max_pos > 0))
        return st_errf(err, ST_ERR_INVALID, "llama config: rope_scaling (llama3) needs factor > 0, "
                       "high_freq_factor > low_freq_factor > 0 and original_max_position_embeddings > 0");
    return ST_OK;
}

st_status st_llama_config_apply_overrides(st_llama_config *c, const st_model_overrides *ov, st_err *err) {
    if (!ov) return ST_OK;
    int derived_hs = c->head_dim * c->n_head == c->hidden_size, mha = c->n_kv_head == c->n_head;
    if (ov->vocab_size > 0) c->vocab_size = ov->vocab_size;
    if (ov->max_seq > 0) c->max_seq = ov->max_seq;
    if (ov->n_layer > 0) c->n_layer = ov->n_layer;
    if (ov->n_head > 0) c->n_head = ov->n_head;
    if (ov->n_embd > 0) c->hidden_size = ov->n_embd;
    if (mha) c->n_kv_head = c->n_head;
    if (derived_hs) {
        if (c->hidden_size % c->n_head)
            return st_errf(err, ST_ERR_INVALID, "n_head %d must divide n_embd %d (head_dim = n_embd / n_head)",
                           c->n_head, c->hidden_size);
        c->head_dim = c->hidden_size / c->n_head;
    }
    if (c->n_head % c->n_kv_head)
        return st_errf(err, ST_ERR_INVALID, "n_head %d is not a multiple of the preset's %d key/value heads",
                       c->n_head, c->n_kv_head);
    return st_llama_config_validate(c, err);
}

/* ------------------------------------------------------------------ activations */

/* The model's own placement of what the block pieces (llama_arch.c) read and write: block
 * l's activation set at sets + l * st_llama_block_act_floats and its output at outs + l * N * C,
 * so an executor that runs the same pieces in the same order computes the same bits. */
struct st_llama_acts {
    st_blocks *blk;  /* the architecture bound to (B, T): token ids, block scratch, rotary tables */
    int32_t *targets;
    float *encoded;  /* (N,C) the embedding's output, block 0's input */
    float *sets;     /* L activation sets */
    float *outs;     /* (L,N,C) block outputs */
    float *lnf, *rstdf, *logits, *losses;
    float *dxn, *dres; /* (N,C) backward: d(final norm output), the residual stream's gradient */
    float *losses_host;
    void *block;
};

/* Lays out the activations for (B,T) from base (NULL: only counts); returns floats used. */
static size_t acts_layout(const st_llama_config *c, int B, int T, st_llama_acts *a, float *base) {
    size_t N = (size_t)B * T, C = c->hidden_size, L = c->n_layer, V = c->vocab_size, off = 0;
    st_llama_acts dummy;
    if (!a) a = &dummy;
#define TAKE(ptr, n) do { (ptr) = base ? (void *)(base + off) : NULL; off += (n); } while (0)
    TAKE(a->targets, N);
    TAKE(a->encoded, N * C);
    TAKE(a->sets, L * st_llama_block_act_floats(c, B, T));
    TAKE(a->outs, L * N * C);
    TAKE(a->lnf, N * C);
    TAKE(a->rstdf, N);
    TAKE(a->logits, N * V);
    TAKE(a->losses, N);
    TAKE(a->dxn, N * C);
    TAKE(a->dres, N * C);
#undef TAKE
    return off;
}

size_t st_llama_act_bytes(const st_llama_config *cfg, int B, int T) {
    return acts_layout(cfg, B, T, NULL, NULL) * sizeof(float) + st_llama_bind_bytes(cfg, B, T);
}

static void acts_free(st_llama_model *m) {
    if (!m->acts) return;
    st_blocks_free(m->acts->blk);
    if (m->acts->block) m->be->ops->dealloc(m->be, m->acts->block);
    free(m->acts->losses_host);
    free(m->acts);
    m->acts = NULL;
}

const float *st_llama_row_losses(const st_llama_model *m) { return m->acts ? m->acts->losses_host : NULL; }

st_status st_llama_alloc_acts(st_llama_model *m, int B, int T, st_err *err) {
    if (B < 1 || T < 1) return st_errf(err, ST_ERR_INVALID, "batch %d and seq %d must be >= 1", B, T);
    if (T > m->cfg.max_seq)
        return st_errf(err, ST_ERR_INVALID, "seq %d exceeds the model's max_position_embeddings %d", T, m->cfg.max_seq);
    if (m->cfg.sliding_window > 0 && T > m->cfg.sliding_window)
        return st_errf(err, ST_ERR_UNSUPPORTED, "seq %d is longer than the checkpoint's sliding_window %d, and strata "
                       "has no sliding-window attention; train with seq <= %d", T, m->cfg.sliding_window,
                       m->cfg.sliding_window);
    acts_free(m);
    size_t bytes = acts_layout(&m->cfg, B, T, NULL, NULL) * sizeof(float);
    st_llama_acts *a = calloc(1, sizeof *a);
    if (!a) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    m->acts = a;
    st_status s = st_blocks_bind(&a->blk, m->arch, m->be, B, T, err);
    if (s) {
        acts_free(m);
        return s;
    }
    a->block = m->be->ops->alloc(m->be, bytes);
    a->losses_host = malloc(sizeof(float) * (size_t)B * T);
    if (!a->block || !a->losses_host) {
        acts_free(m);
        return st_errf(err, ST_ERR_NOMEM, "cannot allocate %.1f MiB of activations for batch %d x seq %d; "
                       "lower batch or seq", st_llama_act_bytes(&m->cfg, B, T) / 1048576.0, B, T);
    }
    acts_layout(&m->cfg, B, T, a, a->block);
    m->B = B;
    m->T = T;
    return ST_OK;
}

st_status st_llama_set_docs(st_llama_model *m, const int32_t *positions, const int32_t *doc_start, st_err *err) {
    if (!m->acts) return st_errf(err, ST_ERR_INVALID, "llama: documents set before the activations");
    return st_blocks_set_docs(m->acts->blk, positions, doc_start, err);
}

/* ------------------------------------------------------------------ lifetime */

st_status st_llama_create(st_llama_model *m, const st_llama_config *cfg, st_backend *be, st_err *err) {
    return model_llama_create(m, cfg, 1, be, err);
}

st_status model_llama_create(st_llama_model *m, const st_llama_config *cfg, int with_grads, st_backend *be,
                             st_err *err) {
    memset(m, 0, sizeof *m);
    st_status s = st_llama_config_validate(cfg, err);
    if (s) return s;
    if (!be->ops->rmsnorm_forward || !be->ops->attention_gqa_forward)
        return st_errf(err, ST_ERR_UNSUPPORTED, "backend '%s' has no Llama-family ops", be->ops->name);
    /* the layout and tensor table are the architecture's (llama_arch.c), one for both */
    if ((s = st_arch_llama(&m->arch, cfg, err))) return s;
    const st_arch_layout *ly = &m->arch->lay;
    m->cfg = *cfg;
    m->be = be;
    m->n_tensors = ly->n_tensors;
    m->tensors = ly->tensors;
    m->block_offset0 = ly->block_offset0;
    m->block_numel = ly->block_numel;
    m->n_params = ly->n_params;
    m->params = model_params_alloc(be, m->n_params, with_grads, &m->params_untouched);
    if (with_grads) m->grads = be->ops->alloc(be, m->n_params * sizeof(float));
    if (!m->params || (with_grads && !m->grads)) {
        size_t n = m->n_params;
        st_llama_free(m);
        return st_errf(err, ST_ERR_NOMEM, "cannot allocate %.1f MiB for parameters%s",
                       (with_grads ? 2.0 : 1.0) * n * sizeof(float) / 1048576.0, with_grads ? " and gradients" : "");
    }
    return ST_OK;
}

void st_llama_free(st_llama_model *m) {
    if (!m->be) return;
    acts_free(m);
    model_params_free(m->be, m->params, m->n_params, m->params_untouched);
    if (m->grads) m->be->ops->dealloc(m->be, m->grads);
    st_arch_free(m->arch);
    memset(m, 0, sizeof *m);
}

const st_param_info *st_llama_find_tensor(const st_llama_model *m, const char *name) {
    return st_params_find(m->tensors, m->n_tensors, name);
}

void st_llama_init_random(st_llama_model *m, uint64_t seed) {
    /* memory that is the host's takes the draws in place; a device's through one staging buffer */
    st_host_stage hs;
    if (st_host_stage_open(&hs, m->be, m->n_params, NULL)) return;
    float *host = st_host_stage_at(&hs, m->params);
    m->arch->ops->init(m->arch, host, seed);
    st_host_stage_put(&hs, m->params, m->n_params);
    st_host_stage_close(&hs);
}

/* ------------------------------------------------------------------ forward / backward */

/* The block interface's pieces (strata/block.h) over the model's own vectors, in the
 * order an executor calls them; the head is block.h's generic one. */

#define OPS (m->be->ops)

float st_llama_forward(st_llama_model *m, const int32_t *inputs, const int32_t *targets, float dloss) {
    return st_llama_forward_hooked(m, inputs, targets, dloss, NULL, NULL);
}

float st_llama_forward_hooked(st_llama_model *m, const int32_t *inputs, const int32_t *targets, float dloss,
                           void (*hook)(void *ctx, size_t offset, size_t n), void *ctx) {
    st_llama_acts *a = m->acts;
    st_backend *be = m->be;
    const st_arch_ops *ao = m->arch->ops;
    const st_arch_layout *ly = &m->arch->lay;
    int L = ly->n_blocks, C = ly->n_embd, V = ly->vocab_size, N = m->B * m->T;
    size_t NC = (size_t)N * C, set = ao->block_act_floats(m->arch, m->B, m->T);
    if (targets) OPS->copy_to_device(be, a->targets, targets, sizeof(int32_t) * N);
    size_t post = ly->block_offset0 + (size_t)L * ly->block_numel;
    if (hook) hook(ctx, 0, ly->block_offset0);
    ao->embed_forward(a->blk, m->params, inputs, a->encoded);
    a->blk->hook = m->hook;
    for (int l = 0; l < L; l++) {
        size_t off = ly->block_offset0 + (size_t)l * ly->block_numel;
        if (hook) hook(ctx, off, ly->block_numel);
        if (m->hook) m->hook->layer = l;
        ao->block_forward(a->blk, m->params + off, l ? a->outs + (l - 1) * NC : a->encoded, a->sets + l * set,
                          a->outs + l * NC);
    }
    if (hook) hook(ctx, post, m->n_params - post);
    ao->norm_forward(a->blk, m->params + ly->norm_offset, a->outs + (L - 1) * NC, a->lnf, a->rstdf);
    OPS->matmul_forward(be, a->logits, a->lnf, m->params + ly->head_offset, NULL, N, C, V, ST_W_OUT_IN);
    if (!targets) { m->mean_loss = NAN; return NAN; }
    OPS->crossentropy_forward_backward(be, a->logits, a->losses, a->targets, N, V, dloss);
    OPS->copy_to_host(be, a->losses_host, a->losses, sizeof(float) * N);
    double sum = 0;
    int counted = 0;
    for (int i = 0; i < N; i++)
        if (targets[i] >= 0) { sum += a->losses_host[i]; counted++; }
    m->mean_loss = counted ? (float)(sum / counted) : 0.0f;
    return m->mean_loss;
}

void st_llama_backward(st_llama_model *m) { st_llama_backward_hooked(m, NULL, NULL); }

void st_llama_backward_hooked(st_llama_model *m, void (*hook)(void *ctx, size_t offset, size_t n), void *ctx) {
    st_llama_acts *a = m->acts;
    st_backend *be = m->be;
    const st_arch_ops *ao = m->arch->ops;
    const st_arch_layout *ly = &m->arch->lay;
    int L = ly->n_blocks, C = ly->n_embd, V = ly->vocab_size, N = m->B * m->T;
    size_t NC = (size_t)N * C, set = ao->block_act_floats(m->arch, m->B, m->T);
    /* frozen base (LoRA): no gradient of the head, the norms' to the hook's scratch, none of the embedding */
    int frozen = m->hook && m->hook->frozen;
    /* no gradient vector of the base: the hook says where each trainable's goes (POET-X) */
    st_linear_hook *ga = !frozen && !m->grads && m->hook && m->hook->grad_at ? m->hook : NULL;
    float *head_g = frozen ? NULL : ga ? ga->grad_at(ga, -1, ly->head_offset) : m->grads + ly->head_offset;
    float *norm_g = frozen ? m->hook->norm_scratch
                    : ga   ? ga->grad_at(ga, -1, ly->norm_offset)
                           : m->grads + ly->norm_offset;
    float *emb_g = frozen ? NULL : ga ? ga->grad_at(ga, -1, 0) : m->grads;
    a->blk->hook = m->hook;
    /* classifier: logits already hold dlogits; the head's gradient lands in the embedding's when tied */
    OPS->memset0(be, a->dxn, NC * sizeof(float));
    OPS->matmul_backward(be, a->dxn, head_g, NULL, a->logits, a->lnf, m->params + ly->head_offset, N, C, V,
                         ST_W_OUT_IN);
    OPS->memset0(be, a->dres, NC * sizeof(float));
    ao->norm_backward(a->blk, a->dres, norm_g, a->dxn, a->outs + (L - 1) * NC, m->params + ly->norm_offset, a->rstdf);
    for (int l = L - 1; l >= 0; l--) {
        size_t off = ly->block_offset0 + l * ly->block_numel;
        if (m->hook) m->hook->layer = l;
        ao->block_backward(a->blk, m->params + off, frozen || !m->grads ? NULL : m->grads + off,
                           l ? a->outs + (l - 1) * NC : a->encoded, a->sets + l * set, a->dres);
        if (hook) hook(ctx, off, ly->block_numel);
    }
    if (emb_g) ao->embed_backward(a->blk, emb_g, a->dres);
}

void st_llama_zero_grad(st_llama_model *m) {
    if (m->grads) OPS->memset0(m->be, m->grads, m->n_params * sizeof(float)); /* frozen (LoRA): freed */
}

const float *st_llama_logits(const st_llama_model *m) { return m->acts ? m->acts->logits : NULL; }

double st_llama_flops_per_token(const st_llama_config *c, int T) {
    return c->n_layer * st_llama_block_flops_per_token(c, T) + 6.0 * c->vocab_size * (double)c->hidden_size;
}

void st_llama_step_gemms(const st_llama_config *c, int B, int T, st_llama_gemm out[ST_LLAMA_STEP_GEMMS]) {
    int N = B * T, C = c->hidden_size, F = c->intermediate_size, V = c->vocab_size, L = c->n_layer;
    int Q = c->n_head * c->head_dim, W = Q + 2 * c->n_kv_head * c->head_dim;
    /* (OC, IC, count) of each nn.Linear-layout product: out = inp @ w^T */
    const int lin[5][3] = {{W, C, L}, {C, Q, L}, {2 * F, C, L}, {C, F, L}, {V, C, 1}};
    for (int i = 0; i < 5; i++) {
        int OC = lin[i][0], IC = lin[i][1], n = lin[i][2];
        out[i] = (st_llama_gemm){N, OC, IC, 0, 1, n};          /* forward: inp (N,IC) w^T */
        out[5 + i] = (st_llama_gemm){N, IC, OC, 0, 0, n};      /* dinp (N,IC) = dout (N,OC) w (OC,IC) */
        out[10 + i] = (st_llama_gemm){OC, IC, N, 1, 0, n};     /* dw (OC,IC) = dout^T inp */
    }
}
