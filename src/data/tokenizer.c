/* tokenizer.c - encode and decode for every tokenizer strata reads, and what the readers share:
 * vocabulary and merge tables, pre-tokenizer regexes, the normalizer, load dispatch.
 *
 * Mirrors what the `tokenizers` library does for a BPE file, step by step:
 *   1. added tokens marked normalized false (the special ones) are found in the raw text
 *      first (leftmost, longest), and cut it into pieces that never reach the model;
 *   2. each remaining piece is normalized (Prepend, Replace: Llama-2's "▁" for spaces), and
 *      the added tokens marked normalized true are cut out of the normalized text;
 *   3. each remaining piece is pre-tokenized: Split(regex, Isolated), ByteLevel (optional
 *      prefix space, optional GPT-2 regex), Metaspace; PCRE2 (JIT) stands in for Oniguruma;
 *   4. each word starts as symbols - in a byte-level model the vocabulary ids of its bytes'
 *      byte-level characters (GPT-2's bytes_to_unicode), otherwise of its characters, with
 *      <0xNN> byte tokens (byte_fallback) or the unk token for a character not in the
 *      vocabulary - merged by rank with a binary heap, the lowest (rank, position) first,
 *      exactly as tokenizers' Word::merge_all.
 * Speed without a change of ids: each encode call takes one of the tokenizer's encoder states
 * (struct tok_enc, one thread at a time each), which keeps PCRE2 match data and BPE scratch
 * between calls, a bounded cache of pre-token -> ids (a pre-token's ids depend on its bytes
 * alone; most pre-tokens of a text repeat) and a small cache of merge-table answers.
 * Decoding runs the decoder (ByteLevel, or a Sequence of Replace, ByteFallback, Fuse, Strip,
 * Metaspace) over the tokens' strings. Where `tokenizers` writes U+FFFD for byte tokens that
 * do not form UTF-8, strata writes the bytes, so decode(encode(x)) keeps any bytes.
 * Text that is not all UTF-8 is encoded by a byte-level model as tiktoken's bytes API
 * encodes bytes, between the special tokens (encode_bytes).
 * A tiktoken rank file is the same machinery: its tokens are raw bytes, every split of a
 * token into two tokens is a merge ranked by the token's rank (tiktoken merges the pair whose
 * concatenation ranks lowest), a word that is itself a token is that token (ignore_merges).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tokenizer_internal.h"

/* ---- hashing ------------------------------------------------------------------------ */

static uint64_t hash_bytes(const void *p, size_t n) {
    const uint8_t *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

size_t tok_pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

int32_t tok_vocab_find(const st_tokenizer *t, const char *s, size_t len) {
    if (!t->vocab) return -1;
    size_t mask = t->vocab_cap - 1;
    for (size_t i = hash_bytes(s, len) & mask;; i = (i + 1) & mask) {
        const str_slot *sl = &t->vocab[i];
        if (!sl->s) return -1;
        if (sl->len == len && memcmp(sl->s, s, len) == 0) return sl->id;
    }
}

void tok_vocab_put(st_tokenizer *t, const char *s, uint32_t len, int32_t id) {
    size_t mask = t->vocab_cap - 1;
    for (size_t i = hash_bytes(s, len) & mask;; i = (i + 1) & mask) {
        str_slot *sl = &t->vocab[i];
        if (!sl->s || (sl->len == len && memcmp(sl->s, s, len) == 0)) {
            sl->s = s;
            sl->len = len;
            sl->id = id;
            return;
        }
    }
}

static uint64_t merge_key(int32_t a, int32_t b) {
    /* +1 so that no real pair has key 0, the empty slot */
    return ((uint64_t)(uint32_t)(a + 1) << 32) | (uint32_t)(b + 1);
}

static const merge_slot *merge_find(const st_tokenizer *t, int32_t a, int32_t b) {
    if (!t->merges) return NULL;
    uint64_t k = merge_key(a, b);
    size_t mask = t->merges_cap - 1;
    for (size_t i = hash_u64(k) & mask;; i = (i + 1) & mask) {
        const merge_slot *m = &t->merges[i];
        if (m->key == 0) return NULL;
        if (m->key == k) return m;
    }
}

/* A later duplicate overwrites an earlier one, as tokenizers' HashMap collect does. */
void tok_merge_put(st_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t new_id) {
    uint64_t k = merge_key(a, b);
    size_t mask = t->merges_cap - 1;
    for (size_t i = hash_u64(k) & mask;; i = (i + 1) & mask) {
        merge_slot *m = &t->merges[i];
        if (m->key == 0 || m->key == k) {
            m->key = k;
            m->rank = rank;
            m->new_id = new_id;
            return;
        }
    }
}

/* ---- UTF-8 and the byte-level alphabet ---------------------------------------------- */

static int utf8_put(char *out, uint32_t cp) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2; /* the alphabet needs no more than U+0143 */
}

/* Next code point of a valid UTF-8 string (JSON strings are); advances *i. */
static uint32_t utf8_next(const uint8_t *s, size_t len, size_t *i) {
    uint8_t c = s[*i];
    int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (int k = 1; k < n && *i + k < len; k++) cp = (cp << 6) | (s[*i + k] & 0x3F);
    *i += n;
    return cp;
}

/* Length of the valid UTF-8 character at s (1-4), or 0 where the bytes are not one:
 * overlong forms, surrogates and code points past U+10FFFF are not. */
size_t tok_utf8_char_len(const uint8_t *s, size_t n) {
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    size_t k = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (k == 0 || k > n) return 0;
    for (size_t i = 1; i < k; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    if (c == 0xE0 && s[1] < 0xA0) return 0; /* overlong */
    if (c == 0xED && s[1] >= 0xA0) return 0; /* surrogate */
    if (c == 0xF0 && s[1] < 0x90) return 0; /* overlong */
    if (c == 0xF4 && s[1] >= 0x90) return 0; /* past U+10FFFF */
    return k;
}

/* GPT-2's bytes_to_unicode: printable bytes stand for themselves, the other 68 take the
 * code points from 256 upward in byte order. */
static void byte_alphabet(st_tokenizer *t) {
    for (int i = 0; i < 324; i++) t->cp_byte[i] = -1;
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        uint32_t cp = printable ? (uint32_t)b : (uint32_t)(256 + extra++);
        t->byte_chr_len[b] = (uint8_t)utf8_put(t->byte_chr[b], cp);
        t->cp_byte[cp] = (int16_t)b;
    }
}

/* ---- loading ------------------------------------------------------------------------ */

st_status tok_read_file(const char *path, char **buf, size_t *len, st_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return st_errf(err, ST_ERR_IO, "tokenizer %s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    while (b) {
        size_t got = fread(b + n, 1, cap - n, f);
        n += got;
        if (n < cap) break;
        char *nb = realloc(b, cap * 2);
        if (!nb) { free(b); b = NULL; break; }
        b = nb;
        cap *= 2;
    }
    int bad = ferror(f);
    fclose(f);
    if (!b) return st_errf(err, ST_ERR_NOMEM, "tokenizer %s: out of memory reading the file", path);
    if (bad) {
        free(b);
        return st_errf(err, ST_ERR_IO, "tokenizer %s: read failed", path);
    }
    *buf = b;
    *len = n;
    return ST_OK;
}

/* Unicode White_Space, which is what Oniguruma (the regex engine of `tokenizers`) matches
 * with \s; PCRE2's \s with UCP also matches U+180E, which Unicode dropped from White_Space. */
#define WHITE_SPACE "\\t\\n\\x0b\\f\\r\\x20\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"

/* Letters and numbers that Unicode 15-16 added, which tokenizers 0.23.3's Oniguruma matches
 * with \p{L} / \p{N} and Debian 12's PCRE2 10.42 (Unicode 14) does not. Measured over every
 * code point: the code points each \p{..} removes in tokenizers (Split(Regex, "removed") of a
 * string of all of them) against pcre2_match of the same class; no code point was in PCRE2's
 * class and not in Oniguruma's. A newer PCRE2 already has them: the union changes nothing. */
