/* test_sample.c - the KV-cached decoder (strata/generate.h) against the model's own
 * forward over the whole prefix, for GPT-2 (the gpt2_tiny fixture's weights, and a
 * random gpt2-mini) and the Llama family (llama_tiny: GQA 4/2, untied head, Llama-3
 * rope scaling, q/k/v/o biases; qwen2_tiny: multi-query, q/k/v biases, tied; qwen3_tiny:
 * per-head q/k norm, head_dim != hidden/heads): at every generated position the logits
 * agree within 1e-5 of the largest reference logit, and greedy generation gives the
 * same tokens both ways. Also: a prompt prefilled in one step equals the same prompt
 * fed a token at a time; the sampler's properties (greedy is the argmax, top_k 1 and a
 * tiny top_p are greedy, a seed repeats its draws, draws follow the softmax); the byte
 * and token-id text hook.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "strata/generate.h"
#include "strata/llama.h"
#include "strata/safetensors.h"
#include "testutil.h"

/* max |a - b| / max |b| */
static double rel_diff(const float *a, const float *b, int n) {
    double d = 0, mx = 0;
    for (int i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        mx = fmax(mx, fabs((double)b[i]));
    }
    return mx > 0 ? d / mx : d;
}

/* Load every parameter of m from a fixture under its own (Hugging Face) name. */
static st_status load_fixture(st_model *m, const char *file, st_err *err) {
    st_safetensors *fx;
    char rel[256];
    snprintf(rel, sizeof rel, "tests/fixtures/%s", file);
    st_status s = st_safetensors_open(&fx, test_source_path(rel), err);
    if (s) return s;
    s = test_load_params(fx, m->tensors, m->n_tensors, m->n_params, m->be, m->params, err);
    st_safetensors_close(fx);
    return s;
}

/* Greedy decoding of n_new tokens after a prompt, with the cache and without: per-step
 * logits and tokens must agree; a one-step prefill must equal token-by-token feeding. */
