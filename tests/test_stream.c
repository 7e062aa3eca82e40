/* test_stream.c - the layer-streaming executor against the plain in-memory step.
 *
 * The in-memory loop here is train.c's (zero, forward, backward, global norm, clip,
 * AdamW over the whole vector). The streamed step runs the same float operations on
 * the same values (the blocks on device slabs, the update per block on the host), so
 * the losses and the final parameters are expected bit for bit, with and without the
 * optimizer overlap, with recompute, keep and offload, and on steps where clipping
 * applies (the speculative update is rolled back) and where it does not. A model whose
 * training state is 8x the device budget trains under that budget. */
#include <math.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>

#include "strata/block.h"
#include "strata/model.h"
#include "strata/train.h"
#include "strata/optim.h"
#include "strata/prof.h"
#include "strata/store.h"
#include "strata/stream.h"
#include "strata/tensor.h"
#include "strata/tier.h"
#include "testutil.h"

/* Steps per run: MAX_STEPS, or SAN_STEPS in a build with AddressSanitizer (or when
 * STRATA_TEST_SANITIZED=1, which tests/CMakeLists.txt sets for -DSTRATA_SANITIZE=ON),
 * where each step is several times slower; every variant and every check still runs. */
#define MAX_STEPS 20
#define SAN_STEPS 6
#if defined(__SANITIZE_ADDRESS__)
#define BUILT_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BUILT_SANITIZED 1
#endif
#endif
#ifndef BUILT_SANITIZED
#define BUILT_SANITIZED 0
#endif
static int steps = MAX_STEPS; /* runtime: SAN_STEPS when sanitized */

static const float LR = 1e-3f, WD = 0.1f;

static void batch(int step, int B, int T, int V, int32_t *in, int32_t *tg) {
    /* a learnable pattern with noise: next token mostly (3 * token + 1) mod V */
    st_rng r;
    st_rng_seed(&r, 1000 + (uint64_t)step);
    for (int b = 0; b < B; b++) {
        int32_t t = (int32_t)(st_rng_u64(&r) % (uint64_t)V);
        for (int i = 0; i < T; i++) {
            in[b * T + i] = t;
            t = st_rng_uniform(&r) < 0.8f ? (3 * t + 1) % V : (int32_t)(st_rng_u64(&r) % (uint64_t)V);
            tg[b * T + i] = t;
        }
    }
}

/* The arch of a GPT-2 configuration (kept until the end of main, which frees them). */
static st_arch *arches[16];
static st_gpt2_config arch_cfgs[16];
static int n_arches;
static const st_arch *arch_of(const st_gpt2_config *cfg) {
    for (int i = 0; i < n_arches; i++)
        if (!memcmp(&arch_cfgs[i], cfg, sizeof *cfg)) return arches[i];
    st_err err = {0};
    st_arch *a = NULL;
    if (n_arches == 16 || st_arch_gpt2(&a, cfg, &err) != ST_OK) {
        fprintf(stderr, "FAIL: arch: %s\n", n_arches == 16 ? "more than 16 configurations" : err.msg);
        exit(1);
    }
    arch_cfgs[n_arches] = *cfg;
    return arches[n_arches++] = a;
}

static st_adamw_params hparams(long step) { return (st_adamw_params){.lr = LR, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = step, .grad_scale = 1.0f}; }

/* train.c's step, on the plain CPU backend; bf16_blocks: the blocks' gradients rounded
 * to bf16 first (what a bf16 drain delivers to the optimizer). */
