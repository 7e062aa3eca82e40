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
#include <stdio.h>

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
    ST_DATA_FORMAT_MEMORY = 5,   /* tokens already in memory (mem, mem_tokens, mem_itemsize) */
    ST_DATA_FORMAT_VIEW = 6      /* a view (st_data_select): documents of a Megatron dataset by id,
                                    no token copied; known by its magic "STRATAVW" */
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
    int online_mix;       /* 1 = every step's weights from st_data_loader_set_step_weights (online
                             mixing): the producer waits for a step's weights before building it;
                             the weights and the schedule above are not used */
    int online_group;     /* online_mix: batches a weight step spans (the micro-batches of an optimizer
                             step: its weights are those of weight step batch / online_group); 0 = 1 */
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
    const uint64_t *seg_doc;   /* [n_seqs] the document each segment is of, in its source (a view's:
                                  the id in its base dataset; UINT64_MAX: a source without an index) */
    const uint32_t *seg_visit; /* [n_seqs] the epoch of its source's stream there (0: first pass) */
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
/* Online mixing (config online_mix): the weights of weight step `step` (the batches
 * [step * online_group, (step + 1) * online_group); n_sources of them, as weights are
 * checked), for a step none of whose batches is built yet and within 16 steps of the next
 * one (refused otherwise, naming both). The batch of a step is built only once its
 * weights are set, so the stream is the same however the prefetch thread runs. */
st_status st_data_loader_set_step_weights(st_data_loader *dl, uint64_t step, const double *w, st_err *err);
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
/* The batch the last st_data_loader_next handed out (valid until the next call): 1, or 0
 * when none was. */
int st_data_loader_last_batch(const st_data_loader *dl, st_data_batch *b);
struct st_data_ident;
/* Source i's dataset identity (strata/data.h's st_data_ident; a view's: its base's) and the
 * path of its .bin/.idx PREFIX; a source without a document index: identity all zero and
 * its token file's path. */
st_status st_data_loader_source_ident(st_data_loader *dl, int i, struct st_data_ident *id, char *path, size_t cap,
                                      st_err *err);
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

/* ---------------------------------------------------------------------------
 * Scores, deduplication and views (data selection without copying tokens).
 *
 * A dataset's identity binds a score file or a view to the Megatron pair it was made
 * from: document and token counts, dtype, the byte sizes of .idx and .bin, the CRC-32C
 * of the whole .idx (every document's length and place) and the CRC-32C of the .bin's
 * sampled blocks (ST_DATA_IDENT_BLOCKS blocks of ST_DATA_IDENT_BLOCK_BYTES spread evenly
 * over it, the whole file when it is smaller): opening costs the .idx plus at most 4 MiB,
 * whatever the dataset's size. A re-packed, grown, truncated or swapped dataset changes
 * it; an edit of tokens in place that keeps every length and misses the sampled blocks
 * does not. */
#define ST_DATA_IDENT_BLOCKS 64
#define ST_DATA_IDENT_BLOCK_BYTES (64u * 1024u)
typedef struct st_data_ident {
    uint64_t n_docs, n_tokens;
    uint64_t idx_bytes, bin_bytes;
    uint32_t idx_crc32c, bin_crc32c;  /* whole .idx; sampled .bin blocks */
    uint32_t dtype, reserved;
} st_data_ident;
/* The identity of the Megatron dataset PREFIX (or its .bin/.idx). */
st_status st_data_ident_compute(const char *dataset, st_data_ident *id, st_err *err);
/* ST_OK when a and b are the same dataset; otherwise the error names file (the score file
 * or view), dataset, and the first field that differs. */
st_status st_data_ident_check(const st_data_ident *want, const st_data_ident *have, const char *file,
                              const char *dataset, st_err *err);

/* A score file: one score per document of a dataset, bound to it by identity.
 * On disk (little-endian): "STRATASC", u32 version (1), u32 header bytes, the identity
 * (48 bytes), u64 documents, char kind[32], char params[256], char dataset[4096] (its
 * absolute path), then f64 score[n], i64 ref[n], u8 dup[n], and a u32 CRC-32C of
 * everything before it. Written to a temporary and renamed: a crash leaves no partial
 * file under the name. */