#define EXTRA_L \
    "\\x{1c89}-\\x{1c8a}\\x{a7cb}-\\x{a7cd}\\x{a7da}-\\x{a7dc}\\x{105c0}-\\x{105f3}\\x{10d4a}-" \
    "\\x{10d65}\\x{10d6f}-\\x{10d85}\\x{10ec2}-\\x{10ec4}\\x{1123f}-\\x{11240}\\x{11380}-\\x{11389}" \
    "\\x{1138b}\\x{1138e}\\x{11390}-\\x{113b5}\\x{113b7}\\x{113d1}\\x{113d3}\\x{11bc0}-\\x{11be0}" \
    "\\x{11f02}\\x{11f04}-\\x{11f10}\\x{11f12}-\\x{11f33}\\x{1342f}\\x{13441}-\\x{13446}\\x{13460}-" \
    "\\x{143fa}\\x{16100}-\\x{1611d}\\x{16d40}-\\x{16d6c}\\x{18cff}\\x{1b132}\\x{1b155}\\x{1df25}-" \
    "\\x{1df2a}\\x{1e030}-\\x{1e06d}\\x{1e4d0}-\\x{1e4eb}\\x{1e5d0}-\\x{1e5ed}\\x{1e5f0}\\x{2b739}" \
    "\\x{2ebf0}-\\x{2ee5d}\\x{31350}-\\x{323af}"
#define EXTRA_N \
    "\\x{10d40}-\\x{10d49}\\x{116d0}-\\x{116e3}\\x{11bf0}-\\x{11bf9}\\x{11f50}-\\x{11f59}\\x{16130}-" \
    "\\x{16139}\\x{16d70}-\\x{16d79}\\x{1ccf0}-\\x{1ccf9}\\x{1d2c0}-\\x{1d2d3}\\x{1e4f0}-\\x{1e4f9}" \
    "\\x{1e5f1}-\\x{1e5fa}"

typedef struct pat_buf { char *b; size_t n, cap; int oom; } pat_buf;

static void pat_put(pat_buf *p, const char *s, size_t l) {
    if (p->oom) return;
    if (p->n + l + 1 > p->cap) {
        size_t cap = (p->n + l + 1) * 2;
        char *nb = realloc(p->b, cap);
        if (!nb) {
            p->oom = 1;
            return;
        }
        p->b = nb;
        p->cap = cap;
    }
    memcpy(p->b + p->n, s, l);
    p->n += l;
    p->b[p->n] = 0;
}

/* Rewrite \s, \S, \p{L}, \p{N} (and \P{L}, \P{N}) of a pattern as explicit classes
 * that match what Oniguruma matches, minding whether they stand inside a character class. A
 * negated one inside a class cannot be written so: refused. */
static st_status rewrite_classes(const st_tokenizer *t, const char *in, const char *field, int keep_props, char **out,
                                 st_err *err) {
    size_t n = strlen(in);
    pat_buf o = {0};
    int in_class = 0;
    for (size_t i = 0; i < n;) {
        if (in[i] == '\\' && i + 1 < n) {
            char e = in[i + 1];
            const char *members = NULL; /* the class's contents, to go inside [...] */
            size_t skip = 2;
            int negated = 0;
            if (e == 's' || e == 'S') {
                members = WHITE_SPACE;
                negated = e == 'S';
            } else if (!keep_props && (e == 'p' || e == 'P') && i + 4 < n && in[i + 2] == '{' && in[i + 4] == '}' &&
                       (in[i + 3] == 'L' || in[i + 3] == 'N')) {
                members = in[i + 3] == 'L' ? "\\p{L}" EXTRA_L : "\\p{N}" EXTRA_N;
                negated = e == 'P';
                skip = 5;
            }
            if (!members) {
                pat_put(&o, in + i, 2);
            } else if (in_class && negated) {
                free(o.b);
                return st_errf(err, ST_ERR_UNSUPPORTED, "%s: %s: regex '%s' has \\%.*s inside a class", t->path,
                               field, in, (int)skip - 1, in + i + 1);
            } else {
                if (!in_class) pat_put(&o, negated ? "[^" : "[", negated ? 2 : 1);
                pat_put(&o, members, strlen(members));
                if (!in_class) pat_put(&o, "]", 1);
            }
            i += skip;
            continue;
        }
        size_t l = 1;
        if (!in_class && in[i] == '[') {
            in_class = 1;
            if (i + l < n && in[i + l] == '^') l++;
            if (i + l < n && in[i + l] == ']') l++; /* a leading ] is literal */
        } else if (in_class && in[i] == '[' && i + 1 < n && in[i + 1] == ':') { /* [:alpha:] */
            const char *end = strstr(in + i + 2, ":]");
            if (end) l = (size_t)(end - (in + i)) + 2;
        } else if (in_class && in[i] == ']') {
            in_class = 0;
        }
        pat_put(&o, in + i, l);
        i += l;
    }
    pat_put(&o, "", 0);
    if (o.oom) {
        free(o.b);
        return st_errf(err, ST_ERR_NOMEM, "%s: out of memory", t->path);
    }
    *out = o.b;
    return ST_OK;
}

static pcre2_code *compile_jit(const char *pattern, uint32_t opts, int *jit, int *ec, PCRE2_SIZE *eo) {
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opts, ec, eo, NULL);
    /* without JIT the interpreter gives the same matches */
    *jit = re && pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    return re;
}

st_status tok_add_split(st_tokenizer *t, const char *pattern, uint32_t extra_opts, const char *field,
                           st_err *err) {
    if (t->n_steps >= (int)(sizeof t->steps / sizeof t->steps[0]))
        return st_errf(err, ST_ERR_UNSUPPORTED, "%s: %s: too many pre-tokenizer steps", t->path, field);
    int ec, jit = 0, jit_fast = 0;
    PCRE2_SIZE eo;
    char *rewritten = NULL, *fast = NULL;
    if (!(extra_opts & PCRE2_LITERAL)) {
        st_status s = rewrite_classes(t, pattern, field, 0, &rewritten, err);
        if (s == ST_OK) s = rewrite_classes(t, pattern, field, 1, &fast, err);
        if (s != ST_OK) {
            free(rewritten);
            return s;
        }
    }
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | extra_opts;
    pcre2_code *re = compile_jit(rewritten ? rewritten : pattern, opts, &jit, &ec, &eo);
    if (!re) {
        free(rewritten);
        free(fast);
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return st_errf(err, ST_ERR_UNSUPPORTED, "%s: %s: regex '%s' does not compile (at offset %zu with \\s, \\p{L}, \\p{N} spelled out): %s", t->path,
                       field, pattern, (size_t)eo, (const char *)msg);
    }
    /* The two patterns differ only in classes that differ only at the code points of
     * uni_new: on text without any of them they match the same. */
    pcre2_code *re_fast = NULL;
    if (fast && strcmp(fast, rewritten) != 0) {
        if (!t->uni_new)
            t->uni_new = compile_jit("[" EXTRA_L EXTRA_N "]", PCRE2_UTF | PCRE2_MATCH_INVALID_UTF, &t->uni_new_jit, &ec,
                                     &eo);
        if (t->uni_new) re_fast = compile_jit(fast, opts, &jit_fast, &ec, &eo);
    }
    free(rewritten);
    free(fast);
    pt_step *st = &t->steps[t->n_steps];
    st->kind = STEP_SPLIT;
    st->re = re;
    st->jit = jit;
    st->re_fast = re_fast;
    st->jit_fast = jit_fast;
    t->n_steps++;
    return ST_OK;
}

st_status tok_dup_str(const st_tokenizer *t, const char *s, size_t len, char **out, st_err *err) {
    *out = malloc(len + 1);
    if (!*out) return st_errf(err, ST_ERR_NOMEM, "%s: out of memory", t->path);
    memcpy(*out, s, len);
    (*out)[len] = 0;
    return ST_OK;
}

st_status tok_set_id_str(st_tokenizer *t, int32_t id, const char *s, size_t len, const char *field, st_err *err) {
    if (id < 0 || (size_t)id >= t->n_ids)
        return st_errf(err, ST_ERR_FORMAT, "%s: %s: id %d is out of range", t->path, field, (int)id);
    if (t->id_str[id]) return ST_OK; /* the model's vocabulary and added_tokens may share an id */
    t->id_str[id] = malloc(len + 1);
    if (!t->id_str[id]) return st_errf(err, ST_ERR_NOMEM, "%s: out of memory", t->path);
    memcpy(t->id_str[id], s, len);
    t->id_str[id][len] = 0;
    t->id_len[id] = (uint32_t)len;
    return ST_OK;
}

