/* test_arch_llama.c - the Llama family behind the block interface (strata/block.h):
 * the pieces (embedding, blocks over weight slabs, final RMSNorm, block.h's generic
 * head) run over vectors the test allocates give the SAME BITS (memcmp) as the model's
 * own forward and backward: the loss, every gradient element and the logits' gradient.
 * Also: the arch's layout and tensor table are the model's, init gives init_random's
 * values, bind_bytes is what bind allocates (each allocation rounded as the arena rounds
 * it), and L * block FLOPs + head FLOPs is the model's flops_per_token.
 *
 * Presets, each with 3 layers: llama-tiny (GQA 4/2, untied, Llama-3 rope, q/k/v and o
 * biases), qwen2-tiny (multi-query, q/k/v biases, tied), qwen3-tiny (q/k RMSNorm).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "strata/block.h"
#include "strata/llama.h"
#include "strata/tier.h"
#include "testutil.h"

enum { B = 2, T = 8, N = B * T, LAYERS = 3 };

/* A backend that counts what it allocates, rounded to ST_ARENA_ALIGN (bind_bytes' contract). */
static st_backend *real_be;
static size_t counted_bytes;
static void *counting_alloc(st_backend *be, size_t bytes) {
    (void)be;
    counted_bytes += (bytes + ST_ARENA_ALIGN - 1) / ST_ARENA_ALIGN * ST_ARENA_ALIGN;
    return real_be->ops->alloc(real_be, bytes);
}
static void counting_dealloc(st_backend *be, void *p) {
    (void)be;
    real_be->ops->dealloc(real_be, p);
}

static float *dev_floats(st_backend *be, size_t n) { return be->ops->alloc(be, n * sizeof(float)); }

static void check_layout(const char *name, const st_arch *a, const st_model *m, const st_llama_config *c) {
    const st_arch_layout *y = &a->lay;
    size_t VC = (size_t)c->vocab_size * c->hidden_size;
    CHECK(!strcmp(a->ops->name, "llama"), "%s: arch name %s", name, a->ops->name);
    CHECK(y->n_params == m->n_params && y->n_params == st_llama_param_count(c), "%s: n_params %zu, model %zu", name,
          y->n_params, m->n_params);
    CHECK(y->n_blocks == c->n_layer && y->emb_numel == VC && y->block_offset0 == VC, "%s: embedding/blocks", name);
    CHECK(y->norm_offset == y->block_offset0 + (size_t)c->n_layer * y->block_numel && y->norm_numel == (size_t)c->hidden_size,
          "%s: norm at %zu (%zu)", name, y->norm_offset, y->norm_numel);
    CHECK(y->tied == c->tie_word_embeddings &&
              y->head_offset == (c->tie_word_embeddings ? 0 : y->norm_offset + y->norm_numel) &&
              y->n_params == y->norm_offset + y->norm_numel + (c->tie_word_embeddings ? 0 : VC),
          "%s: head at %zu, tied %d", name, y->head_offset, y->tied);
    CHECK(y->vocab_size == c->vocab_size && y->n_embd == c->hidden_size && y->max_seq == c->max_seq &&
              y->norm_stat_floats == 1,
          "%s: sizes", name);
    CHECK(y->n_pre_tensors == 1 && y->n_post_tensors == (c->tie_word_embeddings ? 1 : 2) &&
              y->n_tensors == 1 + c->n_layer * y->tensors_per_block + y->n_post_tensors && y->n_tensors == m->n_tensors,
          "%s: %d tensors (%d per block), model %d", name, y->n_tensors, y->tensors_per_block, m->n_tensors);
    if (y->n_tensors != m->n_tensors) return;
    int same = 1;
    for (int i = 0; i < y->n_tensors; i++) {
        const st_param_info *p = &y->tensors[i], *q = &m->tensors[i];
        same &= !strcmp(p->name, q->name) && p->offset == q->offset && p->numel == q->numel && p->ndim == q->ndim &&
                p->shape[0] == q->shape[0] && p->shape[1] == q->shape[1] && p->role == q->role;
    }
    CHECK(same, "%s: the arch's tensor table is the model's", name);
    /* each block's first tensor at its slab, the norm and head where the layout says */
    for (int l = 0; l < c->n_layer; l++) {
        const st_param_info *t = &y->tensors[1 + l * y->tensors_per_block];
        char want[96];
        snprintf(want, sizeof want, "model.layers.%d.input_layernorm.weight", l);
        CHECK(!strcmp(t->name, want) && t->offset == y->block_offset0 + (size_t)l * y->block_numel, "%s: block %d at %zu",
              name, l, t->offset);
    }
    const st_param_info *nt = &y->tensors[y->n_tensors - y->n_post_tensors];
    CHECK(!strcmp(nt->name, "model.norm.weight") && nt->offset == y->norm_offset, "%s: %s at %zu", name, nt->name,
          nt->offset);
    if (!c->tie_word_embeddings)
        CHECK(!strcmp(y->tensors[y->n_tensors - 1].name, "lm_head.weight") &&
                  y->tensors[y->n_tensors - 1].offset == y->head_offset,
              "%s: lm_head", name);
    double flops = y->n_blocks * a->ops->block_flops_per_token(a, T) + a->ops->head_flops_per_token(a);
    CHECK(flops == m->ops->flops_per_token(m, T) && flops == st_llama_flops_per_token(c, T),
          "%s: L * block + head FLOPs %.0f, model %.0f", name, flops, m->ops->flops_per_token(m, T));
    CHECK(a->ops->block_act_floats(a, B, T) == st_llama_block_act_floats(c, B, T), "%s: block_act_floats", name);
}

