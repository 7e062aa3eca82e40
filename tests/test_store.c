/* test_store.c - the tiered state store against the in-memory optimizer: bit-identical
 * master weights, moments and working copies over several steps (fp32 and 8-bit states,
 * f32 and bf16 gradients, subgroups cut through segments, two paths, a cache smaller
 * than the state), reopen and continue, the split across paths following the weights,
 * corruption of a state file or the manifest named with file and offset, the capacity
 * check, and (as root) a full disk during a commit that leaves the last step intact. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "strata/optim.h"
#include "strata/store.h"
#include "strata/tensor.h"
#include "testutil.h"

#define NSEG 6
static const size_t seg_n[NSEG] = {40000, 17, 100000, 16384, 70001, 300};

typedef struct grads_ctx {
    const void *g;
    size_t es;
    float *work;
} grads_ctx;

static const void *grads_at(void *ctx, size_t first, size_t n) {
    (void)n;
    grads_ctx *c = ctx;
    return (const char *)c->g + first * c->es;
}
static void *work_at(void *ctx, size_t first, size_t n) {
    (void)n;
    return ((grads_ctx *)ctx)->work + first;
}

static const float *g_init;
static void init_from(void *ctx, size_t first, size_t n, float *dst) {
    (void)ctx;
    memcpy(dst, g_init + first, n * sizeof(float));
}

static void make_segs(st_optim_segment *segs, size_t *numel) {
    size_t at = 0;
    for (int i = 0; i < NSEG; i++) {
        segs[i] = (st_optim_segment){.offset = at, .n = seg_n[i], .weight_decay = (i % 2) ? 0.0f : 0.1f};
        at += seg_n[i] + (i == 2 ? 5 : 0); /* a gap, as a model with padding would have */
    }
    *numel = at;
}

/* a and b equal over the segments (the gap between them is never written) */
static int segs_equal(const float *a, const float *b, const st_optim_segment *segs) {
    int same = 1;
    for (int k = 0; k < NSEG; k++) same &= !memcmp(a + segs[k].offset, b + segs[k].offset, segs[k].n * 4);
    return same;
}

static void fill_grads(float *g, uint16_t *gb, size_t n, unsigned seed) {
    st_rng r;
    st_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) {
        g[i] = st_rng_normal(&r) * 0.01f;
        gb[i] = st_f32_to_bf16(g[i]);
    }
}

