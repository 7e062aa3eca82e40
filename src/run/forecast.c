/* forecast.c - the learning-rate-aware loss forecast (strata/forecast.h): the areas of a
 * schedule, the law fitted by GSL's trust-region nonlinear least squares in log-transformed
 * parameters (each inside the law's range at every step) from starts that
 * a grid over alpha finds (for a fixed alpha the law is linear in L0, A and C, so each grid
 * point is one linear least-squares solve), the parameters' covariance for the band. */
#include "strata/forecast.h"

#include <gsl/gsl_blas.h>
#include <gsl/gsl_cdf.h>
#include <gsl/gsl_errno.h>
#include <gsl/gsl_multifit.h>
#include <gsl/gsl_multifit_nlinear.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* S1 and S2 at each of n ascending steps, in one walk of the schedule */
static void areas_many(const st_schedule *sc, double lambda, const long *steps, int n, double *S1, double *S2) {
    double peak = sc->lr > 0 ? sc->lr : 1.0, s1 = 0, s2 = 0, m = 0, prev = st_schedule_lr_at(sc, 1) / peak;
    long i = 1;
    for (int k = 0; k < n; k++) {
        for (; i <= steps[k]; i++) {
            double e = st_schedule_lr_at(sc, i) / peak;
            m = lambda * m + (prev > e ? prev - e : 0.0);
            s1 += e;
            s2 += m;
            prev = e;
        }
        S1[k] = s1;
        S2[k] = s2;
    }
}

void st_forecast_areas(const st_schedule *sc, double lambda, long step, double *S1, double *S2) {
    areas_many(sc, lambda, &step, 1, S1, S2);
}

/* The fit works in transformed variables, u = log of each parameter (L0 = e^u0, A = e^u1,
 * alpha = e^u2, C = e^u3), so that every step of the solver stays inside the law's range
 * (L0 > 0, A > 0, alpha > 0, C >= 0: annealing lowers the loss) instead of leaving it and
 * being refused afterwards; the covariance is carried back to the parameters through the
 * transform's Jacobian (diag(e^u), the delta method). */
typedef struct fit_data {
    int n, p;
    const double *S1, *S2, *y;
} fit_data;

static int law_f(const gsl_vector *x, void *params, gsl_vector *f) {
    const fit_data *d = params;
    double L0 = exp(gsl_vector_get(x, 0)), A = exp(gsl_vector_get(x, 1)), al = exp(gsl_vector_get(x, 2));
    double C = d->p == 4 ? exp(gsl_vector_get(x, 3)) : 0.0;
    for (int i = 0; i < d->n; i++)
        gsl_vector_set(f, (size_t)i, L0 + A * pow(d->S1[i], -al) - C * d->S2[i] - d->y[i]);
    return GSL_SUCCESS;
}

static int law_df(const gsl_vector *x, void *params, gsl_matrix *J) {
    const fit_data *d = params;
    double L0 = exp(gsl_vector_get(x, 0)), A = exp(gsl_vector_get(x, 1)), al = exp(gsl_vector_get(x, 2));
    double C = d->p == 4 ? exp(gsl_vector_get(x, 3)) : 0.0;
    for (int i = 0; i < d->n; i++) {
        double t = pow(d->S1[i], -al);
        gsl_matrix_set(J, (size_t)i, 0, L0);
        gsl_matrix_set(J, (size_t)i, 1, A * t);
        gsl_matrix_set(J, (size_t)i, 2, -A * t * log(d->S1[i]) * al);
        if (d->p == 4) gsl_matrix_set(J, (size_t)i, 3, -C * d->S2[i]);
    }
    return GSL_SUCCESS;
}

