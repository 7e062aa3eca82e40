/* test_forecast.c - the loss forecast and the stopping rule (strata/forecast.h) on synthetic
 * curves drawn from the law with known parameters and Gaussian noise: the parameters
 * recovered within 1%, the band covering the true curve at its stated rate over many seeds,
 * the areas against a direct fp64 sum, too few points and a failed fit reported and never
 * used, a probe anneal's points fixing the decay term C that a wsd run's stable part cannot,
 * the rule's decisions, and its refusals naming the key. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "strata/forecast.h"
#include "testutil.h"

static uint64_t rng;
static double unif(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return ((rng >> 11) + 0.5) / 9007199254740992.0;
}
static double gauss(void) { return sqrt(-2 * log(unif())) * cos(2 * M_PI * unif()); }

/* the law's truth as a forecast (no covariance) */
static st_forecast truth(double L0, double A, double al, double C, double fps) {
    st_forecast t;
    memset(&t, 0, sizeof t);
    t.state = ST_FORECAST_OK;
    t.L0 = L0, t.A = A, t.alpha = al, t.C = C, t.n_params = 4, t.lambda = ST_FORECAST_LAMBDA, t.flops_per_step = fps;
    return t;
}

/* n points every `every` steps of the true curve with noise sd */
static int draw(const st_forecast *t, const st_schedule *sc, long every, long last, double sd, long *steps, double *y) {
    int n = 0;
    for (long s = every; s <= last; s += every, n++) {
        steps[n] = s;
        y[n] = st_forecast_loss(t, sc, s, NULL) + sd * gauss();
    }
    return n;
}

