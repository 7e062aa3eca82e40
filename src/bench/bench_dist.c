/* bench_dist.c - strata bench dist: the data-parallel step (strata/dist.h) under mpirun,
 * against the same per-rank work in one process, in the same run.
 *
 *     mpirun -np 2 strata bench dist --model gpt2-124m --batch 2 --seq 256 --threads 1 --zero 1 --json
 *
 * The two are alternated, step after step, so that a noisy machine weighs on both alike:
 * (a) rank 0 alone runs one process's step (its batch, the whole optimizer) while the other
 * ranks wait; (b) every rank runs two ZeRO steps, the second timed: its forward waits for the
 * first's weights gathered while it runs (ZeRO 1 and 2), as every step of a run does; its
 * own gather is waited for before the next (a), untimed, standing for the next step's
 * wait that a run's next forward pays. Figures are medians over the steps after a
 * warm-up. weak_scaling_efficiency = step_s(a) / step_s(b): 1 when N ranks each doing one
 * process's work take no longer than one process. bytes_per_step: this rank's bytes sent
 * and received in a step; theory_bytes_per_step: the stage's volume, a reduce-scatter of
 * the gradient and an all-gather (of the weights for ZeRO 1 and 2, of the gradient for
 * ZeRO 0), each (N - 1) / N x 4 bytes x parameters sent and as many received.
 * exposed_comm_fraction: the time the compute thread waited on communication over the
 * step. Rank 0 prints. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "strata/dist.h"
#include "strata/model.h"
#include "strata/optim.h"
#include "strata/step.h"
#include "strata/train.h"

static void usage(FILE *f) {
    fprintf(f, "usage: mpirun -np N strata bench dist [--model NAME] [--batch B] [--seq T] [--steps N] [--threads N]\n"
               "                  [--zero 0|1|2] [--optim_state f32|8bit] [--gather_overlap 1|0] [--json]\n"
               "  the ZeRO step at N ranks against one process's step with the same per-rank work, alternated;\n"
               "  prints step_s, tokens_per_s, bytes_per_step, theory_bytes_per_step, exposed_comm_fraction,\n"
               "  weak_scaling_efficiency (rank 0); --gather_overlap 0: the weights gathered after the update,\n"
               "  blocking, instead of during the next forward\n");
}

int bench_dist(int argc, char **argv) {
    const char *model = "gpt2-124m", *fmt_name = "f32";
    int B = 2, T = 256, steps = 3, threads = 0, zero = 1, json = 0, overlap = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--json")) json = 1;
        else if (v && !strcmp(a, "--model")) { model = v; i++; }
        else if (v && !strcmp(a, "--batch")) { B = atoi(v); i++; }
        else if (v && !strcmp(a, "--seq")) { T = atoi(v); i++; }
        else if (v && !strcmp(a, "--steps")) { steps = atoi(v); i++; }
        else if (v && !strcmp(a, "--threads")) { threads = atoi(v); i++; }
        else if (v && !strcmp(a, "--zero")) { zero = atoi(v); i++; }
        else if (v && !strcmp(a, "--gather_overlap")) { overlap = !strcmp(v, "1") ? 1 : !strcmp(v, "0") ? 0 : -1; i++; }
        else if (v && !strcmp(a, "--optim_state")) { fmt_name = v; i++; }
        else { fprintf(stderr, "strata bench dist: unknown option '%s'\n", a); usage(stderr); return 2; }
    }
    if (B < 1 || T < 1 || steps < 1 || steps > 1000 || zero < 0 || zero > 2 || overlap < 0 ||
        (strcmp(fmt_name, "f32") && strcmp(fmt_name, "8bit"))) {
        fprintf(stderr, "strata bench dist: --batch, --seq, --steps (1..1000) must be positive, --zero 0, 1 or 2, "
                        "--optim_state f32 or 8bit, --gather_overlap 1 or 0\n");
        return 2;
    }
    st_optim_state_format fmt = strcmp(fmt_name, "8bit") ? ST_OPTIM_STATE_F32 : ST_OPTIM_STATE_8BIT;
    st_err err = {0};
    st_comm *c = NULL;
    if (st_comm_open(&c, 600, &err)) {
        fprintf(stderr, "strata bench dist: %s\n", err.msg);
        return 1;
    }
    int rank = st_comm_rank(c), W = st_comm_size(c);
    if (!threads) threads = st_comm_threads(c);
    st_backend *be = NULL;
    st_model *m = NULL;
    st_optim *opt_one = NULL, *opt = NULL;
    st_optim_segment *segs = NULL, *shard_segs = NULL;
    size_t *bounds = NULL;
    int32_t *in = NULL, *tg = NULL;
    st_step *one = NULL, *dist = NULL;
    double *t_one = calloc((size_t)steps, sizeof(double)), *t_dist = calloc((size_t)steps, sizeof(double)),
           *exposed = calloc((size_t)steps, sizeof(double)), *bytes = calloc((size_t)steps, sizeof(double));
    st_status s = !t_one || !t_dist || !exposed || !bytes ? st_errf(&err, ST_ERR_NOMEM, "out of memory") : ST_OK;
    if (!s) s = st_backend_cpu_create(&be, threads, &err);
    if (!s) s = st_model_create(&m, model, NULL, be, &err);
    if (!s) s = m->ops->alloc_acts(m, B, T, &err);
    if (s) goto done;
    m->ops->init_random(m, 1337);
    segs = calloc((size_t)m->n_tensors, sizeof *segs);
    shard_segs = calloc((size_t)m->n_tensors, sizeof *shard_segs);
    bounds = malloc(sizeof(size_t) * (size_t)(W + 1));
    in = malloc(sizeof(int32_t) * (size_t)B * T);
    tg = malloc(sizeof(int32_t) * (size_t)B * T);
    if (!segs || !shard_segs || !bounds || !in || !tg) { s = st_errf(&err, ST_ERR_NOMEM, "out of memory"); goto done; }
    st_params_decay_segments(m->tensors, m->n_tensors, 0.1f, segs);
    st_zero_bounds(segs, m->n_tensors, m->n_params, W, bounds);
    size_t lo = zero ? bounds[rank] : 0, hi = zero ? bounds[rank + 1] : m->n_params;
    int ns = st_zero_clip_segments(segs, m->n_tensors, lo, hi, shard_segs);
    if (!ns) { s = st_errf(&err, ST_ERR_INVALID, "rank %d's shard is empty: a larger model, or --zero 0", rank); goto done; }
    st_step_setup su = {.m = m, .opt = NULL, .max_micro = 1};
    if (W > 1) {
        su.comm = c;
        su.zero = zero;
        su.bounds = bounds;
        su.overlap_gather = overlap != 0;
    }
    if ((s = st_optim_create(&opt, shard_segs, ns, fmt, &err))) goto done;
    su.opt = opt;
    if ((s = st_step_create(&dist, &su, &err))) goto done;
    if (rank == 0 && W > 1 &&
        ((s = st_optim_create(&opt_one, segs, m->n_tensors, fmt, &err)) ||
         (s = st_step_create(&one, &(st_step_setup){.m = m, .opt = opt_one, .max_micro = 1}, &err))))
        goto done;
    for (size_t i = 0; i < (size_t)B * T; i++) { /* each rank its own tokens */
        in[i] = (int32_t)((bench_hash_unit(i * 131 + (uint64_t)rank * 7919) + 0.5f) * (float)(m->vocab_size - 1));
        tg[i] = (int32_t)((bench_hash_unit(i * 137 + 11 + (uint64_t)rank * 7919) + 0.5f) * (float)(m->vocab_size - 1));
    }
    st_step_hp hp = {.adam = {.lr = 1e-5f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = 1}, .grad_clip = 1.0f};
    if (rank == 0 && !json)
        printf("bench dist: %s, %d ranks, ZeRO %d, %s states, batch %d x seq %d a rank, %d threads a rank\n", model, W,
               zero, fmt_name, B, T, threads);
    for (int k = -1; k < steps && !s; k++) { /* k = -1: the warm-up */
        st_step_result r;
        double t;
        if (W > 1) { /* (a) one process's step on rank 0, the others waiting */
            if ((s = st_step_sync(dist, &err))) break; /* the model's weights are whole */
            if ((s = st_comm_barrier(c, "bench: one process's step", &err))) break;
            t = st_now();
            if (rank == 0 && (s = st_step_run(one, 1, B, T, in, tg, &hp, &r, &err))) break;
            if (k >= 0) t_one[k] = st_now() - t;
            if ((s = st_comm_barrier(c, "bench: one process's step", &err))) break;
        }
        /* (b) the ranks' steps: the first untimed, the second timed */
        if ((s = st_step_run(dist, 1, B, T, in, tg, &hp, &r, &err))) break;
        hp.adam.step++;
        t = st_now();
        if ((s = st_step_run(dist, 1, B, T, in, tg, &hp, &r, &err))) break;
        double dt = st_now() - t;
        hp.adam.step++;
        if (k < 0) continue;
        t_dist[k] = dt;
        if (W == 1) t_one[k] = dt;
        exposed[k] = r.comm_wait_s / dt;
        bytes[k] = (double)(r.sent_bytes + r.received_bytes);
        if (rank == 0 && !json)
            printf("  step %d: one process %.3f s, %d ranks %.3f s (waited %.3f s on communication), %.0f bytes\n", k + 1,
                   t_one[k], W, dt, r.comm_wait_s, bytes[k]);
    }
    if (s) goto done;
    double step_s = bench_median(t_dist, steps), one_s = bench_median(t_one, steps);
    double theory = W > 1 ? 2.0 * 2.0 * (double)(W - 1) / W * 4.0 * (double)m->n_params : 0;
    double bps = bench_median(bytes, steps), ex = bench_median(exposed, steps);
    if (rank == 0) {
        if (json)
            printf("{\"model\":\"%s\",\"ranks\":%d,\"zero\":%d,\"optim_state\":\"%s\",\"batch\":%d,\"seq\":%d,\"threads\":%d,"
                   "\"steps\":%d,\"gather_overlap\":%d,\"n_params\":%zu,\"step_s\":%.4f,\"one_process_step_s\":%.4f,\"tokens_per_s\":%.1f,"
                   "\"bytes_per_step\":%.0f,\"theory_bytes_per_step\":%.0f,\"bytes_ratio\":%.4f,"
                   "\"exposed_comm_fraction\":%.4f,\"weak_scaling_efficiency\":%.4f}\n",
                   model, W, zero, fmt_name, B, T, threads, steps, overlap != 0, m->n_params, step_s, one_s,
                   (double)W * B * T / step_s, bps, theory, theory > 0 ? bps / theory : 1.0, ex, one_s / step_s);
        else
            printf("median: %d ranks %.3f s a step (%.0f tokens/s), one process %.3f s: weak-scaling efficiency %.3f; "
                   "%.0f bytes a step a rank (theory %.0f); communication exposed %.1f%% of the step\n",
                   W, step_s, (double)W * B * T / step_s, one_s, one_s / step_s, bps, theory, 100 * ex);
    }
done:
    if (s) fprintf(stderr, "strata bench dist: rank %d: %s\n", rank, err.msg);
    {
        st_err ignored = {0};
        st_step_sync(dist, &ignored);
    }
    st_step_destroy(one);
    st_step_destroy(dist);
    st_optim_free(opt_one);
    st_optim_free(opt);
    free(segs);
    free(shard_segs);
    free(bounds);
    free(in);
    free(tg);
    free(t_one);
    free(t_dist);
    free(exposed);
    free(bytes);
    st_model_free(m);
    st_backend_free(be);
    if (s) {
        st_comm_abort(c, 1);
        return 1;
    }
    st_comm_close(c);
    return 0;
}
