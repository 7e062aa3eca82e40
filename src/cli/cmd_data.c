/* cmd_data.c - strata data (placeholder until the data pipeline lands). */
#include <stdio.h>
#include "cli/cli.h"
int cmd_data(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "strata data: not built yet\n");
    return 2;
}
int bench_data(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "strata bench data: not built yet\n");
    return 2;
}
