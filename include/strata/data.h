/* data.h - the data pipeline: token sources, mixing, packing, per-rank slices,
 * a prefetch ring, and a resume cursor of a few integers.
 *
 * Example:
 *
 *     st_err err = {0};
 *     st_data_loader_config cfg;
 *     st_data_loader_config_init(&cfg);
 *     cfg.n_sources = 2;                    // Megatron prefixes (.bin + .idx), mixed 70/30
 *     cfg.sources[0] = (st_data_source_config){.path = "web_text_document", .weight = 0.7};
 *     cfg.sources[1] = (st_data_source_config){.path = "code_text_document", .weight = 0.3};
 *     cfg.T = 2048; cfg.B = 8; cfg.rank = 0; cfg.world = 1;
 *     cfg.vocab_size = 50257; cfg.eod_token = 50256; cfg.mask_eod = 1;
 *     st_data_loader *dl = NULL;
 *     if (st_data_loader_open(&dl, &cfg, &err) != ST_OK) { fprintf(stderr, "strata: %s\n", err.msg); return 1; }
 *     for (int step = 0; step < 10; step++) {
 *         st_data_batch b;
 *         if (st_data_loader_next(dl, &b, &err) != ST_OK) break;
 *         // inputs: b.tokens[r*(T+1) + t], t in [0,T); targets: t in [1,T]
 *     }
 *     st_data_loader_state st;                 // save with the checkpoint (plain integers)
 *     st_data_loader_get_state(dl, &st);
 *     st_data_loader_close(dl);
 *     dl = NULL;
 *     // later, possibly with another world size (cfg.rank, cfg.world changed):
 *     if (st_data_loader_open(&dl, &cfg, &err) == ST_OK &&
 *         st_data_loader_set_state(dl, &st, &err) == ST_OK) { }  // the identical token stream
 *     st_data_loader_close(dl);
 *
 * End of example.
 *
 * The order: per source and epoch a seeded Feistel permutation of the documents
 * (O(1) memory, nothing built or cached); documents are concatenated in that order
 * and cut into samples of T+1 tokens that overlap by one token (sample k starts at
 * token k*T of the source's stream). Sources without a document index (llm.c
 * shards, raw token files, memory) are cut into windows of T+1 tokens starting at
 * multiples of T, and the windows are permuted instead. Global sample g picks its
 * source by a hash of (seed, g) against the weights in force at its step, so the
 * global stream depends on the global sample index only: rank r of world W takes
 * rows [r*B, (r+1)*B) of each global batch of W*B rows.
 *
 * Megatron "sequences" are taken as the documents (preprocess_data.py without sentence
 * splitting writes one sequence per document; so does data_pack).
 */
#ifndef STRATA_DATA_H
#define STRATA_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "strata/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ST_DATA_MAX_SOURCES 16
#define ST_DATA_STATE_MAGIC 0x53544454u /* "STDT" */
#define ST_DATA_STATE_VERSION 1u

/* The built-in byte-level tokenizer: token = byte value, end of document = 256. */
#define ST_DATA_BYTE_VOCAB 257
#define ST_DATA_BYTE_EOD 256

/* Append-only. */
typedef enum st_data_format {
    ST_DATA_FORMAT_AUTO = 0,     /* by header: MMIDIDX .idx beside it, llm.c magic (or the .u32 name: raw
                                 uint32), or said in the path as FORMAT@PATH; anything else is refused */
    ST_DATA_FORMAT_MEGATRON = 1, /* Megatron-LM indexed dataset: PREFIX.bin + PREFIX.idx */
    ST_DATA_FORMAT_LLMC = 2,     /* llm.c shard: 256 int32 header, uint16 (v1) or uint32 (v7) tokens */
    ST_DATA_FORMAT_RAW_U16 = 3,  /* headerless little-endian uint16 tokens */
    ST_DATA_FORMAT_RAW_U32 = 4,  /* headerless little-endian uint32 tokens */
    ST_DATA_FORMAT_MEMORY = 5    /* tokens already in memory (mem, mem_tokens, mem_itemsize) */
} st_data_format;

