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

/* What was asked: the command line, parsed and checked once. */
typedef struct offload_opts {
    const char *paths[MAX_PATHS];
    int n_paths, states, gdt, steps, json, in_place, probe;
    double nparams, budget, probe_bytes;
} offload_opts;

/* What was set up: the optimizer's segments, the store's configuration (its regions and
 * budget sized from --host-budget), and the gradient and working-copy buffers. */
typedef struct offload_bench {
    size_t n, elems;   /* parameters; elements of one subgroup's gradient / working buffer */
    int n_segs;
    st_optim_segment *segs;
    double bpe;        /* the state's bytes per parameter */
    st_store_config sc;
    bctx bc;
    double grad_sumsq; /* the whole gradient's, as the step is told */
} offload_bench;

/* The probe's figures per path: three runs each (once before the steps, for the split of
 * the state over the paths, twice after), their medians, and the split's weights. */
typedef struct offload_probe {
    double pr3[MAX_PATHS][3], pw3[MAX_PATHS][3], pm3[MAX_PATHS][3];
    double pr[MAX_PATHS], pw[MAX_PATHS], pm[MAX_PATHS], weight[MAX_PATHS];
    int mem[MAX_PATHS];
} offload_probe;

/* What the steps measured: per timed step, the last timed step's bytes and busy time per
 * path, and the store's own figures at the end. */
typedef struct offload_figures {
    double create_s, rss_peak;
    double t_step[MAX_STEPS], t_cmp[MAX_STEPS], hit[MAX_STEPS]; /* --steps is at most MAX_STEPS */
    double rd_b[MAX_PATHS], wr_b[MAX_PATHS], busy[MAX_PATHS], path_share[MAX_PATHS];
    st_store_stats fin;
} offload_figures;

/* The I/O time the step's bytes take at the probe's speed, beside the step's medians. */
typedef struct offload_summary {
    double io_time, io_serial, io_par, rd_tot, wr_tot, busy_max;
    double step_s, comp_s, hits, io_ratio, overlap, state_bytes, ram;
} offload_summary;

/* The options into o: -1 to go on, else the exit code (0 for --help, 2 for a bad option). */
static int offload_parse_args(int argc, char **argv, offload_opts *o) {
    *o = (offload_opts){.states = ST_OPTIM_STATE_F32, .gdt = ST_BF16, .steps = 3, .probe = 1, .nparams = 200e6,
                        .budget = 2.0 * 1073741824.0, .probe_bytes = 2.0 * 1073741824.0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(usage, stdout); return 0; }
        if (!strcmp(a, "--json")) { o->json = 1; continue; }
        if (!strcmp(a, "--in-place")) { o->in_place = 1; continue; }
        if (!strcmp(a, "--no-probe")) { o->probe = 0; continue; }
        if (!v) { fprintf(stderr, "strata bench offload: %s needs a value\n%s", a, usage); return 2; }
        i++;
        if (!strcmp(a, "--path")) {
            if (o->n_paths == MAX_PATHS) { fprintf(stderr, "strata bench offload: at most %d paths\n", MAX_PATHS); return 2; }
            o->paths[o->n_paths++] = v;
        } else if (!strcmp(a, "--params")) {
            o->nparams = st_parse_count(v);
            if (o->nparams < ST_OPTIM_CHUNK_ELEMS) { fprintf(stderr, "strata bench offload: --params '%s': give a count >= 16K (e.g. 1B)\n", v); return 2; }
        } else if (!strcmp(a, "--states")) {
            if (!strcmp(v, "f32")) o->states = ST_OPTIM_STATE_F32;
            else if (!strcmp(v, "8bit")) o->states = ST_OPTIM_STATE_8BIT;
            else { fprintf(stderr, "strata bench offload: --states '%s': use f32 or 8bit\n", v); return 2; }
        } else if (!strcmp(a, "--grad")) {
            if (!strcmp(v, "bf16")) o->gdt = ST_BF16;
            else if (!strcmp(v, "f32")) o->gdt = ST_F32;
            else { fprintf(stderr, "strata bench offload: --grad '%s': use bf16 or f32\n", v); return 2; }
        } else if (!strcmp(a, "--host-budget")) {
            o->budget = st_parse_bytes(v);
            if (o->budget < 16 * 1048576.0) { fprintf(stderr, "strata bench offload: --host-budget '%s': give >= 16MiB\n", v); return 2; }
        } else if (!strcmp(a, "--probe-bytes")) {
            o->probe_bytes = st_parse_bytes(v);
            if (o->probe_bytes < 4096) { fprintf(stderr, "strata bench offload: --probe-bytes '%s' is not a size\n", v); return 2; }
        } else if (!strcmp(a, "--steps")) {
            o->steps = atoi(v);
            if (o->steps < 1 || o->steps > MAX_STEPS) {
                fprintf(stderr, "strata bench offload: --steps '%s': use 1..%d\n", v, MAX_STEPS);
                return 2;
            }
        } else {
            fprintf(stderr, "strata bench offload: unknown option '%s'\n%s", a, usage);
            return 2;
        }
    }
    if (!o->n_paths) { fprintf(stderr, "strata bench offload: give at least one --path DIR\n%s", usage); return 2; }
    return -1;
}

