/* dist.h - more than one process: the communication interface and ZeRO sharding.
 *
 * A run of N ranks is started by the launcher clusters already have (`mpirun -np N strata
 * train ...`, or `srun` under Slurm); strata brings no launcher or transport of its own.
 * st_comm_open joins the job when a launcher started this process (OpenMPI's, PMI or PMIx
 * environment) and otherwise gives a world of one, so one process runs without mpirun.
 * Every collective names its phase ("gradient reduce", "weights gather", ...) and every
 * wait is bounded: a peer that died or hangs ends the wait with an error naming the phase,
 * the peer and the time waited, never a hang (the launcher then ends the other ranks).
 *
 * Sums are deterministic: a reduction receives every rank's piece and adds them in rank
 * order, (x0 + x1) + x2 ..., on the rank that owns the result; so ZeRO at N ranks gives the
 * bits one process gives with grad_accum N, whatever the transport does.
 *
 * ZeRO: each rank owns a contiguous shard [bounds[r], bounds[r+1]) of the flat parameter
 * vector (st_zero_bounds), cut on the 8-bit optimizer's blocks (ST_OPTIM_Q8_BLOCK from each
 * segment's start), so that the update is the bits of the unsharded one; the gradient
 * norm's chunks (ST_OPTIM_SUMSQ_CHUNK) each belong to the rank holding their first element,
 * which receives the rest of a chunk that crosses into the next shard.
 *
 * Example (any number of ranks, also one):
 *
 *     #include "strata/dist.h"
 *
 *     st_err err = {0};
 *     st_comm *c = NULL;
 *     if (st_comm_open(&c, 60.0, &err)) { fprintf(stderr, "strata: %s\n", err.msg); return 1; }
 *     int r = st_comm_rank(c), n = st_comm_size(c);
 *     float grad[1000], shard[1000];
 *     for (int i = 0; i < 1000; i++) grad[i] = (float)(r + 1);
 *     size_t bounds[ST_DIST_MAX_RANKS + 1];
 *     for (int q = 0; q <= n; q++) bounds[q] = (size_t)1000 * q / n;   // any cut
 *     // shard = the sum over ranks of grad, on the elements this rank owns
 *     if (st_comm_reduce_scatter_f32(c, grad, 0, 1000, bounds, shard, 0, "example", &err) == ST_OK)
 *         printf("rank %d of %d: %g\n", r, n, shard[0]);          // n (n + 1) / 2
 *     st_comm_close(c);
 *
 * End of example.
 */
#ifndef STRATA_DIST_H
#define STRATA_DIST_H

#include "strata/core.h"
#include "strata/optim.h"

#define ST_DIST_MAX_RANKS 4096

typedef struct st_comm st_comm;
typedef struct st_comm_req st_comm_req;

/* Join the launcher's job (MPI), or a world of one when no launcher started this process.
 * timeout_s bounds every wait (<= 0: 300 s). ST_ERR_UNSUPPORTED when a launcher started
 * this process but this strata was built without MPI. */
st_status st_comm_open(st_comm **out, double timeout_s, st_err *err);
/* The same ranks over NCCL (built where CMake finds NCCL and the CUDA toolkit): the ranged
 * reduce-scatter and all-gather below then take CUDA device memory (device `device` of
 * this machine) and run on a stream of the comm's own, with the same rank-order sums
 * (peers' pieces added by cuBLAS saxpy, alpha 1: x + y rounded once, the CPU's bits); the
 * small collectives (host memory) go through boot, which must outlive it and which gives
 * the NCCL id. ST_ERR_UNSUPPORTED without NCCL or without a CUDA device. */
st_status st_comm_open_nccl(st_comm **out, st_comm *boot, int device, st_err *err);
/* Leave the job (MPI_Finalize after the last rank arrives; an NCCL comm frees its own). */
void st_comm_close(st_comm *c);
/* After an error on this rank: end every rank of the job now (MPI_Abort), code as exit
 * status; with a world of one it only closes. */
void st_comm_abort(st_comm *c, int code);
/* The ranks a launcher started this process among, read from its environment (OpenMPI's
 * OMPI_COMM_WORLD_SIZE, PMI's PMI_SIZE) without joining the job: for an account made before or
 * without st_comm_open (strata plan under mpirun counts as the run would). 1: no launcher; 0: a
 * launcher that does not say how many. */
