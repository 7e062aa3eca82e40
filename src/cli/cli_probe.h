/* cli_probe.h - strata probe: each disk path's read and write bandwidth through the io
 * engine, written as a hardware profile (src/cli/cmd_probe.c). */
#ifndef STRATA_CLI_PROBE_H
#define STRATA_CLI_PROBE_H

/* argv[0] == "probe"; returns a process exit code. */
int cmd_probe(int argc, char **argv);

#include <stdint.h>
#include "strata/core.h"
/* One path's sequential read, write and mixed (half reads, half writes in flight
 * together) bandwidth in GB/s through the io engine, as strata probe measures it, with a
 * test file of `bytes`; *memory = 1 for tmpfs. */
st_status cli_probe_measure(const char *path, uint64_t bytes, double *read_gbps, double *write_gbps,
                            double *mixed_gbps, int *memory, st_err *err);

#endif
