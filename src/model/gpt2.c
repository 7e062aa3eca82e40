/* gpt2.c - GPT-2 forward and backward as a sequence of backend ops.
 *
 * Shapes: B batch, T time, C channels, NH heads, V vocabulary, L layers, N = B*T.
 * Per layer the forward keeps what backward needs: ln1, qkv, atty, lse, residual2,
 * ln2, fch, fch_gelu, residual3 (and LayerNorm statistics). The attention keeps only
 * its output and lse (B,NH,T); the classifier has one (N,V) buffer that holds logits
 * and then, in place, their gradient.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"
#include "strata/model.h"
#include "strata/prof.h"

/* ------------------------------------------------------------------ configs */

static const struct { const char *name; st_gpt2_config cfg; } presets[] = {
    {"gpt2-124m", {50257, 1024, 12, 12, 768}},
    {"gpt2-350m", {50257, 1024, 24, 16, 1024}},
    {"gpt2-mini", {256, 256, 4, 4, 128}},
    {"gpt2-tiny", {64, 16, 2, 4, 32}},
};

st_status st_gpt2_config_preset(const char *name, st_gpt2_config *cfg, st_err *err) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(name, presets[i].name)) { *cfg = presets[i].cfg; return ST_OK; }
    return st_errf(err, ST_ERR_INVALID, "unknown model '%s'; known models: %s", name, st_gpt2_preset_names());
}

const char *st_gpt2_preset_names(void) { return "gpt2-124m, gpt2-350m, gpt2-mini, gpt2-tiny"; }

st_status st_gpt2_config_validate(const st_gpt2_config *c, st_err *err) {
    if (c->vocab_size < 2 || c->vocab_size > (1 << 24))
        return st_errf(err, ST_ERR_INVALID, "vocab_size %d is out of range [2, 16777216]", c->vocab_size);
    if (c->max_seq < 1 || c->max_seq > (1 << 20))
        return st_errf(err, ST_ERR_INVALID, "max_seq %d is out of range [1, 1048576]", c->max_seq);
    if (c->n_layer < 1 || c->n_layer > 4096)
        return st_errf(err, ST_ERR_INVALID, "n_layer %d is out of range [1, 4096]", c->n_layer);
    if (c->n_embd < 1 || c->n_embd > 65536)
        return st_errf(err, ST_ERR_INVALID, "n_embd %d is out of range [1, 65536]", c->n_embd);
    if (c->n_head < 1 || c->n_embd % c->n_head != 0)
        return st_errf(err, ST_ERR_INVALID, "n_head %d must be >= 1 and divide n_embd %d", c->n_head, c->n_embd);
    return ST_OK;
}

/* ------------------------------------------------------------------ roles */

static int ends_with(const char *s, const char *suffix) {
    size_t ls = strlen(s), lx = strlen(suffix);
    return ls >= lx && !strcmp(s + ls - lx, suffix);
}

st_role st_role_from_name(const char *name) {
    int is_norm = strstr(name, "ln_") || strstr(name, "norm");
    if (is_norm) return ends_with(name, ".bias") ? ST_ROLE_NORM_BIAS : ST_ROLE_NORM_WEIGHT;
    if (ends_with(name, ".bias")) return ST_ROLE_BIAS;
    if (strstr(name, "wte") || strstr(name, "wpe") || strstr(name, "embed_tokens")) return ST_ROLE_EMBEDDING;
    return ST_ROLE_MATMUL_WEIGHT;
}

const char *st_role_name(st_role r) {
    static const char *names[] = {"embedding", "matmul_weight", "bias", "norm_weight", "norm_bias"};
    return (unsigned)r < 5 ? names[r] : "?";
}

/* ------------------------------------------------------------------ layout */

/* Block slab entries, in order, as (suffix, rows, cols) with dims in units of C. */
enum { BLK_LN1W, BLK_LN1B, BLK_QKVW, BLK_QKVB, BLK_PROJW, BLK_PROJB, BLK_LN2W, BLK_LN2B,
       BLK_FCW, BLK_FCB, BLK_FCPW, BLK_FCPB, BLK_COUNT };
static const struct { const char *suffix; int rows_c, cols_c; } blk_layout[BLK_COUNT] = {
    {"ln_1.weight", 0, 1},        {"ln_1.bias", 0, 1},        {"attn.c_attn.weight", 1, 3},
    {"attn.c_attn.bias", 0, 3},   {"attn.c_proj.weight", 1, 1}, {"attn.c_proj.bias", 0, 1},
    {"ln_2.weight", 0, 1},        {"ln_2.bias", 0, 1},        {"mlp.c_fc.weight", 1, 4},
    {"mlp.c_fc.bias", 0, 4},      {"mlp.c_proj.weight", 4, 1}, {"mlp.c_proj.bias", 0, 1},
};

