/* test_config_numbers.c - numbers that do not fit: seeds of 2^63 and above survive a
 * save and a load, integer keys are range-checked against their C type (nothing is
 * truncated), non-finite numbers in a Hugging Face config.json are refused by field,
 * config.json is never written with a number JSON cannot hold, and the run-config reader
 * refuses what it used to guess at (an empty file, a huge file, duplicate keys,
 * trailing bytes). */
#include <json-c/json.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "strata/llama.h"
#include "strata/safetensors.h"
#include "strata/store.h"
#include "strata/train.h"
#include "testutil.h"

static char path[700];

static void write_file(const char *text) {
    FILE *f = fopen(path, "wb");
    fputs(text, f);
    fclose(f);
}

/* Load `text` as a run configuration; 1 when refused with every needle in the message. */
static int load_refused(const char *text, const char *n1, const char *n2, char *msg, size_t cap) {
    write_file(text);
    st_train_config c;
    st_train_config_defaults(&c);
    st_err err = {0};
    st_status s = st_train_config_load_json(&c, path, &err);
    snprintf(msg, cap, "%s", s ? err.msg : "(accepted)");
    return s != ST_OK && strstr(err.msg, n1) && (!n2 || strstr(err.msg, n2));
}

static int set_refused(const char *key, const char *value, const char *n1, const char *n2, char *msg, size_t cap) {
    st_train_config c;
    st_train_config_defaults(&c);
    st_err err = {0};
    st_status s = st_train_config_set(&c, key, value, &err);
    snprintf(msg, cap, "%s", s ? err.msg : "(accepted)");
    return s == ST_ERR_INVALID && strstr(err.msg, key) && strstr(err.msg, n1) && (!n2 || strstr(err.msg, n2));
}

static void seeds(void) {
    char msg[1024];
    const char *ok[] = {"9223372036854775808", "18446744073709551615", "0"};
    const uint64_t want[] = {9223372036854775808ull, UINT64_MAX, 0};
    for (int i = 0; i < 3; i++) {
        st_train_config c, d;
        st_train_config_defaults(&c);
        st_err err = {0};
        CHECK(st_train_config_set(&c, "seed", ok[i], &err) == ST_OK && c.seed == want[i], "set seed %s: %s", ok[i],
              err.msg);
        CHECK(st_train_config_save_json(&c, path, &err) == ST_OK, "save: %s", err.msg);
        st_train_config_defaults(&d);
        st_status s = st_train_config_load_json(&d, path, &err);
        CHECK(s == ST_OK && d.seed == want[i], "seed %s saved and loaded back: %s (got %llu)", ok[i],
              s ? err.msg : "ok", (unsigned long long)d.seed);
    }
    CHECK(set_refused("seed", "18446744073709551616", "2^64-1", "18446744073709551616", msg, sizeof msg),
          "seed 2^64: %s", msg);
    CHECK(set_refused("seed", "99999999999999999999999", "2^64-1", NULL, msg, sizeof msg), "seed 1e23: %s", msg);
    /* json-c reads 2^64 as 2^64-1 without a word: the reader must see the text */
    CHECK(load_refused("{\"seed\": 18446744073709551616}", "seed", "2^64-1", msg, sizeof msg), "json seed 2^64: %s",
          msg);
}

static void integer_ranges(void) {
    char msg[1024];
    /* the case: 4294967553 = 2^32 + 257 trained with 257 */
    CHECK(set_refused("vocab_size", "4294967553", "4294967553", "2147483647", msg, sizeof msg), "vocab_size: %s", msg);
    CHECK(set_refused("max_seq", "2147483648", "2147483648", "2147483647", msg, sizeof msg), "max_seq: %s", msg);
    CHECK(set_refused("batch", "4294967297", "4294967297", "1048576", msg, sizeof msg), "batch: %s", msg);
    CHECK(set_refused("n_layer", "-4294967295", "-4294967295", "[0, 4096]", msg, sizeof msg), "n_layer: %s", msg);
    CHECK(set_refused("threads", "99999999999999999999", "99999999999999999999", "4096", msg, sizeof msg),
          "threads: %s", msg);
    CHECK(set_refused("steps", "9223372036854775808", "9223372036854775808", "outside", msg, sizeof msg), "steps: %s",
          msg);
    CHECK(set_refused("steps", "1e3", "not", NULL, msg, sizeof msg), "steps 1e3: %s", msg);
    st_train_config c;
    st_train_config_defaults(&c);
    st_err err = {0};
    CHECK(st_train_config_set(&c, "vocab_size", "2147483647", &err) == ST_OK && c.vocab_size == 2147483647,
          "vocab_size INT_MAX is an int: %s", err.msg);
    CHECK(load_refused("{\"vocab_size\": 4294967553}", "vocab_size", "2147483647", msg, sizeof msg),
          "json vocab_size: %s", msg);
    CHECK(load_refused("{\"steps\": 99999999999999999999}", "steps", "99999999999999999999", msg, sizeof msg),
          "json steps beyond 64 bits: %s", msg);
}

