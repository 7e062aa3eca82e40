/* cmd_data.c - strata data {pack, inspect, cat} and strata bench data.
 *
 * pack turns text or JSON-lines into a Megatron .bin/.idx pair with the byte-level
 * tokenizer (one token per byte, end of document 256); inspect describes any source
 * the loader reads; cat prints a document back, which closes the round trip. The
 * benchmark builds a synthetic three-source mix of 10^10 tokens (sparse .bin files, a
 * real .idx of ~10^7 documents) in a temporary directory and deletes it afterwards.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#include "cli/cli.h"
#include "strata/core.h"
#include "strata/data.h"

static const char *data_usage =
    "usage: strata data <pack|inspect|cat> [options]\n"
    "\n"
    "  strata data pack -o PREFIX [--jsonl] [--key K] [--split file|line|blank] FILE...\n"
    "      Tokenize text with the built-in byte-level tokenizer (token = byte, 256 = end of\n"
    "      document, vocabulary 257) into PREFIX.bin + PREFIX.idx (Megatron-LM indexed\n"
    "      dataset, uint16). Each document gets an end-of-document token appended.\n"
    "      --jsonl        each line of each FILE is a JSON object; its K field is a document\n"
    "      --key K        the JSON field holding the text (default \"text\")\n"
    "      --split MODE   plain text: file = one document per file (default), line = one per\n"
    "                     non-empty line, blank = paragraphs separated by blank lines\n"
    "      FILE may be - for standard input.\n"
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
    "  strata data cat PATH [--doc N] [--tokens]\n"
    "      Print document N (default 0) as bytes (byte-level data; token 256 is dropped),\n"
    "      or as token ids with --tokens. Sources without an index have one document.\n";

static int parse_format(const char *s, data_format *f) {
    if (!strcmp(s, "auto")) *f = DATA_FORMAT_AUTO;
    else if (!strcmp(s, "megatron")) *f = DATA_FORMAT_MEGATRON;
    else if (!strcmp(s, "llmc")) *f = DATA_FORMAT_LLMC;
    else if (!strcmp(s, "raw16")) *f = DATA_FORMAT_RAW_U16;
    else if (!strcmp(s, "raw32")) *f = DATA_FORMAT_RAW_U32;
    else return -1;
    return 0;
}

static const char *format_name(data_format f) {
    switch (f) {
    case DATA_FORMAT_MEGATRON: return "megatron";
    case DATA_FORMAT_LLMC: return "llmc";
    case DATA_FORMAT_RAW_U16: return "raw16";
    case DATA_FORMAT_RAW_U32: return "raw32";
    case DATA_FORMAT_MEMORY: return "memory";
    default: return "auto";
    }
}

/* ---- pack ---------------------------------------------------------------------- */

typedef struct pack_ctx {
    data_pack_writer *w;
    int32_t *tok;
    size_t cap;
    uint64_t docs, bytes;
    st_err err;
} pack_ctx;