/* For fixed alpha: L0, A (and C) by linear least squares; the residuals' sum of squares */
static double linear_at(const fit_data *d, double al, double *x) {
    size_t n = (size_t)d->n, q = (size_t)d->p - 1;
    gsl_matrix *X = gsl_matrix_alloc(n, q), *cov = gsl_matrix_alloc(q, q);
    gsl_vector *y = gsl_vector_alloc(n), *c = gsl_vector_alloc(q);
    gsl_multifit_linear_workspace *w = gsl_multifit_linear_alloc(n, q);
    double chisq = INFINITY;
    if (X && cov && y && c && w) {
        for (size_t i = 0; i < n; i++) {
            gsl_matrix_set(X, i, 0, 1.0);
            gsl_matrix_set(X, i, 1, pow(d->S1[i], -al));
            if (q == 3) gsl_matrix_set(X, i, 2, -d->S2[i]);
            gsl_vector_set(y, i, d->y[i]);
        }
        if (gsl_multifit_linear(X, y, c, cov, &chisq, w) == GSL_SUCCESS) {
            x[0] = gsl_vector_get(c, 0);
            x[1] = gsl_vector_get(c, 1);
            x[2] = al;
            x[3] = q == 3 ? gsl_vector_get(c, 2) : 0.0;
        } else {
            chisq = INFINITY;
        }
    }
    if (w) gsl_multifit_linear_free(w);
    if (X) gsl_matrix_free(X);
    if (cov) gsl_matrix_free(cov);
    if (y) gsl_vector_free(y);
    if (c) gsl_vector_free(c);
    return isfinite(chisq) ? chisq : INFINITY;
}

static void not_converged(st_forecast *f, const char *fmt, const char *what) {
    f->state = ST_FORECAST_NOT_CONVERGED;
    snprintf(f->why, sizeof f->why, fmt, what);
}

/* One solve from the start x0 (the parameters, inside the range); u receives the solution
 * in transformed variables, covar its covariance (unscaled); the residuals' sum of squares,
 * INFINITY where the solver failed. */
static double solve_from(const fit_data *d, const double *x0, gsl_multifit_nlinear_workspace *w, gsl_matrix *covar,
                         double *u, int *iters, int *gs_out) {
    gsl_multifit_nlinear_fdf fdf = {.f = law_f, .df = law_df, .fvv = NULL, .n = (size_t)d->n, .p = (size_t)d->p,
                                    .params = (void *)d};
    double u0[4];
    for (int i = 0; i < d->p; i++) u0[i] = log(x0[i]);
    gsl_vector_view v = gsl_vector_view_array(u0, (size_t)d->p);
    int info = 0, gs = gsl_multifit_nlinear_init(&v.vector, &fdf, w);
    double chi0 = INFINITY;
    if (gs == GSL_SUCCESS) {
        gsl_blas_ddot(gsl_multifit_nlinear_residual(w), gsl_multifit_nlinear_residual(w), &chi0);
        gs = gsl_multifit_nlinear_driver(400, 1e-12, 1e-12, 1e-14, NULL, NULL, &info, w);
    }
    *iters = (int)gsl_multifit_nlinear_niter(w);
    double chisq = INFINITY;
    const gsl_vector *xs = gsl_multifit_nlinear_position(w), *res = gsl_multifit_nlinear_residual(w);
    gsl_blas_ddot(res, res, &chisq);
    if (gs == GSL_EMAXITER && chisq <= chi0) gs = GSL_SUCCESS; /* at the tolerances' floor: the fit stands */
    if (gs == GSL_SUCCESS) gs = gsl_multifit_nlinear_covar(gsl_multifit_nlinear_jac(w), 0.0, covar);
    for (int i = 0; i < d->p; i++) u[i] = gsl_vector_get(xs, (size_t)i);
    *gs_out = gs;
    return gs == GSL_SUCCESS && isfinite(chisq) ? chisq : INFINITY;
}

/* The fit of p parameters (4: C fitted; 3: C 0) from several starts: the best alpha of a grid
 * from 0.01 to 4 (for a fixed alpha the law is linear in L0, A and C: one linear solve each)
 * and alphas 0.3, 1 and 3, each start's L0, A and C moved inside the range; the best end. */
