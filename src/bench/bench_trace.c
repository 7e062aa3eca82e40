/* bench_trace.c - strata bench trace: what the profiler costs. The same short training
 * runs with the trace recording odd steps and not even ones (train key trace = 2), so
 * traced and untraced steps are interleaved one by one: the load of a shared machine,
 * which drifts over seconds, falls on both alike. Each step's time comes from the run's
 * own metrics.jsonl (its "traced" field says which kind it was); the first step of each
 * run (warm-up) is left out; overhead = median traced / median untraced - 1. The trace
 * writer's formatting, done on its own thread, lands on either kind of step and so is
 * counted half; it is a few microseconds per step.
 *
 * On a loaded machine step times scatter by far more than 1%, so the same figure is also
 * estimated from CPU cost, which load does not change: events per traced step times the
 * cost of one event (timed here in a tight loop), plus the writer's CPU time per traced
 * step (its thread's CPU clock), over the untraced step time. */
#include <ftw.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench/bench.h"
#include "strata/prof.h"
#include "strata/train.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median of v[0..n) (sorts v). */
static double median(double *v, int n) {
    if (n <= 0) return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

/* Append the step times (seconds) of steps >= 2 of run_dir/metrics.jsonl to on[] or off[]
 * by their "traced" field. */
static int read_step_times(const char *run_dir, double *on, int *n_on, double *off, int *n_off, int cap) {
    char path[2048];
    st_run_path(path, sizeof path, run_dir, ST_RUN_METRICS);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[8192];
    while (fgets(line, sizeof line, f)) {
        json_object *o = json_tokener_parse(line), *st, *ms, *tr;
        if (o && json_object_object_get_ex(o, "step", &st) && json_object_object_get_ex(o, "step_ms", &ms) &&
            json_object_object_get_ex(o, "traced", &tr) && json_object_get_int(st) >= 2) {
            if (json_object_get_boolean(tr) && *n_on < cap) on[(*n_on)++] = json_object_get_double(ms) / 1e3;
            else if (!json_object_get_boolean(tr) && *n_off < cap) off[(*n_off)++] = json_object_get_double(ms) / 1e3;
        }
        if (o) json_object_put(o);
    }
    fclose(f);
    return 0;
}

/* Nanoseconds per span (begin + end + ring store) while a trace is open: a tight loop
 * of half a ring, so nothing is dropped whatever the writer does. */
static double span_cost_ns(const char *root) {
    char path[1024];
    snprintf(path, sizeof path, "%s/span_cost.json", root);
    st_err err = {0};
    if (st_prof_trace_start(path, "span cost", &err)) return NAN;
    const int reps = 30000;
    double best = 1e30;
    for (int r = 0; r < 2; r++) { /* the first pass touches the ring's pages */
        double t0 = st_now();
        for (int i = 0; i < reps / 2; i++) {
            st_prof_span s = st_prof_begin(ST_PROF_CAT_COMPUTE, "span", i);
            st_prof_end(&s);
        }
        double dt = st_now() - t0;
        if (dt < best) best = dt;
    }
    st_prof_trace_stop(&err);
    remove(path);
    return best / (reps / 2) * 1e9;
}

static long count_events(const char *path) {
    json_object *root = json_object_from_file(path), *evs;
    long n = -1;
    if (root && json_object_object_get_ex(root, "traceEvents", &evs)) n = (long)json_object_array_length(evs);
    if (root) json_object_put(root);
    return n;
}

static void usage(FILE *f) {
    fprintf(f, "usage: strata bench trace [--model NAME] [--batch B] [--seq T] [--steps N] [--runs R]\n"
               "                          [--threads N] [--keep DIR] [--json]\n"
               "  Trains the same model R times for N steps, tracing odd steps and not even ones, and\n"
               "  compares the median time of traced and untraced steps (first step of each run left\n"
               "  out). Prints step_s_traced, step_s_untraced and overhead = traced/untraced - 1, and\n"
               "  the same ratio per run (its spread shows the machine's noise).\n"
               "  Defaults: gpt2-mini, batch 8, seq 128, 40 steps, 3 runs.\n");
}

int bench_trace(int argc, char **argv) {
    const char *model = "gpt2-mini", *keep = NULL;
    int B = 8, T = 128, steps = 40, runs = 3, threads = 0, json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(a, "--batch") && i + 1 < argc) B = atoi(argv[++i]);
        else if (!strcmp(a, "--seq") && i + 1 < argc) T = atoi(argv[++i]);
        else if (!strcmp(a, "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(a, "--runs") && i + 1 < argc) runs = atoi(argv[++i]);
        else if (!strcmp(a, "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(a, "--keep") && i + 1 < argc) keep = argv[++i];
        else { fprintf(stderr, "strata bench trace: unknown or incomplete option '%s'\n", a); usage(stderr); return 2; }
    }
    if (B < 1 || T < 1 || steps < 5 || runs < 1) {
        fprintf(stderr, "strata bench trace: need batch, seq >= 1, steps >= 5, runs >= 1\n");
        return 2;
    }
    char root[900]; /* leaves room in run_dir (1024) for the run's name */
    if (keep) {
        snprintf(root, sizeof root, "%s", keep);
        mkdir(root, 0755);
    } else {
        snprintf(root, sizeof root, "/tmp/strata-bench-trace-XXXXXX");
        if (!mkdtemp(root)) { perror("strata bench trace: mkdtemp"); return 1; }
    }
    int cap = runs * steps + 1;
    double *t_on = malloc(sizeof(double) * (size_t)cap), *t_off = malloc(sizeof(double) * (size_t)cap);
    double *run_ratio = malloc(sizeof(double) * (size_t)runs), *tmp = malloc(sizeof(double) * (size_t)cap);
    int n_on = 0, n_off = 0, rc = 0;
    long trace_bytes = 0, events = 0, traced_steps = 0;
    double writer_cpu = 0;
    for (int r = 0; r < runs && !rc; r++) {
        st_train_config cfg;
        st_train_config_defaults(&cfg);
        st_err err = {0};
        snprintf(cfg.model, sizeof cfg.model, "%s", model);
        cfg.batch = B, cfg.seq = T, cfg.steps = steps, cfg.warmup_steps = 2, cfg.quiet = 1, cfg.threads = threads;
        snprintf(cfg.run_dir, sizeof cfg.run_dir, "%s/run_%d", root, r);
        if (st_train_config_set(&cfg, "trace", "2", &err)) {
            fprintf(stderr, "strata bench trace: %s\n", err.msg);
            rc = 1;
            break;
        }
        if (!json) fprintf(stderr, "  run %d of %d ...\n", r + 1, runs);
        if (st_train_run(&cfg, NULL, &err)) {
            fprintf(stderr, "strata bench trace: %s\n", err.msg);
            rc = 1;
            break;
        }
        int on0 = n_on, off0 = n_off;
        read_step_times(cfg.run_dir, t_on, &n_on, t_off, &n_off, cap);
        memcpy(tmp, t_on + on0, sizeof(double) * (size_t)(n_on - on0));
        double m_on = median(tmp, n_on - on0);
        memcpy(tmp, t_off + off0, sizeof(double) * (size_t)(n_off - off0));
        run_ratio[r] = m_on / median(tmp, n_off - off0) - 1;
        char path[2100];
        struct stat sb;
        snprintf(path, sizeof path, "%s/trace.json", cfg.run_dir);
        writer_cpu += st_prof_trace_writer_cpu_s();
        traced_steps += (steps + 1) / 2;
        if (stat(path, &sb) == 0) trace_bytes = (long)sb.st_size, events += count_events(path);
        else {
            fprintf(stderr, "strata bench trace: %s was not written\n", path);
            rc = 1;
        }
    }
    if (!rc && (n_on == 0 || n_off == 0)) {
        fprintf(stderr, "strata bench trace: no steps were timed (traced %d, untraced %d)\n", n_on, n_off);
        rc = 1;
    }
    if (!rc) {
        int timed_on = n_on, timed_off = n_off;
        double on = median(t_on, n_on), off = median(t_off, n_off), overhead = on / off - 1;
        double rr_med = median(run_ratio, runs), rr_lo = run_ratio[0], rr_hi = run_ratio[runs - 1];
        double span_ns = span_cost_ns(root), ev_per_step = (double)events / (double)traced_steps;
        double writer_per_step = writer_cpu / (double)traced_steps;
        double cpu_overhead = (ev_per_step * span_ns * 1e-9 + writer_per_step) / off;
        if (json)
            printf("{\"model\":\"%s\",\"batch\":%d,\"seq\":%d,\"steps_per_run\":%d,\"runs\":%d,"
                   "\"steps_traced\":%d,\"steps_untraced\":%d,\"step_s_traced\":%.9g,\"step_s_untraced\":%.9g,"
                   "\"overhead\":%.5f,\"overhead_per_run_median\":%.5f,\"overhead_per_run_min\":%.5f,"
                   "\"overhead_per_run_max\":%.5f,\"trace_bytes_per_run\":%ld,\"events_per_traced_step\":%.1f,"
                   "\"span_ns\":%.1f,\"writer_cpu_s_per_traced_step\":%.3g,\"overhead_cpu_estimate\":%.3g}\n",
                   model, B, T, steps, runs, timed_on, timed_off, on, off, overhead, rr_med, rr_lo, rr_hi,
                   trace_bytes, ev_per_step, span_ns, writer_per_step, cpu_overhead);
        else
            printf("trace overhead: %s, batch %d x seq %d, %d runs of %d steps (%d traced, %d untraced steps timed)\n"
                   "  step_s_untraced  %.6f (median)\n  step_s_traced    %.6f (median)\n"
                   "  overhead         %+.2f%%  (target <= 1%%)\n  per run          %+.2f%% median, %+.2f%% to %+.2f%%\n"
                   "  trace.json       %ld bytes per run, %.1f events per traced step\n"
                   "  CPU estimate     %.1f ns per event, writer %.1f us per traced step: overhead %.4f%%\n",
                   model, B, T, runs, steps, timed_on, timed_off, off, on, 100 * overhead, 100 * rr_med, 100 * rr_lo,
                   100 * rr_hi, trace_bytes, ev_per_step, span_ns, writer_per_step * 1e6, 100 * cpu_overhead);
    }
    free(t_on);
    free(t_off);
    free(run_ratio);
    free(tmp);
    if (!keep) nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return rc;
}