/* Megatron dtype codes, as stored in byte 17 of the .idx. */
enum {
    ST_DATA_DTYPE_U8 = 1, ST_DATA_DTYPE_I8 = 2, ST_DATA_DTYPE_I16 = 3, ST_DATA_DTYPE_I32 = 4,
    ST_DATA_DTYPE_I64 = 5, ST_DATA_DTYPE_F64 = 6, ST_DATA_DTYPE_F32 = 7, ST_DATA_DTYPE_U16 = 8,
    ST_DATA_DTYPE_U32 = 100 /* not a Megatron code: llm.c v7 shards and raw uint32 files */
};
const char *st_data_dtype_name(int code);   /* "uint16", ...; "?" if unknown */
int st_data_dtype_size(int code);           /* bytes per token; 0 if unknown */

typedef struct st_data_source_config {
    const char *path;     /* Megatron prefix (or its .bin/.idx), llm.c shard, raw token file; may
                             begin FORMAT@ (megatron, megatron-unordered, llmc, raw16, raw32) */
    double weight;        /* relative; need not sum to 1 */
    st_data_format format;   /* ST_DATA_FORMAT_AUTO unless the file cannot say */
    const void *mem;      /* ST_DATA_FORMAT_MEMORY: the tokens (must outlive the loader) */
    size_t mem_tokens;    /* ST_DATA_FORMAT_MEMORY: how many */
    int mem_itemsize;     /* ST_DATA_FORMAT_MEMORY: 2 (uint16) or 4 (uint32) */
    int unordered;        /* Megatron: accept sequences not stored back to back (else refused) */
} st_data_source_config;

/* From global step start_step on (until the next entry), the weights are these. */
typedef struct st_data_schedule_entry {
    uint64_t start_step;
    double weights[ST_DATA_MAX_SOURCES];
} st_data_schedule_entry;

typedef struct st_data_loader_config {
    int n_sources;
    st_data_source_config sources[ST_DATA_MAX_SOURCES];
    const st_data_schedule_entry *schedule; /* optional, sorted by start_step; copied at open */
    int n_schedule;
    uint32_t schedule_version; /* bump when the mix is changed by hand; saved in the state */
    int T;                /* sequence length: a row holds T+1 tokens */
    int B;                /* rows per rank per step */
    int rank, world;      /* this rank takes rows [rank*B, (rank+1)*B) of each global batch */
    uint64_t seed;
    int64_t vocab_size;   /* tokens must be in [0, vocab_size); 0 = no check */
    int64_t eod_token;    /* end-of-document id; -1 = none (init default) */
    int mask_eod;         /* loss_mask = 0 where the target starts a new document */
    int prefetch;         /* ring depth (init default 4); 0 = produce on the caller's thread */
    int no_shuffle;       /* 1 = documents / windows in file order (tests, debugging) */
} st_data_loader_config;

/* Defaults: weights 1, eod_token -1, prefetch 4, B 1, world 1; the caller sets the rest. */
void st_data_loader_config_init(st_data_loader_config *cfg);

/* One rank's batch. Pointers are owned by the loader and valid until the next call
 * to st_data_loader_next (or close). Inputs are tokens[r*(T+1) + t] for t in [0,T),
 * targets the same row at t+1. */
typedef struct st_data_batch {
    int B, T;
    const int32_t *tokens;     /* [B][T+1] */
    const int32_t *positions;  /* [B][T] position of each input in its segment, from 0 */
    const uint8_t *loss_mask;  /* [B][T] 1 = count this target; 0 where mask_eod drops it or where
                                  the source's loss mask (PREFIX.mask) says not to train on it */
    const int32_t *cu_seqlens; /* [n_seqs+1] segment starts in the flattened B*T inputs; a
                                  segment ends at a document start or at the row's end */
    int n_seqs;
    int max_seqlen;            /* longest segment, in tokens */
    const uint8_t *source;     /* [B] which source each row came from */
    uint64_t step;             /* global batch index */
    uint64_t first_sample;     /* global sample index of this rank's row 0 */
} st_data_batch;

/* Per source: where its stream stands. Indexed sources: document `doc` of the
 * permutation of epoch `epoch`, token `offset` inside it. Windowed: window `doc`. */
typedef struct st_data_cursor {
    uint64_t epoch, doc, offset;
} st_data_cursor;

/* The whole loader state: plain integers, fixed size, saved with the checkpoint.
 * It describes the global stream, so it is the same on every rank and restores
 * under any world size. */
