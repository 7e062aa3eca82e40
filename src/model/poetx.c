/* poetx.c - POET-X over a base model's frozen matmul weights (strata/poetx.h).
 *
 * The base's block functions call the st_linear_hook's linear_forward in place of each of the
 * four matmuls (model.h). W0 is held pre-permuted, W0'_j = Pi_out W0_j Pi_in^T (W0'[r][c] =
 * W0[perm_out[r]][perm_in[c]]; strata/poetx.h), so that with P = Pi_in^T P' Pi_in and R =
 * Pi_out^T R' Pi_out (P', R' block-diagonal) the rotations need no permutation. For the
 * projections j of that matmul (one for GPT-2; q|k|v and gate|up are packed for the Llama
 * family, each with its own R and P), out (N, ld):
 *     x' = Pi_in x (N, in)         poet_permute, gather by perm_in
 *     u' = P' x'                   poet_apply_forward (G_in, perm NULL)
 *     h' = u' W0'_j^T (N, out_j)   matmul_forward, W0' as the block stores it (= Pi_out h)
 *     y' = R' h'                   poet_apply_forward (G_out, perm NULL)
 *     out[:, col_j + perm_out[i]] = y'[i]; then out += bias (the projections cover out's columns)
 * G_in, G_out from the packed Q by poet_cayley_forward where they are used (forward, backward,
 * merge), one weight's at a time: never kept across a step. h' is kept for the backward
 * (poetx_recompute 0: N x out_j per weight) or formed again from the layer's input (1).
 * Backward from dout: dbias += column sums; G formed again, dy' = dout's columns gathered by
 * perm_out, dh' = R'^T dy' (and dG_out from h'), du' = dh' W0'_j (no dW0; u' itself is not
 * needed), dx' = P'^T du' (and dG_in from x', gathered again), dx += dx' scattered by perm_in,
 * dq += poet_cayley_backward of dG.
 *
 * The parameter vector is the base's trainable tensors and the Q's. The base keeps no gradient
 * vector: its backwards ask the hook (grad_at) where each trainable's gradient goes, here.
 * GPT-2's embeddings and final norm are read in place from this vector (the base's pointers
 * moved); the blocks' norms and biases are copied into the base's vector before each forward.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/llama.h"
#include "strata/poetx.h"
#include "strata/safetensors.h"
#include "model/frozen_base_internal.h"
#include "model/frozen_store.h"
#include "model/model_internal.h"

typedef struct poet_weight {
    int key;               /* first (frozen_base_index): layer * ST_MM_COUNT + the block matmul */
    int in, out, col, ld;  /* input width, output rows, column in the packed output, its width */
    size_t w_rel;          /* W0_j inside the packed weight the block passes (floats) */
    size_t qi_off, qo_off; /* packed Q in the POET-X vector */
    size_t h_off;          /* its kept h (N x out) at h_keep + N * h_off (recompute 0) */
    const st_param_info *base_t;
    int32_t *perm_in, *perm_out; /* backend memory */
} poet_weight;

typedef struct poet_train { /* a trainable tensor of the base: where it is in each vector */
    size_t base_off, off, numel;
    int aliased; /* the base reads it from the POET-X vector (GPT-2's wte, wpe, ln_f): no copy */
} poet_train;

typedef struct poet_impl {
    frozen_base fb; /* first: the hook, the base; fb.first[k] .. [k + 1]: the weights of matmul key k */
    st_poetx_config cfg;
    int n_w;
    poet_weight *w;
    int n_train;
    poet_train *train;
    st_param_info *tensors;
    size_t q_off;
    size_t blk0, blk_numel; /* the base's block slabs: [blk0 + l * blk_numel, + blk_numel) */
    float *G;       /* one weight's G_in | G_out at a time (2 max_d b): formed where used */
    int32_t *perms; /* every weight's perm_in, perm_out */
    size_t n_perm;  /* their count (the weights' in + out summed) */
    float *scratch; /* u | h | dy | dh | du (N x max width each) | dG_in | dG_out */
    float *h_keep;  /* recompute 0: every weight's h = u W0^T (N x out) from the forward */
    size_t h_total; /* the sum of the weights' out */
    int N, max_d, max_nb;
    frozen_weight *fw; /* [n_w]: each W0 in cfg.frozen_dtype (fp32: the base's own) */
    float *panel;      /* bf16, int8: the dequantising matmuls' panel (host) */
    size_t panel_bytes;/* st_frozen_panel_bytes of the largest weight */
} poet_impl;

static poet_impl *impl_of(const st_model *m) { return (poet_impl *)m->impl; }
static int is_perm_(const int32_t *p, int d);
/* w0_pass's flags: where W0 comes from and what is done to it */
enum {
    W0_FROM_BASE = 1, /* the base's vector in its layout (fp32, as loaded or drawn), not the held W0 */
    W0_RAW = 2,       /* the held W0 is in the base's layout (a file written before W0 was held permuted) */
    W0_FOLD = 4,      /* R W0 P folded in (in the frame held, fp32) */
};
static st_status w0_pass(st_model *m, int flags, const int32_t *newp, int only, float *dense, st_err *err);
static void draw_perms_host(const poet_impl *pi, uint64_t seed, int64_t step, int32_t *h);
static st_status redraw(st_model *m, uint64_t seed, int64_t step, int flags, st_err *err);
static void w0_permute(const poet_weight *a, int gpt2, float *dst, const float *src, const int32_t *pin,
                       const int32_t *pout, int to);

/* The weights and trainables of cfg over a tensor table (w, tr NULL: count only). */
static st_status build(const st_param_info *tt, int nt, const char *arch, const st_poetx_config *cfg, poet_weight *w,
                       int *n_w, poet_train *tr, int *n_tr, size_t *n_params, size_t *n_q, size_t *n_g, st_err *err) {
    int gpt2 = !strcmp(arch, "gpt2");
    if (!gpt2 && strcmp(arch, "llama"))
        return st_errf(err, ST_ERR_UNSUPPORTED, "poetx: no POET-X for a %s model (GPT-2 and the Llama family have it)",
                       arch);
    int b = cfg->block;
    if (b < 2) return st_errf(err, ST_ERR_INVALID, "key 'poetx_block' is %d; it must be >= 2", b);
    if (cfg->terms < 0) return st_errf(err, ST_ERR_INVALID, "key 'poetx_terms' is %d; it must be >= 0", cfg->terms);
    size_t nq = (size_t)b * (b - 1) / 2, np = 0, qn = 0, gn = 0;
    int n = 0, ntr = 0;
    for (int i = 0; i < nt; i++) { /* the base's trainables first, in its order */
        if (frozen_base_proj_of(tt[i].name, gpt2) >= 0) continue;
        if (tr) tr[ntr] = (poet_train){.base_off = tt[i].offset, .off = np, .numel = tt[i].numel};
        ntr++;
        np += tt[i].numel;
    }
    frozen_site site;
    for (int cur = 0; frozen_base_next_site(tt, nt, gpt2, &cur, &site);) {
        const st_param_info *t = site.t;
        int in = site.in, out = site.out, col = site.col;
        if (in % b || out % b)
            return st_errf(err, ST_ERR_INVALID, "key 'poetx_block' is %d, which does not divide %s of tensor '%s' "
                           "(%d x %d); POET-X trains every matmul weight of the blocks: pick a block size that "
                           "divides every weight's dimensions", b, in % b ? "the input width" : "the output width",
                           t->name, t->shape[0], t->shape[1]);
        if (w)
            w[n] = (poet_weight){.key = site.key, .in = in, .out = out, .col = col, .ld = site.ld,
                                 .w_rel = gpt2 ? 0 : (size_t)col * in, .qi_off = np + qn,
                                 .qo_off = np + qn + (size_t)(in / b) * nq, .h_off = gn, .base_t = t};
        n++;
        qn += (size_t)(in / b + out / b) * nq;
        gn += (size_t)out;
    }
    *n_w = n;
    if (n_tr) *n_tr = ntr;
    if (n_params) *n_params = np + qn;
    if (n_q) *n_q = qn;
    if (n_g) *n_g = gn;
    return ST_OK;
}

st_status st_poetx_check(const st_param_info *tensors, int n_tensors, const char *arch, const st_poetx_config *cfg,
                         size_t *n_params, size_t *n_q, st_err *err) {
    int n;
    return build(tensors, n_tensors, arch, cfg, NULL, &n, NULL, NULL, n_params, n_q, NULL, err);
}

/* ------------------------------------------------------------------ the hook */

/* Weight i's W0 as the matmuls read it: fp32, the block's weight w as the caller passes it (the
 * base's own vector in memory, a layer-streaming executor's device copy of it: the same bits);
 * bf16 and int8, the store's (the block's weight is not read), or a layer-streaming executor's
 * copy of the layer's held run (frozen_base_held_view: the same bits). */
static frozen_weight w0_of(const poet_impl *pi, int i, const float *w) {
    frozen_weight fw = frozen_base_held_view(&pi->fb, &pi->fw[i]); /* streamed: the executor's copy */
    if (w && fw.dtype == ST_FROZEN_F32) fw.f32 = (float *)w + pi->w[i].w_rel;
    return fw;
}

