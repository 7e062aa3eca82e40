/* plan_memory.c - the one account of memory: the bytes each tier holds for a configuration,
 * by class of training state, and the refusal of a run that cannot fit its budgets.
 *
 * Every byte the step allocates is read from the executor's own allocation tables
 * (st_stream_device_bytes, st_stream_host_bytes: the tables st_stream_exec_create allocates
 * from), never from a copy of them: in memory the step is the block executor with every
 * block resident (st_stream_plan_resident), so its "device" allocations are host memory;
 * streamed, they are the device tier's, and host memory too where the device is the CPU.
 * Only what is not the executor's is counted here: the staging buffer of initialisation and
 * checkpoints, the runtime's constant, a model that trains through its own forward (LoRA,
 * POET-X: their activations given by the model layer), and the disk state's host buffers.
 */
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "strata/optim.h"
#include "strata/plan.h"
#include "strata/poetx.h"
#include "strata/prof.h"
#include "strata/store.h"

/* Code, shared libraries, OpenMP and OpenBLAS buffers, the data pipeline (the embedded
 * corpus: 4 MiB of text while 8 MiB of tokens are filled) and stdio. Measured as VmHWM
 * minus the training state on the development machine (2 threads), with checkpoints every
 * step: 18.3 MiB for gpt2-mini at batch 1 x seq 16, 19.3 to 19.5 MiB for weight-heavy
 * runs, 31.1 MiB for an activation-heavy one (batch 32 x seq 256: OpenBLAS touches more
 * of its packing buffers on large matrices). The middle, so that either kind of run is
 * within 4% when its state is a few hundred MiB (tests/test_prof_mem.sh). */
#define RUNTIME_BYTES (26.0 * 1048576.0)
/* the disk state's host buffers when state_budget is not given (the store's default) */
#define STATE_BUFFERS_DEFAULT (256.0 * 1048576.0)

const char *st_mem_tier_name(int tier) {
    static const char *n[ST_MEM_TIER_COUNT] = {"device", "host", "disk"};
    return (unsigned)tier < ST_MEM_TIER_COUNT ? n[tier] : "?";
}

