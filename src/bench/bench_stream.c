/* bench_stream.c - strata bench stream: a training step with layer streaming under a
 * device budget, against the same model trained in memory, step for step in one run.
 *
 * Both executors live side by side and alternate steps (the machine is shared: a pair of
 * neighbouring steps sees the same load), each after one warm-up step. step_s and
 * unstreamed_step_s are medians; ratio is the median over pairs of streamed/unstreamed.
 * overlap_efficiency = device compute time on the step thread / step wall time (median).
 *
 * --state-path DIR adds a third executor beside them: the same streamed step with the
 * optimizer state in a disk store in DIR (its update beside the backward, strata/stream.h),
 * in the same alternation; state_step_s is its median step and state_ratio the median over
 * steps of its time over the streamed step with the state in RAM. Its losses must equal the
 * RAM side's bit for bit (state_loss_equal). The store is removed at the end. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"
#include "strata/block.h"
#include "strata/model.h"
#include "strata/train.h"
#include "strata/optim.h"
#include "strata/plan.h"
#include "strata/step.h"
#include "strata/store.h"
#include "strata/stream.h"
#include "strata/tier.h"


/* The files this bench's store made (strata/store.h: NAME.bin, NAME.manifest, its previous
 * commit, the lock), and nothing else. */
static void bench_store_remove(const char *dir, const char *name) {
    const char *ext[] = {".bin", ".manifest", ".manifest.prev", ".lock"};
    for (size_t i = 0; i < sizeof ext / sizeof ext[0]; i++) {
        char f[4200];
        snprintf(f, sizeof f, "%s/%s%s", dir, name, ext[i]);
        unlink(f);
    }
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: strata bench stream [--model NAME] [--device-budget BYTES] [--batch B] [--seq T] [--steps N]\n"
            "                           [--depth D] [--acts auto|recompute|keep|offload] [--no-overlap]\n"
            "                           [--clip auto|speculate|defer] [--max-norm X] [--vocab-chunk ROWS]\n"
            "                           [--grad-dtype f32|bf16] [--resident]\n"
            "                           [--state-path DIR [--state-budget BYTES] [--store-beside 0|1]]\n"
            "                           [--layers L] [--embd C]\n"
            "                           [--heads NH] [--vocab V] [--max-seq T] [--threads N] [--device D] [--json]\n"
            "  Trains N steps (median; one warm-up each) with only the blocks being computed on a device\n"
            "  of BYTES (default: one eighth of the training state, 16 bytes per parameter), alternating\n"
            "  with the same model trained in memory. Prints overlap_efficiency, h2d_bytes, d2h_bytes\n"
            "  (per step), weight_bytes, device_peak_bytes, device_budget_bytes, step_s, unstreamed_step_s.\n"
            "  --vocab-chunk: rows of wte per classifier chunk (0: wte on the device); default: 0 when the\n"
            "  plan fits the budget that way, else 2048. --acts auto: offload every block's activations\n"
            "  when that fits the budget, else recompute them. The default batch is 2: at batch 4 no plan\n"
            "  fits one eighth of gpt2-124m's training state.\n"
            "  --state-path: also run the streamed step with its optimizer state in a disk store in DIR\n"
            "  (created there, removed at the end; --state-budget: its host buffers, default 256 MiB;\n"
            "  --store-beside 1: its update beside the backward, as where the device has cores of its own;\n"
            "  default 0, after the backward, what strata train chooses on the CPU backend)\n"
            "  --device: where the streamed side computes: cpu (default), cuda or cuda:N (a build with\n"
            "  -DSTRATA_CUDA=ON); the unstreamed side is always the CPU\n"
            "  --resident: the executor's weights and gradients are its host vectors (a CPU backend without\n"
            "  a budget, nothing copied, every block's activations kept unless --acts says otherwise), with\n"
            "  its update overlapped as --clip says; the in-memory side is strata train's in-memory step,\n"
            "  itself this executor resident with the clip deferred\n"
            "  defaults: --model gpt2-124m --batch 2 --seq 256 --steps 3 --depth 1 --acts auto\n"
            "            --max-norm 1.0\n");
}

