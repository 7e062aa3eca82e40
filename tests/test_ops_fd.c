/* test_ops_fd.c - the double reference ops: hand-computed forward values, and every
 * backward checked against central finite differences through the forward.
 *
 * The objective is L = sum(out * R) for a fixed random R (so dout = R); for the fused
 * cross-entropy it is L = sum(losses) with dloss = 1 and one masked target. Gradient
 * buffers are pre-filled with random values before each backward and the prefill is
 * subtracted after, so the += contract is tested along with the math.
 *
 * Tolerances (double precision, h = 1e-6): |analytic - numeric| <= FD_RTOL * max|numeric|
 * + FD_ATOL per element, FD_RTOL = 1e-6, FD_ATOL = 1e-8. Central differences have
 * truncation error ~h^2 |L'''| ~ 1e-12 and rounding error ~eps |L| / h ~ 1e-9 for the
 * |L| ~ 10 of these shapes, so a correct backward sits far inside the bound, while a
 * wrong term (a missing factor, a dropped row) misses it by orders of magnitude.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/ref/ops_ref.h"
#include "strata/core.h"
#include "testutil.h"

#define OPS_FD_NAME "test_ops_fd"
#include "ops_fd_common.h"

/* Run backward into a buffer pre-filled with random values, return the increment. */
static double *prefilled(size_t n) { return randn(n, 1.0, 0.0); }

static void fill_nan(double *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = NAN;
}

static int all_finite(const double *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(p[i])) return 0;
    return 1;
}

typedef struct shape {
    int B, T, C, NH, V;
} shape;

/* ---------------- hand-computed forward values ---------------- */

