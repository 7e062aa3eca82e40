/* tokenizer_config.c - a model directory: which file holds its tokenizer, and what
 * tokenizer_config.json says about it (BOS, EOS, pad, add_bos_token, the chat template).
 *
 * Hugging Face writes a special token there as a string or as an AddedToken object
 * ({"content": "<s>", ...}); null means none. A token named there must be a token of the
 * tokenizer: a config that names one the tokenizer lacks is refused, naming the key. */
#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tokenizer_internal.h"

static char *join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

st_status tok_dir_file(const char *dir, char **file, st_err *err) {
    /* tokenizer.json first (what transformers reads); tokenizer.model is a rank file in
     * Llama-3's original directory (in Llama-2's it is sentencepiece, refused by content) */
    static const char *const names[] = {"tokenizer.json", "tokenizer.model"};
    for (int i = 0; i < 2; i++) {
        char *p = join(dir, names[i]);
        if (!p) return st_errf(err, ST_ERR_NOMEM, "tokenizer %s: out of memory", dir);
        if (is_file(p)) {
            *file = p;
            return ST_OK;
        }
        free(p);
    }
    return st_errf(err, ST_ERR_IO, "tokenizer directory %s has neither tokenizer.json nor tokenizer.model", dir);
}

/* A special token's text: a string, or an object's "content"; NULL for null or absent. */
static st_status token_text(json_object *root, const char *key, const char *file, const char **out, st_err *err) {
    json_object *v, *c;
    *out = NULL;
    if (!json_object_object_get_ex(root, key, &v) || !v) return ST_OK;
    if (json_object_is_type(v, json_type_string)) {
        *out = json_object_get_string(v);
        return ST_OK;
    }
    if (json_object_is_type(v, json_type_object) && json_object_object_get_ex(v, "content", &c) &&
        json_object_is_type(c, json_type_string)) {
        *out = json_object_get_string(c);
        return ST_OK;
    }
    return st_errf(err, ST_ERR_FORMAT, "%s: %s is neither a string nor {\"content\": string}", file, key);
}

static st_status resolve(st_tokenizer *t, const char *text, const char *what, const char *file, int32_t *id,
                         st_err *err) {
    int32_t v = st_tokenizer_token_id(t, text);
    if (v < 0)
        return st_errf(err, ST_ERR_FORMAT, "%s: %s '%s' is not a token of %s", file, what, text, t->path);
    *id = v;
    return ST_OK;
}

/* The chat template: a string, or in a list of {"name", "template"} the one named "default". */
static st_status chat_template(st_tokenizer *t, json_object *root, const char *file, st_err *err) {
    json_object *v;
    if (!json_object_object_get_ex(root, "chat_template", &v) || !v) return ST_OK;
    const char *tpl = NULL;
    if (json_object_is_type(v, json_type_string)) {
        tpl = json_object_get_string(v);
    } else if (json_object_is_type(v, json_type_array)) {
        for (size_t i = 0; i < json_object_array_length(v); i++) {
            json_object *e = json_object_array_get_idx(v, i), *nm, *tp;
            if (json_object_object_get_ex(e, "name", &nm) && json_object_is_type(nm, json_type_string) &&
                strcmp(json_object_get_string(nm), "default") == 0 && json_object_object_get_ex(e, "template", &tp) &&
                json_object_is_type(tp, json_type_string))
                tpl = json_object_get_string(tp);
        }
    } else {
        return st_errf(err, ST_ERR_FORMAT, "%s: chat_template is neither a string nor a list of {name, template}",
                       file);
    }
    if (!tpl) return ST_OK;
    return tok_dup_str(t, tpl, strlen(tpl), &t->chat_template, err);
}

static st_status read_config(st_tokenizer *t, const char *file, st_err *err) {
    char *buf = NULL;
    size_t len = 0;
    st_status s = tok_read_file(file, &buf, &len, err);
    if (s != ST_OK) return s;
    json_tokener *jt = json_tokener_new_ex(JSON_TOKENER_DEFAULT_DEPTH);
    if (!jt) {
        free(buf);
        return st_errf(err, ST_ERR_NOMEM, "%s: out of memory", file);
    }
    json_object *root = len <= (size_t)INT32_MAX ? json_tokener_parse_ex(jt, buf, (int)len) : NULL;
    enum json_tokener_error je = json_tokener_get_error(jt);
    size_t end = json_tokener_get_parse_end(jt);
    json_tokener_free(jt);
    free(buf);
    if (!root || je != json_tokener_success || !json_object_is_type(root, json_type_object)) {
        json_object_put(root);
        return st_errf(err, ST_ERR_FORMAT, "%s: malformed JSON at byte %zu: %s", file, end,
                       je == json_tokener_success ? "the top level is not an object"
                       : je == json_tokener_continue ? "the file ends early"
                                                     : json_tokener_error_desc(je));
    }
    static const char *const keys[] = {"bos_token", "eos_token", "pad_token"};
    int32_t *ids[] = {&t->bos_id, &t->eos_id, &t->pad_id};
    for (int k = 0; k < 3 && s == ST_OK; k++) {
        const char *text;
        s = token_text(root, keys[k], file, &text, err);
        if (s == ST_OK && text) s = resolve(t, text, keys[k], file, ids[k], err);
    }
    json_object *v;
    if (s == ST_OK && json_object_object_get_ex(root, "add_bos_token", &v) && v) {
        if (json_object_is_type(v, json_type_boolean)) t->add_bos = json_object_get_boolean(v);
        else s = st_errf(err, ST_ERR_FORMAT, "%s: add_bos_token is not true or false", file);
    }
    if (s == ST_OK) s = chat_template(t, root, file, err);
    json_object_put(root);
    return s;
}

