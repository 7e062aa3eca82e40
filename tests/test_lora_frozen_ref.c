/* test_lora_frozen_ref.c - LoRA with the base's block matmul weights held in bf16 or int8
 * (st_lora_config.frozen_dtype, src/model/frozen_store.c) against its property: it is LoRA in
 * fp32 over a base whose matmul weights were already rounded, here by this file's own
 * reference of the documented schemes (bf16: round to nearest even; int8: each group of 256
 * consecutive values of a tensor as stored, zero = its least, scale = (most - least) / 255 in
 * fp32, code = the nearest of (x - zero) / scale in 0..255, value = zero + scale * code in fp32).
 *
 * For GPT-2 (one projection a matmul), the Llama family (q|k|v and gate|up packed, each its own
 * weight) and a GPT-2 wide enough that a weight takes several dequantising panels (n_embd 512:
 * c_fc is 4 MiB in fp32, the panel 2 MiB), over 4 steps of plain SGD on the adapters:
 *   loss        |d| <= 1e-6 relative, every step
 *   gradients   |d| <= 1e-7 + 1e-4 |ref| (every adapter matrix)
 *   merged model (st_lora_save_merged_hf: held W0 dequantised + s B A) byte-identical to the
 *               reference model's merged file (the same adapters in both)
 * and the held model is not the unrounded one (its first loss differs from fp32's over the
 * original base), and the bytes held (st_lora_held_bytes) are 2 (bf16) or 1 + 8/256 (int8)
 * a matmul-weight value.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/lora.h"
#include "strata/model.h"
#include "testutil.h"

/* The block matmul weights by their names' ends (GPT-2's Conv1D, the Llama family's). */
static int is_block_matmul(const char *name) {
    static const char *const sfx[] = {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight",
                                      ".mlp.c_proj.weight", "q_proj.weight", "k_proj.weight", "v_proj.weight",
                                      "o_proj.weight", "gate_proj.weight", "up_proj.weight", "down_proj.weight"};
    size_t ln = strlen(name);
    for (size_t i = 0; i < sizeof sfx / sizeof *sfx; i++) {
        size_t ls = strlen(sfx[i]);
        if (ln >= ls && !strcmp(name + ln - ls, sfx[i])) return 1;
    }
    return 0;
}

static float ref_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7FFFu + ((u >> 16) & 1u); /* round to nearest, ties to even (finite weights) */
    u &= 0xFFFF0000u;
    memcpy(&x, &u, 4);
    return x;
}

static void ref_int8(float *x, size_t n) {
    for (size_t g0 = 0; g0 < n; g0 += 256) {
        size_t m = n - g0 < 256 ? n - g0 : 256;
        float lo = x[g0], hi = x[g0];
        for (size_t i = 1; i < m; i++) {
            lo = x[g0 + i] < lo ? x[g0 + i] : lo;
            hi = x[g0 + i] > hi ? x[g0 + i] : hi;
        }
        float s = (hi - lo) / 255.0f;
        for (size_t i = 0; i < m; i++) {
            double q = s > 0 ? floor(((double)x[g0 + i] - lo) / s + 0.5) : 0;
            q = q < 0 ? 0 : q > 255 ? 255 : q;
            x[g0 + i] = lo + s * (float)q;
        }
    }
}

static void sgd(st_model *m, float lr) {
    for (size_t i = 0; i < m->n_params; i++) m->params[i] -= lr * m->grads[i];
}

