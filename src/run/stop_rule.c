/* stop_rule.c - the stopping rule (strata/forecast.h): --stop_rule marginal:EPS, target:LOSS
 * or budget:FLOPS parsed and checked, and the decision the run takes after each evaluation,
 * a pure function of the forecast, the schedule and the step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/forecast.h"

st_status st_stop_rule_parse(const char *text, st_stop_rule *r, st_err *err) {
    memset(r, 0, sizeof *r);
    if (!text || !text[0] || !strcmp(text, "none")) return ST_OK;
    static const struct { const char *name; st_stop_rule_kind kind; } kinds[] = {
        {"marginal:", ST_STOP_RULE_MARGINAL}, {"target:", ST_STOP_RULE_TARGET}, {"budget:", ST_STOP_RULE_BUDGET}};
    for (int i = 0; i < 3; i++) {
        size_t k = strlen(kinds[i].name);
        if (strncmp(text, kinds[i].name, k)) continue;
        const char *v = text + k;
        char *end = NULL;
        double x = *v ? strtod(v, &end) : NAN;
        if (!*v || !end || *end || end == v)
            return st_errf(err, ST_ERR_INVALID, "key 'stop_rule': '%s' has no number after '%s' (for example %s%s)", text,
                           kinds[i].name, kinds[i].name, i == 0 ? "0.01" : i == 1 ? "2.5" : "1e18");
        if (!isfinite(x) || x < 0 || (x == 0 && kinds[i].kind != ST_STOP_RULE_MARGINAL))
            return st_errf(err, ST_ERR_INVALID, "key 'stop_rule': %s in '%s' is not a %s", v, text,
                           kinds[i].kind == ST_STOP_RULE_MARGINAL ? "loss decrease per PFLOP (a finite number >= 0)"
                           : kinds[i].kind == ST_STOP_RULE_TARGET ? "target loss (a finite number > 0)"
                                                                  : "FLOP budget (a finite number > 0)");
        r->kind = kinds[i].kind;
        r->value = x;
        return ST_OK;
    }
    return st_errf(err, ST_ERR_INVALID, "key 'stop_rule': '%s' is not marginal:EPS, target:LOSS, budget:FLOPS or none",
                   text);
}

st_status st_stop_rule_check(const st_stop_rule *r, long eval_every, int has_val_data, st_err *err) {
    /* the run decides after its evaluations (a budget too: it needs no forecast, but the
     * decision, logged with the forecast, is taken there) */
    if (r->kind == ST_STOP_RULE_NONE) return ST_OK;
    if (eval_every <= 0)
        return st_errf(err, ST_ERR_INVALID, "key 'stop_rule': it decides after each evaluation, and key 'eval_every' "
                       "is %ld: give eval_every > 0 (for example 25)", eval_every);
    if (!has_val_data)
        return st_errf(err, ST_ERR_INVALID, "key 'stop_rule': it decides after each evaluation of the validation loss, "
                       "and key 'val_data' gives none: give validation sources");
    return ST_OK;
}

static void decide(st_stop_decision *d, st_stop_action a, long decay_start, long end, long planned_end, double fps,
                   const char *why) {
    d->action = a;
    d->decay_start = decay_start;
    d->end_step = end;
    d->flops_saved = (double)(planned_end - end) * fps;
    snprintf(d->why, sizeof d->why, "%s", why);
}

st_status st_stop_rule_decide(const st_stop_rule *r, const st_forecast *f, const st_schedule *sc, long step,
                              double flops_per_step, st_stop_decision *d, st_err *err) {
    memset(d, 0, sizeof *d);
    d->predicted_final = d->gain_per_pflop = NAN;
    long planned_end = st_schedule_end(sc), D = st_schedule_decay_steps(sc);
    int wsd = sc->kind == ST_SCHEDULE_WSD;
    d->end_step = planned_end;
    char why[256];
    if (r->kind == ST_STOP_RULE_NONE) return ST_OK;
    if (wsd && step >= st_schedule_decay_begin(sc)) { /* the decay runs to its end */
        snprintf(d->why, sizeof d->why, "the decay began after step %ld: the run ends at %ld", st_schedule_decay_begin(sc),
                 planned_end);
        return ST_OK;
    }
    if (r->kind == ST_STOP_RULE_BUDGET) {
        if (!(flops_per_step > 0))
            return st_errf(err, ST_ERR_INVALID, "key 'stop_rule': budget needs the FLOPs of a step (%g)", flops_per_step);
        long last = (long)floor(r->value / flops_per_step); /* the last step the budget pays for */
        if (last < step)
            return st_errf(err, ST_ERR_INVALID, "key 'stop_rule': the budget %g FLOPs is smaller than the %g the run has "
                           "spent by step %ld (%g a step): give a larger budget", r->value, (double)step * flops_per_step,
                           step, flops_per_step);
        if (last >= planned_end) {
            snprintf(d->why, sizeof d->why, "the planned run (%ld steps) fits the budget", planned_end);
            return ST_OK;
        }
        snprintf(why, sizeof why, "budget %g FLOPs: the run, %s, ends at step %ld", r->value, wsd ? "decay included" : "",
                 wsd ? (last - D > step ? last : step + D) : last);
        if (wsd) {
            long k = last - D > step ? last - D : step; /* a decay that can no longer fit starts now */
            decide(d, ST_STOP_DECAY, k, k + D, planned_end, flops_per_step, why);
        } else {
            decide(d, ST_STOP_END, 0, last, planned_end, flops_per_step, why);
        }
        return ST_OK;
    }
    if (!f || f->state != ST_FORECAST_OK) {
        snprintf(d->why, sizeof d->why, "no decision: %.200s", f ? f->why : "no forecast");
        return ST_OK;
    }
    st_schedule now = *sc; /* the run that starts its decay (or stops) now */
    if (wsd) now.decay_start = step;
    long end_now = wsd ? step + D : step;
    d->predicted_final = st_forecast_loss(f, &now, end_now, NULL);
    d->gain_per_pflop = st_forecast_gain_per_pflop(f, sc, step);
    if (r->kind == ST_STOP_RULE_MARGINAL) {
        if (!(d->gain_per_pflop < r->value)) {
            snprintf(d->why, sizeof d->why, "marginal: %.4g loss per PFLOP >= %g", d->gain_per_pflop, r->value);
            return ST_OK;
        }
        snprintf(why, sizeof why, "marginal: the forecast's gain %.4g loss per PFLOP is below %g", d->gain_per_pflop,
                 r->value);
    } else { /* target */
        double band, planned = st_forecast_loss(f, sc, planned_end, &band);
        if (d->predicted_final <= r->value) {
            snprintf(why, sizeof why, "target: the forecast %.4f at step %ld reaches %g", d->predicted_final, end_now,
                     r->value);
        } else if (planned - band > r->value) {
            snprintf(why, sizeof why, "target: %g is not reached within the budget: the forecast at the planned end "
                     "(step %ld) is %.4f +- %.4f", r->value, planned_end, planned, band);
        } else {
            snprintf(d->why, sizeof d->why, "target: the forecast %.4f at step %ld is above %g; the planned end's %.4f "
                     "+- %.4f may reach it", d->predicted_final, end_now, r->value, planned, band);
            return ST_OK;
        }
    }
    decide(d, wsd ? ST_STOP_DECAY : ST_STOP_END, wsd ? step : 0, end_now, planned_end, flops_per_step, why);
    return ST_OK;
}
