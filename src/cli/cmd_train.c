/* cmd_train.c - strata train: parse a JSON config and --key value overrides, run. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "strata/train.h"

static volatile int g_stop; /* set by SIGINT/SIGTERM: finish the step, checkpoint, stop */

static void on_signal(int sig) {
    (void)sig;
    if (g_stop) _exit(130); /* second Ctrl-C: stop now (the last checkpoint is intact) */
    g_stop = 1;
}

static void train_usage(FILE *f) {
    fprintf(f,
            "usage: strata train [--config FILE.json] [--KEY VALUE ...]\n"
            "\n"
            "Trains a GPT-2 model. With no arguments: gpt2-mini on the embedded corpus, for\n"
            "about two minutes on two cores, writing to runs/<date-time>/ (metrics.jsonl,\n"
            "config.json, checkpoints/). Ctrl-C finishes the step, writes a checkpoint and\n"
            "stops; `strata train --resume RUN_DIR` continues bit-for-bit.\n"
            "\n"
            "Every key can be set in the JSON file or as --KEY VALUE (the command line wins):\n");
    train_config_print_help(f);
}

int cmd_train(int argc, char **argv) {
    train_config cfg;
    train_config_defaults(&cfg);
    st_err err = {0};
    /* pass 1: --help, --config and --resume, which set the base the overrides apply to */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            train_usage(stdout);
            return 0;
        }
    }
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--config") && train_config_load_json(&cfg, argv[i + 1], &err)) {
            fprintf(stderr, "strata train: %s\n", err.msg);
            return 2;
        }
        if (!strcmp(argv[i], "--resume")) {
            /* a run directory carries its configuration; resume with it */
            char path[2048];
            snprintf(path, sizeof path, "%s/config.json", argv[i + 1]);
            FILE *f = fopen(path, "r");
            if (f) {
                fclose(f);
                if (train_config_load_json(&cfg, path, &err)) {
                    fprintf(stderr, "strata train: %s\n", err.msg);
                    return 2;
                }
            }
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0) {
            fprintf(stderr, "strata train: unexpected argument '%s'; options are --KEY VALUE (see --help)\n", a);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "strata train: option '%s' needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--config")) { i++; continue; }
        char key[128];
        snprintf(key, sizeof key, "%s", a + 2);
        for (char *p = key; *p; p++)
            if (*p == '-') *p = '_';
        if (train_config_set(&cfg, key, argv[++i], &err)) {
            fprintf(stderr, "strata train: %s\n", err.msg);
            return 2;
        }
    }
    if (!cfg.run_dir[0]) {
        if (cfg.resume[0]) snprintf(cfg.run_dir, sizeof cfg.run_dir, "%s", cfg.resume);
        else {
            time_t now = time(NULL);
            char stamp[32];
            strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", localtime(&now));
            snprintf(cfg.run_dir, sizeof cfg.run_dir, "runs/%s", stamp);
        }
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    cfg.stop_flag = &g_stop;
    train_result res;
    if (train_run(&cfg, &res, &err)) {
        fprintf(stderr, "strata train: %s\n", err.msg);
        return 1;
    }
    if (!cfg.quiet)
        printf("done: %ld steps, final loss %.4f, %.0f tokens/s; outputs in %s\n", res.steps_done, res.final_loss,
               res.tokens_per_s, cfg.run_dir);
    return 0;
}
