/* bench_plan.c - strata bench plan: the planner's prediction against the step it plans.
 *
 * For each configuration (a model, a batch shape and a device budget) the planner
 * (plan.h, as strata train calls it) chooses a stream plan from the machine's profile,
 * and the fixed rule chooses one the way strata train does when the planner finds none
 * (the vocabulary resident, then in 2048-row chunks; every block keep, then offload,
 * then recompute: the first that fits). Both plans are run through st_step_run (the step
 * strata train runs), side by side, alternating steps after one warm-up step each (the
 * machine is shared: neighbouring steps see the same load); step times are medians.
 *
 * Three predictions of the run plan: predicted_step_s, the planner's own (the profile
 * measured at start and the model's block and classifier timed at this shape before the
 * steps); predicted_same_load_step_s, the same cost model with the shape timed again
 * after each pair of steps (medians: the load the steps saw); and
 * predicted_reference_rates_step_s, from the reference block's rates alone (what strata
 * train, which does not time the model's shape, predicts).
 *
 * Peaks per tier: device, the budget arena's high-water mark (st_stream_step_stats); host,
 * the process's resident high-water mark (VmHWM, reset through /proc/self/clear_refs)
 * over the planned executor's creation and warm-up step, less the device peak (on the
 * CPU backend the device arena is host memory too); disk, 0 with the state in RAM.
 *
 * The disk-state configuration (qwen2.5-0.5b-disk) keeps the fp32 master weights and moments
 * in a state store (strata/store.h) in --state-path DIR or a new temporary directory, with
 * its update beside or after the backward as strata train chooses (host_work_slowdown <
 * 0.5), no gradient clipping; the path is probed (st_io_probe) and the CRC-32C timed just
 * before the steps, and the prediction is st_plan_predict_disk's from those figures (the
 * same-load one: the path's mixed bandwidth averaged over the probes before and after the
 * steps). Only the planner's plan runs (the rule's would need a store and a model's host
 * state of its own): rule_step_s is null unless the plans are the same. Peaks: host as above
 * (the store's creation and buffers included), disk the store's files' allocated blocks after
 * the steps against st_store_plan's layout.
 *
 * --sweep N (bench_sweep): the planner's monotone sweep (issue 16): the predicted and the
 * measured step time at N device budgets from the smallest any plan fits to the whole
 * state. */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "strata/block.h"
#include "strata/model.h"
#include "strata/plan.h"
#include "strata/io.h"
#include "strata/llama.h"
#include "strata/step.h"
#include "strata/store.h"
#include "strata/stream.h"
#include "strata/tier.h"
#include "strata/train.h"


/* How a configuration's device budget is chosen (bench_one), each from st_stream_device_bytes. */
typedef enum bp_budget {
    BP_BUDGET_EIGHTH,         /* one eighth of the training state (16 bytes a parameter) */
    BP_BUDGET_RECOMPUTE,      /* halfway between the smallest all-recompute and the smallest all-offload
                                 plan (at least the rule's smallest plan), so some blocks recompute */
    BP_BUDGET_RULE_RECOMPUTES /* halfway between the smallest all-offload plan over the planner's vocabulary
                                 chunks and the smallest budget at which the rule keeps or offloads: the
                                 rule recomputes every block where the planner can offload every block */
} bp_budget;

typedef struct bp_config {
    const char *name;
    const char *model;
    int B, T;
    bp_budget budget;
    int disk; /* 1: the training state in a disk store (fp32, under --state-path DIR or a temporary
                 directory), only the planned plan run (the rule's would need a store of its own) */
} bp_config;

static const bp_config CONFIGS[] = {
    {"gpt2-124m-eighth", "gpt2-124m", 2, 256, BP_BUDGET_EIGHTH, 0},
    {"gpt2-124m-recompute", "gpt2-124m", 2, 256, BP_BUDGET_RECOMPUTE, 0},
    {"gpt2-124m-rule-recomputes", "gpt2-124m", 2, 256, BP_BUDGET_RULE_RECOMPUTES, 0},
    {"qwen2.5-0.5b-disk", "qwen2.5-0.5b", 2, 256, BP_BUDGET_EIGHTH, 1},
};
#define N_CONFIGS ((int)(sizeof CONFIGS / sizeof CONFIGS[0]))

/* One executor under its own budgeted device, and the step that drives it. */
typedef struct bp_run {
    st_backend *dev;
    st_stream_exec *x;
    st_step *step;
    double *t;        /* timed steps' wall seconds */
    double *tc, *tt;  /* their device compute and optimizer tail (st_stream_step_stats) */
    double *share;    /* their process CPU seconds per wall second (cores this process got) */
    size_t dev_peak;  /* arena high-water mark over every step */
    st_store *store;  /* the disk state (bp_config.disk) */
    st_optim_segment *segs;
    const char *store_dir;
} bp_run;

#define BP_STORE_NAME "strata-bench-plan-state"
#define BP_PROBE_BYTES (512u << 20) /* the disk probe's test file: a second or two at this disk's speed */