/* Run the normalizer over len bytes: *out (malloc'd, or NULL when len is 0) gets *olen bytes. */
st_status tok_normalize(const st_tokenizer *t, const uint8_t *p, size_t len, char **out, size_t *olen,
                           st_err *err) {
    char *cur = malloc(len ? len : 1);
    size_t n = len;
    if (!cur) return st_errf(err, ST_ERR_NOMEM, "tokenizer: out of memory");
    memcpy(cur, p, len);
    for (int k = 0; k < t->n_norm && n > 0; k++) {
        const norm_step *st = &t->norm[k];
        size_t cnt = 1; /* Prepend adds a once */
        if (st->kind == NORM_REPLACE) {
            cnt = 0;
            for (size_t i = 0; i + st->alen <= n;)
                if (memcmp(cur + i, st->a, st->alen) == 0) {
                    cnt++;
                    i += st->alen;
                } else {
                    i++;
                }
            if (cnt == 0) continue;
        }
        size_t grow_by = st->kind == NORM_REPLACE ? st->blen : st->alen;
        char *nb = malloc(n + cnt * grow_by + 1);
        if (!nb) {
            free(cur);
            return st_errf(err, ST_ERR_NOMEM, "tokenizer: out of memory");
        }
        size_t o = 0;
        if (st->kind == NORM_PREPEND) {
            memcpy(nb, st->a, st->alen);
            memcpy(nb + st->alen, cur, n);
            o = st->alen + n;
        } else {
            for (size_t i = 0; i < n;)
                if (i + st->alen <= n && memcmp(cur + i, st->a, st->alen) == 0) {
                    memcpy(nb + o, st->b, st->blen);
                    o += st->blen;
                    i += st->alen;
                } else {
                    nb[o++] = cur[i++];
                }
        }
        free(cur);
        cur = nb;
        n = o;
    }
    *out = cur;
    *olen = n;
    return ST_OK;
}

/* ---- load dispatch ------------------------------------------------------------------ */

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

st_status st_tokenizer_load(st_tokenizer **out, const char *path, st_err *err) {
    return st_tokenizer_load_ex(out, path, NULL, err);
}

/* The rank files whose name says their pattern: tiktoken's own files and Qwen's. */
static const char *pattern_of_name(const char *path) {
    static const struct { const char *file, *pattern; } KNOWN[] = {
        {"qwen.tiktoken", "qwen2"},       {"cl100k_base.tiktoken", "cl100k"}, {"o200k_base.tiktoken", "o200k"},
        {"r50k_base.tiktoken", "gpt2"},   {"p50k_base.tiktoken", "gpt2"},
    };
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    for (size_t i = 0; i < sizeof KNOWN / sizeof *KNOWN; i++)
        if (!strcmp(base, KNOWN[i].file)) return KNOWN[i].pattern;
    return NULL;
}

/* A rank file with what the options leave unsaid taken from beside it: the pattern from
 * tokenizer_config.json (pat_str; tokenizer_class QWenTokenizer) or else the file's known name,
 * the special tokens from tokenizer_config.json's added_tokens_decoder. */
static st_status load_ranks(st_tokenizer *t, const char *buf, size_t len, const st_tokenizer_opts *opts,
                            const char *dir, st_err *err) {
    tok_rank_config rc;
    st_status s = tok_rank_config_read(dir, &rc, err);
    if (s != ST_OK) return s;
    st_tokenizer_opts eff = opts ? *opts : (st_tokenizer_opts){0};
    const char *from = "the load options";
    if (!eff.pattern && rc.pattern) {
        eff.pattern = rc.pattern;
        from = !strcmp(rc.pattern_key, "pat_str") ? "tokenizer_config.json's pat_str"
                                                  : "tokenizer_config.json's tokenizer_class QWenTokenizer";
    } else if (!eff.pattern && (eff.pattern = pattern_of_name(t->path))) {
        from = "the file's name";
    }
    if (!eff.n_special && rc.n_special) {
        eff.special = rc.special;
        eff.special_ids = rc.special_ids;
        eff.n_special = rc.n_special;
    }
    s = tok_load_tiktoken(t, buf, len, &eff, err);
    if (s == ST_OK) t->pattern_from = from;
    tok_rank_config_free(&rc);
    return s;
}

/* One file, by its content: a JSON object (after any white space) or rank lines; *ranks is set
 * for rank lines. */
static st_status load_file(st_tokenizer *t, const st_tokenizer_opts *opts, const char *dir, int *ranks,
                           st_err *err) {
    char *buf = NULL;
    size_t len = 0;
    st_status s = tok_read_file(t->path, &buf, &len, err);
    if (s != ST_OK) return s;
    size_t i = 0;
    while (i < len && (buf[i] == ' ' || buf[i] == '\t' || buf[i] == '\n' || buf[i] == '\r')) i++;
    *ranks = !(i < len && buf[i] == '{');
    s = *ranks ? load_ranks(t, buf, len, opts, dir, err) : tok_load_json(t, buf, len, err);
    free(buf);
    return s;
}

st_status st_tokenizer_load_ex(st_tokenizer **out, const char *path, const st_tokenizer_opts *opts, st_err *err) {
    *out = NULL;
    st_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return st_errf(err, ST_ERR_NOMEM, "tokenizer %s: out of memory", path);
    t->bos_id = t->eos_id = t->pad_id = -1;
    t->add_bos = -1;
    int dir = is_dir(path);
    st_status s = ST_OK;
    if (dir) {
        s = tok_dir_file(path, &t->path, err);
    } else if (!(t->path = strdup(path))) {
        s = st_errf(err, ST_ERR_NOMEM, "tokenizer %s: out of memory", path);
    }
    /* the directory the file is in: a rank file's tokenizer_config.json is read from it */
    char *in_dir = s == ST_OK ? strdup(t->path) : NULL;
    int ranks = 0;
    if (s == ST_OK && !in_dir) s = st_errf(err, ST_ERR_NOMEM, "tokenizer %s: out of memory", path);
    if (s == ST_OK) {
        char *slash = strrchr(in_dir, '/');
        if (!slash) strcpy(in_dir, ".");
        else if (slash == in_dir) in_dir[1] = 0; /* "/tokenizer.model": "/" */
        else *slash = 0;
        byte_alphabet(t);
        s = load_file(t, opts, in_dir, &ranks, err);
    }
    if (s == ST_OK && (dir || ranks)) s = tok_load_config(t, dir ? path : in_dir, err);
    free(in_dir);
    if (s == ST_OK && opts) s = tok_apply_opts(t, opts, err);
    if (s == ST_OK && !(t->enc = calloc(TOK_ENC_SLOTS, sizeof *t->enc)))
        s = st_errf(err, ST_ERR_NOMEM, "tokenizer %s: out of memory", path);
    if (s == ST_OK) {
        for (int i = 0; i < TOK_ENC_SLOTS; i++) atomic_init(&t->enc[i].busy, 0);
        t->cache_entries = TOK_CACHE_ENTRIES;
        for (int pass = 0; pass < ADDED_PASSES; pass++) {
            for (int b = 0; b < 256; b++)
                if (t->added && t->added_first[pass][b] >= 0) {
                    t->added_nfirst[pass]++;
                    t->added_first_byte[pass] = (uint8_t)b;
                }
        }
    }
    if (s != ST_OK) {
        st_tokenizer_free(t);
        return s;
    }
    *out = t;
    return ST_OK;
}

static void enc_free(tok_enc *e);

