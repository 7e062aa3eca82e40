/* bench_optim.c - strata bench optim: the AdamW engine's speed against the memory ceiling.
 *
 * The step is memory-bound, so the figure of merit is bandwidth: bytes the step must read
 * and write per parameter, times parameters per second, over a ceiling measured in the same
 * run by a kernel that moves the same arrays (same sizes, chunks, threads, vector width)
 * with no arithmetic. Engine and ceiling alternate, and medians are reported, because the
 * machines are shared.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "strata/optim.h"

static const char *bench_optim_usage =
    "usage: strata bench optim [options] [--json]\n"
    "  --params N       parameters, e.g. 100M (default 100M)\n"
    "  --states F       optimizer state format: f32 | 8bit | 8bit-fp (8-bit, float map) (default f32)\n"
    "  --grad D         gradient dtype read by the pass: f32 | bf16 | f16 (default bf16)\n"
    "  --work D         working copy written by the pass: bf16 | f16 | f32 | none (default bf16)\n"
    "  --steps N        timed repetitions of step and ceiling, medians reported (default 7)\n"
    "  --isa I          kernels: auto | portable | avx2 | avx512 | avx512bf16 (default auto)\n"
    "  --json           print one JSON object\n"
    "Reports params_per_s, bytes_per_param (read + written by one step), gbps, ceiling_gbps\n"
    "(same arrays moved with no arithmetic), ratio = gbps / ceiling_gbps, host state bytes per\n"
    "parameter (master weights + moments), and the gradient-norm pass's bandwidth.\n";

static int parse_dtype(const char *s, int *out, int allow_none) {
    if (!strcmp(s, "f32")) *out = ST_F32;
    else if (!strcmp(s, "bf16")) *out = ST_BF16;
    else if (!strcmp(s, "f16")) *out = ST_F16;
    else if (allow_none && !strcmp(s, "none")) *out = -1;
    else return -1;
    return 0;
}

static const char *dtype_arg(int d) { return d == ST_F32 ? "f32" : d == ST_BF16 ? "bf16" : d == ST_F16 ? "f16" : "none"; }


int bench_optim(int argc, char **argv) {
    double nparams = 100e6;
    int states = ST_OPTIM_STATE_F32, gdt = ST_BF16, wdt = ST_BF16, steps = 7, json = 0;
    st_optim_isa isa = ST_OPTIM_ISA_AUTO;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(bench_optim_usage, stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!v) {
            fprintf(stderr, "strata bench optim: %s needs a value\n%s", a, bench_optim_usage);
            return 2;
        } else if (!strcmp(a, "--params")) {
            nparams = st_parse_count(v);
            if (nparams < 1) { fprintf(stderr, "strata bench optim: --params '%s' is not a count (e.g. 100M)\n", v); return 2; }
            i++;
        } else if (!strcmp(a, "--states")) {
            if (!strcmp(v, "f32")) states = ST_OPTIM_STATE_F32;
            else if (!strcmp(v, "8bit")) states = ST_OPTIM_STATE_8BIT;
            else if (!strcmp(v, "8bit-fp")) states = ST_OPTIM_STATE_8BIT_FP;
            else { fprintf(stderr, "strata bench optim: --states '%s': use f32, 8bit or 8bit-fp\n", v); return 2; }
            i++;
        } else if (!strcmp(a, "--grad")) {
            if (parse_dtype(v, &gdt, 0)) { fprintf(stderr, "strata bench optim: --grad '%s': use f32, bf16 or f16\n", v); return 2; }
            i++;
        } else if (!strcmp(a, "--work")) {
            if (parse_dtype(v, &wdt, 1)) { fprintf(stderr, "strata bench optim: --work '%s': use bf16, f16, f32 or none\n", v); return 2; }
            i++;
        } else if (!strcmp(a, "--steps")) {
            steps = atoi(v);
            if (steps < 1 || steps > 1000) { fprintf(stderr, "strata bench optim: --steps '%s': use 1..1000\n", v); return 2; }
            i++;
        } else if (!strcmp(a, "--isa")) {
            if (!strcmp(v, "auto")) isa = ST_OPTIM_ISA_AUTO;
            else if (!strcmp(v, "portable")) isa = ST_OPTIM_ISA_PORTABLE;
            else if (!strcmp(v, "avx2")) isa = ST_OPTIM_ISA_AVX2;
            else if (!strcmp(v, "avx512")) isa = ST_OPTIM_ISA_AVX512;
            else if (!strcmp(v, "avx512bf16")) isa = ST_OPTIM_ISA_AVX512_BF16;
            else { fprintf(stderr, "strata bench optim: --isa '%s': use auto, portable, avx2, avx512 or avx512bf16\n", v); return 2; }
            i++;
        } else {
            fprintf(stderr, "strata bench optim: unknown option '%s'\n%s", a, bench_optim_usage);
            return 2;
        }
    }

    size_t n = (size_t)nparams;
    st_err err = {0};
    st_optim *o;
    st_optim_segment seg = {.offset = 0, .n = n, .weight_decay = 0.1f};
    if (st_optim_create(&o, &seg, 1, (st_optim_state_format)states, &err) != ST_OK ||
        st_optim_set_isa(o, isa, &err) != ST_OK) {
        fprintf(stderr, "strata bench optim: %s\n", err.msg);
        st_optim_free(o);
        return 1;
    }
    size_t gs = st_dtype_size((st_dtype)gdt), ws = wdt < 0 ? 0 : st_dtype_size((st_dtype)wdt);
    float *p = st_alloc(n * 4);
    void *g = st_alloc(n * gs), *w = ws ? st_alloc(n * ws) : NULL;
    if (!p || !g || (ws && !w)) {
        fprintf(stderr, "strata bench optim: cannot allocate %.2f GB of parameters and gradients; use fewer --params\n",
                (double)n * (4 + gs + ws) / 1e9);
        st_free(p); st_free(g); st_free(w); st_optim_free(o);
        return 1;
    }
    long nn = (long)n;
#pragma omp parallel for schedule(static)
    for (long i = 0; i < nn; i++) {
        p[i] = bench_hash_unit((uint64_t)i);
        float x = 1e-3f * bench_hash_unit((uint64_t)i + 0x9e3779b97f4a7c15ULL);
        if (gdt == ST_BF16) ((uint16_t *)g)[i] = st_f32_to_bf16(x);
        else if (gdt == ST_F16) ((uint16_t *)g)[i] = st_f32_to_f16(x);
        else ((float *)g)[i] = x;
    }
    st_optim_step_args a = {.params = p, .grads = g, .grad_dtype = (st_dtype)gdt, .work = w,
                         .work_dtype = ws ? (st_dtype)wdt : ST_F32, .grad_sumsq = 1.0};
    st_adamw_params hp = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = 1, .grad_scale = 1.0f};
    /* warm up: first touch of every page of state, the working copy and the ceiling's code */
    st_optim_step_ex(o, &a, &hp, &err);
    st_optim_bench_ceiling(o, &a);
    double *ts = malloc(sizeof(double) * (size_t)steps * 3), *tc = ts + steps, *tn = tc + steps;
    for (int s = 0; s < steps; s++) {
        hp.step = s + 2;
        double t0 = st_now();
        if (st_optim_step_ex(o, &a, &hp, &err) != ST_OK) {
            fprintf(stderr, "strata bench optim: %s\n", err.msg);
            return 1;
        }
        double t1 = st_now();
        st_optim_bench_ceiling(o, &a);
        double t2 = st_now();
        volatile double ss = st_optim_grad_sumsq(g, (st_dtype)gdt, n);
        (void)ss;
        double t3 = st_now();
        ts[s] = t1 - t0;
        tc[s] = t2 - t1;
        tn[s] = t3 - t2;
    }
    double t_step = bench_median(ts, steps), t_ceil = bench_median(tc, steps), t_norm = bench_median(tn, steps);
    double bpp = st_optim_step_bytes_per_param(o, (st_dtype)gdt, ws ? wdt : -1);
    double pps = (double)n / t_step, gbps = pps * bpp / 1e9, ceil_gbps = (double)n * bpp / t_ceil / 1e9;
    double state_bpp = 4.0 + st_optim_state_bytes_per_param(o), norm_gbps = (double)n * (double)gs / t_norm / 1e9;
    const char *sname = states == ST_OPTIM_STATE_F32 ? "f32" : states == ST_OPTIM_STATE_8BIT ? "8bit" : "8bit-fp";
    if (json) {
        printf("{\"bench\": \"optim\", \"params\": %zu, \"states\": \"%s\", \"grad\": \"%s\", \"work\": \"%s\", "
               "\"isa\": \"%s\", \"threads\": %d, \"steps\": %d, \"step_s\": %.6f, \"ceiling_s\": %.6f, "
               "\"params_per_s\": %.4g, \"bytes_per_param\": %.4f, \"gbps\": %.3f, \"ceiling_gbps\": %.3f, "
               "\"ratio\": %.4f, \"state_bytes_per_param\": %.4f, \"gradnorm_gbps\": %.3f}\n",
               n, sname, dtype_arg(gdt), dtype_arg(wdt), st_optim_isa_name(st_optim_get_isa(o)), omp_get_max_threads(),
               steps, t_step, t_ceil, pps, bpp, gbps, ceil_gbps, gbps / ceil_gbps, state_bpp, norm_gbps);
    } else {
        printf("optimizer step: %zu params, %s states, %s grads, %s working copy, %s kernels, %d threads\n", n, sname,
               dtype_arg(gdt), dtype_arg(wdt), st_optim_isa_name(st_optim_get_isa(o)), omp_get_max_threads());
        printf("  step      %.2f ms (median of %d)  %.3g params/s  %.2f bytes/param  %.2f GB/s\n", t_step * 1e3, steps,
               pps, bpp, gbps);
        printf("  ceiling   %.2f ms  %.2f GB/s  -> ratio %.3f\n", t_ceil * 1e3, ceil_gbps, gbps / ceil_gbps);
        printf("  state     %.3f host bytes/param (master weights + moments)\n", state_bpp);
        printf("  grad norm %.2f GB/s\n", norm_gbps);
    }
    free(ts);
    st_free(p);
    st_free(g);
    st_free(w);
    st_optim_free(o);
    return 0;
}