static void reader(void) {
    char msg[1024];
    CHECK(load_refused("", "empty", NULL, msg, sizeof msg), "empty file: %s", msg);
    CHECK(load_refused(" \n\t ", "empty", NULL, msg, sizeof msg), "blank file: %s", msg);
    CHECK(load_refused("{\"steps\": 10, \"lr\": 0.001, \"steps\": 20}", "'steps'", "twice", msg, sizeof msg),
          "duplicate key: %s", msg);
    /* the last used to win even after a wrong type */
    CHECK(load_refused("{\"steps\": \"ten\", \"steps\": 20}", "steps", NULL, msg, sizeof msg), "duplicate key: %s", msg);
    CHECK(load_refused("{\"steps\": 10} x", "trailing", "offset 14", msg, sizeof msg), "trailing garbage: %s", msg);
    CHECK(load_refused("{\"steps\": 10}{}", "trailing", "offset 13", msg, sizeof msg), "second object: %s", msg);
    CHECK(load_refused("[1, 2]", "object", NULL, msg, sizeof msg), "array: %s", msg);
    CHECK(load_refused("{\"lr\": NaN}", "lr", NULL, msg, sizeof msg), "NaN: %s", msg);
    CHECK(load_refused("{\"steps\": 10,", path, NULL, msg, sizeof msg), "cut short: %s", msg);
    /* the size cap: a 2 MiB value is refused by size, at once, naming the cap */
    size_t big = 2u << 20;
    char *t = malloc(big + 32);
    snprintf(t, 32, "{\"data\": \"");
    memset(t + strlen(t), 'x', big);
    snprintf(t + 10 + big, 22, "\"}");
    clock_t t0 = clock();
    CHECK(load_refused(t, "1 MiB", NULL, msg, sizeof msg), "2 MiB file: %s", msg);
    CHECK((double)(clock() - t0) / CLOCKS_PER_SEC < 0.5, "refusing 2 MiB took %.2f s",
          (double)(clock() - t0) / CLOCKS_PER_SEC);
    free(t);
    /* still fine: every key once, escapes in strings, any order */
    write_file("{ \"data\": \"emb\\u0065dded\", \"steps\": 7, \"lr\": 1e-3, \"seed\": 12 }\n");
    st_train_config c;
    st_train_config_defaults(&c);
    st_err err = {0};
    CHECK(st_train_config_load_json(&c, path, &err) == ST_OK && c.steps == 7 && c.lr == 1e-3 && c.seed == 12 &&
              !strcmp(c.data, "embedded"),
          "a good configuration: %s", err.msg);
}

static const char *llama_json(const char *extra) {
    static char buf[2048];
    snprintf(buf, sizeof buf,
             "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": 256, "
             "\"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
             "\"num_key_value_heads\": 2, \"max_position_embeddings\": 128, \"hidden_act\": \"silu\"%s}",
             extra);
    return buf;
}