void st_tokenizer_free(st_tokenizer *t) {
    if (!t) return;
    for (int i = 0; t->enc && i < TOK_ENC_SLOTS; i++) enc_free(t->enc[i].e);
    free(t->enc);
    for (size_t i = 0; t->id_str && i < t->n_ids; i++) free(t->id_str[i]);
    for (int i = 0; i < t->n_steps; i++) {
        pcre2_code_free(t->steps[i].re);
        pcre2_code_free(t->steps[i].re_fast);
    }
    pcre2_code_free(t->uni_new);
    for (int i = 0; i < t->n_norm; i++) {
        free(t->norm[i].a);
        free(t->norm[i].b);
    }
    for (int i = 0; i < t->n_dec; i++) {
        free(t->dec[i].a);
        free(t->dec[i].b);
    }
    for (int i = 0; t->added && i < t->n_added; i++) {
        free(t->added[i].owned);
        free(t->added[i].content);
    }
    free(t->id_str);
    free(t->id_len);
    free(t->vocab);
    free(t->merges);
    free(t->added);
    free(t->chat_template);
    free(t->pattern);
    free(t->path);
    free(t);
}

size_t st_tokenizer_vocab_size(const st_tokenizer *t) { return t->n_ids; }

const char *st_tokenizer_pattern(const st_tokenizer *t, const char **name, const char **from) {
    if (name) *name = t->pattern_name;
    if (from) *from = t->pattern_from;
    return t->pattern;
}

int32_t st_tokenizer_token_id(const st_tokenizer *t, const char *token) {
    int32_t id = tok_vocab_find(t, token, strlen(token));
    if (id >= 0) return id;
    for (int i = 0; i < t->n_added; i++)
        if (strcmp(t->added[i].content, token) == 0) return t->added[i].id;
    return -1;
}

const char *st_tokenizer_id_token(const st_tokenizer *t, int32_t id) {
    return id >= 0 && (size_t)id < t->n_ids ? t->id_str[id] : NULL;
}

/* ---- encoding ----------------------------------------------------------------------- */

/* a queued merge: the pair (a, b) at pos, to become new_id */
typedef struct heap_item { uint32_t rank, pos; int32_t new_id, a, b; } heap_item;
/* An encoder's copy of merge_find's answers for recent pairs (direct-mapped; new_id -1: no
 * merge; key 0: empty): a large merge table is mostly cache misses, a text's pairs repeat. */
typedef struct pair_ent { uint64_t key; uint32_t rank; int32_t new_id; } pair_ent;
enum { PAIR_CACHE = 4096 };

/* A cache slot: the pre-token's hash and where its record starts in the arena, plus one
 * (0: an empty slot). A record is the pre-token's length (a byte), its number of ids (a
 * byte), its bytes and its ids (unaligned int32), together so that a hit reads one place. */
typedef struct cache_slot { uint32_t h, rec; } cache_slot;
/* Longer pre-tokens are merged every time (long ones seldom repeat; at most 2 ids a byte).
 * Per entry the arena has room for CACHE_REC_BYTES on average. */
enum { CACHE_KEY_MAX = 64, CACHE_REC_BYTES = 48 };
/* BPE scratch past this many symbols is freed when the encode call ends */
enum { SCRATCH_KEEP = 1 << 14 };

struct tok_enc {
    pcre2_match_data *md;
    pcre2_match_context *mctx; /* NULL until a match needs more than JIT's default stack */
    pcre2_jit_stack *js;
    /* BPE scratch, grown as words need */
    int32_t *sym;
    int32_t *prev, *next;
    heap_item *heap;
    size_t scratch_cap;
    pair_ent *pairs; /* PAIR_CACHE of them, made on first use; NULL: look up every pair */
    int no_pairs;
    char *mapped; /* a word in byte-level spelling, for ignore_merges */
    size_t mapped_cap;
    /* the pre-token cache: open addressing over mask + 1 slots holding at most max entries
     * (a half), emptied whole when it or an arena is full; made on first use */
    size_t max, count, mask;
    cache_slot *tab;
    uint8_t *arena;
    size_t arena_used, arena_cap;
    int no_cache; /* its allocation failed: encode without */
};

typedef struct enc_ctx {
    const st_tokenizer *t;
    int32_t *ids;
    size_t cap, n;
    tok_enc *e;
    st_err *err;
    size_t last_word; /* n where the last pre-token's ids began (the bytes rule reads it) */
    int bytes_rule;   /* the text is not all UTF-8 and t is byte-level: see encode_bytes */
    /* check_gaps: look for bytes that are not UTF-8 where the first Split's regex leaves text
     * between matches (it never matches them); saw_invalid: found some */
    int check_gaps, saw_invalid;
} enc_ctx;

static void enc_free(tok_enc *e) {
    if (!e) return;
    pcre2_match_data_free(e->md);
    pcre2_match_context_free(e->mctx);
    pcre2_jit_stack_free(e->js);
    free(e->sym);
    free(e->prev);
    free(e->next);
    free(e->heap);
    free(e->pairs);
    free(e->mapped);
    free(e->tab);
    free(e->arena);
    free(e);
}

static tok_enc *enc_new(size_t cache_entries) {
    tok_enc *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->max = cache_entries;
    e->md = pcre2_match_data_create(16, NULL);
    if (!e->md) {
        free(e);
        return NULL;
    }
    return e;
}

/* A free encoder state of t, or where all TOK_ENC_SLOTS are busy one of this call's own,
 * without a cache; *slot: its slot, -1 for an own one. NULL: out of memory. */
static tok_enc *enc_acquire(const st_tokenizer *t, int *slot) {
    *slot = -1;
    for (int i = 0; t->enc && i < TOK_ENC_SLOTS; i++) {
        tok_enc_slot *sl = &t->enc[i];
        if (atomic_load_explicit(&sl->busy, memory_order_relaxed) ||
            atomic_exchange_explicit(&sl->busy, 1, memory_order_acquire))
            continue;
        if (!sl->e && !(sl->e = enc_new(t->cache_entries))) {
            atomic_store_explicit(&sl->busy, 0, memory_order_release);
            return NULL;
        }
        *slot = i;
        return sl->e;
    }
    return enc_new(0);
}

static void enc_release(const st_tokenizer *t, tok_enc *e, int slot) {
    if (slot < 0) {
        enc_free(e);
        return;
    }
    if (e->scratch_cap > SCRATCH_KEEP) { /* a long word's scratch is not kept */
        free(e->sym);
        free(e->prev);
        free(e->next);
        free(e->heap);
        e->sym = e->prev = e->next = NULL;
        e->heap = NULL;
        e->scratch_cap = 0;
    }
    if (e->mapped_cap > 2 * SCRATCH_KEEP) {
        free(e->mapped);
        e->mapped = NULL;
        e->mapped_cap = 0;
    }
    atomic_store_explicit(&t->enc[slot].busy, 0, memory_order_release);
}

void tok_set_cache_entries(st_tokenizer *t, size_t entries) {
    t->cache_entries = entries;
    for (int i = 0; t->enc && i < TOK_ENC_SLOTS; i++) {
        enc_free(t->enc[i].e);
        t->enc[i].e = NULL;
    }
}

/* 1 to 7 bytes as one word (not injective: for hashing) */
static uint64_t load_short(const uint8_t *p, size_t n) {
    if (n >= 4) {
        uint32_t a, b;
        memcpy(&a, p, 4);
        memcpy(&b, p + n - 4, 4);
        return (uint64_t)a << 32 | b;
    }
    return (uint64_t)p[0] << 16 | (uint64_t)p[n >> 1] << 8 | p[n - 1];
}

/* Hash of a short byte string, 8 bytes at a time. */
static uint32_t hash_piece(const uint8_t *p, size_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ n, v;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&v, p + i, 8);
        h = (h ^ v) * 0xff51afd7ed558ccdull;
        h ^= h >> 29;
    }
    if (i < n) {
        if (n >= 8)
            memcpy(&v, p + n - 8, 8);
        else
            v = load_short(p, n);
        h = (h ^ v) * 0xff51afd7ed558ccdull;
    }
    return (uint32_t)(hash_u64(h) >> 32);
}

