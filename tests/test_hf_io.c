/* test_hf_io.c - Hugging Face model directories: config.json parsing (every supported
 * architecture, and a clear error naming the field for each unsupported option), weights
 * written and read back bit-identically (one file and sharded, F32; BF16 and F16 equal to
 * the rounded values), broken directories rejected with a message (a failed load leaving the
 * weights as they were, read in place or staged), and, where the system
 * Python has torch, strata's directory loaded by tools/gen_fixtures.py --check-hf (its
 * own reader and model) with logits compared to strata's (1e-4 relative + 1e-4 absolute).
 */
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "strata/llama.h"
#include "strata/safetensors.h"
#include "testutil.h"

static st_backend *be;

static float *params_host(const st_llama_model *m) {
    float *h = malloc(m->n_params * sizeof(float));
    m->be->ops->copy_to_host(m->be, h, m->params, m->n_params * sizeof(float));
    return h;
}

static int configs_equal(const st_llama_config *a, const st_llama_config *b) {
    return !strcmp(a->model_type, b->model_type) && a->vocab_size == b->vocab_size &&
           a->hidden_size == b->hidden_size && a->intermediate_size == b->intermediate_size &&
           a->n_layer == b->n_layer && a->n_head == b->n_head && a->n_kv_head == b->n_kv_head &&
           a->head_dim == b->head_dim && a->max_seq == b->max_seq && a->rope_theta == b->rope_theta &&
           a->rope_llama3 == b->rope_llama3 && a->rope_factor == b->rope_factor &&
           a->rope_low_freq_factor == b->rope_low_freq_factor && a->rope_high_freq_factor == b->rope_high_freq_factor &&
           a->rope_original_max_pos == b->rope_original_max_pos && a->rms_norm_eps == b->rms_norm_eps &&
           a->qkv_bias == b->qkv_bias && a->o_bias == b->o_bias && a->qk_norm == b->qk_norm &&
           a->tie_word_embeddings == b->tie_word_embeddings && a->sliding_window == b->sliding_window;
}

/* Save m to dir in dtype (sharded when shard > 0), read config and weights back into a new
 * model; the parameters must equal m's rounded to dtype, bit for bit. */
static void round_trip(st_llama_model *m, const char *dir, st_dtype dtype, size_t shard, const char *what) {
    st_err err = {0};
    CHECK(st_llama_save_hf(m, dir, dtype, shard, &err) == ST_OK, "%s: save: %s", what, err.msg);
    char p[4096];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    int has_index = access(p, F_OK) == 0;
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    int has_single = access(p, F_OK) == 0;
    CHECK(has_index == (shard > 0) && has_single == (shard == 0), "%s: index %d single %d", what, has_index,
          has_single);
    st_llama_config c2;
    st_llama_model m2;
    if (st_hf_config_read(dir, &c2, &err)) {
        CHECK(0, "%s: config: %s", what, err.msg);
        return;
    }
    CHECK(configs_equal(&m->cfg, &c2), "%s: config.json does not round-trip", what);
    if (st_llama_create(&m2, &c2, be, &err) || st_llama_load_hf(&m2, dir, &err)) {
        CHECK(0, "%s: load: %s", what, err.msg);
        return;
    }
    float *a = params_host(m), *b = params_host(&m2);
    CHECK(m->n_params == m2.n_params, "%s: parameter count", what);
    if (dtype != ST_F32) { /* expected: each value rounded to dtype and widened back */
        void *tmp = malloc(m->n_params * 2);
        st_convert(tmp, dtype, a, ST_F32, m->n_params);
        st_convert(a, ST_F32, tmp, dtype, m->n_params);
        free(tmp);
    }
    CHECK(memcmp(a, b, m->n_params * sizeof(float)) == 0, "%s: parameters differ after the round trip", what);
    free(a), free(b);
    st_llama_free(&m2);
}

