/* bench_tokenize.c - strata bench tokenize: encode throughput of a tokenizer.json on a text
 * file, on one thread and on all threads.
 *
 * The text is cut at line ends into chunks of about --chunk bytes (a chunk is what one
 * encode call gets, like a document of `strata data pack`); one thread encodes them in
 * order, then N threads take them from a shared counter. Each figure is the median of
 * --repeat runs. The token count of every run must equal the first's: a tokenizer that
 * gives other ids on other threads is an error, not a figure.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <json-c/json.h>

#include "bench/bench.h"
#include "strata/core.h"
#include "strata/tokenizer.h"

static const char *tok_usage =
    "usage: strata bench tokenize --tokenizer PATH --text FILE [--threads N] [--repeat R]\n"
    "                             [--chunk BYTES] [--json]\n"
    "  Encodes FILE with the tokenizer (a Hugging Face tokenizer.json) in chunks of about BYTES\n"
    "  (default 262144) cut at line ends, first on one thread, then on N threads (default: all\n"
    "  CPUs) taking chunks from a shared counter. Prints the median of R runs (default 3) of:\n"
    "    mb_per_s_1, tokens_per_s_1      one thread (MB = 10^6 bytes of text)\n"
    "    mb_per_s_all, tokens_per_s_all  N threads; speedup = mb_per_s_all / mb_per_s_1\n"
    "    cores_busy_all                  process CPU seconds / wall seconds of the N-thread run:\n"
    "                                    below N when other work holds the cores\n";

typedef struct tok_job {
    const st_tokenizer *tok;
    const char *text;
    const size_t *cut; /* chunk c is text[cut[c], cut[c+1]) */
    size_t n_chunks;
    atomic_size_t next;
    atomic_ullong tokens;
    atomic_int failed;
    st_err err;
    pthread_mutex_t mu;
} tok_job;

static void *tok_worker(void *arg) {
    tok_job *j = arg;
    size_t cap = 1 << 16;
    int32_t *ids = malloc(cap * sizeof *ids);
    unsigned long long mine = 0;
    st_err err = {0};
    for (size_t c; ids && !atomic_load(&j->failed) && (c = atomic_fetch_add(&j->next, 1)) < j->n_chunks;) {
        size_t len = j->cut[c + 1] - j->cut[c], n = 0;
        if (len + 16 > cap) {
            int32_t *t = realloc(ids, (len + 16) * sizeof *ids);
            if (!t) break;
            ids = t, cap = len + 16;
        }
        st_status rc = st_tokenizer_encode(j->tok, j->text + j->cut[c], len, ids, cap, &n, &err);
        if (rc == ST_ERR_INVALID && n > cap) {
            int32_t *t = realloc(ids, n * sizeof *ids);
            if (!t) break;
            ids = t, cap = n;
            rc = st_tokenizer_encode(j->tok, j->text + j->cut[c], len, ids, cap, &n, &err);
        }
        if (rc) {
            pthread_mutex_lock(&j->mu);
            if (!atomic_exchange(&j->failed, 1)) {
                j->err = err;
                st_err_prefix(&j->err, "chunk %zu (byte %zu)", c, j->cut[c]);
            }
            pthread_mutex_unlock(&j->mu);
            break;
        }
        mine += n;
    }
    if (!ids && !atomic_exchange(&j->failed, 1)) st_errf(&j->err, ST_ERR_NOMEM, "out of memory");
    free(ids);
    atomic_fetch_add(&j->tokens, mine);
    return NULL;
}

static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec * 1e-6;
}

/* One pass over all chunks on nt threads: wall seconds, or -1 with j->err; *cpu: process
 * CPU seconds it took. */
static double tok_pass(tok_job *j, int nt, unsigned long long *tokens, double *cpu) {
    atomic_store(&j->next, 0);
    atomic_store(&j->tokens, 0);
    pthread_t th[256];
    int started = 0;
    double t0 = st_now(), c0 = cpu_seconds();
    for (int t = 1; t < nt; t++, started++)
        if (pthread_create(&th[t], NULL, tok_worker, j)) break;
    tok_worker(j);
    for (int t = 1; t <= started; t++) pthread_join(th[t], NULL);
    double el = st_now() - t0;
    *cpu = cpu_seconds() - c0;
    *tokens = atomic_load(&j->tokens);
    return atomic_load(&j->failed) ? -1 : el;
}