static void hook_linear_forward(st_linear_hook *h, int mm, float *out, const float *x, const float *w,
                                const float *bias, int N) {
    poet_impl *pi = (poet_impl *)h;
    st_backend *be = pi->fb.base->be;
    const st_backend_ops *o = be->ops;
    const float *p = pi->fb.self->params;
    int b = pi->cfg.block, k = pi->cfg.terms, key = h->layer * ST_MM_COUNT + mm;
    size_t S = (size_t)pi->N * pi->max_d;
    float *u = pi->scratch, *hh = u + S, *y = hh + S, *xp = y + S;
    int ld = pi->w[pi->fb.first[key]].ld;
    for (int i = pi->fb.first[key]; i < pi->fb.first[key + 1]; i++) {
        const poet_weight *a = &pi->w[i];
        float *Gi = pi->G, *Go = pi->G + (size_t)a->in * b;
        float *hk = pi->h_keep ? pi->h_keep + (size_t)N * a->h_off : hh; /* kept for the backward */
        frozen_weight fw = w0_of(pi, i, w);
        o->poet_cayley_forward(be, Gi, p + a->qi_off, (a->in + a->out) / b, b, k); /* G_in | G_out: Q's adjacent */
        o->poet_permute(be, xp, a->in, x, a->in, a->perm_in, N, a->in, ST_PERMUTE_GATHER); /* x' = Pi_in x */
        o->poet_apply_forward(be, u, xp, Gi, NULL, N, a->in, b, 0);
        frozen_matmul_forward(be, &fw, hk, u, N, pi->panel, pi->panel_bytes / sizeof(float), y); /* h' = Pi_out h */
        o->poet_apply_forward(be, y, hk, Go, NULL, N, a->out, b, 0);
        /* out's columns of the projection: y = Pi_out^T y' (the projections' columns cover out) */
        o->poet_permute(be, out + a->col, ld, y, a->out, a->perm_out, N, a->out, ST_PERMUTE_SCATTER);
    }
    if (bias) o->axpy_rows(be, out, ld, bias, 0, 1.0f, N, ld); /* every row += bias */
}

/* G is formed again (not kept: 0.44 bytes per weight parameter at b = 64); h' = u' W0'^T is the
 * forward's (or, recompute, formed again from x' = Pi_in x). */
static void hook_linear_backward(st_linear_hook *h, int mm, float *dx, float *dbias, const float *dout,
                                 const float *x, const float *w, int N) {
    poet_impl *pi = (poet_impl *)h;
    st_backend *be = pi->fb.base->be;
    const st_backend_ops *o = be->ops;
    const float *p = pi->fb.self->params;
    float *g = pi->fb.self->grads;
    int b = pi->cfg.block, k = pi->cfg.terms, key = h->layer * ST_MM_COUNT + mm;
    size_t S = (size_t)pi->N * pi->max_d;
    /* five buffers of N x max_d: x' | h' or dx' | dy' | dh' | u' or du' */
    float *xp = pi->scratch, *hh = xp + S, *dy = hh + S, *dh = dy + S, *du = dh + S, *dGi = du + S;
    const poet_weight *w0 = &pi->w[pi->fb.first[key]];
    int ld = w0->ld;
    if (dbias) o->matmul_backward(be, NULL, NULL, dbias, dout, NULL, NULL, N, w0->in, ld, pi->fb.gpt2 ? ST_W_IN_OUT : ST_W_OUT_IN);
    for (int i = pi->fb.first[key]; i < pi->fb.first[key + 1]; i++) {
        const poet_weight *a = &pi->w[i];
        float *Gi = pi->G, *Go = pi->G + (size_t)a->in * b;
        const float *hk = hh;
        float *dGo = dGi + (size_t)a->in * b; /* dG_in | dG_out adjacent, as the Q's */
        frozen_weight fw = w0_of(pi, i, w);
        o->poet_cayley_forward(be, Gi, p + a->qi_off, (a->in + a->out) / b, b, k);
        o->poet_permute(be, xp, a->in, x, a->in, a->perm_in, N, a->in, ST_PERMUTE_GATHER); /* x' */
        if (pi->h_keep) {
            hk = pi->h_keep + (size_t)N * a->h_off;
        } else {
            o->poet_apply_forward(be, du, xp, Gi, NULL, N, a->in, b, 0); /* u': du free until below */
            frozen_matmul_forward(be, &fw, hh, du, N, pi->panel, pi->panel_bytes / sizeof(float), dy); /* dy: free */
        }
        /* dy' = Pi_out dy: the projection's columns of dout, into its frame */
        o->poet_permute(be, dy, a->out, dout + a->col, ld, a->perm_out, N, a->out, ST_PERMUTE_GATHER);
        o->memset0(be, dh, (size_t)N * a->out * sizeof(float));
        o->memset0(be, dGo, (size_t)a->out * b * sizeof(float));
        o->poet_apply_backward(be, dh, dGo, dy, hk, Go, NULL, N, a->out, b, 0);
        o->memset0(be, du, (size_t)N * a->in * sizeof(float));
        frozen_matmul_backward_dx(be, &fw, du, dh, N, pi->panel, pi->panel_bytes / sizeof(float), dy); /* no dW0; dy: free */
        float *dxp = hh; /* h' read for the last time above */
        o->memset0(be, dxp, (size_t)N * a->in * sizeof(float));
        o->memset0(be, dGi, (size_t)a->in * b * sizeof(float));
        o->poet_apply_backward(be, dxp, dGi, du, xp, Gi, NULL, N, a->in, b, 0);
        o->poet_permute(be, dx, a->in, dxp, a->in, a->perm_in, N, a->in, ST_PERMUTE_SCATTER_ADD); /* dx += Pi_in^T dx' */
        o->poet_cayley_backward(be, g + a->qi_off, dGi, p + a->qi_off, (a->in + a->out) / b, b, k);
    }
}

/* ------------------------------------------------------------------ st_model ops */

/* dst[i] = src[i] on the backend (no copy op: zero, then add) */
static void dev_copy(st_backend *be, float *dst, const float *src, size_t n) {
    be->ops->memset0(be, dst, n * sizeof(float));
    for (size_t i = 0; i < n; i += 1u << 30) {
        size_t c = n - i < (1u << 30) ? n - i : (1u << 30);
        be->ops->axpy_rows(be, dst + i, (int)c, src + i, (int)c, 1.0f, 1, (int)c);
    }
}

/* The hook's scratch and kept h for B x T rows. */
static st_status alloc_scratch(st_model *m, int B, int T, st_err *err) {
    poet_impl *pi = impl_of(m);
    st_backend *be = m->be;
    if (pi->scratch) be->ops->dealloc(be, pi->scratch);
    if (pi->h_keep) be->ops->dealloc(be, pi->h_keep);
    pi->scratch = pi->h_keep = NULL;
    pi->N = B * T;
    size_t n = 5 * (size_t)pi->N * pi->max_d + 2 * (size_t)pi->max_nb * pi->cfg.block * pi->cfg.block;
    size_t nh = pi->cfg.recompute ? 0 : (size_t)pi->N * pi->h_total;
    if (!(pi->scratch = be->ops->alloc(be, n * sizeof(float))) ||
        (nh && !(pi->h_keep = be->ops->alloc(be, nh * sizeof(float)))))
        return st_errf(err, ST_ERR_NOMEM, "poetx: cannot allocate %.1f MiB of scratch and %.1f MiB of kept activations "
                       "(poetx_recompute 1 keeps none) for batch %d x seq %d", n * 4.0 / 1048576.0,
                       nh * 4.0 / 1048576.0, B, T);
    return ST_OK;
}

static st_status po_alloc_acts(st_model *m, int B, int T, st_err *err) {
    st_status s = frozen_base_alloc_acts(m, B, T, err);
    return s ? s : alloc_scratch(m, B, T, err);
}

st_status st_poetx_hook_bind(st_model *m, int B, int T, st_linear_hook **hook, st_err *err) {
    *hook = NULL;
    if (!st_model_is_poetx(m)) return st_errf(err, ST_ERR_INVALID, "poetx: the model is not a POET-X model");
    poet_impl *pi = impl_of(m);
    if (!st_backend_host_memory(m->be))
        return st_errf(err, ST_ERR_UNSUPPORTED, "poetx: layer streaming runs the hook in host memory; backend '%s' "
                       "keeps its memory elsewhere", m->be->ops->name ? m->be->ops->name : "?");
    if (B < 1 || T < 1) return st_errf(err, ST_ERR_INVALID, "poetx: batch %d x seq %d", B, T);
    st_status s = alloc_scratch(m, B, T, err);
    if (!s) *hook = &pi->fb.hook;
    return s;
}

void st_poetx_to_base(st_model *m) {
    if (!st_model_is_poetx(m)) return;
    poet_impl *pi = impl_of(m);
    for (int i = 0; i < pi->n_train; i++) {
        const poet_train *t = &pi->train[i];
        float *dst = pi->fb.base->params + t->base_off;
        if (t->aliased) memcpy(dst, m->params + t->off, t->numel * sizeof(float)); /* read in place in memory */
        else dev_copy(m->be, dst, m->params + t->off, t->numel); /* po_forward's copy, bit for bit */
    }
}

static float po_forward(st_model *m, const int32_t *in, const int32_t *tg, float dloss) {
    poet_impl *pi = impl_of(m);
    for (int i = 0; i < pi->n_train; i++) /* the trainables as the optimizer left them */
        if (!pi->train[i].aliased)
            dev_copy(m->be, pi->fb.base->params + pi->train[i].base_off, m->params + pi->train[i].off,
                     pi->train[i].numel);
    return pi->fb.base->ops->forward(pi->fb.base, in, tg, dloss);
}

/* The backward is the base's (frozen_base_backward): having no gradient vector, it asks the
 * hook where each trainable tensor's gradient goes (m->grads), the matmul weights' none; the
 * Q's accumulate through the hook. */
