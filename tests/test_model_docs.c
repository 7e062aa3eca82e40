/* test_model_docs.c - packed documents through whole models (st_model_set_docs): GPT-2
 * (wpe at the positions) and the Llama family (rotary angles at the positions; llama,
 * qwen2 with one kv head, qwen3 with q/k norms). For a batch of two rows of several
 * documents each, with masked targets (the boundary and an SFT-style mask):
 *   - the packed loss and every gradient equal those of each document run alone (B = 1,
 *     T = its length, positions from 0) with the same targets, summed with the packed
 *     step's 1/count;
 *   - documents that change nothing (one a row, positions 0..T-1) give the bits of no
 *     documents, and real ones change the loss;
 *   - malformed doc_start and positions are refused. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/backend.h"
#include "strata/model.h"
#include "testutil.h"

enum { B = 2, T = 100 };
static const int row0[] = {5, 1, 70, 24, 0}, row1[] = {30, 1, 69, 0};

static void layout(int32_t *pos, int32_t *ds) {
    const int *rows[B] = {row0, row1};
    for (int b = 0; b < B; b++)
        for (int k = 0, t = 0; rows[b][k]; k++)
            for (int i = 0; i < rows[b][k]; i++, t++) {
                pos[b * T + t] = i;
                ds[b * T + t] = t - i;
            }
}

static float *host_grads(st_model *m) {
    float *g = malloc(m->n_params * sizeof *g);
    if (!g) exit(1);
    m->be->ops->copy_to_host(m->be, g, m->grads, m->n_params * sizeof *g);
    return g;
}

/* loss and gradient of one packed step: mean over targets >= 0 (dloss 1/count) */
static float packed_step(st_model *m, const int32_t *in, const int32_t *tg, float dloss, const int32_t *pos,
                         const int32_t *ds, float **grads) {
    st_err err = {0};
    st_status s = st_model_set_docs(m, pos, ds, &err);
    CHECK(!s, "set_docs: %s", err.msg);
    st_model_zero_grad(m);
    float loss = m->ops->forward(m, in, tg, dloss);
    m->ops->backward(m);
    *grads = host_grads(m);
    return loss;
}

static void test_model(st_backend *be, const char *preset) {
    st_err err = {0};
    st_model *m = NULL, *one = NULL;
    st_model_overrides ov = {.max_seq = 128};
    if (st_model_create(&m, preset, &ov, be, &err) || st_model_create(&one, preset, &ov, be, &err) ||
        m->ops->alloc_acts(m, B, T, &err)) {
        CHECK(0, "%s: %s", preset, err.msg);
        return;
    }
    m->ops->init_random(m, 7);
    one->ops->init_random(one, 7);
    int32_t in[B * T], tg[B * T], pos[B * T], ds[B * T];
    layout(pos, ds);
    st_rng rng;
    st_rng_seed(&rng, 99);
    int count = 0;
    for (int i = 0; i < B * T; i++) {
        in[i] = (int32_t)(st_rng_u64(&rng) % (uint64_t)m->vocab_size);
        tg[i] = (int32_t)(st_rng_u64(&rng) % (uint64_t)m->vocab_size);
        int last = (i % T == T - 1) || ds[i + 1] != ds[i]; /* the target starts the next document */
        if (last || st_rng_uniform(&rng) < 0.2f) tg[i] = -1;
        count += tg[i] >= 0;
    }
    float dloss = 1.0f / (float)count, *gp, *g0, *g1;
    float lp = packed_step(m, in, tg, dloss, pos, ds, &gp);
    /* each document alone, its gradient added into one's (zeroed once) */
    st_model_zero_grad(one);
    double lsum = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0, e; t < T; t = e) {
            for (e = t + 1; e < T && ds[b * T + e] == t;) e++;
            if (one->ops->alloc_acts(one, 1, e - t, &err)) {
                CHECK(0, "%s: %s", preset, err.msg);
                return;
            }
            int n = 0;
            for (int i = t; i < e; i++) n += tg[b * T + i] >= 0;
            float l = one->ops->forward(one, in + b * T + t, tg + b * T + t, dloss);
            one->ops->backward(one);
            lsum += (double)l * n / count;
        }
    float *gs = host_grads(one);
    CHECK(fabs(lp - lsum) <= 1e-5 * fabs(lsum), "%s: packed loss %.7f, documents alone %.7f", preset, lp, lsum);
    double mx = 0;
    for (size_t i = 0; i < m->n_params; i++) mx = fmax(mx, fabs(gs[i]));
    char what[128];
    snprintf(what, sizeof what, "%s: packed gradient = documents alone", preset);
    check_close_f32(what, gp, gs, m->n_params, 2e-5 * mx, 1e-3);
    /* no documents, and documents that change nothing: the same bits */
    int32_t pos_t[B * T], zero[B * T] = {0};
    for (int i = 0; i < B * T; i++) pos_t[i] = i % T;
    float l0 = packed_step(m, in, tg, dloss, NULL, NULL, &g0);
    float l1 = packed_step(m, in, tg, dloss, pos_t, zero, &g1);
    CHECK(l0 == l1 && !memcmp(g0, g1, m->n_params * sizeof(float)),
          "%s: one document a row differs from no documents (loss %.9g vs %.9g)", preset, l1, l0);
    CHECK(fabs(lp - l0) > 1e-4, "%s: the documents changed nothing (loss %.7f)", preset, lp);
    /* refusals */
    int32_t bad[B * T];
    memcpy(bad, ds, sizeof bad);
    bad[3] = 1; /* changes inside the first document */
    CHECK(st_model_set_docs(m, pos, bad, &err) == ST_ERR_INVALID, "%s: doc_start changing mid-document accepted",
          preset);
    memcpy(bad, pos, sizeof bad);
    bad[T + 5] = 128;
    CHECK(st_model_set_docs(m, bad, ds, &err) == ST_ERR_INVALID, "%s: position 128 accepted at max_seq 128", preset);
    free(gp), free(gs), free(g0), free(g1);
    st_model_free(m);
    st_model_free(one);
}

int main(void) {
    st_err err = {0};
    st_backend *be = NULL;
    if (st_backend_cpu_create(&be, 2, &err)) {
        fprintf(stderr, "model_docs: %s\n", err.msg);
        return 1;
    }
    const char *presets[] = {"gpt2-tiny", "llama-tiny", "qwen2-tiny", "qwen3-tiny"};
    for (int i = 0; i < 4; i++) test_model(be, presets[i]);
    st_backend_free(be);
    return test_finish("model_docs");
}