st_status tok_load_config(st_tokenizer *t, const char *dir, st_err *err) {
    char *file = join(dir, "tokenizer_config.json");
    if (!file) return st_errf(err, ST_ERR_NOMEM, "tokenizer %s: out of memory", dir);
    st_status s = is_file(file) ? read_config(t, file, err) : ST_OK;
    free(file);
    if (s != ST_OK || t->chat_template) return s;
    /* newer transformers save the template beside the config */
    file = join(dir, "chat_template.jinja");
    if (!file) return st_errf(err, ST_ERR_NOMEM, "tokenizer %s: out of memory", dir);
    if (is_file(file)) {
        char *buf = NULL;
        size_t len = 0;
        s = tok_read_file(file, &buf, &len, err);
        if (s == ST_OK) {
            s = tok_dup_str(t, buf, len, &t->chat_template, err);
            free(buf);
        }
    }
    free(file);
    return s;
}

st_status tok_apply_opts(st_tokenizer *t, const st_tokenizer_opts *opts, st_err *err) {
    st_status s = ST_OK;
    if (opts->bos_token) s = resolve(t, opts->bos_token, "bos_token", "load options", &t->bos_id, err);
    if (s == ST_OK && opts->eos_token) s = resolve(t, opts->eos_token, "eos_token", "load options", &t->eos_id, err);
    return s;
}

int32_t st_tokenizer_bos_id(const st_tokenizer *t) { return t->bos_id; }
int32_t st_tokenizer_eos_id(const st_tokenizer *t) { return t->eos_id; }
int32_t st_tokenizer_pad_id(const st_tokenizer *t) { return t->pad_id; }
int st_tokenizer_add_bos(const st_tokenizer *t) { return t->add_bos; }
const char *st_tokenizer_chat_template(const st_tokenizer *t) { return t->chat_template; }

/* ---- what a rank file's tokenizer_config.json says of it --------------------------------- */

void tok_rank_config_free(tok_rank_config *rc) {
    json_object_put(rc->root);
    free(rc->special);
    free(rc->special_ids);
    memset(rc, 0, sizeof *rc);
}

st_status tok_rank_config_read(const char *dir, tok_rank_config *rc, st_err *err) {
    memset(rc, 0, sizeof *rc);
    char *file = join(dir, "tokenizer_config.json");
    if (!file) return st_errf(err, ST_ERR_NOMEM, "tokenizer %s: out of memory", dir);
    if (!is_file(file)) {
        free(file);
        return ST_OK;
    }
    st_status s = ST_OK;
    json_object *root = json_object_from_file(file), *v;
    if (!root || !json_object_is_type(root, json_type_object)) {
        json_object_put(root);
        s = st_errf(err, ST_ERR_FORMAT, "%s: not a JSON object: %s", file, json_util_get_last_err());
        free(file);
        return s;
    }
    rc->root = root;
    if (json_object_object_get_ex(root, "pat_str", &v) && v) {
        if (!json_object_is_type(v, json_type_string) || !json_object_get_string_len(v))
            s = st_errf(err, ST_ERR_FORMAT, "%s: pat_str is not a pattern's name or regex (a non-empty string)", file);
        rc->pattern = json_object_get_string(v);
        rc->pattern_key = "pat_str";
    } else if (json_object_object_get_ex(root, "tokenizer_class", &v) && json_object_is_type(v, json_type_string) &&
               !strcmp(json_object_get_string(v), "QWenTokenizer")) {
        /* Qwen's tiktoken tokenizer (tokenization_qwen.py): Qwen2's pattern */
        rc->pattern = "qwen2";
        rc->pattern_key = "tokenizer_class QWenTokenizer";
    }
    /* added_tokens_decoder: {"151643": {"content": "<|endoftext|>", ...}, ...} */
    if (s == ST_OK && json_object_object_get_ex(root, "added_tokens_decoder", &v) && v) {
        size_t n = json_object_is_type(v, json_type_object) ? (size_t)json_object_object_length(v) : 0;
        if (!json_object_is_type(v, json_type_object))
            s = st_errf(err, ST_ERR_FORMAT, "%s: added_tokens_decoder is not an object of id: {content}", file);
        else if (n && (!(rc->special = calloc(n, sizeof *rc->special)) ||
                       !(rc->special_ids = calloc(n, sizeof *rc->special_ids))))
            s = st_errf(err, ST_ERR_NOMEM, "%s: out of memory", file);
        json_object_object_foreach(v, key, tok) {
            if (s != ST_OK) break;
            char *end;
            long id = strtol(key, &end, 10);
            json_object *c;
            if (!*key || *end || id < 0 || id > INT32_MAX - 2 || !json_object_object_get_ex(tok, "content", &c) ||
                !json_object_is_type(c, json_type_string) || !json_object_get_string_len(c)) {
                s = st_errf(err, ST_ERR_FORMAT, "%s: added_tokens_decoder[\"%.40s\"] is not id: {\"content\": token}",
                            file, key);
                break;
            }
            rc->special[rc->n_special] = json_object_get_string(c);
            rc->special_ids[rc->n_special++] = (int32_t)id;
        }
    }
    free(file);
    if (s != ST_OK) tok_rank_config_free(rc);
    return s;
}
