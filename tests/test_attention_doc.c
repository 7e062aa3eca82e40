/* test_attention_doc.c - attention restricted to documents (st_backend_ops
 * attention_doc_* and attention_gqa_doc_*), GPT-2's packed qkv and the Llama family's
 * grouped-query layout, over several document layouts (one document, many short ones,
 * documents of length 1, blocks of 64 queries cut by document ends):
 *   - the fp64 reference restricted to documents equals the causal reference run on each
 *     document alone (the definition: nothing crosses a boundary, positions restart);
 *   - its backward equals central finite differences of its forward;
 *   - the CPU backend equals the reference (forward, lse, backward with +=);
 *   - doc_start all 0 gives the causal ops' bits exactly.
 * With --bench B T C NH DOCS: times the causal and the document ops on the CPU backend
 * (DOCS equal documents a row), the number docs/ARCHITECTURE.md quotes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/ref/ops_ref.h"
#include "strata/backend.h"
#include "strata/core.h"
#include "testutil.h"

static st_rng rng;

static void *xmalloc(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "attention_doc: out of host memory\n");
        exit(1);
    }
    return p;
}

static float *randn(size_t n, float scale) {
    float *p = xmalloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = scale * st_rng_normal(&rng);
    return p;
}

static double *to_f64(const float *x, size_t n) {
    double *d = xmalloc(n * sizeof *d);
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

/* doc_start (B,T) from document lengths: lens[b] lists row b's lengths (summing to T). */
static int32_t *layout(int B, int T, const int *const *lens) {
    int32_t *ds = xmalloc(sizeof(int32_t) * (size_t)B * T);
    for (int b = 0; b < B; b++) {
        int t = 0;
        for (int k = 0; t < T; k++) {
            int n = lens[b][k];
            for (int i = 0; i < n && t < T; i++, t++) ds[(size_t)b * T + t] = t - i;
        }
    }
    return ds;
}

/* The attention of one layout in the grouped-query form (GPT-2: NKV == NH, ld 3C, the
 * packed op). x (B,T,ld) holds [q | k | v] per row; dout (B,T,NH*hs). */
typedef struct att_case {
    int B, T, NH, NKV, hs, ld, gpt2;
    const int32_t *ds;
    const float *x, *dout;
} att_case;

static void ref_fwd(const att_case *c, const double *x, const int32_t *ds, double *o, double *l) {
    int Q = c->NH * c->hs, K = c->NKV * c->hs;
    if (c->gpt2) ref_attention_doc_forward(o, l, x, ds, c->B, c->T, Q, c->NH);
    else ref_attention_gqa_doc_forward(o, l, x, x + Q, x + Q + K, ds, c->ld, c->B, c->T, c->NH, c->NKV, c->hs);
}

static void ref_bwd(const att_case *c, double *g, const double *d, const double *x, const double *o, const double *l) {
    int Q = c->NH * c->hs, K = c->NKV * c->hs;
    if (c->gpt2) ref_attention_doc_backward(g, d, x, o, l, c->ds, c->B, c->T, Q, c->NH);
    else ref_attention_gqa_doc_backward(g, g + Q, g + Q + K, d, x, x + Q, x + Q + K, o, l, c->ds, c->ld, c->B, c->T,
                                        c->NH, c->NKV, c->hs);
}

/* Each document alone through the causal reference (T = its length, positions from 0)
 * against the reference restricted to documents. */