static float *hook_grad_at(st_linear_hook *h, int layer, size_t offset) {
    poet_impl *pi = (poet_impl *)h;
    size_t o = layer >= 0 ? pi->blk0 + (size_t)layer * pi->blk_numel + offset : offset;
    for (int i = 0; i < pi->n_train; i++) {
        const poet_train *t = &pi->train[i];
        if (o >= t->base_off && o < t->base_off + t->numel) return pi->fb.self->grads + t->off + (o - t->base_off);
    }
    return NULL; /* a matmul weight: W0 forms no gradient */
}

/* The base's W0 of weight i (fp32, as the base stores it). */
static float *base_w0(const poet_impl *pi, int i) { return pi->fb.base->params + pi->w[i].base_t->offset; }

/* The base's trainables and W0 as they are, Q = 0 (G = I: the model is the base), permutations of
 * (seed, step 0), W0 into their frame and the store (w0_pass, from the base's vector: the bf16
 * and int8 codes rounded after the permutation, so their groups are the held layout's). */
static void init_trainables(st_model *m) {
    poet_impl *pi = impl_of(m);
    st_backend *be = m->be;
    be->ops->memset0(be, m->params, m->n_params * sizeof(float));
    for (int i = 0; i < pi->n_train; i++)
        dev_copy(be, m->params + pi->train[i].off, pi->fb.base->params + pi->train[i].base_off, pi->train[i].numel);
}

static st_status init_state(st_model *m, uint64_t seed, st_err *err) {
    init_trainables(m);
    return redraw(m, seed, 0, W0_FROM_BASE, err);
}

/* the vtable's (void): a failure said; a run calls st_poetx_init_state, which returns it */
static void po_init_random(st_model *m, uint64_t seed) {
    st_err err = {0};
    if (init_state(m, seed, &err)) st_log(0, "poetx: %s\n", err.msg);
}

st_status st_poetx_init_state(st_model *m, uint64_t seed, st_err *err) {
    if (!st_model_is_poetx(m)) return st_errf(err, ST_ERR_INVALID, "poetx: the model is not a POET-X model");
    return init_state(m, seed, err);
}

/* The file: the trainable tensors and Q's under the table's names, then each weight's W0 (the
 * base's name and storage order, held pre-permuted as W0' in the frame of its permutations:
 * metadata poetx_w0_layout "permuted"; merges change it) in its precision (fp32 F32; bf16 BF16; int8 the codes
 * U8 and "<w>.w0_scale", ".w0_zero" F32, one per group; metadata frozen_dtype) and its
 * permutations ("<w>.perm_in", ".perm_out", I32), so that a checkpoint resumes bit for bit
 * across a merge. */
