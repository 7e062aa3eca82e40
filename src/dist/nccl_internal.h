/* nccl_internal.h - comm.c's NCCL engine (comm_nccl.c): an st_comm opened with
 * st_comm_open_nccl runs its ranged operations here, on device memory. */
#ifndef STRATA_DIST_NCCL_INTERNAL_H
#define STRATA_DIST_NCCL_INTERNAL_H

#include "strata/dist.h"

typedef struct nccl_comm nccl_comm;

/* Rank r's part [*a, *e) of the range [lo, hi) of a vector cut by bounds (comm.c). */
void dist_part_of(const size_t *bounds, int r, size_t lo, size_t hi, size_t *a, size_t *e);

/* The NCCL communicator of boot's ranks on CUDA device `device` (id from rank 0 over boot). */
st_status nccl_open(nccl_comm **out, st_comm *boot, int device, st_err *err);
void nccl_close(nccl_comm *n, int abort);
/* Enqueued on the communicator's stream; nccl_wait completes them. */
st_status nccl_reduce_scatter(nccl_comm *n, const float *in, size_t lo, size_t hi, const size_t *bounds, float *out,
                              int accumulate, st_err *err);
st_status nccl_allgather(nccl_comm *n, float *x, size_t lo, size_t hi, const size_t *bounds, st_err *err);
st_status nccl_wait(nccl_comm *n, double timeout_s, const char *phase, st_err *err);

#endif
