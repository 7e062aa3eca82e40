/* tokenizer.h - Hugging Face tokenizer.json with a byte-level BPE model: encode, decode.
 *
 * Gives the ids of the `tokenizers` library (PyPI) for the byte-level BPE files that GPT-2,
 * Llama-3 and Qwen2-style models ship: the ByteLevel pre-tokenizer (GPT-2 regex) or a
 * Sequence of Split(regex) + ByteLevel, added tokens matched before pre-tokenization, merges
 * by rank, the ByteLevel decoder. Anything else (a WordPiece or Unigram model, a normalizer,
 * an unknown pre-tokenizer or decoder) is refused with ST_ERR_UNSUPPORTED naming the field.
 *
 *     st_tokenizer *tok;
 *     st_err err = {0};
 *     if (st_tokenizer_load(&tok, "tokenizer.json", &err) != ST_OK) { puts(err.msg); return 1; }
 *     int32_t ids[256];
 *     size_t n;
 *     st_tokenizer_encode(tok, "Hello world", 11, ids, 256, &n, &err);   // n ids in ids[]
 *     char text[1024];
 *     size_t len;
 *     st_tokenizer_decode(tok, ids, n, text, sizeof text, &len, &err);   // len bytes
 *     st_tokenizer_free(tok);
 *
 * A loaded tokenizer is read-only: encode and decode may run on many threads at once.
 */
#ifndef STRATA_TOKENIZER_H
#define STRATA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "strata/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct st_tokenizer st_tokenizer;

/* Read a tokenizer.json. Errors name the file and the field (ST_ERR_IO, ST_ERR_FORMAT for
 * malformed JSON or a missing field, ST_ERR_UNSUPPORTED for a model or step not handled). */
st_status st_tokenizer_load(st_tokenizer **out, const char *path, st_err *err);
void st_tokenizer_free(st_tokenizer *tok);

/* Largest id (model vocabulary and added tokens) plus one. */
size_t st_tokenizer_vocab_size(const st_tokenizer *tok);
/* Id of a token as the JSON spells it (byte-level form, "Ġhello"); -1 if absent. */
int32_t st_tokenizer_token_id(const st_tokenizer *tok, const char *token);
/* Token string of an id as the JSON spells it; NULL if no token has that id. */
const char *st_tokenizer_id_token(const st_tokenizer *tok, int32_t id);

/* Encode len bytes of text (UTF-8; invalid bytes are encoded byte-level). Writes at most cap
 * ids and sets *n to the number of ids the text needs; if that is more than cap it returns
 * ST_ERR_INVALID (call again with cap >= *n). No BOS/EOS is added. */
st_status st_tokenizer_encode(const st_tokenizer *tok, const char *text, size_t len, int32_t *ids,
                              size_t cap, size_t *n, st_err *err);
/* Decode ids to bytes (special tokens included, as their text). Writes at most cap bytes and
 * sets *len to the number needed (ST_ERR_INVALID when more than cap); an id with no token
 * is ST_ERR_INVALID naming its index. No terminating NUL is written. */
st_status st_tokenizer_decode(const st_tokenizer *tok, const int32_t *ids, size_t n, char *out,
                              size_t cap, size_t *len, st_err *err);

#ifdef __cplusplus
}
#endif
#endif
