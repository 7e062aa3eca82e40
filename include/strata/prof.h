/* prof.h - the profiler: trace spans and counters, GPU telemetry, step metrics, and
 * the memory estimate a run is checked against before anything is allocated.
 *
 * Spans mark phases of work on the calling thread; they nest like the code does:
 *
 *     st_prof_span s = st_prof_begin(ST_PROF_CAT_COMPUTE, "forward block", l);  // "forward block 3"
 *     ...                                                             // the block's ops
 *     st_prof_end(&s);
 *
 *     st_prof_span io = st_prof_begin(ST_PROF_CAT_IO, "checkpoint write", -1);
 *     ...
 *     st_prof_end_bytes(&io, bytes_written);   // bytes shown in the trace, and a bandwidth track
 *
 *     st_prof_counter("host memory (bytes)", rss);   // a counter track
 *
 * Names and counter names are stored by pointer: pass string literals (or strings that
 * live until st_prof_trace_stop). Each thread writes into its own lock-free ring buffer
 * (single producer, single consumer); a writer thread drains the rings into Chrome trace
 * JSON (opens in Perfetto and chrome://tracing), so a span costs two clock reads and a
 * store. A full ring drops events and counts them (the trace's otherData says how many).
 * When no trace is open and no step is being timed on the thread, st_prof_begin returns at
 * once and st_prof_end does nothing.
 *
 * A run (st_prof_run) ties it together for the training loop: it opens the trace, starts the
 * GPU sampler, times each step and its phases (the spans directly inside the step span),
 * and gives the extra fields of each metrics.jsonl line:
 *
 * Example:
 *
 *     st_err err = {0};
 *     st_prof_run *pr = NULL;                   // run_dir/trace.json, opens in Perfetto
 *     st_prof_run_config rc = {.run_dir = "/tmp", .trace = 1, .label = "example", .last_step = 3};
 *     if (st_prof_run_open(&pr, &rc, &err) != ST_OK) fprintf(stderr, "strata: %s\n", err.msg);
 *     for (long step = 1; step <= 3; step++) {
 *         st_prof_step_begin(pr, step);
 *         for (int l = 0; l < 2; l++) {
 *             st_prof_span s = st_prof_begin(ST_PROF_CAT_COMPUTE, "forward block", l);  // "forward block 1"
 *             st_prof_end(&s);
 *         }
 *         st_prof_span io = st_prof_begin(ST_PROF_CAT_IO, "checkpoint write", -1);
 *         st_prof_end_bytes(&io, 4096);         // bytes shown in the trace, and a bandwidth track
 *         st_prof_counter("host memory (bytes)", 1e9);   // a counter track
 *         st_prof_step_end(pr);
 *         printf("{\"step\": %ld%s}\n", step, st_prof_step_json(pr)); // a metrics.jsonl line
 *     }
 *     st_prof_run_close(pr, &err);
 *
 * End of example.
 *
 * Every st_prof_run function accepts NULL and then does nothing.
 */
#ifndef STRATA_PROF_H
#define STRATA_PROF_H

#include <stdint.h>
#include <stdio.h>

#include "strata/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ trace */

/* What a span's time is spent on. COPY and IO spans on the step thread count as exposed
 * (non-overlapped) transfer time; with bytes they also draw a bandwidth counter track.
 * Append-only. */
typedef enum st_prof_cat {
    ST_PROF_CAT_STEP = 0,      /* one training step */
    ST_PROF_CAT_DATA = 1,      /* waiting for the next batch */
    ST_PROF_CAT_COMPUTE = 2,   /* forward and backward */
    ST_PROF_CAT_RECOMPUTE = 3, /* forward again for activation checkpointing */
    ST_PROF_CAT_COPY = 4,      /* host <-> device copies (bytes) */
    ST_PROF_CAT_IO = 5,        /* disk reads and writes (bytes) */
    ST_PROF_CAT_OPTIM = 6,     /* gradient norm, optimizer update */
    ST_PROF_CAT_OTHER = 7,
    ST_PROF_CAT_COUNT
} st_prof_cat;

const char *st_prof_cat_name(st_prof_cat c);

typedef struct st_prof_span {
    uint64_t t0_ns; /* 0: not recorded (profiling off when it began) */
    const char *name;
    int32_t index; /* >= 0: appended to the name ("forward block 3") and given as args.index */
    int16_t cat;
    int16_t transparent; /* a STEP span inside another span: its children are phases of the outer step */
} st_prof_span;

