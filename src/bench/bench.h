/* bench/bench.h - strata bench <what>: each benchmark measures one component and prints its
 * figures (--json: one JSON object). They live in src/bench/, apart from the CLI, which only
 * parses the command line and starts them (src/cli/main.c dispatches `strata bench`).
 * Each takes its own argv (argv[0] is the benchmark's name) and returns a process exit code. */
#ifndef STRATA_BENCH_H
#define STRATA_BENCH_H

#include <stdint.h>

int bench_step(int argc, char **argv);    /* one training step vs sgemm at the model's shapes */
int bench_optim(int argc, char **argv);   /* the AdamW engine vs a copy ceiling */
int bench_data(int argc, char **argv);    /* the data pipeline over a synthetic mix */
int bench_trace(int argc, char **argv);   /* the profiler's overhead */
int bench_stream(int argc, char **argv);  /* layer streaming under a device budget vs in memory */
int bench_offload(int argc, char **argv); /* the optimizer step with its state on disk paths */
int bench_tokenize(int argc, char **argv); /* tokenizer.json encode: MB/s on 1 and all threads */
int bench_plan(int argc, char **argv);    /* the planner's prediction vs the measured step */
int bench_dist(int argc, char **argv);    /* data parallel under mpirun vs one process's step */
int bench_sample(int argc, char **argv);  /* KV-cached generation vs recomputing the prefix */
int bench_poet(int argc, char **argv);    /* POET-X over the frozen matmul weights vs full AdamW */
int bench_select(int argc, char **argv); /* data selection vs the full corpus, all FLOPs counted */
int bench_lora(int argc, char **argv);    /* LoRA over the frozen base vs full AdamW: state bytes, step time */

/* Helpers the benchmarks share (bench_util.c): the median of v[n] (sorts v); a cheap
 * deterministic value in [-0.5, 0.5) per index (fills of 10^8 elements, in parallel); a
 * /proc/self/status field such as "VmHWM:" in bytes (-1 when absent). */
double bench_median(double *v, int n);
float bench_hash_unit(uint64_t i);
double bench_proc_status_bytes(const char *field);

#endif