static st_status save_file(const st_model *m, const char *path, int with_trainables, const char *merge_step,
                           const char *run, st_err *err) {
    poet_impl *pi = impl_of(m);
    st_backend *be = m->be;
    size_t nw0 = 0, np = 0;
    for (int i = 0; i < pi->n_w; i++) {
        nw0 += pi->w[i].base_t->numel;
        np += (size_t)pi->w[i].in + pi->w[i].out;
    }
    const st_frozen_dtype fd = pi->cfg.frozen_dtype;
    int q8 = fd == ST_FROZEN_INT8, nt = (with_trainables ? m->n_tensors : 0) + (3 + 2 * q8) * pi->n_w;
    /* in host memory W0 is written from the base's own vector: no staging copy of it (at 2B
     * parameters that copy was 7.9 GB, the run's peak at its checkpoint) */
    const int direct = st_backend_host_memory(be);
    if (fd != ST_FROZEN_F32) nw0 = 0; /* the store's, in host memory */
    float *host = malloc((with_trainables ? m->n_params : 1) * sizeof(float));
    float *w0 = malloc((direct || !nw0 ? 1 : nw0) * sizeof(float));
    int32_t *perm = malloc((np ? np : 1) * sizeof(int32_t));
    st_tensor_out *to = calloc((size_t)nt, sizeof *to);
    char(*names)[160] = calloc((size_t)(4 * pi->n_w + 1), sizeof *names);
    st_status s = ST_OK;
    if (!host || !w0 || !perm || !to || !names) {
        s = st_errf(err, ST_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (with_trainables) be->ops->copy_to_host(be, host, m->params, m->n_params * sizeof(float));
    be->ops->copy_to_host(be, perm, pi->perms, np * sizeof(int32_t));
    int k = 0;
    for (int i = 0; with_trainables && i < m->n_tensors; i++, k++) {
        const st_param_info *t = &pi->tensors[i];
        to[k] = (st_tensor_out){.name = t->name, .dtype = ST_F32, .ndim = t->ndim, .data = host + t->offset};
        for (int d = 0; d < t->ndim; d++) to[k].shape[d] = t->shape[d];
    }
    size_t wo = 0, po = 0;
    for (int i = 0; i < pi->n_w; i++) {
        const poet_weight *a = &pi->w[i];
        const st_param_info *t = a->base_t;
        const float *src = pi->fb.base->params + t->offset;
        const frozen_weight *fw = &pi->fw[i];
        int lw = (int)(strlen(t->name) - strlen(".weight"));
        if (fd == ST_FROZEN_F32) {
            if (!direct) be->ops->copy_to_host(be, w0 + wo, src, t->numel * sizeof(float));
            to[k++] = (st_tensor_out){.name = t->name, .dtype = ST_F32, .ndim = 2,
                                      .shape = {t->shape[0], t->shape[1]}, .data = direct ? src : w0 + wo};
        } else {
            to[k++] = (st_tensor_out){.name = t->name, .dtype = q8 ? ST_U8 : ST_BF16, .ndim = 2,
                                      .shape = {t->shape[0], t->shape[1]},
                                      .data = q8 ? (const void *)fw->q : (const void *)fw->bf16};
        }
        if (q8) {
            int64_t ng = (int64_t)st_frozen_groups(t->numel);
            snprintf(names[2 * pi->n_w + 2 * i], sizeof names[0], "%.*s.w0_scale", lw, t->name);
            snprintf(names[2 * pi->n_w + 2 * i + 1], sizeof names[0], "%.*s.w0_zero", lw, t->name);
            to[k++] = (st_tensor_out){.name = names[2 * pi->n_w + 2 * i], .dtype = ST_F32, .ndim = 1, .shape = {ng},
                                      .data = fw->scale};
            to[k++] = (st_tensor_out){.name = names[2 * pi->n_w + 2 * i + 1], .dtype = ST_F32, .ndim = 1,
                                      .shape = {ng}, .data = fw->zero};
        }
        snprintf(names[2 * i], sizeof names[0], "%.*s.perm_in", lw, t->name);
        snprintf(names[2 * i + 1], sizeof names[0], "%.*s.perm_out", lw, t->name);
        to[k++] = (st_tensor_out){.name = names[2 * i], .dtype = ST_I32, .ndim = 1, .shape = {a->in}, .data = perm + po};
        to[k++] = (st_tensor_out){.name = names[2 * i + 1], .dtype = ST_I32, .ndim = 1, .shape = {a->out},
                                  .data = perm + po + a->in};
        wo += t->numel;
        po += (size_t)a->in + a->out;
    }
    char b[16], kk[16];
    snprintf(b, sizeof b, "%d", pi->cfg.block);
    snprintf(kk, sizeof kk, "%d", pi->cfg.terms);
    const char *meta[] = {"format", "strata-poetx", "poetx_block", b, "poetx_terms", kk,
                          "frozen_dtype", st_frozen_dtype_name(fd), "poetx_w0_layout", "permuted",
                          "poetx_merge_step", merge_step, "poetx_run", run};
    s = st_safetensors_write(path, to, nt, meta, !merge_step ? 5 : !run ? 6 : 7, err);
done:
    free(host);
    free(w0);
    free(perm);
    free(to);
    free(names);
    return s;
}

static st_status po_save(const st_model *m, const char *path, st_err *err) {
    return save_file(m, path, 1, NULL, NULL, err);
}

/* The run a W0 file was written for (metadata poetx_run) against this run's: ST_OK where they
 * are the same or the file carries none (written before the key: logged, unchecked). */
static st_status check_run(const st_safetensors *st, const char *path, const char *run, st_err *err) {
    const char *was = st_safetensors_meta(st, "poetx_run");
    if (!was) {
        st_log(1, "poetx: %s carries no poetx_run (written before W0 files were marked with their run): whose run "
               "it is could not be checked\n", path);
        return ST_OK;
    }
    if (!strcmp(was, run)) return ST_OK;
    return st_errf(err, ST_ERR_INVALID, "%s: metadata poetx_run is '%s', this run's is '%s': the file is another "
                   "run's W0 (left under the same state path, or a directory reused); nothing was loaded or changed: "
                   "move that file away and resume again, or start this run afresh in an empty directory", path, was,
                   run);
}

/* W0 of tensor t in the file in precision fd (bf16: BF16; int8: U8 codes and the F32 scales and
 * zeros of its groups), of t's shape: ST_OK, or the error naming the tensor. */
static st_status check_stored_w0(const st_safetensors *st, const char *path, const st_param_info *t,
                                 st_frozen_dtype fd, st_err *err) {
    const st_tensor_entry *e = st_safetensors_find(st, t->name);
    int ok = e && e->dtype == (fd == ST_FROZEN_BF16 ? ST_BF16 : ST_U8) && e->ndim == 2 &&
             e->shape[0] == t->shape[0] && e->shape[1] == t->shape[1];
    char sn[2][160];
    int lw = (int)(strlen(t->name) - strlen(".weight"));
    snprintf(sn[0], sizeof sn[0], "%.*s.w0_scale", lw, t->name);
    snprintf(sn[1], sizeof sn[1], "%.*s.w0_zero", lw, t->name);
    for (int j = 0; ok && fd == ST_FROZEN_INT8 && j < 2; j++) {
        const st_tensor_entry *g = st_safetensors_find(st, sn[j]);
        ok = g && g->dtype == ST_F32 && g->ndim == 1 && (size_t)g->shape[0] == st_frozen_groups(t->numel);
    }
    if (ok) return ST_OK;
    return st_errf(err, ST_ERR_FORMAT, "%s: W0 '%s' is not %s of shape [%d, %d]%s; the file is no "
                   "frozen_dtype %s checkpoint of this model", path, t->name,
                   fd == ST_FROZEN_BF16 ? "BF16" : "U8", t->shape[0], t->shape[1],
                   fd == ST_FROZEN_INT8 ? " with F32 .w0_scale and .w0_zero, one per group of 256" : "",
                   st_frozen_dtype_name(fd));
}

/* W0 of tensor t from the file (check_stored_w0 passed) into the store, byte for byte. */
static void load_stored_w0(const st_safetensors *st, const st_param_info *t, frozen_weight *fw) {
    const void *d = st_safetensors_data(st, st_safetensors_find(st, t->name));
    if (fw->dtype == ST_FROZEN_BF16) {
        memcpy(fw->bf16, d, t->numel * sizeof(uint16_t));
        return;
    }
    memcpy(fw->q, d, t->numel);
    char sn[160];
    int lw = (int)(strlen(t->name) - strlen(".weight"));
    size_t ng = st_frozen_groups(t->numel);
    snprintf(sn, sizeof sn, "%.*s.w0_scale", lw, t->name);
    memcpy(fw->scale, st_safetensors_data(st, st_safetensors_find(st, sn)), ng * sizeof(float));
    snprintf(sn, sizeof sn, "%.*s.w0_zero", lw, t->name);
    memcpy(fw->zero, st_safetensors_data(st, st_safetensors_find(st, sn)), ng * sizeof(float));
}

/* A file po_save wrote: every tensor of the table; W0 and the permutations where present (a
 * checkpoint has them; without them the base's W0 and the drawn permutations stay). */
static st_status load_file(st_model *m, const char *path, int with_trainables, int64_t merge_step, const char *run,
                           st_err *err) {
    poet_impl *pi = impl_of(m);
    st_backend *be = m->be;
    st_safetensors *st;
    st_status s = st_safetensors_open(&st, path, err);
    if (s) return s;
    const char *fb = st_safetensors_meta(st, "poetx_block");
    if (fb && atoi(fb) != pi->cfg.block) {
        s = st_errf(err, ST_ERR_INVALID, "key 'poetx_block': %s was written with poetx_block %s, this run has %d; "
                    "resume with the block size the run was trained with", path, fb, pi->cfg.block);
        st_safetensors_close(st);
        return s;
    }
    /* W0's precision: the file's (none said: fp32, as before the key) must be the run's */
    const st_frozen_dtype fd = pi->cfg.frozen_dtype;
    const char *fdm = st_safetensors_meta(st, "frozen_dtype");
    st_frozen_dtype was = ST_FROZEN_F32;
    if ((fdm && st_frozen_dtype_parse(fdm, &was)) || was != fd) {
        s = st_errf(err, ST_ERR_INVALID, "key 'frozen_dtype': %s holds W0 in %s, this run has frozen_dtype %s; resume "
                    "with the frozen_dtype the run was trained with", path, fdm ? fdm : "fp32",
                    st_frozen_dtype_name(fd));
        st_safetensors_close(st);
        return s;
    }
    /* W0 as held (pre-permuted), or (no poetx_w0_layout: written before W0 was held so) in the
     * base's layout, moved into the frame of the file's permutations once read */
    const char *lay = st_safetensors_meta(st, "poetx_w0_layout");
    const int raw = !lay;
    if (lay && strcmp(lay, "permuted")) {
        s = st_errf(err, ST_ERR_FORMAT, "%s: metadata poetx_w0_layout is '%s'; this strata reads 'permuted' (or "
                    "none: the base's layout)", path, lay);
        st_safetensors_close(st);
        return s;
    }
    /* W0 alone (st_poetx_load_w0): the file of the merge asked for, holding W0 */
    const char *ms = st_safetensors_meta(st, "poetx_merge_step");
    if (merge_step >= 0 && (!ms || strtoll(ms, NULL, 10) != merge_step || !pi->n_w ||
                            !st_safetensors_find(st, pi->w[0].base_t->name))) {
        s = st_errf(err, ST_ERR_FORMAT, "%s: no W0 of the merge at step %lld (the file says merge step %s); the "
                    "run's W0 files are not this state's", path, (long long)merge_step, ms ? ms : "none");
        st_safetensors_close(st);
        return s;
    }
    if (merge_step >= 0 && run && (s = check_run(st, path, run, err))) {
        st_safetensors_close(st);
        return s;
    }
    float *host = malloc((with_trainables ? m->n_params : 1) * sizeof(float));
    if (!host) {
        st_safetensors_close(st);
        return st_errf(err, ST_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; !s && with_trainables && i < m->n_tensors; i++) {
        const st_param_info *t = &pi->tensors[i];
        int64_t shape[4];
        for (int d = 0; d < t->ndim; d++) shape[d] = t->shape[d];
        if (!st_safetensors_find(st, t->name))
            s = st_errf(err, ST_ERR_FORMAT, "%s: no tensor '%s'; the file holds another model or another poetx_block "
                        "(this run: poetx_block %d)", path, t->name, pi->cfg.block);
        else s = st_safetensors_read_f32(st, t->name, host + t->offset, t->numel, shape, t->ndim, err);
    }
    /* W0 and the permutations: all read before any is set, so a bad file changes nothing */
    size_t nw0 = 0;
    for (int i = 0; i < pi->n_w; i++) nw0 += pi->w[i].base_t->numel;
    int have = 0;
    float *w0 = NULL;
    if (fd != ST_FROZEN_F32) nw0 = 1; /* no staging: the store's checked in the file first, then copied */
    if (!s && pi->n_w && st_safetensors_find(st, pi->w[0].base_t->name) && !(w0 = malloc(nw0 * sizeof(float))))
        s = st_errf(err, ST_ERR_NOMEM, "out of memory");
    if (w0) {
        have = 1;
        for (size_t i = 0, wo = 0; !s && i < (size_t)pi->n_w; wo += pi->w[i].base_t->numel, i++) {
            const poet_weight *a = &pi->w[i];
            const st_param_info *t = a->base_t;
            int64_t shape[2] = {t->shape[0], t->shape[1]};
            char pn[2][160];
            int lw = (int)(strlen(t->name) - strlen(".weight"));
            snprintf(pn[0], sizeof pn[0], "%.*s.perm_in", lw, t->name);
            snprintf(pn[1], sizeof pn[1], "%.*s.perm_out", lw, t->name);
            const st_tensor_entry *e0 = st_safetensors_find(st, pn[0]), *e1 = st_safetensors_find(st, pn[1]);
            if (!st_safetensors_find(st, t->name) || !e0 || !e1 || e0->dtype != ST_I32 || e1->dtype != ST_I32 ||
                e0->shape[0] != a->in || e1->shape[0] != a->out)
                s = st_errf(err, ST_ERR_FORMAT, "%s: '%s' or its permutations (%s, %s: I32 [%d], [%d]) missing or of "
                            "another shape; the file is no POET-X checkpoint of this model", path, t->name, pn[0],
                            pn[1], a->in, a->out);
            else if (fd != ST_FROZEN_F32)
                s = check_stored_w0(st, path, t, fd, err);
            else
                s = st_safetensors_read_f32(st, t->name, w0 + wo, t->numel, shape, 2, err);
            if (!s && (!is_perm_(st_safetensors_data(st, e0), a->in) || !is_perm_(st_safetensors_data(st, e1), a->out)))
                s = st_errf(err, ST_ERR_FORMAT, "%s: %s or %s is not a permutation", path, pn[0], pn[1]);
        }
    }
    if (!s) {
        if (with_trainables) be->ops->copy_to_device(be, m->params, host, m->n_params * sizeof(float));
        for (size_t i = 0, wo = 0; have && i < (size_t)pi->n_w; wo += pi->w[i].base_t->numel, i++) {
            const poet_weight *a = &pi->w[i];
            char pn[160];
            int lw = (int)(strlen(a->base_t->name) - strlen(".weight"));
            if (fd == ST_FROZEN_F32)
                be->ops->copy_to_device(be, pi->fb.base->params + a->base_t->offset, w0 + wo,
                                        a->base_t->numel * sizeof(float));
            else
                load_stored_w0(st, a->base_t, &pi->fw[i]);
            snprintf(pn, sizeof pn, "%.*s.perm_in", lw, a->base_t->name);
            be->ops->copy_to_device(be, a->perm_in, st_safetensors_data(st, st_safetensors_find(st, pn)),
                                    (size_t)a->in * sizeof(int32_t));
            snprintf(pn, sizeof pn, "%.*s.perm_out", lw, a->base_t->name);
            be->ops->copy_to_device(be, a->perm_out, st_safetensors_data(st, st_safetensors_find(st, pn)),
                                    (size_t)a->out * sizeof(int32_t));
        }
        if (have && raw) { /* W0 in the base's layout: into the frame of the permutations just read */
            if (fd == ST_FROZEN_INT8)
                st_log(1, "poetx: %s holds W0 in the base's layout (written before W0 was held permuted); its int8 "
                       "codes are rounded again in the permuted layout's groups, so the run goes on within int8's "
                       "rounding of the file's, not bit for bit\n", path);
            int32_t *np = malloc((pi->n_perm ? pi->n_perm : 1) * sizeof(int32_t));
            if (!np) s = st_errf(err, ST_ERR_NOMEM, "out of memory");
            else be->ops->copy_to_host(be, np, pi->perms, pi->n_perm * sizeof(int32_t));
            if (np) s = w0_pass(m, W0_RAW, np, -1, NULL, err);
            free(np);
        }
    }
    free(w0);
    free(host);
    st_safetensors_close(st);
    return s;
}

static st_status po_load(st_model *m, const char *path, st_err *err) { return load_file(m, path, 1, -1, NULL, err); }

static double po_flops(const st_model *m, int T) {
    const st_model *b = impl_of(m)->fb.base;
    return b->ops->flops_per_token(b, T);
}

static void po_describe(const st_model *m, char *buf, size_t cap) {
    poet_impl *pi = impl_of(m);
    char inner[200] = "";
    if (pi->fb.base->ops->describe) pi->fb.base->ops->describe(pi->fb.base, inner, sizeof inner);
    snprintf(buf, cap, "%s, POET-X b %d k %d over %d weights (%zu trainable, W0 %s)", inner, pi->cfg.block,
             pi->cfg.terms, pi->n_w, m->n_params, st_frozen_dtype_name(pi->cfg.frozen_dtype));
}

static void po_destroy(st_model *m) {
    if (!m) return;
    poet_impl *pi = impl_of(m);
    if (pi) {
        st_backend *be = m->be;
        if (pi->scratch) be->ops->dealloc(be, pi->scratch);
        if (pi->h_keep) be->ops->dealloc(be, pi->h_keep);
        if (pi->G) be->ops->dealloc(be, pi->G);
        if (pi->perms) be->ops->dealloc(be, pi->perms);
        for (int i = 0; pi->fw && i < pi->n_w; i++) frozen_weight_free(&pi->fw[i]);
        free(pi->fw);
        free(pi->panel);
        frozen_base_free(m, &pi->fb);
        free(pi->w);
        free(pi->train);
        free(pi->tensors);
        free(pi);
    }
    free(m);
}

/* The merged dense model (R W0 P folded, out of the permutations' frame, the trainables as they
 * are) as the base's Hugging Face directory; the base's vector as it was after. */
static st_status po_save_hf(const st_model *m, const char *dir, st_dtype dtype, st_err *err) {
    poet_impl *pi = impl_of(m);
    st_model *b = pi->fb.base;
    st_backend *be = m->be;
    const int f32 = pi->cfg.frozen_dtype == ST_FROZEN_F32;
    /* fp32: the base's vector holds W0' (kept and put back after); bf16, int8: the dense fp32
     * weights in the base's vector for the write, its pages given back after; the store unchanged */
    size_t nb = b->n_params;
    float *keep = f32 ? malloc(nb * sizeof(float)) : NULL;
    if (f32 && !keep)
        return st_errf(err, ST_ERR_NOMEM, "poetx: out of memory for the merged weights (%.1f MiB)", nb * 4 / 1048576.0);
    if (f32) be->ops->copy_to_host(be, keep, b->params, nb * sizeof(float));
    for (int i = 0; i < pi->n_train; i++)
        dev_copy(be, b->params + pi->train[i].base_off, m->params + pi->train[i].off, pi->train[i].numel);
    st_status s = w0_pass((st_model *)m, W0_FOLD, NULL, -1, NULL, err);
    if (!s) s = b->ops->save_hf(b, dir, dtype, err);
    if (f32) be->ops->copy_to_device(be, b->params, keep, nb * sizeof(float)); /* as it was, bit for bit */
    for (int i = 0; !f32 && i < pi->n_w; i++) frozen_release(base_w0(pi, i), pi->w[i].base_t->numel * sizeof(float));
    free(keep);
    return s;
}

static const st_model_ops poetx_ops = {
    .arch = "poetx",
    .alloc_acts = po_alloc_acts,
    .forward = po_forward,
    .backward = frozen_base_backward,
    .init_random = po_init_random,
    .save = po_save,
    .load = po_load,
    .flops_per_token = po_flops,
    .describe = po_describe,
    .destroy = po_destroy,
    .step_gemms = frozen_base_step_gemms,
    .save_hf = po_save_hf,
    .logits = frozen_base_logits,
    .set_docs = frozen_base_set_docs,
};

int st_model_is_poetx(const st_model *m) { return m && m->ops == &poetx_ops; }
st_model *st_poetx_base(const st_model *m) { return st_model_is_poetx(m) ? impl_of(m)->fb.base : NULL; }
const st_poetx_config *st_poetx_config_of(const st_model *m) { return st_model_is_poetx(m) ? &impl_of(m)->cfg : NULL; }
void st_poetx_extra_bytes(const st_model *m, size_t *g_scratch, size_t *kept_h) {
    const poet_impl *pi = st_model_is_poetx(m) ? impl_of(m) : NULL;
    size_t gmax = 0;
    for (int i = 0; pi && i < pi->n_w; i++)
        if ((size_t)(pi->w[i].in + pi->w[i].out) * pi->cfg.block > gmax)
            gmax = (size_t)(pi->w[i].in + pi->w[i].out) * pi->cfg.block;
    if (g_scratch) *g_scratch = gmax * sizeof(float);
    if (kept_h) *kept_h = pi && pi->h_keep ? (size_t)pi->N * pi->h_total * sizeof(float) : 0;
}
void st_poetx_frozen_bytes(const st_model *m, size_t *w0, size_t *panel) {
    const poet_impl *pi = st_model_is_poetx(m) ? impl_of(m) : NULL;
    size_t n = 0;
    for (int i = 0; pi && i < pi->n_w; i++) n += st_frozen_bytes(pi->cfg.frozen_dtype, pi->w[i].base_t->numel);
    if (w0) *w0 = n;
    if (panel) *panel = pi ? pi->panel_bytes : 0;
}
st_status st_poetx_save_w0(const st_model *m, const char *path, int64_t merge_step, const char *run, st_err *err) {
    if (!st_model_is_poetx(m)) return st_errf(err, ST_ERR_INVALID, "poetx: the model is not a POET-X model");
    char ms[24];
    snprintf(ms, sizeof ms, "%lld", (long long)merge_step);
    return save_file(m, path, 0, ms, run, err);
}
st_status st_poetx_load_w0(st_model *m, const char *path, int64_t merge_step, const char *run, st_err *err) {
    if (!st_model_is_poetx(m)) return st_errf(err, ST_ERR_INVALID, "poetx: the model is not a POET-X model");
    return load_file(m, path, 0, merge_step < 0 ? 0 : merge_step, run, err);
}
st_status st_poetx_w0_check_run(const char *path, const char *run, st_err *err) {
    st_safetensors *st;
    st_status s = st_safetensors_open(&st, path, err);
    if (s) return s;
    s = check_run(st, path, run, err);
    st_safetensors_close(st);
    return s;
}
size_t st_poetx_q_offset(const st_model *m) { return st_model_is_poetx(m) ? impl_of(m)->q_off : 0; }

st_status st_poetx_merged_base(st_model *m, st_model **out, st_err *err) {
    *out = NULL;
    if (!st_model_is_poetx(m)) {
        st_model_free(m);
        return st_errf(err, ST_ERR_INVALID, "poetx: the model is not a POET-X model");
    }
    poet_impl *pi = impl_of(m);
    st_model *b = pi->fb.base;
    for (int i = 0; i < pi->n_train; i++)
        dev_copy(m->be, b->params + pi->train[i].base_off, m->params + pi->train[i].off, pi->train[i].numel);
    /* W = R W0 P into the base's own vector, one weight at a time (bf16, int8: its given-back
     * pages filled again) */
    st_status s = w0_pass(m, W0_FOLD, NULL, -1, NULL, err);
    if (!s) { /* the base on its own again: no hook, GPT-2's embedding and final norm read from its vector */
        frozen_base_set_hook(&pi->fb, NULL);
        if (pi->fb.gpt2) {
            st_gpt2_model *g = b->impl;
            for (int i = 0; i < pi->n_train; i++) {
                const poet_train *t = &pi->train[i];
                if (g->emb_w == m->params + t->off) g->emb_w = b->params + t->base_off;
                if (g->lnf_w == m->params + t->off) g->lnf_w = b->params + t->base_off;
            }
            g->emb_g = g->lnf_g = NULL;
        }
        pi->fb.base = NULL; /* not freed with m */
        *out = b;
    }
    st_model_free(m);
    return s;
}

st_status st_poetx_w0(const st_model *m, const char *weight, float *dst, st_err *err) {
    if (!st_model_is_poetx(m)) return st_errf(err, ST_ERR_INVALID, "poetx: the model is not a POET-X model");
    poet_impl *pi = impl_of(m);
    size_t lw = strlen(weight);
    for (int i = 0; i < pi->n_w; i++) {
        const poet_weight *a = &pi->w[i];
        const char *n = a->base_t->name;
        if (strcmp(n, weight) && !(strlen(n) == lw + 7 && !strncmp(n, weight, lw) && !strcmp(n + lw, ".weight")))
            continue;
        size_t ne = (size_t)a->in * a->out;
        float *h = malloc(ne * sizeof(float));
        int32_t *p = malloc(((size_t)a->in + a->out) * sizeof(int32_t));
        if (!h || !p) {
            free(h), free(p);
            return st_errf(err, ST_ERR_NOMEM, "poetx: out of memory for W0 of '%s'", n);
        }
        if (pi->cfg.frozen_dtype == ST_FROZEN_F32) m->be->ops->copy_to_host(m->be, h, base_w0(pi, i), ne * sizeof(float));
        else frozen_weight_get(&pi->fw[i], 0, ne, h);
        m->be->ops->copy_to_host(m->be, p, a->perm_in, ((size_t)a->in + a->out) * sizeof(int32_t));
        w0_permute(a, pi->fb.gpt2, dst, h, p, p + a->in, 0);
        free(h), free(p);
        return ST_OK;
    }
    return st_errf(err, ST_ERR_INVALID, "poetx: no matmul weight '%s' in this model", weight);
}

/* ------------------------------------------------------------------ permutations, merge */

static void draw_perm(st_rng *r, int32_t *p, int d) {
    for (int i = 0; i < d; i++) p[i] = i;
    for (int i = d - 1; i > 0; i--) { /* Fisher-Yates */
        int j = (int)(st_rng_u64(r) % (uint64_t)(i + 1));
        int32_t t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
}

/* Every weight's perm_in, perm_out of (seed, step) into h (host), laid out as pi->perms. */
static void draw_perms_host(const poet_impl *pi, uint64_t seed, int64_t step, int32_t *h) {
    st_rng r;
    st_rng_seed(&r, seed ^ 0x504F4554ull ^ ((uint64_t)step * 0x9E3779B97F4A7C15ull)); /* "POET", the step */
    for (int i = 0; i < pi->n_w; i++) {
        const poet_weight *a = &pi->w[i];
        int32_t *p = h + (a->perm_in - pi->perms);
        draw_perm(&r, p, a->in);
        draw_perm(&r, p + a->in, a->out);
    }
}

/* The permutations of (seed, step) drawn and W0 moved into their frame by w0_pass(flags): W0 as
 * held (0), folded first (W0_FOLD), or taken from the base's vector (W0_FROM_BASE). */
static st_status redraw(st_model *m, uint64_t seed, int64_t step, int flags, st_err *err) {
    poet_impl *pi = impl_of(m);
    int32_t *np = malloc((pi->n_perm ? pi->n_perm : 1) * sizeof(int32_t));
    if (!np) return st_errf(err, ST_ERR_NOMEM, "poetx: out of memory for the permutations");
    draw_perms_host(pi, seed, step, np);
    st_status s = w0_pass(m, flags, np, -1, NULL, err);
    free(np);
    return s;
}

st_status st_poetx_draw_perms(st_model *m, uint64_t seed, int64_t step, st_err *err) {
    if (!st_model_is_poetx(m)) return st_errf(err, ST_ERR_INVALID, "poetx: the model is not a POET-X model");
    return redraw(m, seed, step, 0, err); /* W0 into the new frame */
}

static int is_perm_(const int32_t *p, int d) {
    char *seen = calloc((size_t)d, 1);
    int ok = seen != NULL;
    for (int i = 0; ok && i < d; i++) {
        ok = p[i] >= 0 && p[i] < d && !seen[p[i]];
        if (ok) seen[p[i]] = 1;
    }
    free(seen);
    return ok;
}

st_status st_poetx_set_perms(st_model *m, const char *weight, const int32_t *perm_in, const int32_t *perm_out,
                             st_err *err) {
    if (!st_model_is_poetx(m)) return st_errf(err, ST_ERR_INVALID, "poetx: the model is not a POET-X model");
    poet_impl *pi = impl_of(m);
    size_t lw = strlen(weight);
    for (int i = 0; i < pi->n_w; i++) {
        poet_weight *a = &pi->w[i];
        const char *n = a->base_t->name;
        if (strcmp(n, weight) && !(strlen(n) == lw + 7 && !strncmp(n, weight, lw) && !strcmp(n + lw, ".weight")))
            continue;
        if (!is_perm_(perm_in, a->in) || !is_perm_(perm_out, a->out))
            return st_errf(err, ST_ERR_INVALID, "poetx: the permutations given for '%s' are not permutations of 0..%d "
                           "and 0..%d", n, a->in - 1, a->out - 1);
        int32_t *np = malloc(pi->n_perm * sizeof(int32_t));
        if (!np) return st_errf(err, ST_ERR_NOMEM, "poetx: out of memory for the permutations");
        m->be->ops->copy_to_host(m->be, np, pi->perms, pi->n_perm * sizeof(int32_t));
        memcpy(np + (a->perm_in - pi->perms), perm_in, sizeof(int32_t) * (size_t)a->in);
        memcpy(np + (a->perm_out - pi->perms), perm_out, sizeof(int32_t) * (size_t)a->out);
        st_status s = w0_pass(m, 0, np, i, NULL, err); /* this W0 into the new frame */
        free(np);
        return s;
    }
    return st_errf(err, ST_ERR_INVALID, "poetx: no matmul weight '%s' in this model", weight);
}

static void transpose(float *dst, const float *src, int rows, int cols) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) dst[(size_t)c * rows + r] = src[(size_t)r * cols + c];
}

/* dst <- src, weight a's W0 (gpt2: stored (in, out), else (out, in)) between the base's layout and
 * the frame of (pin, pout): W0'[r][c] = W0[pout[r]][pin[c]] as (out, in); to 1 into the frame,
 * 0 out of it. */
static void w0_permute(const poet_weight *a, int gpt2, float *dst, const float *src, const int32_t *pin,
                       const int32_t *pout, int to) {
    int in = a->in, out = a->out;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < out; r++)
        for (int c = 0; c < in; c++) {
            size_t pe = gpt2 ? (size_t)c * out + r : (size_t)r * in + c;
            size_t ba = gpt2 ? (size_t)pin[c] * out + pout[r] : (size_t)pout[r] * in + pin[c];
            if (to) dst[pe] = src[ba];
            else dst[ba] = src[pe];
        }
}

/* One weight's held W0' in h1 (host, fp32, stored as the base stores W0) <- R' W0' P' with
 * R' = blockdiag(G_out), P' = blockdiag(G_in) (the frame's: R W0 P = Pi_out^T R' W0' P' Pi_in):
 * the rows of W0' (out, in) through P'^T (apply with G_in^T, trans 1) give W0' P'; the rows of
 * its transpose through R' (trans 0) give (R' W0' P')^T. In fp32, with the backend's ops; h2
 * (host) and d (backend) as large. */
static void fold_weight(st_model *m, const poet_weight *a, float *h1, float *h2, float *d) {
    poet_impl *pi = impl_of(m);
    st_backend *be = m->be;
    const st_backend_ops *o = be->ops;
    int b = pi->cfg.block, k = pi->cfg.terms;
    size_t n = (size_t)a->in * a->out;
    float *Gi = pi->G, *Go = pi->G + (size_t)a->in * b;
    o->poet_cayley_forward(be, Gi, m->params + a->qi_off, (a->in + a->out) / b, b, k);
    if (pi->fb.gpt2) { /* Conv1D (in, out): W0'^T */
        transpose(h2, h1, a->in, a->out);
        memcpy(h1, h2, n * sizeof(float));
    }
    o->copy_to_device(be, d, h1, n * sizeof(float));
    o->poet_apply_forward(be, d, d, Gi, NULL, a->out, a->in, b, 1); /* W0' P', (out, in) */
    o->copy_to_host(be, h1, d, n * sizeof(float));
    transpose(h2, h1, a->out, a->in);                                /* (W0' P')^T, (in, out) */
    o->copy_to_device(be, d, h2, n * sizeof(float));
    o->poet_apply_forward(be, d, d, Go, NULL, a->in, a->out, b, 0); /* (R' W0' P')^T */
    o->copy_to_host(be, h1, d, n * sizeof(float));
    if (!pi->fb.gpt2) {
        transpose(h2, h1, a->in, a->out);
        memcpy(h1, h2, n * sizeof(float));
    }
}


/* Every weight's W0 (only >= 0: that weight's alone), one at a time through host fp32: from the
 * held W0 in the frame of the permutations held (or as flags say), R and P folded in (W0_FOLD),
 * out of the frame into the base's layout, then into the base's vector (dense NULL) or dense (a
 * vector of the base's table) in its layout (newp NULL: save_hf, the held W0 unchanged) or into
 * the held W0 in the frame of newp (every weight's
 * permutations, host, laid out as pi->perms), rounded to frozen_dtype once; newp then becomes the
 * permutations held. With W0_FROM_BASE and frozen_dtype bf16 or int8 the base's fp32 pages of W0
 * are given back after (the store's is the one W0 from now on). */
static st_status w0_pass(st_model *m, int flags, const int32_t *newp, int only, float *dense, st_err *err) {
    poet_impl *pi = impl_of(m);
    st_backend *be = m->be;
    const st_backend_ops *o = be->ops;
    size_t mx = 0;
    for (int i = 0; i < pi->n_w; i++)
        if ((size_t)pi->w[i].in * pi->w[i].out > mx) mx = (size_t)pi->w[i].in * pi->w[i].out;
    float *h1 = malloc((mx ? mx : 1) * sizeof(float)), *h2 = malloc((mx ? mx : 1) * sizeof(float));
    float *d = (flags & W0_FOLD) ? o->alloc(be, (mx ? mx : 1) * sizeof(float)) : NULL;
    int32_t *oldp = malloc((pi->n_perm ? pi->n_perm : 1) * sizeof(int32_t));
    if (!h1 || !h2 || !oldp || ((flags & W0_FOLD) && !d)) {
        free(h1), free(h2), free(oldp);
        if (d) o->dealloc(be, d);
        return st_errf(err, ST_ERR_NOMEM, "poetx: out of memory for W0 (%.1f MiB) in a merge or a change of its "
                       "permutations", 3.0 * mx * 4 / 1048576.0);
    }
    o->copy_to_host(be, oldp, pi->perms, pi->n_perm * sizeof(int32_t));
    const int f32 = pi->cfg.frozen_dtype == ST_FROZEN_F32, gpt2 = pi->fb.gpt2;
    for (int i = 0; i < pi->n_w; i++) {
        const poet_weight *a = &pi->w[i];
        if (only >= 0 && i != only) continue;
        size_t n = (size_t)a->in * a->out, po_in = (size_t)(a->perm_in - pi->perms), po_out = po_in + a->in;
        if (f32 || (flags & W0_FROM_BASE)) o->copy_to_host(be, h1, base_w0(pi, i), n * sizeof(float));
        else frozen_weight_get(&pi->fw[i], 0, n, h1);
        if (flags & W0_FOLD) fold_weight(m, a, h1, h2, d);
        float *w = h1; /* W0 in the base's layout: w */
        if (!(flags & (W0_FROM_BASE | W0_RAW))) {
            w0_permute(a, gpt2, h2, h1, oldp + po_in, oldp + po_out, 0);
            w = h2;
        }
        if (!newp) {
            o->copy_to_device(be, dense ? dense + a->base_t->offset : base_w0(pi, i), w, n * sizeof(float));
            continue;
        }
        float *v = w == h1 ? h2 : h1;
        w0_permute(a, gpt2, v, w, newp + po_in, newp + po_out, 1);
        if (f32) o->copy_to_device(be, base_w0(pi, i), v, n * sizeof(float));
        else frozen_weight_set(&pi->fw[i], v);
        if (!f32 && (flags & W0_FROM_BASE)) frozen_release(base_w0(pi, i), a->base_t->numel * sizeof(float));
    }
    if (newp) o->copy_to_device(be, pi->perms, newp, pi->n_perm * sizeof(int32_t));
    if (d) o->dealloc(be, d);
    free(h1), free(h2), free(oldp);
    return ST_OK;
}

st_status st_poetx_merge(st_model *m, uint64_t seed, int64_t step, st_err *err) {
    if (!st_model_is_poetx(m)) return st_errf(err, ST_ERR_INVALID, "poetx: the model is not a POET-X model");
    poet_impl *pi = impl_of(m);
    st_status s = redraw(m, seed, step, W0_FOLD, err); /* W0 <- R W0 P, in the frame of the new permutations */
    if (s) return s;
    m->be->ops->memset0(m->be, m->params + pi->q_off, (m->n_params - pi->q_off) * sizeof(float));
    return ST_OK;
}

/* ------------------------------------------------------------------ creation */

/* st_poetx_model_create; init 0: the state left for st_poetx_model_create_from's load. */
static st_status poetx_create(st_model **out, st_model *base, const st_poetx_config *cfg, uint64_t seed, int init,
                              st_err *err) {
    *out = NULL;
    const st_backend_ops *bo = base->be->ops;
    if (!bo->poet_cayley_forward || !bo->poet_cayley_backward || !bo->poet_apply_forward ||
        !bo->poet_apply_backward || !bo->axpy_rows || !bo->poet_permute) {
        const char *name = bo->name;
        st_model_free(base);
        return st_errf(err, ST_ERR_UNSUPPORTED, "poetx: backend '%s' lacks the poet_* or axpy_rows ops; train POET-X "
                       "on the cpu backend", name);
    }
    if ((unsigned)cfg->frozen_dtype > ST_FROZEN_INT8 ||
        (cfg->frozen_dtype != ST_FROZEN_F32 && !st_backend_host_memory(base->be))) {
        const char *name = bo->name;
        int fd = (int)cfg->frozen_dtype;
        st_model_free(base);
        if ((unsigned)fd > ST_FROZEN_INT8)
            return st_errf(err, ST_ERR_INVALID, "key 'frozen_dtype': %d is not fp32, bf16 or int8", fd);
        return st_errf(err, ST_ERR_UNSUPPORTED, "key 'frozen_dtype': %s W0 is dequantised by the host, and backend "
                       "'%s' keeps its weights elsewhere; train it on the cpu backend or give frozen_dtype fp32",
                       st_frozen_dtype_name((st_frozen_dtype)fd), name);
    }
    int n_w = 0, n_tr = 0;
    size_t np = 0, nq = 0, ng = 0;
    st_status s = build(base->tensors, base->n_tensors, base->ops->arch, cfg, NULL, &n_w, NULL, &n_tr, &np, &nq, &ng,
                        err);
    if (s) {
        st_model_free(base);
        return s;
    }
    st_model *m = calloc(1, sizeof *m);
    poet_impl *pi = calloc(1, sizeof *pi);
    if (pi) {
        pi->w = calloc((size_t)(n_w ? n_w : 1), sizeof *pi->w);
        pi->train = calloc((size_t)(n_tr ? n_tr : 1), sizeof *pi->train);
        pi->tensors = calloc((size_t)(n_tr + 2 * n_w + 1), sizeof *pi->tensors);
    }
    if (!m || !pi || frozen_base_init(&pi->fb, m, base) || !pi->w || !pi->train || !pi->tensors) {
        if (pi) {
            free(pi->w);
            free(pi->train);
            free(pi->fb.first);
            free(pi->tensors);
        }
        free(pi);
        free(m);
        st_model_free(base);
        return st_errf(err, ST_ERR_NOMEM, "out of memory");
    }
    int gpt2 = pi->fb.gpt2;
    m->ops = &poetx_ops;
    m->impl = pi;
    m->be = base->be;
    pi->cfg = *cfg;
    build(base->tensors, base->n_tensors, base->ops->arch, cfg, pi->w, &pi->n_w, pi->train, &pi->n_train, &np, &nq,
          &ng, err);
    pi->q_off = np - nq;
    frozen_base_index(pi->fb.first, pi->fb.n_layer * ST_MM_COUNT, pi->w, sizeof *pi->w, pi->n_w);
    /* the tensor table: the base's trainables under their names, then each weight's Q's */
    int nt = 0;
    for (int i = 0; i < base->n_tensors; i++) {
        if (frozen_base_proj_of(base->tensors[i].name, gpt2) >= 0) continue;
        pi->tensors[nt] = base->tensors[i];
        pi->tensors[nt].offset = pi->train[nt].off;
        nt++;
    }
    int b = cfg->block, nqb = b * (b - 1) / 2;
    size_t nperm = 0;
    for (int i = 0; i < pi->n_w; i++) {
        poet_weight *a = &pi->w[i];
        const char *bn = a->base_t->name;
        int lw = (int)(strlen(bn) - strlen(".weight"));
        st_param_info *ti = &pi->tensors[nt++], *to = &pi->tensors[nt++];
        /* role bias: no weight decay (Adam on the packed parameters, as published), zero init */
        *ti = (st_param_info){.offset = a->qi_off, .numel = (size_t)(a->in / b) * nqb, .ndim = 2,
                              .shape = {a->in / b, nqb}, .role = ST_ROLE_BIAS};
        *to = (st_param_info){.offset = a->qo_off, .numel = (size_t)(a->out / b) * nqb, .ndim = 2,
                              .shape = {a->out / b, nqb}, .role = ST_ROLE_BIAS};
        snprintf(ti->name, sizeof ti->name, "%.*s.poet_q_in", lw, bn);
        snprintf(to->name, sizeof to->name, "%.*s.poet_q_out", lw, bn);
        if (a->in > pi->max_d) pi->max_d = a->in;
        if (a->out > pi->max_d) pi->max_d = a->out;
        if (a->in / b > pi->max_nb) pi->max_nb = a->in / b;
        if (a->out / b > pi->max_nb) pi->max_nb = a->out / b;
        nperm += (size_t)a->in + a->out;
    }
    m->n_tensors = nt;
    m->tensors = pi->tensors;
    int vectors = frozen_base_vectors(m, &pi->fb, np);
    pi->h_total = ng; /* build's count: the weights' out summed */
    size_t gmax = 0;
    for (int i = 0; i < pi->n_w; i++)
        if ((size_t)(pi->w[i].in + pi->w[i].out) * b > gmax) gmax = (size_t)(pi->w[i].in + pi->w[i].out) * b;
    ng = gmax;
    pi->G = m->be->ops->alloc(m->be, (ng ? ng : 1) * sizeof(float));
    pi->perms = m->be->ops->alloc(m->be, (nperm ? nperm : 1) * sizeof(int32_t));
    /* the store: fp32 is the base's own W0; bf16 and int8 their codes, filled by init_state */
    int store_ok = (pi->fw = calloc((size_t)(pi->n_w ? pi->n_w : 1), sizeof *pi->fw)) != NULL;
    for (int i = 0; store_ok && i < pi->n_w; i++) {
        const st_param_info *t = pi->w[i].base_t;
        pi->fw[i] = (frozen_weight){.dtype = cfg->frozen_dtype, .rows = t->shape[0], .cols = t->shape[1],
                                    .layout = gpt2 ? ST_W_IN_OUT : ST_W_OUT_IN};
    }
    if (store_ok && cfg->frozen_dtype != ST_FROZEN_F32) { /* one allocation, layer by layer: what a
                                                          * layer-streaming executor carries */
        frozen_weight **ws = malloc(sizeof *ws * (size_t)(pi->n_w ? pi->n_w : 1));
        int *layer = malloc(sizeof *layer * (size_t)(pi->n_w ? pi->n_w : 1));
        store_ok = ws && layer;
        for (int i = 0; store_ok && i < pi->n_w; i++) {
            ws[i] = &pi->fw[i];
            layer[i] = pi->w[i].key / ST_MM_COUNT;
        }
        store_ok = store_ok && !frozen_base_hold(&pi->fb, cfg->frozen_dtype, ws, layer, pi->n_w);
        free(ws);
        free(layer);
    }
    for (int i = 0; store_ok && i < pi->n_w; i++) pi->fw[i].f32 = base->params + pi->w[i].base_t->offset;
    size_t max_numel = 0;
    for (int i = 0; i < pi->n_w; i++)
        if (pi->w[i].base_t->numel > max_numel) max_numel = pi->w[i].base_t->numel;
    pi->panel_bytes = cfg->frozen_dtype == ST_FROZEN_F32 ? 0 : st_frozen_panel_bytes(max_numel);
    for (int i = 0; pi->panel_bytes && i < pi->n_w; i++) /* a panel holds at least one output row */
        if ((size_t)pi->w[i].in * sizeof(float) > pi->panel_bytes) {
            int in = pi->w[i].in;
            char name[96];
            snprintf(name, sizeof name, "%s", pi->w[i].base_t->name);
            po_destroy(m);
            return st_errf(err, ST_ERR_UNSUPPORTED, "key 'frozen_dtype': %s has %d inputs, more than one output row "
                           "of the %zu-byte dequantising panel holds; use frozen_dtype fp32 for this model", name, in,
                           st_frozen_panel_bytes(max_numel));
        }
    if (store_ok && pi->panel_bytes) store_ok = (pi->panel = malloc(pi->panel_bytes)) != NULL;
    if (!store_ok) {
        po_destroy(m);
        return st_errf(err, ST_ERR_NOMEM, "poetx: cannot allocate W0 in frozen_dtype %s",
                       st_frozen_dtype_name(cfg->frozen_dtype));
    }
    if (vectors || !pi->G || !pi->perms) {
        po_destroy(m);
        return st_errf(err, ST_ERR_NOMEM, "poetx: cannot allocate %.1f MiB for the trainable parameters, their "
                       "gradients and the blocks' G", (2.0 * np + ng + nperm) * 4 / 1048576.0);
    }
    for (size_t i = 0, off = 0; i < (size_t)pi->n_w; i++) {
        pi->w[i].perm_in = pi->perms + off;
        pi->w[i].perm_out = pi->perms + off + pi->w[i].in;
        off += (size_t)pi->w[i].in + pi->w[i].out;
    }
    pi->n_perm = nperm;
    /* The base's gradient vector goes: what trains has its gradient in m->grads (hook_grad_at),
     * the frozen matmul weights none. GPT-2's embedding and final norm are read and trained
     * in place in m's vectors (their pointers moved), the block tensors copied before each
     * forward. */
    frozen_base_drop_grads(&pi->fb);
    if (gpt2) {
        st_gpt2_model *g = base->impl;
        pi->blk0 = g->block_offset0;
        pi->blk_numel = g->block_numel;
        size_t lnf = (size_t)(g->lnf_w - g->params);
        for (int i = 0; i < pi->n_train; i++) {
            poet_train *t = &pi->train[i];
            if (t->base_off == 0) {
                g->emb_w = m->params + t->off;
                g->emb_g = m->grads + t->off;
            } else if (t->base_off == lnf) {
                g->lnf_w = m->params + t->off;
                g->lnf_g = m->grads + t->off;
            }
            t->aliased = t->base_off < pi->blk0 || t->base_off >= lnf; /* wte, wpe; ln_f weight, bias */
        }
    } else {
        st_llama_model *l = base->impl;
        pi->blk0 = l->block_offset0;
        pi->blk_numel = l->block_numel;
    }
    /* (the held run's size and host address, frozen_base_hold's, kept) */
    pi->fb.hook.linear_forward = hook_linear_forward;
    pi->fb.hook.linear_backward = hook_linear_backward;
    pi->fb.hook.grad_at = hook_grad_at;
    frozen_base_set_hook(&pi->fb, &pi->fb.hook);
    if (init && (s = init_state(m, seed, err))) {
        po_destroy(m);
        return s;
    }
    *out = m;
    return ST_OK;
}

st_status st_poetx_model_create(st_model **out, st_model *base, const st_poetx_config *cfg, uint64_t seed,
                                st_err *err) {
    return poetx_create(out, base, cfg, seed, 1, err);
}

typedef struct w0_load {
    st_model *m;
    const int32_t *perms; /* the permutations of (seed, step 0), host */
    const char *from;
} w0_load;

/* The loader's step after tensor t is in the base's vector at `at` (model_load_each): checked
 * finite, and a W0 taken into the frame of the permutations and into the store (w0_pass of that
 * weight alone: with bf16 or int8 rounded and its fp32 pages given back) before the next is read. */
static st_status w0_each(void *ctx, const st_param_info *t, float *at, st_err *err) {
    const w0_load *h = ctx;
    poet_impl *pi = impl_of(h->m);
    st_status s = model_tensor_check_finite(t, at, h->from, err);
    for (int i = 0; !s && i < pi->n_w; i++)
        if (pi->w[i].base_t == t) return w0_pass(h->m, W0_FROM_BASE, h->perms, i, NULL, err);
    return s;
}

st_status st_poetx_model_create_from(st_model **out, st_model *base, const char *hf_dir, const st_poetx_config *cfg,
                                     uint64_t seed, st_err *err) {
    st_status s = poetx_create(out, base, cfg, seed, 0, err);
    if (s) return s;
    poet_impl *pi = impl_of(*out);
    int32_t *np = malloc((pi->n_perm ? pi->n_perm : 1) * sizeof(int32_t));
    if (!np) s = st_errf(err, ST_ERR_NOMEM, "poetx: out of memory for the permutations");
    if (!s) {
        draw_perms_host(pi, seed, 0, np); /* init_state's redraw, a weight at a time */
        w0_load h = {*out, np, hf_dir};
        model_load_each each = {w0_each, &h};
        s = model_load_hf(base, hf_dir, &each, err);
    }
    free(np);
    if (!s) init_trainables(*out); /* the base's other tensors, read whole now */
    if (s) {
        st_model_free(*out); /* the base half read, some of W0 rounded: discarded */
        *out = NULL;
    }
    return s;
}

typedef struct w0_draw {
    st_model *m;
    const int32_t *perms;      /* the permutations of (seed, step 0), host */
    const st_poetx_orth *orth; /* NULL: W0 as drawn */
    int *pending, n_pending;   /* drawn W0 (their index in pi->w, poetx_init's walk) awaiting orth */
} w0_draw;

/* The pending W0 made orthogonal together (orth's threads), then each into the frame of the
 * permutations and into the store (with bf16 or int8 its fp32 pages given back). */
static st_status w0_flush(w0_draw *h, st_err *err) {
    st_status s = ST_OK;
    if (h->n_pending) s = h->orth->fn(h->orth->ctx, impl_of(h->m)->fb.base, h->pending, h->n_pending, err);
    for (int j = 0; !s && j < h->n_pending; j++) s = w0_pass(h->m, W0_FROM_BASE, h->perms, h->pending[j], NULL, err);
    h->n_pending = 0;
    return s;
}

/* The draw's step after tensor t is in the base's vector (model_init_each): a W0 into the store
 * (w0_pass of that weight alone) before the next is drawn, or with orth once orth->batch of them
 * are drawn. */
static st_status w0_drawn(void *ctx, const st_param_info *t, float *at, st_err *err) {
    w0_draw *h = ctx;
    const poet_impl *pi = impl_of(h->m);
    (void)at;
    for (int i = 0; i < pi->n_w; i++) {
        if (pi->w[i].base_t != t) continue;
        if (!h->orth) return w0_pass(h->m, W0_FROM_BASE, h->perms, i, NULL, err);
        h->pending[h->n_pending++] = i;
        return h->n_pending >= h->orth->batch ? w0_flush(h, err) : ST_OK;
    }
    return ST_OK;
}

st_status st_poetx_model_create_drawn(st_model **out, st_model *base, const st_poetx_config *cfg, uint64_t seed,
                                      const st_poetx_orth *orth, st_err *err) {
    if (orth && (!orth->fn || orth->batch < 1)) {
        st_model_free(base);
        return st_errf(err, ST_ERR_INVALID, "poetx: an orthogonal W0's batch of %d weights (give at least 1)",
                       orth ? orth->batch : 0);
    }
    st_status s = poetx_create(out, base, cfg, seed, 0, err);
    if (s) return s;
    poet_impl *pi = impl_of(*out);
    int32_t *np = malloc((pi->n_perm ? pi->n_perm : 1) * sizeof(int32_t));
    int *pending = orth ? malloc((size_t)orth->batch * sizeof(int)) : NULL;
    if (!np || (orth && !pending)) s = st_errf(err, ST_ERR_NOMEM, "poetx: out of memory for the permutations");
    if (!s) {
        draw_perms_host(pi, seed, 0, np); /* init_state's redraw, a weight at a time */
        w0_draw h = {*out, np, orth, pending, 0};
        model_load_each each = {w0_drawn, &h};
        s = model_init_each(base, seed, &each, err);
        if (!s) s = w0_flush(&h, err); /* the last W0 drawn, fewer than a batch */
    }
    free(np);
    free(pending);
    if (!s) init_trainables(*out); /* the base's other tensors, drawn whole now */
    if (s) {
        st_model_free(*out); /* the base half drawn, some of W0 rounded: discarded */
        *out = NULL;
    }
    return s;
}
