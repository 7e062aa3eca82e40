/* frozen_base.c - what LoRA (lora.c) and POET-X (poetx.c) share around a frozen base model
 * (frozen_base_internal.h): the families' projections and their walk over a tensor table (the
 * column of each projection in its matmul's packed output), the (layer, matmul) index, the
 * common head of their impl with its vectors, the base's gradient vector dropped, the hook,
 * and the ops that pass through to the base. */
#include <stdlib.h>
#include <string.h>

#include "model/frozen_base_internal.h"
#include "strata/llama.h"

static const frozen_proj gpt2_projs[] = {
    {".attn.c_attn.weight", "c_attn", NULL, ST_MM_QKV},  {".attn.c_proj.weight", "c_proj", NULL, ST_MM_O},
    {".mlp.c_fc.weight", "c_fc", NULL, ST_MM_UP},        {".mlp.c_proj.weight", "c_proj", NULL, ST_MM_DOWN},
};
static const frozen_proj llama_projs[] = {
    {".self_attn.q_proj.weight", "q_proj", "q", ST_MM_QKV}, {".self_attn.k_proj.weight", "k_proj", "k", ST_MM_QKV},
    {".self_attn.v_proj.weight", "v_proj", "v", ST_MM_QKV}, {".self_attn.o_proj.weight", "o_proj", "o", ST_MM_O},
    {".mlp.gate_proj.weight", "gate_proj", "gate", ST_MM_UP}, {".mlp.up_proj.weight", "up_proj", "up", ST_MM_UP},
    {".mlp.down_proj.weight", "down_proj", "down", ST_MM_DOWN},
};

const frozen_proj *frozen_base_projs(int gpt2, int *n) {
    *n = gpt2 ? 4 : 7;
    return gpt2 ? gpt2_projs : llama_projs;
}

static int ends_with(const char *s, const char *x) {
    size_t ls = strlen(s), lx = strlen(x);
    return ls >= lx && !memcmp(s + ls - lx, x, lx);
}

int frozen_base_proj_of(const char *name, int gpt2) {
    int npk;
    const frozen_proj *pk = frozen_base_projs(gpt2, &npk);
    int k = -1;
    for (int j = 0; j < npk; j++)
        if (ends_with(name, pk[j].suffix)) k = j;
    return k;
}

int frozen_base_layer_of(const char *name) {
    const char *p = strstr(name, ".h.");
    if (!p) p = strstr(name, ".layers.");
    if (!p) return -1;
    p = strchr(p + 1, '.') + 1;
    return atoi(p);
}

int frozen_base_layers(const st_param_info *tt, int nt) {
    int L = 0;
    for (int i = 0; i < nt; i++) {
        int l = frozen_base_layer_of(tt[i].name);
        if (l + 1 > L) L = l + 1;
    }
    return L;
}

static int site_key(const st_param_info *t, int k, int gpt2) {
    return frozen_base_layer_of(t->name) * ST_MM_COUNT + (gpt2 ? gpt2_projs : llama_projs)[k].mm;
}

int frozen_base_next_site(const st_param_info *tt, int nt, int gpt2, int *cursor, frozen_site *s) {
    int i = *cursor, k = -1;
    while (i < nt && (k = frozen_base_proj_of(tt[i].name, gpt2)) < 0) i++;
    if (i >= nt) {
        *cursor = nt;
        return 0;
    }
    const st_param_info *t = &tt[i];
    int key = site_key(t, k, gpt2);
    *s = (frozen_site){.t = t, .proj = k, .key = key, .in = gpt2 ? t->shape[0] : t->shape[1],
                       .out = gpt2 ? t->shape[1] : t->shape[0]};
    /* the column: the widths of the same matmul's projections just before it; the packed
     * width: all of that matmul's */
    for (int j = i - 1; j >= 0; j--) {
        int kj = frozen_base_proj_of(tt[j].name, gpt2);
        if (kj < 0) continue;
        if (site_key(&tt[j], kj, gpt2) != key) break;
        s->col += gpt2 ? tt[j].shape[1] : tt[j].shape[0];
    }
    for (int j = 0; j < nt; j++) {
        int kj = frozen_base_proj_of(tt[j].name, gpt2);
        if (kj >= 0 && site_key(&tt[j], kj, gpt2) == key) s->ld += gpt2 ? tt[j].shape[1] : tt[j].shape[0];
    }
    *cursor = i + 1;
    return 1;
}

void frozen_base_index(int *first, int n_keys, const void *items, size_t stride, int n) {
    const char *p = items;
    for (int k = 0, i = 0; k < n_keys; k++) {
        first[k] = i;
        while (i < n && *(const int *)(const void *)(p + (size_t)i * stride) == k) i++;
        first[k + 1] = i;
    }
}

int frozen_base_init(frozen_base *fb, st_model *self, st_model *base) {
    fb->base = base;
    fb->self = self;
    fb->gpt2 = !strcmp(base->ops->arch, "gpt2");
    fb->n_layer = frozen_base_layers(base->tensors, base->n_tensors);
    fb->first = calloc((size_t)fb->n_layer * ST_MM_COUNT + 1, sizeof *fb->first);
    return fb->first ? 0 : -1;
}

int frozen_base_vectors(st_model *m, const frozen_base *fb, size_t np) {
    m->be = fb->base->be;
    m->n_params = np;
    m->max_seq = fb->base->max_seq;
    m->vocab_size = fb->base->vocab_size;
    m->params = m->be->ops->alloc(m->be, (np ? np : 1) * sizeof(float));
    m->grads = m->be->ops->alloc(m->be, (np ? np : 1) * sizeof(float));
    return m->params && m->grads ? 0 : -1;
}

