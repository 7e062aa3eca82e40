/* cli.h - the strata program's subcommands; each returns a process exit code. */
#ifndef STRATA_CLI_H
#define STRATA_CLI_H

int cmd_train(int argc, char **argv);
int cmd_bench(int argc, char **argv); /* strata bench <what>: starts a benchmark of src/bench/bench.h */
int cmd_data(int argc, char **argv);
int cmd_inspect(int argc, char **argv);

/* Parse "100M", "2.5B", "64K", "1G" (decimal multipliers) into a count; -1 on error. */
double cli_parse_count(const char *s);
/* Parse "512MiB", "2GiB", "1000" (bytes) ; -1 on error. */
double cli_parse_bytes(const char *s);

#endif