/* Run `steps` steps on the store and on an in-memory optimizer; compare. */
static int run_no;
static void run_identity(st_optim_state_format fmt, st_dtype gdt, int in_place) {
    char dir[4000];
    snprintf(dir, sizeof dir, "%s/run%d", test_tmpdir(), ++run_no);
    mkdir(dir, 0755);
    char p0[4096], p1[4096];
    snprintf(p0, sizeof p0, "%s/a", dir);
    snprintf(p1, sizeof p1, "%s/b", dir);
    mkdir(p0, 0755);
    mkdir(p1, 0755);
    const char *paths[2] = {p0, p1};
    double w[2] = {1.0, 3.0};
    st_optim_segment segs[NSEG];
    size_t numel;
    make_segs(segs, &numel);
    float *p = malloc(numel * 4), *work = calloc(numel, 4), *g = calloc(numel, 4);
    uint16_t *gb = calloc(numel, 2);
    st_rng r;
    st_rng_seed(&r, 7);
    for (size_t i = 0; i < numel; i++) p[i] = st_rng_normal(&r) * 0.05f;
    g_init = p;
    /* small subgroups (every one a few 16384-element chunks) and 4 buffers: the cache
     * holds one, so the pipeline evicts and reads every step */
    st_store_config sc = {.paths = paths, .n_paths = 2, .path_weight = w, .segs = segs, .n_segs = NSEG, .fmt = fmt,
                          .region_bytes = fmt == ST_OPTIM_STATE_F32 ? 400000 : 200000, .in_place = in_place};
    uint64_t pb[2], hb;
    st_err err = {0};
    CHECK(st_store_plan(&sc, pb, &hb, &err) == ST_OK, "plan: %s", err.msg);
    st_store *st = NULL;
    sc.host_budget = 0;
    {
        /* the region size of this layout, for a budget of 4 buffers */
        st_store *tmp;
        CHECK(st_store_create(&tmp, &sc, init_from, NULL, &err) == ST_OK, "create: %s", err.msg);
        st_store_stats ss;
        st_store_get_stats(tmp, &ss);
        st_store_close(tmp);
        char m[8400];
        snprintf(m, sizeof m, "rm -f %s/* %s/*", p0, p1);
        CHECK(system(m) == 0, "cleanup");
        sc.host_budget = 4 * ss.region_bytes;
    }
    CHECK(st_store_create(&st, &sc, init_from, NULL, &err) == ST_OK, "create: %s", err.msg);
    if (!st) return;
    st_store_stats ss;
    st_store_get_stats(st, &ss);
    CHECK(ss.n_subgroups >= 8, "subgroups %d", ss.n_subgroups);
    CHECK(ss.n_buffers == 4, "buffers %d", ss.n_buffers);

    st_optim *ref;
    CHECK(st_optim_create(&ref, segs, NSEG, fmt, &err) == ST_OK, "optim: %s", err.msg);
    float *rp = malloc(numel * 4), *rwork = calloc(numel, 4);
    memcpy(rp, p, numel * 4);
    grads_ctx gc = {gdt == ST_F32 ? (const void *)g : (const void *)gb, st_dtype_size(gdt), work};
    int total_hits = 0;
    for (int step = 1; step <= 6; step++) {
        if (step == 4) { /* close and reopen in the middle */
            st_store_close(st);
            st = NULL;
            CHECK(st_store_open(&st, &sc, &err) == ST_OK, "reopen: %s", err.msg);
            if (!st) break;
            size_t bb;
            const int *blob = st_store_blob(st, &bb);
            CHECK(blob && bb == sizeof(int) && *blob == 3, "blob after reopen: %zu bytes", bb);
            float *mm = malloc(numel * 4);
            CHECK(st_store_read_master(st, mm, &err) == ST_OK, "read master: %s", err.msg);
            CHECK(segs_equal(mm, rp, segs), "master weights after reopen differ from the reference");
            free(mm);
        }
        fill_grads(g, gb, numel, 100 + step);
        double ss2 = st_optim_grad_sumsq(gc.g, gdt, numel);
        st_adamw_params hp = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = step,
                           .grad_scale = st_optim_clip_scale(ss2, 1.0f, 1.0f)};
        st_optim_step_args oa = {.params = rp, .grads = gc.g, .grad_dtype = gdt, .work = rwork, .work_dtype = ST_F32,
                              .grad_sumsq = ss2};
        CHECK(st_optim_step_ex(ref, &oa, &hp, &err) == ST_OK, "ref step: %s", err.msg);
        st_store_step_args sa = {.grads = grads_at, .grad_dtype = gdt, .work = work_at, .work_dtype = ST_F32,
                                 .ctx = &gc, .grad_sumsq = ss2, .blob = &step, .blob_bytes = sizeof step};
        CHECK(st_store_step(st, &sa, &hp, &err) == ST_OK, "store step %d: %s", step, err.msg);
        st_store_get_stats(st, &ss);
        total_hits += ss.hits;
        CHECK(ss.hits + ss.misses == ss.n_subgroups, "step %d: %d hits + %d misses != %d subgroups", step, ss.hits,
              ss.misses, ss.n_subgroups);
        CHECK(ss.write_bytes > 0 && ss.step == (uint64_t)step, "step %d stats", step);
        CHECK(segs_equal(work, rwork, segs), "%s states, %s grads%s: step %d working copy differs from the in-memory optimizer",
              fmt ? "8bit" : "f32", st_dtype_name(gdt), in_place ? ", in place" : "", step);
    }
    CHECK(total_hits >= 4, "the cache never hit (%d hits over 6 steps)", total_hits);
    /* the moments too: read them back through a store reopened, compared via one more step
     * is covered above; here the final master */
    if (st) {
        float *mm = malloc(numel * 4);
        CHECK(st_store_read_master(st, mm, &err) == ST_OK, "read master: %s", err.msg);
        CHECK(segs_equal(mm, rp, segs), "final master weights differ");
        free(mm);
        /* the split follows the weights 1:3 (bytes per path) */
        double b0 = (double)st_store_path_bytes(st, 0), b1 = (double)st_store_path_bytes(st, 1);
        double share = b1 / (b0 + b1);
        CHECK(share > 0.75 * 0.9 && share < 0.75 * 1.1, "path 1 holds %.3f of the state; weight share 0.75", share);
        /* a non-finite gradient: refused, nothing touched */
        st_store_step_args sa = {.grads = grads_at, .grad_dtype = gdt, .ctx = &gc, .grad_sumsq = 1.0 / 0.0};
        st_adamw_params hp = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = 7, .grad_scale = 1};
        CHECK(st_store_step(st, &sa, &hp, &err) == ST_ERR_NONFINITE, "non-finite gradient not refused");
        st_store_get_stats(st, &ss);
        CHECK(ss.step == 6, "a refused step counted (%llu)", (unsigned long long)ss.step);
        st_store_close(st);
    }
    st_optim_free(ref);
    free(p);
    free(work);
    free(g);
    free(gb);
    free(rp);
    free(rwork);
}

