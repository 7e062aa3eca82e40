/* cli_probe.h - strata probe: each disk path's read and write bandwidth through the io
 * engine (measured by st_io_probe in src/tier/probe.c), printed and written as a hardware
 * profile (src/cli/cmd_probe.c). */
#ifndef STRATA_CLI_PROBE_H
#define STRATA_CLI_PROBE_H

/* argv[0] == "probe"; returns a process exit code. */
int cmd_probe(int argc, char **argv);

#endif