static void run_case(st_backend *be, const char *preset, const st_model_overrides *ov, const char *targets,
                     st_frozen_dtype d, int B, int T) {
    st_err err = {0};
    st_model *bh = NULL, *br = NULL, *bo = NULL, *mh = NULL, *mr = NULL, *mo = NULL;
    char what[160];
    snprintf(what, sizeof what, "%s%s %s", preset, ov ? " (wide)" : "", st_frozen_dtype_name(d));
    if (st_model_create(&bh, preset, ov, be, &err) || st_model_create(&br, preset, ov, be, &err) ||
        st_model_create(&bo, preset, ov, be, &err)) {
        CHECK(0, "%s: %s", what, err.msg);
        st_model_free(bh), st_model_free(br), st_model_free(bo);
        return;
    }
    bh->ops->init_random(bh, 5);
    st_rng rng; /* biases and norms away from their initial 0 and 1, so the bias path counts */
    st_rng_seed(&rng, 11);
    for (int i = 0; i < bh->n_tensors; i++)
        if (bh->tensors[i].ndim == 1)
            for (size_t j = 0; j < bh->tensors[i].numel; j++)
                bh->params[bh->tensors[i].offset + j] += 0.2f * (st_rng_uniform(&rng) - 0.5f);
    memcpy(bo->params, bh->params, bh->n_params * sizeof(float));
    memcpy(br->params, bh->params, bh->n_params * sizeof(float));
    size_t n_mm = 0;
    for (int i = 0; i < br->n_tensors; i++) { /* the reference base: its matmul weights rounded here */
        const st_param_info *t = &br->tensors[i];
        if (!is_block_matmul(t->name)) continue;
        n_mm += t->numel;
        float *x = br->params + t->offset;
        if (d == ST_FROZEN_BF16)
            for (size_t j = 0; j < t->numel; j++) x[j] = ref_bf16(x[j]);
        else ref_int8(x, t->numel);
    }
    size_t numel = 0, held = 0, panel = 0, row = 0;
    st_lora_held_bytes(bh->tensors, bh->n_tensors, bh->ops->arch, d, &numel, &held, &panel, &row);
    CHECK(numel == n_mm, "%s: %zu matmul-weight values held, %zu by name", what, numel, n_mm);
    double per = d == ST_FROZEN_BF16 ? 2.0 : 1.0 + 8.0 / 256;
    CHECK(fabs((double)held - per * n_mm) <= 8.0 * br->n_tensors, "%s: %zu bytes held for %zu values (%.4f each)",
          what, held, n_mm, per);
    st_lora_config lh = {.rank = 4, .alpha = 8, .frozen_dtype = d}, lr = lh;
    lr.frozen_dtype = ST_FROZEN_F32;
    snprintf(lh.targets, sizeof lh.targets, "%s", targets);
    snprintf(lr.targets, sizeof lr.targets, "%s", targets);
    st_status s1 = st_lora_model_create(&mh, bh, &lh, 3, &err);
    st_status s2 = s1 ? s1 : st_lora_model_create(&mr, br, &lr, 3, &err);
    st_status s3 = s2 ? s2 : st_lora_model_create(&mo, bo, &lr, 3, &err);
    if (s1) st_model_free(br);
    if (s1 || s2) st_model_free(bo);
    if (s3 || mh->ops->alloc_acts(mh, B, T, &err) || mr->ops->alloc_acts(mr, B, T, &err) ||
        mo->ops->alloc_acts(mo, B, T, &err)) {
        CHECK(0, "%s: %s", what, err.msg);
        st_model_free(mh), st_model_free(mr), st_model_free(mo);
        return;
    }
    int N = B * T, V = mh->vocab_size;
    int32_t *in = malloc(sizeof(int32_t) * N), *tg = malloc(sizeof(int32_t) * N);
    for (int i = 0; i < N; i++) in[i] = (i * 7 + 3) % V, tg[i] = (i * 11 + 5) % V;
    float worst = 0;
    for (int step = 0; step < 4; step++) {
        st_model_zero_grad(mh), st_model_zero_grad(mr), st_model_zero_grad(mo);
        float loss_h = mh->ops->forward(mh, in, tg, 1.0f / N);
        float loss_r = mr->ops->forward(mr, in, tg, 1.0f / N);
        float loss_o = mo->ops->forward(mo, in, tg, 1.0f / N);
        mh->ops->backward(mh), mr->ops->backward(mr), mo->ops->backward(mo);
        float rel = fabsf(loss_h - loss_r) / loss_r;
        worst = rel > worst ? rel : worst;
        CHECK(rel <= 1e-6f, "%s step %d: loss %.8f held vs %.8f over the rounded base (rel %.2g)", what, step, loss_h,
              loss_r, rel);
        if (step == 0)
            CHECK(loss_h != loss_o, "%s: the first loss %.8f is not the unrounded base's (the weights are held "
                  "rounded)", what, loss_o);
        char gw[200];
        snprintf(gw, sizeof gw, "%s step %d adapter gradients", what, step);
        check_close_f32(gw, mh->grads, mr->grads, mh->n_params, 1e-7, 1e-4);
        sgd(mh, 0.05f), sgd(mr, 0.05f), sgd(mo, 0.05f);
    }
    printf("  %-22s 4 steps: worst loss rel diff %.2g; %zu values held in %zu bytes + a %zu-byte panel\n", what,
           worst, n_mm, held, panel);
    /* the merged models written with the same adapters (the Llama family's packed matmuls, formed a
     * projection at a time, drift the adapters by an ulp or so over the steps): the same bytes */
    memcpy(mh->params, mr->params, mh->n_params * sizeof(float));
    char dh[600], dr[600], fh[700], fr[700];
    snprintf(dh, sizeof dh, "%s/%s_%s_h", test_tmpdir(), preset, st_frozen_dtype_name(d));
    snprintf(dr, sizeof dr, "%s/%s_%s_r", test_tmpdir(), preset, st_frozen_dtype_name(d));
    snprintf(fh, sizeof fh, "%s/model.safetensors", dh);
    snprintf(fr, sizeof fr, "%s/model.safetensors", dr);
    if (st_lora_save_merged_hf(mh, dh, ST_F32, &err) || st_lora_save_merged_hf(mr, dr, ST_F32, &err))
        CHECK(0, "%s: save_hf: %s", what, err.msg);
    else CHECK(test_same_file(fh, fr), "%s: the merged model from the held weights is the reference's byte for byte",
               what);
    /* and the held model still trains the same after the save (its weights given back again) */
    st_model_zero_grad(mh), st_model_zero_grad(mr);
    float a = mh->ops->forward(mh, in, tg, 1.0f / N), b = mr->ops->forward(mr, in, tg, 1.0f / N);
    CHECK(fabsf(a - b) <= 1e-6f * b, "%s: after save_hf the loss %.8f vs %.8f", what, a, b);
    free(in);
    free(tg);
    st_model_free(mh), st_model_free(mr), st_model_free(mo);
}