static void test_forward_values(void) {
    /* layernorm of [1,2,3], w = 1, b = 0: mean 2, var 2/3, out = [-1,0,1] / sqrt(2/3 + 1e-5) */
    double x[3] = {1, 2, 3}, w[3] = {1, 1, 1}, b[3] = {0, 0, 0}, out[3], mean, rstd;
    ref_layernorm_forward(out, &mean, &rstd, x, w, b, 1, 3);
    double want_ln[3] = {-1.2247356859083902, 0.0, 1.2247356859083902};
    check_close_f64("layernorm [1,2,3]", out, want_ln, 3, 1e-14, 1e-12);
    CHECK(fabs(mean - 2.0) < 1e-15 && fabs(rstd - 1.2247356859083902) < 1e-12, "ln mean %g rstd %g", mean, rstd);
    /* with w = [2,2,2], b = [1,1,1] the output is 2 * that + 1 */
    double w2[3] = {2, 2, 2}, b2[3] = {1, 1, 1}, want_ln2[3];
    for (int i = 0; i < 3; i++) want_ln2[i] = 2 * want_ln[i] + 1;
    ref_layernorm_forward(out, &mean, &rstd, x, w2, b2, 1, 3);
    check_close_f64("layernorm affine", out, want_ln2, 3, 1e-14, 1e-12);

    /* gelu, tanh approximation */
    double gx[4] = {1, -1, 0, 2}, gy[4], want_g[4] = {0.8411919906082768, -0.15880800939172324, 0.0,
                                                       1.954597694087775};
    ref_gelu_forward(gy, gx, 4);
    check_close_f64("gelu(1,-1,0,2)", gy, want_g, 4, 1e-15, 1e-12);
    double dg = 0, one = 1, zero = 0;
    ref_gelu_backward(&dg, &zero, &one, 1);
    CHECK(fabs(dg - 0.5) < 1e-15, "gelu'(0) = %g, want 0.5", dg);

    /* cross-entropy: logits [0,0] target 0 -> ln 2, dlogits [-0.5, 0.5] * dloss; a masked row */
    double lg[4] = {0, 0, 3, -7}, losses[2] = {NAN, NAN};
    int32_t tg[2] = {0, -1};
    ref_crossentropy_forward_backward(lg, losses, tg, 2, 2, 2.0);
    CHECK(fabs(losses[0] - 0.6931471805599453) < 1e-15, "CE [0,0] loss %.17g, want ln 2", losses[0]);
    CHECK(losses[1] == 0, "CE masked loss %g", losses[1]);
    double want_dl[4] = {-1.0, 1.0, 0, 0};
    check_close_f64("CE dlogits (dloss 2)", lg, want_dl, 4, 1e-15, 0);
    double lg0[2] = {0, 0}, loss0;
    int32_t t1 = 1;
    ref_crossentropy_forward_backward(lg0, &loss0, &t1, 1, 2, 0.0);
    CHECK(lg0[0] == 0 && lg0[1] == 0 && fabs(loss0 - 0.6931471805599453) < 1e-15,
          "CE dloss 0 must leave logits alone");

    /* matmul [1,2] x [[1,2,3],[4,5,6]] + [1,1,1] = [10,13,16], in both layouts */
    double mi[2] = {1, 2}, w_io[6] = {1, 2, 3, 4, 5, 6}, w_oi[6] = {1, 4, 2, 5, 3, 6}, bias[3] = {1, 1, 1};
    double mo[3], want_m[3] = {10, 13, 16}, want_mnb[3] = {9, 12, 15};
    ref_matmul_forward(mo, mi, w_io, bias, 1, 2, 3, ST_W_IN_OUT);
    check_close_f64("matmul in_out", mo, want_m, 3, 0, 0);
    ref_matmul_forward(mo, mi, w_oi, bias, 1, 2, 3, ST_W_OUT_IN);
    check_close_f64("matmul out_in", mo, want_m, 3, 0, 0);
    ref_matmul_forward(mo, mi, w_oi, NULL, 1, 2, 3, ST_W_OUT_IN);
    check_close_f64("matmul no bias", mo, want_mnb, 3, 0, 0);

    /* attention, B=1 T=2 C=1 NH=1 (scale 1): token 0 (q 1, k 0, v 2), token 1 (q 1, k ln 3, v 5).
     * t=0 sees only itself: out 2, lse 0. t=1 scores [0, ln 3] -> p [1/4, 3/4]:
     * out = 2/4 + 15/4 = 4.25, lse = ln 4. */
    double qkv[6] = {1, 0, 2, 1, log(3.0), 5}, ao[2], al[2];
    ref_attention_forward(ao, al, qkv, 1, 2, 1, 1);
    double want_ao[2] = {2, 4.25}, want_al[2] = {0, log(4.0)};
    check_close_f64("attention out", ao, want_ao, 2, 1e-14, 1e-14);
    check_close_f64("attention lse", al, want_al, 2, 1e-14, 1e-14);
    /* two heads of hs=2 (scale 1/sqrt 2): head 1 must read its own slices. Token 0 only. */
    double qkv2[12] = {0, 0, 1, 1, /* q */ 0, 0, 1, 1, /* k */ 7, 8, 9, 10 /* v */}, ao2[4], al2[2];
    ref_attention_forward(ao2, al2, qkv2, 1, 1, 4, 2);
    double want_ao2[4] = {7, 8, 9, 10}, want_al2[2] = {0, 2 / sqrt(2.0)};
    check_close_f64("attention 2-head out", ao2, want_ao2, 4, 1e-14, 1e-14);
    check_close_f64("attention 2-head lse", al2, want_al2, 2, 1e-14, 1e-14);

    /* encoder: token 1 at t=0, token 0 at t=1; C=2 */
    int32_t tok[2] = {1, 0};
    double wte[4] = {1, 2, 10, 20}, wpe[4] = {100, 200, 300, 400}, eo[4], want_e[4] = {110, 220, 301, 402};
    ref_encoder_forward(eo, tok, wte, wpe, 1, 2, 2);
    check_close_f64("encoder", eo, want_e, 4, 0, 0);

    double ra[2] = {1, 2}, rb[2] = {10, 20}, ro[2], want_r[2] = {11, 22};
    ref_residual_forward(ro, ra, rb, 2);
    check_close_f64("residual", ro, want_r, 2, 0, 0);
}

/* ---------------- encoder ---------------- */

typedef struct enc_ctx {
    shape s;
    int32_t *inp;
    double *wte, *wpe, *R, *out;
} enc_ctx;

