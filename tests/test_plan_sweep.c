/* test_plan_sweep.c - the planner's monotone sweep (issue 16): for gpt2-124m at batch 2 x
 * seq 256 under fixed machine profiles (hand-set, no measuring), the device budget is swept
 * geometrically from the smallest budget any plan fits (the smallest all-recompute plan's
 * st_stream_device_bytes; one byte less is refused) up to the whole state (the largest plan:
 * every block kept, the head resident, the deepest prefetch). At every budget st_plan_stream
 * (the defaults: GLPK's gap and time limit, the simple plans as incumbent) and the options
 * strata train and strata plan use must find a plan, within the budget, and the predicted
 * step time must never rise as the budget grows (1e-9 relative for float noise), with no
 * exception: with the defaults, and with the head resident on ties
 * (ST_PLAN_HEAD_RESIDENT_ON_TIE, whose plans must also be no slower than the defaults' and
 * chunk the head only where a resident one does not fit or is slower). With strata train's
 * options (ST_PLAN_HEAD_RESIDENT_IF_FITS: the head resident whenever it fits, for bit-exact
 * runs) everywhere but at the one budget where the head first stays resident, which that
 * preference may make slower than the chunked plan below it (printed), and the head never
 * goes back to chunks. And at bench plan's gpt2-124m-rule-recomputes budget (the rule
 * recomputes every block, every block could offload) the planner is predicted at least 1.1x
 * faster than the rule on the CPU-like profile. */
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
    int L = a->lay.n_blocks, vcs[ST_PLAN_MAX_VCHUNKS], nv = st_plan_vocab_chunks(a, NULL, vcs);
    int nd = ST_PLAN_MAX_DEPTH < L ? ST_PLAN_MAX_DEPTH : L;
    st_stream_config sc = {.arch = a, .B = B, .T = T};
    st_stream_plan *p = malloc(sizeof *p);
    *lo = (size_t)-1, *hi = 0;
    for (int v = 0; v < nv; v++)
        for (int d = 1; d <= nd; d++)
            for (int act = ST_STREAM_ACT_KEEP; act <= ST_STREAM_ACT_OFFLOAD; act++) {
                st_stream_plan_default(p, L);
                st_stream_plan_set_all(p, (unsigned char)act);
                p->vocab_chunk = vcs[v];
                p->prefetch_depth = d;
                size_t b = st_stream_device_bytes(&sc, p);
                if (b < *lo) *lo = b;
                if (b > *hi) *hi = b;
            }
    free(p);
}

/* The fixed rule's plan (strata train without the planner: the head resident, then in
 * ST_PLAN_RULE_VOCAB_CHUNK-row chunks; every block keep, then offload, then recompute: the first
 * that fits); 0 when none fits. */
static int rule_plan(const st_stream_config *sc, size_t budget, st_stream_plan *p) {
    static const st_stream_act order[] = {ST_STREAM_ACT_KEEP, ST_STREAM_ACT_OFFLOAD, ST_STREAM_ACT_RECOMPUTE};
    st_stream_plan_default(p, sc->arch->lay.n_blocks);
    for (int chunk = 0; chunk < 2; chunk++) {
        p->vocab_chunk = chunk ? ST_PLAN_RULE_VOCAB_CHUNK : 0;
        for (int a = 0; a < 3; a++) {
            st_stream_plan_set_all(p, order[a]);
            if (st_stream_device_bytes(sc, p) <= budget) return 1;
        }
    }
    return 0;
}

/* Sweep the budget over [lo, hi] in SWEEP_STEPS geometric steps with options opt (NULL:
 * st_plan_stream's defaults); returns the number of distinct predicted step times. At every
 * budget the predicted step time must not rise (1e-9 relative: float noise), except, with
 * ST_PLAN_HEAD_RESIDENT_IF_FITS, once where the head first stays resident (*rise: its size,
 * relative). With ST_PLAN_HEAD_RESIDENT_ON_TIE, each plan is also held against the defaults'
 * at that budget (never slower) and, where it chunks the vocabulary, against the fastest
 * resident-head plan (none fits, or it is predicted slower than ST_PLAN_RESIDENT_TIE allows).
 * With every option set, where the fixed rule finds a plan, the planner's is predicted no
 * slower than the rule's. */
