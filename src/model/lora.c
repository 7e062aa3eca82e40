/* lora.c - LoRA adapters over a frozen base model (strata/lora.h).
 *
 * The adapters of one projection: A (r, in), B (out, r), scale s = alpha / r. After the base
 * matmul writes out (N, ld) (ld the packed width: GPT-2's c_attn is 3C wide, the Llama
 * family's q|k|v and gate|up are one matmul each), the hook adds
 *     t = x A^T (N, r),  u = t B^T (N, out),  out[:, col .. col + out) += s u
 * and backward, from dout (N, ld):
 *     du = s dout[:, col ..),  dB += du^T t,  dt = du B,  dA += dt^T x,  dx += dt A
 * with t recomputed from x (r columns: cheaper than keeping it). No gradient of W0 is formed:
 * the base's block functions skip their weight gradients when the hook says frozen.
 *
 * frozen_dtype bf16 or int8: every matmul weight of the base's blocks (all frozen, adapted or
 * not) is held in the frozen store (frozen_store.h), one per projection, rounded once from the
 * base's vector at creation, whose fp32 pages of them are then given back. The hook's
 * linear_forward and linear_backward take the block's matmul in place: out = x W0^T through the
 * store's panels (each projection of a packed matmul into its columns) plus the bias; backward
 * dx += dout W0 the same way (no dW0). The adapters' term above is added on top, unchanged.
 */
#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "strata/llama.h"
#include "strata/lora.h"
#include "strata/safetensors.h"
#include "model/frozen_base_internal.h"
#include "model/frozen_store.h"
#include "model/model_internal.h"

typedef struct lora_adapter {
    int key;              /* first (frozen_base_index): layer * ST_MM_COUNT + the block matmul */
    int in, out, col, ld; /* input width, output rows, column in the packed output, its width */
    size_t a_off, b_off;  /* A (r, in) and B (out, r) in the adapter vector */
    const st_param_info *base_t;
} lora_adapter;

/* A matmul weight of the base's blocks held in frozen_dtype (one projection, frozen_site's). */
typedef struct lora_held {
    int key;              /* first (frozen_base_index): layer * ST_MM_COUNT + the block matmul */
    int out, col, ld;     /* output rows, column in the packed output, its width */
    const st_param_info *base_t;
    frozen_weight fw;
} lora_held;

typedef struct lora_impl {
    frozen_base fb;      /* first: the hook, the base; fb.first[k] .. [k + 1]: the adapters of matmul key k */
    st_lora_config cfg;
    float scale;
    int n_ad;
    lora_adapter *ad;
    st_param_info *tensors;
    float *scratch;      /* t (N, r) | dt (N, r) | u (N, max out) | the norms' dropped gradients */
    int N, max_out, max_norm;
    char canon_targets[256]; /* the targets under the family's full names (adapter_config.json) */
    /* frozen_dtype bf16, int8: the held weights, held_first[k] .. [k + 1] those of matmul key k */
    int n_held, *held_first, y_cols, tmp_cols;
    lora_held *held;
    float *panel;        /* panel_bytes of host memory: a panel dequantised */
    size_t panel_bytes;
    float *mm_y, *mm_tmp;/* N x y_cols: one projection's product or dout columns (packed matmuls);
                          * N x tmp_cols: a panel's partial product (a weight of several panels) */
} lora_impl;

static lora_impl *impl_of(const st_model *m) { return (lora_impl *)m->impl; }

/* ------------------------------------------------------------------ the table */

/* Does module name `mod` (the weight's name less ".weight") match target tg, as PEFT's
 * target_modules list does (equal, or ending in "." + tg)? */
static int module_matches(const char *mod, const char *tg) {
    size_t lm = strlen(mod), lt = strlen(tg);
    if (lm == lt) return !strcmp(mod, tg);
    return lm > lt && mod[lm - lt - 1] == '.' && !strcmp(mod + lm - lt, tg);
}

typedef struct targets {
    int n;
    char name[16][64];
} targets;

/* cfg->targets cut at commas, spaces trimmed, short forms (q, gate ...) made full. */
static st_status parse_targets(const char *spec, const frozen_proj *pk, int npk, targets *t, st_err *err) {
    t->n = 0;
    const char *p = spec;
    while (*p) {
        while (*p == ' ' || *p == ',') p++;
        if (!*p) break;
        size_t n = strcspn(p, ",");
        while (n && p[n - 1] == ' ') n--;
        if (t->n == 16 || n >= sizeof t->name[0])
            return st_errf(err, ST_ERR_INVALID, "key 'lora_targets': '%s' has too many or too long names (at most 16 "
                           "of 63 characters)", spec);
        memcpy(t->name[t->n], p, n);
        t->name[t->n][n] = 0;
        for (int i = 0; i < npk; i++)
            if (pk[i].short_name && !strcmp(t->name[t->n], pk[i].short_name))
                snprintf(t->name[t->n], sizeof t->name[0], "%s", pk[i].module);
        t->n++;
        p += strcspn(p, ",");
    }
    if (!t->n)
        return st_errf(err, ST_ERR_INVALID, "key 'lora_targets' is empty; name the projections to adapt, e.g. %s",
                       npk == 4 ? "c_attn,c_proj,c_fc" : "q_proj,k_proj,v_proj,o_proj");
    return ST_OK;
}