static double enc_loss(void *p) {
    enc_ctx *c = p;
    ref_encoder_forward(c->out, c->inp, c->wte, c->wpe, c->s.B, c->s.T, c->s.C);
    return dot_f64(c->out, c->R, (size_t)c->s.B * c->s.T * c->s.C);
}

static void test_encoder(shape s) {
    size_t n = (size_t)s.B * s.T * s.C, nte = (size_t)s.V * s.C, npe = (size_t)s.T * s.C;
    enc_ctx c = {s, malloc((size_t)s.B * s.T * sizeof(int32_t)), randn(nte, 1, 0), randn(npe, 1, 0),
                 randn(n, 1, 0), alloc_f64(n)};
    /* token ids repeat (so dwte rows accumulate from several positions) */
    for (int i = 0; i < s.B * s.T; i++) c.inp[i] = (int32_t)(st_rng_u64(&rng) % (uint64_t)(s.V / 2 + 1));
    c.inp[s.B * s.T - 1] = c.inp[0];
    fill_nan(c.out, n);
    enc_loss(&c);
    CHECK(all_finite(c.out, n), "encoder forward left unwritten outputs");

    double *p_te = prefilled(nte), *p_pe = prefilled(npe);
    double *dwte = dup(p_te, nte), *dwpe = dup(p_pe, npe);
    ref_encoder_backward(dwte, dwpe, c.R, c.inp, s.B, s.T, s.C);
    subtract_prefill(dwte, p_te, nte);
    subtract_prefill(dwpe, p_pe, npe);

    double *num = alloc_f64(nte > npe ? nte : npe);
    numeric_grad(num, c.wte, nte, enc_loss, &c);
    check_grad("encoder dwte", dwte, num, nte);
    numeric_grad(num, c.wpe, npe, enc_loss, &c);
    check_grad("encoder dwpe", dwpe, num, npe);
    free(num), free(dwte), free(dwpe), free(p_te), free(p_pe);
    free(c.inp), free(c.wte), free(c.wpe), free(c.R), free(c.out);
}

/* ---------------- layernorm ---------------- */

typedef struct ln_ctx {
    int N, C;
    double *inp, *w, *b, *R, *out, *mean, *rstd;
} ln_ctx;

static double ln_loss(void *p) {
    ln_ctx *c = p;
    ref_layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C);
    return dot_f64(c->out, c->R, (size_t)c->N * c->C);
}

/* mutation_check: also prove on this op that the comparison can fail. */
static void test_layernorm(shape s, int mutation_check) {
    int N = s.B * s.T, C = s.C;
    size_t n = (size_t)N * C;
    ln_ctx c = {N, C, randn(n, 2.0, 0.5), randn(C, 0.5, 1.0), randn(C, 0.5, 0), randn(n, 1, 0),
                alloc_f64(n), alloc_f64(N), alloc_f64(N)};
    fill_nan(c.out, n);
    ln_loss(&c);
    CHECK(all_finite(c.out, n) && all_finite(c.mean, N) && all_finite(c.rstd, N), "layernorm forward unwritten");

    double *p_x = prefilled(n), *p_w = prefilled(C), *p_b = prefilled(C);
    double *dinp = dup(p_x, n), *dw = dup(p_w, C), *db = dup(p_b, C);
    ref_layernorm_backward(dinp, dw, db, c.R, c.inp, c.w, c.mean, c.rstd, N, C);
    subtract_prefill(dinp, p_x, n);
    subtract_prefill(dw, p_w, C);
    subtract_prefill(db, p_b, C);

    double *num = alloc_f64(n);
    numeric_grad(num, c.inp, n, ln_loss, &c);
    check_grad("layernorm dinp", dinp, num, n);
    if (mutation_check) {
        /* The comparison must be able to fail: nudge one analytic element by 100x the
         * tolerance and expect grad_excess to flag it (not counted as a failure). */
        size_t wi, k = n / 3;
        double maxabs = 0;
        for (size_t i = 0; i < n; i++) maxabs = fmax(maxabs, fabs(num[i]));
        double saved = dinp[k];
        dinp[k] += 100 * (FD_RTOL * maxabs + FD_ATOL);
        double ex = grad_excess(dinp, num, n, &wi);
        CHECK(ex > 0 && wi == k, "mutation sanity: a perturbed gradient passed (excess %g at %zu)", ex, wi);
        dinp[k] = saved;
        /* and a wrong formula, e.g. forgetting the mean-subtraction term, fails too */
        double *wrong = alloc_f64(n);
        for (int r = 0; r < N; r++)
            for (int j = 0; j < C; j++) wrong[(size_t)r * C + j] = c.rstd[r] * c.w[j] * c.R[(size_t)r * C + j];
        CHECK(grad_excess(wrong, num, n, &wi) > 0, "mutation sanity: a wrong layernorm backward passed");
        free(wrong);
    }
    numeric_grad(num, c.w, C, ln_loss, &c);
    check_grad("layernorm dw", dw, num, C);
    numeric_grad(num, c.b, C, ln_loss, &c);
    check_grad("layernorm db", db, num, C);
    free(num), free(dinp), free(dw), free(db), free(p_x), free(p_w), free(p_b);
    free(c.inp), free(c.w), free(c.b), free(c.R), free(c.out), free(c.mean), free(c.rstd);
}

