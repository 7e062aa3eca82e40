/* cmd_train.c - strata train: parse a JSON config and --key value overrides (over a resumed
 * run's saved configuration), run. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "strata/dist.h"
#include "strata/plan.h"
#include "strata/train.h"

/* The default run's time in the usage text is measured (README): OMP_WAIT_POLICY=passive
 * /usr/bin/time -v ./build/strata train on two idle cores, 39.5 s elapsed, 70.6 s of CPU
 * time (user 67.8 s, sys 2.8 s). */

/* What src/data/source.c reads (detect, parse_spec) and how the loader orders it (data.h). */
#define DATA_HELP \
    "Data (--data, --val_data): \"embedded\" (the built-in byte-level corpus, tokens 0..255) or a\n" \
    "comma-separated list of sources [FORMAT@]PATH[:WEIGHT], mixed by relative weight (e.g.\n" \
    "--data web:0.8,code:0.2). A source is a Megatron indexed dataset (PREFIX, PREFIX.bin or\n" \
    "PREFIX.idx, the .idx beside the .bin), an llm.c shard (its header says uint16 or uint32\n" \
    "tokens), or headerless tokens, which must be said as FORMAT@PATH: raw16@PATH\n" \
    "(little-endian uint16) or raw32@PATH (uint32; a name ending in .u32 says it too); llmc@,\n" \
    "megatron@ and megatron-unordered@ name the others explicitly. Indexed datasets are read in\n" \
    "a seeded shuffled order of documents, cut into rows of T+1 tokens; sources without an\n" \
    "index (llm.c shards, raw tokens) are cut into windows of T+1 tokens at a stride of T,\n" \
    "visited in a seeded shuffled order. Validation (--val_data, every --eval_every steps)\n" \
    "reads the same --eval_tokens each time and changes no training state.\n"

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
            "Trains a transformer language model: GPT-2 (presets gpt2-mini, gpt2-124m, ...) or the\n"
            "Llama family (Llama, Qwen2, Qwen3, Mistral: presets llama3.2-1b, qwen2.5-0.5b, ...), from\n"
            "scratch or from a Hugging Face directory (--init_from; GPT-2 or Llama family). With no\n"
            "arguments: gpt2-mini on the embedded corpus, 400 steps, about 40 s on two idle cores\n"
            "(70 s of CPU time), printing the validation loss on the corpus's held-out\n"
            "tail every 50 steps, writing to runs/<date-time>/ (metrics.jsonl, config.json,\n"
            "checkpoints/). Ctrl-C finishes the step, writes a checkpoint and stops.\n"
            "\n"
            "Resume: `strata train --resume RUN_DIR` continues bit-for-bit from the newest complete\n"
            "checkpoint and writes into RUN_DIR where it is now (a moved or copied run resumes in\n"
            "place). The run's saved config.json is the base and keys on the command line win:\n"
            "--steps N trains further, --stop_at N stops again, --run_dir D writes elsewhere; a\n"
            "saved stop_at is not kept. Steps replayed after a crash are logged once.\n"
            "\n"
            DATA_HELP
            "\n"
            "Every key can be set in the JSON file or as --KEY VALUE (the command line wins):\n");
    st_train_config_print_help(f);
}

/* Was --KEY (or --KEY with dashes) given on the command line? */
static int given(int argc, char **argv, const char *key) {
    for (int i = 1; i + 1 < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2)) continue;
        a += 2;
        size_t j = 0;
        for (; a[j] && key[j]; j++)
            if (a[j] != key[j] && !(a[j] == '-' && key[j] == '_')) break;
        if (!a[j] && !key[j]) return 1;
        i++; /* skip the value */
    }
    return 0;
}

/* Where a resumed run writes: the run directory as it is now, not the one recorded in its
 * config.json (the run may have been moved or copied). RESUME is a run directory, or a
 * checkpoint directory RUN/checkpoints/step_N; a checkpoint directory elsewhere keeps the
 * recorded run_dir. */