typedef struct st_data_loader_state {
    uint32_t magic, version;    /* ST_DATA_STATE_MAGIC, ST_DATA_STATE_VERSION */
    uint64_t seed;
    uint64_t step;              /* global batches delivered */
    uint64_t sample;            /* global samples delivered */
    uint32_t schedule_version;
    uint32_t n_sources;
    uint32_t seq_len;           /* T when saved: windowed sources (no index) need the same T */
    uint32_t reserved;
    uint64_t fingerprint[ST_DATA_MAX_SOURCES]; /* per source: its size, to refuse a swapped dataset */
    st_data_cursor cursor[ST_DATA_MAX_SOURCES];
} st_data_loader_state;

/* Loader counters for the benchmark. Bytes are what the loader itself reads (token
 * bytes from the sources, index entries) and writes (the batch arrays). */
typedef struct st_data_loader_stats {
    uint64_t batches, tokens;       /* delivered to this rank; tokens = B*T per batch */
    uint64_t bytes_read, bytes_written;
    double wait_s;                  /* time st_data_loader_next spent waiting on the producer */
    size_t ring_bytes;              /* memory of the prefetch ring */
} st_data_loader_stats;

typedef struct st_data_loader st_data_loader;

st_status st_data_loader_open(st_data_loader **out, const st_data_loader_config *cfg, st_err *err);
st_status st_data_loader_next(st_data_loader *dl, st_data_batch *b, st_err *err);
/* The state after the last batch returned by next (the producer may be ahead). */
void st_data_loader_get_state(const st_data_loader *dl, st_data_loader_state *st);
/* Continue from st: same seed and sources required; schedule and world may differ. */
st_status st_data_loader_set_state(st_data_loader *dl, const st_data_loader_state *st, st_err *err);
void st_data_loader_get_stats(const st_data_loader *dl, st_data_loader_stats *s);
void st_data_loader_close(st_data_loader *dl);
/* A data list as the training configuration's data and val_data keys give it,
 * "PATH[:WEIGHT],PATH[:WEIGHT],..." (a weight is a positive number, 1 when not given; each
 * PATH may begin FORMAT@), cut in place: cfg's sources point into list. Sets n_sources and
 * the sources' path and weight only. Errors name KEY, the source and what to give. */
st_status st_data_list_parse(st_data_loader_config *cfg, char *list, const char *key, st_err *err);
/* Every source of the data list opened and checked as a loader for rows of T+1 tokens and
 * a model of vocab_size (0: not checked) opens them (format, header, index, sidecar, enough
 * tokens for a row), then closed, no token read: what a run calls before it writes
 * anything. "embedded" (the built-in corpus) passes. Errors are prefixed "key 'KEY'". */
st_status st_data_list_check(const char *key, const char *list, int T, int64_t vocab_size, st_err *err);
/* The model's inputs and targets ([B][T] each) of a batch: inputs[r*T+t] = tokens[r*(T+1)+t],
 * targets the next token, or -1 (ignored by every loss) where loss_mask is 0. */
void st_data_batch_targets(const st_data_batch *b, int32_t *inputs, int32_t *targets);

/* One source opened on its own (inspection, tests). */
typedef struct st_data_source st_data_source;
typedef struct st_data_source_info {
    st_data_format format;
    int dtype;            /* Megatron dtype code */
    uint64_t n_docs;      /* documents in the index; 0 for sources without one */
    uint64_t n_tokens;
    const char *bin_path; /* the file holding the tokens */
    const char *sidecar_path; /* PREFIX.json written by data_pack; NULL if none */
    int64_t vocab_size, eod; /* what the sidecar says; 0 and -1 if none */
} st_data_source_info;
st_status st_data_source_open(st_data_source **out, const st_data_source_config *cfg, st_err *err);
void st_data_source_get_info(const st_data_source *s, st_data_source_info *info);
/* Length of document d in tokens (indexed sources only). */
st_status st_data_source_doc_len(st_data_source *s, uint64_t d, uint64_t *len, st_err *err);
/* Read n tokens from token index `start` of document d (or of the file when it has no
 * index: d = 0) into out as int32, checking 0 <= t < vocab_size when vocab_size > 0. */
st_status st_data_source_read(st_data_source *s, uint64_t d, uint64_t start, uint64_t n, int32_t *out,
                           int64_t vocab_size, st_err *err);
void st_data_source_close(st_data_source *s);
/* The loss mask bytes (1 = trained on as a target) of n tokens from token `start` of document
 * d, from the PREFIX.mask its sidecar names; ST_ERR_INVALID when the source has none. */