static st_status fit_p(st_forecast *f, fit_data *d, double *cov_u, double *u_best, int *gs_best, st_err *err) {
    int p = d->p;
    double ymin = INFINITY, ymax = -INFINITY;
    for (int i = 0; i < d->n; i++) ymin = fmin(ymin, d->y[i]), ymax = fmax(ymax, d->y[i]);
    double starts[4][4], best_chi = INFINITY, x[4];
    int ns = 0;
    for (int g = 0; g < 96; g++) {
        double al = 0.01 * pow(400.0, g / 95.0), chi = linear_at(d, al, x);
        if (chi < best_chi) best_chi = chi, memcpy(starts[0], x, sizeof x);
    }
    ns = isfinite(best_chi) ? 1 : 0;
    const double als[3] = {0.3, 1.0, 3.0};
    for (int k = 0; k < 3; k++)
        if (isfinite(linear_at(d, als[k], x))) memcpy(starts[ns++], x, sizeof x);
    gsl_multifit_nlinear_parameters fp = gsl_multifit_nlinear_default_parameters();
    gsl_multifit_nlinear_workspace *w = gsl_multifit_nlinear_alloc(gsl_multifit_nlinear_trust, &fp, (size_t)d->n,
                                                                   (size_t)p);
    gsl_matrix *covar = gsl_matrix_alloc((size_t)p, (size_t)p);
    if (!w || !covar) {
        if (w) gsl_multifit_nlinear_free(w);
        if (covar) gsl_matrix_free(covar);
        return st_errf(err, ST_ERR_NOMEM, "forecast: out of memory for the solver");
    }
    double best = INFINITY;
    *gs_best = GSL_FAILURE;
    for (int k = 0; k < ns; k++) {
        double *s = starts[k], u[4];
        /* inside the range: L0 in (0, min loss), A > 0 (the span of the losses), C > 0 small */
        if (!(s[0] > 0 && s[0] < ymin)) s[0] = ymin > 0 ? 0.5 * ymin : 1e-3;
        if (!(s[1] > 0)) s[1] = fmax(ymax - ymin, 1e-3) * pow(d->S1[0], s[2]);
        if (p == 4 && !(s[3] > 0)) s[3] = 1e-6;
        int iters = 0, gs = 0;
        double chi = solve_from(d, s, w, covar, u, &iters, &gs);
        if (chi < best) {
            best = chi;
            memcpy(u_best, u, sizeof u);
            for (int i = 0; i < p; i++)
                for (int j = 0; j < p; j++) cov_u[i * 4 + j] = gsl_matrix_get(covar, (size_t)i, (size_t)j);
            f->iterations = iters;
            *gs_best = gs;
        } else if (!isfinite(best)) {
            *gs_best = gs;
        }
    }
    gsl_multifit_nlinear_free(w);
    gsl_matrix_free(covar);
    (void)best;
    return ST_OK;
}

st_status st_forecast_fit(st_forecast *f, const st_schedule *sc, double lambda, double flops_per_step,
                          const long *steps, const double *loss, int n, st_err *err) {
    return st_forecast_fit_probe(f, sc, lambda, flops_per_step, steps, loss, n, NULL, NULL, NULL, 0, err);
}

/* steps ascending, each >= 1, losses finite; what names the set in a refusal */
static st_status check_points(const long *steps, const double *loss, int n, const char *what, st_err *err) {
    if (n < 0 || (n > 0 && (!steps || !loss))) return st_errf(err, ST_ERR_INVALID, "forecast: %d %spoints", n, what);
    for (int i = 0; i < n; i++) {
        if (steps[i] < 1 || (i > 0 && steps[i] <= steps[i - 1]))
            return st_errf(err, ST_ERR_INVALID, "forecast: %spoint %d's step %ld is not after the previous one's (%ld); "
                           "give the points by ascending step, each >= 1", what, i, steps[i], i ? steps[i - 1] : 0L);
        if (!isfinite(loss[i]))
            return st_errf(err, ST_ERR_NONFINITE, "forecast: the %sloss at step %ld is %g, not a number to fit", what,
                           steps[i], loss[i]);
    }
    return ST_OK;
}

