/* bench_poet.c - strata bench poet: POET-X over the frozen matmul weights (strata/poetx.h) against
 * full AdamW training of the same model: training-state bytes per matmul-weight parameter by class
 * (as allocated) and the step time (forward, backward, AdamW over the trainable vector), the two
 * steps alternated on the same batch, medians reported (the scaffolding bench lora shares:
 * bench_pair.c). */
#include <stdio.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/bench_pair.h"
#include "strata/model.h"
#include "strata/optim.h"
#include "strata/poetx.h"

static const char *usage =
    "usage: strata bench poet [options] [--json]\n"
    "  --model NAME     preset (default gpt2-mini; any GPT-2 or Llama-family preset)\n"
    "  --block B        poetx_block (default 64)\n"
    "  --terms K        poetx_terms (default 4)\n"
    "  --recompute      poetx_recompute 1: the backward forms each weight's h again (nothing kept)\n"
    "  --frozen_dtype D W0 held in fp32 (default), bf16 or int8 (the run timed)\n"
    "  --batch B --seq T  the micro-batch (default 8 x 128)\n"
    "  --steps N        timed pairs of steps, alternated full / poetx (default 7)\n"
    "  --threads N      compute threads (0: all cores)\n"
    "  --json           print one JSON object\n"
    "Reports, per parameter of the blocks' matmul weights, the bytes each class of POET-X training\n"
    "state holds as allocated (W0; the base's gradient slots of W0 where a gradient vector is kept;\n"
    "the packed Q's weights + gradients + moments; the scratch of one weight's G, formed where used)\n"
    "against AdamW's (weights + gradients + moments), the kept h (activations, N x d_out per weight;\n"
    "0 with --recompute), the two steps' median times and their ratio, and each one's loss after\n"
    "the timed steps. The bytes per matmul-weight parameter are also given for each frozen_dtype\n"
    "(W0 in it, its panel buffer where dequantised, the same Q state and G scratch).\n";

/* The method's side: POET-X over the pair's base (ctx: the st_poetx_config). */
static st_status wrap_poetx(void *ctx, st_model **out, st_model *base, st_err *err) {
    return st_poetx_model_create(out, base, ctx, 1, err); /* takes base */
}