static int pack_doc(pack_ctx *c, const char *text, size_t n) {
    if (n == 0) return 0; /* an empty document would only be an end-of-document token */
    if (n + 1 > c->cap) {
        size_t nc = (n + 1) * 2;
        int32_t *t = realloc(c->tok, nc * sizeof *t);
        if (!t) {
            st_errf(&c->err, ST_ERR_NOMEM, "out of memory for a %zu-byte document", n);
            return -1;
        }
        c->tok = t, c->cap = nc;
    }
    data_tokenize_bytes(text, n, c->tok);
    c->tok[n] = DATA_BYTE_EOD;
    if (data_pack_add(c->w, c->tok, n + 1, &c->err)) return -1;
    c->docs++;
    c->bytes += n;
    return 0;
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

static int data_pack_cmd(int argc, char **argv) {
    const char *out = NULL, *key = "text", *split = "file";
    int jsonl = 0, nfiles = 0;
    const char **files = calloc((size_t)argc, sizeof *files);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-o") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--jsonl")) jsonl = 1;
        else if (!strcmp(argv[i], "--key") && i + 1 < argc) key = argv[++i];
        else if (!strcmp(argv[i], "--split") && i + 1 < argc) split = argv[++i];
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(data_usage, stdout);
            free(files);
            return 0;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "strata data pack: unknown option '%s'\n\n%s", argv[i], data_usage);
            free(files);
            return 2;
        } else files[nfiles++] = argv[i];
    }
    if (!out || !nfiles || (strcmp(split, "file") && strcmp(split, "line") && strcmp(split, "blank"))) {
        fprintf(stderr, "strata data pack: need -o PREFIX and at least one FILE (split: file|line|blank)\n\n%s",
                data_usage);
        free(files);
        return 2;
    }
    pack_ctx c = {0};
    if (data_pack_open(&c.w, out, DATA_DTYPE_U16, &c.err)) {
        fprintf(stderr, "strata data pack: %s\n", c.err.msg);
        free(files);
        return 1;
    }
    double t0 = st_now();
    for (int i = 0; i < nfiles; i++)
        if (pack_file(&c, files[i], jsonl, key, split)) {
            fprintf(stderr, "strata data pack: %s\n", c.err.msg);
            data_pack_abort(c.w);
            free(c.tok);
            free(files);
            return 1;
        }
    free(c.tok);
    free(files);
    if (data_pack_close(c.w, &c.err)) {
        fprintf(stderr, "strata data pack: %s\n", c.err.msg);
        return 1;
    }
    printf("packed %llu documents, %llu tokens (%llu bytes of text + one end-of-document each) into %s.bin/.idx "
           "in %.2f s\n",
           (unsigned long long)c.docs, (unsigned long long)(c.bytes + c.docs), (unsigned long long)c.bytes, out,
           st_now() - t0);
    return 0;
}

/* ---- inspect, cat ---------------------------------------------------------------- */

static int data_inspect_cmd(int argc, char **argv) {
    const char *path = NULL;
    data_format fmt = DATA_FORMAT_AUTO;
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
    st_err err = {0};
    data_source *s;
    data_source_config sc = {.path = path, .format = fmt};
    double t0 = st_now();
    if (data_source_open(&s, &sc, &err)) {
        fprintf(stderr, "strata data inspect: %s\n", err.msg);
        return 1;
    }
    double open_s = st_now() - t0;
    data_source_info info;
    data_source_get_info(s, &info);
    int rc = 0;
    if (vocab > 0) {
        /* A whole pass over the tokens, a document (or a chunk) at a time. */
        int32_t *buf = malloc(sizeof *buf * (1u << 20));
        uint64_t units = info.n_docs ? info.n_docs : 1;
        for (uint64_t d = 0; d < units && !rc; d++) {
            uint64_t len = info.n_tokens;
            if (info.n_docs && data_source_doc_len(s, d, &len, &err)) rc = 1;
            for (uint64_t o = 0; o < len && !rc; o += 1u << 20) {
                uint64_t k = len - o < (1u << 20) ? len - o : (1u << 20);
                if (data_source_read(s, d, o, k, buf, vocab, &err)) rc = 1;
            }
        }
        free(buf);
        if (rc) fprintf(stderr, "strata data inspect: %s\n", err.msg);
    }
    if (json) {
        printf("{\"path\": \"%s\", \"format\": \"%s\", \"dtype\": \"%s\", \"documents\": %llu, \"tokens\": %llu, "
               "\"open_s\": %.6f%s}\n",
               path, format_name(info.format), data_dtype_name(info.dtype), (unsigned long long)info.n_docs,
               (unsigned long long)info.n_tokens, open_s,
               vocab > 0 ? (rc ? ", \"valid\": false" : ", \"valid\": true") : "");
    } else {
        printf("path:      %s\nformat:    %s\ndtype:     %s\ndocuments: %llu%s\ntokens:    %llu\nopened in: %.6f s\n",
               path, format_name(info.format), data_dtype_name(info.dtype), (unsigned long long)info.n_docs,
               info.n_docs ? "" : " (no index: sampled in windows of T+1 tokens)", (unsigned long long)info.n_tokens,
               open_s);
        if (info.n_docs) {
            printf("mean document: %.1f tokens\n", (double)info.n_tokens / (double)info.n_docs);
            for (long long d = 0; d < ndocs && (uint64_t)d < info.n_docs; d++) {
                uint64_t len = 0;
                if (data_source_doc_len(s, (uint64_t)d, &len, &err)) {
                    fprintf(stderr, "strata data inspect: %s\n", err.msg);
                    rc = 1;
                    break;
                }
                printf("  document %lld: %llu tokens\n", d, (unsigned long long)len);
            }
        }
        if (vocab > 0 && !rc) printf("all tokens below %lld\n", vocab);
    }
    data_source_close(s);
    return rc;
}

