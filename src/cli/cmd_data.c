/* cmd_data.c - strata data {pack, inspect, cat} (strata bench data: src/bench/bench_data.c).
 *
 * pack turns text or JSON-lines into a Megatron .bin/.idx pair with the byte-level
 * tokenizer (one token per byte, end of document 256); inspect describes any source
 * the loader reads; cat prints a document back, which closes the round trip.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
