/* test_plan.c - the planner (plan.h): on a 6-block model the mixed-integer program's plan
 * has the same predicted step time as a brute-force search over every per-block choice,
 * prefetch depth and vocabulary chunk that fits (for a sweep of device budgets, under
 * two machine profiles); its device bytes are st_stream_device_bytes' and within the budget;
 * the predicted time never rises as the budget grows; a budget below the smallest plan is
 * refused naming the bytes missing; explicit activation choices (plan_options.fixed_act, the
 * key 'act') are honoured with the rest still optimised (brute force's best among the plans
 * that make them), and a budget they cannot fit is refused naming them and the bytes missing;
 * with bf16 activation sets (plan_options.act_dtype) the program still equals brute force, and
 * a plan's bytes, block times and copies move as the executor's table and the cost model say
 * (act_bf16); 80 blocks solve in under a second; the profile's
 * file round-trips and a wrong version is refused; a shape the profile timed (the
 * model's own block and classifier) is predicted from exactly those times, another
 * from the reference block's measured rates. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/plan.h"
#include "testutil.h"

typedef struct bf_entry {
    double step_s;
    size_t bytes;
    int code; /* the activation choices: block l's st_stream_act is (code / 3^l) % 3 */
} bf_entry;

/* Every plan of the model: 3^L activation choices x depths x vocabulary chunks. */
static bf_entry *brute_force_dt(const st_arch *a, int B, int T, const st_plan_profile *hw, st_dtype act_dtype,
                                int *n_out) {
    int L = a->lay.n_blocks, vcs[ST_PLAN_MAX_VCHUNKS], nv = st_plan_vocab_chunks(a, NULL, vcs);
    int nd = ST_PLAN_MAX_DEPTH < L ? ST_PLAN_MAX_DEPTH : L, n3 = 1;
    for (int l = 0; l < L; l++) n3 *= 3;
    bf_entry *e = malloc(sizeof *e * (size_t)n3 * nv * nd);
    st_stream_plan *p = malloc(sizeof *p);
    st_stream_plan_default(p, L);
    p->act_dtype = act_dtype;
    int n = 0;
    st_err err = {0};
    for (int v = 0; v < nv; v++)
        for (int d = 1; d <= nd; d++)
            for (int code = 0; code < n3; code++) {
                int c = code;
                for (int l = 0; l < L; l++, c /= 3) p->act[l] = (unsigned char)(c % 3);
                p->vocab_chunk = vcs[v];
                p->prefetch_depth = d;
                st_plan_prediction pr;
                if (st_plan_predict(a, B, T, hw, p, &pr, &err)) {
                    fprintf(stderr, "plan_predict: %s\n", err.msg);
                    exit(1);
                }
                e[n++] = (bf_entry){pr.step_s, pr.device_bytes, code};
            }
    free(p);
    *n_out = n;
    return e;
}
static bf_entry *brute_force(const st_arch *a, int B, int T, const st_plan_profile *hw, int *n_out) {
    return brute_force_dt(a, B, T, hw, ST_F32, n_out);
}

/* act_dtype: every plan's activation sets (the program's option, brute force's plans). */
static void sweep_dt(const st_arch *a, int B, int T, const st_plan_profile *hw, st_dtype act_dtype, const char *name,
                     int min_distinct) {
    int n;
    bf_entry *e = brute_force_dt(a, B, T, hw, act_dtype, &n);
    size_t lo = (size_t)-1, hi = 0;
    for (int i = 0; i < n; i++) {
        if (e[i].bytes < lo) lo = e[i].bytes;
        if (e[i].bytes > hi) hi = e[i].bytes;
    }
    st_stream_plan *p = malloc(sizeof *p);
    st_stream_config sc = {.arch = a, .B = B, .T = T};
    st_err err = {0};
    st_plan_prediction pr;
    /* below the smallest plan: refused, naming the bytes missing */
    st_plan_options dflt = {.mip_gap = -1, .allow_vocab_chunk = 1, .act_dtype = act_dtype}; /* st_plan_stream's */
    st_status s = st_plan_stream_ex(a, B, T, lo - 1000, hw, &dflt, p, &pr, &err);
    CHECK(s == ST_ERR_NOMEM, "%s: budget %zu below the smallest plan (%zu) gave %d", name, lo - 1000, lo, (int)s);
    CHECK(strstr(err.msg, "1000 bytes missing") != NULL, "%s: message does not name 1000 bytes missing: %s", name,
          err.msg);
    double prev = INFINITY;
    int steps = 24, distinct = 0;
    double last_t = -1;
    for (int i = 0; i <= steps; i++) {
        size_t budget = lo + (size_t)((double)(hi - lo) * i / steps);
        if (i == steps) budget = hi + 4096;
        double best = INFINITY;
        for (int k = 0; k < n; k++)
            if (e[k].bytes <= budget && e[k].step_s < best) best = e[k].step_s;
        /* the program alone (no simple plan to start from), proving its optimum */
        st_plan_options po = {.time_limit_ms = 20000, .mip_gap = 0, .allow_vocab_chunk = 1, .no_incumbent = 1,
                              .act_dtype = act_dtype};
        s = st_plan_stream_ex(a, B, T, budget, hw, &po, p, &pr, &err);
        CHECK(s == ST_OK, "%s: budget %zu: %s", name, budget, err.msg);
        CHECK(s || p->act_dtype == act_dtype, "%s: budget %zu: the plan's act_dtype %d, asked %d", name, budget,
              (int)p->act_dtype, (int)act_dtype);
        if (!s)
            CHECK(fabs(pr.program_s - pr.step_s) <= 1e-9 + 1e-7 * pr.step_s, "%s: budget %zu: the program's objective "
                  "%.9g s, the cost model's prediction of its plan %.9g s", name, budget, pr.program_s, pr.step_s);
        if (s) continue;
        size_t got = st_stream_device_bytes(&sc, p);
        CHECK(got <= budget, "%s: plan needs %zu device bytes, budget %zu", name, got, budget);
        CHECK(got == pr.device_bytes, "%s: predicted %zu device bytes, stream_device_bytes %zu", name, pr.device_bytes,
              got);
        CHECK(pr.optimal, "%s: budget %zu: not proven optimal", name, budget);
        CHECK(fabs(pr.step_s - best) <= 1e-9 + 1e-7 * best, "%s: budget %zu: the program's plan predicts %.9g s, "
              "brute force's best %.9g s", name, budget, pr.step_s, best);
        CHECK(pr.step_s <= prev * (1 + 1e-9), "%s: budget %zu: predicted %.9g s, above %.9g s at a smaller budget",
              name, budget, pr.step_s, prev);
        prev = pr.step_s;
        if (pr.step_s != last_t) distinct++;
        last_t = pr.step_s;
    }
    /* the sweep means something only if the budget changes the answer */
    CHECK(distinct >= min_distinct, "%s: only %d distinct predicted times over the sweep", name, distinct);
    printf("%s: %d plans brute-forced, budgets %zu..%zu bytes, %d distinct optima\n", name, n, lo, hi, distinct);
    free(p);
    free(e);
}
static void sweep(const st_arch *a, int B, int T, const st_plan_profile *hw, const char *name, int min_distinct) {
    sweep_dt(a, B, T, hw, ST_F32, name, min_distinct);
}