static char *slurp(const char *path, size_t *n, st_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        st_errf(err, ST_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 20, len = 0;
    char *b = malloc(cap);
    size_t r;
    while (b && (r = fread(b + len, 1, cap - len, f)) > 0) {
        len += r;
        if (len == cap) {
            char *t = realloc(b, cap *= 2);
            if (!t) free(b);
            b = t;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!b || bad) {
        free(b);
        st_errf(err, bad ? ST_ERR_IO : ST_ERR_NOMEM, "%s: %s", path, bad ? "read error" : "out of memory");
        return NULL;
    }
    *n = len;
    return b;
}

int bench_tokenize(int argc, char **argv) {
    const char *tok_path = NULL, *text_path = NULL;
    int json = 0, repeat = 3;
    long threads = sysconf(_SC_NPROCESSORS_ONLN);
    double chunk = 262144;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) tok_path = argv[++i];
        else if (!strcmp(argv[i], "--text") && i + 1 < argc) text_path = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atol(argv[++i]);
        else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) repeat = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--chunk") && i + 1 < argc) chunk = atof(argv[++i]);
        else if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(tok_usage, stdout);
            return 0;
        } else {
            fprintf(stderr, "strata bench tokenize: unexpected '%s'\n%s", argv[i], tok_usage);
            return 2;
        }
    }
    if (!tok_path || !text_path || threads < 1 || threads > 256 || repeat < 1 || repeat > 99 || chunk < 1) {
        fprintf(stderr, "strata bench tokenize: need --tokenizer and --text (threads 1..256, repeat 1..99)\n%s",
                tok_usage);
        return 2;
    }
    st_err err = {0};
    st_tokenizer *tok = NULL;
    if (st_tokenizer_load(&tok, tok_path, &err)) {
        fprintf(stderr, "strata bench tokenize: --tokenizer %s: %s\n", tok_path, err.msg);
        return 1;
    }
    size_t len = 0;
    char *text = slurp(text_path, &len, &err);
    size_t *cut = text ? malloc(sizeof *cut * (len / (size_t)chunk + 2)) : NULL;
    if (!cut) {
        fprintf(stderr, "strata bench tokenize: %s\n", text ? "out of memory" : err.msg);
        free(text);
        st_tokenizer_free(tok);
        return 1;
    }
    size_t nc = 0;
    cut[0] = 0;
    for (size_t at = 0; at < len;) { /* each chunk ends after the first line end past `chunk` bytes */
        size_t e = at + (size_t)chunk < len ? at + (size_t)chunk : len;
        while (e < len && text[e - 1] != '\n') e++;
        cut[++nc] = e;
        at = e;
    }
    tok_job j = {.tok = tok, .text = text, .cut = cut, .n_chunks = nc};
    pthread_mutex_init(&j.mu, NULL);
    double t1[99], tn[99], busy[99], cpu;
    unsigned long long tokens = 0, got = 0;
    int rc = 0;
    for (int r = 0; r < repeat && !rc; r++) { /* alternating, so drift in the machine's load hits both */
        t1[r] = tok_pass(&j, 1, r ? &got : &tokens, &cpu);
        tn[r] = t1[r] < 0 ? -1 : tok_pass(&j, (int)threads, &got, &cpu);
        busy[r] = tn[r] > 0 ? cpu / tn[r] : 0;
        if (t1[r] < 0 || tn[r] < 0) rc = 1;
        else if (got != tokens)
            rc = st_errf(&j.err, ST_ERR_INVALID, "%llu tokens on %ld threads but %llu on one: encode is not "
                         "thread-safe", got, threads, tokens) != 0;
    }
    if (rc) {
        fprintf(stderr, "strata bench tokenize: %s\n", j.err.msg);
    } else {
        double s1 = bench_median(t1, repeat), sn = bench_median(tn, repeat);
        double cores = bench_median(busy, repeat);
        double mb1 = len / s1 / 1e6, mbn = len / sn / 1e6, tk1 = tokens / s1, tkn = tokens / sn;
        if (json) {
            json_object *o = json_object_new_object();
            json_object_object_add(o, "tokenizer", json_object_new_string(tok_path));
            json_object_object_add(o, "text", json_object_new_string(text_path));
            json_object_object_add(o, "bytes", json_object_new_int64((int64_t)len));
            json_object_object_add(o, "chunks", json_object_new_int64((int64_t)nc));
            json_object_object_add(o, "tokens", json_object_new_int64((int64_t)tokens));
            json_object_object_add(o, "threads", json_object_new_int((int)threads));
            json_object_object_add(o, "repeat", json_object_new_int(repeat));
            json_object_object_add(o, "mb_per_s_1", json_object_new_double(mb1));
            json_object_object_add(o, "tokens_per_s_1", json_object_new_double(tk1));
            json_object_object_add(o, "mb_per_s_all", json_object_new_double(mbn));
            json_object_object_add(o, "tokens_per_s_all", json_object_new_double(tkn));
            json_object_object_add(o, "speedup", json_object_new_double(mbn / mb1));
            json_object_object_add(o, "cores_busy_all", json_object_new_double(cores));
            puts(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE));
            json_object_put(o);
        } else {
            printf("tokenize: %s on %s: %.2f MB in %zu chunks, %llu tokens (%.2f bytes a token), median of %d\n",
                   tok_path, text_path, len / 1e6, nc, tokens, tokens ? (double)len / tokens : 0.0, repeat);
            printf("  1 thread:    %8.2f MB/s  %12.0f tokens/s\n", mb1, tk1);
            printf("  %2ld threads:  %8.2f MB/s  %12.0f tokens/s  (%.2fx; %.2f cores busy)\n", threads, mbn, tkn,
                   mbn / mb1, cores);
        }
    }
    pthread_mutex_destroy(&j.mu);
    free(cut);
    free(text);
    st_tokenizer_free(tok);
    return rc;
}