static void usage(FILE *f) {
    fprintf(f,
            "usage: strata bench plan [--config NAME] [--steps N] [--profile FILE.json] [--threads N] [--json]\n"
            "                         [--state-path DIR]\n"
            "       strata bench plan --sweep N [--model NAME] [--batch B] [--seq T] [--cost_optimal] [--steps N] ...\n"
            "  For each configuration, the planner's plan (as strata train chooses it) and the fixed rule's\n"
            "  plan (keep, offload, recompute for every block: the first that fits, the vocabulary resident\n"
            "  before chunked) are trained side by side, alternating steps after one warm-up step each.\n"
            "  Prints per configuration predicted_step_s (the planner's cost model), measured_step_s and\n"
            "  rule_step_s (medians of N steps), and predicted and measured peak bytes per tier.\n"
            "  The machine's profile is measured at start (as strata train does) unless --profile names one;\n"
            "  either way the model's block and classifier are timed at the configuration's shape when the\n"
            "  profile lacks them (st_plan_profile_measure_shape).\n"
            "  Configurations (--config, default all):\n");
    static const char *const budget_txt[] = {
        [BP_BUDGET_EIGHTH] = "one eighth of its training state as device budget",
        [BP_BUDGET_RECOMPUTE] = "a budget where some blocks must be recomputed",
        [BP_BUDGET_RULE_RECOMPUTES] = "a budget where the rule recomputes every block but all could offload"};
    for (int i = 0; i < N_CONFIGS; i++)
        fprintf(f, "    %-25s %s, batch %d x seq %d, %s%s\n", CONFIGS[i].name, CONFIGS[i].model, CONFIGS[i].B,
                CONFIGS[i].T, budget_txt[CONFIGS[i].budget], CONFIGS[i].disk ? ", the state on disk" : "");
    fprintf(f, "  (-disk: the training state (fp32 master weights and moments) in a disk store in --state-path DIR,\n"
               "  default a new directory under $TMPDIR or /tmp, removed at the end; its update beside the backward\n"
               "  where strata train would put it (host_work_slowdown < 0.5), else after; the path probed before\n"
               "  and after the steps (strata probe's figures, 512 MiB), the prediction from the first probe; no\n"
               "  gradient clipping; only the planner's plan runs: rule_step_s is null unless the rule's plan is\n"
               "  the same; disk peak: the store's files' allocated bytes against st_store_plan's)\n");
    fprintf(f, "  (recompute: halfway between the smallest all-recompute and all-offload plans, at least the\n"
               "  rule's smallest plan; rule-recomputes: halfway between the smallest budget at which every block\n"
               "  can be offloaded and the smallest at which the rule keeps or offloads them)\n");
    fprintf(f, "  --sweep N [--model NAME] [--batch B] [--seq T] [--cost_optimal]: instead, the device budget\n"
               "  swept geometrically over N points from the smallest budget any plan fits to the whole state\n"
               "  (every block kept, the head resident); at each the planner's plan (strata train's options, or\n"
               "  st_plan_stream's defaults with --cost_optimal) is trained (one warm-up, --steps timed, default 2):\n"
               "  per budget the plan, predicted_step_s and measured_step_s (defaults: gpt2-124m, batch 2, seq 256).\n");
    fprintf(f, "  defaults: --steps 3\n");
}

/* The smallest budget at which the rule's plan recomputes no block: its smallest keep or
 * offload candidate (below it only its recompute candidates can fit). p is scratch. */
/* The plan request (plan.h) strata train makes: with a profile and options, the program's
 * plan (no fallback: the bench compares it); without, the fixed rule's. */
static st_status plan_request(const st_arch *arch, int B, int T, size_t budget, const st_stream_config *sc,
                              const st_plan_profile *hw, const st_plan_options *po, st_stream_plan *out,
                              st_plan_prediction *pred, st_err *err) {
    st_plan_request rq = {.arch = arch, .B = B, .T = T, .budget = budget, .sc = sc, .profile = hw, .solve = hw != NULL,
                          .rule = hw == NULL, .vocab_chunk = -1};
    if (po) rq.options = *po;
    st_plan_result *res = malloc(sizeof *res);
    if (!res) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    st_status s = st_plan_for_run(&rq, res, err);
    if (!s) {
        *out = res->plan;
        if (pred) *pred = res->pred;
    }
    free(res);
    return s;
}

static size_t rule_no_recompute_bytes(const st_stream_config *sc, st_stream_plan *p) {
    size_t m = (size_t)-1;
    for (int i = 0; i < ST_PLAN_RULE_CANDIDATES; i++) {
        st_plan_rule_candidate(sc, i, p);
        if (p->act[0] == ST_STREAM_ACT_RECOMPUTE) continue;
        size_t b = st_stream_device_bytes(sc, p);
        m = b < m ? b : m;
    }
    return m;
}

/* The smallest device bytes of a plan with every block set to act over the vocabulary chunks
 * vcs[0..nv) (depth 1). p is scratch. */
static size_t uniform_min_bytes(const st_stream_config *sc, const int *vcs, int nv, st_stream_act act, st_stream_plan *p) {
    size_t m = (size_t)-1;
    st_stream_plan_default(p, sc->arch->lay.n_blocks);
    st_stream_plan_set_all(p, act);
    for (int v = 0; v < nv; v++) {
        p->vocab_chunk = vcs[v];
        size_t b = st_stream_device_bytes(sc, p);
        m = b < m ? b : m;
    }
    return m;
}

static int same_plan(const st_stream_plan *a, const st_stream_plan *b) {
    if (a->prefetch_depth != b->prefetch_depth || a->vocab_chunk != b->vocab_chunk || a->n_layer != b->n_layer ||
        a->overlap_optim != b->overlap_optim || a->clip != b->clip || a->grad_dtype != b->grad_dtype)
        return 0;
    return !memcmp(a->act, b->act, (size_t)a->n_layer);
}

static void plan_summary(const st_stream_plan *p, char *buf, size_t n) {
    int k = 0, o = 0, r = 0;
    for (int l = 0; l < p->n_layer; l++) {
        k += p->act[l] == ST_STREAM_ACT_KEEP;
        o += p->act[l] == ST_STREAM_ACT_OFFLOAD;
        r += p->act[l] == ST_STREAM_ACT_RECOMPUTE;
    }
    snprintf(buf, n, "%d keep, %d offload, %d recompute, depth %d, vocab_chunk %d", k, o, r, p->prefetch_depth,
             p->vocab_chunk);
}

/* This process's CPU seconds (every thread). */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The machine's 1-minute load average (-1 where unknown). */
static double load_avg(void) {
    FILE *f = fopen("/proc/loadavg", "r");
    double v = -1;
    if (f) {
        if (fscanf(f, "%lf", &v) != 1) v = -1;
        fclose(f);
    }
    return v;
}

/* Resets the process's VmHWM to its VmRSS (Linux >= 4.0); 0 where it cannot. */
static int reset_hwm(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return 0;
    int ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok;
}

/* The store's files in dir (strata/store.h: NAME.bin, NAME.manifest, its previous commit, the
 * lock): with remove, unlinks them; returns the bytes they hold on disk (allocated blocks). */
static unsigned long long store_files(const char *dir, int remove) {
    static const char *const ext[] = {".bin", ".manifest", ".manifest.prev", ".lock"};
    unsigned long long bytes = 0;
    for (size_t i = 0; i < sizeof ext / sizeof ext[0]; i++) {
        char f[4200];
        snprintf(f, sizeof f, "%s/%s%s", dir, BP_STORE_NAME, ext[i]);
        struct stat sb;
        if (stat(f, &sb) == 0) bytes += (unsigned long long)sb.st_blocks * 512ull;
        if (remove) unlink(f);
    }
    return bytes;
}

