/* test_poetx_fixture.c - one POET-X linear layer built from strata's ops against the fp64
 * PyTorch reference in tests/fixtures/poetx_linear.safetensors (written by
 * tools/gen_poetx_fixtures.py, which forms R W0 P densely from the papers' equations).
 *
 * The layer, per row x: u = P x (poet_apply_forward with G_in, perm_in), h = W0 u
 * (matmul_forward, W0 (d_out, d_in) as nn.Linear stores it), y = R h (poet_apply_forward
 * with G_out, perm_out); G_in, G_out = poet_cayley_forward of the packed q_in, q_out. The
 * backward from dy: poet_apply_backward (dh, dG_out), matmul_backward (du),
 * poet_apply_backward (dx, dG_in), poet_cayley_backward (dq_in, dq_out). The merged weight
 * R W0 P: the rows of W0 through P^T (trans 1) give W0 P, its transpose's rows through R
 * (trans 0) give (R W0 P)^T. Run on the cpu and the ref backends.
 *
 * Tolerances (fp32 ops vs the fp64 reference), those of test_gpt2_fixture.c with the
 * absolute part scaled by the tensor's largest value (these gradients reach 25):
 *   G, y, merged W   |d| <= 1e-5 max|ref| + 1e-4 |ref|
 *   gradients        |d| <= 1e-6 max|ref| + 1e-3 |ref|
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "strata/backend.h"
#include "strata/safetensors.h"
#include "testutil.h"

static float maxabs(const float *a, size_t n) {
    float m = 0;
    for (size_t i = 0; i < n; i++) m = fmaxf(m, fabsf(a[i]));
    return m;
}

static void cmp(const char *be, const char *what, const float *got, const float *want, size_t n, double atol,
                double rtol) {
    char w[128];
    snprintf(w, sizeof w, "%s: %s", be, what);
    check_close_f32(w, got, want, n, atol * maxabs(want, n), rtol);
}

typedef struct fixture {
    int b, k, N, din, dout;
    float *x, *W0, *q_in, *q_out, *dy, *G_in, *G_out, *y, *Wm, *gx, *gq_in, *gq_out;
    const int32_t *perm_in, *perm_out;
} fixture;

static float *dev(st_backend *be, const void *host, size_t bytes) {
    float *p = be->ops->alloc(be, bytes ? bytes : 1);
    if (p && host) be->ops->copy_to_device(be, p, host, bytes);
    return p;
}

static float *host(st_backend *be, const float *d, size_t n) {
    float *h = malloc(sizeof(float) * (n ? n : 1));
    be->ops->synchronize(be);
    be->ops->copy_to_host(be, h, d, sizeof(float) * n);
    return h;
}

static void run(st_backend *be, const fixture *f) {
    const char *nm = be->ops->name;
    int b = f->b, k = f->k, N = f->N, din = f->din, dout = f->dout, nbi = din / b, nbo = dout / b;
    size_t nq = (size_t)b * (b - 1) / 2, F = sizeof(float);
    float *q_in = dev(be, f->q_in, nbi * nq * F), *q_out = dev(be, f->q_out, nbo * nq * F);
    float *G_in = dev(be, NULL, (size_t)din * b * F), *G_out = dev(be, NULL, (size_t)dout * b * F);
    int32_t *p_in = (int32_t *)dev(be, f->perm_in, din * sizeof(int32_t));
    int32_t *p_out = (int32_t *)dev(be, f->perm_out, dout * sizeof(int32_t));
    float *x = dev(be, f->x, (size_t)N * din * F), *W0 = dev(be, f->W0, (size_t)dout * din * F);
    float *u = dev(be, NULL, (size_t)N * din * F), *h = dev(be, NULL, (size_t)N * dout * F);
    float *y = dev(be, NULL, (size_t)N * dout * F), *dy = dev(be, f->dy, (size_t)N * dout * F);
    float *dh = dev(be, NULL, (size_t)N * dout * F), *du = dev(be, NULL, (size_t)N * din * F);
    float *dx = dev(be, NULL, (size_t)N * din * F), *dG_in = dev(be, NULL, (size_t)din * b * F);
    float *dG_out = dev(be, NULL, (size_t)dout * b * F), *dq_in = dev(be, NULL, nbi * nq * F);
    float *dq_out = dev(be, NULL, nbo * nq * F);
    float *M = dev(be, NULL, (size_t)dout * din * F), *Mt = dev(be, NULL, (size_t)dout * din * F);
    if (!q_in || !q_out || !G_in || !G_out || !p_in || !p_out || !x || !W0 || !u || !h || !y || !dy || !dh || !du ||
        !dx || !dG_in || !dG_out || !dq_in || !dq_out || !M || !Mt) {
        CHECK(0, "%s: backend allocation failed", nm);
        return;
    }
    const st_backend_ops *o = be->ops;
    o->poet_cayley_forward(be, G_in, q_in, nbi, b, k);
    o->poet_cayley_forward(be, G_out, q_out, nbo, b, k);
    o->poet_apply_forward(be, u, x, G_in, p_in, N, din, b, 0);
    o->matmul_forward(be, h, u, W0, NULL, N, din, dout, ST_W_OUT_IN);
    o->poet_apply_forward(be, y, h, G_out, p_out, N, dout, b, 0);
    /* backward (the buffers are zeroed by alloc: the ops accumulate) */
    o->poet_apply_backward(be, dh, dG_out, dy, h, G_out, p_out, N, dout, b, 0);
    o->matmul_backward(be, du, NULL, NULL, dh, u, W0, N, din, dout, ST_W_OUT_IN);
    o->poet_apply_backward(be, dx, dG_in, du, x, G_in, p_in, N, din, b, 0);
    o->poet_cayley_backward(be, dq_in, dG_in, q_in, nbi, b, k);
    o->poet_cayley_backward(be, dq_out, dG_out, q_out, nbo, b, k);
    /* the merge: rows of W0 times P (= P^T applied to each row), then R from the left */
    o->poet_apply_forward(be, M, W0, G_in, p_in, dout, din, b, 1);
    float *Mh = host(be, M, (size_t)dout * din), *Mth = malloc(F * dout * din);
    for (int i = 0; i < dout; i++)
        for (int j = 0; j < din; j++) Mth[(size_t)j * dout + i] = Mh[(size_t)i * din + j];
    o->copy_to_device(be, Mt, Mth, F * dout * din);
    o->poet_apply_forward(be, Mt, Mt, G_out, p_out, din, dout, b, 0); /* in place */
    float *Wt = host(be, Mt, (size_t)dout * din), *Wm = malloc(F * dout * din);
    for (int i = 0; i < dout; i++)
        for (int j = 0; j < din; j++) Wm[(size_t)i * din + j] = Wt[(size_t)j * dout + i];

    float *hG_in = host(be, G_in, (size_t)din * b), *hG_out = host(be, G_out, (size_t)dout * b);
    float *hy = host(be, y, (size_t)N * dout), *hdx = host(be, dx, (size_t)N * din);
    float *hq_in = host(be, dq_in, nbi * nq), *hq_out = host(be, dq_out, nbo * nq);
    cmp(nm, "G_in", hG_in, f->G_in, (size_t)din * b, 1e-5, 1e-4);
    cmp(nm, "G_out", hG_out, f->G_out, (size_t)dout * b, 1e-5, 1e-4);
    cmp(nm, "y", hy, f->y, (size_t)N * dout, 1e-5, 1e-4);
    cmp(nm, "W_merged", Wm, f->Wm, (size_t)dout * din, 1e-5, 1e-4);
    cmp(nm, "grad.x", hdx, f->gx, (size_t)N * din, 1e-6, 1e-3);
    cmp(nm, "grad.q_in", hq_in, f->gq_in, nbi * nq, 1e-6, 1e-3);
    cmp(nm, "grad.q_out", hq_out, f->gq_out, nbo * nq, 1e-6, 1e-3);
    /* the merged weight gives the layer's y: x W_merged^T */
    float *y2 = malloc(F * N * dout);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < dout; i++) {
            double s = 0;
            for (int j = 0; j < din; j++) s += (double)f->x[(size_t)n * din + j] * Wm[(size_t)i * din + j];
            y2[(size_t)n * dout + i] = (float)s;
        }
    cmp(nm, "x W_merged^T = y", y2, f->y, (size_t)N * dout, 1e-5, 1e-4);
    free(Mh), free(Mth), free(Wt), free(Wm), free(hG_in), free(hG_out), free(hy), free(hdx), free(hq_in);
    free(hq_out), free(y2);
    float *all[] = {q_in, q_out, G_in, G_out, (float *)p_in, (float *)p_out, x, W0, u, h, y, dy, dh, du, dx, dG_in,
                    dG_out, dq_in, dq_out, M, Mt};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) o->dealloc(be, all[i]);
}