/* ---------------- matmul ---------------- */

typedef struct mm_ctx {
    int N, C, OC;
    st_wlayout layout;
    double *inp, *w, *bias, *R, *out;
} mm_ctx;

static double mm_loss(void *p) {
    mm_ctx *c = p;
    ref_matmul_forward(c->out, c->inp, c->w, c->bias, c->N, c->C, c->OC, c->layout);
    return dot_f64(c->out, c->R, (size_t)c->N * c->OC);
}

static void test_matmul(int N, int C, int OC, st_wlayout layout, int with_bias) {
    size_t ni = (size_t)N * C, nw = (size_t)C * OC, no = (size_t)N * OC;
    mm_ctx c = {N, C, OC, layout, randn(ni, 1, 0), randn(nw, 0.3, 0), with_bias ? randn(OC, 1, 0) : NULL,
                randn(no, 1, 0), alloc_f64(no)};
    fill_nan(c.out, no);
    mm_loss(&c);
    CHECK(all_finite(c.out, no), "matmul forward unwritten");

    double *p_x = prefilled(ni), *p_w = prefilled(nw), *p_b = prefilled(OC);
    double *dinp = dup(p_x, ni), *dw = dup(p_w, nw), *db = dup(p_b, OC);
    ref_matmul_backward(dinp, dw, with_bias ? db : NULL, c.R, c.inp, c.w, N, C, OC, layout);
    subtract_prefill(dinp, p_x, ni);
    subtract_prefill(dw, p_w, nw);
    subtract_prefill(db, p_b, OC);

    char what[96];
    const char *lname = layout == ST_W_IN_OUT ? "in_out" : "out_in";
    double *num = alloc_f64(ni > nw ? ni : nw);
    numeric_grad(num, c.inp, ni, mm_loss, &c);
    snprintf(what, sizeof what, "matmul %s bias=%d dinp", lname, with_bias);
    check_grad(what, dinp, num, ni);
    numeric_grad(num, c.w, nw, mm_loss, &c);
    snprintf(what, sizeof what, "matmul %s bias=%d dw", lname, with_bias);
    check_grad(what, dw, num, nw);
    if (with_bias) {
        numeric_grad(num, c.bias, OC, mm_loss, &c);
        snprintf(what, sizeof what, "matmul %s dbias", lname);
        check_grad(what, db, num, OC);
    } else {
        int untouched = 1;
        for (int o = 0; o < OC; o++) untouched &= db[o] == 0;
        CHECK(untouched, "matmul: NULL dbias but the bias buffer changed");
    }

    /* NULL-able grads: dw alone, then dinp alone, equal the increments of the full call */
    double *dw_only = alloc_f64(nw), *dx_only = alloc_f64(ni);
    ref_matmul_backward(NULL, dw_only, NULL, c.R, c.inp, c.w, N, C, OC, layout);
    ref_matmul_backward(dx_only, NULL, NULL, c.R, c.inp, c.w, N, C, OC, layout);
    check_close_f64("matmul dw alone", dw_only, dw, nw, 1e-12, 1e-12);
    check_close_f64("matmul dinp alone", dx_only, dinp, ni, 1e-12, 1e-12);
    free(dw_only), free(dx_only);
    free(num), free(dinp), free(dw), free(db), free(p_x), free(p_w), free(p_b);
    free(c.inp), free(c.w), free(c.bias), free(c.R), free(c.out);
}

