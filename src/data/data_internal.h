/* data_internal.h - pieces of the data pipeline shared between its files (and tests):
 * the source struct, the per-source stream walk, the permutation, the batch builder. */
#ifndef STRATA_DATA_INTERNAL_H
#define STRATA_DATA_INTERNAL_H

#include <limits.h>
#include <stdint.h>

#include "strata/data.h"

#define DATA_PATH_MAX 4096

/* Per-token loops of every batch, also compiled for AVX2 (chosen at load time). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DATA_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define DATA_CLONES
#endif

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

struct st_data_source {
    st_data_format format;
    int dtype, itemsize;
    int unordered;           /* Megatron: sequences need not be stored back to back */
    char bin_path[DATA_PATH_MAX + 8], idx_path[DATA_PATH_MAX + 8];
    int fd;                  /* token file; -1 for memory sources */
    const uint8_t *mem;      /* memory sources */
    uint64_t data_off;       /* byte offset of token 0 (llm.c: after the header) */
    uint64_t n_tokens, bin_bytes;
    /* Megatron index, memory-mapped */
    const uint8_t *idx_map;
    size_t idx_bytes;
    int idx_fd;              /* index lookups (one entry, or a window's) pread this (source.c) */
    uint64_t n_docs, n_doc_idx;
    /* staging: file bytes of tokens before widening to int32, and of index runs */
    uint8_t *stage;
    size_t stage_bytes;
    /* counters (bytes the loader moves because of this source) */
    uint64_t bytes_read, bytes_written, idx_lookups;
    /* Megatron: PREFIX.json written by data_pack ("" when absent), and what it says */
    char sidecar_path[DATA_PATH_MAX + 8];
    int64_t sidecar_vocab, sidecar_eod;
    /* PREFIX.mask named by the sidecar: one byte a token, 0 = not a target to train on. With
     * mask_in_sign (set by the loader) reads return such a token as token | INT32_MIN. */
    char mask_path[DATA_PATH_MAX + 8];
    int has_mask, mask_fd, mask_in_sign;
    /* A view (view.c): the documents seen are view_docs[0, n_view) of the base dataset this
     * struct opened (n_docs, the index and the .bin are the base's); n_tokens is theirs.
     * view_ordered: read them in the view's order, never shuffled (a curriculum). */
    uint64_t *view_docs, n_view;
    uint64_t view_crc;       /* CRC-32C of the ids, in the loader state's fingerprint */
    int view_ordered;
    st_data_pacing view_pace; /* kind NONE: not paced */
    st_data_ident view_base;  /* the base's identity, checked when the view was opened */
    char view_path[DATA_PATH_MAX + 8];
};

/* Documents a reader sees: a view's, else the index's. */
static inline uint64_t data_source_n_docs(const st_data_source *s) { return s->view_docs ? s->n_view : s->n_docs; }
/* Open the Megatron pair PREFIX.bin/.idx into s (source.c). */
st_status data_source_open_megatron(st_data_source *s, const char *prefix, st_err *err);
/* Open the view file path into s: its base dataset, checked against the identity the view
 * was made for, and its document ids (view.c). */
st_status data_view_open(st_data_source *s, const char *path, st_err *err);
/* The identity of an opened Megatron source (score.c). */
st_status data_source_ident(st_data_source *s, st_data_ident *id, st_err *err);
/* ST_INVALID naming dataset when it is a view, where a Megatron dataset is needed (score.c). */
st_status data_refuse_view(const char *dataset, st_err *err);
/* A dataset's PREFIX (given as PREFIX, PREFIX.bin or PREFIX.idx), absolute (score.c). */
st_status data_dataset_abspath(const char *dataset, char *out, size_t cap, st_err *err);
/* A whole file into malloc'd memory (score.c). */
st_status data_read_file(const char *path, uint8_t **out, size_t *n, st_err *err);

/* The sidecar of a Megatron source (pack.c): read PREFIX.json if there, after the pair is
 * checked (refused when damaged or when its counts are not the pair's); and refuse a
 * vocab_size smaller than the one the data was packed with (vocab_size 0: no check). */
st_status data_sidecar_read(st_data_source *s, const char *prefix, st_err *err);
st_status data_sidecar_check(const st_data_source *s, int64_t vocab_size, st_err *err);
/* Open the loss mask `name` beside the sidecar (pack.c); its size must be the token count. */
st_status data_mask_open(st_data_source *s, const char *name, st_err *err);

/* Document d of an indexed source: byte pointer into the .bin and length in tokens,
 * checked against the .bin size and (unless the source is unordered) against the end of
 * document d-1: sequences are stored back to back. */
st_status data_source_doc(st_data_source *s, uint64_t d, uint64_t *ptr, uint64_t *len, st_err *err);
/* Index entries of many documents at once (a stream's lookahead window; the stream
 * itself reads them in steps with data_source_doc_runs). keys are
 * (document << DATA_KEY_POS_BITS | slot), sorted ascending; the raw entries of the
 * document in each key land in len[slot] and ptr[slot], unchecked (use
 * data_source_doc_entry), and, when prev_end is not NULL and the source is not
 * unordered, the byte where the document before it ends in prev_end[slot] (0 for
 * document 0). Neighbouring entries share one pread. */
