/* cmd_forecast.c - strata forecast RUN_DIR: the learning-rate-aware loss forecast
 * (strata/forecast.h) fitted to a run's evaluation points (its metrics.jsonl, also while
 * the run is writing it, with config.json's schedule), and what more compute would buy:
 * the loss of a run of the same schedule ending at 2x and 4x the FLOPs spent, the gain of
 * one more step now, and the step where that gain falls below a threshold. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/forecast.h"
#include "strata/schedule.h"
#include "strata/train.h"

static const char *usage =
    "usage: strata forecast RUN_DIR [--json] [--threshold EPS] [--from STEP] [--up_to STEP]\n"
    "  the loss forecast L(s) = L0 + A S1^-alpha - C S2 (learning-rate areas; Tissue et al. 2024) fitted to\n"
    "  RUN_DIR's validation losses, its 95% band, the loss at 2x and 4x the FLOPs spent, and where one more\n"
    "  step's gain falls below EPS loss per PFLOP (default: a tenth of the gain now)\n"
    "  --from STEP    fit only the evaluations from STEP on (default: past the first fifth of the points' steps,\n"
    "                 where the loss falls faster than the law: the model's first rapid phase)\n"
    "  --up_to STEP   fit only the evaluations up to STEP (what the run knew then)\n"
    "  --probe DIR    also fit the points of a probe anneal: a wsd run DIR identical to RUN_DIR up to its decay's\n"
    "                 start F (the same keys, seed and data; its steps and decay_frac chosen so the decay starts at\n"
    "                 F) whose evaluations after F saw the rate decay, so the law's annealing term C is fitted;\n"
    "                 its steps after F are FLOPs spent beside the run (probe_flops_frac). Measured in\n"
    "                 docs/BENCHMARKS.md: the drop of a short early decay does not carry to the planned one\n"
    "  --json         one JSON object\n";

/* the same schedule, ending at step T (wsd: its decay moved, not before `now`) */
static st_schedule ending_at(const st_schedule *sc, long T, long now) {
    st_schedule e = *sc;
    if (e.kind == ST_SCHEDULE_WSD) {
        long k = T - st_schedule_decay_steps(sc);
        e.decay_start = k > now ? k : now;
    } else {
        e.steps = T;
    }
    return e;
}

static void jnum(char *b, size_t n, double x) {
    if (isfinite(x)) snprintf(b, n, "%.9g", x);
    else snprintf(b, n, "null");
}

/* A probe anneal's schedule and its points after its fork (pfirst: the first of them), checked
 * against the run's schedule sc: a wsd run with the same peak rate, warmup and floor, whose
 * decay starts at the fork. 0, or 1 with the message printed. */
static int probe_points(const char *dir, const st_schedule *sc, st_schedule *psc, st_forecast_points *p, int *pfirst,
                        long *fork) {
    st_err err = {0};
    st_train_config cfg;
    st_train_config_defaults(&cfg);
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (st_train_config_load_json(&cfg, path, &err) || st_train_config_schedule(&cfg, psc, &err)) {
        fprintf(stderr, "strata forecast: --probe: %s\n", err.msg);
        return 1;
    }
    const char *bad = psc->kind != ST_SCHEDULE_WSD ? "schedule (a probe is a wsd run)"
                      : psc->lr != sc->lr                ? "lr"
                      : psc->warmup_steps != sc->warmup_steps ? "warmup_steps"
                      : psc->min_lr_frac != sc->min_lr_frac   ? "min_lr_frac"
                                                              : NULL;
    if (bad) {
        fprintf(stderr, "strata forecast: --probe %s: key '%s' differs from the run's; a probe anneal is the run's "
                "own keys with its decay started at the fork\n", path, bad);
        return 1;
    }
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    if (st_forecast_points_read(path, 0, p, &err)) {
        fprintf(stderr, "strata forecast: --probe: %s\n", err.msg);
        return 1;
    }
    psc->decay_start = p->decay_start;
    *fork = st_schedule_decay_begin(psc);
    *pfirst = st_forecast_first_point(p->step, p->n, *fork + 1);
    if (*pfirst >= p->n) {
        fprintf(stderr, "strata forecast: --probe %s: no evaluation after its decay's start (step %ld); evaluate "
                "during the probe's decay (eval_every)\n", path, *fork);
        st_forecast_points_free(p);
        return 1;
    }
    return 0;
}

