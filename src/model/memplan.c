/* memplan.c - the memory estimate: bytes per class of training state for a GPT-2 shape,
 * where each class lives, and the refusal of a run that cannot fit its budgets.
 *
 * It is computed from the shape alone, before anything is allocated, and follows what the
 * code allocates (st_gpt2_create, st_gpt2_act_bytes, st_optim_create, the checkpoint's staging
 * copy), so the tests can hold it to the measured peak. Today every class lives on the
 * host; the planner (plan/) will place classes on device, host and disk and reuse this.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "strata/optim.h"
#include "strata/model.h"
#include "strata/prof.h"

/* Code, shared libraries, OpenMP and OpenBLAS buffers, the data pipeline (the embedded
 * corpus: 4 MiB of text while 8 MiB of tokens are filled) and stdio. Measured as VmHWM
 * minus the training state on the development machine (2 threads), with checkpoints every
 * step: 18.3 MiB for gpt2-mini at batch 1 x seq 16, 19.3 to 19.5 MiB for weight-heavy
 * runs, 31.1 MiB for an activation-heavy one (batch 32 x seq 256: OpenBLAS touches more
 * of its packing buffers on large matrices). The middle, so that either kind of run is
 * within 4% when its state is a few hundred MiB (tests/test_prof_mem.sh). */
#define RUNTIME_BYTES (26.0 * 1048576.0)

const char *st_mem_tier_name(int tier) {
    static const char *n[ST_MEM_TIER_COUNT] = {"device", "host", "disk"};
    return (unsigned)tier < ST_MEM_TIER_COUNT ? n[tier] : "?";
}

/* 8-bit moments of one tensor: a code byte per element for m and for v, padded to whole
 * blocks, and one fp32 absmax per block for each (as st_optim_create lays them out). */
static double q8_bytes(double numel) {
    double blocks = ceil(numel / ST_OPTIM_Q8_BLOCK);
    return 2.0 * blocks * ST_OPTIM_Q8_BLOCK + 2.0 * blocks * sizeof(float);
}

void st_mem_plan_gpt2(const st_gpt2_config *mc, int B, int T, int optim_8bit, st_mem_plan *e) {
    memset(e, 0, sizeof *e);
    double C = mc->n_embd, L = mc->n_layer, V = mc->vocab_size, maxT = mc->max_seq, NH = mc->n_head;
    double N = (double)B * T;
    /* per block: ln_1 (2C), c_attn (3C^2 + 3C), attn.c_proj (C^2 + C), ln_2 (2C),
     * c_fc (4C^2 + 4C), mlp.c_proj (4C^2 + C) */
    double block = 12.0 * C * C + 13.0 * C;
    e->n_params = V * C + maxT * C + L * block + 2.0 * C;
    e->weights = 4.0 * e->n_params;
    e->grads = 4.0 * e->n_params;
    e->master = 0;
    e->master_if_bf16 = 4.0 * e->n_params;
    e->moments_f32 = 8.0 * e->n_params;
    double tensors[] = {C, C, C * 3 * C, 3 * C, C * C, C, C, C, C * 4 * C, 4 * C, 4 * C * C, C};
    double q8 = q8_bytes(V * C) + q8_bytes(maxT * C) + 2 * q8_bytes(C);
    for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; i++) q8 += L * q8_bytes(tensors[i]);
    e->moments_8bit = q8;
    e->moments_8bit_used = optim_8bit;
    e->acts_stored = (double)st_gpt2_act_bytes(mc, B, T) + 4.0 * N /* host copy of losses */;
    /* With checkpointing each block keeps only its input (N, C); backward recomputes one
     * block at a time, so one block's stored set is live at once. */
    double per_layer = 4.0 * (N * C * 8 + N * 4 * C * 2 + N * 4 + NH * N);
    e->acts_ckpt = e->acts_stored - L * per_layer + L * 4.0 * N * C + per_layer;
    /* st_gpt2_init_random and the checkpoint save/load stage all weights in one host buffer */
    e->init_scratch = 4.0 * e->n_params;
    e->runtime = RUNTIME_BYTES + 8.0 * N /* the loop's inputs and targets */;
    double moments = optim_8bit ? e->moments_8bit : e->moments_f32;
    /* The checkpoint at the end of a run stages the weights while everything else is
     * allocated: that is the peak. */
    e->tier_need[ST_MEM_TIER_HOST] = e->runtime + e->weights + e->grads + e->master + moments + e->acts_stored +
                                   e->init_scratch;
}