/* ---------------- attention ---------------- */

typedef struct att_ctx {
    shape s;
    double *qkv, *R, *out, *lse;
} att_ctx;

static double att_loss(void *p) {
    att_ctx *c = p;
    ref_attention_forward(c->out, c->lse, c->qkv, c->s.B, c->s.T, c->s.C, c->s.NH);
    return dot_f64(c->out, c->R, (size_t)c->s.B * c->s.T * c->s.C);
}

static void test_attention(shape s) {
    size_t n = (size_t)s.B * s.T * s.C, nl = (size_t)s.B * s.NH * s.T;
    att_ctx c = {s, randn(3 * n, 1.0, 0), randn(n, 1, 0), alloc_f64(n), alloc_f64(nl)};
    fill_nan(c.out, n);
    fill_nan(c.lse, nl);
    att_loss(&c);
    CHECK(all_finite(c.out, n) && all_finite(c.lse, nl), "attention forward unwritten");

    /* lse against a direct sum of exponentials (independent of the max-shift in the op) */
    int hs = s.C / s.NH;
    double max_lse_err = 0;
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.NH; h++)
            for (int t = 0; t < s.T; t++) {
                double sum = 0;
                for (int j = 0; j <= t; j++) {
                    double d = 0;
                    for (int k = 0; k < hs; k++)
                        d += c.qkv[((size_t)b * s.T + t) * 3 * s.C + h * hs + k] *
                             c.qkv[((size_t)b * s.T + j) * 3 * s.C + s.C + h * hs + k];
                    sum += exp(d / sqrt((double)hs));
                }
                max_lse_err = fmax(max_lse_err, fabs(log(sum) - c.lse[((size_t)b * s.NH + h) * s.T + t]));
            }
    CHECK(max_lse_err < 1e-12, "attention lse vs direct sum: err %g", max_lse_err);

    double *p_q = prefilled(3 * n), *dqkv = dup(p_q, 3 * n);
    ref_attention_backward(dqkv, c.R, c.qkv, c.out, c.lse, s.B, s.T, s.C, s.NH);
    subtract_prefill(dqkv, p_q, 3 * n);
    double *num = alloc_f64(3 * n);
    numeric_grad(num, c.qkv, 3 * n, att_loss, &c);
    char what[96];
    snprintf(what, sizeof what, "attention dqkv B=%d T=%d C=%d NH=%d", s.B, s.T, s.C, s.NH);
    check_grad(what, dqkv, num, 3 * n);
    free(num), free(dqkv), free(p_q);
    free(c.qkv), free(c.R), free(c.out), free(c.lse);
}

/* ---------------- gelu, residual ---------------- */

typedef struct ew_ctx {
    int n;
    double *a, *b, *R, *out;
} ew_ctx;

static double gelu_loss(void *p) {
    ew_ctx *c = p;
    ref_gelu_forward(c->out, c->a, c->n);
    return dot_f64(c->out, c->R, c->n);
}

static double residual_loss(void *p) {
    ew_ctx *c = p;
    ref_residual_forward(c->out, c->a, c->b, c->n);
    return dot_f64(c->out, c->R, c->n);
}

static void test_gelu(int n) {
    ew_ctx c = {n, randn(n, 2.0, 0), NULL, randn(n, 1, 0), alloc_f64(n)};
    c.a[0] = 0, c.a[1] = -4, c.a[2] = 4; /* the tails and the middle */
    double *p = prefilled(n), *dx = dup(p, n), *num = alloc_f64(n);
    ref_gelu_backward(dx, c.a, c.R, n);
    subtract_prefill(dx, p, n);
    numeric_grad(num, c.a, n, gelu_loss, &c);
    check_grad("gelu dinp", dx, num, n);
    free(p), free(dx), free(num), free(c.a), free(c.R), free(c.out);
}

