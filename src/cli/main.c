/* main.c - the strata program: one binary, subcommands. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "cli/cli.h"
#include "cli/cli_probe.h"
#include "cli/cli_prof.h"
#include "strata/backend.h"

int cmd_sample(int argc, char **argv); /* cmd_sample.c: strata sample */
int cmd_forecast(int argc, char **argv); /* cmd_forecast.c: strata forecast */

static const char *usage =
    "strata - train transformer language models whose state exceeds the memory that computes them\n"
    "\n"
    "usage: strata <command> [options]    (strata <command> --help for each)\n"
    "\n"
    "commands:\n"
    "  train     train a model (no arguments: a small GPT-2 on the embedded corpus)\n"
    "  data      pack text into token datasets and inspect them\n"
    "  bench     measure a component and print its figures (--json for one JSON object)\n"
    "  inspect   describe a checkpoint or model directory\n"
    "  plan      the memory each class of training state needs, and whether it fits\n"
    "  probe     measure each disk path's read and write bandwidth (a hardware profile)\n"
    "  report    an HTML report (charts) and a summary of a run directory\n"
    "  sample    generate text from a run, a checkpoint or a Hugging Face model (KV cache)\n"
    "  forecast  fit a run's validation losses and forecast what more compute would buy\n";

int cmd_bench(int argc, char **argv) {
    static const char *bench_usage =
        "usage: strata bench <what> [options] [--json]\n"
        "  step    one training step of a model: tokens/s, achieved GFLOP/s vs sgemm\n"
        "  optim   the AdamW engine over N parameters: bandwidth vs a copy ceiling\n"
        "  data    the data pipeline over a synthetic mix: first batch, tokens/s, memory\n"
        "  trace   the profiler's overhead: the same short training traced and untraced\n"
        "  stream  layer streaming under a device budget vs the in-memory step\n"
        "  offload the optimizer step with its state on disk paths vs their probed bandwidth\n"
        "  sample  generation with the KV cache vs recomputing the prefix: tokens/s of each\n"
        "  tokenize a tokenizer.json encoding a text file: MB/s and tokens/s, 1 and all threads\n"
        "  plan    the planner's predicted step time and peaks vs measured, and the fixed rule's step\n"
        "  dist    (under mpirun) the ZeRO step at N ranks vs one process's step: scaling, bytes, exposed comm\n"
        "  lora    LoRA over the frozen base vs full AdamW: training-state bytes per parameter, step time\n"
        "  poet    POET-X over the frozen matmul weights vs full AdamW: state bytes per weight parameter, step time\n"
        "  select  data selection by a proxy's loss vs the full corpus: validation loss, FLOPs counted whole\n";
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(bench_usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "step")) return bench_step(argc - 1, argv + 1);
    if (!strcmp(argv[1], "optim")) return bench_optim(argc - 1, argv + 1);
    if (!strcmp(argv[1], "data")) return bench_data(argc - 1, argv + 1);
    if (!strcmp(argv[1], "trace")) return bench_trace(argc - 1, argv + 1);
    if (!strcmp(argv[1], "stream")) return bench_stream(argc - 1, argv + 1);
    if (!strcmp(argv[1], "offload")) return bench_offload(argc - 1, argv + 1);
    if (!strcmp(argv[1], "sample")) return bench_sample(argc - 1, argv + 1);
    if (!strcmp(argv[1], "tokenize")) return bench_tokenize(argc - 1, argv + 1);
    if (!strcmp(argv[1], "plan")) return bench_plan(argc - 1, argv + 1);
    if (!strcmp(argv[1], "dist")) return bench_dist(argc - 1, argv + 1);
    if (!strcmp(argv[1], "lora")) return bench_lora(argc - 1, argv + 1);
    if (!strcmp(argv[1], "poet")) return bench_poet(argc - 1, argv + 1);
    if (!strcmp(argv[1], "select")) return bench_select(argc - 1, argv + 1);
    fprintf(stderr, "strata bench: unknown benchmark '%s'\n%s", argv[1], bench_usage);
    return 2;
}

int main(int argc, char **argv) {
    st_blas_fix_coretype(argv);
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress lines appear as they happen, also through a pipe */
    if (argc < 2) {
        fputs(usage, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        fputs(usage, stdout);
        return 0;
    }
    if (!strcmp(cmd, "train")) return cmd_train(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "data")) return cmd_data(argc - 1, argv + 1);
    if (!strcmp(cmd, "inspect")) return cmd_inspect(argc - 1, argv + 1);
    if (!strcmp(cmd, "report")) return cmd_report(argc - 1, argv + 1);
    if (!strcmp(cmd, "plan")) return cmd_plan(argc - 1, argv + 1);
    if (!strcmp(cmd, "probe")) return cmd_probe(argc - 1, argv + 1);
    if (!strcmp(cmd, "sample")) return cmd_sample(argc - 1, argv + 1);
    if (!strcmp(cmd, "forecast")) return cmd_forecast(argc - 1, argv + 1);
    fprintf(stderr, "strata: unknown command '%s'\n\n%s", cmd, usage);
    return 2;
}