/* The adapters of cfg over a tensor table (ad may be NULL: count only). */
static st_status build_adapters(const st_param_info *tt, int nt, const char *arch, const st_lora_config *cfg,
                                lora_adapter *ad, int *n_ad, size_t *n_params, char *canon, size_t canon_cap,
                                st_err *err) {
    int gpt2 = !strcmp(arch, "gpt2"), npk;
    const frozen_proj *pk = frozen_base_projs(gpt2, &npk);
    if (cfg->rank < 1) return st_errf(err, ST_ERR_INVALID, "key 'lora_rank' is %d; it must be >= 1", cfg->rank);
    if (!(cfg->alpha > 0) || !isfinite(cfg->alpha))
        return st_errf(err, ST_ERR_INVALID, "key 'lora_alpha' is %g; it must be > 0 (the scale is alpha / rank)",
                       cfg->alpha);
    targets tg;
    st_status s = parse_targets(cfg->targets, pk, npk, &tg, err);
    if (s) return s;
    int used[16] = {0}, n = 0;
    size_t np = 0;
    frozen_site site;
    for (int cur = 0; frozen_base_next_site(tt, nt, gpt2, &cur, &site);) {
        const st_param_info *t = site.t;
        int in = site.in, out = site.out;
        char mod[96];
        snprintf(mod, sizeof mod, "%.*s", (int)(strlen(t->name) - strlen(".weight")), t->name);
        int hit = 0;
        for (int j = 0; j < tg.n; j++)
            if (module_matches(mod, tg.name[j])) hit = used[j] = 1;
        if (hit) {
            int lo = in < out ? in : out;
            if (cfg->rank > lo)
                return st_errf(err, ST_ERR_INVALID, "key 'lora_rank' is %d, larger than tensor '%s' (%d x %d) allows "
                               "(its smaller dimension, %d); lower lora_rank or leave that projection out of "
                               "lora_targets", cfg->rank, t->name, t->shape[0], t->shape[1], lo);
            if (ad) ad[n] = (lora_adapter){.key = site.key, .in = in, .out = out, .col = site.col, .ld = site.ld,
                                           .a_off = np, .b_off = np + (size_t)cfg->rank * in, .base_t = t};
            n++;
            np += (size_t)cfg->rank * (in + out);
        }
    }
    for (int j = 0; j < tg.n; j++)
        if (!used[j]) {
            char have[160] = "";
            for (int i = 0; i < npk; i++)
                if (!strstr(have, pk[i].module))
                    snprintf(have + strlen(have), sizeof have - strlen(have), "%s%s", have[0] ? ", " : "", pk[i].module);
            return st_errf(err, ST_ERR_INVALID, "key 'lora_targets': '%s' names no projection of this %s model; its "
                           "projections are %s", tg.name[j], arch, have);
        }
    if (canon) {
        canon[0] = 0;
        for (int j = 0; j < tg.n; j++)
            snprintf(canon + strlen(canon), canon_cap - strlen(canon), "%s%s", j ? "," : "", tg.name[j]);
    }
    *n_ad = n;
    if (n_params) *n_params = np;
    return ST_OK;
}

st_status st_lora_check(const st_param_info *tensors, int n_tensors, const char *arch, const st_lora_config *cfg,
                        size_t *n_params, st_err *err) {
    int n;
    return build_adapters(tensors, n_tensors, arch, cfg, NULL, &n, n_params, NULL, 0, err);
}

/* ------------------------------------------------------------------ the hook */

static void hook_forward(st_linear_hook *h, int mm, float *out, const float *x, int N) {
    lora_impl *li = (lora_impl *)h;
    st_backend *be = li->fb.base->be;
    const float *p = li->fb.self->params;
    int r = li->cfg.rank, k = h->layer * ST_MM_COUNT + mm;
    float *t = li->scratch, *u = t + 2 * (size_t)li->N * r;
    for (int i = li->fb.first[k]; i < li->fb.first[k + 1]; i++) {
        const lora_adapter *a = &li->ad[i];
        be->ops->matmul_forward(be, t, x, p + a->a_off, NULL, N, a->in, r, ST_W_OUT_IN);
        be->ops->matmul_forward(be, u, t, p + a->b_off, NULL, N, r, a->out, ST_W_OUT_IN);
        be->ops->axpy_rows(be, out + a->col, a->ld, u, a->out, li->scale, N, a->out);
    }
}

static void hook_backward(st_linear_hook *h, int mm, float *dx, const float *dout, const float *x, int N) {
    lora_impl *li = (lora_impl *)h;
    st_backend *be = li->fb.base->be;
    const float *p = li->fb.self->params;
    float *g = li->fb.self->grads;
    int r = li->cfg.rank, k = h->layer * ST_MM_COUNT + mm;
    float *t = li->scratch, *dt = t + (size_t)li->N * r, *du = dt + (size_t)li->N * r;
    for (int i = li->fb.first[k]; i < li->fb.first[k + 1]; i++) {
        const lora_adapter *a = &li->ad[i];
        be->ops->memset0(be, du, (size_t)N * a->out * sizeof(float));
        be->ops->axpy_rows(be, du, a->out, dout + a->col, a->ld, li->scale, N, a->out);
        be->ops->matmul_forward(be, t, x, p + a->a_off, NULL, N, a->in, r, ST_W_OUT_IN);
        be->ops->memset0(be, dt, (size_t)N * r * sizeof(float));
        be->ops->matmul_backward(be, dt, g + a->b_off, NULL, du, t, p + a->b_off, N, r, a->out, ST_W_OUT_IN);
        be->ops->matmul_backward(be, dx, g + a->a_off, NULL, dt, x, p + a->a_off, N, a->in, r, ST_W_OUT_IN);
    }
}

/* frozen_dtype bf16, int8: the block's matmul through the held weights, in place of the base's.
 * out (N, ld) = x W0^T (+ bias); w, the block's own fp32 weight, is not read (its pages given
 * back; a layer-streaming executor's held slab has none: the weights are read from its copy of
 * the layer's held run, frozen_base_held_view). */
static void hook_linear_forward(st_linear_hook *h, int mm, float *out, const float *x, const float *w,
                                const float *bias, int N) {
    lora_impl *li = (lora_impl *)h;
    st_backend *be = li->fb.base->be;
    const st_backend_ops *o = be->ops;
    int k = h->layer * ST_MM_COUNT + mm, i0 = li->held_first[k], i1 = li->held_first[k + 1];
    size_t pf = li->panel_bytes / sizeof(float);
    int ld = li->held[i0].ld;
    (void)w;
    if (i1 - i0 == 1) {
        frozen_weight fw = frozen_base_held_view(&li->fb, &li->held[i0].fw);
        frozen_matmul_forward(be, &fw, out, x, N, li->panel, pf, li->mm_tmp);
    } else { /* q|k|v, gate|up: each projection into its columns */
        o->memset0(be, out, (size_t)N * ld * sizeof(float));
        for (int i = i0; i < i1; i++) {
            const lora_held *a = &li->held[i];
            frozen_weight fw = frozen_base_held_view(&li->fb, &a->fw);
            frozen_matmul_forward(be, &fw, li->mm_y, x, N, li->panel, pf, li->mm_tmp);
            o->axpy_rows(be, out + a->col, ld, li->mm_y, a->out, 1.0f, N, a->out);
        }
    }
    if (bias) o->axpy_rows(be, out, ld, bias, 0, 1.0f, N, ld); /* every row += bias */
}

/* dx (N, in) += dout (N, ld) W0 through the held weights; no gradient of W0; dbias += the
 * column sums where asked (frozen: the blocks pass none). */