/* What was asked: the command line, parsed and checked once. */
typedef struct stream_opts {
    const char *model, *acts, *clip, *gdt, *state_path, *device;
    int B, T, steps, depth, overlap, threads, json, vchunk, store_beside, cuda_index, act_auto, resident;
    double budget_arg, max_norm, state_budget;
    st_stream_act act;
    st_model_overrides ov;
} stream_opts;

/* What was set up: the model, the in-memory step, the streamed step and (--state-path) the
 * streamed step with its state in a disk store, and the one batch they all train on. */
typedef struct stream_bench {
    st_backend *cpu, *dev, *dev2;
    st_model *m;
    st_arch *arch;
    st_stream_exec *x, *xd;
    st_store *store;
    int store_made;
    st_step *mem_step, *str_step, *disk_step;
    st_optim *opt;
    st_optim_segment *segs;
    st_stream_plan plan;
    st_stream_config sc;
    const char *spaths[1];
    st_store_config stc;
    int32_t *inp, *tgt;
    size_t n, state, weight_bytes, budget;
} stream_bench;

/* What was measured: per timed step (steps of each), and the maxima over them. */
typedef struct stream_figures {
    double *ts, *tu, *te, *rr, *tc, *tt; /* streamed, unstreamed, efficiency, ratio, compute, tail */
    double *td, *rd, *tw;                /* the disk-state side: step, ratio to streamed, tail */
    int beside, abandoned, loss_equal;
    uint64_t h2d_max, d2h_max, h2d_act, d2h_act;
    size_t peak, dev_budget;
    float loss_s, loss_u;
} stream_figures;

/* The options into o: -1 to go on, else the exit code (0 for --help, 2 for a bad option). */
static int stream_parse_args(int argc, char **argv, stream_opts *o) {
    *o = (stream_opts){.model = "gpt2-124m", .acts = "auto", .clip = "auto", .gdt = "f32", .device = "cpu",
                       .B = 2, .T = 256, .steps = 3, .depth = 1, .overlap = 1, .vchunk = -1, .cuda_index = -1,
                       .max_norm = 1.0, .state_budget = (double)ST_STORE_HOST_BUDGET_DEFAULT};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--json")) o->json = 1;
        else if (!strcmp(a, "--no-overlap")) o->overlap = 0;
        else if (!strcmp(a, "--resident")) o->resident = 1;
        else if (v && !strcmp(a, "--model")) { o->model = v; i++; }
        else if (v && !strcmp(a, "--device")) { o->device = v; i++; }
        else if (v && !strcmp(a, "--device-budget")) {
            o->budget_arg = st_parse_bytes(v);
            i++;
            if (o->budget_arg <= 0) { fprintf(stderr, "strata bench stream: bad --device-budget '%s'\n", v); return 2; }
        }
        else if (v && !strcmp(a, "--batch")) { o->B = atoi(v); i++; }
        else if (v && !strcmp(a, "--seq")) { o->T = atoi(v); i++; }
        else if (v && !strcmp(a, "--steps")) { o->steps = atoi(v); i++; }
        else if (v && !strcmp(a, "--depth")) { o->depth = atoi(v); i++; }
        else if (v && !strcmp(a, "--acts")) { o->acts = v; i++; }
        else if (v && !strcmp(a, "--vocab-chunk")) { o->vchunk = atoi(v); i++; }
        else if (v && !strcmp(a, "--grad-dtype")) { o->gdt = v; i++; }
        else if (v && !strcmp(a, "--state-path")) { o->state_path = v; i++; }
        else if (v && !strcmp(a, "--store-beside")) {
            if (strcmp(v, "0") && strcmp(v, "1")) {
                fprintf(stderr, "strata bench stream: --store-beside '%s': use 1 (beside the backward) or 0 (after)\n", v);
                return 2;
            }
            o->store_beside = *v == '1';
            i++;
        }
        else if (v && !strcmp(a, "--state-budget")) {
            o->state_budget = st_parse_bytes(v);
            i++;
            if (!(o->state_budget > 0)) { fprintf(stderr, "strata bench stream: bad --state-budget '%s'\n", v); return 2; }
        }
        else if (v && !strcmp(a, "--clip")) { o->clip = v; i++; }
        else if (v && !strcmp(a, "--max-norm")) { o->max_norm = atof(v); i++; }
        else if (v && !strcmp(a, "--threads")) { o->threads = atoi(v); i++; }
        else if (v && !strcmp(a, "--layers")) { o->ov.n_layer = atoi(v); i++; }
        else if (v && !strcmp(a, "--embd")) { o->ov.n_embd = atoi(v); i++; }
        else if (v && !strcmp(a, "--heads")) { o->ov.n_head = atoi(v); i++; }
        else if (v && !strcmp(a, "--vocab")) { o->ov.vocab_size = atoi(v); i++; }
        else if (v && !strcmp(a, "--max-seq")) { o->ov.max_seq = atoi(v); i++; }
        else { fprintf(stderr, "strata bench stream: unknown or incomplete option '%s'\n", a); usage(stderr); return 2; }
    }
    return -1;
}

