/* test_stream_w16.c - matmul bf16 through the layer-streaming executor, whose matmuls read
 * the weights' bf16 copy (written by the optimizer's pass, stream_w16.c) instead of rounding
 * each weight at each use, equals bit for bit the model's own forward and backward under
 * matmul bf16 (which rounds every weight at every call) followed by the same update.
 *
 * A 6-block GPT-2 on a budgeted CPU device (two weight slots, so slots are reused by other
 * blocks), with clipping at the median norm so that some steps roll the speculative update
 * back: speculative and overlapped, not overlapped, and kept/recomputed/offloaded blocks;
 * between two steps a weight edited on both sides (st_stream_set_params); the final forward
 * alone (st_stream_eval) against the model's. Skips (77) in a build without oneDNN. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "strata/block.h"
#include "strata/model.h"
#include "strata/optim.h"
#include "strata/stream.h"
#include "strata/tier.h"
#include "testutil.h"

enum { B = 2, T = 32, STEPS = 8, EDIT_AT = 4 };
static const float LR = 1e-3f, WD = 0.1f;
static const st_gpt2_config CFG = {128, 32, 6, 4, 64};

static void batch(int step, int V, int32_t *in, int32_t *tg) {
    st_rng r;
    st_rng_seed(&r, 500 + (uint64_t)step);
    for (int i = 0; i < B * T; i++) {
        in[i] = (int32_t)(st_rng_u64(&r) % (uint64_t)V);
        tg[i] = (in[i] * 3 + 1) % V;
    }
}

static st_adamw_params hparams(long step) { return (st_adamw_params){.lr = LR, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = step, .grad_scale = 1.0f}; }

/* The model's own step under the backend's matmul mode; the edit before step EDIT_AT. */
static void ref_train(st_backend *cpu, float max_norm, float *losses, double *norms, float *params, float *eval) {
    st_err err = {0};
    st_gpt2_model m;
    CHECK(st_gpt2_create(&m, &CFG, cpu, &err) == ST_OK && st_gpt2_alloc_acts(&m, B, T, &err) == ST_OK, "ref: %s", err.msg);
    st_gpt2_init_random(&m, 5);
    st_optim_segment *segs = calloc((size_t)m.n_tensors, sizeof *segs);
    st_params_decay_segments(m.tensors, m.n_tensors, WD, segs);
    st_optim *o = NULL;
    CHECK(st_optim_create(&o, segs, m.n_tensors, ST_OPTIM_STATE_F32, &err) == ST_OK, "optim: %s", err.msg);
    int32_t in[B * T], tg[B * T];
    for (int s = 0; s < STEPS && o; s++) {
        if (s == EDIT_AT) m.params[m.block_offset0 + m.block_numel / 2] += 0.25f; /* a matmul weight of block 0, edited by the caller */
        batch(s, CFG.vocab_size, in, tg);
        st_gpt2_zero_grad(&m);
        losses[s] = st_gpt2_forward(&m, in, tg, 1.0f / (B * T));
        st_gpt2_backward(&m);
        double norm = sqrt(st_optim_grad_sumsq_f32(m.grads, m.n_params));
        norms[s] = norm;
        st_adamw_params hp = hparams(s + 1);
        hp.grad_scale = max_norm > 0 && norm > max_norm ? (float)(max_norm / norm) : 1.0f;
        st_optim_step(o, m.params, m.grads, &hp);
    }
    batch(STEPS, CFG.vocab_size, in, tg);
    *eval = st_gpt2_forward(&m, in, tg, 0.0f);
    memcpy(params, m.params, m.n_params * sizeof(float));
    free(segs);
    st_optim_free(o);
    st_gpt2_free(&m);
}