static void check_model(const char *what, st_model *m, int n_prompt, int n_new) {
    st_err err = {0};
    int V = m->vocab_size, total = n_prompt + n_new;
    int32_t *seq = malloc(sizeof(int32_t) * total), *toks[2];
    float *lc = malloc(sizeof(float) * V), *lf = malloc(sizeof(float) * V), *l1 = malloc(sizeof(float) * V);
    st_rng rng;
    st_rng_seed(&rng, 7);
    for (int i = 0; i < n_prompt; i++) seq[i] = (int32_t)(st_rng_u64(&rng) % (uint64_t)V);
    st_gen *g = NULL, *g1 = NULL;
    if (st_gen_create(&g, m, total, &err) || st_gen_create(&g1, m, total, &err)) {
        CHECK(0, "%s: create: %s", what, err.msg);
        goto out;
    }
    /* the prompt in one step, and a token at a time */
    CHECK(st_gen_step(g, seq, n_prompt, lc, &err) == ST_OK, "%s: prefill: %s", what, err.msg);
    for (int i = 0; i < n_prompt; i++) CHECK(st_gen_step(g1, seq + i, 1, l1, &err) == ST_OK, "%s: step", what);
    double d1 = rel_diff(l1, lc, V);
    CHECK(d1 <= 1e-5, "%s: prefill in one step vs token by token: logits differ by %.3g relative", what, d1);
    double worst = 0;
    int len = n_prompt;
    for (int i = 0; i < n_new; i++) {
        if (st_gen_full_forward(m, seq, len, lf, &err)) {
            CHECK(0, "%s: full forward: %s", what, err.msg);
            break;
        }
        double d = rel_diff(lc, lf, V);
        worst = fmax(worst, d);
        CHECK(d <= 1e-5, "%s: position %d: cached logits differ from the full forward by %.3g relative", what, len - 1,
              d);
        st_sampler greedy = {0, 0, 1};
        int32_t a = st_sample(lc, V, &greedy, &rng, NULL), b = st_sample(lf, V, &greedy, &rng, NULL);
        CHECK(a == b, "%s: position %d: greedy token %d with the cache, %d without", what, len - 1, a, b);
        seq[len++] = b;
        if (i + 1 < n_new && st_gen_step(g, &b, 1, lc, &err)) {
            CHECK(0, "%s: step: %s", what, err.msg);
            break;
        }
    }
    CHECK(st_gen_pos(g) == total - 1, "%s: %d positions cached, expected %d", what, st_gen_pos(g), total - 1);
    int32_t extra[2] = {0, 0};
    CHECK(st_gen_step(g, extra, 2, lc, &err) == ST_ERR_INVALID, "%s: a step past the cache is refused", what);
    /* the loop itself: the same greedy tokens with and without the cache */
    toks[0] = malloc(sizeof(int32_t) * n_new);
    toks[1] = malloc(sizeof(int32_t) * n_new);
    st_generate_result res[2];
    for (int pass = 0; pass < 2; pass++) {
        st_generate_config gc = {.max_new = n_new, .sampler = {0, 0, 1}, .seed = 1, .no_cache = pass, .stop_token = -1};
        CHECK(st_generate(m, seq, n_prompt, &gc, NULL, NULL, toks[pass], &res[pass], &err) == ST_OK,
              "%s: generate: %s", what, err.msg);
    }
    CHECK(res[0].n_new == n_new && res[1].n_new == n_new, "%s: %d and %d tokens generated", what, res[0].n_new,
          res[1].n_new);
    CHECK(!memcmp(toks[0], toks[1], sizeof(int32_t) * n_new) && !memcmp(toks[0], seq + n_prompt, sizeof(int32_t) * n_new),
          "%s: st_generate's greedy tokens differ between the cache and the full forward", what);
    printf("%-24s %2d prompt + %2d new tokens: worst logit difference %.2e of the largest logit\n", what, n_prompt,
           n_new, worst);
    free(toks[0]);
    free(toks[1]);
out:
    st_gen_free(g);
    st_gen_free(g1);
    free(seq);
    free(lc);
    free(lf);
    free(l1);
}

static void check_llama_fixture(st_backend *be, const char *preset, const char *file) {
    st_err err = {0};
    st_llama_config cfg;
    st_model *m = NULL;
    if (st_llama_config_preset(preset, &cfg, &err) || st_model_create_llama(&m, &cfg, be, &err) ||
        load_fixture(m, file, &err)) {
        CHECK(0, "%s: %s", file, err.msg);
    } else {
        check_model(file, m, 5, cfg.max_seq - 5);
    }
    st_model_free(m);
}