st_status st_plan_memory(const st_mem_request *rq, st_mem_plan *e, st_err *err) {
    memset(e, 0, sizeof *e);
    if (!rq->arch || rq->B < 1 || rq->T < 1)
        return st_errf(err, ST_ERR_INVALID, "memory account: no model or batch %d x seq %d", rq->B, rq->T);
    const st_arch_layout *y = &rq->arch->lay;
    double n = (double)y->n_params, N = (double)rq->B * rq->T;
    st_stream_plan p;
    if (rq->plan) p = *rq->plan;
    else if (rq->streamed) st_stream_plan_default(&p, y->n_blocks); /* the smallest: every block recomputed */
    else st_stream_plan_resident(&p, y->n_blocks);
    if (!rq->plan) p.act_dtype = rq->act_dtype; /* the step's activation sets: 4 or 2 bytes an element */
    st_stream_plan all_rc = p; /* the same plan recomputing every block: the checkpointed figure */
    st_stream_plan_set_all(&all_rc, ST_STREAM_ACT_RECOMPUTE);
    /* the executor's tables: device bytes, host bytes without the moments, and the moments in
     * either format (what the optimizer adds to the host table) */
    /* LoRA streamed (what trains is not the arch's, and the executor's tables hold the
     * activations): a frozen base's executor, no gradient slots or host gradient vector */
    /* POET-X streamed (hook_bytes): a hook that trains the ends, the same tables with the
     * embedding's and head's gradients, and the hook's own host bytes besides */
    st_linear_hook frozen_hook = {.frozen = 1, .held_block_bytes = rq->held_block_bytes},
                   ends_hook = {.frozen = 0, .held_block_bytes = rq->held_block_bytes};
    int ends = rq->hook_bytes > 0 && (rq->streamed || rq->plan) && rq->model_act_bytes <= 0;
    int fz = rq->trainable_params > 0 && (rq->streamed || rq->plan) && rq->model_act_bytes <= 0;
    st_stream_config sc = {.arch = rq->arch, .B = rq->B, .T = rq->T, .grad_accum = rq->grad_accum > 1 ? rq->grad_accum : 1,
                           .state_format = ST_OPTIM_STATE_F32, .external_optimizer = 1,
                           .hook = ends ? &ends_hook : fz ? &frozen_hook : NULL};
    double dev = (double)st_stream_device_bytes(&sc, &p), dev_rc = (double)st_stream_device_bytes(&sc, &all_rc);
    double host = (double)st_stream_host_bytes(&sc, &p);
    sc.external_optimizer = 0;
    double mf = (double)st_stream_host_bytes(&sc, &p) - host;
    sc.state_format = ST_OPTIM_STATE_8BIT;
    double m8 = (double)st_stream_host_bytes(&sc, &p) - host;
    int q8 = rq->state_format != ST_OPTIM_STATE_F32;
    e->n_params = n;
    e->weights = 4.0 * n; /* the host vectors, which the executor counts first */
    e->grads = 4.0 * n;
    e->master_if_bf16 = 4.0 * n;
    e->moments_f32 = mf;
    e->moments_8bit = m8;
    e->moments_8bit_used = q8;
    e->state_format = rq->state_format;
    e->streamed = rq->streamed || rq->plan;
    e->exec_host = host - (fz ? 4.0 : 8.0) * n; /* per-row buffers, grad_accum's gradient, offloaded sets, backups */
    if (rq->bf16_weights) e->exec_host += (double)st_stream_bf16_weight_bytes(&sc); /* matmul bf16's copy */
    if (ends) e->exec_host += rq->hook_bytes; /* POET-X's kept h and scratch, host memory */
    else if (fz && rq->frozen_hook_bytes > 0) e->exec_host += rq->frozen_hook_bytes; /* LoRA's adapter scratch */
    if (rq->model_act_bytes > 0) { /* the model's own forward: its activations, its per-row losses */
        e->acts_stored = rq->model_act_bytes + 4.0 * N;
        e->acts_ckpt = e->acts_stored; /* the model's forward keeps them all */
        e->exec_host = 0;
    } else {
        e->acts_stored = dev;
        e->acts_ckpt = dev_rc;
    }
    if (rq->trainable_params > 0) { /* LoRA, POET-X: the base frozen, only what the method trains updated */
        double t = rq->trainable_params;
        e->n_trainable = t;
        e->frozen = rq->frozen_bytes > 0 ? rq->frozen_bytes : 4.0 * n;
        e->frozen_dtype = rq->frozen_dtype;
        e->weights = e->grads = e->master_if_bf16 = 4.0 * t;
        e->moments_f32 = 8.0 * t;
        e->moments_8bit = 2.0 * t + 8.0 * ceil(t / ST_OPTIM_Q8_BLOCK);
    }
    /* st_gpt2_init_random and the checkpoint's save and load stage all weights in one buffer (a
     * method over frozen weights: what it trains, at the end-of-run checkpoint) */
    e->init_scratch = 4.0 * (rq->trainable_params > 0 ? rq->trainable_params : n);
    if (rq->method_staging > 0) e->init_scratch = rq->method_staging;
    e->runtime = RUNTIME_BYTES + 8.0 * N; /* ... and the loop's inputs and targets */
    double moments = q8 ? e->moments_8bit : e->moments_f32;
    if (rq->state_on_disk) {
        e->moments_on_disk = 1;
        e->state_buffers = rq->state_budget > 0 ? rq->state_budget : STATE_BUFFERS_DEFAULT;
        moments = e->state_buffers;
        /* two regions a subgroup (crash-safe), each the master weights and the moments */
        e->tier_need[ST_MEM_TIER_DISK] = 2.0 * (e->n_trainable > 0 ? e->n_trainable : n) *
                                         st_store_bytes_per_param((st_optim_state_format)rq->state_format) +
                                     (rq->method_disk > 0 ? rq->method_disk : 0);
    }
    double acts_host = e->streamed && !rq->device_is_host && rq->model_act_bytes <= 0 ? 0 : e->acts_stored;
    if (e->streamed && rq->model_act_bytes <= 0) e->tier_need[ST_MEM_TIER_DEVICE] = e->acts_stored;
    /* The checkpoint at the end of a run stages the weights while everything else is
     * allocated: that is the peak. */
    e->tier_need[ST_MEM_TIER_HOST] = e->runtime + e->frozen + e->weights + e->grads + e->master + moments + e->exec_host +
                                     acts_host + e->init_scratch;
    /* A method over frozen weights builds the whole base first (its weights, no gradients), then
     * wraps it: that start can be the peak (the methods' own figure, method_start; without it the
     * base's weights, gradients and a staging buffer, 12 bytes a parameter, an upper bound) */
    double start = e->runtime + (rq->method_start > 0 ? rq->method_start : 12.0 * n);
    if (rq->trainable_params > 0 && start > e->tier_need[ST_MEM_TIER_HOST]) e->tier_need[ST_MEM_TIER_HOST] = start;
    return ST_OK;
}