int st_comm_launched_size(void);
int st_comm_rank(const st_comm *c);
int st_comm_size(const st_comm *c);
int st_comm_local_size(const st_comm *c);   /* ranks on this machine */
const char *st_comm_engine(const st_comm *c); /* "mpi", "nccl" or "self" */
/* Compute threads for one rank: this machine's cores divided by the ranks on it (>= 1). */
int st_comm_threads(const st_comm *c);
void st_comm_set_timeout(st_comm *c, double timeout_s);
/* Bytes this rank sent and received through the comm since it opened. */
void st_comm_bytes(const st_comm *c, uint64_t *sent, uint64_t *received);

st_status st_comm_barrier(st_comm *c, const char *phase, st_err *err);
st_status st_comm_bcast(st_comm *c, void *buf, size_t bytes, int root, const char *phase, st_err *err);
/* Every rank's `bytes` bytes, in rank order, into all (size x bytes). */
st_status st_comm_allgather(st_comm *c, const void *mine, size_t bytes, void *all, const char *phase, st_err *err);
/* x[0..n) summed over ranks in rank order, on every rank. */
st_status st_comm_allreduce_f64(st_comm *c, double *x, int n, const char *phase, st_err *err);

/* The range [lo, hi) of a flat fp32 vector `in` (indexed from 0, every rank's own), cut by
 * bounds[0..size] into the ranks' shards: this rank's part of the range, summed over the
 * ranks in rank order, goes to out (indexed from bounds[rank]): out = in_0 + in_1 + ...,
 * or with accumulate out = ((out + in_0) + in_1) + ... The non-blocking form returns
 * before anything moved; `in` must not change and out not be read until the wait. */
st_status st_comm_ireduce_scatter_f32(st_comm *c, const float *in, size_t lo, size_t hi, const size_t *bounds,
                                      float *out, int accumulate, st_comm_req **req, st_err *err);
/* The range [lo, hi) of a flat fp32 vector x, in place: every rank's part of the range
 * (its shard) is copied to every other rank. */
st_status st_comm_iallgather_f32(st_comm *c, float *x, size_t lo, size_t hi, const size_t *bounds,
                                 st_comm_req **req, st_err *err);
/* Wait for req (then freed) at most the timeout; phase names it in the error. */
st_status st_comm_wait(st_comm *c, st_comm_req *req, const char *phase, st_err *err);
/* A collective of point-to-point pieces: every rank calls it (maybe with none), each piece
 * sent to or received from one peer; the sizes must match on both sides. */
typedef struct st_comm_piece {
    int peer;
    float *buf;
    size_t n;
} st_comm_piece;
st_status st_comm_exchange_f32(st_comm *c, const st_comm_piece *sends, int ns, const st_comm_piece *recvs, int nr,
                               const char *phase, st_err *err);
/* The communication thread: st_comm_ireduce_scatter_f32's reduction queued to a thread of
 * the comm's own, which posts it, progresses it and sums it while the caller computes (the
 * gradient of one block reduced while the blocks below run backward). The wait returns
 * once everything queued is complete, or with the first error of any. */
st_status st_comm_async_reduce(st_comm *c, const float *in, size_t lo, size_t hi, const size_t *bounds, float *out,
                               int accumulate, st_err *err);
st_status st_comm_async_wait(st_comm *c, const char *phase, st_err *err);
/* A ranged all-gather (st_comm_iallgather_f32) queued to the same thread, in order after
 * what is queued; *ticket names it. st_comm_async_wait_ticket(c, t) returns once every
 * operation queued up to ticket t is complete (the weights of the blocks up to one, while
 * the later ones still travel), or with the first error. While the thread has work, the
 * small collectives (barrier, bcast, allgather, allreduce_f64) go through it and return
 * when they are done; the other operations first wait until it is idle. */
st_status st_comm_async_gather(st_comm *c, float *x, size_t lo, size_t hi, const size_t *bounds, uint64_t *ticket,
                               st_err *err);
st_status st_comm_async_wait_ticket(st_comm *c, uint64_t ticket, st_err *err);
/* The blocking forms. */
st_status st_comm_reduce_scatter_f32(st_comm *c, const float *in, size_t lo, size_t hi, const size_t *bounds,
                                     float *out, int accumulate, const char *phase, st_err *err);
