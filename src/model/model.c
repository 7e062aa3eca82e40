/* model.c - the architecture-independent model interface, and GPT-2 behind it. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/llama.h"
#include "strata/block.h"
#include "strata/model.h"
#include "model_internal.h"

static st_gpt2_model *as_gpt2(const st_model *m) { return (st_gpt2_model *)m->impl; }

static st_status g_alloc_acts(st_model *m, int B, int T, st_err *err) {
    st_status s = st_gpt2_alloc_acts(as_gpt2(m), B, T, err);
    m->row_losses = st_gpt2_row_losses(as_gpt2(m));
    return s;
}
static float g_forward(st_model *m, const int32_t *in, const int32_t *tg, float dloss) {
    return st_gpt2_forward_hooked(as_gpt2(m), in, tg, dloss, m->weight_hook, m->weight_hook_ctx);
}
static void g_backward(st_model *m) { st_gpt2_backward_hooked(as_gpt2(m), m->grad_hook, m->grad_hook_ctx); }
static void g_init_random(st_model *m, uint64_t seed) { st_gpt2_init_random(as_gpt2(m), seed); }
static st_status g_save(const st_model *m, const char *path, st_err *err) {
    return st_gpt2_save_safetensors(as_gpt2(m), path, err);
}
static st_status g_load(st_model *m, const char *path, st_err *err) { return st_gpt2_load_safetensors(as_gpt2(m), path, err); }
static double g_flops(const st_model *m, int T) { return st_gpt2_flops_per_token(&as_gpt2(m)->cfg, T); }
static void g_describe(const st_model *m, char *buf, size_t cap) {
    const st_gpt2_config *c = &as_gpt2(m)->cfg;
    snprintf(buf, cap, "gpt2 L=%d C=%d NH=%d V=%d maxT=%d", c->n_layer, c->n_embd, c->n_head, c->vocab_size, c->max_seq);
}
static void g_destroy(st_model *m) {
    st_gpt2_free(as_gpt2(m));
    free(m->impl);
    free(m);
}

static int g_step_gemms(const st_model *m, int B, int T, st_gemm_shape *out, int max) {
    const st_gpt2_config *c = &as_gpt2(m)->cfg;
    int N = B * T, C = c->n_embd, V = c->vocab_size, L = c->n_layer;
    st_gemm_shape shapes[] = {
        /* forward: out(N,OC) = inp(N,C) w(C,OC) */
        {N, 3 * C, C, 0, 0, L}, {N, C, C, 0, 0, L}, {N, 4 * C, C, 0, 0, L}, {N, C, 4 * C, 0, 0, L},
        {N, V, C, 0, 1, 1},
        /* backward dinp(N,C) = dout(N,OC) w^T */
        {N, C, 3 * C, 0, 1, L}, {N, C, C, 0, 1, L}, {N, C, 4 * C, 0, 1, L}, {N, 4 * C, C, 0, 1, L},
        {N, C, V, 0, 0, 1},
        /* backward dw(C,OC) = inp^T dout */
        {C, 3 * C, N, 1, 0, L}, {C, C, N, 1, 0, L}, {C, 4 * C, N, 1, 0, L}, {4 * C, C, N, 1, 0, L},
        {V, C, N, 1, 0, 1},
    };
    int n = (int)(sizeof shapes / sizeof shapes[0]);
    if (n > max) n = max;
    memcpy(out, shapes, sizeof(st_gemm_shape) * (size_t)n);
    return n;
}