/* The values the loop could not judge alone: 0 when they hold, else 2 (the exit code). */
static int stream_check_args(stream_opts *o) {
    if (o->B < 1 || o->T < 1 || o->steps < 1) {
        fprintf(stderr, "strata bench stream: --batch, --seq, --steps must be >= 1\n");
        return 2;
    }
    const char *acts = o->acts;
    o->act_auto = !strcmp(acts, "auto");
    o->act = !strcmp(acts, "keep") ? ST_STREAM_ACT_KEEP : !strcmp(acts, "offload") || o->act_auto ? ST_STREAM_ACT_OFFLOAD
           : !strcmp(acts, "recompute") ? ST_STREAM_ACT_RECOMPUTE : (st_stream_act)-1;
    if ((int)o->act < 0) {
        fprintf(stderr, "strata bench stream: --acts '%s': use auto, recompute, keep or offload\n", acts);
        return 2;
    }
    if (strcmp(o->gdt, "f32") && strcmp(o->gdt, "bf16")) {
        fprintf(stderr, "strata bench stream: --grad-dtype '%s': use f32 or bf16\n", o->gdt);
        return 2;
    }
    if (strcmp(o->clip, "speculate") && strcmp(o->clip, "defer") && strcmp(o->clip, "auto")) {
        fprintf(stderr, "strata bench stream: --clip '%s': use auto, speculate or defer\n", o->clip);
        return 2;
    }
    if (o->resident && ((o->device && strcmp(o->device, "cpu")) || o->vchunk > 0 || o->budget_arg > 0 ||
                        !strcmp(o->gdt, "bf16"))) {
        fprintf(stderr, "strata bench stream: --resident keeps everything in the CPU's memory: no --device other "
                "than cpu, no --device-budget, no --vocab-chunk, no --grad-dtype bf16\n");
        return 2;
    }
    st_err err = {0};
    if (st_backend_device_parse(o->device, &o->cuda_index, &err)) { /* whether this build has it: when it is created */
        fprintf(stderr, "strata bench stream: --device: %s\n", err.msg);
        return 2;
    }
    return 0;
}

/* The streamed step's plan: the options', then the plan request's fixed rule (plan.h) for
 * what they left open, with no program: the activations given (auto: offload, else
 * recompute), each with the vocabulary resident, else in ST_PLAN_RULE_VOCAB_CHUNK-row
 * chunks (offload saves the recompute; a resident wte saves the second pass over it). None
 * fitting leaves the smallest, which the executor then refuses naming the bytes. --acts
 * auto becomes the choice made, for the figures. */