static void hook_linear_backward(st_linear_hook *h, int mm, float *dx, float *dbias, const float *dout,
                                 const float *x, const float *w, int N) {
    lora_impl *li = (lora_impl *)h;
    st_backend *be = li->fb.base->be;
    const st_backend_ops *o = be->ops;
    int k = h->layer * ST_MM_COUNT + mm, i0 = li->held_first[k], i1 = li->held_first[k + 1];
    size_t pf = li->panel_bytes / sizeof(float);
    const lora_held *a0 = &li->held[i0];
    int ld = a0->ld, in = a0->fw.layout == ST_W_IN_OUT ? a0->fw.rows : a0->fw.cols;
    (void)x, (void)w;
    if (dbias) o->matmul_backward(be, NULL, NULL, dbias, dout, NULL, NULL, N, in, ld, a0->fw.layout);
    for (int i = i0; i < i1; i++) {
        const lora_held *a = &li->held[i];
        const float *d = dout;
        if (a->out != ld) { /* the projection's columns of dout, contiguous */
            o->memset0(be, li->mm_y, (size_t)N * a->out * sizeof(float));
            o->axpy_rows(be, li->mm_y, a->out, dout + a->col, ld, 1.0f, N, a->out);
            d = li->mm_y;
        }
        frozen_weight fw = frozen_base_held_view(&li->fb, &a->fw);
        frozen_matmul_backward_dx(be, &fw, dx, d, N, li->panel, pf, li->mm_tmp);
    }
}

/* ------------------------------------------------------------------ st_model ops */

/* The widest norm of a tensor table (the norms' dropped gradients' length; 1 where none). */
static int widest_norm(const st_param_info *t, int n) {
    int w = 1;
    for (int i = 0; i < n; i++)
        if (t[i].ndim == 1 && t[i].shape[0] > w) w = t[i].shape[0];
    return w;
}

/* The hook's scratch in floats for N rows: t and dt (N x rank each), u (N x the widest adapted
 * output), the norms' dropped gradients (2 x the widest norm). */
static size_t scratch_floats(size_t N, int rank, int max_out, int max_norm) {
    return 2 * N * (size_t)rank + N * (size_t)max_out + 2 * (size_t)max_norm;
}

/* The hook's scratch for B x T rows (t, dt, u, the norms' dropped gradients; the held matmuls'). */
static st_status alloc_scratch(st_model *m, int B, int T, st_err *err) {
    lora_impl *li = impl_of(m);
    st_backend *be = m->be;
    if (li->scratch) be->ops->dealloc(be, li->scratch);
    li->N = B * T;
    size_t n = scratch_floats((size_t)li->N, li->cfg.rank, li->max_out, li->max_norm);
    if (!(li->scratch = be->ops->alloc(be, n * sizeof(float))))
        return st_errf(err, ST_ERR_NOMEM, "lora: cannot allocate %.1f MiB of adapter scratch for batch %d x seq %d",
                       n * 4.0 / 1048576.0, B, T);
    li->fb.hook.norm_scratch = li->scratch + 2 * (size_t)li->N * li->cfg.rank + (size_t)li->N * li->max_out;
    if (li->mm_y) be->ops->dealloc(be, li->mm_y);
    if (li->mm_tmp) be->ops->dealloc(be, li->mm_tmp);
    li->mm_y = li->mm_tmp = NULL;
    size_t ny = (size_t)li->N * li->y_cols, nt = (size_t)li->N * li->tmp_cols;
    if ((ny && !(li->mm_y = be->ops->alloc(be, ny * sizeof(float)))) ||
        (nt && !(li->mm_tmp = be->ops->alloc(be, nt * sizeof(float)))))
        return st_errf(err, ST_ERR_NOMEM, "lora: cannot allocate %.1f MiB of frozen-weight scratch for batch %d x seq %d",
                       (ny + nt) * 4.0 / 1048576.0, B, T);
    return ST_OK;
}

static st_status lo_alloc_acts(st_model *m, int B, int T, st_err *err) {
    st_status s = frozen_base_alloc_acts(m, B, T, err);
    return s ? s : alloc_scratch(m, B, T, err);
}

st_status st_lora_hook_bind(st_model *m, int B, int T, st_linear_hook **hook, st_err *err) {
    *hook = NULL;
    if (!st_model_is_lora(m)) return st_errf(err, ST_ERR_INVALID, "lora: the model has no adapters");
    lora_impl *li = impl_of(m);
    if (B < 1 || T < 1) return st_errf(err, ST_ERR_INVALID, "lora: batch %d x seq %d", B, T);
    st_status s = alloc_scratch(m, B, T, err);
    if (!s) *hook = &li->fb.hook;
    return s;
}

static float lo_forward(st_model *m, const int32_t *in, const int32_t *tg, float dloss) {
    lora_impl *li = impl_of(m);
    return li->fb.base->ops->forward(li->fb.base, in, tg, dloss);
}

/* A ~ U(-1/sqrt(in), 1/sqrt(in)) (the bound of PEFT's kaiming_uniform(a = sqrt(5))), B = 0. */
static void lo_init_random(st_model *m, uint64_t seed) {
    lora_impl *li = impl_of(m);
    float *host = calloc(m->n_params ? m->n_params : 1, sizeof(float));
    if (!host) return;
    st_rng rng;
    st_rng_seed(&rng, seed ^ 0x4C6F5241ull); /* "LoRA": not the base's stream */
    for (int i = 0; i < li->n_ad; i++) {
        const lora_adapter *a = &li->ad[i];
        float bound = 1.0f / sqrtf((float)a->in);
        for (size_t j = 0; j < (size_t)li->cfg.rank * a->in; j++)
            host[a->a_off + j] = bound * (2.0f * st_rng_uniform(&rng) - 1.0f);
    }
    m->be->ops->copy_to_device(m->be, m->params, host, m->n_params * sizeof(float));
    free(host);
}

static st_status write_adapters(const st_model *m, const char *path, const char *const *meta, int n_meta,
                                st_err *err) {
    lora_impl *li = impl_of(m);
    float *host = malloc(m->n_params * sizeof(float));
    st_tensor_out *to = calloc((size_t)m->n_tensors, sizeof *to);
    if (!host || !to) {
        free(host);
        free(to);
        return st_errf(err, ST_ERR_NOMEM, "out of memory");
    }
    m->be->ops->copy_to_host(m->be, host, m->params, m->n_params * sizeof(float));
    for (int i = 0; i < m->n_tensors; i++) {
        const st_param_info *t = &li->tensors[i];
        to[i] = (st_tensor_out){.name = t->name, .dtype = ST_F32, .ndim = 2, .shape = {t->shape[0], t->shape[1]},
                                .data = host + t->offset};
    }
    st_status s = st_safetensors_write(path, to, m->n_tensors, meta, n_meta, err);
    free(host);
    free(to);
    return s;
}

static st_status lo_save(const st_model *m, const char *path, st_err *err) {
    lora_impl *li = impl_of(m);
    char r[16], a[32];
    snprintf(r, sizeof r, "%d", li->cfg.rank);
    snprintf(a, sizeof a, "%.17g", li->cfg.alpha);
    const char *meta[] = {"format", "strata-lora", "r", r, "lora_alpha", a, "target_modules", li->canon_targets};
    return write_adapters(m, path, meta, 4, err);
}