static st_status g_get_arch(const st_model *m, st_arch **out, st_err *err) {
    return st_arch_gpt2(out, &as_gpt2(m)->cfg, err);
}
static st_status g_save_hf(const st_model *m, const char *dir, st_dtype dtype, st_err *err) {
    (void)dtype; /* GPT-2's directory is F32 */
    return st_gpt2_save_hf(as_gpt2(m), dir, err);
}
static const float *g_logits(const st_model *m) { return st_gpt2_logits(as_gpt2(m)); }
static void g_decode_info(const st_model *m, st_decode_info *d) {
    const st_gpt2_config *c = &as_gpt2(m)->cfg;
    memset(d, 0, sizeof *d);
    d->kind = ST_DECODE_LN_GELU;
    d->n_layer = c->n_layer, d->n_embd = c->n_embd, d->n_head = d->n_kv_head = c->n_head;
    d->head_size = c->n_embd / c->n_head;
    d->mlp_width = d->mlp_act_width = 4 * c->n_embd;
    d->eps = 1e-5f; /* unused: the layernorm op has GPT-2's epsilon */
}
static st_status g_set_docs(st_model *m, const int32_t *positions, const int32_t *doc_start, st_err *err) {
    return st_gpt2_set_docs(as_gpt2(m), positions, doc_start, err);
}
static const st_model_ops gpt2_ops = {"gpt2", g_alloc_acts, g_forward, g_backward, g_init_random, g_save,
                                      g_load, g_flops, g_describe, g_destroy, g_step_gemms, g_get_arch,
                                      g_save_hf, g_logits, g_decode_info, NULL, g_set_docs};

st_status st_docs_check(const int32_t *positions, const int32_t *doc_start, int B, int T, int max_seq,
                        int *plain_pos, int *plain_ds, st_err *err) {
    *plain_pos = *plain_ds = 1;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            size_t i = (size_t)b * T + t;
            if (positions) {
                if (positions[i] < 0 || positions[i] >= max_seq)
                    return st_errf(err, ST_ERR_INVALID, "documents: row %d position %d has position %d, outside the "
                                   "model's [0, %d)", b, t, positions[i], max_seq);
                if (positions[i] != t) *plain_pos = 0;
            }
            if (doc_start) {
                int d = doc_start[i];
                if (d < 0 || d > t || (t > 0 && d != doc_start[i - 1] && d != t))
                    return st_errf(err, ST_ERR_INVALID, "documents: row %d position %d has doc_start %d; it must be "
                                   "in [0, %d] and change only where a document starts (doc_start == position)",
                                   b, t, d, t);
                if (d) *plain_ds = 0;
            }
        }
    return ST_OK;
}

st_status st_model_set_docs(st_model *m, const int32_t *positions, const int32_t *doc_start, st_err *err) {
    if (!m->ops->set_docs) {
        if (!positions && !doc_start) return ST_OK;
        return st_errf(err, ST_ERR_UNSUPPORTED, "model %s has no attention restricted to documents; train with "
                       "--doc_mask 0", m->ops->arch);
    }
    return m->ops->set_docs(m, positions, doc_start, err);
}

void st_model_wrap_gpt2(st_model *out, st_gpt2_model *g) {
    memset(out, 0, sizeof *out);
    out->ops = &gpt2_ops;
    out->be = g->be;
    out->n_params = g->n_params;
    out->params = g->params;
    out->grads = g->grads;
    out->n_tensors = g->n_tensors;
    out->tensors = g->tensors;
    out->max_seq = g->cfg.max_seq;
    out->vocab_size = g->cfg.vocab_size;
    out->impl = g;
}

const char *st_model_preset_names(void) {
    static char buf[512];
    if (!buf[0]) snprintf(buf, sizeof buf, "%s, %s", st_gpt2_preset_names(), st_llama_preset_names());
    return buf;
}

st_status st_model_create(st_model **out, const char *preset, const st_model_overrides *ov, st_backend *be,
                          st_err *err) {
    *out = NULL;
    st_llama_config lc;
    if (st_llama_config_preset(preset, &lc, NULL) == ST_OK) {
        st_status s = st_llama_config_apply_overrides(&lc, ov, err);
        return s ? s : st_model_create_llama(out, &lc, be, err);
    }
    st_gpt2_config cfg;
    if (st_gpt2_config_preset(preset, &cfg, NULL) != ST_OK)
        return st_errf(err, ST_ERR_INVALID, "unknown model '%s'; known models: %s", preset, st_model_preset_names());
    if (ov) {
        if (ov->vocab_size > 0) cfg.vocab_size = ov->vocab_size;
        if (ov->max_seq > 0) cfg.max_seq = ov->max_seq;
        if (ov->n_layer > 0) cfg.n_layer = ov->n_layer;
        if (ov->n_head > 0) cfg.n_head = ov->n_head;
        if (ov->n_embd > 0) cfg.n_embd = ov->n_embd;
    }
    return st_model_create_gpt2(out, &cfg, be, err);
}

