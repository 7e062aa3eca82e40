/* forecast.h - where a run's loss is going, and when to stop: the learning-rate-aware
 * scaling law of Tissue et al. 2024 ("Scaling law with learning rate annealing") fitted to
 * a run's evaluation points by nonlinear least squares (GSL's multifit_nlinear), its
 * predictions with an uncertainty band, and the stopping rule that decides on them.
 *
 * Example:
 *
 *     st_schedule sc;
 *     st_forecast f;
 *     st_err err = {0};
 *     long steps[] = {50, 100, 150, 200, 250, 300, 350, 400};
 *     double loss[] = {3.10, 2.72, 2.55, 2.45, 2.38, 2.33, 2.23, 2.16};
 *     if (st_schedule_init(&sc, "wsd", "1-sqrt", 3e-3, 0.1, 0.2, 400, 20, &err)) return 1;
 *     if (st_forecast_fit(&f, &sc, ST_FORECAST_LAMBDA, 1e12, steps, loss, 8, &err)) return 1;
 *     if (f.state == ST_FORECAST_OK) {
 *         double band, at = st_forecast_loss(&f, &sc, 800, &band); // twice the steps
 *         printf("L0 %.3f alpha %.3f: loss at step 800 %.3f +- %.3f\n", f.L0, f.alpha, at, band);
 *     } else {
 *         printf("no forecast: %s\n", f.why);   // too few points, or the fit did not converge
 *     }
 *
 * End of example.
 *
 * The law: L(s) = L0 + A * S1(s)^-alpha - C * S2(s), s the optimizer step, with
 *   S1(s) = sum_{i=1..s} eta_i / eta_max                 (the forward area: the learning
 *           rate's sum, in steps at the peak rate; the law's A absorbs the unit)
 *   m_i   = lambda * m_{i-1} + max(0, eta_{i-1} - eta_i) / eta_max,  m_0 = 0, eta_0 = eta_1
 *   S2(s) = sum_{i=1..s} m_i                             (the annealing area: each decrease of
 *           the rate enters with a momentum that decays by lambda a step, so that a drop's
 *           effect on the loss builds up over the steps after it, as the paper defines it;
 *           lambda 0.999 is its value. The warmup's rises are not annealing: only decreases
 *           count, our reading of the paper's warmup-free definition.)
 * Four parameters L0, A, alpha > 0, C. Where the fitted points saw no annealing (S2 the same
 * at all of them: the stable phase of a WSD run) C cannot be fitted: it is fixed at 0 and
 * annealed = 0 says that a forecast past a decay is the curve without the decay's drop (an
 * upper bound); three parameters then.
 */
#ifndef STRATA_FORECAST_H
#define STRATA_FORECAST_H

#include "strata/core.h"
#include "strata/schedule.h"

#define ST_FORECAST_LAMBDA 0.999 /* S2's momentum decay a step (Tissue et al. 2024) */
#define ST_FORECAST_LEVEL 0.95   /* the band's coverage of the true curve */

typedef enum {
    ST_FORECAST_OK = 0,
    ST_FORECAST_TOO_FEW = 1,       /* fewer points than the law's parameters + 1 */
    ST_FORECAST_NOT_CONVERGED = 2, /* the solver stopped without a fit: never used */
} st_forecast_state;

typedef struct st_forecast {
    st_forecast_state state;
    char why[256];          /* what state means here, for a log line */
    double L0, A, alpha, C; /* the law's parameters (C 0 where annealed is 0) */
    double cov[4][4];       /* their covariance (L0, A, alpha, C), from the Jacobian and the residuals */
    int n_params;           /* 4, or 3 without annealing */
    int annealed;           /* the points saw the rate decrease (S2 varies over them) */
    int n_points;           /* all fitted, a probe's included */
    int n_probe;            /* of them a probe anneal's (st_forecast_fit_probe) */
    double rms;             /* the residuals' root mean square */
    double band_t;          /* Student's t quantile of level ST_FORECAST_LEVEL, n - n_params dof */
    double lambda;
    double flops_per_step;  /* for predictions by FLOP count and gains per PFLOP */
    long last_step;         /* the last point's step */
    int iterations;
} st_forecast;

/* The forward and annealing areas S1(step), S2(step) of schedule sc (definitions above). */
void st_forecast_areas(const st_schedule *sc, double lambda, long step, double *S1, double *S2);

/* Fit the law to n points (steps ascending, each >= 1; losses finite) of a run trained with
 * sc. A status other than ST_OK is an argument refused (the message names it); a fit that
 * could not be made is ST_OK with f->state saying why (too few points, not converged), and
 * its parameters must not be used. */
st_status st_forecast_fit(st_forecast *f, const st_schedule *sc, double lambda, double flops_per_step,
                          const long *steps, const double *loss, int n, st_err *err);

/* The fit with a probe anneal's points as well: a short branch of the same run that forked
 * from it at a step F (the same state, so the same curve to F) and ran a decay there, its
 * schedule probe_sc (the run's, with its decay begun at F), its np points after F (ascending).
 * Each point enters with the areas of its own schedule, so the probe's annealed points fix C,
 * which the run's own points before any decay cannot (S2 is 0 at all of them); the forecast
 * is then the run's schedule's curve, its planned decay's drop included. The probe's steps are
 * not the run's: they are spent beside it (the caller counts them). np 0 (or probe_sc NULL) is
 * st_forecast_fit. The points are refused as st_forecast_fit's, "probe's" named. */