#define ST_DATA_SCORES_MAGIC "STRATASC"
#define ST_DATA_SCORES_VERSION 1u
enum { ST_DATA_DUP_NONE = 0, ST_DATA_DUP_EXACT = 1, ST_DATA_DUP_NEAR = 2 };
typedef struct st_data_scores {
    st_data_ident ident;
    char dataset[4096];    /* the dataset's absolute path (PREFIX) */
    char kind[32];         /* "dedup", "external" or "proxy" */
    char params[256];      /* how they were made, for people */
    uint64_t n_docs;
    double *score;         /* [n_docs] dedup: estimated Jaccard similarity with ref (1 exact), 0 unique */
    int64_t *ref;          /* [n_docs] dedup: the earliest document this one repeats; -1: none */
    uint8_t *dup;          /* [n_docs] ST_DATA_DUP_* */
} st_data_scores;
/* Allocates the arrays for n documents (score 0, ref -1, dup 0); the rest is the caller's. */
st_status st_data_scores_alloc(st_data_scores *sc, uint64_t n, st_err *err);
void st_data_scores_free(st_data_scores *sc);
st_status st_data_scores_write(const char *path, const st_data_scores *sc, st_err *err);
/* Read and check a score file; when dataset is not NULL it must be the dataset the file
 * was made for (same identity), else refused naming both. */
st_status st_data_scores_read(const char *path, const char *dataset, st_data_scores *sc, st_err *err);
/* One score per line of a text file (external scores, e.g. a proxy model's losses) for the
 * documents of dataset, in order; refused (naming the file and line) when the count
 * differs or a score is not a finite number. */
st_status st_data_scores_from_text(const char *text_path, const char *dataset, st_data_scores *sc, st_err *err);

/* Proxy-loss scores: the mean loss (nats per predicted token) of every document of dataset
 * under model m, forward only. Documents are packed back to back into batches of B rows of
 * T positions with document attention (st_model_set_docs: no document sees another's
 * tokens; a document longer than what is left of a row goes on at the next row, its
 * position restarting there); the per-position losses (the model's row_losses) are summed per
 * document in document order, so the scores depend on B, T and the model only, not on the
 * thread count (the backend's threads compute the forward). A document of one token has
 * nothing to predict: score 0 (counted in empty_docs). A token outside the model's
 * vocabulary is refused naming the .bin, the token, its byte offset and the vocabulary.
 * out->kind "proxy"; allocated here (st_data_scores_free). */
struct st_model;
typedef struct st_data_proxy_config {
    int B, T;               /* rows per forward (default 8) and row length (default min(256, the model's
                               context); at most the context) */
    int progress;           /* a progress line on stderr about once a second, and a last one */
    const char *model_name; /* what the score file's params name the model by (NULL: its architecture) */
} st_data_proxy_config;
void st_data_proxy_config_init(st_data_proxy_config *cfg);
typedef struct st_data_proxy_stats {
    uint64_t n_docs, n_tokens, n_targets, forwards, empty_docs;
    int B, T;               /* the batch used */
    double flops;           /* the forwards' model FLOPs (a third of ops->flops_per_token a position,
                               every position of every forward, padding included) */
    double seconds;         /* the whole pass, reading included */
    double forward_s;       /* in the model's forward */
} st_data_proxy_stats;
st_status st_data_score_proxy(const char *dataset, struct st_model *m, const st_data_proxy_config *cfg,
                              st_data_scores *out, st_data_proxy_stats *stats, st_err *err);
/* Reducible loss: m's proxy score minus ref's (a model trained on held-out data), document by
 * document, kind "reducible"; stats add both passes. ref_name names it in the file's params. */
st_status st_data_score_reducible(const char *dataset, struct st_model *m, struct st_model *ref,
                                  const st_data_proxy_config *cfg, const char *ref_name, st_data_scores *out,
                                  st_data_proxy_stats *stats, st_err *err);

