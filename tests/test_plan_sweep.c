/* test_plan_sweep.c - the planner's monotone sweep (issue 16): for gpt2-124m at batch 2 x
 * seq 256 under fixed machine profiles (hand-set, no measuring), the device budget is swept
 * geometrically from the smallest budget any plan fits (the smallest all-recompute plan's
 * stream_device_bytes; one byte less is refused) up to the whole state (the largest plan:
 * every block kept, the head resident, the deepest prefetch). At every budget plan_stream
 * (the defaults: GLPK's gap and time limit, the simple plans as incumbent) and the options
 * strata train and strata plan use must find a plan, within the budget, and the predicted
 * step time must never rise as the budget grows (1e-9 relative for float noise): with the
 * defaults everywhere; with strata train's options (prefer_resident_head) everywhere but at
 * the one budget where the head first stays resident, which the preference may make slower
 * than the chunked plan below it (printed), and the head never goes back to chunks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/model.h"
#include "strata/plan.h"
#include "testutil.h"

#define SWEEP_STEPS 40

/* The smallest and the largest device bytes of the uniform plans (every block keep, every
 * offload, every recompute) over the depths and vocabulary chunks: the smallest is the
 * smallest of any plan (checked: one byte less is refused), the largest the whole state. */
static void plan_bytes_range(const st_arch *a, int B, int T, size_t *lo, size_t *hi) {
    int L = a->lay.n_blocks, vcs[PLAN_MAX_VCHUNKS], nv = plan_vocab_chunks(a, NULL, vcs);
    int nd = PLAN_MAX_DEPTH < L ? PLAN_MAX_DEPTH : L;
    stream_config sc = {.arch = a, .B = B, .T = T};
    stream_plan *p = malloc(sizeof *p);
    *lo = (size_t)-1, *hi = 0;
    for (int v = 0; v < nv; v++)
        for (int d = 1; d <= nd; d++)
            for (int act = STREAM_ACT_KEEP; act <= STREAM_ACT_OFFLOAD; act++) {
                stream_plan_default(p, L);
                stream_plan_set_all(p, (unsigned char)act);
                p->vocab_chunk = vcs[v];
                p->prefetch_depth = d;
                size_t b = stream_device_bytes(&sc, p);
                if (b < *lo) *lo = b;
                if (b > *hi) *hi = b;
            }
    free(p);
}

/* Sweep the budget over [lo, hi] in SWEEP_STEPS geometric steps with options opt (NULL:
 * plan_stream's defaults); returns the number of distinct predicted step times.
 * to_resident: the one rise allowed, where the head first stays resident (prefer_resident_head
 * takes the resident head over a faster chunked plan); *rise: its size, relative. */
