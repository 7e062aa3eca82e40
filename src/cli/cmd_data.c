/* cmd_data.c - strata data {pack, inspect, cat, dedup, score, select} (strata bench data:
 * src/bench/bench_data.c).
 *
 * pack turns text or JSON-lines into a Megatron .bin/.idx pair and its sidecar .json,
 * with a tokenizer.json (on many threads) or the byte-level tokenizer (one token per
 * byte, end of document 256); inspect describes any source the loader reads; cat prints
 * a document back (decoded with the tokenizer), which closes the round trip; dedup and
 * score write score files, select writes a view over a dataset (src/data/dedup.c,
 * score.c, view.c), and inspect describes those too.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <pthread.h>
#include <stdatomic.h>

#include <json-c/json.h>

#include "cli/cli.h"
#include "strata/chat.h"
#include "strata/core.h"
#include "strata/data.h"
#include "strata/backend.h"
#include "strata/model.h"
#include "strata/train.h"
#include "strata/tokenizer.h"

static const char *data_usage =
    "usage: strata data <pack|inspect|cat|dedup|score|select> [options]\n"
    "\n"
    "  strata data pack -o PREFIX [--tokenizer PATH [--pattern P] [--special T=ID] --eod ID]\n"
    "                   [--jsonl] [--key K]\n"
    "                   [--split file|line|blank] [--threads N] [--progress] FILE...\n"
    "      Tokenize text into PREFIX.bin + PREFIX.idx (Megatron-LM indexed dataset: uint16\n"
    "      for vocabularies up to 65536, else int32), with --tokenizer also PREFIX.json (the\n"
    "      sidecar: vocab_size, eod, the tokenizer's name and CRC-32C, dtype, documents,\n"
    "      tokens; the loader refuses a model vocab_size below the sidecar's). Each document\n"
    "      gets an end-of-document token appended.\n"
    "      --tokenizer P  a Hugging Face tokenizer.json, a tiktoken rank file or a model\n"
    "                     directory; without it the built-in byte-level tokenizer (token =\n"
    "                     byte, 256 = end of document, vocabulary 257)\n"
    "      --pattern NAME|REGEX  a tiktoken rank file's pre-tokenizer pattern: gpt2,\n"
    "                     cl100k, o200k, llama3, qwen2 (Qwen's: single digits) or the regex;\n"
    "                     needed unless a tokenizer_config.json beside the file says it\n"
    "                     (pat_str; tokenizer_class QWenTokenizer) or the file is qwen.tiktoken,\n"
    "                     cl100k_base.tiktoken, o200k_base.tiktoken, r50k_base or p50k_base;\n"
    "                     recorded in the sidecar\n"
    "      --special TEXT=ID  a rank file's special token and its id (tiktoken's special_tokens;\n"
    "                     repeat for each); default tokenizer_config.json's added_tokens_decoder\n"
    "      --eod ID       the end-of-document id, any id the tokenizer defines (a rank or a\n"
    "                     special token); default the tokenizer's EOS (tokenizer_config.json\n"
    "                     eos_token, beside a rank file or in a model directory), else it must\n"
    "                     be given\n"
    "      --threads N    tokenize on N threads (default: all CPUs); the output is the same\n"
    "      --progress     MB/s, documents and ETA on stderr once a second (default when\n"
    "                     stderr is a terminal)\n"
    "      --jsonl        each line of each FILE is a JSON object; its K field is a document\n"
    "      --key K        the JSON field holding the text (default \"text\")\n"
    "      --split MODE   plain text: file = one document per file (default), line = one per\n"
    "                     non-empty line, blank = paragraphs separated by blank lines\n"
    "      FILE may be - for standard input.\n"
    "      --chat         SFT data: each line of each FILE is a conversation, {\"messages\":\n"
    "                     [{\"role\", \"content\"}...]} or {\"prompt\", \"completion\"},\n"
    "                     rendered with the model directory's chat template (recognised\n"
    "                     from tokenizer_config.json: ChatML as Qwen2/2.5 use it, Qwen3's,\n"
    "                     Llama-3's or Llama-3.1's; any other is refused) and packed with\n"
    "                     a loss mask PREFIX.mask (1 byte a token) that the loader\n"
    "                     applies: targets not trained on become -1\n"
    "      --chat_format F  chatml|qwen3|llama3|llama3.1: render as that family whatever\n"
    "                     the template is (also where none is recognised)\n"
    "      --mask M       assistant (default: the assistant's content and end-of-turn\n"
    "                     token) or all\n"
    "\n"
    "  strata data inspect PATH [--format F] [--docs N] [--validate VOCAB] [--json]\n"
    "      Print a source's format, token dtype, documents and tokens. PATH is a Megatron\n"
    "      prefix (or its .bin/.idx), an llm.c shard, or a raw token file. The format comes\n"
    "      from the header (the .idx beside it, the llm.c magic) or the name (.u32 = raw\n"
    "      uint32); a headerless file needs it said: raw16@PATH, as in a --data list, or\n"
    "      --format megatron|llmc|raw16|raw32. megatron-unordered@PREFIX accepts a\n"
    "      Megatron index whose sequences are not stored back to back;\n"
    "      --docs N lists the first N document lengths; --validate reads every token and\n"
    "      checks it is below VOCAB.\n"
    "\n"
    "  strata data cat PATH [--doc N | --all] [--tokens | --decode --tokenizer P [--eod ID]\n"
    "                  [--pattern P] [--special T=ID] [--trained]]\n"
    "      Print document N (default 0; --all: every document, each followed by a newline)\n"
    "      as bytes (byte-level data; token 256 is dropped), as token ids with --tokens, or\n"
    "      as text decoded with the tokenizer P (the end-of-document id the sidecar or --eod\n"
    "      names is dropped). Sources without an index have one document.\n"
    "      --pattern, --special  as for pack, for a rank file; --pattern defaults to the\n"
    "                     one the sidecar records\n"
    "      --trained      (--decode, a pack with a loss mask) only the tokens trained on as\n"
    "                     targets: each run of them, decoded, on a line of its own\n"
    "\n"
    "  strata data dedup DATASET -o SCORES [--ngram N] [--hashes H] [--bands B] [--rows R]\n"
    "                    [--threshold J] [--seed S] [--threads N] [--max_compare K] [--json]\n"
    "      Exact duplicates (a 128-bit hash of the tokens, confirmed token by token) and near\n"
    "      duplicates (MinHash over token N-grams, default 5; H hashes, default 128; banded\n"
    "      LSH of B bands x R rows, default 32 x 4; a candidate pair counts when its estimated\n"
    "      Jaccard similarity is >= J, default 0.7) of a Megatron dataset. Each duplicate\n"
    "      points at the earliest document it repeats. SCORES is a score file bound to the\n"
    "      dataset (its sizes and checksums). Also: strata data score --dedup ...\n"
    "\n"
    "  strata data score DATASET --proxy MODEL -o SCORES [--reference REF] [--batch B] [--seq T]\n"
    "                    [--threads N] [--json] [--quiet]\n"
    "      Proxy loss: MODEL (a run directory of strata train, one of its checkpoints, or a\n"
    "      Hugging Face model directory) run forward only over every document, packed\n"
    "      back to back into B x T batches (default 8 x min(256, its context)) with document\n"
    "      attention; a document's score is its mean loss in nats per predicted token. A\n"
    "      progress line on stderr; the FLOPs and their rate at the end. A token outside\n"
    "      the model's vocabulary is refused, naming the file, the token and the vocabulary.\n"
    "      With --reference REF (a model trained on held-out data, given as MODEL is): the\n"
    "      reducible loss, MODEL's mean loss minus REF's, document by document (kind\n"
    "      'reducible'; high: learnable and not yet learnt, low: learnt or unlearnable noise).\n"
    "\n"
    "  strata data score DATASET --dynamics RUN_DIR -o SCORES [--metric first|drop|forget]\n"
    "                    [--unseen X]\n"
    "      Learning dynamics of a run that trained on DATASET with --doc_signals MIB (its\n"
    "      RUN_DIR/doc_signals.bin): per document, first: the mean loss of its first visit\n"
    "      (default); drop: first visit's mean loss minus its last visit's; forget: the\n"
    "      forgetting events (visits whose loss rose over the visit before). Documents the\n"
    "      run never reached are refused unless --unseen X gives their score.\n"
    "\n"
    "  strata data score DATASET --from_text FILE -o SCORES\n"
    "      A score file from one score per line of FILE (a proxy model's loss, ...), in the\n"
    "      dataset's document order; a count that differs or a non-finite score is refused.\n"
    "\n"
    "  strata data select DATASET -o VIEW [--scores SCORES --keep lowest|highest F]\n"
    "                     [--scores SCORES --keep band LO HI] [--drop_duplicates DEDUP]\n"
    "                     [--order base|ascending|descending]\n"
    "      A view: the ids of the kept documents of DATASET, no token copied, bound to it\n"
    "      by its sizes and checksums. lowest/highest keep the fraction F (0 < F <= 1) of the\n"
    "      documents with the lowest/highest scores; band keeps the quantiles [LO, HI) of the\n"
    "      scores ranked ascending; duplicates of a dedup score file are dropped first.\n"
    "      --order ascending|descending: read in that order of the scores (a curriculum),\n"
    "      not shuffled. A view is a data source: strata train --data VIEW[:W],...\n"
    "      --pace linear|root|step [--pace_start C0] [--pace_length L] [--pace_band W]\n"
    "      [--pace_steps K]: a paced curriculum (ordered by score, ascending unless --order\n"
    "      descending): while the source's draws are under L x its documents (default 1),\n"
    "      each takes a random document among the easiest c(t) of them, c growing from C0\n"
    "      (default 0.1) to 1 linearly, as a square root or in K steps (default 4); with W\n"
    "      in (0, 1), from a band of W of the documents sliding from easy to hard. Then\n"
    "      every document, shuffled each epoch.\n"
    "      strata data inspect VIEW (or SCORES) describes it.\n";

static int parse_format(const char *s, st_data_format *f) {
    if (!strcmp(s, "auto")) *f = ST_DATA_FORMAT_AUTO;
    else if (!strcmp(s, "megatron")) *f = ST_DATA_FORMAT_MEGATRON;
    else if (!strcmp(s, "llmc")) *f = ST_DATA_FORMAT_LLMC;
    else if (!strcmp(s, "raw16")) *f = ST_DATA_FORMAT_RAW_U16;
    else if (!strcmp(s, "raw32")) *f = ST_DATA_FORMAT_RAW_U32;
    else return -1;
    return 0;
}

static const char *format_name(st_data_format f) {
    switch (f) {
    case ST_DATA_FORMAT_MEGATRON: return "megatron";
    case ST_DATA_FORMAT_LLMC: return "llmc";
    case ST_DATA_FORMAT_RAW_U16: return "raw16";
    case ST_DATA_FORMAT_RAW_U32: return "raw32";
    case ST_DATA_FORMAT_MEMORY: return "memory";
    case ST_DATA_FORMAT_VIEW: return "view";
    default: return "auto";
    }
}

/* ---- pack ---------------------------------------------------------------------- */

