/* hf_config.c - Hugging Face config.json to and from st_llama_config.
 *
 * Reads the fields that define the supported architectures (LlamaForCausalLM,
 * MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM) with transformers' defaults
 * where a field may be absent. Anything that would change the model's equations in a way
 * strata does not implement (another activation, rope_scaling other than llama3, MLP
 * biases, dropout in attention, partial rotary) is an error that names the field, so a
 * checkpoint is never trained as a different model than it is. Fields that do not change
 * the equations (token ids, torch_dtype, ...) are ignored.
 */
#include <errno.h>
#include <json-c/json.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/hf_internal.h"
#include "strata/llama.h"

typedef struct arch_info {
    const char *arch, *model_type;
    int qkv_bias_always; /* Qwen2: q/k/v biases are part of the architecture */
    int qk_norm;         /* Qwen3 */
} arch_info;

static const arch_info archs[] = {
    {"LlamaForCausalLM", "llama", 0, 0},
    {"MistralForCausalLM", "mistral", 0, 0},
    {"Qwen2ForCausalLM", "qwen2", 1, 0},
    {"Qwen3ForCausalLM", "qwen3", 0, 1},
};
#define N_ARCHS (int)(sizeof archs / sizeof archs[0])

static const char *supported_archs(void) {
    return "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM";
}

/* Field lookups: missing (or null) fields take the default; a present field of the wrong
 * type is an error naming it. */
static st_status get_int(json_object *o, const char *origin, const char *key, int required, int def, int *out,
                         st_err *err) {
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || json_object_is_type(v, json_type_null)) {
        if (required)
            return st_errf(err, ST_ERR_FORMAT, "%s: field '%s' is missing; a Llama-family config.json must set it",
                           origin, key);
        *out = def;
        return ST_OK;
    }
    if (!json_object_is_type(v, json_type_int))
        return st_errf(err, ST_ERR_FORMAT, "%s: field '%s' must be an integer, not %s", origin, key,
                       json_object_to_json_string(v));
    int64_t x = json_object_get_int64(v);
    if (x < -(1ll << 31) || x > (1ll << 31) - 1)
        return st_errf(err, ST_ERR_FORMAT, "%s: field '%s' = %lld is out of range", origin, key, (long long)x);
    *out = (int)x;
    return ST_OK;
}

static st_status get_double(json_object *o, const char *origin, const char *key, double def, double *out,
                            st_err *err) {
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || json_object_is_type(v, json_type_null)) {
        *out = def;
        return ST_OK;
    }
    if (!json_object_is_type(v, json_type_double) && !json_object_is_type(v, json_type_int))
        return st_errf(err, ST_ERR_FORMAT, "%s: field '%s' must be a number, not %s", origin, key,
                       json_object_to_json_string(v));
    double d = json_object_get_double(v);
    /* json-c reads Infinity, NaN and 1e999; none of them is a model (and JSON has no way
     * to write them back) */
    if (!isfinite(d))
        return st_errf(err, ST_ERR_FORMAT, "%s: field '%s' is %s; it must be a finite number", origin, key,
                       json_object_to_json_string(v));
    *out = d;
    return ST_OK;
}

static st_status get_bool(json_object *o, const char *origin, const char *key, int def, int *out, st_err *err) {
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || json_object_is_type(v, json_type_null)) {
        *out = def;
        return ST_OK;
    }
    if (!json_object_is_type(v, json_type_boolean))
        return st_errf(err, ST_ERR_FORMAT, "%s: field '%s' must be true or false, not %s", origin, key,
                       json_object_to_json_string(v));
    *out = json_object_get_boolean(v);
    return ST_OK;
}

static const char *get_string(json_object *o, const char *key) {
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_string)) return NULL;
    return json_object_get_string(v);
}

