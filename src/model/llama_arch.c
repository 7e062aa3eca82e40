/* llama_arch.c - the Llama family as executors see it (include/strata/block.h): the
 * parameter layout and its tensor table, and the embedding, one block and the final
 * RMSNorm as backend ops over weight slabs wherever they live. st_llama_forward and
 * st_llama_backward (llama.c) are these same pieces run over the model's own vector.
 *
 * Shapes: B batch, T time, N = B*T, C hidden, NH query heads, NKV key/value heads, hs
 * head_dim, Q = NH hs, K = NKV hs, W = Q + 2K the packed q|k|v width, F intermediate, V
 * vocabulary, L layers. A block keeps what its backward needs (one activation set):
 * ln1 (+rstd), qkv (q and k after rope; with q/k norm also the raw projection), atty,
 * lse, res2, ln2 (+rstd), gate|up and the SwiGLU output. Attention keeps only its output
 * and lse; rope is undone on the gradient in place, so the pre-rope q and k are not kept.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/block.h"
#include "strata/llama.h"
#include "strata/tier.h" /* ST_ARENA_ALIGN: how the executor's arena rounds each allocation */

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
static void blk_shape(const st_llama_config *c, int i, int *rows, int *cols) {
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

static size_t blk_numel(const st_llama_config *c) {
    size_t n = 0;
    for (int i = 0; i < BLK_COUNT; i++) {
        int r, k;
        blk_shape(c, i, &r, &k);
        n += (size_t)r * (k ? k : 1);
    }
    return n;
}

static int blk_tensors(const st_llama_config *c) {
    int n = 0;
    for (int i = 0; i < BLK_COUNT; i++) {
        int r, k;
        blk_shape(c, i, &r, &k);
        n += r > 0;
    }
    return n;
}

size_t st_llama_param_count(const st_llama_config *c) {
    size_t VC = (size_t)c->vocab_size * c->hidden_size;
    return VC + (size_t)c->n_layer * blk_numel(c) + c->hidden_size + (c->tie_word_embeddings ? 0 : VC);
}

/* Pointers to a block's tensors inside its slab (weights or gradients); absent ones NULL. */
typedef struct blk_ptrs {
    float *t[BLK_COUNT];
} blk_ptrs;

/* held (block.h's held slab): the 1-D tensors packed, the matmul weights NULL. off: each tensor's
 * offset in the whole slab (NULL: not wanted). */
static blk_ptrs blk_at_(const st_llama_config *c, const float *slab, int held, size_t *off) {
    blk_ptrs b;
    float *p = (float *)slab;
    size_t o = 0;
    for (int i = 0; i < BLK_COUNT; i++) {
        int r, k;
        blk_shape(c, i, &r, &k);
        size_t n = (size_t)r * (k ? k : 1);
        int skip = held && k; /* a matmul weight: the hook's */
        b.t[i] = r && !skip ? p : NULL;
        if (!skip) p += n;
        if (off) off[i] = o;
        o += n;
    }
    return b;
}
static blk_ptrs blk_at(const st_llama_config *c, const float *slab) { return blk_at_(c, slab, 0, NULL); }
static int held_slab(const st_blocks *b) { return b->hook && b->hook->held; }

static void put_tensor(st_param_info *tab, int *n, const char *name, size_t *off, int d0, int d1) {
    st_param_info *t = &tab[(*n)++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->offset = *off;
    t->ndim = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1 ? d1 : 1;
    t->numel = (size_t)d0 * (d1 ? (size_t)d1 : 1);
    t->role = st_role_from_name(name);
    *off += t->numel;
}

/* The tensor table in vector order (Hugging Face names) and the layout around it. */
static st_status build_layout(const st_llama_config *cfg, st_arch_layout *ly, st_err *err) {
    int L = cfg->n_layer, C = cfg->hidden_size, V = cfg->vocab_size, per = blk_tensors(cfg);
    int post = cfg->tie_word_embeddings ? 1 : 2;
    st_param_info *tab = calloc((size_t)L * per + 1 + post, sizeof *tab);
    if (!tab) return st_errf(err, ST_ERR_NOMEM, "out of memory for the tensor table of %d layers", L);
    int n = 0;
    size_t off = 0;
    put_tensor(tab, &n, "model.embed_tokens.weight", &off, V, C);
    ly->emb_numel = ly->block_offset0 = off;
    for (int l = 0; l < L; l++) {
        for (int i = 0; i < BLK_COUNT; i++) {
            int r, k;
            blk_shape(cfg, i, &r, &k);
            if (!r) continue;
            char name[96];
            snprintf(name, sizeof name, "model.layers.%d.%s", l, blk_names[i]);
            put_tensor(tab, &n, name, &off, r, k);
        }
    }
    ly->block_numel = blk_numel(cfg);
    ly->norm_offset = off;
    ly->norm_numel = (size_t)C;
    put_tensor(tab, &n, "model.norm.weight", &off, C, 0);
    ly->head_offset = 0;
    if (!cfg->tie_word_embeddings) {
        ly->head_offset = off;
        put_tensor(tab, &n, "lm_head.weight", &off, V, C);
    }
    ly->n_blocks = L;
    ly->n_params = off;
    ly->tied = cfg->tie_word_embeddings != 0;
    ly->vocab_size = V, ly->n_embd = C, ly->max_seq = cfg->max_seq;
    ly->n_tensors = n, ly->n_pre_tensors = 1, ly->tensors_per_block = per, ly->n_post_tensors = post;
    ly->tensors = tab;
    ly->norm_stat_floats = 1; /* rstd */
    return ST_OK;
}

/* ------------------------------------------------------------------ rotary tables */

/* Rotary tables (T, hs/2) in double, rounded once: Hugging Face's default inv_freq =
 * theta^(-2i/hs), with Llama 3's rescaling of the low and medium frequencies. */
static void rope_tables(const st_llama_config *c, int T, float *cos_t, float *sin_t) {
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
void st_llama_rope_tables(const st_llama_config *c, int T, float *cos_t, float *sin_t);
void st_llama_rope_tables(const st_llama_config *c, int T, float *cos_t, float *sin_t) { rope_tables(c, T, cos_t, sin_t); }

/* ------------------------------------------------------------------ one block's activations */

typedef struct llama_set {
    float *ln1, *rstd1, *qkv, *qkvn, *rstdq, *rstdk, *atty, *lse, *res2, *ln2, *rstd2, *gu, *hmlp;
} llama_set;

/* Carves one block's activation set for (B, T) from base (NULL: only counts); floats used. */
static size_t set_layout(const st_llama_config *c, int B, int T, const float *base, llama_set *s) {
    size_t N = (size_t)B * T, C = c->hidden_size, NH = c->n_head, NKV = c->n_kv_head, hs = c->head_dim;
    size_t W = (NH + 2 * NKV) * hs, Q = NH * hs, F = c->intermediate_size, off = 0;
    llama_set dummy;
    if (!s) s = &dummy;
#define TAKE(ptr, n) do { (ptr) = base ? (float *)base + off : NULL; off += (n); } while (0)
    TAKE(s->ln1, N * C);
    TAKE(s->rstd1, N);
    TAKE(s->qkv, N * W);
    if (c->qk_norm) {
        TAKE(s->qkvn, N * W);
        TAKE(s->rstdq, N * NH);
        TAKE(s->rstdk, N * NKV);
    } else {
        s->qkvn = s->rstdq = s->rstdk = NULL;
    }
    TAKE(s->atty, N * Q);
    TAKE(s->lse, NH * N);
    TAKE(s->res2, N * C);
    TAKE(s->ln2, N * C);
    TAKE(s->rstd2, N);
    TAKE(s->gu, N * 2 * F);
    TAKE(s->hmlp, N * F);
#undef TAKE
    return off;
}

size_t st_llama_block_act_floats(const st_llama_config *c, int B, int T) { return set_layout(c, B, T, NULL, NULL); }

/* ------------------------------------------------------------------ bound state */

/* What st_blocks_bind allocates on the backend, one allocation each (absent: 0 bytes). */
enum { BD_INPUTS, BD_SCRATCH, BD_DC, BD_DA, BD_DF, BD_DGU, BD_DQKV, BD_DQKVN, BD_COS, BD_SIN,
       /* packed documents (a_set_docs; allocated at bind, counted by bind_bytes): doc_start
        * (N int32), the rotary tables gathered at each token's position (N, hs/2) */
       BD_DOCSTART, BD_COSP, BD_SINP, BD_COUNT };

typedef struct llama_bound {
    void *p[BD_COUNT];
    float *host_cs;     /* the host rotary tables (2 x T x hs/2: cos then sin), to gather from */
    int ds_on, pos_on;  /* the last a_set_docs's: doc_start and positions in use */
} llama_bound;

#define BD(b, i) ((float *)((llama_bound *)(b)->state)->p[i])

static void bound_sizes(const st_llama_config *c, int B, int T, size_t bytes[BD_COUNT]) {
    size_t N = (size_t)B * T, C = c->hidden_size, hs = c->head_dim, F = c->intermediate_size;
    size_t Q = (size_t)c->n_head * hs, W = Q + 2 * (size_t)c->n_kv_head * hs;
    bytes[BD_INPUTS] = N * sizeof(int32_t);           /* token ids of the last embed_forward */
    bytes[BD_SCRATCH] = N * C * sizeof(float);        /* o_proj and down_proj outputs */
    bytes[BD_DC] = N * C * sizeof(float);             /* backward: d(norm output) */
    bytes[BD_DA] = N * Q * sizeof(float);             /* d(attention output) */
    bytes[BD_DF] = N * F * sizeof(float);             /* d(SwiGLU output) */
    bytes[BD_DGU] = N * 2 * F * sizeof(float);        /* d(gate|up) */
    bytes[BD_DQKV] = N * W * sizeof(float);           /* d(q|k|v projection) */
    bytes[BD_DQKVN] = c->qk_norm ? N * W * sizeof(float) : 0; /* d(normed q|k) */
    bytes[BD_COS] = bytes[BD_SIN] = (size_t)T * (hs / 2) * sizeof(float);
    /* packed documents (a_set_docs): their starts and the rotary tables at their positions,
     * allocated at bind so a plan that fills its budget holds them too */
    bytes[BD_DOCSTART] = N * sizeof(int32_t);
    bytes[BD_COSP] = bytes[BD_SINP] = N * (hs / 2) * sizeof(float);
}

static size_t arena_round(size_t bytes) { return (bytes + ST_ARENA_ALIGN - 1) / ST_ARENA_ALIGN * ST_ARENA_ALIGN; }

size_t st_llama_bind_bytes(const st_llama_config *c, int B, int T) {
    size_t bytes[BD_COUNT], sum = 0;
    bound_sizes(c, B, T, bytes);
    for (int i = 0; i < BD_COUNT; i++)
        if (bytes[i]) sum += arena_round(bytes[i]);
    return sum;
}

static const st_llama_config *cfg_of(const st_arch *a) { return (const st_llama_config *)a->impl; }

static size_t a_block_act_floats(const st_arch *a, int B, int T) { return st_llama_block_act_floats(cfg_of(a), B, T); }
static size_t a_bind_bytes(const st_arch *a, int B, int T) { return st_llama_bind_bytes(cfg_of(a), B, T); }

static void a_unbind(st_blocks *b) {
    llama_bound *s = b->state;
    if (!s) return;
    for (int i = 0; i < BD_COUNT; i++)
        if (s->p[i]) b->be->ops->dealloc(b->be, s->p[i]);
    free(s->host_cs);
    free(s);
    b->state = NULL;
}

static st_status a_bind(st_blocks *b, st_err *err) {
    const st_llama_config *c = cfg_of(b->arch);
    st_backend *be = b->be;
    int B = b->B, T = b->T;
    if (!be->ops->rmsnorm_forward || !be->ops->attention_gqa_forward)
        return st_errf(err, ST_ERR_UNSUPPORTED, "backend '%s' has no Llama-family ops", be->ops->name);
    if (B < 1 || T < 1) return st_errf(err, ST_ERR_INVALID, "batch %d and seq %d must be >= 1", B, T);
    if (T > c->max_seq)
        return st_errf(err, ST_ERR_INVALID, "seq %d exceeds the model's max_position_embeddings %d", T, c->max_seq);
    if (c->sliding_window > 0 && T > c->sliding_window)
        return st_errf(err, ST_ERR_UNSUPPORTED, "seq %d is longer than the checkpoint's sliding_window %d, and strata "
                       "has no sliding-window attention; train with seq <= %d", T, c->sliding_window,
                       c->sliding_window);
    size_t bytes[BD_COUNT], nt = (size_t)T * (c->head_dim / 2);
    bound_sizes(c, B, T, bytes);
    llama_bound *s = calloc(1, sizeof *s);
    float *host_cs = malloc(2 * nt * sizeof(float));
    b->state = s;
    int ok = s && host_cs;
    for (int i = 0; ok && i < BD_COUNT; i++)
        if (bytes[i] && !(s->p[i] = be->ops->alloc(be, bytes[i]))) ok = 0;
    if (!ok) {
        free(host_cs);
        a_unbind(b);
        return st_errf(err, ST_ERR_NOMEM, "cannot allocate %.1f MiB of block scratch for batch %d x seq %d; lower "
                       "batch or seq", st_llama_bind_bytes(c, B, T) / 1048576.0, B, T);
    }
    rope_tables(c, T, host_cs, host_cs + nt);
    be->ops->copy_to_device(be, s->p[BD_COS], host_cs, nt * sizeof(float));
    be->ops->copy_to_device(be, s->p[BD_SIN], host_cs + nt, nt * sizeof(float));
    s->host_cs = host_cs; /* kept for the documents' gathered tables */
    return ST_OK;
}

static st_status a_set_docs(st_blocks *b, const int32_t *positions, const int32_t *doc_start, st_err *err) {
    const st_llama_config *c = cfg_of(b->arch);
    st_backend *be = b->be;
    llama_bound *s = b->state;
    int plain_pos, plain_ds;
    st_status st = st_docs_check(positions, doc_start, b->B, b->T, b->T, &plain_pos, &plain_ds, err);
    if (st) return st;
    if (!plain_ds && (!be->ops->attention_gqa_doc_forward || !be->ops->attention_gqa_doc_backward))
        return st_errf(err, ST_ERR_UNSUPPORTED, "backend '%s' has no attention restricted to documents; train with "
                       "--doc_mask 0", be->ops->name);
    size_t N = (size_t)b->B * b->T, half = (size_t)c->head_dim / 2, nt = (size_t)b->T * half;
    s->ds_on = s->pos_on = 0;
    if (!plain_ds) {
        if (!s->p[BD_DOCSTART] && !(s->p[BD_DOCSTART] = be->ops->alloc(be, N * sizeof(int32_t))))
            return st_errf(err, ST_ERR_NOMEM, "llama: out of memory for the documents of a %d x %d batch", b->B, b->T);
        be->ops->copy_to_device(be, s->p[BD_DOCSTART], doc_start, N * sizeof(int32_t));
        s->ds_on = 1;
    }
    if (!plain_pos) { /* rotary tables of N rows, row n at token n's position: rope over (1, N) */
        float *g = malloc(2 * N * half * sizeof(float));
        if (!g || (!s->p[BD_COSP] && !(s->p[BD_COSP] = be->ops->alloc(be, N * half * sizeof(float)))) ||
            (!s->p[BD_SINP] && !(s->p[BD_SINP] = be->ops->alloc(be, N * half * sizeof(float))))) {
            free(g);
            return st_errf(err, ST_ERR_NOMEM, "llama: out of memory for the rotary tables of a %d x %d batch", b->B,
                           b->T);
        }
        for (size_t n = 0; n < N; n++) {
            memcpy(g + n * half, s->host_cs + (size_t)positions[n] * half, half * sizeof(float));
            memcpy(g + (N + n) * half, s->host_cs + nt + (size_t)positions[n] * half, half * sizeof(float));
        }
        be->ops->copy_to_device(be, s->p[BD_COSP], g, N * half * sizeof(float));
        be->ops->copy_to_device(be, s->p[BD_SINP], g + N * half, N * half * sizeof(float));
        free(g);
        s->pos_on = 1;
    }
    return ST_OK;
}

/* Rotary embedding of H heads of each row of x (rows W floats apart), forward or back: at
 * positions 0..T-1 of each row, or at the documents' positions (a_set_docs). */
static void rope_rows(st_blocks *b, float *x, int H, int W, int backward) {
    st_backend *be = b->be;
    llama_bound *s = b->state;
    int hs = cfg_of(b->arch)->head_dim, B = s->pos_on ? 1 : b->B, T = s->pos_on ? b->B * b->T : b->T;
    const float *cs = BD(b, s->pos_on ? BD_COSP : BD_COS), *sn = BD(b, s->pos_on ? BD_SINP : BD_SIN);
    if (backward) be->ops->rope_backward(be, x, cs, sn, B, T, H, hs, W);
    else be->ops->rope_forward(be, x, cs, sn, B, T, H, hs, W);
}

/* ------------------------------------------------------------------ the pieces */

#define OPS (be->ops)

static void a_embed_forward(st_blocks *b, const float *emb_w, const int32_t *host_inputs, float *out) {
    st_backend *be = b->be;
    int32_t *inputs = (int32_t *)((llama_bound *)b->state)->p[BD_INPUTS];
    if (host_inputs) OPS->copy_to_device(be, inputs, host_inputs, sizeof(int32_t) * (size_t)b->B * b->T);
    OPS->embedding_forward(be, out, inputs, emb_w, b->B, b->T, cfg_of(b->arch)->hidden_size);
}

static int32_t *a_token_ids(st_blocks *b) { return (int32_t *)((llama_bound *)b->state)->p[BD_INPUTS]; }

static void a_embed_backward(st_blocks *b, float *emb_g, const float *dres) {
    st_backend *be = b->be;
    const int32_t *inputs = (const int32_t *)((llama_bound *)b->state)->p[BD_INPUTS];
    OPS->embedding_backward(be, emb_g, dres, inputs, b->B, b->T, cfg_of(b->arch)->hidden_size);
}

/* The block's matmul (ST_W_OUT_IN), or the hook's linear map in its place, then the hook's
 * additive term (model.h's st_linear_hook). */
static void mm_forward(st_blocks *b, int mm, float *out, const float *x, const float *w, const float *bias, int N,
                       int C, int OC) {
    st_linear_hook *hk = b->hook;
    st_backend *be = b->be;
    if (hk && hk->linear_forward) hk->linear_forward(hk, mm, out, x, w, bias, N);
    else OPS->matmul_forward(be, out, x, w, bias, N, C, OC, ST_W_OUT_IN);
    if (hk && hk->forward) hk->forward(hk, mm, out, x, N);
}

static void mm_backward(st_blocks *b, int mm, float *dx, float *dw, float *dbias, const float *dout, const float *x,
                        const float *w, int N, int C, int OC) {
    st_linear_hook *hk = b->hook;
    st_backend *be = b->be;
    if (hk && hk->linear_backward) hk->linear_backward(hk, mm, dx, dbias, dout, x, w, N);
    else OPS->matmul_backward(be, dx, dw, dbias, dout, x, w, N, C, OC, ST_W_OUT_IN);
    if (hk && hk->backward) hk->backward(hk, mm, dx, dout, x, N);
}

static void a_block_forward(st_blocks *b, const float *wslab, const float *in, float *acts, float *out) {
    st_backend *be = b->be;
    const st_llama_config *c = cfg_of(b->arch);
    int B = b->B, T = b->T, C = c->hidden_size, NH = c->n_head, NKV = c->n_kv_head, hs = c->head_dim;
    int F = c->intermediate_size, N = B * T, Q = NH * hs, W = (NH + 2 * NKV) * hs;
    size_t NC = (size_t)N * C;
    float eps = (float)c->rms_norm_eps;
    float *scratch = BD(b, BD_SCRATCH);
    blk_ptrs w = blk_at_(c, wslab, held_slab(b), NULL);
    llama_set a;
    set_layout(c, B, T, acts, &a);
    OPS->rmsnorm_forward(be, a.ln1, a.rstd1, in, w.t[BLK_LN1], N, 1, C, C, eps);
    /* q|k|v weights (and biases) are adjacent: one (W, C) matmul */
    mm_forward(b, ST_MM_QKV, a.qkv, a.ln1, w.t[BLK_QW], w.t[BLK_QB], N, C, W);
    float *qk = a.qkv; /* the buffer holding the q and k that attention sees */
    if (c->qk_norm) {
        qk = a.qkvn;
        OPS->rmsnorm_forward(be, qk, a.rstdq, a.qkv, w.t[BLK_QN], N, NH, hs, W, eps);
        OPS->rmsnorm_forward(be, qk + Q, a.rstdk, a.qkv + Q, w.t[BLK_KN], N, NKV, hs, W, eps);
    }
    rope_rows(b, qk, NH, W, 0);
    rope_rows(b, qk + Q, NKV, W, 0);
    if (((llama_bound *)b->state)->ds_on)
        OPS->attention_gqa_doc_forward(be, a.atty, a.lse, qk, qk + Q, a.qkv + Q + NKV * hs,
                                       (const int32_t *)((llama_bound *)b->state)->p[BD_DOCSTART], W, B, T, NH, NKV,
                                       hs);
    else OPS->attention_gqa_forward(be, a.atty, a.lse, qk, qk + Q, a.qkv + Q + NKV * hs, W, B, T, NH, NKV, hs);
    mm_forward(b, ST_MM_O, scratch, a.atty, w.t[BLK_OW], w.t[BLK_OB], N, Q, C);
    OPS->residual_forward(be, a.res2, in, scratch, (int)NC);
    OPS->rmsnorm_forward(be, a.ln2, a.rstd2, a.res2, w.t[BLK_LN2], N, 1, C, C, eps);
    mm_forward(b, ST_MM_UP, a.gu, a.ln2, w.t[BLK_GATE], NULL, N, C, 2 * F); /* gate|up adjacent */
    OPS->swiglu_forward(be, a.hmlp, a.gu, N, F);
    mm_forward(b, ST_MM_DOWN, scratch, a.hmlp, w.t[BLK_DOWN], NULL, N, F, C);
    OPS->residual_forward(be, out, a.res2, scratch, (int)NC);
}

/* dres: the residual stream's gradient; each branch adds into it */
static void a_block_backward(st_blocks *b, const float *wslab, float *gslab, const float *in, const float *acts,
                             float *dres) {
    st_backend *be = b->be;
    const st_llama_config *c = cfg_of(b->arch);
    int B = b->B, T = b->T, C = c->hidden_size, NH = c->n_head, NKV = c->n_kv_head, hs = c->head_dim;
    int F = c->intermediate_size, N = B * T, Q = NH * hs, K = NKV * hs, W = Q + 2 * K;
    size_t NC = (size_t)N * C;
    float *dC = BD(b, BD_DC), *dA = BD(b, BD_DA), *dF = BD(b, BD_DF), *dGU = BD(b, BD_DGU);
    float *dQKV = BD(b, BD_DQKV);
    size_t off[BLK_COUNT];
    blk_ptrs w = blk_at_(c, wslab, held_slab(b), off), g;
    st_linear_hook *hk = b->hook;
    if (hk && hk->frozen) { /* no gradient of the base: the matmuls form none, the norms' go to scratch */
        memset(&g, 0, sizeof g);
        g.t[BLK_LN1] = g.t[BLK_LN2] = g.t[BLK_QN] = g.t[BLK_KN] = hk->norm_scratch;
    } else if (!gslab && hk && hk->grad_at) { /* the hook keeps the gradients (POET-X) */
        for (int i = 0; i < BLK_COUNT; i++)
            g.t[i] = w.t[i] ? hk->grad_at(hk, hk->layer, off[i]) : NULL;
    } else {
        g = blk_at(c, gslab);
    }
    llama_set a;
    set_layout(c, B, T, acts, &a);
    /* MLP branch */
    OPS->memset0(be, dF, (size_t)N * F * sizeof(float));
    mm_backward(b, ST_MM_DOWN, dF, g.t[BLK_DOWN], NULL, dres, a.hmlp, w.t[BLK_DOWN], N, F, C);
    OPS->memset0(be, dGU, (size_t)N * 2 * F * sizeof(float));
    OPS->swiglu_backward(be, dGU, a.gu, dF, N, F);
    OPS->memset0(be, dC, NC * sizeof(float));
    mm_backward(b, ST_MM_UP, dC, g.t[BLK_GATE], NULL, dGU, a.ln2, w.t[BLK_GATE], N, C, 2 * F);
    OPS->rmsnorm_backward(be, dres, g.t[BLK_LN2], dC, a.res2, w.t[BLK_LN2], a.rstd2, N, 1, C, C);
    /* attention branch */
    OPS->memset0(be, dA, (size_t)N * Q * sizeof(float));
    mm_backward(b, ST_MM_O, dA, g.t[BLK_OW], g.t[BLK_OB], dres, a.atty, w.t[BLK_OW], N, Q, C);
    OPS->memset0(be, dQKV, (size_t)N * W * sizeof(float));
    float *qk = a.qkv, *dqk = dQKV;
    if (c->qk_norm) {
        qk = a.qkvn;
        dqk = BD(b, BD_DQKVN);
        OPS->memset0(be, dqk, (size_t)N * W * sizeof(float));
    }
    if (((llama_bound *)b->state)->ds_on)
        OPS->attention_gqa_doc_backward(be, dqk, dqk + Q, dQKV + Q + K, dA, qk, qk + Q, a.qkv + Q + K, a.atty, a.lse,
                                        (const int32_t *)((llama_bound *)b->state)->p[BD_DOCSTART], W, B, T, NH,
                                        NKV, hs);
    else OPS->attention_gqa_backward(be, dqk, dqk + Q, dQKV + Q + K, dA, qk, qk + Q, a.qkv + Q + K, a.atty, a.lse, W,
                                     B, T, NH, NKV, hs);
    rope_rows(b, dqk, NH, W, 1);
    rope_rows(b, dqk + Q, NKV, W, 1);
    if (c->qk_norm) {
        OPS->rmsnorm_backward(be, dQKV, g.t[BLK_QN], dqk, a.qkv, w.t[BLK_QN], a.rstdq, N, NH, hs, W);
        OPS->rmsnorm_backward(be, dQKV + Q, g.t[BLK_KN], dqk + Q, a.qkv + Q, w.t[BLK_KN], a.rstdk, N, NKV, hs, W);
    }
    OPS->memset0(be, dC, NC * sizeof(float));
    mm_backward(b, ST_MM_QKV, dC, g.t[BLK_QW], g.t[BLK_QB], dQKV, a.ln1, w.t[BLK_QW], N, C, W);
    OPS->rmsnorm_backward(be, dres, g.t[BLK_LN1], dC, in, w.t[BLK_LN1], a.rstd1, N, 1, C, C);
}

static void a_norm_forward(st_blocks *b, const float *nw, const float *x, float *xn, float *stats) {
    st_backend *be = b->be;
    const st_llama_config *c = cfg_of(b->arch);
    int C = c->hidden_size;
    OPS->rmsnorm_forward(be, xn, stats, x, nw, b->B * b->T, 1, C, C, (float)c->rms_norm_eps);
}

static void a_norm_backward(st_blocks *b, float *dx, float *ng, const float *dxn, const float *x, const float *nw,
                            const float *stats) {
    st_backend *be = b->be;
    int C = cfg_of(b->arch)->hidden_size;
    OPS->rmsnorm_backward(be, dx, ng, dxn, x, nw, stats, b->B * b->T, 1, C, C);
}

#undef OPS

/* Weights N(0, 0.02) (Hugging Face's initializer_range), norms 1, biases 0. */
static void a_init(const st_arch *a, float *host_params, uint64_t seed) {
    st_params_init_by_role(a->lay.tensors, a->lay.n_tensors, host_params, seed, NULL, 1.0f);
}

/* 6 * (matmul weights) + 6 * T * NH * hs (causal attention), per token (llama.h) */
double st_llama_block_flops_per_token(const st_llama_config *c, int T) {
    double C = c->hidden_size, F = c->intermediate_size;
    double Q = (double)c->n_head * c->head_dim, K = (double)c->n_kv_head * c->head_dim;
    return 6.0 * (C * (Q + 2 * K) + Q * C + 3 * C * F) + 6.0 * T * Q;
}

static double a_block_flops(const st_arch *a, int T) { return st_llama_block_flops_per_token(cfg_of(a), T); }
static double a_head_flops(const st_arch *a) { return 6.0 * a->lay.vocab_size * (double)a->lay.n_embd; }

/* frees a too (st_arch_free) */
static void a_destroy(st_arch *a) {
    free((void *)a->lay.tensors);
    free(a->impl);
    free(a);
}

static const st_arch_ops llama_arch_ops = {
    .name = "llama",
    .block_act_floats = a_block_act_floats,
    .bind_bytes = a_bind_bytes,
    .bind = a_bind,
    .unbind = a_unbind,
    .embed_forward = a_embed_forward,
    .token_ids = a_token_ids,
    .embed_backward = a_embed_backward,
    .block_forward = a_block_forward,
    .block_backward = a_block_backward,
    .norm_forward = a_norm_forward,
    .norm_backward = a_norm_backward,
    .init = a_init,
    .block_flops_per_token = a_block_flops,
    .head_flops_per_token = a_head_flops,
    .destroy = a_destroy,
    .set_docs = a_set_docs,
};

st_status st_arch_llama(st_arch **out, const st_llama_config *cfg, st_err *err) {
    *out = NULL;
    st_status s = st_llama_config_validate(cfg, err);
    if (s) return s;
    st_arch *a = calloc(1, sizeof *a);
    st_llama_config *copy = malloc(sizeof *copy);
    if (!a || !copy) {
        free(a);
        free(copy);
        return st_errf(err, ST_ERR_NOMEM, "out of memory");
    }
    *copy = *cfg;
    a->ops = &llama_arch_ops;
    a->impl = copy;
    if ((s = build_layout(cfg, &a->lay, err))) {
        free(copy);
        free(a);
        return s;
    }
    *out = a;
    return ST_OK;
}