/* Documents are gathered into a batch of about PACK_BATCH_BYTES of text, the batch is cut
 * into PACK_RUNS_PER_THREAD contiguous runs of documents per thread (of about equal bytes),
 * the threads take runs from a shared counter (a thread the machine holds back does not
 * hold up the others) and tokenize each into the run's own buffer, and the runs are
 * written in order: the output does not depend on the thread count. */
#define PACK_BATCH_BYTES (8u << 20)
#define PACK_BATCH_DOCS 65536u
#define PACK_MAX_THREADS 256
#define PACK_RUNS_PER_THREAD 8

typedef struct pack_run {
    size_t d0, d1;     /* documents [d0, d1) of the batch */
    int32_t *ids;      /* their tokens, each document's followed by the end-of-document id */
    size_t n, cap;
    st_status rc;
    st_err err;
} pack_run;

typedef struct pack_ctx {
    st_data_pack_writer *w;
    const st_tokenizer *tok; /* NULL: the byte-level tokenizer */
    int32_t eod;
    int threads;
    pack_run *runs;       /* [threads * PACK_RUNS_PER_THREAD] */
    size_t n_runs;
    atomic_size_t next_run;
    /* the batch: document k is text[start[k], start[k+1]) */
    char *text;
    size_t tlen, tcap;
    size_t *start, *ntok; /* [nb + 1], [nb]: tokens of document k with its end-of-document */
    size_t nb, dcap;
    uint64_t docs, bytes, tokens;
    /* progress */
    int progress, tty, printed;
    uint64_t in_bytes, in_total; /* input bytes read; all of them (0: unknown, standard input) */
    double t0, last_print;
    st_err err;
} pack_ctx;

static int grow_ids(pack_run *k, size_t need) {
    if (k->n + need <= k->cap) return 0;
    size_t nc = (k->n + need) * 3 / 2 + 1024;
    int32_t *t = realloc(k->ids, nc * sizeof *t);
    if (!t) return -1;
    k->ids = t, k->cap = nc;
    return 0;
}

static void pack_run_tokenize(pack_ctx *c, pack_run *k) {
    k->n = 0;
    k->rc = ST_OK;
    for (size_t d = k->d0; d < k->d1 && !k->rc; d++) {
        const char *text = c->text + c->start[d];
        size_t len = c->start[d + 1] - c->start[d], got = 0;
        /* byte-level BPE gives at most one id a byte; the margin is for normalizers that add a few */
        if (grow_ids(k, len + 17)) {
            k->rc = st_errf(&k->err, ST_ERR_NOMEM, "out of memory for a %zu-byte document", len);
            break;
        }
        if (!c->tok) {
            st_data_tokenize_bytes(text, len, k->ids + k->n);
            got = len;
        } else {
            k->rc = st_tokenizer_encode(c->tok, text, len, k->ids + k->n, k->cap - k->n - 1, &got, &k->err);
            if (k->rc == ST_ERR_INVALID && got + 1 > k->cap - k->n) { /* more ids than the margin: once more */
                if (grow_ids(k, got + 1)) {
                    k->rc = st_errf(&k->err, ST_ERR_NOMEM, "out of memory for a %zu-byte document", len);
                    break;
                }
                k->rc = st_tokenizer_encode(c->tok, text, len, k->ids + k->n, k->cap - k->n - 1, &got, &k->err);
            }
            if (k->rc) {
                st_err_prefix(&k->err, "document %llu", (unsigned long long)(c->docs + d));
                break;
            }
        }
        k->ids[k->n + got] = c->eod;
        k->n += got + 1;
        c->ntok[d] = got + 1;
    }
}

static void *pack_thread(void *arg) {
    pack_ctx *c = arg;
    for (size_t r; (r = atomic_fetch_add(&c->next_run, 1)) < c->n_runs;) pack_run_tokenize(c, &c->runs[r]);
    return NULL;
}

static void pack_progress(pack_ctx *c, int last) {
    double now = st_now();
    if (!c->progress || (!last && now - c->last_print < 1.0)) return; /* at the end, always a last line */
    c->last_print = now;
    double el = now - c->t0, rate = el > 0 ? (double)c->in_bytes / el : 0;
    char eta[48] = "";
    if (c->in_total && rate > 0 && !last)
        snprintf(eta, sizeof eta, ", ETA %.0f s",
                 (double)(c->in_total > c->in_bytes ? c->in_total - c->in_bytes : 0) / rate);
    char total[48] = "";
    if (c->in_total) snprintf(total, sizeof total, " of %.1f", c->in_total / 1e6);
    fprintf(stderr, "%s%.1f%s MB, %llu documents, %llu tokens, %.2f MB/s%s%s", c->tty ? "\r\033[K" : "",
            c->in_bytes / 1e6, total, (unsigned long long)c->docs, (unsigned long long)c->tokens, rate / 1e6, eta,
            c->tty && !last ? "" : "\n");
    c->printed = 1;
}

/* Tokenize the batch and write it. */
static int pack_flush(pack_ctx *c) {
    if (c->nb == 0) return 0;
    int nt = c->threads;
    size_t nr = (size_t)nt * PACK_RUNS_PER_THREAD;
    if (nr > c->nb) nr = c->nb;
    /* contiguous runs of about tlen / nr bytes (a run may be empty) */
    size_t d = 0;
    for (size_t r = 0; r < nr; r++) {
        pack_run *k = &c->runs[r];
        k->d0 = d;
        size_t goal = c->tlen / nr * (r + 1);
        while (d < c->nb && (r == nr - 1 || c->start[d + 1] <= goal)) d++;
        k->d1 = d;
    }
    c->n_runs = nr;
    atomic_store(&c->next_run, 0);
    pthread_t th[PACK_MAX_THREADS];
    int started = 0;
    for (int t = 1; t < nt && (size_t)t < nr; t++, started++)
        if (pthread_create(&th[t], NULL, pack_thread, c)) break;
    pack_thread(c); /* also does the runs of threads that did not start */
    for (int t = 1; t <= started; t++) pthread_join(th[t], NULL);
    for (size_t r = 0; r < nr; r++) {
        pack_run *k = &c->runs[r];
        if (k->rc) {
            c->err = k->err;
            return -1;
        }
        size_t off = 0;
        for (size_t j = k->d0; j < k->d1; j++) {
            if (st_data_pack_add(c->w, k->ids + off, c->ntok[j], &c->err)) return -1;
            off += c->ntok[j];
            c->tokens += c->ntok[j];
        }
    }
    c->docs += c->nb;
    c->bytes += c->tlen;
    c->nb = 0;
    c->tlen = 0;
    pack_progress(c, 0);
    return 0;
}

