/* gpt2_arch.c - GPT-2 behind the block interface (strata/block.h).
 *
 * The pieces are gpt2.c's own block functions (the ones st_gpt2_forward/st_gpt2_backward run
 * over the model's vector), so an executor calling them in the same order computes the
 * same bits. The bound state is a GPT-2 shell on the backend (a two-row vocabulary: the
 * head is the executor's) holding only the token ids and the block functions' forward
 * and backward scratch. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "strata/block.h"
#include "strata/tier.h" /* ST_ARENA_ALIGN: bind_bytes rounds as the arena does */

typedef struct g_impl {
    st_gpt2_config cfg;
    st_param_info *tensors;
} g_impl;

static const st_gpt2_config *cfg_of(const st_arch *a) { return &((const g_impl *)a->impl)->cfg; }
static st_gpt2_model *shell_of(st_blocks *b) { return (st_gpt2_model *)b->state; }
static size_t rnd(size_t bytes) { return (bytes + ST_ARENA_ALIGN - 1) / ST_ARENA_ALIGN * ST_ARENA_ALIGN; }

static size_t g_block_act_floats(const st_arch *a, int B, int T) {
    size_t N = (size_t)B * T, C = (size_t)cfg_of(a)->n_embd, NH = (size_t)cfg_of(a)->n_head;
    return N * C * 15 + N * 4 + NH * N; /* ln1 qkv(3) atty res2 ln2 | fch fchg (4 each) | stats | lse */
}

static st_gpt2_config shell_cfg(const st_arch *a) {
    st_gpt2_config d = *cfg_of(a);
    d.vocab_size = 2; /* the least valid: the shell never holds the vocabulary */
    return d;
}

/* The scratch, and the packed documents' positions and starts (2 B T int32, allocated here
 * rather than at the first packed batch, so a plan that fills its budget holds them too). */
static size_t g_bind_bytes(const st_arch *a, int B, int T) {
    return rnd(st_gpt2_scratch_bytes(cfg_of(a), B, T)) + rnd(2 * (size_t)B * T * sizeof(int32_t));
}

static st_status g_bind(st_blocks *b, st_err *err) {
    st_gpt2_model *m = calloc(1, sizeof *m);
    if (!m) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    st_gpt2_config d = shell_cfg(b->arch);
    st_status s = st_gpt2_create_shell(m, &d, b->be, err);
    if (!s) s = st_gpt2_alloc_scratch(m, b->B, b->T, err);
    if (!s && !(m->docs = b->be->ops->alloc(b->be, 2 * (size_t)b->B * b->T * sizeof(int32_t))))
        s = st_errf(err, ST_ERR_NOMEM, "gpt2: out of memory for the documents of a %d x %d batch", b->B, b->T);
    if (s) {
        st_gpt2_free(m);
        free(m);
        return s;
    }
    b->state = m;
    return ST_OK;
}

static void g_unbind(st_blocks *b) {
    st_gpt2_model *m = shell_of(b);
    if (m) {
        st_gpt2_free(m);
        free(m);
    }
    b->state = NULL;
}

static void g_embed_forward(st_blocks *b, const float *emb_w, const int32_t *host_inputs, float *out) {
    st_gpt2_model *m = shell_of(b);
    int C = m->cfg.n_embd, V = cfg_of(b->arch)->vocab_size, N = b->B * b->T;
    m->emb_w = (float *)emb_w;
    if (host_inputs) m->be->ops->copy_to_device(m->be, st_gpt2_token_ids(m), host_inputs, sizeof(int32_t) * (size_t)N);
    if (m->pos_dev) { /* packed documents: st_gpt2_embed_forward's ops, so the same bits as in memory */
        float *scratch = st_gpt2_scratch(m);
        m->be->ops->embedding_forward(m->be, out, st_gpt2_token_ids(m), emb_w, b->B, b->T, C);
        m->be->ops->embedding_forward(m->be, scratch, m->pos_dev, emb_w + (size_t)V * C, b->B, b->T, C);
        m->be->ops->residual_forward(m->be, out, out, scratch, N * C);
    } else {
        m->be->ops->encoder_forward(m->be, out, st_gpt2_token_ids(m), emb_w, emb_w + (size_t)V * C, b->B, b->T, C);
    }
}

static int32_t *g_token_ids(st_blocks *b) { return st_gpt2_token_ids(shell_of(b)); }

static void g_embed_backward(st_blocks *b, float *emb_g, const float *dres) {
    st_gpt2_model *m = shell_of(b);
    int C = m->cfg.n_embd, V = cfg_of(b->arch)->vocab_size;
    if (m->pos_dev) { /* st_gpt2_embed_backward's ops */
        m->be->ops->embedding_backward(m->be, emb_g, dres, st_gpt2_token_ids(m), b->B, b->T, C);
        m->be->ops->embedding_backward(m->be, emb_g + (size_t)V * C, dres, m->pos_dev, b->B, b->T, C);
    } else {
        m->be->ops->encoder_backward(m->be, emb_g, emb_g + (size_t)V * C, dres, st_gpt2_token_ids(m), b->B, b->T, C);
    }
}