/* state_dir: NULL, the state in RAM; else a new store there (removed by run_close). */
static st_status run_open(bp_run *r, st_backend *cpu, const st_stream_config *sc, const st_stream_plan *p, size_t budget,
                          int steps, const char *state_dir, st_err *err) {
    memset(r, 0, sizeof *r);
    r->t = calloc((size_t)steps, sizeof *r->t);
    r->tc = calloc((size_t)steps, sizeof *r->tc);
    r->tt = calloc((size_t)steps, sizeof *r->tt);
    r->share = calloc((size_t)steps, sizeof *r->share);
    if (!r->t || !r->tc || !r->tt || !r->share) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    st_status s = st_backend_with_budget(&r->dev, cpu, budget, err);
    if (!s) s = st_stream_exec_create(&r->x, sc, p, r->dev, err);
    if (s) return s;
    st_stream_init_random(r->x, 1);
    if (state_dir) { /* the state in a store, its master weights the executor's random ones */
        const st_arch_layout *y = &sc->arch->lay;
        if (!(r->segs = calloc((size_t)y->n_tensors, sizeof *r->segs))) return st_errf(err, ST_ERR_NOMEM, "out of memory");
        st_params_decay_segments(y->tensors, y->n_tensors, sc->weight_decay, r->segs);
        const char *paths[1] = {state_dir};
        st_store_config stc = {.paths = paths, .n_paths = 1, .segs = r->segs, .n_segs = y->n_tensors,
                               .fmt = ST_OPTIM_STATE_F32, .host_budget = ST_STORE_HOST_BUDGET_DEFAULT,
                               .name = BP_STORE_NAME};
        if (st_store_exists(&stc))
            return st_errf(err, ST_ERR_INVALID, "%s already holds %s.manifest (another bench running, or one killed): "
                           "remove %s.* there", state_dir, BP_STORE_NAME, BP_STORE_NAME);
        r->store_dir = state_dir;
        if ((s = st_store_create(&r->store, &stc, st_store_init_copy, st_stream_params(r->x), err)) ||
            (s = st_stream_attach_store(r->x, r->store, NULL, 0, err)))
            return s;
    }
    return st_step_create(&r->step, &(st_step_setup){.sx = r->x, .max_micro = 1}, err);
}

static void run_close(bp_run *r) {
    st_step_destroy(r->step);
    r->step = NULL;
    st_stream_exec_free(r->x);
    st_store_close(r->store);
    if (r->store_dir) store_files(r->store_dir, 1);
    free(r->segs);
    if (r->dev) st_backend_free(r->dev);
    free(r->t);
    free(r->tc);
    free(r->tt);
    free(r->share);
    memset(r, 0, sizeof *r);
}

/* Step s of the run (s < 0: warm-up, not timed). */
static st_status run_step(bp_run *r, int s, int B, int T, const int32_t *inp, const int32_t *tgt, st_err *err) {
    /* the disk state unclipped (as bench stream --max-norm 0): every step of these random tokens
     * clips, and a clipped step beside the backward is done twice */
    st_step_hp hp = {.adam = {1e-4f, 0.9f, 0.95f, 1e-8f, s + 2, 1.0f}, .grad_clip = r->store ? 0.0f : 1.0f};
    st_step_result res;
    double c0 = cpu_now(), w0 = st_now();
    st_status st = st_step_run(r->step, 1, B, T, inp, tgt, &hp, &res, err);
    if (st) return st;
    if (s >= 0) r->share[s] = (cpu_now() - c0) / (st_now() - w0);
    if (s >= 0) r->t[s] = res.stream.wall_s, r->tc[s] = res.stream.compute_s, r->tt[s] = res.stream.optim_tail_s;
    if (res.stream.device_peak_bytes > r->dev_peak) r->dev_peak = res.stream.device_peak_bytes;
    return ST_OK;
}

typedef struct bp_result {
    const bp_config *cfg;
    size_t budget;
    int constrained, same;
    char plan_txt[96], rule_txt[96];
    st_plan_prediction pred;
    double measured_s, rule_s, meas_compute_s, meas_tail_s;
    st_plan_prediction pred_same; /* the run plan, predicted from the shape timed between the steps */
    st_plan_prediction pred_ref;  /* the run plan from the reference rates alone (what strata train has) */
    double load0, load1;       /* the 1-minute load average before and after (the machine is shared) */
    double norm_pred_s, norm_meas_s; /* both in CPU seconds / threads: what the wall time would be with
                                        every core to this process (below) */
    double pred_host, meas_host;
    size_t meas_dev;
    /* the disk state (cfg->disk) */
    int rule_measured;          /* 0: the rule's plan differs and was not run (its own store) */
    int beside;                 /* the store's update beside the backward (host_work_slowdown < 0.5) */
    st_io_probe_result probe0, probe1; /* the state path probed before and after the steps */
    st_plan_disk_cost dc, dc_same;
    unsigned long long meas_disk;  /* the store's files' allocated bytes after the steps */
    double store_step_s, store_read_wait_s, store_write_wait_s, store_update_s, store_crc_s, store_commit_s,
        store_grad_wait_s;
    double crc_bps;             /* the CRC-32C rate measured before the steps (st_plan_crc_bytes_per_s) */
    unsigned long long store_read_bytes, store_write_bytes;
    int store_hits, store_misses;
} bp_result;

/* The model's blocks (no weights) by preset name: GPT-2's presets, then the Llama family's. */
static st_status make_arch(const char *model, st_arch **arch, st_err *err) {
    st_gpt2_config g;
    st_llama_config l;
    if (st_gpt2_config_preset(model, &g, NULL) == ST_OK) return st_arch_gpt2(arch, &g, err);
    if (st_llama_config_preset(model, &l, NULL) == ST_OK) return st_arch_llama(arch, &l, err);
    return st_errf(err, ST_ERR_INVALID, "no model preset '%s' (GPT-2: %s; Llama family: %s)", model,
                   st_gpt2_preset_names(), st_llama_preset_names());
}

/* The disk path's figures through the tier's probe (st_io_probe, a BP_PROBE_BYTES file). */
static st_status probe_disk(const char *dir, st_io_probe_result *r, st_err *err) {
    return st_io_probe(dir, BP_PROBE_BYTES, 0, 0, r, err);
}

