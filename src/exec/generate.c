/* generate.c - the KV-cached decoder and the generation loop (strata/generate.h).
 *
 * Names: L layers, C width, NH query heads, NKV key/value heads (GPT-2: NKV = NH), hs
 * head size, Q = NH*hs, K = NKV*hs, W = Q + 2K the packed q|k|v width, F2 the first MLP
 * matmul's width (GPT-2 4C; Llama 2F, gate|up), Fh its activation's width (4C; F),
 * V vocabulary, n the new rows of a step, pos the first of their positions.
 *
 * A step runs the model's own backend ops over the n new rows only: embedding (GPT-2's
 * position table read from row pos on; Llama's rope tables likewise), norms, the q|k|v
 * matmul, rope, then the new rows' k and v go into the cache, attention reads the cache
 * (plain loops: one query row against every earlier key; no backend op does that), and
 * the rest of the block. The head runs on the last row only.
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "strata/generate.h"

/* the decode kinds (st_decode_kind, model.h): ARCH_GPT2 LayerNorm/GELU, ARCH_LLAMA RMSNorm/rope/SwiGLU */
enum { ARCH_GPT2 = ST_DECODE_LN_GELU, ARCH_LLAMA = ST_DECODE_RMS_SWIGLU };

/* Element offsets of one block's tensors in the parameter vector; NONE when absent.
 * GPT-2 uses ln1w/b, qkvw/b, ow/b, ln2w/b, fcw/b, downw/b; Llama ln1w, qkvw, qkvb (q|k|v
 * biases), qn, kn, ow, ob, ln2w, fcw (gate|up), downw. */
#define NONE ((size_t)-1)
typedef struct gen_layer {
    size_t ln1w, ln1b, qkvw, qkvb, qn, kn, ow, ob, ln2w, ln2b, fcw, fcb, downw, downb;
} gen_layer;

struct st_gen {
    st_model *m;
    st_backend *be;
    int arch, L, C, NH, NKV, hs, Q, K, W, F2, Fh, V, max_T, pos, threads;
    int host_blas; /* the cpu backend: one-row products through sgemv (gen_matmul) */
    float eps;
    size_t wte, wpe, lnfw, lnfb, head; /* offsets, as gen_layer */
    gen_layer *layers;
    float *kc, *vc;                    /* (L, max_T, K) each */
    int32_t *tok;                      /* (max_T) */
    float *x, *ln, *qkv, *qkn, *att, *proj, *res2, *fc, *fcg, *stat_a, *stat_b, *lnf, *logits;
    float *cos, *sin;                  /* (max_T, hs/2), Llama */
    float *scores;                     /* (threads, max_T) */
    float *block;                      /* every buffer above but layers and scores */
};

#define OPS (g->be->ops)

static size_t off_of(const st_model *m, const char *name) {
    const st_param_info *t = st_params_find(m->tensors, m->n_tensors, name);
    return t ? t->offset : NONE;
}

static size_t numel_of(const st_model *m, const char *name) {
    const st_param_info *t = st_params_find(m->tensors, m->n_tensors, name);
    return t ? t->numel : 0;
}

/* Looks up every tensor a step reads. Tensors the step reads as one (q|k|v, gate|up)
 * must lie next to each other, as the model layouts promise; checked, not assumed. */