static void stream_choose_plan(stream_bench *b, stream_opts *o) {
    st_stream_plan *plan = &b->plan;
    st_stream_plan_default(plan, b->arch->lay.n_blocks);
    plan->prefetch_depth = o->depth;
    plan->overlap_optim = o->overlap;
    plan->clip = !strcmp(o->clip, "defer") ? ST_STREAM_CLIP_DEFER
               : !strcmp(o->clip, "auto")  ? ST_STREAM_CLIP_AUTO : ST_STREAM_CLIP_SPECULATE;
    plan->grad_dtype = strcmp(o->gdt, "bf16") ? ST_F32 : ST_BF16;
    if (o->resident) { /* no budget to plan for: the activations the options say (auto: kept, as in memory) */
        plan->resident = 1;
        st_stream_plan_set_all(plan, o->act_auto ? ST_STREAM_ACT_KEEP : o->act);
        if (o->act_auto) o->acts = "keep";
        return;
    }
    static const st_stream_act auto_acts[] = {ST_STREAM_ACT_OFFLOAD, ST_STREAM_ACT_RECOMPUTE};
    st_plan_request rq = {.arch = b->arch, .B = o->B, .T = o->T, .sc = &b->sc, .rule = 1,
                          .rule_order = ST_PLAN_RULE_ACTS_FIRST, .base = plan, .vocab_chunk = o->vchunk,
                          .rule_acts = o->act_auto ? auto_acts : &o->act, .n_rule_acts = o->act_auto ? 2 : 1,
                          /* a GPU: less cuBLASLt's workspace */
                          .budget = st_backend_device_usable_bytes(o->device, b->budget)};
    static st_plan_result res; /* the plan's act table is large; one bench at a time */
    st_err ignored = {0};
    st_plan_for_run(&rq, &res, &ignored);
    *plan = res.plan;
    if (o->act_auto) o->acts = plan->act[0] == ST_STREAM_ACT_OFFLOAD ? "offload" : "recompute";
}

/* The third side (--state-path): the same streamed step, its optimizer state in a disk
 * store that this bench creates and must not find already there. */
static int stream_setup_disk(stream_bench *b, const stream_opts *o, st_err *err) {
    st_stream_config scd = b->sc;
    scd.external_optimizer = 1;
    scd.store_beside = o->store_beside;
    if (st_store_exists(&b->stc)) {
        st_errf(err, ST_ERR_INVALID, "--state-path %s already holds strata-bench-stream-state.manifest (another "
                "bench running, or one killed): remove strata-bench-stream-state.* there", o->state_path);
        return 1;
    }
    if (st_backend_device_create(&b->dev2, o->device, b->cpu, b->budget, err) ||
        st_stream_exec_create(&b->xd, &scd, &b->plan, b->dev2, err))
        return 1;
    st_stream_set_params(b->xd, b->m->params);
    if (st_store_create(&b->store, &b->stc, st_store_init_copy, b->m->params, err)) return 1;
    b->store_made = 1;
    if (st_stream_attach_store(b->xd, b->store, NULL, 0, err)) return 1;
    return st_step_create(&b->disk_step, &(st_step_setup){.sx = b->xd, .max_micro = 1}, err) ? 1 : 0;
}

/* The model, its optimizer, the streamed executor (and the disk side), one batch of random
 * tokens, and both sides' steps (strata train's step, strata/step.h). */
