/* plan_request.c - the plan a run takes (plan.h's st_plan_for_run): the machine's profile,
 * the program's plan within the budget, and the fixed rule where the program finds none. One
 * function for strata train, strata plan, bench plan and bench stream. */
#include <stdlib.h>
#include <string.h>

#include "strata/plan.h"

/* The rule's i-th candidate of n_acts x vocabulary choices, in the request's order. */
static void rule_candidate(const st_plan_request *rq, const st_stream_act *acts, int n_acts, int i, st_stream_plan *p) {
    int n_vocab = rq->vocab_chunk >= 0 ? 1 : 2;
    int act_i = rq->rule_order == ST_PLAN_RULE_ACTS_FIRST ? i / n_vocab : i % n_acts;
    int vocab_i = rq->rule_order == ST_PLAN_RULE_ACTS_FIRST ? i % n_vocab : i / n_acts;
    if (rq->base) *p = *rq->base;
    else st_stream_plan_default(p, rq->arch->lay.n_blocks);
    p->vocab_chunk = rq->vocab_chunk >= 0 ? rq->vocab_chunk : vocab_i ? ST_PLAN_RULE_VOCAB_CHUNK : 0;
    p->act_dtype = rq->options.act_dtype;
    st_stream_plan_set_all(p, acts[act_i]);
    const unsigned char *fixed = rq->options.fixed_act;
    for (int l = 0; fixed && l < p->n_layer; l++)
        if (fixed[l] != ST_PLAN_ACT_FREE) p->act[l] = fixed[l];
}

static st_status by_rule(const st_plan_request *rq, st_plan_result *out, st_err *err) {
    static const st_stream_act all[] = {ST_STREAM_ACT_KEEP, ST_STREAM_ACT_OFFLOAD, ST_STREAM_ACT_RECOMPUTE};
    const st_stream_act *acts = rq->rule_acts ? rq->rule_acts : all;
    int n_acts = rq->rule_acts ? rq->n_rule_acts : 3, n = n_acts * (rq->vocab_chunk >= 0 ? 1 : 2);
    out->by_rule = 1;
    for (int i = 0; i < n; i++) {
        rule_candidate(rq, acts, n_acts, i, &out->plan);
        size_t need = st_stream_device_bytes(rq->sc, &out->plan);
        if (need <= rq->budget) return ST_OK; /* no prediction: the caller predicts it if it wants one */
    }
    size_t need = st_stream_device_bytes(rq->sc, &out->plan);
    return st_errf(err, ST_ERR_NOMEM, "no plan fits %zu device bytes: the smallest the rule makes needs %zu, %zu bytes "
                   "missing", rq->budget, need, need - rq->budget);
}

st_status st_plan_for_run(const st_plan_request *rq, st_plan_result *out, st_err *err) {
    memset(out, 0, sizeof *out);
    st_status s = ST_OK;
    if (rq->profile) {
        out->hw = *rq->profile;
        out->have_hw = 1;
    } else if (rq->measure_on) {
        s = st_plan_profile_cached(rq->measure_on, rq->with_shape ? rq->arch : NULL, rq->B, rq->T, &out->hw,
                                   &out->why_rule);
        out->have_hw = s == ST_OK;
        if (s && !rq->rule) {
            *err = out->why_rule;
            return s;
        }
    }
    if (rq->solve && out->have_hw) {
        s = st_plan_stream_ex(rq->arch, rq->B, rq->T, rq->budget, &out->hw, &rq->options, &out->plan, &out->pred,
                              &out->why_rule);
        if (!s) {
            out->has_pred = 1;
            return ST_OK;
        }
        int fixed = 0;
        for (int l = 0; rq->options.fixed_act && l < rq->arch->lay.n_blocks; l++)
            fixed |= rq->options.fixed_act[l] != ST_PLAN_ACT_FREE;
        if (!rq->rule || (s == ST_ERR_NOMEM && fixed)) { /* the choices given do not fit: refused, not bypassed */
            *err = out->why_rule;
            return fixed && s == ST_ERR_NOMEM ? st_err_prefix(err, "key 'act'") : s;
        }
    } else if (!rq->rule) {
        return st_errf(err, ST_ERR_INVALID, "plan: no profile of the machine to plan from, and no rule allowed");
    }
    return by_rule(rq, out, err);
}

/* The fixed rule alone (plan.h), the vocabulary outermost: the request with no program. */
int st_plan_rule(const st_stream_config *sc, const unsigned char *fixed, size_t budget, st_stream_plan *p) {
    st_plan_request rq = {.arch = sc->arch, .B = sc->B, .T = sc->T, .budget = budget, .sc = sc, .rule = 1,
                          .rule_order = ST_PLAN_RULE_HEAD_FIRST, .vocab_chunk = -1};
    rq.options.fixed_act = fixed;
    st_plan_result *res = malloc(sizeof *res);
    if (!res) return 0;
    st_err ignored = {0};
    int found = st_plan_for_run(&rq, res, &ignored) == ST_OK;
    *p = res->plan;
    free(res);
    return found;
}