static st_status resolve_tensors(st_gen *g, st_err *err) {
    const st_model *m = g->m;
    char name[128];
#define REQ(dst, ...)                                                                                    \
    do {                                                                                                 \
        snprintf(name, sizeof name, __VA_ARGS__);                                                        \
        if (((dst) = off_of(m, name)) == NONE)                                                           \
            return st_errf(err, ST_ERR_FORMAT, "generate: the model has no tensor %s", name);            \
    } while (0)
#define OPT(dst, ...) do { snprintf(name, sizeof name, __VA_ARGS__); (dst) = off_of(m, name); } while (0)
#define ADJ(first, second, ...)                                                                          \
    do {                                                                                                 \
        snprintf(name, sizeof name, __VA_ARGS__);                                                        \
        size_t o_ = off_of(m, name);                                                                     \
        if (o_ != (first) + (second))                                                                    \
            return st_errf(err, ST_ERR_FORMAT, "generate: %s does not follow its neighbour in the "     \
                           "parameter vector (the decoder reads them as one matrix)", name);             \
    } while (0)
    for (int l = 0; l < g->L; l++) {
        gen_layer *y = &g->layers[l];
        *y = (gen_layer){NONE, NONE, NONE, NONE, NONE, NONE, NONE, NONE, NONE, NONE, NONE, NONE, NONE, NONE};
        if (g->arch == ARCH_GPT2) {
            const char *pre = "transformer.h";
            REQ(y->ln1w, "%s.%d.ln_1.weight", pre, l);
            REQ(y->ln1b, "%s.%d.ln_1.bias", pre, l);
            REQ(y->qkvw, "%s.%d.attn.c_attn.weight", pre, l);
            REQ(y->qkvb, "%s.%d.attn.c_attn.bias", pre, l);
            REQ(y->ow, "%s.%d.attn.c_proj.weight", pre, l);
            REQ(y->ob, "%s.%d.attn.c_proj.bias", pre, l);
            REQ(y->ln2w, "%s.%d.ln_2.weight", pre, l);
            REQ(y->ln2b, "%s.%d.ln_2.bias", pre, l);
            REQ(y->fcw, "%s.%d.mlp.c_fc.weight", pre, l);
            REQ(y->fcb, "%s.%d.mlp.c_fc.bias", pre, l);
            REQ(y->downw, "%s.%d.mlp.c_proj.weight", pre, l);
            REQ(y->downb, "%s.%d.mlp.c_proj.bias", pre, l);
        } else {
            const char *pre = "model.layers";
            size_t QC = (size_t)g->Q * g->C, KC = (size_t)g->K * g->C, kb;
            REQ(y->ln1w, "%s.%d.input_layernorm.weight", pre, l);
            REQ(y->qkvw, "%s.%d.self_attn.q_proj.weight", pre, l);
            ADJ(y->qkvw, QC, "%s.%d.self_attn.k_proj.weight", pre, l);
            ADJ(y->qkvw, QC + KC, "%s.%d.self_attn.v_proj.weight", pre, l);
            OPT(y->qkvb, "%s.%d.self_attn.q_proj.bias", pre, l);
            OPT(kb, "%s.%d.self_attn.k_proj.bias", pre, l);
            if ((y->qkvb == NONE) != (kb == NONE))
                return st_errf(err, ST_ERR_FORMAT, "generate: layer %d has q or k projection biases but not both", l);
            if (y->qkvb != NONE) {
                ADJ(y->qkvb, (size_t)g->Q, "%s.%d.self_attn.k_proj.bias", pre, l);
                ADJ(y->qkvb, (size_t)g->Q + g->K, "%s.%d.self_attn.v_proj.bias", pre, l);
            }
            OPT(y->qn, "%s.%d.self_attn.q_norm.weight", pre, l);
            OPT(y->kn, "%s.%d.self_attn.k_norm.weight", pre, l);
            REQ(y->ow, "%s.%d.self_attn.o_proj.weight", pre, l);
            OPT(y->ob, "%s.%d.self_attn.o_proj.bias", pre, l);
            REQ(y->ln2w, "%s.%d.post_attention_layernorm.weight", pre, l);
            REQ(y->fcw, "%s.%d.mlp.gate_proj.weight", pre, l);
            ADJ(y->fcw, (size_t)g->Fh * g->C, "%s.%d.mlp.up_proj.weight", pre, l);
            REQ(y->downw, "%s.%d.mlp.down_proj.weight", pre, l);
        }
    }
    if (g->arch == ARCH_GPT2) {
        REQ(g->wte, "transformer.wte.weight");
        REQ(g->wpe, "transformer.wpe.weight");
        REQ(g->lnfw, "transformer.ln_f.weight");
        REQ(g->lnfb, "transformer.ln_f.bias");
        g->head = g->wte; /* tied */
    } else {
        REQ(g->wte, "model.embed_tokens.weight");
        REQ(g->lnfw, "model.norm.weight");
        g->lnfb = NONE;
        OPT(g->head, "lm_head.weight");
        if (g->head == NONE) g->head = g->wte; /* tie_word_embeddings */
        g->wpe = NONE;
    }
    if (numel_of(m, g->arch == ARCH_GPT2 ? "transformer.wte.weight" : "model.embed_tokens.weight") !=
        (size_t)g->V * g->C)
        return st_errf(err, ST_ERR_SHAPE, "generate: the embedding is not (V=%d, C=%d)", g->V, g->C);
#undef REQ
#undef OPT
#undef ADJ
    return ST_OK;
}

