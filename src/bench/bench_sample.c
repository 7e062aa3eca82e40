/* bench_sample.c - strata bench sample: the KV-cached decoder against recomputing the whole
 * prefix for every token, in the same run, with the same weights and prompt (greedy, so both
 * must give the same tokens). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "strata/backend.h"
#include "strata/generate.h"
#include "strata/train.h"

static const char *usage =
    "usage: strata bench sample [--model PRESET | --from DIR] [--prompt_len N] [--max_new N]\n"
    "                           [--threads N] [--json]\n"
    "\n"
    "Greedy generation of max_new tokens (default 256) after a prompt of prompt_len\n"
    "tokens (default 16, fixed pseudo-random ids), first with the KV cache, then\n"
    "recomputing the whole prefix for every token (strata sample --no-cache), in the same\n"
    "run on the same weights (--model: random, default gpt2-124m). Prints tokens/s of\n"
    "each, the speedup per token, and whether both produced the same tokens (exit 1 if not).\n";

typedef struct sample_opts {
    const char *from, *preset;
    int max_new, prompt_len, threads, json;
} sample_opts;

/* An integer option in [lo, hi]; 0 when it is one, else the message printed and 1. */
static int int_opt(const char *opt, const char *v, int lo, int hi, int *out) {
    char *end;
    long x = strtol(v, &end, 10);
    if (end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "strata bench sample: %s '%s' must be an integer in [%d, %d]\n", opt, v, lo, hi);
        return 1;
    }
    *out = (int)x;
    return 0;
}

/* 0: parsed; 1: a bad option (said); 2: --help printed. */
static int parse_opts(int argc, char **argv, sample_opts *o) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(usage, stdout); return 2; }
        if (!strcmp(a, "--json")) { o->json = 1; continue; }
        if (i + 1 >= argc) {
            fprintf(stderr, "strata bench sample: option '%s' needs a value (or is unknown)\n%s", a, usage);
            return 1;
        }
        const char *v = argv[++i];
        int bad = 0;
        if (!strcmp(a, "--from")) o->from = v, o->preset = NULL;
        else if (!strcmp(a, "--model")) o->preset = v, o->from = NULL;
        else if (!strcmp(a, "--max_new")) bad = int_opt(a, v, 0, 1 << 24, &o->max_new);
        else if (!strcmp(a, "--prompt_len")) bad = int_opt(a, v, 1, 1 << 24, &o->prompt_len);
        else if (!strcmp(a, "--threads")) bad = int_opt(a, v, 0, 4096, &o->threads);
        else {
            fprintf(stderr, "strata bench sample: unknown option '%s'\n%s", a, usage);
            return 1;
        }
        if (bad) return 1;
    }
    return 0;
}

int bench_sample(int argc, char **argv) {
    sample_opts o = {.preset = "gpt2-124m", .max_new = 256, .prompt_len = 16};
    int given = 0; /* --model and --from exclude each other */
    for (int i = 1; i < argc; i++) given += !strcmp(argv[i], "--model") || !strcmp(argv[i], "--from");
    if (given > 1) {
        fprintf(stderr, "strata bench sample: give --from DIR or --model PRESET (one of them)\n%s", usage);
        return 2;
    }
    int r = parse_opts(argc, argv, &o);
    if (r) return r == 2 ? 0 : 2;
    st_err err = {0};
    st_backend *be = NULL;
    st_model *m = NULL;
    int32_t *prompt = NULL, *out[2] = {NULL, NULL};
    int rc = 1;
    char desc[4800];
    if (st_backend_cpu_create(&be, o.threads, &err)) goto fail;
    if (o.from) {
        if (st_train_open_model(&m, o.from, be, desc, sizeof desc, &err)) goto fail;
    } else {
        if (st_model_create(&m, o.preset, NULL, be, &err)) goto fail;
        m->ops->init_random(m, 1337);
        char d[200];
        m->ops->describe(m, d, sizeof d);
        snprintf(desc, sizeof desc, "random weights (seed 1337): %s", d);
    }
    if (o.prompt_len + o.max_new > m->max_seq) {
        fprintf(stderr, "strata bench sample: prompt_len %d + max_new %d pass the model's %d positions\n", o.prompt_len,
                o.max_new, m->max_seq);
        rc = 2;
        goto done;
    }
    prompt = malloc(sizeof(int32_t) * (size_t)o.prompt_len);
    out[0] = malloc(sizeof(int32_t) * (size_t)(o.max_new + 1));
    out[1] = malloc(sizeof(int32_t) * (size_t)(o.max_new + 1));
    if (!prompt || !out[0] || !out[1]) goto fail;
    st_rng rng;
    st_rng_seed(&rng, 42);
    for (int i = 0; i < o.prompt_len; i++) prompt[i] = (int32_t)(st_rng_u64(&rng) % (uint64_t)m->vocab_size);
    st_generate_result res[2];
    for (int pass = 0; pass < 2; pass++) {
        st_generate_config gc = {.max_new = o.max_new, .sampler = {0.0f, 0, 1.0f}, .seed = 1, .no_cache = pass,
                                 .stop_token = -1};
        if (!o.json)
            fprintf(stderr, "strata bench sample: %s, %d tokens after %d...\n", pass ? "no cache" : "KV cache",
                    o.max_new, o.prompt_len);
        if (st_generate(m, prompt, o.prompt_len, &gc, NULL, NULL, out[pass], &res[pass], &err)) goto fail;
    }
    int same = res[0].n_new == res[1].n_new && !memcmp(out[0], out[1], sizeof(int32_t) * (size_t)res[0].n_new);
    double speedup = res[0].tokens_per_s > 0 && res[1].tokens_per_s > 0 ? res[0].tokens_per_s / res[1].tokens_per_s : 0;
    if (o.json) {
        printf("{\"bench\":\"sample\",\"model\":");
        st_fput_json_string(stdout, desc, strlen(desc));
        printf(",\"threads\":%d,\"prompt_tokens\":%d,\"new_tokens\":%d,\"cache_tokens_per_s\":%.3f,"
               "\"cache_prefill_s\":%.6f,\"cache_decode_s\":%.6f,\"nocache_tokens_per_s\":%.4f,\"nocache_s\":%.3f,"
               "\"speedup\":%.2f,\"same_tokens\":%s}\n",
               o.threads, o.prompt_len, res[0].n_new, res[0].tokens_per_s, res[0].prefill_s, res[0].decode_s,
               res[1].tokens_per_s, res[1].prefill_s + res[1].decode_s, speedup, same ? "true" : "false");
    } else {
        printf("model: %s\n", desc);
        printf("greedy, %d tokens after a prompt of %d:\n", res[0].n_new, o.prompt_len);
        printf("  KV cache     %10.2f tokens/s  (%.3f s; prompt %.1f ms)\n", res[0].tokens_per_s,
               res[0].prefill_s + res[0].decode_s, res[0].prefill_s * 1e3);
        printf("  no cache     %10.2f tokens/s  (%.3f s)\n", res[1].tokens_per_s, res[1].prefill_s + res[1].decode_s);
        printf("  speedup per token: %.1fx; same tokens: %s\n", speedup, same ? "yes" : "NO");
    }
    rc = same ? 0 : 1;
    goto done;
fail:
    fprintf(stderr, "strata bench sample: %s\n", err.msg[0] ? err.msg : "out of memory");
done:
    free(prompt);
    free(out[0]);
    free(out[1]);
    st_model_free(m);
    st_backend_free(be);
    return rc;
}