/* bf16 activation sets against fp32's, plan by plan: every kept, offloaded or recomputed set
 * at 2 bytes an element and one fp32 working set more (the executor's table), an offloaded
 * set's copies at half their time and one conversion more each forward and backward (6 bytes
 * an element at the memory bandwidth); the program's optimum equals brute force's under bf16. */
static void act_bf16(const st_arch *a, int B, int T, const st_plan_profile *hw) {
    int L = a->lay.n_blocks;
    double S = (double)st_block_act_floats(a, B, T), conv = 6.0 * S / hw->mem_bytes_per_s;
    st_stream_plan *p = malloc(sizeof *p);
    st_stream_config sc = {.arch = a, .B = B, .T = T};
    st_err err = {0};
    for (int act = ST_STREAM_ACT_KEEP; act <= ST_STREAM_ACT_OFFLOAD; act++) {
        st_stream_plan_default(p, L);
        st_stream_plan_set_all(p, (st_stream_act)act);
        st_plan_prediction p32, p16;
        size_t b32 = st_stream_device_bytes(&sc, p);
        CHECK(st_plan_predict(a, B, T, hw, p, &p32, &err) == ST_OK, "%s", err.msg);
        p->act_dtype = ST_BF16;
        size_t b16 = st_stream_device_bytes(&sc, p);
        CHECK(st_plan_predict(a, B, T, hw, p, &p16, &err) == ST_OK, "%s", err.msg);
        int sets = act == ST_STREAM_ACT_KEEP ? L : act == ST_STREAM_ACT_OFFLOAD ? 2 : 1; /* sets on the device */
        double want = (double)b32 - 2.0 * S * sets + 4.0 * S; /* halved, and the working set */
        CHECK(fabs((double)b16 - want) <= 64.0 * (sets + 2), "%s: bf16 device bytes %zu, want about %.0f (fp32 %zu)",
              st_plan_act_name((st_stream_act)act), b16, want, b32);
        CHECK(fabs(p16.block_fwd_s - p32.block_fwd_s - conv) <= 1e-12 && fabs(p16.block_bwd_s - p32.block_bwd_s - conv) <= 1e-12,
              "%s: a block's forward/backward %.9g/%.9g s under bf16, fp32's %.9g/%.9g plus %.9g each",
              st_plan_act_name((st_stream_act)act), p16.block_fwd_s, p16.block_bwd_s, p32.block_fwd_s, p32.block_bwd_s,
              conv);
        if (act == ST_STREAM_ACT_OFFLOAD)
            CHECK(p16.transfer_exposed_s < p32.transfer_exposed_s, "offload: exposed copies %.9g s under bf16, not below "
                  "fp32's %.9g", p16.transfer_exposed_s, p32.transfer_exposed_s);
    }
    free(p);
}

/* Whether brute force's entry e makes the choices fixed (ST_PLAN_ACT_FREE: any). */
static int honours(const bf_entry *e, const unsigned char *fixed, int L) {
    for (int l = 0, c = e->code; l < L; l++, c /= 3)
        if (fixed[l] != ST_PLAN_ACT_FREE && c % 3 != fixed[l]) return 0;
    return 1;
}

/* Explicit activation choices (key 'act') are constraints of the program: for each spec,
 * over a sweep of budgets the program's plan makes exactly the fixed choices and is as fast
 * as brute force's best among the plans that make them (the depth, the vocabulary chunk and
 * the other blocks still optimised); a budget the fixed choices cannot fit (though a free
 * plan would) is refused naming the choices and the exact bytes missing. */
