/* testutil.c - shared helpers for the C tests. */
#include "testutil.h"

#include "strata/backend.h"
#include "strata/model.h"
#include "strata/safetensors.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int test_failures = 0;
int test_checks = 0;
static char tmpdir[256];

static int close_report(const char *what, size_t n, size_t worst_i, double worst_excess, double a,
                        double b, double atol, double rtol) {
    test_checks++;
    if (worst_excess > 0) {
        test_failures++;
        fprintf(stderr, "FAIL %s: %zu elements, worst [%zu]: got %.9g want %.9g (atol %g rtol %g)\n", what,
                n, worst_i, a, b, atol, rtol);
        return 0;
    }
    return 1;
}

#define CLOSE_BODY                                                                 \
    size_t worst_i = 0;                                                            \
    double worst = -1;                                                             \
    for (size_t i = 0; i < n; i++) {                                               \
        double d = fabs((double)a[i] - (double)b[i]), lim = atol + rtol * fabs((double)b[i]); \
        double ex = (d != d) ? INFINITY : d - lim;                                 \
        if (ex > worst) { worst = ex; worst_i = i; }                               \
    }                                                                              \
    return close_report(what, n, worst_i, worst, n ? a[worst_i] : 0, n ? b[worst_i] : 0, atol, rtol);

int check_close_f32(const char *what, const float *a, const float *b, size_t n, double atol, double rtol) {
    CLOSE_BODY
}
int check_close_f64(const char *what, const double *a, const double *b, size_t n, double atol, double rtol) {
    CLOSE_BODY
}

const char *test_source_path(const char *rel) {
    static char buf[4096];
    const char *root = getenv("STRATA_SOURCE_DIR");
    snprintf(buf, sizeof buf, "%s/%s", root ? root : ".", rel);
    return buf;
}

const char *test_tmpdir(void) {
    if (!tmpdir[0]) {
        strcpy(tmpdir, "/tmp/strata-test-XXXXXX");
        if (!mkdtemp(tmpdir)) { perror("mkdtemp"); exit(1); }
    }
    return tmpdir;
}

int test_finish(const char *name) {
    if (tmpdir[0] && test_failures == 0) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", tmpdir);
    }
    printf("%s: %d checks, %d passed, %d failed\n", name, test_checks, test_checks - test_failures,
           test_failures);
    return test_failures ? 1 : 0;
}

int test_meta_int(struct st_safetensors *st, const char *key) {
    const char *v = st_safetensors_meta(st, key);
    return v ? atoi(v) : -1;
}

float *test_read_f32(struct st_safetensors *st, const char *name, size_t n) {
    float *buf = malloc(n * sizeof(float));
    st_err err = {0};
    if (!buf || st_safetensors_read_f32(st, name, buf, n, NULL, 0, &err) != ST_OK) {
        fprintf(stderr, "%s\n", buf ? err.msg : "out of memory");
        free(buf);
        return NULL;
    }
    return buf;
}

unsigned char *test_slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n ? *n : 1);
    if (b && fread(b, 1, *n, f) != *n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    return b;
}

int test_same_file(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    unsigned char *x = test_slurp(a, &na), *y = test_slurp(b, &nb);
    int same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

int test_load_params(struct st_safetensors *fx, const struct st_param_info *t, int n, size_t n_params,
                     struct st_backend *be, float *params, struct st_err *err) {
    float *host = malloc(n_params * sizeof(float));
    if (!host) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    st_status s = ST_OK;
    for (int i = 0; i < n && !s; i++) {
        int64_t shape[2] = {t[i].shape[0], t[i].shape[1]};
        s = st_safetensors_read_f32(fx, t[i].name, host + t[i].offset, t[i].numel, shape, t[i].ndim, err);
    }
    if (!s) be->ops->copy_to_device(be, params, host, n_params * sizeof(float));
    free(host);
    return s;
}

int32_t *test_random_perm(st_rng *r, int d) {
    int32_t *p = malloc(sizeof(int32_t) * (size_t)(d > 0 ? d : 1));
    if (!p) {
        fprintf(stderr, "test_random_perm: out of memory\n");
        exit(1);
    }
    for (int i = 0; i < d; i++) p[i] = i;
    for (int i = d - 1; i > 0; i--) {
        int j = (int)(st_rng_u64(r) % (uint64_t)(i + 1));
        int32_t t = p[i];
        p[i] = p[j], p[j] = t;
    }
    return p;
}