int main(void) {
    st_err err = {0};
    st_safetensors *fx;
    const char *path = test_source_path("tests/fixtures/poetx_linear.safetensors");
    if (st_safetensors_open(&fx, path, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    fixture f = {0};
    f.b = test_meta_int(fx, "b"), f.k = test_meta_int(fx, "k"), f.N = test_meta_int(fx, "N");
    f.din = test_meta_int(fx, "d_in"), f.dout = test_meta_int(fx, "d_out");
    CHECK(f.b > 1 && f.k >= 0 && f.N > 0 && f.din % f.b == 0 && f.dout % f.b == 0, "fixture metadata b=%d k=%d N=%d "
          "d_in=%d d_out=%d", f.b, f.k, f.N, f.din, f.dout);
    size_t nq = (size_t)f.b * (f.b - 1) / 2;
    f.x = test_read_f32(fx, "x", (size_t)f.N * f.din);
    f.W0 = test_read_f32(fx, "W0", (size_t)f.dout * f.din);
    f.q_in = test_read_f32(fx, "q_in", f.din / f.b * nq);
    f.q_out = test_read_f32(fx, "q_out", f.dout / f.b * nq);
    f.dy = test_read_f32(fx, "dy", (size_t)f.N * f.dout);
    f.G_in = test_read_f32(fx, "G_in", (size_t)f.din * f.b);
    f.G_out = test_read_f32(fx, "G_out", (size_t)f.dout * f.b);
    f.y = test_read_f32(fx, "y", (size_t)f.N * f.dout);
    f.Wm = test_read_f32(fx, "W_merged", (size_t)f.dout * f.din);
    f.gx = test_read_f32(fx, "grad.x", (size_t)f.N * f.din);
    f.gq_in = test_read_f32(fx, "grad.q_in", f.din / f.b * nq);
    f.gq_out = test_read_f32(fx, "grad.q_out", f.dout / f.b * nq);
    const st_tensor_entry *pi = st_safetensors_find(fx, "perm_in"), *po = st_safetensors_find(fx, "perm_out");
    CHECK(pi && po && pi->numel == (size_t)f.din && po->numel == (size_t)f.dout, "perm_in (%d), perm_out (%d) present",
          f.din, f.dout);
    if (!f.x || !f.W0 || !f.q_in || !f.q_out || !f.dy || !f.G_in || !f.G_out || !f.y || !f.Wm || !f.gx || !f.gq_in ||
        !f.gq_out || !pi || !po)
        return test_finish("poetx_fixture");
    f.perm_in = st_safetensors_data(fx, pi);
    f.perm_out = st_safetensors_data(fx, po);

    st_backend *cpu = NULL, *ref = NULL;
    if (st_backend_cpu_create(&cpu, 0, &err) || st_backend_ref_create(&ref, &err)) {
        fprintf(stderr, "poetx_fixture: %s\n", err.msg);
        return 1;
    }
    run(cpu, &f);
    run(ref, &f);
    st_backend_free(cpu), st_backend_free(ref);
    float *bufs[] = {f.x, f.W0, f.q_in, f.q_out, f.dy, f.G_in, f.G_out, f.y, f.Wm, f.gx, f.gq_in, f.gq_out};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    st_safetensors_close(fx);
    return test_finish("poetx_fixture");
}
