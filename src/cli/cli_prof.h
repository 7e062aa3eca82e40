/* cli_prof.h - the profiler's subcommands: strata report, strata plan (strata bench trace:
 * src/bench/bench_trace.c).
 * Each returns a process exit code; main.c dispatches to them. */
#ifndef STRATA_CLI_PROF_H
#define STRATA_CLI_PROF_H

int cmd_report(int argc, char **argv); /* strata report RUN_DIR: report.html + a text summary */
int cmd_plan(int argc, char **argv);   /* strata plan --model ... --batch ... --seq ...: memory estimate */

#endif
