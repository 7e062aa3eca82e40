/* llama.c - Llama-family decoder forward and backward as a sequence of backend ops.
 *
 * Shapes: B batch, T time, C hidden, NH query heads, NKV key/value heads, hs head_dim,
 * W = (NH + 2 NKV) hs the packed q|k|v width, F intermediate, V vocabulary, L layers,
 * N = B*T. Per layer the forward keeps what backward needs: ln1 (+rstd), qkv (q and k
 * after rope; with q/k norm also the raw projection), atty, lse, res2, ln2 (+rstd),
 * gate|up, the SwiGLU output and res3. Attention keeps only out and lse; rope is undone
 * on the gradient in place, so the pre-rope q and k are not kept. The classifier has one
 * (N,V) buffer that holds the logits and then, in place, their gradient.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/llama.h"

/* ------------------------------------------------------------------ configs */

static llama_config preset(const char *type, int V, int C, int F, int L, int NH, int NKV, int hs, int maxT,
                           double theta, double eps, int qkv_bias, int qk_norm, int tied) {
    llama_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.model_type, sizeof c.model_type, "%s", type);
    c.vocab_size = V, c.hidden_size = C, c.intermediate_size = F, c.n_layer = L;
    c.n_head = NH, c.n_kv_head = NKV, c.head_dim = hs, c.max_seq = maxT;
    c.rope_theta = theta, c.rms_norm_eps = eps;
    c.qkv_bias = qkv_bias, c.qk_norm = qk_norm, c.tie_word_embeddings = tied;
    return c;
}

static void with_llama3_rope(llama_config *c, double factor, double low, double high, int orig) {
    c->rope_llama3 = 1;
    c->rope_factor = factor, c->rope_low_freq_factor = low, c->rope_high_freq_factor = high;
    c->rope_original_max_pos = orig;
}

st_status llama_config_preset(const char *name, llama_config *cfg, st_err *err) {
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
                       llama_preset_names());
    }
    return ST_OK;
}

const char *llama_preset_names(void) { return "llama-tiny, qwen2-tiny, qwen3-tiny, qwen2.5-0.5b, llama3.2-1b"; }

