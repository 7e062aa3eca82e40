/* cmd_sample.c - strata sample: text from a trained model, streamed as it is drawn (strata
 * bench sample, the KV-cached decoder against recomputing the prefix, is src/bench/bench_sample.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/backend.h"
#include "strata/generate.h"
#include "strata/train.h"

int cmd_sample(int argc, char **argv);

static const char *sample_usage =
    "usage: strata sample (--from DIR | --model PRESET) [--prompt TEXT] [options]\n"
    "\n"
    "Generates text after a prompt, one token at a time with a KV cache (the prompt is\n"
    "one forward, then each new token one more row), and streams it to stdout as it is\n"
    "drawn; tokens/s on stderr at the end.\n"
    "\n"
    "  --from DIR          a run directory (its newest checkpoint), a checkpoint directory\n"
    "                      (RUN/checkpoints/step_N) or a Hugging Face model directory\n"
    "                      (GPT2LMHeadModel, Llama, Qwen2, Qwen3, Mistral)\n"
    "  --model PRESET      random weights of a preset instead (to measure speed)\n"
    "  --prompt TEXT       text, encoded by the tokenizer.json in the --from directory\n"
    "                      (byte-level BPE: GPT-2, Llama 3, Qwen2), else as bytes for\n"
    "                      byte-level models (vocabulary 256 or 257: the embedded corpus,\n"
    "                      strata data pack); any other model takes token ids separated by\n"
    "                      spaces or commas and prints token ids. Default: the end-of-\n"
    "                      document token (<|endoftext|>, byte 256), else a newline or token 0\n"
    "  --max_new N         tokens to generate (default 256; prompt + N must fit the model)\n"
    "  --temperature T     softmax temperature (default 1; 0: greedy)\n"
    "  --top_k K           draw from the K most likely tokens only (default 0: all)\n"
    "  --top_p P           draw from the smallest set holding P of the probability (default 1: all)\n"
    "  --seed S            sampling seed (default 1337; the same seed draws the same text)\n"
    "  --no-cache          recompute the whole prefix for every token (the reference; slow)\n"
    "  --threads N         compute threads (default: all cores)\n"
    "  --json              no streamed text: one JSON object with the tokens, text and speed\n";

typedef struct cli_opts {
    const char *from, *preset, *prompt;
    int max_new, threads, json, no_cache;
    st_sampler sampler;
    unsigned long long seed;
} cli_opts;

static int parse_int(const char *opt, const char *v, int lo, int hi, int *out) {
    char *end;
    long x = strtol(v, &end, 10);
    if (end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "strata: %s '%s' must be an integer in [%d, %d]\n", opt, v, lo, hi);
        return 1;
    }
    *out = (int)x;
    return 0;
}

static int parse_float(const char *opt, const char *v, float *out) {
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end) {
        fprintf(stderr, "strata: %s '%s' is not a number\n", opt, v);
        return 1;
    }
    *out = (float)x;
    return 0;
}

/* 0: parsed; 1: bad option (message printed); 2: --help printed. */
static int parse_opts(int argc, char **argv, cli_opts *o, const char *usage) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(usage, stdout); return 2; }
        if (!strcmp(a, "--json")) { o->json = 1; continue; }
        if ((!strcmp(a, "--no-cache") || !strcmp(a, "--no_cache"))) { o->no_cache = 1; continue; }
        if (i + 1 >= argc) {
            fprintf(stderr, "strata: option '%s' needs a value (or is unknown)\n%s", a, usage);
            return 1;
        }
        const char *v = argv[++i];
        int bad = 0;
        if (!strcmp(a, "--from")) o->from = v;
        else if (!strcmp(a, "--model")) o->preset = v;
        else if (!strcmp(a, "--prompt")) o->prompt = v;
        else if (!strcmp(a, "--max_new")) bad = parse_int(a, v, 0, 1 << 24, &o->max_new);
        else if (!strcmp(a, "--threads")) bad = parse_int(a, v, 0, 4096, &o->threads);
        else if (!strcmp(a, "--temperature")) bad = parse_float(a, v, &o->sampler.temperature);
        else if (!strcmp(a, "--top_k")) bad = parse_int(a, v, 0, 1 << 24, &o->sampler.top_k);
        else if (!strcmp(a, "--top_p")) bad = parse_float(a, v, &o->sampler.top_p);
        else if (!strcmp(a, "--seed")) {
            char *end;
            o->seed = strtoull(v, &end, 10);
            bad = end == v || *end || v[0] == '-';
            if (bad) fprintf(stderr, "strata: --seed '%s' must be a non-negative integer\n", v);
        } else {
            fprintf(stderr, "strata: unknown option '%s'\n%s", a, usage);
            return 1;
        }
        if (bad) return 1;
    }
    if (!o->from == !o->preset) {
        fprintf(stderr, "strata: give --from DIR or --model PRESET (one of them)\n%s", usage);
        return 1;
    }
    st_err err = {0};
    if (st_sampler_validate(&o->sampler, &err)) {
        fprintf(stderr, "strata: %s\n", err.msg);
        return 1;
    }
    return 0;
}

/* The model to sample: a directory's weights, or a preset with random weights. */
static st_status open_model(const cli_opts *o, st_backend *be, st_model **m, char *desc, size_t cap, st_err *err) {
    if (o->from) return st_train_open_model(m, o->from, be, desc, cap, err);
    st_status s = st_model_create(m, o->preset, NULL, be, err);
    if (s) return s;
    (*m)->ops->init_random(*m, 1337);
    char d[200];
    (*m)->ops->describe(*m, d, sizeof d);
    snprintf(desc, cap, "random weights (seed 1337): %s", d);
    return ST_OK;
}