static void flip_byte(const char *file, long off) {
    FILE *f = fopen(file, "r+b");
    CHECK(f != NULL, "open %s", file);
    if (!f) return;
    fseek(f, off, SEEK_SET);
    int c = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc(c ^ 0x20, f);
    fclose(f);
}

/* A flipped byte in a state file or in the manifest is found and named. */
static void test_corruption(void) {
    char dir[4000];
    snprintf(dir, sizeof dir, "%s/corrupt", test_tmpdir());
    mkdir(dir, 0755);
    char p0[4096];
    snprintf(p0, sizeof p0, "%s/c", dir);
    mkdir(p0, 0755);
    const char *paths[1] = {p0};
    st_optim_segment segs[NSEG];
    size_t numel;
    make_segs(segs, &numel);
    st_store_config sc = {.paths = paths, .n_paths = 1, .segs = segs, .n_segs = NSEG, .fmt = ST_OPTIM_STATE_F32,
                          .region_bytes = 400000, .host_budget = 64u << 20};
    st_err err = {0};
    st_store *st;
    CHECK(st_store_create(&st, &sc, NULL, NULL, &err) == ST_OK, "create: %s", err.msg);
    if (!st) return;
    st_store_close(st);
    char bin[4200], man[4200];
    snprintf(bin, sizeof bin, "%s/strata-state.bin", p0);
    snprintf(man, sizeof man, "%s/strata-state.manifest", p0);
    flip_byte(bin, 5000); /* inside subgroup 0's region A (after the 4 KiB header), current at step 0 */
    CHECK(st_store_open(&st, &sc, &err) == ST_OK, "open: %s", err.msg);
    if (st) {
        float *mm = malloc(numel * 4);
        st_status s = st_store_read_master(st, mm, &err);
        CHECK(s == ST_ERR_CHECKSUM, "a flipped byte was not detected (status %d)", (int)s);
        CHECK(strstr(err.msg, bin) && strstr(err.msg, "bytes [4096, "), "the error names neither file nor offset: %s",
              err.msg);
        free(mm);
        st_store_close(st);
    }
    flip_byte(bin, 5000);
    flip_byte(man, 70);
    st_status s = st_store_open(&st, &sc, &err);
    CHECK(s == ST_ERR_CHECKSUM && strstr(err.msg, man), "a flipped manifest byte: status %d: %s", (int)s, err.msg);
    if (s == ST_OK) st_store_close(st);
    /* a manifest that exists is never replaced by create */
    flip_byte(man, 70);
    s = st_store_create(&st, &sc, NULL, NULL, &err);
    CHECK(s == ST_ERR_INVALID && strstr(err.msg, "already exists"), "create over a store: %d %s", (int)s, err.msg);
    if (s == ST_OK) st_store_close(st);
    /* a truncated state file */
    CHECK(truncate(bin, 8192) == 0, "truncate");
    s = st_store_open(&st, &sc, &err);
    CHECK(s == ST_ERR_TRUNCATED && strstr(err.msg, bin), "a truncated file: %d %s", (int)s, err.msg);
    if (s == ST_OK) st_store_close(st);
}