static int pack_doc(pack_ctx *c, const char *text, size_t n) {
    if (n == 0) return 0; /* an empty document would only be an end-of-document token */
    if (c->tlen + n > c->tcap) {
        size_t nc = (c->tlen + n) * 3 / 2 + 4096;
        char *t = realloc(c->text, nc);
        if (!t) {
            st_errf(&c->err, ST_ERR_NOMEM, "out of memory for a %zu-byte document", n);
            return -1;
        }
        c->text = t, c->tcap = nc;
    }
    if (c->nb + 2 > c->dcap) {
        size_t nc = c->dcap ? c->dcap * 2 : 1024;
        size_t *s = realloc(c->start, nc * sizeof *s), *k = s ? realloc(c->ntok, nc * sizeof *k) : NULL;
        if (s) c->start = s;
        if (!s || !k) {
            st_errf(&c->err, ST_ERR_NOMEM, "out of memory at document %llu", (unsigned long long)(c->docs + c->nb));
            return -1;
        }
        c->ntok = k, c->dcap = nc;
    }
    memcpy(c->text + c->tlen, text, n);
    c->start[c->nb] = c->tlen;
    c->tlen += n;
    c->start[++c->nb] = c->tlen;
    if (c->tlen >= PACK_BATCH_BYTES || c->nb >= PACK_BATCH_DOCS) return pack_flush(c);
    return 0;
}

static void pack_ctx_free(pack_ctx *c) {
    for (int r = 0; c->runs && r < c->threads * PACK_RUNS_PER_THREAD; r++) free(c->runs[r].ids);
    free(c->runs);
    free(c->text);
    free(c->start);
    free(c->ntok);
}

/* CRC-32C and size of the tokenizer's bytes: the file, or a model directory's tokenizer.json
 * (else its tokenizer.model), whose name goes to `within` ("" for a file). */
static int tokenizer_digest(const char *path, uint32_t *crc, uint64_t *bytes, char within[64]) {
    char buf[1 << 16], p[4096];
    struct stat st;
    within[0] = 0;
    if (stat(path, &st) != 0) return -1;
    snprintf(p, sizeof p, "%s", path);
    if (S_ISDIR(st.st_mode)) {
        snprintf(within, 64, "tokenizer.json");
        snprintf(p, sizeof p, "%s/%s", path, within);
        if (access(p, F_OK) != 0) {
            snprintf(within, 64, "tokenizer.model");
            snprintf(p, sizeof p, "%s/%s", path, within);
        }
    }
    FILE *f = fopen(p, "rb");
    if (!f) return -1;
    *crc = 0;
    *bytes = 0;
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        *crc = st_crc32c(*crc, buf, n);
        *bytes += n;
    }
    int bad = ferror(f);
    fclose(f);
    return bad ? -1 : 0;
}

static const char *base_name(const char *path) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--; /* a directory given as dir/ */
    static char b[256];
    size_t e = n, s = n;
    while (s > 0 && path[s - 1] != '/') s--;
    snprintf(b, sizeof b, "%.*s", (int)(e - s), path + s);
    return b;
}

static int pack_file(pack_ctx *c, const char *path, int jsonl, const char *key, const char *split) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        st_errf(&c->err, ST_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    char *line = NULL, *acc = NULL;
    size_t lcap = 0, alen = 0, acap = 0;
    ssize_t n;
    uint64_t lineno = 0, off = 0;
    int rc = 0;
    int mode_file = !jsonl && !strcmp(split, "file"), mode_blank = !jsonl && !strcmp(split, "blank");
    while (rc == 0 && (n = getline(&line, &lcap, f)) >= 0) {
        lineno++;
        uint64_t line_off = off;
        off += (uint64_t)n;
        c->in_bytes += (uint64_t)n;
        if (jsonl) {
            while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
            if (n == 0) continue;
            struct json_tokener *tk = json_tokener_new();
            struct json_object *o = json_tokener_parse_ex(tk, line, (int)n);
            enum json_tokener_error je = json_tokener_get_error(tk);
            json_tokener_free(tk);
            struct json_object *v = NULL;
            if (!o || je != json_tokener_success) {
                st_errf(&c->err, ST_ERR_FORMAT, "%s: line %llu (byte offset %llu): not valid JSON (%s)", path,
                        (unsigned long long)lineno, (unsigned long long)line_off, json_tokener_error_desc(je));
                rc = -1;
            } else if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_string)) {
                st_errf(&c->err, ST_ERR_FORMAT,
                        "%s: line %llu (byte offset %llu): no string field \"%s\"; name the text field with --key",
                        path, (unsigned long long)lineno, (unsigned long long)line_off, key);
                rc = -1;
            } else {
                rc = pack_doc(c, json_object_get_string(v), (size_t)json_object_get_string_len(v));
            }
            if (o) json_object_put(o);
            continue;
        }
        if (!mode_file && !mode_blank) { /* line */
            size_t k = (size_t)n;
            while (k > 0 && (line[k - 1] == '\n' || line[k - 1] == '\r')) k--;
            rc = pack_doc(c, line, k);
            continue;
        }
        int blank = 1;
        for (ssize_t i = 0; i < n; i++)
            if (line[i] != '\n' && line[i] != '\r' && line[i] != ' ' && line[i] != '\t') blank = 0;
        if (mode_blank && blank) {
            rc = pack_doc(c, acc, alen);
            alen = 0;
            continue;
        }
        if (alen + (size_t)n > acap) {
            size_t nc = (alen + (size_t)n) * 2;
            char *a = realloc(acc, nc);
            if (!a) {
                st_errf(&c->err, ST_ERR_NOMEM, "%s: out of memory at byte %llu", path, (unsigned long long)off);
                rc = -1;
                break;
            }
            acc = a, acap = nc;
        }
        memcpy(acc + alen, line, (size_t)n);
        alen += (size_t)n;
    }
    if (rc == 0 && (mode_file || mode_blank)) {
        if (mode_blank)
            while (alen > 0 && (acc[alen - 1] == '\n' || acc[alen - 1] == '\r')) alen--;
        rc = pack_doc(c, acc, alen);
    }
    if (rc == 0 && ferror(f)) {
        st_errf(&c->err, ST_ERR_IO, "%s: read error at byte %llu", path, (unsigned long long)off);
        rc = -1;
    }
    free(line);
    free(acc);
    if (f != stdin) fclose(f);
    return rc;
}

/* What a rank file does not say, from the command line: --pattern and --special TEXT=ID
 * (repeatable). 1 where argv[*i] was one of them (*i advanced), 0 where not, -1 on a bad value
 * (said on stderr). The option strings point into argv. */
typedef struct rank_opts {
    const char *pattern;
    const char **special;
    int32_t *special_ids;
    size_t n_special;
    char **owned; /* the TEXT parts, cut from TEXT=ID */
} rank_opts;

static int rank_opt(rank_opts *r, int argc, char **argv, int *i, const char *cmd) {
    if (!strcmp(argv[*i], "--pattern") && *i + 1 < argc) {
        r->pattern = argv[++*i];
        return 1;
    }
    if (strcmp(argv[*i], "--special") || *i + 1 >= argc) return 0;
    const char *v = argv[++*i], *eq = strrchr(v, '=');
    char *end = NULL;
    long long id = eq && eq[1] ? strtoll(eq + 1, &end, 10) : -1;
    if (!eq || eq == v || !end || *end || id < 0 || id > INT32_MAX - 2) {
        fprintf(stderr, "strata data %s: --special '%s' is not TEXT=ID (a special token and its id, e.g. "
                "'<|endoftext|>=151643')\n", cmd, v);
        return -1;
    }
    const char **sp = realloc(r->special, (r->n_special + 1) * sizeof *sp);
    if (sp) r->special = sp;
    int32_t *ids = sp ? realloc(r->special_ids, (r->n_special + 1) * sizeof *ids) : NULL;
    if (ids) r->special_ids = ids;
    char **own = ids ? realloc(r->owned, (r->n_special + 1) * sizeof *own) : NULL;
    if (own) r->owned = own;
    char *text = own ? strndup(v, (size_t)(eq - v)) : NULL;
    if (!text) {
        fprintf(stderr, "strata data %s: out of memory\n", cmd);
        return -1;
    }
    r->owned[r->n_special] = text;
    r->special[r->n_special] = text;
    r->special_ids[r->n_special++] = (int32_t)id;
    return 1;
}

static void rank_opts_free(rank_opts *r) {
    for (size_t k = 0; k < r->n_special; k++) free(r->owned[k]);
    free(r->owned);
    free(r->special);
    free(r->special_ids);
    memset(r, 0, sizeof *r); /* a second call frees nothing */
}