/* The segments and the store's sizes: 0, or the exit code (1: out of memory; 2: a budget
 * too small, said on stderr). */
static int offload_size(offload_bench *b, const offload_opts *o) {
    /* tensors of 50M parameters, decay on every other one, as a model's would be */
    size_t n = (size_t)o->nparams, seg_len = 50000000;
    b->n = n;
    b->n_segs = (int)((n + seg_len - 1) / seg_len);
    b->segs = calloc((size_t)b->n_segs, sizeof *b->segs);
    if (!b->segs) return 1;
    for (int i = 0; i < b->n_segs; i++) {
        size_t off = (size_t)i * seg_len;
        b->segs[i] = (st_optim_segment){.offset = off, .n = n - off < seg_len ? n - off : seg_len,
                                        .weight_decay = i % 2 ? 0.0f : 0.1f};
    }
    /* the budget: regions of 1/8 of it (at most ST_STORE_MAX_REGION, as the store chooses), then the gradient and working-copy
     * buffers of one subgroup and the process itself (its resident size now + 8 MiB); the
     * rest is the store's */
    b->bpe = st_store_bytes_per_param((st_optim_state_format)o->states);
    double gs = o->gdt == ST_BF16 ? 2.0 : 4.0, ws = 2.0;
    uint64_t region = (uint64_t)(o->budget / (8.0 + (gs + ws) / b->bpe));
    if (region > ST_STORE_MAX_REGION) region = ST_STORE_MAX_REGION;
    b->elems = (size_t)((double)region / b->bpe) / ST_OPTIM_CHUNK_ELEMS * ST_OPTIM_CHUNK_ELEMS + 2 * ST_OPTIM_CHUNK_ELEMS;
    uint64_t side = (uint64_t)((double)b->elems * (gs + ws));
    double base_rss = bench_proc_status_bytes("VmRSS:"); /* the program itself, before any buffer */
    double store_budget = o->budget - (double)side - (base_rss > 0 ? base_rss : 32.0 * 1048576.0) - 8.0 * 1048576.0;
    if (store_budget < 3.0 * (double)region) {
        fprintf(stderr, "strata bench offload: --host-budget %.0f bytes is too small for three %llu-byte subgroups plus "
                "buffers; give more\n", o->budget, (unsigned long long)region);
        return 2;
    }
    b->sc = (st_store_config){.paths = o->paths, .n_paths = o->n_paths, .segs = b->segs, .n_segs = b->n_segs,
                              .fmt = (st_optim_state_format)o->states, .host_budget = (uint64_t)store_budget,
                              .region_bytes = region, .in_place = o->in_place, .name = "strata-bench-offload"};
    return 0;
}

/* One subgroup's gradient (filled) and working copy, reused for every subgroup; 1 when out
 * of memory (said on stderr). */
static int offload_buffers(offload_bench *b, const offload_opts *o) {
    size_t gs = o->gdt == ST_BF16 ? 2 : 4;
    b->bc = (bctx){st_io_alloc(b->elems * gs), st_io_alloc(b->elems * 2)};
    if (!b->bc.grad || !b->bc.work) { fprintf(stderr, "strata bench offload: out of memory\n"); return 1; }
    for (size_t i = 0; i < b->elems; i++) {
        float g = 1e-3f * bench_hash_unit(i + 77);
        if (o->gdt == ST_BF16) ((uint16_t *)b->bc.grad)[i] = st_f32_to_bf16(g);
        else ((float *)b->bc.grad)[i] = g;
    }
    b->grad_sumsq = st_optim_grad_sumsq(b->bc.grad, (st_dtype)o->gdt, b->elems) * (double)b->n / (double)b->elems;
    return 0;
}