static void stream_train(st_backend *cpu, const st_arch *arch, const char *what, const st_stream_plan *plan,
                         float max_norm, const float *ref_losses, const float *ref_p, float ref_eval, size_t n) {
    st_err err = {0};
    st_backend *dev = NULL;
    st_stream_exec *x = NULL;
    CHECK(st_backend_with_budget(&dev, cpu, 64u << 20, &err) == ST_OK, "budget: %s", err.msg);
    st_stream_config sc = {.arch = arch, .B = B, .T = T, .weight_decay = WD};
    if (!dev || st_stream_exec_create(&x, &sc, plan, dev, &err) != ST_OK) {
        CHECK(0, "%s: create: %s", what, err.msg);
        st_backend_free(dev);
        return;
    }
    st_stream_init_random(x, 5);
    int32_t in[B * T], tg[B * T];
    int same_loss = 0, rolled = 0, clipped = 0;
    for (int s = 0; s < STEPS; s++) {
        if (s == EDIT_AT) {
            st_stream_params(x)[arch->lay.block_offset0 + arch->lay.block_numel / 2] += 0.25f;
            st_stream_set_params(x, st_stream_params(x)); /* "I edited st_stream_params" */
        }
        batch(s, CFG.vocab_size, in, tg);
        st_stream_step_stats st;
        st_adamw_params hp = hparams(s + 1);
        CHECK(st_stream_step(x, in, tg, &hp, max_norm, &st, &err) == ST_OK, "%s: step %d: %s", what, s, err.msg);
        same_loss += memcmp(&st.loss, &ref_losses[s], sizeof(float)) == 0;
        rolled += st.rolled_back;
        clipped += st.clipped;
    }
    size_t diff = 0;
    for (size_t i = 0; i < n; i++) diff += memcmp(&st_stream_params(x)[i], &ref_p[i], sizeof(float)) != 0;
    float le = 0;
    batch(STEPS, CFG.vocab_size, in, tg);
    CHECK(st_stream_eval(x, in, tg, &le, &err) == ST_OK, "%s: eval: %s", what, err.msg);
    CHECK(same_loss == STEPS, "%s: %d of %d losses bit-identical to the model's bf16 step", what, same_loss, STEPS);
    CHECK(diff == 0, "%s: %zu of %zu final weights differ from the model's bf16 step", what, diff, n);
    CHECK(memcmp(&le, &ref_eval, sizeof le) == 0, "%s: eval %.9g, the model's forward %.9g", what, le, ref_eval);
    printf("  %-40s %d steps equal (%d clipped, %d rolled back), eval %.6f\n", what, same_loss, clipped, rolled, le);
    st_stream_exec_free(x);
    st_backend_free(dev);
}

int main(void) {
    st_err err = {0};
    st_backend *cpu = NULL;
    CHECK(st_backend_cpu_create(&cpu, 0, &err) == ST_OK, "cpu: %s", err.msg);
    if (!cpu) return test_finish("stream_w16");
    if (st_backend_set_matmul(cpu, "bf16", &err) != ST_OK) {
        printf("stream_w16: skipped: %s\n", err.msg);
        st_backend_free(cpu);
        return 77;
    }
    CHECK(st_backend_bf16_weights_read(cpu), "the CPU backend under matmul bf16 reads no weight copy");
    st_arch *arch = NULL;
    CHECK(st_arch_gpt2(&arch, &CFG, &err) == ST_OK, "arch: %s", err.msg);
    if (!arch) return test_finish("stream_w16");
    size_t n = arch->lay.n_params;
    float losses0[STEPS], losses[STEPS], eval0, eval;
    double norms[STEPS];
    float *ref_p = malloc(n * sizeof(float));
    /* a clip threshold that some steps exceed and others do not */
    ref_train(cpu, 0.0f, losses0, norms, ref_p, &eval0);
    double sorted[STEPS];
    memcpy(sorted, norms, sizeof sorted);
    for (int i = 0; i < STEPS; i++)
        for (int j = i + 1; j < STEPS; j++)
            if (sorted[j] < sorted[i]) { double t = sorted[i]; sorted[i] = sorted[j]; sorted[j] = t; }
    float max_norm = (float)(0.5 * (sorted[STEPS / 2 - 1] + sorted[STEPS / 2]));
    ref_train(cpu, max_norm, losses, norms, ref_p, &eval);

    struct { const char *name; int overlap, clip, acts; } v[] = {
        {"overlap, speculative, recompute", 1, ST_STREAM_CLIP_SPECULATE, ST_STREAM_ACT_RECOMPUTE},
        {"overlap, deferred clip, mixed acts", 1, ST_STREAM_CLIP_DEFER, -1},
        {"no overlap, keep", 0, ST_STREAM_CLIP_SPECULATE, ST_STREAM_ACT_KEEP},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        st_stream_plan plan;
        st_stream_plan_default(&plan, CFG.n_layer);
        plan.prefetch_depth = 1; /* two weight slots for six blocks */
        plan.overlap_optim = v[i].overlap;
        plan.clip = v[i].clip;
        if (v[i].acts >= 0) st_stream_plan_set_all(&plan, (st_stream_act)v[i].acts);
        else for (int l = 0; l < plan.n_layer; l++) plan.act[l] = (unsigned char)(l % 3);
        stream_train(cpu, arch, v[i].name, &plan, max_norm, losses, ref_p, eval, n);
    }
    free(ref_p);
    st_arch_free(arch);
    st_backend_free(cpu);
    return test_finish("stream_w16");
}
