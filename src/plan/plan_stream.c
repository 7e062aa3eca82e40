/* plan_stream.c - the stream plan as a mixed-integer program (GLPK): per block keep /
 * offload / recompute, the prefetch depth and the vocabulary chunking, minimising the
 * cost model's step time (plan_cost.c) under the device budget. The device bytes come
 * from st_stream_device_bytes itself (see device_model). */
#include <math.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>

#include "plan/plan_cost.h"
#include "strata/tier.h"

#ifdef STRATA_HAVE_GLPK
#include <glpk.h>
#endif

int st_plan_vocab_chunks(const st_arch *a, const st_plan_options *opt, int *out) {
    int n = 0, V = a->lay.vocab_size;
    out[n++] = 0;
    if (opt && !opt->allow_vocab_chunk) return n;
    for (int div = 2; div <= 64 && n < ST_PLAN_MAX_VCHUNKS; div *= 2) {
        int vc = (V + div - 1) / div;
        vc = (vc + 63) / 64 * 64; /* whole cache lines of rows */
        if (vc >= V) continue;
        if (n > 1 && out[n - 1] == vc) continue;
        out[n++] = vc;
    }
    /* the fixed rule's chunk, in its place (descending): at most 6 halvings above, so room */
    if (ST_PLAN_RULE_VOCAB_CHUNK < V && n < ST_PLAN_MAX_VCHUNKS) {
        int i = 1;
        while (i < n && out[i] > ST_PLAN_RULE_VOCAB_CHUNK) i++;
        if (i == n || out[i] != ST_PLAN_RULE_VOCAB_CHUNK) {
            memmove(out + i + 1, out + i, sizeof *out * (size_t)(n - i));
            out[i] = ST_PLAN_RULE_VOCAB_CHUNK;
            n++;
        }
    }
    return n;
}

/* ------------------------------------------------------------------ device bytes */

/* st_stream_device_bytes, taken apart: every allocation of the executor's table is rounded
 * on its own, so for a given vocabulary chunk and depth the bytes are
 *     base(vc, d) + keep[n_keep] + off[n_offload] + rc0 * (no block recomputes)
 * with base the all-recompute plan. The terms are read from st_stream_device_bytes by
 * differences and the decomposition is checked against it over every (n_keep,
 * n_offload), so the program's bytes are the executor's, exactly. */
typedef struct device_model {
    int L;
    double *keep, *off; /* L + 1 each */
    double rc0;
} device_model;

static size_t bytes_of(const st_stream_config *sc, st_stream_plan *p, int vc, int d, int nk, int no) {
    int L = p->n_layer;
    p->vocab_chunk = vc;
    p->prefetch_depth = d;
    for (int l = 0; l < L; l++)
        p->act[l] = l < nk ? ST_STREAM_ACT_KEEP : l < nk + no ? ST_STREAM_ACT_OFFLOAD : ST_STREAM_ACT_RECOMPUTE;
    return st_stream_device_bytes(sc, p);
}

static double model_bytes(const device_model *m, double base, int nk, int no) {
    return base + m->keep[nk] + m->off[no] + (nk + no == m->L ? m->rc0 : 0);
}

static st_status device_model_init(device_model *m, const st_stream_config *sc, st_stream_plan *p, int vc, int d,
                                   st_err *err) {
    int L = sc->arch->lay.n_blocks;
    m->L = L;
    m->keep = calloc((size_t)L + 1, sizeof(double));
    m->off = calloc((size_t)L + 1, sizeof(double));
    if (!m->keep || !m->off) return st_errf(err, ST_ERR_NOMEM, "plan: out of memory");
    double base = (double)bytes_of(sc, p, vc, d, 0, 0);
    for (int k = 1; k < L; k++) {
        m->keep[k] = (double)bytes_of(sc, p, vc, d, k, 0) - base;
        m->off[k] = (double)bytes_of(sc, p, vc, d, 0, k) - base;
    }
    if (L >= 2) {
        m->rc0 = (double)bytes_of(sc, p, vc, d, 1, L - 1) - base - m->keep[1] - m->off[L - 1];
        m->keep[L] = (double)bytes_of(sc, p, vc, d, L, 0) - base - m->rc0;
        m->off[L] = (double)bytes_of(sc, p, vc, d, 0, L) - base - m->rc0;
    } else {
        m->rc0 = 0;
        m->keep[1] = (double)bytes_of(sc, p, vc, d, 1, 0) - base;
        m->off[1] = (double)bytes_of(sc, p, vc, d, 0, 1) - base;
    }
    for (int nk = 0; nk <= L; nk++)
        for (int no = 0; nk + no <= L; no++) {
            double want = (double)bytes_of(sc, p, vc, d, nk, no);
            if (model_bytes(m, base, nk, no) != want)
                return st_errf(err, ST_ERR_INVALID, "plan: st_stream_device_bytes is not a sum of per-choice terms at "
                               "%d keep, %d offload (%.0f bytes, the planner's model %.0f): the executor's "
                               "allocation table changed, update src/plan/plan_stream.c", nk, no, want,
                               model_bytes(m, base, nk, no));
        }
    return ST_OK;
}