st_status st_gen_create(st_gen **out, st_model *m, int max_T, st_err *err) {
    *out = NULL;
    if (!m || !m->ops || !m->params) return st_errf(err, ST_ERR_INVALID, "generate: no model weights");
    st_gen *g = calloc(1, sizeof *g);
    if (!g) return st_errf(err, ST_ERR_NOMEM, "generate: out of memory");
    g->m = m;
    g->be = m->be;
    if (!m->ops->decode_info) {
        free(g);
        return st_errf(err, ST_ERR_UNSUPPORTED, "generate: no decoder for architecture '%s'", m->ops->arch);
    }
    st_decode_info d;
    m->ops->decode_info(m, &d);
    g->arch = d.kind == ST_DECODE_LN_GELU ? ARCH_GPT2 : ARCH_LLAMA;
    g->L = d.n_layer, g->C = d.n_embd, g->NH = d.n_head, g->NKV = d.n_kv_head, g->hs = d.head_size;
    g->F2 = d.mlp_width, g->Fh = d.mlp_act_width;
    g->eps = d.eps;
    if (d.sliding_window > 0 && max_T > d.sliding_window) {
        free(g);
        return st_errf(err, ST_ERR_UNSUPPORTED, "generate: %d positions pass the checkpoint's sliding_window %d, "
                       "and strata has no sliding-window attention; generate at most %d tokens in all", max_T,
                       d.sliding_window, d.sliding_window);
    }
    g->V = m->vocab_size;
    g->Q = g->NH * g->hs, g->K = g->NKV * g->hs, g->W = g->Q + 2 * g->K;
    if (max_T < 1 || max_T > m->max_seq) {
        free(g);
        return st_errf(err, ST_ERR_INVALID, "generate: %d positions; the model has %d (prompt plus new tokens must "
                       "fit)", max_T, m->max_seq);
    }
    g->max_T = max_T;
    g->threads = omp_get_max_threads();
    g->host_blas = !strcmp(g->be->ops->name, "cpu");
    g->layers = calloc((size_t)g->L, sizeof *g->layers);
    g->scores = malloc(sizeof(float) * (size_t)g->threads * max_T);
    st_status s = g->layers && g->scores ? resolve_tensors(g, err) : st_errf(err, ST_ERR_NOMEM, "out of memory");
    if (s) {
        st_gen_free(g);
        return s;
    }
    size_t R = (size_t)max_T, C = g->C, half = (size_t)g->hs / 2, total = 0;
    /* one allocation, each buffer 64-byte aligned; the first pass (base NULL) counts */
    for (int pass = 0; pass < 2; pass++) {
        float *base = pass ? g->block : NULL;
        size_t off = 0;
#define TAKE(ptr, count) do { (ptr) = base ? (void *)(base + off) : NULL; off += ((count) + 15) & ~(size_t)15; } while (0)
        TAKE(g->kc, (size_t)g->L * R * g->K);
        TAKE(g->vc, (size_t)g->L * R * g->K);
        TAKE(g->tok, R);
        TAKE(g->x, R * C);
        TAKE(g->ln, R * C);
        TAKE(g->qkv, R * g->W);
        TAKE(g->qkn, R * g->W);
        TAKE(g->att, R * g->Q);
        TAKE(g->proj, R * C);
        TAKE(g->res2, R * C);
        TAKE(g->fc, R * g->F2);
        TAKE(g->fcg, R * g->Fh);
        TAKE(g->stat_a, R * g->NH); /* layernorm mean, rmsnorm rstd (rows, heads) */
        TAKE(g->stat_b, R * g->NH);
        TAKE(g->lnf, C);
        TAKE(g->logits, (size_t)g->V);
        TAKE(g->cos, g->arch == ARCH_LLAMA ? R * half : 0);
        TAKE(g->sin, g->arch == ARCH_LLAMA ? R * half : 0);
#undef TAKE
        total = off;
        if (!pass && !(g->block = g->be->ops->alloc(g->be, total * sizeof(float)))) {
            st_gen_free(g);
            return st_errf(err, ST_ERR_NOMEM, "generate: cannot allocate %.1f MiB for the KV cache and buffers of %d "
                           "positions; generate fewer tokens", total * 4.0 / 1048576.0, max_T);
        }
    }
    if (g->arch == ARCH_LLAMA && m->ops->rope_tables) {
        float *host = malloc(sizeof(float) * 2 * R * half);
        if (!host) {
            st_gen_free(g);
            return st_errf(err, ST_ERR_NOMEM, "out of memory");
        }
        m->ops->rope_tables(m, max_T, host, host + R * half);
        g->be->ops->copy_to_device(g->be, g->cos, host, sizeof(float) * R * half);
        g->be->ops->copy_to_device(g->be, g->sin, host + R * half, sizeof(float) * R * half);
        free(host);
    }
    *out = g;
    return ST_OK;
}

