/* test_model_no_grads.c - the base of a method over frozen weights built without a gradient
 * vector (st_model_overrides.no_grads through st_model_create_from), for GPT-2 and the Llama
 * family, from a preset and from a Hugging Face directory:
 *   - its grads are NULL (GPT-2's emb_g and lnf_g too), a model made without the flag has them;
 *   - init_random on the CPU (its memory the host's: the draws in place) gives the values the
 *     architecture's initialisation writes into a staging buffer of its own (st_arch.ops->init),
 *     bit for bit, with or without the flag;
 *   - a directory loaded without gradients holds the weights it was saved from, bit for bit;
 *   - LoRA over it gives the loss and adapter gradients of LoRA over a base with gradients, bit
 *     for bit, over two SGD steps. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/block.h"
#include "strata/lora.h"
#include "strata/model.h"
#include "testutil.h"

enum { B = 2, T = 8, SEED = 9 };

static void sgd(st_model *m, float lr) {
    for (size_t i = 0; i < m->n_params; i++) m->params[i] -= lr * m->grads[i];
}

/* LoRA over two bases with the same weights: the same losses and adapter gradients */
static void same_lora(const char *what, const char *targets, st_model *frozen, st_model *full) {
    st_err err = {0};
    st_model *a = NULL, *b = NULL;
    st_lora_config lc = {.rank = 2, .alpha = 4};
    snprintf(lc.targets, sizeof lc.targets, "%s", targets);
    st_status s1 = st_lora_model_create(&a, frozen, &lc, 3, &err);
    st_status s2 = s1 ? s1 : st_lora_model_create(&b, full, &lc, 3, &err);
    if (s1) st_model_free(full);
    if (s2 || a->ops->alloc_acts(a, B, T, &err) || b->ops->alloc_acts(b, B, T, &err)) {
        CHECK(0, "%s: lora: %s", what, err.msg);
        st_model_free(a), st_model_free(b);
        return;
    }
    int32_t in[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) in[i] = (i * 7 + 3) % a->vocab_size, tg[i] = (i * 11 + 5) % a->vocab_size;
    for (int step = 0; step < 2; step++) {
        st_model_zero_grad(a), st_model_zero_grad(b);
        float la = a->ops->forward(a, in, tg, 1.0f / (B * T)), lb = b->ops->forward(b, in, tg, 1.0f / (B * T));
        a->ops->backward(a), b->ops->backward(b);
        CHECK(la == lb, "%s step %d: LoRA's loss %.9g over the base without gradients, %.9g with", what, step, la, lb);
        CHECK(!memcmp(a->grads, b->grads, a->n_params * sizeof(float)), "%s step %d: the adapters' gradients differ",
              what, step);
        sgd(a, 0.1f), sgd(b, 0.1f);
    }
    st_model_free(a), st_model_free(b);
}

static void run_case(st_backend *be, const char *preset) {
    st_err err = {0};
    st_model_overrides ov = {0}, fz = {.no_grads = 1};
    st_model *full = NULL, *frozen = NULL, *loaded = NULL;
    st_arch *arch = NULL;
    if (st_model_create_from(&full, preset, "", &ov, 1, be, &err) ||
        st_model_create_from(&frozen, preset, "", &fz, 1, be, &err) || st_arch_of_model(&arch, full, &err)) {
        CHECK(0, "%s: %s", preset, err.msg);
        st_model_free(full), st_model_free(frozen);
        return;
    }
    CHECK(full->grads != NULL, "%s: a model made without no_grads has its gradient vector", preset);
    CHECK(frozen->grads == NULL, "%s: no_grads: no gradient vector", preset);
    if (!strcmp(frozen->ops->arch, "gpt2")) {
        const st_gpt2_model *g = frozen->impl;
        CHECK(!g->grads && !g->emb_g && !g->lnf_g, "%s: no_grads: GPT-2's grads, emb_g and lnf_g are NULL", preset);
    }
    full->ops->init_random(full, SEED);
    frozen->ops->init_random(frozen, SEED);
    float *staged = malloc(full->n_params * sizeof(float));
    if (!staged) exit(1);
    arch->ops->init(arch, staged, SEED);
    CHECK(!memcmp(full->params, staged, full->n_params * sizeof(float)),
          "%s: init_random in place gives the staging buffer's values", preset);
    CHECK(!memcmp(frozen->params, staged, full->n_params * sizeof(float)),
          "%s: init_random without gradients gives the staging buffer's values", preset);
    free(staged);
    st_arch_free(arch);
    /* a Hugging Face directory of these weights, loaded without gradients */
    char dir[600];
    snprintf(dir, sizeof dir, "%s/%s_hf", test_tmpdir(), preset);
    if (full->ops->save_hf(full, dir, ST_F32, &err) || st_model_create_from(&loaded, "", dir, &fz, 1, be, &err)) {
        CHECK(0, "%s: save_hf and load: %s", preset, err.msg);
    } else {
        CHECK(loaded->grads == NULL, "%s: a directory loaded with no_grads has no gradient vector", preset);
        CHECK(loaded->n_params == full->n_params &&
                  !memcmp(loaded->params, full->params, full->n_params * sizeof(float)),
              "%s: the directory's weights loaded without gradients are the saved ones", preset);
        st_model_free(loaded);
    }
    same_lora(preset, strcmp(frozen->ops->arch, "gpt2") ? "q_proj,v_proj,down_proj" : "c_attn,c_fc", frozen,
              full); /* takes both */
}

int main(void) {
    st_err err = {0};
    st_backend *be = NULL;
    if (st_backend_cpu_create(&be, 0, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    run_case(be, "gpt2-tiny");
    run_case(be, "llama-tiny");
    st_backend_free(be);
    return test_finish("model_no_grads");
}