static int stream_setup(stream_bench *b, stream_opts *o, st_err *err) {
    if (st_backend_cpu_create(&b->cpu, o->threads, err) || st_model_create(&b->m, o->model, &o->ov, b->cpu, err) ||
        b->m->ops->alloc_acts(b->m, o->B, o->T, err) || st_arch_of_model(&b->arch, b->m, err))
        return 1;
    const st_arch_layout *ly = &b->arch->lay;
    b->n = b->m->n_params, b->state = b->n * 16, b->weight_bytes = b->n * 4;
    b->budget = o->budget_arg > 0 ? (size_t)o->budget_arg : b->state / 8;
    b->sc = (st_stream_config){.arch = b->arch, .B = o->B, .T = o->T, .weight_decay = 0.1f};
    stream_choose_plan(b, o);
    if (o->resident) b->budget = 0; /* unbounded: the host's memory */
    if ((o->resident ? st_backend_cpu_create(&b->dev, o->threads, err)
                     : st_backend_device_create(&b->dev, o->device, b->cpu, b->budget, err)) ||
        st_stream_exec_create(&b->x, &b->sc, &b->plan, b->dev, err))
        return 1;
    b->m->ops->init_random(b->m, 1);
    st_stream_set_params(b->x, b->m->params); /* the CPU backend's memory is host memory */
    b->segs = calloc((size_t)b->m->n_tensors, sizeof *b->segs);
    if (!b->segs) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    st_params_decay_segments(b->m->tensors, b->m->n_tensors, 0.1f, b->segs);
    if (st_optim_create(&b->opt, b->segs, b->m->n_tensors, ST_OPTIM_STATE_F32, err)) return 1;
    b->spaths[0] = o->state_path;
    b->stc = (st_store_config){.paths = b->spaths, .n_paths = 1, .segs = b->segs, .n_segs = b->m->n_tensors,
                               .fmt = ST_OPTIM_STATE_F32, .host_budget = (uint64_t)o->state_budget,
                               .name = "strata-bench-stream-state"};
    if (o->state_path && stream_setup_disk(b, o, err)) return 1;
    size_t N = (size_t)o->B * (size_t)o->T;
    b->inp = malloc(sizeof(int32_t) * N);
    b->tgt = malloc(sizeof(int32_t) * N);
    if (!b->inp || !b->tgt) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    st_rng rng;
    st_rng_seed(&rng, 7);
    for (size_t i = 0; i < N; i++) b->inp[i] = (int32_t)(st_rng_u64(&rng) % (uint64_t)ly->vocab_size);
    for (size_t i = 0; i < N; i++) b->tgt[i] = (int32_t)(st_rng_u64(&rng) % (uint64_t)ly->vocab_size);
    if (st_step_create(&b->mem_step, &(st_step_setup){.m = b->m, .opt = b->opt, .max_micro = 1}, err) ||
        st_step_create(&b->str_step, &(st_step_setup){.sx = b->x, .max_micro = 1}, err))
        return 1;
    return 0;
}

/* The disk side's step s (-1: the warm-up) after the streamed one (st, its stats). */
static int stream_disk_step(stream_bench *b, const stream_opts *o, int s, const st_step_hp *hp,
                                  const st_stream_step_stats *st, stream_figures *f, st_err *err) {
    st_step_result rdk;
    if (st_step_run(b->disk_step, 1, o->B, o->T, b->inp, b->tgt, hp, &rdk, err) || st_backend_status(b->dev2, err))
        return 1;
    st_stream_step_stats sd = rdk.stream;
    f->loss_equal &= memcmp(&sd.loss, &st->loss, sizeof(float)) == 0;
    st_store_stats ss;
    st_store_get_stats(b->store, &ss);
    if (!o->json)
        fprintf(stderr, "  step %d: disk state %.3f s (loss %.4f, %s%s, optimizer tail %.3f s; the store's "
                        "last step %.3f s: update %.3f, crc %.3f, waits for reads %.3f, writes %.3f, "
                        "gradients %.3f, commit %.3f)\n", s + 1, sd.wall_s, sd.loss,
                sd.store_beside ? "beside the backward" : "after the backward",
                sd.rolled_back ? ", abandoned and redone" : "", sd.optim_tail_s, ss.step_s, ss.update_s,
                ss.crc_s, ss.read_wait_s, ss.write_wait_s, ss.grad_wait_s, ss.commit_s);
    if (s >= 0) {
        f->td[s] = sd.wall_s;
        f->rd[s] = sd.wall_s / st->wall_s;
        f->tw[s] = sd.optim_tail_s;
        f->beside += sd.store_beside;
        f->abandoned += sd.store_beside && sd.rolled_back;
    }
    return 0;
}

/* One warm-up and o->steps timed steps, the sides alternating within each; then the
 * device's own peak and budget (on any device: the step's stats know the CPU arena only). */