static int data_cat_cmd(int argc, char **argv) {
    const char *path = NULL;
    long long doc = 0;
    int as_tokens = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--doc") && i + 1 < argc) doc = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--tokens")) as_tokens = 1;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(data_usage, stdout);
            return 0;
        } else if (!path && argv[i][0] != '-') path = argv[i];
        else {
            fprintf(stderr, "strata data cat: unexpected '%s'\n\n%s", argv[i], data_usage);
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "strata data cat: need a PATH\n\n%s", data_usage);
        return 2;
    }
    st_err err = {0};
    data_source *s;
    data_source_config sc = {.path = path};
    if (data_source_open(&s, &sc, &err)) {
        fprintf(stderr, "strata data cat: %s\n", err.msg);
        return 1;
    }
    data_source_info info;
    data_source_get_info(s, &info);
    uint64_t len = info.n_tokens;
    int rc = 0;
    if (info.n_docs && data_source_doc_len(s, (uint64_t)doc, &len, &err)) rc = 1;
    else if (!info.n_docs && doc != 0) rc = st_errf(&err, ST_ERR_INVALID, "%s has no index: only --doc 0", path) != 0;
    int32_t *buf = rc ? NULL : malloc(sizeof *buf * (len ? len : 1));
    if (!rc && data_source_read(s, info.n_docs ? (uint64_t)doc : 0, 0, len, buf, 0, &err)) rc = 1;
    if (!rc) {
        for (uint64_t i = 0; i < len; i++) {
            if (as_tokens) printf(i + 1 < len ? "%d " : "%d\n", buf[i]);
            else if (buf[i] < 256) putchar(buf[i]);
        }
    }
    if (rc) fprintf(stderr, "strata data cat: %s\n", err.msg);
    free(buf);
    data_source_close(s);
    return rc;
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
    fprintf(stderr, "strata data: unknown subcommand '%s'\n\n%s", sub, data_usage);
    return 2;
}

/* ---- bench ----------------------------------------------------------------------- */

static const char *bench_usage =
    "usage: strata bench data [--json] [--tokens N] [--seq-len T] [--batch B] [--seconds S]\n"
    "                         [--prefetch D] [--dir DIR] [--keep]\n"
    "  Builds a synthetic mix of three Megatron sources (weights 0.5/0.3/0.2, documents of\n"
    "  log-normal length with mean 1000 tokens, N tokens in all, default 1e10) in a fresh\n"
    "  directory under DIR (default /dev/shm, else /tmp): real .idx files, sparse .bin\n"
    "  files made with ftruncate. Then one consumer reads batches of B x T (default 8 x 2048) for S seconds\n"
    "  (default 3), and the files are deleted unless --keep. Prints:\n"
    "    first_batch_s    open of all three sources to the first batch in hand\n"
    "    tokens_per_s     input tokens (B*T a batch) delivered per second, consumer not computing\n"
    "    bytes_per_token  bytes the loader reads + writes per delivered token (token bytes from\n"
    "                     the page cache and the staging copy, batch arrays, and the .idx\n"
    "                     bytes the lookahead preads: on a large index that is the whole\n"
    "                     index once per 65536 documents of a source, 12 x its documents /\n"
    "                     65536 bytes per document)\n"
    "    cpu_s_per_gtok   process CPU seconds (user + system, all threads) per 10^9 tokens\n"
    "    rss_mb           resident set after the run (VmRSS); rss_peak_mb is VmHWM\n"
    "    memcpy_gbps      memcpy of 256 MiB, counted as bytes read + written per second\n"
    "                     (the same convention as bytes_per_token), median of 5\n"
    "    stall_frac       share of time next() waited while the consumer simulated an\n"
    "                     accelerator step (sleeping) of twice the loader's per-batch time,\n"
    "                     at least 1 ms\n";