void st_mem_plan_generic(double n_params, double act_bytes, int B, int T, int optim_8bit, st_mem_plan *e) {
    memset(e, 0, sizeof *e);
    double N = (double)B * T;
    e->n_params = n_params;
    e->weights = 4.0 * n_params;
    e->grads = 4.0 * n_params;
    e->master_if_bf16 = 4.0 * n_params;
    e->moments_f32 = 8.0 * n_params;
    /* 8-bit: one byte per moment element plus an fp32 absmax per 256 (padding per tensor
     * is ignored: under 0.1% for real models) */
    e->moments_8bit = 2.0 * n_params + 8.0 * n_params / 256.0;
    e->moments_8bit_used = optim_8bit;
    e->acts_stored = act_bytes + 4.0 * N;
    e->acts_ckpt = e->acts_stored; /* no checkpointing estimate for this architecture yet */
    e->init_scratch = 4.0 * n_params;
    e->runtime = RUNTIME_BYTES + 8.0 * N;
    double moments = optim_8bit ? e->moments_8bit : e->moments_f32;
    e->tier_need[ST_MEM_TIER_HOST] = e->runtime + e->weights + e->grads + moments + e->acts_stored + e->init_scratch;
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
    const char *h = "host";
#define ROW(label, bytes, where, note)                                                              \
    do {                                                                                            \
        fmt_bytes(b, sizeof b, bytes);                                                              \
        fprintf(f, "  %-34s %16.0f  %11s  %-6s %s\n", label, (double)(bytes), b, where, note);     \
    } while (0)
    fprintf(f, "parameters: %.0f\n\n", e->n_params);
    fprintf(f, "  %-34s %16s  %11s  %-6s %s\n", "class", "bytes", "", "tier", "");
    ROW("weights (fp32)", e->weights, h, "");
    ROW("gradients (fp32)", e->grads, h, "");
    ROW("master copy (fp32)", e->master, "-", "the fp32 weights are the master copy");
    ROW("  master copy with bf16 weights", e->master_if_bf16, "-", "(not used: weights are fp32)");
    const char *mh = e->moments_on_disk ? "disk" : h;
    ROW("moments, fp32 (m, v)", e->moments_f32, e->moments_8bit_used ? "-" : mh,
        e->moments_8bit_used ? "(not used: optim_state 8bit)" : "optim_state f32");
    ROW("moments, 8-bit blockwise (m, v)", e->moments_8bit, e->moments_8bit_used ? mh : "-",
        e->moments_8bit_used ? "optim_state 8bit" : "(not used: optim_state f32)");
    if (e->moments_on_disk)
        ROW("disk state's host buffers", e->state_buffers, h, "state_budget (see the disk state below)");
    ROW("activations, all stored", e->acts_stored, h, "what the executor does");
    ROW("activations, checkpointed", e->acts_ckpt, "-", "(per-block recompute: not implemented yet)");
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
        if (e->tier_need[t] > 0 && have <= 0) verdict = t == ST_MEM_TIER_HOST ? "unknown budget" : "DOES NOT FIT";
        fprintf(f, "  %-34s %16.0f  %11s  %s%s%s%s\n", st_mem_tier_name(t), e->tier_need[t], b, hb,
                t == ST_MEM_TIER_HOST && budget[t] <= 0 ? " (MemAvailable)" : "", verdict[0] ? ": " : "", verdict);
    }
#undef ROW
}