static void fixed_choices(const st_arch *a, int B, int T, const st_plan_profile *hw, const char *name) {
    int L = a->lay.n_blocks, n;
    bf_entry *e = brute_force(a, B, T, hw, &n);
    st_stream_plan *p = malloc(sizeof *p);
    st_err err = {0};
    const char *specs[] = {"1:offload,4:keep", "0-2:recompute", "keep", "5:recompute,0:keep"};
    for (size_t si = 0; si < sizeof specs / sizeof specs[0]; si++) {
        unsigned char fixed[ST_STREAM_MAX_LAYERS];
        int nf = 0;
        CHECK(st_plan_act_parse(specs[si], L, fixed, &nf, &err) == ST_OK, "%s: act '%s': %s", name, specs[si], err.msg);
        size_t lo = (size_t)-1, hi = 0, free_lo = (size_t)-1;
        for (int i = 0; i < n; i++) {
            if (e[i].bytes < free_lo) free_lo = e[i].bytes;
            if (!honours(&e[i], fixed, L)) continue;
            if (e[i].bytes < lo) lo = e[i].bytes;
            if (e[i].bytes > hi) hi = e[i].bytes;
        }
        st_plan_options po = {.time_limit_ms = 20000, .mip_gap = 0, .allow_vocab_chunk = 1, .no_incumbent = 1,
                           .fixed_act = fixed};
        st_plan_prediction pr;
        int steps = 8;
        double free_best_gap = 0;
        for (int k = 0; k <= steps; k++) {
            size_t budget = lo + (size_t)((double)(hi - lo) * k / steps);
            double best = INFINITY, free_best = INFINITY;
            for (int i = 0; i < n; i++)
                if (e[i].bytes <= budget) {
                    if (e[i].step_s < free_best) free_best = e[i].step_s;
                    if (honours(&e[i], fixed, L) && e[i].step_s < best) best = e[i].step_s;
                }
            for (int run = 0; run < 2; run++) { /* the program alone, then with the simple incumbent */
                st_plan_options o = po;
                if (run) o.no_incumbent = 0, o.mip_gap = -1;
                st_status s = st_plan_stream_ex(a, B, T, budget, hw, &o, p, &pr, &err);
                CHECK(s == ST_OK, "%s: act '%s', budget %zu: %s", name, specs[si], budget, err.msg);
                if (s) continue;
                int bad = -1;
                for (int l = 0; l < L; l++)
                    if (fixed[l] != ST_PLAN_ACT_FREE && p->act[l] != fixed[l]) bad = l;
                CHECK(bad < 0, "%s: act '%s', budget %zu: block %d is %s", name, specs[si], budget, bad,
                      bad >= 0 ? st_plan_act_name(p->act[bad]) : "");
                CHECK(pr.device_bytes <= budget, "%s: act '%s': %zu device bytes, budget %zu", name, specs[si],
                      pr.device_bytes, budget);
                CHECK(fabs(pr.step_s - best) <= 1e-9 + 1e-7 * best, "%s: act '%s', budget %zu (%s): predicted %.9g s, "
                      "brute force's best with the fixed choices %.9g s", name, specs[si], budget,
                      run ? "defaults" : "program alone", pr.step_s, best);
            }
            if (!isfinite(best)) continue;
            if (best - free_best > free_best_gap) free_best_gap = best - free_best;
        }
        /* the budget below the smallest plan the fixed choices allow, above the smallest free plan */
        if (lo > free_lo) {
            size_t budget = lo - 1 > free_lo ? lo - 1 : free_lo;
            st_status s = st_plan_stream_ex(a, B, T, budget, hw, &po, p, &pr, &err);
            char want[64];
            snprintf(want, sizeof want, " %zu bytes missing", lo - budget);
            CHECK(s == ST_ERR_NOMEM && strstr(err.msg, "fixed activation choices") && strstr(err.msg, want),
                  "%s: act '%s', budget %zu (smallest with it %zu, free %zu): gave %d, want the fixed choices and%s "
                  "named: %s", name, specs[si], budget, lo, free_lo, (int)s, want, err.msg);
            s = st_plan_stream_ex(a, B, T, budget, hw, NULL, p, &pr, &err);
            CHECK(s == ST_OK, "%s: budget %zu: the free program fails: %s", name, budget, err.msg);
        }
        printf("%s: act '%s' (%d blocks fixed): budgets %zu..%zu equal brute force's best with the choices "
               "(the free best up to %.4f s faster); smallest plan with them %zu bytes, free %zu\n", name, specs[si],
               nf, lo, hi, free_best_gap, lo, free_lo);
    }
    /* the spec's own errors name the item */
    unsigned char fixed[ST_STREAM_MAX_LAYERS];
    int nf = -1;
    CHECK(st_plan_act_parse("auto", L, fixed, &nf, &err) == ST_OK && nf == 0 && fixed[0] == ST_PLAN_ACT_FREE, "act auto");
    CHECK(st_plan_act_parse("0-2:keep,4:offload,1:auto", L, fixed, &nf, &err) == ST_OK && nf == 3 &&
              fixed[0] == ST_STREAM_ACT_KEEP && fixed[1] == ST_PLAN_ACT_FREE && fixed[2] == ST_STREAM_ACT_KEEP &&
              fixed[3] == ST_PLAN_ACT_FREE && fixed[4] == ST_STREAM_ACT_OFFLOAD && fixed[5] == ST_PLAN_ACT_FREE,
          "act 0-2:keep,4:offload,1:auto parsed as %d fixed", nf);
    CHECK(st_plan_act_parse("0-9:keep", L, fixed, &nf, &err) == ST_ERR_INVALID && strstr(err.msg, "'0-9:keep'") &&
              strstr(err.msg, "blocks 0-5"), "a range past the last block: %s", err.msg);
    CHECK(st_plan_act_parse("1:keep,3:fast", L, fixed, &nf, &err) == ST_ERR_INVALID && strstr(err.msg, "'3:fast'"),
          "an unknown choice: %s", err.msg);
    CHECK(st_plan_act_parse("keeps", L, fixed, &nf, &err) == ST_ERR_INVALID && strstr(err.msg, "'keeps'"),
          "an unknown global choice: %s", err.msg);
    CHECK(st_plan_act_parse("3-1:keep", L, fixed, &nf, &err) == ST_ERR_INVALID, "a reversed range accepted");
    free(p);
    free(e);
}