st_status st_forecast_fit_probe(st_forecast *f, const st_schedule *sc, double lambda, double flops_per_step,
                                const long *steps, const double *base_loss, int nb, const st_schedule *probe_sc,
                                const long *probe_steps, const double *probe_loss, int np, st_err *err) {
    memset(f, 0, sizeof *f);
    f->lambda = lambda;
    f->flops_per_step = flops_per_step;
    if (!probe_sc) np = 0;
    int n = nb + (np > 0 ? np : 0);
    f->n_points = n;
    f->n_probe = np > 0 ? np : 0;
    if (!(lambda >= 0 && lambda < 1))
        return st_errf(err, ST_ERR_INVALID, "forecast: lambda %g is not within [0, 1)", lambda);
    if (!(flops_per_step >= 0) || !isfinite(flops_per_step))
        return st_errf(err, ST_ERR_INVALID, "forecast: %g FLOPs a step is not a count", flops_per_step);
    st_status cs = check_points(steps, base_loss, nb, "", err);
    if (!cs) cs = check_points(probe_steps, probe_loss, np, "probe's ", err);
    if (cs) return cs;
    f->last_step = nb ? steps[nb - 1] : 0;
    /* the run's points then the probe's, each with the areas of its own schedule */
    double *S1 = malloc(sizeof(double) * (size_t)(n ? n : 1)), *S2 = malloc(sizeof(double) * (size_t)(n ? n : 1));
    double *loss = malloc(sizeof(double) * (size_t)(n ? n : 1));
    if (!S1 || !S2 || !loss) {
        free(S1);
        free(S2);
        free(loss);
        return st_errf(err, ST_ERR_NOMEM, "forecast: out of memory for %d points", n);
    }
    if (nb) areas_many(sc, lambda, steps, nb, S1, S2);
    if (np > 0) areas_many(probe_sc, lambda, probe_steps, np, S1 + nb, S2 + nb);
    if (nb) memcpy(loss, base_loss, sizeof(double) * (size_t)nb);
    if (np > 0) memcpy(loss + nb, probe_loss, sizeof(double) * (size_t)np);
    double lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < n; i++) {
        lo = fmin(lo, S2[i]);
        hi = fmax(hi, S2[i]);
    }
    f->annealed = n > 0 && hi - lo > 1e-9 * (1.0 + fabs(hi));
    f->n_params = f->annealed ? 4 : 3;
    int p = f->n_params;
    int ok_areas = 1;
    for (int i = 0; i < n; i++) ok_areas &= S1[i] > 0;
    if (n < p + 1) {
        f->state = ST_FORECAST_TOO_FEW;
        snprintf(f->why, sizeof f->why, "too few points: %d evaluation%s, the law has %d parameters%s and needs at least "
                 "%d", n, n == 1 ? "" : "s", p, f->annealed ? "" : " (no annealing seen: C not fitted)", p + 1);
        free(S1);
        free(S2);
        free(loss);
        return ST_OK;
    }
    if (!ok_areas) { /* the learning rate was 0 up to a point: the law has no value there */
        free(S1);
        free(S2);
        free(loss);
        return st_errf(err, ST_ERR_INVALID, "forecast: the learning rate's sum is 0 at step %ld; give points where it "
                       "has trained", nb ? steps[0] : probe_steps[0]);
    }
    gsl_set_error_handler_off(); /* GSL's default handler aborts; its statuses are read here */
    fit_data d = {n, p, S1, S2, loss};
    double cov_u[16] = {0}, u[4] = {0};
    int gs = GSL_FAILURE, c_bound = 0;
    st_status s = fit_p(f, &d, cov_u, u, &gs, err);
    /* C at its bound 0 (the points' annealing does not lower the loss): the law without it */
    if (!s && p == 4 && gs == GSL_SUCCESS && exp(u[3]) * (hi - lo) < 1e-9 * (1.0 + fabs(loss[n - 1]))) {
        d.p = p = f->n_params = 3;
        c_bound = 1;
        s = fit_p(f, &d, cov_u, u, &gs, err);
    }
    if (s) {
        free(S1);
        free(S2);
        free(loss);
        return s;
    }
    double th[4] = {exp(u[0]), exp(u[1]), exp(u[2]), p == 4 ? exp(u[3]) : 0.0}, chisq = 0;
    f->L0 = th[0], f->A = th[1], f->alpha = th[2], f->C = th[3];
    for (int i = 0; i < n; i++) {
        double r = f->L0 + f->A * pow(S1[i], -f->alpha) - f->C * S2[i] - loss[i];
        chisq += r * r;
    }
    double s2 = chisq / (double)(n - p);
    f->rms = sqrt(chisq / n);
    double reach = f->A * pow(S1[0], -f->alpha); /* the power term's size at the first point */
    int finite = isfinite(f->L0) && isfinite(f->A) && isfinite(f->alpha) && isfinite(f->C) && isfinite(s2);
    for (int i = 0; i < p && finite; i++)
        for (int j = 0; j < p; j++) {
            f->cov[i][j] = th[i] * cov_u[i * 4 + j] * th[j] * s2;
            finite &= isfinite(f->cov[i][j]);
        }
    if (gs != GSL_SUCCESS)
        not_converged(f, "not converged: the solver stopped: %s", gsl_strerror(gs));
    else if (!finite)
        not_converged(f, "not converged: %s", "a parameter or its variance is not finite");
    else if (!(f->L0 > 1e-6 * fabs(loss[n - 1])))
        not_converged(f, "not converged: %s", "L0 went to its bound 0: these points do not fix the loss's floor (a "
                      "first rapid phase the law does not describe; fit from a later step: --from)");
    else if (!(f->alpha > 1e-4 && f->alpha < 20) || !(reach > 1e-6 * (1.0 + fabs(f->L0))))
        not_converged(f, "not converged: %s", "the loss does not fall as a power of the learning rate's area (the "
                      "power term vanished, or alpha left (0, 20))");
    else {
        f->state = ST_FORECAST_OK;
        f->band_t = gsl_cdf_tdist_Pinv(0.5 + ST_FORECAST_LEVEL / 2, (double)(n - p));
        char probe[64] = "";
        if (f->n_probe) snprintf(probe, sizeof probe, " and %d of a probe anneal", f->n_probe);
        snprintf(f->why, sizeof f->why, "fitted on %d points to step %ld%s (rms %.3g, %d iterations)%s", nb, f->last_step,
                 probe, f->rms, f->iterations,
                 c_bound ? "; the annealing seen did not lower the loss: C at its bound 0"
                 : f->annealed ? "" : "; no annealing seen: C fixed at 0");
    }
    free(S1);
    free(S2);
    free(loss);
    return ST_OK;
}

