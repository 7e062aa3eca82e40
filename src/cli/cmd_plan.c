/* cmd_plan.c - strata plan: the bytes each class of training state needs and where it
 * would live, from the configuration alone, before anything is allocated. It takes the
 * same --KEY VALUE options (and --config) as strata train, so a plan describes exactly
 * the run that train would start, and train refuses the same plan when it does not fit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/cli_prof.h"
#include "strata/prof.h"
#include "strata/llama.h"
#include "strata/train.h"

static void plan_usage(FILE *f) {
    fprintf(f,
            "usage: strata plan [--config FILE.json] [--KEY VALUE ...] [--host_budget BYTES]\n"
            "                   [--device_budget BYTES] [--disk_budget BYTES]\n"
            "\n"
            "Prints the bytes each class of training state needs (weights, gradients, master copy,\n"
            "moments in fp32 or 8-bit, activations with and without checkpointing), where each\n"
            "lives, and whether the peak fits each tier's budget. Nothing is allocated. Budgets\n"
            "take suffixes (512MiB, 8GiB, 2e9); the host budget defaults to MemAvailable.\n"
            "Exit status: 0 fits, 3 does not fit, 2 bad options.\n"
            "\n"
            "Keys (as for strata train): %s\n", train_config_keys());
}

int cmd_plan(int argc, char **argv) {
    train_config cfg;
    train_config_defaults(&cfg);
    st_err err = {0};
    double budget[PROF_TIER_COUNT] = {0, 0, 0};
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            plan_usage(stdout);
            return 0;
        }
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--config") && train_config_load_json(&cfg, argv[i + 1], &err)) {
            fprintf(stderr, "strata plan: %s\n", err.msg);
            return 2;
        }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0 || i + 1 >= argc) {
            fprintf(stderr, "strata plan: '%s': options are --KEY VALUE (see --help)\n", a);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--config")) continue;
        int tier = !strcmp(a, "--device_budget") ? PROF_TIER_DEVICE
                   : !strcmp(a, "--host_budget") ? PROF_TIER_HOST
                   : !strcmp(a, "--disk_budget") ? PROF_TIER_DISK
                                                 : -1;
        if (tier >= 0) {
            budget[tier] = cli_parse_bytes(v);
            if (budget[tier] < 0) {
                fprintf(stderr, "strata plan: %s '%s' is not a byte count (e.g. 8GiB, 512MiB, 2e9)\n", a, v);
                return 2;
            }
            /* the train key too, where this strata has it, so the check below is train's */
            train_config_set(&cfg, a + 2, v, NULL);
            continue;
        }
        char key[128];
        snprintf(key, sizeof key, "%s", a + 2);
        for (char *p = key; *p; p++)
            if (*p == '-') *p = '_';
        if (train_config_set(&cfg, key, v, &err)) {
            fprintf(stderr, "strata plan: %s\n", err.msg);
            return 2;
        }
    }
    gpt2_config mc;
    llama_config lc;
    int is_llama;
    prof_mem_estimate e;
    if (train_config_resolve_llama(&cfg, &lc, &is_llama, &err) || (!is_llama && train_config_resolve(&cfg, &mc, &err))) {
        fprintf(stderr, "strata plan: %s\n", err.msg);
        return 2;
    }
    if (is_llama) { /* the Llama family: parameters and stored activations from the model's own counts */
        prof_mem_estimate_generic((double)llama_param_count(&lc), (double)llama_act_bytes(&lc, cfg.batch, cfg.seq),
                                  cfg.batch, cfg.seq, !strcmp(cfg.optim_state, "8bit"), &e);
        printf("plan for %s (L=%d C=%d NH=%d NKV=%d V=%d maxT=%d), batch %d x seq %d, optim_state %s\n",
               cfg.init_from[0] ? cfg.init_from : cfg.model, lc.n_layer, lc.hidden_size, lc.n_head, lc.n_kv_head,
               lc.vocab_size, lc.max_seq, cfg.batch, cfg.seq, cfg.optim_state);
    } else {
        prof_mem_estimate_gpt2(&mc, cfg.batch, cfg.seq, !strcmp(cfg.optim_state, "8bit"), &e);
        printf("plan for %s (L=%d C=%d NH=%d V=%d maxT=%d), batch %d x seq %d, optim_state %s\n", cfg.model,
               mc.n_layer, mc.n_embd, mc.n_head, mc.vocab_size, mc.max_seq, cfg.batch, cfg.seq, cfg.optim_state);
    }
    prof_mem_print(stdout, &e, budget);
    if (prof_mem_check(&e, budget, &err)) {
        printf("\n%s\n", err.msg);
        return 3;
    }
    return 0;
}