void st_gen_free(st_gen *g) {
    if (!g) return;
    if (g->block) g->be->ops->dealloc(g->be, g->block);
    free(g->layers);
    free(g->scores);
    free(g);
}

void st_gen_reset(st_gen *g) { g->pos = 0; }
int st_gen_pos(const st_gen *g) { return g->pos; }

/* The n new rows' keys and values (rows ld floats apart) into layer l's cache. */
static void cache_store(st_gen *g, int l, const float *k, const float *v, int ld, int n) {
    size_t K = (size_t)g->K, base = ((size_t)l * g->max_T + g->pos) * K;
    for (int i = 0; i < n; i++) {
        memcpy(g->kc + base + (size_t)i * K, k + (size_t)i * ld, K * sizeof(float));
        memcpy(g->vc + base + (size_t)i * K, v + (size_t)i * ld, K * sizeof(float));
    }
}

/* out (n, Q): for new row i (position pos+i) and query head h, softmax(q.k_t / sqrt(hs))
 * over cached positions t <= pos+i, times v_t; query head h reads kv head h / (NH/NKV). */
static void cache_attend(st_gen *g, int l, const float *q, int ldq, int n, float *out) {
    int NH = g->NH, hs = g->hs, G = g->NH / g->NKV, K = g->K, pos = g->pos;
    const float *kc = g->kc + (size_t)l * g->max_T * K, *vc = g->vc + (size_t)l * g->max_T * K;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for schedule(dynamic, 1) num_threads(g->threads)
    for (int ih = 0; ih < n * NH; ih++) {
        int i = ih / NH, h = ih % NH, last = pos + i;
        float *S = g->scores + (size_t)omp_get_thread_num() * g->max_T;
        const float *qh = q + (size_t)i * ldq + (size_t)h * hs;
        const float *kh = kc + (size_t)(h / G) * hs, *vh = vc + (size_t)(h / G) * hs;
        float mx = -INFINITY;
        for (int t = 0; t <= last; t++) {
            const float *kt = kh + (size_t)t * K;
            float s = 0.0f;
            for (int d = 0; d < hs; d++) s += qh[d] * kt[d];
            S[t] = s * scale;
            if (S[t] > mx) mx = S[t];
        }
        float sum = 0.0f;
        for (int t = 0; t <= last; t++) {
            S[t] = expf(S[t] - mx);
            sum += S[t];
        }
        float inv = 1.0f / sum, *o = out + (size_t)i * NH * hs + (size_t)h * hs;
        for (int d = 0; d < hs; d++) o[d] = 0.0f;
        for (int t = 0; t <= last; t++) {
            const float *vt = vh + (size_t)t * K;
            float w = S[t] * inv;
            for (int d = 0; d < hs; d++) o[d] += w * vt[d];
        }
    }
}