/* Per-document signals of a run (key doc_signals): for every document a step trained on,
 * per segment of a row (a document cut over rows or steps gives several records), the loss
 * summed over its counted targets. RUN_DIR/doc_signals.bin (little-endian): a header of
 * ST_DATA_DOCSIG_HEADER_BYTES: "STRATADS", u32 version (1), u32 header bytes, u32 record
 * bytes (40), u32 sources, u64 the most records kept (the bound), u32 rows a step
 * (batch x grad_accum x ranks), u32 T, u32 0, u32 CRC-32C of the header with this field 0, then 24 reserved bytes; then per
 * source (ST_DATA_MAX_SOURCES slots) its identity (48 bytes, all 0 for a source without a
 * document index) and its PREFIX (464 bytes, NUL-padded). Then records, in the order of the
 * global samples (step, micro-batch, rank, row, segment): the same whatever the ranks. */
#define ST_DATA_DOCSIG_MAGIC "STRATADS"
#define ST_DATA_DOCSIG_VERSION 1u
#define ST_DATA_DOCSIG_FILE "doc_signals.bin"
#define ST_DATA_DOCSIG_PATH_BYTES 464
#define ST_DATA_DOCSIG_HEADER_BYTES (64 + ST_DATA_MAX_SOURCES * (48 + ST_DATA_DOCSIG_PATH_BYTES))
typedef struct st_data_docsig {
    uint64_t doc;          /* the document's id in its source (a view's: in its base) */
    uint64_t step;         /* the run's step (from 1) */
    double loss_sum;       /* nats, over its counted targets in this segment */
    uint32_t count;        /* counted targets */
    uint32_t visit;        /* the epoch of the source's stream (0: first pass over it) */
    uint16_t source;       /* index in the run's data list */
    uint16_t micro;        /* in memory only: the micro-batch (0 on disk) */
    uint32_t reserved;
} st_data_docsig;

/* Open run_dir's doc_signals.bin and check its header (magic, version, sizes, CRC-32C), read
 * into h (ST_DATA_DOCSIG_HEADER_BYTES; its CRC field zeroed); *f is left at the first record
 * (read them with fread, st_data_docsig each), *n_sources the run's sources. Refusals name
 * the file and the offset. */
st_status st_data_docsig_open(const char *run_dir, FILE **f, uint8_t *h, uint32_t *n_sources, st_err *err);
/* Learning-dynamics scores of dataset from a run's doc_signals.bin (run_dir's): the run's
 * source whose identity is dataset's (refused naming both when none is). Per document, the
 * records of each visit summed; metric "first": the mean loss of its first visit; "drop":
 * first visit's mean loss minus its last visit's (0 with one visit); "forget": forgetting
 * events, visits whose mean loss rose over the visit before. A document no record covers
 * gets `unseen` when unseen_ok, else the call is refused naming how many. out->kind
 * "dynamics"; allocated here. */
typedef struct st_data_dynamics_stats {
    uint64_t records, docs_seen, unseen, max_visits;
    int source;            /* the run's source it scored */
} st_data_dynamics_stats;
st_status st_data_score_dynamics(const char *dataset, const char *run_dir, const char *metric, int unseen_ok,
                                 double unseen, st_data_scores *out, st_data_dynamics_stats *stats, st_err *err);

/* Online data mixing (--mix online): the sources' weights adapted during the run from
 * their training loss, an EXP3 bandit as in Albalak et al. 2023 (online data mixing). With
 * K sources, after t updates: eps_t = min(1/K, sqrt(ln K / (K t))) (eps_0 taken as eps_1);
 * the weights are pi_i = (1 - K eps_{t+1}) softmax(eps_t R)_i + eps_{t+1} (uniform at the
 * start); an update with source i's loss sum L_i over n_i targets (n_i > 0) sets
 * R_i = alpha R_i + (1 - alpha) (L_i / n_i) / pi_i (a source absent from the step keeps
 * R_i). The weights of an update made after step s (0-based) are used from step
 * s + delay: the data loader builds batches up to delay - 1 steps ahead while the run
 * trains; steps [0, delay) use the uniform weights. The struct is the whole state, plain
 * numbers (saved with a checkpoint as it is, after st_data_mix_online_seal). */