static void check_per_document(const att_case *c, const char *tag) {
    int B = c->B, T = c->T, NH = c->NH, Q = NH * c->hs, K = c->NKV * c->hs, ld = c->ld;
    size_t nx = (size_t)B * T * ld, no = (size_t)B * T * Q, nl = (size_t)B * NH * T;
    double *x = to_f64(c->x, nx), *d = to_f64(c->dout, no);
    double *o = xmalloc(no * 8), *l = xmalloc(nl * 8), *g = xmalloc(nx * 8);
    double *o1 = xmalloc(no * 8), *l1 = xmalloc(nl * 8), *g1 = xmalloc(nx * 8);
    ref_fwd(c, x, c->ds, o, l);
    ref_bwd(c, g, d, x, o, l);
    double *so = xmalloc(no * 8), *sl = xmalloc(nl * 8);
    for (int b = 0; b < B; b++)
        for (int a = 0, e; a < T; a = e) {
            for (e = a + 1; e < T && c->ds[(size_t)b * T + e] == a;) e++;
            int n = e - a;
            size_t r0 = (size_t)b * T + a;
            const double *xs = x + r0 * ld;
            if (c->gpt2) {
                ref_attention_forward(so, sl, xs, 1, n, Q, NH);
                ref_attention_backward(g1 + r0 * ld, d + r0 * Q, xs, so, sl, 1, n, Q, NH);
            } else {
                ref_attention_gqa_forward(so, sl, xs, xs + Q, xs + Q + K, ld, 1, n, NH, c->NKV, c->hs);
                ref_attention_gqa_backward(g1 + r0 * ld, g1 + r0 * ld + Q, g1 + r0 * ld + Q + K, d + r0 * Q, xs,
                                           xs + Q, xs + Q + K, so, sl, ld, 1, n, NH, c->NKV, c->hs);
            }
            memcpy(o1 + r0 * Q, so, sizeof(double) * n * Q);
            for (int h = 0; h < NH; h++) memcpy(l1 + ((size_t)b * NH + h) * T + a, sl + (size_t)h * n, sizeof(double) * n);
        }
    char w[320];
    snprintf(w, sizeof w, "%s: reference out = each document alone", tag);
    check_close_f64(w, o, o1, no, 1e-12, 1e-12);
    snprintf(w, sizeof w, "%s: reference lse = each document alone", tag);
    check_close_f64(w, l, l1, nl, 1e-12, 1e-12);
    snprintf(w, sizeof w, "%s: reference backward = each document alone", tag);
    check_close_f64(w, g, g1, nx, 1e-12, 1e-12);
    free(x), free(d), free(o), free(l), free(g), free(o1), free(l1), free(g1), free(so), free(sl);
}

/* The reference backward against central differences of loss = sum(out * dout) over
 * every input element (small shapes only). */
static void check_fd(const att_case *c, const char *tag) {
    int B = c->B, T = c->T, NH = c->NH, Q = NH * c->hs;
    size_t nx = (size_t)B * T * c->ld, no = (size_t)B * T * Q, nl = (size_t)B * NH * T;
    double *x = to_f64(c->x, nx), *d = to_f64(c->dout, no);
    double *o = xmalloc(no * 8), *l = xmalloc(nl * 8), *g = xmalloc(nx * 8), *fd = xmalloc(nx * 8);
    ref_fwd(c, x, c->ds, o, l);
    ref_bwd(c, g, d, x, o, l);
    const double h = 1e-5;
    for (size_t i = 0; i < nx; i++) {
        double keep = x[i], lp = 0, lm = 0;
        x[i] = keep + h;
        ref_fwd(c, x, c->ds, o, l);
        for (size_t j = 0; j < no; j++) lp += o[j] * d[j];
        x[i] = keep - h;
        ref_fwd(c, x, c->ds, o, l);
        for (size_t j = 0; j < no; j++) lm += o[j] * d[j];
        x[i] = keep;
        fd[i] = (lp - lm) / (2 * h);
    }
    char w[320];
    snprintf(w, sizeof w, "%s: reference backward = finite differences", tag);
    check_close_f64(w, g, fd, nx, 1e-7, 1e-6);
    free(x), free(d), free(o), free(l), free(g), free(fd);
}

/* The CPU backend (threads) against the reference backend, the gradient prefilled to
 * check +=; and with doc_start all 0 against the CPU's own causal op, bit for bit. */