/* The tokenizer at path with the rank file's options given. */
static st_status load_tokenizer(st_tokenizer **tok, const char *path, const rank_opts *r, st_err *err) {
    st_tokenizer_opts o = {.pattern = r->pattern, .special = r->special, .special_ids = r->special_ids,
                           .n_special = r->n_special};
    return st_tokenizer_load_ex(tok, path, &o, err);
}

static int data_pack_cmd(int argc, char **argv) {
    const char *out = NULL, *key = "text", *split = "file", *tok_path = NULL;
    int jsonl = 0, nfiles = 0, progress = 0, chat = 0;
    const char *chat_format = NULL, *mask_kind = "assistant";
    long threads = sysconf(_SC_NPROCESSORS_ONLN);
    long long eod = -1;
    rank_opts ro = {0};
    int ro_rc = 0;
    const char **files = calloc((size_t)argc, sizeof *files);
    for (int i = 1; i < argc; i++) {
        if ((ro_rc = rank_opt(&ro, argc, argv, &i, "pack")) < 0) {
            free(files);
            rank_opts_free(&ro);
            return 2;
        } else if (ro_rc) continue;
        if (!strcmp(argv[i], "-o") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--jsonl")) jsonl = 1;
        else if (!strcmp(argv[i], "--key") && i + 1 < argc) key = argv[++i];
        else if (!strcmp(argv[i], "--split") && i + 1 < argc) split = argv[++i];
        else if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) tok_path = argv[++i];
        else if (!strcmp(argv[i], "--chat")) chat = 1;
        else if (!strcmp(argv[i], "--chat_format") && i + 1 < argc) chat_format = argv[++i];
        else if (!strcmp(argv[i], "--mask") && i + 1 < argc) mask_kind = argv[++i];
        else if (!strcmp(argv[i], "--eod") && i + 1 < argc) {
            char *end;
            eod = strtoll(argv[++i], &end, 10);
            if (*end || eod < 0) {
                fprintf(stderr, "strata data pack: --eod '%s' is not a token id\n", argv[i]);
                free(files);
                rank_opts_free(&ro);
                return 2;
            }
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            char *end;
            threads = strtol(argv[++i], &end, 10);
            if (*end || threads < 1 || threads > PACK_MAX_THREADS) {
                fprintf(stderr, "strata data pack: --threads '%s': give 1 to %d\n", argv[i], PACK_MAX_THREADS);
                free(files);
                rank_opts_free(&ro);
                return 2;
            }
        } else if (!strcmp(argv[i], "--progress")) progress = 1;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(data_usage, stdout);
            free(files);
            rank_opts_free(&ro);
            return 0;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "strata data pack: unknown option '%s'\n\n%s", argv[i], data_usage);
            free(files);
            rank_opts_free(&ro);
            return 2;
        } else files[nfiles++] = argv[i];
    }
    if (!out || !nfiles || (strcmp(split, "file") && strcmp(split, "line") && strcmp(split, "blank"))) {
        fprintf(stderr, "strata data pack: need -o PREFIX and at least one FILE (split: file|line|blank)\n\n%s",
                data_usage);
        free(files);
        rank_opts_free(&ro);
        return 2;
    }
    if (chat && (!tok_path || jsonl || (strcmp(mask_kind, "assistant") && strcmp(mask_kind, "all")))) {
        fprintf(stderr, "strata data pack: --chat needs --tokenizer (a model directory), takes JSON lines "
                "without --jsonl, and --mask assistant|all\n");
        free(files);
        rank_opts_free(&ro);
        return 2;
    }
    if (threads < 1) threads = 1;
    if (threads > PACK_MAX_THREADS) threads = PACK_MAX_THREADS;
    pack_ctx c = {0};
    st_chat_template ct;
    st_chat_pack_stats cs = {0};
    st_tokenizer *tok = NULL;
    char tok_name[512];
    st_data_pack_meta meta = {.vocab_size = ST_DATA_BYTE_VOCAB, .eod = ST_DATA_BYTE_EOD, .tokenizer = "bytes"};
    if (tok_path) {
        if (load_tokenizer(&tok, tok_path, &ro, &c.err)) {
            fprintf(stderr, "strata data pack: --tokenizer %s: %s\n", tok_path, c.err.msg);
            free(files);
            rank_opts_free(&ro);
            return 1;
        }
        meta.vocab_size = (int64_t)st_tokenizer_vocab_size(tok);
        char digested[64];
        meta.has_digest = tokenizer_digest(tok_path, &meta.tokenizer_crc32c, &meta.tokenizer_bytes, digested) == 0;
        snprintf(tok_name, sizeof tok_name, "%s%s%s", base_name(tok_path), digested[0] ? "/" : "", digested);
        meta.tokenizer = tok_name;
        meta.pattern = st_tokenizer_pattern(tok, &meta.pattern_name, NULL); /* a rank file's: the sidecar says it */
        if (eod < 0) eod = st_tokenizer_eos_id(tok); /* a model directory's tokenizer_config.json eos_token */
        if (eod < 0) {
            int32_t hint = st_tokenizer_token_id(tok, "<|endoftext|>");
            char h[96] = "";
            if (hint >= 0) snprintf(h, sizeof h, " (this tokenizer's <|endoftext|> is id %d)", hint);
            fprintf(stderr,
                    "strata data pack: --tokenizer %s names no end-of-sequence token (a model directory's "
                    "tokenizer_config.json eos_token), and every document needs one appended; give its id with "
                    "--eod ID%s\n", tok_path, h);
            st_tokenizer_free(tok);
            free(files);
            rank_opts_free(&ro);
            return 2;
        }
        meta.eod = eod;
        const char *bos = st_tokenizer_id_token(tok, st_tokenizer_bos_id(tok));
        if (chat && st_chat_template_init(&ct, st_tokenizer_chat_template(tok), chat_format, bos, &c.err)) {
            fprintf(stderr, "strata data pack: --tokenizer %s: %s\n", tok_path, c.err.msg);
            st_tokenizer_free(tok);
            free(files);
            rank_opts_free(&ro);
            return 2;
        }
        if (chat) meta.mask_kind = strcmp(mask_kind, "all") ? "assistant" : "all";
    } else if (ro.pattern || ro.n_special) {
        fprintf(stderr, "strata data pack: --pattern and --special are for --tokenizer (a rank file)\n");
        free(files);
        rank_opts_free(&ro);
        return 2;
    } else if (eod >= 0) {
        fprintf(stderr, "strata data pack: --eod is for --tokenizer; the byte-level tokenizer's is %d\n", ST_DATA_BYTE_EOD);
        free(files);
        rank_opts_free(&ro);
        return 2;
    }
    if (meta.eod >= meta.vocab_size || (tok && !st_tokenizer_id_token(tok, (int32_t)meta.eod))) {
        /* any id the tokenizer defines: a rank, an added or special token (a rank file's come
         * from --special or tokenizer_config.json's added_tokens_decoder) */
        fprintf(stderr, "strata data pack: --eod %lld is no token of %s (its ids are the ranks and special tokens, "
                "[0, %lld)%s); give a token's id, or name the special token with --special TEXT=ID\n", eod, tok_path,
                (long long)meta.vocab_size, meta.eod < meta.vocab_size ? ", and no token has this one" : "");
        st_tokenizer_free(tok);
        free(files);
        rank_opts_free(&ro);
        return 2;
    }
    /* Megatron's reader picks uint16 for vocabularies up to 65536 ids, int32 above */
    int dtype = meta.vocab_size <= 65536 ? ST_DATA_DTYPE_U16 : ST_DATA_DTYPE_I32;
    c.tok = tok;
    c.eod = (int32_t)meta.eod;
    c.threads = (int)threads;
    c.runs = calloc((size_t)threads * PACK_RUNS_PER_THREAD, sizeof *c.runs);
    c.progress = progress || isatty(2);
    c.tty = isatty(2);
    for (int i = 0; i < nfiles; i++) {
        struct stat st;
        if (!strcmp(files[i], "-") || stat(files[i], &st) != 0 || !S_ISREG(st.st_mode)) {
            c.in_total = 0;
            break;
        }
        c.in_total += (uint64_t)st.st_size;
    }
    int rc = 0;
    if (!c.runs) rc = st_errf(&c.err, ST_ERR_NOMEM, "out of memory") != 0;
    /* byte-level packs stay as they were, a pair without a sidecar (a stale one is removed) */
    else if (st_data_pack_open(&c.w, out, dtype, &c.err) || (tok && st_data_pack_set_meta(c.w, &meta, &c.err))) {
        st_data_pack_abort(c.w);
        c.w = NULL;
        rc = 1;
    }
    c.t0 = c.last_print = st_now();
    for (int i = 0; i < nfiles && !rc; i++)
        rc = chat ? st_chat_pack_file(c.w, tok, &ct, !strcmp(mask_kind, "all") ? ST_CHAT_MASK_ALL
                                      : ST_CHAT_MASK_ASSISTANT, c.eod, c.threads, files[i], &cs, &c.err) != 0
                  : pack_file(&c, files[i], jsonl, key, split) != 0;
    if (chat) c.docs = cs.docs, c.tokens = cs.tokens, c.bytes = cs.bytes, c.in_bytes = cs.bytes;
    if (!rc) rc = pack_flush(&c) != 0;
    if (c.w && !rc) rc = st_data_pack_close(c.w, &c.err) != 0;
    else if (c.w) st_data_pack_abort(c.w);
    pack_progress(&c, 1);
    if (rc) fprintf(stderr, "strata data pack: %s\n", c.err.msg);
    else {
        double el = st_now() - c.t0;
        printf("packed %llu documents, %llu tokens (%llu bytes of text, tokenizer %s, end of document %lld "
               "appended to each) into %s.bin/.idx%s in %.2f s (%.2f MB/s, %d thread%s)\n",
               (unsigned long long)c.docs, (unsigned long long)c.tokens, (unsigned long long)c.bytes,
               meta.tokenizer, (long long)meta.eod, out, tok ? "/.json" : "", el, el > 0 ? c.bytes / el / 1e6 : 0.0, c.threads,
               c.threads == 1 ? "" : "s");
        if (chat)
            printf("chat template %s, mask %s: %llu of %llu tokens are trained on, in %s.mask\n", ct.name, meta.mask_kind,
                   (unsigned long long)cs.trained, (unsigned long long)cs.tokens, out);
    }
    pack_ctx_free(&c);
    st_tokenizer_free(tok);
    free(files);
    rank_opts_free(&ro);
    return rc;
}