static void test_round_trips(void) {
    const char *presets[] = {"llama-tiny", "qwen2-tiny", "qwen3-tiny"};
    for (int i = 0; i < 3; i++) {
        st_err err = {0};
        st_llama_config cfg;
        st_llama_model m;
        if (st_llama_config_preset(presets[i], &cfg, &err) || st_llama_create(&m, &cfg, be, &err)) {
            CHECK(0, "%s: %s", presets[i], err.msg);
            continue;
        }
        st_llama_init_random(&m, 7 + i);
        /* non-trivial norm weights and biases, so a swapped tensor would show */
        float *h = params_host(&m);
        for (size_t j = 0; j < m.n_params; j++) h[j] += 1e-3f * (float)(j % 97);
        m.be->ops->copy_to_device(m.be, m.params, h, m.n_params * sizeof(float));
        free(h);
        char dir[4096], what[128];
        snprintf(dir, sizeof dir, "%s/%s", test_tmpdir(), presets[i]);
        snprintf(what, sizeof what, "%s f32 single file", presets[i]);
        round_trip(&m, dir, ST_F32, 0, what);
        snprintf(what, sizeof what, "%s f32 sharded (16 KiB shards)", presets[i]);
        round_trip(&m, dir, ST_F32, 16 << 10, what); /* over the single file: it must go */
        snprintf(what, sizeof what, "%s bf16 single after sharded", presets[i]);
        round_trip(&m, dir, ST_BF16, 0, what);       /* and the stale index must go too */
        snprintf(what, sizeof what, "%s f16 sharded", presets[i]);
        round_trip(&m, dir, ST_F16, 20 << 10, what);
        st_llama_free(&m);
    }
}

/* ---------------------------------------------------------------- config.json */

static const char *base_cfg =
    "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", \"vocab_size\": 64, \"hidden_size\": 32, "
    "\"intermediate_size\": 48, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
    "\"max_position_embeddings\": 128, \"rms_norm_eps\": 1e-06, \"rope_theta\": 10000.0, \"hidden_act\": \"silu\", "
    "\"tie_word_embeddings\": %s %s}";

/* Parse base_cfg with the given architecture and extra fields; expect success (want NULL)
 * or an error whose message contains want. */
static void expect_cfg(const char *arch, const char *type, const char *tied, const char *extra, const char *want,
                       st_llama_config *out) {
    char text[2048];
    snprintf(text, sizeof text, base_cfg, arch, type, tied, extra);
    st_err err = {0};
    st_llama_config c;
    st_status s = st_hf_config_parse(text, "test/config.json", &c, &err);
    if (!want) {
        CHECK(s == ST_OK, "config %s %s should parse: %s", arch, extra, err.msg);
        if (out) *out = c;
    } else {
        CHECK(s != ST_OK && strstr(err.msg, want) && strstr(err.msg, "test/config.json"),
              "config %s %s: want an error naming '%s', got '%s'", arch, extra, want, s ? err.msg : "success");
    }
}