/* Nanoseconds on CLOCK_MONOTONIC: the clock of every span, counter and GPU sample. */
uint64_t st_prof_now_ns(void);

st_prof_span st_prof_begin(st_prof_cat cat, const char *name, int index);
void st_prof_end(st_prof_span *s);
/* End a span that moved bytes (copy, read, write): args.bytes in the trace. */
void st_prof_end_bytes(st_prof_span *s, int64_t bytes);

/* A span for the rest of the enclosing block (GCC/Clang cleanup attribute). */
static inline void st_prof_scope_end_(st_prof_span *s) { st_prof_end(s); }
#define ST_PROF_CONCAT2_(a, b) a##b
#define ST_PROF_CONCAT_(a, b) ST_PROF_CONCAT2_(a, b)
#define ST_PROF_SCOPE(cat, name, index) \
    st_prof_span ST_PROF_CONCAT_(prof_scope_, __LINE__) __attribute__((cleanup(st_prof_scope_end_))) = st_prof_begin(cat, name, index)

/* A span measured elsewhere, between t0_ns and t1_ns on st_prof_now_ns's clock, drawn on
 * the GPU process's track (the executor's device-timed compute: CUDA events); no-op when
 * no trace is open. */
void st_prof_span_gpu(st_prof_cat cat, const char *name, int index, uint64_t t0_ns, uint64_t t1_ns);
/* A sample of a counter track (process "strata"); no-op when no trace is open. */
void st_prof_counter(const char *name, double value);
/* The same on the GPU process's tracks (NVML samples). */
void st_prof_counter_gpu(const char *name, double value);
/* Name the calling thread in the trace ("main", "nvml sampler"). */
void st_prof_thread_name(const char *name);

/* Open a trace file; process_name labels the process ("strata train gpt2-mini"). One
 * trace at a time per process. */
st_status st_prof_trace_start(const char *path, const char *process_name, st_err *err);
/* Drain every ring, write thread names and totals, close the file. Call when no traced
 * work is running on other threads. */
st_status st_prof_trace_stop(st_err *err);
int st_prof_trace_active(void);
/* Stop and restart recording while the trace stays open (bench trace alternates steps).
 * Call between spans: a span that ends while paused is not recorded. */
void st_prof_trace_pause(int paused);
/* CPU seconds the last trace spent formatting and writing (writer thread and the final
 * drain): the part of its cost that is not on the traced threads. */
double st_prof_trace_writer_cpu_s(void);
/* Events dropped because a ring was full, in the current or last trace. */
uint64_t st_prof_trace_dropped(void);

/* Phase times of the calling thread: spans that ended directly inside the outermost open
 * span (depth 1), summed by name, since st_prof_phase_reset. Used by st_prof_run. A STEP span
 * opened inside another span (an executor's own step inside the training loop's) does
 * not count as a level: its children are the phases. */
#define ST_PROF_MAX_PHASES 24
typedef struct st_prof_phases {
    int n;
    const char *name[ST_PROF_MAX_PHASES];
    double seconds[ST_PROF_MAX_PHASES];
    double exposed_xfer_s; /* outermost COPY/IO spans on this thread (any depth) */
    int64_t xfer_bytes;    /* bytes of those spans */
} st_prof_phases;
void st_prof_phase_accounting(int on); /* on this thread: time spans even with no trace open */
void st_prof_phase_reset(void);
void st_prof_phase_read(st_prof_phases *out);

/* ------------------------------------------------------------------ GPU telemetry */

/* NVML, loaded at run time with dlopen (libnvidia-ml.so.1, or $STRATA_NVML_LIB), sampled
 * on a side thread at hz (10..100) into GPU counter tracks. Where there is no NVML or no
 * GPU it returns ST_ERR_UNSUPPORTED with the reason, and logs it once per process. */
typedef struct st_prof_gpu st_prof_gpu;
st_status st_prof_gpu_open(st_prof_gpu **out, double hz, st_err *err);
int st_prof_gpu_count(const st_prof_gpu *g);
/* Since the last call: 1 - mean SM clock / max SM clock over the samples of device 0
 * (0 with no samples), and the OR of the clock-event (throttle) reasons seen. */
void st_prof_gpu_take_summary(st_prof_gpu *g, double *freq_lost, uint64_t *reasons, int *samples);
void st_prof_gpu_close(st_prof_gpu *g);

/* ------------------------------------------------------------------ machine facts */

