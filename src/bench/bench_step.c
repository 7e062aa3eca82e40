/* bench_step.c - strata bench step: one GPT-2 training step (forward, backward, clip,
 * AdamW) timed, against OpenBLAS sgemm measured at the model's own matmul shapes in
 * the same run. ratio = achieved / sgemm says how much of the step is matrix products
 * at full speed, and how much is lost around them. Under --matmul bf16 the step's
 * matmuls are oneDNN's over bf16 operands, and the ceiling is oneDNN's bf16 matmul at the
 * same shapes over operands already in bf16. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/matmul_bf16.h"
#include "bench/bench.h"
#include "strata/model.h"
#include "strata/plan.h"
#include "strata/step.h"
#include "strata/optim.h"
#include "strata/tensor.h"



/* The matmuls of one training step (forward, and both backward products) with the
 * same shapes and transposes as the model makes them. */
typedef struct gemm_bench {
    st_gemm_shape shapes[32];
    int ns;
    float *A, *B, *C;
    uint16_t *A16, *B16; /* A and B in bf16, for the bf16 ceiling */
    cpu_bf16 *bf16;      /* non-NULL: the pass runs oneDNN's bf16 matmul instead of sgemm */
    double flops; /* per step */
} gemm_bench;

static void gemm_bench_init(gemm_bench *g, const st_model *m, int B, int T) {
    memset(g, 0, sizeof *g);
    g->ns = m->ops->step_gemms(m, B, T, g->shapes, 32);
    size_t maxa = 0, maxb = 0, maxc = 0;
    g->flops = 0;
    for (int i = 0; i < g->ns; i++) {
        st_gemm_shape s = g->shapes[i];
        size_t a = (size_t)s.M * s.K, b = (size_t)s.K * s.N, cc = (size_t)s.M * s.N;
        maxa = a > maxa ? a : maxa;
        maxb = b > maxb ? b : maxb;
        maxc = cc > maxc ? cc : maxc;
        g->flops += 2.0 * s.M * s.N * s.K * s.count;
    }
    g->A = st_alloc(maxa * 4);
    g->B = st_alloc(maxb * 4);
    g->C = st_alloc(maxc * 4);
    for (size_t i = 0; i < maxa; i++) g->A[i] = (float)((i * 7919) % 1000) * 1e-3f;
    for (size_t i = 0; i < maxb; i++) g->B[i] = (float)((i * 104729) % 1000) * 1e-3f;
    g->A16 = st_alloc(maxa * 2);
    g->B16 = st_alloc(maxb * 2);
    st_convert(g->A16, ST_BF16, g->A, ST_F32, maxa);
    st_convert(g->B16, ST_BF16, g->B, ST_F32, maxb);
}

/* Seconds for one step's worth of sgemm (each shape once, weighted by its count). */
static double gemm_bench_pass(gemm_bench *g) {
    double total = 0;
    for (int i = 0; i < g->ns; i++) {
        st_gemm_shape s = g->shapes[i];
        double t0 = st_now();
        if (g->bf16) { /* the same product, C +=, operands already bf16: oneDNN's kernel alone */
            st_err e = {0};
            cpu_bf16_lock(g->bf16);
            st_status st = cpu_bf16_gemm(g->bf16, s.ta, s.tb, s.M, s.N, s.K, g->A16, g->B16, NULL, 1, g->C, &e);
            cpu_bf16_unlock(g->bf16);
            if (st) fprintf(stderr, "strata bench step: %s\n", e.msg);
            total += (st_now() - t0) * s.count;
            continue;
        }
        cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, s.M, s.N, s.K,
                    1.0f, g->A, s.ta ? s.M : s.K, g->B, s.tb ? s.K : s.N, 1.0f, g->C, s.N);
        total += (st_now() - t0) * s.count;
    }
    return total;
}

static void gemm_bench_free(gemm_bench *g) {
    st_free(g->A);
    st_free(g->B);
    st_free(g->C);
    st_free(g->A16);
    st_free(g->B16);
    cpu_bf16_free(g->bf16);
}