static void resumed_run_dir(const char *resume, char *run_dir, size_t cap) {
    char r[2048], probe[2200];
    snprintf(r, sizeof r, "%s", resume);
    size_t n = strlen(r);
    while (n > 1 && r[n - 1] == '/') r[--n] = 0;
    snprintf(probe, sizeof probe, "%s/train_state.bin", r);
    char probe2[2200];
    snprintf(probe2, sizeof probe2, "%s/shards.json", r); /* a data-parallel checkpoint (ckpt.h) */
    if (access(probe, F_OK) != 0 && access(probe2, F_OK) != 0) { /* a run directory */
        snprintf(run_dir, cap, "%s", r);
        return;
    }
    char *slash = strrchr(r, '/');
    if (!slash) return; /* "step_N" in the current directory: keep the recorded run_dir */
    *slash = 0; /* r: the directory holding the checkpoint */
    const char *parent = strrchr(r, '/') ? strrchr(r, '/') + 1 : r;
    if (strcmp(parent, "checkpoints")) return; /* not inside a run: keep the recorded run_dir */
    char *up = strrchr(r, '/');
    if (!up) snprintf(run_dir, cap, ".");
    else if (up == r) snprintf(run_dir, cap, "/");
    else {
        *up = 0;
        snprintf(run_dir, cap, "%s", r);
    }
}

int cmd_train(int argc, char **argv) {
    st_train_config cfg;
    st_train_config_defaults(&cfg);
    st_err err = {0};
    /* pass 1: --help, --config and --resume, which set the base the overrides apply to */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            train_usage(stdout);
            return 0;
        }
    }
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--config") && st_train_config_load_json(&cfg, argv[i + 1], &err)) {
            fprintf(stderr, "strata train: %s\n", err.msg);
            return 2;
        }
        if (!strcmp(argv[i], "--resume")) {
            /* a run directory carries its configuration; resume with it */
            char path[2048];
            st_run_path(path, sizeof path, argv[i + 1], ST_RUN_CONFIG);
            if (access(path, F_OK) == 0) {
                if (st_train_config_load_json(&cfg, path, &err)) {
                    fprintf(stderr, "strata train: %s\n", err.msg);
                    return 2;
                }
                /* a stop point is for the run that was given it: kept, a resume would stop at
                 * once (zero steps); the command line may give a new one */
                if (cfg.stop_at > 0 && !given(argc, argv, "stop_at")) {
                    st_log(1, "strata train: the run was stopped at step %ld (stop_at); this resume runs to step "
                           "%ld (give --stop_at to stop earlier)\n", cfg.stop_at, cfg.steps);
                    cfg.stop_at = 0;
                }
            }
            if (!given(argc, argv, "run_dir")) resumed_run_dir(argv[i + 1], cfg.run_dir, sizeof cfg.run_dir);
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
        if (st_train_config_set(&cfg, key, argv[++i], &err)) {
            fprintf(stderr, "strata train: %s\n", err.msg);
            return 2;
        }
    }
    if (st_train_config_plan_file(&cfg) && cfg.plan[0] && !(cfg.device_budget > 0)) {
        /* a plan file and no device_budget: the budget the plan was made for (it fits it) */
        st_plan_file *pf = malloc(sizeof *pf);
        if (!pf || st_plan_file_load(cfg.plan, pf, &err)) {
            fprintf(stderr, "strata train: key 'plan': %s\n", pf ? err.msg : "out of memory");
            free(pf);
            return 2;
        }
        cfg.device_budget = (double)pf->device_budget;
        st_log(1, "strata train: device_budget %zu bytes, the budget of plan file %s\n", pf->device_budget, cfg.plan);
        free(pf);
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
    /* under mpirun (or srun) this process is one rank of the run; else a world of one */
    st_comm *comm = NULL;
    if (st_comm_open(&comm, cfg.dist_timeout, &err)) {
        fprintf(stderr, "strata train: %s\n", err.msg);
        return 1;
    }
    int rank = st_comm_rank(comm), world = st_comm_size(comm);
    st_train_result res;
    st_train_hooks hooks = {.stop_flag = &g_stop, .comm = comm};
    if (st_train_run_with(&cfg, &hooks, &res, &err)) {
        if (world > 1) fprintf(stderr, "strata train: rank %d of %d: %s\n", rank, world, err.msg);
        else fprintf(stderr, "strata train: %s\n", err.msg);
        fflush(stderr);
        st_comm_abort(comm, 1); /* the other ranks stop now, not at their next wait's timeout */
        return 1;
    }
    st_comm_close(comm);
    if (rank > 0) return 0;
    if (!cfg.quiet && res.steps_run == 0)
        printf("done: nothing trained, the run is at step %ld; outputs in %s\n", res.steps_done, cfg.run_dir);
    else if (!cfg.quiet)
        printf("done: %ld steps, final loss %.4f, %.0f tokens/s; outputs in %s\n", res.steps_done, res.final_loss,
               res.tokens_per_s, cfg.run_dir);
    return 0;
}
