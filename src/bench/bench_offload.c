/* bench_offload.c - strata bench offload: the optimizer step with its state (fp32 master
 * weights + moments) on disk paths, through the state store, against the paths' own
 * bandwidth measured by the probe in the same run.
 *
 * The gradient and the working copy stand for what the device sends down and takes
 * back: one subgroup-sized buffer each, reused for every subgroup, so host memory is the
 * store's buffers plus these two, and the budget can be far below the state. Figures:
 *   io_time_s     the step's reads + writes at each path's mixed-probe bandwidth (reads
 *                 and writes in flight together, as in the step); paths in parallel:
 *                 the slowest path's time. Also io_time_serial_s (read time + write
 *                 time at the pure probes) and io_time_overlapped_s (their max)
 *   compute_s     optimizer update + checksums, measured in the step
 *   io_ratio      io_time_s / step_s: 1.0 when the step moves its bytes at probe speed
 *   overlap_ratio step_s / max(io_time_s, compute_s): 1.0 when I/O and compute overlap
 *                 perfectly
 * Steps after the first are timed (the first warms the cache); medians are reported. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"
#include "strata/io.h"
#include "strata/store.h"

#define MAX_PATHS ST_STORE_MAX_PATHS
#define MAX_STEPS 100

static const char *usage =
    "usage: strata bench offload --path DIR [--path DIR2 ...] [options] [--json]\n"
    "  --params N         parameters, e.g. 1B (default 200M)\n"
    "  --states F         f32 | 8bit (default f32)\n"
    "  --host-budget B    host bytes for the store's buffers, gradient and working copy\n"
    "                     (default 2GiB)\n"
    "  --grad D           gradient dtype: bf16 | f32 (default bf16)\n"
    "  --steps N          timed steps after one warm-up step (default 3)\n"
    "  --probe-bytes B    test file per path for the probe (default 2GiB)\n"
    "  --in-place         one region per subgroup (half the disk, not crash-safe)\n"
    "  --no-probe         skip the probe (io_ratio and overlap_ratio are then absent)\n"
    "Prints step_s, read/write bytes and GB/s per step, the probe's GB/s per path, io_time_s,\n"
    "compute_s, io_ratio, overlap_ratio, cache hit rate, peak resident memory vs the budget.\n";

static void init_master(void *ctx, size_t first, size_t n, float *dst) {
    (void)ctx;
    long nn = (long)n;
#pragma omp parallel for schedule(static)
    for (long i = 0; i < nn; i++) dst[i] = 0.04f * bench_hash_unit(first + (size_t)i);
}

typedef struct bctx {
    void *grad, *work;
} bctx;
static const void *grads_at(void *ctx, size_t first, size_t n) {
    (void)first;
    (void)n;
    return ((bctx *)ctx)->grad;
}
static void *work_at(void *ctx, size_t first, size_t n) {
    (void)first;
    (void)n;
    return ((bctx *)ctx)->work;
}

/* One path's read, write and mixed bandwidth (GB/s) through the tier's disk probe. */
static st_status probe_once(const char *path, uint64_t bytes, double *read_gbps, double *write_gbps,
                            double *mixed_gbps, int *memory, st_err *err) {
    st_io_probe_result r;
    st_status s = st_io_probe(path, bytes, 0, 0, &r, err);
    if (s != ST_OK) return s;
    *read_gbps = r.read_gbps;
    *write_gbps = r.write_gbps;
    *mixed_gbps = r.mixed_gbps;
    *memory = r.memory;
    return ST_OK;
}