/* The adapters from a file lo_save or st_lora_save_adapter wrote (or PEFT's own
 * adapter_model.safetensors): every adapter under its name and shape. */
static st_status lo_load(st_model *m, const char *path, st_err *err) {
    lora_impl *li = impl_of(m);
    st_safetensors *st;
    st_status s = st_safetensors_open(&st, path, err);
    if (s) return s;
    st_safetensors **src = malloc((size_t)(m->n_tensors ? m->n_tensors : 1) * sizeof *src);
    if (!src) s = st_errf(err, ST_ERR_NOMEM, "out of memory");
    for (int i = 0; !s && i < m->n_tensors; i++) {
        const st_param_info *t = &li->tensors[i];
        if (!st_safetensors_find(st, t->name))
            s = st_errf(err, ST_ERR_FORMAT, "%s: no adapter '%s'; the file holds adapters of another rank, targets or "
                        "model (this run: r %d, lora_targets %s)", path, t->name, li->cfg.rank, li->canon_targets);
        src[i] = st;
    }
    if (!s) s = model_params_load(m->be, m->params, li->tensors, m->n_tensors, src, NULL, err);
    free(src);
    st_safetensors_close(st);
    return s;
}

static double lo_flops(const st_model *m, int T) {
    /* the base's forward and its backward to the activations (2/3 of its step: no weight
     * gradients) plus the adapters' 6 r (in + out) per token each (recompute included: 8) */
    lora_impl *li = impl_of(m);
    double f = li->fb.base->ops->flops_per_token(li->fb.base, T) * 2.0 / 3.0;
    for (int i = 0; i < li->n_ad; i++) f += 8.0 * li->cfg.rank * (li->ad[i].in + li->ad[i].out);
    return f;
}

static void lo_describe(const st_model *m, char *buf, size_t cap) {
    lora_impl *li = impl_of(m);
    char b[200];
    li->fb.base->ops->describe(li->fb.base, b, sizeof b);
    snprintf(buf, cap, "%s, LoRA r=%d alpha=%g on %s (%d adapted projections; %zu base weights frozen, the blocks' "
             "matmul weights held in %s)", b, li->cfg.rank, li->cfg.alpha, li->canon_targets, li->n_ad,
             li->fb.base->n_params, st_frozen_dtype_name(li->cfg.frozen_dtype));
}

static void lo_destroy(st_model *m) {
    lora_impl *li = impl_of(m);
    if (li) {
        if (li->scratch) m->be->ops->dealloc(m->be, li->scratch);
        if (li->mm_y) m->be->ops->dealloc(m->be, li->mm_y);
        if (li->mm_tmp) m->be->ops->dealloc(m->be, li->mm_tmp);
        for (int i = 0; li->held && i < li->n_held; i++) frozen_weight_free(&li->held[i].fw);
        free(li->held);
        free(li->held_first);
        free(li->panel);
        frozen_base_free(m, &li->fb);
        free(li->ad);
        free(li->tensors);
        free(li);
    }
    free(m);
}

static st_status lo_save_hf(const st_model *m, const char *dir, st_dtype dtype, st_err *err) {
    return st_lora_save_merged_hf(m, dir, dtype, err);
}

/* No decoder of its own (decode_info NULL): strata sample reads the merged model --save_hf writes. */
static const st_model_ops lora_ops = {
    .arch = "lora",
    .alloc_acts = lo_alloc_acts,
    .forward = lo_forward,
    .backward = frozen_base_backward,
    .init_random = lo_init_random,
    .save = lo_save,
    .load = lo_load,
    .flops_per_token = lo_flops,
    .describe = lo_describe,
    .destroy = lo_destroy,
    .step_gemms = frozen_base_step_gemms,
    .save_hf = lo_save_hf,
    .logits = frozen_base_logits,
    .set_docs = frozen_base_set_docs,
};

int st_model_is_lora(const st_model *m) { return m && m->ops == &lora_ops; }

/* The held matmuls' scratch columns over a table (panel_bytes the panel): *y the widest projection
 * of a packed matmul (0: none packed), *tmp the most output rows of a panel of a weight that takes
 * several (frozen_panel_rows' count; 0: every weight one panel). */
static void held_scratch(const st_param_info *tt, int nt, int gpt2, size_t panel_bytes, int *y, int *tmp) {
    frozen_site site;
    *y = *tmp = 0;
    for (int cur = 0; frozen_base_next_site(tt, nt, gpt2, &cur, &site);) {
        size_t pw = panel_bytes / sizeof(float) / (size_t)site.in;
        if (pw < 1) pw = 1;
        if (site.out != site.ld && site.out > *y) *y = site.out;
        if (pw < (size_t)site.out && (int)pw > *tmp) *tmp = (int)pw;
    }
}

size_t st_lora_hook_scratch_bytes(const st_param_info *tensors, int n_tensors, const char *arch,
                                  const st_lora_config *cfg, int B, int T) {
    int n_ad = 0, max_out = 0;
    st_err e = {0};
    if (build_adapters(tensors, n_tensors, arch, cfg, NULL, &n_ad, NULL, NULL, 0, &e)) return 0;
    lora_adapter *ad = calloc((size_t)(n_ad ? n_ad : 1), sizeof *ad);
    if (!ad) return 0;
    build_adapters(tensors, n_tensors, arch, cfg, ad, &n_ad, NULL, NULL, 0, &e);
    for (int i = 0; i < n_ad; i++)
        if (ad[i].out > max_out) max_out = ad[i].out;
    free(ad);
    return sizeof(float) * scratch_floats((size_t)B * (size_t)T, cfg->rank, max_out, widest_norm(tensors, n_tensors));
}

void st_lora_held_bytes(const st_param_info *tensors, int n_tensors, const char *arch, st_frozen_dtype d, size_t *numel,
                        size_t *held, size_t *panel, size_t *row_floats) {
    size_t n = 0, h = 0, mx = 0;
    int gpt2 = !strcmp(arch, "gpt2"), y = 0, tmp = 0;
    frozen_site site;
    for (int cur = 0; frozen_base_next_site(tensors, n_tensors, gpt2, &cur, &site);) {
        n += site.t->numel;
        h += st_frozen_bytes(d, site.t->numel);
        if (site.t->numel > mx) mx = site.t->numel;
    }
    *numel = n;
    *held = h;
    *panel = d == ST_FROZEN_F32 ? 0 : st_frozen_panel_bytes(mx);
    if (*panel) held_scratch(tensors, n_tensors, gpt2, *panel, &y, &tmp);
    *row_floats = (size_t)y + (size_t)tmp;
}

