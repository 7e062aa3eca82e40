/* generate.h - text from a model: a KV-cached decoder over the model's own weights,
 * samplers, and the hook that turns tokens into text. Greedy text from a model, first
 * step by step, then with the loop that does the same (and streams through a callback):
 *
 * Example:
 *
 *     st_err err = {0};
 *     st_backend *be = NULL;
 *     st_model *m = NULL;
 *     st_gen *g = NULL;
 *     int32_t prompt[3] = {1, 2, 3}, out[8];
 *     if (st_backend_cpu_create(&be, 0, &err) || st_model_create(&m, "gpt2-tiny", NULL, be, &err) ||
 *         st_gen_create(&g, m, 3 + 8, &err)) {            // the cache holds 11 positions
 *         fprintf(stderr, "strata: %s\n", err.msg);
 *         return 1;
 *     }
 *     m->ops->init_random(m, 1337);
 *     float *logits = malloc(sizeof(float) * m->vocab_size);
 *     st_sampler greedy = {0.0f, 0, 1.0f};                 // temperature 0: the argmax
 *     st_rng rng;
 *     st_rng_seed(&rng, 1);
 *     st_gen_step(g, prompt, 3, logits, &err);             // prefill: logits of the last token
 *     for (int i = 0; i < 8; i++) {
 *         out[i] = st_sample(logits, m->vocab_size, &greedy, &rng, NULL); // greedy needs no scratch
 *         if (i < 7) st_gen_step(g, &out[i], 1, logits, &err);            // one more row
 *     }
 *     st_generate_config gc = {.max_new = 8, .sampler = greedy, .seed = 1, .stop_token = -1};
 *     int32_t again[8];
 *     st_generate(m, prompt, 3, &gc, NULL, NULL, again, NULL, &err);
 *     printf("same tokens: %s\n", memcmp(out, again, sizeof out) ? "no" : "yes");
 *     free(logits);
 *     st_gen_free(g);
 *     st_model_free(m);
 *     st_backend_free(be);
 *
 * End of example.
 *
 * The decoder reads the weights in place through the model's tensor table (so a model
 * being trained is sampled with its current weights, and nothing is copied), runs the
 * backend's ops (norms, matmuls, rope, GELU/SwiGLU, residuals) on the new rows only, and
 * computes attention with plain loops over a cache of every earlier position's keys and
 * values per layer: L x max_T x (NKV*hs) floats each for k and v. A one-row product on
 * the cpu backend is an sgemv (the backend has no matrix-vector op). The backend's memory
 * must be host memory (the cpu and ref backends). The reference path,
 * st_gen_full_forward, runs the model's own training forward over the whole prefix.
 */
#ifndef STRATA_GENERATE_H
#define STRATA_GENERATE_H

#include <stdio.h>

#include "strata/backend.h"
#include "strata/core.h"
#include "strata/llama.h"
#include "strata/model.h"

/* ------------------------------------------------------------------ KV-cached decoder */

typedef struct st_gen st_gen;

/* A decoder for m (arch "gpt2" or "llama") whose cache holds max_T positions
 * (<= the model's max positions). m must outlive it. */
st_status st_gen_create(st_gen **out, st_model *m, int max_T, st_err *err);
void st_gen_free(st_gen *g);
/* Forget every cached position (the next step starts at position 0). */
void st_gen_reset(st_gen *g);
/* Positions cached so far. */
int st_gen_pos(const st_gen *g);
/* Append n >= 1 tokens at the next positions (n > 1: a prefill, computed as one batch of
 * rows) and write the logits (V floats, host memory) of the last of them. Fails when
 * the positions would pass max_T, or on a token outside [0, V). */
st_status st_gen_step(st_gen *g, const int32_t *tokens, int n, float *logits, st_err *err);

/* The reference without a cache: the model's training forward over tokens[0..n) as one
 * sequence (B = 1, T = n; the model's activations are reallocated for it), and the
 * logits (V) of position n-1. */
st_status st_gen_full_forward(st_model *m, const int32_t *tokens, int n, float *logits, st_err *err);

/* ------------------------------------------------------------------ sampling */

typedef struct st_sampler {
    float temperature; /* <= 0: greedy (the first index of the largest logit) */
    int top_k;         /* > 0: only the k most likely tokens */
    float top_p;       /* in (0, 1): only the smallest set of most likely tokens whose
                          probability reaches top_p (nucleus); >= 1: off */
} st_sampler;