static int bytes_equal(const uint8_t *a, const uint8_t *b, size_t n) {
    uint64_t x, y;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&x, a + i, 8);
        memcpy(&y, b + i, 8);
        if (x != y) return 0;
    }
    for (; i < n; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

/* The record of w, or NULL. */
static const uint8_t *cache_get(const tok_enc *e, const uint8_t *w, size_t len, uint32_t h) {
    if (!e->tab) return NULL;
    for (size_t i = h & e->mask;; i = (i + 1) & e->mask) {
        cache_slot sl = e->tab[i];
        if (sl.rec == 0) return NULL;
        const uint8_t *r = e->arena + sl.rec - 1;
        if (sl.h == h && r[0] == len && bytes_equal(r + 2, w, len)) return r;
    }
}

/* Remember that w (len <= CACHE_KEY_MAX, not in the cache) encodes to ids[0..nid). Best
 * effort: without memory nothing is kept. */
static void cache_put(tok_enc *e, const uint8_t *w, size_t len, uint32_t h, const int32_t *ids, size_t nid) {
    if (e->no_cache) return;
    if (!e->tab) {
        size_t slots = tok_pow2_at_least(2 * e->max);
        e->arena_cap = e->max * CACHE_REC_BYTES;
        e->tab = calloc(slots, sizeof *e->tab);
        e->arena = malloc(e->arena_cap);
        if (!e->tab || !e->arena || e->arena_cap >= UINT32_MAX) {
            free(e->tab);
            free(e->arena);
            e->tab = NULL;
            e->arena = NULL;
            e->no_cache = 1;
            return;
        }
        e->mask = slots - 1;
    }
    size_t need = 2 + len + 4 * nid;
    if (nid > UINT8_MAX || need > e->arena_cap) return;
    if (e->count == e->max || e->arena_used + need > e->arena_cap) {
        memset(e->tab, 0, (e->mask + 1) * sizeof *e->tab);
        e->count = e->arena_used = 0;
    }
    size_t i = h & e->mask;
    while (e->tab[i].rec) i = (i + 1) & e->mask;
    e->tab[i] = (cache_slot){h, (uint32_t)e->arena_used + 1};
    uint8_t *r = e->arena + e->arena_used;
    r[0] = (uint8_t)len;
    r[1] = (uint8_t)nid;
    memcpy(r + 2, w, len);
    memcpy(r + 2 + len, ids, 4 * nid);
    e->arena_used += need;
    e->count++;
}

static void emit(enc_ctx *c, int32_t id) {
    if (c->n < c->cap) c->ids[c->n] = id;
    c->n++;
}

static int heap_less(const heap_item *a, const heap_item *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(heap_item *h, size_t *n, heap_item it) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&it, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = it;
}

static heap_item heap_pop(heap_item *h, size_t *n) {
    heap_item top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const heap_item *best = &last;
        if (l < *n && heap_less(&h[l], best)) { m = l; best = &h[l]; }
        if (r < *n && heap_less(&h[r], best)) { m = r; }
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    if (*n > 0) h[i] = last;
    return top;
}

static st_status grow(enc_ctx *c, size_t len) {
    tok_enc *e = c->e;
    if (len <= e->scratch_cap) return ST_OK;
    size_t cap = tok_pow2_at_least(len);
    int32_t *s = realloc(e->sym, cap * sizeof *s), *p, *nx;
    if (s) e->sym = s;
    p = realloc(e->prev, cap * sizeof *p);
    if (p) e->prev = p;
    nx = realloc(e->next, cap * sizeof *nx);
    if (nx) e->next = nx;
    /* every symbol can put at most two pairs on the heap per merge, plus the initial ones */
    heap_item *h = realloc(e->heap, 3 * cap * sizeof *h);
    if (h) e->heap = h;
    if (!s || !p || !nx || !h) return st_errf(c->err, ST_ERR_NOMEM, "tokenizer: out of memory for a %zu-byte word", len);
    e->scratch_cap = cap;
    return ST_OK;
}

/* merge_find through the encoder's pair cache: 1 and *it filled (rank, new_id, a, b) where
 * (a, b) merges */
static int pair_merge(const st_tokenizer *t, tok_enc *e, int32_t a, int32_t b, heap_item *it) {
    const merge_slot *m;
    if (!e->pairs) {
        if (!e->no_pairs && !(e->pairs = calloc(PAIR_CACHE, sizeof *e->pairs))) e->no_pairs = 1;
        if (!e->pairs) {
            if (!(m = merge_find(t, a, b))) return 0;
            *it = (heap_item){m->rank, 0, m->new_id, a, b};
            return 1;
        }
    }
    uint64_t k = merge_key(a, b);
    pair_ent *pe = &e->pairs[hash_u64(k) & (PAIR_CACHE - 1)];
    if (pe->key != k) {
        m = merge_find(t, a, b);
        *pe = m ? (pair_ent){k, m->rank, m->new_id} : (pair_ent){k, 0, -1};
    }
    if (pe->new_id < 0) return 0;
    *it = (heap_item){pe->rank, 0, pe->new_id, a, b};
    return 1;
}

/* The vocabulary id of the whole word w (raw bytes; through the byte-level alphabet in a
 * byte-level model) in *id, -1 where it is no token. */
static st_status whole_id(enc_ctx *c, const uint8_t *w, size_t len, int32_t *id) {
    const st_tokenizer *t = c->t;
    tok_enc *e = c->e;
    const char *word = (const char *)w;
    size_t ml = len;
    if (t->byte_level) {
        size_t need = 2 * len;
        if (need > e->mapped_cap) {
            char *m = realloc(e->mapped, need);
            if (!m) return st_errf(c->err, ST_ERR_NOMEM, "tokenizer: out of memory");
            e->mapped = m;
            e->mapped_cap = need;
        }
        ml = 0;
        for (size_t i = 0; i < len; i++) {
            memcpy(e->mapped + ml, t->byte_chr[w[i]], t->byte_chr_len[w[i]]);
            ml += t->byte_chr_len[w[i]];
        }
        word = e->mapped;
    }
    *id = tok_vocab_find(t, word, ml);
    return ST_OK;
}

/* BPE on one pre-token (raw bytes). */
static st_status bpe_merge(enc_ctx *c, const uint8_t *w, size_t len) {
    const st_tokenizer *t = c->t;
    tok_enc *e = c->e;
    if (len == 0) return ST_OK;
    if (t->ignore_merges) {
        int32_t id;
        st_status s = whole_id(c, w, len, &id);
        if (s != ST_OK) return s;
        if (id >= 0) {
            emit(c, id);
            return ST_OK;
        }
    }
    /* a byte-level character is at most 2 bytes, so byte fallback makes at most 2 symbols a byte */
    st_status s = grow(c, t->byte_level && t->byte_fallback ? 2 * len : len);
    if (s != ST_OK) return s;
    int32_t *sym = e->sym, *prev = e->prev, *next = e->next;
    size_t n = 0;
    int unk_pending = 0;
    /* tokenizers' BPE::merge_word: each character's id; else its bytes' <0xNN> ids; else unk,
     * one for a run when fuse_unk. An unk waits until the next character found in the
     * vocabulary (byte tokens do not flush it), as there. */
    for (size_t i = 0; i < len;) {
        const uint8_t *u;
        size_t ul;
        int32_t id;
        if (t->byte_level) {
            id = t->byte_id[w[i]];
            u = (const uint8_t *)t->byte_chr[w[i]];
            ul = t->byte_chr_len[w[i]];
            i++;
        } else {
            /* a byte that is not part of valid UTF-8 stands alone: its <0xNN> or unk */
            ul = tok_utf8_char_len(w + i, len - i);
            if (ul == 0) ul = 1;
            u = w + i;
            id = tok_vocab_find(t, (const char *)u, ul);
            i += ul;
        }
        if (id >= 0) {
            if (unk_pending) sym[n++] = t->unk_id;
            unk_pending = 0;
            sym[n++] = id;
            continue;
        }
        if (t->byte_fallback) {
            int all = 1;
            for (size_t j = 0; j < ul; j++) all = all && t->fallback_id[u[j]] >= 0;
            if (all) {
                for (size_t j = 0; j < ul; j++) sym[n++] = t->fallback_id[u[j]];
                continue;
            }
        }
        if (t->unk_id < 0) continue; /* tokenizers drops a character it has no id for */
        if (unk_pending && !t->fuse_unk) sym[n++] = t->unk_id;
        unk_pending = 1;
    }
    if (unk_pending) sym[n++] = t->unk_id;
    for (size_t i = 0; i < n; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    size_t hn = 0;
    heap_item it;
    for (size_t i = 0; i + 1 < n; i++)
        if (pair_merge(t, e, sym[i], sym[i + 1], &it)) {
            it.pos = (uint32_t)i;
            heap_push(e->heap, &hn, it);
        }
    while (hn > 0) {
        heap_item top = heap_pop(e->heap, &hn);
        uint32_t pos = top.pos;
        int32_t nx = next[pos];
        /* Skip a pair that changed since it was queued (or pos merged into its left neighbour):
         * symbols only grow, so the pair at pos is the queued one exactly when both of its
         * symbols are, and then it still merges to top.new_id. */
        if (sym[pos] != top.a || nx < 0 || sym[nx] != top.b) continue;
        sym[pos] = top.new_id;
        sym[nx] = -1;
        next[pos] = next[nx];
        if (next[nx] >= 0) prev[next[nx]] = (int32_t)pos;
        if (prev[pos] >= 0 && pair_merge(t, e, sym[prev[pos]], sym[pos], &it)) {
            it.pos = (uint32_t)prev[pos];
            heap_push(e->heap, &hn, it);
        }
        if (next[pos] >= 0 && pair_merge(t, e, sym[pos], sym[next[pos]], &it)) {
            it.pos = pos;
            heap_push(e->heap, &hn, it);
        }
    }
    for (int32_t i = n ? 0 : -1; i >= 0; i = next[i]) emit(c, sym[i]);
    return ST_OK;
}

/* One pre-token's ids: from the cache, or merged and then cached. A pre-token's ids depend on
 * its bytes alone, so a cached one gives the ids merging would. */
static st_status bpe_word(enc_ctx *c, const uint8_t *w, size_t len) {
    tok_enc *e = c->e;
    c->last_word = c->n;
    if (e->max == 0 || len > CACHE_KEY_MAX) return bpe_merge(c, w, len);
    uint32_t h = hash_piece(w, len);
    const uint8_t *r = cache_get(e, w, len, h);
    if (r) {
        const uint8_t *id = r + 2 + len;
        for (unsigned k = 0; k < r[1]; k++, id += 4) {
            int32_t v;
            memcpy(&v, id, 4);
            emit(c, v);
        }
        return ST_OK;
    }
    size_t n0 = c->n;
    st_status s = bpe_merge(c, w, len);
    /* ids past cap were counted, not written: such a word is not cached */
    if (s == ST_OK && c->n <= c->cap && c->n > n0) cache_put(e, w, len, h, c->ids + n0, c->n - n0);
    return s;
}

/* Metaspace: spaces become the replacement character, which is put in front (always, or only
 * for the piece at the start of the text), and with split the piece is cut before each
 * replacement character (tokenizers' MergedWithNext on single characters: "▁▁a" is "▁", "▁a"). */
static st_status metaspace(enc_ctx *c, int k, const pt_step *st, const uint8_t *p, size_t len, int at_start);

/* Length of the longest prefix of p that is valid UTF-8 (len when all of it is). */
static size_t utf8_valid_len(const uint8_t *p, size_t len) {
    size_t i = 0;
    while (i < len) {
        uint64_t w;
        if (i + 8 <= len && (memcpy(&w, p + i, 8), (w & 0x8080808080808080ull) == 0)) {
            i += 8;
            continue;
        }
        size_t k = tok_utf8_char_len(p + i, len - i);
        if (k == 0) return i;
        i += k;
    }
    return len;
}

/* Text the first Split's regex left between its matches: remember whether it holds bytes that
 * are not UTF-8 (the text is then encoded again by the bytes rule). */
static void check_gap(enc_ctx *c, const uint8_t *p, size_t len) {
    if (c->check_gaps && !c->saw_invalid && utf8_valid_len(p, len) < len) c->saw_invalid = 1;
}

/* Pre-tokenizer step k over one piece; at_start: the piece begins at byte 0 of the text
 * (Metaspace's prepend_scheme "first" looks at that). */
static st_status pretok(enc_ctx *c, int k, const uint8_t *p, size_t len, int at_start) {
    const st_tokenizer *t = c->t;
    if (len == 0) return ST_OK;
    if (k == t->n_steps) return bpe_word(c, p, len);
    const pt_step *st = &t->steps[k];
    if (st->kind == STEP_METASPACE) return metaspace(c, k, st, p, len, at_start);
    if (st->kind == STEP_PREFIX_SPACE) {
        if (p[0] == ' ') return pretok(c, k + 1, p, len, at_start);
        uint8_t *b = malloc(len + 1);
        if (!b) return st_errf(c->err, ST_ERR_NOMEM, "tokenizer: out of memory");
        b[0] = ' ';
        memcpy(b + 1, p, len);
        st_status s = pretok(c, k + 1, b, len + 1, at_start);
        free(b);
        return s;
    }
    size_t pos = 0, at = 0;
    st_status s;
    tok_enc *e = c->e;
    const pcre2_code *re = st->re;
    int jit = st->jit;
    if (st->re_fast) { /* text without the code points the fast pattern misclassifies */
        int rc = t->uni_new_jit ? pcre2_jit_match(t->uni_new, p, len, 0, 0, e->md, NULL)
                                : pcre2_match(t->uni_new, p, len, 0, 0, e->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) {
            re = st->re_fast;
            jit = st->jit_fast;
        }
    }
    while (at <= len) {
        /* pcre2_jit_match skips pcre2_match's checks of its arguments, which hold here */
        int rc = jit ? pcre2_jit_match(re, p, len, at, 0, e->md, e->mctx)
                     : pcre2_match(re, p, len, at, 0, e->md, e->mctx);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !e->mctx) {
            /* JIT's default 32 KiB stack is enough for ordinary text; a long run that
             * backtracks gets a larger one, kept with the encoder state */
            if (!e->js) e->js = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
            if (e->js) e->mctx = pcre2_match_context_create(NULL); /* only with its stack */
            if (!e->mctx) return st_errf(c->err, ST_ERR_NOMEM, "tokenizer: out of memory");
            pcre2_jit_stack_assign(e->mctx, NULL, e->js);
            continue;
        }
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return st_errf(c->err, ST_ERR_INVALID, "tokenizer %s: pre-tokenizer regex failed at byte %zu: %s",
                           t->path, at, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* an empty match splits nothing: step over one character */
            at = ms + 1;
            while (at < len && (p[at] & 0xC0) == 0x80) at++;
            continue;
        }
        if (ms > pos) check_gap(c, p + pos, ms - pos);
        if (ms > pos && (s = pretok(c, k + 1, p + pos, ms - pos, at_start && pos == 0)) != ST_OK) return s;
        if ((s = pretok(c, k + 1, p + ms, me - ms, at_start && ms == 0)) != ST_OK) return s;
        pos = at = me;
    }
    if (pos < len) check_gap(c, p + pos, len - pos);
    if (pos < len) return pretok(c, k + 1, p + pos, len - pos, at_start && pos == 0);
    return ST_OK;
}

static st_status metaspace(enc_ctx *c, int k, const pt_step *st, const uint8_t *p, size_t len, int at_start) {
    size_t spaces = 0;
    for (size_t i = 0; i < len; i++) spaces += p[i] == ' ';
    uint8_t *b = malloc(len + (spaces + 1) * st->rep_len);
    if (!b) return st_errf(c->err, ST_ERR_NOMEM, "tokenizer: out of memory");
    size_t n = 0;
    int starts = p[0] == ' ' || (len >= st->rep_len && memcmp(p, st->rep, st->rep_len) == 0);
    if (!starts && (st->prepend == PREPEND_ALWAYS || (st->prepend == PREPEND_FIRST && at_start))) {
        memcpy(b, st->rep, st->rep_len);
        n = st->rep_len;
    }
    for (size_t i = 0; i < len; i++)
        if (p[i] == ' ') {
            memcpy(b + n, st->rep, st->rep_len);
            n += st->rep_len;
        } else {
            b[n++] = p[i];
        }
    st_status s = ST_OK;
    if (!st->split) {
        s = pretok(c, k + 1, b, n, at_start);
    } else {
        size_t start = 0;
        for (size_t i = 0; i < n && s == ST_OK;) {
            int match = i + st->rep_len <= n && memcmp(b + i, st->rep, st->rep_len) == 0;
            if (match && i > start) {
                s = pretok(c, k + 1, b + start, i - start, at_start && start == 0);
                start = i;
            }
            i += match ? st->rep_len : 1;
        }
        if (s == ST_OK) s = pretok(c, k + 1, b + start, n - start, at_start && start == 0);
    }
    free(b);
    return s;
}

/* Whether token id's bytes are all ' ', '\n' or '\t' (tiktoken's _increase_last_piece_token_len
 * test). A rank file's token is its bytes (its alphabet maps byte 0 to itself); a ByteLevel
 * token's characters stand for bytes through the alphabet. */
static int token_all_space(const st_tokenizer *t, int32_t id) {
    const uint8_t *u = (const uint8_t *)t->id_str[id];
    size_t l = t->id_len[id];
    int raw = t->byte_chr_len[0] == 1;
    for (size_t j = 0; j < l;) {
        int b = u[j++];
        if (!raw && b >= 0x80) {
            j--;
            uint32_t cp = utf8_next(u, l, &j);
            b = cp < 324 ? t->cp_byte[cp] : -1;
        } else if (!raw) {
            b = t->cp_byte[b];
        }
        if (b != ' ' && b != '\n' && b != '\t') return 0;
    }
    return 1;
}

/* Token id's bytes written at out (which holds id_len[id]); their number. */
static size_t token_bytes(const st_tokenizer *t, int32_t id, uint8_t *out) {
    const uint8_t *u = (const uint8_t *)t->id_str[id];
    size_t l = t->id_len[id], o = 0;
    if (t->byte_chr_len[0] == 1) {
        memcpy(out, u, l);
        return l;
    }
    for (size_t j = 0; j < l;) {
        size_t j0 = j;
        uint32_t cp = utf8_next(u, l, &j);
        if (cp < 324 && t->cp_byte[cp] >= 0) {
            out[o++] = (uint8_t)t->cp_byte[cp];
        } else { /* a character outside the alphabet is its own UTF-8, as decode writes it */
            memcpy(out + o, u + j0, j - j0);
            o += j - j0;
        }
    }
    return o;
}

/* One piece left by the added tokens in a text that is not all UTF-8, as tiktoken's bytes API
 * (CoreBPE::_encode_bytes) encodes bytes: valid UTF-8 as text; else the valid prefix (up to
 * the first byte that starts no character) as text, then the ids of its last pre-token are
 * taken back - and before them every id whose bytes are all ' ', '\n', '\t' when the last
 * pre-token's first id is such - and their bytes followed by all the rest of the piece, valid
 * or not, are one word: the token it is, or else its byte-pair merge. */
static st_status encode_bytes(enc_ctx *c, const uint8_t *p, size_t len, int at_start) {
    const st_tokenizer *t = c->t;
    size_t v = utf8_valid_len(p, len);
    if (v == len) return pretok(c, 0, p, len, at_start);
    /* the prefix's ids apart (at most one a byte, one more for a prefix space) */
    enc_ctx sub = {.t = t, .cap = v + 2, .e = c->e, .err = c->err, .last_word = SIZE_MAX};
    sub.ids = malloc(sub.cap * sizeof *sub.ids);
    if (!sub.ids) return st_errf(c->err, ST_ERR_NOMEM, "tokenizer: out of memory");
    uint8_t *w = NULL;
    st_status s = pretok(&sub, 0, p, v, at_start);
    if (s == ST_OK && sub.n > sub.cap)
        s = st_errf(c->err, ST_ERR_INVALID, "tokenizer %s: %zu bytes of text made %zu ids", t->path, v, sub.n);
    if (s != ST_OK) goto done;
    size_t n = sub.n, k = sub.last_word <= n ? n - sub.last_word : 0;
    if (k > 0 && token_all_space(t, sub.ids[n - k]))
        while (k < n && token_all_space(t, sub.ids[n - k - 1])) k++;
    size_t wcap = len - v;
    for (size_t i = n - k; i < n; i++) wcap += t->id_len[sub.ids[i]];
    if (!(w = malloc(wcap))) {
        s = st_errf(c->err, ST_ERR_NOMEM, "tokenizer: out of memory for a %zu-byte word", wcap);
        goto done;
    }
    size_t wl = 0;
    for (size_t i = n - k; i < n; i++) wl += token_bytes(t, sub.ids[i], w + wl);
    memcpy(w + wl, p + v, len - v);
    wl += len - v;
    for (size_t i = 0; i < n - k; i++) emit(c, sub.ids[i]);
    int32_t id;
    if ((s = whole_id(c, w, wl, &id)) != ST_OK) goto done;
    if (id >= 0) emit(c, id);
    else s = bpe_merge(c, w, wl);
done:
    free(w);
    free(sub.ids);
    return s;
}

/* The normalizer over one piece left by the raw added tokens, then the normalized ones. */
static st_status split_added(enc_ctx *c, int pass, const uint8_t *p, size_t len, int at_start);

static st_status normalize_piece(enc_ctx *c, const uint8_t *p, size_t len, int at_start) {
    if (len == 0) return ST_OK;
    if (c->t->n_norm == 0) return split_added(c, ADDED_NORMALIZED, p, len, at_start);
    char *nb = NULL;
    size_t nl = 0;
    st_status s = tok_normalize(c->t, p, len, &nb, &nl, c->err);
    if (s != ST_OK) return s;
    s = split_added(c, ADDED_NORMALIZED, (const uint8_t *)nb, nl, at_start);
    free(nb);
    return s;
}

static st_status next_pass(enc_ctx *c, int pass, const uint8_t *p, size_t len, int at_start) {
    if (pass == ADDED_RAW) return normalize_piece(c, p, len, at_start);
    return split_added(c, pass + 1, p, len, at_start);
}

/* Cut the added tokens of one pass out of p (leftmost, longest, as tokenizers' matcher);
 * what lies between goes on: after the raw pass to the normalizer and the normalized pass,
 * after that to the pre-tokenizer. */
static st_status split_added(enc_ctx *c, int pass, const uint8_t *p, size_t len, int at_start) {
    const st_tokenizer *t = c->t;
    if (pass == ADDED_PASSES) return c->bytes_rule ? encode_bytes(c, p, len, at_start) : pretok(c, 0, p, len, at_start);
    if (t->added_nfirst[pass] == 0) return next_pass(c, pass, p, len, at_start);
    size_t seg = 0;
    st_status s;
    for (size_t i = 0; i < len;) {
        if (t->added_nfirst[pass] == 1 && p[i] != t->added_first_byte[pass]) {
            const uint8_t *f = memchr(p + i, t->added_first_byte[pass], len - i);
            i = f ? (size_t)(f - p) : len;
            continue;
        }
        const added_tok *best = NULL;
        for (int a = t->added_first[pass][p[i]]; a >= 0; a = t->added[a].next) {
            const added_tok *at = &t->added[a];
            if (at->len <= len - i && (!best || at->len > best->len) && memcmp(p + i, at->s, at->len) == 0) best = at;
        }
        if (!best) {
            i++;
            continue;
        }
        if ((s = next_pass(c, pass, p + seg, i - seg, at_start && seg == 0)) != ST_OK) return s;
        emit(c, best->id);
        i += best->len;
        seg = i;
    }
    return next_pass(c, pass, p + seg, len - seg, at_start && seg == 0);
}

st_status st_tokenizer_encode(const st_tokenizer *t, const char *text, size_t len, int32_t *ids, size_t cap,
                              size_t *n, st_err *err) {
    enc_ctx c = {.t = t, .ids = ids, .cap = cap, .err = err};
    /* A byte-level model encodes text that is not all UTF-8 by tiktoken's bytes rule
     * (encode_bytes). Whether it is, costs no pass over valid text where the pre-tokenizer
     * starts with a Split: its regex never matches such bytes, so they lie between its
     * matches, and the text is encoded again when some do. */
    if (t->byte_level && !t->byte_fallback) {
        if (t->n_steps > 0 && t->steps[0].kind == STEP_SPLIT) c.check_gaps = 1;
        else c.bytes_rule = utf8_valid_len((const uint8_t *)text, len) < len;
    }
    *n = 0;
    int slot;
    c.e = enc_acquire(t, &slot);
    if (!c.e) return st_errf(err, ST_ERR_NOMEM, "tokenizer: out of memory");
    st_status s = split_added(&c, ADDED_RAW, (const uint8_t *)text, len, 1);
    if (s == ST_OK && c.saw_invalid) {
        c.n = 0;
        c.check_gaps = 0;
        c.bytes_rule = 1;
        s = split_added(&c, ADDED_RAW, (const uint8_t *)text, len, 1);
    }
    enc_release(t, c.e, slot);
    if (s != ST_OK) return s;
    *n = c.n;
    if (c.n > cap)
        return st_errf(err, ST_ERR_INVALID, "tokenizer: the text needs %zu ids, the buffer holds %zu", c.n, cap);
    return ST_OK;
}

/* ---- decoding ----------------------------------------------------------------------- */

/* A list of strings in one buffer: what tokenizers' decode_chain passes from step to step. */
typedef struct piece { size_t off, len; } piece;
typedef struct plist { char *buf; size_t n, cap; piece *p; size_t np, pcap; int oom; } plist;

static void pl_new(plist *l) {
    if (l->oom) return;
    if (l->np == l->pcap) {
        size_t c = l->pcap ? 2 * l->pcap : 64;
        piece *np = realloc(l->p, c * sizeof *np);
        if (!np) {
            l->oom = 1;
            return;
        }
        l->p = np;
        l->pcap = c;
    }
    l->p[l->np++] = (piece){l->n, 0};
}

/* append to the last piece */
static void pl_add(plist *l, const void *b, size_t len) {
    if (l->oom || len == 0) return;
    if (l->n + len > l->cap) {
        size_t c = l->cap ? l->cap : 256;
        while (c < l->n + len) c *= 2;
        char *nb = realloc(l->buf, c);
        if (!nb) {
            l->oom = 1;
            return;
        }
        l->buf = nb;
        l->cap = c;
    }
    memcpy(l->buf + l->n, b, len);
    l->n += len;
    l->p[l->np - 1].len += len;
}

/* ByteFallback's test: "<0xNN>", six bytes, NN read as Rust's u8::from_str_radix(_, 16) does */
static int byte_token(const char *s, size_t len, uint8_t *b) {
    if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return 0;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char ch = s[i];
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
        if (d < 0 && !(i == 3 && ch == '+')) return 0; /* a leading + is accepted there */
        v = d < 0 ? v : v * 16 + d;
    }
    *b = (uint8_t)v;
    return 1;
}

