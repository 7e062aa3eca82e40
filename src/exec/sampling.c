/* sampling.c - the next token from logits (greedy, temperature, top-k, top-p), and the
 * tokens <-> text hook (strata/generate.h): bytes for byte-level vocabularies, decimal
 * token ids for every other vocabulary until a tokenizer is plugged in. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "strata/generate.h"
#include "strata/tokenizer.h"

/* ------------------------------------------------------------------ sampling */

st_status st_sampler_validate(const st_sampler *s, st_err *err) {
    if (!isfinite(s->temperature) || s->temperature < 0)
        return st_errf(err, ST_ERR_INVALID, "temperature %g must be >= 0 (0: greedy)", s->temperature);
    if (s->top_k < 0) return st_errf(err, ST_ERR_INVALID, "top_k %d must be >= 0 (0: off)", s->top_k);
    if (!(s->top_p > 0 && s->top_p <= 1))
        return st_errf(err, ST_ERR_INVALID, "top_p %g must be in (0, 1] (1: off)", s->top_p);
    return ST_OK;
}

typedef struct cand { float v; int32_t i; } cand; /* a scaled logit and its token */

size_t st_sample_scratch_floats(int V) { return 2 * (size_t)V; } /* one cand per token */

/* Descending by value; equal values by token id, so the order (and a draw) is fixed. */
static int cand_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->v != y->v) return x->v < y->v ? 1 : -1;
    return (x->i > y->i) - (x->i < y->i);
}

int32_t st_sample(const float *logits, int V, const st_sampler *s, st_rng *rng, float *scratch) {
    if (!(s->temperature > 0)) {
        int32_t best = 0;
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        return best;
    }
    cand *c = (cand *)(void *)scratch;
    float inv_t = 1.0f / s->temperature;
    for (int i = 0; i < V; i++) c[i] = (cand){logits[i] * inv_t, i};
    int n = V;
    int truncate = (s->top_k > 0 && s->top_k < V) || s->top_p < 1.0f;
    if (truncate) {
        qsort(c, (size_t)V, sizeof *c, cand_desc);
        if (s->top_k > 0 && s->top_k < n) n = s->top_k;
    }
    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        if (c[i].v > mx) mx = c[i].v;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        c[i].v = expf(c[i].v - mx); /* unnormalised probability, in place */
        sum += c[i].v;
    }
    if (s->top_p < 1.0f) { /* the smallest prefix (most likely first) holding top_p of the mass */
        double cum = 0, need = s->top_p * sum;
        int keep = n;
        for (int i = 0; i < n; i++) {
            cum += c[i].v;
            if (cum >= need) { keep = i + 1; break; }
        }
        n = keep;
        sum = cum < need ? sum : cum;
    }
    double u = st_rng_uniform(rng) * sum, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += c[i].v;
        if (u < acc) return c[i].i;
    }
    return c[n - 1].i; /* u rounded up to the total */
}

/* ------------------------------------------------------------------ tokens and text */

st_status st_text_open(st_text *t, int vocab_size, const char *model_dir, st_err *err) {
    memset(t, 0, sizeof *t);
    if (vocab_size < 2) return st_errf(err, ST_ERR_INVALID, "a vocabulary of %d tokens", vocab_size);
    t->vocab_size = vocab_size;
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", model_dir ? model_dir : "");
    if (model_dir && access(path, R_OK) == 0) {
        st_status s = st_tokenizer_load(&t->tok, path, err);
        if (s) return s;
        if (st_tokenizer_vocab_size(t->tok) > (size_t)vocab_size) {
            s = st_errf(err, ST_ERR_SHAPE, "%s has %zu tokens, the model %d; a tokenizer of another model?", path,
                        st_tokenizer_vocab_size(t->tok), vocab_size);
            st_text_close(t);
            return s;
        }
        t->kind = ST_TEXT_TOKENIZER;
        t->eod = st_tokenizer_token_id(t->tok, "<|endoftext|>");
        if (t->eod < 0) t->eod = st_tokenizer_token_id(t->tok, "<|end_of_text|>");
        return ST_OK;
    }
    if (vocab_size == 256 || vocab_size == 257) { /* the embedded corpus; strata data pack (256 = end of document) */
        t->kind = ST_TEXT_BYTES;
        t->eod = vocab_size == 257 ? 256 : -1;
    } else {
        t->kind = ST_TEXT_IDS;
        t->eod = -1;
    }
    return ST_OK;
}

void st_text_close(st_text *t) {
    st_tokenizer_free(t->tok);
    t->tok = NULL;
}

const char *st_text_kind_name(const st_text *t) {
    return t->kind == ST_TEXT_BYTES       ? "bytes"
           : t->kind == ST_TEXT_TOKENIZER ? "tokenizer.json"
                                          : "token ids (no tokenizer.json beside the model)";
}

st_status st_text_encode(const st_text *t, const char *text, int32_t **tokens, int *n, st_err *err) {
    size_t len = strlen(text);
    *tokens = malloc(sizeof(int32_t) * (len + 1));
    *n = 0;
    if (!*tokens) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    if (t->kind == ST_TEXT_BYTES) {
        for (size_t i = 0; i < len; i++) (*tokens)[(*n)++] = (unsigned char)text[i];
        return ST_OK;
    }
    if (t->kind == ST_TEXT_TOKENIZER) { /* byte-level BPE: at most one id per byte, plus slack */
        size_t got = 0;
        st_status s = st_tokenizer_encode(t->tok, text, len, *tokens, len + 1, &got, err);
        if (s || got > (size_t)1 << 30) {
            free(*tokens);
            *tokens = NULL;
            return s ? st_err_prefix(err, "prompt") : st_errf(err, ST_ERR_INVALID, "prompt: too long");
        }
        *n = (int)got;
        return ST_OK;
    }
    const char *p = text;
    while (*p) {
        if (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') { p++; continue; }
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v >= t->vocab_size) {
            free(*tokens);
            *tokens = NULL;
            *n = 0;
            return st_errf(err, ST_ERR_INVALID, "prompt: '%.20s' at offset %zu is not a token id in [0, %d); this "
                           "vocabulary has no tokenizer yet, so a prompt is token ids separated by spaces or commas",
                           p, (size_t)(p - text), t->vocab_size);
        }
        (*tokens)[(*n)++] = (int32_t)v;
        p = end;
    }
    return ST_OK;
}

size_t st_text_decode(const st_text *t, int32_t token, char *buf, size_t cap) {
    if (t->kind == ST_TEXT_TOKENIZER) {
        size_t len = 0;
        st_err e;
        if (token == t->eod || st_tokenizer_decode(t->tok, &token, 1, buf, cap - 1, &len, &e)) len = 0;
        buf[len] = 0;
        return len;
    }
    if (t->kind == ST_TEXT_BYTES) {
        if (token == t->eod || token < 0 || token > 255) { buf[0] = 0; return 0; }
        buf[0] = (char)token;
        buf[1] = 0;
        return 1;
    }
    int n = snprintf(buf, cap, " %d", (int)token); /* ids read back as a prompt */
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}
