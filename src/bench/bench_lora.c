/* bench_lora.c - strata bench lora: LoRA over the frozen base (strata/lora.h) against full AdamW
 * training of the same model: training-state bytes per parameter by class (what each keeps
 * besides activations: weights, gradients, optimizer moments) and the step time (forward,
 * backward, AdamW), the two steps alternated on the same batch, medians reported (the scaffolding
 * bench poet shares: bench_pair.c). */
#include <stdio.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/bench_pair.h"
#include "strata/lora.h"
#include "strata/model.h"
#include "strata/optim.h"

static const char *usage =
    "usage: strata bench lora [options] [--json]\n"
    "  --model NAME     preset (default gpt2-mini; any GPT-2 or Llama-family preset)\n"
    "  --rank R         lora_rank (default 16)\n"
    "  --alpha A        lora_alpha (default 32)\n"
    "  --targets LIST   lora_targets (default: every projection of the family)\n"
    "  --batch B --seq T  the micro-batch (default 8 x 128)\n"
    "  --steps N        timed pairs of steps, alternated full / lora (default 7)\n"
    "  --frozen_dtype D the base's block matmul weights held in fp32 (default), bf16 or int8 (the\n"
    "                   LoRA side timed; QLoRA-like)\n"
    "  --threads N      compute threads (0: all cores)\n"
    "  --json           print one JSON object\n"
    "Reports the training state's bytes per parameter by class (full: weights + gradients +\n"
    "AdamW moments per parameter; lora: the frozen base's weights as held, the adapters' weights +\n"
    "gradients + moments) and over the base's parameters (also for each frozen_dtype), the two steps' median times and\n"
    "their ratio, and each one's loss after the timed steps.\n";

/* The method's side: LoRA over the pair's base (ctx: the st_lora_config; its targets, when empty,
 * every projection of the base's family). */
static st_status wrap_lora(void *ctx, st_model **out, st_model *base, st_err *err) {
    st_lora_config *lc = ctx;
    if (!lc->targets[0])
        snprintf(lc->targets, sizeof lc->targets, "%s",
                 !strcmp(base->ops->arch, "gpt2") ? "c_attn,c_proj,c_fc" : "q,k,v,o,gate,up,down");
    return st_lora_model_create(out, base, lc, 1, err); /* takes base */
}

int bench_lora(int argc, char **argv) {
    const char *targets = "", *fdn = "fp32";
    int rank = 16;
    double alpha = 32;
    bench_pair p;
    bench_pair_init(&p, "lora");
    const bench_opt opts[] = {{"--targets", 's', &targets}, {"--rank", 'i', &rank}, {"--alpha", 'd', &alpha},
                            {"--frozen_dtype", 's', &fdn}};
    int rc = bench_pair_parse(&p, argc, argv, usage, opts, (int)(sizeof opts / sizeof *opts));
    if (rc >= 0) return rc;
    st_frozen_dtype fd;
    if (st_frozen_dtype_parse(fdn, &fd)) {
        fprintf(stderr, "strata bench lora: --frozen_dtype %s is not fp32, bf16 or int8\n", fdn);
        bench_pair_free(&p);
        return 2;
    }
    st_lora_config lc = {.rank = rank, .alpha = alpha, .frozen_dtype = fd};
    snprintf(lc.targets, sizeof lc.targets, "%s", targets);
    if (bench_pair_run(&p, wrap_lora, &lc)) return 1; /* said, and freed */
    const bench_side *full = &p.full, *lo = &p.method;
    double med_f = p.med_full, med_l = p.med_method;
    /* bytes per parameter, by class, as allocated */
    const st_model *bm = st_lora_base(lo->m);
    double nb = (double)bm->n_params, na = (double)lo->m->n_params, nfull = (double)full->m->n_params;
    double mom = st_optim_state_bytes_per_param(full->opt); /* AdamW's m and v (the weights are their own master) */
    double full_pp = 4.0 + 4.0 + mom;                 /* weights, gradients, moments */
    /* the base: weights only (no gradient, no moments), its blocks' matmul weights as held in each
     * frozen_dtype (st_lora_held_bytes: the store's bytes and its panel buffer) */
    double base_by_dtype[3];
    for (int d = 0; d < 3; d++) {
        size_t mm_numel, held, panel, row_floats;
        st_lora_held_bytes(bm->tensors, bm->n_tensors, bm->ops->arch, (st_frozen_dtype)d, &mm_numel, &held, &panel,
                           &row_floats);
        base_by_dtype[d] = ((double)(bm->n_params - mm_numel) * 4.0 + (double)held + (double)panel) / nb +
                           (bm->grads ? 4.0 : 0.0);
    }
    double frozen_pp = base_by_dtype[fd];
    double adapter_pp = 4.0 + 4.0 + st_optim_state_bytes_per_param(lo->opt);
    double lora_total = frozen_pp * nb + adapter_pp * na;
    char desc[300];
    lo->m->ops->describe(lo->m, desc, sizeof desc);
    if (p.json) {
        printf("{\"model\":\"%s\",\"rank\":%d,\"alpha\":%g,\"targets\":\"%s\",\"batch\":%d,\"seq\":%d,\"steps\":%d,"
               "\"base_params\":%.0f,\"adapter_params\":%.0f,"
               "\"full_bytes_per_param\":%.3f,\"frozen_bytes_per_param\":%.6f,\"adapter_bytes_per_param\":%.3f,"
               "\"full_state_bytes\":%.0f,\"lora_state_bytes\":%.0f,\"lora_bytes_per_base_param\":%.4f,"
               "\"full_step_s\":%.6f,\"lora_step_s\":%.6f,\"lora_over_full\":%.4f,"
               "\"full_loss\":%.6f,\"lora_loss\":%.6f,\"frozen_dtype\":\"%s\","
               "\"frozen_bytes_per_param_by_frozen_dtype\":{\"fp32\":%.6f,\"bf16\":%.6f,\"int8\":%.6f},"
               "\"loadavg\":%.2f}\n",
               p.model, rank, alpha, lc.targets, p.batch, p.seq, p.steps, nb, na, full_pp, frozen_pp, adapter_pp,
               full_pp * nfull, lora_total, lora_total / nb, med_f, med_l, med_l / med_f, full->loss, lo->loss,
               st_frozen_dtype_name(fd), base_by_dtype[0], base_by_dtype[1], base_by_dtype[2], p.loadavg);
    } else {
        printf("%s\n", desc);
        printf("training state, bytes per parameter: full AdamW %.1f (weights 4, gradients 4, moments %.1f); "
               "LoRA: frozen base %.3f (%s; fp32 %.3f, bf16 %.3f, int8 %.3f), adapters %.1f\n", full_pp, mom, frozen_pp,
               st_frozen_dtype_name(fd), base_by_dtype[0], base_by_dtype[1], base_by_dtype[2], adapter_pp);
        printf("  full %.2f MiB for %.0f parameters; LoRA %.2f MiB (%.0f base + %.0f adapter parameters): %.3f bytes "
               "per base parameter\n", full_pp * nfull / 1048576.0, nfull, lora_total / 1048576.0, nb, na,
               lora_total / nb);
        printf("step (batch %d x seq %d, %d pairs alternated, medians): full %.2f ms, LoRA %.2f ms (%.3fx); load %.2f\n",
               p.batch, p.seq, p.steps, med_f * 1e3, med_l * 1e3, med_l / med_f, p.loadavg);
        printf("loss after %d steps: full %.4f, LoRA %.4f\n", p.steps + 1, full->loss, lo->loss);
    }
    bench_pair_free(&p);
    return 0;
}
