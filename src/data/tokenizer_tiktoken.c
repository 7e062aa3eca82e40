/* tokenizer_tiktoken.c - tiktoken rank files (*.tiktoken, Llama-3's tokenizer.model).
 *
 * Each line is "base64(token bytes) rank"; the rank is the token's id. tiktoken splits the text
 * with a regex, takes a piece that is itself a token as that token, and otherwise merges the
 * adjacent pair of parts whose concatenation has the lowest rank (leftmost on a tie) until no
 * pair is a token. That is BPE over raw bytes where every split of a token into two tokens is a
 * merge ranked by the token's rank, with ignore_merges: tokenizer.c's encoder, unchanged.
 * The pattern is never guessed: st_tokenizer_opts names it (gpt2, cl100k, o200k, llama3, qwen2
 * or a regex), or tokenizer.c finds it said beside the file; without one the file is refused.
 * Special tokens come from st_tokenizer_opts (a rank file does not list them) and are found
 * leftmost-longest; tiktoken's alternation takes the first listed where one special token is
 * a prefix of another at the same place (not so in the Llama-3 or cl100k sets: each is "<|...|>").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

static int b64_value(char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* Standard base64 with '=' padding (RFC 4648), as tiktoken writes it: the number of bytes
 * written to out (at most 3 * n / 4), or -1 where s is not base64. */
static long b64_decode(const char *s, size_t n, uint8_t *out) {
    if (n == 0 || n % 4 != 0) return -1;
    long o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        for (int k = 0; k < 4; k++) {
            int pad = s[i + k] == '=' && i + 4 == n && k >= 2;
            v[k] = pad ? -2 : b64_value(s[i + k]);
            if (v[k] == -1) return -1;
        }
        if (v[0] < 0 || v[1] < 0 || (v[2] == -2 && v[3] != -2)) return -1;
        uint32_t x = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)(v[2] < 0 ? 0 : v[2]) << 6 |
                     (uint32_t)(v[3] < 0 ? 0 : v[3]);
        out[o++] = (uint8_t)(x >> 16);
        if (v[2] >= 0) out[o++] = (uint8_t)(x >> 8);
        if (v[3] >= 0) out[o++] = (uint8_t)x;
    }
    return o;
}

typedef struct rank_line { size_t off, len; int32_t rank; size_t line; } rank_line;

/* "token rank" with the token's bytes decoded into arena at *used; 0 if the line is not one. */
static int parse_line(const char *l, size_t n, uint8_t *arena, size_t *used, rank_line *r) {
    size_t sp = 0;
    while (sp < n && l[sp] != ' ' && l[sp] != '\t') sp++;
    size_t d = sp;
    while (d < n && (l[d] == ' ' || l[d] == '\t')) d++;
    if (sp == 0 || d == sp || d == n) return 0;
    int64_t rank = 0;
    for (size_t i = d; i < n; i++) {
        if (l[i] < '0' || l[i] > '9' || rank > (INT32_MAX - 2) / 10) return 0;
        rank = rank * 10 + (l[i] - '0');
    }
    if (rank > INT32_MAX - 2) return 0;
    long bl = b64_decode(l, sp, arena + *used);
    if (bl <= 0) return 0;
    r->off = *used;
    r->len = (size_t)bl;
    r->rank = (int32_t)rank;
    *used += (size_t)bl;
    return 1;
}

static const struct { const char *name, *regex; } NAMED_PATTERNS[] = {
    {"gpt2", TOK_R50K_PATTERN},     {"cl100k", TOK_CL100K_PATTERN}, {"o200k", TOK_O200K_PATTERN},
    {"llama3", TOK_LLAMA3_PATTERN}, {"qwen2", TOK_QWEN2_PATTERN},
};

const char *tok_named_pattern(const char *name, const char **regex) {
    *regex = NULL;
    for (size_t i = 0; name && i < sizeof NAMED_PATTERNS / sizeof *NAMED_PATTERNS; i++)
        if (!strcmp(name, NAMED_PATTERNS[i].name)) {
            *regex = NAMED_PATTERNS[i].regex;
            return NAMED_PATTERNS[i].name;
        }
    return NULL;
}