st_status st_data_source_read_mask(st_data_source *s, uint64_t d, uint64_t start, uint64_t n, uint8_t *out, st_err *err);

/* Writing a Megatron .bin/.idx pair, a document at a time. */
typedef struct st_data_pack_writer st_data_pack_writer;
st_status st_data_pack_open(st_data_pack_writer **out, const char *prefix, int dtype, st_err *err);
st_status st_data_pack_add(st_data_pack_writer *w, const int32_t *tokens, size_t n, st_err *err);
/* A document with its loss mask (mask[i] = 1: train on token i as a target), written to
 * PREFIX.mask (one byte a token, indexed like the tokens) and named in the sidecar, which the
 * loader then reads. Either every document of a pack has a mask or none has. */
st_status st_data_pack_add_masked(st_data_pack_writer *w, const int32_t *tokens, const uint8_t *mask, size_t n,
                               st_err *err);
st_status st_data_pack_close(st_data_pack_writer *w, st_err *err); /* writes the .idx; frees w */
void st_data_pack_abort(st_data_pack_writer *w);                    /* frees w, removes both files */
/* What the sidecar PREFIX.json that close then writes says (without a call, close removes a
 * stale one). A source opened with a sidecar refuses reads with a smaller vocab_size. */
typedef struct st_data_pack_meta {
    int64_t vocab_size;          /* ids are in [0, vocab_size) */
    int64_t eod;                 /* the end-of-document id appended to each document */
    const char *tokenizer;       /* its name: the file's basename, or "bytes" (copied) */
    int has_digest;              /* the next two are set */
    uint32_t tokenizer_crc32c;   /* CRC-32C of the tokenizer file's bytes */
    uint64_t tokenizer_bytes;
    const char *mask_kind;       /* with st_data_pack_add_masked: what the mask keeps ("assistant",
                                    "all"; a static string), written beside the mask's name */
    const char *pattern;         /* a rank file's pre-tokenizer regex (st_tokenizer_pattern), NULL
                                    for none; written as tokenizer.pattern (copied) */
    const char *pattern_name;    /* its known name (gpt2, ..., qwen2) or NULL; tokenizer.pattern_name */
} st_data_pack_meta;
st_status st_data_pack_set_meta(st_data_pack_writer *w, const st_data_pack_meta *m, st_err *err);

/* The byte-level tokenizer: writes n tokens (one per byte) to out. */
void st_data_tokenize_bytes(const void *text, size_t n, int32_t *out);

/* The shared data plane: one producer process feeds n_local training processes of
 * one machine through a ring in shared memory (/dev/shm/<name>). The producer runs
 * a loader whose ranks are the local ranks [first_rank, first_rank + n_local) of
 * cfg->world, all with cfg->B rows; consumer i receives exactly what a loader with
 * rank first_rank + i would give. cfg->rank is ignored.
 * Faults: a producer or consumer that dies (even by SIGKILL) ends the others with an
 * error naming it within milliseconds; a producer that makes no progress for timeout_s
 * (0: 5 s; stopped, or stuck in its loader) ends the consumers the same way. A segment
 * left by a producer that died is replaced by the next producer of that name; one with
 * a live producer is refused (ST_ERR_BUSY). */
typedef struct st_data_plane st_data_plane;
st_status st_data_plane_serve(st_data_plane **out, const char *name, const st_data_loader_config *cfg,
                           int first_rank, int n_local, double timeout_s, st_err *err);
/* Waits up to timeout_s for the producer to create the ring. */
st_status st_data_plane_attach(st_data_plane **out, const char *name, int local_index, double timeout_s,
                            st_err *err);
st_status st_data_plane_next(st_data_plane *p, st_data_batch *b, st_err *err);
void st_data_plane_get_state(const st_data_plane *p, st_data_loader_state *st);
/* ST_OK while the plane works; its error once it has failed (a loader error, a peer that
 * died or went silent). The producer's process polls this; consumers get it from next. */
st_status st_data_plane_check(st_data_plane *p, st_err *err);
/* Consumer: detaches. Producer: stops after the consumers detach or after it is told
 * to; removes the shared memory. */
void st_data_plane_close(st_data_plane *p);

/* The embedded default corpus: deterministic English-like text (byte tokens, 0..255) written to
 * buf[0..cap); returns the bytes written. */
size_t st_data_embedded_generate(uint8_t *buf, size_t cap, uint64_t seed);

#ifdef __cplusplus
}
#endif
#endif
