/* data_internal.h - pieces of the data pipeline shared between its files (and tests):
 * the source struct, the per-source stream walk, the permutation, the batch builder. */
#ifndef STRATA_DATA_INTERNAL_H
#define STRATA_DATA_INTERNAL_H

#include <limits.h>
#include <stdint.h>

#include "strata/data.h"

#define DATA_PATH_MAX 4096

/* Megatron .idx: 9-byte magic, u64 version, u8 dtype, u64 sequence count, u64
 * document-index count = 34 bytes, after which the int32 sizes and the int64
 * pointers follow unaligned. */
#define DATA_IDX_HEADER_BYTES 34
/* llm.c shards: 256 int32 header words. */
#define DATA_LLMC_HEADER_BYTES 1024
#define DATA_LLMC_MAGIC_U16 20240520
#define DATA_LLMC_VERSION_U16 1
#define DATA_LLMC_MAGIC_U32 20240801
#define DATA_LLMC_VERSION_U32 7

struct data_source {
    data_format format;
    int dtype, itemsize;
    char bin_path[DATA_PATH_MAX + 8], idx_path[DATA_PATH_MAX + 8];
    int fd;                  /* token file; -1 for memory sources */
    const uint8_t *mem;      /* memory sources */
    uint64_t data_off;       /* byte offset of token 0 (llm.c: after the header) */
    uint64_t n_tokens, bin_bytes;
    /* Megatron index, memory-mapped */
    const uint8_t *idx_map;
    size_t idx_bytes;
    int idx_fd;              /* per-document lookups use pread on this (see source.c) */
    uint64_t n_docs, n_doc_idx;
    /* staging for token conversion: holds file bytes before widening to int32 */
    uint8_t *stage;
    size_t stage_bytes;
    /* counters (bytes the loader moves because of this source) */
    uint64_t bytes_read, bytes_written, idx_lookups;
};

/* Document d of an indexed source: byte pointer into the .bin and length in tokens,
 * checked against the .bin size. */
st_status data_source_doc(data_source *s, uint64_t d, uint64_t *ptr, uint64_t *len, st_err *err);
/* Read n tokens starting at byte offset `base` of the token file (no index lookup;
 * the caller has checked the range against the document it came from). */
st_status data_source_read_at(data_source *s, uint64_t base, uint64_t n, int32_t *out, int64_t vocab_size,
                              st_err *err);

/* A bijection on [0, n) from a key: Feistel network on the next even power of two,
 * cycle-walking back into range. O(1) memory, about 2 evaluations on average. */
uint64_t data_perm(uint64_t j, uint64_t n, uint64_t key);
uint64_t data_mix64(uint64_t x);

/* Convert n tokens of a Megatron dtype to int32 with the vocabulary check. Returns the
 * index of the first bad token, or n if all are good (bad_value receives it). */
size_t data_convert(const void *src, int dtype, size_t n, int32_t *dst, int64_t vocab_size,
                    int64_t *bad_value);

/* The stream of one source within a loader: T+1-token samples overlapping by one. */
typedef struct data_stream {
    data_source *src;
    int index;            /* position in the loader's source list (keys the permutation) */
    int windowed;         /* no document index: permute windows of the token file */
    uint64_t n_units;     /* documents or windows per epoch */
    uint64_t seed;
    int T;
    int shuffle;
    int64_t vocab_size, eod_token;
    /* the last document looked up: a sample usually starts inside the document where
     * the previous sample of this source ended */
    uint64_t last_doc, last_ptr, last_len;
    int last_valid;
} data_stream;

st_status data_stream_init(data_stream *s, data_source *src, int index, uint64_t seed, int T,
                           int shuffle, int64_t vocab_size, int64_t eod_token, st_err *err);
/* Take the sample at cursor c into row (T+1 tokens) or, with row NULL, only step over
 * it; starts receives the indices in [1, T] where a new document begins (n_starts of
 * them, at most T). Advances c by T tokens. */
st_status data_stream_take(data_stream *s, data_cursor *c, int32_t *row, int32_t *starts,
                           int *n_starts, st_err *err);

uint64_t data_source_fingerprint(const data_source *s);

#endif
