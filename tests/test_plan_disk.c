/* test_plan_disk.c - the cost model's disk-state terms (st_plan_predict_disk, plan.h): on a
 * 6-block GPT-2 shape under a hand-set profile, the store's time grows with the state's
 * bytes (fp32 against 8-bit) and shrinks with the disk's bandwidth (io_s exactly inversely);
 * after the backward all of it is exposed, beside it the backward hides at most its own
 * length (the blocks' backward and recomputed forwards), and the rest of the step is the
 * in-RAM prediction's without the in-RAM optimizer; the disk bytes are the store's layout
 * (both regions of 12 fp32 bytes a parameter, padded), the host bytes the executor's without
 * moments plus the store's buffers; the CRC-32C's measured rate is a rate and is charged
 * for every byte read and written; a path without bandwidth or not a directory is refused.
 * The store's cache: a real store at the planner's layout reads and hits exactly what the
 * prediction says, in both orders; the store's host budget chosen by predicted step (a larger
 * one on a slow disk with host to spare, the default alone without). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/optim.h"
#include "strata/plan.h"
#include "strata/store.h"
#include "strata/train.h"
#include "testutil.h"

static int close_to(double a, double b) { return fabs(a - b) <= 1e-12 + 1e-9 * fabs(b); }

/* the store's side of a step: a zero gradient, the executor's order beside the backward */
static float *zero_grads;
static const void *grads_at(void *ctx, size_t first, size_t n) {
    (void)ctx, (void)n;
    return zero_grads + first;
}
static st_status landed(void *ctx, size_t first, size_t n, st_err *err) {
    (void)ctx, (void)first, (void)n, (void)err;
    return ST_OK;
}
static double blocks_down(void *ctx, size_t first, size_t end) { /* the executor's order */
    const st_arch_layout *y = ctx;
    return st_stream_store_order(first, end, y->block_offset0, y->norm_offset);
}

/* The store's host budget chosen (st_plan_state_budget): a 124M-parameter GPT-2's state (1.5 GB)
 * on a slow disk after the backward: with 8 GiB of host memory to spare a larger budget than
 * the default, predicted faster; the candidates ascending and within the host; with less host
 * than twice the default, the default alone. */