static void test_config_parse(void) {
    st_llama_config c;
    expect_cfg("LlamaForCausalLM", "llama", "false", "", NULL, &c);
    CHECK(c.head_dim == 8 && c.n_kv_head == 2 && !c.qkv_bias && !c.o_bias && !c.qk_norm && !c.tie_word_embeddings &&
              !c.rope_llama3 && c.rms_norm_eps == 1e-6,
          "llama config fields");
    expect_cfg("LlamaForCausalLM", "llama", "true",
               ", \"attention_bias\": true, \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 32.0, "
               "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}",
               NULL, &c);
    CHECK(c.qkv_bias && c.o_bias && c.tie_word_embeddings && c.rope_llama3 && c.rope_factor == 32.0 &&
              c.rope_original_max_pos == 8192,
          "llama3 config fields");
    expect_cfg("Qwen2ForCausalLM", "qwen2", "true", ", \"use_sliding_window\": false, \"sliding_window\": 4096", NULL,
               &c);
    CHECK(c.qkv_bias && !c.o_bias && c.sliding_window == 0, "qwen2: q/k/v biases, no o bias, window off");
    expect_cfg("Qwen3ForCausalLM", "qwen3", "true", ", \"head_dim\": 16, \"attention_bias\": false", NULL, &c);
    CHECK(c.qk_norm && c.head_dim == 16 && !c.qkv_bias, "qwen3: q/k norm, explicit head_dim");
    expect_cfg("MistralForCausalLM", "mistral", "false", ", \"sliding_window\": null", NULL, &c);
    CHECK(c.sliding_window == 0, "mistral without a window");
    expect_cfg("MistralForCausalLM", "mistral", "false", ", \"sliding_window\": 16", NULL, &c);
    CHECK(c.sliding_window == 16, "mistral window 16");
    /* a window shorter than the sequence is refused when the activations are sized */
    st_llama_model m;
    st_err err = {0};
    c.vocab_size = 64;
    if (st_llama_create(&m, &c, be, &err) == ST_OK) {
        CHECK(st_llama_alloc_acts(&m, 1, 32, &err) != ST_OK && strstr(err.msg, "sliding_window"),
              "seq 32 > sliding_window 16 must be refused naming the field: %s", err.msg);
        CHECK(st_llama_alloc_acts(&m, 1, 16, &err) == ST_OK, "seq 16 within the window: %s", err.msg);
        st_llama_free(&m);
    }

    /* unsupported architectures and options: the message names the field */
    expect_cfg("GPTNeoXForCausalLM", "gpt_neox", "false", "", "architectures", NULL);
    expect_cfg("LlamaForCausalLM", "qwen2", "false", "", "model_type", NULL);
    expect_cfg("LlamaForCausalLM", "llama", "false", ", \"hidden_act\": \"gelu\"", "hidden_act", NULL);
    expect_cfg("LlamaForCausalLM", "llama", "false", ", \"mlp_bias\": true", "mlp_bias", NULL);
    expect_cfg("LlamaForCausalLM", "llama", "false", ", \"attention_dropout\": 0.1", "attention_dropout", NULL);
    expect_cfg("LlamaForCausalLM", "llama", "false", ", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0}",
               "rope_scaling", NULL);
    expect_cfg("LlamaForCausalLM", "llama", "false", ", \"rope_scaling\": {\"rope_type\": \"llama3\"}",
               "rope_scaling", NULL);
    expect_cfg("LlamaForCausalLM", "llama", "false", ", \"partial_rotary_factor\": 0.5", "partial_rotary_factor",
               NULL);
    expect_cfg("LlamaForCausalLM", "llama", "false", ", \"num_key_value_heads\": 3", "num_key_value_heads", NULL);
    expect_cfg("LlamaForCausalLM", "llama", "false", ", \"hidden_size\": \"32\"", "hidden_size", NULL);
    expect_cfg("LlamaForCausalLM", "llama", "\"yes\"", "", "tie_word_embeddings", NULL);
    st_err e2 = {0};
    CHECK(st_hf_config_parse("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 32}", "x/config.json", &c,
                          &e2) != ST_OK && strstr(e2.msg, "vocab_size"),
          "missing field must be named: %s", e2.msg);
    CHECK(st_hf_config_parse("{\"architectures\": [", "x/config.json", &c, &e2) != ST_OK && strstr(e2.msg, "JSON"),
          "broken JSON: %s", e2.msg);
}

/* Released checkpoints' config.json files (as published on the Hugging Face hub) parse to
 * strata's presets of the same shape, field for field. */
static const char *qwen25_05b_json =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"attention_dropout\": 0.0, \"bos_token_id\": 151643, "
    "\"eos_token_id\": 151643, \"hidden_act\": \"silu\", \"hidden_size\": 896, \"initializer_range\": 0.02, "
    "\"intermediate_size\": 4864, \"max_position_embeddings\": 32768, \"max_window_layers\": 24, "
    "\"model_type\": \"qwen2\", \"num_attention_heads\": 14, \"num_hidden_layers\": 24, "
    "\"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, \"sliding_window\": 32768, "
    "\"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.40.1\", "
    "\"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151936}";
static const char *llama32_1b_json =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0, "
    "\"bos_token_id\": 128000, \"eos_token_id\": 128001, \"head_dim\": 64, \"hidden_act\": \"silu\", "
    "\"hidden_size\": 2048, \"initializer_range\": 0.02, \"intermediate_size\": 8192, "
    "\"max_position_embeddings\": 131072, \"mlp_bias\": false, \"model_type\": \"llama\", "
    "\"num_attention_heads\": 32, \"num_hidden_layers\": 16, \"num_key_value_heads\": 8, \"pretraining_tp\": 1, "
    "\"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"factor\": 32.0, \"high_freq_factor\": 4.0, "
    "\"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}, "
    "\"rope_theta\": 500000.0, \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", "
    "\"transformers_version\": \"4.45.0.dev0\", \"use_cache\": true, \"vocab_size\": 128256}";
