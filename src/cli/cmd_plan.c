/* cmd_plan.c - strata plan: the bytes each class of training state needs and where it
 * would live, from the configuration alone, before anything is allocated. It takes the
 * same --KEY VALUE options (and --config) as strata train, so a plan describes exactly
 * the run that train would start, and train refuses the same plan when it does not fit.
 * With --device_budget it also runs the planner (plan.h): the per-block stream plan,
 * its predicted step time in parts and its device bytes, from a hardware profile
 * (--profile FILE, or measured now on the CPU backend). */
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/cli_prof.h"
#include "strata/block.h"
#include "strata/plan.h"
#include "strata/poetx.h" /* st_frozen_held_block_bytes */
#include "strata/prof.h"
#include "strata/store.h"
#include "strata/train.h"

static void plan_usage(FILE *f) {
    fprintf(f,
            "usage: strata plan [--config FILE.json] [--KEY VALUE ...] [--host_budget BYTES]\n"
            "                   [--device_budget BYTES] [--disk_budget BYTES] [--json]\n"
            "                   [--profile FILE.json] [--save_profile FILE.json] [--time_limit_ms N]\n"
            "                   [-o PLAN.json]\n"
            "\n"
            "Prints the bytes each class of training state needs (weights, gradients, master copy,\n"
            "moments in fp32 or 8-bit, activations with and without checkpointing), where each\n"
            "lives, and whether the peak fits each tier's budget. Nothing is allocated. Budgets\n"
            "take suffixes (512MiB, 8GiB, 2e9); the host budget defaults to MemAvailable.\n"
            "With --device_budget, the planner chooses the layer-streaming plan (per block: keep,\n"
            "offload or recompute its activations; the prefetch depth; the vocabulary chunk) that\n"
            "minimises the predicted step time within the budget, solved as a mixed-integer\n"
            "program (GLPK), and prints it per block with the predicted step time in parts, the\n"
            "device bytes and the solve time. The machine's figures come from --profile (a file\n"
            "--save_profile wrote) or are measured now on the CPU backend (about a second).\n"
            "With the state on disk (state_paths) the prediction adds the store's time, from each\n"
            "path's bandwidth in --state_profile FILE (strata probe --path DIR -o FILE; strata plan\n"
            "probes nothing: without it the disk's time is not predicted and it says so), as\n"
            "strata train predicts it (it probes a path briefly where no state_profile is given).\n"
            "With --plan_state auto, each placement of the optimizer state that fits (f32 or 8-bit, in\n"
            "host memory or on state_paths) is predicted with this machine's profile, as strata train\n"
            "predicts it, and the fastest is taken; every candidate's step is printed.\n"
            "--json prints only the plan, as JSON: the memory account (\"memory\": each class's bytes and\n"
            "tier, each tier's need, budget and fit) and, with --device_budget, the device plan.\n"
            "-o PLAN.json (with --device_budget) writes that JSON to a file (crash-safely); strata\n"
            "train --plan PLAN.json runs the plan exactly,\n"
            "refusing it for another model shape, batch or seq, or a device_budget it does not fit.\n"
            "Exit status: 0 fits, 3 does not fit, 2 bad options.\n"
            "\n"
            "Keys (as for strata train): %s\n", st_train_config_keys());
}

/* The disk state (state_paths): each path's share of two regions of master weights and
 * moments, against its free space now. 1 if some path is short. */