static void device_model_free(device_model *m) {
    free(m->keep);
    free(m->off);
}

/* The fewest bytes any plan of this model needs with at least fk blocks kept, fo offloaded
 * and fr recomputed (the fixed choices), and that plan's shape. */
static double min_bytes(const device_model *m, const double *base, int np, int fk, int fo, int fr, int *bp, int *bnk,
                        int *bno) {
    double best = INFINITY;
    for (int p = 0; p < np; p++)
        for (int nk = fk; nk <= m->L - fr; nk++)
            for (int no = fo; nk + no <= m->L - fr; no++) {
                double b = model_bytes(m, base[p], nk, no);
                if (b < best) {
                    best = b;
                    *bp = p;
                    *bnk = nk;
                    *bno = no;
                }
            }
    return best;
}

/* ------------------------------------------------------------------ the program */

#ifdef STRATA_HAVE_GLPK
typedef struct triplets {
    int n, cap;
    int *i, *j;
    double *v;
} triplets;

static int tp_add(triplets *t, int i, int j, double v) {
    if (v == 0) return 0;
    if (t->n + 1 >= t->cap) {
        int cap = t->cap ? t->cap * 2 : 4096;
        int *ni = realloc(t->i, sizeof(int) * (size_t)cap), *nj = ni ? realloc(t->j, sizeof(int) * (size_t)cap) : NULL;
        if (ni) t->i = ni;
        if (nj) t->j = nj;
        double *nv = nj ? realloc(t->v, sizeof(double) * (size_t)cap) : NULL;
        if (!nv) return -1;
        t->v = nv;
        t->cap = cap;
    }
    t->n++; /* GLPK's arrays are 1-based */
    t->i[t->n] = i;
    t->j[t->n] = j;
    t->v[t->n] = v;
    return 0;
}

/* The program's columns (1-based), in order. */
typedef struct cols {
    int k, o, r, res, top, zk, zo, pp, ef, eb, opt, nk, no, n;
} cols;

/* Column values of plan p (pair index pi): the incumbent handed to GLPK. */
static void fill_cols(const cols *cl, const plan_cost *c, const st_stream_plan *p, int pi, int nd, double *x) {
    int L = c->L, d = p->prefetch_depth, nk = 0, no = 0, seen_off = 0, seen_rc = 0;
    memset(x, 0, sizeof(double) * (size_t)(cl->n + 1));
    unsigned char mv[ST_STREAM_MAX_LAYERS], rerun[ST_STREAM_MAX_LAYERS];
    for (int l = L - 1; l >= 0; l--) {
        int a = p->act[l];
        x[cl->k + l] = a == ST_STREAM_ACT_KEEP;
        x[cl->o + l] = a == ST_STREAM_ACT_OFFLOAD;
        x[cl->r + l] = a == ST_STREAM_ACT_RECOMPUTE;
        x[cl->res + l] = a == ST_STREAM_ACT_OFFLOAD && seen_off < 2;
        x[cl->top + l] = a == ST_STREAM_ACT_RECOMPUTE && seen_rc < 1;
        mv[l] = a == ST_STREAM_ACT_OFFLOAD && seen_off >= 2;
        rerun[l] = a == ST_STREAM_ACT_RECOMPUTE && seen_rc >= 1;
        seen_off += a == ST_STREAM_ACT_OFFLOAD;
        seen_rc += a == ST_STREAM_ACT_RECOMPUTE;
        nk += a == ST_STREAM_ACT_KEEP;
        no += a == ST_STREAM_ACT_OFFLOAD;
    }
    x[cl->zk + nk] = 1;
    x[cl->zo + no] = 1;
    x[cl->nk] = nk;
    x[cl->no] = no;
    x[cl->pp + pi] = 1;
    double below = 0;
    for (int w = 0; w < L; w++) {
        double e = plan_cost_wfetch_fwd(c, d, w) + (w > 0 && mv[w - 1] ? c->ta_out : 0) - c->fwd;
        x[cl->ef + w] = e > 0 ? e : 0;
        double cw = c->bwd + (rerun[w] ? c->fwd : 0);
        e = plan_cost_wfetch_bwd(c, d, w) + (w + 1 < L ? c->tg : 0) + (w > 0 && mv[w - 1] ? c->ta_in : 0) - cw;
        x[cl->eb + w] = e > 0 ? e : 0;
        if (w < L - 1) below += cw;
    }
    double opt = (double)L * c->opt_block - below;
    x[cl->opt] = opt > c->opt_block ? opt : c->opt_block;
    (void)nd;
}

/* The best of the simple plans (per vocabulary chunk and depth: the last k blocks keep,
 * the rest all recompute or all offload, for every k) that fits: the program's first incumbent,
 * so it never returns a plan slower than these rules, the executor's fixed rule among
 * them. Returns the pair index, -1 when none fits. */
