/* cmd_train.c - strata train, strata inspect, strata bench step. */
#include <stdio.h>
#include "cli/cli.h"
int cmd_train(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "todo\n"); return 2; }
int cmd_inspect(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "todo\n"); return 2; }
int bench_step(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "todo\n"); return 2; }