static const void *held_host(st_linear_hook *h, int layer) {
    const frozen_base *fb = (const frozen_base *)h;
    return fb->held_mem + (size_t)layer * fb->held_stride;
}

/* Each layer's placed bytes (layer[i] of w[i], n of them); the longest. */
static size_t held_layer_bytes(st_frozen_dtype d, const size_t *numel, const int *layer, int n) {
    size_t mx = 0, run = 0;
    for (int i = 0; i < n; i++) {
        if (i && layer[i] != layer[i - 1]) run = 0;
        run += frozen_weight_placed_bytes(d, numel[i]);
        if (run > mx) mx = run;
    }
    return mx;
}

int frozen_base_hold(frozen_base *fb, st_frozen_dtype d, frozen_weight *const *w, const int *layer, int n) {
    size_t *numel = malloc(sizeof *numel * (size_t)(n ? n : 1));
    if (!numel) return -1;
    for (int i = 0; i < n; i++) numel[i] = (size_t)w[i]->rows * w[i]->cols;
    fb->held_stride = held_layer_bytes(d, numel, layer, n);
    free(numel);
    /* zeroed (the runs' padding too) without touching its pages: a page is taken when a weight is
     * rounded into it, as that weight's fp32 pages go back (st_alloc would fill it all at once) */
    fb->held_mem = calloc(fb->held_stride * (size_t)(fb->n_layer ? fb->n_layer : 1), 1);
    if (!fb->held_mem) return -1;
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        if (!i || layer[i] != layer[i - 1]) at = (size_t)layer[i] * fb->held_stride;
        frozen_weight_place(w[i], d, w[i]->rows, w[i]->cols, w[i]->layout, fb->held_mem + at);
        at += frozen_weight_placed_bytes(d, (size_t)w[i]->rows * w[i]->cols);
    }
    fb->hook.held_block_bytes = fb->held_stride;
    fb->hook.held_host = held_host;
    return 0;
}

frozen_weight frozen_base_held_view(const frozen_base *fb, const frozen_weight *w) {
    if (!fb->hook.held || w->dtype == ST_FROZEN_F32) return *w;
    return frozen_weight_moved(w, fb->held_mem + (size_t)fb->hook.layer * fb->held_stride, fb->hook.held);
}

size_t st_frozen_held_block_bytes(const st_param_info *tensors, int n_tensors, const char *arch, st_frozen_dtype d) {
    if (d == ST_FROZEN_F32) return 0;
    int gpt2 = !strcmp(arch, "gpt2"), n = 0;
    frozen_site site;
    for (int cur = 0; frozen_base_next_site(tensors, n_tensors, gpt2, &cur, &site);) n++;
    size_t *numel = malloc(sizeof *numel * (size_t)(n ? n : 1));
    int *layer = malloc(sizeof *layer * (size_t)(n ? n : 1));
    size_t b = 0;
    if (numel && layer) {
        int i = 0;
        for (int cur = 0; frozen_base_next_site(tensors, n_tensors, gpt2, &cur, &site); i++) {
            numel[i] = site.t->numel;
            layer[i] = site.key / ST_MM_COUNT;
        }
        b = held_layer_bytes(d, numel, layer, n);
    }
    free(numel);
    free(layer);
    return b;
}

void frozen_base_drop_grads(frozen_base *fb) {
    st_model *base = fb->base;
    if (base->grads) base->be->ops->dealloc(base->be, base->grads);
    base->grads = NULL;
    if (fb->gpt2) {
        st_gpt2_model *g = base->impl;
        g->grads = g->emb_g = g->lnf_g = NULL;
    } else {
        ((st_llama_model *)base->impl)->grads = NULL;
    }
}

void frozen_base_set_hook(frozen_base *fb, st_linear_hook *h) {
    if (fb->gpt2) ((st_gpt2_model *)fb->base->impl)->hook = h;
    else ((st_llama_model *)fb->base->impl)->hook = h;
}

void frozen_base_free(st_model *m, frozen_base *fb) {
    if (m->params) m->be->ops->dealloc(m->be, m->params);
    if (m->grads) m->be->ops->dealloc(m->be, m->grads);
    if (fb->base) {
        frozen_base_set_hook(fb, NULL);
        st_model_free(fb->base);
    }
    free(fb->first);
    free(fb->held_mem);
    fb->held_mem = NULL;
}

st_status frozen_base_alloc_acts(st_model *m, int B, int T, st_err *err) {
    st_model *base = ((frozen_base *)m->impl)->base;
    st_status s = base->ops->alloc_acts(base, B, T, err);
    if (!s) m->row_losses = base->row_losses; /* the base's forward writes them */
    return s;
}

void frozen_base_backward(st_model *m) {
    st_model *base = ((frozen_base *)m->impl)->base;
    base->ops->backward(base); /* the base's own grad hook is NULL: m's gradients are complete at the end */
    if (m->grad_hook) m->grad_hook(m->grad_hook_ctx, 0, m->n_params);
}

int frozen_base_step_gemms(const st_model *m, int B, int T, st_gemm_shape *out, int max) {
    const st_model *b = ((const frozen_base *)m->impl)->base;
    return b->ops->step_gemms ? b->ops->step_gemms(b, B, T, out, max) : 0;
}

const float *frozen_base_logits(const st_model *m) {
    const st_model *b = ((const frozen_base *)m->impl)->base;
    return b->ops->logits(b);
}

st_status frozen_base_set_docs(st_model *m, const int32_t *positions, const int32_t *doc_start, st_err *err) {
    return st_model_set_docs(((frozen_base *)m->impl)->base, positions, doc_start, err);
}