/* st_lora_load_peak_bytes and st_lora_draw_peak_bytes: `each` bytes a value of the tensor in
 * flight beside those kept (8: its fp32 and its file's pages; 4: its fp32 as drawn), or its fp32
 * and its held codes as it is rounded, the more */
static size_t start_peak_bytes(const st_param_info *tensors, int n_tensors, const char *arch, st_frozen_dtype d,
                               size_t each) {
    int gpt2 = !strcmp(arch, "gpt2"), cur = 0;
    frozen_site site;
    int more = d != ST_FROZEN_F32 && frozen_base_next_site(tensors, n_tensors, gpt2, &cur, &site);
    size_t kept = 0, peak = 0;
    for (int i = 0; i < n_tensors; i++) { /* the loader's and the draw's order (the table's) */
        const st_param_info *t = &tensors[i];
        int held = more && site.t == t;
        size_t hb = held ? st_frozen_bytes(d, t->numel) : 0, fly = each * t->numel;
        if (held && 4 * t->numel + hb > fly) fly = 4 * t->numel + hb; /* its fp32 beside its codes */
        if (kept + fly > peak) peak = kept + fly;
        kept += held ? hb : 4 * t->numel;
        if (held) more = frozen_base_next_site(tensors, n_tensors, gpt2, &cur, &site);
    }
    return kept > peak ? kept : peak;
}

size_t st_lora_load_peak_bytes(const st_param_info *tensors, int n_tensors, const char *arch, st_frozen_dtype d) {
    return start_peak_bytes(tensors, n_tensors, arch, d, 8);
}

size_t st_lora_draw_peak_bytes(const st_param_info *tensors, int n_tensors, const char *arch, st_frozen_dtype d) {
    return start_peak_bytes(tensors, n_tensors, arch, d, 4);
}

/* frozen_dtype bf16, int8: every matmul weight of the base's blocks into the store, rounded from
 * the base's vector as it is now and the fp32 pages of them given back (round_now; 0: each as
 * the loader reads it, hold_each); the hook takes the blocks' matmuls. Returns ST_OK, or a
 * refusal (the caller frees m). */
static st_status hold_weights(lora_impl *li, int round_now, st_err *err) {
    st_model *b = li->fb.base;
    int nk = li->fb.n_layer * ST_MM_COUNT, n = 0;
    frozen_site site;
    for (int cur = 0; frozen_base_next_site(b->tensors, b->n_tensors, li->fb.gpt2, &cur, &site);) n++;
    li->held = calloc((size_t)(n ? n : 1), sizeof *li->held);
    li->held_first = calloc((size_t)nk + 1, sizeof *li->held_first);
    if (!li->held || !li->held_first) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    size_t max_numel = 0;
    for (int cur = 0; frozen_base_next_site(b->tensors, b->n_tensors, li->fb.gpt2, &cur, &site);) {
        lora_held *a = &li->held[li->n_held];
        *a = (lora_held){.key = site.key, .out = site.out, .col = site.col, .ld = site.ld, .base_t = site.t};
        a->fw = (frozen_weight){.dtype = li->cfg.frozen_dtype, .rows = site.t->shape[0], .cols = site.t->shape[1],
                                .layout = li->fb.gpt2 ? ST_W_IN_OUT : ST_W_OUT_IN};
        li->n_held++;
        if (site.t->numel > max_numel) max_numel = site.t->numel;
    }
    /* one allocation, layer by layer: what a layer-streaming executor carries (frozen_base_hold) */
    frozen_weight **ws = malloc(sizeof *ws * (size_t)(n ? n : 1));
    int *layer = malloc(sizeof *layer * (size_t)(n ? n : 1));
    int bad = !ws || !layer;
    for (int i = 0; !bad && i < li->n_held; i++) {
        ws[i] = &li->held[i].fw;
        layer[i] = li->held[i].key / ST_MM_COUNT;
    }
    bad = bad || frozen_base_hold(&li->fb, li->cfg.frozen_dtype, ws, layer, li->n_held);
    free(ws);
    free(layer);
    if (bad)
        return st_errf(err, ST_ERR_NOMEM, "lora: cannot allocate the base's block matmul weights in frozen_dtype %s",
                       st_frozen_dtype_name(li->cfg.frozen_dtype));
    for (int i = 0; i < li->n_held; i++) li->held[i].fw.f32 = b->params + li->held[i].base_t->offset;
    frozen_base_index(li->held_first, nk, li->held, sizeof *li->held, li->n_held);
    li->panel_bytes = st_frozen_panel_bytes(max_numel);
    for (int i = 0; i < li->n_held; i++) {
        const frozen_weight *fw = &li->held[i].fw;
        int in = fw->layout == ST_W_IN_OUT ? fw->rows : fw->cols;
        if ((size_t)in * sizeof(float) > li->panel_bytes) /* a panel holds at least one output row */
            return st_errf(err, ST_ERR_UNSUPPORTED, "key 'frozen_dtype': %s has %d inputs, more than one output row "
                           "of the %zu-byte dequantising panel holds; use frozen_dtype fp32 for this model",
                           li->held[i].base_t->name, in, li->panel_bytes);
    }
    held_scratch(b->tensors, b->n_tensors, li->fb.gpt2, li->panel_bytes, &li->y_cols, &li->tmp_cols);
    if (!(li->panel = malloc(li->panel_bytes)))
        return st_errf(err, ST_ERR_NOMEM, "lora: cannot allocate the %zu-byte dequantising panel", li->panel_bytes);
    for (int i = 0; round_now && i < li->n_held; i++) {
        lora_held *a = &li->held[i];
        frozen_weight_set(&a->fw, b->params + a->base_t->offset);
        frozen_release(b->params + a->base_t->offset, a->base_t->numel * sizeof(float));
    }
    li->fb.hook.linear_forward = hook_linear_forward;
    li->fb.hook.linear_backward = hook_linear_backward;
    return ST_OK;
}
st_model *st_lora_base(const st_model *m) { return st_model_is_lora(m) ? impl_of(m)->fb.base : NULL; }
const st_lora_config *st_lora_config_of(const st_model *m) { return st_model_is_lora(m) ? &impl_of(m)->cfg : NULL; }

/* st_lora_model_create; round_now 0: the held weights' store made, each rounded into it as the
 * loader reads it (st_lora_model_create_from). */