static st_status parse_rope_scaling(json_object *root, const char *origin, st_llama_config *c, st_err *err) {
    json_object *rs;
    if (!json_object_object_get_ex(root, "rope_scaling", &rs) || json_object_is_type(rs, json_type_null))
        return ST_OK;
    if (!json_object_is_type(rs, json_type_object))
        return st_errf(err, ST_ERR_FORMAT, "%s: field 'rope_scaling' must be an object or null", origin);
    const char *type = get_string(rs, "rope_type");
    if (!type) type = get_string(rs, "type"); /* the older spelling */
    if (!type)
        return st_errf(err, ST_ERR_FORMAT, "%s: field 'rope_scaling' has no 'rope_type'", origin);
    if (!strcmp(type, "default")) return ST_OK;
    if (strcmp(type, "llama3"))
        return st_errf(err, ST_ERR_UNSUPPORTED, "%s: field 'rope_scaling.rope_type' is '%s'; strata supports only "
                       "'llama3' (or no rope_scaling)", origin, type);
    double orig = 0;
    st_status s;
    c->rope_llama3 = 1;
    if ((s = get_double(rs, origin, "factor", NAN, &c->rope_factor, err)) ||
        (s = get_double(rs, origin, "low_freq_factor", NAN, &c->rope_low_freq_factor, err)) ||
        (s = get_double(rs, origin, "high_freq_factor", NAN, &c->rope_high_freq_factor, err)) ||
        (s = get_double(rs, origin, "original_max_position_embeddings", NAN, &orig, err)))
        return s;
    if (isnan(c->rope_factor) || isnan(c->rope_low_freq_factor) || isnan(c->rope_high_freq_factor) || isnan(orig))
        return st_errf(err, ST_ERR_FORMAT, "%s: field 'rope_scaling' (llama3) needs factor, low_freq_factor, "
                       "high_freq_factor and original_max_position_embeddings", origin);
    if (!(orig >= 1 && orig <= INT_MAX) || orig != floor(orig))
        return st_errf(err, ST_ERR_FORMAT, "%s: field 'rope_scaling.original_max_position_embeddings' is %g; it must be "
                       "a whole number in [1, %d]", origin, orig, INT_MAX);
    c->rope_original_max_pos = (int)orig;
    return ST_OK;
}

static st_status parse_root(json_object *root, const char *origin, st_llama_config *c, st_err *err) {
    memset(c, 0, sizeof *c);
    if (!json_object_is_type(root, json_type_object))
        return st_errf(err, ST_ERR_FORMAT, "%s: config.json must be a JSON object", origin);
    /* architecture: from 'architectures'[0], else from 'model_type' */
    const arch_info *ai = NULL;
    json_object *ja;
    const char *model_type = get_string(root, "model_type");
    if (json_object_object_get_ex(root, "architectures", &ja) && !json_object_is_type(ja, json_type_null)) {
        if (!json_object_is_type(ja, json_type_array) || json_object_array_length(ja) != 1 ||
            !json_object_is_type(json_object_array_get_idx(ja, 0), json_type_string))
            return st_errf(err, ST_ERR_FORMAT, "%s: field 'architectures' must be a list of one name", origin);
        const char *a = json_object_get_string(json_object_array_get_idx(ja, 0));
        for (int i = 0; i < N_ARCHS; i++)
            if (!strcmp(a, archs[i].arch)) ai = &archs[i];
        if (!ai)
            return st_errf(err, ST_ERR_UNSUPPORTED, "%s: field 'architectures' is '%s'; strata supports %s", origin, a,
                           supported_archs());
        if (model_type && strcmp(model_type, ai->model_type))
            return st_errf(err, ST_ERR_FORMAT, "%s: field 'model_type' is '%s' but architectures says %s ('%s')",
                           origin, model_type, ai->arch, ai->model_type);
    } else if (model_type) {
        for (int i = 0; i < N_ARCHS; i++)
            if (!strcmp(model_type, archs[i].model_type)) ai = &archs[i];
        if (!ai)
            return st_errf(err, ST_ERR_UNSUPPORTED, "%s: field 'model_type' is '%s'; strata supports llama, mistral, "
                           "qwen2, qwen3", origin, model_type);
    } else {
        return st_errf(err, ST_ERR_FORMAT, "%s: neither 'architectures' nor 'model_type' is set", origin);
    }
    snprintf(c->model_type, sizeof c->model_type, "%s", ai->model_type);

    st_status s;
    if ((s = get_int(root, origin, "vocab_size", 1, 0, &c->vocab_size, err)) ||
        (s = get_int(root, origin, "hidden_size", 1, 0, &c->hidden_size, err)) ||
        (s = get_int(root, origin, "intermediate_size", 1, 0, &c->intermediate_size, err)) ||
        (s = get_int(root, origin, "num_hidden_layers", 1, 0, &c->n_layer, err)) ||
        (s = get_int(root, origin, "num_attention_heads", 1, 0, &c->n_head, err)) ||
        (s = get_int(root, origin, "num_key_value_heads", 0, c->n_head, &c->n_kv_head, err)) ||
        (s = get_int(root, origin, "max_position_embeddings", 1, 0, &c->max_seq, err)))
        return s;
    if (c->n_head < 1)
        return st_errf(err, ST_ERR_FORMAT, "%s: field 'num_attention_heads' must be >= 1", origin);
    if ((s = get_int(root, origin, "head_dim", 0, c->hidden_size / c->n_head, &c->head_dim, err))) return s;
    if ((s = get_double(root, origin, "rms_norm_eps", 1e-6, &c->rms_norm_eps, err)) ||
        (s = get_double(root, origin, "rope_theta", 10000.0, &c->rope_theta, err)) ||
        (s = get_bool(root, origin, "tie_word_embeddings", 0, &c->tie_word_embeddings, err)))
        return s;

    const char *act = get_string(root, "hidden_act");
    if (act && strcmp(act, "silu"))
        return st_errf(err, ST_ERR_UNSUPPORTED, "%s: field 'hidden_act' is '%s'; strata's SwiGLU MLP uses 'silu'",
                       origin, act);
    int attention_bias = 0, mlp_bias = 0;
    if ((s = get_bool(root, origin, "attention_bias", 0, &attention_bias, err)) ||
        (s = get_bool(root, origin, "mlp_bias", 0, &mlp_bias, err)))
        return s;
    if (mlp_bias)
        return st_errf(err, ST_ERR_UNSUPPORTED, "%s: field 'mlp_bias' is true; strata's MLP has no biases", origin);
    /* Llama, Mistral and Qwen3 put attention_bias on q, k, v and o; Qwen2 has q/k/v biases
     * always and none on o. */
    c->qkv_bias = ai->qkv_bias_always || attention_bias;
    c->o_bias = !ai->qkv_bias_always && attention_bias;
    c->qk_norm = ai->qk_norm;
    double dropout, partial;
    if ((s = get_double(root, origin, "attention_dropout", 0.0, &dropout, err)) ||
        (s = get_double(root, origin, "partial_rotary_factor", 1.0, &partial, err)))
        return s;
    if (dropout != 0.0)
        return st_errf(err, ST_ERR_UNSUPPORTED, "%s: field 'attention_dropout' is %g; strata has no attention "
                       "dropout: set it to 0.0", origin, dropout);
    if (partial != 1.0)
        return st_errf(err, ST_ERR_UNSUPPORTED, "%s: field 'partial_rotary_factor' is %g; strata rotates whole heads "
                       "(1.0)", origin, partial);
    if ((s = parse_rope_scaling(root, origin, c, err))) return s;

    /* Sliding window: Mistral sets 'sliding_window' (or null); Qwen2/3 set it with
     * 'use_sliding_window', which is off in every released checkpoint. */
    int use_sw = 1, sw = 0;
    if (ai->model_type[0] == 'q' && (s = get_bool(root, origin, "use_sliding_window", 0, &use_sw, err))) return s;
    if ((s = get_int(root, origin, "sliding_window", 0, 0, &sw, err))) return s;
    c->sliding_window = use_sw && sw > 0 ? sw : 0;

    if ((s = st_llama_config_validate(c, err))) return st_err_prefix(err, "%s", origin);
    return ST_OK;
}

