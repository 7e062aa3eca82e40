/* bench_optim.c - strata bench optim (placeholder until the optimizer engine lands). */
#include <stdio.h>
#include "cli/cli.h"
int bench_optim(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "strata bench optim: not built yet\n");
    return 2;
}