/* The same directory twice is refused; two paths given in the other order are named. */
static void test_paths(void) {
    char a[4000], b[4000], a2[4100];
    snprintf(a, sizeof a, "%s/pa", test_tmpdir());
    snprintf(b, sizeof b, "%s/pb", test_tmpdir());
    snprintf(a2, sizeof a2, "%s/", a);
    mkdir(a, 0755);
    mkdir(b, 0755);
    st_optim_segment segs[NSEG];
    size_t numel;
    make_segs(segs, &numel);
    const char *dup[2] = {a, a2};
    st_store_config sc = {.paths = dup, .n_paths = 2, .segs = segs, .n_segs = NSEG, .fmt = ST_OPTIM_STATE_F32,
                          .region_bytes = 400000, .host_budget = 64u << 20};
    st_err err = {0};
    st_store *st;
    st_status s = st_store_create(&st, &sc, NULL, NULL, &err);
    CHECK(s == ST_ERR_INVALID && strstr(err.msg, "same directory"), "one directory twice: %d %s", (int)s, err.msg);
    if (s == ST_OK) st_store_close(st);
    const char *ab[2] = {a, b}, *ba[2] = {b, a};
    sc.paths = ab;
    CHECK(st_store_create(&st, &sc, NULL, NULL, &err) == ST_OK, "create: %s", err.msg);
    if (s == ST_OK || !st) return;
    st_store_close(st);
    /* the manifest lives in paths[0]: copy it over so the swapped order finds one */
    char cmd[8600];
    snprintf(cmd, sizeof cmd, "cp %s/strata-state.manifest %s/", a, b);
    CHECK(system(cmd) == 0, "cp");
    sc.paths = ba;
    s = st_store_open(&st, &sc, &err);
    CHECK(s == ST_ERR_INVALID && strstr(err.msg, "in the order"), "swapped paths: %d %s", (int)s, err.msg);
    if (s == ST_OK) st_store_close(st);
}

/* More state than the disk holds: refused before anything is written, with the bytes missing. */
static void test_capacity(void) {
    char dir[4000];
    snprintf(dir, sizeof dir, "%s/capacity", test_tmpdir());
    mkdir(dir, 0755);
    st_optim_segment seg = {.offset = 0, .n = 40000000000ull, .weight_decay = 0.0f}; /* 40e9 parameters: 960 GB in two regions */
    const char *paths[1] = {dir};
    st_store_config sc = {.paths = paths, .n_paths = 1, .segs = &seg, .n_segs = 1, .fmt = ST_OPTIM_STATE_F32,
                          .region_bytes = 64ull << 30, .host_budget = 1u << 30};
    st_err err = {0};
    st_store *st;
    st_status s = st_store_create(&st, &sc, NULL, NULL, &err);
    CHECK(s == ST_ERR_NOSPACE && strstr(err.msg, "bytes missing") && strstr(err.msg, dir),
          "capacity: status %d: %s", (int)s, err.msg);
    if (s == ST_OK) st_store_close(st);
    char f[4200];
    snprintf(f, sizeof f, "%s/strata-state.bin", dir);
    CHECK(access(f, F_OK) != 0, "a refused store left %s behind", f);
}

/* A full disk at commit time (a 4 MiB tmpfs, root only): a clear error, and the store
 * reopens at the last committed step with its weights. */