static int sweep(const st_arch *a, int B, int T, const plan_profile *hw, const plan_options *opt, const char *name,
                 int to_resident, double *rise) {
    size_t lo, hi;
    plan_bytes_range(a, B, T, &lo, &hi);
    stream_config sc = {.arch = a, .B = B, .T = T};
    stream_plan *p = malloc(sizeof *p);
    plan_prediction pr;
    st_err err = {0};
    /* the smallest budget: one byte less fits nothing */
    st_status s = plan_stream_ex(a, B, T, lo - 1, hw, opt, p, &pr, &err);
    CHECK(s == ST_ERR_NOMEM && strstr(err.msg, " 1 bytes missing"), "%s: budget %zu (one byte below the smallest "
          "plan) gave %d: %s", name, lo - 1, (int)s, err.msg);
    double prev = INFINITY, last = -1, worst_solve = 0, t_lo = 0;
    int distinct = 0, prev_vc = -1;
    *rise = 0;
    for (int i = 0; i <= SWEEP_STEPS; i++) {
        size_t budget = i == SWEEP_STEPS ? hi : (size_t)((double)lo * pow((double)hi / (double)lo, (double)i / SWEEP_STEPS));
        if (budget < lo) budget = lo;
        s = plan_stream_ex(a, B, T, budget, hw, opt, p, &pr, &err);
        CHECK(s == ST_OK, "%s: budget %zu (step %d of %d, smallest plan %zu): %s", name, budget, i, SWEEP_STEPS, lo,
              err.msg);
        if (s) continue;
        size_t got = stream_device_bytes(&sc, p);
        CHECK(got <= budget && got == pr.device_bytes, "%s: budget %zu: the plan needs %zu device bytes (predicted %zu)",
              name, budget, got, pr.device_bytes);
        if (to_resident && prev_vc > 0 && p->vocab_chunk == 0 && pr.step_s > prev) { /* the switch */
            *rise = pr.step_s / prev - 1;
            prev = pr.step_s;
        }
        /* a larger budget never gives the resident head up */
        CHECK(!to_resident || prev_vc != 0 || p->vocab_chunk == 0, "%s: budget %zu: vocab_chunk %d after a resident "
              "head", name, budget, p->vocab_chunk);
        prev_vc = p->vocab_chunk;
        CHECK(pr.step_s <= prev * (1 + 1e-9), "%s: budget %zu: predicted %.9g s, above %.9g s at the smaller budget "
              "before it (%d keep, %d offload, %d recompute, depth %d, vocab_chunk %d)", name, budget, pr.step_s, prev,
              pr.n_keep, pr.n_offload, pr.n_recompute, p->prefetch_depth, p->vocab_chunk);
        if (i == 0) t_lo = pr.step_s;
        if (pr.step_s != last) distinct++;
        last = pr.step_s;
        if (pr.step_s < prev) prev = pr.step_s;
        if (pr.solve_s > worst_solve) worst_solve = pr.solve_s;
    }
    printf("%s: budgets %zu..%zu bytes in %d geometric steps: predicted %.4f s .. %.4f s, %d distinct, slowest solve "
           "%.3f s", name, lo, hi, SWEEP_STEPS, t_lo, last, distinct, worst_solve);
    if (to_resident) printf(", rise where the head turns resident %.2f%%", 100 * *rise);
    printf("\n");
    free(p);
    return distinct;
}

int main(void) {
    st_err err = {0};
    gpt2_config cfg;
    st_arch *a = NULL;
    if (gpt2_config_preset("gpt2-124m", &cfg, &err) || st_arch_gpt2(&a, &cfg, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const int B = 2, T = 256;
    /* the CPU backend: the "device" is the host's cores, so host work slows compute */
    plan_profile cpu = {.version = PLAN_PROFILE_VERSION, .sgemm_flops = 60e9, .h2d_bytes_per_s = 6e9,
                        .d2h_bytes_per_s = 5e9, .mem_bytes_per_s = 8e9, .optim_ns_per_param = 1.0,
                        .block_fwd_flops = 40e9, .block_bwd_flops = 35e9, .head_flops = 45e9,
                        .host_work_slowdown = 0.5};
    /* an accelerator behind a PCIe link: copies dominate, recompute is cheap */
    plan_profile gpu = {.version = PLAN_PROFILE_VERSION, .sgemm_flops = 50e12, .h2d_bytes_per_s = 20e9,
                        .d2h_bytes_per_s = 20e9, .mem_bytes_per_s = 10e9, .optim_ns_per_param = 0.5,
                        .block_fwd_flops = 30e12, .block_bwd_flops = 30e12, .head_flops = 30e12};
    stream_plan *p = malloc(sizeof *p);
    plan_prediction pr;
    if (plan_stream(a, B, T, (size_t)1 << 34, &cpu, p, &pr, &err) == ST_ERR_UNSUPPORTED) {
        printf("skip: %s\n", err.msg);
        free(p);
        st_arch_free(a);
        return 77;
    }
    free(p);
    /* as strata train and strata plan call it: the head resident whenever a plan with it fits */
    plan_options train = {.mip_gap = -1, .allow_vocab_chunk = 1, .prefer_resident_head = 1};
    const plan_profile *hws[2] = {&cpu, &gpu};
    const char *names[2] = {"CPU profile", "accelerator profile"};
    for (int h = 0; h < 2; h++) {
        char name[128];
        snprintf(name, sizeof name, "gpt2-124m B2 T256, %s, defaults", names[h]);
        double rise;
        int d = sweep(a, B, T, hws[h], NULL, name, 0, &rise);
        /* the sweep means something only if the budget changes the answer */
        CHECK(d >= 3, "%s: only %d distinct predicted times over the sweep", name, d);
        snprintf(name, sizeof name, "gpt2-124m B2 T256, %s, strata train's options", names[h]);
        sweep(a, B, T, hws[h], &train, name, 1, &rise);
    }
    st_arch_free(a);
    return test_finish("plan_sweep");
}
