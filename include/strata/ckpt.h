/* ckpt.h - the training state beside the weights: step, RNG, data cursor, optimizer
 * moments, in a versioned binary with a CRC-32C over everything.
 *
 * train_state.bin layout (little-endian):
 *   0   char[8]  magic "STRATAts"
 *   8   u32      version (1)
 *   12  u32      optimizer state format (optim_state_format)
 *   16  u64      step (optimizer steps completed)
 *   24  u64      adam step (updates applied; a skipped non-finite step does not count)
 *   32  u64      rng state
 *   40  u64      D: bytes of the data loader's state
 *   48  u64      number of parameters
 *   56  u32      number of optimizer buffers K
 *   60  u32      reserved (0)
 *   64  u64[K]   byte size of each buffer
 *   ..  bytes    the data loader's state (D bytes, data_loader_state)
 *   ..  bytes    the K buffers, in order
 *   end u32      CRC-32C of every byte before it
 */
#ifndef STRATA_CKPT_H
#define STRATA_CKPT_H

#include "strata/core.h"
#include "strata/optim.h"

#define ST_TRAIN_STATE_VERSION 1u

#define ST_DATA_STATE_MAX 4096

typedef struct train_state_header {
    uint64_t step, adam_step, rng, n_params;
    uint64_t data_state_bytes;                 /* <= ST_DATA_STATE_MAX */
    unsigned char data_state[ST_DATA_STATE_MAX]; /* opaque to this layer */
} train_state_header;

st_status train_state_save(const char *path, const train_state_header *h, optim *o, st_err *err);
/* Validates magic, version, size, CRC and that the state matches this optimizer
 * (format, parameter count, buffer sizes) before anything is copied into it. */
st_status train_state_load(const char *path, train_state_header *h, optim *o, st_err *err);

#endif
