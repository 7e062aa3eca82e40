/* test_tokenizer_corpus.c - 10 MB of text through 32k tokenizers: the references' ids, document
 * by document.
 *
 * tools/gen_tokenizer_fixtures.py --corpus trained two byte-level BPE tokenizers of 32,000
 * tokens with Hugging Face `tokenizers` (the GPT-2 pattern, and Llama-3's Split regex with
 * ignore_merges), made a tiktoken rank file of each, and recorded in
 * tests/fixtures/tok_corpus_digests.txt, for every document of a corpus, the number and the
 * CRC-32C of the ids the references give: `tokenizers` for the .json files, tiktoken
 * (allowed_special "all") for the rank files with the GPT-2 and the Llama-3 pattern. Documents
 * with invalid UTF-8, which `tokenizers` cannot take, are cut at the special tokens and each
 * piece between them goes through tiktoken's bytes API, Encoding._encode_bytes (the valid
 * prefix as text; its last pre-token, with the all-whitespace tokens before it, and every byte
 * after the first invalid one as one BPE piece): strata's rule for such text. The .json
 * tokenizers have the same rows through the rank file made from them, in their own ids.
 * The corpus itself is not committed: this test has the stdlib-only tools/gen_text_corpus.py
 * write it again (python3, or exit 77), with the arguments the digest file names, and checks
 * each document's length and CRC-32C before its ids, so a corpus that came out differently is
 * told apart from ids that differ. Every document must also decode to its own bytes, the
 * invalid ones included.
 */
#include <errno.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "strata/core.h"
#include "strata/tokenizer.h"
#include "testutil.h"

extern char **environ;

enum { SET_VALID, SET_INVALID, N_SETS };
static const char *const SET_NAME[N_SETS] = {"valid", "invalid"};

/* One document of the corpus as the generator wrote it (text[0..len), NUL after it). */
typedef struct doc { const char *text; size_t len; } doc;
typedef struct corpus { unsigned char *buf; doc *docs; size_t n; } corpus;

/* One row of the digest file. */
typedef struct digest { char tokenizer[32]; int set; size_t index, bytes, n_ids; uint32_t text_crc, ids_crc; } digest;

typedef struct config {
    const char *name, *file;     /* digest rows' tokenizer, fixture */
    const char *pattern;         /* rank files: st_tokenizer_opts.pattern */
    int ranks;
} config;

static const char *const SPECIALS[] = {"<|endoftext|>", "<|im_start|>"};

/* Run python3 tools/gen_text_corpus.py ARGS -o out; 0 when it wrote the file, 77 when there is
 * no python3, 1 on another failure. */
static int run_generator(const char *args, const char *out) {
    char script[1024], argbuf[256];
    snprintf(script, sizeof script, "%s", test_source_path("tools/gen_text_corpus.py"));
    snprintf(argbuf, sizeof argbuf, "%s", args);
    char *argv[24];
    int argc = 0;
    argv[argc++] = "python3";
    argv[argc++] = script;
    for (char *save = NULL, *a = strtok_r(argbuf, " ", &save); a && argc < 20; a = strtok_r(NULL, " ", &save))
        argv[argc++] = a;
    argv[argc++] = "-o";
    argv[argc++] = (char *)out;
    argv[argc] = NULL;
    pid_t pid;
    int rc = posix_spawnp(&pid, "python3", NULL, NULL, argv, environ);
    if (rc == ENOENT) return 77;
    if (rc != 0) {
        fprintf(stderr, "cannot start python3: %s\n", strerror(rc));
        return 1;
    }
    int st = 0;
    if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "python3 %s %s failed (status %d)\n", script, args, st);
        return WIFEXITED(st) && WEXITSTATUS(st) == 127 ? 77 : 1;
    }
    return 0;
}

/* Split the generator's output at its NUL bytes. */
static int read_corpus(const char *path, corpus *c) {
    size_t n = 0;
    c->buf = test_slurp(path, &n);
    if (!c->buf) return 0;
    size_t cap = 64;
    c->docs = malloc(cap * sizeof *c->docs);
    c->n = 0;
    for (size_t at = 0; at < n && c->docs;) {
        unsigned char *end = memchr(c->buf + at, 0, n - at);
        if (!end) {
            fprintf(stderr, "%s: no NUL after the last document\n", path);
            return 0;
        }
        if (c->n == cap) {
            doc *d = realloc(c->docs, 2 * cap * sizeof *d);
            if (!d) return 0;
            c->docs = d;
            cap *= 2;
        }
        c->docs[c->n++] = (doc){(const char *)c->buf + at, (size_t)(end - (c->buf + at))};
        at = (size_t)(end - c->buf) + 1;
    }
    return c->docs != NULL;
}