/* Probe run k (0, 1 or 2) of path p; 0, or 1 after saying which path failed. */
static int offload_probe_run(const offload_opts *o, offload_probe *pb, int p, int k) {
    st_err err = {0};
    if (probe_once(o->paths[p], (uint64_t)o->probe_bytes, &pb->pr3[p][k], &pb->pw3[p][k], &pb->pm3[p][k], &pb->mem[p],
                   &err) != ST_OK) {
        fprintf(stderr, "strata bench offload: probe of %s: %s\n", o->paths[p], err.msg);
        return 1;
    }
    return 0;
}

/* The first probe, before the state exists: it decides the split over the paths (every
 * byte is read once and written once per step, both in flight together: the mixed
 * bandwidth). The disks of shared machines vary by 2x from one minute to the next, hence
 * two more runs after the steps. Without the probe the paths weigh the same. */
static int offload_probe_first(const offload_opts *o, offload_probe *pb) {
    for (int p = 0; p < o->n_paths; p++) pb->weight[p] = 1.0;
    for (int p = 0; p < o->n_paths && o->probe; p++) {
        if (offload_probe_run(o, pb, p, 0)) return 1;
        pb->weight[p] = pb->pm3[p][0];
    }
    return 0;
}

/* The two later probes and each path's medians of three. */
static int offload_probe_rest(const offload_opts *o, offload_probe *pb) {
    for (int p = 0; p < o->n_paths && o->probe; p++) {
        if (offload_probe_run(o, pb, p, 1) || offload_probe_run(o, pb, p, 2)) return 1;
        pb->pr[p] = bench_median(pb->pr3[p], 3);
        pb->pw[p] = bench_median(pb->pw3[p], 3);
        pb->pm[p] = bench_median(pb->pm3[p], 3);
    }
    return 0;
}

/* The store's files (each path's NAME.bin and NAME.lock, the manifest and the commit
 * before it), removed once it is closed: the benchmark's state is gone and the later
 * probes have the space. */
static void offload_close_store(st_store *st, int np) {
    st_io_engine *io = st_store_io(st);
    char files[MAX_PATHS][4400];
    for (int p = 0; p < np; p++) snprintf(files[p], sizeof files[p], "%s", st_io_engine_file(io, p));
    char manifest[4400];
    snprintf(manifest, sizeof manifest, "%s", st_store_manifest_path(st));
    st_store_close(st);
    for (int p = 0; p < np; p++) {
        unlink(files[p]);
        size_t len = strlen(files[p]);
        if (len > 4 && !strcmp(files[p] + len - 4, ".bin")) {
            snprintf(files[p] + len - 4, sizeof files[p] - (len - 4), ".lock");
            unlink(files[p]);
        }
    }
    unlink(manifest);
    strncat(manifest, ".prev", sizeof manifest - strlen(manifest) - 1);
    unlink(manifest);
}

/* The store created (timed), one warm-up step and o->steps timed ones, the store's
 * figures, then the store closed and its files removed; 0, or 1 after saying what failed
 * (a failed step still closes and removes the store). */