static void dec_step_run(const st_tokenizer *t, const dec_step *st, const plist *in, plist *o) {
    int run = 0; /* BYTE_FALLBACK: the last piece of o is a run of bytes */
    if (st->kind == DEC_FUSE || st->kind == DEC_BYTE_LEVEL) pl_new(o);
    for (size_t i = 0; i < in->np; i++) {
        const char *s = in->buf + in->p[i].off;
        size_t l = in->p[i].len;
        switch (st->kind) {
        case DEC_FUSE:
            pl_add(o, s, l);
            break;
        case DEC_BYTE_LEVEL: { /* a piece of alphabet characters is bytes, any other stays text */
            int all = 1;
            for (size_t j = 0; j < l && all;) {
                uint32_t cp = utf8_next((const uint8_t *)s, l, &j);
                all = cp < 324 && t->cp_byte[cp] >= 0;
            }
            if (!all) {
                pl_add(o, s, l);
                break;
            }
            for (size_t j = 0; j < l;) {
                uint8_t b = (uint8_t)t->cp_byte[utf8_next((const uint8_t *)s, l, &j)];
                pl_add(o, &b, 1);
            }
            break;
        }
        case DEC_BYTE_FALLBACK: {
            uint8_t b;
            if (byte_token(s, l, &b)) {
                if (!run) pl_new(o);
                run = 1;
                pl_add(o, &b, 1);
            } else {
                run = 0;
                pl_new(o);
                pl_add(o, s, l);
            }
            break;
        }
        case DEC_REPLACE:
            pl_new(o);
            for (size_t j = 0; j < l;)
                if (j + st->alen <= l && memcmp(s + j, st->a, st->alen) == 0) {
                    pl_add(o, st->b, st->blen);
                    j += st->alen;
                } else {
                    pl_add(o, s + j++, 1);
                }
            break;
        case DEC_STRIP: {
            size_t a = 0, e = l;
            for (uint32_t k = 0; k < st->start && a + st->alen <= e && memcmp(s + a, st->a, st->alen) == 0; k++)
                a += st->alen;
            for (uint32_t k = 0; k < st->stop && e - a >= st->alen && memcmp(s + e - st->alen, st->a, st->alen) == 0;
                 k++)
                e -= st->alen;
            pl_new(o);
            pl_add(o, s + a, e - a);
            break;
        }
        case DEC_METASPACE: /* in the first piece the replacement is dropped, elsewhere a space */
            pl_new(o);
            for (size_t j = 0; j < l;)
                if (j + st->alen <= l && memcmp(s + j, st->a, st->alen) == 0) {
                    if (!(i == 0 && st->prepend)) pl_add(o, " ", 1);
                    j += st->alen;
                } else {
                    pl_add(o, s + j++, 1);
                }
            break;
        }
    }
}