/* out (n, OC) = inp (n, C) x w (+ bias): the backend's matmul, except one row on the cpu
 * backend, which is a matrix-vector product the backend has no op for. OpenBLAS's sgemm
 * with one row packs the whole weight matrix first: on this project's 2-core machine
 * (OpenBLAS 0.3.21, other jobs running) one row times GPT-2's (50257 x 768) head took
 * about 100 ms as sgemm and 33 ms as sgemv. A decode step reads every weight once, so
 * this is its speed. */
static void gen_matmul(st_gen *g, float *out, const float *inp, const float *w, const float *bias, int n, int C,
                       int OC, st_wlayout layout) {
    if (n != 1 || !g->host_blas) {
        OPS->matmul_forward(g->be, out, inp, w, bias, n, C, OC, layout);
        return;
    }
    float beta = 0.0f;
    if (bias) {
        memcpy(out, bias, sizeof(float) * (size_t)OC);
        beta = 1.0f;
    }
    if (layout == ST_W_IN_OUT) /* w (C, OC): out = w^T inp */
        cblas_sgemv(CblasRowMajor, CblasTrans, C, OC, 1.0f, w, OC, inp, 1, beta, out, 1);
    else /* w (OC, C): out = w inp */
        cblas_sgemv(CblasRowMajor, CblasNoTrans, OC, C, 1.0f, w, C, inp, 1, beta, out, 1);
}

static void layer_step_ln_gelu(st_gen *g, const float *P, const gen_layer *y, int l, int n) {
    st_backend *be = g->be;
    int C = g->C;
    size_t NC = (size_t)n * C;
    OPS->layernorm_forward(be, g->ln, g->stat_a, g->stat_b, g->x, P + y->ln1w, P + y->ln1b, n, C);
    gen_matmul(g, g->qkv, g->ln, P + y->qkvw, P + y->qkvb, n, C, 3 * C, ST_W_IN_OUT);
    cache_store(g, l, g->qkv + C, g->qkv + 2 * C, 3 * C, n);
    cache_attend(g, l, g->qkv, 3 * C, n, g->att);
    gen_matmul(g, g->proj, g->att, P + y->ow, P + y->ob, n, C, C, ST_W_IN_OUT);
    OPS->residual_forward(be, g->res2, g->x, g->proj, (int)NC);
    OPS->layernorm_forward(be, g->ln, g->stat_a, g->stat_b, g->res2, P + y->ln2w, P + y->ln2b, n, C);
    gen_matmul(g, g->fc, g->ln, P + y->fcw, P + y->fcb, n, C, 4 * C, ST_W_IN_OUT);
    OPS->gelu_forward(be, g->fcg, g->fc, (int)(NC * 4));
    gen_matmul(g, g->proj, g->fcg, P + y->downw, P + y->downb, n, 4 * C, C, ST_W_IN_OUT);
    OPS->residual_forward(be, g->x, g->res2, g->proj, (int)NC);
}

#define OPTP(P, o) ((o) == NONE ? NULL : (P) + (o))