static int plan_disk(const st_train_config *c, double n_params) {
    char buf[sizeof c->state_paths];
    const char *paths[ST_STORE_MAX_PATHS];
    double w[ST_STORE_MAX_PATHS];
    int n, weighted;
    st_err err = {0};
    if (st_train_state_paths(c, buf, sizeof buf, paths, &n, w, &weighted, &err)) {
        printf("\ndisk state: %s\n", err.msg);
        return 1;
    }
    st_optim_segment seg = {.offset = 0, .n = (size_t)n_params, .weight_decay = 0.0f}; /* one tensor: the layout within a few KiB */
    st_store_config sc = {.paths = paths, .n_paths = n, .path_weight = weighted ? w : NULL, .segs = &seg,
                          .n_segs = 1, .fmt = st_train_config_state_format(c),
                          .host_budget = c->state_budget > 0 ? (uint64_t)c->state_budget : ST_STORE_HOST_BUDGET_DEFAULT};
    uint64_t need[ST_STORE_MAX_PATHS], avail[ST_STORE_MAX_PATHS], fs_need[ST_STORE_MAX_PATHS], host = 0;
    if (st_store_plan(&sc, need, &host, &err) || st_store_space(&sc, need, avail, fs_need, &err)) {
        printf("\ndisk state: %s\n", err.msg);
        return 1;
    }
    printf("\ndisk state (state_paths, two regions per subgroup for crash safety; host buffers %.1f MiB%s):\n",
           (double)host / 1048576.0,
           c->state_budget > 0 ? ""
           : !st_train_config_plan_file(c) && c->device_budget > 0 &&
                   st_train_config_method_of(c) == ST_TRAIN_METHOD_FULL /* a method's store: no choice */
               ? " at the default state_budget; the planner's choice "
                                                                "of it below"
                                                              : " at the default state_budget");
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

/* The machine's profile: loaded from profile, or measured on the CPU backend (with this
 * model's own block and classifier at this batch shape where with_shape, as strata train's
 * planner measures it); once per run of strata plan (*have). 0, or 2 on bad input. */
static int machine(const st_arch *a, const st_train_config *cfg, const char *profile, int with_shape,
                   st_plan_profile *hw, int *have) {
    if (*have) return 0;
    st_err err = {0};
    if (profile) {
        if (st_plan_profile_load(profile, hw, &err)) {
            fprintf(stderr, "strata plan: %s\n", err.msg);
            return 2;
        }
    } else {
        st_backend *be = NULL;
        st_status s = st_backend_cpu_create(&be, 0, &err);
        if (!s) s = st_plan_profile_cached(be, with_shape ? a : NULL, cfg->batch, cfg->seq, hw, &err);
        if (be) st_backend_free(be);
        if (s) {
            fprintf(stderr, "strata plan: measuring the machine: %s\n", err.msg);
            return 2;
        }
    }
    *have = 1;
    return 0;
}

/* The plan strata train asks for under device_budget, from profile hw, with no fallback to the
 * rule (strata plan says what the program finds), into v. 2 where key 'act' is refused (said on
 * stderr), else 0. */
typedef struct {
    st_status s;          /* the planner's status; err its message */
    st_err err;
    st_stream_plan p;     /* the plan and its prediction, where s is ST_OK */
    st_plan_prediction pr;
    unsigned char fixed[ST_STREAM_MAX_LAYERS]; /* the blocks key 'act' fixes */
    int n_fixed;
} solved_plan;

static int solve(const st_arch *a, const st_train_config *cfg, double device_budget, const st_plan_profile *hw,
                 int time_limit_ms, solved_plan *v) {
    st_stream_plan *p = &v->p;
    st_plan_prediction *pr = &v->pr;
    unsigned char *fixed = v->fixed;
    int *n_fixed = &v->n_fixed;
    st_status *s = &v->s;
    st_err *err = &v->err;
    /* as strata train: LoRA no base gradient; POET-X the ends' gradients */
    st_train_method method = st_train_config_method_of(cfg);
    st_plan_options po = {.time_limit_ms = time_limit_ms, .mip_gap = -1, .allow_vocab_chunk = 1,
                       .prefer_resident_head = st_train_config_plan_head(cfg),
                       .frozen_base = method == ST_TRAIN_METHOD_LORA ? 1 : method == ST_TRAIN_METHOD_POETX ? 2 : 0};
    /* LoRA, POET-X over frozen_dtype bf16 or int8: the weight slots carry the held weights */
    if (po.frozen_base && st_train_config_frozen_dtype(cfg) > 0)
        po.held_block_bytes = st_frozen_held_block_bytes(a->lay.tensors, a->lay.n_tensors, a->ops->name,
                                                         (st_frozen_dtype)st_train_config_frozen_dtype(cfg));
    /* key 'act': choices the plan must make, as strata train takes them */
    *n_fixed = 0;
    if (st_train_config_act(cfg, a->lay.n_blocks, fixed, n_fixed, err)) {
        fprintf(stderr, "strata plan: %s\n", err->msg);
        return 2;
    }
    if (*n_fixed) po.fixed_act = fixed;
    st_train_config_act_dtype(cfg, &po.act_dtype, NULL); /* key 'act_dtype' (checked by the resolve) */
    st_plan_request rq = {.arch = a, .B = cfg->batch, .T = cfg->seq, .budget = (size_t)device_budget,
                          .profile = hw, .solve = 1, .options = po};
    st_plan_result *res = malloc(sizeof *res);
    *s = res ? st_plan_for_run(&rq, res, err) : st_errf(err, ST_ERR_NOMEM, "out of memory");
    if (res) {
        *p = res->plan;
        *pr = res->pred;
        free(res);
    }
    if (*s && *n_fixed && *s != ST_ERR_NOMEM) st_err_prefix(err, "key 'act'"); /* ST_ERR_NOMEM: named already */
    return 0;
}

/* The planner's section: the profile (machine()), the plan for the device budget (v, solved
 * by the caller), printed as text or JSON, and written to out (a plan file, plan.h) when out
 * is not NULL. 0 fits, 3 no plan fits, 2 bad input. */
static int plan_device(const st_arch *a, const st_train_config *cfg, double device_budget, const char *profile,
                       st_plan_profile *hw_in, int *have_hw, const char *save_profile, int json, const char *out,
                       json_object *memory, const solved_plan *v) {
    st_err err = {0};
    if ((device_budget > 0 || save_profile) && machine(a, cfg, profile, device_budget > 0, hw_in, have_hw)) {
        json_object_put(memory);
        return 2;
    }
    st_plan_profile hw = *hw_in;
    if (save_profile && st_plan_profile_save(save_profile, &hw, &err)) {
        fprintf(stderr, "strata plan: %s\n", err.msg);
        json_object_put(memory);
        return 2;
    }
    if (!(device_budget > 0)) { /* --json: the memory account alone */
        if (json) {
            json_object *o = json_object_new_object();
            json_object_object_add(o, "model", json_object_new_string(cfg->init_from[0] ? cfg->init_from : cfg->model));
            json_object_object_add(o, "batch", json_object_new_int(cfg->batch));
            json_object_object_add(o, "seq", json_object_new_int(cfg->seq));
            json_object_object_add(o, "n_blocks", json_object_new_int(a->lay.n_blocks));
            json_object_object_add(o, "profile_saved", json_object_new_boolean(save_profile != NULL));
            json_object_object_add(o, "memory", json_object_get(memory));
            printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE));
            json_object_put(o);
        }
        json_object_put(memory);
        return 0;
    }
    const st_stream_plan *p = &v->p; /* solved by the caller, whose account it judged */
    st_plan_prediction pr = v->pr;
    const unsigned char *fixed = v->fixed;
    int n_fixed = v->n_fixed, L = a->lay.n_blocks;
    st_status s = v->s;
    err = v->err;
    /* the prediction strata train logs and saves for this configuration (the state on disk:
     * the store's time, from state_profile only: strata plan writes nothing to probe a path) */
    st_plan_config_disk cd;
    memset(&cd, 0, sizeof cd);
    st_err derr = {0};
    int disk_unknown = !s && st_train_plan_predict(cfg, a, &hw, p, 0, &pr, &cd, &derr) != ST_OK;
    int rc = s == ST_OK ? 0 : s == ST_ERR_NOMEM ? 3 : 2;
    json_object *o = NULL;
    if (json || (out && !s)) { /* the plan file's document, and what people read beside it */
        const char *model = cfg->init_from[0] ? cfg->init_from : cfg->model;
        json_object *prof = json_object_new_object();
        if (s) {
            o = json_object_new_object();
            json_object_object_add(o, "model", json_object_new_string(model));
            json_object_object_add(o, "batch", json_object_new_int(cfg->batch));
            json_object_object_add(o, "seq", json_object_new_int(cfg->seq));
            json_object_object_add(o, "n_blocks", json_object_new_int(L));
            json_object_object_add(o, "device_budget", json_object_new_int64((int64_t)device_budget));
        } else {
            st_plan_file *pf = malloc(sizeof *pf); /* a few KiB: the plan's act table */
            if (!pf) {
                fprintf(stderr, "strata plan: out of memory\n");
                json_object_put(prof);
                json_object_put(memory);
                return 2;
            }
            st_plan_file_init(pf, a, model, cfg->batch, cfg->seq, (size_t)device_budget, p, &pr);
            o = st_plan_file_to_json(pf);
            free(pf);
        }
        json_object_object_add(o, "fits", json_object_new_boolean(s == ST_OK));
        json_object_object_add(prof, "sgemm_flops", json_object_new_double(hw.sgemm_flops));
        json_object_object_add(prof, "h2d_bytes_per_s", json_object_new_double(hw.h2d_bytes_per_s));
        json_object_object_add(prof, "d2h_bytes_per_s", json_object_new_double(hw.d2h_bytes_per_s));
        json_object_object_add(prof, "mem_bytes_per_s", json_object_new_double(hw.mem_bytes_per_s));
        json_object_object_add(prof, "optim_ns_per_param", json_object_new_double(hw.optim_ns_per_param));
        json_object_object_add(prof, "block_fwd_flops", json_object_new_double(hw.block_fwd_flops));
        json_object_object_add(prof, "block_bwd_flops", json_object_new_double(hw.block_bwd_flops));
        json_object_object_add(prof, "head_flops", json_object_new_double(hw.head_flops));
        json_object_object_add(prof, "host_work_slowdown", json_object_new_double(hw.host_work_slowdown));
        json_object_object_add(prof, "measured_shape",
                               json_object_new_boolean(st_plan_profile_shape(&hw, a, cfg->batch, cfg->seq) != NULL));
        json_object_object_add(o, "profile", prof);
        if (memory) json_object_object_add(o, "memory", json_object_get(memory)); /* the run's account */
        if (s) {
            json_object_object_add(o, "error", json_object_new_string(err.msg));
        } else {
            json_object_object_add(o, "solve_s", json_object_new_double(pr.solve_s));
            json_object_object_add(o, "optimal", json_object_new_boolean(pr.optimal));
            if (cd.on_disk && !disk_unknown) {
                json_object_object_add(o, "disk", st_plan_config_disk_to_json(&cd));
            } else if (disk_unknown) { /* "predicted" is the state in RAM's */
                json_object *d = json_object_new_object();
                json_object_object_add(d, "unknown", json_object_new_string(derr.msg));
                json_object_object_add(o, "disk", d);
            }
        }
    }
    json_object_put(memory); /* the document holds its own reference */
    if (out && s) {
        fprintf(stderr, "strata plan: no plan fits the device budget: %s not written\n", out);
    } else if (out) { /* the same text --json prints */
        st_err werr = {0};
        if (st_plan_file_save_json(out, o, &werr)) {
            fprintf(stderr, "strata plan: %s\n", werr.msg);
            rc = 2;
        }
    }
    if (json) {
        printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE));
        json_object_put(o);
        return rc;
    }
    if (o) json_object_put(o);
    printf("\ndevice plan (layer streaming), budget %.0f bytes (%.1f MiB); machine: sgemm %.1f GFLOP/s, "
           "h2d %.2f GB/s, d2h %.2f GB/s, memcpy %.2f GB/s, optimizer %.2f ns/param, reference block %.1f/%.1f "
           "GFLOP/s forward/backward, classifier %.1f GFLOP/s, host work slows compute %.2f s/s (%s); this model's "
           "block and classifier %s\n",
           device_budget, device_budget / 1048576.0, hw.sgemm_flops / 1e9, hw.h2d_bytes_per_s / 1e9,
           hw.d2h_bytes_per_s / 1e9, hw.mem_bytes_per_s / 1e9, hw.optim_ns_per_param, hw.block_fwd_flops / 1e9,
           hw.block_bwd_flops / 1e9, hw.head_flops / 1e9, hw.host_work_slowdown, profile ? profile : "measured now",
           st_plan_profile_shape(&hw, a, cfg->batch, cfg->seq) ? "timed at this batch shape"
                                                            : "from the reference rates (not timed at this shape)");
    if (s) {
        printf("  %s\n", err.msg);
        return rc;
    }
    for (int l = 0; l < L;) { /* runs of one choice */
        int e = l;
        while (e + 1 < L && p->act[e + 1] == p->act[l]) e++;
        if (e > l) printf("  blocks %3d-%-3d %s\n", l, e, st_plan_act_name(p->act[l]));
        else printf("  block  %3d     %s\n", l, st_plan_act_name(p->act[l]));
        l = e + 1;
    }
    if (n_fixed) {
        char what[512];
        st_plan_act_describe(fixed, L, what, sizeof what);
        printf("  fixed by key 'act' (%d of %d blocks; the rest chosen): %s\n", n_fixed, L, what);
    }
    printf("  prefetch depth %d, vocabulary %s, activations in %s\n", p->prefetch_depth,
           p->vocab_chunk ? "chunked" : "resident", p->act_dtype == ST_BF16 ? "bf16" : "f32");
    if (p->vocab_chunk) printf("    (in chunks of %d rows)\n", p->vocab_chunk);
    printf("  device bytes %zu of %zu (%.1f MiB of %.1f MiB)\n", pr.device_bytes, pr.device_budget,
           pr.device_bytes / 1048576.0, pr.device_budget / 1048576.0);
    printf("  predicted step %.4f s = compute %.4f + recompute %.4f + exposed copies %.4f + exposed optimizer %.4f"
           " + host work on the device's cores %.4f\n",
           pr.step_s, pr.compute_s, pr.recompute_s, pr.transfer_exposed_s, pr.optim_exposed_s, pr.host_work_s);
    if (cd.on_disk && !disk_unknown)
        printf("  the state on disk: the store %.4f s a step (io %.4f s, cpu %.4f s; each path's mixed bandwidth from "
               "%s, the CRC-32C at %.2f GB/s measured now), %s the backward, %.4f s of it hidden: the exposed optimizer "
               "above is the store's\n",
               cd.dc.store_s, cd.dc.io_s, cd.dc.cpu_s, cfg->state_profile, cd.crc_bytes_per_s / 1e9,
               cd.beside ? "beside" : "after", cd.dc.hidden_s);
    if (cd.on_disk && !disk_unknown) {
        printf("  the store's cache: state_budget %llu bytes %s, %g of %d subgroups cached (not read: %llu bytes read "
               "a step, %llu written)\n", cd.dc.state_budget,
               cd.budget_chosen ? "chosen (the key left 0)" : "as given", cd.dc.cache_hits, cd.dc.n_subgroups,
               cd.dc.read_bytes, cd.dc.write_bytes);
        if (cd.budget_chosen)
            printf("    of %d candidates, each within the %.0f host bytes left for the store's buffers:\n", cd.n_budgets,
                   cd.host_cap);
        for (int i = 0; i < cd.n_budgets; i++) {
            char line[256];
            st_plan_state_budget_describe(&cd, i, line, sizeof line);
            printf("      %s\n", line);
        }
    } else if (disk_unknown)
        printf("  the state on disk: the step's time with it is not predicted (%s); the step above is the state "
               "in RAM's\n", derr.msg);
    printf("  (one block: forward %.3f ms, backward %.3f ms; %d keep, %d offload, %d recompute)\n",
           pr.block_fwd_s * 1e3, pr.block_bwd_s * 1e3, pr.n_keep, pr.n_offload, pr.n_recompute);
    printf("  solved in %.3f s (%s)\n", pr.solve_s, pr.optimal ? "optimal" : "time limit: the best plan found");
    if (out && rc == 0) printf("  plan written to %s (strata train --plan %s runs it)\n", out, out);
    return rc;
}