static int sweep(const st_arch *a, int B, int T, const st_plan_profile *hw, const st_plan_options *opt, const char *name,
                 double *rise) {
    size_t lo, hi;
    plan_bytes_range(a, B, T, &lo, &hi);
    st_stream_config sc = {.arch = a, .B = B, .T = T};
    st_stream_plan *p = malloc(sizeof *p), *q = malloc(sizeof *q);
    st_plan_prediction pr, qr;
    st_err err = {0}, qerr = {0};
    int prefer = opt && opt->prefer_resident_head == ST_PLAN_HEAD_RESIDENT_ON_TIE;
    int if_fits = opt && opt->prefer_resident_head == ST_PLAN_HEAD_RESIDENT_IF_FITS, prev_vc = -1;
    *rise = 0;
    st_plan_options res = {0};
    if (opt) res = *opt;
    res.allow_vocab_chunk = 0;
    res.prefer_resident_head = 0;
    /* the smallest budget: one byte less fits nothing */
    st_status s = st_plan_stream_ex(a, B, T, lo - 1, hw, opt, p, &pr, &err);
    CHECK(s == ST_ERR_NOMEM && strstr(err.msg, " 1 bytes missing"), "%s: budget %zu (one byte below the smallest "
          "plan) gave %d: %s", name, lo - 1, (int)s, err.msg);
    double prev = INFINITY, last = -1, worst_solve = 0, t_lo = 0, best_vs_rule = 0, worst_vs_rule = INFINITY;
    int distinct = 0, n_res = 0, n_chunk = 0, n_res_fits = 0;
    for (int i = 0; i <= SWEEP_STEPS; i++) {
        size_t budget = i == SWEEP_STEPS ? hi : (size_t)((double)lo * pow((double)hi / (double)lo, (double)i / SWEEP_STEPS));
        if (budget < lo) budget = lo;
        s = st_plan_stream_ex(a, B, T, budget, hw, opt, p, &pr, &err);
        CHECK(s == ST_OK, "%s: budget %zu (step %d of %d, smallest plan %zu): %s", name, budget, i, SWEEP_STEPS, lo,
              err.msg);
        if (s) continue;
        size_t got = st_stream_device_bytes(&sc, p);
        CHECK(got <= budget && got == pr.device_bytes, "%s: budget %zu: the plan needs %zu device bytes (predicted %zu)",
              name, budget, got, pr.device_bytes);
        if (if_fits && prev_vc > 0 && p->vocab_chunk == 0 && pr.step_s > prev) { /* the switch */
            *rise = pr.step_s / prev - 1;
            prev = pr.step_s;
        }
        /* a larger budget never gives the resident head up */
        CHECK(!if_fits || prev_vc != 0 || p->vocab_chunk == 0, "%s: budget %zu: vocab_chunk %d after a resident "
              "head", name, budget, p->vocab_chunk);
        prev_vc = p->vocab_chunk;
        CHECK(pr.step_s <= prev * (1 + 1e-9), "%s: budget %zu: predicted %.9g s, above %.9g s at the smaller budget "
              "before it (%d keep, %d offload, %d recompute, depth %d, vocab_chunk %d)", name, budget, pr.step_s, prev,
              pr.n_keep, pr.n_offload, pr.n_recompute, p->prefetch_depth, p->vocab_chunk);
        st_plan_prediction rr;
        if (rule_plan(&sc, budget, q) && st_plan_predict(a, B, T, hw, q, &rr, &qerr) == ST_OK) {
            CHECK(pr.step_s <= rr.step_s * (1 + 1e-9), "%s: budget %zu: predicted %.9g s (vocab_chunk %d), the fixed "
                  "rule's plan %.9g s (vocab_chunk %d, %d recompute)", name, budget, pr.step_s, p->vocab_chunk,
                  rr.step_s, q->vocab_chunk, rr.n_recompute);
            if (rr.step_s / pr.step_s > best_vs_rule) best_vs_rule = rr.step_s / pr.step_s;
            if (rr.step_s / pr.step_s < worst_vs_rule) worst_vs_rule = rr.step_s / pr.step_s;
        }
        if (prefer) {
            n_res += p->vocab_chunk == 0;
            n_chunk += p->vocab_chunk != 0;
            /* the preference costs no predicted time: the defaults' plan is no faster */
            st_status ds = st_plan_stream_ex(a, B, T, budget, hw, NULL, q, &qr, &qerr);
            CHECK(ds == ST_OK && pr.step_s <= qr.step_s * (1 + 1e-9), "%s: budget %zu: predicted %.9g s (vocab_chunk "
                  "%d), the defaults' plan %.9g s (vocab_chunk %d): %s", name, budget, pr.step_s, p->vocab_chunk,
                  qr.step_s, q->vocab_chunk, ds ? qerr.msg : "slower");
            /* and the head is chunked only where the resident head does not fit or is slower */
            st_status rs = st_plan_stream_ex(a, B, T, budget, hw, &res, q, &qr, &qerr);
            CHECK(rs == ST_OK || rs == ST_ERR_NOMEM, "%s: budget %zu: the resident head: %s", name, budget, qerr.msg);
            n_res_fits += rs == ST_OK;
            if (p->vocab_chunk && rs == ST_OK)
                CHECK(qr.step_s > pr.step_s * (1 + ST_PLAN_RESIDENT_TIE), "%s: budget %zu: vocab_chunk %d predicted "
                      "%.9g s, but the resident head fits and is predicted %.9g s", name, budget, p->vocab_chunk,
                      pr.step_s, qr.step_s);
        }
        if (i == 0) t_lo = pr.step_s;
        if (pr.step_s != last) distinct++;
        last = pr.step_s;
        if (pr.step_s < prev) prev = pr.step_s;
        if (pr.solve_s > worst_solve) worst_solve = pr.solve_s;
    }
    printf("%s: budgets %zu..%zu bytes in %d geometric steps: predicted %.4f s .. %.4f s, %d distinct, slowest solve "
           "%.3f s, the rule's predicted time / the plan's %.4f .. %.4f", name, lo, hi, SWEEP_STEPS, t_lo, last,
           distinct, worst_solve, worst_vs_rule, best_vs_rule);
    if (prefer)
        printf("; the head resident in %d plans, chunked in %d (a resident head fits at %d budgets)", n_res, n_chunk,
               n_res_fits);
    if (if_fits) printf(", rise where the head turns resident %.2f%%", 100 * *rise);
    printf("\n");
    free(p);
    free(q);
    return distinct;
}

