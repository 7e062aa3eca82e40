/* bench_step.c - strata bench step: one GPT-2 training step (forward, backward, clip,
 * AdamW) timed, against OpenBLAS sgemm measured at the model's own matmul shapes in
 * the same run. ratio = achieved / sgemm says how much of the step is matrix products
 * at full speed, and how much is lost around them. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "strata/model.h"
#include "strata/optim.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* One sgemm shape of a training step: C(M,N) = op(A) op(B) with K the inner size,
 * `count` times per step. */
typedef struct gemm_shape { int M, N, K, ta, tb, count; } gemm_shape;

/* Times every matmul a step makes (forward, and both backward products), with the
 * same transposes, and returns total FLOPs / total seconds, median of `reps`. */
static double measure_sgemm(const gpt2_config *c, int B, int T, int reps, double *matmul_flops) {
    int N = B * T, C = c->n_embd, V = c->vocab_size, L = c->n_layer;
    gemm_shape shapes[] = {
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
    int ns = sizeof shapes / sizeof shapes[0];
    size_t maxa = 0, maxb = 0, maxc = 0;
    for (int i = 0; i < ns; i++) {
        size_t a = (size_t)shapes[i].M * shapes[i].K, b = (size_t)shapes[i].K * shapes[i].N,
               cc = (size_t)shapes[i].M * shapes[i].N;
        maxa = a > maxa ? a : maxa;
        maxb = b > maxb ? b : maxb;
        maxc = cc > maxc ? cc : maxc;
    }
    float *A = st_alloc(maxa * 4), *Bm = st_alloc(maxb * 4), *Cm = st_alloc(maxc * 4);
    for (size_t i = 0; i < maxa; i++) A[i] = (float)((i * 7919) % 1000) * 1e-3f;
    for (size_t i = 0; i < maxb; i++) Bm[i] = (float)((i * 104729) % 1000) * 1e-3f;
    double flops = 0;
    for (int i = 0; i < ns; i++) flops += 2.0 * shapes[i].M * shapes[i].N * shapes[i].K * shapes[i].count;
    *matmul_flops = flops;
    double *t = malloc(sizeof(double) * (size_t)reps);
    for (int r = -1; r < reps; r++) { /* r = -1 warms up */
        double total = 0;
        for (int i = 0; i < ns; i++) {
            gemm_shape g = shapes[i];
            double t0 = st_now();
            cblas_sgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans, g.tb ? CblasTrans : CblasNoTrans, g.M, g.N,
                        g.K, 1.0f, A, g.ta ? g.M : g.K, Bm, g.tb ? g.K : g.N, 1.0f, Cm, g.N);
            total += (st_now() - t0) * g.count;
        }
        if (r >= 0) t[r] = total;
    }
    double med = median(t, reps);
    free(t);
    st_free(A);
    st_free(Bm);
    st_free(Cm);
    return flops / med / 1e9;
}

static void usage(FILE *f) {
    fprintf(f, "usage: strata bench step [--model NAME] [--batch B] [--seq T] [--steps N] [--threads N] [--json]\n"
               "  Times N training steps (median; one warm-up first) of a randomly initialised model and\n"
               "  OpenBLAS sgemm at the same matmul shapes. FLOPs per token: %s\n"
               "  defaults: --model gpt2-124m --batch 4 --seq 256 --steps 5\n",
            "6*(L*12*C^2 + V*C) + 6*L*T*C");
}