static st_status decode_chain(const st_tokenizer *t, const int32_t *ids, size_t n, char *out, size_t cap,
                              size_t *len, st_err *err) {
    plist a = {0}, b = {0};
    for (size_t i = 0; i < n && !a.oom; i++) {
        pl_new(&a);
        pl_add(&a, t->id_str[ids[i]], t->id_len[ids[i]]);
    }
    for (int k = 0; k < t->n_dec && !a.oom; k++) {
        b.n = b.np = 0;
        dec_step_run(t, &t->dec[k], &a, &b);
        plist tmp = a;
        a = b;
        b = tmp;
        a.oom |= b.oom;
    }
    size_t o = 0;
    for (size_t i = 0; i < a.np && !a.oom; i++) {
        if (o < cap && a.p[i].len > 0)
            memcpy(out + o, a.buf + a.p[i].off, a.p[i].len < cap - o ? a.p[i].len : cap - o);
        o += a.p[i].len;
    }
    int oom = a.oom;
    free(a.buf);
    free(a.p);
    free(b.buf);
    free(b.p);
    if (oom) return st_errf(err, ST_ERR_NOMEM, "tokenizer: out of memory decoding %zu ids", n);
    *len = o;
    if (o > cap) return st_errf(err, ST_ERR_INVALID, "tokenizer: the text needs %zu bytes, the buffer holds %zu", o, cap);
    return ST_OK;
}