st_status st_forecast_fit_probe(st_forecast *f, const st_schedule *sc, double lambda, double flops_per_step,
                                const long *steps, const double *loss, int n, const st_schedule *probe_sc,
                                const long *probe_steps, const double *probe_loss, int np, st_err *err);

/* The first of n ascending points to fit: the first at or after step from, or where from is
 * negative the default: past the first ST_FORECAST_SKIP (a fifth) of the last point's step, where a
 * model's loss falls faster than the law (its first rapid phase). */
#define ST_FORECAST_SKIP 0.2
int st_forecast_first_point(const long *steps, int n, long from);

/* The law's loss at step under schedule sc (the fit's own, or one whose decay starts
 * elsewhere); *band (NULL: not wanted) the half-width of the ST_FORECAST_LEVEL band of the
 * true curve there (the parameters' covariance through the law's gradient, times band_t). */
double st_forecast_loss(const st_forecast *f, const st_schedule *sc, long step, double *band);
/* The step that has spent flops (flops / flops_per_step, rounded down). */
long st_forecast_step_at_flops(const st_forecast *f, double flops);
/* What the next step buys, in loss per PFLOP (1e15 FLOPs), at step: the decrease of the
 * forecast curve from step to step + 1 as the run goes now (for wsd the stable curve, the
 * rate held at its peak; for cosine and constant, the curve sc plans). The measured counterpart is the
 * slope of the run's own evaluations there, so a rule on it can be checked against the
 * curve it stops. */
double st_forecast_gain_per_pflop(const st_forecast *f, const st_schedule *sc, long step);

/* The stopping rule: --stop_rule marginal:EPS | target:LOSS | budget:FLOPS. */
typedef enum { ST_STOP_RULE_NONE = 0, ST_STOP_RULE_MARGINAL, ST_STOP_RULE_TARGET, ST_STOP_RULE_BUDGET } st_stop_rule_kind;
typedef struct st_stop_rule {
    st_stop_rule_kind kind;
    double value; /* EPS (loss per PFLOP), LOSS, or FLOPS */
} st_stop_rule;

/* Parse the key's text ("" or "none": no rule). EPS >= 0, LOSS > 0, FLOPS > 0, finite;
 * a refusal names the key 'stop_rule'. */
st_status st_stop_rule_parse(const char *text, st_stop_rule *r, st_err *err);
/* The rule against the run's other keys, before anything is written: the run decides after
 * its evaluations, so every rule needs them (eval_every > 0, validation data). */
st_status st_stop_rule_check(const st_stop_rule *r, long eval_every, int has_val_data, st_err *err);

typedef enum {
    ST_STOP_CONTINUE = 0, /* train on as planned */
    ST_STOP_DECAY = 1,    /* wsd: start the decay after step decay_start; the run ends at end_step */
    ST_STOP_END = 2,      /* stop after end_step (the current step: now) */
} st_stop_action;

typedef struct st_stop_decision {
    st_stop_action action;
    long decay_start, end_step;
    double flops_saved;     /* of the planned run's */
    double predicted_final; /* the forecast's loss at end_step (NaN without a fit) */
    double gain_per_pflop;  /* the forecast's gain at step (marginal; NaN without) */
    char why[256];
} st_stop_decision;

/* After the evaluation of step: what the rule decides, from the forecast f (NULL, or a
 * state other than OK: the rules that need one continue, saying why), the schedule as it
 * runs, and the FLOPs of one step. A pure function of its arguments (the same points give
 * the same decision on every rank and on a resume). A wsd run whose decay has begun
 * continues to its end. A budget already spent at step is refused naming the key. */
st_status st_stop_rule_decide(const st_stop_rule *r, const st_forecast *f, const st_schedule *sc, long step,
                              double flops_per_step, st_stop_decision *d, st_err *err);

/* A run's evaluation points, as metrics.jsonl holds them: the records with a val_loss, by
 * ascending step; a step logged twice (a resume re-runs the steps after its checkpoint)
 * keeps its last record. The fit's inputs, so that a resume refits from exactly the points
 * the uninterrupted run had (the loop fits the values as printed, %.6f). */
typedef struct st_forecast_points {
    int n, cap;
    long *step;
    double *loss;
    double flops_per_step; /* the records' achieved_gflops * step_ms (their median; 0: none) */
    long last_step;        /* the last record's step, evaluated or not */
    long decay_start;      /* the latest record's decay_start (a stopping rule's; 0: none) */
    long end_step;         /* the latest record's end_step (a stopping rule's; 0: none) */
} st_forecast_points;

/* Read path (a metrics.jsonl), the records up to step up_to (0: all). A last line cut short
 * (a run still writing) is skipped; any other malformed line is refused naming path:line. */
st_status st_forecast_points_read(const char *path, long up_to, st_forecast_points *p, st_err *err);
/* Add the point (step, loss); points at or after step are dropped first. */
st_status st_forecast_points_add(st_forecast_points *p, long step, double loss, st_err *err);
void st_forecast_points_free(st_forecast_points *p);

#endif
