/* cli.h - the strata program's subcommands; each returns a process exit code. */
#ifndef STRATA_CLI_H
#define STRATA_CLI_H

int cmd_train(int argc, char **argv);
int cmd_bench(int argc, char **argv); /* strata bench <what>: starts a benchmark of src/bench/bench.h */
int cmd_data(int argc, char **argv);
int cmd_inspect(int argc, char **argv);

#endif