/* N input and N target ids drawn from a fixed seed (malloc'd; the caller frees both, also on
 * failure): the same tokens for every plan and every run. */
static st_status random_tokens(int N, int vocab, int32_t **inp, int32_t **tgt, st_err *err) {
    *inp = malloc(sizeof(int32_t) * (size_t)N);
    *tgt = malloc(sizeof(int32_t) * (size_t)N);
    if (!*inp || !*tgt) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    st_rng rng;
    st_rng_seed(&rng, 7);
    for (int i = 0; i < N; i++) (*inp)[i] = (int32_t)(st_rng_u64(&rng) % (uint64_t)vocab);
    for (int i = 0; i < N; i++) (*tgt)[i] = (int32_t)(st_rng_u64(&rng) % (uint64_t)vocab);
    return ST_OK;
}

static st_status bench_one(const bp_config *cfg, st_backend *cpu, st_plan_profile *hw, int steps, int json,
                           const char *state_dir, bp_result *out, st_err *err) {
    memset(out, 0, sizeof *out);
    out->cfg = cfg;
    st_arch *arch = NULL;
    bp_run plan_run = {0}, rule_run = {0};
    st_stream_plan *pp = malloc(sizeof *pp), *rp = malloc(sizeof *rp), *tp = malloc(sizeof *tp);
    int32_t *inp = NULL, *tgt = NULL;
    st_status s = ST_OK;
    if (!pp || !rp || !tp) { s = st_errf(err, ST_ERR_NOMEM, "out of memory"); goto done; }
    if ((s = make_arch(cfg->model, &arch, err))) goto done;
    st_stream_config sc = {.arch = arch, .B = cfg->B, .T = cfg->T, .weight_decay = 0.1f};
    size_t n = arch->lay.n_params, budget = n * 16 / 8;
    st_plan_options po = {.mip_gap = -1, .allow_vocab_chunk = 1,
                       .prefer_resident_head = ST_PLAN_HEAD_RESIDENT_IF_FITS}; /* as strata train */
    int vcs[ST_PLAN_MAX_VCHUNKS], nv = st_plan_vocab_chunks(arch, &po, vcs);
    if (cfg->budget == BP_BUDGET_RECOMPUTE) {
        /* halfway between the smallest all-recompute and the smallest all-offload plan over
         * the planner's vocabulary chunks (depth 1), so no plan offloads or keeps every
         * block; at least the rule's smallest plan (recompute, 2048-row chunks) */
        size_t lo = uniform_min_bytes(&sc, vcs, nv, ST_STREAM_ACT_RECOMPUTE, tp);
        size_t hi = uniform_min_bytes(&sc, vcs, nv, ST_STREAM_ACT_OFFLOAD, tp);
        budget = lo + (hi > lo ? (hi - lo) / 2 : 0);
        st_plan_rule_candidate(&sc, ST_PLAN_RULE_CANDIDATES - 1, tp);
        size_t rule_min = st_stream_device_bytes(&sc, tp);
        if (budget < rule_min) budget = rule_min;
    } else if (cfg->budget == BP_BUDGET_RULE_RECOMPUTES) {
        /* from the smallest budget at which every block can offload (the planner's chunks) to
         * the smallest at which the rule stops recomputing: halfway, so the rule recomputes
         * every block and the planner may offload every one */
        size_t lo = uniform_min_bytes(&sc, vcs, nv, ST_STREAM_ACT_OFFLOAD, tp);
        size_t hi = rule_no_recompute_bytes(&sc, tp);
        if (hi <= lo + 1) {
            s = st_errf(err, ST_ERR_UNSUPPORTED, "%s: no device budget where the rule recomputes every block and "
                        "every block could be offloaded: the smallest all-offload plan needs %zu bytes, the rule "
                        "keeps or offloads from %zu bytes", cfg->name, lo, hi);
            goto done;
        }
        budget = lo + (hi - lo) / 2;
    }
    out->budget = budget;
    out->load0 = load_avg();
    /* the model's own block and classifier timed at this shape, unless the profile has them */
    if (!st_plan_profile_shape(hw, arch, cfg->B, cfg->T) &&
        (s = st_plan_profile_measure_shape(cpu, arch, cfg->B, cfg->T, hw, err)))
        goto done;
    if ((s = plan_request(arch, cfg->B, cfg->T, budget, &sc, hw, &po, pp, &out->pred, err))) goto done;
    out->pred_host = (double)st_plan_host_bytes(arch, cfg->B, cfg->T, pp);
    /* the disk state: the plan run's store beside the backward where strata train puts it, the
     * path probed now (and again after the steps), the prediction with the store's terms */
    st_stream_config scp = sc;
    const char *dpaths[1] = {state_dir};
    double mixed = 0;
    st_plan_disk dk = {.paths = dpaths, .n_paths = 1, .mixed_bytes_per_s = &mixed, .fmt = ST_OPTIM_STATE_F32,
                       .optim_ns_per_param = hw->optim_ns_per_param, .host_budget = ST_STORE_HOST_BUDGET_DEFAULT,
                       .weight_decay = sc.weight_decay,
                       .cpu_slowdown = 1.0}; /* the CPU backend: the store's all-core work is the compute's cores */
    if (state_dir) {
        scp.external_optimizer = 1;
        scp.store_beside = out->beside = dk.beside = hw->host_work_slowdown < 0.5;
        if ((s = probe_disk(state_dir, &out->probe0, err)) || (s = st_plan_crc_bytes_per_s(&out->crc_bps, err))) goto done;
        mixed = out->probe0.mixed_gbps * 1e9;
        dk.crc_bytes_per_s = out->crc_bps;
        st_plan_prediction solved = out->pred;
        if ((s = st_plan_predict_disk(arch, cfg->B, cfg->T, hw, pp, &dk, &out->pred, &out->dc, err))) goto done;
        out->pred.solve_s = solved.solve_s;
        out->pred.optimal = solved.optimal;
        out->pred_host = (double)out->dc.host_bytes;
    }
    {
        st_plan_profile *ref = malloc(sizeof *ref);
        if (!ref) { s = st_errf(err, ST_ERR_NOMEM, "out of memory"); goto done; }
        *ref = *hw;
        ref->n_shapes = 0;
        s = state_dir ? st_plan_predict_disk(arch, cfg->B, cfg->T, ref, pp, &dk, &out->pred_ref, NULL, err)
                      : st_plan_predict(arch, cfg->B, cfg->T, ref, pp, &out->pred_ref, err);
        free(ref);
        if (s) goto done;
    }
    if (plan_request(arch, cfg->B, cfg->T, budget, &sc, NULL, NULL, rp, NULL, err)) {
        s = st_errf(err, ST_ERR_NOMEM, "%s: the fixed rule finds no plan within %zu device bytes", cfg->name, budget);
        goto done;
    }
    int rule_rc = 0;
    for (int l = 0; l < rp->n_layer; l++) {
        out->constrained |= rp->act[l] != ST_STREAM_ACT_KEEP;
        rule_rc += rp->act[l] == ST_STREAM_ACT_RECOMPUTE;
    }
    if (cfg->budget == BP_BUDGET_RULE_RECOMPUTES && rule_rc != rp->n_layer) {
        s = st_errf(err, ST_ERR_UNSUPPORTED, "%s: at %zu device bytes the rule recomputes %d of %d blocks, not "
                    "every one", cfg->name, budget, rule_rc, rp->n_layer);
        goto done;
    }
    out->same = same_plan(pp, rp);
    plan_summary(pp, out->plan_txt, sizeof out->plan_txt);
    plan_summary(rp, out->rule_txt, sizeof out->rule_txt);
    if (!json)
        fprintf(stderr, "%s: budget %zu bytes; planner: %s (predicted %.3f s); rule: %s%s\n", cfg->name, budget,
                out->plan_txt, out->pred.step_s, out->rule_txt, out->same ? " (the same plan)" : "");

    if ((s = random_tokens(cfg->B * cfg->T, arch->lay.vocab_size, &inp, &tgt, err))) goto done;

    /* the planned executor alone from creation to the end of its warm-up step: its host peak */
    double rss0 = bench_proc_status_bytes("VmRSS:");
    int hwm_ok = reset_hwm();
    if ((s = run_open(&plan_run, cpu, &scp, pp, budget, steps, state_dir, err)) ||
        (s = run_step(&plan_run, -1, cfg->B, cfg->T, inp, tgt, err)))
        goto done;
    double hwm = bench_proc_status_bytes("VmHWM:");
    out->meas_host = hwm_ok && rss0 >= 0 && hwm >= 0 ? hwm - rss0 - (double)plan_run.dev_peak : -1;
    if (out->meas_host < 0 && hwm_ok) out->meas_host = 0;
    out->rule_measured = out->same || !state_dir;
    if (!out->same && !state_dir) {
        if ((s = run_open(&rule_run, cpu, &sc, rp, budget, steps, NULL, err)) ||
            (s = run_step(&rule_run, -1, cfg->B, cfg->T, inp, tgt, err)))
            goto done;
    }
    /* the shape timed again after each pair of steps: the same load as the steps see (the
     * machine may be shared), for predicted_same_load_step_s */
    st_plan_profile *hs = malloc(sizeof *hs);
    double *sf = calloc((size_t)steps, sizeof *sf), *sb = calloc((size_t)steps, sizeof *sb),
           *sh = calloc((size_t)steps, sizeof *sh), *ss = calloc((size_t)steps, sizeof *ss),
           *sn = calloc((size_t)steps, sizeof *sn), *sc2 = calloc((size_t)steps, sizeof *sc2);
    if (!hs || !sf || !sb || !sh || !ss || !sn || !sc2) s = st_errf(err, ST_ERR_NOMEM, "out of memory");
    for (int i = 0; i < steps && !s; i++) {
        if ((s = run_step(&plan_run, i, cfg->B, cfg->T, inp, tgt, err))) break;
        if (rule_run.x && (s = run_step(&rule_run, i, cfg->B, cfg->T, inp, tgt, err))) break;
        *hs = *hw;
        double c0 = cpu_now(), w0 = st_now();
        if ((s = st_plan_profile_measure_shape(cpu, arch, cfg->B, cfg->T, hs, err))) break;
        ss[i] = (cpu_now() - c0) / (st_now() - w0);
        const st_plan_shape_time *e = st_plan_profile_shape(hs, arch, cfg->B, cfg->T);
        sf[i] = e->block_fwd_s, sb[i] = e->block_bwd_s, sh[i] = e->head_s_per_row, sc2[i] = e->head_s_per_chunk;
        if (!json)
            fprintf(stderr, "  step %d: planned %.3f s, rule %.3f s\n", i + 1, plan_run.t[i],
                    out->same ? plan_run.t[i] : rule_run.x ? rule_run.t[i] : NAN);
    }
    if (!s) {
        st_plan_shape_time *e = (st_plan_shape_time *)st_plan_profile_shape(hs, arch, cfg->B, cfg->T);
        e->block_fwd_s = bench_median(sf, steps);
        e->block_bwd_s = bench_median(sb, steps);
        e->head_s_per_row = bench_median(sh, steps);
        e->head_s_per_chunk = bench_median(sc2, steps);
        if (state_dir) { /* the disk as probed before and after the steps (mean) */
            if (!(s = probe_disk(state_dir, &out->probe1, err))) {
                mixed = 0.5e9 * (out->probe0.mixed_gbps + out->probe1.mixed_gbps);
                s = st_plan_predict_disk(arch, cfg->B, cfg->T, hs, pp, &dk, &out->pred_same, &out->dc_same, err);
            }
        } else
            s = st_plan_predict(arch, cfg->B, cfg->T, hs, pp, &out->pred_same, err);
        /* load-normalised: a time x the cores this process got / its threads, for the
         * shape's timings and for each step alike (1 on an idle machine) */
        double nth = omp_get_max_threads(), k = bench_median(ss, steps) / nth;
        e->block_fwd_s *= k;
        e->block_bwd_s *= k;
        e->head_s_per_row *= k;
        e->head_s_per_chunk *= k;
        st_plan_prediction pn;
        if (!s && !(s = state_dir ? st_plan_predict_disk(arch, cfg->B, cfg->T, hs, pp, &dk, &pn, NULL, err)
                                  : st_plan_predict(arch, cfg->B, cfg->T, hs, pp, &pn, err)))
            out->norm_pred_s = pn.step_s;
        for (int i = 0; i < steps; i++) sn[i] = plan_run.t[i] * plan_run.share[i] / nth;
        out->norm_meas_s = bench_median(sn, steps);
    }
    free(hs);
    free(sf);
    free(sb);
    free(sh);
    free(ss);
    free(sn);
    free(sc2);
    if (s) goto done;
    out->meas_dev = plan_run.dev_peak;
    out->measured_s = bench_median(plan_run.t, steps);
    out->meas_compute_s = bench_median(plan_run.tc, steps);
    out->meas_tail_s = bench_median(plan_run.tt, steps);
    out->rule_s = out->same ? out->measured_s : rule_run.x ? bench_median(rule_run.t, steps) : NAN;
    if (plan_run.store) {
        st_store_stats ss;
        st_store_get_stats(plan_run.store, &ss); /* the last step's */
        out->store_step_s = ss.step_s, out->store_read_wait_s = ss.read_wait_s, out->store_write_wait_s = ss.write_wait_s;
        out->store_update_s = ss.update_s, out->store_crc_s = ss.crc_s, out->store_commit_s = ss.commit_s;
        out->store_grad_wait_s = ss.grad_wait_s;
        out->store_read_bytes = ss.read_bytes, out->store_write_bytes = ss.write_bytes;
        out->store_hits = ss.hits, out->store_misses = ss.misses;
        out->meas_disk = store_files(state_dir, 0);
    }
    out->load1 = load_avg();
done:
    run_close(&plan_run);
    run_close(&rule_run);
    free(inp);
    free(tgt);
    free(pp);
    free(rp);
    free(tp);
    st_arch_free(arch);
    return s;
}