static int test_full_disk(void) {
    if (geteuid() != 0) return 0;
    const char *dir = test_tmpdir();
    char mnt[4096];
    snprintf(mnt, sizeof mnt, "%s/small", dir);
    mkdir(mnt, 0755);
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=4m") != 0) {
        fprintf(stderr, "note: cannot mount a tmpfs (%s); full-disk case not run\n", strerror(errno));
        return 0;
    }
    st_optim_segment seg = {.offset = 0, .n = 65536, .weight_decay = 0.0f};
    const char *paths[1] = {mnt};
    st_store_config sc = {.paths = paths, .n_paths = 1, .segs = &seg, .n_segs = 1, .fmt = ST_OPTIM_STATE_F32,
                          .region_bytes = 400000, .host_budget = 16u << 20};
    st_err err = {0};
    st_store *st;
    float *g = calloc(65536, 4), *before = malloc(65536 * 4), *after = malloc(65536 * 4);
    for (int i = 0; i < 65536; i++) g[i] = 0.001f * (float)(i % 17);
    grads_ctx gc = {g, 4, NULL};
    CHECK(st_store_create(&st, &sc, NULL, NULL, &err) == ST_OK, "create: %s", err.msg);
    if (st) {
        st_adamw_params hp = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = 1, .grad_scale = 1};
        st_store_step_args sa = {.grads = grads_at, .grad_dtype = ST_F32, .ctx = &gc, .grad_sumsq = 1.0};
        CHECK(st_store_step(st, &sa, &hp, &err) == ST_OK, "step 1: %s", err.msg);
        CHECK(st_store_read_master(st, before, &err) == ST_OK, "read: %s", err.msg);
        /* fill the filesystem */
        char fill[4200];
        snprintf(fill, sizeof fill, "%s/filler", mnt);
        FILE *f = fopen(fill, "wb");
        static char junk[65536];
        while (f && fwrite(junk, 1, sizeof junk, f) == sizeof junk && fflush(f) == 0) {}
        if (f) fclose(f);
        hp.step = 2;
        st_status s = st_store_step(st, &sa, &hp, &err);
        CHECK(s == ST_ERR_IO || s == ST_ERR_NOSPACE, "a full disk at commit: status %d", (int)s);
        CHECK(strstr(err.msg, "manifest") && strstr(err.msg, "space"), "unclear full-disk error: %s", err.msg);
        s = st_store_step(st, &sa, &hp, &err);
        CHECK(s == ST_ERR_INVALID, "a failed store accepted another step");
        st_store_close(st);
        unlink(fill);
        CHECK(st_store_open(&st, &sc, &err) == ST_OK, "reopen after the full disk: %s", err.msg);
        if (st) {
            st_store_stats ss;
            st_store_get_stats(st, &ss);
            CHECK(ss.step == 1, "after the failed commit the store is at step %llu, not 1", (unsigned long long)ss.step);
            CHECK(st_store_read_master(st, after, &err) == ST_OK, "read: %s", err.msg);
            CHECK(!memcmp(before, after, 65536 * 4), "the last committed weights changed");
            st_store_close(st);
        }
    }
    free(g);
    free(before);
    free(after);
    umount2(mnt, MNT_DETACH);
    return 1;
}

/* ------------------------------------------------------------------ the speculative step
 * What the streaming executor uses to update the disk state beside its backward: gradients
 * of two dtypes read as they are (even segments bf16, odd fp32), each subgroup waited for
 * before its update and visited in the caller's order (descending), a step abandoned at its
 * commit gate (nothing committed, the store usable, the redo equal to the reference), and a
 * step abandoned by a failing wait. */
typedef struct spec_ctx {
    const float *g;
    const uint16_t *gb;
    float *work;
    const st_optim_segment *segs;
    size_t numel;
    unsigned char *landed; /* per element: the wait has released it */
    size_t last_first;     /* the order the waits came in */
    int out_of_order, early, waits, fail_at, verdict;
} spec_ctx;

static int seg_bf16(const spec_ctx *c, size_t x) {
    for (int i = 0; i < NSEG; i++)
        if (x >= c->segs[i].offset && x < c->segs[i].offset + c->segs[i].n) return i % 2 == 0;
    return 0;
}
static st_dtype spec_dtype_of(void *ctx, size_t x) { return seg_bf16(ctx, x) ? ST_BF16 : ST_F32; }
static const void *spec_grads_as(void *ctx, size_t first, size_t n, st_dtype dt) {
    spec_ctx *c = ctx;
    for (size_t i = first; i < first + n; i++) /* no update reads a gradient before its wait */
        if (!c->landed[i] && (spec_dtype_of(c, i) == dt)) {
            c->early = 1;
            break;
        }
    return dt == ST_BF16 ? (const void *)(c->gb + first) : (const void *)(c->g + first);
}
static void *spec_work_at(void *ctx, size_t first, size_t n) {
    (void)n;
    return ((spec_ctx *)ctx)->work + first;
}
static st_status spec_wait(void *ctx, size_t first, size_t n, st_err *err) {
    spec_ctx *c = ctx;
    if (c->waits++ && first >= c->last_first) c->out_of_order = 1;
    c->last_first = first;
    if (c->fail_at && c->waits == c->fail_at) return st_errf(err, ST_ERR_INVALID, "test: the backward failed");
    memset(c->landed + first, 1, n);
    return ST_OK;
}
static double spec_order(void *ctx, size_t first, size_t end) {
    (void)ctx;
    (void)first;
    return -(double)end;
}
static int spec_commit(void *ctx) { return ((spec_ctx *)ctx)->verdict; }