int bench_offload(int argc, char **argv) {
    const char *paths[MAX_PATHS];
    int n_paths = 0, states = ST_OPTIM_STATE_F32, gdt = ST_BF16, steps = 3, json = 0, in_place = 0, probe = 1;
    double nparams = 200e6, budget = 2.0 * 1073741824.0, probe_bytes = 2.0 * 1073741824.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(usage, stdout); return 0; }
        if (!strcmp(a, "--json")) { json = 1; continue; }
        if (!strcmp(a, "--in-place")) { in_place = 1; continue; }
        if (!strcmp(a, "--no-probe")) { probe = 0; continue; }
        if (!v) { fprintf(stderr, "strata bench offload: %s needs a value\n%s", a, usage); return 2; }
        i++;
        if (!strcmp(a, "--path")) {
            if (n_paths == MAX_PATHS) { fprintf(stderr, "strata bench offload: at most %d paths\n", MAX_PATHS); return 2; }
            paths[n_paths++] = v;
        } else if (!strcmp(a, "--params")) {
            nparams = st_parse_count(v);
            if (nparams < ST_OPTIM_CHUNK_ELEMS) { fprintf(stderr, "strata bench offload: --params '%s': give a count >= 16K (e.g. 1B)\n", v); return 2; }
        } else if (!strcmp(a, "--states")) {
            if (!strcmp(v, "f32")) states = ST_OPTIM_STATE_F32;
            else if (!strcmp(v, "8bit")) states = ST_OPTIM_STATE_8BIT;
            else { fprintf(stderr, "strata bench offload: --states '%s': use f32 or 8bit\n", v); return 2; }
        } else if (!strcmp(a, "--grad")) {
            if (!strcmp(v, "bf16")) gdt = ST_BF16;
            else if (!strcmp(v, "f32")) gdt = ST_F32;
            else { fprintf(stderr, "strata bench offload: --grad '%s': use bf16 or f32\n", v); return 2; }
        } else if (!strcmp(a, "--host-budget")) {
            budget = st_parse_bytes(v);
            if (budget < 16 * 1048576.0) { fprintf(stderr, "strata bench offload: --host-budget '%s': give >= 16MiB\n", v); return 2; }
        } else if (!strcmp(a, "--probe-bytes")) {
            probe_bytes = st_parse_bytes(v);
            if (probe_bytes < 4096) { fprintf(stderr, "strata bench offload: --probe-bytes '%s' is not a size\n", v); return 2; }
        } else if (!strcmp(a, "--steps")) {
            steps = atoi(v);
            if (steps < 1 || steps > MAX_STEPS) {
                fprintf(stderr, "strata bench offload: --steps '%s': use 1..%d\n", v, MAX_STEPS);
                return 2;
            }
        } else {
            fprintf(stderr, "strata bench offload: unknown option '%s'\n%s", a, usage);
            return 2;
        }
    }
    if (!n_paths) { fprintf(stderr, "strata bench offload: give at least one --path DIR\n%s", usage); return 2; }

    /* tensors of 50M parameters, decay on every other one, as a model's would be */
    size_t n = (size_t)nparams, seg_len = 50000000;
    int n_segs = (int)((n + seg_len - 1) / seg_len);
    st_optim_segment *segs = calloc((size_t)n_segs, sizeof *segs);
    if (!segs) return 1;
    for (int i = 0; i < n_segs; i++) {
        size_t o = (size_t)i * seg_len;
        segs[i] = (st_optim_segment){o, n - o < seg_len ? n - o : seg_len, i % 2 ? 0.0f : 0.1f};
    }
    /* the budget: regions of 1/8 of it (at most ST_STORE_MAX_REGION, as the store chooses), then the gradient and working-copy
     * buffers of one subgroup and the process itself (its resident size now + 8 MiB); the
     * rest is the store's */
    double bpe = st_store_bytes_per_param((st_optim_state_format)states);
    double gs = gdt == ST_BF16 ? 2.0 : 4.0, ws = 2.0;
    uint64_t region = (uint64_t)(budget / (8.0 + (gs + ws) / bpe));
    if (region > ST_STORE_MAX_REGION) region = ST_STORE_MAX_REGION;
    size_t elems = (size_t)((double)region / bpe) / ST_OPTIM_CHUNK_ELEMS * ST_OPTIM_CHUNK_ELEMS + 2 * ST_OPTIM_CHUNK_ELEMS;
    uint64_t side = (uint64_t)((double)elems * (gs + ws));
    double base_rss = bench_proc_status_bytes("VmRSS:"); /* the program itself, before any buffer */
    double store_budget = budget - (double)side - (base_rss > 0 ? base_rss : 32.0 * 1048576.0) - 8.0 * 1048576.0;
    if (store_budget < 3.0 * (double)region) {
        fprintf(stderr, "strata bench offload: --host-budget %.0f bytes is too small for three %llu-byte subgroups plus "
                "buffers; give more\n", budget, (unsigned long long)region);
        free(segs);
        return 2;
    }
    st_store_config sc = {.paths = paths, .n_paths = n_paths, .segs = segs, .n_segs = n_segs,
                          .fmt = (st_optim_state_format)states, .host_budget = (uint64_t)store_budget,
                          .region_bytes = region, .in_place = in_place, .name = "strata-bench-offload"};
    st_err err = {0};
    st_store *st = NULL;
    bctx bc = {st_io_alloc(elems * (size_t)gs), st_io_alloc(elems * 2)};
    if (!bc.grad || !bc.work) { fprintf(stderr, "strata bench offload: out of memory\n"); free(segs); return 1; }
    for (size_t i = 0; i < elems; i++) {
        float g = 1e-3f * bench_hash_unit(i + 77);
        if (gdt == ST_BF16) ((uint16_t *)bc.grad)[i] = st_f32_to_bf16(g);
        else ((float *)bc.grad)[i] = g;
    }
    double ss = st_optim_grad_sumsq(bc.grad, (st_dtype)gdt, elems) * (double)n / (double)elems;
    /* the probe, three times per path (once now, for the split, twice after the steps):
     * the disks of shared machines vary by 2x from one minute to the next */
    double pr3[MAX_PATHS][3] = {{0}}, pw3[MAX_PATHS][3] = {{0}}, pm3[MAX_PATHS][3] = {{0}}, weight[MAX_PATHS];
    int mem[MAX_PATHS] = {0};
    for (int p = 0; p < n_paths; p++) {
        weight[p] = 1.0;
        if (probe &&
            probe_once(paths[p], (uint64_t)probe_bytes, &pr3[p][0], &pw3[p][0], &pm3[p][0], &mem[p], &err) != ST_OK) {
            fprintf(stderr, "strata bench offload: probe of %s: %s\n", paths[p], err.msg);
            st_io_free(bc.grad);
            st_io_free(bc.work);
            free(segs);
            return 1;
        }
        /* every byte is read once and written once per step, both in flight together */
        if (probe) weight[p] = pm3[p][0];
    }
    sc.path_weight = weight;
    /* the probe's own 64 MiB buffer is gone: restart the peak-RSS count (Linux >= 4.0) */
    FILE *cr = fopen("/proc/self/clear_refs", "w");
    if (cr) {
        fputs("5", cr);
        fclose(cr);
    }
    double tc0 = st_now();
    if (st_store_create(&st, &sc, init_master, NULL, &err) != ST_OK) {
        fprintf(stderr, "strata bench offload: %s\n", err.msg);
        st_io_free(bc.grad);
        st_io_free(bc.work);
        free(segs);
        return 1;
    }
    double create_s = st_now() - tc0;
    st_io_engine *io = st_store_io(st);
    int np = n_paths, rc = 0;
    double t_step[MAX_STEPS], t_cmp[MAX_STEPS], hit[MAX_STEPS]; /* --steps is at most MAX_STEPS */
    double rd_b[MAX_PATHS] = {0}, wr_b[MAX_PATHS] = {0}, busy[MAX_PATHS] = {0};
    st_store_stats s0 = {0};
    st_adamw_params hp = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = 1, .grad_scale = 1.0f};
    st_store_step_args sa = {.grads = grads_at, .grad_dtype = (st_dtype)gdt, .work = work_at, .work_dtype = ST_BF16,
                             .ctx = &bc, .grad_sumsq = ss};
    for (int s = 0; s <= steps && !rc; s++) {
        st_io_path_stats before[MAX_PATHS];
        for (int p = 0; p < np; p++) st_io_get_stats(io, p, &before[p]);
        hp.step = s + 1;
        if (st_store_step(st, &sa, &hp, &err) != ST_OK) {
            fprintf(stderr, "strata bench offload: step %d: %s\n", s + 1, err.msg);
            rc = 1;
            break;
        }
        st_store_get_stats(st, &s0);
        if (!json)
            fprintf(stderr, "step %d: %.2f s, read %.2f GB, wrote %.2f GB, update %.2f s, crc %.2f s, %d/%d hits\n",
                    s + 1, s0.step_s, s0.read_bytes / 1e9, s0.write_bytes / 1e9, s0.update_s, s0.crc_s, s0.hits,
                    s0.n_subgroups);
        if (s == 0) continue; /* warm-up */
        for (int p = 0; p < np; p++) {
            st_io_path_stats a;
            st_io_get_stats(io, p, &a);
            rd_b[p] = (double)(a.read_bytes - before[p].read_bytes);
            wr_b[p] = (double)(a.write_bytes - before[p].write_bytes);
            busy[p] = a.busy_s - before[p].busy_s;
        }
        t_step[s - 1] = s0.step_s;
        t_cmp[s - 1] = s0.update_s + s0.crc_s;
        hit[s - 1] = (double)s0.hits / s0.n_subgroups;
    }
    double rss_peak = bench_proc_status_bytes("VmHWM:");
    st_store_stats fin;
    st_store_get_stats(st, &fin);
    uint64_t disk_bytes = fin.disk_bytes;
    double path_share[MAX_PATHS];
    for (int p = 0; p < np; p++) path_share[p] = (double)st_store_path_bytes(st, p) / (double)disk_bytes;
    /* remove the state before probing: the probe needs the space */
    char files[MAX_PATHS][4400];
    for (int p = 0; p < np; p++) snprintf(files[p], sizeof files[p], "%s", st_io_engine_file(io, p));
    char manifest[4400];
    snprintf(manifest, sizeof manifest, "%s", st_store_manifest_path(st));
    st_store_close(st);
    for (int p = 0; p < np; p++) {
        unlink(files[p]);
        /* the store's per-path lock file, NAME.lock beside NAME.bin: the benchmark's state is gone */
        size_t n = strlen(files[p]);
        if (n > 4 && !strcmp(files[p] + n - 4, ".bin")) {
            snprintf(files[p] + n - 4, sizeof files[p] - (n - 4), ".lock");
            unlink(files[p]);
        }
    }
    unlink(manifest);
    strncat(manifest, ".prev", sizeof manifest - strlen(manifest) - 1); /* the commit before the last */
    unlink(manifest);
    if (rc) goto out;

    double pr[MAX_PATHS] = {0}, pw[MAX_PATHS] = {0}, pm[MAX_PATHS] = {0};
    for (int p = 0; p < np && probe; p++) {
        for (int k = 1; k < 3; k++)
            if (probe_once(paths[p], (uint64_t)probe_bytes, &pr3[p][k], &pw3[p][k], &pm3[p][k], &mem[p], &err) !=
                ST_OK) {
                fprintf(stderr, "strata bench offload: probe of %s: %s\n", paths[p], err.msg);
                rc = 1;
                goto out;
            }
        pr[p] = bench_median(pr3[p], 3);
        pw[p] = bench_median(pw3[p], 3);
        pm[p] = bench_median(pm3[p], 3);
    }
    /* the last timed step's bytes per path. The I/O time at probe speed is the slowest
     * path's; within a path, the step's reads and writes at the mixed probe's bandwidth
     * (reads and writes in flight together, as in the step). Beside it: the serial sum of
     * read time and write time at the pure probes, and their max (full overlap). */
    double io_time = 0, io_serial = 0, io_par = 0, rd_tot = 0, wr_tot = 0, busy_max = 0;
    for (int p = 0; p < np; p++) {
        double tr = probe ? rd_b[p] / (pr[p] * 1e9) : 0, tw = probe ? wr_b[p] / (pw[p] * 1e9) : 0;
        double tm = probe ? (rd_b[p] + wr_b[p]) / (pm[p] * 1e9) : 0;
        if (tr + tw > io_serial) io_serial = tr + tw;
        if ((tr > tw ? tr : tw) > io_par) io_par = tr > tw ? tr : tw;
        if (tm > io_time) io_time = tm;
        if (busy[p] > busy_max) busy_max = busy[p];
        rd_tot += rd_b[p];
        wr_tot += wr_b[p];
    }
    double step_s = bench_median(t_step, steps), comp_s = bench_median(t_cmp, steps), hits = bench_median(hit, steps);
    double io_ratio = probe ? io_time / step_s : NAN;
    double bound = io_time > comp_s ? io_time : comp_s;
    double overlap = probe ? step_s / bound : NAN;
    double state_bytes = (double)n * bpe;
    double ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (json) {
        printf("{\"bench\": \"offload\", \"params\": %zu, \"states\": \"%s\", \"grad\": \"%s\", \"in_place\": %s, "
               "\"paths\": %d, \"subgroups\": %d, \"region_bytes\": %llu, \"host_buffers\": %d, "
               "\"state_bytes\": %.0f, \"disk_bytes\": %llu, \"machine_ram_bytes\": %.0f, \"state_over_ram\": %.3f, "
               "\"create_s\": %.3f, \"steps\": %d, \"step_s\": %.4f, \"read_bytes\": %.0f, \"write_bytes\": %.0f, "
               "\"read_gbps\": %.3f, \"write_gbps\": %.3f, \"compute_s\": %.4f, \"io_time_s\": %.4f, "
               "\"io_time_serial_s\": %.4f, \"io_time_overlapped_s\": %.4f, \"io_busy_s\": %.4f, \"io_ratio\": %.4f, \"overlap_ratio\": %.4f, \"bound\": \"%s\", "
               "\"cache_hit_rate\": %.4f, \"host_budget_bytes\": %.0f, \"rss_peak_bytes\": %.0f, "
               "\"rss_over_budget\": %.4f, \"path\": [",
               n, states ? "8bit" : "f32", gdt == ST_BF16 ? "bf16" : "f32", in_place ? "true" : "false", np,
               fin.n_subgroups, (unsigned long long)fin.region_bytes, fin.n_buffers, state_bytes,
               (unsigned long long)disk_bytes, ram, state_bytes / ram, create_s, steps, step_s, rd_tot, wr_tot,
               rd_tot / step_s / 1e9, wr_tot / step_s / 1e9, comp_s, io_time, io_serial, io_par, busy_max, io_ratio, overlap,
               io_time > comp_s ? "io" : "compute", hits, budget, rss_peak, rss_peak / budget);
        for (int p = 0; p < np; p++)
            printf("%s{\"dir\": \"%s\", \"share\": %.4f, \"read_bytes\": %.0f, \"write_bytes\": %.0f, "
                   "\"probe_read_gbps\": %.3f, \"probe_write_gbps\": %.3f, \"probe_mixed_gbps\": %.3f, "
                   "\"split_weight\": %.4f, \"memory\": %s}",
                   p ? ", " : "", paths[p], path_share[p], rd_b[p], wr_b[p], pr[p], pw[p], pm[p], weight[p],
                   mem[p] ? "true" : "false");
        printf("]}\n");
    } else {
        printf("offload step: %zu params, %s states on %d path(s), %.2f GB of state (%.2fx RAM), %d subgroups\n", n,
               states ? "8-bit" : "fp32", np, state_bytes / 1e9, state_bytes / ram, fin.n_subgroups);
        printf("  step      %.3f s (median of %d)  read %.2f GB/s  write %.2f GB/s  cache hits %.0f%%\n", step_s,
               steps, rd_tot / step_s / 1e9, wr_tot / step_s / 1e9, hits * 100);
        for (int p = 0; p < np; p++)
            printf("  path %-24s share %.3f  probe read %.2f write %.2f mixed %.2f GB/s%s\n", paths[p], path_share[p],
                   pr[p], pw[p], pm[p], mem[p] ? " [tmpfs]" : "");
        printf("  io at probe speed %.3f s (serial %.3f s, overlapped %.3f s), compute %.3f s -> io_ratio %.3f, "
               "overlap_ratio %.3f (%s-bound)\n", io_time, io_serial, io_par, comp_s, io_ratio, overlap, io_time > comp_s ? "io" : "compute");
        printf("  memory    peak RSS %.1f MiB for a host budget of %.1f MiB (%.3f)\n", rss_peak / 1048576.0,
               budget / 1048576.0, rss_peak / budget);
    }
out:
    st_io_free(bc.grad);
    st_io_free(bc.work);
    free(segs);
    return rc;
}