static const char *qwen3_06b_json =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0, "
    "\"head_dim\": 128, \"hidden_act\": \"silu\", \"hidden_size\": 1024, \"intermediate_size\": 3072, "
    "\"max_position_embeddings\": 40960, \"max_window_layers\": 28, \"model_type\": \"qwen3\", "
    "\"num_attention_heads\": 16, \"num_hidden_layers\": 28, \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-06, "
    "\"rope_scaling\": null, \"rope_theta\": 1000000, \"sliding_window\": null, \"tie_word_embeddings\": true, "
    "\"torch_dtype\": \"bfloat16\", \"use_sliding_window\": false, \"vocab_size\": 151936}";
static const char *mistral_7b_json =
    "{\"architectures\": [\"MistralForCausalLM\"], \"bos_token_id\": 1, \"eos_token_id\": 2, "
    "\"hidden_act\": \"silu\", \"hidden_size\": 4096, \"initializer_range\": 0.02, \"intermediate_size\": 14336, "
    "\"max_position_embeddings\": 32768, \"model_type\": \"mistral\", \"num_attention_heads\": 32, "
    "\"num_hidden_layers\": 32, \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, "
    "\"sliding_window\": 4096, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", "
    "\"transformers_version\": \"4.34.0.dev0\", \"use_cache\": true, \"vocab_size\": 32000}";

static void test_released_configs(void) {
    st_err err = {0};
    st_llama_config c, p;
    CHECK(st_hf_config_parse(qwen25_05b_json, "Qwen2.5-0.5B", &c, &err) == ST_OK, "%s", err.msg);
    CHECK(st_llama_config_preset("qwen2.5-0.5b", &p, &err) == ST_OK && configs_equal(&c, &p),
          "Qwen2.5-0.5B config.json != preset qwen2.5-0.5b");
    CHECK(st_llama_param_count(&c) == 494032768, "Qwen2.5-0.5B has 494,032,768 parameters, got %zu",
          st_llama_param_count(&c));
    CHECK(st_hf_config_parse(llama32_1b_json, "Llama-3.2-1B", &c, &err) == ST_OK, "%s", err.msg);
    CHECK(st_llama_config_preset("llama3.2-1b", &p, &err) == ST_OK && configs_equal(&c, &p),
          "Llama-3.2-1B config.json != preset llama3.2-1b");
    CHECK(st_llama_param_count(&c) == 1235814400, "Llama-3.2-1B has 1,235,814,400 parameters, got %zu",
          st_llama_param_count(&c));
    CHECK(st_hf_config_parse(qwen3_06b_json, "Qwen3-0.6B", &c, &err) == ST_OK, "%s", err.msg);
    CHECK(c.qk_norm && c.head_dim == 128 && !c.qkv_bias && c.sliding_window == 0 &&
              st_llama_param_count(&c) == 596049920,
          "Qwen3-0.6B: q/k norm, head_dim 128, 596,049,920 parameters (got %zu)", st_llama_param_count(&c));
    CHECK(st_hf_config_parse(mistral_7b_json, "Mistral-7B-v0.1", &c, &err) == ST_OK, "%s", err.msg);
    CHECK(c.sliding_window == 4096 && !c.tie_word_embeddings && st_llama_param_count(&c) == 7241732096,
          "Mistral-7B: window 4096, untied, 7,241,732,096 parameters (got %zu)", st_llama_param_count(&c));
}

static void test_overrides(void) {
    st_err err = {0};
    st_llama_config c;
    st_llama_config_preset("qwen2.5-0.5b", &c, &err);
    st_model_overrides ov = {.vocab_size = 256, .max_seq = 64, .n_layer = 2, .n_head = 4, .n_embd = 128};
    CHECK(st_llama_config_apply_overrides(&c, &ov, &err) == ST_OK && c.vocab_size == 256 && c.max_seq == 64 &&
              c.n_layer == 2 && c.n_head == 4 && c.hidden_size == 128 && c.head_dim == 32 && c.n_kv_head == 2 &&
              c.qkv_bias && c.tie_word_embeddings,
          "overrides on qwen2.5-0.5b: %s", err.msg);
    st_llama_config_preset("qwen2.5-0.5b", &c, &err);
    st_model_overrides bad = {.n_head = 7, .n_embd = 896};
    CHECK(st_llama_config_apply_overrides(&c, &bad, &err) != ST_OK && strstr(err.msg, "n_head"),
          "7 heads over 2 kv heads must be refused: %s", err.msg);
}