static void test_speculative(st_optim_state_format fmt) {
    char dir[4000];
    snprintf(dir, sizeof dir, "%s/spec%d", test_tmpdir(), (int)fmt);
    mkdir(dir, 0755);
    const char *paths[1] = {dir};
    st_optim_segment segs[NSEG];
    size_t numel;
    make_segs(segs, &numel);
    float *p = malloc(numel * 4), *rp = malloc(numel * 4), *g = calloc(numel, 4), *work = calloc(numel, 4),
          *rwork = calloc(numel, 4), *mm = malloc(numel * 4), *before = malloc(numel * 4);
    uint16_t *gb = calloc(numel, 2);
    unsigned char *landed = calloc(numel, 1);
    st_rng r;
    st_rng_seed(&r, 11);
    for (size_t i = 0; i < numel; i++) p[i] = st_rng_normal(&r) * 0.05f;
    memcpy(rp, p, numel * 4);
    g_init = p;
    st_store_config sc = {.paths = paths, .n_paths = 1, .segs = segs, .n_segs = NSEG, .fmt = fmt,
                          .region_bytes = fmt == ST_OPTIM_STATE_F32 ? 400000 : 200000, .host_budget = 2000000};
    st_err err = {0};
    st_store *st = NULL;
    CHECK(st_store_create(&st, &sc, init_from, NULL, &err) == ST_OK, "create: %s", err.msg);
    st_optim *ref;
    CHECK(st_optim_create(&ref, segs, NSEG, fmt, &err) == ST_OK, "optim: %s", err.msg);
    spec_ctx c = {.g = g, .gb = gb, .work = work, .segs = segs, .numel = numel, .landed = landed};
    /* steps: 1 committed, 2 abandoned at the gate then redone, 3 abandoned by a failed wait then
     * redone, 4 committed */
    for (int step = 1; st && step <= 4; step++) {
        fill_grads(g, gb, numel, 300 + step);
        double ss = 0;
        for (int k = 0; k < NSEG; k++)
            ss += k % 2 == 0 ? st_optim_grad_sumsq(gb + segs[k].offset, ST_BF16, segs[k].n)
                             : st_optim_grad_sumsq(g + segs[k].offset, ST_F32, segs[k].n);
        st_adamw_params hp = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = step, .grad_scale = 1};
        for (int k = 0; k < NSEG; k++) { /* the reference: each segment in its dtype */
            st_optim_step_args oa = {.params = rp, .grads = k % 2 == 0 ? (const void *)gb : (const void *)g,
                                  .grad_dtype = k % 2 == 0 ? ST_BF16 : ST_F32, .work = rwork, .work_dtype = ST_F32,
                                  .seg_begin = k, .seg_end = k + 1, .grad_sumsq = ss};
            CHECK(st_optim_step_ex(ref, &oa, &hp, &err) == ST_OK, "ref step: %s", err.msg);
        }
        CHECK(st_store_read_master(st, before, &err) == ST_OK, "read: %s", err.msg);
        st_store_step_args sa = {.grad_dtype_of = spec_dtype_of, .grads_as = spec_grads_as, .work = spec_work_at,
                                 .work_dtype = ST_F32, .ctx = &c, .grad_sumsq = 0, .wait = spec_wait,
                                 .order_key = spec_order, .commit = spec_commit, .blob = &step, .blob_bytes = sizeof step};
        st_store_stats ss2;
        if (step == 2 || step == 3) { /* abandoned: the store stays at step - 1, whole */
            memset(landed, 0, numel);
            c.waits = 0;
            c.verdict = 0;
            c.fail_at = step == 3 ? 3 : 0;
            st_status s = st_store_step(st, &sa, &hp, &err);
            CHECK(step == 2 ? s == ST_OK : s == ST_ERR_INVALID && strstr(err.msg, "backward failed"),
                  "step %d abandoned: status %d: %s", step, (int)s, err.msg);
            st_store_get_stats(st, &ss2);
            CHECK(ss2.abandoned && ss2.step == (uint64_t)step - 1, "step %d: abandoned %d, store at step %llu", step,
                  ss2.abandoned, (unsigned long long)ss2.step);
            CHECK(st_store_read_master(st, mm, &err) == ST_OK, "read after abandon: %s", err.msg);
            CHECK(segs_equal(mm, before, segs), "step %d: an abandoned step changed the committed weights", step);
            size_t bb;
            const int *blob = st_store_blob(st, &bb);
            CHECK(blob && *blob == step - 1, "step %d: an abandoned step committed its blob", step);
        }
        memset(landed, 0, numel);
        c.waits = 0;
        c.fail_at = 0;
        c.verdict = 1;
        c.out_of_order = c.early = 0;
        CHECK(st_store_step(st, &sa, &hp, &err) == ST_OK, "store step %d: %s", step, err.msg);
        st_store_get_stats(st, &ss2);
        CHECK(!ss2.abandoned && ss2.step == (uint64_t)step, "step %d not committed", step);
        CHECK(!c.early, "step %d: a subgroup's gradient was read before its wait returned", step);
        CHECK(!c.out_of_order && c.waits == ss2.n_subgroups, "step %d: %d waits for %d subgroups, %s", step, c.waits,
              ss2.n_subgroups, c.out_of_order ? "not in the caller's order" : "in order");
        CHECK(segs_equal(work, rwork, segs), "%s states: speculative step %d differs from the in-memory optimizer", fmt ? "8bit" : "f32", step);
    }
    if (st) {
        CHECK(st_store_read_master(st, mm, &err) == ST_OK, "read: %s", err.msg);
        CHECK(segs_equal(mm, rp, segs), "final master weights after abandoned steps differ");
        st_store_close(st);
        /* reopened: the committed step 4, not an abandoned one */
        CHECK(st_store_open(&st, &sc, &err) == ST_OK, "reopen: %s", err.msg);
        if (st) {
            st_store_stats ss2;
            st_store_get_stats(st, &ss2);
            CHECK(ss2.step == 4, "reopened at step %llu", (unsigned long long)ss2.step);
            st_store_close(st);
        }
    }
    st_optim_free(ref);
    free(p);
    free(rp);
    free(g);
    free(gb);
    free(work);
    free(rwork);
    free(mm);
    free(before);
    free(landed);
}