static st_status lora_create(st_model **out, st_model *base, const st_lora_config *cfg, uint64_t seed, int round_now,
                             st_err *err) {
    *out = NULL;
    int gpt2 = !strcmp(base->ops->arch, "gpt2");
    if (!gpt2 && strcmp(base->ops->arch, "llama")) {
        st_model_free(base);
        return st_errf(err, ST_ERR_UNSUPPORTED, "lora: no adapters for a %s model (GPT-2 and the Llama family have them)",
                       base->ops->arch);
    }
    if (!base->be->ops->axpy_rows) {
        const char *name = base->be->ops->name;
        st_model_free(base);
        return st_errf(err, ST_ERR_UNSUPPORTED, "lora: backend '%s' has no axpy_rows op; train LoRA on the cpu "
                       "backend", name);
    }
    if ((unsigned)cfg->frozen_dtype > ST_FROZEN_INT8 ||
        (cfg->frozen_dtype != ST_FROZEN_F32 && !st_backend_host_memory(base->be))) {
        const char *name = base->be->ops->name;
        int fd = (int)cfg->frozen_dtype;
        st_model_free(base);
        if ((unsigned)fd > ST_FROZEN_INT8)
            return st_errf(err, ST_ERR_INVALID, "key 'frozen_dtype': %d is not fp32, bf16 or int8", fd);
        return st_errf(err, ST_ERR_UNSUPPORTED, "key 'frozen_dtype': %s base weights are dequantised by the host, and "
                       "backend '%s' keeps its weights elsewhere; train LoRA on the cpu backend or give frozen_dtype "
                       "fp32", st_frozen_dtype_name((st_frozen_dtype)fd), name);
    }
    int n_ad = 0;
    size_t np = 0;
    st_status s = build_adapters(base->tensors, base->n_tensors, base->ops->arch, cfg, NULL, &n_ad, &np, NULL, 0, err);
    if (s) {
        st_model_free(base);
        return s;
    }
    st_model *m = calloc(1, sizeof *m);
    lora_impl *li = calloc(1, sizeof *li);
    if (li) {
        li->ad = calloc((size_t)(n_ad ? n_ad : 1), sizeof *li->ad);
        li->tensors = calloc((size_t)(n_ad ? 2 * n_ad : 1), sizeof *li->tensors);
    }
    if (!m || !li || frozen_base_init(&li->fb, m, base) || !li->ad || !li->tensors) {
        if (li) {
            free(li->ad);
            free(li->fb.first);
            free(li->tensors);
        }
        free(li);
        free(m);
        st_model_free(base);
        return st_errf(err, ST_ERR_NOMEM, "out of memory");
    }
    m->ops = &lora_ops;
    m->impl = li;
    li->cfg = *cfg;
    li->scale = (float)(cfg->alpha / cfg->rank);
    build_adapters(base->tensors, base->n_tensors, base->ops->arch, cfg, li->ad, &li->n_ad, &np, li->canon_targets,
                   sizeof li->canon_targets, err);
    frozen_base_index(li->fb.first, li->fb.n_layer * ST_MM_COUNT, li->ad, sizeof *li->ad, li->n_ad);
    li->max_norm = widest_norm(base->tensors, base->n_tensors);
    for (int i = 0; i < li->n_ad; i++) {
        lora_adapter *a = &li->ad[i];
        if (a->out > li->max_out) li->max_out = a->out;
        char mod[96];
        const char *bn = a->base_t->name;
        snprintf(mod, sizeof mod, "%.*s", (int)(strlen(bn) - strlen(".weight")), bn);
        st_param_info *ta = &li->tensors[2 * i], *tb = &li->tensors[2 * i + 1];
        *ta = (st_param_info){.offset = a->a_off, .numel = (size_t)cfg->rank * a->in, .ndim = 2,
                              .shape = {cfg->rank, a->in}, .role = ST_ROLE_MATMUL_WEIGHT};
        *tb = (st_param_info){.offset = a->b_off, .numel = (size_t)a->out * cfg->rank, .ndim = 2,
                              .shape = {a->out, cfg->rank}, .role = ST_ROLE_MATMUL_WEIGHT};
        snprintf(ta->name, sizeof ta->name, "base_model.model.%.64s.lora_A.weight", mod);
        snprintf(tb->name, sizeof tb->name, "base_model.model.%.64s.lora_B.weight", mod);
    }
    m->n_tensors = 2 * li->n_ad;
    m->tensors = li->tensors;
    if (frozen_base_vectors(m, &li->fb, np)) {
        lo_destroy(m);
        return st_errf(err, ST_ERR_NOMEM, "lora: cannot allocate %.1f MiB for the adapters and their gradients",
                       2.0 * np * 4 / 1048576.0);
    }
    frozen_base_drop_grads(&li->fb); /* the base is frozen: its gradient vector goes */
    li->fb.hook = (st_linear_hook){.forward = hook_forward, .backward = hook_backward, .frozen = 1};
    if (cfg->frozen_dtype != ST_FROZEN_F32 && (s = hold_weights(li, round_now, err))) {
        lo_destroy(m);
        return s;
    }
    frozen_base_set_hook(&li->fb, &li->fb.hook);
    lo_init_random(m, seed);
    *out = m;
    return ST_OK;
}

st_status st_lora_model_create(st_model **out, st_model *base, const st_lora_config *cfg, uint64_t seed,
                               st_err *err) {
    return lora_create(out, base, cfg, seed, 1, err);
}

typedef struct hold_load {
    lora_impl *li;
    const char *from;
} hold_load;

/* The loader's step after tensor t is in the base's vector at `at` (model_load_each): its values
 * checked finite (st_model_check_finite's rule, as the whole base's was after a load), and a held
 * weight rounded into the store and its fp32 pages given back before the next tensor is read. */
static st_status hold_each(void *ctx, const st_param_info *t, float *at, st_err *err) {
    const hold_load *h = ctx;
    st_status s = h->from ? model_tensor_check_finite(t, at, h->from, err) : ST_OK; /* drawn: finite */
    for (int i = 0; !s && i < h->li->n_held; i++) {
        lora_held *a = &h->li->held[i];
        if (a->base_t != t) continue;
        frozen_weight_set(&a->fw, at);
        frozen_release(at, t->numel * sizeof(float));
        break;
    }
    return s;
}

st_status st_lora_model_create_from(st_model **out, st_model *base, const char *hf_dir, const st_lora_config *cfg,
                                    uint64_t seed, st_err *err) {
    st_status s = lora_create(out, base, cfg, seed, 0, err);
    if (s) return s;
    hold_load h = {impl_of(*out), hf_dir};
    model_load_each each = {hold_each, &h};
    if ((s = model_load_hf(base, hf_dir, &each, err))) {
        st_model_free(*out); /* the base half read, some of it rounded: discarded */
        *out = NULL;
    }
    return s;
}

st_status st_lora_model_create_drawn(st_model **out, st_model *base, const st_lora_config *cfg, uint64_t seed,
                                     st_err *err) {
    st_status s = lora_create(out, base, cfg, seed, 0, err);
    if (s) return s;
    hold_load h = {impl_of(*out), NULL};
    model_load_each each = {hold_each, &h};
    if ((s = model_init_each(base, seed, &each, err))) {
        st_model_free(*out); /* the base half drawn, some of it rounded: discarded */
        *out = NULL;
    }
    return s;
}

