/* bench/bench_pair.h - the scaffolding the frozen-base method benchmarks share (bench lora, bench
 * poet): the command line both take, full AdamW training of a model against a method wrapped
 * around a frozen copy of the same model (same preset, same seed), the two steps alternated on
 * one batch with the order flipped every pair, medians, the load average. Each benchmark keeps
 * its own options, its byte classes and its output (bench_pair.c). */
#ifndef STRATA_BENCH_PAIR_H
#define STRATA_BENCH_PAIR_H

#include <stdint.h>

#include "strata/model.h"
#include "strata/optim.h"

/* One side of the comparison: a model and the AdamW (fp32 states) over all its parameters. */
typedef struct bench_side {
    st_model *m;
    st_optim *opt;
    st_optim_segment *segs;
    long step;
    float loss; /* after the last step */
} bench_side;

/* An option a benchmark adds to the common ones: kind 'f' a flag (sets the int to 1), 's' a
 * string, 'i' an int (atoi), 'd' a double (atof). */
typedef struct bench_opt {
    const char *name;
    char kind;
    void *value;
} bench_opt;

/* Wraps the method around base (the pair's model, random weights seed 1); takes base whatever it
 * returns, as st_lora_model_create and st_poetx_model_create do. */
typedef st_status (*bench_pair_wrap)(void *ctx, st_model **out, st_model *base, st_err *err);

typedef struct bench_pair {
    const char *name; /* "lora": the messages' prefix, "strata bench lora: " */
    /* the command line both take (bench_pair_init's defaults) */
    const char *model;
    int batch, seq, steps, threads, json;
    /* after bench_pair_run */
    st_backend *be;
    bench_side full, method;
    int32_t *in, *tg;             /* the batch, batch x seq tokens each (one allocation) */
    double *t_full, *t_method;    /* the timed steps, seconds (one allocation; sorted by the medians) */
    double med_full, med_method;  /* their medians, seconds */
    double loadavg;               /* the 1-minute load average after the steps (0 no /proc, -1 unread) */
    st_err err;
} bench_pair;

/* Defaults: gpt2-mini, batch 8 x seq 128, 7 timed pairs, all cores, text output. */
void bench_pair_init(bench_pair *p, const char *name);

/* Parses argv (argv[0] the benchmark's name): --help/-h, --json, --model, --batch, --seq,
 * --steps, --threads and the benchmark's own opts[n_opts]. Returns -1 to go on, else the exit
 * code: 0 after --help (usage printed), 2 on a bad command line (said on stderr with usage). */
int bench_pair_parse(bench_pair *p, int argc, char **argv, const char *usage, const bench_opt *opts, int n_opts);

/* Builds both sides on the CPU backend (the full model and wrap's, each with activations for the
 * batch and its AdamW), one warm-up step each, then the timed pairs, alternated; sets the
 * medians and the load average. Returns 0, or 1 with the reason said on stderr and all it made
 * freed (bench_pair_free). */
int bench_pair_run(bench_pair *p, bench_pair_wrap wrap, void *ctx);

/* Frees all bench_pair_run made and zeroes p (a second call frees nothing). */
void bench_pair_free(bench_pair *p);

#endif
