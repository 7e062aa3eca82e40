/* test_poetx_init.c - st_poetx_orthogonal_w0 (key poetx_init orthogonal) against fp64 loops:
 * for wide, tall and square weights every singular value equals gain x the RMS singular value of
 * the weight given (W W^T or W^T W = s^2 I to 1e-5 of s^2), the same seed gives the same bits and
 * another seed another matrix, a bad gain is refused naming the key; over a model
 * (st_poetx_orthogonal_base), its parts (as ranks draw them) put together give the whole's bits,
 * each part changing only its own weights. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/backend.h"
#include "strata/poetx.h"

static int fails;
#define CHECK(c, ...)                                  \
    do {                                               \
        if (!(c)) {                                    \
            fprintf(stderr, "FAIL: " __VA_ARGS__);     \
            fprintf(stderr, "\n");                     \
            fails++;                                   \
        }                                              \
    } while (0)

static void one(int rows, int cols, float gain) {
    size_t n = (size_t)rows * cols;
    float *w = malloc(n * sizeof *w), *w2 = malloc(n * sizeof *w2), *w3 = malloc(n * sizeof *w3);
    st_rng r;
    st_rng_seed(&r, 7);
    double ss = 0;
    for (size_t i = 0; i < n; i++) {
        w[i] = 0.02f * st_rng_normal(&r);
        ss += (double)w[i] * w[i];
    }
    memcpy(w2, w, n * sizeof *w);
    memcpy(w3, w, n * sizeof *w);
    int N = rows < cols ? rows : cols;
    double s = gain * sqrt(ss / N);
    st_err err = {0};
    CHECK(!st_poetx_orthogonal_w0(w, rows, cols, gain, 11, "w", &err), "%d x %d: %s", rows, cols, err.msg);
    CHECK(!st_poetx_orthogonal_w0(w2, rows, cols, gain, 11, "w", &err), "%d x %d: %s", rows, cols, err.msg);
    CHECK(!st_poetx_orthogonal_w0(w3, rows, cols, gain, 12, "w", &err), "%d x %d: %s", rows, cols, err.msg);
    CHECK(!memcmp(w, w2, n * sizeof *w), "%d x %d: the same seed gave other bits", rows, cols);
    CHECK(memcmp(w, w3, n * sizeof *w), "%d x %d: another seed gave the same matrix", rows, cols);
    /* the Gram matrix over the shorter side: rows <= cols: W W^T (rows x rows), else W^T W */
    double worst = 0;
    for (int a = 0; a < N; a++)
        for (int b = 0; b < N; b++) {
            double g = 0;
            if (rows <= cols)
                for (int k = 0; k < cols; k++) g += (double)w[(size_t)a * cols + k] * w[(size_t)b * cols + k];
            else
                for (int k = 0; k < rows; k++) g += (double)w[(size_t)k * cols + a] * w[(size_t)k * cols + b];
            double e = fabs(g - (a == b ? s * s : 0.0)) / (s * s);
            if (e > worst) worst = e;
        }
    printf("%4d x %-4d gain %.1f: s %.6f, max |Gram - s^2 I| / s^2 = %.2e\n", rows, cols, gain, s, worst);
    CHECK(worst < 1e-5, "%d x %d: Gram matrix off s^2 I by %.3e of s^2", rows, cols, worst);
    free(w), free(w2), free(w3);
}

int main(void) {
    one(8, 24, 1.0f);
    one(24, 8, 2.0f);
    one(16, 16, 2.0f);
    one(128, 384, 2.0f);
    one(512, 128, 3.0f);
    /* the same bits on one thread as on several (a run's ranks may have other thread counts) */
    {
        size_t n = (size_t)768 * 256;
        float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
        for (size_t i = 0; i < n; i++) a[i] = b[i] = 0.02f * (float)((i * 2654435761u) % 1000) / 1000.0f;
        st_err e = {0};
        int nt = omp_get_max_threads();
        omp_set_num_threads(1);
        CHECK(!st_poetx_orthogonal_w0(a, 768, 256, 2.0f, 5, "w", &e), "%s", e.msg);
        omp_set_num_threads(nt > 1 ? nt : 2);
        CHECK(!st_poetx_orthogonal_w0(b, 768, 256, 2.0f, 5, "w", &e), "%s", e.msg);
        CHECK(!memcmp(a, b, n * sizeof *a), "768 x 256: other bits on 1 thread than on %d", nt > 1 ? nt : 2);
        CHECK(omp_get_max_threads() == (nt > 1 ? nt : 2), "the thread count not restored (%d)", omp_get_max_threads());
        omp_set_num_threads(nt);
        free(a), free(b);
    }
    /* the parts of a model's W0 (ranks draw one each) against the whole, on llama-tiny (separate
     * q, k, v, o, gate, up, down: 14 weights) */
    {
        st_err e = {0};
        st_backend *be = NULL;
        st_model *whole = NULL, *parts = NULL, *init = NULL;
        CHECK(!st_backend_cpu_create(&be, 0, &e), "%s", e.msg);
        CHECK(be && !st_model_create(&whole, "llama-tiny", NULL, be, &e) &&
                  !st_model_create(&parts, "llama-tiny", NULL, be, &e) &&
                  !st_model_create(&init, "llama-tiny", NULL, be, &e),
              "%s", e.msg);
        if (whole && parts && init) {
            whole->ops->init_random(whole, 3), parts->ops->init_random(parts, 3), init->ops->init_random(init, 3);
            int n = st_poetx_init_weights(whole, NULL);
            CHECK(n == 14, "llama-tiny: %d weights walked, not 14", n);
            const st_param_info **t = malloc((size_t)n * sizeof *t);
            st_poetx_init_weights(whole, t);
            CHECK(!st_poetx_orthogonal_base(whole, 2.0f, 9, &e), "%s", e.msg);
            for (int part = 0; part < 3; part++) {
                CHECK(!st_poetx_orthogonal_base_part(parts, 2.0f, 9, part, 3, &e), "%s", e.msg);
                for (int k = 0; k < n; k++) { /* drawn so far: parts 0..part */
                    size_t bytes = t[k]->numel * sizeof(float);
                    const float *got = parts->params + t[k]->offset;
                    const float *want = (k % 3 <= part ? whole : init)->params + t[k]->offset;
                    CHECK(!memcmp(got, want, bytes), "after part %d of 3: %s is not %s", part, t[k]->name,
                          k % 3 <= part ? "the whole's draw" : "as initialised");
                }
            }
            CHECK(!memcmp(parts->params, whole->params, whole->n_params * sizeof(float)),
                  "the three parts together differ from the whole");
            st_status rs = st_poetx_orthogonal_base_part(parts, 2.0f, 9, 3, 3, &e);
            CHECK(rs == ST_ERR_INVALID, "part 3 of 3: status %d", (int)rs);
            free(t);
        }
        st_model_free(whole), st_model_free(parts), st_model_free(init);
        st_backend_free(be);
    }
    float w[6] = {1, 2, 3, 4, 5, 6};
    st_err err = {0};
    st_status s = st_poetx_orthogonal_w0(w, 2, 3, 0.0f, 1, "h.0.attn.c_attn.weight", &err);
    CHECK(s == ST_ERR_INVALID && strstr(err.msg, "poetx_init_gain") && strstr(err.msg, "c_attn"),
          "gain 0: status %d, '%s'", (int)s, err.msg);
    CHECK(w[0] == 1 && w[5] == 6, "a refused call changed the weight");
    if (fails) return 1;
    printf("poetx_init: ok\n");
    return 0;
}