/* A frozen base's executor (st_plan_options.frozen_base): no gradient slots; only the hook's
 * frozen flag and its held bytes a block are read. frozen_base 2 (POET-X's hook, which trains the
 * base's ends): no gradient slots, the embedding's and head's gradients. h: the caller's. */
static st_linear_hook *plan_hook(const st_plan_options *o, st_linear_hook *h) {
    *h = (st_linear_hook){.frozen = o->frozen_base == 1, .held_block_bytes = o->held_block_bytes};
    return o->frozen_base ? h : NULL;
}

static int best_simple(const st_arch *a, int B, int T, const st_plan_profile *hw, size_t budget, const int *vcs, int np,
                       int nd, const unsigned char *fx, st_dtype act_dtype, st_stream_plan *best, st_stream_plan *work,
                       double *best_s, const st_stream_config *scp, const st_plan_options *o) {
    int L = a->lay.n_blocks, bi = -1;
    st_stream_config sc = *scp;
    *best_s = INFINITY;
    for (int p = 0; p < np; p++)
        for (int rest = ST_STREAM_ACT_RECOMPUTE; rest <= ST_STREAM_ACT_OFFLOAD; rest++)
            for (int k = L; k >= 0; k--) {
                st_stream_plan_default(work, L);
                work->act_dtype = act_dtype;
                work->vocab_chunk = vcs[p / nd];
                work->prefetch_depth = 1 + p % nd;
                for (int l = 0; l < L; l++)
                    work->act[l] = fx && fx[l] != ST_PLAN_ACT_FREE ? fx[l] : l >= L - k ? ST_STREAM_ACT_KEEP : (unsigned char)rest;
                if (st_stream_device_bytes(&sc, work) > budget) continue;
                st_plan_prediction pr;
                st_err e = {0};
                if (st_plan_predict_frozen(a, B, T, hw, work, o->frozen_base, o->held_block_bytes, &pr, &e) == ST_OK &&
                    pr.step_s < *best_s) {
                    *best_s = pr.step_s;
                    *best = *work;
                    bi = p;
                }
            }
    return bi;
}

typedef struct heur_ctx {
    const double *x;
    int given;
} heur_ctx;

static void glpk_callback(glp_tree *tree, void *info) {
    heur_ctx *h = info;
    if (glp_ios_reason(tree) == GLP_IHEUR && !h->given) {
        glp_ios_heur_sol(tree, h->x);
        h->given = 1;
    }
}

static int glpk_quiet_hook(void *info, const char *s) {
    (void)info;
    (void)s;
    return 1; /* handled: GLPK prints nothing */
}

/* GLPK aborts the process on an internal failure (a numerical assertion in its simplex);
 * its documented way out is a hook that jumps back, after which glp_free_env frees it all. */
static void glpk_error_hook(void *info) { longjmp(*(jmp_buf *)info, 1); }
#endif

/* The plan is the best simple one (GLPK failed or found none of its own): its prediction,
 * not optimal, no program objective. */
static st_status take_simple(const st_arch *a, int B, int T, const st_plan_profile *hw, const st_stream_plan *simple,
                             const st_plan_options *o, size_t device_budget, double t0, st_stream_plan *out,
                             st_plan_prediction *pred, st_err *err) {
    *out = *simple;
    st_status s = st_plan_predict_frozen(a, B, T, hw, out, o->frozen_base, o->held_block_bytes, pred, err);
    if (s) return s;
    pred->program_s = NAN;
    pred->device_budget = device_budget;
    pred->optimal = 0;
    pred->solve_s = st_now() - t0;
    return ST_OK;
}

static st_status solve_program(const st_arch *a, int B, int T, size_t device_budget, const st_plan_profile *hw,
                               st_plan_options o, double t0, st_stream_plan *out, st_plan_prediction *pred, st_err *err);