/* The plan request (st_plan_for_run): the rule alone (and st_plan_rule, which is it) equals
 * the rule written out by hand at every budget;
 * the activations-first order is bench stream's (each act with the vocabulary resident,
 * then chunked); the program alone equals st_plan_stream_ex; fixed choices that do not fit
 * are refused naming key 'act', never bypassed by the rule. */
static void plan_request(const st_arch *a, int B, int T, const st_plan_profile *hw) {
    st_err err = {0};
    /* the rule's candidates differ in bytes where the activations and the vocabulary are
     * large against the blocks: a wide vocabulary, long rows */
    st_gpt2_config rc = {.vocab_size = 16384, .max_seq = 256, .n_layer = 4, .n_head = 2, .n_embd = 64};
    st_arch *ra = NULL;
    CHECK(st_arch_gpt2(&ra, &rc, &err) == ST_OK, "%s", err.msg);
    if (!ra) return;
    st_stream_config sc = {.arch = ra, .B = 8, .T = 256};
    st_stream_plan *want = malloc(sizeof *want), *q = malloc(sizeof *q);
    st_plan_result *res = malloc(sizeof *res);
    if (!want || !q || !res) {
        CHECK(0, "out of memory");
        goto out;
    }
    st_stream_plan_default(q, ra->lay.n_blocks);
    st_stream_plan_set_all(q, ST_STREAM_ACT_KEEP);
    size_t top = st_stream_device_bytes(&sc, q) + 4096;
    int mismatch = 0, acts_mismatch = 0, n = 0, kinds = 0;
    int seen[3][2] = {{0}}; /* [act][chunked] */
    for (size_t budget = top / 512; budget <= top; budget += top / 512, n++) {
        st_plan_request rq = {.arch = ra, .B = sc.B, .T = sc.T, .budget = budget, .sc = &sc, .rule = 1, .vocab_chunk = -1};
        int found = 0; /* the rule by hand: the vocabulary resident, then chunked; keep, offload, recompute */
        static const st_stream_act order[] = {ST_STREAM_ACT_KEEP, ST_STREAM_ACT_OFFLOAD, ST_STREAM_ACT_RECOMPUTE};
        for (int i = 0; i < 6 && !found; i++) {
            st_stream_plan_default(want, ra->lay.n_blocks);
            st_stream_plan_set_all(want, order[i % 3]);
            want->vocab_chunk = i / 3 ? ST_PLAN_RULE_VOCAB_CHUNK : 0;
            found = st_stream_device_bytes(&sc, want) <= budget;
        }
        st_status s = st_plan_for_run(&rq, res, &err);
        if (found != st_plan_rule(&sc, NULL, budget, q) || (found && q->vocab_chunk != want->vocab_chunk)) mismatch++;
        if ((s == ST_OK) != found || (found && (memcmp(res->plan.act, want->act, (size_t)want->n_layer) ||
                                                res->plan.vocab_chunk != want->vocab_chunk)))
            mismatch++;
        if (!s) seen[res->plan.act[0]][res->plan.vocab_chunk != 0] = 1;
        /* bench stream's order: offload (resident, chunked), then recompute (resident, chunked) */
        static const st_stream_act acts[] = {ST_STREAM_ACT_OFFLOAD, ST_STREAM_ACT_RECOMPUTE};
        rq.rule_order = ST_PLAN_RULE_ACTS_FIRST;
        rq.rule_acts = acts;
        rq.n_rule_acts = 2;
        s = st_plan_for_run(&rq, res, &err);
        int hand = 0; /* the same order by hand */
        for (int i = 0; i < 4 && !hand; i++) {
            st_stream_plan_default(q, ra->lay.n_blocks);
            st_stream_plan_set_all(q, acts[i / 2]);
            q->vocab_chunk = i % 2 ? ST_PLAN_RULE_VOCAB_CHUNK : 0;
            hand = st_stream_device_bytes(&sc, q) <= budget;
        }
        if ((s == ST_OK) != hand || memcmp(res->plan.act, q->act, (size_t)q->n_layer) ||
            res->plan.vocab_chunk != q->vocab_chunk)
            acts_mismatch++;
    }
    for (int x = 0; x < 3; x++) kinds += seen[x][0] + seen[x][1];
    CHECK(mismatch == 0 && kinds >= 3, "plan request, rule alone: %d of %d budgets differ from the rule by hand (%d kinds "
          "of plan seen)", mismatch, n, kinds);
    CHECK(acts_mismatch == 0, "plan request, activations first: %d of %d budgets differ from the order by hand",
          acts_mismatch, n);
    /* the program alone: st_plan_stream_ex's plan and prediction */
    sc = (st_stream_config){.arch = a, .B = B, .T = T};
    st_stream_plan_default(q, a->lay.n_blocks);
    st_stream_plan_set_all(q, ST_STREAM_ACT_KEEP);
    top = st_stream_device_bytes(&sc, q) + 4096;
    size_t mid = top / 2;
    st_plan_prediction pr;
    st_plan_options po = {.mip_gap = -1, .allow_vocab_chunk = 1};
    st_plan_request rq = {.arch = a, .B = B, .T = T, .budget = mid, .sc = &sc, .profile = hw, .solve = 1, .options = po};
    st_status s1 = st_plan_stream_ex(a, B, T, mid, hw, &po, want, &pr, &err);
    st_status s2 = st_plan_for_run(&rq, res, &err);
    CHECK(s1 == ST_OK && s2 == ST_OK && !res->by_rule && res->has_pred && res->pred.step_s == pr.step_s &&
              !memcmp(res->plan.act, want->act, (size_t)want->n_layer) && res->plan.vocab_chunk == want->vocab_chunk,
          "plan request, the program: %d %d, by rule %d, %g s against %g s", s1, s2, res->by_rule, res->pred.step_s,
          pr.step_s);
    /* every block kept at a budget only recompute fits: refused, naming the key, not the rule's plan */
    unsigned char fixed[ST_STREAM_MAX_LAYERS];
    memset(fixed, ST_STREAM_ACT_KEEP, sizeof fixed);
    rq.options.fixed_act = fixed;
    rq.budget = top / 8;
    rq.rule = 1;
    rq.vocab_chunk = -1;
    st_status s3 = st_plan_for_run(&rq, res, &err);
    CHECK(s3 == ST_ERR_NOMEM && strstr(err.msg, "key 'act'"), "plan request, fixed keep at %zu bytes: %d (%s)",
          rq.budget, s3, err.msg);
    printf("plan request: %d budgets, the rule's %d kinds of plan as by hand, bench stream's order as by hand, "
           "the program's plan and the refusal of fixed choices\n", n, kinds);
out:
    free(want);
    free(q);
    free(res);
    st_arch_free(ra);
}