static int offload_run_steps(offload_bench *b, const offload_opts *o, offload_figures *f) {
    st_err err = {0};
    st_store *st = NULL;
    /* the probe's own 64 MiB buffer is gone: restart the peak-RSS count (Linux >= 4.0) */
    FILE *cr = fopen("/proc/self/clear_refs", "w");
    if (cr) {
        fputs("5", cr);
        fclose(cr);
    }
    double tc0 = st_now();
    if (st_store_create(&st, &b->sc, init_master, NULL, &err) != ST_OK) {
        fprintf(stderr, "strata bench offload: %s\n", err.msg);
        return 1;
    }
    f->create_s = st_now() - tc0;
    st_io_engine *io = st_store_io(st);
    int np = o->n_paths, rc = 0;
    st_store_stats s0 = {0};
    st_adamw_params hp = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = 1, .grad_scale = 1.0f};
    st_store_step_args sa = {.grads = grads_at, .grad_dtype = (st_dtype)o->gdt, .work = work_at, .work_dtype = ST_BF16,
                             .ctx = &b->bc, .grad_sumsq = b->grad_sumsq};
    for (int s = 0; s <= o->steps; s++) {
        st_io_path_stats before[MAX_PATHS];
        for (int p = 0; p < np; p++) st_io_get_stats(io, p, &before[p]);
        hp.step = s + 1;
        if (st_store_step(st, &sa, &hp, &err) != ST_OK) {
            fprintf(stderr, "strata bench offload: step %d: %s\n", s + 1, err.msg);
            rc = 1;
            break;
        }
        st_store_get_stats(st, &s0);
        if (!o->json)
            fprintf(stderr, "step %d: %.2f s, read %.2f GB, wrote %.2f GB, update %.2f s, crc %.2f s, %d/%d hits\n",
                    s + 1, s0.step_s, s0.read_bytes / 1e9, s0.write_bytes / 1e9, s0.update_s, s0.crc_s, s0.hits,
                    s0.n_subgroups);
        if (s == 0) continue; /* warm-up */
        for (int p = 0; p < np; p++) {
            st_io_path_stats a;
            st_io_get_stats(io, p, &a);
            f->rd_b[p] = (double)(a.read_bytes - before[p].read_bytes);
            f->wr_b[p] = (double)(a.write_bytes - before[p].write_bytes);
            f->busy[p] = a.busy_s - before[p].busy_s;
        }
        f->t_step[s - 1] = s0.step_s;
        f->t_cmp[s - 1] = s0.update_s + s0.crc_s;
        f->hit[s - 1] = (double)s0.hits / s0.n_subgroups;
    }
    f->rss_peak = bench_proc_status_bytes("VmHWM:");
    st_store_get_stats(st, &f->fin);
    for (int p = 0; p < np; p++) f->path_share[p] = (double)st_store_path_bytes(st, p) / (double)f->fin.disk_bytes;
    offload_close_store(st, np);
    return rc;
}

/* The last timed step's bytes per path at the probe's speed. The I/O time is the slowest
 * path's; within a path, the step's reads and writes at the mixed probe's bandwidth (reads
 * and writes in flight together, as in the step). Beside it: the serial sum of read time
 * and write time at the pure probes, and their max (full overlap). Then the medians. */
static void offload_summarize(const offload_bench *b, const offload_opts *o, const offload_probe *pb,
                              offload_figures *f, offload_summary *u) {
    *u = (offload_summary){0};
    int probe = o->probe;
    for (int p = 0; p < o->n_paths; p++) {
        double tr = probe ? f->rd_b[p] / (pb->pr[p] * 1e9) : 0, tw = probe ? f->wr_b[p] / (pb->pw[p] * 1e9) : 0;
        double tm = probe ? (f->rd_b[p] + f->wr_b[p]) / (pb->pm[p] * 1e9) : 0;
        if (tr + tw > u->io_serial) u->io_serial = tr + tw;
        if ((tr > tw ? tr : tw) > u->io_par) u->io_par = tr > tw ? tr : tw;
        if (tm > u->io_time) u->io_time = tm;
        if (f->busy[p] > u->busy_max) u->busy_max = f->busy[p];
        u->rd_tot += f->rd_b[p];
        u->wr_tot += f->wr_b[p];
    }
    u->step_s = bench_median(f->t_step, o->steps);
    u->comp_s = bench_median(f->t_cmp, o->steps);
    u->hits = bench_median(f->hit, o->steps);
    u->io_ratio = probe ? u->io_time / u->step_s : NAN;
    double bound = u->io_time > u->comp_s ? u->io_time : u->comp_s;
    u->overlap = probe ? u->step_s / bound : NAN;
    u->state_bytes = (double)b->n * b->bpe;
    u->ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
}