/* ------------------------------------------------------------------ PEFT adapter, merged model */

st_status st_lora_save_adapter(const st_model *m, const char *dir, const char *base_name, st_err *err) {
    if (!st_model_is_lora(m)) return st_errf(err, ST_ERR_INVALID, "save_adapter: the model has no adapters");
    lora_impl *li = impl_of(m);
    if (mkdir(dir, 0777) && errno != EEXIST)
        return st_errf(err, ST_ERR_IO, "save_adapter: cannot create directory %s", dir);
    json_object *o = json_object_new_object(), *tm = json_object_new_array();
    char buf[256];
    snprintf(buf, sizeof buf, "%s", li->canon_targets);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) json_object_array_add(tm, json_object_new_string(tok));
    json_object_object_add(o, "peft_type", json_object_new_string("LORA"));
    json_object_object_add(o, "task_type", json_object_new_string("CAUSAL_LM"));
    json_object_object_add(o, "base_model_name_or_path", json_object_new_string(base_name ? base_name : ""));
    json_object_object_add(o, "r", json_object_new_int(li->cfg.rank));
    json_object_object_add(o, "lora_alpha", json_object_new_double(li->cfg.alpha));
    json_object_object_add(o, "lora_dropout", json_object_new_double(0.0));
    json_object_object_add(o, "target_modules", tm);
    json_object_object_add(o, "fan_in_fan_out", json_object_new_boolean(li->fb.gpt2));
    json_object_object_add(o, "bias", json_object_new_string("none"));
    json_object_object_add(o, "inference_mode", json_object_new_boolean(1));
    json_object_object_add(o, "init_lora_weights", json_object_new_boolean(1));
    json_object_object_add(o, "modules_to_save", NULL);
    json_object_object_add(o, "use_rslora", json_object_new_boolean(0));
    json_object_object_add(o, "use_dora", json_object_new_boolean(0));
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    int bad = json_object_to_file_ext(path, o, JSON_C_TO_STRING_PRETTY);
    json_object_put(o);
    if (bad) return st_errf(err, ST_ERR_IO, "save_adapter: cannot write %s", path);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    const char *meta[] = {"format", "pt"};
    return write_adapters(m, path, meta, 1, err);
}

/* w (the base's whole vector, host) += s B A of every adapter, in double per element. */
static void merge_into(const lora_impl *li, float *w, const float *ad) {
    int r = li->cfg.rank;
    for (int i = 0; i < li->n_ad; i++) {
        const lora_adapter *a = &li->ad[i];
        const float *A = ad + a->a_off, *B = ad + a->b_off;
        float *W = w + a->base_t->offset;
        for (int o = 0; o < a->out; o++)
            for (int j = 0; j < a->in; j++) {
                double d = 0;
                for (int k = 0; k < r; k++) d += (double)B[(size_t)o * r + k] * A[(size_t)k * a->in + j];
                float *e = li->fb.gpt2 ? &W[(size_t)j * a->out + o] : &W[(size_t)o * a->in + j];
                *e = (float)(*e + li->scale * d);
            }
    }
}

st_status st_lora_save_merged_hf(const st_model *m, const char *dir, st_dtype dtype, st_err *err) {
    if (!st_model_is_lora(m)) return st_errf(err, ST_ERR_INVALID, "lora: the model has no adapters");
    lora_impl *li = impl_of(m);
    st_model *b = li->fb.base;
    st_backend *be = m->be;
    size_t nb = b->n_params;
    if (li->held) { /* W0 as held, dequantised into the base's vector (host memory) for the write, merged
                     * there, its pages given back after: the store, the one W0, unchanged */
        float *ad = malloc(m->n_params * sizeof(float));
        if (!ad) return st_errf(err, ST_ERR_NOMEM, "lora: out of memory for the adapters");
        be->ops->copy_to_host(be, ad, m->params, m->n_params * sizeof(float));
        for (int i = 0; i < li->n_held; i++)
            frozen_weight_get(&li->held[i].fw, 0, li->held[i].base_t->numel, b->params + li->held[i].base_t->offset);
        merge_into(li, b->params, ad);
        st_status s = b->ops->save_hf(b, dir, dtype, err);
        for (int i = 0; i < li->n_held; i++)
            frozen_release(b->params + li->held[i].base_t->offset, li->held[i].base_t->numel * sizeof(float));
        free(ad);
        return s;
    }
    float *keep = malloc(nb * sizeof(float)), *w = malloc(nb * sizeof(float)), *ad = malloc(m->n_params * sizeof(float));
    if (!keep || !w || !ad) {
        free(keep);
        free(w);
        free(ad);
        return st_errf(err, ST_ERR_NOMEM, "lora: out of memory for the merged weights (%.1f MiB)", 2.0 * nb * 4 / 1048576.0);
    }
    be->ops->copy_to_host(be, keep, b->params, nb * sizeof(float));
    be->ops->copy_to_host(be, ad, m->params, m->n_params * sizeof(float));
    memcpy(w, keep, nb * sizeof(float));
    merge_into(li, w, ad); /* W0 += s B A */
    be->ops->copy_to_device(be, b->params, w, nb * sizeof(float));
    st_status s = b->ops->save_hf(b, dir, dtype, err);
    be->ops->copy_to_device(be, b->params, keep, nb * sizeof(float)); /* the base as it was, bit for bit */
    free(keep);
    free(w);
    free(ad);
    return s;
}

/* ------------------------------------------------------------------ a saved adapter, read back */

