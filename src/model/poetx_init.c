/* poetx_init.c - W0 with a flat spectrum for a POET-X run from scratch (strata/poetx.h's
 * st_poetx_orthogonal_w0).
 *
 * POET-X never changes a weight's singular values: W = R W0 P keeps W0's. From a Gaussian
 * initialisation they stay spread as the Marchenko-Pastur law spreads them, at the size the
 * initialisation's standard deviation gives, for the whole run. This gives W0 one singular value
 * for all, s = gain x the RMS singular value of the weight as initialised (its Frobenius norm over
 * sqrt(min(rows, cols))), in a random orientation: the Q factor of a Householder QR of a Gaussian
 * matrix, each column's sign that of R's diagonal entry, which is Haar distributed (Mezzadri
 * 2007). LAPACK's dgeqrf and dorgqr (OpenBLAS carries them) in fp64 on one thread, so that the bits
 * do not depend on the thread count (ranks of one run may have other counts than one process),
 * rounded to fp32 once. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "strata/poetx.h"
#include "model/frozen_base_internal.h"

/* LAPACK (Fortran calling convention), from the OpenBLAS the library links */
extern void dgeqrf_(const int *m, const int *n, double *a, const int *lda, double *tau, double *work, const int *lwork,
                    int *info);
extern void dorgqr_(const int *m, const int *n, const int *k, double *a, const int *lda, const double *tau,
                    double *work, const int *lwork, int *info);

st_status st_poetx_orthogonal_w0(float *w, int rows, int cols, float gain, uint64_t seed, const char *name,
                                 st_err *err) {
    const int M = rows > cols ? rows : cols, N = rows > cols ? cols : rows;
    if (rows <= 0 || cols <= 0)
        return st_errf(err, ST_ERR_SHAPE, "poetx_init orthogonal: %s is %d x %d, not a matrix", name, rows, cols);
    if (!(gain > 0.0f) || !isfinite(gain))
        return st_errf(err, ST_ERR_INVALID, "key 'poetx_init_gain': %g for %s (%d x %d): give a positive gain",
                       (double)gain, name, rows, cols);
    double ss = 0.0;
    for (size_t i = 0; i < (size_t)rows * cols; i++) ss += (double)w[i] * w[i];
    const double s = gain * sqrt(ss / N);
    double *a = malloc((size_t)M * N * sizeof(double)), *tau = malloc((size_t)N * sizeof(double)), *sign = NULL,
           *work = NULL, q = 0.0;
    int info = 0, lwork = -1;
    if (a && tau) sign = malloc((size_t)N * sizeof(double));
    if (!a || !tau || !sign) {
        free(a), free(tau), free(sign);
        return st_errf(err, ST_ERR_NOMEM, "poetx_init orthogonal: out of memory for %s (%d x %d, %zu bytes)", name,
                       rows, cols, (size_t)M * N * sizeof(double));
    }
    st_rng r;
    st_rng_seed(&r, seed);
    for (size_t i = 0; i < (size_t)M * N; i++) a[i] = st_rng_normal(&r);
    /* one thread (OpenBLAS's OpenMP build also sets OpenMP's count: both restored after); inside
     * a parallel region (st_poetx_orthogonal_base's) OpenBLAS runs on the calling thread alone */
    const int nested = omp_in_parallel();
    const int blas_threads = nested ? 0 : openblas_get_num_threads(), omp_threads = nested ? 0 : omp_get_max_threads();
    if (!nested) openblas_set_num_threads(1);
    dgeqrf_(&M, &N, a, &M, tau, &q, &lwork, &info); /* the workspace it wants */
    lwork = info ? 0 : (int)q;
    if (lwork < N) lwork = N;
    work = malloc((size_t)lwork * sizeof(double));
    if (work) dgeqrf_(&M, &N, a, &M, tau, work, &lwork, &info);
    for (int j = 0; work && !info && j < N; j++) sign[j] = a[j + (size_t)j * M] < 0.0 ? -1.0 : 1.0;
    if (work && !info) {
        int wl = -1;
        dorgqr_(&M, &N, &N, a, &M, tau, &q, &wl, &info);
        if (!info && (int)q > lwork) {
            double *w2 = realloc(work, (size_t)q * sizeof(double));
            if (w2) work = w2, lwork = (int)q;
        }
        if (!info) dorgqr_(&M, &N, &N, a, &M, tau, work, &lwork, &info);
    }
    if (!nested) {
        openblas_set_num_threads(blas_threads);
        omp_set_num_threads(omp_threads);
    }
    st_status st = ST_OK;
    if (!work) st = st_errf(err, ST_ERR_NOMEM, "poetx_init orthogonal: out of memory for %s's QR workspace", name);
    else if (info) st = st_errf(err, ST_ERR_INVALID, "poetx_init orthogonal: LAPACK's QR of %s (%d x %d) said %d",
                                name, rows, cols, info);
    else /* Q (M x N, column-major, orthonormal columns); W = s Q (rows >= cols) or s Q^T, row-major */
        for (int i = 0; i < rows; i++)
            for (int j = 0; j < cols; j++) {
                size_t k = rows >= cols ? (size_t)i + (size_t)j * M : (size_t)j + (size_t)i * M;
                int col = rows >= cols ? j : i;
                w[(size_t)i * cols + j] = (float)(s * sign[col] * a[k]);
            }
    free(a), free(tau), free(sign), free(work);
    return st;
}