static void usage(FILE *f) {
    fprintf(f, "usage: strata bench step [--model NAME] [--n_layer L] [--n_embd C] [--n_head H] [--vocab_size V] "
               "[--max_seq S] [--batch B] [--seq T] [--steps N] [--threads N] [--matmul M] "
               "[--act_dtype f32|bf16] [--json]\n"
               "  NAME: %s\n"
               "  Times N training steps (median; one warm-up first) of a randomly initialised model and\n"
               "  OpenBLAS sgemm at the same matmul shapes, one sgemm pass right after each step;\n"
               "  ratio is the median over steps of achieved/sgemm. FLOPs per token: %s\n"
               "  --matmul fp32 (default), bf16 or auto: the step's matmul precision (strata train's key);\n"
               "  under bf16 the ceiling is oneDNN's bf16 matmul at the same shapes (operands already bf16)\n"
               "  and weight_to_bf16_s the time to round every parameter to bf16 twice (a step's weight\n"
               "  conversions, forward and backward); step_convert_weights_s, step_convert_acts_s and\n"
               "  step_onednn_s are what the timed steps spent in them (mean a step)\n"
               "  --act_dtype f32 (default) or bf16: the activations the step keeps for the backward (strata\n"
               "  train's key); act_bytes is the memory account's figure for them (the executor's sets and\n"
               "  working buffers, plan.h's acts_stored)\n"
               "  --n_layer, --n_embd, --n_head, --vocab_size, --max_seq: the preset's shape changed (as strata train's keys)\n"
               "  forward_gflops (--json): a third of the step's FLOPs over the forward's time\n"
               "  defaults: --model gpt2-124m --batch 4 --seq 256 --steps 5\n",
            st_model_preset_names(), "6 x (matmul weights incl. the head) + 6 x L x T x NH*head_dim (causal attention)");
}