/* --json: one object, the paths in an array. */
static void offload_print_json(const offload_bench *b, const offload_opts *o, const offload_probe *pb,
                               const offload_figures *f, const offload_summary *u) {
    printf("{\"bench\": \"offload\", \"params\": %zu, \"states\": \"%s\", \"grad\": \"%s\", \"in_place\": %s, "
           "\"paths\": %d, \"subgroups\": %d, \"region_bytes\": %llu, \"host_buffers\": %d, "
           "\"state_bytes\": %.0f, \"disk_bytes\": %llu, \"machine_ram_bytes\": %.0f, \"state_over_ram\": %.3f, "
           "\"create_s\": %.3f, \"steps\": %d, \"step_s\": %.4f, \"read_bytes\": %.0f, \"write_bytes\": %.0f, "
           "\"read_gbps\": %.3f, \"write_gbps\": %.3f, \"compute_s\": %.4f, \"io_time_s\": %.4f, "
           "\"io_time_serial_s\": %.4f, \"io_time_overlapped_s\": %.4f, \"io_busy_s\": %.4f, \"io_ratio\": %.4f, \"overlap_ratio\": %.4f, \"bound\": \"%s\", "
           "\"cache_hit_rate\": %.4f, \"host_budget_bytes\": %.0f, \"rss_peak_bytes\": %.0f, "
           "\"rss_over_budget\": %.4f, \"path\": [",
           b->n, o->states ? "8bit" : "f32", o->gdt == ST_BF16 ? "bf16" : "f32", o->in_place ? "true" : "false",
           o->n_paths, f->fin.n_subgroups, (unsigned long long)f->fin.region_bytes, f->fin.n_buffers, u->state_bytes,
           (unsigned long long)f->fin.disk_bytes, u->ram, u->state_bytes / u->ram, f->create_s, o->steps, u->step_s,
           u->rd_tot, u->wr_tot, u->rd_tot / u->step_s / 1e9, u->wr_tot / u->step_s / 1e9, u->comp_s, u->io_time,
           u->io_serial, u->io_par, u->busy_max, u->io_ratio, u->overlap, u->io_time > u->comp_s ? "io" : "compute",
           u->hits, o->budget, f->rss_peak, f->rss_peak / o->budget);
    for (int p = 0; p < o->n_paths; p++)
        printf("%s{\"dir\": \"%s\", \"share\": %.4f, \"read_bytes\": %.0f, \"write_bytes\": %.0f, "
               "\"probe_read_gbps\": %.3f, \"probe_write_gbps\": %.3f, \"probe_mixed_gbps\": %.3f, "
               "\"split_weight\": %.4f, \"memory\": %s}",
               p ? ", " : "", o->paths[p], f->path_share[p], f->rd_b[p], f->wr_b[p], pb->pr[p], pb->pw[p], pb->pm[p],
               pb->weight[p], pb->mem[p] ? "true" : "false");
    printf("]}\n");
}

/* The same figures as lines of text. */
static void offload_print_text(const offload_bench *b, const offload_opts *o, const offload_probe *pb,
                               const offload_figures *f, const offload_summary *u) {
    printf("offload step: %zu params, %s states on %d path(s), %.2f GB of state (%.2fx RAM), %d subgroups\n", b->n,
           o->states ? "8-bit" : "fp32", o->n_paths, u->state_bytes / 1e9, u->state_bytes / u->ram, f->fin.n_subgroups);
    printf("  step      %.3f s (median of %d)  read %.2f GB/s  write %.2f GB/s  cache hits %.0f%%\n", u->step_s,
           o->steps, u->rd_tot / u->step_s / 1e9, u->wr_tot / u->step_s / 1e9, u->hits * 100);
    for (int p = 0; p < o->n_paths; p++)
        printf("  path %-24s share %.3f  probe read %.2f write %.2f mixed %.2f GB/s%s\n", o->paths[p],
               f->path_share[p], pb->pr[p], pb->pw[p], pb->pm[p], pb->mem[p] ? " [tmpfs]" : "");
    printf("  io at probe speed %.3f s (serial %.3f s, overlapped %.3f s), compute %.3f s -> io_ratio %.3f, "
           "overlap_ratio %.3f (%s-bound)\n", u->io_time, u->io_serial, u->io_par, u->comp_s, u->io_ratio, u->overlap,
           u->io_time > u->comp_s ? "io" : "compute");
    printf("  memory    peak RSS %.1f MiB for a host budget of %.1f MiB (%.3f)\n", f->rss_peak / 1048576.0,
           o->budget / 1048576.0, f->rss_peak / o->budget);
}

int bench_offload(int argc, char **argv) {
    offload_opts o;
    int rc = offload_parse_args(argc, argv, &o);
    if (rc >= 0) return rc;
    offload_bench b = {0};
    offload_probe pb = {0};
    offload_figures f = {0};
    rc = offload_size(&b, &o);
    if (!rc) rc = offload_buffers(&b, &o);
    if (!rc) rc = offload_probe_first(&o, &pb);
    b.sc.path_weight = pb.weight;
    if (!rc) rc = offload_run_steps(&b, &o, &f);
    if (!rc) rc = offload_probe_rest(&o, &pb);
    if (!rc) {
        offload_summary u;
        offload_summarize(&b, &o, &pb, &f, &u);
        if (o.json) offload_print_json(&b, &o, &pb, &f, &u);
        else offload_print_text(&b, &o, &pb, &f, &u);
    }
    st_io_free(b.bc.grad);
    st_io_free(b.bc.work);
    free(b.segs);
    return rc;
}