static void check_sampler(void) {
    enum { V = 50 };
    float logits[V], scratch[2 * V];
    for (int i = 0; i < V; i++) logits[i] = (float)((i * 37) % V) * 0.1f; /* largest at i with i*37 % 50 == 49 */
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    st_rng r1, r2;
    st_rng_seed(&r1, 5);
    st_rng_seed(&r2, 5);
    st_sampler greedy = {0, 0, 1}, topk1 = {1.5f, 1, 1}, topp = {1.0f, 0, 1e-6f}, full = {1.0f, 0, 1}, mix = {0.7f, 10, 0.9f};
    CHECK(st_sample(logits, V, &greedy, &r1, scratch) == best, "greedy is the argmax");
    CHECK(st_sample(logits, V, &topk1, &r1, scratch) == best, "top_k 1 is greedy");
    CHECK(st_sample(logits, V, &topp, &r1, scratch) == best, "a tiny top_p is greedy");
    st_rng_seed(&r1, 5);
    int same = 1, in_top10 = 1;
    for (int i = 0; i < 200; i++) {
        int a = st_sample(logits, V, &mix, &r1, scratch), b = st_sample(logits, V, &mix, &r2, scratch);
        same &= a == b;
        int rank = 0;
        for (int j = 0; j < V; j++) rank += logits[j] > logits[a];
        in_top10 &= rank < 10;
    }
    CHECK(same, "the same seed draws the same tokens");
    CHECK(in_top10, "top_k 10 draws only from the 10 largest logits");
    /* temperature 1 draws follow the softmax: the frequency of the best token */
    double z = 0;
    for (int i = 0; i < V; i++) z += exp(logits[i] - logits[best]);
    int hits = 0, n = 20000;
    for (int i = 0; i < n; i++) hits += st_sample(logits, V, &full, &r1, scratch) == best;
    double p = 1.0 / z, sd = sqrt(p * (1 - p) / n);
    CHECK(fabs((double)hits / n - p) < 5 * sd, "best token drawn %.4f of the time, softmax says %.4f",
          (double)hits / n, p);
    st_err err = {0};
    st_sampler bad[] = {{-1, 0, 1}, {1, -2, 1}, {1, 0, 0}, {1, 0, 1.5f}, {NAN, 0, 1}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(st_sampler_validate(&bad[i], &err) == ST_ERR_INVALID, "bad sampler %zu refused", i);
}

static void check_text(void) {
    st_err err = {0};
    st_text t;
    int32_t *tok;
    int n;
    char buf[32];
    CHECK(st_text_open(&t, 257, NULL, &err) == ST_OK && t.kind == ST_TEXT_BYTES && t.eod == 256, "257: bytes, eod 256");
    CHECK(st_text_encode(&t, "hi\xc3\xa9", &tok, &n, &err) == ST_OK && n == 4 && tok[0] == 'h' && tok[3] == 0xa9,
          "bytes encode");
    free(tok);
    CHECK(st_text_decode(&t, 'x', buf, sizeof buf) == 1 && buf[0] == 'x', "byte decode");
    CHECK(st_text_decode(&t, 256, buf, sizeof buf) == 0, "end of document decodes to nothing");
    CHECK(st_text_open(&t, 50257, NULL, &err) == ST_OK && t.kind == ST_TEXT_IDS, "50257: token ids");
    CHECK(st_text_encode(&t, "50256, 464 318", &tok, &n, &err) == ST_OK && n == 3 && tok[0] == 50256 && tok[2] == 318,
          "ids encode");
    free(tok);
    CHECK(st_text_encode(&t, "12 99999", &tok, &n, &err) == ST_ERR_INVALID && strstr(err.msg, "99999"),
          "an id outside the vocabulary is refused: %s", err.msg);
    CHECK(st_text_encode(&t, "hello", &tok, &n, &err) == ST_ERR_INVALID, "text for a vocabulary without tokenizer");
    CHECK(st_text_decode(&t, 464, buf, sizeof buf) == 4 && !strcmp(buf, " 464"), "id decode '%s'", buf);
}

int main(void) {
    st_err err = {0};
    st_backend *be;
    if (st_backend_cpu_create(&be, 0, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    st_model *m = NULL;
    /* the gpt2_tiny fixture's shape */
    st_model_overrides tiny = {.vocab_size = 64, .max_seq = 16, .n_layer = 2, .n_head = 4, .n_embd = 32};
    if (st_model_create(&m, "gpt2-tiny", &tiny, be, &err) || load_fixture(m, "gpt2_tiny.safetensors", &err))
        CHECK(0, "gpt2_tiny: %s", err.msg);
    else
        check_model("gpt2_tiny.safetensors", m, 5, 11);
    st_model_free(m);
    if (st_model_create(&m, "gpt2-mini", NULL, be, &err)) {
        CHECK(0, "gpt2-mini: %s", err.msg);
    } else {
        m->ops->init_random(m, 1);
        check_model("gpt2-mini (random)", m, 9, 24);
    }
    st_model_free(m);
    check_llama_fixture(be, "llama-tiny", "llama_tiny.safetensors");
    check_llama_fixture(be, "qwen2-tiny", "qwen2_tiny.safetensors");
    check_llama_fixture(be, "qwen3-tiny", "qwen3_tiny.safetensors");
    check_sampler();
    check_text();
    st_backend_free(be);
    return test_finish("sample");
}
