/* ckpt.h - the training state beside the weights: step, RNG, data cursor, optimizer
 * moments, in a versioned binary with a CRC-32C over everything.
 *
 * train_state.bin layout (little-endian):
 *   0   char[8]  magic "STRATAts"
 *   8   u32      version (1)
 *   12  u32      optimizer state format (st_optim_state_format)
 *   16  u64      step (optimizer steps completed)
 *   24  u64      adam step (updates applied; a skipped non-finite step does not count)
 *   32  u64      rng state
 *   40  u64      D: bytes of the data loader's state
 *   48  u64      number of parameters
 *   56  u32      number of optimizer buffers K
 *   60  u32      reserved (0)
 *   64  u64[K]   byte size of each buffer
 *   ..  bytes    the data loader's state (D bytes, st_data_loader_state)
 *   ..  bytes    the K buffers, in order
 *   end u32      CRC-32C of every byte before it
 */
#ifndef STRATA_CKPT_H
#define STRATA_CKPT_H

#include "strata/core.h"
#include "strata/optim.h"

#define ST_TRAIN_STATE_VERSION 1u

#define ST_DATA_STATE_MAX 4096

typedef struct st_train_state_header {
    uint64_t step, adam_step, rng, n_params;
    uint64_t data_state_bytes;                 /* <= ST_DATA_STATE_MAX */
    unsigned char data_state[ST_DATA_STATE_MAX]; /* opaque to this layer */
} st_train_state_header;

st_status st_train_state_save(const char *path, const st_train_state_header *h, st_optim *o, st_err *err);
/* Validates magic, version, size, CRC and that the state matches this optimizer
 * (format, parameter count, buffer sizes) before anything is copied into it. */
st_status st_train_state_load(const char *path, st_train_state_header *h, st_optim *o, st_err *err);

/* Data parallel (ZeRO 1 and 2): each rank writes its shard of the optimizer state to
 * DIR/train_state.rankNNNNN.bin (the layout above, for the shard's elements: segments
 * clipped to it), and rank 0 writes DIR/shards.json, the world-size-independent description
 * (world, bounds of each shard, parameter count, format). The shards hold the bytes of one
 * process's train_state.bin buffers cut at the bounds (the cuts fall on the 8-bit blocks),
 * so a checkpoint written at N ranks resumes at M. */
#define ST_SHARDS_JSON "shards.json"
st_status st_train_state_save_shard(const char *dir, int rank, const st_train_state_header *h, st_optim *o, st_err *err);
st_status st_train_state_save_shards_json(const char *dir, int world, int zero, st_optim_state_format fmt, size_t n_params,
                                       const size_t *bounds, st_err *err);
/* The shard [lo, hi) of a checkpoint's optimizer state, written at any world size (one
 * train_state.bin, or shards.json and its rank files), into o, which was made for segs
 * (the whole vector's segments) clipped to [lo, hi) and counted from lo; h from the checkpoint, with n_params
 * the whole vector's. Every file read is validated as st_train_state_load does. */
st_status st_train_state_load_shard(const char *dir, st_train_state_header *h, st_optim *o, const st_optim_segment *segs,
                                 int n_segs, size_t lo, size_t hi, st_err *err);

#endif