st_status st_lora_read_adapter_config(const char *dir, st_lora_config *cfg, char *base, size_t base_cap,
                                      st_err *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    memset(cfg, 0, sizeof *cfg);
    if (base && base_cap) base[0] = 0;
    json_object *o = json_object_from_file(path), *v;
    if (!o)
        return st_errf(err, ST_ERR_IO, "%s: cannot read it as JSON; an adapter directory holds adapter_config.json "
                       "and adapter_model.safetensors (strata train --save_adapter, PEFT's save_pretrained)", path);
    st_status s = ST_OK;
    const char *pt = json_object_object_get_ex(o, "peft_type", &v) ? json_object_get_string(v) : NULL;
    if (!pt || strcmp(pt, "LORA"))
        s = st_errf(err, ST_ERR_UNSUPPORTED, "%s: peft_type is %s, not LORA; strata continues LoRA adapters only", path,
                    pt ? pt : "missing");
    /* what strata's adapters are not: refused rather than read as plain LoRA */
    static const char *const flags[] = {"use_dora", "use_rslora"};
    for (int i = 0; !s && i < 2; i++)
        if (json_object_object_get_ex(o, flags[i], &v) && json_object_get_boolean(v))
            s = st_errf(err, ST_ERR_UNSUPPORTED, "%s: %s is true; strata's LoRA is plain LoRA (scale alpha / r, no "
                        "DoRA)", path, flags[i]);
    if (!s && json_object_object_get_ex(o, "bias", &v) && json_object_is_type(v, json_type_string) &&
        strcmp(json_object_get_string(v), "none"))
        s = st_errf(err, ST_ERR_UNSUPPORTED, "%s: bias is '%s'; strata trains no biases (bias 'none')", path,
                    json_object_get_string(v));
    if (!s && json_object_object_get_ex(o, "modules_to_save", &v) && json_object_is_type(v, json_type_array) &&
        json_object_array_length(v) > 0)
        s = st_errf(err, ST_ERR_UNSUPPORTED, "%s: modules_to_save is not empty; strata's adapters train the "
                    "projections' A and B only", path);
    if (!s && !(json_object_object_get_ex(o, "r", &v) && json_object_is_type(v, json_type_int) &&
                (cfg->rank = json_object_get_int(v)) >= 1))
        s = st_errf(err, ST_ERR_FORMAT, "%s: 'r' is missing or not an integer >= 1", path);
    if (!s && !(json_object_object_get_ex(o, "lora_alpha", &v) &&
                (json_object_is_type(v, json_type_int) || json_object_is_type(v, json_type_double)) &&
                (cfg->alpha = json_object_get_double(v)) > 0))
        s = st_errf(err, ST_ERR_FORMAT, "%s: 'lora_alpha' is missing or not a number > 0", path);
    if (!s && !(json_object_object_get_ex(o, "target_modules", &v) && json_object_is_type(v, json_type_array) &&
                json_object_array_length(v) > 0))
        s = st_errf(err, ST_ERR_FORMAT, "%s: 'target_modules' is missing or not a list of module names (a string is "
                    "PEFT's regular expression, which strata does not read)", path);
    for (size_t i = 0; !s && i < json_object_array_length(v); i++) {
        const char *t = json_object_get_string(json_object_array_get_idx(v, i));
        size_t have = strlen(cfg->targets);
        if (!t || !*t || strchr(t, ',') || have + strlen(t) + 2 > sizeof cfg->targets)
            s = st_errf(err, ST_ERR_FORMAT, "%s: target_modules item %zu is not a module name strata can hold", path, i);
        else snprintf(cfg->targets + have, sizeof cfg->targets - have, "%s%s", have ? "," : "", t);
    }
    if (!s && base && base_cap && json_object_object_get_ex(o, "base_model_name_or_path", &v) &&
        json_object_is_type(v, json_type_string))
        snprintf(base, base_cap, "%s", json_object_get_string(v));
    json_object_put(o);
    return s;
}

st_status st_lora_check_adapter(const st_param_info *tensors, int n_tensors, const char *arch, const st_lora_config *cfg,
                                const char *dir, st_err *err) {
    st_lora_config was;
    st_status s = st_lora_read_adapter_config(dir, &was, NULL, 0, err);
    if (s) return s;
    if (was.rank != cfg->rank)
        return st_errf(err, ST_ERR_INVALID, "key 'lora_rank' is %d, but the adapter in %s has r %d; give --lora_rank %d "
                       "to continue it", cfg->rank, dir, was.rank, was.rank);
    if (was.alpha != cfg->alpha)
        return st_errf(err, ST_ERR_INVALID, "key 'lora_alpha' is %g, but the adapter in %s has lora_alpha %g; give "
                       "--lora_alpha %g to continue it", cfg->alpha, dir, was.alpha, was.alpha);
    int n_run = 0, n_was = 0;
    if ((s = build_adapters(tensors, n_tensors, arch, cfg, NULL, &n_run, NULL, NULL, 0, err))) return s;
    lora_adapter *ar = calloc((size_t)n_run + 1, sizeof *ar), *aw = NULL;
    st_err e2 = {0};
    if (!ar) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    build_adapters(tensors, n_tensors, arch, cfg, ar, &n_run, NULL, NULL, 0, err);
    int same = !build_adapters(tensors, n_tensors, arch, &was, NULL, &n_was, NULL, NULL, 0, &e2) && n_was == n_run;
    if (same && (aw = calloc((size_t)n_was + 1, sizeof *aw))) {
        build_adapters(tensors, n_tensors, arch, &was, aw, &n_was, NULL, NULL, 0, &e2);
        for (int i = 0; i < n_run; i++) same = same && ar[i].base_t == aw[i].base_t;
    }
    free(aw);
    if (!same) {
        free(ar);
        return st_errf(err, ST_ERR_INVALID, "key 'lora_targets' ('%s') adapts other projections of this %s model than "
                       "the adapter in %s (target_modules %s); give --lora_targets %s to continue it", cfg->targets,
                       arch, dir, was.targets, was.targets);
    }
    /* every adapter under its PEFT name and shape */
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    st_safetensors *st;
    if ((s = st_safetensors_open(&st, path, err))) {
        free(ar);
        return s;
    }
    for (int i = 0; !s && i < n_run; i++) {
        const char *bn = ar[i].base_t->name;
        for (int ab = 0; !s && ab < 2; ab++) {
            char name[160];
            snprintf(name, sizeof name, "base_model.model.%.*s.lora_%c.weight", (int)(strlen(bn) - strlen(".weight")),
                     bn, ab ? 'B' : 'A');
            int64_t want[2] = {ab ? ar[i].out : cfg->rank, ab ? cfg->rank : ar[i].in};
            const st_tensor_entry *e = st_safetensors_find(st, name);
            if (!e)
                s = st_errf(err, ST_ERR_FORMAT, "%s: no tensor '%s'; the adapter was saved over another model than "
                            "init_from's", path, name);
            else if (e->ndim != 2 || e->shape[0] != want[0] || e->shape[1] != want[1])
                s = st_errf(err, ST_ERR_FORMAT, "%s: tensor '%s' is %s%lld x %lld, this model's adapter is %lld x %lld; "
                            "the adapter was saved over a model of another shape than init_from's", path, name,
                            e->ndim != 2 ? "not 2-D, " : "", (long long)e->shape[0],
                            (long long)(e->ndim > 1 ? e->shape[1] : 0), (long long)want[0], (long long)want[1]);
        }
    }
    st_safetensors_close(st);
    free(ar);
    return s;
}

st_status st_lora_load_adapter(st_model *m, const char *dir, st_err *err) {
    if (!st_model_is_lora(m)) return st_errf(err, ST_ERR_INVALID, "lora: the model has no adapters to load into");
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    return lo_load(m, path, err);
}