/* ---------------------------------------------------------------- broken directories */

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void expect_load_error(st_llama_model *m, const char *dir, const char *want, const char *what) {
    st_err err = {0};
    st_status s = st_llama_load_hf(m, dir, &err);
    CHECK(s != ST_OK && strstr(err.msg, want), "%s: want an error naming '%s', got '%s'", what, want,
          s ? err.msg : "success");
}

static void test_broken_dirs(void) {
    st_err err = {0};
    st_llama_config cfg, cq;
    st_llama_model m, mq;
    if (st_llama_config_preset("llama-tiny", &cfg, &err) || st_llama_create(&m, &cfg, be, &err) ||
        st_llama_config_preset("qwen2-tiny", &cq, &err) || st_llama_create(&mq, &cq, be, &err)) {
        CHECK(0, "setup: %s", err.msg);
        return;
    }
    st_llama_init_random(&m, 1);
    char dir[4096], p[4200];
    snprintf(dir, sizeof dir, "%s/broken", test_tmpdir());
    expect_load_error(&m, dir, "model.safetensors", "no directory");
    CHECK(st_llama_save_hf(&m, dir, ST_F32, 0, &err) == ST_OK, "save: %s", err.msg);
    /* a qwen2 model reading llama weights: its q/k/v biases are missing and lm_head is extra */
    /* llama-tiny has o_proj biases, which qwen2 does not: an unexpected tensor is named */
    expect_load_error(&mq, dir, "model.layers.0.self_attn.o_proj.bias", "llama weights into a qwen2 config");
    /* weights with a tensor removed: rewrite the file without the last layer's down_proj */
    st_llama_model m3;
    cfg.n_layer = 1;
    if (st_llama_create(&m3, &cfg, be, &err) == ST_OK) {
        char d1[4096];
        snprintf(d1, sizeof d1, "%s/one_layer", test_tmpdir());
        st_llama_save_hf(&m3, d1, ST_F32, 0, &err);
        expect_load_error(&m, d1, "model.layers.1.", "missing layer");
        st_llama_free(&m3);
    }
    /* sharded: the index names a shard file that is not there */
    CHECK(st_llama_save_hf(&m, dir, ST_F32, 8 << 10, &err) == ST_OK, "save sharded: %s", err.msg);
    glob_t g;
    snprintf(p, sizeof p, "%s/model-00002-of-*.safetensors", dir);
    if (glob(p, 0, NULL, &g) == 0 && g.gl_pathc == 1) {
        const char *base = strrchr(g.gl_pathv[0], '/') + 1;
        CHECK(strstr(base, "-of-00001") == NULL, "8 KiB shards of a 77 KiB model: %s", base);
        unlink(g.gl_pathv[0]);
        expect_load_error(&m, dir, base, "missing shard");
        globfree(&g);
    } else {
        CHECK(0, "no second shard matching %s", p);
    }
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    write_file(p, "{\"metadata\": {}, \"weight_map\": {\"model.norm.weight\": \"../x.safetensors\"}}");
    expect_load_error(&m, dir, "model.embed_tokens.weight", "index without an entry");
    write_file(p, "{\"weight_map\": []}");
    expect_load_error(&m, dir, "weight_map", "index without a weight_map object");
    /* a shard whose header lies: the safetensors reader's validation reaches through */
    CHECK(st_llama_save_hf(&m, dir, ST_F32, 0, &err) == ST_OK, "save: %s", err.msg);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    FILE *f = fopen(p, "r+b");
    if (f) { /* cut the file short: the data section no longer holds what the header says */
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        fclose(f);
        CHECK(truncate(p, len - 100) == 0, "truncate");
    }
    st_status s = st_llama_load_hf(&m, dir, &err);
    CHECK(s != ST_OK && strstr(err.msg, "model.safetensors"), "truncated weights: %s", s ? err.msg : "success");
    st_llama_free(&m);
    st_llama_free(&mq);
}