#define ST_DATA_MIX_MAGIC 0x5354584du /* "STXM" */
#define ST_DATA_MIX_VERSION 1u
#define ST_DATA_MIX_MAX_DELAY 8
typedef struct st_data_mix_online {
    uint32_t magic, version, K, delay;
    uint64_t t;                                  /* updates made (steps observed) */
    double alpha;                                /* smoothing of the rewards */
    double reward[ST_DATA_MAX_SOURCES];          /* R */
    double weights[ST_DATA_MAX_SOURCES];         /* pi after the last update */
    double ring[ST_DATA_MIX_MAX_DELAY][ST_DATA_MAX_SOURCES]; /* step q's weights at q % delay, q in [t, t + delay) */
    uint32_t crc32c, reserved;                   /* CRC-32C of the bytes before it (seal) */
} st_data_mix_online;
/* K sources (2..ST_DATA_MAX_SOURCES), alpha in [0, 1), delay 1..ST_DATA_MIX_MAX_DELAY. */
st_status st_data_mix_online_init(st_data_mix_online *m, int K, double alpha, int delay, st_err *err);
/* One step's per-source loss sums and target counts (all ranks' together). */
st_status st_data_mix_online_update(st_data_mix_online *m, const double *loss_sum, const double *count, st_err *err);
/* The weights of global step `step`, or NULL when the state does not hold them (outside
 * [t, t + delay)). */
const double *st_data_mix_online_weights_for(const st_data_mix_online *m, uint64_t step);
void st_data_mix_online_seal(st_data_mix_online *m);
/* A state read back: magic, version, CRC and K sources checked; errors name where. */
st_status st_data_mix_online_check(const st_data_mix_online *m, int K, const char *where, st_err *err);

/* Deduplication: exact duplicates by a 128-bit hash of the token content (confirmed by
 * comparing the tokens), near duplicates by MinHash over token n-grams with banded LSH,
 * candidate pairs verified by the estimated Jaccard similarity. Every duplicate points at
 * the earliest document it repeats (ref); the earliest of a group is kept (ref -1).
 * Memory: 4 * num_hashes + 40 bytes a document (signatures in one array) plus a token
 * buffer per thread; tokens are streamed a document at a time, never held. */
typedef struct st_data_dedup_config {
    int ngram;           /* tokens per shingle (default 5); shorter documents: one shingle */
    int num_hashes;      /* MinHash signature length (default 128) */
    int bands, rows;     /* LSH: bands x rows <= num_hashes (default 32 x 4) */
    double threshold;    /* near duplicate: estimated Jaccard >= threshold (default 0.7) */
    uint64_t seed;       /* hash functions (default 1) */
    int threads;         /* OpenMP threads; 0 = the default */
    int max_compare;     /* per LSH bucket, each document is compared with at most this many
                            earlier ones (default 16): bounds the work of huge buckets */
} st_data_dedup_config;
void st_data_dedup_config_init(st_data_dedup_config *cfg);
typedef struct st_data_dedup_stats {
    uint64_t n_docs, n_tokens, exact, near, candidates, verified;
    double exact_s, minhash_s, lsh_s, total_s;
    size_t mem_bytes;    /* what the deduplication allocated, at most at once */
} st_data_dedup_stats;
/* Scores of dataset: out->kind "dedup". out is allocated here (st_data_scores_free). */
st_status st_data_dedup(const char *dataset, const st_data_dedup_config *cfg, st_data_scores *out,
                        st_data_dedup_stats *stats, st_err *err);

