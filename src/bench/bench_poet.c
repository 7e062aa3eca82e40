/* bench_poet.c - strata bench poet: POET-X over the frozen matmul weights (strata/poetx.h) against
 * full AdamW training of the same model: training-state bytes per matmul-weight parameter by class
 * (as allocated) and the step time (forward, backward, AdamW over the trainable vector), the two
 * steps alternated on the same batch, medians reported. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "strata/model.h"
#include "strata/optim.h"
#include "strata/poetx.h"

static const char *usage =
    "usage: strata bench poet [options] [--json]\n"
    "  --model NAME     preset (default gpt2-mini; any GPT-2 or Llama-family preset)\n"
    "  --block B        poetx_block (default 64)\n"
    "  --terms K        poetx_terms (default 4)\n"
    "  --recompute      poetx_recompute 1: the backward forms each weight's h again (nothing kept)\n"
    "  --batch B --seq T  the micro-batch (default 8 x 128)\n"
    "  --steps N        timed pairs of steps, alternated full / poetx (default 7)\n"
    "  --threads N      compute threads (0: all cores)\n"
    "  --json           print one JSON object\n"
    "Reports, per parameter of the blocks' matmul weights, the bytes each class of POET-X training\n"
    "state holds as allocated (W0; the base's gradient slots of W0 where a gradient vector is kept;\n"
    "the packed Q's weights + gradients + moments; the scratch of one weight's G, formed where used)\n"
    "against AdamW's (weights + gradients + moments), the kept h (activations, N x d_out per weight;\n"
    "0 with --recompute), the two steps' median times and their ratio, and each one's loss after\n"
    "the timed steps.\n";

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

int bench_poet(int argc, char **argv) {
    const char *model = "gpt2-mini";
    int block = 64, terms = 4, B = 8, T = 128, steps = 7, threads = 0, json = 0, recompute = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        } else if (!strcmp(a, "--recompute")) {
            recompute = 1;
            continue;
        } else if (!v) {
            fprintf(stderr, "strata bench poet: %s needs a value\n%s", a, usage);
            return 2;
        }
        i++;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--block")) block = atoi(v);
        else if (!strcmp(a, "--terms")) terms = atoi(v);
        else if (!strcmp(a, "--batch")) B = atoi(v);
        else if (!strcmp(a, "--seq")) T = atoi(v);
        else if (!strcmp(a, "--steps")) steps = atoi(v);
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else {
            fprintf(stderr, "strata bench poet: unknown option '%s'\n%s", a, usage);
            return 2;
        }
    }
    if (steps < 1 || steps > 1000 || B < 1 || T < 1) {
        fprintf(stderr, "strata bench poet: --steps 1..1000, --batch and --seq >= 1\n");
        return 2;
    }
    st_err err = {0};
    st_backend *be = NULL;
    side full = {0}, po = {0};
    st_model *base = NULL;
    int32_t *in = NULL, *tg = NULL;
    double *tf = calloc((size_t)steps, sizeof *tf), *tp = calloc((size_t)steps, sizeof *tp);
    int rc = 1;
    if (!tf || !tp || st_backend_cpu_create(&be, threads, &err) ||
        st_model_create(&full.m, model, NULL, be, &err) || full.m->ops->alloc_acts(full.m, B, T, &err))
        goto fail;
    full.m->ops->init_random(full.m, 1);
    if (st_model_create(&base, model, NULL, be, &err)) goto fail;
    base->ops->init_random(base, 1);
    st_poetx_config pc = {.block = block, .terms = terms, .recompute = recompute};
    st_status s = st_poetx_model_create(&po.m, base, &pc, 1, &err); /* takes base */
    base = NULL;
    if (s || po.m->ops->alloc_acts(po.m, B, T, &err) || open_optim(&full, &err) || open_optim(&po, &err)) goto fail;
    int N = B * T, V = full.m->vocab_size;
    in = malloc(sizeof(int32_t) * N);
    tg = malloc(sizeof(int32_t) * N);
    if (!in || !tg) goto fail;
    for (int i = 0; i < N; i++) {
        in[i] = (int32_t)((i * 2654435761u) % (unsigned)V);
        tg[i] = (int32_t)((i * 40503u + 7) % (unsigned)V);
    }
    one_step(&full, in, tg, N); /* warm-up: first touches, BLAS buffers */
    one_step(&po, in, tg, N);
    for (int i = 0; i < steps; i++) { /* alternated, the order flipped every pair */
        if (i & 1) {
            tp[i] = one_step(&po, in, tg, N);
            tf[i] = one_step(&full, in, tg, N);
        } else {
            tf[i] = one_step(&full, in, tg, N);
            tp[i] = one_step(&po, in, tg, N);
        }
    }
    double med_f = bench_median(tf, steps), med_p = bench_median(tp, steps);
    /* bytes per matmul-weight parameter, by class, as allocated */
    const st_model *bm = st_poetx_base(po.m);
    size_t q0 = st_poetx_q_offset(po.m);
    double nq = (double)(po.m->n_params - q0), ntrain = (double)q0;
    double nmm = (double)bm->n_params - ntrain; /* the base's matmul weights: W0 */
    size_t g_scratch = 0, kept_h = 0;
    st_poetx_extra_bytes(po.m, &g_scratch, &kept_h);
    double mom = st_optim_state_bytes_per_param(full.opt);
    double adamw_pp = 4.0 + 4.0 + mom;
    double w0_pp = 4.0, w0_grad_pp = bm->grads ? 4.0 : 0.0;
    double q_pp = nq * (4.0 + 4.0 + st_optim_state_bytes_per_param(po.opt)) / nmm, g_pp = (double)g_scratch / nmm;
    double poet_pp = w0_pp + w0_grad_pp + q_pp + g_pp;
    double load[3] = {0};
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
        fclose(f);
    }
    char desc[300];
    po.m->ops->describe(po.m, desc, sizeof desc);
    if (json) {
        printf("{\"model\":\"%s\",\"block\":%d,\"terms\":%d,\"batch\":%d,\"seq\":%d,\"steps\":%d,"
               "\"matmul_params\":%.0f,\"q_params\":%.0f,\"other_params\":%.0f,"
               "\"adamw_bytes_per_param\":%.3f,\"w0_bytes_per_param\":%.3f,\"w0_grad_slot_bytes_per_param\":%.3f,"
               "\"q_state_bytes_per_param\":%.4f,\"g_bytes_per_param\":%.4f,\"poetx_bytes_per_param\":%.3f,"
               "\"adamw_step_s\":%.6f,\"poetx_step_s\":%.6f,\"poetx_over_adamw\":%.4f,"
               "\"adamw_loss\":%.6f,\"poetx_loss\":%.6f,\"recompute\":%d,\"kept_h_mib\":%.2f,\"loadavg\":%.2f}\n",
               model, block, terms, B, T, steps, nmm, nq, ntrain, adamw_pp, w0_pp, w0_grad_pp, q_pp, g_pp, poet_pp,
               med_f, med_p, med_p / med_f, full.loss, po.loss, recompute, kept_h / 1048576.0, load[0]);
    } else {
        printf("%s\n", desc);
        printf("training state per matmul-weight parameter (%.0f of them), bytes: AdamW %.2f; POET-X %.3f = W0 %.1f + "
               "W0's gradient slot %.1f + Q state %.4f (%.0f Q parameters) + G scratch %.4f; kept h %.2f MiB\n", nmm,
               adamw_pp, poet_pp, w0_pp, w0_grad_pp, q_pp, nq, g_pp, kept_h / 1048576.0);
        printf("step (batch %d x seq %d, %d pairs alternated, medians): AdamW %.2f ms, POET-X %.2f ms (%.3fx); "
               "load %.2f\n", B, T, steps, med_f * 1e3, med_p * 1e3, med_p / med_f, load[0]);
        printf("loss after %d steps: AdamW %.4f, POET-X %.4f\n", steps + 1, full.loss, po.loss);
    }
    rc = 0;
fail:
    if (rc) fprintf(stderr, "strata bench poet: %s\n", err.msg[0] ? err.msg : "out of memory");
    free(in);
    free(tg);
    free(tf);
    free(tp);
    st_model_free(base);
    close_side(&full);
    close_side(&po);
    st_backend_free(be);
    return rc;
}