st_status st_model_create_gpt2(st_model **out, const st_gpt2_config *cfg, st_backend *be, st_err *err) {
    return model_create_gpt2(out, cfg, 1, be, err);
}

st_status model_create_gpt2(st_model **out, const st_gpt2_config *cfg, int with_grads, st_backend *be, st_err *err) {
    *out = NULL;
    st_gpt2_model *g = calloc(1, sizeof *g);
    st_model *m = calloc(1, sizeof *m);
    if (!g || !m) {
        free(g);
        free(m);
        return st_errf(err, ST_ERR_NOMEM, "out of memory");
    }
    st_status s = model_gpt2_create(g, cfg, with_grads, be, err);
    if (s) {
        free(g);
        free(m);
        return s;
    }
    st_model_wrap_gpt2(m, g);
    *out = m;
    return ST_OK;
}

st_status st_model_create_from(st_model **out, const char *preset, const char *hf_dir, const st_model_overrides *ov,
                               int with_weights, st_backend *be, st_err *err) {
    *out = NULL;
    int grads = !(ov && ov->no_grads);
    if (hf_dir && hf_dir[0] && with_weights) /* shape and weights */
        return st_gpt2_hf_is_dir(hf_dir) ? model_create_gpt2_hf(out, hf_dir, grads, be, err)
                                      : model_create_llama_hf(out, hf_dir, grads, be, err);
    st_gpt2_config g;
    st_llama_config l;
    int llama;
    st_status s = model_family_resolve(preset, hf_dir, ov, &llama, &g, &l, err);
    if (s) return s;
    return llama ? model_create_llama(out, &l, grads, be, err) : model_create_gpt2(out, &g, grads, be, err);
}

void st_model_free(st_model *m) {
    if (m && m->ops) m->ops->destroy(m);
}

void st_model_zero_grad(st_model *m) { m->be->ops->memset0(m->be, m->grads, m->n_params * sizeof(float)); }

const st_param_info *st_params_find(const st_param_info *t, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(t[i].name, name)) return &t[i];
    return NULL;
}

size_t st_params_load_extra_bytes(const st_param_info *t, int n, int host_memory) {
    size_t largest = 0;
    for (int i = 0; i < n; i++)
        if (t[i].numel > largest) largest = t[i].numel;
    return (host_memory ? 1 : 2) * largest * sizeof(float);
}

float *model_params_alloc(st_backend *be, size_t n, int with_grads, int *untouched) {
    *untouched = !with_grads && st_backend_host_memory(be);
    return *untouched ? st_alloc_untouched(n * sizeof(float)) : be->ops->alloc(be, n * sizeof(float));
}

void model_params_free(st_backend *be, float *params, size_t n, int untouched) {
    if (!params) return;
    if (untouched) st_free_untouched(params, n * sizeof(float));
    else be->ops->dealloc(be, params);
}

st_status model_params_load(st_backend *be, float *params, const st_param_info *t, int n, st_safetensors *const *src,
                            const char *const *names, st_err *err) {
    return model_params_load_each(be, params, t, n, src, names, NULL, err);
}

st_status model_params_load_each(st_backend *be, float *params, const st_param_info *t, int n,
                                 st_safetensors *const *src, const char *const *names, const model_load_each *each,
                                 st_err *err) {
    size_t largest = 0;
    st_status s = ST_OK;
    for (int i = 0; i < n && !s; i++) {
        int64_t shape[2] = {t[i].shape[0], t[i].shape[1]};
        s = st_safetensors_check_f32(src[i], names ? names[i] : t[i].name, t[i].numel, shape, t[i].ndim, err);
        if (t[i].numel > largest) largest = t[i].numel;
    }
    st_host_stage hs;
    if (s) return s;
    if ((s = st_host_stage_open(&hs, be, largest, err))) /* a device's staging buffer */
        return n ? st_err_prefix(err, "loading %s", st_safetensors_path(src[0])) : s;
    for (int i = 0; i < n && !s; i++) {
        int64_t shape[2] = {t[i].shape[0], t[i].shape[1]};
        float *dst = params + t[i].offset;
        s = st_safetensors_read_f32(src[i], names ? names[i] : t[i].name, st_host_stage_at(&hs, dst), t[i].numel, shape,
                                    t[i].ndim, err); /* checked above: cannot fail */
        if (!s) st_host_stage_put(&hs, dst, t[i].numel);
        if (!s && each) s = each->fn(each->ctx, &t[i], dst, err);
    }
    st_host_stage_close(&hs);
    return s;
}