/* A load that fails at the last tensor in the layout (a shape the configuration does not
 * have) leaves the model's weights as they were, bit for bit, on the host backend (whose
 * loads read in place) and on a backend whose memory counts as a device's (the same ops under
 * another name: staged a tensor at a time); the good directory loads the same bits on both,
 * and init_random draws the same bits in place and staged. */
static void test_failed_load_keeps_weights(void) {
    st_err err = {0};
    st_llama_config cfg;
    st_llama_model src;
    st_backend_ops staged_ops = *be->ops;
    staged_ops.name = "staged"; /* st_backend_host_memory: 0 */
    st_backend staged = {&staged_ops, be->ctx};
    CHECK(!st_backend_host_memory(&staged) && st_backend_host_memory(be), "the staged backend is no host memory");
    if (st_llama_config_preset("llama-tiny", &cfg, &err) || st_llama_create(&src, &cfg, be, &err)) {
        CHECK(0, "setup: %s", err.msg);
        return;
    }
    st_llama_init_random(&src, 7);
    char good[4096], bad[4096], p[4200];
    snprintf(good, sizeof good, "%s/load_good", test_tmpdir());
    snprintf(bad, sizeof bad, "%s/load_bad_last", test_tmpdir());
    CHECK(st_llama_save_hf(&src, good, ST_F32, 0, &err) == ST_OK, "save: %s", err.msg);
    CHECK(st_llama_save_hf(&src, bad, ST_F32, 0, &err) == ST_OK, "save: %s", err.msg);
    float *want = params_host(&src);
    /* the bad directory: every tensor as saved but the last in the layout one row short */
    st_tensor_out *outs = calloc((size_t)src.n_tensors, sizeof *outs);
    int last = 0;
    for (int i = 0; i < src.n_tensors; i++) {
        const st_param_info *t = &src.tensors[i];
        outs[i] = (st_tensor_out){.name = t->name, .dtype = ST_F32, .ndim = t->ndim, .data = want + t->offset};
        outs[i].shape[0] = t->shape[0];
        outs[i].shape[1] = t->shape[1];
        if (t->offset > src.tensors[last].offset) last = i;
    }
    outs[last].shape[0]--;
    snprintf(p, sizeof p, "%s/model.safetensors", bad);
    CHECK(st_safetensors_write(p, outs, src.n_tensors, NULL, 0, &err) == ST_OK, "write: %s", err.msg);
    st_backend *bes[2] = {be, &staged};
    float *drawn[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        st_llama_model m;
        if (st_llama_create(&m, &cfg, bes[k], &err)) {
            CHECK(0, "create: %s", err.msg);
            break;
        }
        st_llama_init_random(&m, 8);
        drawn[k] = params_host(&m);
        st_status s = st_llama_load_hf(&m, bad, &err);
        CHECK(s != ST_OK && strstr(err.msg, src.tensors[last].name), "%s backend: the last tensor's shape refused: %s",
              bes[k]->ops->name, s ? err.msg : "success");
        float *after = params_host(&m);
        CHECK(memcmp(after, drawn[k], m.n_params * sizeof(float)) == 0,
              "%s backend: a failed load changed the weights", bes[k]->ops->name);
        free(after);
        CHECK(st_llama_load_hf(&m, good, &err) == ST_OK, "%s backend: load: %s", bes[k]->ops->name, err.msg);
        after = params_host(&m);
        CHECK(memcmp(after, want, m.n_params * sizeof(float)) == 0, "%s backend: loaded weights differ from saved",
              bes[k]->ops->name);
        free(after);
        if (k == 1 && drawn[0])
            CHECK(memcmp(drawn[0], drawn[1], m.n_params * sizeof(float)) == 0,
                  "init_random staged differs from init_random in place");
        st_llama_free(&m);
    }
    free(drawn[0]);
    free(drawn[1]);
    free(outs);
    free(want);
    st_llama_free(&src);
}

/* ---------------------------------------------------------------- st_model interface */

/* A Llama-family model behind st_model: created from an HF directory, one forward and
 * backward through the vtable, saved as one .safetensors and as a directory, and loaded
 * back into fresh models bit-identically. */