/* --sweep N: the device budget swept geometrically over N points from the smallest budget
 * any plan fits (the smallest all-recompute plan over the vocabulary chunks, depth 1) to the
 * whole state (the largest plan: every block kept, the head resident, the deepest prefetch);
 * at each, the planner's plan (strata train's options, or st_plan_stream's defaults with
 * cost_optimal) is trained for one warm-up and `steps` timed steps (median). */
static st_status bench_sweep(const char *model, int B, int T, int npts, int steps, int cost_optimal, st_backend *cpu,
                             st_plan_profile *hw, int json, st_err *err) {
    st_arch *arch = NULL;
    st_stream_plan *pp = malloc(sizeof *pp);
    int32_t *inp = NULL, *tgt = NULL;
    bp_run run = {0};
    st_status s = ST_OK;
    if (!pp) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    if ((s = make_arch(model, &arch, err))) goto done;
    st_stream_config sc = {.arch = arch, .B = B, .T = T, .weight_decay = 0.1f};
    st_plan_options po = {.mip_gap = -1, .allow_vocab_chunk = 1,
                       .prefer_resident_head = cost_optimal ? ST_PLAN_HEAD_FASTEST : ST_PLAN_HEAD_RESIDENT_IF_FITS};
    int L = arch->lay.n_blocks, vcs[ST_PLAN_MAX_VCHUNKS], nv = st_plan_vocab_chunks(arch, &po, vcs);
    size_t lo = (size_t)-1, hi = 0;
    for (int v = 0; v < nv; v++)
        for (int d = 1; d <= ST_PLAN_MAX_DEPTH && d <= L; d++)
            for (int act = ST_STREAM_ACT_KEEP; act <= ST_STREAM_ACT_OFFLOAD; act++) {
                st_stream_plan_default(pp, L);
                st_stream_plan_set_all(pp, (st_stream_act)act);
                pp->vocab_chunk = vcs[v];
                pp->prefetch_depth = d;
                size_t b = st_stream_device_bytes(&sc, pp);
                lo = b < lo ? b : lo;
                hi = b > hi ? b : hi;
            }
    if (!st_plan_profile_shape(hw, arch, B, T) && (s = st_plan_profile_measure_shape(cpu, arch, B, T, hw, err))) goto done;
    if ((s = random_tokens(B * T, arch->lay.vocab_size, &inp, &tgt, err))) goto done;
    if (json)
        printf("{\"bench\":\"plan_sweep\",\"model\":\"%s\",\"batch\":%d,\"seq\":%d,\"threads\":%d,\"steps\":%d,"
               "\"options\":\"%s\",\"smallest_budget_bytes\":%zu,\"whole_state_bytes\":%zu,\"budgets\":[",
               model, B, T, omp_get_max_threads(), steps, cost_optimal ? "cost_optimal" : "strata_train", lo, hi);
    for (int i = 0; i < npts; i++) {
        size_t budget = npts == 1 || i == npts - 1
                            ? hi
                            : (size_t)((double)lo * pow((double)hi / (double)lo, (double)i / (npts - 1)));
        if (budget < lo) budget = lo;
        st_plan_prediction pred;
        char txt[96];
        if ((s = plan_request(arch, B, T, budget, &sc, hw, &po, pp, &pred, err))) goto done;
        plan_summary(pp, txt, sizeof txt);
        if ((s = run_open(&run, cpu, &sc, pp, budget, steps, NULL, err))) goto done;
        for (int k = -1; k < steps && !s; k++) s = run_step(&run, k, B, T, inp, tgt, err);
        if (s) goto done;
        double meas = bench_median(run.t, steps);
        size_t peak = run.dev_peak;
        run_close(&run);
        if (json)
            printf("%s{\"device_budget_bytes\":%zu,\"plan\":\"%s\",\"device_bytes\":%zu,\"measured_device_peak_bytes\":%zu,"
                   "\"predicted_step_s\":%.4f,\"measured_step_s\":%.4f,\"predicted_over_measured\":%.3f,"
                   "\"predicted_parts_s\":{\"compute\":%.4f,\"recompute\":%.4f,\"transfer_exposed\":%.4f,"
                   "\"optim_exposed\":%.4f,\"host_work\":%.4f},\"solve_s\":%.4f}",
                   i ? "," : "", budget, txt, pred.device_bytes, peak, pred.step_s, meas, pred.step_s / meas,
                   pred.compute_s, pred.recompute_s, pred.transfer_exposed_s, pred.optim_exposed_s, pred.host_work_s,
                   pred.solve_s);
        else
            printf("budget %.1f MB: %s: predicted %.3f s, measured %.3f s (predicted/measured %.3f)\n", budget / 1e6,
                   txt, pred.step_s, meas, pred.step_s / meas);
        fflush(stdout);
    }
    if (json) printf("]}\n");
done:
    run_close(&run);
    free(inp);
    free(tgt);
    free(pp);
    st_arch_free(arch);
    return s;
}

