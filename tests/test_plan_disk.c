/* test_plan_disk.c - the cost model's disk-state terms (st_plan_predict_disk, plan.h): on a
 * 6-block GPT-2 shape under a hand-set profile, the store's time grows with the state's
 * bytes (fp32 against 8-bit) and shrinks with the disk's bandwidth (io_s exactly inversely);
 * after the backward all of it is exposed, beside it the backward hides at most its own
 * length (the blocks' backward and recomputed forwards), and the rest of the step is the
 * in-RAM prediction's without the in-RAM optimizer; the disk bytes are the store's layout
 * (both regions of 12 fp32 bytes a parameter, padded), the host bytes the executor's without
 * moments plus the store's buffers; the CRC-32C's measured rate is a rate and is charged
 * for every byte read and written; a path without bandwidth or not a directory is refused. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/optim.h"
#include "strata/plan.h"
#include "testutil.h"

static int close_to(double a, double b) { return fabs(a - b) <= 1e-12 + 1e-9 * fabs(b); }

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
    CHECK(k32.read_bytes + k32.write_bytes == k32.disk_bytes, "read %llu + written %llu != %llu", k32.read_bytes,
          k32.write_bytes, k32.disk_bytes);
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