static st_status load_specials(st_tokenizer *t, const st_tokenizer_opts *opts, int32_t first_id, st_err *err) {
    for (int b = 0; b < 256; b++) t->added_first[ADDED_RAW][b] = t->added_first[ADDED_NORMALIZED][b] = -1;
    size_t n = opts ? opts->n_special : 0;
    t->added = calloc(n ? n : 1, sizeof *t->added);
    if (!t->added) return st_errf(err, ST_ERR_NOMEM, "%s: out of memory", t->path);
    for (size_t i = 0; i < n; i++) {
        const char *sp = opts->special[i];
        int32_t id = opts->special_ids ? opts->special_ids[i] : first_id + (int32_t)i;
        if (!sp || !*sp)
            return st_errf(err, ST_ERR_INVALID, "%s: special token %zu is empty", t->path, i);
        if (id < 0 || (size_t)id >= t->n_ids || t->id_str[id])
            return st_errf(err, ST_ERR_INVALID, "%s: special token '%s' has id %d, which %s", t->path, sp, (int)id,
                           id < 0 ? "is negative" : (size_t)id >= t->n_ids ? "is out of range" : "a rank or special token has");
        char field[64];
        snprintf(field, sizeof field, "special token %zu", i);
        st_status s = tok_set_id_str(t, id, sp, strlen(sp), field, err);
        if (s != ST_OK) return s;
        added_tok *at = &t->added[t->n_added];
        at->s = t->id_str[id];
        at->len = t->id_len[id];
        at->id = id;
        if ((s = tok_dup_str(t, sp, strlen(sp), &at->content, err)) != ST_OK) return s;
        at->next = t->added_first[ADDED_RAW][(uint8_t)sp[0]];
        t->added_first[ADDED_RAW][(uint8_t)sp[0]] = t->n_added++;
    }
    return ST_OK;
}

