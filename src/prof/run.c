/* run.c - the profiler's view of a training run: opens the trace and the GPU sampler,
 * times every step and its phases, and gives the step's metrics (tokens/s, FLOP/s
 * against the measured peak, exposed transfer time, memory peaks, GPU clock lost) as
 * metrics.jsonl fields, counter samples and, on a terminal, a live progress line. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "strata/prof.h"

struct st_prof_run {
    st_prof_run_config cfg;
    char label[128];
    st_prof_gpu *gpu;
    st_prof_span step_span;
    long step;
    long steps_seen;
    double t_first_step;   /* st_prof_now_ns of the first step's end, for the ETA */
    long first_step;
    st_prof_step_stats last;
    char json[2048];
    int tty, progress_shown;
    double ema_step_s;     /* smoothed step time: the ETA's rate */
};

st_status st_prof_run_open(st_prof_run **out, const st_prof_run_config *cfg, st_err *err) {
    *out = NULL;
    st_prof_run *r = calloc(1, sizeof *r);
    if (!r) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    r->cfg = *cfg;
    snprintf(r->label, sizeof r->label, "%s", cfg->label ? cfg->label : "strata");
    r->cfg.label = r->label;
    r->cfg.run_dir = NULL; /* not kept: the caller's string may go */
    r->tty = cfg->progress && isatty(STDOUT_FILENO);
    st_prof_thread_name("main");
    if (cfg->trace) {
        char path[2048];
        snprintf(path, sizeof path, "%s/trace.json", cfg->run_dir ? cfg->run_dir : ".");
        st_status s = st_prof_trace_start(path, r->label, err);
        if (s) {
            free(r);
            return s;
        }
    }
    st_err gerr = {0};
    if (st_prof_gpu_open(&r->gpu, cfg->gpu_hz, &gerr) != ST_OK) r->gpu = NULL; /* said once; carry on */
    r->last.peak_flops = st_prof_peak_flops();
    st_prof_counter("peak FP32 (GFLOP/s)", r->last.peak_flops / 1e9);
    st_prof_phase_accounting(1);
    *out = r;
    return ST_OK;
}

void st_prof_step_begin(st_prof_run *r, long step) {
    if (!r) return;
    r->step = step;
    if (r->cfg.trace == 2) st_prof_trace_pause(step % 2 == 0); /* at a step boundary: no span is open */
    st_prof_phase_reset();
    r->step_span = st_prof_begin(ST_PROF_CAT_STEP, "step", (int)step);
}