static void ref_train_ex(st_backend *cpu, const st_gpt2_config *cfg, int B, int T, float max_norm, float *losses,
                         double *norms, float *final_params, int bf16_blocks) {
    st_err err = {0};
    st_gpt2_model m;
    CHECK(st_gpt2_create(&m, cfg, cpu, &err) == ST_OK && st_gpt2_alloc_acts(&m, B, T, &err) == ST_OK, "ref: %s", err.msg);
    st_gpt2_init_random(&m, 5);
    st_optim_segment *segs = calloc((size_t)m.n_tensors, sizeof *segs);
    st_params_decay_segments(m.tensors, m.n_tensors, WD, segs);
    st_optim *o;
    CHECK(st_optim_create(&o, segs, m.n_tensors, ST_OPTIM_STATE_F32, &err) == ST_OK, "optim: %s", err.msg);
    int N = B * T;
    int32_t *in = malloc(sizeof(int32_t) * N), *tg = malloc(sizeof(int32_t) * N);
    for (int s = 0; s < steps; s++) {
        batch(s, B, T, cfg->vocab_size, in, tg);
        st_gpt2_zero_grad(&m);
        losses[s] = st_gpt2_forward(&m, in, tg, 1.0f / N);
        st_gpt2_backward(&m);
        if (bf16_blocks) {
            size_t nb = (size_t)cfg->n_layer * m.block_numel;
            uint16_t *tmp = malloc(nb * 2);
            st_convert(tmp, ST_BF16, m.grads + m.block_offset0, ST_F32, nb);
            st_convert(m.grads + m.block_offset0, ST_F32, tmp, ST_BF16, nb);
            free(tmp);
        }
        double norm = sqrt(st_optim_grad_sumsq_f32(m.grads, m.n_params));
        norms[s] = norm;
        st_adamw_params hp = hparams(s + 1);
        hp.grad_scale = (max_norm > 0 && norm > max_norm) ? (float)(max_norm / norm) : 1.0f;
        st_optim_step(o, m.params, m.grads, &hp);
    }
    memcpy(final_params, m.params, m.n_params * sizeof(float));
    free(in);
    free(tg);
    free(segs);
    st_optim_free(o);
    st_gpt2_free(&m);
}

static void ref_train(st_backend *cpu, const st_gpt2_config *cfg, int B, int T, float max_norm, float *losses,
                      double *norms, float *final_params) {
    ref_train_ex(cpu, cfg, B, T, max_norm, losses, norms, final_params, 0);
}

typedef struct run_result {
    float losses[MAX_STEPS];
    int clipped, rolled_back;
    size_t peak, budget, need;
    uint64_t h2d_max, d2h_max, h2d_act, d2h_act;
    double eff;
} run_result;

static int stream_train(st_backend *cpu, const st_gpt2_config *cfg, int B, int T, float max_norm, const st_stream_plan *plan,
                        size_t budget, run_result *res, float *final_params) {
    st_err err = {0};
    memset(res, 0, sizeof *res);
    st_backend *dev;
    CHECK(st_backend_with_budget(&dev, cpu, budget, &err) == ST_OK, "budget: %s", err.msg);
    st_stream_config sc = {.arch = arch_of(cfg), .B = B, .T = T, .weight_decay = WD};
    res->need = st_stream_device_bytes(&sc, plan);
    st_stream_exec *x;
    if (st_stream_exec_create(&x, &sc, plan, dev, &err) != ST_OK) {
        CHECK(0, "stream_exec_create: %s", err.msg);
        st_backend_free(dev);
        return 1;
    }
    st_stream_init_random(x, 5);
    int N = B * T;
    int32_t *in = malloc(sizeof(int32_t) * N), *tg = malloc(sizeof(int32_t) * N);
    for (int s = 0; s < steps; s++) {
        batch(s, B, T, cfg->vocab_size, in, tg);
        st_stream_step_stats st;
        st_adamw_params hp = hparams(s + 1);
        CHECK(st_stream_step(x, in, tg, &hp, max_norm, &st, &err) == ST_OK, "step %d: %s", s, err.msg);
        res->losses[s] = st.loss;
        res->clipped += st.clipped;
        res->rolled_back += st.rolled_back;
        if (st.device_peak_bytes > res->peak) res->peak = st.device_peak_bytes;
        res->budget = st.device_budget_bytes;
        if (st.h2d_bytes > res->h2d_max) res->h2d_max = st.h2d_bytes;
        if (st.d2h_bytes > res->d2h_max) res->d2h_max = st.d2h_bytes;
        if (st.h2d_act_bytes > res->h2d_act) res->h2d_act = st.h2d_act_bytes;
        if (st.d2h_act_bytes > res->d2h_act) res->d2h_act = st.d2h_act_bytes;
        res->eff = st.overlap_efficiency;
    }
    memcpy(final_params, st_stream_params(x), st_stream_arch(x)->lay.n_params * sizeof(float));
    free(in);
    free(tg);
    st_stream_exec_free(x);
    st_backend_free(dev);
    return 0;
}

/* exact: bit-identical losses and parameters expected (the same float operations);
 * otherwise losses within 1e-5 relative and parameters close. */