static double rss_field(const char *field) { /* MiB */
    double b = cli_proc_status_bytes(field);
    return b < 0 ? -1 : b / 1048576.0;
}

static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double memcpy_gbps(void) {
    size_t n = 256u << 20;
    char *a = malloc(n), *b = malloc(n);
    if (!a || !b) {
        free(a), free(b);
        return -1;
    }
    memset(a, 1, n);
    memset(b, 2, n);
    double r[5];
    for (int i = 0; i < 5; i++) {
        double t0 = st_now();
        memcpy(b, a, n);
        r[i] = 2.0 * (double)n / (st_now() - t0) / 1e9;
        a[i] = b[n - 1 - i]; /* keep the copy observable */
    }
    free(a), free(b);
    qsort(r, 5, sizeof r[0], cmp_double);
    return r[2];
}

/* One synthetic Megatron source: `tokens` tokens in documents of log-normal length,
 * written as a real .idx (streamed in chunks; the sizes are drawn twice from the same
 * seed rather than kept) and a sparse .bin of the matching size. */
static int make_synth(const char *prefix, uint64_t tokens, uint64_t seed, uint64_t *docs_out, st_err *err) {
    char ip[1100], bp[1100];
    snprintf(ip, sizeof ip, "%.1090s.idx", prefix);
    snprintf(bp, sizeof bp, "%.1090s.bin", prefix);
    FILE *f = fopen(ip, "wb");
    if (!f) return st_errf(err, ST_ERR_IO, "%s: cannot create: %s", ip, strerror(errno));
    const double mu = log(1000.0) - 0.5, sigma = 1.0; /* mean exp(mu + sigma^2/2) = 1000 */
    enum { CH = 1 << 16 };
    static int32_t sz[CH];
    static int64_t pt[CH];
    uint8_t hdr[34] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
    fwrite(hdr, 1, 34, f); /* counts filled in at the end */
    uint64_t n = 0, total = 0;
    st_rng r;
    st_rng_seed(&r, seed);
    while (total < tokens) {
        int k = 0;
        for (; k < CH && total < tokens; k++) {
            double len = exp(mu + sigma * st_rng_normal(&r));
            uint64_t L = len < 1 ? 1 : len > 1e6 ? 1000000 : (uint64_t)len;
            if (L > tokens - total) L = tokens - total;
            sz[k] = (int32_t)L;
            total += L;
        }
        fwrite(sz, 4, (size_t)k, f);
        n += (uint64_t)k;
    }
    st_rng_seed(&r, seed);
    uint64_t ptr = 0, t2 = 0;
    for (uint64_t done = 0; done < n;) {
        int k = 0;
        for (; k < CH && done < n; k++, done++) {
            double len = exp(mu + sigma * st_rng_normal(&r));
            uint64_t L = len < 1 ? 1 : len > 1e6 ? 1000000 : (uint64_t)len;
            if (L > tokens - t2) L = tokens - t2;
            pt[k] = (int64_t)ptr;
            ptr += 2 * L;
            t2 += L;
        }
        fwrite(pt, 8, (size_t)k, f);
    }
    for (uint64_t done = 0; done <= n;) {
        int k = 0;
        for (; k < CH && done <= n; k++, done++) pt[k] = (int64_t)done;
        fwrite(pt, 8, (size_t)k, f);
    }
    uint64_t version = 1, ndi = n + 1;
    hdr[17] = DATA_DTYPE_U16;
    memcpy(hdr + 9, &version, 8);
    memcpy(hdr + 18, &n, 8);
    memcpy(hdr + 26, &ndi, 8);
    int bad = fseek(f, 0, SEEK_SET) != 0 || fwrite(hdr, 1, 34, f) != 34;
    if (fclose(f) != 0 || bad) return st_errf(err, ST_ERR_IO, "%s: write failed: %s", ip, strerror(errno));
    int fd = open(bp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ftruncate(fd, (off_t)(2 * total)) != 0) {
        if (fd >= 0) close(fd);
        return st_errf(err, ST_ERR_IO, "%s: cannot create a sparse %llu-byte file: %s", bp,
                       (unsigned long long)(2 * total), strerror(errno));
    }
    close(fd);
    *docs_out = n;
    return ST_OK;
}

