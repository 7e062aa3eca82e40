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
            "                           [--grad-dtype f32|bf16]\n"
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
            "  defaults: --model gpt2-124m --batch 2 --seq 256 --steps 3 --depth 1 --acts auto\n"
            "            --max-norm 1.0\n");
}

int bench_stream(int argc, char **argv) {
    const char *model = "gpt2-124m", *acts = "auto", *clip = "auto", *gdt = "f32";
    int B = 2, T = 256, steps = 3, depth = 1, overlap = 1, threads = 0, json = 0, vchunk = -1;
    double budget_arg = 0, max_norm = 1.0, state_budget = (double)ST_STORE_HOST_BUDGET_DEFAULT;
    const char *state_path = NULL, *device = "cpu";
    int store_beside = 0, cuda_index = -1;
    st_model_overrides ov = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--no-overlap")) overlap = 0;
        else if (v && !strcmp(a, "--model")) { model = v; i++; }
        else if (v && !strcmp(a, "--device")) { device = v; i++; }
        else if (v && !strcmp(a, "--device-budget")) {
            budget_arg = st_parse_bytes(v);
            i++;
            if (budget_arg <= 0) { fprintf(stderr, "strata bench stream: bad --device-budget '%s'\n", v); return 2; }
        }
        else if (v && !strcmp(a, "--batch")) { B = atoi(v); i++; }
        else if (v && !strcmp(a, "--seq")) { T = atoi(v); i++; }
        else if (v && !strcmp(a, "--steps")) { steps = atoi(v); i++; }
        else if (v && !strcmp(a, "--depth")) { depth = atoi(v); i++; }
        else if (v && !strcmp(a, "--acts")) { acts = v; i++; }
        else if (v && !strcmp(a, "--vocab-chunk")) { vchunk = atoi(v); i++; }
        else if (v && !strcmp(a, "--grad-dtype")) { gdt = v; i++; }
        else if (v && !strcmp(a, "--state-path")) { state_path = v; i++; }
        else if (v && !strcmp(a, "--store-beside")) {
            if (strcmp(v, "0") && strcmp(v, "1")) {
                fprintf(stderr, "strata bench stream: --store-beside '%s': use 1 (beside the backward) or 0 (after)\n", v);
                return 2;
            }
            store_beside = *v == '1';
            i++;
        }
        else if (v && !strcmp(a, "--state-budget")) {
            state_budget = st_parse_bytes(v);
            i++;
            if (!(state_budget > 0)) { fprintf(stderr, "strata bench stream: bad --state-budget '%s'\n", v); return 2; }
        }
        else if (v && !strcmp(a, "--clip")) { clip = v; i++; }
        else if (v && !strcmp(a, "--max-norm")) { max_norm = atof(v); i++; }
        else if (v && !strcmp(a, "--threads")) { threads = atoi(v); i++; }
        else if (v && !strcmp(a, "--layers")) { ov.n_layer = atoi(v); i++; }
        else if (v && !strcmp(a, "--embd")) { ov.n_embd = atoi(v); i++; }
        else if (v && !strcmp(a, "--heads")) { ov.n_head = atoi(v); i++; }
        else if (v && !strcmp(a, "--vocab")) { ov.vocab_size = atoi(v); i++; }
        else if (v && !strcmp(a, "--max-seq")) { ov.max_seq = atoi(v); i++; }
        else { fprintf(stderr, "strata bench stream: unknown or incomplete option '%s'\n", a); usage(stderr); return 2; }
    }
    if (B < 1 || T < 1 || steps < 1) {
        fprintf(stderr, "strata bench stream: --batch, --seq, --steps must be >= 1\n");
        return 2;
    }
    int act_auto = !strcmp(acts, "auto");
    st_stream_act act = !strcmp(acts, "keep") ? ST_STREAM_ACT_KEEP : !strcmp(acts, "offload") || act_auto ? ST_STREAM_ACT_OFFLOAD
                   : !strcmp(acts, "recompute") ? ST_STREAM_ACT_RECOMPUTE : (st_stream_act)-1;
    if ((int)act < 0) {
        fprintf(stderr, "strata bench stream: --acts '%s': use auto, recompute, keep or offload\n", acts);
        return 2;
    }
    if (strcmp(gdt, "f32") && strcmp(gdt, "bf16")) {
        fprintf(stderr, "strata bench stream: --grad-dtype '%s': use f32 or bf16\n", gdt);
        return 2;
    }
    if (strcmp(clip, "speculate") && strcmp(clip, "defer") && strcmp(clip, "auto")) {
        fprintf(stderr, "strata bench stream: --clip '%s': use auto, speculate or defer\n", clip);
        return 2;
    }
    st_err err = {0};
    if (st_backend_device_parse(device, &cuda_index, &err)) { /* whether this build has it: when it is created */
        fprintf(stderr, "strata bench stream: --device: %s\n", err.msg);
        return 2;
    }

    st_backend *cpu = NULL, *dev = NULL, *dev2 = NULL;
    st_model *m = NULL;
    st_arch *arch = NULL;
    st_stream_exec *x = NULL, *xd = NULL;
    st_store *store = NULL;
    int store_made = 0;
    st_step mem_step = {0}, str_step = {0}, disk_step = {0};
    double *td = NULL, *rd = NULL, *tw = NULL;
    int beside = 0, abandoned = 0, loss_equal = 1;
    st_optim *opt = NULL;
    st_optim_segment *segs = NULL;
    int32_t *inp = NULL, *tgt = NULL;
    double *ts = NULL, *tu = NULL, *te = NULL, *rr = NULL, *tc = NULL, *tt = NULL;
    int rc = 1;
    if (st_backend_cpu_create(&cpu, threads, &err) || st_model_create(&m, model, &ov, cpu, &err) ||
        m->ops->alloc_acts(m, B, T, &err) || st_arch_of_model(&arch, m, &err))
        goto fail;
    const st_arch_layout *ly = &arch->lay;
    size_t n = m->n_params, state = n * 16, weight_bytes = n * 4;
    size_t budget = budget_arg > 0 ? (size_t)budget_arg : state / 8;
    st_stream_plan plan;
    st_stream_plan_default(&plan, ly->n_blocks);
    plan.prefetch_depth = depth;
    plan.overlap_optim = overlap;
    plan.clip = !strcmp(clip, "defer") ? ST_STREAM_CLIP_DEFER : !strcmp(clip, "auto") ? ST_STREAM_CLIP_AUTO : ST_STREAM_CLIP_SPECULATE;
    plan.grad_dtype = strcmp(gdt, "bf16") ? ST_F32 : ST_BF16;
    st_stream_plan_set_all(&plan, act);
    st_stream_config sc = {.arch = arch, .B = B, .T = T, .weight_decay = 0.1f};
    /* a small planner: the cheapest plan that fits (offload saves the recompute; a
     * resident wte saves the second pass over it) */
    size_t usable = st_backend_device_usable_bytes(device, budget); /* a GPU: less cuBLASLt's workspace */
    plan.vocab_chunk = vchunk >= 0 ? vchunk : 0;
    if (vchunk < 0 && st_stream_device_bytes(&sc, &plan) > usable) plan.vocab_chunk = 2048;
    if (act_auto && st_stream_device_bytes(&sc, &plan) > usable) {
        st_stream_plan_set_all(&plan, ST_STREAM_ACT_RECOMPUTE);
        if (vchunk < 0) {
            plan.vocab_chunk = 0;
            if (st_stream_device_bytes(&sc, &plan) > usable) plan.vocab_chunk = 2048;
        }
    }
    if (act_auto) acts = plan.act[0] == ST_STREAM_ACT_OFFLOAD ? "offload" : "recompute";
    if (st_backend_device_create(&dev, device, cpu, budget, &err) || st_stream_exec_create(&x, &sc, &plan, dev, &err))
        goto fail;

    m->ops->init_random(m, 1);
    st_stream_set_params(x, m->params); /* the CPU backend's memory is host memory */
    segs = calloc((size_t)m->n_tensors, sizeof *segs);
    if (!segs) { st_errf(&err, ST_ERR_NOMEM, "out of memory"); goto fail; }
    st_params_decay_segments(m->tensors, m->n_tensors, 0.1f, segs);
    if (st_optim_create(&opt, segs, m->n_tensors, ST_OPTIM_STATE_F32, &err)) goto fail;
    const char *spaths[1] = {state_path};
    st_store_config stc = {.paths = spaths, .n_paths = 1, .segs = segs, .n_segs = m->n_tensors,
                           .fmt = ST_OPTIM_STATE_F32, .host_budget = (uint64_t)state_budget,
                           .name = "strata-bench-stream-state"};
    if (state_path) { /* the third side: streamed, the state on disk */
        st_stream_config scd = sc;
        scd.external_optimizer = 1;
        scd.store_beside = store_beside;
        if (st_store_exists(&stc)) {
            st_errf(&err, ST_ERR_INVALID, "--state-path %s already holds strata-bench-stream-state.manifest (another "
                    "bench running, or one killed): remove strata-bench-stream-state.* there", state_path);
            goto fail;
        }
        if (st_backend_device_create(&dev2, device, cpu, budget, &err) || st_stream_exec_create(&xd, &scd, &plan, dev2, &err))
            goto fail;
        st_stream_set_params(xd, m->params);
        if (st_store_create(&store, &stc, st_store_init_copy, m->params, &err)) goto fail;
        store_made = 1;
        if (st_stream_attach_store(xd, store, NULL, 0, &err)) goto fail;
        st_step_init_streamed(&disk_step, xd, 1);
    }

    int N = B * T;
    inp = malloc(sizeof(int32_t) * (size_t)N);
    tgt = malloc(sizeof(int32_t) * (size_t)N);
    ts = calloc((size_t)steps, sizeof(double)), tu = calloc((size_t)steps, sizeof(double));
    te = calloc((size_t)steps, sizeof(double)), rr = calloc((size_t)steps, sizeof(double));
    tc = calloc((size_t)steps, sizeof(double)), tt = calloc((size_t)steps, sizeof(double));
    td = calloc((size_t)steps, sizeof(double)), rd = calloc((size_t)steps, sizeof(double));
    tw = calloc((size_t)steps, sizeof(double));
    if (!inp || !tgt || !ts || !tu || !te || !rr || !tc || !tt || !td || !rd || !tw) {
        st_errf(&err, ST_ERR_NOMEM, "out of memory");
        goto fail;
    }
    st_rng rng;
    st_rng_seed(&rng, 7);
    for (int i = 0; i < N; i++) inp[i] = (int32_t)(st_rng_u64(&rng) % (uint64_t)ly->vocab_size);
    for (int i = 0; i < N; i++) tgt[i] = (int32_t)(st_rng_u64(&rng) % (uint64_t)ly->vocab_size);
    st_stream_step_stats st = {0};
    uint64_t h2d_max = 0, d2h_max = 0, h2d_act = 0, d2h_act = 0;
    size_t peak = 0;
    float loss_s = 0, loss_u = 0;
    /* both sides run strata train's step (strata/step.h) */
    if (st_step_init_memory(&mem_step, m, opt, NULL, 1, &err)) goto fail;
    st_step_init_streamed(&str_step, x, 1);
    for (int s = -1; s < steps; s++) {
        st_step_hp hp = {.adam = {1e-4f, 0.9f, 0.95f, 1e-8f, s + 2, 1.0f}, .grad_clip = (float)max_norm};
        st_step_result ru;
        double t0 = st_now();
        if (st_step_run(&mem_step, 1, B, T, inp, tgt, &hp, &ru, &err)) goto fail;
        loss_u = (float)ru.loss;
        double tun = st_now() - t0;
        /* streamed */
        st_step_result rs;
        if (st_step_run(&str_step, 1, B, T, inp, tgt, &hp, &rs, &err)) goto fail;
        if (st_backend_status(dev, &err)) goto fail; /* a failed kernel: no figures from garbage */
        st = rs.stream;
        loss_s = st.loss;
        st_stream_step_stats sd = {0};
        if (xd) { /* the same step with the state on disk */
            st_step_result rdk;
            if (st_step_run(&disk_step, 1, B, T, inp, tgt, &hp, &rdk, &err) || st_backend_status(dev2, &err)) goto fail;
            sd = rdk.stream;
            loss_equal &= memcmp(&sd.loss, &st.loss, sizeof(float)) == 0;
            st_store_stats ss;
            st_store_get_stats(store, &ss);
            if (!json)
                fprintf(stderr, "  step %d: disk state %.3f s (loss %.4f, %s%s, optimizer tail %.3f s; the store's "
                                "last step %.3f s: update %.3f, crc %.3f, waits for reads %.3f, writes %.3f, "
                                "gradients %.3f, commit %.3f)\n", s + 1, sd.wall_s, sd.loss,
                        sd.store_beside ? "beside the backward" : "after the backward",
                        sd.rolled_back ? ", abandoned and redone" : "", sd.optim_tail_s, ss.step_s, ss.update_s,
                        ss.crc_s, ss.read_wait_s, ss.write_wait_s, ss.grad_wait_s, ss.commit_s);
            if (s >= 0) {
                td[s] = sd.wall_s;
                rd[s] = sd.wall_s / st.wall_s;
                tw[s] = sd.optim_tail_s;
                beside += sd.store_beside;
                abandoned += sd.store_beside && sd.rolled_back;
            }
        }
        if (!json)
            fprintf(stderr, "  step %d: streamed %.3f s (loss %.4f, compute %.3f, waits %.3f, optimizer tail %.3f, "
                            "efficiency %.3f), unstreamed %.3f s (loss %.4f)\n",
                    s + 1, st.wall_s, st.loss, st.compute_s, st.wait_s, st.optim_tail_s, st.overlap_efficiency, tun,
                    loss_u);
        if (s >= 0) {
            ts[s] = st.wall_s; tu[s] = tun; te[s] = st.overlap_efficiency; rr[s] = st.wall_s / tun;
            tc[s] = st.compute_s; tt[s] = st.optim_tail_s;
            if (st.h2d_bytes > h2d_max) h2d_max = st.h2d_bytes;
            if (st.h2d_act_bytes > h2d_act) h2d_act = st.h2d_act_bytes;
            if (st.d2h_act_bytes > d2h_act) d2h_act = st.d2h_act_bytes;
            if (st.d2h_bytes > d2h_max) d2h_max = st.d2h_bytes;
        }
    }
    /* the device's own figures, on any device (the step's stats know the CPU arena only) */
    size_t dev_budget = 0;
    if (st_backend_memory(dev, NULL, &peak, &dev_budget, &err)) goto fail;
    double step_s = bench_median(ts, steps), un_s = bench_median(tu, steps), eff = bench_median(te, steps), ratio = bench_median(rr, steps);
    double comp_s = bench_median(tc, steps), tail_s = bench_median(tt, steps);
    char state_json[1400] = "";
    if (xd)
        snprintf(state_json, sizeof state_json,
                 ",\"state_path\":\"%s\",\"store_beside\":%d,\"state_budget_bytes\":%.0f,\"state_step_s\":%.4f,\"state_ratio\":%.3f,"
                 "\"state_optim_tail_s\":%.4f,\"state_steps_beside\":%d,\"state_steps_abandoned\":%d,"
                 "\"state_loss_equal\":%s",
                 state_path, store_beside, state_budget, bench_median(td, steps), bench_median(rd, steps), bench_median(tw, steps),
                 beside, abandoned, loss_equal ? "true" : "false");
    if (json) {
        printf("{\"bench\":\"stream\",\"device\":\"%s\",\"model\":\"%s\",\"n_layer\":%d,\"n_embd\":%d,\"vocab_size\":%d,"
               "\"batch\":%d,\"seq\":%d,\"params\":%zu,\"threads\":%d,\"steps\":%d,\"prefetch_depth\":%d,"
               "\"acts\":\"%s\",\"overlap_optim\":%s,\"clip\":\"%s\",\"grad_dtype\":\"%s\",\"vocab_chunk\":%d,"
               "\"training_state_bytes\":%zu,\"weight_bytes\":%zu,\"device_budget_bytes\":%zu,"
               "\"device_peak_bytes\":%zu,\"h2d_bytes\":%llu,\"d2h_bytes\":%llu,\"h2d_act_bytes\":%llu,"
               "\"d2h_act_bytes\":%llu,\"h2d_weight_per_weight\":%.3f,\"overlap_efficiency\":%.3f,"
               "\"compute_s\":%.4f,\"optim_tail_s\":%.4f,\"step_s\":%.4f,\"unstreamed_step_s\":%.4f,"
               "\"ratio\":%.3f,\"loss\":%.5f,\"unstreamed_loss\":%.5f%s}\n",
               device, model, ly->n_blocks, ly->n_embd, ly->vocab_size, B, T, n, omp_get_max_threads(), steps, depth, acts,
               overlap ? "true" : "false", clip, gdt, plan.vocab_chunk, state, weight_bytes, dev_budget, peak,
               (unsigned long long)h2d_max, (unsigned long long)d2h_max, (unsigned long long)h2d_act,
               (unsigned long long)d2h_act, (double)(h2d_max - h2d_act) / weight_bytes, eff, comp_s, tail_s, step_s,
               un_s, ratio, loss_s, loss_u, state_json);
    } else {
        printf("model %s (%zu params, state %.1f MB), device budget %.1f MB (peak %.1f MB), batch %d x seq %d\n"
               "streamed %.3f s/step vs unstreamed %.3f s (ratio %.3f), overlap efficiency %.3f\n"
               "h2d %.1f MB/step (weights and embeddings %.2f x weights, offloaded activations %.1f MB), "
               "d2h %.1f MB/step\n",
               model, n, state / 1e6, dev_budget / 1e6, peak / 1e6, B, T, step_s, un_s, ratio, eff,
               h2d_max / 1e6, (double)(h2d_max - h2d_act) / weight_bytes, h2d_act / 1e6, d2h_max / 1e6);
        if (xd)
            printf("disk state (%s): %.3f s/step, %.3f x the streamed step with the state in RAM; %d of %d steps "
                   "beside the backward (%d abandoned); losses %s\n", state_path, bench_median(td, steps),
                   bench_median(rd, steps), beside, steps, abandoned, loss_equal ? "equal" : "DIFFER");
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "strata bench stream: %s\n", err.msg);
done:
    free(inp); free(tgt); free(ts); free(tu); free(te); free(rr); free(tc); free(tt);
    free(td); free(rd); free(tw);
    st_step_free(&disk_step);
    st_stream_exec_free(xd);
    if (dev2) st_backend_free(dev2);
    st_store_close(store);
    if (store_made) bench_store_remove(state_path, stc.name);
    free(segs);
    st_optim_free(opt);
    st_stream_exec_free(x);
    if (dev) st_backend_free(dev);
    st_step_free(&mem_step);
    st_step_free(&str_step);
    st_model_free(m);
    st_arch_free(arch);
    if (cpu) st_backend_free(cpu);
    return rc;
}
