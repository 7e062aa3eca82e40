/* backend_cpu_chunk.c - the chunked classifier's online softmax and the bf16 drain, as
 * backend ops on host-addressable memory (see backend.h). */
#include <math.h>
#include <string.h>

#include "backend_cpu_chunk.h"
#include "strata/tensor.h"

void st_host_softmax_chunk_init(st_backend *be, float *rmax, double *rsum, float *tlogit, int N) {
    (void)be;
    for (int i = 0; i < N; i++) {
        rmax[i] = -INFINITY;
        rsum[i] = 0;
        tlogit[i] = 0;
    }
}

void st_host_softmax_chunk_stats(st_backend *be, const float *logits, const int32_t *targets, int N, int nr, int r0,
                                 float *rmax, double *rsum, float *tlogit) {
    (void)be;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        int t = targets[i];
        if (t < 0) continue;
        const float *l = logits + (size_t)i * nr;
        float mx = -INFINITY;
        for (int j = 0; j < nr; j++) mx = l[j] > mx ? l[j] : mx;
        if (mx > rmax[i]) {
            rsum[i] *= exp((double)rmax[i] - (double)mx); /* rescale the sum so far */
            rmax[i] = mx;
        }
        double sum = 0;
        float m = rmax[i];
        for (int j = 0; j < nr; j++) sum += expf(l[j] - m);
        rsum[i] += sum;
        if (t >= r0 && t < r0 + nr) tlogit[i] = l[t - r0];
    }
}

void st_host_softmax_chunk_grad(st_backend *be, float *logits, const int32_t *targets, int N, int nr, int r0,
                                const float *rmax, const double *rsum, float dloss) {
    (void)be;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *l = logits + (size_t)i * nr;
        int t = targets[i];
        if (t < 0) {
            memset(l, 0, sizeof(float) * (size_t)nr);
            continue;
        }
        float m = rmax[i], sc = (float)(dloss / rsum[i]);
        for (int j = 0; j < nr; j++) l[j] = expf(l[j] - m) * sc;
        if (t >= r0 && t < r0 + nr) l[t - r0] -= dloss;
    }
}

void st_host_to_bf16(st_backend *be, uint16_t *dst, const float *src, size_t n) {
    (void)be;
    st_convert(dst, ST_BF16, src, ST_F32, n);
}