static void check_cpu(st_backend *cpu, st_backend *ref, const att_case *c, const char *tag) {
    int B = c->B, T = c->T, NH = c->NH, NKV = c->NKV, hs = c->hs, ld = c->ld, Q = NH * hs, K = NKV * hs;
    size_t nx = (size_t)B * T * ld, no = (size_t)B * T * Q, nl = (size_t)B * NH * T;
    float *g0 = randn(nx, 1);
    float *res[2][3];
    st_backend *bes[2] = {cpu, ref};
    for (int k = 0; k < 2; k++) {
        st_backend *be = bes[k];
        float *o = xmalloc(no * 4), *l = xmalloc(nl * 4), *g = xmalloc(nx * 4);
        memcpy(g, g0, nx * 4);
        if (c->gpt2) {
            be->ops->attention_doc_forward(be, o, l, c->x, c->ds, B, T, Q, NH);
            be->ops->attention_doc_backward(be, g, c->dout, c->x, o, l, c->ds, B, T, Q, NH);
        } else {
            be->ops->attention_gqa_doc_forward(be, o, l, c->x, c->x + Q, c->x + Q + K, c->ds, ld, B, T, NH, NKV, hs);
            be->ops->attention_gqa_doc_backward(be, g, g + Q, g + Q + K, c->dout, c->x, c->x + Q, c->x + Q + K, o, l,
                                                c->ds, ld, B, T, NH, NKV, hs);
        }
        res[k][0] = o, res[k][1] = l, res[k][2] = g;
    }
    char w[320];
    const char *part[3] = {"out", "lse", "backward (+=)"};
    size_t n[3] = {no, nl, nx};
    for (int i = 0; i < 3; i++) {
        double mx = 0;
        for (size_t j = 0; j < n[i]; j++) mx = fmax(mx, fabs(res[1][i][j]));
        snprintf(w, sizeof w, "%s: cpu %s = reference", tag, part[i]);
        check_close_f32(w, res[0][i], res[1][i], n[i], 3e-5 * (mx > 0 ? mx : 1), 3e-4); /* test_ops_diff's */
    }
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 3; i++) free(res[k][i]);
    /* doc_start all 0: the causal op's bits */
    int32_t *zero = xmalloc(sizeof(int32_t) * (size_t)B * T);
    float *o[2], *l[2], *g[2];
    for (int k = 0; k < 2; k++) {
        o[k] = xmalloc(no * 4), l[k] = xmalloc(nl * 4), g[k] = xmalloc(nx * 4);
        memcpy(g[k], g0, nx * 4);
        if (c->gpt2 && k == 0) {
            cpu->ops->attention_forward(cpu, o[k], l[k], c->x, B, T, Q, NH);
            cpu->ops->attention_backward(cpu, g[k], c->dout, c->x, o[k], l[k], B, T, Q, NH);
        } else if (c->gpt2) {
            cpu->ops->attention_doc_forward(cpu, o[k], l[k], c->x, zero, B, T, Q, NH);
            cpu->ops->attention_doc_backward(cpu, g[k], c->dout, c->x, o[k], l[k], zero, B, T, Q, NH);
        } else if (k == 0) {
            cpu->ops->attention_gqa_forward(cpu, o[k], l[k], c->x, c->x + Q, c->x + Q + K, ld, B, T, NH, NKV, hs);
            cpu->ops->attention_gqa_backward(cpu, g[k], g[k] + Q, g[k] + Q + K, c->dout, c->x, c->x + Q, c->x + Q + K,
                                             o[k], l[k], ld, B, T, NH, NKV, hs);
        } else {
            cpu->ops->attention_gqa_doc_forward(cpu, o[k], l[k], c->x, c->x + Q, c->x + Q + K, zero, ld, B, T, NH, NKV,
                                                hs);
            cpu->ops->attention_gqa_doc_backward(cpu, g[k], g[k] + Q, g[k] + Q + K, c->dout, c->x, c->x + Q,
                                                 c->x + Q + K, o[k], l[k], zero, ld, B, T, NH, NKV, hs);
        }
    }
    CHECK(!memcmp(o[0], o[1], no * 4) && !memcmp(l[0], l[1], nl * 4) && !memcmp(g[0], g[1], nx * 4),
          "%s: doc_start all 0 differs from the causal op's bits", tag);
    for (int k = 0; k < 2; k++) free(o[k]), free(l[k]), free(g[k]);
    free(zero), free(g0);
}

static void run_case(st_backend *cpu, st_backend *ref, int gpt2, int B, int T, int NH, int NKV, int hs,
                     const int *const *lens, const char *name, int fd) {
    att_case c = {B, T, NH, gpt2 ? NH : NKV, hs, 0, gpt2, NULL, NULL, NULL};
    c.ld = (NH + 2 * c.NKV) * hs;
    int32_t *ds = layout(B, T, lens);
    float *x = randn((size_t)B * T * c.ld, 1), *d = randn((size_t)B * T * NH * hs, 1);
    for (size_t r = 0; r < (size_t)B * T; r++) /* peaked and flat softmax rows both */
        for (int i = 0; i < (NH + c.NKV) * hs; i++) x[r * c.ld + i] *= 1.7f;
    c.ds = ds, c.x = x, c.dout = d;
    char tag[160];
    snprintf(tag, sizeof tag, "%s %s B=%d T=%d NH=%d NKV=%d hs=%d", gpt2 ? "attention_doc" : "attention_gqa_doc", name,
             B, T, NH, c.NKV, hs);
    check_per_document(&c, tag);
    if (fd) check_fd(&c, tag);
    check_cpu(cpu, ref, &c, tag);
    free(ds), free(x), free(d);
}

static double now_s(void) { return st_now(); }