size_t st_plan_host_bytes(const st_arch *a, int B, int T, const st_stream_plan *p) {
    st_stream_config sc = {.arch = a, .B = B, .T = T, .state_format = ST_OPTIM_STATE_F32};
    return st_stream_host_bytes(&sc, p);
}

size_t st_plan_host_bytes_disk(const st_arch *a, int B, int T, const st_stream_plan *p) {
    st_stream_config sc = {.arch = a, .B = B, .T = T, .state_format = ST_OPTIM_STATE_F32, .external_optimizer = 1};
    return st_stream_host_bytes(&sc, p);
}

static void fmt_bytes(char *buf, size_t cap, double b) {
    if (b >= 1073741824.0) snprintf(buf, cap, "%.2f GiB", b / 1073741824.0);
    else if (b >= 1048576.0) snprintf(buf, cap, "%.1f MiB", b / 1048576.0);
    else if (b >= 1024.0) snprintf(buf, cap, "%.1f KiB", b / 1024.0);
    else snprintf(buf, cap, "%.0f B", b);
}

static double host_budget(const double budget[ST_MEM_TIER_COUNT]) {
    return budget[ST_MEM_TIER_HOST] > 0 ? budget[ST_MEM_TIER_HOST] : st_prof_host_available_bytes();
}

st_status st_mem_plan_check(const st_mem_plan *e, const double budget[ST_MEM_TIER_COUNT], st_err *err) {
    double have[ST_MEM_TIER_COUNT] = {budget[0] > 0 ? budget[0] : 0, host_budget(budget), budget[2] > 0 ? budget[2] : 0};
    char msg[ST_ERR_MSG_MAX] = "";
    int short_tiers = 0;
    for (int t = 0; t < ST_MEM_TIER_COUNT; t++) {
        if (e->tier_need[t] <= have[t] || e->tier_need[t] <= 0) continue;
        if (t == ST_MEM_TIER_HOST && have[t] <= 0) continue; /* MemAvailable unreadable: cannot judge */
        if (t == ST_MEM_TIER_DEVICE && have[t] <= 0) continue; /* no device budget: the plan's own check */
        if (t == ST_MEM_TIER_DISK && have[t] <= 0) continue; /* no disk budget: the store checks its paths */
        char need[32], got[32], miss[32];
        fmt_bytes(need, sizeof need, e->tier_need[t]);
        fmt_bytes(got, sizeof got, have[t]);
        fmt_bytes(miss, sizeof miss, e->tier_need[t] - have[t]);
        snprintf(msg + strlen(msg), sizeof msg - strlen(msg), "%s%s needs %.0f bytes (%s), budget %.0f (%s): "
                 "%.0f bytes (%s) missing", short_tiers ? "; " : "", st_mem_tier_name(t), e->tier_need[t], need,
                 have[t], got, e->tier_need[t] - have[t], miss);
        short_tiers++;
    }
    if (!short_tiers) return ST_OK;
    return st_errf(err, ST_ERR_NOMEM, "the run does not fit its memory: %s. Lower batch or seq, use optim_state "
                   "8bit, or raise host_budget (see strata plan)", msg);
}