st_status st_plan_stream_ex(const st_arch *a, int B, int T, size_t device_budget, const st_plan_profile *hw,
                         const st_plan_options *opt, st_stream_plan *out, st_plan_prediction *pred, st_err *err) {
    double t0 = st_now();
    if (opt && opt->prefer_resident_head == ST_PLAN_HEAD_RESIDENT_IF_FITS && opt->allow_vocab_chunk) {
        st_plan_options res = *opt;
        res.allow_vocab_chunk = 0;
        res.prefer_resident_head = ST_PLAN_HEAD_FASTEST;
        st_status r = st_plan_stream_ex(a, B, T, device_budget, hw, &res, out, pred, err);
        if (r != ST_ERR_NOMEM) return r;
        res.allow_vocab_chunk = 1; /* no resident plan fits: chunks */
        r = st_plan_stream_ex(a, B, T, device_budget, hw, &res, out, pred, err);
        if (r == ST_OK) pred->solve_s = st_now() - t0;
        return r;
    }
    if (opt && opt->prefer_resident_head == ST_PLAN_HEAD_RESIDENT_ON_TIE && opt->allow_vocab_chunk) {
        /* the fastest plan over every vocabulary choice; where it chunks, the fastest plan
         * with the head resident replaces it only when predicted no slower (a tie to
         * ST_PLAN_RESIDENT_TIE): the choice is the smaller of two times that never rise with
         * the budget, so it never rises either */
        st_plan_options all = *opt;
        all.prefer_resident_head = ST_PLAN_HEAD_FASTEST;
        st_status r = st_plan_stream_ex(a, B, T, device_budget, hw, &all, out, pred, err);
        if (r != ST_OK || out->vocab_chunk == 0) return r;
        st_plan_options res = all;
        res.allow_vocab_chunk = 0;
        int limit = all.time_limit_ms > 0 ? all.time_limit_ms : ST_PLAN_TIME_LIMIT_MS;
        int left = limit - (int)((st_now() - t0) * 1e3);
        res.time_limit_ms = left > 50 ? left : 50;
        st_stream_plan *rp = malloc(sizeof *rp);
        if (!rp) return st_errf(err, ST_ERR_NOMEM, "plan: out of memory");
        st_plan_prediction rpred;
        st_err rerr = {0};
        /* a resident head that does not fit (or a failed solve of it) leaves the chunked plan */
        if (st_plan_stream_ex(a, B, T, device_budget, hw, &res, rp, &rpred, &rerr) == ST_OK &&
            rpred.step_s <= pred->step_s * (1 + ST_PLAN_RESIDENT_TIE)) {
            *out = *rp;
            *pred = rpred;
        }
        free(rp);
        pred->solve_s = st_now() - t0;
        return ST_OK;
    }
    st_plan_options o = {.time_limit_ms = ST_PLAN_TIME_LIMIT_MS, .max_depth = ST_PLAN_MAX_DEPTH, .allow_vocab_chunk = 1,
                      .mip_gap = ST_PLAN_MIP_GAP, .no_incumbent = 0};
    if (opt) {
        o = *opt;
        if (o.time_limit_ms <= 0) o.time_limit_ms = ST_PLAN_TIME_LIMIT_MS;
        if (o.mip_gap < 0) o.mip_gap = ST_PLAN_MIP_GAP;
        if (o.max_depth <= 0 || o.max_depth > ST_PLAN_MAX_DEPTH) o.max_depth = ST_PLAN_MAX_DEPTH;
    }
    st_status s = solve_program(a, B, T, device_budget, hw, o, t0, out, pred, err);
    if (!s && o.frozen_base) { /* the prediction's bytes are a trained base's (st_plan_predict) */
        st_linear_hook ph;
        st_stream_config sc = {.arch = a, .B = B, .T = T, .hook = plan_hook(&o, &ph)};
        pred->device_bytes = st_stream_device_bytes(&sc, out);
    }
    return s;
}

#ifdef STRATA_HAVE_GLPK
/* What one attempt of the program is built from (solve_program's). */
typedef struct program {
    const cols *cl;
    const plan_cost *c, *cm;  /* cm: the times in milliseconds */
    const device_model *m;
    const unsigned char *fx;  /* fixed choices (NULL: none) */
    const double *base;       /* each (vocabulary chunk, depth) pair's bytes */
    const int *vcs;
    int L, np, nd;
    double bunit;             /* 1/256 of the budget: the byte row's unit */
} program;

/* The program (the columns' kinds and bounds, the objective, the rows) for budget bytes, in
 * GLPK's problem lp; 0, or 1 when a row could not be stored (out of memory). */