int st_forecast_first_point(const long *steps, int n, long from) {
    if (n <= 0) return 0;
    if (from < 0) from = (long)ceil(ST_FORECAST_SKIP * (double)steps[n - 1]);
    int i = 0;
    while (i < n && steps[i] < from) i++;
    return i;
}

double st_forecast_loss(const st_forecast *f, const st_schedule *sc, long step, double *band) {
    double S1, S2;
    st_forecast_areas(sc, f->lambda, step, &S1, &S2);
    double t = pow(S1, -f->alpha), L = f->L0 + f->A * t - f->C * S2;
    if (band) {
        double g[4] = {1.0, t, -f->A * t * log(S1), -S2}, v = 0;
        for (int i = 0; i < f->n_params; i++)
            for (int j = 0; j < f->n_params; j++) v += g[i] * f->cov[i][j] * g[j];
        *band = f->band_t * sqrt(v > 0 ? v : 0);
    }
    return L;
}

long st_forecast_step_at_flops(const st_forecast *f, double flops) {
    return f->flops_per_step > 0 ? (long)floor(flops / f->flops_per_step) : 0;
}

double st_forecast_gain_per_pflop(const st_forecast *f, const st_schedule *sc, long step) {
    double per = f->flops_per_step > 0 ? f->flops_per_step / 1e15 : NAN;
    st_schedule now = *sc;
    /* wsd: the curve with the rate held to step + 1 (the decay not begun: what a stable step buys) */
    if (sc->kind == ST_SCHEDULE_WSD) now.decay_start = step + 1;
    return (st_forecast_loss(f, &now, step, NULL) - st_forecast_loss(f, &now, step + 1, NULL)) / per;
}