/* The digest file: "corpus SET ARGS..." lines, "#" comments, and rows
 * "TOKENIZER SET INDEX BYTES TEXT_CRC N_IDS IDS_CRC". */
static digest *read_digests(const char *path, char args[N_SETS][256], size_t *n) {
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "cannot read %s", path);
    if (!f) return NULL;
    size_t cap = 4096;
    digest *d = malloc(cap * sizeof *d);
    char line[512];
    *n = 0;
    int lineno = 0;
    while (d && fgets(line, sizeof line, f)) {
        lineno++;
        line[strcspn(line, "\n")] = 0;
        if (line[0] == '#' || line[0] == 0) continue;
        if (strncmp(line, "corpus ", 7) == 0) {
            for (int s = 0; s < N_SETS; s++) {
                size_t l = strlen(SET_NAME[s]);
                if (strncmp(line + 7, SET_NAME[s], l) == 0 && line[7 + l] == ' ')
                    snprintf(args[s], 256, "%.200s", line + 8 + l);
            }
            continue;
        }
        if (*n == cap) {
            digest *g = realloc(d, 2 * cap * sizeof *g);
            if (!g) break;
            d = g;
            cap *= 2;
        }
        digest *r = &d[*n];
        char set[16];
        if (sscanf(line, "%31s %15s %zu %zu %x %zu %x", r->tokenizer, set, &r->index, &r->bytes, &r->text_crc,
                   &r->n_ids, &r->ids_crc) != 7) {
            CHECK(0, "%s line %d is not a digest row: '%s'", path, lineno, line);
            continue;
        }
        r->set = strcmp(set, "invalid") == 0 ? SET_INVALID : SET_VALID;
        (*n)++;
    }
    fclose(f);
    return d;
}

/* Encode every document (every stride-th under the sanitizers) with one tokenizer; compare
 * with the digest rows of cfg, and decode back. Returns the documents whose ids differ. */
static int check_config(const config *cfg, corpus sets[N_SETS], const digest *dg, size_t ndg, size_t stride,
                        double *mb, double *secs) {
    st_tokenizer_opts ro = {.pattern = cfg->pattern, .special = SPECIALS, .n_special = 2};
    st_tokenizer *tok = NULL;
    st_err err = {0};
    st_status s = st_tokenizer_load_ex(&tok, test_source_path(cfg->file), cfg->ranks ? &ro : NULL, &err);
    CHECK(s == ST_OK, "%s: %s", cfg->file, err.msg);
    if (s != ST_OK) return 1;
    CHECK(st_tokenizer_vocab_size(tok) == 32000, "%s: vocabulary %zu, not 32000", cfg->name,
          st_tokenizer_vocab_size(tok));
    size_t cap = 1 << 16, bcap = 1 << 16;
    int32_t *ids = malloc(cap * sizeof *ids);
    char *back = malloc(bcap);
    int differ = 0, rows = 0, printed = 0;
    for (int set = 0; set < N_SETS; set++) {
        const corpus *c = &sets[set];
        for (size_t i = 0; i < c->n && ids && back; i += stride) {
            const doc *d = &c->docs[i];
            const digest *want = NULL;
            for (size_t k = 0; k < ndg && !want; k++)
                if (dg[k].set == set && dg[k].index == i && strcmp(dg[k].tokenizer, cfg->name) == 0) want = &dg[k];
            CHECK(want != NULL, "%s: no digest row for %s document %zu", cfg->name, SET_NAME[set], i);
            uint32_t tcrc = st_crc32c(0, d->text, d->len);
            if (want && (want->bytes != d->len || want->text_crc != tcrc)) {
                CHECK(0, "%s document %zu came out of gen_text_corpus.py as %zu bytes (crc %08x), the digests were "
                         "made from %zu bytes (crc %08x): the generator or Python's random changed; run "
                         "tools/gen_tokenizer_fixtures.py --corpus again", SET_NAME[set], i, d->len, tcrc,
                      want->bytes, want->text_crc);
                return 1;
            }
            size_t n = 0;
            double t0 = st_now();
            s = st_tokenizer_encode(tok, d->text, d->len, ids, cap, &n, &err);
            if (s == ST_ERR_INVALID && n > cap) {
                int32_t *g = realloc(ids, n * sizeof *g);
                if (!g) break;
                ids = g;
                cap = n;
                s = st_tokenizer_encode(tok, d->text, d->len, ids, cap, &n, &err);
            }
            *secs += st_now() - t0;
            *mb += (double)d->len / 1e6;
            CHECK(s == ST_OK, "%s %s document %zu: %s", cfg->name, SET_NAME[set], i, err.msg);
            if (s != ST_OK) continue;
            if (want) {
                rows++;
                uint32_t icrc = st_crc32c(0, ids, n * sizeof *ids); /* little-endian int32, as the script */
                if (n != want->n_ids || icrc != want->ids_crc) {
                    differ++;
                    if (printed++ < 5)
                        fprintf(stderr, "  %s %s document %zu (%zu bytes): strata %zu ids (crc %08x), the reference "
                                        "%zu (crc %08x)\n", cfg->name, SET_NAME[set], i, d->len, n, icrc,
                                want->n_ids, want->ids_crc);
                }
            }
            size_t blen = 0;
            s = st_tokenizer_decode(tok, ids, n, back, bcap, &blen, &err);
            if (s == ST_ERR_INVALID && blen > bcap) {
                char *g = realloc(back, blen);
                if (!g) break;
                back = g;
                bcap = blen;
                s = st_tokenizer_decode(tok, ids, n, back, bcap, &blen, &err);
            }
            CHECK(s == ST_OK && blen == d->len && memcmp(back, d->text, blen) == 0,
                  "%s %s document %zu: decode(encode(x)) is %zu bytes, not the document's %zu: %s", cfg->name,
                  SET_NAME[set], i, blen, d->len, s == ST_OK ? "bytes differ" : err.msg);
        }
    }
    CHECK(differ == 0, "%s: %d of %d documents have other ids than the reference", cfg->name, differ, rows);
    CHECK(rows >= 40, "%s: only %d documents compared", cfg->name, rows);
    free(ids);
    free(back);
    st_tokenizer_free(tok);
    return differ;
}