static int program_build(glp_prob *lp, const program *pg, double budget) {
    const cols *cl = pg->cl;
    const plan_cost *cc = pg->c, *cmp = pg->cm;
    const device_model *mm = pg->m;
    const unsigned char *fx = pg->fx;
    const double *base = pg->base;
    const int *vcs = pg->vcs;
    int L = pg->L, np = pg->np, nd = pg->nd, ncol = cl->n;
    int ck = cl->k, co = cl->o, cr = cl->r, cres = cl->res, ctop = cl->top, czk = cl->zk, czo = cl->zo;
    int cpp = cl->pp, cef = cl->ef, ceb = cl->eb, copt = cl->opt, cnk = cl->nk, cno = cl->no;
    glp_set_obj_dir(lp, GLP_MIN);
    glp_add_cols(lp, ncol);
    for (int j = 1; j < cef; j++) glp_set_col_kind(lp, j, GLP_BV);
    for (int j = cef; j < copt; j++) glp_set_col_bnds(lp, j, GLP_LO, 0, 0);
    glp_set_col_bnds(lp, copt, GLP_LO, cmp->opt_block, 0);
    for (int l = 0; fx && l < L; l++) /* a fixed choice: its three binaries are constants */
        if (fx[l] != ST_PLAN_ACT_FREE) {
            glp_set_col_bnds(lp, ck + l, GLP_FX, fx[l] == ST_STREAM_ACT_KEEP, 0);
            glp_set_col_bnds(lp, co + l, GLP_FX, fx[l] == ST_STREAM_ACT_OFFLOAD, 0);
            glp_set_col_bnds(lp, cr + l, GLP_FX, fx[l] == ST_STREAM_ACT_RECOMPUTE, 0);
        }
    /* the counts as integers of their own: branching on them splits the program's
     * many equivalent block orders at once */
    for (int j = cnk; j <= cno; j++) {
        glp_set_col_kind(lp, j, GLP_IV);
        glp_set_col_bnds(lp, j, GLP_DB, 0, L);
    }
    /* objective: the pair's constants, the reruns, the exposures */
    for (int p = 0; p < np; p++) {
        double hc, ce, cop;
        plan_cost_const(cc, vcs[p / nd], &hc, &ce, &cop);
        glp_set_obj_coef(lp, cpp + p, (hc + ce + cop + plan_cost_host_work(cc, vcs[p / nd], 1 + p % nd)) * 1e3);
    }
    double move_work = cmp->slow * (cmp->ta_out + cmp->ta_in); /* an offloaded block that moves (not one of the last two) */
    for (int l = 0; l < L; l++) {
        glp_set_obj_coef(lp, cr + l, cmp->fwd);
        glp_set_obj_coef(lp, ctop + l, -cmp->fwd);
        glp_set_obj_coef(lp, co + l, move_work);
        glp_set_obj_coef(lp, cres + l, -move_work);
        glp_set_obj_coef(lp, cef + l, 1);
        glp_set_obj_coef(lp, ceb + l, 1);
    }
    glp_set_obj_coef(lp, copt, 1);
    glp_set_obj_coef(lp, 0, (double)L * (cmp->fwd + cmp->bwd));

    triplets t = {0};
    int row = 0, bad = 0;
#define ROW(type, lo, hi) (row++, glp_add_rows(lp, 1), glp_set_row_bnds(lp, row, (type), (lo), (hi)))
#define E(col, v) (bad |= tp_add(&t, row, (col), (v)))
    for (int l = 0; l < L; l++) { /* one choice per block */
        ROW(GLP_FX, 1, 1);
        E(ck + l, 1), E(co + l, 1), E(cr + l, 1);
    }
    ROW(GLP_FX, 1, 1); /* n_keep, one-hot */
    for (int k = 0; k <= L; k++) E(czk + k, 1);
    ROW(GLP_FX, 0, 0);
    for (int k = 1; k <= L; k++) E(czk + k, k);
    E(cnk, -1);
    ROW(GLP_FX, 0, 0);
    E(cnk, 1);
    for (int l = 0; l < L; l++) E(ck + l, -1);
    ROW(GLP_FX, 1, 1); /* n_offload, one-hot */
    for (int k = 0; k <= L; k++) E(czo + k, 1);
    ROW(GLP_FX, 0, 0);
    for (int k = 1; k <= L; k++) E(czo + k, k);
    E(cno, -1);
    ROW(GLP_FX, 0, 0);
    E(cno, 1);
    for (int l = 0; l < L; l++) E(co + l, -1);
    /* top_l: block l is the highest recompute block (its forward is not run again) */
    for (int l = 0; l < L; l++) {
        ROW(GLP_UP, 0, 0);
        E(ctop + l, 1), E(cr + l, -1);
        ROW(GLP_LO, 0, 0);
        E(ctop + l, 1), E(cr + l, -1);
        for (int j = l + 1; j < L; j++) E(cr + j, 1);
    }
    ROW(GLP_UP, 0, 1);
    for (int l = 0; l < L; l++) E(ctop + l, 1);
    /* res_l: block l is one of the two highest offloaded blocks (stays on the device) */
    for (int l = 0; l < L; l++) {
        ROW(GLP_UP, 0, 0);
        E(cres + l, 1), E(co + l, -1);
        ROW(GLP_LO, 0, 0);
        E(cres + l, 1), E(co + l, -1);
        for (int j = l + 1; j < L; j++) E(co + j, 0.5);
    }
    ROW(GLP_UP, 0, 2);
    for (int l = 0; l < L; l++) E(cres + l, 1);
    /* device bytes (in units of 1/256 of the budget): base + keep[n_keep] + off[n_offload] + rc0 (1 - any recompute) <= budget */
    ROW(GLP_UP, 0, (budget - mm->rc0) / pg->bunit);
    for (int p = 0; p < np; p++) E(cpp + p, base[p] / pg->bunit);
    for (int k = 0; k <= L; k++) E(czk + k, mm->keep[k] / pg->bunit), E(czo + k, mm->off[k] / pg->bunit);
    for (int l = 0; l < L; l++) E(ctop + l, -mm->rc0 / pg->bunit);
    ROW(GLP_FX, 1, 1); /* one (vocabulary chunk, depth) */
    for (int p = 0; p < np; p++) E(cpp + p, 1);
    /* forward windows: e >= weight fetches + the drain of a moving offloaded block w-1 - fwd */
    for (int w = 0; w < L; w++) {
        ROW(GLP_LO, -cmp->fwd, 0);
        E(cef + w, 1);
        for (int p = 0; p < np; p++) E(cpp + p, -plan_cost_wfetch_fwd(cmp, 1 + p % nd, w));
        if (w > 0) E(co + w - 1, -cmp->ta_out), E(cres + w - 1, cmp->ta_out);
    }
    /* backward windows: e >= weight fetches + block w+1's gradient + the fetch of a moving
     * offloaded block w-1 - (bwd + a rerun forward) */
    for (int w = 0; w < L; w++) {
        ROW(GLP_LO, (w + 1 < L ? cmp->tg : 0) - cmp->bwd, 0);
        E(ceb + w, 1);
        for (int p = 0; p < np; p++) E(cpp + p, -plan_cost_wfetch_bwd(cmp, 1 + p % nd, w));
        if (w > 0) E(co + w - 1, -cmp->ta_in), E(cres + w - 1, cmp->ta_in);
        E(cr + w, cmp->fwd), E(ctop + w, -cmp->fwd);
    }
    /* the optimizer behind the backward of the blocks below the last */
    ROW(GLP_LO, (double)L * cmp->opt_block - (double)(L - 1) * cmp->bwd, 0);
    E(copt, 1);
    for (int l = 0; l < L - 1; l++) E(cr + l, cmp->fwd), E(ctop + l, -cmp->fwd);
#undef ROW
#undef E
    if (!bad) glp_load_matrix(lp, t.n, t.i, t.j, t.v);
    free(t.i), free(t.j), free(t.v);
    return bad;
}