st_status st_tokenizer_decode(const st_tokenizer *t, const int32_t *ids, size_t n, char *out, size_t cap,
                              size_t *len, st_err *err) {
    for (size_t i = 0; i < n; i++)
        if (!st_tokenizer_id_token(t, ids[i]))
            return st_errf(err, ST_ERR_INVALID, "tokenizer %s: ids[%zu] = %d has no token (vocabulary size %zu)",
                           t->path, i, (int)ids[i], t->n_ids);
    if (!(t->n_dec == 1 && t->dec[0].kind == DEC_BYTE_LEVEL)) return decode_chain(t, ids, n, out, cap, len, err);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        const char *s = st_tokenizer_id_token(t, ids[i]);
        if (!s)
            return st_errf(err, ST_ERR_INVALID, "tokenizer %s: ids[%zu] = %d has no token (vocabulary size %zu)",
                           t->path, i, (int)ids[i], t->n_ids);
        const uint8_t *u = (const uint8_t *)s;
        size_t l = t->id_len[ids[i]];
        /* the ByteLevel decoder maps every character back to its byte; a token with a
         * character outside the alphabet is written as its own UTF-8 */
        int all = 1;
        for (size_t j = 0; j < l && all;) {
            uint32_t cp = utf8_next(u, l, &j);
            all = cp < 324 && t->cp_byte[cp] >= 0;
        }
        if (all) {
            for (size_t j = 0; j < l;) {
                uint32_t cp = utf8_next(u, l, &j);
                if (o < cap) out[o] = (char)t->cp_byte[cp];
                o++;
            }
        } else {
            for (size_t j = 0; j < l; j++, o++)
                if (o < cap) out[o] = s[j];
        }
    }
    *len = o;
    if (o > cap) return st_errf(err, ST_ERR_INVALID, "tokenizer: the text needs %zu bytes, the buffer holds %zu", o, cap);
    return ST_OK;
}