int main(void) {
    char args[N_SETS][256] = {{0}};
    size_t ndg = 0;
    digest *dg = read_digests(test_source_path("tests/fixtures/tok_corpus_digests.txt"), args, &ndg);
    CHECK(dg && ndg > 1000 && args[SET_VALID][0] && args[SET_INVALID][0],
          "tok_corpus_digests.txt: %zu rows, corpus lines '%s' '%s'", ndg, args[SET_VALID], args[SET_INVALID]);
    if (!dg || !args[SET_VALID][0] || !args[SET_INVALID][0]) return test_finish("tokenizer_corpus");

    corpus sets[N_SETS] = {{0}};
    for (int s = 0; s < N_SETS; s++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s.docs", test_tmpdir(), SET_NAME[s]);
        double t0 = st_now();
        int rc = run_generator(args[s], path);
        if (rc == 77) {
            fprintf(stderr, "SKIP tokenizer_corpus: no python3 to run tools/gen_text_corpus.py (stdlib only)\n");
            return 77;
        }
        CHECK(rc == 0 && read_corpus(path, &sets[s]), "tools/gen_text_corpus.py %s wrote no corpus", args[s]);
        if (rc != 0 || !sets[s].docs) return test_finish("tokenizer_corpus");
        size_t bytes = 0;
        for (size_t i = 0; i < sets[s].n; i++) bytes += sets[s].docs[i].len;
        printf("%s corpus: %zu documents, %zu bytes (generated in %.1f s)\n", SET_NAME[s], sets[s].n, bytes,
               st_now() - t0);
        if (s == SET_VALID) CHECK(bytes >= 10000000, "the valid corpus is %zu bytes, under 10 MB", bytes);
    }

    /* under the sanitizers (several times slower) every 10th document */
    size_t stride = getenv("STRATA_TEST_SANITIZED") ? 10 : 1;
    static const config CONFIGS[] = {
        {"json_gpt2", "tests/fixtures/tok_corpus_gpt2.json", NULL, 0},
        {"json_llama3", "tests/fixtures/tok_corpus_llama3.json", NULL, 0},
        {"ranks_gpt2", "tests/fixtures/tok_corpus_gpt2.tiktoken", "gpt2", 1},
        {"ranks_llama3", "tests/fixtures/tok_corpus_llama3.tiktoken", "llama3", 1},
    };
    for (size_t k = 0; k < sizeof CONFIGS / sizeof *CONFIGS; k++) {
        double mb = 0, secs = 0;
        int differ = check_config(&CONFIGS[k], sets, dg, ndg, stride, &mb, &secs);
        printf("%-13s %s: %.2f MB encoded in %.2f s (%.2f MB/s, one thread)\n", CONFIGS[k].name,
               differ ? "DIFFERS" : "same ids", mb, secs, secs > 0 ? mb / secs : 0.0);
    }
    for (int s = 0; s < N_SETS; s++) {
        free(sets[s].buf);
        free(sets[s].docs);
    }
    free(dg);
    return test_finish("tokenizer_corpus");
}