static void hf_numbers(void) {
    st_llama_config c;
    st_err err = {0};
    CHECK(st_hf_config_parse(llama_json(""), "t/config.json", &c, &err) == ST_OK, "base config: %s", err.msg);
    struct { const char *extra, *field; } bad[] = {
        {", \"rms_norm_eps\": 1e999", "rms_norm_eps"},
        {", \"rms_norm_eps\": NaN", "rms_norm_eps"},
        {", \"rope_theta\": Infinity", "rope_theta"},
        {", \"rope_theta\": -Infinity", "rope_theta"},
        {", \"attention_dropout\": NaN", "attention_dropout"},
        {", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": Infinity, \"low_freq_factor\": 1.0, "
         "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 64}", "factor"},
        {", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
         "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 1e300}", "original_max_position_embeddings"},
        {", \"vocab_size\": 99999999999999999999", "vocab_size"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        st_err e = {0};
        /* a later duplicate key wins in json-c: the bad value is the one read */
        st_status s = st_hf_config_parse(llama_json(bad[i].extra), "t/config.json", &c, &e);
        CHECK(s != ST_OK && strstr(e.msg, bad[i].field) && strstr(e.msg, "t/config.json"), "%s: %s", bad[i].extra,
              s ? e.msg : "(accepted)");
    }
    /* --save_hf's config.json: never a number JSON cannot hold */
    CHECK(st_hf_config_parse(llama_json(""), "t/config.json", &c, &err) == ST_OK, "base config: %s", err.msg);
    double vals[] = {INFINITY, -INFINITY, NAN};
    for (int i = 0; i < 3; i++)
        for (int f = 0; f < 2; f++) {
            st_llama_config d = c;
            if (f) d.rope_theta = vals[i];
            else d.rms_norm_eps = vals[i];
            char *text = st_hf_config_to_json(&d, "float32");
            int valid = 1;
            if (text) {
                json_tokener *tok = json_tokener_new();
                json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
                json_object *o = json_tokener_parse_ex(tok, text, (int)strlen(text));
                /* json-c's strict mode still reads NaN and Infinity: look for them too */
                valid = o && !strstr(text, "nan") && !strstr(text, "inf") && !strstr(text, "NaN") &&
                        !strstr(text, "Infinity");
                if (o) json_object_put(o);
                json_tokener_free(tok);
            }
            CHECK(valid, "config.json with %s = %g is not JSON:\n%s", f ? "rope_theta" : "rms_norm_eps", vals[i],
                  text ? text : "");
            free(text);
        }
}

/* A probe profile's bandwidths: Infinity or 1e999 would send every subgroup to one path. */
static void profile_numbers(void) {
    const char *paths[2] = {"/a", "/b"};
    const char *bad[] = {"{\"paths\": [{\"path\": \"/a\", \"mixed_gbps\": 1e999}, {\"path\": \"/b\", \"mixed_gbps\": 1}]}",
                         "{\"paths\": [{\"path\": \"/a\", \"mixed_gbps\": 1}, {\"path\": \"/b\", \"read_gbps\": NaN, "
                         "\"write_gbps\": 2}]}",
                         "{\"paths\": [{\"path\": \"/a\", \"mixed_gbps\": 1}, {\"path\": \"/b\", \"mixed_gbps\": \"fast\"}]}"};
    const char *field[] = {"mixed_gbps", "read_gbps", "mixed_gbps"}, *path_named[] = {"'/a'", "'/b'", "'/b'"};
    for (int i = 0; i < 3; i++) {
        write_file(bad[i]);
        double w[2];
        st_err err = {0};
        st_status s = st_store_weights_from_profile(path, paths, 2, w, &err);
        CHECK(s != ST_OK && strstr(err.msg, field[i]) && strstr(err.msg, path_named[i]), "profile %s: %s (w %g %g)",
              bad[i], s ? err.msg : "(accepted)", w[0], w[1]);
    }
}

/* safetensors data_offsets: json-c reads "8" and 8.5 as 8; an offset is an integer. */
static void safetensors_offsets(void) {
    const char *hdr[] = {"{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8.5]}}",
                         "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[\"0\",\"8\"]}}",
                         "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}"};
    for (int i = 0; i < 3; i++) {
        uint64_t h = strlen(hdr[i]);
        FILE *f = fopen(path, "wb");
        fwrite(&h, 8, 1, f);
        fwrite(hdr[i], 1, h, f);
        fwrite("\0\0\0\0\0\0\0\0", 1, 8, f);
        fclose(f);
        st_safetensors *st = NULL;
        st_err err = {0};
        st_status s = st_safetensors_open(&st, path, &err);
        if (i < 2)
            CHECK(s != ST_OK && strstr(err.msg, "data_offsets"), "%s: %s", hdr[i], s ? err.msg : "(accepted)");
        else
            CHECK(s == ST_OK, "%s: %s", hdr[i], err.msg);
        st_safetensors_close(st);
    }
}

int main(void) {
    snprintf(path, sizeof path, "%s/config.json", test_tmpdir());
    seeds();
    integer_ranges();
    reader();
    hf_numbers();
    profile_numbers();
    safetensors_offsets();
    return test_finish("config_numbers");
}