void st_prof_step_end(st_prof_run *r) {
    if (!r) return;
    uint64_t t0 = r->step_span.t0_ns;
    st_prof_end(&r->step_span);
    uint64_t t1 = st_prof_now_ns();
    st_prof_step_stats *st = &r->last;
    st->step = r->step;
    st->traced = st_prof_trace_active();
    st->step_s = t0 ? (double)(t1 - t0) * 1e-9 : 0;
    st_prof_phase_read(&st->phases);
    double sum = 0;
    for (int i = 0; i < st->phases.n; i++) sum += st->phases.seconds[i];
    if (st->phases.n < ST_PROF_MAX_PHASES && st->step_s > sum) {
        st->phases.name[st->phases.n] = "other";
        st->phases.seconds[st->phases.n++] = st->step_s - sum;
    }
    st->achieved_flops = st->step_s > 0 ? r->cfg.flops_per_step / st->step_s : 0;
    st->host_peak_bytes = st_prof_host_peak_bytes();
    st->host_rss_bytes = st_prof_host_rss_bytes();
    int samples;
    st_prof_gpu_take_summary(r->gpu, &st->gpu_freq_lost, &st->gpu_reasons, &samples);
    if (!samples) st->gpu_freq_lost = -1; /* no GPU, or a step shorter than the sampling period */
    st_prof_counter("host memory resident (bytes)", st->host_rss_bytes);
    st_prof_counter("host memory peak (bytes)", st->host_peak_bytes);
    st_prof_counter("host plan, estimated peak (bytes)", r->cfg.host_plan_bytes);
    st_prof_counter("achieved (GFLOP/s)", st->achieved_flops / 1e9);
    if (r->steps_seen++ == 0) r->first_step = st->step;
    r->ema_step_s = r->steps_seen <= 2 ? st->step_s : 0.9 * r->ema_step_s + 0.1 * st->step_s;

    /* the metrics.jsonl fields */
    char *p = r->json, *end = r->json + sizeof r->json;
    p += snprintf(p, (size_t)(end - p), ",\"phase_ms\":{");
    for (int i = 0; i < st->phases.n && p < end; i++)
        p += snprintf(p, (size_t)(end - p), "%s\"%s\":%.3f", i ? "," : "", st->phases.name[i],
                      st->phases.seconds[i] * 1e3);
    if (p < end)
        p += snprintf(p, (size_t)(end - p),
                      "},\"prof_step_ms\":%.3f,\"exposed_xfer_ms\":%.3f,\"xfer_bytes\":%lld,\"achieved_flops\":%.6g,"
                      "\"peak_flops\":%.6g,\"flops_frac\":%.4f,\"host_peak_bytes\":%.0f,\"host_rss_bytes\":%.0f,"
                      "\"host_plan_bytes\":%.0f,\"traced\":%s",
                      st->step_s * 1e3, st->phases.exposed_xfer_s * 1e3, (long long)st->phases.xfer_bytes,
                      st->achieved_flops, st->peak_flops, st->peak_flops > 0 ? st->achieved_flops / st->peak_flops : 0,
                      st->host_peak_bytes, st->host_rss_bytes, r->cfg.host_plan_bytes, st->traced ? "true" : "false");
    if (p < end && st->gpu_freq_lost >= 0)
        snprintf(p, (size_t)(end - p), ",\"gpu_freq_lost\":%.4f,\"gpu_clock_reasons\":%llu", st->gpu_freq_lost,
                 (unsigned long long)st->gpu_reasons);
}

const st_prof_step_stats *st_prof_step_last(const st_prof_run *r) { return r ? &r->last : NULL; }

const char *st_prof_step_json(st_prof_run *r) { return r ? r->json : ""; }

static void fmt_eta(char *buf, size_t cap, double s) {
    if (!(s >= 0) || s > 1e8) snprintf(buf, cap, "?");
    else if (s >= 3600) snprintf(buf, cap, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
    else if (s >= 60) snprintf(buf, cap, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
    else snprintf(buf, cap, "%.0fs", s);
}

void st_prof_progress(st_prof_run *r, long step, double loss) {
    if (!r || !r->tty) return;
    long last = r->cfg.last_step > 0 ? r->cfg.last_step : step;
    double frac = last > 0 ? (double)step / last : 1;
    char eta[32];
    fmt_eta(eta, sizeof eta, r->ema_step_s * (double)(last - step));
    int width = 24, filled = (int)(frac * width + 0.5);
    char bar[32];
    for (int i = 0; i < width; i++) bar[i] = i < filled ? '#' : '.';
    bar[width] = 0;
    double tok_s = r->last.step_s > 0 ? r->cfg.tokens_per_step / r->last.step_s : 0;
    printf("\r\033[K[%s] %ld/%ld | loss %.4f | %.0f tok/s | %.1f%% of peak FLOP/s | ETA %s", bar, step, last, loss,
           tok_s, r->last.peak_flops > 0 ? 100.0 * r->last.achieved_flops / r->last.peak_flops : 0.0, eta);
    fflush(stdout);
    r->progress_shown = 1;
}

void st_prof_progress_clear(st_prof_run *r) {
    if (!r || !r->tty || !r->progress_shown) return;
    fputs("\r\033[K", stdout);
    r->progress_shown = 0;
}

st_status st_prof_run_close(st_prof_run *r, st_err *err) {
    if (!r) return ST_OK;
    st_prof_progress_clear(r);
    st_prof_phase_accounting(0);
    if (r->step_span.t0_ns) st_prof_end(&r->step_span); /* a step left open by an error */
    /* the trace first: its last drain still reads the GPU track names */
    st_status s = r->cfg.trace ? st_prof_trace_stop(err) : ST_OK;
    st_prof_gpu_close(r->gpu);
    free(r);
    return s;
}