int bench_step(int argc, char **argv) {
    const char *model = "gpt2-124m";
    const char *matmul = "fp32";
    const char *act_dtype = "f32";
    int B = 4, T = 256, steps = 5, threads = 0, json = 0;
    st_model_overrides ov = {0}; /* the preset's shape changed (a proxy model's, strata data score) */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--json")) json = 1;
        else if (v && !strcmp(a, "--model")) { model = v; i++; }
        else if (v && !strcmp(a, "--batch")) { B = atoi(v); i++; }
        else if (v && !strcmp(a, "--seq")) { T = atoi(v); i++; }
        else if (v && !strcmp(a, "--steps")) { steps = atoi(v); i++; }
        else if (v && !strcmp(a, "--threads")) { threads = atoi(v); i++; }
        else if (v && !strcmp(a, "--matmul")) { matmul = v; i++; }
        else if (v && !strcmp(a, "--act_dtype")) { act_dtype = v; i++; }
        else if (v && !strcmp(a, "--n_layer")) { ov.n_layer = atoi(v); i++; }
        else if (v && !strcmp(a, "--n_embd")) { ov.n_embd = atoi(v); i++; }
        else if (v && !strcmp(a, "--n_head")) { ov.n_head = atoi(v); i++; }
        else if (v && !strcmp(a, "--vocab_size")) { ov.vocab_size = atoi(v); i++; }
        else if (v && !strcmp(a, "--max_seq")) { ov.max_seq = atoi(v); i++; }
        else { fprintf(stderr, "strata bench step: unknown or incomplete option '%s'\n", a); usage(stderr); return 2; }
    }
    if (B < 1 || T < 1 || steps < 1) { fprintf(stderr, "strata bench step: --batch, --seq, --steps must be >= 1\n"); return 2; }
    if (strcmp(act_dtype, "f32") && strcmp(act_dtype, "bf16")) {
        fprintf(stderr, "strata bench step: --act_dtype '%s' is not f32 or bf16\n", act_dtype);
        return 2;
    }
    st_dtype adt = strcmp(act_dtype, "bf16") ? ST_F32 : ST_BF16;
    st_err err = {0};
    st_backend *be = NULL;
    st_model *m = NULL;
    st_optim *opt = NULL;
    if (st_backend_cpu_create(&be, threads, &err) || st_backend_set_matmul(be, matmul, &err) ||
        st_model_create(&m, model, &ov, be, &err) ||
        m->ops->alloc_acts(m, B, T, &err)) {
        fprintf(stderr, "strata bench step: %s\n", err.msg);
        return 1;
    }
    m->ops->init_random(m, 1);
    st_optim_segment *segs = calloc((size_t)m->n_tensors, sizeof *segs);
    for (int i = 0; i < m->n_tensors; i++)
        segs[i] = (st_optim_segment){.offset = m->tensors[i].offset, .n = m->tensors[i].numel, .weight_decay = 0.1f};
    if (st_optim_create(&opt, segs, m->n_tensors, ST_OPTIM_STATE_F32, &err)) {
        fprintf(stderr, "strata bench step: %s\n", err.msg);
        return 1;
    }
    int N = B * T;
    int32_t *inp = malloc(sizeof(int32_t) * (size_t)N), *tgt = malloc(sizeof(int32_t) * (size_t)N);
    st_rng rng;
    st_rng_seed(&rng, 7);
    for (int i = 0; i < N; i++) inp[i] = (int32_t)(st_rng_u64(&rng) % (uint64_t)m->vocab_size);
    for (int i = 0; i < N; i++) tgt[i] = (int32_t)(st_rng_u64(&rng) % (uint64_t)m->vocab_size);
    double *ts = malloc(sizeof(double) * (size_t)steps), *tf = malloc(sizeof(double) * (size_t)steps),
           *tb = malloc(sizeof(double) * (size_t)steps), *to = malloc(sizeof(double) * (size_t)steps),
           *tg = malloc(sizeof(double) * (size_t)steps), *rr = malloc(sizeof(double) * (size_t)steps);
    double flops = m->ops->flops_per_token(m, T) * N;
    gemm_bench gb;
    gemm_bench_init(&gb, m, B, T);
    st_matmul_mode mode = ST_MATMUL_FP32;
    st_backend_matmul_parse(matmul, &mode, NULL);
    if (mode == ST_MATMUL_AUTO) mode = st_backend_matmul_auto("cpu", NULL, 0);
    double w16_s = 0; /* a step's weight conversions: every parameter to bf16, twice */
    if (mode == ST_MATMUL_BF16) {
        if (cpu_bf16_create(&gb.bf16, &err)) {
            fprintf(stderr, "strata bench step: %s\n", err.msg);
            return 1;
        }
        uint16_t *w16 = st_alloc(m->n_params * 2);
        for (int r = 0; r < 3 && w16; r++) {
            double t0 = st_now();
            st_convert(w16, ST_BF16, m->params, ST_F32, m->n_params);
            double t = 2 * (st_now() - t0);
            w16_s = !r || t < w16_s ? t : w16_s;
        }
        st_free(w16);
    }
    const char *ceiling = mode == ST_MATMUL_BF16 ? "onednn_bf16" : "sgemm";
    gemm_bench_pass(&gb); /* warm up */
    float loss = 0;
    st_step *step = NULL; /* strata train's step (strata/step.h) */
    if (st_step_create(&step, &(st_step_setup){.m = m, .opt = opt, .max_micro = 1, .act_dtype = adt}, &err)) {
        fprintf(stderr, "strata bench step: %s\n", err.msg);
        return 1;
    }
    /* the memory account's activations for this step (the resident executor's table) */
    double act_bytes = 0;
    st_arch *arch = NULL;
    st_mem_plan mp;
    if (st_arch_of_model(&arch, m, &err) == ST_OK &&
        st_plan_memory(&(st_mem_request){.arch = arch, .B = B, .T = T, .act_dtype = adt}, &mp, &err) == ST_OK)
        act_bytes = mp.acts_stored;
    st_arch_free(arch);
    cpu_bf16_stats st0 = {0}, st1 = {0}; /* the step's own bf16 conversions and oneDNN time, over the timed steps */
    cpu_bf16 *step_bf16 = mode == ST_MATMUL_BF16 ? cpu_backend_bf16(be) : NULL;
    for (int s = -1; s < steps; s++) {
        if (s == 0 && step_bf16) cpu_bf16_get_stats(step_bf16, &st0);
        st_step_hp hp = {.adam = {1e-4f, 0.9f, 0.95f, 1e-8f, s + 2, 1.0f}, .grad_clip = 1.0f};
        st_step_result r;
        double t0 = st_now();
        if (st_step_run(step, 1, B, T, inp, tgt, &hp, &r, &err)) {
            fprintf(stderr, "strata bench step: %s\n", err.msg);
            return 1;
        }
        double t3 = st_now(), t1 = t0 + r.forward_s, t2 = t1 + r.backward_s;
        loss = (float)r.loss;
        /* sgemm right after each step: the machine is shared, so the ratio is taken
         * pair by pair and the median of the pairs is reported */
        double g = gemm_bench_pass(&gb);
        if (s >= 0) {
            ts[s] = t3 - t0; tf[s] = t1 - t0; tb[s] = t2 - t1; to[s] = t3 - t2; tg[s] = g;
            rr[s] = (flops / ts[s]) / (gb.flops / g);
        }
        if (!json) fprintf(stderr, "  step %d: %.3f s (loss %.4f), %s pass %.3f s\n", s + 1, t3 - t0, loss, ceiling, g);
    }
    if (step_bf16) cpu_bf16_get_stats(step_bf16, &st1);
    double conv_w = (st1.convert_s[1] - st0.convert_s[1]) / steps,
           conv_a = (st1.convert_s[0] + st1.convert_s[2] + st1.convert_s[3] + st1.convert_s[4] - st0.convert_s[0] -
                     st0.convert_s[2] - st0.convert_s[3] - st0.convert_s[4]) / steps,
           in_gemm = (st1.gemm_s - st0.gemm_s) / steps;
    double step_s = bench_median(ts, steps), fwd_s = bench_median(tf, steps), bwd_s = bench_median(tb, steps), opt_s = bench_median(to, steps);
    double achieved = flops / step_s / 1e9, matmul_flops = gb.flops;
    double sgemm = gb.flops / bench_median(tg, steps) / 1e9;
    double ratio = bench_median(rr, steps);
    if (json) {
        printf("{\"bench\":\"step\",\"model\":\"%s\",\"batch\":%d,\"seq\":%d,\"params\":%zu,\"threads\":%d,"
               "\"steps\":%d,\"step_s\":%.4f,\"forward_s\":%.4f,\"backward_s\":%.4f,\"optimizer_s\":%.4f,"
               "\"tokens_per_s\":%.1f,\"flops_per_step\":%.4e,\"matmul_flops_per_step\":%.4e,"
               "\"achieved_gflops\":%.2f,\"forward_gflops\":%.2f,\"matmul\":\"%s\",\"%s_gflops\":%.2f,"
               "\"ratio\":%.3f,\"loss\":%.4f,\"act_dtype\":\"%s\",\"act_bytes\":%.0f",
               model, B, T, m->n_params, omp_get_max_threads(), steps, step_s, fwd_s, bwd_s, opt_s, N / step_s,
               flops, matmul_flops, achieved, flops / 3 / fwd_s / 1e9, st_backend_matmul_name(mode), ceiling, sgemm, ratio, loss,
               act_dtype, act_bytes);
        if (mode == ST_MATMUL_BF16)
            printf(",\"weight_to_bf16_s\":%.4f,\"step_convert_weights_s\":%.4f,\"step_convert_acts_s\":%.4f,"
                   "\"step_onednn_s\":%.4f", w16_s, conv_w, conv_a, in_gemm);
        printf("}\n");
    } else {
        printf("model %s (%zu params), batch %d x seq %d: step %.3f s (forward %.3f, backward %.3f, optimizer %.3f), "
               "%.0f tokens/s\nmatmul %s: achieved %.1f GFLOP/s, %s at the model's shapes %.1f GFLOP/s, ratio %.3f\n",
               model, m->n_params, B, T, step_s, fwd_s, bwd_s, opt_s, N / step_s, st_backend_matmul_name(mode),
               achieved, mode == ST_MATMUL_BF16 ? "oneDNN bf16" : "sgemm", sgemm, ratio);
        printf("activations %s: %.1f MB (the memory account's)\n", act_dtype, act_bytes / 1e6);
        if (mode == ST_MATMUL_BF16)
            printf("every parameter rounded to bf16 twice: %.4f s; in a step (mean): weights to bf16 %.4f s, "
                   "activations to bf16 %.4f s, oneDNN's matmuls %.4f s\n", w16_s, conv_w, conv_a, in_gemm);
    }
    free(ts); free(tf); free(tb); free(to); free(tg); free(rr);
    gemm_bench_free(&gb);
    st_step_destroy(step);
    free(inp); free(tgt); free(segs);
    st_optim_free(opt);
    st_model_free(m);
    st_backend_free(be);
    return 0;
}