int bench_poet(int argc, char **argv) {
    int block = 64, terms = 4, recompute = 0;
    const char *fdn = "fp32";
    bench_pair p;
    bench_pair_init(&p, "poet");
    const bench_opt opts[] = {{"--recompute", 'f', &recompute}, {"--block", 'i', &block}, {"--terms", 'i', &terms},
                             {"--frozen_dtype", 's', &fdn}};
    int rc = bench_pair_parse(&p, argc, argv, usage, opts, (int)(sizeof opts / sizeof *opts));
    if (rc >= 0) return rc;
    st_frozen_dtype fd;
    if (st_frozen_dtype_parse(fdn, &fd)) {
        fprintf(stderr, "strata bench poet: --frozen_dtype %s is not fp32, bf16 or int8\n", fdn);
        bench_pair_free(&p);
        return 2;
    }
    st_poetx_config pc = {.block = block, .terms = terms, .recompute = recompute, .frozen_dtype = fd};
    if (bench_pair_run(&p, wrap_poetx, &pc)) return 1; /* said, and freed */
    const bench_side *full = &p.full, *po = &p.method;
    double med_f = p.med_full, med_p = p.med_method;
    /* bytes per matmul-weight parameter, by class, as allocated */
    const st_model *bm = st_poetx_base(po->m);
    size_t q0 = st_poetx_q_offset(po->m);
    double nq = (double)(po->m->n_params - q0), ntrain = (double)q0;
    double nmm = (double)bm->n_params - ntrain; /* the base's matmul weights: W0 */
    size_t g_scratch = 0, kept_h = 0;
    st_poetx_extra_bytes(po->m, &g_scratch, &kept_h);
    double mom = st_optim_state_bytes_per_param(full->opt);
    double adamw_pp = 4.0 + 4.0 + mom;
    size_t w0_bytes = 0, panel_bytes = 0;
    st_poetx_frozen_bytes(po->m, &w0_bytes, &panel_bytes); /* as allocated, in the run's frozen_dtype */
    double w0_pp = (double)w0_bytes / nmm, panel_pp = (double)panel_bytes / nmm, w0_grad_pp = bm->grads ? 4.0 : 0.0;
    double q_pp = nq * (4.0 + 4.0 + st_optim_state_bytes_per_param(po->opt)) / nmm, g_pp = (double)g_scratch / nmm;
    double poet_pp = w0_pp + panel_pp + w0_grad_pp + q_pp + g_pp;
    /* each frozen_dtype: W0 in it (st_frozen_bytes over the base's matmul weights, as the store
     * allocates), its panel buffer where dequantised, the rest as this run's */
    double by_dtype[3];
    size_t max_numel = 0;
    for (int d = 0; d < 3; d++) {
        double w = 0;
        for (int i = 0; i < bm->n_tensors; i++) {
            const st_param_info *t = &bm->tensors[i];
            int trained = 0;
            for (int j = 0; j < po->m->n_tensors; j++) trained |= !strcmp(po->m->tensors[j].name, t->name);
            if (trained) continue;
            w += (double)st_frozen_bytes((st_frozen_dtype)d, t->numel);
            if (t->numel > max_numel) max_numel = t->numel;
        }
        by_dtype[d] = (w + (d ? (double)st_frozen_panel_bytes(max_numel) : 0)) / nmm + w0_grad_pp + q_pp + g_pp;
    }
    char desc[300];
    po->m->ops->describe(po->m, desc, sizeof desc);
    if (p.json) {
        printf("{\"model\":\"%s\",\"block\":%d,\"terms\":%d,\"batch\":%d,\"seq\":%d,\"steps\":%d,"
               "\"matmul_params\":%.0f,\"q_params\":%.0f,\"other_params\":%.0f,"
               "\"adamw_bytes_per_param\":%.3f,\"w0_bytes_per_param\":%.3f,\"w0_grad_slot_bytes_per_param\":%.3f,"
               "\"q_state_bytes_per_param\":%.4f,\"g_bytes_per_param\":%.4f,\"poetx_bytes_per_param\":%.3f,"
               "\"adamw_step_s\":%.6f,\"poetx_step_s\":%.6f,\"poetx_over_adamw\":%.4f,"
               "\"adamw_loss\":%.6f,\"poetx_loss\":%.6f,\"recompute\":%d,\"kept_h_mib\":%.2f,\"loadavg\":%.2f,"
               "\"frozen_dtype\":\"%s\",\"panel_bytes_per_param\":%.4f,\"poetx_bytes_per_param_by_frozen_dtype\":"
               "{\"fp32\":%.3f,\"bf16\":%.3f,\"int8\":%.3f}}\n",
               p.model, block, terms, p.batch, p.seq, p.steps, nmm, nq, ntrain, adamw_pp, w0_pp, w0_grad_pp, q_pp,
               g_pp, poet_pp, med_f, med_p, med_p / med_f, full->loss, po->loss, recompute, kept_h / 1048576.0, p.loadavg,
               st_frozen_dtype_name(fd), panel_pp, by_dtype[0], by_dtype[1], by_dtype[2]);
    } else {
        printf("%s\n", desc);
        printf("training state per matmul-weight parameter (%.0f of them), bytes: AdamW %.2f; POET-X %.3f = W0 %.3f "
               "(%s) + panel %.4f + W0's gradient slot %.1f + Q state %.4f (%.0f Q parameters) + G scratch %.4f; kept h "
               "%.2f MiB\n", nmm, adamw_pp, poet_pp, w0_pp, st_frozen_dtype_name(fd), panel_pp, w0_grad_pp, q_pp, nq,
               g_pp, kept_h / 1048576.0);
        printf("POET-X bytes per matmul-weight parameter by frozen_dtype: fp32 %.3f, bf16 %.3f, int8 %.3f\n",
               by_dtype[0], by_dtype[1], by_dtype[2]);
        printf("step (batch %d x seq %d, %d pairs alternated, medians): AdamW %.2f ms, POET-X %.2f ms (%.3fx); "
               "load %.2f\n", p.batch, p.seq, p.steps, med_f * 1e3, med_p * 1e3, med_p / med_f, p.loadavg);
        printf("loss after %d steps: AdamW %.4f, POET-X %.4f\n", p.steps + 1, full->loss, po->loss);
    }
    bench_pair_free(&p);
    return 0;
}