static void run(st_backend *be, const char *name, uint64_t seed) {
    st_err err = {0};
    st_llama_config c;
    st_model_overrides ov = {.n_layer = LAYERS};
    st_model *m = NULL;
    if (st_llama_config_preset(name, &c, &err) || st_llama_config_apply_overrides(&c, &ov, &err) ||
        st_model_create_llama(&m, &c, be, &err) || m->ops->alloc_acts(m, B, T, &err)) {
        CHECK(0, "%s: setup: %s", name, err.msg);
        st_model_free(m);
        return;
    }
    int32_t in[N], tg[N];
    for (int i = 0; i < N; i++) {
        in[i] = (int32_t)((i * 7 + 3) % c.vocab_size);
        tg[i] = i % 5 == 2 ? -1 : (int32_t)((i * 11 + 1) % c.vocab_size); /* some targets ignored */
    }
    float dloss = 1.0f / N;

    /* the model's own step */
    m->ops->init_random(m, seed);
    st_model_zero_grad(m);
    float loss_m = m->ops->forward(m, in, tg, dloss);
    m->ops->backward(m);
    size_t P = m->n_params, V = (size_t)c.vocab_size, C = (size_t)c.hidden_size, NC = (size_t)N * C;
    float *hp_m = malloc(P * 4), *hg_m = malloc(P * 4), *hg = malloc(P * 4);
    float *hl_m = malloc(N * V * 4), *hl = malloc(N * V * 4);
    be->ops->copy_to_host(be, hp_m, m->params, P * 4);
    be->ops->copy_to_host(be, hg_m, m->grads, P * 4);
    be->ops->copy_to_host(be, hl_m, st_llama_logits(st_model_llama(m)), N * V * 4);

    /* the same step from the pieces */
    st_arch *a = NULL;
    st_blocks *b = NULL;
    if (m->ops->get_arch(m, &a, &err)) {
        CHECK(0, "%s: get_arch: %s", name, err.msg);
        goto out;
    }
    check_layout(name, a, m, &c);
    const st_arch_layout *y = &a->lay;
    const st_arch_ops *o = a->ops;

    /* bind_bytes is what bind allocates */
    st_backend_ops counting = *be->ops;
    counting.alloc = counting_alloc;
    counting.dealloc = counting_dealloc;
    st_backend cbe = {&counting, be->ctx};
    real_be = be;
    counted_bytes = 0;
    if (st_blocks_bind(&b, a, &cbe, B, T, &err)) {
        CHECK(0, "%s: bind (counting): %s", name, err.msg);
        goto out;
    }
    st_blocks_free(b);
    b = NULL;
    CHECK(counted_bytes == o->bind_bytes(a, B, T) && counted_bytes == st_llama_bind_bytes(&c, B, T),
          "%s: bind allocated %zu bytes, bind_bytes says %zu", name, counted_bytes, o->bind_bytes(a, B, T));
    CHECK(st_blocks_bind(&b, a, be, B, c.max_seq + 1, &err) == ST_ERR_INVALID && !b, "%s: seq past max_seq refused",
          name);

    if (st_blocks_bind(&b, a, be, B, T, &err)) {
        CHECK(0, "%s: bind: %s", name, err.msg);
        goto out;
    }
    int L = y->n_blocks;
    size_t set = st_block_act_floats(a, B, T);
    float *p = dev_floats(be, P), *g = dev_floats(be, P), *outs = dev_floats(be, (L + 1) * NC);
    float *acts = dev_floats(be, L * set), *xn = dev_floats(be, NC), *stats = dev_floats(be, N);
    float *logits = dev_floats(be, N * V), *losses = dev_floats(be, N), *dxn = dev_floats(be, NC);
    float *dres = dev_floats(be, NC), *lh = malloc(N * 4);
    int32_t *dtg = be->ops->alloc(be, N * sizeof(int32_t));
    if (!p || !g || !outs || !acts || !xn || !stats || !logits || !losses || !dxn || !dres || !lh || !dtg) {
        CHECK(0, "%s: out of memory", name);
        goto out; /* the test ends; its memory goes with it */
    }
    float *host = malloc(P * 4);
    o->init(a, host, seed);
    CHECK(host && !memcmp(host, hp_m, P * 4), "%s: init(seed) differs from init_random(seed)", name);
    be->ops->copy_to_device(be, p, host, P * 4);
    free(host);
    be->ops->copy_to_device(be, dtg, tg, sizeof tg);

    o->embed_forward(b, p, in, outs);
    for (int l = 0; l < L; l++)
        o->block_forward(b, p + y->block_offset0 + l * y->block_numel, outs + l * NC, acts + l * set,
                         outs + (l + 1) * NC);
    const float *x = outs + L * NC, *W = p + y->head_offset, *nw = p + y->norm_offset;
    o->norm_forward(b, nw, x, xn, stats);
    be->ops->matmul_forward(be, logits, xn, W, NULL, N, (int)C, (int)V, ST_W_OUT_IN);
    be->ops->crossentropy_forward_backward(be, logits, losses, dtg, N, (int)V, dloss);
    be->ops->copy_to_host(be, lh, losses, N * 4);
    double sum = 0;
    int counted = 0;
    for (int i = 0; i < N; i++)
        if (tg[i] >= 0) sum += lh[i], counted++;
    float loss = (float)(sum / counted);

    be->ops->memset0(be, dxn, NC * 4);
    be->ops->matmul_backward(be, dxn, g + y->head_offset, NULL, logits, xn, W, N, (int)C, (int)V, ST_W_OUT_IN);
    be->ops->memset0(be, dres, NC * 4);
    o->norm_backward(b, dres, g + y->norm_offset, dxn, x, nw, stats);
    for (int l = L - 1; l >= 0; l--) {
        size_t off = y->block_offset0 + l * y->block_numel;
        o->block_backward(b, p + off, g + off, outs + l * NC, acts + l * set, dres);
    }
    o->embed_backward(b, g, dres);
    be->ops->copy_to_host(be, hg, g, P * 4);
    be->ops->copy_to_host(be, hl, logits, N * V * 4);

    CHECK(isfinite(loss) && !memcmp(&loss, &loss_m, sizeof loss), "%s: loss %.9g from the pieces, model %.9g", name,
          loss, loss_m);
    CHECK(!memcmp(hl, hl_m, N * V * 4), "%s: d(logits) differ", name);
    size_t diff = 0, first = P;
    for (size_t i = 0; i < P; i++)
        if (memcmp(&hg[i], &hg_m[i], 4)) diff++, first = first < P ? first : i;
    const st_param_info *ft = NULL;
    for (int i = 0; first < P && i < y->n_tensors; i++)
        if (first >= y->tensors[i].offset && first < y->tensors[i].offset + y->tensors[i].numel) ft = &y->tensors[i];
    CHECK(diff == 0, "%s: %zu of %zu gradient elements differ, first %zu (%s: %.9g vs model %.9g)", name, diff, P,
          first, ft ? ft->name : "?", first < P ? hg[first] : 0.0, first < P ? hg_m[first] : 0.0);
    double gnorm = 0;
    for (size_t i = 0; i < P; i++) gnorm += (double)hg[i] * hg[i];
    CHECK(gnorm > 0, "%s: the gradient is not all zero", name);
    printf("%s: n_params %zu block_numel %zu tensors %d (%d per block) bind_bytes %zu block_act_floats %zu "
           "loss %.6f; pieces == model bit for bit: %s\n",
           name, y->n_params, y->block_numel, y->n_tensors, y->tensors_per_block, o->bind_bytes(a, B, T), set, loss,
           !diff && !memcmp(&loss, &loss_m, sizeof loss) && !memcmp(hl, hl_m, N * V * 4) ? "yes" : "NO");
    be->ops->dealloc(be, p);
    be->ops->dealloc(be, g);
    be->ops->dealloc(be, outs);
    be->ops->dealloc(be, acts);
    be->ops->dealloc(be, xn);
    be->ops->dealloc(be, stats);
    be->ops->dealloc(be, logits);
    be->ops->dealloc(be, losses);
    be->ops->dealloc(be, dxn);
    be->ops->dealloc(be, dres);
    be->ops->dealloc(be, dtg);
    free(lh);
out:
    st_blocks_free(b);
    st_arch_free(a);
    free(hp_m), free(hg_m), free(hg), free(hl_m), free(hl);
    st_model_free(m);
}

int main(void) {
    st_err err = {0};
    st_backend *be = NULL;
    if (st_backend_cpu_create(&be, 0, &err)) {
        fprintf(stderr, "cpu backend: %s\n", err.msg);
        return 1;
    }
    run(be, "llama-tiny", 11);
    run(be, "qwen2-tiny", 12);
    run(be, "qwen3-tiny", 13);
    /* a bad configuration is refused by name */
    st_llama_config c;
    st_arch *a = NULL;
    st_llama_config_preset("qwen2-tiny", &c, &err);
    c.n_kv_head = 3;
    CHECK(st_arch_llama(&a, &c, &err) == ST_ERR_INVALID && !a && strstr(err.msg, "num_key_value_heads"),
          "st_arch_llama refuses 3 kv heads for 4 heads: %s", err.msg);
    st_backend_free(be);
    return test_finish("arch_llama");
}