static void compare(const char *what, const float *ref_losses, const float *ref_params, const run_result *r,
                    const float *params, size_t n, int exact) {
    int same_loss = 0;
    double worst = 0;
    for (int s = 0; s < steps; s++) {
        same_loss += memcmp(&ref_losses[s], &r->losses[s], sizeof(float)) == 0;
        double rel = fabs((double)r->losses[s] - ref_losses[s]) / fabs((double)ref_losses[s]);
        if (rel > worst) worst = rel;
    }
    CHECK(worst <= 1e-5, "%s: loss differs from the in-memory run by %.3g relative", what, worst);
    if (exact) {
        CHECK(same_loss == steps, "%s: %d of %d losses bit-identical to the in-memory run", what, same_loss, steps);
        size_t diff = 0;
        for (size_t i = 0; i < n; i++) diff += memcmp(&ref_params[i], &params[i], sizeof(float)) != 0;
        CHECK(diff == 0, "%s: %zu of %zu final parameters differ from the in-memory run", what, diff, n);
    } else {
        /* Adam divides by the gradient's running RMS, so rounding-level gradient
         * differences move near-zero-gradient weights by up to ~lr per step */
        check_close_f32(what, params, ref_params, n, 20 * steps * LR * 1e-2, 1e-3);
    }
    printf("  %-34s losses %.6f -> %.6f, worst rel %.2g, clipped %d, rolled back %d, overlap eff %.2f\n", what,
           r->losses[0], r->losses[steps - 1], worst, r->clipped, r->rolled_back, r->eff);
}

static void plan_mixed(st_stream_plan *p) {
    for (int l = 0; l < p->n_layer; l++) p->act[l] = (unsigned char)(l % 3); /* keep, recompute, offload, ... */
}

/* Every transfer, compute phase and optimizer update is a span in the trace, transfers
 * with their bytes. */
static void test_trace(st_backend *cpu) {
    st_err err = {0};
    st_gpt2_config cfg = {64, 16, 3, 4, 32};
    int B = 2, T = 16, N = B * T;
    st_backend *dev;
    CHECK(st_backend_with_budget(&dev, cpu, 16u << 20, &err) == ST_OK, "budget: %s", err.msg);
    st_stream_plan plan;
    st_stream_plan_default(&plan, cfg.n_layer);
    plan.vocab_chunk = 16;
    st_stream_config sc = {.arch = arch_of(&cfg), .B = B, .T = T, .weight_decay = WD};
    st_stream_exec *x;
    CHECK(st_stream_exec_create(&x, &sc, &plan, dev, &err) == ST_OK, "create: %s", err.msg);
    st_stream_init_random(x, 1);
    char path[1100];
    snprintf(path, sizeof path, "%s/stream.trace.json", test_tmpdir());
    CHECK(st_prof_trace_start(path, "test_stream", &err) == ST_OK, "trace: %s", err.msg);
    int32_t in[32], tg[32];
    batch(0, B, T, cfg.vocab_size, in, tg);
    (void)N;
    st_stream_step_stats st;
    st_adamw_params hp = hparams(1);
    CHECK(st_stream_step(x, in, tg, &hp, 0, &st, &err) == ST_OK, "step: %s", err.msg);
    st_stream_exec_free(x); /* joins the worker threads: their rings are complete */
    CHECK(st_prof_trace_stop(&err) == ST_OK, "trace stop: %s", err.msg);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "trace file %s", path);
    if (f) {
        static char buf[1 << 20];
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = 0;
        fclose(f);
        const char *want[] = {"\"h2d\"", "\"d2h\"", "forward block", "recompute block", "backward block",
                              "forward head chunk", "backward head chunk", "optim block", "optim embed+head",
                              "\"bytes\":", "copy engine", "optimizer"};
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
            CHECK(strstr(buf, want[i]) != NULL, "trace lacks %s", want[i]);
    }
    st_backend_free(dev);
}

/* A non-finite gradient skips the step, as in memory: the speculative updates already
 * made are rolled back and nothing changes. */