#define DATA_KEY_POS_BITS 24
st_status data_source_doc_batch(st_data_source *s, const uint64_t *keys, size_t n, int32_t *len, int64_t *ptr,
                                int64_t *prev_end, st_err *err);
/* One step of that: from keys[*i] on, the entries of one index array (which = 0: sizes
 * into len, 1: pointers into ptr; the sizes of a set of keys before their pointers, as
 * prev_end needs both), in preads of neighbouring entries, until max_preads preads or
 * max_bytes bytes are done (at least one pread); advances *i past them. */
st_status data_source_doc_runs(st_data_source *s, const uint64_t *keys, size_t n, size_t *i, int which,
                               int max_preads, size_t max_bytes, int32_t *len, int64_t *ptr, int64_t *prev_end,
                               st_err *err);
/* Check a raw entry of document d as data_source_doc does (prev_end: where document d-1
 * ends, from data_source_doc_runs), and return it. */
st_status data_source_doc_entry(const st_data_source *s, uint64_t d, int32_t n, int64_t p, int64_t prev_end,
                                uint64_t *ptr, uint64_t *len, st_err *err);
/* Read n tokens starting at byte offset `base` of the token file (no index lookup;
 * the caller has checked the range against the document it came from). */
st_status data_source_read_at(st_data_source *s, uint64_t base, uint64_t n, int32_t *out, int64_t vocab_size,
                              st_err *err);

/* A bijection on [0, n) from a key: Feistel network on the next even power of two,
 * cycle-walking back into range. O(1) memory, about 2 evaluations on average. */
uint64_t data_perm(uint64_t j, uint64_t n, uint64_t key);
uint64_t data_mix64(uint64_t x);

/* Convert n tokens of a Megatron dtype to int32 with the vocabulary check. Returns the
 * index of the first bad token, or n if all are good (bad_value receives it). */
size_t data_convert(const void *src, int dtype, size_t n, int32_t *dst, int64_t vocab_size,
                    int64_t *bad_value);

/* A window of the lookahead: positions [first, first + n) of the permutation of epoch
 * `epoch`, read in stages (see stream.c); its arrays are valid once stage is ready. */
typedef struct data_window {
    uint64_t epoch, first, key;
    uint32_t n, at;       /* positions; progress inside the stage */
    int stage, pass, passes;
    uint64_t *doc;        /* [la_cap] document at each position */
    int32_t *len;         /* [la_cap] its raw size entry */
    int64_t *ptr;         /* [la_cap] its raw pointer entry */
    int64_t *prev_end;    /* [la_cap] where the document before it ends (NULL: unordered source) */
} data_window;

/* The stream of one source within a loader: T+1-token samples overlapping by one. */
typedef struct data_stream {
    st_data_source *src;
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
    /* Lookahead (indexed sources; stream.c says why): the index entries of windows of
     * upcoming permutation positions, read together. While the current window serves
     * lookups, the next one is read a bounded step at a time, so no single lookup
     * waits for a whole window. Windows start small (the first batch comes quickly)
     * and grow to la_cap. */
    uint32_t la_cap;      /* most positions a window holds; 0 = one lookup per document */
    uint32_t la_size;     /* size of the next window to start */
    uint32_t la_lookups;  /* lookups since the last step of the next window */
    int la_cur;           /* which of win[] serves lookups */
    data_window win[2];
    uint64_t *la_keys, *la_tmp; /* [la_cap] sort scratch of the window being read */
} data_stream;

/* Positions per lookahead window: per source by default, at most TOTAL over all of a
 * loader's sources (72 bytes a position: two windows of 28 and 16 of sort scratch, so
 * 18.9 MB at the total), and FIRST for the first window after an open or a jump. */
#define DATA_LOOKAHEAD_DEFAULT (1u << 16)
#define DATA_LOOKAHEAD_TOTAL (1u << 18)
#define DATA_LOOKAHEAD_FIRST 16u

st_status data_stream_init(data_stream *s, st_data_source *src, int index, uint64_t seed, int T,
                           int shuffle, int64_t vocab_size, int64_t eod_token, st_err *err);
/* Set the lookahead window (positions; 0 = off, look up each document on its own).
 * The stream's samples do not depend on it. Call before the first take. */
st_status data_stream_set_lookahead(data_stream *s, uint32_t cap, st_err *err);
void data_stream_free(data_stream *s);
/* Take the sample at cursor c into row (T+1 tokens) or, with row NULL, only step over
 * it; starts receives the indices in [1, T] where a new document begins (n_starts of
 * them, at most T). Advances c by T tokens. */
st_status data_stream_take(data_stream *s, st_data_cursor *c, int32_t *row, int32_t *starts,
                           int *n_starts, st_err *err);
/* data_stream_take, and the documents of the row's segments: docs[0] the one the row starts
 * in, docs[k + 1] the one starting at starts[k] (T + 1 entries at most; a view's documents
 * as ids of its base; UINT64_MAX for a source without an index) and visits[] the epoch of the
 * stream at each (the how-many-th pass over the source). docs and visits may be NULL. */
st_status data_stream_take_docs(data_stream *s, st_data_cursor *c, int32_t *row, int32_t *starts,
                                int *n_starts, uint64_t *docs, uint32_t *visits, st_err *err);

uint64_t data_source_fingerprint(const st_data_source *s);

#endif