typedef struct block_ptrs {
    float *ln1w, *ln1b, *qkvw, *qkvb, *projw, *projb, *ln2w, *ln2b, *fcw, *fcb, *fcpw, *fcpb;
} block_ptrs;

/* Pointers into one block's slab (weights or gradients share the layout); held (block.h's held
 * slab): the 1-D tensors packed, the matmul weights NULL. off: each tensor's offset in the whole
 * slab (NULL: not wanted). */
static block_ptrs slab_ptrs_(const st_gpt2_model *m, float *slab, int held, size_t *off) {
    size_t C = (size_t)m->cfg.n_embd, o = 0;
    float *p = slab;
    block_ptrs b;
    float **slots[BLK_COUNT] = {&b.ln1w, &b.ln1b, &b.qkvw, &b.qkvb, &b.projw, &b.projb,
                                &b.ln2w, &b.ln2b, &b.fcw,  &b.fcb,  &b.fcpw, &b.fcpb};
    for (int i = 0; i < BLK_COUNT; i++) {
        size_t rows = blk_layout[i].rows_c ? blk_layout[i].rows_c * C : 1, n = rows * blk_layout[i].cols_c * C;
        int skip = held && blk_layout[i].rows_c; /* a matmul weight: the hook's */
        *slots[i] = skip ? NULL : p;
        if (!skip) p += n;
        if (off) off[i] = o;
        o += n;
    }
    return b;
}
static block_ptrs slab_ptrs(const st_gpt2_model *m, float *slab) { return slab_ptrs_(m, slab, 0, NULL); }
static int held_slab(const st_gpt2_model *m) { return m->hook && m->hook->held; }