/* ---- inspect, cat ---------------------------------------------------------------- */

/* strata data inspect SCORES: its header, and with --docs N its first N documents' records. */
static int inspect_scores(const char *path, long long ndocs, int json) {
    st_err err = {0};
    st_data_scores sc;
    if (st_data_scores_read(path, NULL, &sc, &err)) {
        fprintf(stderr, "strata data inspect: %s\n", err.msg);
        return 1;
    }
    uint64_t exact = 0, near = 0;
    for (uint64_t d = 0; d < sc.n_docs; d++) exact += sc.dup[d] == ST_DATA_DUP_EXACT, near += sc.dup[d] == ST_DATA_DUP_NEAR;
    if (json)
        printf("{\"path\": \"%s\", \"format\": \"scores\", \"kind\": \"%s\", \"params\": \"%s\", \"dataset\": "
               "\"%s\", \"documents\": %llu, \"exact_duplicates\": %llu, \"near_duplicates\": %llu}\n",
               path, sc.kind, sc.params, sc.dataset, (unsigned long long)sc.n_docs, (unsigned long long)exact,
               (unsigned long long)near);
    else
        printf("path:      %s\nformat:    scores (version %u)\nkind:      %s\nparams:    %s\ndataset:   %s\n"
               "documents: %llu\nexact duplicates: %llu\nnear duplicates:  %llu\n",
               path, ST_DATA_SCORES_VERSION, sc.kind, sc.params, sc.dataset, (unsigned long long)sc.n_docs,
               (unsigned long long)exact, (unsigned long long)near);
    if (!json)
        for (long long d = 0; d < ndocs && (uint64_t)d < sc.n_docs; d++)
            printf("  document %lld: score %.9g dup %s of %lld\n", d, sc.score[d],
                   sc.dup[d] == ST_DATA_DUP_EXACT ? "exact" : sc.dup[d] == ST_DATA_DUP_NEAR ? "near" : "none",
                   (long long)sc.ref[d]);
    st_data_scores_free(&sc);
    return 0;
}

static int data_inspect_cmd(int argc, char **argv) {
    const char *path = NULL;
    st_data_format fmt = ST_DATA_FORMAT_AUTO;
    long long ndocs = 5, vocab = 0;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--format") && i + 1 < argc) {
            if (parse_format(argv[++i], &fmt)) {
                fprintf(stderr, "strata data inspect: unknown format '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--docs") && i + 1 < argc) ndocs = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--validate") && i + 1 < argc) vocab = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(data_usage, stdout);
            return 0;
        } else if (!path && argv[i][0] != '-') path = argv[i];
        else {
            fprintf(stderr, "strata data inspect: unexpected '%s'\n\n%s", argv[i], data_usage);
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "strata data inspect: need a PATH\n\n%s", data_usage);
        return 2;
    }
    {   /* a score file is described, not opened as a source */
        char magic[8] = {0};
        FILE *f = fopen(path, "rb");
        if (f) {
            size_t got = fread(magic, 1, 8, f);
            fclose(f);
            if (got == 8 && !memcmp(magic, ST_DATA_SCORES_MAGIC, 8)) return inspect_scores(path, ndocs, json);
        }
    }
    st_err err = {0};
    st_data_source *s;
    st_data_source_config sc = {.path = path, .format = fmt};
    double t0 = st_now();
    if (st_data_source_open(&s, &sc, &err)) {
        fprintf(stderr, "strata data inspect: %s\n", err.msg);
        return 1;
    }
    double open_s = st_now() - t0;
    st_data_source_info info;
    st_data_source_get_info(s, &info);
    int rc = 0;
    if (vocab > 0) {
        /* A whole pass over the tokens, a document (or a chunk) at a time. */
        int32_t *buf = malloc(sizeof *buf * (1u << 20));
        uint64_t units = info.n_docs ? info.n_docs : 1;
        for (uint64_t d = 0; d < units && !rc; d++) {
            uint64_t len = info.n_tokens;
            if (info.n_docs && st_data_source_doc_len(s, d, &len, &err)) rc = 1;
            for (uint64_t o = 0; o < len && !rc; o += 1u << 20) {
                uint64_t k = len - o < (1u << 20) ? len - o : (1u << 20);
                if (st_data_source_read(s, d, o, k, buf, vocab, &err)) rc = 1;
            }
        }
        free(buf);
        if (rc) fprintf(stderr, "strata data inspect: %s\n", err.msg);
    }
    char side[128] = "";
    if (info.sidecar_path)
        snprintf(side, sizeof side, json ? ", \"vocab_size\": %lld, \"eod\": %lld" : "vocab_size: %lld (sidecar)\neod:       %lld\n",
                 (long long)info.vocab_size, (long long)info.eod);
    char view[6000] = "";
    if (info.format == ST_DATA_FORMAT_VIEW) {
        st_data_view_info vi;
        if (st_data_view_inspect(path, 0, &vi, &err) == ST_OK) {
            double frac = (double)vi.n_kept / (double)vi.base.n_docs;
            if (json)
                snprintf(view, sizeof view, ", \"base\": \"%s\", \"base_documents\": %llu, \"base_tokens\": %llu, "
                         "\"rule\": \"%s\", \"kept_fraction\": %.6f, \"kept_tokens\": %llu, \"ordered\": %s, \"paced\": %s",
                         vi.base_path, (unsigned long long)vi.base.n_docs, (unsigned long long)vi.base.n_tokens,
                         vi.rule, frac, (unsigned long long)vi.kept_tokens, vi.ordered ? "true" : "false",
                         vi.ordered == 2 ? "true" : "false");
            else
                snprintf(view, sizeof view, "base:      %s (%llu documents, %llu tokens; unchanged)\nrule:      %s\n"
                         "kept:      %llu documents (fraction %.4f), %llu tokens (fraction %.4f)\n",
                         vi.base_path, (unsigned long long)vi.base.n_docs, (unsigned long long)vi.base.n_tokens,
                         vi.rule, (unsigned long long)vi.n_kept, frac, (unsigned long long)vi.kept_tokens,
                         (double)vi.kept_tokens / (double)vi.base.n_tokens);
        }
    }
    if (json) {
        printf("{\"path\": \"%s\", \"format\": \"%s\", \"dtype\": \"%s\", \"documents\": %llu, \"tokens\": %llu, "
               "\"open_s\": %.6f%s%s%s}\n",
               path, format_name(info.format), st_data_dtype_name(info.dtype), (unsigned long long)info.n_docs,
               (unsigned long long)info.n_tokens, open_s,
               vocab > 0 ? (rc ? ", \"valid\": false" : ", \"valid\": true") : "", side, view);
    } else {
        fputs(view, stdout);
        fputs(side, stdout);
        printf("path:      %s\nformat:    %s\ndtype:     %s\ndocuments: %llu%s\ntokens:    %llu\nopened in: %.6f s\n",
               path, format_name(info.format), st_data_dtype_name(info.dtype), (unsigned long long)info.n_docs,
               info.n_docs ? "" : " (no index: sampled in windows of T+1 tokens)", (unsigned long long)info.n_tokens,
               open_s);
        if (info.n_docs) {
            printf("mean document: %.1f tokens\n", (double)info.n_tokens / (double)info.n_docs);
            for (long long d = 0; d < ndocs && (uint64_t)d < info.n_docs; d++) {
                uint64_t len = 0;
                if (st_data_source_doc_len(s, (uint64_t)d, &len, &err)) {
                    fprintf(stderr, "strata data inspect: %s\n", err.msg);
                    rc = 1;
                    break;
                }
                printf("  document %lld: %llu tokens\n", d, (unsigned long long)len);
            }
        }
        if (vocab > 0 && !rc) printf("all tokens below %lld\n", vocab);
    }
    st_data_source_close(s);
    return rc;
}