static void test_residual(int n) {
    ew_ctx c = {n, randn(n, 1, 0), randn(n, 1, 0), randn(n, 1, 0), alloc_f64(n)};
    double *pa = prefilled(n), *pb = prefilled(n), *da = dup(pa, n), *db = dup(pb, n), *num = alloc_f64(n);
    ref_residual_backward(da, db, c.R, n);
    subtract_prefill(da, pa, n);
    subtract_prefill(db, pb, n);
    numeric_grad(num, c.a, n, residual_loss, &c);
    check_grad("residual da", da, num, n);
    numeric_grad(num, c.b, n, residual_loss, &c);
    check_grad("residual db", db, num, n);
    free(pa), free(pb), free(da), free(db), free(num), free(c.a), free(c.b), free(c.R), free(c.out);
}

/* ---------------- cross-entropy ---------------- */

typedef struct ce_ctx {
    int N, V;
    double *logits, *scratch, *losses;
    int32_t *targets;
} ce_ctx;

static double ce_loss(void *p) {
    ce_ctx *c = p;
    memcpy(c->scratch, c->logits, (size_t)c->N * c->V * sizeof(double));
    ref_crossentropy_forward_backward(c->scratch, c->losses, c->targets, c->N, c->V, 0.0);
    double s = 0;
    for (int i = 0; i < c->N; i++) s += c->losses[i];
    return s;
}

static void test_crossentropy(shape s) {
    int N = s.B * s.T, V = s.V;
    size_t nl = (size_t)N * V;
    ce_ctx c = {N, V, randn(nl, 2.0, 0), alloc_f64(nl), alloc_f64(N), malloc((size_t)N * sizeof(int32_t))};
    for (int i = 0; i < N; i++) c.targets[i] = (int32_t)(st_rng_u64(&rng) % (uint64_t)V);
    c.targets[1] = -1; /* masked */
    ce_loss(&c);
    CHECK(c.losses[1] == 0, "CE masked row loss %g", c.losses[1]);

    double *dl = dup(c.logits, nl), *num = alloc_f64(nl);
    double *losses1 = alloc_f64(N);
    ref_crossentropy_forward_backward(dl, losses1, c.targets, N, V, 1.0);
    check_close_f64("CE losses with dloss=1 equal dloss=0", losses1, c.losses, N, 0, 0);
    int masked_zero = 1;
    for (int v = 0; v < V; v++) masked_zero &= dl[(size_t)1 * V + v] == 0;
    CHECK(masked_zero, "CE masked row dlogits must be 0");
    numeric_grad(num, c.logits, nl, ce_loss, &c);
    check_grad("CE dlogits", dl, num, nl);

    /* dloss scales the gradient linearly */
    double *dl2 = dup(c.logits, nl);
    ref_crossentropy_forward_backward(dl2, losses1, c.targets, N, V, 0.25);
    for (size_t i = 0; i < nl; i++) dl[i] *= 0.25;
    check_close_f64("CE dloss scaling", dl2, dl, nl, 1e-15, 1e-13);
    free(dl), free(dl2), free(num), free(losses1);
    free(c.logits), free(c.scratch), free(c.losses), free(c.targets);
}

int main(void) {
    st_rng_seed(&rng, 20240607);
    test_forward_values();

    /* a power-of-two-ish shape, one with prime T and odd head size, and B=3 with one head */
    shape shapes[3] = {{2, 5, 8, 2, 11}, {1, 7, 15, 3, 13}, {3, 13, 6, 1, 7}};
    for (int i = 0; i < 3; i++) {
        shape s = shapes[i];
        test_encoder(s);
        test_layernorm(s, i == 0);
        test_attention(s);
        test_crossentropy(s);
        for (int layout = 0; layout < 2; layout++)
            for (int bias = 0; bias < 2; bias++) test_matmul(s.B * s.T, s.C, s.V, (st_wlayout)layout, bias);
        test_gelu(s.B * s.T * s.C);
        test_residual(s.B * s.T * s.C);
    }
    /* attention where T reaches a length with many masked pairs */
    test_attention((shape){1, 19, 10, 2, 0});
    return test_finish("ops_fd");
}