/* Packed documents: the shell's (st_gpt2_set_docs), read by the embedding and the blocks'
 * attention until the next call. */
static st_status g_set_docs(st_blocks *b, const int32_t *positions, const int32_t *doc_start, st_err *err) {
    return st_gpt2_set_docs(shell_of(b), positions, doc_start, err);
}

static void g_block_forward(st_blocks *b, const float *w, const float *in, float *acts, float *out) {
    st_gpt2_model *m = shell_of(b);
    m->hook = b->hook;
    st_gpt2_block_acts a = st_gpt2_block_acts_at(m, acts, out);
    st_gpt2_block_forward(m, w, in, &a);
}

static void g_block_backward(st_blocks *b, const float *w, float *g, const float *in, const float *acts,
                             float *dres) {
    st_gpt2_model *m = shell_of(b);
    m->hook = b->hook;
    st_gpt2_block_acts a = st_gpt2_block_acts_at(m, (float *)acts, NULL);
    st_gpt2_block_backward(m, w, g, in, &a, dres);
}

static void g_norm_forward(st_blocks *b, const float *nw, const float *x, float *xn, float *stats) {
    int C = cfg_of(b->arch)->n_embd, N = b->B * b->T;
    b->be->ops->layernorm_forward(b->be, xn, stats, stats + N, x, nw, nw + C, N, C);
}

static void g_norm_backward(st_blocks *b, float *dx, float *ng, const float *dxn, const float *x, const float *nw,
                            const float *stats) {
    int C = cfg_of(b->arch)->n_embd, N = b->B * b->T;
    b->be->ops->layernorm_backward(b->be, dx, ng, ng + C, dxn, x, nw, stats, stats + N, N, C);
}

static void g_init(const st_arch *a, float *host, uint64_t seed) {
    st_params_init_by_role(a->lay.tensors, a->lay.n_tensors, host, seed, "c_proj.weight",
                           1.0f / sqrtf(2.0f * cfg_of(a)->n_layer));
}

static double g_block_flops(const st_arch *a, int T) {
    double C = cfg_of(a)->n_embd;
    return 6.0 * 12.0 * C * C + 6.0 * T * C;
}

static double g_head_flops(const st_arch *a) { return 6.0 * (double)cfg_of(a)->vocab_size * cfg_of(a)->n_embd; }

static void g_destroy(st_arch *a) {
    g_impl *g = a->impl;
    if (g) free(g->tensors);
    free(g);
    free(a);
}

static const st_arch_ops gpt2_arch_ops = {
    .name = "gpt2",
    .block_act_floats = g_block_act_floats,
    .bind_bytes = g_bind_bytes,
    .bind = g_bind,
    .unbind = g_unbind,
    .embed_forward = g_embed_forward,
    .token_ids = g_token_ids,
    .embed_backward = g_embed_backward,
    .block_forward = g_block_forward,
    .block_backward = g_block_backward,
    .norm_forward = g_norm_forward,
    .norm_backward = g_norm_backward,
    .init = g_init,
    .block_flops_per_token = g_block_flops,
    .head_flops_per_token = g_head_flops,
    .destroy = g_destroy,
    .set_docs = g_set_docs,
};

st_status st_arch_gpt2(st_arch **out, const st_gpt2_config *cfg, st_err *err) {
    *out = NULL;
    st_gpt2_model sh;
    st_status s = st_gpt2_create_shell(&sh, cfg, NULL, err);
    if (s) return s;
    st_arch *a = calloc(1, sizeof *a);
    g_impl *g = calloc(1, sizeof *g);
    if (!a || !g) {
        free(a);
        free(g);
        free(sh.tensors);
        return st_errf(err, ST_ERR_NOMEM, "out of memory");
    }
    g->cfg = *cfg;
    g->tensors = sh.tensors; /* the shell's table, now the arch's */
    a->ops = &gpt2_arch_ops;
    a->impl = g;
    st_arch_layout *y = &a->lay;
    size_t C = (size_t)cfg->n_embd;
    y->n_blocks = cfg->n_layer;
    y->n_params = sh.n_params;
    y->emb_numel = sh.block_offset0;
    y->block_offset0 = sh.block_offset0;
    y->block_numel = sh.block_numel;
    y->norm_offset = sh.n_params - 2 * C;
    y->norm_numel = 2 * C;
    y->head_offset = 0;
    y->tied = 1;
    y->vocab_size = cfg->vocab_size;
    y->n_embd = cfg->n_embd;
    y->max_seq = cfg->max_seq;
    y->n_tensors = sh.n_tensors;
    y->n_pre_tensors = 2;
    y->n_post_tensors = 2;
    y->tensors_per_block = (sh.n_tensors - 4) / cfg->n_layer;
    y->tensors = g->tensors;
    y->norm_stat_floats = 2;
    *out = a;
    return ST_OK;
}