/* A view: the documents of a Megatron dataset by id, in order, no token copied. Every
 * data option of strata train opens it as a source (its format known by its magic).
 * On disk: "STRATAVW", u32 version (1, or 2 for a paced curriculum), u32 header bytes,
 * the base identity (48 bytes), u64 kept documents, u64 kept tokens, u32 ordered (1: read
 * in the view's order, not shuffled; 2: paced), u32 reserved, char rule[512], char
 * base[4096] (absolute path of the base PREFIX), version 2 only: the pacing (u32 kind, u32
 * steps, f64 start, f64 length, f64 band), then u64 document ids [kept], then a u32
 * CRC-32C of everything before it.
 *
 * Pacing (a competence-based curriculum, Platanios et al. 2019): the view's documents are
 * ranked easiest first (its order); draw g of the source's stream (g = epoch x n + position,
 * n documents) while g < P = ceil(length x n) takes a document at random (seeded by the run's
 * seed and g) among the easiest ceil(c(g / P) x n), or, with band W > 0, in a band of
 * ceil(W x n) documents that slides from the easiest to the hardest as c grows; from draw P
 * on, every document in a shuffled order each epoch. The competence c(t), c0 = start: linear
 * c0 + (1 - c0) t; root sqrt(c0^2 + (1 - c0^2) t); step (K steps) c0 + (1 - c0) floor(K t) / (K - 1),
 * each at most 1. */
#define ST_DATA_VIEW_MAGIC "STRATAVW"
#define ST_DATA_VIEW_VERSION 1u
#define ST_DATA_VIEW_VERSION_PACED 2u
typedef enum st_data_pace {
    ST_DATA_PACE_NONE = 0,
    ST_DATA_PACE_LINEAR = 1,
    ST_DATA_PACE_ROOT = 2,
    ST_DATA_PACE_STEP = 3
} st_data_pace;
typedef struct st_data_pacing {
    uint32_t kind;            /* st_data_pace */
    uint32_t steps;           /* STEP: K, 2..1000 */
    double start;             /* c0, in (0, 1] (default 0.1) */
    double length;            /* P / n: pacing lasts this many of the view's documents' worth of draws, > 0 (default 1) */
    double band;              /* 0: the easiest prefix; in (0, 1): the width of a sliding band */
} st_data_pacing;
/* The competence at t in [0, 1] (1 beyond). */
double st_data_pacing_competence(const st_data_pacing *p, double t);
typedef enum st_data_keep {
    ST_DATA_KEEP_ALL = 0,     /* no score rule */
    ST_DATA_KEEP_LOWEST = 1,  /* the fraction with the lowest scores */
    ST_DATA_KEEP_HIGHEST = 2, /* the fraction with the highest */
    ST_DATA_KEEP_BAND = 3     /* ranked by score ascending, the quantiles [band_lo, band_hi) */
} st_data_keep;
typedef enum st_data_order {
    ST_DATA_ORDER_BASE = 0,   /* the base's order; the loader shuffles as for any dataset */
    ST_DATA_ORDER_ASCENDING = 1,  /* by score, lowest first, read in that order (curriculum) */
    ST_DATA_ORDER_DESCENDING = 2
} st_data_order;
typedef struct st_data_select_config {
    const char *dataset;      /* the base Megatron PREFIX */
    const char *scores;       /* score file for keep/order (NULL: none) */
    st_data_keep keep;
    double fraction;          /* LOWEST/HIGHEST: in (0, 1] */
    double band_lo, band_hi;  /* BAND: 0 <= lo <= hi <= 1 (lo = hi keeps nothing: refused) */
    const char *dedup;        /* a dedup score file: its duplicates are dropped first (NULL: none) */
    st_data_order order;
    st_data_pacing pace;      /* kind NONE: no pacing; else ordered by score (ascending unless order says
                                 descending: hard to easy) and paced */
} st_data_select_config;
typedef struct st_data_view_info {
    st_data_ident base;
    char base_path[4096];
    char rule[512];
    uint64_t n_kept, kept_tokens;
    int ordered;              /* 1: in the view's order; 2: paced */
    st_data_pacing pace;
} st_data_view_info;
/* Write the view out (temporary + rename: nothing partial under the name). Refused, with
 * the file and the key: fraction outside (0, 1], band lo > hi or outside [0, 1], NaN
 * scores, score files of another dataset, an empty selection. */
st_status st_data_select(const char *out, const st_data_select_config *cfg, st_data_view_info *info, st_err *err);
/* Read a view's header (and check its base is unchanged when check_base). */
st_status st_data_view_inspect(const char *path, int check_base, st_data_view_info *info, st_err *err);

#ifdef __cplusplus
}
#endif
#endif