st_status st_hf_config_parse(const char *json_text, const char *origin, st_llama_config *cfg, st_err *err) {
    json_tokener *tok = json_tokener_new();
    if (!tok) return st_errf(err, ST_ERR_NOMEM, "out of memory parsing %s", origin);
    json_object *root = json_tokener_parse_ex(tok, json_text, (int)strlen(json_text));
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    if (!root || jerr != json_tokener_success) {
        st_status s = st_errf(err, ST_ERR_FORMAT, "%s: not valid JSON (%s at byte %zu)", origin,
                              json_tokener_error_desc(jerr), (size_t)json_tokener_get_parse_end(tok));
        json_tokener_free(tok);
        if (root) json_object_put(root);
        return s;
    }
    json_tokener_free(tok);
    st_status s = parse_root(root, origin, cfg, err);
    json_object_put(root);
    return s;
}

char *hf_read_text(const char *path, st_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        st_errf(err, ST_ERR_IO, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            if (cap > (64u << 20)) {
                free(buf);
                fclose(f);
                st_errf(err, ST_ERR_FORMAT, "%s is larger than 64 MiB; not a config or index file", path);
                return NULL;
            }
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                st_errf(err, ST_ERR_NOMEM, "out of memory reading %s", path);
                return NULL;
            }
            buf = nb;
        }
        size_t n = fread(buf + len, 1, 4096, f);
        len += n;
        if (n < 4096) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        st_errf(err, ST_ERR_IO, "error reading %s", path);
        return NULL;
    }
    buf[len] = 0;
    return buf;
}

st_status st_hf_config_read(const char *dir, st_llama_config *cfg, st_err *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = hf_read_text(path, err);
    if (!text) return err ? err->code : ST_ERR_IO;
    st_status s = st_hf_config_parse(text, path, cfg, err);
    free(text);
    return s;
}