st_status st_sampler_validate(const st_sampler *s, st_err *err);
/* Scratch floats st_sample needs for a vocabulary of V. */
size_t st_sample_scratch_floats(int V);
/* The next token from logits (V; not modified): greedy, or drawn with rng (one uniform
 * per call) after temperature, top-k and top-p. scratch: st_sample_scratch_floats(V)
 * (greedy reads none: it may be NULL). */
int32_t st_sample(const float *logits, int V, const st_sampler *s, st_rng *rng, float *scratch);

/* ------------------------------------------------------------------ tokens and text
 * How text becomes tokens and back, chosen by st_text_open: a tokenizer.json beside the
 * model (strata/tokenizer.h: byte-level BPE, GPT-2, Llama 3, Qwen2); else byte-level
 * vocabularies (256, or 257 with 256 = end of document: the embedded corpus and `strata
 * data pack`) read and write bytes; any other vocabulary reads and writes token ids as
 * decimal numbers. */

typedef enum st_text_kind { ST_TEXT_BYTES = 0, ST_TEXT_IDS = 1, ST_TEXT_TOKENIZER = 2 } st_text_kind;

struct st_tokenizer;
typedef struct st_text {
    st_text_kind kind;
    int vocab_size;
    int32_t eod;                /* end-of-document token (generation stops there), -1: none */
    struct st_tokenizer *tok;   /* ST_TEXT_TOKENIZER: owned, st_text_close frees it */
} st_text;

/* Bytes of buffer st_text_decode needs for any one token. */
#define ST_TEXT_TOKEN_MAX 256

/* The text of a model of vocabulary V loaded from model_dir (may be NULL):
 * model_dir/tokenizer.json when there is one (its ids must fit the vocabulary; its
 * <|endoftext|> or <|end_of_text|> ends generation), else bytes or ids as above. */
st_status st_text_open(st_text *t, int vocab_size, const char *model_dir, st_err *err);
void st_text_close(st_text *t);
const char *st_text_kind_name(const st_text *t);
/* text -> tokens (malloc'd, caller frees; *n may be 0). IDS: decimal ids separated by
 * spaces or commas, each in [0, V). */
st_status st_text_encode(const st_text *t, const char *text, int32_t **tokens, int *n, st_err *err);
/* One token's text into buf (NUL-terminated); returns its length in bytes (a byte token
 * is 1 byte, which may be 0x00; the end-of-document token is empty; a byte-level BPE
 * token may be part of a UTF-8 character). cap >= ST_TEXT_TOKEN_MAX. */
size_t st_text_decode(const st_text *t, int32_t token, char *buf, size_t cap);

/* ------------------------------------------------------------------ the loop */

typedef struct st_generate_config {
    int max_new;        /* tokens to generate */
    st_sampler sampler;
    uint64_t seed;      /* the sampling RNG's seed */
    int no_cache;       /* 1: st_gen_full_forward over the whole prefix for every token */
    int32_t stop_token; /* < 0: none; generation ends after emitting it */
} st_generate_config;

typedef struct st_generate_result {
    int n_prompt, n_new;
    double prefill_s;    /* the prompt's forward (with the cache), up to the first logits */
    double decode_s;     /* everything after it: one forward and one draw per new token */
    double tokens_per_s; /* n_new / (prefill_s + decode_s) */
    int stopped;         /* 1: ended at stop_token or by the callback */
} st_generate_result;

/* Called with each new token as soon as it is drawn; nonzero stops generation. */
typedef int (*st_token_fn)(void *ctx, int32_t token);

/* Generate up to c->max_new tokens after prompt (n_prompt >= 1), calling on_token (may
 * be NULL) for each and storing them in out (may be NULL; room for max_new).
 * n_prompt + max_new must fit the model's positions. */
st_status st_generate(st_model *m, const int32_t *prompt, int n_prompt, const st_generate_config *c,
                      st_token_fn on_token, void *ctx, int32_t *out, st_generate_result *res, st_err *err);

/* What strata train prints every sample_every steps: max_new tokens after prompt with
 * temperature 1 (seeded by seed), KV-cached, printed once generated as
 * "label<prompt text>|<sample text>\n" on f, decoded by the vocabulary's st_text (control
 * bytes but newline and tab, and bytes outside valid UTF-8, escaped as \xNN; a backslash
 * doubled). Fails only when generation fails (out of memory, an unsupported architecture). */
st_status st_generate_print_sample(st_model *m, const int32_t *prompt, int n_prompt, int max_new, uint64_t seed,
                                   const char *label, FILE *f, st_err *err);

#endif
