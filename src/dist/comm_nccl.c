/* comm_nccl.c - the ranged reduce-scatter and all-gather of dist.h over NCCL, on device
 * memory (built where CMake finds NCCL and the CUDA toolkit: STRATA_HAVE_NCCL).
 *
 * The same contract as over MPI: this rank's part of a range is the sum over the ranks in
 * rank order, on the owner. Each peer's piece is received with ncclRecv (the sends and
 * receives of one operation in one NCCL group), then the pieces are added in rank order by
 * cuBLAS saxpy with alpha 1 (fma(1, x, y) rounds x + y once: the CPU's sum, bit for bit).
 * Everything runs on one CUDA stream of the communicator's own; a wait polls it and NCCL's
 * asynchronous error against the timeout and aborts the NCCL communicator when it expires,
 * so a lost peer is an error naming the phase, not a hang. The NCCL id is made by rank 0
 * and broadcast over the MPI communicator that launched the job.
 *
 * NCCL, the CUDA runtime and cuBLAS are compiled against (their headers) and loaded with
 * dlopen when a communicator is first opened, as NVML is (src/prof/nvml.c): linked in,
 * their loading costs every strata process 0.5 s and 200 MB of resident memory (measured:
 * `/usr/bin/time strata train --help`), and a machine without them could not run strata
 * at all. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/nccl_internal.h"

#ifdef STRATA_HAVE_NCCL
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>

/* Every function used, from its library: declared from the headers, resolved by dlsym. */
#define NCCL_FUNCS(X)                                                                                                 \
    X(rt, cudaGetDeviceCount) X(rt, cudaSetDevice) X(rt, cudaGetErrorString) X(rt, cudaStreamCreateWithFlags)        \
    X(rt, cudaStreamDestroy) X(rt, cudaStreamSynchronize) X(rt, cudaStreamQuery) X(rt, cudaMalloc) X(rt, cudaFree)   \
    X(rt, cudaMemcpyAsync) X(nc, ncclGetUniqueId) X(nc, ncclCommInitRank) X(nc, ncclCommDestroy)                     \
    X(nc, ncclCommAbort) X(nc, ncclGroupStart) X(nc, ncclGroupEnd) X(nc, ncclSend) X(nc, ncclRecv)                   \
    X(nc, ncclGetErrorString) X(nc, ncclCommGetAsyncError) X(bl, cublasCreate_v2) X(bl, cublasDestroy_v2)             \
    X(bl, cublasSetStream_v2) X(bl, cublasSaxpy_v2)
#define DECLARE(lib, f) static __typeof__(f) *p_##f;
NCCL_FUNCS(DECLARE)
#undef DECLARE

#define STR2(x) #x
#define STR(x) STR2(x)
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static char load_error[512];