int bench_plan(int argc, char **argv) {
    const char *only = NULL, *profile = NULL, *model = "gpt2-124m", *state_path = NULL;
    int steps = 3, threads = 0, json = 0, sweep = 0, sweep_B = 2, sweep_T = 256, cost_optimal = 0, steps_set = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--json")) json = 1;
        else if (v && !strcmp(a, "--config")) { only = v; i++; }
        else if (v && !strcmp(a, "--profile")) { profile = v; i++; }
        else if (v && !strcmp(a, "--state-path")) { state_path = v; i++; }
        else if (v && !strcmp(a, "--steps")) { steps = atoi(v); steps_set = 1; i++; }
        else if (v && !strcmp(a, "--sweep")) { sweep = atoi(v); i++; }
        else if (v && !strcmp(a, "--model")) { model = v; i++; }
        else if (v && !strcmp(a, "--batch")) { sweep_B = atoi(v); i++; }
        else if (v && !strcmp(a, "--seq")) { sweep_T = atoi(v); i++; }
        else if (!strcmp(a, "--cost_optimal")) cost_optimal = 1;
        else if (v && !strcmp(a, "--threads")) { threads = atoi(v); i++; }
        else { fprintf(stderr, "strata bench plan: unknown or incomplete option '%s'\n", a); usage(stderr); return 2; }
    }
    if (sweep && !steps_set) steps = 2;
    if (steps < 1 || sweep < 0 || sweep_B < 1 || sweep_T < 1) {
        fprintf(stderr, "strata bench plan: --steps, --batch and --seq must be >= 1, --sweep >= 0\n");
        return 2;
    }
    int sel[N_CONFIGS], nsel = 0;
    for (int i = 0; i < N_CONFIGS; i++)
        if (!only || !strcmp(only, CONFIGS[i].name)) sel[nsel++] = i;
    if (!nsel) {
        fprintf(stderr, "strata bench plan: no configuration '%s'\n", only);
        usage(stderr);
        return 2;
    }
    st_err err = {0};
    st_backend *cpu = NULL;
    st_plan_profile hw;
    char tmp_dir[4096] = "";
    int any_disk = 0;
    for (int k = 0; k < nsel; k++) any_disk |= CONFIGS[sel[k]].disk;
    if (any_disk && !sweep && !state_path) { /* a directory of its own under the run's temporary directory */
        const char *td = getenv("TMPDIR");
        snprintf(tmp_dir, sizeof tmp_dir, "%s/strata-bench-plan-XXXXXX", td && *td ? td : "/tmp");
        if (!mkdtemp(tmp_dir)) {
            fprintf(stderr, "strata bench plan: cannot create a directory %s for the disk state: %s (give one with "
                    "--state-path DIR)\n", tmp_dir, strerror(errno));
            return 1;
        }
        state_path = tmp_dir;
    }
    const char *state_dir = state_path;
    double prof_s = 0;
    bp_result res[N_CONFIGS];
    int rc = 1;
    if (st_backend_cpu_create(&cpu, threads, &err)) goto fail;
    if (profile) {
        if (st_plan_profile_load(profile, &hw, &err)) goto fail;
    } else {
        double t0 = st_now();
        if (st_plan_profile_measure(cpu, &hw, &err)) goto fail;
        prof_s = st_now() - t0;
    }
    if (sweep) {
        if (bench_sweep(model, sweep_B, sweep_T, sweep, steps, cost_optimal, cpu, &hw, json, &err)) goto fail;
        rc = 0;
        goto done;
    }
    for (int k = 0; k < nsel; k++)
        if (bench_one(&CONFIGS[sel[k]], cpu, &hw, steps, json, CONFIGS[sel[k]].disk ? state_dir : NULL, &res[k], &err))
            goto fail;
    if (json) {
        printf("{\"bench\":\"plan\",\"threads\":%d,\"steps\":%d,\"profile\":\"%s\",\"profile_s\":%.3f,\"configs\":[",
               omp_get_max_threads(), steps, profile ? profile : "measured", prof_s);
        for (int k = 0; k < nsel; k++) {
            bp_result *r = &res[k];
            char rule_s[32] = "null", rule_ratio[32] = "null", disk_json[1600] = "";
            if (r->rule_measured) {
                snprintf(rule_s, sizeof rule_s, "%.4f", r->rule_s);
                snprintf(rule_ratio, sizeof rule_ratio, "%.3f", r->rule_s / r->measured_s);
            }
            if (r->cfg->disk)
                snprintf(disk_json, sizeof disk_json,
                         ",\"disk_state\":{\"state_path\":\"%s\",\"state_format\":\"f32\",\"store_beside\":%s,"
                         "\"rule_measured\":%s,\"probe_before_gbps\":{\"read\":%.3f,\"write\":%.3f,\"mixed\":%.3f},"
                         "\"probe_after_gbps\":{\"read\":%.3f,\"write\":%.3f,\"mixed\":%.3f},"
                         "\"predicted\":{\"io_s\":%.3f,\"cpu_s\":%.3f,\"store_s\":%.3f,\"hidden_s\":%.3f,"
                         "\"read_bytes\":%llu,\"write_bytes\":%llu,\"store_host_bytes\":%llu},"
                         "\"predicted_same_load\":{\"io_s\":%.3f,\"cpu_s\":%.3f,\"store_s\":%.3f,\"compute_s\":%.3f,"
                         "\"optim_exposed_s\":%.3f,\"host_work_s\":%.3f},"
                         "\"profile\":{\"optim_ns_per_param\":%.3f,\"mem_bytes_per_s\":%.4g,\"crc_bytes_per_s\":%.4g,"
                         "\"host_work_slowdown\":%.3f},"
                         "\"measured_last_step\":{\"store_step_s\":%.3f,\"update_s\":%.3f,\"crc_s\":%.3f,"
                         "\"commit_s\":%.3f,\"grad_wait_s\":%.3f,"
                         "\"read_wait_s\":%.3f,\"write_wait_s\":%.3f,\"read_bytes\":%llu,\"write_bytes\":%llu,"
                         "\"cache_hits\":%d,\"cache_misses\":%d}}",
                         state_path, r->beside ? "true" : "false", r->rule_measured ? "true" : "false",
                         r->probe0.read_gbps, r->probe0.write_gbps, r->probe0.mixed_gbps, r->probe1.read_gbps,
                         r->probe1.write_gbps, r->probe1.mixed_gbps, r->dc.io_s, r->dc.cpu_s, r->dc.store_s,
                         r->dc.hidden_s, r->dc.read_bytes, r->dc.write_bytes, r->dc.store_host_bytes,
                         r->dc_same.io_s, r->dc_same.cpu_s, r->dc_same.store_s, r->pred_same.compute_s,
                         r->pred_same.optim_exposed_s, r->pred_same.host_work_s, hw.optim_ns_per_param,
                         hw.mem_bytes_per_s, r->crc_bps, hw.host_work_slowdown, r->store_step_s, r->store_update_s,
                         r->store_crc_s, r->store_commit_s, r->store_grad_wait_s, r->store_read_wait_s, r->store_write_wait_s, r->store_read_bytes,
                         r->store_write_bytes, r->store_hits, r->store_misses);
            printf("%s{\"name\":\"%s\",\"model\":\"%s\",\"batch\":%d,\"seq\":%d,\"device_budget_bytes\":%zu,"
                   "\"constrained\":%s,\"plan\":\"%s\",\"rule_plan\":\"%s\",\"rule_same_plan\":%s,"
                   "\"predicted_step_s\":%.4f,\"measured_step_s\":%.4f,\"rule_step_s\":%s,"
                   "\"predicted_over_measured\":%.3f,\"rule_over_measured\":%s,"
                   "\"predicted_same_load_step_s\":%.4f,\"predicted_same_load_over_measured\":%.3f,"
                   "\"predicted_reference_rates_step_s\":%.4f,\"predicted_reference_rates_over_measured\":%.3f,"
                   "\"predicted_parts_s\":{\"compute\":%.4f,\"recompute\":%.4f,\"transfer_exposed\":%.4f,"
                   "\"optim_exposed\":%.4f,\"host_work\":%.4f},\"measured_parts_s\":{\"compute\":%.4f,\"optim_tail\":%.4f},"
                   "\"solve_s\":%.4f,\"load_avg_before\":%.2f,\"load_avg_after\":%.2f,"
                   "\"load_normalised\":{\"predicted_step_s\":%.4f,\"measured_step_s\":%.4f,"
                   "\"predicted_over_measured\":%.3f},"
                   "\"predicted_peak_bytes\":{\"device\":%zu,\"host\":%.0f,\"disk\":%llu},"
                   "\"measured_peak_bytes\":{\"device\":%zu,\"host\":%.0f,\"disk\":%llu}%s}",
                   k ? "," : "", r->cfg->name, r->cfg->model, r->cfg->B, r->cfg->T, r->budget,
                   r->constrained ? "true" : "false", r->plan_txt, r->rule_txt, r->same ? "true" : "false",
                   r->pred.step_s, r->measured_s, rule_s, r->pred.step_s / r->measured_s, rule_ratio,
                   r->pred_same.step_s, r->pred_same.step_s / r->measured_s, r->pred_ref.step_s,
                   r->pred_ref.step_s / r->measured_s,
                   r->pred.compute_s, r->pred.recompute_s, r->pred.transfer_exposed_s, r->pred.optim_exposed_s,
                   r->pred.host_work_s, r->meas_compute_s, r->meas_tail_s, r->pred.solve_s, r->load0, r->load1, r->norm_pred_s,
                   r->norm_meas_s, r->norm_pred_s / r->norm_meas_s, r->pred.device_bytes, r->pred_host, r->dc.disk_bytes,
                   r->meas_dev, r->meas_host, r->meas_disk, disk_json);
        }
        printf("]}\n");
    } else {
        for (int k = 0; k < nsel; k++) {
            bp_result *r = &res[k];
            printf("%s (%s, batch %d x seq %d, device budget %.1f MB%s)\n"
                   "  planner: %s\n  rule:    %s\n"
                   "  predicted %.3f s, measured %.3f s (predicted/measured %.3f), rule %.3f s (rule/measured %.3f)\n"
                   "  predicted from the shape timed between the steps (the same load) %.3f s (/measured %.3f), "
                   "from the reference rates alone %.3f s (/measured %.3f)\n"
                   "  load-normalised: predicted %.3f s, measured %.3f s (/measured %.3f); load average %.2f -> %.2f\n"
                   "  predicted compute %.3f + recompute %.3f s, measured compute %.3f s (recompute included), "
                   "optimizer tail %.3f s\n"
                   "  device peak: predicted %.1f MB, measured %.1f MB; host peak: predicted %.1f MB, measured %.1f MB\n",
                   r->cfg->name, r->cfg->model, r->cfg->B, r->cfg->T, r->budget / 1e6,
                   r->constrained ? ", constrained" : "", r->plan_txt, r->rule_txt, r->pred.step_s, r->measured_s,
                   r->pred.step_s / r->measured_s, r->rule_s, r->rule_s / r->measured_s, r->pred_same.step_s,
                   r->pred_same.step_s / r->measured_s, r->pred_ref.step_s, r->pred_ref.step_s / r->measured_s,
                   r->norm_pred_s, r->norm_meas_s, r->norm_pred_s / r->norm_meas_s, r->load0, r->load1,
                   r->pred.compute_s,
                   r->pred.recompute_s, r->meas_compute_s, r->meas_tail_s, r->pred.device_bytes / 1e6,
                   r->meas_dev / 1e6, r->pred_host / 1e6, r->meas_host / 1e6);
            if (r->cfg->disk)
                printf("  disk state (%s, store %s the backward): disk peak predicted %.1f MB, measured %.1f MB; "
                       "store predicted io %.3f s, cpu %.3f s, exposed %.3f s; mixed %.3f GB/s before, %.3f after; the "
                       "store's last step %.3f s\n", state_path, r->beside ? "beside" : "after", r->dc.disk_bytes / 1e6,
                       r->meas_disk / 1e6, r->dc.io_s, r->dc.cpu_s, r->pred.optim_exposed_s, r->probe0.mixed_gbps,
                       r->probe1.mixed_gbps, r->store_step_s);
        }
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "strata bench plan: %s\n", err.msg);
done:
    if (cpu) st_backend_free(cpu);
    if (*tmp_dir) rmdir(tmp_dir);
    return rc;
}
