/* tokenizer_internal.h - what the tokenizer's source files share (not a public header): the
 * layout of a loaded tokenizer and the helpers that fill it.
 *   tokenizer.c          vocabulary and merge tables, regexes, encode, decode, load dispatch
 *   tokenizer_json.c     Hugging Face tokenizer.json
 *   tokenizer_tiktoken.c tiktoken rank files ("base64token rank" lines)
 *   tokenizer_config.c   model directories and tokenizer_config.json
 */
#ifndef STRATA_TOKENIZER_INTERNAL_H
#define STRATA_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "strata/tokenizer.h"

/* The regex of tokenizers' ByteLevel pre-tokenizer (use_regex true): GPT-2's pattern. */
#define TOK_GPT2_PATTERN \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
/* The pre-tokenizer patterns a rank file's user names (st_tokenizer_opts.pattern), each as its
 * publisher spells it; tests/test_tokenizer.c checks each against PyPI tiktoken with the
 * publisher's string (tools/gen_tokenizer_fixtures.py writes the ids).
 * Llama-3's (Meta's tokenizer.py), which is cl100k_base's as tiktoken first shipped it. */
#define TOK_LLAMA3_PATTERN \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" \
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Qwen's (Qwen-7B's tokenization_qwen.py PAT_STR, Qwen2's tokenizer.json Split regex): Llama-3's
 * with single digits, \p{N} for \p{N}{1,3} */
#define TOK_QWEN2_PATTERN \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" \
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* tiktoken's r50k_base / p50k_base / gpt2 (tiktoken_ext/openai_public.py r50k_pat_str) */
#define TOK_R50K_PATTERN \
    "'(?:[sdmt]|ll|ve|re)| ?\\p{L}++| ?\\p{N}++| ?[^\\s\\p{L}\\p{N}]++|\\s++$|\\s+(?!\\S)|\\s"
/* tiktoken's cl100k_base as it ships it now */
#define TOK_CL100K_PATTERN \
    "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}++|\\p{N}{1,3}+| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*+" \
    "|\\s++$|\\s*[\\r\\n]|\\s+(?!\\S)|\\s"
/* tiktoken's o200k_base */
#define TOK_O200K_PATTERN \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?" \
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?" \
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* A known pattern by its name (gpt2, cl100k, o200k, llama3, qwen2): the name (static) and in
 * *regex its regex; NULL (and *regex NULL) where name is none of them. */
const char *tok_named_pattern(const char *name, const char **regex);
/* The names tok_named_pattern knows, for messages. */
#define TOK_PATTERN_NAMES "gpt2, cl100k, o200k, llama3, qwen2"

enum { STEP_SPLIT, STEP_PREFIX_SPACE, STEP_METASPACE };
/* Metaspace's prepend_scheme */
enum { PREPEND_NEVER, PREPEND_ALWAYS, PREPEND_FIRST };
typedef struct pt_step {
    int kind;
    pcre2_code *re;  /* STEP_SPLIT */
    /* STEP_SPLIT: the pattern with \p{L}, \p{N} left to PCRE2 (faster), for text without the
     * code points PCRE2's Unicode lacks (st_tokenizer.uni_new); NULL when it is re */
    pcre2_code *re_fast;
    int jit, jit_fast; /* re, re_fast are JIT-compiled: matched with pcre2_jit_match */
    char rep[5];     /* STEP_METASPACE: the replacement character, UTF-8 */
    uint8_t rep_len;
    uint8_t prepend; /* PREPEND_* */
    uint8_t split;   /* split before each run of replacement characters (MergedWithNext) */
} pt_step;

/* normalizers: Prepend(a) to a non-empty piece, Replace(a -> b) every occurrence */
enum { NORM_PREPEND, NORM_REPLACE };
typedef struct norm_step { int kind; char *a, *b; uint32_t alen, blen; } norm_step;

