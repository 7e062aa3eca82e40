/* run_stop_internal.h - the stopping rule as the run's loop uses it: the schedule it runs
 * (with a decay the rule moved), the evaluation points so far (read back from
 * metrics.jsonl on a resume), the fit and the decision after each evaluation, shared by
 * the ranks. Private to the library (the loop in src/run/train.c). */
#ifndef STRATA_RUN_STOP_INTERNAL_H
#define STRATA_RUN_STOP_INTERNAL_H

#include "strata/dist.h"
#include "strata/forecast.h"
#include "strata/train.h"

typedef struct st_run_stop {
    st_stop_rule rule;
    st_schedule sched;        /* the run's schedule, decay_start where the rule moved it */
    st_forecast_points points;
    double flops_per_step;
    long end;                 /* the run's last step (a decision's end_step, or the planned one) */
    long eval_every;          /* the points are the regular evaluations' (a stop_at's extra one is not) */
    int decided;
    int fc_ok;                /* the last evaluation's forecast: fc_final +- fc_band at step end */
    double fc_final, fc_band;
    char line[96];            /* its text for the step line (" | forecast ..."); "" without an evaluation */
} st_run_stop;

/* c's rule and schedule; on a resume (resume_step > 0) the points and any decision that
 * metrics.jsonl holds up to resume_step, so the next fit is the uninterrupted run's. end:
 * the run's last step as planned (steps or stop_at). */
st_status st_run_stop_open(st_run_stop *rs, const st_train_config *c, double flops_per_step, long resume_step,
                           long end, st_err *err);
/* The learning rate of step (the schedule as it runs). */
double st_run_stop_lr(const st_run_stop *rs, long step);
/* The same schedule's value at step for another peak rate (method poetx's Q: poetx_lr). */
double st_run_stop_lr_peak(const st_run_stop *rs, long step, double peak);
/* After the evaluation of step, if it is a regular one (a multiple of eval_every: an
 * evaluation at a stop_at would give a resumed run a point the uninterrupted one lacks) (val as metrics.jsonl prints it, %.6f, so that a resume fits
 * the same numbers): refit, decide, take the decision (rs->end, the decay). json receives
 * the record's fields (,"forecast_final":..., and at a decision "decay_start", "end_step",
 * "stop":"why"); a log line is printed when a decision is taken and quiet is 0. Every run
 * with evaluations is forecast (rs->line, fc_*); only a rule decides. */
st_status st_run_stop_eval(st_run_stop *rs, long step, double val, int quiet, char *json, size_t cap, st_err *err);
/* Under mpirun, at every evaluation step: rank 0's end and decay for every rank. */
st_status st_run_stop_share(st_run_stop *rs, st_comm *comm, int lead, st_err *err);
void st_run_stop_close(st_run_stop *rs);

#endif
