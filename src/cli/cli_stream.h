/* cli_stream.h - strata bench stream: the layer-streaming executor against the
 * in-memory step, in one run (src/cli/bench_stream.c). */
#ifndef STRATA_CLI_STREAM_H
#define STRATA_CLI_STREAM_H

/* argv[0] == "stream"; returns a process exit code. */
int bench_stream(int argc, char **argv);

#endif