/* Warn when the tokenizer given to decode is not the one the sidecar names. */
static void cat_check_tokenizer(const char *sidecar, const char *tok_path) {
    json_object *o = sidecar ? json_object_from_file(sidecar) : NULL, *t, *crc, *name;
    uint32_t mine;
    uint64_t bytes;
    char within[64];
    if (o && json_object_object_get_ex(o, "tokenizer", &t) && json_object_object_get_ex(t, "crc32c", &crc) &&
        tokenizer_digest(tok_path, &mine, &bytes, within) == 0) {
        char hex[16];
        snprintf(hex, sizeof hex, "%08x", mine);
        if (strcmp(hex, json_object_get_string(crc)))
            fprintf(stderr, "strata data cat: warning: %s (CRC-32C %s) is not the tokenizer %s names (%s, CRC-32C %s)\n",
                    tok_path, hex, sidecar,
                    json_object_object_get_ex(t, "name", &name) ? json_object_get_string(name) : "?",
                    json_object_get_string(crc));
    }
    json_object_put(o);
}

static int data_cat_cmd(int argc, char **argv) {
    const char *path = NULL, *tok_path = NULL;
    long long doc = 0, eod_arg = -1;
    int as_tokens = 0, decode = 0, all = 0, trained = 0;
    uint8_t *mk = NULL;
    rank_opts ro = {0};
    for (int i = 1; i < argc; i++) {
        int r = rank_opt(&ro, argc, argv, &i, "cat");
        if (r < 0) {
            rank_opts_free(&ro);
            return 2;
        }
        if (r) continue;
        if (!strcmp(argv[i], "--doc") && i + 1 < argc) doc = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--trained")) trained = decode = 1;
        else if (!strcmp(argv[i], "--all")) all = 1;
        else if (!strcmp(argv[i], "--tokens")) as_tokens = 1;
        else if (!strcmp(argv[i], "--decode")) decode = 1;
        else if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) tok_path = argv[++i];
        else if (!strcmp(argv[i], "--eod") && i + 1 < argc) eod_arg = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(data_usage, stdout);
            return 0;
        } else if (!path && argv[i][0] != '-') path = argv[i];
        else {
            fprintf(stderr, "strata data cat: unexpected '%s'\n\n%s", argv[i], data_usage);
            return 2;
        }
    }
    if (!path || (decode && !tok_path) || (decode && as_tokens)) {
        fprintf(stderr, "strata data cat: need a PATH; --decode needs --tokenizer P and excludes --tokens\n\n%s",
                data_usage);
        return 2;
    }
    st_err err = {0};
    st_tokenizer *tok = NULL;
    st_data_source *s;
    st_data_source_config sc = {.path = path};
    if (st_data_source_open(&s, &sc, &err)) {
        fprintf(stderr, "strata data cat: %s\n", err.msg);
        rank_opts_free(&ro);
        return 1;
    }
    st_data_source_info info;
    st_data_source_get_info(s, &info);
    /* a rank file's pattern: --pattern, else the one the sidecar records (decoding does not
     * depend on it, but the load asks for it) */
    json_object *side = decode && !ro.pattern && info.sidecar_path ? json_object_from_file(info.sidecar_path) : NULL;
    json_object *st, *sp;
    if (side && json_object_object_get_ex(side, "tokenizer", &st) && json_object_object_get_ex(st, "pattern", &sp) &&
        json_object_is_type(sp, json_type_string))
        ro.pattern = json_object_get_string(sp);
    st_status ls = decode ? load_tokenizer(&tok, tok_path, &ro, &err) : ST_OK;
    json_object_put(side);
    ro.pattern = NULL; /* it pointed into the sidecar's JSON or argv */
    rank_opts_free(&ro);
    if (ls) {
        fprintf(stderr, "strata data cat: --tokenizer %s: %s\n", tok_path, err.msg);
        st_data_source_close(s);
        return 1;
    }
    int64_t eod = eod_arg >= 0 ? eod_arg : info.eod;
    if (decode) cat_check_tokenizer(info.sidecar_path, tok_path);
    uint64_t first = all ? 0 : (uint64_t)doc, end = all ? (info.n_docs ? info.n_docs : 1) : (uint64_t)doc + 1;
    int rc = 0;
    if (!info.n_docs && doc != 0) rc = st_errf(&err, ST_ERR_INVALID, "%s has no index: only --doc 0", path) != 0;
    int32_t *buf = NULL;
    char *text = NULL;
    size_t bcap = 0, tcap = 0;
    for (uint64_t d = first; d < end && !rc; d++) {
        uint64_t len = info.n_tokens;
        if (info.n_docs && st_data_source_doc_len(s, d, &len, &err)) {
            rc = 1;
            break;
        }
        if (len + 1 > bcap) {
            free(buf);
            bcap = len + 1;
            if (!(buf = malloc(sizeof *buf * bcap))) {
                rc = st_errf(&err, ST_ERR_NOMEM, "out of memory for %llu tokens", (unsigned long long)len) != 0;
                break;
            }
        }
        if (st_data_source_read(s, info.n_docs ? d : 0, 0, len, buf, 0, &err)) {
            rc = 1;
            break;
        }
        if (trained) { /* each run of trained tokens decoded on its own line */
            uint8_t *nm = realloc(mk, len + 1);
            if (!nm || st_data_source_read_mask(s, d, 0, len, nm, &err)) {
                mk = nm;
                rc = nm ? 1 : st_errf(&err, ST_ERR_NOMEM, "out of memory") != 0;
                break;
            }
            mk = nm;
            size_t k = 0;
            for (uint64_t i = 0; i <= len; i++)
                if (i < len && mk[i]) buf[k++] = buf[i];
                else if (k && buf[k - 1] >= 0) buf[k++] = -1; /* a run's end */
            len = k;
        }
        if (as_tokens) {
            for (uint64_t i = 0; i < len; i++) printf(i + 1 < len ? "%d " : "%d", buf[i]);
            putchar('\n');
            continue;
        }
        for (uint64_t a = 0, b = 0; trained && a < len && !rc; a = ++b) { /* the runs, -1 after each */
            while (buf[b] >= 0) b++;
            size_t got = 0;
            st_status r = st_tokenizer_decode(tok, buf + a, b - a, text, tcap, &got, &err);
            if (r == ST_ERR_INVALID && got > tcap) {
                free(text);
                tcap = got;
                text = malloc(tcap);
                r = text ? st_tokenizer_decode(tok, buf + a, b - a, text, tcap, &got, &err)
                         : st_errf(&err, ST_ERR_NOMEM, "out of memory for %zu bytes", got);
            }
            if (r) rc = 1;
            else fwrite(text, 1, got, stdout), putchar('\n');
        }
        if (trained) continue;
        if (decode) {
            size_t n = len && buf[len - 1] == eod ? len - 1 : len, got = 0;
            st_status r = st_tokenizer_decode(tok, buf, n, text, tcap, &got, &err);
            if (r == ST_ERR_INVALID && got > tcap) {
                free(text);
                tcap = got;
                if (!(text = malloc(tcap))) {
                    rc = st_errf(&err, ST_ERR_NOMEM, "out of memory for %zu bytes", got) != 0;
                    break;
                }
                r = st_tokenizer_decode(tok, buf, n, text, tcap, &got, &err);
            }
            if (r) {
                st_err_prefix(&err, "%s: document %llu", path, (unsigned long long)d);
                rc = 1;
                break;
            }
            fwrite(text, 1, got, stdout);
        } else {
            for (uint64_t i = 0; i < len; i++)
                if (buf[i] < 256) putchar(buf[i]);
        }
        if (all) putchar('\n');
    }
    if (rc) fprintf(stderr, "strata data cat: %s\n", err.msg);
    free(buf);
    free(text);
    free(mk);
    st_data_source_close(s);
    st_tokenizer_free(tok);
    return rc;
}

/* A number option's value, or a refusal naming the key. */
static int num_arg(const char *cmd, const char *key, const char *v, double *out) {
    char *end;
    *out = strtod(v, &end);
    if (end == v || *end) {
        fprintf(stderr, "strata data %s: %s '%s' is not a number\n", cmd, key, v);
        return 1;
    }
    return 0;
}