/* The weights' draws in pieces of at most this many values: each piece starts from the one
 * sequence's state at its first value (st_rng_skip), so the pieces run in parallel and give
 * the values of one sequential pass (7e9 values take minutes on one core). */
#define INIT_PIECE ((size_t)1 << 24)

typedef struct init_piece {
    float *p;
    size_t n;
    float std;
    uint64_t s;
} init_piece;

void st_params_init_by_role(const st_param_info *t, int n, float *host, uint64_t seed, const char *resid_suffix,
                            float resid_scale) {
    st_rng rng;
    st_rng_seed(&rng, seed);
    size_t ls = resid_suffix ? strlen(resid_suffix) : 0, np = 0;
    for (int i = 0; i < n; i++)
        if (t[i].role != ST_ROLE_NORM_WEIGHT && t[i].role != ST_ROLE_BIAS && t[i].role != ST_ROLE_NORM_BIAS)
            np += (t[i].numel + INIT_PIECE - 1) / INIT_PIECE;
    init_piece *pc = malloc((np ? np : 1) * sizeof *pc);
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        float *p = host + t[i].offset;
        switch (t[i].role) {
        case ST_ROLE_NORM_WEIGHT:
            for (size_t j = 0; j < t[i].numel; j++) p[j] = 1.0f;
            break;
        case ST_ROLE_BIAS:
        case ST_ROLE_NORM_BIAS:
            memset(p, 0, t[i].numel * sizeof(float));
            break;
        default: {
            size_t ln = strlen(t[i].name);
            float std = 0.02f;
            if (ls && ln >= ls && !strcmp(t[i].name + ln - ls, resid_suffix)) std *= resid_scale;
            if (!pc) { /* no memory for the pieces: one pass */
                for (size_t j = 0; j < t[i].numel; j++) p[j] = std * st_rng_normal(&rng);
                break;
            }
            for (size_t off = 0; off < t[i].numel; off += INIT_PIECE) {
                size_t m = t[i].numel - off < INIT_PIECE ? t[i].numel - off : INIT_PIECE;
                pc[k++] = (init_piece){p + off, m, std, rng.s};
                st_rng_skip(&rng, 2 * (uint64_t)m); /* st_rng_normal takes two draws */
            }
        }
        }
    }
    if (!pc) return;
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t q = 0; q < k; q++) {
        st_rng r = {pc[q].s};
        float *p = pc[q].p, std = pc[q].std;
        for (size_t j = 0; j < pc[q].n; j++) p[j] = std * st_rng_normal(&r);
    }
    free(pc);
}

/* The pieces of one tensor drawn a tensor at a time: about a thread's share each, at least this
 * many values (a piece's start costs a jump of the sequence, st_rng_skip: about 0.3 ms, 5% of
 * drawing 2^18 values) and at most INIT_PIECE. */
#define INIT_PIECE_MIN ((size_t)1 << 18)

