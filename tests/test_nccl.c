/* test_nccl.c - dist.h over NCCL on CUDA device memory (st_comm_open_nccl): the ranged
 * reduce-scatter gives the rank-order sum (accumulating onto what is there), the gather
 * copies each rank's part everywhere, the bytes counted are the operation's. One process
 * (a world of one), or under mpirun with one GPU a rank (rank r on device r): every rank's
 * input is r + 1 + i / 1000, so the sum on every element is known exactly.
 * Skips (77) without NCCL in this build, without an NVIDIA device, or with fewer devices
 * than ranks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "strata/dist.h"

#ifdef TEST_HAVE_CUDART
#include <cuda_runtime_api.h>
#endif

int main(void) {
#ifndef TEST_HAVE_CUDART
    printf("SKIP: this strata was built without NCCL (the CUDA toolkit and NCCL were not found)\n");
    return 77;
#else
    if (access("/dev/nvidiactl", F_OK) != 0) { /* before the CUDA runtime is touched */
        printf("SKIP: no NVIDIA device on this machine (/dev/nvidiactl absent)\n");
        return 77;
    }
    st_err err = {0};
    st_comm *boot = NULL, *c = NULL;
    if (st_comm_open(&boot, 60, &err)) {
        printf("FAIL: st_comm_open: %s\n", err.msg);
        return 1;
    }
    int rank = st_comm_rank(boot), W = st_comm_size(boot), ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < W) {
        printf("SKIP: %d CUDA devices for %d ranks\n", ndev, W);
        st_comm_close(boot);
        return 77;
    }
    st_status s = st_comm_open_nccl(&c, boot, rank, &err);
    if (s == ST_ERR_UNSUPPORTED) {
        printf("SKIP: %s\n", err.msg);
        st_comm_close(boot);
        return 77;
    }
    int fail = 0;
    if (s) {
        printf("FAIL: st_comm_open_nccl: %s\n", err.msg);
        st_comm_close(boot);
        return 1;
    }
    if (strcmp(st_comm_engine(c), "nccl")) {
        printf("FAIL: engine %s, nccl expected\n", st_comm_engine(c));
        fail = 1;
    }
    enum { N = 100003 };
    size_t bounds[ST_DIST_MAX_RANKS + 1];
    for (int r = 0; r <= W; r++) bounds[r] = (size_t)N * r / W;
    size_t lo = bounds[rank], n = bounds[rank + 1] - lo;
    float *h = malloc(sizeof(float) * N), *got = malloc(sizeof(float) * N), *din = NULL, *dout = NULL;
    for (int i = 0; i < N; i++) h[i] = (float)(rank + 1) + (float)i / 1000.0f;
    if (!h || !got || cudaMalloc((void **)&din, sizeof(float) * N) != cudaSuccess ||
        cudaMalloc((void **)&dout, sizeof(float) * (n ? n : 1)) != cudaSuccess) {
        printf("FAIL: memory\n");
        return 1;
    }
    cudaMemcpy(din, h, sizeof(float) * N, cudaMemcpyHostToDevice);
    /* the whole range, then again accumulating: 2 x the sum */
    for (int pass = 0; pass < 2 && !fail; pass++) {
        if (st_comm_reduce_scatter_f32(c, din, 0, N, bounds, dout, pass, "test reduce", &err)) {
            printf("FAIL: reduce pass %d: %s\n", pass, err.msg);
            fail = 1;
            break;
        }
        cudaMemcpy(got, dout, sizeof(float) * n, cudaMemcpyDeviceToHost);
        for (size_t i = 0; i < n && !fail; i++) {
            size_t g = lo + i;
            float want = 0; /* rank order, as the device sums */
            for (int r = 0; r < W; r++) want = r ? want + ((float)(r + 1) + (float)g / 1000.0f)
                                                 : (float)(r + 1) + (float)g / 1000.0f;
            if (pass) want = want + want;
            if (got[i] != want) {
                printf("FAIL: pass %d element %zu: %.9g, want %.9g\n", pass, g, got[i], want);
                fail = 1;
            }
        }
    }
    /* the gather: each rank writes rank + 1 on its part, then every element is its owner's */
    for (int i = 0; i < N; i++) h[i] = -1;
    for (size_t i = 0; i < n; i++) h[lo + i] = (float)(rank + 1);
    cudaMemcpy(din, h, sizeof(float) * N, cudaMemcpyHostToDevice);
    if (!fail && st_comm_allgather_f32(c, din, 0, N, bounds, "test gather", &err)) {
        printf("FAIL: gather: %s\n", err.msg);
        fail = 1;
    }
    cudaMemcpy(got, din, sizeof(float) * N, cudaMemcpyDeviceToHost);
    for (int r = 0; r < W && !fail; r++)
        for (size_t i = bounds[r]; i < bounds[r + 1] && !fail; i++)
            if (got[i] != (float)(r + 1)) {
                printf("FAIL: gather: element %zu is %g, rank %d's %d expected\n", i, got[i], r, r + 1);
                fail = 1;
            }
    uint64_t sent, received;
    st_comm_bytes(c, &sent, &received);
    uint64_t want_sent = 2 * (uint64_t)(N - n) * 4 + (uint64_t)n * 4 * (uint64_t)(W - 1);
    if (!fail && sent != want_sent) {
        printf("FAIL: %llu bytes sent, %llu expected\n", (unsigned long long)sent, (unsigned long long)want_sent);
        fail = 1;
    }
    cudaFree(din);
    cudaFree(dout);
    free(h);
    free(got);
    st_comm_close(c);
    st_comm_close(boot);
    if (!fail) printf("PASS: NCCL reduce-scatter (rank-order sums, accumulate) and gather at %d rank(s)\n", W);
    return fail;
#endif
}