/* bench plan's gpt2-124m-rule-recomputes budget (src/bench/bench_plan.c), computed again here:
 * halfway between the smallest all-offload plan over the planner's vocabulary chunks (depth 1)
 * and the smallest budget at which the fixed rule keeps or offloads. There the rule must
 * recompute every block, and the planner (options opt) must be predicted at least 1.1x faster
 * than the rule's plan (issue 16: "the planned run is at least 1.1 x faster than the rule"). */
static void rule_recomputes_budget(const st_arch *a, int B, int T, const st_plan_profile *hw, const st_plan_options *opt,
                                   const char *name) {
    int L = a->lay.n_blocks, vcs[ST_PLAN_MAX_VCHUNKS], nv = st_plan_vocab_chunks(a, opt, vcs);
    st_stream_config sc = {.arch = a, .B = B, .T = T};
    st_stream_plan *p = malloc(sizeof *p), *q = malloc(sizeof *q);
    size_t lo = (size_t)-1, hi = (size_t)-1;
    st_stream_plan_default(p, L);
    st_stream_plan_set_all(p, ST_STREAM_ACT_OFFLOAD);
    for (int v = 0; v < nv; v++) {
        p->vocab_chunk = vcs[v];
        size_t b = st_stream_device_bytes(&sc, p);
        if (b < lo) lo = b;
    }
    static const st_stream_act no_recompute[2] = {ST_STREAM_ACT_KEEP, ST_STREAM_ACT_OFFLOAD};
    for (int chunk = 0; chunk < 2; chunk++)
        for (int k = 0; k < 2; k++) {
            st_stream_plan_default(p, L);
            st_stream_plan_set_all(p, no_recompute[k]);
            p->vocab_chunk = chunk ? ST_PLAN_RULE_VOCAB_CHUNK : 0;
            size_t b = st_stream_device_bytes(&sc, p);
            if (b < hi) hi = b;
        }
    CHECK(hi > lo + 1, "%s: no budget where the rule recomputes and every block can offload (all-offload from %zu "
          "bytes, the rule keeps or offloads from %zu)", name, lo, hi);
    size_t budget = lo + (hi - lo) / 2;
    st_plan_prediction pr, rr;
    st_err err = {0};
    int rule_rc = 0;
    CHECK(rule_plan(&sc, budget, q), "%s: budget %zu: the rule finds no plan", name, budget);
    for (int l = 0; l < q->n_layer; l++) rule_rc += q->act[l] == ST_STREAM_ACT_RECOMPUTE;
    CHECK(rule_rc == L, "%s: budget %zu: the rule recomputes %d of %d blocks", name, budget, rule_rc, L);
    st_status s = st_plan_stream_ex(a, B, T, budget, hw, opt, p, &pr, &err);
    CHECK(s == ST_OK, "%s: budget %zu: %s", name, budget, err.msg);
    st_status rs = st_plan_predict(a, B, T, hw, q, &rr, &err);
    CHECK(rs == ST_OK, "%s: budget %zu: the rule's plan: %s", name, budget, err.msg);
    if (!s && !rs) {
        CHECK(rr.step_s >= 1.1 * pr.step_s, "%s: budget %zu: the rule's plan predicted %.4f s, the planner's %.4f s "
              "(%d keep, %d offload, %d recompute, vocab_chunk %d): rule / plan %.3f, below 1.1", name, budget,
              rr.step_s, pr.step_s, pr.n_keep, pr.n_offload, pr.n_recompute, p->vocab_chunk, rr.step_s / pr.step_s);
        printf("%s: budget %zu bytes (every block offloads from %zu, the rule keeps or offloads from %zu): the rule "
               "recomputes all %d blocks, predicted %.4f s; the planner %d keep, %d offload, %d recompute, vocab_chunk "
               "%d, predicted %.4f s: rule / plan %.3f\n", name, budget, lo, hi, L, rr.step_s, pr.n_keep,
               pr.n_offload, pr.n_recompute, p->vocab_chunk, pr.step_s, rr.step_s / pr.step_s);
    }
    free(p);
    free(q);
}