static int stream_run_steps(stream_bench *b, const stream_opts *o, stream_figures *f, st_err *err) {
    for (int s = -1; s < o->steps; s++) {
        st_step_hp hp = {.adam = {1e-4f, 0.9f, 0.95f, 1e-8f, s + 2, 1.0f}, .grad_clip = (float)o->max_norm};
        st_step_result ru, rs;
        double t0 = st_now();
        if (st_step_run(b->mem_step, 1, o->B, o->T, b->inp, b->tgt, &hp, &ru, err)) return 1;
        f->loss_u = (float)ru.loss;
        double tun = st_now() - t0;
        if (st_step_run(b->str_step, 1, o->B, o->T, b->inp, b->tgt, &hp, &rs, err)) return 1;
        if (st_backend_status(b->dev, err)) return 1; /* a failed kernel: no figures from garbage */
        st_stream_step_stats st = rs.stream;
        f->loss_s = st.loss;
        if (b->xd && stream_disk_step(b, o, s, &hp, &st, f, err)) return 1;
        if (!o->json)
            fprintf(stderr, "  step %d: streamed %.3f s (loss %.4f, compute %.3f, waits %.3f, optimizer tail %.3f, "
                            "efficiency %.3f), unstreamed %.3f s (loss %.4f)\n",
                    s + 1, st.wall_s, st.loss, st.compute_s, st.wait_s, st.optim_tail_s, st.overlap_efficiency, tun,
                    f->loss_u);
        if (s < 0) continue; /* warm-up */
        f->ts[s] = st.wall_s; f->tu[s] = tun; f->te[s] = st.overlap_efficiency; f->rr[s] = st.wall_s / tun;
        f->tc[s] = st.compute_s; f->tt[s] = st.optim_tail_s;
        if (st.h2d_bytes > f->h2d_max) f->h2d_max = st.h2d_bytes;
        if (st.h2d_act_bytes > f->h2d_act) f->h2d_act = st.h2d_act_bytes;
        if (st.d2h_act_bytes > f->d2h_act) f->d2h_act = st.d2h_act_bytes;
        if (st.d2h_bytes > f->d2h_max) f->d2h_max = st.d2h_bytes;
    }
    if (!o->resident && st_backend_memory(b->dev, NULL, &f->peak, &f->dev_budget, err)) return 1; /* resident: unbounded */
    return 0;
}

/* --json: one object; the disk side's keys only with --state-path. */
static void stream_print_json(const stream_bench *b, const stream_opts *o, stream_figures *f) {
    const st_arch_layout *ly = &b->arch->lay;
    int steps = o->steps;
    char state_json[1400] = "";
    if (b->xd)
        snprintf(state_json, sizeof state_json,
                 ",\"state_path\":\"%s\",\"store_beside\":%d,\"state_budget_bytes\":%.0f,\"state_step_s\":%.4f,\"state_ratio\":%.3f,"
                 "\"state_optim_tail_s\":%.4f,\"state_steps_beside\":%d,\"state_steps_abandoned\":%d,"
                 "\"state_loss_equal\":%s",
                 o->state_path, o->store_beside, o->state_budget, bench_median(f->td, steps), bench_median(f->rd, steps),
                 bench_median(f->tw, steps), f->beside, f->abandoned, f->loss_equal ? "true" : "false");
    printf("{\"bench\":\"stream\",\"device\":\"%s\",\"model\":\"%s\",\"n_layer\":%d,\"n_embd\":%d,\"vocab_size\":%d,"
           "\"batch\":%d,\"seq\":%d,\"params\":%zu,\"threads\":%d,\"steps\":%d,\"prefetch_depth\":%d,"
           "\"resident\":%s,\"acts\":\"%s\",\"overlap_optim\":%s,\"clip\":\"%s\",\"grad_dtype\":\"%s\",\"vocab_chunk\":%d,"
           "\"training_state_bytes\":%zu,\"weight_bytes\":%zu,\"device_budget_bytes\":%zu,"
           "\"device_peak_bytes\":%zu,\"h2d_bytes\":%llu,\"d2h_bytes\":%llu,\"h2d_act_bytes\":%llu,"
           "\"d2h_act_bytes\":%llu,\"h2d_weight_per_weight\":%.3f,\"overlap_efficiency\":%.3f,"
           "\"compute_s\":%.4f,\"optim_tail_s\":%.4f,\"step_s\":%.4f,\"unstreamed_step_s\":%.4f,"
           "\"ratio\":%.3f,\"loss\":%.5f,\"unstreamed_loss\":%.5f%s}\n",
           o->device, o->model, ly->n_blocks, ly->n_embd, ly->vocab_size, o->B, o->T, b->n, omp_get_max_threads(),
           steps, o->depth, o->resident ? "true" : "false", o->acts, o->overlap ? "true" : "false", o->clip, o->gdt, b->plan.vocab_chunk, b->state,
           b->weight_bytes, f->dev_budget, f->peak, (unsigned long long)f->h2d_max, (unsigned long long)f->d2h_max,
           (unsigned long long)f->h2d_act, (unsigned long long)f->d2h_act,
           (double)(f->h2d_max - f->h2d_act) / b->weight_bytes, bench_median(f->te, steps),
           bench_median(f->tc, steps), bench_median(f->tt, steps), bench_median(f->ts, steps),
           bench_median(f->tu, steps), bench_median(f->rr, steps), f->loss_s, f->loss_u, state_json);
}