/* VmHWM and VmRSS of this process (bytes), from /proc/self/status; 0 if unreadable. */
double st_prof_host_peak_bytes(void);
double st_prof_host_rss_bytes(void);
/* MemAvailable from /proc/meminfo (bytes); 0 if unreadable. */
double st_prof_host_available_bytes(void);
/* Peak FP32 FLOP/s of this machine as measured: the best of a few square sgemm calls on
 * the current OpenMP thread count; measured once per process (about 0.1 s). */
double st_prof_peak_flops(void);

/* ------------------------------------------------------------------ a training run */

typedef struct st_prof_run_config {
    const char *run_dir;     /* trace.json goes here */
    int trace;               /* 1: write run_dir/trace.json; 2: the same, recording odd steps only
                                (strata bench trace compares them with the even steps) */
    const char *label;       /* process name in the trace */
    double flops_per_step;   /* model FLOPs of one optimizer step */
    double tokens_per_step;
    long last_step;          /* for the ETA */
    double host_plan_bytes;  /* the memory estimate's peak host bytes (st_mem_plan) */
    int progress;            /* 1: a live progress line when stdout is a terminal */
    double gpu_hz;           /* NVML sampling rate; 0: 20 Hz */
} st_prof_run_config;

typedef struct st_prof_step_stats {
    long step;
    int traced;              /* the step was recorded in the trace */
    double step_s;
    st_prof_phases phases;      /* plus "other": step_s minus the phases */
    double achieved_flops, peak_flops;
    double host_peak_bytes, host_rss_bytes;
    double gpu_freq_lost;    /* -1: no GPU */
    uint64_t gpu_reasons;
} st_prof_step_stats;

typedef struct st_prof_run st_prof_run;
st_status st_prof_run_open(st_prof_run **out, const st_prof_run_config *cfg, st_err *err);
void st_prof_step_begin(st_prof_run *r, long step);
void st_prof_step_end(st_prof_run *r);
const st_prof_step_stats *st_prof_step_last(const st_prof_run *r);
/* The step's extra metrics.jsonl fields, starting with a comma; valid until the next step. */
const char *st_prof_step_json(st_prof_run *r);
/* On a terminal: redraw the live progress line (step, loss, tokens/s, ETA) / erase it
 * before other output. Nothing when stdout is not a terminal or progress is 0. */
void st_prof_progress(st_prof_run *r, long step, double loss);
void st_prof_progress_clear(st_prof_run *r);
st_status st_prof_run_close(st_prof_run *r, st_err *err);

/* Bytes of the regular files directly in dir (a checkpoint's size); -1 if unreadable. */
int64_t st_prof_dir_bytes(const char *dir);

/* ------------------------------------------------------------------ TensorBoard events */

/* A TensorBoard event file in a run directory, so `tensorboard --logdir runs` shows every
 * run: run_dir/events.out.tfevents.<unix seconds>.<hostname>, TFRecord framing (length,
 * masked CRC-32C of it, a tensorflow Event protobuf, masked CRC-32C of that), the first
 * record giving file_version "brain.Event:2", then one Event per call with the step's
 * scalars (stored as float32, as TensorBoard does). A tag's last '/' component is the
 * metrics.jsonl key it mirrors ("train/loss" is "loss"), so the two can be compared.
 *
 *     st_prof_tb *tb;  st_prof_tb_open(&tb, run_dir, &err);
 *     st_prof_tb_scalars(tb, step, tags, values, n, &err);   // one step's scalars, flushed
 *     st_prof_tb_scalar(tb, "val/loss", step, vloss, &err);  // one more, flushed
 *     st_prof_tb_close(tb, &err);
 *
 * Write errors come back as ST_ERR_IO naming the file. The functions after st_prof_tb_open
 * accept a NULL writer and then do nothing. Tags are at most ST_PROF_TB_TAG_MAX bytes. */
#define ST_PROF_TB_TAG_MAX 256
typedef struct st_prof_tb st_prof_tb;
st_status st_prof_tb_open(st_prof_tb **out, const char *run_dir, st_err *err);
/* n scalars of one step in one Event, written and flushed. */
st_status st_prof_tb_scalars(st_prof_tb *w, long step, const char *const *tags, const double *values, int n, st_err *err);
st_status st_prof_tb_scalar(st_prof_tb *w, const char *tag, long step, double value, st_err *err);
const char *st_prof_tb_path(const st_prof_tb *w);
/* Flush and close; an error names the file. w is freed either way. */
st_status st_prof_tb_close(st_prof_tb *w, st_err *err);

#ifdef __cplusplus
}
#endif
#endif