void st_mem_plan_print(FILE *f, const st_mem_plan *e, const double budget[ST_MEM_TIER_COUNT]) {
    char b[32];
    const char *h = "host", *at = e->streamed ? "device" : h;
#define ROW(label, bytes, where, note)                                                              \
    do {                                                                                            \
        fmt_bytes(b, sizeof b, bytes);                                                              \
        fprintf(f, "  %-34s %16.0f  %11s  %-6s %s\n", label, (double)(bytes), b, where, note);     \
    } while (0)
    fprintf(f, "parameters: %.0f\n", e->n_params);
    if (e->n_trainable > 0)
        fprintf(f, "trained: %.0f (the base's weights frozen: %.3f bytes of training state per base parameter)\n",
                e->n_trainable, (e->frozen + e->weights + e->grads + (e->moments_8bit_used ? e->moments_8bit : e->moments_f32)) /
                                    e->n_params);
    fputc('\n', f);
    fprintf(f, "  %-34s %16s  %11s  %-6s %s\n", "class", "bytes", "", "tier", "");
    if (e->n_trainable > 0)
        ROW(e->frozen_dtype == ST_FROZEN_BF16   ? "frozen base weights (W0 bf16)"
            : e->frozen_dtype == ST_FROZEN_INT8 ? "frozen base weights (W0 int8)"
                                                : "frozen base weights (fp32)",
            e->frozen, h, e->frozen_dtype ? "no gradient, no moments; W0's panel buffer, the rest fp32"
                                          : "no gradient, no moments");
    ROW(e->n_trainable > 0 ? "trained weights (fp32)" : "weights (fp32)", e->weights, h, "");
    ROW("gradients (fp32)", e->grads, h, "");
    ROW("master copy (fp32)", e->master, "-", "the fp32 weights are the master copy");
    ROW("  master copy with bf16 weights", e->master_if_bf16, "-", "(not used: weights are fp32)");
    const char *mh = e->moments_on_disk ? "disk" : h;
    char used[64], unused[96];
    snprintf(used, sizeof used, "optim_state %s", st_optim_state_name((st_optim_state_format)e->state_format));
    snprintf(unused, sizeof unused, "(not used: %s)", used);
    ROW("moments, fp32 (m, v)", e->moments_f32, e->moments_8bit_used ? "-" : mh, e->moments_8bit_used ? unused : used);
    ROW("moments, 8-bit blockwise (m, v)", e->moments_8bit, e->moments_8bit_used ? mh : "-",
        e->moments_8bit_used ? used : unused);
    if (e->moments_on_disk)
        ROW("disk state's host buffers", e->state_buffers, h, "state_budget (see the disk state below)");
    ROW("activations, all stored", e->acts_stored, at,
        e->n_trainable > 0 && !e->streamed ? "the model's own forward (its activation count)"
        : e->streamed      ? "the executor's device tables, every block recomputed, the head resident"
                           : "the executor's tables, every block kept");
    ROW("activations, checkpointed", e->acts_ckpt, "-", "(every block recomputed: a streamed plan's choice)");
    if (e->exec_host > 0) ROW("executor's host buffers", e->exec_host, h, "per-row buffers, grad_accum, offloads, bf16 copy");
    ROW("staging (init, checkpoint save)", e->init_scratch, h, "transient, at the end-of-run checkpoint");
    ROW("runtime (code, BLAS, data)", e->runtime, h, "measured constant");
    fprintf(f, "\n  %-34s %16s  %11s  %s\n", "tier", "peak need", "", "budget");
    for (int t = 0; t < ST_MEM_TIER_COUNT; t++) {
        double have = t == ST_MEM_TIER_HOST ? host_budget(budget) : budget[t];
        char hb[32] = "none";
        if (have > 0) fmt_bytes(hb, sizeof hb, have);
        fmt_bytes(b, sizeof b, e->tier_need[t]);
        const char *verdict = e->tier_need[t] <= 0 ? "" : (have > 0 && e->tier_need[t] > have) ? "DOES NOT FIT"
                                                                                              : "fits";
        if (e->tier_need[t] > 0 && have <= 0)
            verdict = t == ST_MEM_TIER_HOST ? "unknown budget"
                    : t == ST_MEM_TIER_DISK ? "see the disk state below" : "DOES NOT FIT";
        fprintf(f, "  %-34s %16.0f  %11s  %s%s%s%s%s\n", st_mem_tier_name(t), e->tier_need[t], b, hb,
                t == ST_MEM_TIER_HOST && budget[t] <= 0 ? " (MemAvailable)" : "", verdict[0] ? ": " : "", verdict,
                t == ST_MEM_TIER_DEVICE && e->device_of_plan ? " (the device plan below)" : "");
    }
#undef ROW
}