int bench_data(int argc, char **argv) {
    int json = 0, keep = 0, T = 2048, B = 8, prefetch = 4;
    double tokens = 1e10, seconds = 3;
    /* tmpfs by default: reading a hole there copies the zero page, while ext4 allocates
     * and zeroes a page-cache page per 4 KiB (45% of the run in kernel memset), which
     * measures the filesystem's sparse files rather than the loader. */
    struct stat sd;
    const char *dir = stat("/dev/shm", &sd) == 0 && S_ISDIR(sd.st_mode) ? "/dev/shm" : "/tmp";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--keep")) keep = 1;
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) tokens = cli_parse_count(argv[++i]);
        else if (!strcmp(argv[i], "--seq-len") && i + 1 < argc) T = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) B = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--prefetch") && i + 1 < argc) prefetch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(bench_usage, stdout);
            return 0;
        } else {
            fprintf(stderr, "strata bench data: unknown option '%s'\n\n%s", argv[i], bench_usage);
            return 2;
        }
    }
    if (!(tokens >= 3e4) || T < 1 || B < 1 || !(seconds > 0)) {
        fprintf(stderr, "strata bench data: need --tokens >= 3e4 (1e10, 2.5B, ...), T, B >= 1, S > 0\n");
        return 2;
    }
    char tdir[1024];
    snprintf(tdir, sizeof tdir, "%s/strata-bench-data-XXXXXX", dir);
    if (!mkdtemp(tdir)) {
        fprintf(stderr, "strata bench data: cannot create a directory under %s: %s\n", dir, strerror(errno));
        return 1;
    }
    st_err err = {0};
    const double share[3] = {0.5, 0.3, 0.2};
    char prefix[3][1100];
    uint64_t docs[3], total_docs = 0;
    int rc = 0;
    double t0 = st_now();
    for (int i = 0; i < 3 && !rc; i++) {
        snprintf(prefix[i], sizeof prefix[i], "%s/src%d", tdir, i);
        rc = make_synth(prefix[i], (uint64_t)(tokens * share[i]), 1000 + (uint64_t)i, &docs[i], &err) != ST_OK;
        total_docs += rc ? 0 : docs[i];
    }
    double gen_s = st_now() - t0;
    data_loader_config c;
    data_loader_config_init(&c);
    c.n_sources = 3;
    for (int i = 0; i < 3; i++) c.sources[i] = (data_source_config){.path = prefix[i], .weight = share[i]};
    c.T = T, c.B = B, c.seed = 42, c.vocab_size = 50257, c.eod_token = 50256, c.mask_eod = 1;
    c.prefetch = prefetch;
    data_loader *dl = NULL;
    data_batch b;
    double first_batch_s = 0, tok_s = 0, bpt = 0, cpu_gtok = 0, rss = 0, rss_peak = 0, stall = 0;
    data_loader_stats st0 = {0}, st1 = {0};
    if (!rc) {
        t0 = st_now();
        rc = data_loader_open(&dl, &c, &err) || data_loader_next(dl, &b, &err);
        first_batch_s = st_now() - t0;
    }
    if (!rc) {
        /* Phase 1: the consumer takes batches as fast as the loader makes them. */
        data_loader_get_stats(dl, &st0);
        double c0 = cpu_seconds(), w0 = st_now();
        while (!rc && st_now() - w0 < seconds) rc = data_loader_next(dl, &b, &err) != ST_OK;
        double wall = st_now() - w0, cpu = cpu_seconds() - c0;
        data_loader_get_stats(dl, &st1);
        double ntok = (double)(st1.tokens - st0.tokens);
        tok_s = ntok / wall;
        bpt = (double)(st1.bytes_read - st0.bytes_read + st1.bytes_written - st0.bytes_written) / ntok;
        cpu_gtok = cpu / ntok * 1e9;
        /* Phase 2: a step that takes twice the loader's per-batch time; the consumer
         * should find a batch ready every time. */
        double step_s = 2.0 * (double)B * T / tok_s, wait0 = st1.wait_s;
        if (step_s < 1e-3) step_s = 1e-3;
        if (step_s > 0.5) step_s = 0.5;
        w0 = st_now();
        int steps = 0;
        while (!rc && st_now() - w0 < seconds / 2) {
            rc = data_loader_next(dl, &b, &err) != ST_OK;
            /* the accelerator computes; this thread waits for it */
            struct timespec ts = {0, (long)(step_s * 1e9)};
            nanosleep(&ts, NULL);
            steps++;
        }
        data_loader_get_stats(dl, &st1);
        stall = (st1.wait_s - wait0) / (st_now() - w0);
        rss = rss_field("VmRSS:");
        rss_peak = rss_field("VmHWM:");
    }
    data_loader_close(dl);
    for (int i = 0; i < 3 && !keep; i++) {
        char p[1200];
        snprintf(p, sizeof p, "%.1090s.idx", prefix[i]);
        unlink(p);
        snprintf(p, sizeof p, "%.1090s.bin", prefix[i]);
        unlink(p);
    }
    if (!keep) rmdir(tdir);
    if (rc) {
        fprintf(stderr, "strata bench data: %s\n", err.msg);
        return 1;
    }
    double mc = memcpy_gbps();
    double ring_mb = (double)st1.ring_bytes / 1048576.0;
    if (json) {
        printf("{\"bench\": \"data\", \"tokens_indexed\": %.0f, \"documents\": %llu, \"sources\": 3, \"seq_len\": %d, "
               "\"batch\": %d, \"prefetch\": %d, \"generate_s\": %.3f, \"first_batch_s\": %.6f, \"tokens_per_s\": %.4g, "
               "\"bytes_per_token\": %.3f, \"achieved_gbps\": %.3f, \"cpu_s_per_gtok\": %.3f, \"rss_mb\": %.1f, "
               "\"rss_peak_mb\": %.1f, \"ring_mb\": %.2f, \"memcpy_gbps\": %.3f, \"stall_frac\": %.5f}\n",
               tokens, (unsigned long long)total_docs, T, B, prefetch, gen_s, first_batch_s, tok_s, bpt,
               tok_s * bpt / 1e9, cpu_gtok, rss, rss_peak, ring_mb, mc, stall);
    } else {
        printf("data pipeline: 3 sources, %.3g tokens indexed in %llu documents (generated in %.2f s)\n", tokens,
               (unsigned long long)total_docs, gen_s);
        printf("  first_batch_s    %.6f\n  tokens_per_s     %.4g  (B=%d, T=%d, prefetch %d)\n", first_batch_s, tok_s, B,
               T, prefetch);
        printf("  bytes_per_token  %.3f  -> %.3f GB/s moved, memcpy %.3f GB/s (read+write)\n", bpt, tok_s * bpt / 1e9,
               mc);
        printf("  cpu_s_per_gtok   %.3f\n  rss_mb           %.1f (peak %.1f, ring %.2f)\n  stall_frac       %.5f\n",
               cpu_gtok, rss, rss_peak, ring_mb, stall);
    }
    return 0;
}
