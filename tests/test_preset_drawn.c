/* test_preset_drawn.c - a preset's frozen base drawn a tensor at a time and held as it is drawn
 * (st_lora_model_create_drawn, st_poetx_model_create_drawn) against the whole draw that wraps
 * it after (init_random, then st_lora_model_create; init_random, st_poetx_orthogonal_base where
 * orthogonal, then st_poetx_model_create), for bf16 and int8, GPT-2 and the Llama family:
 *   - the same loss bit for bit, and the same merged weights (save_hf) byte for byte;
 *   - a GPT-2 base whose embedding is larger than the whole draw's pieces (2^24 values) and
 *     whose block weights are drawn in several pieces, so every piece's start (a jump of the one
 *     sequence) is checked;
 *   - POET-X's orthogonal W0 in batches of 1 and 3 weights, and the model's own W0 (no orth). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/lora.h"
#include "strata/model.h"
#include "strata/poetx.h"
#include "testutil.h"

enum { B = 2, T = 8, SEED = 5 };
static const float GAIN = 3.0f;

static st_status orth_some(void *ctx, st_model *base, const int *ks, int n, st_err *err) {
    (void)ctx;
    return st_poetx_orthogonal_some(base, GAIN, SEED, ks, n, 0, 1, err);
}

static int same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    while (same) {
        int ca = fgetc(fa), cb = fgetc(fb);
        if (ca != cb) same = 0;
        if (ca == EOF || cb == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

/* the loss of a batch and save_hf's model.safetensors of the two models, alike; frees both */
static void compare(const char *what, st_model *whole, st_model *drawn) {
    st_err err = {0};
    if (whole->ops->alloc_acts(whole, B, T, &err) || drawn->ops->alloc_acts(drawn, B, T, &err)) {
        CHECK(0, "%s: alloc_acts: %s", what, err.msg);
        st_model_free(whole), st_model_free(drawn);
        return;
    }
    int32_t in[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) in[i] = (i * 7 + 3) % whole->vocab_size, tg[i] = (i * 11 + 5) % whole->vocab_size;
    float lw = whole->ops->forward(whole, in, tg, 1.0f / (B * T)), ld = drawn->ops->forward(drawn, in, tg, 1.0f / (B * T));
    CHECK(lw == ld, "%s: the loss %.9g drawn whole, %.9g drawn a tensor at a time", what, lw, ld);
    char dw[700], dd[700], fw[760], fd[760];
    snprintf(dw, sizeof dw, "%s/whole", test_tmpdir());
    snprintf(dd, sizeof dd, "%s/drawn", test_tmpdir());
    snprintf(fw, sizeof fw, "%s/model.safetensors", dw);
    snprintf(fd, sizeof fd, "%s/model.safetensors", dd);
    if (whole->ops->save_hf(whole, dw, ST_F32, &err) || drawn->ops->save_hf(drawn, dd, ST_F32, &err))
        CHECK(0, "%s: save_hf: %s", what, err.msg);
    else
        CHECK(same_file(fw, fd), "%s: the merged weights differ", what);
    st_model_free(whole), st_model_free(drawn);
}

static st_status bases(st_backend *be, const char *preset, const st_model_overrides *shape, st_model **whole,
                       st_model **drawn, st_err *err) {
    st_model_overrides ov = *shape;
    ov.no_grads = 1;
    *whole = *drawn = NULL;
    st_status s = st_model_create_from(whole, preset, "", &ov, 1, be, err);
    if (!s) s = st_model_create_from(drawn, preset, "", &ov, 1, be, err);
    if (s) st_model_free(*whole), *whole = NULL;
    else (*whole)->ops->init_random(*whole, SEED);
    return s;
}

static void lora_case(st_backend *be, const char *preset, const st_model_overrides *shape, const char *targets,
                      st_frozen_dtype d) {
    char what[160];
    snprintf(what, sizeof what, "lora %s %s", preset, st_frozen_dtype_name(d));
    st_err err = {0};
    st_model *bw = NULL, *bd = NULL, *w = NULL, *m = NULL;
    st_lora_config lc = {.rank = 2, .alpha = 4, .frozen_dtype = d};
    snprintf(lc.targets, sizeof lc.targets, "%s", targets);
    if (bases(be, preset, shape, &bw, &bd, &err) || st_lora_model_create(&w, bw, &lc, SEED, &err)) {
        CHECK(0, "%s: %s", what, err.msg);
        st_model_free(bd);
        return;
    }
    if (st_lora_model_create_drawn(&m, bd, &lc, SEED, &err)) {
        CHECK(0, "%s: drawn: %s", what, err.msg);
        st_model_free(w);
        return;
    }
    compare(what, w, m);
}

static void poetx_case(st_backend *be, const char *preset, const st_model_overrides *shape, int block,
                       st_frozen_dtype d, int batch) {
    char what[160];
    snprintf(what, sizeof what, "poetx %s %s %s", preset, st_frozen_dtype_name(d),
             batch ? (batch == 1 ? "orthogonal, batch 1" : "orthogonal, batch 3") : "model init");
    st_err err = {0};
    st_model *bw = NULL, *bd = NULL, *w = NULL, *m = NULL;
    st_poetx_config pc = {.block = block, .terms = 4, .frozen_dtype = d};
    st_poetx_orth orth = {orth_some, NULL, batch};
    if (bases(be, preset, shape, &bw, &bd, &err) ||
        (batch && st_poetx_orthogonal_base(bw, GAIN, SEED, &err)) || st_poetx_model_create(&w, bw, &pc, SEED, &err)) {
        CHECK(0, "%s: %s", what, err.msg);
        if (!w) st_model_free(bw);
        st_model_free(bd);
        return;
    }
    if (st_poetx_model_create_drawn(&m, bd, &pc, SEED, batch ? &orth : NULL, &err)) {
        CHECK(0, "%s: drawn: %s", what, err.msg);
        st_model_free(w);
        return;
    }
    compare(what, w, m);
}

int main(void) {
    st_err err = {0};
    st_backend *be = NULL;
    if (st_backend_cpu_create(&be, 0, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    /* wte 17,000 x 1024 values (over 2^24: two pieces), block weights of 1-4M values */
    st_model_overrides big = {.vocab_size = 17000, .n_layer = 1, .n_embd = 1024, .n_head = 16};
    st_model_overrides none = {0};
    lora_case(be, "gpt2-mini", &big, "c_attn,c_fc", ST_FROZEN_INT8);
    lora_case(be, "gpt2-tiny", &none, "c_attn", ST_FROZEN_BF16);
    lora_case(be, "llama-tiny", &none, "q_proj,v_proj,down_proj", ST_FROZEN_INT8);
    poetx_case(be, "gpt2-mini", &big, 64, ST_FROZEN_INT8, 3);
    poetx_case(be, "gpt2-tiny", &none, 16, ST_FROZEN_BF16, 1);
    poetx_case(be, "gpt2-tiny", &none, 16, ST_FROZEN_INT8, 0);
    poetx_case(be, "llama-tiny", &none, 8, ST_FROZEN_INT8, 3);
    st_backend_free(be);
    return test_finish("preset_drawn");
}