/* The host account (st_plan_host_bytes, now the executor's own table) against the count
 * written out by hand from what the executor allocates: every combination of activations,
 * vocabulary chunking, drain dtype and clip mode, the state in RAM and on disk. */
static size_t host_by_hand(const st_arch *a, int B, int T, const st_stream_plan *p, int disk) {
    const st_arch_layout *y = &a->lay;
    size_t n = y->n_params, N = (size_t)B * T, C = (size_t)y->n_embd;
    size_t bytes = n * 4 * 2 + N * 20;
    if (p->grad_dtype == ST_BF16) bytes += n * 2;
    size_t n_off = 0;
    for (int l = 0; l < p->n_layer; l++) n_off += p->act[l] == ST_STREAM_ACT_OFFLOAD;
    bytes += n_off * st_block_act_floats(a, B, T) * 4;
    if (p->vocab_chunk > 0) {
        size_t V = (size_t)y->vocab_size, vc = (size_t)p->vocab_chunk < V ? (size_t)p->vocab_chunk : V;
        size_t nvc = (V + vc - 1) / vc;
        bytes += 2 * N * C * 4;
        if (nvc > 2) bytes += N * (nvc - 2) * vc * 4;
        bytes += a->ops->bind_bytes(a, B, T);
    }
    if (disk) return bytes;
    bytes += n * 8;
    if (p->overlap_optim && p->clip != ST_STREAM_CLIP_DEFER) bytes += (y->norm_offset - y->block_offset0) * 12;
    return bytes;
}

static void host_account(const st_arch *a, int B, int T) {
    st_stream_plan *p = malloc(sizeof *p);
    if (!p) return;
    int n = 0, bad = 0;
    for (int v = 0; v < 2 * 3 * 2 * 3 * 2; v++, n++) {
        st_stream_plan_default(p, a->lay.n_blocks);
        for (int l = 0; l < p->n_layer; l++) p->act[l] = (unsigned char)((l + v) % 3);
        if (v % 3 == 1) st_stream_plan_set_all(p, ST_STREAM_ACT_KEEP);
        p->vocab_chunk = (v / 3) % 2 ? 64 : 0;
        p->grad_dtype = (v / 6) % 2 ? ST_BF16 : ST_F32;
        p->clip = (st_stream_clip)((v / 12) % 3);
        p->overlap_optim = v / 36 == 0;
        for (int disk = 0; disk < 2; disk++) {
            size_t got = disk ? st_plan_host_bytes_disk(a, B, T, p) : st_plan_host_bytes(a, B, T, p);
            size_t want = host_by_hand(a, B, T, p, disk);
            if (got != want) {
                if (!bad) fprintf(stderr, "host account: plan %d%s: %zu bytes, by hand %zu\n", v, disk ? " (disk)" : "",
                                  got, want);
                bad++;
            }
        }
    }
    CHECK(bad == 0, "host account: %d of %d plans differ from the count by hand", bad, 2 * n);
    printf("host account: %d plans, the executor's table equals the count by hand\n", 2 * n);
    free(p);
}