st_status tok_load_tiktoken(st_tokenizer *t, const char *buf, size_t len, const st_tokenizer_opts *opts,
                            st_err *err) {
    size_t max_lines = 1;
    for (size_t i = 0; i < len; i++) max_lines += buf[i] == '\n';
    rank_line *lines = malloc(max_lines * sizeof *lines);
    uint8_t *arena = malloc(len ? len : 1); /* decoded tokens are shorter than their base64 */
    st_status s = ST_OK;
    if (!lines || !arena) {
        s = st_errf(err, ST_ERR_NOMEM, "%s: out of memory", t->path);
        goto done;
    }
    size_t n = 0, used = 0, lineno = 0;
    int32_t max_rank = -1;
    for (size_t i = 0; i < len;) {
        size_t e = i;
        while (e < len && buf[e] != '\n') e++;
        size_t l = e - i;
        lineno++;
        if (l > 0 && buf[i + l - 1] == '\r') l--;
        if (l > 0) { /* tiktoken skips empty lines */
            if (!parse_line(buf + i, l, arena, &used, &lines[n])) {
                /* the excerpt: printable bytes only */
                char ex[61];
                size_t k = 0;
                for (; k < l && k < 60; k++) ex[k] = buf[i + k] >= 0x20 && buf[i + k] < 0x7f ? buf[i + k] : '?';
                ex[k] = 0;
                s = st_errf(err, ST_ERR_FORMAT,
                            "tokenizer %s: neither JSON nor a tiktoken rank file: line %zu is not 'base64token rank': "
                            "'%s'%s",
                            t->path, lineno, ex, l > 60 ? "..." : "");
                goto done;
            }
            lines[n].line = lineno;
            if (lines[n].rank > max_rank) max_rank = lines[n].rank;
            n++;
        }
        i = e + 1;
    }
    if (n == 0) {
        s = st_errf(err, ST_ERR_FORMAT, "tokenizer %s: empty: neither JSON nor a tiktoken rank file", t->path);
        goto done;
    }
    /* ranks index tables: a rank file numbers its tokens (almost) densely, and a rank far
     * past the count of lines would make those tables gigabytes of holes */
    if ((size_t)max_rank + 1 > 2 * n + 1024) {
        s = st_errf(err, ST_ERR_FORMAT, "tokenizer %s: the largest rank, %ld, is far past its %zu tokens (ranks are "
                    "numbered from 0, almost without gaps); the file is damaged", t->path, (long)max_rank, n);
        goto done;
    }
    size_t n_special = opts ? opts->n_special : 0;
    int64_t max_id = max_rank + (int64_t)n_special;
    for (size_t i = 0; opts && opts->special_ids && i < n_special; i++)
        if (opts->special_ids[i] > max_id) max_id = opts->special_ids[i];
    if (max_id > INT32_MAX - 2) {
        s = st_errf(err, ST_ERR_INVALID, "%s: special token ids past %d", t->path, INT32_MAX - 2);
        goto done;
    }
    t->n_ids = (size_t)max_id + 1;
    t->id_str = calloc(t->n_ids, sizeof *t->id_str);
    t->id_len = calloc(t->n_ids, sizeof *t->id_len);
    t->vocab_cap = tok_pow2_at_least(n * 2 + 2);
    t->vocab = calloc(t->vocab_cap, sizeof *t->vocab);
    if (!t->id_str || !t->id_len || !t->vocab) {
        s = st_errf(err, ST_ERR_NOMEM, "%s: out of memory", t->path);
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        const rank_line *r = &lines[i];
        const char *tok = (const char *)arena + r->off;
        int32_t other = tok_vocab_find(t, tok, r->len);
        if (t->id_str[r->rank] || other >= 0) {
            s = st_errf(err, ST_ERR_FORMAT, "tokenizer %s: line %zu: %s %d is already taken by an earlier line", t->path,
                        r->line, other >= 0 ? "the token of rank" : "rank", (int)(other >= 0 ? other : r->rank));
            goto done;
        }
        char field[48];
        snprintf(field, sizeof field, "line %zu", r->line);
        if ((s = tok_set_id_str(t, r->rank, tok, r->len, field, err)) != ST_OK) goto done;
        tok_vocab_put(t, t->id_str[r->rank], t->id_len[r->rank], r->rank);
    }
    /* raw bytes are their own alphabet: every byte needs a rank, or tiktoken cannot encode it */
    for (int b = 0; b < 256; b++) {
        t->byte_chr[b][0] = (char)b;
        t->byte_chr_len[b] = 1;
        t->byte_id[b] = tok_vocab_find(t, t->byte_chr[b], 1);
        t->fallback_id[b] = -1;
        if (t->byte_id[b] < 0) {
            s = st_errf(err, ST_ERR_FORMAT, "tokenizer %s: no line gives byte 0x%02X a rank (every byte needs one)",
                        t->path, b);
            goto done;
        }
    }
    /* merges: every split of a token into two tokens, ranked by the token's rank */
    size_t n_pairs = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            t->merges_cap = tok_pow2_at_least(n_pairs * 2 + 2);
            t->merges = calloc(t->merges_cap, sizeof *t->merges);
            if (!t->merges) {
                s = st_errf(err, ST_ERR_NOMEM, "%s: out of memory for %zu merges", t->path, n_pairs);
                goto done;
            }
        }
        for (size_t i = 0; i < n; i++) {
            const rank_line *r = &lines[i];
            const char *tok = (const char *)arena + r->off;
            for (size_t k = 1; k < r->len; k++) {
                int32_t a = tok_vocab_find(t, tok, k), b = a < 0 ? -1 : tok_vocab_find(t, tok + k, r->len - k);
                if (b < 0) continue;
                if (pass == 0) n_pairs++;
                else tok_merge_put(t, a, b, (uint32_t)r->rank, r->rank);
            }
        }
    }
    t->unk_id = -1;
    t->byte_level = 1;
    t->ignore_merges = 1;
    t->dec[0].kind = DEC_FUSE; /* tokens are bytes: decode concatenates them */
    t->n_dec = 1;
    /* the pattern is said (the options, a tokenizer_config.json beside the file, a known file
     * name: tokenizer.c), never guessed: the same ranks split two ways give other ids */
    const char *pat = opts ? opts->pattern : NULL;
    if (!pat || !*pat) {
        s = st_errf(err, ST_ERR_INVALID,
                    "tokenizer %s: a tiktoken rank file does not say how text is split before merging (its "
                    "pre-tokenizer pattern), and nothing beside it says (a tokenizer_config.json with pat_str, or "
                    "tokenizer_class QWenTokenizer; a known file name: qwen.tiktoken, cl100k_base.tiktoken, "
                    "o200k_base.tiktoken, r50k_base.tiktoken, p50k_base.tiktoken); give it with --pattern NAME|REGEX "
                    "(NAME one of " TOK_PATTERN_NAMES "; the model's own, as its tokenizer code or tokenizer.json "
                    "spells it)",
                    t->path);
        goto done;
    }
    const char *regex = NULL;
    t->pattern_name = tok_named_pattern(pat, &regex);
    if ((s = tok_dup_str(t, regex ? regex : pat, strlen(regex ? regex : pat), &t->pattern, err)) != ST_OK) goto done;
    /* tiktoken's regex engine (Rust's) reads $ as the end of the text only */
    if ((s = tok_add_split(t, t->pattern, PCRE2_DOLLAR_ENDONLY, "pattern", err)) != ST_OK) goto done;
    s = load_specials(t, opts, max_rank + 1, err);
done:
    free(lines);
    free(arena);
    return s;
}