st_status llama_config_validate(const llama_config *c, st_err *err) {
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

st_status llama_config_apply_overrides(llama_config *c, const st_model_overrides *ov, st_err *err) {
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
    return llama_config_validate(c, err);
}

/* ------------------------------------------------------------------ layout */

enum { BLK_LN1, BLK_QW, BLK_KW, BLK_VW, BLK_QB, BLK_KB, BLK_VB, BLK_QN, BLK_KN, BLK_OW, BLK_OB, BLK_LN2,
       BLK_GATE, BLK_UP, BLK_DOWN, BLK_COUNT };
static const char *const blk_names[BLK_COUNT] = {
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.q_proj.bias",  "self_attn.k_proj.bias",   "self_attn.v_proj.bias",   "self_attn.q_norm.weight",
    "self_attn.k_norm.weight", "self_attn.o_proj.weight", "self_attn.o_proj.bias",  "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",   "mlp.up_proj.weight",      "mlp.down_proj.weight"};

/* Shape (rows, cols) of block entry i; rows 0 when the configuration has no such tensor,
 * cols 0 for a vector. */
static void blk_shape(const llama_config *c, int i, int *rows, int *cols) {
    int C = c->hidden_size, hs = c->head_dim, Q = c->n_head * hs, K = c->n_kv_head * hs, F = c->intermediate_size;
    int r = 0, k = 0;
    switch (i) {
    case BLK_LN1: case BLK_LN2: r = C; break;
    case BLK_QW: r = Q, k = C; break;
    case BLK_KW: case BLK_VW: r = K, k = C; break;
    case BLK_QB: r = c->qkv_bias ? Q : 0; break;
    case BLK_KB: case BLK_VB: r = c->qkv_bias ? K : 0; break;
    case BLK_QN: case BLK_KN: r = c->qk_norm ? hs : 0; break;
    case BLK_OW: r = C, k = Q; break;
    case BLK_OB: r = c->o_bias ? C : 0; break;
    case BLK_GATE: case BLK_UP: r = F, k = C; break;
    case BLK_DOWN: r = C, k = F; break;
    }
    *rows = r, *cols = k;
}

static size_t blk_numel(const llama_config *c) {
    size_t n = 0;
    for (int i = 0; i < BLK_COUNT; i++) {
        int r, k;
        blk_shape(c, i, &r, &k);
        n += (size_t)r * (k ? k : 1);
    }
    return n;
}

size_t llama_param_count(const llama_config *c) {
    size_t VC = (size_t)c->vocab_size * c->hidden_size;
    return VC + (size_t)c->n_layer * blk_numel(c) + c->hidden_size + (c->tie_word_embeddings ? 0 : VC);
}

/* Pointers to a block's tensors inside base (params or grads); absent ones are NULL. */
typedef struct blk_ptrs {
    float *t[BLK_COUNT];
} blk_ptrs;

static blk_ptrs block_at(const llama_model *m, float *base, int l) {
    blk_ptrs b;
    float *p = base + m->block_offset0 + (size_t)l * m->block_numel;
    for (int i = 0; i < BLK_COUNT; i++) {
        int r, k;
        blk_shape(&m->cfg, i, &r, &k);
        b.t[i] = r ? p : NULL;
        p += (size_t)r * (k ? k : 1);
    }
    return b;
}

static void add_tensor(llama_model *m, const char *name, size_t *off, int d0, int d1) {
    st_param_info *t = &m->tensors[m->n_tensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->offset = *off;
    t->ndim = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1 ? d1 : 1;
    t->numel = (size_t)d0 * (d1 ? (size_t)d1 : 1);
    t->role = st_role_from_name(name);
    *off += t->numel;
}

/* ------------------------------------------------------------------ activations */

struct llama_acts {
    int32_t *inputs, *targets;
    float *encoded;                    /* (N,C) */
    float *ln1, *rstd1, *qkv, *qkvn, *rstdq, *rstdk, *atty, *lse, *res2, *ln2, *rstd2, *gu, *hmlp, *res3;
    float *lnf, *rstdf, *logits, *losses, *scratch;
    float *dres, *dC, *dA, *dF, *dGU, *dQKV, *dQKVn;
    float *cos, *sin;                  /* (T, hs/2) */
    float *losses_host;
    void *block;
};

/* Lays out the activations for (B,T) from base (NULL: only counts); returns floats used. */
static size_t acts_layout(const llama_config *c, int B, int T, llama_acts *a, float *base) {
    size_t N = (size_t)B * T, C = c->hidden_size, L = c->n_layer, NH = c->n_head, NKV = c->n_kv_head;
    size_t hs = c->head_dim, W = (NH + 2 * NKV) * hs, Q = NH * hs, F = c->intermediate_size;
    size_t V = c->vocab_size, off = 0;
    llama_acts dummy;
    if (!a) a = &dummy;
#define TAKE(ptr, n) do { (ptr) = base ? (void *)(base + off) : NULL; off += (n); } while (0)
    TAKE(a->inputs, N);
    TAKE(a->targets, N);
    TAKE(a->encoded, N * C);
    TAKE(a->ln1, L * N * C);
    TAKE(a->rstd1, L * N);
    TAKE(a->qkv, L * N * W);
    if (c->qk_norm) {
        TAKE(a->qkvn, L * N * W);
        TAKE(a->rstdq, L * N * NH);
        TAKE(a->rstdk, L * N * NKV);
    } else {
        a->qkvn = a->rstdq = a->rstdk = NULL;
    }
    TAKE(a->atty, L * N * Q);
    TAKE(a->lse, L * NH * N);
    TAKE(a->res2, L * N * C);
    TAKE(a->ln2, L * N * C);
    TAKE(a->rstd2, L * N);
    TAKE(a->gu, L * N * 2 * F);
    TAKE(a->hmlp, L * N * F);
    TAKE(a->res3, L * N * C);
    TAKE(a->lnf, N * C);
    TAKE(a->rstdf, N);
    TAKE(a->logits, N * V);
    TAKE(a->losses, N);
    TAKE(a->scratch, N * C);
    TAKE(a->dres, N * C);
    TAKE(a->dC, N * C);
    TAKE(a->dA, N * Q);
    TAKE(a->dF, N * F);
    TAKE(a->dGU, N * 2 * F);
    TAKE(a->dQKV, N * W);
    if (c->qk_norm) TAKE(a->dQKVn, N * W);
    else a->dQKVn = NULL;
    TAKE(a->cos, (size_t)T * hs / 2);
    TAKE(a->sin, (size_t)T * hs / 2);
#undef TAKE
    return off;
}

size_t llama_act_bytes(const llama_config *cfg, int B, int T) { return acts_layout(cfg, B, T, NULL, NULL) * 4; }

/* Rotary tables (T, hs/2) in double, rounded once: Hugging Face's default inv_freq =
 * theta^(-2i/hs), with Llama 3's rescaling of the low and medium frequencies. */
static void rope_tables(const llama_config *c, int T, float *cos_t, float *sin_t) {
    int hs = c->head_dim, half = hs / 2;
    for (int i = 0; i < half; i++) {
        double inv = 1.0 / pow(c->rope_theta, (2.0 * i) / hs);
        if (c->rope_llama3) {
            double orig = c->rope_original_max_pos, lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor;
            double wl = 2.0 * M_PI / inv;
            if (wl > orig / lo) {
                inv /= c->rope_factor;
            } else if (!(wl < orig / hi)) {
                double smooth = (orig / wl - lo) / (hi - lo);
                inv = (1.0 - smooth) * inv / c->rope_factor + smooth * inv;
            }
        }
        for (int t = 0; t < T; t++) {
            cos_t[(size_t)t * half + i] = (float)cos(t * inv);
            sin_t[(size_t)t * half + i] = (float)sin(t * inv);
        }
    }
}

/* The same tables for other users of the forward (the KV-cached decoder, strata/generate.h). */
void llama_rope_tables(const llama_config *c, int T, float *cos_t, float *sin_t);
void llama_rope_tables(const llama_config *c, int T, float *cos_t, float *sin_t) { rope_tables(c, T, cos_t, sin_t); }

static void acts_free(llama_model *m) {
    if (!m->acts) return;
    m->be->ops->dealloc(m->be, m->acts->block);
    free(m->acts->losses_host);
    free(m->acts);
    m->acts = NULL;
}

st_status llama_alloc_acts(llama_model *m, int B, int T, st_err *err) {
    if (B < 1 || T < 1) return st_errf(err, ST_ERR_INVALID, "batch %d and seq %d must be >= 1", B, T);
    if (T > m->cfg.max_seq)
        return st_errf(err, ST_ERR_INVALID, "seq %d exceeds the model's max_position_embeddings %d", T, m->cfg.max_seq);
    if (m->cfg.sliding_window > 0 && T > m->cfg.sliding_window)
        return st_errf(err, ST_ERR_UNSUPPORTED, "seq %d is longer than the checkpoint's sliding_window %d, and strata "
                       "has no sliding-window attention; train with seq <= %d", T, m->cfg.sliding_window,
                       m->cfg.sliding_window);
    acts_free(m);
    size_t bytes = llama_act_bytes(&m->cfg, B, T);
    llama_acts *a = calloc(1, sizeof *a);
    if (!a) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    a->block = m->be->ops->alloc(m->be, bytes);
    a->losses_host = malloc(sizeof(float) * (size_t)B * T);
    float *host_cs = malloc(sizeof(float) * (size_t)T * m->cfg.head_dim);
    if (!a->block || !a->losses_host || !host_cs) {
        if (a->block) m->be->ops->dealloc(m->be, a->block);
        free(a->losses_host);
        free(a);
        free(host_cs);
        return st_errf(err, ST_ERR_NOMEM, "cannot allocate %.1f MiB of activations for batch %d x seq %d; "
                       "lower batch or seq", bytes / 1048576.0, B, T);
    }
    acts_layout(&m->cfg, B, T, a, a->block);
    size_t nt = (size_t)T * m->cfg.head_dim / 2;
    rope_tables(&m->cfg, T, host_cs, host_cs + nt);
    m->be->ops->copy_to_device(m->be, a->cos, host_cs, nt * sizeof(float));
    m->be->ops->copy_to_device(m->be, a->sin, host_cs + nt, nt * sizeof(float));
    free(host_cs);
    m->acts = a;
    m->B = B;
    m->T = T;
    return ST_OK;
}

/* ------------------------------------------------------------------ lifetime */

st_status llama_create(llama_model *m, const llama_config *cfg, st_backend *be, st_err *err) {
    memset(m, 0, sizeof *m);
    st_status s = llama_config_validate(cfg, err);
    if (s) return s;
    if (!be->ops->rmsnorm_forward || !be->ops->attention_gqa_forward)
        return st_errf(err, ST_ERR_UNSUPPORTED, "backend '%s' has no Llama-family ops", be->ops->name);
    m->cfg = *cfg;
    m->be = be;
    int L = cfg->n_layer, C = cfg->hidden_size, V = cfg->vocab_size;
    m->tensors = calloc((size_t)L * BLK_COUNT + 3, sizeof *m->tensors);
    if (!m->tensors) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    size_t off = 0;
    add_tensor(m, "model.embed_tokens.weight", &off, V, C);
    m->block_offset0 = off;
    for (int l = 0; l < L; l++) {
        for (int i = 0; i < BLK_COUNT; i++) {
            int r, k;
            blk_shape(cfg, i, &r, &k);
            if (!r) continue;
            char name[96];
            snprintf(name, sizeof name, "model.layers.%d.%s", l, blk_names[i]);
            add_tensor(m, name, &off, r, k);
        }
    }
    m->block_numel = blk_numel(cfg);
    add_tensor(m, "model.norm.weight", &off, C, 0);
    if (!cfg->tie_word_embeddings) add_tensor(m, "lm_head.weight", &off, V, C);
    m->n_params = off;
    m->params = be->ops->alloc(be, off * sizeof(float));
    m->grads = be->ops->alloc(be, off * sizeof(float));
    if (!m->params || !m->grads) {
        llama_free(m);
        return st_errf(err, ST_ERR_NOMEM, "cannot allocate %.1f MiB for parameters and gradients",
                       2.0 * off * sizeof(float) / 1048576.0);
    }
    return ST_OK;
}

void llama_free(llama_model *m) {
    if (!m->be) return;
    acts_free(m);
    if (m->params) m->be->ops->dealloc(m->be, m->params);
    if (m->grads) m->be->ops->dealloc(m->be, m->grads);
    free(m->tensors);
    memset(m, 0, sizeof *m);
}

const st_param_info *llama_find_tensor(const llama_model *m, const char *name) {
    return st_params_find(m->tensors, m->n_tensors, name);
}

void llama_init_random(llama_model *m, uint64_t seed) {
    float *host = malloc(m->n_params * sizeof(float));
    if (!host) return;
    st_params_init_by_role(m->tensors, m->n_tensors, host, seed, NULL, 1.0f);
    m->be->ops->copy_to_device(m->be, m->params, host, m->n_params * sizeof(float));
    free(host);
}

/* ------------------------------------------------------------------ forward / backward */

#define OPS (m->be->ops)

static const float *head_weight(const llama_model *m, const float *base) {
    size_t C = m->cfg.hidden_size;
    return m->cfg.tie_word_embeddings ? base : base + m->n_params - (size_t)m->cfg.vocab_size * C;
}

static const float *final_norm(const llama_model *m, const float *base) {
    size_t C = m->cfg.hidden_size, head = m->cfg.tie_word_embeddings ? 0 : (size_t)m->cfg.vocab_size * C;
    return base + m->n_params - head - C;
}

float llama_forward(llama_model *m, const int32_t *inputs, const int32_t *targets, float dloss) {
    llama_acts *a = m->acts;
    st_backend *be = m->be;
    const llama_config *c = &m->cfg;
    int B = m->B, T = m->T, C = c->hidden_size, NH = c->n_head, NKV = c->n_kv_head, hs = c->head_dim;
    int L = c->n_layer, V = c->vocab_size, F = c->intermediate_size, N = B * T;
    int Q = NH * hs, W = (NH + 2 * NKV) * hs;
    size_t NC = (size_t)N * C;
    float eps = (float)c->rms_norm_eps;
    OPS->copy_to_device(be, a->inputs, inputs, sizeof(int32_t) * N);
    if (targets) OPS->copy_to_device(be, a->targets, targets, sizeof(int32_t) * N);
    OPS->embedding_forward(be, a->encoded, a->inputs, m->params, B, T, C);
    for (int l = 0; l < L; l++) {
        blk_ptrs w = block_at(m, m->params, l);
        const float *in = l == 0 ? a->encoded : a->res3 + (l - 1) * NC;
        float *ln1 = a->ln1 + l * NC, *qkv = a->qkv + (size_t)l * N * W, *atty = a->atty + (size_t)l * N * Q;
        float *res2 = a->res2 + l * NC, *ln2 = a->ln2 + l * NC, *res3 = a->res3 + l * NC;
        float *gu = a->gu + (size_t)l * N * 2 * F, *hm = a->hmlp + (size_t)l * N * F;
        float *lse = a->lse + (size_t)l * NH * N;
        OPS->rmsnorm_forward(be, ln1, a->rstd1 + (size_t)l * N, in, w.t[BLK_LN1], N, 1, C, C, eps);
        /* q|k|v weights (and biases) are adjacent: one (W, C) matmul */
        OPS->matmul_forward(be, qkv, ln1, w.t[BLK_QW], w.t[BLK_QB], N, C, W, ST_W_OUT_IN);
        float *qk = qkv; /* the buffer holding the q and k that attention sees */
        if (c->qk_norm) {
            qk = a->qkvn + (size_t)l * N * W;
            OPS->rmsnorm_forward(be, qk, a->rstdq + (size_t)l * N * NH, qkv, w.t[BLK_QN], N, NH, hs, W, eps);
            OPS->rmsnorm_forward(be, qk + Q, a->rstdk + (size_t)l * N * NKV, qkv + Q, w.t[BLK_KN], N, NKV, hs, W,
                                 eps);
        }
        OPS->rope_forward(be, qk, a->cos, a->sin, B, T, NH, hs, W);
        OPS->rope_forward(be, qk + Q, a->cos, a->sin, B, T, NKV, hs, W);
        OPS->attention_gqa_forward(be, atty, lse, qk, qk + Q, qkv + Q + NKV * hs, W, B, T, NH, NKV, hs);
        OPS->matmul_forward(be, a->scratch, atty, w.t[BLK_OW], w.t[BLK_OB], N, Q, C, ST_W_OUT_IN);
        OPS->residual_forward(be, res2, in, a->scratch, (int)NC);
        OPS->rmsnorm_forward(be, ln2, a->rstd2 + (size_t)l * N, res2, w.t[BLK_LN2], N, 1, C, C, eps);
        OPS->matmul_forward(be, gu, ln2, w.t[BLK_GATE], NULL, N, C, 2 * F, ST_W_OUT_IN); /* gate|up adjacent */
        OPS->swiglu_forward(be, hm, gu, N, F);
        OPS->matmul_forward(be, a->scratch, hm, w.t[BLK_DOWN], NULL, N, F, C, ST_W_OUT_IN);
        OPS->residual_forward(be, res3, res2, a->scratch, (int)NC);
    }
    OPS->rmsnorm_forward(be, a->lnf, a->rstdf, a->res3 + (L - 1) * NC, final_norm(m, m->params), N, 1, C, C, eps);
    OPS->matmul_forward(be, a->logits, a->lnf, head_weight(m, m->params), NULL, N, C, V, ST_W_OUT_IN);
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

void llama_backward(llama_model *m) {
    llama_acts *a = m->acts;
    st_backend *be = m->be;
    const llama_config *c = &m->cfg;
    int B = m->B, T = m->T, C = c->hidden_size, NH = c->n_head, NKV = c->n_kv_head, hs = c->head_dim;
    int L = c->n_layer, V = c->vocab_size, F = c->intermediate_size, N = B * T;
    int Q = NH * hs, K = NKV * hs, W = Q + 2 * K;
    size_t NC = (size_t)N * C;

    /* classifier: logits already hold dlogits; the head's gradient lands in dwte when tied */
    OPS->memset0(be, a->dC, NC * sizeof(float));
    OPS->matmul_backward(be, a->dC, (float *)head_weight(m, m->grads), NULL, a->logits, a->lnf,
                         head_weight(m, m->params), N, C, V, ST_W_OUT_IN);
    OPS->memset0(be, a->dres, NC * sizeof(float));
    OPS->rmsnorm_backward(be, a->dres, (float *)final_norm(m, m->grads), a->dC, a->res3 + (L - 1) * NC,
                          final_norm(m, m->params), a->rstdf, N, 1, C, C);
    /* dres: the residual stream's gradient; each branch adds into it */
    for (int l = L - 1; l >= 0; l--) {
        blk_ptrs w = block_at(m, m->params, l), g = block_at(m, m->grads, l);
        const float *in = l == 0 ? a->encoded : a->res3 + (l - 1) * NC;
        float *ln1 = a->ln1 + l * NC, *qkv = a->qkv + (size_t)l * N * W, *atty = a->atty + (size_t)l * N * Q;
        float *res2 = a->res2 + l * NC, *ln2 = a->ln2 + l * NC;
        float *gu = a->gu + (size_t)l * N * 2 * F, *hm = a->hmlp + (size_t)l * N * F;
        float *lse = a->lse + (size_t)l * NH * N;
        /* MLP branch */
        OPS->memset0(be, a->dF, (size_t)N * F * sizeof(float));
        OPS->matmul_backward(be, a->dF, g.t[BLK_DOWN], NULL, a->dres, hm, w.t[BLK_DOWN], N, F, C, ST_W_OUT_IN);
        OPS->memset0(be, a->dGU, (size_t)N * 2 * F * sizeof(float));
        OPS->swiglu_backward(be, a->dGU, gu, a->dF, N, F);
        OPS->memset0(be, a->dC, NC * sizeof(float));
        OPS->matmul_backward(be, a->dC, g.t[BLK_GATE], NULL, a->dGU, ln2, w.t[BLK_GATE], N, C, 2 * F, ST_W_OUT_IN);
        OPS->rmsnorm_backward(be, a->dres, g.t[BLK_LN2], a->dC, res2, w.t[BLK_LN2], a->rstd2 + (size_t)l * N, N, 1,
                              C, C);
        /* attention branch */
        OPS->memset0(be, a->dA, (size_t)N * Q * sizeof(float));
        OPS->matmul_backward(be, a->dA, g.t[BLK_OW], g.t[BLK_OB], a->dres, atty, w.t[BLK_OW], N, Q, C, ST_W_OUT_IN);
        OPS->memset0(be, a->dQKV, (size_t)N * W * sizeof(float));
        float *qk = qkv, *dqk = a->dQKV;
        if (c->qk_norm) {
            qk = a->qkvn + (size_t)l * N * W;
            dqk = a->dQKVn;
            OPS->memset0(be, dqk, (size_t)N * W * sizeof(float));
        }
        OPS->attention_gqa_backward(be, dqk, dqk + Q, a->dQKV + Q + K, a->dA, qk, qk + Q, qkv + Q + K, atty, lse, W,
                                    B, T, NH, NKV, hs);
        OPS->rope_backward(be, dqk, a->cos, a->sin, B, T, NH, hs, W);
        OPS->rope_backward(be, dqk + Q, a->cos, a->sin, B, T, NKV, hs, W);
        if (c->qk_norm) {
            OPS->rmsnorm_backward(be, a->dQKV, g.t[BLK_QN], dqk, qkv, w.t[BLK_QN], a->rstdq + (size_t)l * N * NH, N,
                                  NH, hs, W);
            OPS->rmsnorm_backward(be, a->dQKV + Q, g.t[BLK_KN], dqk + Q, qkv + Q, w.t[BLK_KN],
                                  a->rstdk + (size_t)l * N * NKV, N, NKV, hs, W);
        }
        OPS->memset0(be, a->dC, NC * sizeof(float));
        OPS->matmul_backward(be, a->dC, g.t[BLK_QW], g.t[BLK_QB], a->dQKV, ln1, w.t[BLK_QW], N, C, W, ST_W_OUT_IN);
        OPS->rmsnorm_backward(be, a->dres, g.t[BLK_LN1], a->dC, in, w.t[BLK_LN1], a->rstd1 + (size_t)l * N, N, 1, C,
                              C);
    }
    OPS->embedding_backward(be, m->grads, a->dres, a->inputs, B, T, C);
}

void llama_zero_grad(llama_model *m) { OPS->memset0(m->be, m->grads, m->n_params * sizeof(float)); }

const float *llama_logits(const llama_model *m) { return m->acts ? m->acts->logits : NULL; }

double llama_flops_per_token(const llama_config *c, int T) {
    double C = c->hidden_size, L = c->n_layer, V = c->vocab_size, F = c->intermediate_size;
    double Q = (double)c->n_head * c->head_dim, K = (double)c->n_kv_head * c->head_dim;
    double per_layer = C * (Q + 2 * K) + Q * C + 3 * C * F;
    return 6.0 * (L * per_layer + V * C) + 6.0 * L * T * Q;
}

void llama_step_gemms(const llama_config *c, int B, int T, llama_gemm out[LLAMA_STEP_GEMMS]) {
    int N = B * T, C = c->hidden_size, F = c->intermediate_size, V = c->vocab_size, L = c->n_layer;
    int Q = c->n_head * c->head_dim, W = Q + 2 * c->n_kv_head * c->head_dim;
    /* (OC, IC, count) of each nn.Linear-layout product: out = inp @ w^T */
    const int lin[5][3] = {{W, C, L}, {C, Q, L}, {2 * F, C, L}, {C, F, L}, {V, C, 1}};
    for (int i = 0; i < 5; i++) {
        int OC = lin[i][0], IC = lin[i][1], n = lin[i][2];
        out[i] = (llama_gemm){N, OC, IC, 0, 1, n};          /* forward: inp (N,IC) w^T */
        out[5 + i] = (llama_gemm){N, IC, OC, 0, 0, n};      /* dinp (N,IC) = dout (N,OC) w (OC,IC) */
        out[10 + i] = (llama_gemm){OC, IC, N, 1, 0, n};     /* dw (OC,IC) = dout^T inp */
    }
}