static int data_dedup_cmd(int argc, char **argv, const char *cmd) {
    const char *dataset = NULL, *outp = NULL;
    int json = 0;
    st_data_dedup_config cfg;
    st_data_dedup_config_init(&cfg);
    for (int i = 1; i < argc; i++) {
        double x;
        const char *a = argv[i];
        if (!strcmp(a, "--dedup")) continue; /* strata data score --dedup */
        if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "-o") && i + 1 < argc) outp = argv[++i];
        else if ((!strcmp(a, "--ngram") || !strcmp(a, "--hashes") || !strcmp(a, "--bands") || !strcmp(a, "--rows") ||
                  !strcmp(a, "--threshold") || !strcmp(a, "--seed") || !strcmp(a, "--threads") ||
                  !strcmp(a, "--max_compare")) && i + 1 < argc) {
            if (num_arg(cmd, a, argv[++i], &x)) return 2;
            if (!strcmp(a, "--ngram")) cfg.ngram = (int)x;
            else if (!strcmp(a, "--hashes")) cfg.num_hashes = (int)x;
            else if (!strcmp(a, "--bands")) cfg.bands = (int)x;
            else if (!strcmp(a, "--rows")) cfg.rows = (int)x;
            else if (!strcmp(a, "--threshold")) cfg.threshold = x;
            else if (!strcmp(a, "--seed")) cfg.seed = (uint64_t)x;
            else if (!strcmp(a, "--threads")) cfg.threads = (int)x;
            else cfg.max_compare = (int)x;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(data_usage, stdout);
            return 0;
        } else if (!dataset && a[0] != '-') dataset = a;
        else {
            fprintf(stderr, "strata data %s: unexpected '%s'\n\n%s", cmd, a, data_usage);
            return 2;
        }
    }
    if (!dataset || !outp) {
        fprintf(stderr, "strata data %s: need a DATASET and -o SCORES\n\n%s", cmd, data_usage);
        return 2;
    }
    st_err err = {0};
    st_data_scores sc;
    st_data_dedup_stats st;
    if (st_data_dedup(dataset, &cfg, &sc, &st, &err) || st_data_scores_write(outp, &sc, &err)) {
        fprintf(stderr, "strata data %s: %s\n", cmd, err.msg);
        st_data_scores_free(&sc);
        return 1;
    }
    st_data_scores_free(&sc);
    if (json)
        printf("{\"dataset\": \"%s\", \"scores\": \"%s\", \"documents\": %llu, \"tokens\": %llu, \"exact\": %llu, "
               "\"near\": %llu, \"candidates\": %llu, \"verified\": %llu, \"ngram\": %d, \"hashes\": %d, \"bands\": %d, "
               "\"rows\": %d, \"threshold\": %g, \"minhash_s\": %.4f, \"exact_s\": %.4f, \"lsh_s\": %.4f, "
               "\"total_s\": %.4f, \"tokens_per_s\": %.6g, \"mem_bytes\": %zu}\n",
               dataset, outp, (unsigned long long)st.n_docs, (unsigned long long)st.n_tokens,
               (unsigned long long)st.exact, (unsigned long long)st.near, (unsigned long long)st.candidates,
               (unsigned long long)st.verified, cfg.ngram, cfg.num_hashes, cfg.bands, cfg.rows, cfg.threshold,
               st.minhash_s, st.exact_s, st.lsh_s, st.total_s, st.total_s > 0 ? (double)st.n_tokens / st.total_s : 0,
               st.mem_bytes);
    else
        printf("%s: %llu documents, %llu tokens: %llu exact and %llu near duplicates (%llu candidate pairs, %llu "
               "verified) in %.3f s (MinHash pass %.3f s, %.3g tokens/s); %.1f MiB\n",
               outp, (unsigned long long)st.n_docs, (unsigned long long)st.n_tokens, (unsigned long long)st.exact,
               (unsigned long long)st.near, (unsigned long long)st.candidates, (unsigned long long)st.verified,
               st.total_s, st.minhash_s, st.total_s > 0 ? (double)st.n_tokens / st.total_s : 0,
               (double)st.mem_bytes / (1 << 20));
    return 0;
}

/* strata data score DATASET --proxy MODEL -o SCORES: a proxy model's mean loss a document. */
static int data_score_proxy_cmd(const char *dataset, const char *proxy, const char *refp, const char *outp, int B, int T,
                                int threads, int json, int quiet) {
    st_err err = {0};
    st_backend *be = NULL;
    st_model *m = NULL, *ref = NULL;
    st_data_scores sc = {0};
    st_data_proxy_stats st;
    char desc[4600] = "";
    st_data_proxy_config cfg;
    st_data_proxy_config_init(&cfg);
    cfg.B = B, cfg.T = T, cfg.progress = !quiet, cfg.model_name = proxy;
    int rc = 1;
    if (st_backend_cpu_create(&be, threads, &err) || st_train_open_model(&m, proxy, be, desc, sizeof desc, &err)) {
        fprintf(stderr, "strata data score: --proxy %s: %s\n", proxy, err.msg);
        goto done;
    }
    if (!quiet) fprintf(stderr, "proxy: %s\n", desc);
    if (refp && st_train_open_model(&ref, refp, be, desc, sizeof desc, &err)) {
        fprintf(stderr, "strata data score: --reference %s: %s\n", refp, err.msg);
        goto done;
    }
    if (refp && !quiet) fprintf(stderr, "reference: %s\n", desc);
    if ((refp ? st_data_score_reducible(dataset, m, ref, &cfg, refp, &sc, &st, &err)
              : st_data_score_proxy(dataset, m, &cfg, &sc, &st, &err)) ||
        st_data_scores_write(outp, &sc, &err)) {
        fprintf(stderr, "strata data score: %s\n", err.msg);
        goto done;
    }
    double fr = st.forward_s > 0 ? st.flops / st.forward_s : 0, r = st.seconds > 0 ? st.flops / st.seconds : 0;
    if (json)
        printf("{\"dataset\": \"%s\", \"scores\": \"%s\", \"kind\": \"%s\", \"proxy\": \"%s\", \"documents\": %llu, \"tokens\": %llu, "
               "\"targets\": %llu, \"empty_documents\": %llu, \"forwards\": %llu, \"batch\": %d, \"seq\": %d, "
               "\"threads\": %d, \"flops\": %.6g, \"seconds\": %.4f, \"forward_s\": %.4f, \"flops_per_s\": %.6g, "
               "\"forward_flops_per_s\": %.6g, \"tokens_per_s\": %.6g}\n",
               dataset, outp, sc.kind, proxy, (unsigned long long)st.n_docs, (unsigned long long)st.n_tokens,
               (unsigned long long)st.n_targets, (unsigned long long)st.empty_docs, (unsigned long long)st.forwards,
               st.B, st.T, threads, st.flops, st.seconds, st.forward_s, r, fr,
               st.seconds > 0 ? (double)st.n_tokens / st.seconds : 0);
    else
        printf("%s: %llu %s scores for %s (%llu tokens, %llu documents with nothing to predict); "
               "%.3g FLOPs in %.2f s (%.3g GFLOP/s, %.3g in the forward)\n",
               outp, (unsigned long long)st.n_docs, refp ? "reducible-loss" : "proxy-loss", dataset, (unsigned long long)st.n_tokens,
               (unsigned long long)st.empty_docs, st.flops, st.seconds, r * 1e-9, fr * 1e-9);
    rc = 0;
done:
    st_data_scores_free(&sc);
    st_model_free(ref);
    st_model_free(m);
    st_backend_free(be);
    return rc;
}

/* strata data score DATASET --dynamics RUN_DIR -o SCORES: a run's per-document records. */
static int data_score_dynamics_cmd(const char *dataset, const char *run_dir, const char *outp, const char *metric,
                                   int unseen_ok, double unseen, int json) {
    st_err err = {0};
    st_data_scores sc;
    st_data_dynamics_stats st;
    if (st_data_score_dynamics(dataset, run_dir, metric, unseen_ok, unseen, &sc, &st, &err) ||
        st_data_scores_write(outp, &sc, &err)) {
        fprintf(stderr, "strata data score: --dynamics %s: %s\n", run_dir, err.msg);
        st_data_scores_free(&sc);
        return 1;
    }
    if (json)
        printf("{\"dataset\": \"%s\", \"scores\": \"%s\", \"run_dir\": \"%s\", \"metric\": \"%s\", \"source\": %d, "
               "\"records\": %llu, \"documents\": %llu, \"seen\": %llu, \"unseen\": %llu, \"max_visits\": %llu}\n",
               dataset, outp, run_dir, metric, st.source, (unsigned long long)st.records,
               (unsigned long long)sc.n_docs, (unsigned long long)st.docs_seen, (unsigned long long)st.unseen,
               (unsigned long long)st.max_visits);
    else
        printf("%s: %llu learning-dynamics scores (%s) for %s from %llu records of %s (source %d; %llu documents "
               "seen, %llu unseen, at most %llu visits)\n", outp, (unsigned long long)sc.n_docs, metric, dataset,
               (unsigned long long)st.records, run_dir, st.source, (unsigned long long)st.docs_seen,
               (unsigned long long)st.unseen, (unsigned long long)st.max_visits);
    st_data_scores_free(&sc);
    return 0;
}