#endif

/* The program itself (st_plan_stream_ex less the head policies), with options o (defaults
 * filled in), started at t0. */
static st_status solve_program(const st_arch *a, int B, int T, size_t device_budget, const st_plan_profile *hw,
                               st_plan_options o, double t0, st_stream_plan *out, st_plan_prediction *pred, st_err *err) {
    plan_cost c;
    st_status s = plan_cost_init(&c, a, B, T, hw, err);
    if (s) return s;
    if (o.act_dtype != ST_F32 && o.act_dtype != ST_BF16)
        return st_errf(err, ST_ERR_INVALID, "plan: activation dtype %s (f32 or bf16)", st_dtype_name(o.act_dtype));
    /* the program's terms are its plans' predictions (st_plan_predict_frozen: frozen, then act) */
    plan_cost_frozen(&c, o.frozen_base, o.held_block_bytes); /* a frozen base's blocks (LoRA, POET-X) */
    plan_cost_act(&c, o.act_dtype);
    int L = c.L;
    if (L < 1 || L > ST_STREAM_MAX_LAYERS) return st_errf(err, ST_ERR_INVALID, "plan: %d blocks", L);
    /* explicit choices: fixed columns of the program, and fewer plans to fit */
    const unsigned char *fx = o.fixed_act;
    int nfix[3] = {0, 0, 0};
    for (int l = 0; fx && l < L; l++) {
        if (fx[l] == ST_PLAN_ACT_FREE) continue;
        if (fx[l] > ST_STREAM_ACT_OFFLOAD)
            return st_errf(err, ST_ERR_INVALID, "plan: block %d's fixed activation choice is %d, not a st_stream_act", l,
                           fx[l]);
        nfix[fx[l]]++;
    }
    int fk = nfix[ST_STREAM_ACT_KEEP], fo = nfix[ST_STREAM_ACT_OFFLOAD], fr = nfix[ST_STREAM_ACT_RECOMPUTE];
    int vcs[ST_PLAN_MAX_VCHUNKS], nv = st_plan_vocab_chunks(a, &o, vcs);
    int nd = o.max_depth < L ? o.max_depth : L, np = nv * nd;
    st_linear_hook ph;
    st_stream_config sc = {.arch = a, .B = B, .T = T, .hook = plan_hook(&o, &ph)};
    st_stream_plan *work = malloc(sizeof *work);
    double *base = malloc(sizeof(double) * (size_t)np);
    device_model m = {0};
    if (!work || !base) {
        free(work);
        free(base);
        return st_errf(err, ST_ERR_NOMEM, "plan: out of memory");
    }
    st_stream_plan_default(work, L);
    work->act_dtype = o.act_dtype; /* the sets' bytes: 4 or 2 an element */
    if ((s = device_model_init(&m, &sc, work, vcs[0], 1, err))) goto done;
    for (int p = 0; p < np; p++) {
        base[p] = (double)bytes_of(&sc, work, vcs[p / nd], 1 + p % nd, 0, 0);
        /* the per-choice terms do not depend on the chunk or the depth: checked at one mix */
        int nk = L / 2, no = L - nk;
        if (model_bytes(&m, base[p], nk, no) != (double)bytes_of(&sc, work, vcs[p / nd], 1 + p % nd, nk, no)) {
            s = st_errf(err, ST_ERR_INVALID, "plan: st_stream_device_bytes's activation terms depend on the vocabulary "
                        "chunk or depth: the executor's allocation table changed, update src/plan/plan_stream.c");
            goto done;
        }
    }
    int mp = 0, mk = 0, mo = 0;
    double need = min_bytes(&m, base, np, fk, fo, fr, &mp, &mk, &mo);
    if (need > (double)device_budget && fk + fo + fr > 0) {
        int fp = 0, fk0 = 0, fo0 = 0;
        double free_need = min_bytes(&m, base, np, 0, 0, 0, &fp, &fk0, &fo0);
        char what[512];
        st_plan_act_describe(fx, L, what, sizeof what);
        s = st_errf(err, ST_ERR_NOMEM, "plan: the fixed activation choices (%s) leave no stream plan within a device "
                    "budget of %zu bytes: the smallest with them (%d keep, %d offload, %d recompute, prefetch depth %d, "
                    "vocab_chunk %d) needs %.0f, %.0f bytes missing (without fixed choices the smallest needs %.0f: "
                    "fix fewer blocks, recompute in place of keep or offload, or give a larger budget)", what,
                    device_budget, mk, mo, L - mk - mo, 1 + mp % nd, vcs[mp / nd], need, need - (double)device_budget,
                    free_need);
        goto done;
    }
    if (need > (double)device_budget) {
        s = st_errf(err, ST_ERR_NOMEM, "plan: no stream plan fits a device budget of %zu bytes: the smallest (%d keep, "
                    "%d offload, %d recompute, prefetch depth %d, vocab_chunk %d) needs %.0f, %.0f bytes missing "
                    "(a smaller batch or sequence, or a larger budget)", device_budget, mk, mo, L - mk - mo,
                    1 + mp % nd, vcs[mp / nd], need, need - (double)device_budget);
        goto done;
    }
#ifndef STRATA_HAVE_GLPK
    (void)out;
    (void)pred;
    (void)t0;
    s = st_errf(err, ST_ERR_UNSUPPORTED, "plan: this strata was built without GLPK (Debian: apt-get install "
                "libglpk-dev, then configure again): the planner cannot solve");
#else
    {
    /* columns */
    int ck = 1, co = ck + L, cr = co + L, cres = cr + L, ctop = cres + L, czk = ctop + L, czo = czk + L + 1;
    int cpp = czo + L + 1, cef = cpp + np, ceb = cef + L, copt = ceb + L, cnk = copt + 1, cno = cnk + 1, ncol = cno;
    cols cl = {ck, co, cr, cres, ctop, czk, czo, cpp, cef, ceb, copt, cnk, cno, ncol};
    int solved = 0;
    st_stream_plan *simple = malloc(sizeof *simple);
    double *x0 = malloc(sizeof(double) * (size_t)(ncol + 1)), simple_s;
    if (!simple || !x0) {
        free(simple);
        free(x0);
        s = st_errf(err, ST_ERR_NOMEM, "plan: out of memory");
        goto done;
    }
    /* units the solver handles well together: milliseconds, and 1/256 of the budget */
    double bunit = (double)device_budget / 256.0 > 1.0 ? (double)device_budget / 256.0 : 1.0;
    double budget = (double)device_budget;
    plan_cost cm = c;
    cm.fwd *= 1e3, cm.bwd *= 1e3, cm.tw *= 1e3, cm.tg *= 1e3, cm.ta_out *= 1e3, cm.ta_in *= 1e3, cm.opt_block *= 1e3;
    program pg = {.cl = &cl, .c = &c, .cm = &cm, .m = &m, .fx = fx, .base = base, .vcs = vcs, .L = L, .np = np, .nd = nd,
                  .bunit = bunit};
    for (int attempt = 0; attempt < 4; attempt++) {
        volatile int si = best_simple(a, B, T, hw, (size_t)budget, vcs, np, nd, fx, o.act_dtype, simple, work, &simple_s, &sc,
                                      &o);
        if (si >= 0) fill_cols(&cl, &cm, simple, si, nd, x0);
        heur_ctx hx = {x0, si < 0 || o.no_incumbent};
        glp_term_hook(glpk_quiet_hook, NULL);
        glp_prob *lp = glp_create_prob();
        if (program_build(lp, &pg, budget)) {
            glp_delete_prob(lp);
            s = st_errf(err, ST_ERR_NOMEM, "plan: out of memory");
            break;
        }
        glp_smcp sp;
        glp_init_smcp(&sp);
        sp.msg_lev = GLP_MSG_OFF;
        glp_iocp ip;
        glp_init_iocp(&ip);
        ip.msg_lev = GLP_MSG_OFF;
        ip.presolve = GLP_OFF; /* the incumbent is given in the program's own columns */
        ip.cb_func = glpk_callback;
        ip.cb_info = &hx;
        ip.mip_gap = o.mip_gap;
        int left = o.time_limit_ms - (int)((st_now() - t0) * 1e3);
        ip.tm_lim = left > 50 ? left : 50;
        ip.mir_cuts = GLP_ON;
        glp_scale_prob(lp, GLP_SF_AUTO);
        sp.tm_lim = ip.tm_lim;
        jmp_buf jb;
        glp_error_hook(glpk_error_hook, &jb);
        if (setjmp(jb)) { /* GLPK failed inside: every GLPK object is gone with its environment */
            glp_error_hook(NULL, NULL);
            glp_free_env();
            if (si < 0) {
                s = st_errf(err, ST_ERR_INVALID, "plan: GLPK failed (a numerical error in its simplex) and no simple "
                            "plan fits the budget of %zu bytes", device_budget);
                break;
            }
            if ((s = take_simple(a, B, T, hw, simple, &o, device_budget, t0, out, pred, err))) break;
            solved = 1;
            break;
        }
        int rc = glp_simplex(lp, &sp);
        if (rc == 0) rc = glp_intopt(lp, &ip);
        glp_error_hook(NULL, NULL);
        int st = glp_mip_status(lp);
        if (st != GLP_OPT && st != GLP_FEAS && si >= 0) { /* no solution of its own: the simple plan */
            glp_delete_prob(lp);
            if ((s = take_simple(a, B, T, hw, simple, &o, device_budget, t0, out, pred, err))) break;
            solved = 1;
            break;
        }
        if (st != GLP_OPT && st != GLP_FEAS) {
            glp_delete_prob(lp);
            s = st_errf(err, rc == GLP_ETMLIM ? ST_ERR_UNSUPPORTED : ST_ERR_INVALID,
                        "plan: GLPK found no plan in %d ms (glp_intopt %d, status %d) though the smallest plan fits: "
                        "raise the time limit", o.time_limit_ms, rc, st);
            break;
        }
        st_stream_plan_default(out, L);
        out->act_dtype = o.act_dtype;
        int pbest = 0;
        for (int p = 0; p < np; p++)
            if (glp_mip_col_val(lp, cpp + p) > 0.5) pbest = p;
        out->vocab_chunk = vcs[pbest / nd];
        out->prefetch_depth = 1 + pbest % nd;
        for (int l = 0; l < L; l++)
            out->act[l] = glp_mip_col_val(lp, ck + l) > 0.5   ? ST_STREAM_ACT_KEEP
                          : glp_mip_col_val(lp, co + l) > 0.5 ? ST_STREAM_ACT_OFFLOAD
                                                              : ST_STREAM_ACT_RECOMPUTE;
        int optimal = st == GLP_OPT || rc == GLP_EMIPGAP;
        double obj = glp_mip_obj_val(lp);
        glp_delete_prob(lp);
        int l_bad = -1;
        for (int l = 0; fx && l < L && l_bad < 0; l++)
            if (fx[l] != ST_PLAN_ACT_FREE && out->act[l] != fx[l]) l_bad = l;
        if (l_bad >= 0) {
            s = st_errf(err, ST_ERR_INVALID, "plan: GLPK's plan has block %d %s, fixed %s (a planner bug: report it)",
                        l_bad, st_plan_act_name(out->act[l_bad]), st_plan_act_name(fx[l_bad]));
            break;
        }
        size_t got = st_stream_device_bytes(&sc, out);
        if (got > device_budget) { /* GLPK's feasibility tolerance: tighten by the excess, solve again */
            budget -= (double)(got - device_budget) + ST_ARENA_ALIGN;
            continue;
        }
        if ((s = st_plan_predict_frozen(a, B, T, hw, out, o.frozen_base, o.held_block_bytes, pred, err))) break;
        pred->program_s = obj * 1e-3;
        if (si >= 0 && !o.no_incumbent && simple_s < pred->step_s) { /* GLPK stopped before reaching its incumbent */
            *out = *simple;
            if ((s = st_plan_predict_frozen(a, B, T, hw, out, o.frozen_base, o.held_block_bytes, pred, err))) break;
            optimal = 0;
        }
        pred->device_budget = device_budget;
        pred->optimal = optimal;
        pred->solve_s = st_now() - t0;
        solved = 1;
        break;
    }
    if (!s && !solved) s = st_errf(err, ST_ERR_INVALID, "plan: GLPK's plans kept exceeding the budget of %zu bytes", device_budget);
    free(simple);
    free(x0);
    }
#endif
done:
    device_model_free(&m);
    free(work);
    free(base);
    return s;
}

st_status st_plan_stream(const st_arch *a, int B, int T, size_t device_budget, const st_plan_profile *hw,
                      st_stream_plan *out, st_plan_prediction *pred, st_err *err) {
    return st_plan_stream_ex(a, B, T, device_budget, hw, NULL, out, pred, err);
}

void st_plan_rule_candidate(const st_stream_config *sc, int i, st_stream_plan *p) {
    static const st_stream_act order[] = {ST_STREAM_ACT_KEEP, ST_STREAM_ACT_OFFLOAD, ST_STREAM_ACT_RECOMPUTE};
    st_stream_plan_default(p, sc->arch->lay.n_blocks);
    p->vocab_chunk = i / 3 ? ST_PLAN_RULE_VOCAB_CHUNK : 0;
    st_stream_plan_set_all(p, order[i % 3]);
}

