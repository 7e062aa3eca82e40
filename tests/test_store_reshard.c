/* test_store_reshard.c - a state store's ranges moved into new stores (the re-shard of a
 * disk state for another number of ranks): a store stepped 3 times is cut at 3 ranks'
 * shard bounds into 3 new stores (st_store_read_range into st_store_create_filled), those
 * are put back together into one, and the one steps exactly as the original (master
 * weights and working copy bit for bit: the moments came through whole), fp32 and 8-bit,
 * segments with gaps and sizes off the block grid, several subgroups per store. Also: a
 * reader's shared lock (readers together, never beside a writer, either way), a reader
 * refused a step, the previous commit read without changing the store, a range off the
 * 8-bit blocks refused, and a failed fill leaving no store. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "strata/dist.h"
#include "strata/optim.h"
#include "strata/store.h"
#include "testutil.h"

#define NSEG 5
static const size_t seg_n[NSEG] = {70001, 300, 100000, 16384, 45000};
#define NQ 3 /* the shards */

static void make_segs(st_optim_segment *segs, size_t *numel) {
    size_t at = 0;
    for (int i = 0; i < NSEG; i++) {
        segs[i] = (st_optim_segment){.offset = at, .n = seg_n[i], .weight_decay = (i % 2) ? 0.0f : 0.1f};
        at += seg_n[i] + (i == 1 ? 7 : 0); /* a gap */
    }
    *numel = at;
}

static const float *g_init;
static void init_from(void *ctx, size_t first, size_t n, float *dst) {
    (void)ctx;
    memcpy(dst, g_init + first, n * sizeof(float));
}

static const void *grads_at(void *ctx, size_t first, size_t n) {
    (void)n;
    return (const float *)ctx + first;
}

/* The sources of a fill: stores holding elements [lo[q], hi[q]) of the whole vector (segs);
 * the new store starts at element `at`. */
typedef struct sources {
    st_store *st[NQ];
    size_t lo[NQ], hi[NQ], at;
    int n, calls, fail_at;
    const st_optim_segment *segs;
    st_optim_state_format fmt;
} sources;

static st_status fill_from(void *ctx, size_t first, size_t n, float *master, void *const moments[], int n_moments,
                           st_err *err) {
    sources *x = ctx;
    if (++x->calls == x->fail_at) return st_errf(err, ST_ERR_IO, "test: the fill fails at its call %d", x->calls);
    size_t a = x->at + first, b = a + n;
    for (int q = 0; q < x->n; q++) {
        size_t pa = a > x->lo[q] ? a : x->lo[q], pb = b < x->hi[q] ? b : x->hi[q];
        if (pa >= pb) continue;
        void *dst[ST_STORE_MAX_MOMENTS];
        for (int i = 0; i < n_moments; i++)
            dst[i] = (char *)moments[i] + st_store_moment_offset(x->segs, NSEG, x->fmt, a, pa, i);
        st_status s = st_store_read_range(x->st[q], pa - x->lo[q], pb - pa, master + (pa - a), dst, err);
        if (s) return s;
    }
    return ST_OK;
}

static void mkdirs2(const char *base, const char *name, char *p0, char *p1, size_t cap) {
    char d[4096];
    snprintf(d, sizeof d, "%s/%s", base, name);
    mkdir(d, 0755);
    snprintf(p0, cap, "%s/a", d);
    snprintf(p1, cap, "%s/b", d);
    mkdir(p0, 0755);
    mkdir(p1, 0755);
}