static int bench(st_backend *cpu, int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: test_attention_doc --bench B T C NH DOCS\n");
        return 2;
    }
    int B = atoi(argv[2]), T = atoi(argv[3]), C = atoi(argv[4]), NH = atoi(argv[5]), D = atoi(argv[6]);
    size_t nx = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *x = randn(nx, 1), *d = randn(no, 1), *o = xmalloc(no * 4), *l = xmalloc(nl * 4), *g = xmalloc(nx * 4);
    int32_t *ds = xmalloc(sizeof(int32_t) * (size_t)B * T);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) ds[(size_t)b * T + t] = t / ((T + D - 1) / D) * ((T + D - 1) / D);
    double best[3][2];
    for (int mode = 0; mode < 3; mode++) { /* causal, doc_start all 0, DOCS documents */
        best[mode][0] = best[mode][1] = 1e30;
        int32_t *zero = xmalloc(sizeof(int32_t) * (size_t)B * T), *use = mode == 1 ? zero : ds;
        for (int rep = 0; rep < 3; rep++) {
            double t0 = now_s();
            if (mode == 0) cpu->ops->attention_forward(cpu, o, l, x, B, T, C, NH);
            else cpu->ops->attention_doc_forward(cpu, o, l, x, use, B, T, C, NH);
            double t1 = now_s();
            if (mode == 0) cpu->ops->attention_backward(cpu, g, d, x, o, l, B, T, C, NH);
            else cpu->ops->attention_doc_backward(cpu, g, d, x, o, l, use, B, T, C, NH);
            double t2 = now_s();
            best[mode][0] = fmin(best[mode][0], t1 - t0);
            best[mode][1] = fmin(best[mode][1], t2 - t1);
        }
        free(zero);
    }
    printf("B=%d T=%d C=%d NH=%d, best of 3 (ms): causal fwd %.2f bwd %.2f | doc, one document fwd %.2f bwd %.2f | "
           "doc, %d documents fwd %.2f bwd %.2f\n", B, T, C, NH, best[0][0] * 1e3, best[0][1] * 1e3,
           best[1][0] * 1e3, best[1][1] * 1e3, D, best[2][0] * 1e3, best[2][1] * 1e3);
    free(x), free(d), free(o), free(l), free(g), free(ds);
    return 0;
}

int main(int argc, char **argv) {
    st_err err = {0};
    st_backend *cpu = NULL, *ref = NULL;
    if (st_backend_cpu_create(&cpu, 2, &err) || st_backend_ref_create(&ref, &err)) {
        fprintf(stderr, "attention_doc: %s\n", err.msg);
        return 1;
    }
    st_rng_seed(&rng, 20261201);
    if (argc > 1 && !strcmp(argv[1], "--bench")) {
        int rc = bench(cpu, argc, argv);
        st_backend_free(cpu), st_backend_free(ref);
        return rc;
    }
    /* layouts: row lengths summing to T */
    static const int one150[] = {150}, many150[] = {3, 1, 7, 20, 1, 1, 30, 12, 5, 40, 30};
    static const int blk150[] = {1, 63, 2, 70, 13, 1}, ones8[] = {1, 1, 1, 1, 1, 1, 1, 1};
    static const int fd7a[] = {3, 1, 3}, fd7b[] = {1, 6};
    const int *one[] = {one150, one150}, *mixed[] = {many150, blk150}, *blk[] = {blk150};
    const int *all1[] = {ones8, ones8}, *fda[] = {fd7a, fd7b};
    for (int gpt2 = 1; gpt2 >= 0; gpt2--) {
        /* small shapes: every input element through finite differences */
        run_case(cpu, ref, gpt2, 2, 7, 2, 1, 4, fda, "fd layout", 1);
        run_case(cpu, ref, gpt2, 2, 8, 4, 2, 4, all1, "documents of length 1", 1);
        run_case(cpu, ref, gpt2, 2, 150, 4, 2, 16, one, "one document", 0);
        run_case(cpu, ref, gpt2, 2, 150, 4, 2, 16, mixed, "many documents", 0);
    }
    /* grouped-query ratios, and B * NKV too small for the threads (the scratch path) */
    run_case(cpu, ref, 0, 2, 150, 4, 4, 8, mixed, "many documents", 0);
    run_case(cpu, ref, 0, 2, 150, 6, 1, 8, mixed, "many documents", 0);
    run_case(cpu, ref, 0, 1, 150, 4, 1, 16, blk, "blocks cut by documents", 0);
    run_case(cpu, ref, 0, 1, 150, 4, 2, 16, blk, "blocks cut by documents", 0);
    st_backend_free(cpu);
    st_backend_free(ref);
    return test_finish("attention_doc");
}