static int data_score_cmd(int argc, char **argv) {
    const char *dataset = NULL, *outp = NULL, *text = NULL, *proxy = NULL, *dyn = NULL, *metric = "first", *refp = NULL;
    int unseen_ok = 0;
    double unseen = 0;
    int B = 0, T = 0, threads = 0, json = 0, quiet = 0;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--dedup")) return data_dedup_cmd(argc, argv, "score --dedup");
    for (int i = 1; i < argc; i++) {
        double x;
        const char *a = argv[i];
        if (!strcmp(a, "-o") && i + 1 < argc) outp = argv[++i];
        else if (!strcmp(a, "--from_text") && i + 1 < argc) text = argv[++i];
        else if (!strcmp(a, "--proxy") && i + 1 < argc) proxy = argv[++i];
        else if (!strcmp(a, "--dynamics") && i + 1 < argc) dyn = argv[++i];
        else if (!strcmp(a, "--reference") && i + 1 < argc) refp = argv[++i];
        else if (!strcmp(a, "--metric") && i + 1 < argc) metric = argv[++i];
        else if (!strcmp(a, "--unseen") && i + 1 < argc) {
            if (num_arg("score", a, argv[++i], &unseen)) return 2;
            unseen_ok = 1;
        } else if ((!strcmp(a, "--batch") || !strcmp(a, "--seq") || !strcmp(a, "--threads")) && i + 1 < argc) {
            if (num_arg("score", a, argv[++i], &x)) return 2;
            int lo = strcmp(a, "--threads") ? 1 : 0;
            if (x != (int)x || x < lo || x > 1 << 20) {
                fprintf(stderr, "strata data score: %s %s: give a whole number >= %d\n", a, argv[i], lo);
                return 2;
            }
            *(!strcmp(a, "--batch") ? &B : !strcmp(a, "--seq") ? &T : &threads) = (int)x;
        } else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--quiet")) quiet = 1;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(data_usage, stdout);
            return 0;
        } else if (!dataset && a[0] != '-') dataset = a;
        else {
            fprintf(stderr, "strata data score: unexpected '%s' (--proxy MODEL, --dynamics RUN_DIR, --from_text FILE or --dedup)\n\n%s",
                    a, data_usage);
            return 2;
        }
    }
    if (refp && !proxy) {
        fprintf(stderr, "strata data score: --reference %s needs --proxy MODEL (the reducible loss is MODEL's loss minus "
                "the reference's)\n", refp);
        return 2;
    }
    if (!dataset || !outp || !!text + !!proxy + !!dyn != 1) {
        fprintf(stderr, "strata data score: need a DATASET, one of --proxy MODEL, --dynamics RUN_DIR and --from_text "
                "FILE (or --dedup), "
                "and -o SCORES\n\n%s", data_usage);
        return 2;
    }
    if (dyn) return data_score_dynamics_cmd(dataset, dyn, outp, metric, unseen_ok, unseen, json);
    if (proxy) return data_score_proxy_cmd(dataset, proxy, refp, outp, B, T, threads, json, quiet);
    st_err err = {0};
    st_data_scores sc;
    if (st_data_scores_from_text(text, dataset, &sc, &err) || st_data_scores_write(outp, &sc, &err)) {
        fprintf(stderr, "strata data score: %s\n", err.msg);
        st_data_scores_free(&sc);
        return 1;
    }
    printf("%s: %llu scores for %s\n", outp, (unsigned long long)sc.n_docs, dataset);
    st_data_scores_free(&sc);
    return 0;
}

static int data_select_cmd(int argc, char **argv) {
    const char *outp = NULL;
    st_data_select_config c = {0};
    c.pace.start = 0.1, c.pace.length = 1, c.pace.steps = 4;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        double x;
        if (!strcmp(a, "-o") && i + 1 < argc) outp = argv[++i];
        else if (!strcmp(a, "--pace") && i + 1 < argc) {
            const char *p = argv[++i];
            c.pace.kind = !strcmp(p, "linear") ? ST_DATA_PACE_LINEAR : !strcmp(p, "root") ? ST_DATA_PACE_ROOT
                        : !strcmp(p, "step") ? ST_DATA_PACE_STEP : 0;
            if (!c.pace.kind) {
                fprintf(stderr, "strata data select: --pace '%s': give linear, root or step\n", p);
                return 2;
            }
        } else if (!strcmp(a, "--pace_start") && i + 1 < argc) {
            if (num_arg("select", a, argv[++i], &c.pace.start)) return 2;
        } else if (!strcmp(a, "--pace_length") && i + 1 < argc) {
            if (num_arg("select", a, argv[++i], &c.pace.length)) return 2;
        } else if (!strcmp(a, "--pace_band") && i + 1 < argc) {
            if (num_arg("select", a, argv[++i], &c.pace.band)) return 2;
        } else if (!strcmp(a, "--pace_steps") && i + 1 < argc) {
            if (num_arg("select", a, argv[++i], &x)) return 2;
            c.pace.steps = x >= 0 && x <= 1e6 && x == (int)x ? (uint32_t)x : 0;
        }
        else if (!strcmp(a, "--scores") && i + 1 < argc) c.scores = argv[++i];
        else if (!strcmp(a, "--drop_duplicates") && i + 1 < argc) c.dedup = argv[++i];
        else if (!strcmp(a, "--keep") && i + 2 < argc) {
            const char *k = argv[++i];
            if (!strcmp(k, "lowest") || !strcmp(k, "highest")) {
                c.keep = k[0] == 'l' ? ST_DATA_KEEP_LOWEST : ST_DATA_KEEP_HIGHEST;
                if (num_arg("select", "--keep fraction", argv[++i], &c.fraction)) return 2;
            } else if (!strcmp(k, "band") && i + 2 < argc) {
                c.keep = ST_DATA_KEEP_BAND;
                if (num_arg("select", "--keep band LO", argv[++i], &c.band_lo) ||
                    num_arg("select", "--keep band HI", argv[++i], &c.band_hi))
                    return 2;
            } else {
                fprintf(stderr, "strata data select: --keep '%s': give lowest F, highest F or band LO HI\n", k);
                return 2;
            }
        } else if (!strcmp(a, "--order") && i + 1 < argc) {
            const char *o = argv[++i];
            if (!strcmp(o, "base")) c.order = ST_DATA_ORDER_BASE;
            else if (!strcmp(o, "ascending")) c.order = ST_DATA_ORDER_ASCENDING;
            else if (!strcmp(o, "descending")) c.order = ST_DATA_ORDER_DESCENDING;
            else {
                fprintf(stderr, "strata data select: --order '%s': give base, ascending or descending\n", o);
                return 2;
            }
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(data_usage, stdout);
            return 0;
        } else if (!c.dataset && a[0] != '-') c.dataset = a;
        else {
            fprintf(stderr, "strata data select: unexpected '%s'\n\n%s", a, data_usage);
            return 2;
        }
    }
    if (!c.dataset || !outp) {
        fprintf(stderr, "strata data select: need a DATASET and -o VIEW\n\n%s", data_usage);
        return 2;
    }
    st_err err = {0};
    st_data_view_info vi;
    if (st_data_select(outp, &c, &vi, &err)) {
        fprintf(stderr, "strata data select: %s\n", err.msg);
        return 1;
    }
    printf("%s: %llu of %llu documents (%.4f), %llu of %llu tokens; %s\n", outp, (unsigned long long)vi.n_kept,
           (unsigned long long)vi.base.n_docs, (double)vi.n_kept / (double)vi.base.n_docs,
           (unsigned long long)vi.kept_tokens, (unsigned long long)vi.base.n_tokens, vi.rule);
    return 0;
}

int cmd_data(int argc, char **argv) {
    if (argc < 2) {
        fputs(data_usage, stderr);
        return 2;
    }
    const char *sub = argv[1];
    if (!strcmp(sub, "--help") || !strcmp(sub, "-h") || !strcmp(sub, "help")) {
        fputs(data_usage, stdout);
        return 0;
    }
    if (!strcmp(sub, "pack")) return data_pack_cmd(argc - 1, argv + 1);
    if (!strcmp(sub, "inspect")) return data_inspect_cmd(argc - 1, argv + 1);
    if (!strcmp(sub, "cat")) return data_cat_cmd(argc - 1, argv + 1);
    if (!strcmp(sub, "dedup")) return data_dedup_cmd(argc - 1, argv + 1, "dedup");
    if (!strcmp(sub, "score")) return data_score_cmd(argc - 1, argv + 1);
    if (!strcmp(sub, "select")) return data_select_cmd(argc - 1, argv + 1);
    fprintf(stderr, "strata data: unknown subcommand '%s'\n\n%s", sub, data_usage);
    return 2;
}
