/* run_stop.c - the stopping rule inside a run (run_stop_internal.h): the schedule the loop
 * asks for each step's learning rate, the refit after each evaluation (every run with
 * evaluations: the step line, metrics.jsonl, TensorBoard) and the rule's decision. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run/run_stop_internal.h"

st_status st_run_stop_open(st_run_stop *rs, const st_train_config *c, double flops_per_step, long resume_step,
                           long end, st_err *err) {
    memset(rs, 0, sizeof *rs);
    rs->flops_per_step = flops_per_step;
    rs->end = end;
    rs->eval_every = c->eval_every;
    st_status s = st_train_config_schedule(c, &rs->sched, err);
    if (!s) s = st_stop_rule_parse(c->stop_rule, &rs->rule, err);
    /* every run with evaluations forecasts (the step line, metrics.jsonl, TensorBoard); a
     * resume refits from the points the uninterrupted run had */
    if (s || rs->eval_every <= 0 || resume_step <= 0) return s;
    char path[2200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", c->run_dir);
    if ((s = st_forecast_points_read(path, resume_step, &rs->points, err))) return s;
    int k = 0; /* the regular evaluations' points */
    for (int i = 0; i < rs->points.n; i++)
        if (rs->points.step[i] % rs->eval_every == 0) {
            rs->points.step[k] = rs->points.step[i];
            rs->points.loss[k++] = rs->points.loss[i];
        }
    rs->points.n = k;
    if (rs->rule.kind != ST_STOP_RULE_NONE && rs->points.end_step > 0) { /* the decision taken before it stopped */
        rs->sched.decay_start = rs->points.decay_start;
        rs->end = rs->points.end_step;
        rs->decided = 1;
    }
    return ST_OK;
}

double st_run_stop_lr(const st_run_stop *rs, long step) { return st_schedule_lr_at(&rs->sched, step); }

double st_run_stop_lr_peak(const st_run_stop *rs, long step, double peak) {
    st_schedule sc = rs->sched; /* warmup, decay and min_lr_frac as lr's: only the peak differs */
    sc.lr = peak;
    return st_schedule_lr_at(&sc, step);
}

st_status st_run_stop_eval(st_run_stop *rs, long step, double val, int quiet, char *json, size_t cap, st_err *err) {
    json[0] = 0;
    rs->line[0] = 0;
    rs->fc_ok = 0;
    if (!isfinite(val) || rs->eval_every <= 0 || step % rs->eval_every) return ST_OK;
    char txt[32];
    snprintf(txt, sizeof txt, "%.6f", val); /* the value metrics.jsonl keeps */
    st_status s = st_forecast_points_add(&rs->points, step, strtod(txt, NULL), err);
    if (s) return s;
    st_forecast f;
    int first = st_forecast_first_point(rs->points.step, rs->points.n, -1);
    if ((s = st_forecast_fit(&f, &rs->sched, ST_FORECAST_LAMBDA, rs->flops_per_step, rs->points.step + first,
                             rs->points.loss + first, rs->points.n - first, err)))
        return s;
    size_t n = 0;
    if (f.state == ST_FORECAST_OK) {
        /* at the run's planned end (a stop_at is a pause, not the plan), or its decision's */
        long fend = rs->decided ? rs->end : st_schedule_end(&rs->sched);
        double band, L = st_forecast_loss(&f, &rs->sched, fend, &band);
        n += (size_t)snprintf(json + n, cap - n, ",\"forecast_final\":%.6f,\"forecast_band\":%.6f", isfinite(L) ? L : 0,
                              isfinite(band) ? band : 0);
        if (isfinite(L) && isfinite(band)) {
            rs->fc_ok = 1, rs->fc_final = L, rs->fc_band = band;
            snprintf(rs->line, sizeof rs->line, " | forecast %.4f +- %.4f at %ld%s", L, band, fend,
                     f.annealed || rs->sched.kind != ST_SCHEDULE_WSD ? "" : " (no decay drop yet)");
        }
    } else {
        n += (size_t)snprintf(json + n, cap - n, ",\"forecast\":\"%s\"",
                              f.state == ST_FORECAST_TOO_FEW ? "too few points" : "not converged");
        snprintf(rs->line, sizeof rs->line, " | forecast: %s",
                 f.state == ST_FORECAST_TOO_FEW ? "too few points" : "not converged");
    }
    if (rs->rule.kind == ST_STOP_RULE_NONE || rs->decided) return ST_OK;
    st_stop_decision d;
    if ((s = st_stop_rule_decide(&rs->rule, &f, &rs->sched, step, rs->flops_per_step, &d, err))) return s;
    if (n < cap && isfinite(d.gain_per_pflop))
        n += (size_t)snprintf(json + n, cap - n, ",\"gain_per_pflop\":%.6g", d.gain_per_pflop);
    if (d.action == ST_STOP_CONTINUE) return ST_OK;
    rs->decided = 1;
    if (d.action == ST_STOP_DECAY) rs->sched.decay_start = d.decay_start;
    rs->end = d.end_step;
    if (n < cap)
        snprintf(json + n, cap - n, ",\"decay_start\":%ld,\"end_step\":%ld,\"flops_saved\":%.6g,\"stop\":\"%s\"",
                 d.action == ST_STOP_DECAY ? d.decay_start : 0L, d.end_step, d.flops_saved,
                 d.action == ST_STOP_DECAY ? "decay" : "end");
    if (!quiet)
        printf("stop rule at step %ld: %s; %s, ending at step %ld (%.4g FLOPs saved)\n", step, d.why,
               d.action == ST_STOP_DECAY ? "the decay starts" : "the run stops", d.end_step, d.flops_saved);
    return ST_OK;
}

st_status st_run_stop_share(st_run_stop *rs, st_comm *comm, int lead, st_err *err) {
    if (rs->rule.kind == ST_STOP_RULE_NONE) return ST_OK;
    double v[3] = {lead ? (double)rs->sched.decay_start : 0, lead ? (double)rs->end : 0, lead ? rs->decided : 0};
    st_status s = st_comm_allreduce_f64(comm, v, 3, "stop rule", err);
    if (s) return s;
    rs->sched.decay_start = (long)v[0];
    rs->end = (long)v[1];
    rs->decided = v[2] > 0;
    return ST_OK;
}

void st_run_stop_close(st_run_stop *rs) { st_forecast_points_free(&rs->points); }