int main(void) {
    st_err err = {0};
    /* a GPT-2 shape small enough to brute-force: 6 blocks */
    st_gpt2_config cfg = {.vocab_size = 512, .max_seq = 64, .n_layer = 6, .n_head = 2, .n_embd = 64};
    st_arch *a = NULL;
    if (st_arch_gpt2(&a, &cfg, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    st_plan_profile fast = {.version = ST_PLAN_PROFILE_VERSION, .sgemm_flops = 20e9, .h2d_bytes_per_s = 8e9,
                         .d2h_bytes_per_s = 6e9, .mem_bytes_per_s = 10e9, .optim_ns_per_param = 1.0,
                         .block_fwd_flops = 20e9, .block_bwd_flops = 20e9, .head_flops = 20e9};
    /* slow copies: offloading activations costs more than recomputing them */
    st_plan_profile slow = fast;
    slow.h2d_bytes_per_s = slow.d2h_bytes_per_s = 0.3e9;
    st_stream_plan *p = malloc(sizeof *p);
    st_plan_prediction pr;
    if (st_plan_stream(a, 4, 64, (size_t)1 << 30, &fast, p, &pr, &err) == ST_ERR_UNSUPPORTED) {
        printf("skip: %s\n", err.msg);
        return 77;
    }
    sweep(a, 4, 64, &fast, "6 blocks, fast copies", 2);
    sweep(a, 4, 64, &slow, "6 blocks, slow copies", 8);
    /* a slow optimizer: the update is longer than the backward that hides it */
    st_plan_profile slow_opt = fast;
    slow_opt.h2d_bytes_per_s = slow_opt.d2h_bytes_per_s = 1e9;
    slow_opt.optim_ns_per_param = 40.0;
    sweep(a, 4, 64, &slow_opt, "6 blocks, slow optimizer", 2);
    /* the device's compute shares the host's cores (the CPU backend): every copy and the
     * optimizer cost compute too, so an offloaded block costs more than its exposed copies */
    st_plan_profile shared = slow;
    shared.h2d_bytes_per_s = shared.d2h_bytes_per_s = 2e9;
    shared.host_work_slowdown = 0.6;
    sweep(a, 4, 64, &shared, "6 blocks, host work on the device's cores", 2);
    sweep_dt(a, 4, 64, &slow, ST_BF16, "6 blocks, slow copies, bf16 activations", 8);
    act_bf16(a, 4, 64, &slow);
    fixed_choices(a, 4, 64, &slow, "6 blocks, slow copies");
    plan_request(a, 4, 64, &fast);
    host_account(a, 4, 64);
    fixed_choices(a, 4, 64, &shared, "6 blocks, host work on the device's cores");
    {
        st_stream_plan *q = malloc(sizeof *q);
        st_plan_prediction p0, p1;
        st_stream_plan_default(q, a->lay.n_blocks);
        st_stream_plan_set_all(q, ST_STREAM_ACT_OFFLOAD);
        st_plan_profile own = shared;
        own.host_work_slowdown = 0;
        CHECK(st_plan_predict(a, 4, 64, &own, q, &p0, &err) == ST_OK && st_plan_predict(a, 4, 64, &shared, q, &p1, &err) == ST_OK,
              "%s", err.msg);
        /* 6 blocks, 4 of them move: their activations out and in, plus every fetch, drain and update */
        CHECK(p0.host_work_s == 0 && p1.host_work_s > 0 &&
                  fabs(p1.step_s - p0.step_s - p1.host_work_s) <= 1e-12 + 1e-9 * p1.step_s,
              "host work: %g s without, %g s with; steps %g, %g", p0.host_work_s, p1.host_work_s, p0.step_s, p1.step_s);
        free(q);
    }
    /* the edges of the byte model and the windows: one and two blocks */
    for (int nl = 1; nl <= 2; nl++) {
        st_gpt2_config small = cfg;
        small.n_layer = nl;
        st_arch *s1 = NULL;
        CHECK(st_arch_gpt2(&s1, &small, &err) == ST_OK, "%s", err.msg);
        if (s1) sweep(s1, 4, 64, &slow, nl == 1 ? "1 block, slow copies" : "2 blocks, slow copies", 2);
        st_arch_free(s1);
    }

    /* 80 blocks: under a second, at a budget where blocks must choose */
    st_gpt2_config big = {.vocab_size = 50304, .max_seq = 256, .n_layer = 80, .n_head = 12, .n_embd = 768};
    st_arch *b = NULL;
    CHECK(st_arch_gpt2(&b, &big, &err) == ST_OK, "%s", err.msg);
    if (b) {
        st_stream_config sc = {.arch = b, .B = 2, .T = 256};
        st_stream_plan *all = malloc(sizeof *all);
        st_stream_plan_default(all, 80);
        st_stream_plan_set_all(all, ST_STREAM_ACT_KEEP);
        size_t keep = st_stream_device_bytes(&sc, all);
        st_stream_plan_set_all(all, ST_STREAM_ACT_RECOMPUTE);
        size_t rc = st_stream_device_bytes(&sc, all);
        size_t budget = rc + (keep - rc) / 3;
        /* a fast device: every block's choice changes the time; the program alone, to the proven optimum */
        st_plan_profile dev = {.version = ST_PLAN_PROFILE_VERSION, .sgemm_flops = 20e12, .h2d_bytes_per_s = 20e9,
                            .d2h_bytes_per_s = 20e9, .mem_bytes_per_s = 10e9, .optim_ns_per_param = 0.5,
                            .block_fwd_flops = 20e12, .block_bwd_flops = 20e12, .head_flops = 20e12};
        st_plan_options po = {.time_limit_ms = 20000, .mip_gap = 0, .allow_vocab_chunk = 1, .no_incumbent = 1};
        for (int run = 0; run < 2; run++) {
            st_status s = st_plan_stream_ex(b, 2, 256, budget, &dev, run ? NULL : &po, p, &pr, &err);
            CHECK(s == ST_OK, "80 blocks: %s", err.msg);
            if (s) continue;
            CHECK(st_stream_device_bytes(&sc, p) <= budget, "80 blocks: over the budget");
            CHECK(pr.solve_s < 1.0, "80 blocks solved in %.3f s (limit 1 s)", pr.solve_s);
            CHECK(pr.optimal, "80 blocks: stopped at the time limit");
            printf("80 blocks (%s): budget %zu bytes, solved in %.3f s (%s): %d keep, %d offload, %d recompute, "
                   "depth %d, vocab_chunk %d, predicted %.4f s\n", run ? "defaults" : "no incumbent, gap 0", budget,
                   pr.solve_s, pr.optimal ? "optimal" : "time limit", pr.n_keep, pr.n_offload, pr.n_recompute,
                   p->prefetch_depth, p->vocab_chunk, pr.step_s);
        }
        /* compute-bound with large activations (batch 8): GLPK alone does not prove its optimum
         * in a second here; the defaults return by the time limit with the best plan found,
         * never slower than the simple plans it starts from */
        sc.B = 8;
        st_stream_plan_set_all(all, ST_STREAM_ACT_KEEP);
        keep = st_stream_device_bytes(&sc, all);
        st_stream_plan_set_all(all, ST_STREAM_ACT_RECOMPUTE);
        rc = st_stream_device_bytes(&sc, all);
        budget = rc + (keep - rc) / 3;
        dev.mem_bytes_per_s = 200e9;
        dev.optim_ns_per_param = 0.05;
        st_status s = st_plan_stream(b, 8, 256, budget, &dev, p, &pr, &err);
        CHECK(s == ST_OK, "80 blocks, batch 8: %s", err.msg);
        if (!s) {
            CHECK(st_stream_device_bytes(&sc, p) <= budget, "80 blocks, batch 8: over the budget");
            CHECK(pr.solve_s < 1.0, "80 blocks, batch 8: %.3f s (limit 1 s)", pr.solve_s);
            printf("80 blocks, batch 8 (defaults): solved in %.3f s (%s): %d keep, %d offload, %d recompute, "
                   "predicted %.4f s\n", pr.solve_s, pr.optimal ? "optimal" : "time limit", pr.n_keep, pr.n_offload,
                   pr.n_recompute, pr.step_s);
        }
        free(all);
        st_arch_free(b);
    }

    /* the profile file */
    const char *dir = test_tmpdir();
    char path[4096];
    snprintf(path, sizeof path, "%s/hw.json", dir);
    st_plan_profile back;
    CHECK(st_plan_profile_save(path, &slow, &err) == ST_OK, "%s", err.msg);
    CHECK(st_plan_profile_load(path, &back, &err) == ST_OK, "%s", err.msg);
    CHECK(fabs(back.h2d_bytes_per_s - slow.h2d_bytes_per_s) < 1e-3 * slow.h2d_bytes_per_s &&
              back.version == ST_PLAN_PROFILE_VERSION, "profile did not round-trip");
    FILE *f = fopen(path, "w");
    fputs("{\"strata_plan_profile\": 99, \"sgemm_flops\": 1}", f);
    fclose(f);
    CHECK(st_plan_profile_load(path, &back, &err) == ST_ERR_FORMAT && strstr(err.msg, "version 99"),
          "version 99 accepted: %s", err.msg);
    /* a version 1 file (no block or classifier times) is refused naming the file and what to do */
    f = fopen(path, "w");
    fputs("{\"strata_plan_profile\": 1, \"sgemm_flops\": 1e9, \"h2d_bytes_per_s\": 1e9, \"d2h_bytes_per_s\": 1e9, "
          "\"mem_bytes_per_s\": 1e9, \"optim_ns_per_param\": 1}", f);
    fclose(f);
    CHECK(st_plan_profile_load(path, &back, &err) == ST_ERR_FORMAT && strstr(err.msg, "version 1") &&
              strstr(err.msg, path) && strstr(err.msg, "--save_profile"),
          "a version 1 profile accepted or refused without the file and the remedy: %s", err.msg);
    f = fopen(path, "w");
    fputs("{\"strata_plan_profile\": 2, \"sgemm_flops\": 1e9, \"h2d_bytes_per_s\": -1}", f);
    fclose(f);
    CHECK(st_plan_profile_load(path, &back, &err) == ST_ERR_FORMAT && strstr(err.msg, "h2d_bytes_per_s"),
          "a negative bandwidth accepted: %s", err.msg);
    f = fopen(path, "w");
    fputs("{\"strata_plan_profile\": 2, \"sgemm_flops\": 1e9, \"h2d_bytes_per_s\": 1e9, \"d2h_bytes_per_s\": 1e9, "
          "\"mem_bytes_per_s\": 1e9, \"optim_ns_per_param\": 1}", f);
    fclose(f);
    CHECK(st_plan_profile_load(path, &back, &err) == ST_ERR_FORMAT && strstr(err.msg, "block_fwd_flops"),
          "a profile without the block's rates accepted: %s", err.msg);

    /* calibration: the profile times this model's own block and classifier at its batch
     * shape; the cost model then predicts exactly those times (not FLOPs at a rate), the
     * entry survives the file, and another shape falls back to the reference rates */
    st_backend *cpu = NULL;
    CHECK(st_backend_cpu_create(&cpu, 0, &err) == ST_OK, "%s", err.msg);
    st_plan_profile hw;
    st_status ms = cpu ? st_plan_profile_measure(cpu, &hw, &err) : ST_ERR_INVALID;
    CHECK(ms == ST_OK, "measure: %s", err.msg);
    if (ms == ST_OK) {
        CHECK(hw.block_fwd_flops > 0 && hw.block_bwd_flops > 0 && hw.head_flops > 0 && hw.n_shapes == 0 &&
                  hw.host_work_slowdown >= 0 && hw.host_work_slowdown <= 1,
              "reference rates %g %g %g, host work slowdown %g, %d shapes", hw.block_fwd_flops, hw.block_bwd_flops,
              hw.head_flops, hw.host_work_slowdown, hw.n_shapes);
        CHECK(st_plan_profile_shape(&hw, a, 4, 64) == NULL, "a shape found before it was measured");
        CHECK(st_plan_profile_measure_shape(cpu, a, 4, 64, &hw, &err) == ST_OK, "measure shape: %s", err.msg);
        CHECK(st_plan_profile_measure_shape(cpu, a, 4, 64, &hw, &err) == ST_OK && hw.n_shapes == 1,
              "measuring a shape again added an entry (%d): %s", hw.n_shapes, err.msg);
        const st_plan_shape_time *e = st_plan_profile_shape(&hw, a, 4, 64);
        CHECK(e != NULL, "the measured shape is not found");
        if (e) {
            CHECK(e->block_fwd_s > 0 && e->block_bwd_s > 0 && e->head_s_per_row > 0, "times %g %g %g",
                  e->block_fwd_s, e->block_bwd_s, e->head_s_per_row);
            st_stream_plan_default(p, a->lay.n_blocks);
            st_plan_prediction a_pr, b_pr;
            CHECK(st_plan_predict(a, 4, 64, &hw, p, &a_pr, &err) == ST_OK, "%s", err.msg);
            CHECK(a_pr.block_fwd_s == e->block_fwd_s && a_pr.block_bwd_s == e->block_bwd_s,
                  "predicted block %g/%g s, measured %g/%g s", a_pr.block_fwd_s, a_pr.block_bwd_s, e->block_fwd_s,
                  e->block_bwd_s);
            double want = a->lay.n_blocks * (e->block_fwd_s + e->block_bwd_s) + e->head_s_per_chunk +
                          e->head_s_per_row * a->lay.vocab_size; /* the default plan: the head resident, one chunk */
            CHECK(fabs(a_pr.compute_s - want) <= 1e-12 + 1e-9 * want, "predicted compute %.9g s, measured parts %.9g s",
                  a_pr.compute_s, want);
            /* chunked: each chunk adds the measured per-chunk time (the line through two chunk sizes) */
            p->vocab_chunk = 128;
            st_plan_prediction c_pr;
            CHECK(st_plan_predict(a, 4, 64, &hw, p, &c_pr, &err) == ST_OK, "%s", err.msg);
            double wantc = want + 3 * e->head_s_per_chunk;
            CHECK(e->head_s_per_chunk >= 0 && fabs(c_pr.compute_s - wantc) <= 1e-12 + 1e-9 * wantc,
                  "chunked: predicted compute %.9g s, measured parts %.9g s", c_pr.compute_s, wantc);
            p->vocab_chunk = 0;
            CHECK(st_plan_profile_save(path, &hw, &err) == ST_OK && st_plan_profile_load(path, &back, &err) == ST_OK,
                  "%s", err.msg);
            const st_plan_shape_time *e2 = st_plan_profile_shape(&back, a, 4, 64);
            CHECK(back.n_shapes == 1 && e2 && fabs(e2->block_bwd_s - e->block_bwd_s) <= 1e-5 * e->block_bwd_s &&
                      fabs(e2->head_s_per_chunk - e->head_s_per_chunk) <= 1e-5 * e->head_s_per_chunk &&
                      fabs(back.block_fwd_flops - hw.block_fwd_flops) <= 1e-5 * hw.block_fwd_flops,
                  "the measured shape did not round-trip");
            /* with this machine's measured figures too, the program's optimum equals brute
             * force and never rises as the budget grows */
            sweep(a, 4, 64, &hw, "6 blocks, this machine's measured profile", 1);
            /* batch 2: not measured, the reference rates */
            CHECK(st_plan_predict(a, 2, 64, &hw, p, &b_pr, &err) == ST_OK, "%s", err.msg);
            double fl = a->ops->block_flops_per_token(a, 64) * 2 * 64;
            CHECK(fabs(b_pr.block_fwd_s - fl / 3 / hw.block_fwd_flops) <= 1e-9 * b_pr.block_fwd_s,
                  "an unmeasured shape's forward %g s, the reference rate gives %g s", b_pr.block_fwd_s,
                  fl / 3 / hw.block_fwd_flops);
        }
    }
    if (cpu) st_backend_free(cpu);
    free(p);
    st_arch_free(a);
    return test_finish("plan");
}