/* A JSON number with the shortest text that reads back as exactly d (1e-06, not
 * 9.9999999999999995e-07), as Python's json module writes it. */
static json_object *exact_double(double d) {
    char buf[64];
    if (d == floor(d) && fabs(d) < 1e16) {
        snprintf(buf, sizeof buf, "%.1f", d); /* 500000.0, not 5e+05 */
    } else {
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(buf, sizeof buf, "%.*g", prec, d);
            if (strtod(buf, NULL) == d) break;
        }
    }
    if (!strpbrk(buf, ".eEn")) strcat(buf, ".0"); /* keep it a float in Python's eyes */
    return json_object_new_double_s(d, buf);
}

static const char *arch_of(const st_llama_config *c) {
    for (int i = 0; i < N_ARCHS; i++)
        if (!strcmp(c->model_type, archs[i].model_type)) return archs[i].arch;
    return "LlamaForCausalLM";
}

char *st_hf_config_to_json(const st_llama_config *c, const char *torch_dtype) {
    /* JSON has no Infinity or NaN: such a configuration is not written at all (no reader
     * could load it back) */
    if (!isfinite(c->rms_norm_eps) || !isfinite(c->rope_theta) ||
        (c->rope_llama3 && (!isfinite(c->rope_factor) || !isfinite(c->rope_low_freq_factor) ||
                            !isfinite(c->rope_high_freq_factor))))
        return NULL;
    json_object *o = json_object_new_object();
    json_object *a = json_object_new_array();
    json_object_array_add(a, json_object_new_string(arch_of(c)));
    json_object_object_add(o, "architectures", a);
    json_object_object_add(o, "model_type", json_object_new_string(c->model_type[0] ? c->model_type : "llama"));
    json_object_object_add(o, "vocab_size", json_object_new_int(c->vocab_size));
    json_object_object_add(o, "hidden_size", json_object_new_int(c->hidden_size));
    json_object_object_add(o, "intermediate_size", json_object_new_int(c->intermediate_size));
    json_object_object_add(o, "num_hidden_layers", json_object_new_int(c->n_layer));
    json_object_object_add(o, "num_attention_heads", json_object_new_int(c->n_head));
    json_object_object_add(o, "num_key_value_heads", json_object_new_int(c->n_kv_head));
    json_object_object_add(o, "head_dim", json_object_new_int(c->head_dim));
    json_object_object_add(o, "max_position_embeddings", json_object_new_int(c->max_seq));
    json_object_object_add(o, "hidden_act", json_object_new_string("silu"));
    json_object_object_add(o, "rms_norm_eps", exact_double(c->rms_norm_eps));
    json_object_object_add(o, "rope_theta", exact_double(c->rope_theta));
    if (c->rope_llama3) {
        json_object *rs = json_object_new_object();
        json_object_object_add(rs, "rope_type", json_object_new_string("llama3"));
        json_object_object_add(rs, "factor", exact_double(c->rope_factor));
        json_object_object_add(rs, "low_freq_factor", exact_double(c->rope_low_freq_factor));
        json_object_object_add(rs, "high_freq_factor", exact_double(c->rope_high_freq_factor));
        json_object_object_add(rs, "original_max_position_embeddings", json_object_new_int(c->rope_original_max_pos));
        json_object_object_add(o, "rope_scaling", rs);
    } else {
        json_object_object_add(o, "rope_scaling", NULL);
    }
    int is_qwen2 = !strcmp(c->model_type, "qwen2");
    if (!is_qwen2) json_object_object_add(o, "attention_bias", json_object_new_boolean(c->qkv_bias));
    json_object_object_add(o, "attention_dropout", exact_double(0.0));
    if (c->model_type[0] == 'q') {
        json_object_object_add(o, "use_sliding_window", json_object_new_boolean(c->sliding_window > 0));
        json_object_object_add(o, "sliding_window", c->sliding_window > 0 ? json_object_new_int(c->sliding_window) : NULL);
    } else if (!strcmp(c->model_type, "mistral")) {
        json_object_object_add(o, "sliding_window", c->sliding_window > 0 ? json_object_new_int(c->sliding_window) : NULL);
    } else {
        json_object_object_add(o, "mlp_bias", json_object_new_boolean(0));
    }
    json_object_object_add(o, "tie_word_embeddings", json_object_new_boolean(c->tie_word_embeddings));
    json_object_object_add(o, "torch_dtype", json_object_new_string(torch_dtype ? torch_dtype : "float32"));
    char *text = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED |
                                                               JSON_C_TO_STRING_NOSLASHESCAPE));
    json_object_put(o);
    return text;
}