/* each weight its own stream of the seed: (seed, its place k >= 1 in the table's walk) */
static uint64_t weight_seed(uint64_t seed, int k) {
    return seed * 0x9E3779B97F4A7C15ull + 0xD1B54A32D192ED03ull * (uint64_t)k;
}

int st_poetx_init_weights(const st_model *base, const st_param_info **out) {
    const int gpt2 = !strcmp(base->ops->arch, "gpt2");
    int cursor = 0, n = 0;
    frozen_site site;
    while (frozen_base_next_site(base->tensors, base->n_tensors, gpt2, &cursor, &site)) {
        if (out) out[n] = site.t;
        n++;
    }
    return n;
}

st_status st_poetx_orthogonal_base(st_model *base, float gain, uint64_t seed, st_err *err) {
    return st_poetx_orthogonal_base_part(base, gain, seed, 0, 1, err);
}

st_status st_poetx_orthogonal_base_part(st_model *base, float gain, uint64_t seed, int part, int parts, st_err *err) {
    int n = st_poetx_init_weights(base, NULL);
    int *ks = malloc((size_t)(n ? n : 1) * sizeof *ks);
    if (!ks) return st_errf(err, ST_ERR_NOMEM, "poetx_init orthogonal: out of memory");
    for (int k = 0; k < n; k++) ks[k] = k;
    st_status s = st_poetx_orthogonal_some(base, gain, seed, ks, n, part, parts, err);
    free(ks);
    return s;
}

st_status st_poetx_orthogonal_some(st_model *base, float gain, uint64_t seed, const int *ks, int n_ks, int part,
                                   int parts, st_err *err) {
    if (parts < 1 || part < 0 || part >= parts)
        return st_errf(err, ST_ERR_INVALID, "poetx_init orthogonal: part %d of %d does not exist", part, parts);
    st_backend *be = base->be;
    int n = st_poetx_init_weights(base, NULL);
    const st_param_info **all = malloc((size_t)(n ? n : 1) * sizeof *all),
                        **t = malloc((size_t)(n_ks ? n_ks : 1) * sizeof *t);
    int *kt = malloc((size_t)(n_ks ? n_ks : 1) * sizeof *kt);
    if (!all || !t || !kt) {
        free(all), free(t), free(kt);
        return st_errf(err, ST_ERR_NOMEM, "poetx_init orthogonal: out of memory");
    }
    st_poetx_init_weights(base, all);
    /* this part's weights: the k-th (from 0) of the walk where k % parts == part, each from stream
     * k + 1 of the seed whatever the parts */
    int m = 0;
    for (int j = 0; j < n_ks; j++) {
        if (ks[j] < 0 || ks[j] >= n) {
            free(all), free(t), free(kt);
            return st_errf(err, ST_ERR_INVALID, "poetx_init orthogonal: weight %d of %d does not exist", ks[j], n);
        }
        if (ks[j] % parts == part) t[m] = all[ks[j]], kt[m++] = ks[j];
    }
    free(all);
    st_status s = ST_OK;
    if (st_backend_host_memory(be)) {
        /* the weights in place, one weight a thread (each QR on its thread alone: the same bits
         * for any thread count) */
        st_status *st = calloc((size_t)(m ? m : 1), sizeof *st);
        st_err *errs = calloc((size_t)(m ? m : 1), sizeof *errs);
        if (!st || !errs) {
            free(t), free(kt), free(st), free(errs);
            return st_errf(err, ST_ERR_NOMEM, "poetx_init orthogonal: out of memory");
        }
#pragma omp parallel for schedule(dynamic, 1)
        for (int i = 0; i < m; i++)
            st[i] = st_poetx_orthogonal_w0(base->params + t[i]->offset, t[i]->shape[0], t[i]->shape[1], gain,
                                           weight_seed(seed, kt[i] + 1), t[i]->name, &errs[i]);
        for (int i = 0; i < m && !s; i++)
            if (st[i]) {
                s = st[i];
                *err = errs[i];
            }
        free(t), free(kt), free(st), free(errs);
        return s;
    }
    float *host = NULL;
    size_t cap = 0;
    for (int i = 0; !s && i < m; i++) {
        const st_param_info *tw = t[i];
        if (tw->numel > cap) {
            free(host);
            cap = tw->numel;
            if (!(host = malloc(cap * sizeof *host))) {
                s = st_errf(err, ST_ERR_NOMEM, "poetx_init orthogonal: out of memory for %s (%zu bytes)", tw->name,
                            cap * sizeof *host);
                break;
            }
        }
        be->ops->copy_to_host(be, host, base->params + tw->offset, tw->numel * sizeof *host);
        s = st_poetx_orthogonal_w0(host, tw->shape[0], tw->shape[1], gain, weight_seed(seed, kt[i] + 1), tw->name,
                                   err);
        if (!s) be->ops->copy_to_device(be, base->params + tw->offset, host, tw->numel * sizeof *host);
    }
    free(host);
    free(t), free(kt);
    return s;
}