static void add_tensor(st_gpt2_model *m, const char *name, size_t *off, int ndim, int d0, int d1) {
    st_param_info *t = &m->tensors[m->n_tensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->offset = *off;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = ndim > 1 ? d1 : 1;
    t->numel = (size_t)d0 * (ndim > 1 ? (size_t)d1 : 1);
    t->role = st_role_from_name(name);
    *off += t->numel;
}

/* ------------------------------------------------------------------ activations */

struct st_gpt2_acts {
    int32_t *inputs, *targets; /* backend copies (N) */
    float *encoded;            /* (N,C) */
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *lse, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch, *fchg, *res3;
    float *lnf, *lnf_mean, *lnf_rstd;
    float *logits, *losses;    /* (N,V), (N) */
    float *scratch;            /* (N,C): projection outputs in forward */
    /* backward scratch */
    float *dres, *dC, *dC4a, *dC4b, *dC3;
    float *losses_host;
    void *block;               /* the single allocation */
};

size_t st_gpt2_act_bytes(const st_gpt2_config *cfg, int B, int T) { return st_gpt2_act_bytes_layers(cfg, B, T, cfg->n_layer); }

size_t st_gpt2_act_bytes_layers(const st_gpt2_config *cfg, int B, int T, int n_layers) {
    size_t N = (size_t)B * T, C = cfg->n_embd, L = (size_t)n_layers, NH = cfg->n_head, V = cfg->vocab_size;
    size_t per_layer = N * C * 8 + N * 4 * C * 2 + N * 4 + NH * N; /* ln1 qkv(3) atty res2 ln2 res3 + fch fchg + stats + lse */
    size_t total = 2 * N /* tokens */ + N * C + L * per_layer + N * C + 2 * N + N * V + N + N * C /* scratch */
                   + N * C * 2 + N * 4 * C * 2 + N * 3 * C;
    return total * 4;
}

st_status st_gpt2_alloc_acts(st_gpt2_model *m, int B, int T, st_err *err) {
    return st_gpt2_alloc_acts_layers(m, B, T, m->cfg.n_layer, err);
}

/* scratch_only: the token ids and the block functions' scratch, nothing else (the block
 * interface's bound state, gpt2_arch.c). */
static size_t scratch_floats(const st_gpt2_config *cfg, int B, int T) {
    size_t N = (size_t)B * T, C = cfg->n_embd;
    return N /* token ids */ + N * C /* scratch */ + N * C + N * 4 * C * 2 + N * 3 * C /* dC dC4a dC4b dC3 */;
}
size_t st_gpt2_scratch_bytes(const st_gpt2_config *cfg, int B, int T) { return scratch_floats(cfg, B, T) * 4; }

static st_status alloc_acts(st_gpt2_model *m, int B, int T, int n_layers, int scratch_only, st_err *err);
st_status st_gpt2_alloc_scratch(st_gpt2_model *m, int B, int T, st_err *err) { return alloc_acts(m, B, T, 0, 1, err); }
const float *st_gpt2_row_losses(const st_gpt2_model *m) { return m->acts ? m->acts->losses_host : NULL; }

st_status st_gpt2_alloc_acts_layers(st_gpt2_model *m, int B, int T, int n_layers, st_err *err) {
    return alloc_acts(m, B, T, n_layers, 0, err);
}

static st_status alloc_acts(st_gpt2_model *m, int B, int T, int n_layers, int scratch_only, st_err *err) {
    if (B < 1 || T < 1) return st_errf(err, ST_ERR_INVALID, "batch %d and seq %d must be >= 1", B, T);
    if (n_layers < 0 || n_layers > m->cfg.n_layer)
        return st_errf(err, ST_ERR_INVALID, "activation layers %d out of range [0, %d]", n_layers, m->cfg.n_layer);
    if (T > m->cfg.max_seq)
        return st_errf(err, ST_ERR_INVALID, "seq %d exceeds the model's max_seq %d (rows of wpe)", T, m->cfg.max_seq);
    if (m->acts) {
        m->be->ops->dealloc(m->be, m->acts->block);
        free(m->acts->losses_host);
        free(m->acts);
        m->acts = NULL;
    }
    if (m->docs) { /* documents are of one batch shape */
        m->be->ops->dealloc(m->be, m->docs);
        m->docs = NULL;
    }
    m->pos_dev = m->ds_dev = NULL;
    size_t bytes = scratch_only ? st_gpt2_scratch_bytes(&m->cfg, B, T) : st_gpt2_act_bytes_layers(&m->cfg, B, T, n_layers);
    st_gpt2_acts *a = calloc(1, sizeof *a);
    if (!a) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    a->block = m->be->ops->alloc(m->be, bytes);
    a->losses_host = malloc(sizeof(float) * (size_t)B * T);
    if (!a->block || !a->losses_host) {
        if (a->block) m->be->ops->dealloc(m->be, a->block);
        free(a->losses_host);
        free(a);
        return st_errf(err, ST_ERR_NOMEM, "cannot allocate %.1f MiB of activations for batch %d x seq %d; "
                       "lower batch or seq", bytes / 1048576.0, B, T);
    }
    size_t N = (size_t)B * T, C = m->cfg.n_embd, L = (size_t)n_layers, NH = m->cfg.n_head, V = m->cfg.vocab_size;
    float *p = a->block;
#define TAKE(ptr, n) do { ptr = (void *)p; p += (n); } while (0)
    if (scratch_only) {
        TAKE(a->inputs, N);
        TAKE(a->scratch, N * C);
        TAKE(a->dC, N * C);
        TAKE(a->dC4a, N * 4 * C);
        TAKE(a->dC4b, N * 4 * C);
        TAKE(a->dC3, N * 3 * C);
        goto taken;
    }
    TAKE(a->inputs, N);
    TAKE(a->targets, N);
    TAKE(a->encoded, N * C);
    TAKE(a->ln1, L * N * C);
    TAKE(a->qkv, L * N * 3 * C);
    TAKE(a->atty, L * N * C);
    TAKE(a->res2, L * N * C);
    TAKE(a->ln2, L * N * C);
    TAKE(a->res3, L * N * C);
    TAKE(a->fch, L * N * 4 * C);
    TAKE(a->fchg, L * N * 4 * C);
    TAKE(a->ln1_mean, L * N);
    TAKE(a->ln1_rstd, L * N);
    TAKE(a->ln2_mean, L * N);
    TAKE(a->ln2_rstd, L * N);
    TAKE(a->lse, L * NH * N);
    TAKE(a->lnf, N * C);
    TAKE(a->lnf_mean, N);
    TAKE(a->lnf_rstd, N);
    TAKE(a->logits, N * V);
    TAKE(a->losses, N);
    TAKE(a->scratch, N * C);
    TAKE(a->dres, N * C);
    TAKE(a->dC, N * C);
    TAKE(a->dC4a, N * 4 * C);
    TAKE(a->dC4b, N * 4 * C);
    TAKE(a->dC3, N * 3 * C);
taken:
#undef TAKE
    if ((size_t)((char *)p - (char *)a->block) > bytes) {
        m->be->ops->dealloc(m->be, a->block);
        free(a->losses_host);
        free(a);
        return st_errf(err, ST_ERR_INVALID, "internal: activation layout exceeds its size");
    }
    m->acts = a;
    m->B = B;
    m->T = T;
    return ST_OK;
}

/* ------------------------------------------------------------------ lifetime */

st_status st_gpt2_create(st_gpt2_model *m, const st_gpt2_config *cfg, st_backend *be, st_err *err) {
    return model_gpt2_create(m, cfg, 1, be, err);
}

st_status model_gpt2_create(st_gpt2_model *m, const st_gpt2_config *cfg, int with_grads, st_backend *be,
                            st_err *err) {
    st_status s = st_gpt2_create_shell(m, cfg, be, err);
    if (s) return s;
    size_t off = m->n_params;
    m->params = model_params_alloc(be, off, with_grads, &m->params_untouched);
    if (with_grads) m->grads = be->ops->alloc(be, off * sizeof(float));
    if (!m->params || (with_grads && !m->grads)) {
        st_gpt2_free(m);
        return st_errf(err, ST_ERR_NOMEM, "cannot allocate %.1f MiB for parameters%s",
                       (with_grads ? 2.0 : 1.0) * off * sizeof(float) / 1048576.0, with_grads ? " and gradients" : "");
    }
    size_t lnf_off = off - 2 * (size_t)cfg->n_embd;
    m->emb_w = m->params;
    m->lnf_w = m->params + lnf_off;
    if (m->grads) {
        m->emb_g = m->grads;
        m->lnf_g = m->grads + lnf_off;
    }
    return ST_OK;
}

st_status st_gpt2_create_shell(st_gpt2_model *m, const st_gpt2_config *cfg, st_backend *be, st_err *err) {
    memset(m, 0, sizeof *m);
    st_status s = st_gpt2_config_validate(cfg, err);
    if (s) return s;
    m->cfg = *cfg;
    m->be = be;
    int L = cfg->n_layer, C = cfg->n_embd;
    m->tensors = calloc((size_t)(2 + L * BLK_COUNT + 2), sizeof *m->tensors);
    if (!m->tensors) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    size_t off = 0;
    add_tensor(m, "transformer.wte.weight", &off, 2, cfg->vocab_size, C);
    add_tensor(m, "transformer.wpe.weight", &off, 2, cfg->max_seq, C);
    m->block_offset0 = off;
    for (int l = 0; l < L; l++) {
        for (int i = 0; i < BLK_COUNT; i++) {
            char name[96];
            snprintf(name, sizeof name, "transformer.h.%d.%s", l, blk_layout[i].suffix);
            if (blk_layout[i].rows_c) add_tensor(m, name, &off, 2, blk_layout[i].rows_c * C, blk_layout[i].cols_c * C);
            else add_tensor(m, name, &off, 1, blk_layout[i].cols_c * C, 1);
        }
        if (l == 0) m->block_numel = off - m->block_offset0;
    }
    add_tensor(m, "transformer.ln_f.weight", &off, 1, C, 1);
    add_tensor(m, "transformer.ln_f.bias", &off, 1, C, 1);
    m->n_params = off;
    return ST_OK;
}

void st_gpt2_free(st_gpt2_model *m) {
    if (!m->be) return;
    if (m->acts) {
        m->be->ops->dealloc(m->be, m->acts->block);
        free(m->acts->losses_host);
        free(m->acts);
    }
    model_params_free(m->be, m->params, m->n_params, m->params_untouched);
    if (m->grads) m->be->ops->dealloc(m->be, m->grads);
    if (m->docs) m->be->ops->dealloc(m->be, m->docs);
    free(m->tensors);
    memset(m, 0, sizeof *m);
}

const st_param_info *st_gpt2_find_tensor(const st_gpt2_model *m, const char *name) {
    return st_params_find(m->tensors, m->n_tensors, name);
}

void st_gpt2_init_random(st_gpt2_model *m, uint64_t seed) {
    /* memory that is the host's takes the draws in place; a device's through one staging buffer */
    st_host_stage hs;
    if (st_host_stage_open(&hs, m->be, m->n_params, NULL)) return;
    float *host = st_host_stage_at(&hs, m->params);
    const char *suffix;
    float scale;
    model_gpt2_init_rule(m->cfg.n_layer, &suffix, &scale);
    st_params_init_by_role(m->tensors, m->n_tensors, host, seed, suffix, scale);
    st_host_stage_put(&hs, m->params, m->n_params);
    st_host_stage_close(&hs);
}

/* ------------------------------------------------------------------ forward / backward */

#define OPS (m->be->ops)

st_gpt2_block_acts st_gpt2_layer_acts(const st_gpt2_model *m, int l) {
    st_gpt2_acts *a = m->acts;
    size_t N = (size_t)m->B * m->T, NC = N * (size_t)m->cfg.n_embd;
    st_gpt2_block_acts b = {
        .ln1 = a->ln1 + l * NC,           .ln1_mean = a->ln1_mean + l * N, .ln1_rstd = a->ln1_rstd + l * N,
        .qkv = a->qkv + l * NC * 3,       .atty = a->atty + l * NC,        .lse = a->lse + (size_t)l * m->cfg.n_head * N,
        .res2 = a->res2 + l * NC,         .ln2 = a->ln2 + l * NC,          .ln2_mean = a->ln2_mean + l * N,
        .ln2_rstd = a->ln2_rstd + l * N,  .fch = a->fch + l * NC * 4,      .fchg = a->fchg + l * NC * 4,
        .out = a->res3 + l * NC,
    };
    return b;
}

size_t st_gpt2_block_act_floats(const st_gpt2_model *m) {
    size_t N = (size_t)m->B * m->T, C = (size_t)m->cfg.n_embd, NH = (size_t)m->cfg.n_head;
    return N * C * 7 + N * C * 8 + N * 4 + NH * N; /* ln1 qkv(3) atty res2 ln2 | fch fchg | stats | lse */
}

st_gpt2_block_acts st_gpt2_block_acts_at(const st_gpt2_model *m, float *buf, float *out) {
    size_t N = (size_t)m->B * m->T, NC = N * (size_t)m->cfg.n_embd;
    st_gpt2_block_acts b;
    float *p = buf;
    b.ln1 = p; p += NC;
    b.qkv = p; p += 3 * NC;
    b.atty = p; p += NC;
    b.res2 = p; p += NC;
    b.ln2 = p; p += NC;
    b.fch = p; p += 4 * NC;
    b.fchg = p; p += 4 * NC;
    b.ln1_mean = p; p += N;
    b.ln1_rstd = p; p += N;
    b.ln2_mean = p; p += N;
    b.ln2_rstd = p; p += N;
    b.lse = p;
    b.out = out;
    return b;
}

const float *st_gpt2_layer_input(const st_gpt2_model *m, int l) {
    return l == 0 ? m->acts->encoded : m->acts->res3 + (size_t)(l - 1) * m->B * m->T * m->cfg.n_embd;
}

/* The block's matmul (Conv1D weights, ST_W_IN_OUT), or the hook's linear map in its place, then
 * the hook's additive term (model.h's st_linear_hook). */
static void mm_forward(st_gpt2_model *m, int mm, float *out, const float *x, const float *w, const float *bias, int N,
                       int C, int OC) {
    st_linear_hook *hk = m->hook;
    if (hk && hk->linear_forward) hk->linear_forward(hk, mm, out, x, w, bias, N);
    else OPS->matmul_forward(m->be, out, x, w, bias, N, C, OC, ST_W_IN_OUT);
    if (hk && hk->forward) hk->forward(hk, mm, out, x, N);
}

/* dx (N,C) is WRITTEN (the block's input gradients start here): by the backend's
 * matmul_backward_write where it has one, else cleared and accumulated into. */
static void mm_backward(st_gpt2_model *m, int mm, float *dx, float *dw, float *dbias, const float *dout,
                        const float *x, const float *w, int N, int C, int OC) {
    st_linear_hook *hk = m->hook;
    if (!(hk && hk->linear_backward) && OPS->matmul_backward_write) {
        OPS->matmul_backward_write(m->be, dx, dw, dbias, dout, x, w, N, C, OC, ST_W_IN_OUT);
    } else {
        OPS->memset0(m->be, dx, (size_t)N * C * sizeof(float));
        if (hk && hk->linear_backward) hk->linear_backward(hk, mm, dx, dbias, dout, x, w, N);
        else OPS->matmul_backward(m->be, dx, dw, dbias, dout, x, w, N, C, OC, ST_W_IN_OUT);
    }
    if (hk && hk->backward) hk->backward(hk, mm, dx, dout, x, N);
}

void st_gpt2_block_forward(st_gpt2_model *m, const float *wslab, const float *in, const st_gpt2_block_acts *a) {
    st_backend *be = m->be;
    int B = m->B, T = m->T, C = m->cfg.n_embd, NH = m->cfg.n_head, N = B * T;
    size_t NC = (size_t)N * C;
    float *scratch = m->acts->scratch;
    block_ptrs w = slab_ptrs_(m, (float *)wslab, held_slab(m), NULL);
    OPS->layernorm_forward(be, a->ln1, a->ln1_mean, a->ln1_rstd, in, w.ln1w, w.ln1b, N, C);
    mm_forward(m, ST_MM_QKV, a->qkv, a->ln1, w.qkvw, w.qkvb, N, C, 3 * C);
    if (m->ds_dev) OPS->attention_doc_forward(be, a->atty, a->lse, a->qkv, m->ds_dev, B, T, C, NH);
    else OPS->attention_forward(be, a->atty, a->lse, a->qkv, B, T, C, NH);
    mm_forward(m, ST_MM_O, scratch, a->atty, w.projw, w.projb, N, C, C);
    OPS->residual_forward(be, a->res2, in, scratch, (int)NC);
    OPS->layernorm_forward(be, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w.ln2w, w.ln2b, N, C);
    mm_forward(m, ST_MM_UP, a->fch, a->ln2, w.fcw, w.fcb, N, C, 4 * C);
    OPS->gelu_forward(be, a->fchg, a->fch, (int)(NC * 4));
    mm_forward(m, ST_MM_DOWN, scratch, a->fchg, w.fcpw, w.fcpb, N, 4 * C, C);
    OPS->residual_forward(be, a->out, a->res2, scratch, (int)NC);
}

void st_gpt2_block_backward(st_gpt2_model *m, const float *wslab, float *gslab, const float *in, const st_gpt2_block_acts *a,
                         float *dres) {
    st_gpt2_acts *s = m->acts;
    st_backend *be = m->be;
    int B = m->B, T = m->T, C = m->cfg.n_embd, NH = m->cfg.n_head, N = B * T;
    size_t NC = (size_t)N * C;
    size_t off[BLK_COUNT];
    block_ptrs w = slab_ptrs_(m, (float *)wslab, held_slab(m), off), g;
    st_linear_hook *hk = m->hook;
    if (hk && hk->frozen) { /* no gradient of the base: the matmuls form none, the norms' go to scratch */
        memset(&g, 0, sizeof g);
        g.ln1w = g.ln2w = hk->norm_scratch;
        g.ln1b = g.ln2b = hk->norm_scratch + C;
    } else if (!gslab && hk && hk->grad_at) { /* the hook keeps the gradients (POET-X) */
        float **gs[BLK_COUNT] = {&g.ln1w, &g.ln1b, &g.qkvw, &g.qkvb, &g.projw, &g.projb,
                                 &g.ln2w, &g.ln2b, &g.fcw,  &g.fcb,  &g.fcpw, &g.fcpb};
        for (int i = 0; i < BLK_COUNT; i++) *gs[i] = hk->grad_at(hk, hk->layer, off[i]);
    } else {
        g = slab_ptrs(m, gslab);
    }
    /* dres is the gradient of the residual stream; it flows through the block's
     * identity path unchanged and the two branches add into it. The branches' own
     * gradients (dC4a, dC4b, dC, dC3) are written by the op that forms them, not
     * cleared and added to, where the backend has the write variants. */
    mm_backward(m, ST_MM_DOWN, s->dC4a, g.fcpw, g.fcpb, dres, a->fchg, w.fcpw, N, 4 * C, C);
    if (OPS->gelu_backward_write) {
        OPS->gelu_backward_write(be, s->dC4b, a->fch, s->dC4a, (int)(NC * 4));
    } else {
        OPS->memset0(be, s->dC4b, NC * 4 * sizeof(float));
        OPS->gelu_backward(be, s->dC4b, a->fch, s->dC4a, (int)(NC * 4));
    }
    mm_backward(m, ST_MM_UP, s->dC, g.fcw, g.fcb, s->dC4b, a->ln2, w.fcw, N, C, 4 * C);
    OPS->layernorm_backward(be, dres, g.ln2w, g.ln2b, s->dC, a->res2, w.ln2w, a->ln2_mean, a->ln2_rstd, N, C);
    mm_backward(m, ST_MM_O, s->dC, g.projw, g.projb, dres, a->atty, w.projw, N, C, C);
    if (OPS->attention_backward_write) {
        OPS->attention_backward_write(be, s->dC3, s->dC, a->qkv, a->atty, a->lse, m->ds_dev, B, T, C, NH);
    } else {
        OPS->memset0(be, s->dC3, NC * 3 * sizeof(float));
        if (m->ds_dev)
            OPS->attention_doc_backward(be, s->dC3, s->dC, a->qkv, a->atty, a->lse, m->ds_dev, B, T, C, NH);
        else OPS->attention_backward(be, s->dC3, s->dC, a->qkv, a->atty, a->lse, B, T, C, NH);
    }
    mm_backward(m, ST_MM_QKV, s->dC, g.qkvw, g.qkvb, s->dC3, a->ln1, w.qkvw, N, C, 3 * C);
    OPS->layernorm_backward(be, dres, g.ln1w, g.ln1b, s->dC, in, w.ln1w, a->ln1_mean, a->ln1_rstd, N, C);
}

void st_gpt2_embed_forward(st_gpt2_model *m, const int32_t *inputs, const int32_t *targets) {
    st_gpt2_acts *a = m->acts;
    int B = m->B, T = m->T, C = m->cfg.n_embd, V = m->cfg.vocab_size, N = B * T;
    st_prof_span pc = st_prof_begin(ST_PROF_CAT_COPY, "copy h2d tokens", -1);
    OPS->copy_to_device(m->be, a->inputs, inputs, sizeof(int32_t) * N);
    if (targets) OPS->copy_to_device(m->be, a->targets, targets, sizeof(int32_t) * N);
    st_prof_end_bytes(&pc, (int64_t)sizeof(int32_t) * N * (targets ? 2 : 1));
    st_prof_span pe = st_prof_begin(ST_PROF_CAT_COMPUTE, "embedding", -1);
    if (m->pos_dev) { /* wte[token] + wpe[position]: the rows gathered, then one add (encoder_forward's) */
        OPS->embedding_forward(m->be, a->encoded, a->inputs, m->emb_w, B, T, C);
        OPS->embedding_forward(m->be, a->scratch, m->pos_dev, m->emb_w + (size_t)V * C, B, T, C);
        OPS->residual_forward(m->be, a->encoded, a->encoded, a->scratch, N * C);
    } else {
        OPS->encoder_forward(m->be, a->encoded, a->inputs, m->emb_w, m->emb_w + (size_t)V * C, B, T, C);
    }
    st_prof_end(&pe);
}

st_status st_gpt2_set_docs(st_gpt2_model *m, const int32_t *positions, const int32_t *doc_start, st_err *err) {
    if (!m->acts) return st_errf(err, ST_ERR_INVALID, "gpt2: documents set before the activations");
    int plain_pos, plain_ds;
    st_status s = st_docs_check(positions, doc_start, m->B, m->T, m->cfg.max_seq, &plain_pos, &plain_ds, err);
    if (s) return s;
    const st_backend_ops *o = m->be->ops;
    if ((!plain_ds && (!o->attention_doc_forward || !o->attention_doc_backward)) ||
        (!plain_pos && (!o->embedding_forward || !o->embedding_backward)))
        return st_errf(err, ST_ERR_UNSUPPORTED, "backend '%s' has no attention restricted to documents; train with "
                       "--doc_mask 0", o->name);
    size_t N = (size_t)m->B * m->T;
    m->pos_dev = m->ds_dev = NULL;
    if (plain_pos && plain_ds) return ST_OK;
    if (!m->docs && !(m->docs = o->alloc(m->be, 2 * N * sizeof(int32_t))))
        return st_errf(err, ST_ERR_NOMEM, "gpt2: out of memory for the documents of a %d x %d batch", m->B, m->T);
    if (!plain_pos) {
        o->copy_to_device(m->be, m->docs, positions, N * sizeof(int32_t));
        m->pos_dev = m->docs;
    }
    if (!plain_ds) {
        o->copy_to_device(m->be, m->docs + N, doc_start, N * sizeof(int32_t));
        m->ds_dev = m->docs + N;
    }
    return ST_OK;
}

float st_gpt2_head_forward(st_gpt2_model *m, const float *x, const int32_t *targets, float dloss) {
    st_gpt2_acts *a = m->acts;
    st_backend *be = m->be;
    int C = m->cfg.n_embd, V = m->cfg.vocab_size, N = m->B * m->T;
    const float *lnfw = m->lnf_w, *lnfb = lnfw + C;
    st_prof_span pk = st_prof_begin(ST_PROF_CAT_COMPUTE, "classifier", -1);
    OPS->layernorm_forward(be, a->lnf, a->lnf_mean, a->lnf_rstd, x, lnfw, lnfb, N, C);
    OPS->matmul_forward(be, a->logits, a->lnf, m->emb_w, NULL, N, C, V, ST_W_OUT_IN);
    if (!targets) { st_prof_end(&pk); m->mean_loss = NAN; return NAN; }
    OPS->crossentropy_forward_backward(be, a->logits, a->losses, a->targets, N, V, dloss);
    st_prof_end(&pk);
    st_prof_span pc = st_prof_begin(ST_PROF_CAT_COPY, "copy d2h losses", -1);
    OPS->copy_to_host(be, a->losses_host, a->losses, sizeof(float) * N);
    st_prof_end_bytes(&pc, (int64_t)sizeof(float) * N);
    double sum = 0;
    int counted = 0;
    for (int i = 0; i < N; i++)
        if (targets[i] >= 0) { sum += a->losses_host[i]; counted++; }
    m->mean_loss = counted ? (float)(sum / counted) : 0.0f;
    return m->mean_loss;
}

void st_gpt2_head_backward(st_gpt2_model *m, const float *x, float *dres) {
    st_gpt2_acts *a = m->acts;
    st_backend *be = m->be;
    int C = m->cfg.n_embd, V = m->cfg.vocab_size, N = m->B * m->T;
    size_t NC = (size_t)N * C;
    int frozen = m->hook && m->hook->frozen; /* no gradient of the head, the final norm's to scratch */
    float *dlnfw = frozen ? m->hook->norm_scratch : m->lnf_g, *dlnfb = dlnfw + C;
    const float *lnfw = m->lnf_w;
    /* the logits buffer already holds dlogits */
    st_prof_span pk = st_prof_begin(ST_PROF_CAT_COMPUTE, "classifier backward", -1);
    if (OPS->matmul_backward_write) {
        OPS->matmul_backward_write(be, a->dC, frozen ? NULL : m->emb_g, NULL, a->logits, a->lnf, m->emb_w, N, C, V,
                                   ST_W_OUT_IN);
    } else {
        OPS->memset0(be, a->dC, NC * sizeof(float));
        OPS->matmul_backward(be, a->dC, frozen ? NULL : m->emb_g, NULL, a->logits, a->lnf, m->emb_w, N, C, V,
                             ST_W_OUT_IN);
    }
    OPS->memset0(be, dres, NC * sizeof(float));
    OPS->layernorm_backward(be, dres, dlnfw, dlnfb, a->dC, x, lnfw, a->lnf_mean, a->lnf_rstd, N, C);
    st_prof_end(&pk);
}

void st_gpt2_embed_backward(st_gpt2_model *m, const float *dres) {
    int C = m->cfg.n_embd, V = m->cfg.vocab_size;
    if (m->hook && m->hook->frozen) return; /* frozen embeddings: nothing to form */
    st_prof_span pe = st_prof_begin(ST_PROF_CAT_COMPUTE, "embedding backward", -1);
    if (m->pos_dev) {
        OPS->embedding_backward(m->be, m->emb_g, dres, m->acts->inputs, m->B, m->T, C);
        OPS->embedding_backward(m->be, m->emb_g + (size_t)V * C, dres, m->pos_dev, m->B, m->T, C);
    } else {
        OPS->encoder_backward(m->be, m->emb_g, m->emb_g + (size_t)V * C, dres, m->acts->inputs, m->B, m->T, C);
    }
    st_prof_end(&pe);
}

float *st_gpt2_dresidual(st_gpt2_model *m) { return m->acts->dres; }
int32_t *st_gpt2_token_ids(st_gpt2_model *m) { return m->acts->inputs; }
float *st_gpt2_scratch(st_gpt2_model *m) { return m->acts->scratch; }

float st_gpt2_forward(st_gpt2_model *m, const int32_t *inputs, const int32_t *targets, float dloss) {
    return st_gpt2_forward_hooked(m, inputs, targets, dloss, NULL, NULL);
}

float st_gpt2_forward_hooked(st_gpt2_model *m, const int32_t *inputs, const int32_t *targets, float dloss,
                          void (*hook)(void *ctx, size_t offset, size_t n), void *ctx) {
    st_prof_span pf = st_prof_begin(ST_PROF_CAT_COMPUTE, "forward", -1);
    size_t post = m->block_offset0 + (size_t)m->cfg.n_layer * m->block_numel;
    if (hook) hook(ctx, 0, m->block_offset0);
    st_gpt2_embed_forward(m, inputs, targets);
    for (int l = 0; l < m->cfg.n_layer; l++) {
        size_t off = m->block_offset0 + (size_t)l * m->block_numel;
        if (hook) hook(ctx, off, m->block_numel);
        if (m->hook) m->hook->layer = l;
        st_prof_span pb = st_prof_begin(ST_PROF_CAT_COMPUTE, "forward block", l);
        st_gpt2_block_acts a = st_gpt2_layer_acts(m, l);
        st_gpt2_block_forward(m, m->params + off, st_gpt2_layer_input(m, l), &a);
        st_prof_end(&pb);
    }
    if (hook) hook(ctx, post, m->n_params - post);
    float loss = st_gpt2_head_forward(m, st_gpt2_layer_input(m, m->cfg.n_layer), targets, dloss);
    st_prof_end(&pf);
    return loss;
}

void st_gpt2_backward(st_gpt2_model *m) { st_gpt2_backward_hooked(m, NULL, NULL); }

void st_gpt2_backward_hooked(st_gpt2_model *m, void (*hook)(void *ctx, size_t offset, size_t n), void *ctx) {
    st_prof_span pbw = st_prof_begin(ST_PROF_CAT_COMPUTE, "backward", -1);
    float *dres = m->acts->dres;
    st_gpt2_head_backward(m, st_gpt2_layer_input(m, m->cfg.n_layer), dres);
    for (int l = m->cfg.n_layer - 1; l >= 0; l--) {
        if (m->hook) m->hook->layer = l;
        st_prof_span pb = st_prof_begin(ST_PROF_CAT_COMPUTE, "backward block", l);
        st_gpt2_block_acts a = st_gpt2_layer_acts(m, l);
        size_t off = m->block_offset0 + (size_t)l * m->block_numel;
        st_gpt2_block_backward(m, m->params + off, m->grads ? m->grads + off : NULL, st_gpt2_layer_input(m, l), &a, dres);
        st_prof_end(&pb);
        if (hook) hook(ctx, off, m->block_numel);
    }
    st_gpt2_embed_backward(m, dres);
    st_prof_end(&pbw);
}

void st_gpt2_zero_grad(st_gpt2_model *m) {
    if (m->grads) OPS->memset0(m->be, m->grads, m->n_params * sizeof(float)); /* frozen (LoRA): freed */
}

const float *st_gpt2_logits(const st_gpt2_model *m) { return m->acts ? m->acts->logits : NULL; }

double st_gpt2_flops_per_token(const st_gpt2_config *c, int T) {
    double C = c->n_embd, L = c->n_layer, V = c->vocab_size;
    return 6.0 * (L * 12.0 * C * C + V * C) + 6.0 * L * T * C;
}