int cmd_plan(int argc, char **argv) {
    st_train_config cfg;
    st_train_config_defaults(&cfg);
    st_err err = {0};
    double budget[ST_MEM_TIER_COUNT] = {0, 0, 0};
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            plan_usage(stdout);
            return 0;
        }
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--config") && st_train_config_load_json(&cfg, argv[i + 1], &err)) {
            fprintf(stderr, "strata plan: %s\n", err.msg);
            return 2;
        }
    const char *profile = NULL, *save_profile = NULL, *out = NULL;
    int json = 0, time_limit_ms = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        if (!strcmp(a, "-o") && i + 1 < argc) {
            out = argv[++i];
            continue;
        }
        if (strncmp(a, "--", 2) != 0 || i + 1 >= argc) {
            fprintf(stderr, "strata plan: '%s': options are --KEY VALUE (see --help)\n", a);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--config")) continue;
        if (!strcmp(a, "--profile") || !strcmp(a, "--save_profile")) {
            *(a[2] == 'p' ? &profile : &save_profile) = v;
            continue;
        }
        if (!strcmp(a, "--time_limit_ms")) {
            time_limit_ms = atoi(v);
            continue;
        }
        int tier = !strcmp(a, "--device_budget") ? ST_MEM_TIER_DEVICE
                   : !strcmp(a, "--host_budget") ? ST_MEM_TIER_HOST
                   : !strcmp(a, "--disk_budget") ? ST_MEM_TIER_DISK
                                                 : -1;
        if (tier >= 0) {
            budget[tier] = st_parse_bytes(v);
            if (budget[tier] < 0) {
                fprintf(stderr, "strata plan: %s '%s' is not a byte count (e.g. 8GiB, 512MiB, 2e9)\n", a, v);
                return 2;
            }
            /* the train key too (a number of bytes), so the check below is train's */
            char num[32];
            snprintf(num, sizeof num, "%.0f", budget[tier]);
            st_train_config_set(&cfg, a + 2, num, NULL);
            continue;
        }
        char key[128];
        snprintf(key, sizeof key, "%s", a + 2);
        for (char *p = key; *p; p++)
            if (*p == '-') *p = '_';
        if (st_train_config_set(&cfg, key, v, &err)) {
            fprintf(stderr, "strata plan: %s\n", err.msg);
            return 2;
        }
    }
    if (out && !(budget[ST_MEM_TIER_DEVICE] > 0)) {
        fprintf(stderr, "strata plan: -o %s writes the device plan: give --device_budget BYTES too\n", out);
        return 2;
    }
    st_model_shape shape;
    st_arch *planned_arch = NULL;
    solved_plan *sv = NULL; /* with --device_budget: the plan chosen, which the account's device tier is */
    st_mem_plan e;
    if (st_train_config_resolve(&cfg, &shape, &err)) {
        fprintf(stderr, "strata plan: %s\n", err.msg);
        return 2;
    }
    st_model_overrides ov = st_train_config_overrides(&cfg);
    st_plan_profile hw;
    int have_hw = 0;
    if (st_train_config_places_state(&cfg)) { /* as strata train places the state (its profile, where two or
                                            more placements that fit can be timed, is the planner's) */
        char why[1024], line[512];
        if (budget[ST_MEM_TIER_HOST] > 0 && !(cfg.host_budget > 0)) cfg.host_budget = budget[ST_MEM_TIER_HOST];
        st_plan_state_choice ch;
        st_arch *pa = NULL;
        int bad = st_train_state_fit(&cfg, &ch, &err) != ST_OK;
        if (!bad && ch.needs_profile) {
            bad = st_model_resolve(cfg.model, cfg.init_from, &ov, cfg.batch, cfg.seq, &shape, &pa, &err) != ST_OK;
            if (!bad && machine(pa, &cfg, profile, 1, &hw, &have_hw)) {
                st_arch_free(pa);
                return 2;
            }
        }
        if (!bad) bad = st_train_state_choose(&cfg, pa, have_hw ? &hw : NULL, &ch, why, sizeof why, &err) != ST_OK;
        st_arch_free(pa);
        if (bad) {
            fprintf(stderr, "strata plan: %s\n", err.msg);
            return 2;
        }
        FILE *f = json ? stderr : stdout;
        fprintf(f, "%s\n", why);
        for (int i = 0; i < ch.n; i++) {
            st_train_state_describe(&ch, i, line, sizeof line);
            fprintf(f, "  %s\n", line);
        }
    }
    /* method poetx: its recompute chosen as strata train chooses it */
    if (budget[ST_MEM_TIER_HOST] > 0 && !(cfg.host_budget > 0)) cfg.host_budget = budget[ST_MEM_TIER_HOST];
    char why[320];
    if (st_train_poetx_recompute_choose(&cfg, why, sizeof why, &err)) {
        fprintf(stderr, "strata plan: %s\n", err.msg);
        return 2;
    }
    if (why[0]) fprintf(json ? stderr : stdout, "%s\n", why);
    /* the run's memory account (the executor's tables; streamed: the smallest plan's, every block
     * recomputed and the head resident) */
    if (st_train_mem_plan(&cfg, NULL, &e, &err)) {
        fprintf(stderr, "strata plan: %s\n", err.msg);
        return 2;
    }
    if (json || budget[ST_MEM_TIER_DEVICE] > 0 || save_profile) {
        st_arch *arch = NULL;
        if (st_model_resolve(cfg.model, cfg.init_from, &ov, cfg.batch, cfg.seq, &shape, &arch, &err)) {
            fprintf(stderr, "strata plan: %s\n", err.msg);
            return 2;
        }
        if (budget[ST_MEM_TIER_DEVICE] > 0) {
            /* streamed: the device tier's need is the plan chosen's device bytes (it may chunk the
             * vocabulary where the smallest plan's tables keep the head); where no plan fits, the
             * smallest plan's. The rest of the account stays the smallest plan's: what strata
             * train checks before it starts (run_check) */
            sv = calloc(1, sizeof *sv); /* a few KiB: the plan's act table */
            int bad = !sv || machine(arch, &cfg, profile, 1, &hw, &have_hw);
            if (!sv) fprintf(stderr, "strata plan: out of memory\n");
            if (!bad) bad = solve(arch, &cfg, budget[ST_MEM_TIER_DEVICE], &hw, time_limit_ms, sv);
            if (bad) {
                free(sv);
                st_arch_free(arch);
                return 2;
            }
            if (sv->s == ST_OK) {
                e.tier_need[ST_MEM_TIER_DEVICE] = (double)sv->pr.device_bytes;
                e.device_of_plan = 1;
            }
        }
        if (json) { /* one document: the device plan (with --device_budget) and the memory account */
            int short_ = st_mem_plan_check(&e, budget, &err) != ST_OK;
            int prc = plan_device(arch, &cfg, budget[ST_MEM_TIER_DEVICE], profile, &hw, &have_hw, save_profile, 1,
                                  out, st_mem_plan_to_json(&e, budget), sv);
            st_arch_free(arch);
            free(sv);
            return prc == 0 && short_ ? 3 : prc;
        }
        planned_arch = arch; /* its section is printed after the estimate */
    }
    printf("plan for %s (%s), batch %d x seq %d, optim_state %s, act_dtype %s\n",
           cfg.init_from[0] ? cfg.init_from : cfg.model, shape.desc, cfg.batch, cfg.seq, cfg.optim_state,
           cfg.act_dtype);
    st_mem_plan_print(stdout, &e, budget);
    int rc = 0;
    if (st_mem_plan_check(&e, budget, &err)) {
        printf("\n%s\n", err.msg);
        rc = 3;
    }
    /* a method's store (LoRA, POET-X) holds what it trains */
    if (cfg.state_paths[0] && plan_disk(&cfg, e.n_trainable > 0 ? e.n_trainable : e.n_params) && !rc) rc = 3;
    if (planned_arch) {
        int prc = plan_device(planned_arch, &cfg, budget[ST_MEM_TIER_DEVICE], profile, &hw, &have_hw, save_profile, 0,
                              out, out ? st_mem_plan_to_json(&e, budget) : NULL, sv);
        st_arch_free(planned_arch);
        if (prc == 2) rc = 2;
        else if (prc == 3) rc = 3; /* the executor's device bytes: no plan fits */
    }
    free(sv);
    return rc;
}