st_status st_comm_allgather_f32(st_comm *c, float *x, size_t lo, size_t hi, const size_t *bounds, const char *phase,
                                st_err *err);

/* ZeRO's shards of a flat vector of n elements described by segs: bounds[0] = 0,
 * bounds[size] = n, each cut the nearest whole 8-bit block to r n / size (see above); a
 * shard may be empty when n is small. */
void st_zero_bounds(const st_optim_segment *segs, int n_segs, size_t n, int size, size_t *bounds);
/* segs clipped to [lo, hi) into out, offsets counted from lo (the shard's optimizer indexes
 * its own buffers: params + lo, the gradient shard, base 0), each keeping its weight decay and
 * learning-rate class; how many. */
int st_zero_clip_segments(const st_optim_segment *segs, int n_segs, size_t lo, size_t hi, st_optim_segment *out);

/* The ranks' side of a data-parallel step (src/dist/zero.c), for an executor that hands
 * it each block's gradient as backward completes it (exec/step.c runs the micro-batches
 * and the update; everything that crosses ranks is here). n: the flat vector's elements;
 * bounds: the ranks' shards (st_zero_bounds; copied). Stage 0: the gradient reduced onto
 * the shards, then gathered whole, and the whole update on every rank; 1 and 2: the update
 * on this rank's shard only, the updated weights gathered after it; with overlap_gather,
 * part by part (the blocks' ranges the backward reported) while the next forward waits for
 * each part as it reaches it. */
typedef struct st_zero st_zero;
st_status st_zero_create(st_zero **out, st_comm *c, int stage, const size_t *bounds, size_t n, int overlap_gather,
                         st_err *err);
void st_zero_destroy(st_zero *z);
int st_zero_stage(const st_zero *z);
void st_zero_shard_range(const st_zero *z, size_t *lo, size_t *hi);
float *st_zero_shard(st_zero *z); /* the summed gradient on [lo, hi), counted from lo */

/* One micro-batch's reduction of grads (the flat gradient, this rank's own) onto the
 * shards: begin it, give st_zero_grad_ready (ctx: the pass) to the backward as its hook,
 * end it after the backward (the ranges the hook did not see are reduced, then the wait,
 * added to *wait_s). add (non-NULL): added into each range before it is reduced (the sum
 * of the earlier micro-batches); accumulate: onto the shard's running sum (ZeRO 2). */
typedef struct st_zero_pass {
    st_zero *z;
    float *grads;
    const float *add;
    int accumulate;
    size_t done_lo, done_hi; /* the ranges reduced so far: blocks, from the last down */
    st_status st;
    st_err *err;
} st_zero_pass;
void st_zero_pass_begin(st_zero_pass *p, st_zero *z, float *grads, const float *add, int accumulate, st_err *err);
void st_zero_grad_ready(void *pass, size_t offset, size_t n);
st_status st_zero_pass_end(st_zero_pass *p, double *wait_s);
/* The summed gradient the update reads: *g on [*lo, *hi) (the shard; stage 0: gathered
 * into grads, the whole vector). */
st_status st_zero_summed(st_zero *z, float *grads, const float **g, size_t *lo, size_t *hi, double *wait_s,
                         st_err *err);
/* Its squared norm over every rank: the bits st_optim_grad_sumsq gives on the whole vector. */
st_status st_zero_grad_sumsq(st_zero *z, const float *g, size_t lo, size_t hi, double *sumsq, st_err *err);
/* After the update (stages 1 and 2): every rank's updated shard of params to every rank,
 * now or, with overlap_gather, in flight until the next forward's weight hook. */
st_status st_zero_share_weights(st_zero *z, float *params, double *wait_s, st_err *err);
int st_zero_gathering(const st_zero *z); /* the last update's weights still arriving */
/* The next forward: st_zero_step_begin, then st_zero_weights_ready (ctx: z) as the model's
 * weight hook, then st_zero_weights_done (its waits added to *wait_s, its first error,
 * then whatever is still in flight). st_zero_sync: wait for all of it. */
void st_zero_step_begin(st_zero *z);
void st_zero_weights_ready(void *zero, size_t offset, size_t n);
st_status st_zero_weights_done(st_zero *z, double *wait_s, st_err *err);
st_status st_zero_sync(st_zero *z, st_err *err);

#endif