static void layer_step_rms_swiglu(st_gen *g, const float *P, const gen_layer *y, int l, int n) {
    st_backend *be = g->be;
    int C = g->C, NH = g->NH, NKV = g->NKV, hs = g->hs, Q = g->Q, K = g->K, W = g->W, F = g->Fh;
    size_t NC = (size_t)n * C, half = (size_t)hs / 2;
    const float *cs = g->cos + (size_t)g->pos * half, *sn = g->sin + (size_t)g->pos * half;
    OPS->rmsnorm_forward(be, g->ln, g->stat_a, g->x, P + y->ln1w, n, 1, C, C, g->eps);
    gen_matmul(g, g->qkv, g->ln, P + y->qkvw, OPTP(P, y->qkvb), n, C, W, ST_W_OUT_IN);
    float *qk = g->qkv; /* the q and k that attention sees; v stays in qkv */
    if (y->qn != NONE) {
        qk = g->qkn;
        OPS->rmsnorm_forward(be, qk, g->stat_a, g->qkv, P + y->qn, n, NH, hs, W, g->eps);
        OPS->rmsnorm_forward(be, qk + Q, g->stat_b, g->qkv + Q, P + y->kn, n, NKV, hs, W, g->eps);
    }
    OPS->rope_forward(be, qk, cs, sn, 1, n, NH, hs, W);
    OPS->rope_forward(be, qk + Q, cs, sn, 1, n, NKV, hs, W);
    cache_store(g, l, qk + Q, g->qkv + Q + K, W, n);
    cache_attend(g, l, qk, W, n, g->att);
    gen_matmul(g, g->proj, g->att, P + y->ow, OPTP(P, y->ob), n, Q, C, ST_W_OUT_IN);
    OPS->residual_forward(be, g->res2, g->x, g->proj, (int)NC);
    OPS->rmsnorm_forward(be, g->ln, g->stat_a, g->res2, P + y->ln2w, n, 1, C, C, g->eps);
    gen_matmul(g, g->fc, g->ln, P + y->fcw, NULL, n, C, 2 * F, ST_W_OUT_IN); /* gate|up */
    OPS->swiglu_forward(be, g->fcg, g->fc, n, F);
    gen_matmul(g, g->proj, g->fcg, P + y->downw, NULL, n, F, C, ST_W_OUT_IN);
    OPS->residual_forward(be, g->x, g->res2, g->proj, (int)NC);
}

static st_status check_tokens(const int32_t *tokens, int n, int V, st_err *err) {
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return st_errf(err, ST_ERR_INVALID, "generate: token %d at position %d is outside the vocabulary [0, %d)",
                           tokens[i], i, V);
    return ST_OK;
}

st_status st_gen_step(st_gen *g, const int32_t *tokens, int n, float *logits, st_err *err) {
    if (n < 1) return st_errf(err, ST_ERR_INVALID, "generate: a step needs at least one token");
    if (g->pos + n > g->max_T)
        return st_errf(err, ST_ERR_INVALID, "generate: positions %d..%d pass the cache's %d; create the decoder with "
                       "more positions", g->pos, g->pos + n - 1, g->max_T);
    st_status s = check_tokens(tokens, n, g->V, err);
    if (s) return s;
    st_backend *be = g->be;
    const float *P = g->m->params;
    int C = g->C;
    OPS->copy_to_device(be, g->tok, tokens, sizeof(int32_t) * (size_t)n);
    if (g->arch == ARCH_GPT2) /* position rows from pos on */
        OPS->encoder_forward(be, g->x, g->tok, P + g->wte, P + g->wpe + (size_t)g->pos * C, 1, n, C);
    else
        OPS->embedding_forward(be, g->x, g->tok, P + g->wte, 1, n, C);
    for (int l = 0; l < g->L; l++) {
        if (g->arch == ARCH_GPT2) layer_step_ln_gelu(g, P, &g->layers[l], l, n);
        else layer_step_rms_swiglu(g, P, &g->layers[l], l, n);
    }
    const float *last = g->x + (size_t)(n - 1) * C;
    if (g->arch == ARCH_GPT2)
        OPS->layernorm_forward(be, g->lnf, g->stat_a, g->stat_b, last, P + g->lnfw, P + g->lnfb, 1, C);
    else
        OPS->rmsnorm_forward(be, g->lnf, g->stat_a, last, P + g->lnfw, 1, 1, C, C, g->eps);
    gen_matmul(g, g->logits, g->lnf, P + g->head, NULL, 1, C, g->V, ST_W_OUT_IN);
    OPS->copy_to_host(be, logits, g->logits, sizeof(float) * (size_t)g->V);
    g->pos += n;
    return ST_OK;
}