static void *open_lib(const char *name, const char *versioned) {
    void *h = dlopen(versioned, RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
#ifdef STRATA_CUDA_LIBDIR
    char path[1024];
    if (!h) {
        snprintf(path, sizeof path, "%s/%s", STRATA_CUDA_LIBDIR, versioned);
        h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
#endif
    return h;
}

static void load_all(void) {
    void *rt = open_lib("libcudart.so", "libcudart.so." STR(STRATA_CUDA_MAJOR));
    void *nc = open_lib("libnccl.so", "libnccl.so." STR(NCCL_MAJOR));
    void *bl = open_lib("libcublas.so", "libcublas.so." STR(STRATA_CUDA_MAJOR));
    if (!rt || !nc || !bl) {
        snprintf(load_error, sizeof load_error, "cannot load %s (%s); install the CUDA toolkit and NCCL, or put their "
                 "lib directory in LD_LIBRARY_PATH", !rt ? "libcudart" : !nc ? "libnccl" : "libcublas", dlerror());
        return;
    }
#define RESOLVE(lib, f)                                                                                              \
    if (!load_error[0] && !(p_##f = (__typeof__(f) *)dlsym(lib, #f)))                                                  \
        snprintf(load_error, sizeof load_error, "the loaded CUDA libraries lack %s", #f);
    NCCL_FUNCS(RESOLVE)
#undef RESOLVE
}

struct nccl_comm {
    ncclComm_t comm;
    cudaStream_t stream;
    cublasHandle_t blas;
    float *scratch; /* the peers' pieces, device memory */
    size_t scratch_n;
    int rank, size, device;
};

static st_status cuda_fail(cudaError_t e, const char *what, st_err *err) {
    return st_errf(err, ST_ERR_IO, "%s: CUDA error %d (%s)", what, (int)e, p_cudaGetErrorString(e));
}
static st_status nccl_fail(ncclResult_t r, const char *what, st_err *err) {
    return st_errf(err, ST_ERR_IO, "%s: NCCL error %d (%s)", what, (int)r, p_ncclGetErrorString(r));
}

st_status nccl_open(nccl_comm **out, st_comm *boot, int device, st_err *err) {
    *out = NULL;
    pthread_once(&load_once, load_all);
    if (load_error[0]) return st_errf(err, ST_ERR_UNSUPPORTED, "NCCL: %s", load_error);
    int count = 0;
    cudaError_t ce = p_cudaGetDeviceCount(&count);
    if (ce != cudaSuccess || count == 0)
        return st_errf(err, ST_ERR_UNSUPPORTED, "NCCL: no CUDA device (%s)",
                       ce != cudaSuccess ? p_cudaGetErrorString(ce) : "none found");
    if (device < 0 || device >= count)
        return st_errf(err, ST_ERR_INVALID, "NCCL: device %d; this machine has %d (0 to %d)", device, count, count - 1);
    nccl_comm *n = calloc(1, sizeof *n);
    if (!n) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    n->rank = st_comm_rank(boot);
    n->size = st_comm_size(boot);
    n->device = device;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    st_status s = ST_OK;
    ncclResult_t nr;
    if ((ce = p_cudaSetDevice(device)) != cudaSuccess) s = cuda_fail(ce, "cudaSetDevice", err);
    if (!s && n->rank == 0 && (nr = p_ncclGetUniqueId(&id)) != ncclSuccess) s = nccl_fail(nr, "ncclGetUniqueId", err);
    /* every rank learns rank 0's status with the id: a failure there ends all of them */
    int ok = s == ST_OK;
    st_err berr = {0};
    if (st_comm_bcast(boot, &ok, sizeof ok, 0, "NCCL id", &berr) || st_comm_bcast(boot, &id, sizeof id, 0, "NCCL id", &berr))
        s = s ? s : st_errf(err, berr.code, "%s", berr.msg);
    if (!s && !ok) s = st_errf(err, ST_ERR_IO, "NCCL: rank 0 could not make the communicator's id");
    if (!s && (nr = p_ncclCommInitRank(&n->comm, n->size, id, n->rank)) != ncclSuccess)
        s = nccl_fail(nr, "ncclCommInitRank", err);
    if (!s && (ce = p_cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking)) != cudaSuccess)
        s = cuda_fail(ce, "cudaStreamCreate", err);
    if (!s && p_cublasCreate_v2(&n->blas) != CUBLAS_STATUS_SUCCESS)
        s = st_errf(err, ST_ERR_IO, "NCCL: cublasCreate failed");
    if (!s && p_cublasSetStream_v2(n->blas, n->stream) != CUBLAS_STATUS_SUCCESS)
        s = st_errf(err, ST_ERR_IO, "NCCL: cublasSetStream failed");
    if (s) {
        nccl_close(n, 1);
        return s;
    }
    *out = n;
    return ST_OK;
}

void nccl_close(nccl_comm *n, int abort) {
    if (!n) return;
    if (n->comm) {
        if (abort) p_ncclCommAbort(n->comm);
        else {
            p_cudaStreamSynchronize(n->stream);
            p_ncclCommDestroy(n->comm);
        }
    }
    if (n->blas) p_cublasDestroy_v2(n->blas);
    if (n->scratch) p_cudaFree(n->scratch);
    if (n->stream) p_cudaStreamDestroy(n->stream);
    free(n);
}


#define PIECE ((size_t)1 << 30) /* elements per NCCL or cuBLAS call (counts are int for cuBLAS) */

st_status nccl_reduce_scatter(nccl_comm *n, const float *in, size_t lo, size_t hi, const size_t *bounds, float *out,
                              int accumulate, st_err *err) {
    size_t a, e;
    dist_part_of(bounds, n->rank, lo, hi, &a, &e);
    size_t len = e - a, need = (size_t)(n->size - 1) * len;
    cudaError_t ce;
    if (need > n->scratch_n) { /* grow the pieces' buffer (after what uses it now) */
        p_cudaStreamSynchronize(n->stream);
        if (n->scratch) p_cudaFree(n->scratch);
        n->scratch = NULL;
        n->scratch_n = 0;
        if ((ce = p_cudaMalloc((void **)&n->scratch, need * sizeof(float))) != cudaSuccess)
            return cuda_fail(ce, "NCCL: device memory for the gradient pieces", err);
        n->scratch_n = need;
    }
    ncclResult_t nr = p_ncclGroupStart();
    for (int r = 0, k = 0; r < n->size && nr == ncclSuccess; r++) {
        if (r == n->rank) continue;
        size_t pa, pe;
        dist_part_of(bounds, r, lo, hi, &pa, &pe);
        for (size_t o = 0; o < pe - pa && nr == ncclSuccess; o += PIECE)
            nr = p_ncclSend(in + pa + o, pe - pa - o < PIECE ? pe - pa - o : PIECE, ncclFloat, r, n->comm, n->stream);
        float *dst = n->scratch + (size_t)k++ * len;
        for (size_t o = 0; o < len && nr == ncclSuccess; o += PIECE)
            nr = p_ncclRecv(dst + o, len - o < PIECE ? len - o : PIECE, ncclFloat, r, n->comm, n->stream);
    }
    ncclResult_t ne = p_ncclGroupEnd();
    if (nr != ncclSuccess || ne != ncclSuccess) return nccl_fail(nr != ncclSuccess ? nr : ne, "NCCL reduce", err);
    if (!len) return ST_OK;
    float *dst = out + (a - bounds[n->rank]);
    const float one = 1.0f;
    int first = !accumulate;
    for (int r = 0, k = 0; r < n->size; r++) {
        const float *src = r == n->rank ? in + a : n->scratch + (size_t)k++ * len;
        if (first) {
            if ((ce = p_cudaMemcpyAsync(dst, src, len * sizeof(float), cudaMemcpyDeviceToDevice, n->stream)) != cudaSuccess)
                return cuda_fail(ce, "NCCL reduce: copy", err);
            first = 0;
            continue;
        }
        for (size_t o = 0; o < len; o += PIECE)
            if (p_cublasSaxpy_v2(n->blas, (int)(len - o < PIECE ? len - o : PIECE), &one, src + o, 1, dst + o, 1) !=
                CUBLAS_STATUS_SUCCESS)
                return st_errf(err, ST_ERR_IO, "NCCL reduce: the sum in rank order (cublasSaxpy) failed");
    }
    return ST_OK;
}

st_status nccl_allgather(nccl_comm *n, float *x, size_t lo, size_t hi, const size_t *bounds, st_err *err) {
    size_t a, e;
    dist_part_of(bounds, n->rank, lo, hi, &a, &e);
    ncclResult_t nr = p_ncclGroupStart();
    for (int r = 0; r < n->size && nr == ncclSuccess; r++) {
        if (r == n->rank) continue;
        size_t pa, pe;
        dist_part_of(bounds, r, lo, hi, &pa, &pe);
        for (size_t o = 0; o < e - a && nr == ncclSuccess; o += PIECE)
            nr = p_ncclSend(x + a + o, e - a - o < PIECE ? e - a - o : PIECE, ncclFloat, r, n->comm, n->stream);
        for (size_t o = 0; o < pe - pa && nr == ncclSuccess; o += PIECE)
            nr = p_ncclRecv(x + pa + o, pe - pa - o < PIECE ? pe - pa - o : PIECE, ncclFloat, r, n->comm, n->stream);
    }
    ncclResult_t ne = p_ncclGroupEnd();
    if (nr != ncclSuccess || ne != ncclSuccess) return nccl_fail(nr != ncclSuccess ? nr : ne, "NCCL gather", err);
    return ST_OK;
}

st_status nccl_wait(nccl_comm *n, double timeout_s, const char *phase, st_err *err) {
    double t0 = st_now();
    for (;;) {
        cudaError_t ce = p_cudaStreamQuery(n->stream);
        if (ce == cudaSuccess) return ST_OK;
        if (ce != cudaErrorNotReady) return cuda_fail(ce, phase, err);
        ncclResult_t async = ncclSuccess;
        p_ncclCommGetAsyncError(n->comm, &async);
        if (async != ncclSuccess && async != ncclInProgress) {
            p_ncclCommAbort(n->comm);
            n->comm = NULL;
            return nccl_fail(async, phase, err);
        }
        if (st_now() - t0 > timeout_s) {
            p_ncclCommAbort(n->comm);
            n->comm = NULL;
            return st_errf(err, ST_ERR_IO, "%s: the NCCL operations did not complete within %.0f s (key 'dist_timeout'): "
                           "a rank died or hangs; every rank stops; the last committed checkpoint is intact", phase,
                           timeout_s);
        }
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
}

#else /* built without NCCL */

st_status nccl_open(nccl_comm **out, st_comm *boot, int device, st_err *err) {
    (void)boot, (void)device;
    *out = NULL;
    return st_errf(err, ST_ERR_UNSUPPORTED, "this strata was built without NCCL (it needs the CUDA toolkit and NCCL "
                   "where CMake finds them)");
}
void nccl_close(nccl_comm *n, int abort) { (void)n, (void)abort; }
st_status nccl_reduce_scatter(nccl_comm *n, const float *in, size_t lo, size_t hi, const size_t *bounds, float *out,
                              int accumulate, st_err *err) {
    (void)n, (void)in, (void)lo, (void)hi, (void)bounds, (void)out, (void)accumulate;
    return st_errf(err, ST_ERR_UNSUPPORTED, "built without NCCL");
}
st_status nccl_allgather(nccl_comm *n, float *x, size_t lo, size_t hi, const size_t *bounds, st_err *err) {
    (void)n, (void)x, (void)lo, (void)hi, (void)bounds;
    return st_errf(err, ST_ERR_UNSUPPORTED, "built without NCCL");
}
st_status nccl_wait(nccl_comm *n, double timeout_s, const char *phase, st_err *err) {
    (void)n, (void)timeout_s, (void)phase;
    return st_errf(err, ST_ERR_UNSUPPORTED, "built without NCCL");
}

#endif