st_status model_params_init_each(st_backend *be, float *params, const st_param_info *t, int n, uint64_t seed,
                                 const char *resid_suffix, float resid_scale, const model_load_each *each,
                                 st_err *err) {
    size_t largest = 0;
    for (int i = 0; i < n; i++)
        if (t[i].numel > largest) largest = t[i].numel;
    st_host_stage hs;
    st_status s = st_host_stage_open(&hs, be, largest, err); /* a device's staging buffer */
    if (s) return st_err_prefix(err, "drawing the weights");
    st_rng rng;
    st_rng_seed(&rng, seed);
    size_t ls = resid_suffix ? strlen(resid_suffix) : 0;
    const size_t threads = (size_t)omp_get_max_threads();
    for (int i = 0; i < n && !s; i++) {
        float *dst = params + t[i].offset, *p = st_host_stage_at(&hs, dst);
        const size_t numel = t[i].numel;
        switch (t[i].role) {
        case ST_ROLE_NORM_WEIGHT:
            for (size_t j = 0; j < numel; j++) p[j] = 1.0f;
            break;
        case ST_ROLE_BIAS:
        case ST_ROLE_NORM_BIAS:
            memset(p, 0, numel * sizeof(float));
            break;
        default: {
            /* st_params_init_by_role's draws: this tensor's values are the sequence's from where
             * the tables' earlier tensors left it, each piece from its first value's state */
            size_t ln = strlen(t[i].name), piece = (numel + threads - 1) / threads;
            float std = 0.02f;
            if (ls && ln >= ls && !strcmp(t[i].name + ln - ls, resid_suffix)) std *= resid_scale;
            if (piece < INIT_PIECE_MIN) piece = INIT_PIECE_MIN;
            if (piece > INIT_PIECE) piece = INIT_PIECE;
            const size_t np = (numel + piece - 1) / piece;
            const st_rng start = rng;
#pragma omp parallel for schedule(dynamic, 1)
            for (size_t q = 0; q < np; q++) {
                st_rng r = start;
                size_t off = q * piece, m = numel - off < piece ? numel - off : piece;
                if (off) st_rng_skip(&r, 2 * (uint64_t)off); /* st_rng_normal takes two draws */
                for (size_t j = 0; j < m; j++) p[off + j] = std * st_rng_normal(&r);
            }
            st_rng_skip(&rng, 2 * (uint64_t)numel);
        }
        }
        st_host_stage_put(&hs, dst, numel);
        if (each) s = each->fn(each->ctx, &t[i], dst, err);
    }
    st_host_stage_close(&hs);
    return s;
}

void model_gpt2_init_rule(int n_layer, const char **resid_suffix, float *resid_scale) {
    *resid_suffix = "c_proj.weight";
    *resid_scale = 1.0f / sqrtf(2.0f * n_layer);
}

st_status model_init_each(st_model *m, uint64_t seed, const model_load_each *each, st_err *err) {
    const char *suffix = NULL;
    float scale = 1.0f;
    if (!strcmp(m->ops->arch, "gpt2")) model_gpt2_init_rule(as_gpt2(m)->cfg.n_layer, &suffix, &scale);
    else if (strcmp(m->ops->arch, "llama"))
        return st_errf(err, ST_ERR_INVALID, "drawing the weights of a %s model a tensor at a time: only GPT-2's "
                       "and the Llama family's", m->ops->arch);
    return model_params_init_each(m->be, m->params, m->tensors, m->n_tensors, seed, suffix, scale, each, err);
}

st_status model_tensor_check_finite(const st_param_info *ti, const float *p, const char *from, st_err *err) {
    for (size_t i = 0; i < ti->numel; i++)
        if (!isfinite(p[i]))
            return st_errf(err, ST_ERR_NONFINITE,
                           "%s: tensor '%s' element %zu is %s: the weights are damaged; load another "
                           "checkpoint", from, ti->name, i, isnan(p[i]) ? "NaN" : "infinite");
    return ST_OK;
}

st_status st_model_check_finite(const st_model *m, const char *from, st_err *err) {
    const float *p = m->params; /* host memory on the CPU backend, where weights are loaded */
    st_status s = ST_OK;
    for (int t = 0; t < m->n_tensors && !s; t++) s = model_tensor_check_finite(&m->tensors[t], p + m->tensors[t].offset, from, err);
    return s;
}

void st_params_decay_segments(const st_param_info *t, int n, float weight_decay, st_optim_segment *out) {
    for (int i = 0; i < n; i++) {
        st_role r = t[i].role;
        out[i] = (st_optim_segment){.offset = t[i].offset, .n = t[i].numel,
                                    .weight_decay = (r == ST_ROLE_MATMUL_WEIGHT || r == ST_ROLE_EMBEDDING) ? weight_decay : 0.0f};
    }
}