int bench_step(int argc, char **argv) {
    const char *model = "gpt2-124m";
    int B = 4, T = 256, steps = 5, threads = 0, json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--json")) json = 1;
        else if (v && !strcmp(a, "--model")) { model = v; i++; }
        else if (v && !strcmp(a, "--batch")) { B = atoi(v); i++; }
        else if (v && !strcmp(a, "--seq")) { T = atoi(v); i++; }
        else if (v && !strcmp(a, "--steps")) { steps = atoi(v); i++; }
        else if (v && !strcmp(a, "--threads")) { threads = atoi(v); i++; }
        else { fprintf(stderr, "strata bench step: unknown or incomplete option '%s'\n", a); usage(stderr); return 2; }
    }
    if (B < 1 || T < 1 || steps < 1) { fprintf(stderr, "strata bench step: --batch, --seq, --steps must be >= 1\n"); return 2; }
    st_err err = {0};
    gpt2_config cfg;
    st_backend *be = NULL;
    gpt2_model m = {0};
    optim *opt = NULL;
    if (gpt2_config_preset(model, &cfg, &err) || st_backend_cpu_create(&be, threads, &err) ||
        gpt2_create(&m, &cfg, be, &err) || gpt2_alloc_acts(&m, B, T, &err)) {
        fprintf(stderr, "strata bench step: %s\n", err.msg);
        return 1;
    }
    gpt2_init_random(&m, 1);
    optim_segment *segs = calloc((size_t)m.n_tensors, sizeof *segs);
    for (int i = 0; i < m.n_tensors; i++) segs[i] = (optim_segment){m.tensors[i].offset, m.tensors[i].numel, 0.1f};
    if (optim_create(&opt, segs, m.n_tensors, OPTIM_STATE_F32, &err)) {
        fprintf(stderr, "strata bench step: %s\n", err.msg);
        return 1;
    }
    int N = B * T;
    int32_t *inp = malloc(sizeof(int32_t) * (size_t)N), *tgt = malloc(sizeof(int32_t) * (size_t)N);
    st_rng rng;
    st_rng_seed(&rng, 7);
    for (int i = 0; i < N; i++) { inp[i] = (int32_t)(st_rng_u64(&rng) % (uint64_t)cfg.vocab_size); }
    for (int i = 0; i < N; i++) { tgt[i] = (int32_t)(st_rng_u64(&rng) % (uint64_t)cfg.vocab_size); }
    double *ts = malloc(sizeof(double) * (size_t)steps), *tf = malloc(sizeof(double) * (size_t)steps),
           *tb = malloc(sizeof(double) * (size_t)steps), *to = malloc(sizeof(double) * (size_t)steps);
    float loss = 0;
    for (int s = -1; s < steps; s++) {
        double t0 = st_now();
        gpt2_zero_grad(&m);
        loss = gpt2_forward(&m, inp, tgt, 1.0f / N);
        double t1 = st_now();
        gpt2_backward(&m);
        double t2 = st_now();
        double norm = sqrt(optim_grad_sumsq_f32(m.grads, m.n_params));
        adamw_params hp = {1e-4f, 0.9f, 0.95f, 1e-8f, s + 2, norm > 1.0 ? (float)(1.0 / norm) : 1.0f};
        optim_step(opt, m.params, m.grads, &hp);
        double t3 = st_now();
        if (s >= 0) { ts[s] = t3 - t0; tf[s] = t1 - t0; tb[s] = t2 - t1; to[s] = t3 - t2; }
        if (!json) fprintf(stderr, "  step %d: %.3f s (loss %.4f)\n", s + 1, t3 - t0, loss);
    }
    double step_s = median(ts, steps), fwd_s = median(tf, steps), bwd_s = median(tb, steps), opt_s = median(to, steps);
    double flops = gpt2_flops_per_token(&cfg, T) * N;
    double achieved = flops / step_s / 1e9, matmul_flops;
    double sgemm = measure_sgemm(&cfg, B, T, 3, &matmul_flops);
    double ratio = achieved / sgemm;
    if (json) {
        printf("{\"bench\":\"step\",\"model\":\"%s\",\"batch\":%d,\"seq\":%d,\"params\":%zu,\"threads\":%d,"
               "\"steps\":%d,\"step_s\":%.4f,\"forward_s\":%.4f,\"backward_s\":%.4f,\"optimizer_s\":%.4f,"
               "\"tokens_per_s\":%.1f,\"flops_per_step\":%.4e,\"matmul_flops_per_step\":%.4e,"
               "\"achieved_gflops\":%.2f,\"sgemm_gflops\":%.2f,\"ratio\":%.3f,\"loss\":%.4f}\n",
               model, B, T, m.n_params, omp_get_max_threads(), steps, step_s, fwd_s, bwd_s, opt_s, N / step_s,
               flops, matmul_flops, achieved, sgemm, ratio, loss);
    } else {
        printf("model %s (%zu params), batch %d x seq %d: step %.3f s (forward %.3f, backward %.3f, optimizer %.3f), "
               "%.0f tokens/s\nachieved %.1f GFLOP/s, sgemm at the model's shapes %.1f GFLOP/s, ratio %.3f\n",
               model, m.n_params, B, T, step_s, fwd_s, bwd_s, opt_s, N / step_s, achieved, sgemm, ratio);
    }
    free(ts); free(tf); free(tb); free(to);
    free(inp); free(tgt); free(segs);
    optim_free(opt);
    gpt2_free(&m);
    st_backend_free(be);
    return 0;
}