int main(void) {
    st_err err = {0};
    st_schedule cos_sc, wsd;
    CHECK(!st_schedule_init(&cos_sc, "cosine", "linear", 3e-3, 0.1, 0.2, 2000, 50, &err), "%s", err.msg);
    CHECK(!st_schedule_init(&wsd, "wsd", "1-sqrt", 3e-3, 0.1, 0.2, 2000, 50, &err), "%s", err.msg);

    /* the areas against their definition summed here */
    {
        double s1 = 0, s2 = 0, m = 0, prev = st_schedule_lr_at(&wsd, 1) / 3e-3, S1, S2;
        for (long i = 1; i <= 2000; i++) {
            double e = st_schedule_lr_at(&wsd, i) / 3e-3;
            m = 0.999 * m + fmax(0, prev - e);
            s1 += e, s2 += m, prev = e;
        }
        st_forecast_areas(&wsd, 0.999, 2000, &S1, &S2);
        CHECK(fabs(S1 - s1) < 1e-9 && fabs(S2 - s2) < 1e-9 && S2 > 10, "areas %g %g against %g %g", S1, S2, s1, s2);
        st_forecast_areas(&wsd, 0.999, 1600, &S1, &S2);
        CHECK(S2 == 0, "no annealing before the decay: S2 %g", S2);
    }

    static long steps[4096];
    static double y[4096];
    st_forecast f, t = truth(2.0, 1.5, 0.45, 0.004, 1e12);
    /* recovery: 10 seeds, whole curves (cosine and wsd), every parameter within 1% */
    const st_schedule *scs[2] = {&cos_sc, &wsd};
    double worst = 0;
    for (int k = 0; k < 2; k++)
        for (int seed = 1; seed <= 10; seed++) {
            rng = (uint64_t)seed * 7919 + (uint64_t)k;
            int n = draw(&t, scs[k], 10, 2000, 2e-4, steps, y);
            CHECK(!st_forecast_fit(&f, scs[k], ST_FORECAST_LAMBDA, 1e12, steps, y, n, &err), "%s", err.msg);
            CHECK(f.state == ST_FORECAST_OK && f.annealed && f.n_params == 4, "seed %d: %s", seed, f.why);
            double rel[4] = {f.L0 / t.L0 - 1, f.A / t.A - 1, f.alpha / t.alpha - 1, f.C / t.C - 1};
            for (int i = 0; i < 4; i++) worst = fmax(worst, fabs(rel[i]));
            if (seed == 1 && k == 1)
                printf("wsd seed 1: L0 %.5f A %.5f alpha %.5f C %.6f (%s)\n", f.L0, f.A, f.alpha, f.C, f.why);
        }
    CHECK(worst < 0.01, "a parameter recovered %.3f%% off", worst * 100);
    printf("recovery: worst parameter %.3f%% off over 20 fits\n", worst * 100);

    /* the band: fitted on the first half of a cosine run with noise 0.01, the truth at the
     * end (an extrapolation) and at 2x inside the band at the stated 95% over 400 seeds */
    int cover_end = 0, cover_mid = 0, fits = 0;
    for (int seed = 1; seed <= 400; seed++) {
        rng = (uint64_t)seed * 104729;
        int n = draw(&t, &cos_sc, 20, 1000, 0.01, steps, y);
        if (st_forecast_fit(&f, &cos_sc, ST_FORECAST_LAMBDA, 1e12, steps, y, n, &err) || f.state != ST_FORECAST_OK)
            continue;
        fits++;
        double band, L = st_forecast_loss(&f, &cos_sc, 2000, &band);
        cover_end += fabs(L - st_forecast_loss(&t, &cos_sc, 2000, NULL)) <= band;
        L = st_forecast_loss(&f, &cos_sc, 500, &band);
        cover_mid += fabs(L - st_forecast_loss(&t, &cos_sc, 500, NULL)) <= band;
    }
    printf("band: %d fits of 400; truth covered %.3f at the end, %.3f at step 500 (stated %.2f)\n", fits,
           (double)cover_end / fits, (double)cover_mid / fits, ST_FORECAST_LEVEL);
    CHECK(fits >= 390, "%d of 400 fits converged", fits);
    CHECK(fabs((double)cover_end / fits - ST_FORECAST_LEVEL) < 0.035, "coverage at the end %.3f", (double)cover_end / fits);
    CHECK(fabs((double)cover_mid / fits - ST_FORECAST_LEVEL) < 0.035, "coverage at step 500 %.3f", (double)cover_mid / fits);

    /* too few points: 4 annealed points for 4 parameters; 3 without annealing for 3 */
    long s4[] = {100, 200, 300, 400};
    double y4[] = {3.0, 2.8, 2.7, 2.65};
    CHECK(!st_forecast_fit(&f, &cos_sc, ST_FORECAST_LAMBDA, 1e12, s4, y4, 4, &err) && f.state == ST_FORECAST_TOO_FEW &&
              strstr(f.why, "too few points"), "%d %s", f.state, f.why);
    CHECK(!st_forecast_fit(&f, &wsd, ST_FORECAST_LAMBDA, 1e12, s4, y4, 3, &err) && f.state == ST_FORECAST_TOO_FEW &&
              strstr(f.why, "at least 4"), "%d %s", f.state, f.why);
    st_stop_rule rule;
    st_stop_decision d;
    CHECK(!st_stop_rule_parse("marginal:1e9", &rule, &err), "%s", err.msg);
    CHECK(!st_stop_rule_decide(&rule, &f, &wsd, 400, 1e12, &d, &err) && d.action == ST_STOP_CONTINUE &&
              strstr(d.why, "too few points"), "too few: %d %s", d.action, d.why);
    /* a fit that cannot be made (a loss that rises as the model trains: A < 0) is reported
     * and never used */
    double up[] = {2.0, 2.1, 2.2, 2.3, 2.4, 2.5, 2.6};
    long s7[] = {100, 200, 300, 400, 500, 600, 700};
    CHECK(!st_forecast_fit(&f, &wsd, ST_FORECAST_LAMBDA, 1e12, s7, up, 7, &err) && f.state == ST_FORECAST_NOT_CONVERGED &&
              strstr(f.why, "not converged"), "rising: %d %s", f.state, f.why);
    CHECK(!st_stop_rule_decide(&rule, &f, &wsd, 700, 1e12, &d, &err) && d.action == ST_STOP_CONTINUE &&
              strstr(d.why, "not converged"), "not converged: %d %s", d.action, d.why);
    /* the parameters stay in the law's range: points where annealing raised the loss (C < 0 in
     * truth) give C at its bound 0, a fit without it; a curve with no floor (L0 0 in truth, a
     * pure power law) gives L0 at its bound, reported as not converged */
    {
        st_forecast up2 = truth(2.0, 1.5, 0.45, -3e-5, 1e12), nofloor = truth(0.0, 1.5, 0.45, 0.0, 1e12);
        rng = 4242;
        int m = draw(&up2, &cos_sc, 20, 2000, 1e-3, steps, y);
        CHECK(!st_forecast_fit(&f, &cos_sc, ST_FORECAST_LAMBDA, 1e12, steps, y, m, &err) && f.state == ST_FORECAST_OK &&
                  f.C == 0 && f.n_params == 3 && f.annealed && strstr(f.why, "C at its bound 0"),
              "C < 0 in truth: %d C %g %s", f.state, f.C, f.why);
        m = draw(&nofloor, &wsd, 20, 1500, 1e-4, steps, y);
        CHECK(!st_forecast_fit(&f, &wsd, ST_FORECAST_LAMBDA, 1e12, steps, y, m, &err) &&
                  f.state == ST_FORECAST_NOT_CONVERGED && strstr(f.why, "L0 went to its bound"),
              "L0 0 in truth: %d L0 %g %s", f.state, f.L0, f.why);
    }
    /* arguments refused */
    long sdown[] = {100, 50};
    CHECK(st_forecast_fit(&f, &wsd, 0.999, 1e12, sdown, y4, 2, &err) == ST_ERR_INVALID, "descending steps");
    double ynan[] = {1, NAN};
    CHECK(st_forecast_fit(&f, &wsd, 0.999, 1e12, s4, ynan, 2, &err) == ST_ERR_NONFINITE, "NaN loss");

    /* the rule on a long wsd run (8000 steps, 1e12 FLOPs a step): the true gain falls as
     * the run goes on; EPS set to the true gain at step 2000 fires there (on the truth)
     * and, on fits to noisy points every 50 steps, at an evaluation within 10% of it */
    st_schedule lng;
    CHECK(!st_schedule_init(&lng, "wsd", "1-sqrt", 3e-3, 0.1, 0.1, 8000, 50, &err), "%s", err.msg);
    double eps = st_forecast_gain_per_pflop(&t, &lng, 2000);
    CHECK(eps > 0 && st_forecast_gain_per_pflop(&t, &lng, 1000) > eps && st_forecast_gain_per_pflop(&t, &lng, 3000) < eps,
          "the gain does not fall: %g", eps);
    /* the gain is what a stable step buys now: the slope of the curve with the rate held */
    {
        st_schedule held = lng;
        held.kind = ST_SCHEDULE_CONSTANT;
        double g = (st_forecast_loss(&t, &held, 2000, NULL) - st_forecast_loss(&t, &held, 2001, NULL)) / 1e-3;
        CHECK(fabs(eps / g - 1) < 1e-9, "wsd gain %g, the held curve's slope %g", eps, g);
    }
    rule.kind = ST_STOP_RULE_MARGINAL, rule.value = eps;
    CHECK(!st_stop_rule_decide(&rule, &t, &lng, 1950, 1e12, &d, &err) && d.action == ST_STOP_CONTINUE, "1950: %s", d.why);
    CHECK(!st_stop_rule_decide(&rule, &t, &lng, 2050, 1e12, &d, &err) && d.action == ST_STOP_DECAY &&
              d.decay_start == 2050 && d.end_step == 2850 && d.flops_saved == (8000 - 2850) * 1e12,
          "2050: %d %ld %ld %g %s", d.action, d.decay_start, d.end_step, d.flops_saved, d.why);
    rng = 99;
    int n = draw(&t, &lng, 50, 7200, 2e-3, steps, y);
    long fired = -1;
    for (int k = 5; k <= n && fired < 0; k++) {
        st_forecast g;
        if (st_forecast_fit(&g, &lng, ST_FORECAST_LAMBDA, 1e12, steps, y, k, &err)) break;
        st_stop_decision a, b;
        st_stop_rule_decide(&rule, &g, &lng, steps[k - 1], 1e12, &a, &err);
        st_stop_rule_decide(&rule, &g, &lng, steps[k - 1], 1e12, &b, &err);
        CHECK(!memcmp(&a, &b, sizeof a), "the same inputs decided twice differ");
        if (a.action == ST_STOP_DECAY) fired = steps[k - 1];
    }
    printf("marginal rule: the truth crosses at 2000; the fits fired at %ld\n", fired);
    CHECK(fired >= 1800 && fired <= 2200, "fired at %ld, not within 10%% of 2000", fired);
    /* the same rule on a cosine run stops (no decay to start) */
    st_schedule lc = lng;
    lc.kind = ST_SCHEDULE_COSINE;
    rule.value = st_forecast_gain_per_pflop(&t, &lc, 2000) * 1.0001;
    CHECK(!st_stop_rule_decide(&rule, &t, &lc, 2000, 1e12, &d, &err) && d.action == ST_STOP_END && d.end_step == 2000,
          "cosine: %d %ld %s", d.action, d.end_step, d.why);
    /* budget: 5000 steps' FLOPs: the decay (800 steps) starts after 4200 */
    CHECK(!st_stop_rule_parse("budget:5e15", &rule, &err), "%s", err.msg);
    CHECK(!st_stop_rule_decide(&rule, NULL, &lng, 100, 1e12, &d, &err) && d.action == ST_STOP_DECAY &&
              d.decay_start == 4200 && d.end_step == 5000, "budget: %d %ld %ld %s", d.action, d.decay_start, d.end_step,
          d.why);
    CHECK(st_stop_rule_decide(&rule, NULL, &lng, 5001, 1e12, &d, &err) == ST_ERR_INVALID && strstr(err.msg, "'stop_rule'"),
          "a spent budget: %s", err.msg);
    CHECK(!st_stop_rule_parse("budget:1e20", &rule, &err) && !st_stop_rule_decide(&rule, NULL, &lng, 100, 1e12, &d, &err) &&
              d.action == ST_STOP_CONTINUE, "a budget larger than the run");
    /* target: reached by decaying now / never within the budget / maybe later */
    st_schedule at = lng;
    at.decay_start = 3000;
    double l3000 = st_forecast_loss(&t, &at, 3800, NULL), lend = st_forecast_loss(&t, &lng, 8000, NULL);
    rule.kind = ST_STOP_RULE_TARGET, rule.value = l3000 + 1e-6;
    CHECK(!st_stop_rule_decide(&rule, &t, &lng, 3000, 1e12, &d, &err) && d.action == ST_STOP_DECAY && d.end_step == 3800,
          "target reached: %d %s", d.action, d.why);
    rule.value = lend - 0.01;
    CHECK(!st_stop_rule_decide(&rule, &t, &lng, 3000, 1e12, &d, &err) && d.action == ST_STOP_DECAY &&
              strstr(d.why, "not reached"), "target unreachable: %d %s", d.action, d.why);
    rule.value = lend + 1e-3;
    CHECK(!st_stop_rule_decide(&rule, &t, &lng, 3000, 1e12, &d, &err) && d.action == ST_STOP_CONTINUE,
          "target later: %d %s", d.action, d.why);
    /* a decay that has begun runs to its end */
    CHECK(!st_stop_rule_decide(&rule, &t, &at, 3100, 1e12, &d, &err) && d.action == ST_STOP_CONTINUE, "decaying: %s", d.why);

    /* a probe anneal: the stable part of a wsd run to step 500 cannot fit C (S2 0 at all of its
     * points), a branch that forked there and decayed over 100 steps can: with its points (each
     * with its own schedule's areas) the law comes back and so does the planned end's loss,
     * its decay's drop included; without them the end is the curve without the drop */
    {
        st_schedule probe;
        CHECK(!st_schedule_init(&probe, "wsd", "1-sqrt", 3e-3, 0.1, 100.0 / 600, 600, 50, &err), "%s", err.msg);
        CHECK(st_schedule_decay_begin(&probe) == 500, "the probe forks at %ld", st_schedule_decay_begin(&probe));
        static long ps[64];
        static double py[64];
        rng = 4242;
        int n = draw(&t, &wsd, 10, 500, 2e-4, steps, y), np = 0;
        for (long s = 510; s <= 600; s += 10, np++) {
            ps[np] = s;
            py[np] = st_forecast_loss(&t, &probe, s, NULL) + 2e-4 * gauss();
        }
        int first = st_forecast_first_point(steps, n, -1);
        double truth_end = st_forecast_loss(&t, &wsd, 2000, NULL), band;
        CHECK(!st_forecast_fit(&f, &wsd, ST_FORECAST_LAMBDA, 1e12, steps + first, y + first, n - first, &err) &&
                  f.state == ST_FORECAST_OK && !f.annealed && f.C == 0, "without the probe: %s", f.why);
        double plain = st_forecast_loss(&f, &wsd, 2000, NULL);
        CHECK(!st_forecast_fit_probe(&f, &wsd, ST_FORECAST_LAMBDA, 1e12, steps + first, y + first, n - first, &probe, ps,
                                     py, np, &err),
              "%s", err.msg);
        double end = st_forecast_loss(&f, &wsd, 2000, &band);
        CHECK(f.state == ST_FORECAST_OK && f.annealed && f.n_probe == np && f.last_step == 500 && strstr(f.why, "probe"),
              "with the probe: %s", f.why);
        CHECK(fabs(f.C / t.C - 1) < 0.05 && fabs(end / truth_end - 1) < 0.002 && fabs(end - truth_end) < band,
              "probe: C %g (truth %g), end %.5f +- %.5f (truth %.5f)", f.C, t.C, end, band, truth_end);
        CHECK(plain - truth_end > 0.05, "without the probe the end misses the drop: %.5f against %.5f", plain, truth_end);
        printf("probe anneal: C %.6f (truth %.6f), end %.5f +- %.5f (truth %.5f; without the probe %.5f)\n", f.C, t.C,
               end, band, truth_end, plain);
        ps[3] = ps[2]; /* the probe's points out of order: refused, naming the probe's */
        CHECK(st_forecast_fit_probe(&f, &wsd, ST_FORECAST_LAMBDA, 1e12, steps, y, n, &probe, ps, py, np, &err) ==
                      ST_ERR_INVALID && strstr(err.msg, "probe's"), "%s", err.msg);
    }

    /* the key's refusals, each naming it */
    const char *bad[] = {"marginal:-1", "marginal:nan", "marginal:", "target:0", "target:inf", "budget:-5", "budget:1e3x",
                         "foo:1", "marginal", "target:-2.5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err.msg[0] = 0;
        CHECK(st_stop_rule_parse(bad[i], &rule, &err) == ST_ERR_INVALID && strstr(err.msg, "'stop_rule'"), "%s: %s", bad[i],
              err.msg);
    }
    CHECK(!st_stop_rule_parse("none", &rule, &err) && rule.kind == ST_STOP_RULE_NONE, "none");
    CHECK(!st_stop_rule_parse("marginal:0.5", &rule, &err) && st_stop_rule_check(&rule, 0, 1, &err) == ST_ERR_INVALID &&
              strstr(err.msg, "'eval_every'"), "eval_every 0: %s", err.msg);
    CHECK(st_stop_rule_check(&rule, 50, 0, &err) == ST_ERR_INVALID && strstr(err.msg, "'val_data'"), "no val: %s", err.msg);
    CHECK(!st_stop_rule_parse("budget:1e18", &rule, &err) && st_stop_rule_check(&rule, 0, 1, &err) == ST_ERR_INVALID &&
              strstr(err.msg, "'eval_every'"), "budget decides after evaluations too: %s", err.msg);
    return test_finish("forecast");
}