static void run(st_optim_state_format fmt) {
    const char *fn = fmt ? "8bit" : "f32";
    char base[4096];
    snprintf(base, sizeof base, "%s/%s", test_tmpdir(), fn);
    mkdir(base, 0755);
    st_optim_segment segs[NSEG];
    size_t numel;
    make_segs(segs, &numel);
    float *p = malloc(numel * 4), *g = malloc(numel * 4);
    float *m0 = malloc(numel * 4), *m1 = malloc(numel * 4), *before = malloc(numel * 4);
    st_rng r;
    st_rng_seed(&r, 11);
    for (size_t i = 0; i < numel; i++) p[i] = st_rng_normal(&r) * 0.05f;
    g_init = p;
    st_err err = {0};
    uint64_t region = fmt == ST_OPTIM_STATE_F32 ? 400000 : 200000; /* several subgroups a store */

    /* the original: created, 3 steps */
    char a0[4200], b0[4200];
    mkdirs2(base, "orig", a0, b0, sizeof a0);
    const char *op[2] = {a0, b0};
    st_store_config oc = {.paths = op, .n_paths = 2, .segs = segs, .n_segs = NSEG, .fmt = fmt, .region_bytes = region,
                          .host_budget = 8 * region};
    st_store *st = NULL;
    CHECK(st_store_create(&st, &oc, init_from, NULL, &err) == ST_OK, "create: %s", err.msg);
    if (!st) goto out;
    for (int step = 1; step <= 4; step++) { /* the fourth step's gradient is for both stores, below */
        for (size_t i = 0; i < numel; i++) g[i] = st_rng_normal(&r) * 0.01f;
        if (step == 4) break;
        double ss = st_optim_grad_sumsq_f32(g, numel);
        st_adamw_params hp = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = step,
                           .grad_scale = st_optim_clip_scale(ss, 1.0f, 1.0f)};
        st_store_step_args sa = {.grads = grads_at, .grad_dtype = ST_F32, .ctx = g, .grad_sumsq = ss,
                                 .blob = &step, .blob_bytes = sizeof step};
        CHECK(st_store_step(st, &sa, &hp, &err) == ST_OK, "step %d: %s", step, err.msg);
    }
    st_store_stats ss;
    st_store_get_stats(st, &ss);
    CHECK(ss.n_subgroups >= 4, "%s: %d subgroups; the test wants several", fn, ss.n_subgroups);

    /* locks: a reader beside the writer is refused; readers together; a writer beside them refused */
    st_store *r1 = NULL, *r2 = NULL, *wr = NULL;
    CHECK(st_store_open_readonly(&r1, &oc, 0, &err) == ST_ERR_BUSY, "%s: a reader opened beside the writer", fn);
    st_store_close(st);
    st = NULL;
    CHECK(st_store_open_readonly(&r1, &oc, 0, &err) == ST_OK, "reader 1: %s", err.msg);
    CHECK(st_store_open_readonly(&r2, &oc, 0, &err) == ST_OK, "reader 2 beside reader 1: %s", err.msg);
    CHECK(st_store_open(&wr, &oc, &err) == ST_ERR_BUSY, "%s: a writer opened beside two readers", fn);
    st_store_close(wr);
    if (!r1 || !r2) goto out;
    {
        int blob = 0;
        st_store_step_args sa = {.grads = grads_at, .grad_dtype = ST_F32, .ctx = g, .grad_sumsq = 1.0};
        st_adamw_params hp = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = 4, .grad_scale = 1};
        CHECK(st_store_step(r1, &sa, &hp, &err) == ST_ERR_INVALID, "%s: a reader took a step", fn);
        CHECK(st_store_commit_blob(r2, &blob, sizeof blob, &err) == ST_ERR_INVALID, "%s: a reader committed", fn);
    }
    CHECK(st_store_read_master(r2, before, &err) == ST_OK, "read master: %s", err.msg);
    if (fmt == ST_OPTIM_STATE_8BIT) { /* element 1000 of a segment: inside its fourth block */
        float x[10];
        void *mm[ST_STORE_MAX_MOMENTS] = {m0, m0, m0, m0};
        CHECK(st_store_read_range(r2, 1000, 10, x, mm, &err) == ST_ERR_INVALID && strstr(err.msg, "8-bit blocks"),
              "a range off the 8-bit blocks: %s", err.msg);
    }
    st_store_close(r2);

    /* cut at 3 ranks' bounds into 3 stores of one path each */
    size_t bounds[NQ + 1];
    st_zero_bounds(segs, NSEG, numel, NQ, bounds);
    size_t bb;
    int blob[1] = {0}; /* the loop state of step 3, copied: r1 is closed before the merge */
    const void *b1 = st_store_blob(r1, &bb);
    CHECK(b1 && bb == sizeof blob, "%s: the blob of step 3: %zu bytes", fn, bb);
    if (b1 && bb == sizeof blob) memcpy(blob, b1, bb);
    st_store *piece[NQ] = {0};
    sources one = {.n = 1, .segs = segs, .fmt = fmt, .st = {r1}, .lo = {0}, .hi = {numel}};
    char pp[NQ][4200];
    for (int q = 0; q < NQ; q++) {
        char pb[4200];
        char name[32];
        snprintf(name, sizeof name, "piece%d", q);
        mkdirs2(base, name, pp[q], pb, sizeof pb);
        const char *qp[1] = {pp[q]};
        st_optim_segment clip[NSEG];
        st_store_config qc = {.paths = qp, .n_paths = 1, .segs = clip, .fmt = fmt, .region_bytes = region / 2,
                              .host_budget = 8 * region,
                              .n_segs = st_zero_clip_segments(segs, NSEG, bounds[q], bounds[q + 1], clip)};
        one.at = bounds[q];
        CHECK(st_store_create_filled(&piece[q], &qc, fill_from, &one, 3, blob, bb, &err) == ST_OK,
              "%s: piece %d: %s", fn, q, err.msg);
        st_store_close(piece[q]);
        piece[q] = NULL;
        CHECK(st_store_open_readonly(&piece[q], &qc, 0, &err) == ST_OK, "%s: reopen piece %d: %s", fn, q, err.msg);
        if (!piece[q]) goto out;
    }
    st_store_close(r1);

    /* back together into one store on two paths */
    char ma[4200], mb[4200];
    mkdirs2(base, "merged", ma, mb, sizeof ma);
    const char *mp[2] = {ma, mb};
    st_store_config mc = oc;
    mc.paths = mp;
    mc.region_bytes = region * 2 / 3; /* subgroups cut elsewhere than the original's */
    sources all = {.n = NQ, .segs = segs, .fmt = fmt, .at = 0};
    for (int q = 0; q < NQ; q++) {
        all.st[q] = piece[q];
        all.lo[q] = bounds[q];
        all.hi[q] = bounds[q + 1];
    }
    st_store *mg = NULL;
    CHECK(st_store_create_filled(&mg, &mc, fill_from, &all, 3, blob, bb, &err) == ST_OK, "%s: merged: %s", fn,
          err.msg);
    for (int q = 0; q < NQ; q++) st_store_close(piece[q]);
    if (!mg) goto out;
    st_store_info in;
    CHECK(st_store_peek(&mc, 0, &in, &err) == ST_OK && in.step == 3 && in.numel == numel && in.fmt == fmt,
          "%s: peek of the merged store: %s step %llu", fn, err.msg, (unsigned long long)in.step);
    {
        size_t b2;
        const int *bl = st_store_blob(mg, &b2);
        CHECK(bl && b2 == sizeof(int) && *bl == 3, "%s: the merged store's blob", fn);
    }

    /* the fourth step on both: the same bits */
    CHECK(st_store_open(&st, &oc, &err) == ST_OK, "reopen the original: %s", err.msg);
    if (!st) goto out_mg;
    {
        double s2 = st_optim_grad_sumsq_f32(g, numel);
        int step = 4;
        st_adamw_params hp = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = 4,
                           .grad_scale = st_optim_clip_scale(s2, 1.0f, 1.0f)};
        st_store_step_args sa = {.grads = grads_at, .grad_dtype = ST_F32, .ctx = g, .grad_sumsq = s2,
                                 .work = NULL, .work_dtype = ST_F32, .blob = &step, .blob_bytes = sizeof step};
        CHECK(st_store_step(st, &sa, &hp, &err) == ST_OK, "original step 4: %s", err.msg);
        CHECK(st_store_step(mg, &sa, &hp, &err) == ST_OK, "merged step 4: %s", err.msg);
        CHECK(st_store_read_master(st, m0, &err) == ST_OK && st_store_read_master(mg, m1, &err) == ST_OK,
              "read master: %s", err.msg);
        int same = 1, changed = 0;
        for (int k = 0; k < NSEG; k++) {
            same &= !memcmp(m0 + segs[k].offset, m1 + segs[k].offset, segs[k].n * 4);
            changed |= memcmp(m0 + segs[k].offset, before + segs[k].offset, segs[k].n * 4) != 0;
        }
        CHECK(same, "%s: cut into 3 and put back together, the store steps differently from the original", fn);
        CHECK(changed, "%s: the fourth step changed nothing", fn);
    }
    st_store_close(st);
    st = NULL;
    st_store_close(mg); /* the merged store is read below: its writer's lock would refuse that */
    mg = NULL;

    /* the previous commit, read without changing the store */
    {
        char man[4400];
        snprintf(man, sizeof man, "%s/strata-state.manifest.prev", a0);
        size_t n0 = 0, n1 = 0;
        unsigned char *f0 = test_slurp(man, &n0);
        st_store *pr = NULL;
        CHECK(st_store_open_readonly(&pr, &oc, 1, &err) == ST_OK, "%s: the previous commit: %s", fn, err.msg);
        if (pr) {
            CHECK(st_store_read_master(pr, m1, &err) == ST_OK, "read the previous master: %s", err.msg);
            int same = 1;
            for (int k = 0; k < NSEG; k++) same &= !memcmp(m1 + segs[k].offset, before + segs[k].offset, segs[k].n * 4);
            CHECK(same, "%s: the previous commit's master weights are not step 3's", fn);
            st_store_get_stats(pr, &ss);
            CHECK(ss.step == 3, "%s: the previous commit is step %llu", fn, (unsigned long long)ss.step);
            st_store_close(pr);
        }
        unsigned char *f1 = test_slurp(man, &n1);
        CHECK(f0 && f1 && n0 == n1 && !memcmp(f0, f1, n0), "%s: reading the previous commit changed it", fn);
        CHECK(st_store_peek(&oc, 0, &in, &err) == ST_OK && in.step == 4, "%s: the store is not at step 4", fn);
        free(f0);
        free(f1);
    }

    /* a fill that fails: no store, no files */
    {
        char fa[4200], fb[4200], bin[4400];
        mkdirs2(base, "failed", fa, fb, sizeof fa);
        const char *fp[2] = {fa, fb};
        st_store_config fc = mc;
        fc.paths = fp;
        sources bad = {.n = 1, .segs = segs, .fmt = fmt, .lo = {0}, .hi = {numel}, .fail_at = 2};
        CHECK(st_store_open_readonly(&bad.st[0], &mc, 0, &err) == ST_OK, "reader: %s", err.msg);
        st_store *fs = NULL;
        if (bad.st[0])
            CHECK(st_store_create_filled(&fs, &fc, fill_from, &bad, 3, NULL, 0, &err) == ST_ERR_IO &&
              strstr(err.msg, "fails at its call 2"), "%s: a failing fill: %s", fn, err.msg);
        CHECK(!st_store_exists(&fc), "%s: a failed fill left a manifest", fn);
        snprintf(bin, sizeof bin, "%s/strata-state.bin", fa);
        CHECK(access(bin, F_OK) != 0, "%s: a failed fill left %s", fn, bin);
        st_store_close(fs);
        st_store_close(bad.st[0]);
    }
out_mg:
    st_store_close(mg);
out:
    st_store_close(st);
    free(p);
    free(g);
    free(m0);
    free(m1);
    free(before);
}

int main(void) {
    run(ST_OPTIM_STATE_F32);
    run(ST_OPTIM_STATE_8BIT);
    return test_finish("store_reshard");
}