static void test_nonfinite(st_backend *cpu) {
    st_err err = {0};
    st_gpt2_config cfg = {64, 16, 4, 4, 32};
    int B = 2, T = 16;
    st_backend *dev;
    CHECK(st_backend_with_budget(&dev, cpu, 16u << 20, &err) == ST_OK, "budget: %s", err.msg);
    st_stream_plan plan;
    st_stream_plan_default(&plan, cfg.n_layer);
    st_stream_config sc = {.arch = arch_of(&cfg), .B = B, .T = T, .weight_decay = WD};
    st_stream_exec *x;
    CHECK(st_stream_exec_create(&x, &sc, &plan, dev, &err) == ST_OK, "create: %s", err.msg);
    st_stream_init_random(x, 1);
    size_t n = st_stream_arch(x)->lay.n_params, b0 = st_stream_arch(x)->lay.block_offset0;
    float *p = st_stream_params(x);
    p[b0 + 3] = NAN; /* block 0's ln_1 weight: everything downstream is NaN */
    st_stream_set_params(x, p);
    float *before = malloc(n * 4);
    memcpy(before, p, n * 4);
    int32_t in[32], tg[32];
    batch(0, B, T, cfg.vocab_size, in, tg);
    st_stream_step_stats st;
    st_adamw_params hp = hparams(1);
    CHECK(st_stream_step(x, in, tg, &hp, 1.0f, &st, &err) == ST_OK, "step: %s", err.msg);
    CHECK(st.skipped == 1 && st.rolled_back == 1, "non-finite step: skipped %d, rolled back %d", st.skipped,
          st.rolled_back);
    CHECK(memcmp(before, st_stream_params(x), n * 4) == 0, "a skipped step changed the parameters");
    size_t bytes;
    float *m = st_optim_state_buffer(st_stream_optim(x), 0, &bytes), *v = st_optim_state_buffer(st_stream_optim(x), 1, &bytes);
    size_t nz = 0;
    for (size_t i = 0; i < n; i++) nz += m[i] != 0.0f || v[i] != 0.0f;
    CHECK(nz == 0, "a skipped step left %zu non-zero moments", nz);
    free(before);
    st_stream_exec_free(x);
    st_backend_free(dev);
}

/* The disk state beside the backward: with the optimizer state in a store, a thread updates
 * each subgroup as its gradients land (clip scale 1) and commits only once the step turns
 * out neither clipped nor skipped; otherwise the step is abandoned whole and redone. Every
 * loss and final weight equals the run with the state in RAM (which speculates per block),
 * with fp32 and bf16 drains (the store reads bf16 as bf16); steps ran beside the backward and
 * clipped ones were abandoned; a non-finite step leaves the committed state and puts the
 * committed weights back on the host. */