static void budget_chosen(const st_plan_profile *hw, const char *dir) {
    st_err err = {0};
    st_gpt2_config cfg = {.vocab_size = 50257, .max_seq = 1024, .n_layer = 12, .n_head = 12, .n_embd = 768};
    st_arch *a = NULL;
    if (st_arch_gpt2(&a, &cfg, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    st_stream_plan *p = malloc(sizeof *p);
    st_stream_plan_default(p, a->lay.n_blocks);
    st_stream_plan_set_all(p, ST_STREAM_ACT_KEEP);
    double bw = 1e8;
    st_plan_disk d = {.paths = &dir, .n_paths = 1, .mixed_bytes_per_s = &bw, .fmt = ST_OPTIM_STATE_F32,
                      .optim_ns_per_param = 1.0, .host_budget = ST_STORE_HOST_BUDGET_DEFAULT, .weight_decay = 0.1f};
    st_plan_prediction def, ch;
    st_plan_disk_cost kd;
    st_plan_config_disk *cd = calloc(1, sizeof *cd);
    CHECK(st_plan_predict_disk(a, 1, 64, hw, p, &d, &def, &kd, &err) == ST_OK, "%s", err.msg);
    CHECK(st_plan_state_budget(a, 1, 64, hw, p, &d, 8.0 * (1u << 30), &ch, cd, &err) == ST_OK, "%s", err.msg);
    int pick = cd->budget_pick;
    CHECK(cd->budget_chosen && cd->n_budgets >= 3 && cd->budgets[0].budget == ST_STORE_HOST_BUDGET_DEFAULT &&
              cd->dc.state_budget == cd->budgets[pick].budget && cd->dc.state_budget > ST_STORE_HOST_BUDGET_DEFAULT &&
              ch.step_s < def.step_s && ch.step_s == cd->budgets[pick].step_s && cd->budgets[0].step_s == def.step_s,
          "8 GiB to spare: %d candidates, chose %llu (step %g s; the default's %g s)", cd->n_budgets,
          cd->dc.state_budget, ch.step_s, def.step_s);
    for (int i = 0; i < cd->n_budgets; i++) {
        char line[256];
        st_plan_state_budget_describe(cd, i, line, sizeof line);
        printf("  %s\n", line);
        CHECK(cd->budgets[i].budget <= 8.0 * (1u << 30) && (i == 0 || cd->budgets[i].budget > cd->budgets[i - 1].budget),
              "candidate %d: %llu bytes", i, cd->budgets[i].budget);
        CHECK(cd->budgets[pick].step_s <= cd->budgets[i].step_s, "candidate %d predicted faster than the choice", i);
    }
    CHECK(cd->budgets[cd->n_budgets - 1].whole && cd->budgets[cd->n_budgets - 1].hits == cd->budgets[cd->n_budgets - 1].n_subgroups,
          "the last candidate is the whole state cached");
    CHECK(st_plan_state_budget(a, 1, 64, hw, p, &d, 400.0 * (1u << 20), &ch, cd, &err) == ST_OK && cd->n_budgets == 1 &&
              cd->dc.state_budget == ST_STORE_HOST_BUDGET_DEFAULT && ch.step_s == def.step_s,
          "400 MiB to spare: %d candidates, chose %llu", cd->n_budgets, cd->dc.state_budget);
    free(cd);
    free(p);
    st_arch_free(a);
}

/* The cache in the prediction: a store laid out as the planner lays it out (the model's
 * segments, a host budget of a few subgroups), stepped for real, reads what
 * st_plan_predict_disk says, to the byte, in both orders (after the backward: alternating;
 * beside it: the gradients' order, read ahead with every buffer). */
static void cache_matches_store(const st_plan_profile *hw, const char *dir) {
    st_err err = {0};
    st_gpt2_config cfg = {.vocab_size = 512, .max_seq = 64, .n_layer = 6, .n_head = 2, .n_embd = 128};
    st_arch *a = NULL;
    if (st_arch_gpt2(&a, &cfg, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    const st_arch_layout *y = &a->lay;
    st_stream_plan *p = malloc(sizeof *p);
    st_stream_plan_default(p, y->n_blocks);
    st_stream_plan_set_all(p, ST_STREAM_ACT_KEEP);
    st_optim_segment *segs = calloc((size_t)y->n_tensors, sizeof *segs);
    zero_grads = calloc(y->n_params, sizeof(float));
    st_params_decay_segments(y->tensors, y->n_tensors, 0.1f, segs);
    double bw = 1e9;
    for (int beside = 0; beside < 2; beside++) {
        st_plan_disk d = {.paths = &dir, .n_paths = 1, .mixed_bytes_per_s = &bw, .fmt = ST_OPTIM_STATE_F32,
                          .optim_ns_per_param = 1.0, .host_budget = 6u << 20, .beside = beside, .weight_decay = 0.1f};
        st_plan_prediction pr;
        st_plan_disk_cost k;
        CHECK(st_plan_predict_disk(a, 2, 32, hw, p, &d, &pr, &k, &err) == ST_OK, "%s", err.msg);
        st_store_config sc = {.paths = &dir, .n_paths = 1, .segs = segs, .n_segs = y->n_tensors,
                              .fmt = ST_OPTIM_STATE_F32, .host_budget = d.host_budget,
                              .name = beside ? "beside" : "after"};
        st_store *st = NULL;
        CHECK(st_store_create(&st, &sc, NULL, NULL, &err) == ST_OK, "create: %s", err.msg);
        if (!st) break;
        st_store_stats ss;
        st_store_get_stats(st, &ss);
        CHECK(ss.n_subgroups == k.n_subgroups && ss.n_buffers == k.n_buffers && ss.n_subgroups >= 3 * ss.n_buffers / 2 &&
                  ss.n_buffers >= 4,
              "layout: %d subgroups, %d buffers; predicted %d, %d", ss.n_subgroups, ss.n_buffers, k.n_subgroups,
              k.n_buffers);
        st_adamw_params hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .grad_scale = 1};
        st_store_step_args sa = {.grads = grads_at, .grad_dtype = ST_F32, .grad_sumsq = 0};
        if (beside) {
            sa.wait = landed;
            sa.order_key = blocks_down;
            sa.ctx = (void *)y;
        }
        st_store_layout lay;
        CHECK(st_store_plan_step(&sc, &sa, &lay, &err) == ST_OK, "%s", err.msg);
        int hits2 = 0;
        unsigned long long read2 = 0;
        for (int step = 1; step <= 4; step++) { /* the store's step counter before it: step - 1 */
            hp.step = step;
            CHECK(st_store_step(st, &sa, &hp, &err) == ST_OK, "step %d: %s", step, err.msg);
            st_store_get_stats(st, &ss);
            if (step < 3) continue; /* the cache warm: as the planner predicts a step */
            int o = (step - 1) % 2;
            CHECK(ss.hits == lay.hits[o] && ss.read_bytes == lay.read_bytes[o][0] && ss.write_bytes == k.write_bytes &&
                      ss.write_bytes == lay.write_bytes[0],
                  "%s, step %d: the store hit %d, read %llu, wrote %llu bytes; predicted %d, %llu, %llu",
                  beside ? "beside" : "after", step, ss.hits, (unsigned long long)ss.read_bytes,
                  (unsigned long long)ss.write_bytes, lay.hits[o], (unsigned long long)lay.read_bytes[o][0],
                  k.write_bytes);
            hits2 += ss.hits;
            read2 += ss.read_bytes;
        }
        CHECK(hits2 == 2 * k.cache_hits && read2 == 2 * k.read_bytes,
              "%s: the planner's mean step %g hits, %llu bytes read; the store's two steps %d, %llu",
              beside ? "beside" : "after", k.cache_hits, k.read_bytes, hits2, read2);
        CHECK(close_to(k.io_s, (double)(k.read_bytes + k.write_bytes) / bw) && (beside || k.read_bytes < k.write_bytes),
              "io %g s for %llu + %llu bytes", k.io_s, k.read_bytes, k.write_bytes);
        if (!beside) CHECK(k.cache_hits > 0, "after the backward the cache hit nothing");
        printf("cache, %s the backward: %d subgroups, %d buffers, %g hits, %llu bytes read, %llu written a step\n",
               beside ? "beside" : "after", k.n_subgroups, k.n_buffers, k.cache_hits, k.read_bytes, k.write_bytes);
        st_store_close(st);
    }
    free(zero_grads);
    free(segs);
    free(p);
    st_arch_free(a);
}

int main(void) {
    st_err err = {0};
    st_gpt2_config cfg = {.vocab_size = 512, .max_seq = 64, .n_layer = 6, .n_head = 2, .n_embd = 64};
    st_arch *a = NULL;
    if (st_arch_gpt2(&a, &cfg, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const int B = 4, T = 64, L = a->lay.n_blocks;
    const double n = (double)a->lay.n_params;
    st_plan_profile hw = {.version = ST_PLAN_PROFILE_VERSION, .sgemm_flops = 20e9, .h2d_bytes_per_s = 8e9,
                          .d2h_bytes_per_s = 6e9, .mem_bytes_per_s = 10e9, .optim_ns_per_param = 1.0,
                          .block_fwd_flops = 20e9, .block_bwd_flops = 20e9, .head_flops = 20e9};
    st_stream_plan *p = malloc(sizeof *p);
    st_stream_plan_default(p, L);
    st_stream_plan_set_all(p, ST_STREAM_ACT_OFFLOAD);
    p->act[1] = ST_STREAM_ACT_RECOMPUTE;
    const char *dir = test_tmpdir();
    double bw = 1e9;
    st_plan_disk d = {.paths = &dir, .n_paths = 1, .mixed_bytes_per_s = &bw, .fmt = ST_OPTIM_STATE_F32,
                      .optim_ns_per_param = 1.0, .host_budget = 64u << 20, .weight_decay = 0.1f};
    st_plan_prediction ram, f32, q8, fast, beside;
    st_plan_disk_cost k32, k8, kf, kb;
    CHECK(st_plan_predict(a, B, T, &hw, p, &ram, &err) == ST_OK, "%s", err.msg);
    CHECK(st_plan_predict_disk(a, B, T, &hw, p, &d, &f32, &k32, &err) == ST_OK, "%s", err.msg);

    /* after the backward: the store's whole time exposed in place of the in-RAM optimizer's */
    CHECK(k32.store_s > 0 && k32.hidden_s == 0 && close_to(f32.optim_exposed_s, k32.store_s),
          "after: store %g s, hidden %g s, optim_exposed %g s", k32.store_s, k32.hidden_s, f32.optim_exposed_s);
    CHECK(close_to(f32.compute_s, ram.compute_s) && close_to(f32.recompute_s, ram.recompute_s) &&
              close_to(f32.transfer_exposed_s, ram.transfer_exposed_s) && f32.device_bytes == ram.device_bytes,
          "the disk state changed the step's other parts");
    CHECK(close_to(f32.step_s - ram.step_s, k32.store_s - ram.optim_exposed_s), "step %g s vs %g s in RAM", f32.step_s,
          ram.step_s);
    /* its parts: the busiest path's bytes (one region read, one written) over its bandwidth, and
     * the update at optim_ns_per_param plus every byte crossing memory once */
    CHECK(close_to(k32.io_s, (double)(k32.read_bytes + k32.write_bytes) / bw) &&
              close_to(k32.store_s, fmax(k32.io_s, k32.cpu_s)) &&
              close_to(k32.cpu_s, n * 1e-9 + ((double)(k32.read_bytes + k32.write_bytes) + 4 * n) / hw.mem_bytes_per_s),
          "io %g s, cpu %g s, store %g s", k32.io_s, k32.cpu_s, k32.store_s);

    /* the CRC-32C at its own rate: half the rate, the CRC's seconds twice over */
    double crc = 0;
    CHECK(st_plan_crc_bytes_per_s(&crc, &err) == ST_OK && isfinite(crc) && crc > 1e6, "CRC-32C rate %g B/s", crc);
    {
        st_plan_disk_cost kc;
        st_plan_prediction pc;
        d.crc_bytes_per_s = hw.mem_bytes_per_s / 2;
        CHECK(st_plan_predict_disk(a, B, T, &hw, p, &d, &pc, &kc, &err) == ST_OK &&
                  close_to(kc.cpu_s - k32.cpu_s, (double)(k32.read_bytes + k32.write_bytes) / hw.mem_bytes_per_s),
              "CRC at half the memory rate: cpu %g s, was %g s", kc.cpu_s, k32.cpu_s);
        d.crc_bytes_per_s = 0;
    }

    /* the layout's bytes: both regions of master + two fp32 moments, padded to 4096 a buffer */
    CHECK(k32.disk_bytes >= 2 * 12 * n && k32.disk_bytes <= 2 * 12 * n * 1.2 + (1 << 20),
          "disk %llu bytes for %g parameters", k32.disk_bytes, n);
    /* every region written (one of two, past the file's 4096-byte header); the whole state in
     * 64 MiB of buffers: every subgroup cached, nothing read */
    CHECK(2 * k32.write_bytes + 4096 == k32.disk_bytes && k32.read_bytes == 0 && k32.cache_hits == k32.n_subgroups,
          "read %llu + written %llu of %llu, %g of %d subgroups cached", k32.read_bytes, k32.write_bytes,
          k32.disk_bytes, k32.cache_hits, k32.n_subgroups);
    size_t in_ram = st_plan_host_bytes(a, B, T, p), on_disk = st_plan_host_bytes_disk(a, B, T, p);
    size_t backups = (a->lay.norm_offset - a->lay.block_offset0) * 12;
    CHECK(on_disk == in_ram - a->lay.n_params * 8 - backups, "host bytes %zu on disk, %zu in RAM", on_disk, in_ram);
    CHECK(k32.host_bytes == on_disk + k32.store_host_bytes && k32.store_host_bytes > 0 &&
              k32.store_host_bytes <= d.host_budget,
          "host %zu = %zu + store %llu", k32.host_bytes, on_disk, k32.store_host_bytes);

    /* grows with the state's bytes: 8-bit moments take half the disk, and the step */
    d.fmt = ST_OPTIM_STATE_8BIT;
    CHECK(st_plan_predict_disk(a, B, T, &hw, p, &d, &q8, &k8, &err) == ST_OK, "%s", err.msg);
    CHECK(k8.disk_bytes < k32.disk_bytes * 0.6 && k8.io_s < k32.io_s && k8.store_s < k32.store_s &&
              q8.step_s < f32.step_s,
          "8-bit: disk %llu vs %llu bytes, io %g vs %g s, step %g vs %g s", k8.disk_bytes, k32.disk_bytes, k8.io_s,
          k32.io_s, q8.step_s, f32.step_s);
    d.fmt = ST_OPTIM_STATE_F32;
    printf("6 blocks: store %.6f s after the backward (io %.6f, cpu %.6f), %llu disk bytes; 8-bit %llu bytes\n",
           k32.store_s, k32.io_s, k32.cpu_s, k32.disk_bytes, k8.disk_bytes);

    /* shrinks with the bandwidth: io_s exactly inversely; far above it the update is the limit */
    bw = 4e9;
    CHECK(st_plan_predict_disk(a, B, T, &hw, p, &d, &fast, &kf, &err) == ST_OK, "%s", err.msg);
    CHECK(close_to(kf.io_s * 4, k32.io_s) && fast.step_s <= f32.step_s, "4x the bandwidth: io %g s (was %g s)",
          kf.io_s, k32.io_s);
    bw = 1e15;
    CHECK(st_plan_predict_disk(a, B, T, &hw, p, &d, &fast, &kf, &err) == ST_OK && close_to(kf.store_s, kf.cpu_s),
          "an infinitely fast disk: store %g s, cpu %g s", kf.store_s, kf.cpu_s);

    /* beside the backward: hides at most the backward (6 blocks' backward, one recomputed forward) */
    double bwd = L * f32.block_bwd_s + f32.recompute_s;
    d.beside = 1;
    for (int i = 0; i < 3; i++) {
        bw = i == 0 ? 1e6 : i == 1 ? 1e9 : 1e15; /* store far longer than, about, far shorter than the backward */
        CHECK(st_plan_predict_disk(a, B, T, &hw, p, &d, &beside, &kb, &err) == ST_OK, "%s", err.msg);
        d.beside = 0;
        CHECK(st_plan_predict_disk(a, B, T, &hw, p, &d, &f32, &k32, &err) == ST_OK, "%s", err.msg);
        d.beside = 1;
        CHECK(kb.hidden_s <= bwd * (1 + 1e-12) && close_to(kb.hidden_s, fmin(kb.store_s, bwd)) &&
                  close_to(f32.step_s - beside.step_s, kb.hidden_s),
              "bandwidth %g: hidden %g s of %g s, backward %g s; steps after %g, beside %g", bw, kb.hidden_s, kb.store_s,
              bwd, f32.step_s, beside.step_s);
        if (i == 0) CHECK(close_to(kb.hidden_s, bwd), "a slow disk: hidden %g s, the backward %g s", kb.hidden_s, bwd);
    }
    /* on the compute's own cores (host_work_slowdown) the store's update beside the backward costs compute */
    hw.host_work_slowdown = 0.5;
    st_plan_prediction r2, b2;
    d.beside = 0;
    CHECK(st_plan_predict_disk(a, B, T, &hw, p, &d, &r2, &k32, &err) == ST_OK, "%s", err.msg);
    d.beside = 1;
    CHECK(st_plan_predict_disk(a, B, T, &hw, p, &d, &b2, &kb, &err) == ST_OK, "%s", err.msg);
    CHECK(close_to(b2.host_work_s - r2.host_work_s, 0.5 * kb.cpu_s), "host work beside %g s, after %g s, cpu %g s",
          b2.host_work_s, r2.host_work_s, kb.cpu_s);
    d.cpu_slowdown = 1; /* all-core work on the compute's own cores: every second of it */
    CHECK(st_plan_predict_disk(a, B, T, &hw, p, &d, &b2, &kb, &err) == ST_OK &&
              close_to(b2.host_work_s - r2.host_work_s, kb.cpu_s),
          "cpu_slowdown 1: host work beside %g s, after %g s, cpu %g s", b2.host_work_s, r2.host_work_s, kb.cpu_s);
    /* a slow disk: the store's CPU work stretches the backward it hides behind, so it does not
     * lengthen the step (the step ends when the store does, the backward's first gradient +
     * store_s): beside saves exactly the backward against after */
    double bw_was = bw;
    bw = 1e6;
    d.beside = 0;
    CHECK(st_plan_predict_disk(a, B, T, &hw, p, &d, &r2, &k32, &err) == ST_OK, "%s", err.msg);
    d.beside = 1;
    CHECK(st_plan_predict_disk(a, B, T, &hw, p, &d, &b2, &kb, &err) == ST_OK, "%s", err.msg);
    CHECK(kb.store_s > bwd + kb.cpu_s && close_to(kb.hidden_s, bwd + kb.cpu_s) && close_to(r2.step_s - b2.step_s, bwd),
          "slow disk, cpu_slowdown 1: hidden %g s (backward %g + cpu %g), steps after %g beside %g", kb.hidden_s, bwd,
          kb.cpu_s, r2.step_s, b2.step_s);
    bw = bw_was;
    d.cpu_slowdown = 0;

    cache_matches_store(&hw, dir);
    budget_chosen(&hw, dir);

    /* refusals */
    bw = 0;
    CHECK(st_plan_predict_disk(a, B, T, &hw, p, &d, &b2, NULL, &err) == ST_ERR_INVALID && strstr(err.msg, dir) &&
              strstr(err.msg, "strata probe"),
          "a path without bandwidth: %s", err.msg);
    bw = 1e9;
    const char *nodir = "/nonexistent/strata-plan-disk";
    d.paths = &nodir;
    CHECK(st_plan_predict_disk(a, B, T, &hw, p, &d, &b2, NULL, &err) != ST_OK && strstr(err.msg, nodir),
          "a path that is not a directory: %s", err.msg);
    free(p);
    st_arch_free(a);
    return test_finish("plan_disk");
}