/* decoders, applied in order to the list of token strings as tokenizers' decode_chain */
enum { DEC_BYTE_LEVEL, DEC_REPLACE, DEC_BYTE_FALLBACK, DEC_FUSE, DEC_STRIP, DEC_METASPACE };
typedef struct dec_step {
    int kind;
    char *a, *b;           /* REPLACE: a -> b; STRIP, METASPACE: a is the character */
    uint32_t alen, blen;
    uint32_t start, stop;  /* STRIP: at most this many characters from each end */
    int prepend;           /* METASPACE: prepend_scheme is not never */
} dec_step;
enum { MAX_STEPS = 8 };

typedef struct str_slot { const char *s; uint32_t len; int32_t id; } str_slot;
typedef struct merge_slot { uint64_t key; uint32_t rank; int32_t new_id; } merge_slot; /* key 0: empty */

/* s: what the text must contain, for a normalized token its content normalized (owned);
 * content: the token as added_tokens spells it (owned) */
typedef struct added_tok { const char *s; uint32_t len; int32_t id; int next; char *owned, *content; } added_tok;
/* tokenizers matches the added tokens marked normalized false first, then in what is left
 * those marked normalized true (in the normalized text: the same here, with no normalizer) */
enum { ADDED_RAW, ADDED_NORMALIZED, ADDED_PASSES };

/* An encoder's state kept between st_tokenizer_encode calls (tokenizer.c): PCRE2 match data,
 * BPE scratch and a bounded cache of pre-token -> ids. A tokenizer holds TOK_ENC_SLOTS of them;
 * an encode call takes a free one (busy 0 -> 1) and gives it back, so each is used by one
 * thread at a time. */
typedef struct tok_enc tok_enc;
enum { TOK_ENC_SLOTS = 64 };
typedef struct tok_enc_slot { atomic_int busy; tok_enc *e; } tok_enc_slot;
/* the cache's default capacity, in pre-tokens: with its table and arena at most about 1 MiB
 * an encoder state (CACHE_REC_BYTES in tokenizer.c), so 64 MiB with every slot in use */
enum { TOK_CACHE_ENTRIES = 16384 };

struct st_tokenizer {
    char *path;
    /* model vocabulary: string -> id (open addressing), and id -> string for decode */
    str_slot *vocab;
    size_t vocab_cap;
    char **id_str; /* owned strings (NUL-terminated), NULL where no token */
    uint32_t *id_len;
    size_t n_ids;
    merge_slot *merges;
    size_t merges_cap;
    int32_t byte_id[256];   /* vocabulary id of each byte's byte-level character, -1 if absent */
    char byte_chr[256][3];  /* the byte-level character of each byte, UTF-8 */
    uint8_t byte_chr_len[256];
    int16_t cp_byte[324];   /* inverse: code point -> byte, -1 where none */
    int32_t unk_id;
    int fuse_unk, ignore_merges;
    int byte_level;          /* a ByteLevel pre-tokenizer: symbols from bytes, not characters */
    int byte_fallback;       /* a character not in the vocabulary becomes its <0xNN> tokens */
    int32_t fallback_id[256]; /* id of <0xNN>, -1 if absent */
    pt_step steps[MAX_STEPS];
    int n_steps;
    pcre2_code *uni_new; /* the letters and numbers Oniguruma has and PCRE2 lacks, as a class */
    int uni_new_jit;
    norm_step norm[MAX_STEPS];
    int n_norm;
    dec_step dec[MAX_STEPS];
    int n_dec;
    added_tok *added;
    int n_added;
    int added_first[ADDED_PASSES][256]; /* chains of added tokens by first byte, -1 ends */
    /* from tokenizer_config.json (a model directory) or the load options; -1 where not given */
    int32_t bos_id, eos_id, pad_id;
    int add_bos;         /* add_bos_token: 1, 0, or -1 where not given */
    char *chat_template; /* NULL where none */
    /* a rank file's pre-tokenizer regex (owned), its name where it is a known one, and what
     * said it ("the load options", "tokenizer_config.json", "the file's name"); NULL for a
     * tokenizer.json, whose pre-tokenizer is in the file */
    char *pattern;
    const char *pattern_name, *pattern_from;
    tok_enc_slot *enc;    /* TOK_ENC_SLOTS encoder states, each made on first use */
    size_t cache_entries; /* pre-tokens each encoder state caches; 0: none */
    /* per added-token pass: how many distinct first bytes its tokens have, and the byte
     * when it is one (split_added then searches with memchr) */
    int added_nfirst[ADDED_PASSES];
    uint8_t added_first_byte[ADDED_PASSES];
};