static void store_run(st_backend *cpu, const st_gpt2_config *cfg, const st_stream_plan *plan, int disk, float max_norm,
                      float *losses, float *final, int *beside, int *abandoned) {
    st_err err = {0};
    int B = 2, T = 16;
    *beside = *abandoned = 0;
    st_backend *dev;
    CHECK(st_backend_with_budget(&dev, cpu, 16u << 20, &err) == ST_OK, "budget: %s", err.msg);
    st_stream_config sc = {.arch = arch_of(cfg), .B = B, .T = T, .weight_decay = WD, .external_optimizer = disk,
                        .store_beside = 1};
    st_stream_exec *x;
    if (st_stream_exec_create(&x, &sc, plan, dev, &err) != ST_OK) {
        CHECK(0, "create: %s", err.msg);
        st_backend_free(dev);
        return;
    }
    st_stream_init_random(x, 3);
    const st_arch_layout *ly = &st_stream_arch(x)->lay;
    size_t n = ly->n_params;
    st_optim_segment *segs = calloc((size_t)ly->n_tensors, sizeof *segs);
    st_params_decay_segments(ly->tensors, ly->n_tensors, WD, segs);
    st_store *store = NULL;
    long blob = 0;
    if (disk) {
        char dir[1100];
        snprintf(dir, sizeof dir, "%s/beside-%d", test_tmpdir(), plan->grad_dtype == ST_BF16);
        mkdir(dir, 0755);
        const char *paths[1] = {dir};
        /* small subgroups and cache: reads during the step, a wait for each subgroup */
        st_store_config stc = {.paths = paths, .n_paths = 1, .segs = segs, .n_segs = ly->n_tensors,
                               .fmt = ST_OPTIM_STATE_F32, .region_bytes = 64u << 10, .host_budget = 1u << 20};
        CHECK(st_store_create(&store, &stc, st_store_init_copy, st_stream_params(x), &err) == ST_OK, "store: %s", err.msg);
        if (store) CHECK(st_stream_attach_store(x, store, &blob, sizeof blob, &err) == ST_OK, "attach: %s", err.msg);
    }
    int32_t in[32], tg[32];
    for (int s = 0; s < steps && (!disk || store); s++) {
        batch(s, B, T, cfg->vocab_size, in, tg);
        blob = s + 1;
        st_stream_step_stats st;
        st_adamw_params hp = hparams(s + 1);
        CHECK(st_stream_step(x, in, tg, &hp, max_norm, &st, &err) == ST_OK, "step %d: %s", s, err.msg);
        losses[s] = st.loss;
        *beside += st.store_beside;
        *abandoned += st.store_beside && st.rolled_back;
    }
    memcpy(final, st_stream_params(x), n * 4);
    if (store) {
        float *p = st_stream_params(x), *master = malloc(n * 4);
        size_t at = ly->block_offset0 + 3; /* block 0's ln_1 weight: everything downstream is NaN */
        float keep = p[at];
        p[at] = NAN;
        st_stream_set_params(x, p);
        st_store_stats ss;
        st_store_get_stats(store, &ss);
        uint64_t step0 = ss.step;
        batch(0, B, T, cfg->vocab_size, in, tg);
        st_stream_step_stats st;
        st_adamw_params hp = hparams(steps + 1);
        CHECK(st_stream_step(x, in, tg, &hp, max_norm, &st, &err) == ST_OK, "non-finite step: %s", err.msg);
        st_store_get_stats(store, &ss);
        CHECK(st.skipped && ss.step == step0, "non-finite step: skipped %d, store at step %llu (was %llu)", st.skipped,
              (unsigned long long)ss.step, (unsigned long long)step0);
        CHECK(st_store_read_master(store, master, &err) == ST_OK, "read: %s", err.msg);
        p[at] = keep;
        size_t diff = 0; /* the host weights are the committed ones (the NaN put there was never committed) */
        for (size_t i = 0; i < ly->n_params; i++) diff += memcmp(&final[i], &p[i], 4) != 0 || memcmp(&master[i], &p[i], 4) != 0;
        CHECK(diff == 0, "after a skipped step beside the backward %zu host weights differ from the committed ones", diff);
        free(master);
    }
    st_store_close(store);
    free(segs);
    st_stream_exec_free(x);
    st_backend_free(dev);
}

static void test_store_beside(st_backend *cpu) {
    st_gpt2_config cfg = {64, 16, 6, 4, 32};
    size_t n;
    {
        st_err err = {0};
        st_gpt2_model shell;
        CHECK(st_gpt2_create_shell(&shell, &cfg, cpu, &err) == ST_OK, "shell: %s", err.msg);
        n = shell.n_params;
        st_gpt2_free(&shell);
    }
    float *pr = malloc(n * 4), *pd = malloc(n * 4), lr_[MAX_STEPS], ld[MAX_STEPS];
    for (int bf = 0; bf < 2; bf++) {
        st_stream_plan plan;
        st_stream_plan_default(&plan, cfg.n_layer);
        plan.clip = bf ? ST_STREAM_CLIP_AUTO : ST_STREAM_CLIP_SPECULATE;
        plan.grad_dtype = bf ? ST_BF16 : ST_F32;
        plan_mixed(&plan);
        int b0, a0, b1, a1;
        float max_norm = 2.5f; /* clips about half the steps (norms 1.9-3.7) */
        store_run(cpu, &cfg, &plan, 0, max_norm, lr_, pr, &b0, &a0);
        store_run(cpu, &cfg, &plan, 1, max_norm, ld, pd, &b1, &a1);
        size_t diff = 0;
        for (size_t i = 0; i < n; i++) diff += memcmp(&pr[i], &pd[i], 4) != 0;
        int same_loss = !memcmp(lr_, ld, sizeof(float) * (size_t)steps);
        CHECK(diff == 0 && same_loss, "%s drain: the disk state beside the backward differs from the state in RAM: "
              "%zu of %zu weights, losses %s", bf ? "bf16" : "fp32", diff, n, same_loss ? "same" : "differ");
        CHECK(b1 >= 2 && a1 >= 1 && b1 > a1, "%s drain: %d steps beside the backward, %d abandoned (want some of each)",
              bf ? "bf16" : "fp32", b1, a1);
        printf("  disk state beside the backward, %s drain: %d of %d steps beside, %d abandoned and redone, "
               "bit-identical to the state in RAM\n", bf ? "bf16" : "fp32", b1, steps, a1);
    }
    free(pr);
    free(pd);
}