/* One class of the account: its bytes and where it lives ("-": not used by this run). */
static void class_json(json_object *cl, const char *name, double bytes, const char *tier) {
    json_object *o = json_object_new_object();
    json_object_object_add(o, "bytes", json_object_new_double(bytes));
    json_object_object_add(o, "tier", json_object_new_string(tier));
    json_object_object_add(cl, name, o);
}

json_object *st_mem_plan_to_json(const st_mem_plan *e, const double budget[ST_MEM_TIER_COUNT]) {
    json_object *o = json_object_new_object(), *cl = json_object_new_object(), *tiers = json_object_new_object();
    const char *h = "host", *at = e->streamed ? "device" : h, *mh = e->moments_on_disk ? "disk" : h;
    json_object_object_add(o, "n_params", json_object_new_double(e->n_params));
    if (e->n_trainable > 0) {
        json_object_object_add(o, "n_trainable", json_object_new_double(e->n_trainable));
        double state = e->frozen + e->weights + e->grads + (e->moments_8bit_used ? e->moments_8bit : e->moments_f32);
        json_object_object_add(o, "bytes_per_base_param", json_object_new_double(state / e->n_params));
        class_json(cl, "frozen_weights", e->frozen, h);
        json_object_object_add(o, "frozen_dtype", json_object_new_string(st_frozen_dtype_name((st_frozen_dtype)e->frozen_dtype)));
    }
    class_json(cl, "weights", e->weights, h);
    class_json(cl, "grads", e->grads, h);
    class_json(cl, "master", e->master, "-");
    class_json(cl, "moments_f32", e->moments_f32, e->moments_8bit_used ? "-" : mh);
    class_json(cl, "moments_8bit", e->moments_8bit, e->moments_8bit_used ? mh : "-");
    if (e->moments_on_disk) class_json(cl, "state_buffers", e->state_buffers, h);
    class_json(cl, "activations", e->acts_stored, at);
    class_json(cl, "activations_checkpointed", e->acts_ckpt, "-");
    if (e->exec_host > 0) class_json(cl, "executor_host", e->exec_host, h);
    class_json(cl, "staging", e->init_scratch, h);
    class_json(cl, "runtime", e->runtime, h);
    json_object_object_add(o, "optim_state",
                           json_object_new_string(st_optim_state_name((st_optim_state_format)e->state_format)));
    json_object_object_add(o, "classes", cl);
    int fits = 1;
    for (int t = 0; t < ST_MEM_TIER_COUNT; t++) {
        double have = t == ST_MEM_TIER_HOST ? host_budget(budget) : budget[t] > 0 ? budget[t] : 0;
        json_object *ti = json_object_new_object();
        json_object_object_add(ti, "need", json_object_new_double(e->tier_need[t]));
        json_object_object_add(ti, "budget", have > 0 ? json_object_new_double(have) : NULL);
        /* as st_mem_plan_check judges: a tier with no budget is not judged here (the device's
         * plan and the disk state's paths are checked on their own) */
        int judged = have > 0 && e->tier_need[t] > 0;
        int ok = !judged || e->tier_need[t] <= have;
        fits &= ok;
        json_object_object_add(ti, "fits", judged ? json_object_new_boolean(ok) : NULL);
        if (t == ST_MEM_TIER_DEVICE && e->device_of_plan) /* the need: the device plan's bytes */
            json_object_object_add(ti, "of_plan", json_object_new_boolean(1));
        json_object_object_add(tiers, st_mem_tier_name(t), ti);
    }
    json_object_object_add(o, "tiers", tiers);
    json_object_object_add(o, "fits", json_object_new_boolean(fits));
    return o;
}