int main(void) {
    st_err err = {0};
    st_gpt2_config cfg;
    st_arch *a = NULL;
    if (st_gpt2_config_preset("gpt2-124m", &cfg, &err) || st_arch_gpt2(&a, &cfg, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const int B = 2, T = 256;
    /* the CPU backend: the "device" is the host's cores, so host work slows compute */
    st_plan_profile cpu = {.version = ST_PLAN_PROFILE_VERSION, .sgemm_flops = 60e9, .h2d_bytes_per_s = 6e9,
                        .d2h_bytes_per_s = 5e9, .mem_bytes_per_s = 8e9, .optim_ns_per_param = 1.0,
                        .block_fwd_flops = 40e9, .block_bwd_flops = 35e9, .head_flops = 45e9,
                        .host_work_slowdown = 0.5};
    /* an accelerator behind a PCIe link: copies dominate, recompute is cheap */
    st_plan_profile gpu = {.version = ST_PLAN_PROFILE_VERSION, .sgemm_flops = 50e12, .h2d_bytes_per_s = 20e9,
                        .d2h_bytes_per_s = 20e9, .mem_bytes_per_s = 10e9, .optim_ns_per_param = 0.5,
                        .block_fwd_flops = 30e12, .block_bwd_flops = 30e12, .head_flops = 30e12};
    st_stream_plan *p = malloc(sizeof *p);
    st_plan_prediction pr;
    if (st_plan_stream(a, B, T, (size_t)1 << 34, &cpu, p, &pr, &err) == ST_ERR_UNSUPPORTED) {
        printf("skip: %s\n", err.msg);
        free(p);
        st_arch_free(a);
        return 77;
    }
    free(p);
    /* as strata train, strata plan and strata bench plan call it, and the monotone preference */
    st_plan_options train = {.mip_gap = -1, .allow_vocab_chunk = 1, .prefer_resident_head = ST_PLAN_HEAD_RESIDENT_IF_FITS};
    st_plan_options tie = {.mip_gap = -1, .allow_vocab_chunk = 1, .prefer_resident_head = ST_PLAN_HEAD_RESIDENT_ON_TIE};
    const st_plan_profile *hws[2] = {&cpu, &gpu};
    const char *names[2] = {"CPU profile", "accelerator profile"};
    for (int h = 0; h < 2; h++) {
        char name[128];
        double rise;
        snprintf(name, sizeof name, "gpt2-124m B2 T256, %s, defaults", names[h]);
        int d = sweep(a, B, T, hws[h], NULL, name, &rise);
        /* the sweep means something only if the budget changes the answer */
        CHECK(d >= 3, "%s: only %d distinct predicted times over the sweep", name, d);
        snprintf(name, sizeof name, "gpt2-124m B2 T256, %s, the head resident on ties", names[h]);
        sweep(a, B, T, hws[h], &tie, name, &rise);
        snprintf(name, sizeof name, "gpt2-124m B2 T256, %s, strata train's options", names[h]);
        sweep(a, B, T, hws[h], &train, name, &rise);
    }
    /* bench plan's constrained budget where the planner must beat the rule, on the CPU-like profile */
    rule_recomputes_budget(a, B, T, &cpu, &train, "gpt2-124m B2 T256, CPU profile, the rule recomputes");
    st_arch_free(a);
    return test_finish("plan_sweep");
}