int main(void) {
    st_err err = {0};
    st_backend *cpu;
    const char *san = getenv("STRATA_TEST_SANITIZED");
    if (BUILT_SANITIZED || (san && !strcmp(san, "1"))) steps = SAN_STEPS;
    printf("%d steps per run%s\n", steps, steps < MAX_STEPS ? " (sanitized)" : "");
    CHECK(st_backend_cpu_create(&cpu, 0, &err) == ST_OK, "cpu: %s", err.msg);

    /* ---- the budget: training state >= 8x the device budget */
    {
        st_gpt2_config cfg = {256, 32, 24, 4, 128};
        int B = 2, T = 32;
        st_gpt2_model shell;
        CHECK(st_gpt2_create_shell(&shell, &cfg, cpu, &err) == ST_OK, "shell: %s", err.msg);
        size_t n = shell.n_params;
        st_gpt2_free(&shell);
        size_t state = n * 16; /* fp32 params, grads, two moments */
        size_t budget = state / 8;
        st_stream_plan plan;
        st_stream_plan_default(&plan, cfg.n_layer);
        st_stream_config sc = {.arch = arch_of(&cfg), .B = B, .T = T, .weight_decay = WD};
        size_t need = st_stream_device_bytes(&sc, &plan);
        printf("deep model: %zu params, training state %zu bytes, budget %zu (1/8), plan needs %zu\n", n, state, budget,
               need);
        CHECK(need <= budget, "the default plan needs %zu > budget %zu", need, budget);

        /* a plan that does not fit is an error that names the bytes missing */
        st_backend *small;
        CHECK(st_backend_with_budget(&small, cpu, need - 4096, &err) == ST_OK, "small budget");
        st_stream_exec *x = NULL;
        st_status s = st_stream_exec_create(&x, &sc, &plan, small, &err);
        CHECK(s == ST_ERR_NOMEM && strstr(err.msg, "bytes missing"), "a plan over budget: %d '%s'", s, err.msg);
        st_stream_exec_free(x);
        st_backend_free(small);

        float ref_losses[MAX_STEPS];
        double norms[MAX_STEPS];
        float *ref_p = malloc(n * 4), *p = malloc(n * 4);
        ref_train(cpu, &cfg, B, T, 0, ref_losses, norms, ref_p);
        run_result r;
        stream_train(cpu, &cfg, B, T, 0, &plan, budget, &r, p);
        CHECK(r.peak <= budget, "device peak %zu exceeds the budget %zu", r.peak, budget);
        CHECK(r.budget == budget / 256 * 256, "budget reported %zu", r.budget);
        CHECK(state >= 8 * r.budget, "state %zu < 8 x budget %zu", state, r.budget);
        size_t weight_bytes = n * 4;
        CHECK(r.h2d_max <= 2 * weight_bytes, "h2d %llu bytes per step > 2 x weights %zu", (unsigned long long)r.h2d_max,
              weight_bytes);
        CHECK(r.d2h_max == weight_bytes, "d2h %llu bytes per step != one gradient %zu", (unsigned long long)r.d2h_max,
              weight_bytes);
        printf("  peak %zu of budget %zu, h2d %.2f x weights, d2h %.2f x weights\n", r.peak, r.budget,
               (double)r.h2d_max / weight_bytes, (double)r.d2h_max / weight_bytes);
        compare("24 blocks, state = 8 x budget", ref_losses, ref_p, &r, p, n, 1);
        free(ref_p);
        free(p);
    }

    /* ---- plans, overlap and clipping on a small model */
    {
        st_gpt2_config cfg = {128, 32, 6, 4, 64};
        int B = 2, T = 32;
        st_gpt2_model shell;
        CHECK(st_gpt2_create_shell(&shell, &cfg, cpu, &err) == ST_OK, "shell: %s", err.msg);
        size_t n = shell.n_params, bn = shell.block_numel;
        st_gpt2_free(&shell);
        float ref_losses[MAX_STEPS], ref0_losses[MAX_STEPS];
        double norms[MAX_STEPS];
        float *ref_p = malloc(n * 4), *p = malloc(n * 4);
        /* a clip threshold that some steps exceed and others do not */
        ref_train(cpu, &cfg, B, T, 0, ref0_losses, norms, ref_p);
        double sorted[MAX_STEPS];
        memcpy(sorted, norms, sizeof sorted[0] * steps);
        for (int i = 0; i < steps; i++)
            for (int j = i + 1; j < steps; j++)
                if (sorted[j] < sorted[i]) { double t = sorted[i]; sorted[i] = sorted[j]; sorted[j] = t; }
        float max_norm = (float)(0.5 * (sorted[steps / 2 - 1] + sorted[steps / 2]));
        ref_train(cpu, &cfg, B, T, max_norm, ref_losses, norms, ref_p);
        size_t budget = 64u << 20;

        float *ref16_losses = malloc(sizeof(float) * steps), *ref16_p = malloc(n * 4);
        ref_train_ex(cpu, &cfg, B, T, max_norm, ref16_losses, norms, ref16_p, 1);
        struct { const char *name; int depth, overlap, clip, acts, vchunk, bf16; } v[] = {
            {"recompute, overlap, speculative", 1, 1, ST_STREAM_CLIP_SPECULATE, ST_STREAM_ACT_RECOMPUTE, 0, 0},
            {"recompute, no overlap", 1, 0, ST_STREAM_CLIP_SPECULATE, ST_STREAM_ACT_RECOMPUTE, 0, 0},
            {"recompute, overlap, deferred", 1, 1, ST_STREAM_CLIP_DEFER, ST_STREAM_ACT_RECOMPUTE, 0, 0},
            {"recompute, overlap, auto", 1, 1, ST_STREAM_CLIP_AUTO, ST_STREAM_ACT_RECOMPUTE, 0, 0},
            {"keep, depth 2, overlap", 2, 1, ST_STREAM_CLIP_SPECULATE, ST_STREAM_ACT_KEEP, 0, 0},
            {"offload, overlap", 1, 1, ST_STREAM_CLIP_SPECULATE, ST_STREAM_ACT_OFFLOAD, 0, 0},
            {"offload, no overlap", 1, 0, ST_STREAM_CLIP_SPECULATE, ST_STREAM_ACT_OFFLOAD, 0, 0},
            {"keep/recompute/offload, depth 3", 3, 1, ST_STREAM_CLIP_SPECULATE, -1, 0, 0},
            {"vocab chunks of 48, overlap", 1, 1, ST_STREAM_CLIP_SPECULATE, ST_STREAM_ACT_RECOMPUTE, 48, 0},
            {"vocab chunks of 48, no overlap", 1, 0, ST_STREAM_CLIP_SPECULATE, ST_STREAM_ACT_RECOMPUTE, 48, 0},
            {"vocab in two chunks, overlap, auto", 1, 1, ST_STREAM_CLIP_AUTO, ST_STREAM_ACT_RECOMPUTE, 100, 0},
            {"vocab in one chunk, offload", 1, 1, ST_STREAM_CLIP_SPECULATE, ST_STREAM_ACT_OFFLOAD, 128, 0},
            {"bf16 drain, overlap", 1, 1, ST_STREAM_CLIP_SPECULATE, ST_STREAM_ACT_RECOMPUTE, 0, 1},
            {"bf16 drain, no overlap, chunks of 48", 1, 0, ST_STREAM_CLIP_SPECULATE, ST_STREAM_ACT_RECOMPUTE, 48, 1},
        };
        for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
            st_stream_plan plan;
            st_stream_plan_default(&plan, cfg.n_layer);
            plan.prefetch_depth = v[i].depth;
            plan.overlap_optim = v[i].overlap;
            plan.clip = (st_stream_clip)v[i].clip;
            plan.vocab_chunk = v[i].vchunk;
            plan.grad_dtype = v[i].bf16 ? ST_BF16 : ST_F32;
            if (v[i].acts >= 0) st_stream_plan_set_all(&plan, (st_stream_act)v[i].acts);
            else plan_mixed(&plan);
            run_result r;
            if (stream_train(cpu, &cfg, B, T, max_norm, &plan, budget, &r, p)) continue;
            /* bf16: against the in-memory run with the same rounding; the norm's partial
             * sums split where bf16 blocks meet fp32 embeddings, so not bit for bit */
            compare(v[i].name, v[i].bf16 ? ref16_losses : ref_losses, v[i].bf16 ? ref16_p : ref_p, &r, p, n,
                    v[i].vchunk == 0 && !v[i].bf16);
            CHECK(r.clipped > 0 && r.clipped < steps, "%s: clipping applied on %d of %d steps", v[i].name, r.clipped,
                  steps);
            if (v[i].overlap && v[i].clip == ST_STREAM_CLIP_AUTO) /* only a clipped step after an unclipped one */
                CHECK(r.rolled_back <= r.clipped && (r.clipped == 0 || r.rolled_back >= 1),
                      "%s: %d rollbacks for %d clipped steps", v[i].name, r.rolled_back, r.clipped);
            if (v[i].overlap && v[i].clip == ST_STREAM_CLIP_SPECULATE)
                CHECK(r.rolled_back == r.clipped, "%s: %d rollbacks for %d clipped steps", v[i].name, r.rolled_back,
                      r.clipped);
            /* weights move 2L - depth - 1 times per step, the embedding and head once */
            int resident = v[i].depth + 1 < cfg.n_layer ? v[i].depth + 1 : cfg.n_layer;
            size_t offl = 0;
            if (v[i].acts == ST_STREAM_ACT_OFFLOAD) {
                st_gpt2_model sh;
                st_gpt2_create_shell(&sh, &cfg, cpu, &err);
                sh.B = B;
                sh.T = T;
                offl = (size_t)(cfg.n_layer - 2) * st_gpt2_block_act_floats(&sh) * 4; /* each way */
                st_gpt2_free(&sh);
            }
            if (v[i].vchunk) { /* the classifier's logits, every chunk but the last, each way */
                size_t V = (size_t)cfg.vocab_size, vc = (size_t)v[i].vchunk, nvc = (V + vc - 1) / vc;
                size_t last2 = nvc >= 2 ? vc + (V - (nvc - 1) * vc) : V; /* stay on the device */
                offl += (size_t)B * T * (V - last2) * 4;
            }
            uint64_t want = (uint64_t)(2 * cfg.n_layer - resident) * bn * 4 + (n - (size_t)cfg.n_layer * bn) * 4 + offl;
            uint64_t want_d2h = n * 4 + offl;
            if (v[i].vchunk) {
                /* wte twice less the two chunks still resident, not wte/wpe after the update;
                 * the embedding in, the residual gradient out instead of wpe's (the targets
                 * go through the backend's own copy, uncounted) */
                size_t V = (size_t)cfg.vocab_size, C = (size_t)cfg.n_embd, vc = (size_t)v[i].vchunk;
                size_t nvc = (V + vc - 1) / vc, Nn = (size_t)B * T;
                size_t wte2 = 2 * V * C - (nvc >= 2 ? vc + (V - (nvc - 1) * vc) : V) * C;
                want = want - (V + (size_t)cfg.max_seq) * C * 4 + wte2 * 4 + Nn * C * 4;
                want_d2h = want_d2h - (size_t)cfg.max_seq * C * 4 + Nn * C * 4;
            }
            if (v[i].bf16) want_d2h -= (size_t)cfg.n_layer * bn * 2;
            CHECK(r.h2d_max == want, "%s: h2d %llu bytes per step, expected %llu", v[i].name,
                  (unsigned long long)r.h2d_max, (unsigned long long)want);
            CHECK(r.h2d_act == offl && r.d2h_act == offl, "%s: activation bytes %llu in, %llu out, expected %zu",
                  v[i].name, (unsigned long long)r.h2d_act, (unsigned long long)r.d2h_act, offl);
            CHECK(r.h2d_max - offl <= 2 * n * 4, "%s: h2d %llu bytes of weights per step > 2 x weights", v[i].name,
                  (unsigned long long)(r.h2d_max - offl));
            CHECK(r.d2h_max == want_d2h, "%s: d2h %llu bytes per step, expected %llu", v[i].name,
                  (unsigned long long)r.d2h_max, (unsigned long long)want_d2h);
            CHECK(r.peak <= r.budget, "%s: peak %zu over budget %zu", v[i].name, r.peak, r.budget);
        }
        (void)ref0_losses;
        free(ref16_losses);
        free(ref16_p);
        free(ref_p);
        free(p);
    }
    test_trace(cpu);
    test_nonfinite(cpu);
    test_store_beside(cpu);
    st_backend_free(cpu);
    for (int i = 0; i < n_arches; i++) st_arch_free(arches[i]);
    return test_finish("stream");
}
