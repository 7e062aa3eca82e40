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
#include "strata/store.h"
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

/* The disk state (state_paths): each path's share of two regions of master weights and
 * moments, against its free space now. 1 if some path is short. */
static int plan_disk(const train_config *c, double n_params) {
    char buf[sizeof c->state_paths];
    const char *paths[ST_STORE_MAX_PATHS];
    double w[ST_STORE_MAX_PATHS];
    int n, weighted;
    st_err err = {0};
    if (train_state_paths(c, buf, sizeof buf, paths, &n, w, &weighted, &err)) {
        printf("\ndisk state: %s\n", err.msg);
        return 1;
    }
    optim_segment seg = {0, (size_t)n_params, 0.0f}; /* one tensor: the layout within a few KiB */
    st_store_config sc = {.paths = paths, .n_paths = n, .path_weight = weighted ? w : NULL, .segs = &seg,
                          .n_segs = 1, .fmt = strcmp(c->optim_state, "8bit") ? OPTIM_STATE_F32 : OPTIM_STATE_8BIT,
                          .host_budget = c->state_budget > 0 ? (uint64_t)c->state_budget : TRAIN_STATE_BUDGET_DEFAULT};
    uint64_t need[ST_STORE_MAX_PATHS], avail[ST_STORE_MAX_PATHS], fs_need[ST_STORE_MAX_PATHS], host = 0;
    if (st_store_plan(&sc, need, &host, &err) || st_store_space(&sc, need, avail, fs_need, &err)) {
        printf("\ndisk state: %s\n", err.msg);
        return 1;
    }
    printf("\ndisk state (state_paths, two regions per subgroup for crash safety; host buffers %.1f MiB):\n",
           (double)host / 1048576.0);
    int short_ = 0;
    for (int p = 0; p < n; p++) { /* paths on one filesystem are judged by what they need together */
        int ok = avail[p] >= fs_need[p];
        short_ |= !ok;
        printf("  %-32s needs %10.3f GB, free %10.3f GB%s  %s\n", paths[p], (double)need[p] / 1e9,
               (double)avail[p] / 1e9, fs_need[p] > need[p] ? " (shared filesystem)" : "", ok ? "fits" : "SHORT");
        if (!ok)
            printf("    %llu bytes missing: free space, add a path, or use optim_state 8bit\n",
                   (unsigned long long)(fs_need[p] - avail[p]));
    }
    return short_;
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
    train_mem_state_on_disk(&cfg, &e);
    prof_mem_print(stdout, &e, budget);
    int rc = 0;
    if (prof_mem_check(&e, budget, &err)) {
        printf("\n%s\n", err.msg);
        rc = 3;
    }
    if (cfg.state_paths[0] && plan_disk(&cfg, e.n_params) && !rc) rc = 3;
    return rc;
}