int main(void) {
    st_err err = {0};
    st_backend *be = NULL;
    if (st_backend_cpu_create(&be, 0, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    st_model_overrides wide = {.vocab_size = 256, .n_layer = 1, .n_embd = 512, .n_head = 8};
    for (int d = ST_FROZEN_BF16; d <= ST_FROZEN_INT8; d++) {
        run_case(be, "gpt2-tiny", NULL, "c_attn,c_proj", (st_frozen_dtype)d, 2, 8);
        run_case(be, "llama-tiny", NULL, "q,v,gate,down", (st_frozen_dtype)d, 2, 8);
        run_case(be, "gpt2-tiny", &wide, "c_fc", (st_frozen_dtype)d, 2, 8);
    }
    /* refused: a dtype that is none */
    st_model *base = NULL, *m = NULL;
    st_lora_config bad = {.rank = 2, .alpha = 4, .targets = "c_attn", .frozen_dtype = (st_frozen_dtype)7};
    if (!st_model_create(&base, "gpt2-tiny", NULL, be, &err)) {
        base->ops->init_random(base, 1);
        st_status s = st_lora_model_create(&m, base, &bad, 1, &err);
        CHECK(s != ST_OK && strstr(err.msg, "frozen_dtype"), "frozen_dtype 7 refused naming the key: %s", err.msg);
        st_model_free(m);
    }
    st_backend_free(be);
    return test_finish("lora_frozen_ref");
}