static void test_spec_in_place(void) {
    char dir[4000];
    snprintf(dir, sizeof dir, "%s/specip", test_tmpdir());
    mkdir(dir, 0755);
    const char *paths[1] = {dir};
    st_optim_segment segs[1] = {{.offset = 0, .n = 65536, .weight_decay = 0.1f}};
    st_store_config sc = {.paths = paths, .n_paths = 1, .segs = segs, .n_segs = 1, .in_place = 1};
    st_err err = {0};
    st_store *st = NULL;
    CHECK(st_store_create(&st, &sc, NULL, NULL, &err) == ST_OK, "create: %s", err.msg);
    if (!st) return;
    float *g = calloc(65536, 4);
    grads_ctx gc = {g, 4, NULL};
    st_adamw_params hp = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = 1, .grad_scale = 1};
    st_store_step_args sa = {.grads = grads_at, .grad_dtype = ST_F32, .ctx = &gc, .commit = spec_commit};
    st_status s = st_store_step(st, &sa, &hp, &err);
    CHECK(s == ST_ERR_INVALID && strstr(err.msg, "in-place"), "a step that may be abandoned on an in-place store: %d %s",
          (int)s, err.msg);
    st_store_close(st);
    free(g);
}

int main(void) {
    run_identity(ST_OPTIM_STATE_F32, ST_F32, 0);
    run_identity(ST_OPTIM_STATE_F32, ST_BF16, 0);
    run_identity(ST_OPTIM_STATE_8BIT, ST_BF16, 0);
    run_identity(ST_OPTIM_STATE_8BIT, ST_F32, 1);
    test_speculative(ST_OPTIM_STATE_F32);
    test_speculative(ST_OPTIM_STATE_8BIT);
    test_spec_in_place();
    test_corruption();
    test_paths();
    test_capacity();
    if (!test_full_disk()) fprintf(stderr, "note: not root; the full-disk case is covered only when run as root\n");
    return test_finish("store");
}