st_status st_gen_full_forward(st_model *m, const int32_t *tokens, int n, float *logits, st_err *err) {
    if (n < 1 || n > m->max_seq)
        return st_errf(err, ST_ERR_INVALID, "generate: a prefix of %d tokens; the model has %d positions", n,
                       m->max_seq);
    st_status s = check_tokens(tokens, n, m->vocab_size, err);
    if (s) return s;
    if (!m->ops->logits)
        return st_errf(err, ST_ERR_UNSUPPORTED, "generate: no forward for architecture '%s'", m->ops->arch);
    if ((s = m->ops->alloc_acts(m, 1, n, err))) return s;
    m->ops->forward(m, tokens, NULL, 0.0f);
    const float *all = m->ops->logits(m);
    size_t V = (size_t)m->vocab_size;
    m->be->ops->copy_to_host(m->be, logits, all + (size_t)(n - 1) * V, sizeof(float) * V);
    return ST_OK;
}

/* ------------------------------------------------------------------ the loop */

st_status st_generate(st_model *m, const int32_t *prompt, int n_prompt, const st_generate_config *c,
                      st_token_fn on_token, void *ctx, int32_t *out, st_generate_result *res, st_err *err) {
    if (res) memset(res, 0, sizeof *res);
    if (n_prompt < 1) return st_errf(err, ST_ERR_INVALID, "generate: the prompt has no tokens");
    if (c->max_new < 0) return st_errf(err, ST_ERR_INVALID, "generate: max_new %d must be >= 0", c->max_new);
    st_status s = st_sampler_validate(&c->sampler, err);
    if (s) return s;
    if ((long)n_prompt + c->max_new > m->max_seq)
        return st_errf(err, ST_ERR_INVALID, "generate: a prompt of %d tokens and %d new ones pass the model's %d "
                       "positions; shorten the prompt or lower max_new", n_prompt, c->max_new, m->max_seq);
    if ((s = check_tokens(prompt, n_prompt, m->vocab_size, err))) return s;
    int V = m->vocab_size, total = n_prompt + c->max_new;
    float *logits = malloc(sizeof(float) * (size_t)V);
    float *scratch = malloc(sizeof(float) * st_sample_scratch_floats(V));
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)total);
    st_gen *g = NULL;
    if (!logits || !scratch || !seq) {
        s = st_errf(err, ST_ERR_NOMEM, "generate: out of memory");
        goto done;
    }
    memcpy(seq, prompt, sizeof(int32_t) * (size_t)n_prompt);
    if (!c->no_cache && (s = st_gen_create(&g, m, total, err))) goto done;
    st_rng rng;
    st_rng_seed(&rng, c->seed);
    double t0 = st_now();
    s = g ? st_gen_step(g, prompt, n_prompt, logits, err) : st_gen_full_forward(m, seq, n_prompt, logits, err);
    if (s) goto done;
    double t1 = st_now();
    int len = n_prompt, stopped = 0;
    for (int i = 0; i < c->max_new; i++) {
        int32_t tok = st_sample(logits, V, &c->sampler, &rng, scratch);
        seq[len++] = tok;
        if (out) out[i] = tok;
        if (res) res->n_new = i + 1;
        if ((on_token && on_token(ctx, tok)) || (c->stop_token >= 0 && tok == c->stop_token)) {
            stopped = 1;
            break;
        }
        if (i + 1 == c->max_new) break; /* the last token's logits are never used */
        s = g ? st_gen_step(g, &tok, 1, logits, err) : st_gen_full_forward(m, seq, len, logits, err);
        if (s) goto done;
    }
    double t2 = st_now();
    if (res) {
        res->n_prompt = n_prompt;
        res->prefill_s = t1 - t0;
        res->decode_s = t2 - t1;
        res->tokens_per_s = res->n_new > 0 ? res->n_new / (t2 - t0) : 0.0;
        res->stopped = stopped;
    }