/* The same figures as lines of text. */
static void stream_print_text(const stream_bench *b, const stream_opts *o, stream_figures *f) {
    int steps = o->steps;
    printf("model %s (%zu params, state %.1f MB), device budget %.1f MB (peak %.1f MB), batch %d x seq %d\n"
           "streamed %.3f s/step vs unstreamed %.3f s (ratio %.3f), overlap efficiency %.3f\n"
           "h2d %.1f MB/step (weights and embeddings %.2f x weights, offloaded activations %.1f MB), "
           "d2h %.1f MB/step\n",
           o->model, b->n, b->state / 1e6, f->dev_budget / 1e6, f->peak / 1e6, o->B, o->T,
           bench_median(f->ts, steps), bench_median(f->tu, steps), bench_median(f->rr, steps),
           bench_median(f->te, steps), f->h2d_max / 1e6, (double)(f->h2d_max - f->h2d_act) / b->weight_bytes,
           f->h2d_act / 1e6, f->d2h_max / 1e6);
    if (b->xd)
        printf("disk state (%s): %.3f s/step, %.3f x the streamed step with the state in RAM; %d of %d steps "
               "beside the backward (%d abandoned); losses %s\n", o->state_path, bench_median(f->td, steps),
               bench_median(f->rd, steps), f->beside, steps, f->abandoned, f->loss_equal ? "equal" : "DIFFER");
}

/* Room for every per-step series, in one block (f->ts owns it). */
static int stream_figures_alloc(stream_figures *f, int steps, st_err *err) {
    double *all = calloc((size_t)steps * 9, sizeof(double));
    if (!all) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    double **series[9] = {&f->ts, &f->tu, &f->te, &f->rr, &f->tc, &f->tt, &f->td, &f->rd, &f->tw};
    for (int k = 0; k < 9; k++) *series[k] = all + (size_t)k * (size_t)steps;
    return 0;
}

/* Everything stream_setup made, in the reverse order; the disk store's files removed. */
static void stream_free(stream_bench *b, const stream_opts *o) {
    free(b->inp); free(b->tgt);
    st_step_destroy(b->mem_step); /* the steps before the executors they step */
    st_step_destroy(b->str_step);
    st_step_destroy(b->disk_step);
    st_stream_exec_free(b->xd);
    if (b->dev2) st_backend_free(b->dev2);
    st_store_close(b->store);
    if (b->store_made) bench_store_remove(o->state_path, b->stc.name);
    free(b->segs);
    st_optim_free(b->opt);
    st_stream_exec_free(b->x);
    if (b->dev) st_backend_free(b->dev);
    st_model_free(b->m);
    st_arch_free(b->arch);
    if (b->cpu) st_backend_free(b->cpu);
}

int bench_stream(int argc, char **argv) {
    stream_opts o;
    int rc = stream_parse_args(argc, argv, &o);
    if (rc >= 0) return rc;
    if ((rc = stream_check_args(&o))) return rc;
    stream_bench b = {0};
    stream_figures f = {.loss_equal = 1};
    st_err err = {0};
    if (stream_setup(&b, &o, &err) || stream_figures_alloc(&f, o.steps, &err) || stream_run_steps(&b, &o, &f, &err)) {
        fprintf(stderr, "strata bench stream: %s\n", err.msg);
        rc = 1;
    } else if (o.json) {
        stream_print_json(&b, &o, &f);
    } else {
        stream_print_text(&b, &o, &f);
    }
    free(f.ts);
    stream_free(&b, &o);
    return rc;
}
