/* tokenizer.h - the tokenizers of the models people fine-tune: encode, decode.
 *
 * Gives the ids of the `tokenizers` library (PyPI) and of tiktoken for the files models ship:
 *   - Hugging Face tokenizer.json with a BPE model: byte-level (GPT-2, Llama-3, Qwen2: the
 *     ByteLevel pre-tokenizer or Split(regex) + ByteLevel) or over characters with byte
 *     fallback (Llama-2, Mistral: a Prepend/Replace normalizer or a Metaspace pre-tokenizer,
 *     <0xNN> tokens), added tokens matched before pre-tokenization, merges by rank, the
 *     ByteLevel decoder or a Sequence of Replace, ByteFallback, Fuse, Strip, Metaspace;
 *   - a model directory: its tokenizer.json (or else a rank file named tokenizer.model) and,
 *     when present, tokenizer_config.json for BOS/EOS/pad, add_bos_token and the chat template;
 *   - a tiktoken rank file (*.tiktoken, Llama-3's tokenizer.model: "base64token rank" lines)
 *     with a pre-tokenizer pattern and special tokens given in st_tokenizer_opts, or else said
 *     by a tokenizer_config.json beside it (pat_str, a name or a regex, or tokenizer_class
 *     QWenTokenizer: qwen2; added_tokens_decoder for the special tokens; bos/eos/pad as for a
 *     directory), or for the pattern by a known file name (qwen.tiktoken: qwen2,
 *     cl100k_base.tiktoken, o200k_base.tiktoken, r50k_base.tiktoken and p50k_base.tiktoken:
 *     tiktoken's). A rank file whose pattern nothing says is refused: the same ranks split
 *     two ways give other ids (Llama-3's \p{N}{1,3} and Qwen's \p{N} differ on "2020").
 * The format is read from the content (a JSON object, or rank lines), never from the name.
 * Anything else (a WordPiece or Unigram model, an unknown normalizer, pre-tokenizer or
 * decoder) is refused with ST_ERR_UNSUPPORTED naming the field.
 *
 * Example:
 *
 *     st_tokenizer *tok;
 *     st_err err = {0};
 *     if (st_tokenizer_load(&tok, "tokenizer.json", &err) != ST_OK) { puts(err.msg); return 1; }
 *     int32_t ids[256];
 *     size_t n = 0;
 *     st_tokenizer_encode(tok, "Hello world", 11, ids, 256, &n, &err);   // n ids in ids[]
 *     char text[1024];
 *     size_t len = 0;
 *     st_tokenizer_decode(tok, ids, n, text, sizeof text, &len, &err);   // len bytes, no NUL
 *     printf("%zu ids: %.*s\n", n, (int)len, text);
 *     st_tokenizer_free(tok);
 *
 * End of example.
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

/* Read a tokenizer.json, a rank file or a model directory. Errors name the file and the field
 * or line (ST_ERR_IO, ST_ERR_FORMAT for malformed JSON, a missing field or a bad rank line,
 * ST_ERR_UNSUPPORTED for a model or step not handled). */
st_status st_tokenizer_load(st_tokenizer **out, const char *path, st_err *err);

/* What a rank file does not say (a tokenizer.json ignores pattern and special). */
typedef struct st_tokenizer_opts {
    /* pre-tokenizer regex (a rank file's): a name, "gpt2" (tiktoken's r50k_base, p50k_base),
     * "cl100k", "o200k" (tiktoken's), "llama3" (Meta's tokenizer.py), "qwen2" (Qwen's: single
     * digits), or the regex itself (as tiktoken's pat_str: $ is the text's end); NULL: what
     * beside the file says (above), else the load is refused (ST_ERR_INVALID) */
    const char *pattern;
    /* special tokens, found in the text before pre-tokenization (leftmost, longest); ids from
     * special_ids, or when that is NULL the largest rank + 1, + 2, ... in order (tiktoken's
     * special_tokens: Qwen's <|endoftext|> is 151643, one past its ranks). n_special 0: a
     * tokenizer_config.json's added_tokens_decoder beside a rank file, else none */
    const char *const *special;
    const int32_t *special_ids;
    size_t n_special;
    /* BOS and EOS by token text (NULL: tokenizer_config.json's, else none) */
    const char *bos_token, *eos_token;
} st_tokenizer_opts;

/* st_tokenizer_load with options; opts may be NULL. */
st_status st_tokenizer_load_ex(st_tokenizer **out, const char *path, const st_tokenizer_opts *opts, st_err *err);
void st_tokenizer_free(st_tokenizer *tok);

/* BOS, EOS and pad ids from tokenizer_config.json (bos_token, eos_token, pad_token, as a string
 * or {"content": ...}) or the load options; -1 when absent. */
int32_t st_tokenizer_bos_id(const st_tokenizer *tok);
int32_t st_tokenizer_eos_id(const st_tokenizer *tok);
int32_t st_tokenizer_pad_id(const st_tokenizer *tok);
/* tokenizer_config.json's add_bos_token: 1, 0, or -1 when it does not say. */
int st_tokenizer_add_bos(const st_tokenizer *tok);
/* tokenizer_config.json's chat_template (the "default" one of a list), or else the
 * directory's chat_template.jinja; NULL when there is none. Owned by tok. */
const char *st_tokenizer_chat_template(const st_tokenizer *tok);

/* A rank file's pre-tokenizer regex, as it was said (NULL for a tokenizer.json, whose
 * pre-tokenizer is in the file); *name (may be NULL) gets the known name ("qwen2", ...) or
 * NULL for a regex given as such, *from (may be NULL) what said it ("the load options",
 * "tokenizer_config.json's pat_str", "the file's name", ...). Owned by tok. */
const char *st_tokenizer_pattern(const st_tokenizer *tok, const char **name, const char **from);

/* Largest id (model vocabulary and added tokens) plus one. */
size_t st_tokenizer_vocab_size(const st_tokenizer *tok);
/* Id of a token as the file spells it (tokenizer.json: byte-level form, "Ġhello"; a rank file:
 * the raw bytes); -1 if absent. */
int32_t st_tokenizer_token_id(const st_tokenizer *tok, const char *token);
/* Token string of an id as the file spells it; NULL if no token has that id. A rank file's
 * token may hold a NUL byte: st_tokenizer_decode gives its bytes. */
const char *st_tokenizer_id_token(const st_tokenizer *tok, int32_t id);

/* Encode len bytes of text. Writes at most cap ids and sets *n to the number of ids the text
 * needs; if that is more than cap it returns ST_ERR_INVALID (call again with cap >= *n). No
 * BOS/EOS is added.
 * The text need not be valid UTF-8. Where a pre-tokenizer regex splits the text (byte-level
 * tokenizer.json files, rank files), each stretch of valid UTF-8 is encoded as text, and each
 * stretch of invalid bytes (bytes that start no character; the regex, compiled with
 * PCRE2_MATCH_INVALID_UTF, never matches them) is its own piece, merged byte-level and never
 * joined to the text around it: tiktoken's rule (Encoding._encode_single_piece), which
 * tests/test_tokenizer_corpus.c checks id for id (`tokenizers` takes no invalid UTF-8). In a
 * character-level model each invalid byte stands alone: its <0xNN> byte_fallback token, else
 * the unk token. st_tokenizer_decode gives the same bytes back. */
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