int cmd_forecast(int argc, char **argv) {
    const char *dir = NULL, *probe_dir = NULL;
    int json = 0;
    double threshold = NAN;
    long up_to = 0, from = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(usage, stdout);
            return 0;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if ((!strcmp(argv[i], "--threshold") || !strcmp(argv[i], "--up_to") || !strcmp(argv[i], "--from")) &&
                   i + 1 < argc) {
            char *end;
            double x = strtod(argv[i + 1], &end);
            if (*end || end == argv[i + 1] || !isfinite(x) || x < 0 || (argv[i][2] == 'u' && x < 1)) {
                fprintf(stderr, "strata forecast: %s %s is not %s\n", argv[i], argv[i + 1],
                        argv[i][2] == 'u' ? "a step >= 1" : "a finite loss decrease per PFLOP >= 0");
                return 2;
            }
            if (argv[i][2] == 'u') up_to = (long)x;
            else if (argv[i][2] == 'f') from = (long)x;
            else threshold = x;
            i++;
        } else if (!strcmp(argv[i], "--probe") && i + 1 < argc) {
            probe_dir = argv[++i];
        } else if (argv[i][0] == '-' || dir) {
            fprintf(stderr, "strata forecast: unexpected argument '%s'\n%s", argv[i], usage);
            return 2;
        } else {
            dir = argv[i];
        }
    }
    if (!dir) {
        fputs(usage, stderr);
        return 2;
    }
    st_err err = {0};
    st_train_config cfg;
    st_train_config_defaults(&cfg);
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    st_schedule sc;
    st_forecast_points pts = {0};
    if (st_train_config_load_json(&cfg, path, &err) || st_train_config_schedule(&cfg, &sc, &err)) {
        fprintf(stderr, "strata forecast: %s\n", err.msg);
        return 1;
    }
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    if (st_forecast_points_read(path, up_to, &pts, &err)) {
        fprintf(stderr, "strata forecast: %s\n", err.msg);
        return 1;
    }
    sc.decay_start = pts.decay_start; /* a stopping rule's decision, as the run took it */
    int first = st_forecast_first_point(pts.step, pts.n, from);
    st_schedule psc;
    st_forecast_points probe = {0};
    int pfirst = 0;
    long fork = 0;
    if (probe_dir && probe_points(probe_dir, &sc, &psc, &probe, &pfirst, &fork)) {
        st_forecast_points_free(&pts);
        return 1;
    }
    st_forecast f;
    if (st_forecast_fit_probe(&f, &sc, ST_FORECAST_LAMBDA, pts.flops_per_step, pts.step + first, pts.loss + first,
                              pts.n - first, probe_dir ? &psc : NULL, probe.step + pfirst, probe.loss + pfirst,
                              probe.n - pfirst, &err)) {
        fprintf(stderr, "strata forecast: %s\n", err.msg);
        st_forecast_points_free(&pts);
        st_forecast_points_free(&probe);
        return 1;
    }
    /* the probe's steps after its fork: spent beside the run, as a share of the run's planned end */
    long probe_steps = probe_dir ? probe.last_step - fork : 0;
    double probe_frac = (double)probe_steps / (double)st_schedule_end(&sc);
    st_forecast_points_free(&probe);
    long now = pts.last_step, end = st_schedule_end(&sc);
    double fps = pts.flops_per_step, spent = (double)now * fps;
    int ok = f.state == ST_FORECAST_OK && now > 0;
    double l_end = NAN, b_end = NAN, l2 = NAN, b2 = NAN, l4 = NAN, b4 = NAN, g_now = NAN, g_end = NAN;
    long cross = -1, s2 = 2 * now, s4 = 4 * now;
    if (ok) {
        l_end = st_forecast_loss(&f, &sc, end, &b_end);
        st_schedule e2 = ending_at(&sc, s2, now), e4 = ending_at(&sc, s4, now);
        l2 = st_forecast_loss(&f, &e2, s2, &b2);
        l4 = st_forecast_loss(&f, &e4, s4, &b4);
        int decaying = sc.kind == ST_SCHEDULE_WSD && now >= st_schedule_decay_begin(&sc);
        g_now = decaying ? NAN : st_forecast_gain_per_pflop(&f, &sc, now);
        st_schedule ee = ending_at(&sc, end, now);
        g_end = st_forecast_gain_per_pflop(&f, &ee, sc.kind == ST_SCHEDULE_WSD ? st_schedule_decay_begin(&ee) : end);
        if (isnan(threshold) && isfinite(g_now)) threshold = g_now / 10;
        /* the gain falls as the run goes on: the first step below the threshold, by bisection
         * over [now, 1000 x now] */
        if (isfinite(threshold) && isfinite(g_now)) {
            long lo = now, hi = 1000 * (now > 0 ? now : 1);
            if (g_now < threshold) cross = now;
            else if (st_forecast_gain_per_pflop(&f, &sc, hi) < threshold) {
                while (hi - lo > 1) {
                    long mid = lo + (hi - lo) / 2;
                    if (st_forecast_gain_per_pflop(&f, &sc, mid) < threshold) hi = mid;
                    else lo = mid;
                }
                cross = hi;
            }
        }
    }
    if (json) {
        char a[12][40];
        jnum(a[0], 40, f.L0), jnum(a[1], 40, f.A), jnum(a[2], 40, f.alpha), jnum(a[3], 40, f.C);
        jnum(a[4], 40, l_end), jnum(a[5], 40, b_end), jnum(a[6], 40, l2), jnum(a[7], 40, b2);
        jnum(a[8], 40, l4), jnum(a[9], 40, b4), jnum(a[10], 40, g_now), jnum(a[11], 40, g_end);
        char th[40], rms[40];
        jnum(th, sizeof th, threshold), jnum(rms, sizeof rms, f.rms);
        printf("{\"run_dir\":\"%s\",\"points\":%d,\"last_step\":%ld,\"flops_per_step\":%.9g,\"flops_spent\":%.9g,"
               "\"schedule\":\"%s\",\"decay_start\":%ld,\"end_step\":%ld,\"state\":\"%s\",\"why\":\"%s\","
               "\"annealed\":%s,\"L0\":%s,\"A\":%s,\"alpha\":%s,\"C\":%s,\"rms\":%s,\"level\":%.2f,"
               "\"loss_end\":%s,\"band_end\":%s,\"steps_2x\":%ld,\"loss_2x\":%s,\"band_2x\":%s,\"steps_4x\":%ld,"
               "\"loss_4x\":%s,\"band_4x\":%s,\"gain_per_pflop_now\":%s,\"gain_per_pflop_end\":%s,\"threshold\":%s,"
               "\"crossing_step\":%ld,\"probe_points\":%d,\"probe_fork\":%ld,\"probe_steps\":%ld,"
               "\"probe_flops_frac\":%.6g}\n",
               dir, pts.n, now, fps, spent, st_schedule_kind_name(sc.kind), pts.decay_start, end,
               f.state == ST_FORECAST_OK ? "ok" : f.state == ST_FORECAST_TOO_FEW ? "too_few_points" : "not_converged",
               f.why, f.annealed ? "true" : "false", a[0], a[1], a[2], a[3], rms, ST_FORECAST_LEVEL, a[4], a[5], s2, a[6],
               a[7], s4, a[8], a[9], a[10], a[11], th, cross, f.n_probe, fork, probe_steps, probe_frac);
    } else {
        printf("forecast of %s: %d evaluation points, to step %ld of %ld (schedule %s)\n", dir, pts.n, now, end,
               st_schedule_kind_name(sc.kind));
        if (f.state != ST_FORECAST_OK) {
            printf("  no forecast: %s\n", f.why);
        } else {
            printf("  fit         L(s) = %.4f + %.4f * S1^-%.4f - %.5f * S2  (%s)\n", f.L0, f.A, f.alpha, f.C, f.why);
            printf("  spent       %.4g FLOPs (%.4g a step)\n", spent, fps);
            if (probe_dir)
                printf("  probe       %s: %d points after its fork at step %ld, %ld steps (%.2f%% of the run's)\n", probe_dir,
                       f.n_probe, fork, probe_steps, 100 * probe_frac);
            printf("  planned end step %ld: loss %.4f +- %.4f (%.0f%% band)%s\n", end, l_end, b_end, ST_FORECAST_LEVEL * 100,
                   f.annealed || end <= st_schedule_decay_begin(&sc) || sc.kind != ST_SCHEDULE_WSD
                       ? ""
                       : "\n              an upper bound: no annealing seen yet, so the decay's drop (C) is not in it nor in the band");
            printf("  2x FLOPs    step %ld: loss %.4f +- %.4f\n", s2, l2, b2);
            printf("  4x FLOPs    step %ld: loss %.4f +- %.4f\n", s4, l4, b4);
            printf("  gain        %.4g loss per PFLOP now, %.4g at the planned end\n", g_now, g_end);
            if (cross >= 0)
                printf("  threshold   %.4g loss per PFLOP: crossed at step %ld (%.4g FLOPs)\n", threshold, cross,
                       (double)cross * fps);
            else if (isfinite(threshold))
                printf("  threshold   %.4g loss per PFLOP: not crossed within 1000x the steps run\n", threshold);
        }
    }
    st_forecast_points_free(&pts);
    return f.state == ST_FORECAST_OK ? 0 : 3;
}