static void test_st_model(void) {
    st_err err = {0};
    st_llama_config cfg;
    st_llama_model src;
    if (st_llama_config_preset("qwen3-tiny", &cfg, &err) || st_llama_create(&src, &cfg, be, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    st_llama_init_random(&src, 3);
    char dir[4096], file[4200], dir2[4200];
    snprintf(dir, sizeof dir, "%s/st_model_src", test_tmpdir());
    CHECK(st_llama_save_hf(&src, dir, ST_F32, 0, &err) == ST_OK, "save: %s", err.msg);
    st_model *m = NULL, *m2 = NULL, *m3 = NULL;
    if (st_model_create_hf(&m, dir, be, &err)) {
        CHECK(0, "st_model_create_hf: %s", err.msg);
        st_llama_free(&src);
        return;
    }
    CHECK(st_model_llama(m) != NULL && m->n_params == src.n_params, "st_model wraps the llama model");
    char desc[256];
    m->ops->describe(m, desc, sizeof desc);
    CHECK(strstr(desc, "qwen3") && strstr(desc, "qk-norm"), "describe: %s", desc);
    int32_t in[16], tg[16];
    for (int i = 0; i < 16; i++) in[i] = (i * 7) % 64, tg[i] = (i * 5 + 1) % 64;
    CHECK(m->ops->alloc_acts(m, 2, 8, &err) == ST_OK, "acts: %s", err.msg);
    st_model_zero_grad(m);
    float loss = m->ops->forward(m, in, tg, 1.0f / 16);
    m->ops->backward(m);
    CHECK(fabsf(loss - logf(64.0f)) < 0.1f, "loss of a 0.02-initialised model %.4f, want ~ln 64", loss);
    snprintf(file, sizeof file, "%s/ckpt.safetensors", test_tmpdir());
    snprintf(dir2, sizeof dir2, "%s/st_model_dir", test_tmpdir());
    CHECK(m->ops->save(m, file, &err) == ST_OK, "save file: %s", err.msg);
    CHECK(m->ops->save(m, dir2, &err) == ST_OK, "save dir: %s", err.msg);
    if (st_model_create_llama(&m2, &cfg, be, &err) || st_model_create_llama(&m3, &cfg, be, &err)) {
        CHECK(0, "create: %s", err.msg);
    } else {
        CHECK(m2->ops->load(m2, file, &err) == ST_OK, "load file: %s", err.msg);
        CHECK(m3->ops->load(m3, dir2, &err) == ST_OK, "load dir: %s", err.msg);
        float *a = params_host(st_model_llama(m)), *b = params_host(st_model_llama(m2)), *c = params_host(st_model_llama(m3));
        CHECK(!memcmp(a, b, m->n_params * 4) && !memcmp(a, c, m->n_params * 4), "st_model save/load round trip");
        free(a), free(b), free(c);
        st_safetensors *st;
        if (st_safetensors_open(&st, file, &err) == ST_OK) {
            st_llama_config back;
            const char *cj = st_safetensors_meta(st, "config");
            CHECK(cj && st_hf_config_parse(cj, file, &back, &err) == ST_OK && configs_equal(&back, &cfg),
                  "the file's 'config' metadata describes the model");
            st_safetensors_close(st);
        }
    }
    st_model_free(m3);
    st_model_free(m2);
    st_model_free(m);
    st_llama_free(&src);
}

/* ---------------------------------------------------------------- inspect */

static void test_inspect(void) {
    st_err err = {0};
    st_llama_config cfg;
    st_llama_model m;
    if (st_llama_config_preset("qwen2-tiny", &cfg, &err) || st_llama_create(&m, &cfg, be, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    char dir[4096], want[128];
    snprintf(dir, sizeof dir, "%s/inspect", test_tmpdir());
    for (int sharded = 0; sharded < 2; sharded++) {
        CHECK(st_llama_save_hf(&m, dir, ST_BF16, sharded ? 12 << 10 : 0, &err) == ST_OK, "save: %s", err.msg);
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        st_status s = st_hf_inspect(dir, 2, 16, 8.0, f, &err);
        fclose(f);
        snprintf(want, sizeof want, "parameters %zu", m.n_params);
        CHECK(s == ST_OK && strstr(text, "qwen2") && strstr(text, "multi-query") && strstr(text, want) &&
                  strstr(text, "BF16 19712") && strstr(text, "activations") && !strstr(text, "WARNING"),
              "inspect (sharded %d) output:\n%s\n%s", sharded, text, s ? err.msg : "");
        free(text);
    }
    st_llama_free(&m);
}

/* ---------------------------------------------------------------- Python cross-check */

static void python_check(const char *fixture, st_dtype dtype, size_t shard) {
    st_err err = {0};
    st_safetensors *fx;
    char fpath[512];
    snprintf(fpath, sizeof fpath, "tests/fixtures/%s", fixture);
    if (st_safetensors_open(&fx, test_source_path(fpath), &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    st_llama_config cfg;
    st_llama_model m;
    const char *preset = st_safetensors_meta(fx, "preset");
    int B = atoi(st_safetensors_meta(fx, "B")), T = atoi(st_safetensors_meta(fx, "T"));
    if (!preset || st_llama_config_preset(preset, &cfg, &err) || st_llama_create(&m, &cfg, be, &err)) {
        CHECK(0, "%s: %s", fixture, err.msg);
        st_safetensors_close(fx);
        return;
    }
    /* the fixture's weights (an HF state dict), written by strata, read back by strata
     * (so bf16 rounding is in both), and the logits of the round-tripped model */
    float *host = malloc(m.n_params * sizeof(float));
    for (int i = 0; i < m.n_tensors; i++)
        st_safetensors_read_f32(fx, m.tensors[i].name, host + m.tensors[i].offset, m.tensors[i].numel, NULL, 0, &err);
    m.be->ops->copy_to_device(m.be, m.params, host, m.n_params * sizeof(float));
    free(host);
    char dir[4096], lpath[4200], cmd[9000];
    snprintf(dir, sizeof dir, "%s/py_%s_%s", test_tmpdir(), preset, st_dtype_name(dtype));
    CHECK(st_llama_save_hf(&m, dir, dtype, shard, &err) == ST_OK, "save: %s", err.msg);
    CHECK(st_llama_load_hf(&m, dir, &err) == ST_OK, "load: %s", err.msg);
    CHECK(st_llama_alloc_acts(&m, B, T, &err) == ST_OK, "acts: %s", err.msg);
    const int32_t *inputs = st_safetensors_data(fx, st_safetensors_find(fx, "inputs"));
    st_llama_forward(&m, inputs, NULL, 0.0f);
    st_tensor_out outs[2] = {{.name = "inputs", .dtype = ST_I32, .ndim = 2, .shape = {B, T}, .data = inputs},
                             {.name = "logits", .dtype = ST_F32, .ndim = 3, .shape = {B, T, cfg.vocab_size},
                              .data = st_llama_logits(&m)}};
    snprintf(lpath, sizeof lpath, "%s/strata_logits.safetensors", dir);
    CHECK(st_safetensors_write(lpath, outs, 2, NULL, 0, &err) == ST_OK, "write logits: %s", err.msg);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s' --check-hf '%s' '%s'", test_source_path("tools/gen_fixtures.py"),
             dir, lpath);
    int rc = system(cmd);
    CHECK(rc == 0, "python --check-hf of %s (%s, shard %zu) failed (status %d)", preset, st_dtype_name(dtype), shard,
          rc);
    st_llama_free(&m);
    st_safetensors_close(fx);
}

int main(void) {
    st_err err = {0};
    if (st_backend_cpu_create(&be, 0, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    test_config_parse();
    test_released_configs();
    test_overrides();
    test_round_trips();
    test_broken_dirs();
    test_failed_load_keeps_weights();
    test_inspect();
    test_st_model();
    if (system("/usr/bin/python3 -c 'import torch, numpy' >/dev/null 2>&1") == 0) {
        python_check("llama_tiny.safetensors", ST_F32, 0);
        python_check("qwen2_tiny.safetensors", ST_BF16, 16 << 10);
        python_check("qwen3_tiny.safetensors", ST_F16, 0);
    } else {
        printf("hf_io: /usr/bin/python3 with torch and numpy not found; skipping the Python cross-check\n");
    }
    st_backend_free(be);
    return test_finish("hf_io");
}
