/* test_tok_cache.c - the encoder's cache of pre-token -> ids never changes an id.
 *
 * st_tokenizer_encode keeps, per encoder state, a bounded cache of the ids of pre-tokens it
 * has merged (src/data/tokenizer.c), emptied whole when full. A text of many repeated pieces
 * (words, contractions, digits, Chinese, emoji, space runs, a special token, invalid bytes,
 * pre-tokens longer than the cache takes) is encoded with no cache (the reference), then with
 * caches of 1, 2 and 7 entries (emptied again and again) and the default one, twice each (the
 * second time from a warm cache), and once into a buffer too small (ids counted past the end
 * must not be cached) followed by the full call. Every id must equal the reference's, for a
 * byte-level tokenizer.json (GPT-2 and Llama-3 patterns), a tiktoken rank file and a
 * byte-fallback model over characters; and two threads at once must give them too.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer_internal.h"
#include "strata/tokenizer.h"
#include "testutil.h"

static const char *const PIECES[] = {
    "the", " the", " model", " Model", "'s", "'ll", " don't", " 1234567", " 42", "\n", "\n\n", "    ", "  ",
    "\t", " 训练", "模型的参数", " 🙂", "🚀🚀", " x+=1;", "(a, b)", " <|endoftext|>", "\xff", "\xc3", " caf\xc3\xa9",
    " supercalifragilisticexpialidocious-supercalifragilisticexpialidocious-antidisestablishment",
    "这是一个非常长的中文句子没有任何空格所以它会成为一个很长的预分词片段用来测试缓存不收的长片段",
};

static char *make_text(size_t *len) {
    size_t cap = 200000, n = 0;
    char *t = malloc(cap + 256);
    uint64_t x = 88172645463325252ull;
    while (t && n < cap) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        const char *p = PIECES[x % (sizeof PIECES / sizeof PIECES[0])];
        size_t l = strlen(p);
        memcpy(t + n, p, l);
        n += l;
    }
    *len = n;
    return t;
}

static int32_t *encode(const st_tokenizer *tok, const char *text, size_t len, size_t *n) {
    st_err err = {0};
    size_t cap = len + 16;
    int32_t *ids = malloc(cap * sizeof *ids);
    st_status s = ids ? st_tokenizer_encode(tok, text, len, ids, cap, n, &err) : ST_ERR_NOMEM;
    CHECK(s == ST_OK, "encode: %s", err.msg);
    if (s != ST_OK) {
        free(ids);
        return NULL;
    }
    return ids;
}

static int same(const int32_t *a, size_t na, const int32_t *b, size_t nb, const char *what) {
    if (!a || !b) return 0;
    size_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    CHECK(na == nb && i == na, "%s: %zu ids against %zu without a cache, first difference at id %zu", what, na, nb, i);
    return na == nb && i == na;
}

typedef struct job { const st_tokenizer *tok; const char *text; size_t len; const int32_t *ref; size_t nref; int ok; } job;

/* no CHECK here: its counters are not for threads */
static void *worker(void *arg) {
    job *j = arg;
    int32_t *ids = malloc((j->nref + 1) * sizeof *ids);
    j->ok = ids != NULL;
    for (int r = 0; r < 3 && j->ok; r++) {
        size_t n = 0;
        st_err err = {0};
        j->ok = st_tokenizer_encode(j->tok, j->text, j->len, ids, j->nref + 1, &n, &err) == ST_OK && n == j->nref &&
                memcmp(ids, j->ref, n * sizeof *ids) == 0;
    }
    free(ids);
    return NULL;
}

static void check_file(const char *file, const st_tokenizer_opts *opts, const char *text, size_t len) {
    st_tokenizer *tok = NULL;
    st_err err = {0};
    st_status s = st_tokenizer_load_ex(&tok, test_source_path(file), opts, &err);
    CHECK(s == ST_OK, "%s: %s", file, err.msg);
    if (s != ST_OK) return;
    CHECK(tok->cache_entries == TOK_CACHE_ENTRIES, "%s: default cache %zu", file, tok->cache_entries);
    tok_set_cache_entries(tok, 0);
    size_t nref = 0;
    int32_t *ref = encode(tok, text, len, &nref);
    CHECK(nref > len / 8, "%s: %zu ids for %zu bytes", file, nref, len);
    const size_t sizes[] = {1, 2, 7, TOK_CACHE_ENTRIES};
    char what[160];
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        tok_set_cache_entries(tok, sizes[k]);
        for (int pass = 0; pass < 2; pass++) {
            size_t n = 0;
            int32_t *ids = encode(tok, text, len, &n);
            snprintf(what, sizeof what, "%s, cache of %zu, pass %d", file, sizes[k], pass);
            same(ids, n, ref, nref, what);
            free(ids);
        }
    }
    /* a buffer too small: ids past its end are counted, not cached */
    tok_set_cache_entries(tok, TOK_CACHE_ENTRIES);
    int32_t few[7];
    size_t n = 0;
    s = st_tokenizer_encode(tok, text, len, few, 7, &n, &err);
    CHECK(s == ST_ERR_INVALID && n == nref, "%s: small buffer: status %d, %zu ids", file, (int)s, n);
    CHECK(memcmp(few, ref, sizeof few) == 0, "%s: small buffer: the first ids", file);
    int32_t *ids = encode(tok, text, len, &n);
    snprintf(what, sizeof what, "%s, after a call with a small buffer", file);
    same(ids, n, ref, nref, what);
    free(ids);
    /* several threads at once, each with its own encoder state */
    job jobs[3];
    pthread_t th[3];
    for (int t = 0; t < 3; t++) {
        jobs[t] = (job){tok, text, len, ref, nref, 0};
        if (pthread_create(&th[t], NULL, worker, &jobs[t])) jobs[t].tok = NULL;
    }
    for (int t = 0; t < 3; t++) {
        if (jobs[t].tok) pthread_join(th[t], NULL);
        CHECK(jobs[t].ok, "%s: thread %d gave other ids", file, t);
    }
    free(ref);
    st_tokenizer_free(tok);
}

int main(void) {
    size_t len = 0;
    char *text = make_text(&len);
    CHECK(text != NULL, "out of memory");
    if (!text) return test_finish("tok_cache");
    check_file("tests/fixtures/tok_gpt2.json", NULL, text, len);
    check_file("tests/fixtures/tok_llama3.json", NULL, text, len);
    check_file("tests/fixtures/tok_llama2.json", NULL, text, len);
    const char *const special[] = {"<|endoftext|>"};
    st_tokenizer_opts ro = {.pattern = "llama3", .special = special, .n_special = 1};
    check_file("tests/fixtures/tok_ranks.tiktoken", &ro, text, len);
    free(text);
    return test_finish("tok_cache");
}
