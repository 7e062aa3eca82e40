/* bench_lora.c - strata bench lora: LoRA over the frozen base (strata/lora.h) against full AdamW
 * training of the same model: training-state bytes per parameter by class (what each keeps
 * besides activations: weights, gradients, optimizer moments) and the step time (forward,
 * backward, AdamW), the two steps alternated on the same batch, medians reported. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
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
    "  --threads N      compute threads (0: all cores)\n"
    "  --json           print one JSON object\n"
    "Reports the training state's bytes per parameter by class (full: weights + gradients +\n"
    "AdamW moments per parameter; lora: the frozen base's weights, the adapters' weights +\n"
    "gradients + moments) and over the base's parameters, the two steps' median times and\n"
    "their ratio, and each one's loss after the timed steps.\n";

typedef struct side {
    st_model *m;
    st_optim *opt;
    st_optim_segment *segs;
    long step;
    float loss;
} side;

static int open_optim(side *s, st_err *err) {
    st_model *m = s->m;
    if (!(s->segs = calloc((size_t)m->n_tensors, sizeof *s->segs))) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    st_params_decay_segments(m->tensors, m->n_tensors, 0.1f, s->segs);
    return st_optim_create(&s->opt, s->segs, m->n_tensors, ST_OPTIM_STATE_F32, err);
}

static double one_step(side *s, const int32_t *in, const int32_t *tg, int N) {
    double t0 = st_now();
    st_model_zero_grad(s->m);
    s->loss = s->m->ops->forward(s->m, in, tg, 1.0f / N);
    s->m->ops->backward(s->m);
    st_adamw_params hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = ++s->step,
                          .grad_scale = 1.0f};
    st_optim_step(s->opt, s->m->params, s->m->grads, &hp);
    return st_now() - t0;
}

static void close_side(side *s) {
    st_optim_free(s->opt);
    free(s->segs);
    st_model_free(s->m);
}

int bench_lora(int argc, char **argv) {
    const char *model = "gpt2-mini", *targets = "";
    int rank = 16, B = 8, T = 128, steps = 7, threads = 0, json = 0;
    double alpha = 32;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        } else if (!v) {
            fprintf(stderr, "strata bench lora: %s needs a value\n%s", a, usage);
            return 2;
        }
        i++;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--targets")) targets = v;
        else if (!strcmp(a, "--rank")) rank = atoi(v);
        else if (!strcmp(a, "--alpha")) alpha = atof(v);
        else if (!strcmp(a, "--batch")) B = atoi(v);
        else if (!strcmp(a, "--seq")) T = atoi(v);
        else if (!strcmp(a, "--steps")) steps = atoi(v);
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else {
            fprintf(stderr, "strata bench lora: unknown option '%s'\n%s", a, usage);
            return 2;
        }
    }
    if (steps < 1 || steps > 1000 || B < 1 || T < 1) {
        fprintf(stderr, "strata bench lora: --steps 1..1000, --batch and --seq >= 1\n");
        return 2;
    }
    st_err err = {0};
    st_backend *be = NULL;
    side full = {0}, lo = {0};
    st_model *base = NULL;
    int32_t *in = NULL, *tg = NULL;
    double *tf = calloc((size_t)steps, sizeof *tf), *tl = calloc((size_t)steps, sizeof *tl);
    int rc = 1;
    if (!tf || !tl || st_backend_cpu_create(&be, threads, &err) ||
        st_model_create(&full.m, model, NULL, be, &err) || full.m->ops->alloc_acts(full.m, B, T, &err))
        goto fail;
    full.m->ops->init_random(full.m, 1);
    if (st_model_create(&base, model, NULL, be, &err)) goto fail;
    base->ops->init_random(base, 1);
    st_lora_config lc = {.rank = rank, .alpha = alpha};
    snprintf(lc.targets, sizeof lc.targets, "%s",
             targets[0] ? targets : !strcmp(base->ops->arch, "gpt2") ? "c_attn,c_proj,c_fc" : "q,k,v,o,gate,up,down");
    st_status s = st_lora_model_create(&lo.m, base, &lc, 1, &err); /* takes base */
    base = NULL;
    if (s || lo.m->ops->alloc_acts(lo.m, B, T, &err) || open_optim(&full, &err) || open_optim(&lo, &err)) goto fail;
    int N = B * T, V = full.m->vocab_size;
    in = malloc(sizeof(int32_t) * N);
    tg = malloc(sizeof(int32_t) * N);
    if (!in || !tg) goto fail;
    for (int i = 0; i < N; i++) {
        in[i] = (int32_t)((i * 2654435761u) % (unsigned)V);
        tg[i] = (int32_t)((i * 40503u + 7) % (unsigned)V);
    }
    one_step(&full, in, tg, N); /* warm-up: first touches, BLAS buffers */
    one_step(&lo, in, tg, N);
    for (int i = 0; i < steps; i++) { /* alternated, the order flipped every pair */
        if (i & 1) {
            tl[i] = one_step(&lo, in, tg, N);
            tf[i] = one_step(&full, in, tg, N);
        } else {
            tf[i] = one_step(&full, in, tg, N);
            tl[i] = one_step(&lo, in, tg, N);
        }
    }
    double med_f = bench_median(tf, steps), med_l = bench_median(tl, steps);
    /* bytes per parameter, by class, as allocated */
    const st_model *bm = st_lora_base(lo.m);
    double nb = (double)bm->n_params, na = (double)lo.m->n_params, nfull = (double)full.m->n_params;
    double mom = st_optim_state_bytes_per_param(full.opt); /* AdamW's m and v (the weights are their own master) */
    double full_pp = 4.0 + 4.0 + mom;                 /* weights, gradients, moments */
    double frozen_pp = bm->grads ? 8.0 : 4.0;        /* the base: weights only (no gradient, no moments) */
    double adapter_pp = 4.0 + 4.0 + st_optim_state_bytes_per_param(lo.opt);
    double lora_total = frozen_pp * nb + adapter_pp * na;
    double load[3] = {0};
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
        fclose(f);
    }
    char desc[300];
    lo.m->ops->describe(lo.m, desc, sizeof desc);
    if (json) {
        printf("{\"model\":\"%s\",\"rank\":%d,\"alpha\":%g,\"targets\":\"%s\",\"batch\":%d,\"seq\":%d,\"steps\":%d,"
               "\"base_params\":%.0f,\"adapter_params\":%.0f,"
               "\"full_bytes_per_param\":%.3f,\"frozen_bytes_per_param\":%.3f,\"adapter_bytes_per_param\":%.3f,"
               "\"full_state_bytes\":%.0f,\"lora_state_bytes\":%.0f,\"lora_bytes_per_base_param\":%.4f,"
               "\"full_step_s\":%.6f,\"lora_step_s\":%.6f,\"lora_over_full\":%.4f,"
               "\"full_loss\":%.6f,\"lora_loss\":%.6f,\"loadavg\":%.2f}\n",
               model, rank, alpha, lc.targets, B, T, steps, nb, na, full_pp, frozen_pp, adapter_pp, full_pp * nfull,
               lora_total, lora_total / nb, med_f, med_l, med_l / med_f, full.loss, lo.loss, load[0]);
    } else {
        printf("%s\n", desc);
        printf("training state, bytes per parameter: full AdamW %.1f (weights 4, gradients 4, moments %.1f); "
               "LoRA: frozen base %.1f, adapters %.1f\n", full_pp, mom, frozen_pp, adapter_pp);
        printf("  full %.2f MiB for %.0f parameters; LoRA %.2f MiB (%.0f base + %.0f adapter parameters): %.3f bytes "
               "per base parameter\n", full_pp * nfull / 1048576.0, nfull, lora_total / 1048576.0, nb, na,
               lora_total / nb);
        printf("step (batch %d x seq %d, %d pairs alternated, medians): full %.2f ms, LoRA %.2f ms (%.3fx); load %.2f\n",
               B, T, steps, med_f * 1e3, med_l * 1e3, med_l / med_f, load[0]);
        printf("loss after %d steps: full %.4f, LoRA %.4f\n", steps + 1, full.loss, lo.loss);
    }
    rc = 0;
fail:
    if (rc) fprintf(stderr, "strata bench lora: %s\n", err.msg[0] ? err.msg : "out of memory");
    free(in);
    free(tg);
    free(tf);
    free(tl);
    st_model_free(base);
    close_side(&full);
    close_side(&lo);
    st_backend_free(be);
    return rc;
}