/* vocabulary (string -> id) and merges ((id, id) -> rank, id), sized before the first put */
int32_t tok_vocab_find(const st_tokenizer *t, const char *s, size_t len);
void tok_vocab_put(st_tokenizer *t, const char *s, uint32_t len, int32_t id);
void tok_merge_put(st_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t new_id);
size_t tok_pow2_at_least(size_t n);
/* length of the valid UTF-8 character at s (1-4), 0 where the bytes are not one */
size_t tok_utf8_char_len(const uint8_t *s, size_t n);
st_status tok_read_file(const char *path, char **buf, size_t *len, st_err *err);
st_status tok_dup_str(const st_tokenizer *t, const char *s, size_t len, char **out, st_err *err);
/* id's token string (owned by t), once: a later call for the same id keeps the first */
st_status tok_set_id_str(st_tokenizer *t, int32_t id, const char *s, size_t len, const char *field, st_err *err);
/* a Split(pattern, Isolated) pre-tokenizer step; \s, \p{L}, \p{N} as Oniguruma means them */
st_status tok_add_split(st_tokenizer *t, const char *pattern, uint32_t extra_opts, const char *field, st_err *err);
/* the normalizer over len bytes: *out (malloc'd) gets *olen bytes */
st_status tok_normalize(const st_tokenizer *t, const uint8_t *p, size_t len, char **out, size_t *olen, st_err *err);
/* Set how many pre-tokens each encoder state caches (0: no cache; TOK_CACHE_ENTRIES after a
 * load) and drop the states made so far. Not while another thread encodes with t: for tests. */
void tok_set_cache_entries(st_tokenizer *t, size_t entries);

/* Fill t (path set, byte alphabet made) from a file's bytes: tokenizer_json.c, tokenizer_tiktoken.c. */
st_status tok_load_json(st_tokenizer *t, const char *buf, size_t len, st_err *err);
st_status tok_load_tiktoken(st_tokenizer *t, const char *buf, size_t len, const st_tokenizer_opts *opts,
                            st_err *err);

/* What a tokenizer_config.json beside a rank file says of what the rank file does not: the
 * pre-tokenizer pattern (pat_str, a name or a regex; or tokenizer_class QWenTokenizer, Qwen's
 * tiktoken tokenizer: qwen2) and the special tokens with their ids (added_tokens_decoder).
 * Strings point into root (json-c), freed by tok_rank_config_free. */
typedef struct tok_rank_config {
    void *root;
    const char *pattern;     /* NULL where the config does not say */
    const char *pattern_key; /* the key that said it, for messages */
    const char **special;
    int32_t *special_ids;
    size_t n_special;
} tok_rank_config;
/* dir's tokenizer_config.json; all zero where there is none. */
st_status tok_rank_config_read(const char *dir, tok_rank_config *rc, st_err *err);
void tok_rank_config_free(tok_rank_config *rc);

/* tokenizer_config.c: the file a model directory's tokenizer is read from (malloc'd path),
 * its tokenizer_config.json, and the options' BOS/EOS. */
st_status tok_dir_file(const char *dir, char **file, st_err *err);
st_status tok_load_config(st_tokenizer *t, const char *dir, st_err *err);
st_status tok_apply_opts(st_tokenizer *t, const st_tokenizer_opts *opts, st_err *err);

#endif