typedef struct stream_sink { const st_text *text; } stream_sink;

static int print_token(void *ctx, int32_t tok) {
    stream_sink *k = ctx;
    char buf[ST_TEXT_TOKEN_MAX];
    size_t n = st_text_decode(k->text, tok, buf, sizeof buf);
    fwrite(buf, 1, n, stdout);
    fflush(stdout); /* the text appears as it is drawn, also through a pipe */
    return 0;
}

int cmd_sample(int argc, char **argv) {
    cli_opts o = {.max_new = 256, .sampler = {1.0f, 0, 1.0f}, .seed = 1337};
    int r = parse_opts(argc, argv, &o, sample_usage);
    if (r) return r == 2 ? 0 : 2;
    st_err err = {0};
    st_backend *be = NULL;
    st_model *m = NULL;
    int32_t *prompt = NULL, *out = NULL;
    int n_prompt = 0, rc = 1;
    char desc[4800];
    st_text text = {0};
    if (st_backend_cpu_create(&be, o.threads, &err) || open_model(&o, be, &m, desc, sizeof desc, &err)) goto fail;
    if (st_text_open(&text, m->vocab_size, o.from, &err)) goto fail;
    if (o.prompt && o.prompt[0]) {
        if (st_text_encode(&text, o.prompt, &prompt, &n_prompt, &err)) goto fail;
    }
    if (!n_prompt) { /* a model needs one token to start from */
        free(prompt);
        prompt = malloc(sizeof(int32_t));
        if (!prompt) goto fail;
        prompt[0] = text.eod >= 0 ? text.eod : text.kind == ST_TEXT_BYTES ? '\n' : 0; /* a document's start */
        n_prompt = 1;
    }
    if (n_prompt >= m->max_seq) {
        fprintf(stderr, "strata sample: the prompt has %d tokens; the model has %d positions\n", n_prompt, m->max_seq);
        rc = 2;
        goto done;
    }
    if (n_prompt + o.max_new > m->max_seq) {
        fprintf(stderr, "strata sample: %d new tokens after %d of prompt pass the model's %d positions; generating %d\n",
                o.max_new, n_prompt, m->max_seq, m->max_seq - n_prompt);
        o.max_new = m->max_seq - n_prompt;
    }
    out = malloc(sizeof(int32_t) * (size_t)(o.max_new + 1));
    if (!out) goto fail;
    fprintf(stderr, "strata sample: %s; text as %s; %s\n", desc, st_text_kind_name(&text),
            o.no_cache ? "no cache (the whole prefix every token)" : "KV cache");
    st_generate_config gc = {.max_new = o.max_new, .sampler = o.sampler, .seed = o.seed, .no_cache = o.no_cache,
                             .stop_token = text.eod};
    stream_sink sink = {&text};
    char buf[ST_TEXT_TOKEN_MAX];
    if (!o.json) { /* the prompt as given; the default one decoded */
        if (o.prompt && o.prompt[0]) fputs(o.prompt, stdout);
        for (int i = 0; !(o.prompt && o.prompt[0]) && i < n_prompt; i++) {
            size_t n = st_text_decode(&text, prompt[i], buf, sizeof buf);
            fwrite(buf, 1, n, stdout);
        }
        fflush(stdout);
    }
    st_generate_result res;
    if (st_generate(m, prompt, n_prompt, &gc, o.json ? NULL : print_token, &sink, out, &res, &err)) goto fail;
    if (!o.json) {
        printf("\n");
        fprintf(stderr, "strata sample: %d tokens in %.3f s: %.2f tokens/s (prompt of %d tokens %.1f ms, then %.2f "
                "tokens/s)%s\n", res.n_new, res.prefill_s + res.decode_s, res.tokens_per_s, res.n_prompt,
                res.prefill_s * 1e3, res.decode_s > 0 && res.n_new > 1 ? (res.n_new - 1) / res.decode_s : 0.0,
                res.stopped ? "; stopped at the end-of-document token" : "");
    } else {
        printf("{\"from\":");
        st_fput_json_string(stdout, desc, strlen(desc));
        printf(",\"cache\":%s,\"prompt_tokens\":%d,\"new_tokens\":%d,\"prefill_s\":%.6f,\"decode_s\":%.6f,"
               "\"tokens_per_s\":%.3f,\"stopped\":%s,\"tokens\":[",
               o.no_cache ? "false" : "true", res.n_prompt, res.n_new, res.prefill_s, res.decode_s, res.tokens_per_s,
               res.stopped ? "true" : "false");
        for (int i = 0; i < res.n_new; i++) printf("%s%d", i ? "," : "", out[i]);
        printf("],\"text\":");
        char *txt = malloc((size_t)res.n_new * ST_TEXT_TOKEN_MAX + 1);
        size_t len = 0;
        if (txt)
            for (int i = 0; i < res.n_new; i++) len += st_text_decode(&text, out[i], txt + len, ST_TEXT_TOKEN_MAX);
        st_fput_json_string(stdout, txt ? txt : "", len);
        free(txt);
        printf("}\n");
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "strata sample: %s\n", err.msg[0] ? err.msg : "out of memory");
done:
    st_text_close(&text);
    free(prompt);
    free(out);
    st_model_free(m);
    st_backend_free(be);
    return rc;
}
