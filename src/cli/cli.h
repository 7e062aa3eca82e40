/* cli.h - the strata program's subcommands; each returns a process exit code. */
#ifndef STRATA_CLI_H
#define STRATA_CLI_H

int cmd_train(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_data(int argc, char **argv);
int cmd_inspect(int argc, char **argv);

/* strata bench <what> ... */
int bench_step(int argc, char **argv);
int bench_optim(int argc, char **argv);
int bench_data(int argc, char **argv);

/* Parse "100M", "2.5B", "64K", "1G" (decimal multipliers) into a count; -1 on error. */
double cli_parse_count(const char *s);
/* Parse "512MiB", "2GiB", "1000" (bytes) ; -1 on error. */
double cli_parse_bytes(const char *s);

/* Benchmarks' helpers: the median of v[n] (sorts v); a cheap deterministic value in
 * [-0.5, 0.5) per index (fills of 10^8 elements, in parallel); a /proc/self/status
 * field such as "VmHWM:" in bytes (-1 when absent). */
#include <stdint.h>
double cli_median(double *v, int n);
float cli_hash_unit(uint64_t i);
double cli_proc_status_bytes(const char *field);

#endif