done:
    st_gen_free(g);
    free(logits);
    free(scratch);
    free(seq);
    return s;
}

/* ------------------------------------------------------------------ training samples */

/* Length of the valid UTF-8 sequence at s[0..n) (1..4), or 0 when it is not one. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    size_t len = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (!len || len > n) return 0;
    unsigned char lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80, hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
    for (size_t i = 1; i < len; i++)
        if (s[i] < (i == 1 ? lo : 0x80) || s[i] > (i == 1 ? hi : 0xbf)) return 0;
    return len;
}

/* Text as it is where it is UTF-8, except control bytes other than newline and tab; those
 * and bytes outside valid UTF-8 are escaped (\xNN), so a sample of an untrained byte
 * model neither moves the terminal's cursor nor makes the log binary; a backslash is
 * doubled. */
static void put_text(FILE *f, const char *text, size_t n) {
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < n;) {
        size_t len = utf8_len(s + i, n - i);
        if (!len || (len == 1 && ((s[i] < 32 && s[i] != '\n' && s[i] != '\t') || s[i] == 127))) {
            fprintf(f, "\\x%02x", s[i]);
            i++;
        } else if (s[i] == '\\') { /* doubled, so an escape reads back unambiguously */
            fputs("\\\\", f);
            i++;
        } else {
            fwrite(s + i, 1, len, f);
            i += len;
        }
    }
}

st_status st_generate_print_sample(st_model *m, const int32_t *prompt, int n_prompt, int max_new, uint64_t seed,
                                   const char *label, FILE *f, st_err *err) {
    st_text text;
    st_status s = st_text_open(&text, m->vocab_size, NULL, err);
    if (s) return s;
    if (n_prompt + max_new > m->max_seq) max_new = m->max_seq - n_prompt;
    if (max_new < 1) return ST_OK; /* no room: nothing to show */
    st_generate_config gc = {.max_new = max_new, .sampler = {1.0f, 0, 1.0f}, .seed = seed, .stop_token = text.eod};
    int32_t *out = malloc(sizeof(int32_t) * (size_t)max_new);
    char *buf = malloc(ST_TEXT_TOKEN_MAX * ((size_t)n_prompt + max_new) + 2);
    if (!out || !buf) {
        free(out);
        free(buf);
        return st_errf(err, ST_ERR_NOMEM, "out of memory");
    }
    st_generate_result res;
    s = st_generate(m, prompt, n_prompt, &gc, NULL, NULL, out, &res, err);
    if (!s) { /* decoded whole, so a character split over tokens is checked as one */
        size_t n = 0, cut;
        for (int i = 0; i < n_prompt; i++) n += st_text_decode(&text, prompt[i], buf + n, ST_TEXT_TOKEN_MAX);
        cut = n;
        for (int i = 0; i < res.n_new; i++) n += st_text_decode(&text, out[i], buf + n, ST_TEXT_TOKEN_MAX);
        fputs(label ? label : "", f);
        put_text(f, buf, cut);
        fputc('|', f);
        put_text(f, buf + cut, n - cut);
        fputc('\n', f);
        fflush(f);
    }
    free(out);
    free(buf);
    return s;
}
