/* tokenizer_json.c - Hugging Face tokenizer.json: the BPE model, its added tokens, normalizer,
 * pre-tokenizer and decoder, read into the tables tokenizer.c encodes with. Anything not
 * handled is refused with ST_ERR_UNSUPPORTED naming the field. */
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

static const char *type_of(json_object *o) {
    json_object *ty;
    if (!o || !json_object_is_type(o, json_type_object) || !json_object_object_get_ex(o, "type", &ty) ||
        !json_object_is_type(ty, json_type_string))
        return NULL;
    return json_object_get_string(ty);
}

static int get_bool(json_object *o, const char *key) {
    json_object *v;
    return json_object_object_get_ex(o, key, &v) && json_object_get_boolean(v);
}

static int is_null(json_object *o, const char *key) {
    json_object *v;
    return !json_object_object_get_ex(o, key, &v) || v == NULL;
}

/* Metaspace's replacement character and prepend scheme, for the pre-tokenizer and the
 * decoder: prepend_scheme "always" | "first" | "never", or the older add_prefix_space
 * (true: always, false: never); always when neither is given, as tokenizers reads it. */
static st_status metaspace_params(const st_tokenizer *t, json_object *p, const char *field, char rep[5],
                                  uint8_t *rep_len, uint8_t *prepend, st_err *err) {
    json_object *v;
    if (!json_object_object_get_ex(p, "replacement", &v) || !json_object_is_type(v, json_type_string))
        return st_errf(err, ST_ERR_FORMAT, "%s: %s.replacement is missing", t->path, field);
    const char *r = json_object_get_string(v);
    size_t rl = (size_t)json_object_get_string_len(v);
    if (rl == 0 || rl > 4 || tok_utf8_char_len((const uint8_t *)r, rl) != rl)
        return st_errf(err, ST_ERR_FORMAT, "%s: %s.replacement '%s' is not one character", t->path, field, r);
    memcpy(rep, r, rl);
    rep[rl] = 0;
    *rep_len = (uint8_t)rl;
    *prepend = PREPEND_ALWAYS;
    if (json_object_object_get_ex(p, "prepend_scheme", &v) && v) {
        const char *ps = json_object_get_string(v);
        if (strcmp(ps, "always") == 0) *prepend = PREPEND_ALWAYS;
        else if (strcmp(ps, "first") == 0) *prepend = PREPEND_FIRST;
        else if (strcmp(ps, "never") == 0) *prepend = PREPEND_NEVER;
        else return st_errf(err, ST_ERR_FORMAT, "%s: %s.prepend_scheme '%s' is none of always, first, never",
                            t->path, field, ps);
    } else if (json_object_object_get_ex(p, "add_prefix_space", &v) && v) {
        *prepend = json_object_get_boolean(v) ? PREPEND_ALWAYS : PREPEND_NEVER;
    }
    return ST_OK;
}

/* A {"String": s} pattern (Replace normalizer and decoder); a Regex one is refused. */
static st_status string_pattern(const st_tokenizer *t, json_object *o, const char *field, const char **s,
                                size_t *len, st_err *err) {
    json_object *pat, *v;
    if (!json_object_object_get_ex(o, "pattern", &pat) || !json_object_is_type(pat, json_type_object))
        return st_errf(err, ST_ERR_FORMAT, "%s: %s.pattern is missing", t->path, field);
    if (json_object_object_get_ex(pat, "Regex", &v))
        return st_errf(err, ST_ERR_UNSUPPORTED, "%s: %s.pattern.Regex is not supported (only String)", t->path,
                       field);
    if (!json_object_object_get_ex(pat, "String", &v) || !json_object_is_type(v, json_type_string) ||
        json_object_get_string_len(v) == 0)
        return st_errf(err, ST_ERR_FORMAT, "%s: %s.pattern.String is missing or empty", t->path, field);
    *s = json_object_get_string(v);
    *len = (size_t)json_object_get_string_len(v);
    return ST_OK;
}

/* One normalizer (Prepend or Replace); a Sequence is unrolled by load_normalizer. */
static st_status load_norm_one(st_tokenizer *t, json_object *n, const char *field, st_err *err) {
    const char *ty = type_of(n);
    if (!ty) return st_errf(err, ST_ERR_FORMAT, "%s: %s.type is missing", t->path, field);
    int prepend = strcmp(ty, "Prepend") == 0;
    if (!prepend && strcmp(ty, "Replace") != 0)
        return st_errf(err, ST_ERR_UNSUPPORTED, "%s: %s.type '%s' is not supported (Prepend, Replace, Sequence)",
                       t->path, field, ty);
    if (t->n_norm >= MAX_STEPS)
        return st_errf(err, ST_ERR_UNSUPPORTED, "%s: %s: too many normalizer steps", t->path, field);
    norm_step *st = &t->norm[t->n_norm];
    const char *a, *b;
    size_t alen, blen;
    json_object *v;
    st_status s;
    if (prepend) {
        if (!json_object_object_get_ex(n, "prepend", &v) || !json_object_is_type(v, json_type_string))
            return st_errf(err, ST_ERR_FORMAT, "%s: %s.prepend is missing", t->path, field);
        a = json_object_get_string(v);
        alen = (size_t)json_object_get_string_len(v);
        b = "";
        blen = 0;
    } else {
        if ((s = string_pattern(t, n, field, &a, &alen, err)) != ST_OK) return s;
        if (!json_object_object_get_ex(n, "content", &v) || !json_object_is_type(v, json_type_string))
            return st_errf(err, ST_ERR_FORMAT, "%s: %s.content is missing", t->path, field);
        b = json_object_get_string(v);
        blen = (size_t)json_object_get_string_len(v);
    }
    if ((s = tok_dup_str(t, a, alen, &st->a, err)) != ST_OK) return s;
    if ((s = tok_dup_str(t, b, blen, &st->b, err)) != ST_OK) {
        free(st->a);
        return s;
    }
    st->kind = prepend ? NORM_PREPEND : NORM_REPLACE;
    st->alen = (uint32_t)alen;
    st->blen = (uint32_t)blen;
    t->n_norm++;
    return ST_OK;
}

static st_status load_normalizer(st_tokenizer *t, json_object *root, st_err *err) {
    json_object *n, *arr;
    if (!json_object_object_get_ex(root, "normalizer", &n) || !n) return ST_OK;
    const char *ty = type_of(n);
    if (!ty || strcmp(ty, "Sequence") != 0) return load_norm_one(t, n, "normalizer", err);
    if (!json_object_object_get_ex(n, "normalizers", &arr) || !json_object_is_type(arr, json_type_array))
        return st_errf(err, ST_ERR_FORMAT, "%s: normalizer.normalizers is missing", t->path);
    for (size_t i = 0; i < json_object_array_length(arr); i++) {
        char field[64];
        snprintf(field, sizeof field, "normalizer.normalizers[%zu]", i);
        st_status s = load_norm_one(t, json_object_array_get_idx(arr, i), field, err);
        if (s != ST_OK) return s;
    }
    return ST_OK;
}

static st_status load_dec_one(st_tokenizer *t, json_object *d, const char *field, st_err *err) {
    const char *ty = type_of(d);
    if (!ty) return st_errf(err, ST_ERR_FORMAT, "%s: %s.type is missing", t->path, field);
    if (t->n_dec >= MAX_STEPS) return st_errf(err, ST_ERR_UNSUPPORTED, "%s: %s: too many decoders", t->path, field);
    dec_step *st = &t->dec[t->n_dec];
    memset(st, 0, sizeof *st);
    json_object *v;
    st_status s;
    if (strcmp(ty, "ByteLevel") == 0) {
        st->kind = DEC_BYTE_LEVEL;
    } else if (strcmp(ty, "ByteFallback") == 0) {
        st->kind = DEC_BYTE_FALLBACK;
    } else if (strcmp(ty, "Fuse") == 0) {
        st->kind = DEC_FUSE;
    } else if (strcmp(ty, "Replace") == 0) {
        const char *a;
        size_t alen;
        if ((s = string_pattern(t, d, field, &a, &alen, err)) != ST_OK) return s;
        if (!json_object_object_get_ex(d, "content", &v) || !json_object_is_type(v, json_type_string))
            return st_errf(err, ST_ERR_FORMAT, "%s: %s.content is missing", t->path, field);
        if ((s = tok_dup_str(t, a, alen, &st->a, err)) != ST_OK) return s;
        if ((s = tok_dup_str(t, json_object_get_string(v), (size_t)json_object_get_string_len(v), &st->b, err)) != ST_OK) {
            free(st->a);
            st->a = NULL;
            return s;
        }
        st->alen = (uint32_t)alen;
        st->blen = (uint32_t)json_object_get_string_len(v);
        st->kind = DEC_REPLACE;
    } else if (strcmp(ty, "Strip") == 0) {
        json_object *c, *a, *b;
        if (!json_object_object_get_ex(d, "content", &c) || !json_object_is_type(c, json_type_string) ||
            !json_object_object_get_ex(d, "start", &a) || !json_object_is_type(a, json_type_int) ||
            !json_object_object_get_ex(d, "stop", &b) || !json_object_is_type(b, json_type_int) ||
            json_object_get_int64(a) < 0 || json_object_get_int64(b) < 0)
            return st_errf(err, ST_ERR_FORMAT, "%s: %s needs content (a character), start and stop (>= 0)", t->path,
                           field);
        size_t cl = (size_t)json_object_get_string_len(c);
        if (cl == 0 || tok_utf8_char_len((const uint8_t *)json_object_get_string(c), cl) != cl)
            return st_errf(err, ST_ERR_FORMAT, "%s: %s.content is not one character", t->path, field);
        if ((s = tok_dup_str(t, json_object_get_string(c), cl, &st->a, err)) != ST_OK) return s;
        st->alen = (uint32_t)cl;
        st->start = json_object_get_int64(a) > 1000000 ? 1000000 : (uint32_t)json_object_get_int64(a);
        st->stop = json_object_get_int64(b) > 1000000 ? 1000000 : (uint32_t)json_object_get_int64(b);
        st->kind = DEC_STRIP;
    } else if (strcmp(ty, "Metaspace") == 0) {
        char rep[5];
        uint8_t rl, prepend;
        if ((s = metaspace_params(t, d, field, rep, &rl, &prepend, err)) != ST_OK) return s;
        if ((s = tok_dup_str(t, rep, rl, &st->a, err)) != ST_OK) return s;
        st->alen = rl;
        st->prepend = prepend != PREPEND_NEVER;
        st->kind = DEC_METASPACE;
    } else {
        return st_errf(err, ST_ERR_UNSUPPORTED,
                       "%s: %s.type '%s' is not supported (ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, "
                       "Sequence)",
                       t->path, field, ty);
    }
    t->n_dec++;
    return ST_OK;
}

static st_status load_decoder(st_tokenizer *t, json_object *root, st_err *err) {
    json_object *d, *arr;
    if (!json_object_object_get_ex(root, "decoder", &d) || !d)
        return st_errf(err, ST_ERR_UNSUPPORTED, "%s: decoder is null: not supported (a decoder says how to "
                       "turn tokens back into text)", t->path);
    const char *ty = type_of(d);
    if (!ty || strcmp(ty, "Sequence") != 0) return load_dec_one(t, d, "decoder", err);
    if (!json_object_object_get_ex(d, "decoders", &arr) || !json_object_is_type(arr, json_type_array))
        return st_errf(err, ST_ERR_FORMAT, "%s: decoder.decoders is missing", t->path);
    for (size_t i = 0; i < json_object_array_length(arr); i++) {
        char field[64];
        snprintf(field, sizeof field, "decoder.decoders[%zu]", i);
        st_status s = load_dec_one(t, json_object_array_get_idx(arr, i), field, err);
        if (s != ST_OK) return s;
    }
    return ST_OK;
}

/* One pre-tokenizer (not a Sequence). *saw_byte_level is set by ByteLevel; a Split after
 * it would see byte-level characters, which this reader does not do. */
static st_status load_pretok_one(st_tokenizer *t, json_object *p, const char *field, int *saw_byte_level,
                                 st_err *err) {
    const char *ty = type_of(p);
    if (!ty) return st_errf(err, ST_ERR_FORMAT, "%s: %s.type is missing", t->path, field);
    if (strcmp(ty, "ByteLevel") == 0) {
        if (*saw_byte_level)
            return st_errf(err, ST_ERR_UNSUPPORTED, "%s: %s: a second ByteLevel is not supported", t->path, field);
        *saw_byte_level = 1;
        if (get_bool(p, "add_prefix_space")) {
            if (t->n_steps >= MAX_STEPS)
                return st_errf(err, ST_ERR_UNSUPPORTED, "%s: %s: too many steps", t->path, field);
            t->steps[t->n_steps++].kind = STEP_PREFIX_SPACE;
        }
        json_object *ur;
        /* use_regex defaults to true in tokenizers */
        if (!json_object_object_get_ex(p, "use_regex", &ur) || json_object_get_boolean(ur))
            return tok_add_split(t, TOK_GPT2_PATTERN, 0, field, err);
        return ST_OK;
    }
    if (strcmp(ty, "Split") == 0) {
        if (*saw_byte_level)
            return st_errf(err, ST_ERR_UNSUPPORTED, "%s: %s: a Split after ByteLevel is not supported", t->path,
                           field);
        json_object *beh, *pat, *re;
        const char *b = json_object_object_get_ex(p, "behavior", &beh) ? json_object_get_string(beh) : NULL;
        if (!b || strcmp(b, "Isolated") != 0)
            return st_errf(err, ST_ERR_UNSUPPORTED, "%s: %s.behavior '%s' is not supported (only Isolated)",
                           t->path, field, b ? b : "(missing)");
        if (get_bool(p, "invert"))
            return st_errf(err, ST_ERR_UNSUPPORTED, "%s: %s.invert true is not supported", t->path, field);
        if (!json_object_object_get_ex(p, "pattern", &pat) || !json_object_is_type(pat, json_type_object))
            return st_errf(err, ST_ERR_FORMAT, "%s: %s.pattern is missing", t->path, field);
        if (json_object_object_get_ex(pat, "Regex", &re) && json_object_is_type(re, json_type_string))
            return tok_add_split(t, json_object_get_string(re), 0, field, err);
        if (json_object_object_get_ex(pat, "String", &re) && json_object_is_type(re, json_type_string))
            return tok_add_split(t, json_object_get_string(re), PCRE2_LITERAL, field, err);
        return st_errf(err, ST_ERR_FORMAT, "%s: %s.pattern has neither Regex nor String", t->path, field);
    }
    if (strcmp(ty, "Metaspace") == 0) {
        if (t->n_steps >= MAX_STEPS)
            return st_errf(err, ST_ERR_UNSUPPORTED, "%s: %s: too many steps", t->path, field);
        pt_step *st = &t->steps[t->n_steps];
        st_status s = metaspace_params(t, p, field, st->rep, &st->rep_len, &st->prepend, err);
        if (s != ST_OK) return s;
        json_object *sp;
        /* split defaults to true, as in tokenizers */
        st->split = !json_object_object_get_ex(p, "split", &sp) || json_object_get_boolean(sp);
        st->kind = STEP_METASPACE;
        t->n_steps++;
        return ST_OK;
    }
    return st_errf(err, ST_ERR_UNSUPPORTED,
                   "%s: %s.type '%s' is not supported (ByteLevel, Split, Metaspace, Sequence)", t->path, field, ty);
}

static st_status load_pretok(st_tokenizer *t, json_object *root, st_err *err) {
    json_object *p;
    int saw = 0;
    if (!json_object_object_get_ex(root, "pre_tokenizer", &p) || !p) return ST_OK; /* one word per piece */
    st_status s;
    const char *ty = type_of(p);
    if (ty && strcmp(ty, "Sequence") == 0) {
        json_object *arr;
        if (!json_object_object_get_ex(p, "pretokenizers", &arr) || !json_object_is_type(arr, json_type_array))
            return st_errf(err, ST_ERR_FORMAT, "%s: pre_tokenizer.pretokenizers is missing", t->path);
        for (size_t i = 0; i < json_object_array_length(arr); i++) {
            char field[64];
            snprintf(field, sizeof field, "pre_tokenizer.pretokenizers[%zu]", i);
            if ((s = load_pretok_one(t, json_object_array_get_idx(arr, i), field, &saw, err)) != ST_OK) return s;
        }
    } else if ((s = load_pretok_one(t, p, "pre_tokenizer", &saw, err)) != ST_OK) {
        return s;
    }
    t->byte_level = saw; /* without ByteLevel the model works on characters */
    return ST_OK;
}

static st_status load_model(st_tokenizer *t, json_object *root, json_object *added, st_err *err) {
    json_object *m, *vocab, *merges, *v;
    if (!json_object_object_get_ex(root, "model", &m) || !json_object_is_type(m, json_type_object))
        return st_errf(err, ST_ERR_FORMAT, "%s: model is missing", t->path);
    const char *ty = type_of(m);
    if (ty && strcmp(ty, "BPE") != 0)
        return st_errf(err, ST_ERR_UNSUPPORTED, "%s: model.type '%s' is not supported (strata reads BPE models)",
                       t->path, ty);
    if (json_object_object_get_ex(m, "dropout", &v) && v && json_object_get_double(v) != 0.0)
        return st_errf(err, ST_ERR_UNSUPPORTED, "%s: model.dropout is not supported (set it to null)", t->path);
    static const char *const unsupported_str[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++)
        if (json_object_object_get_ex(m, unsupported_str[i], &v) && v && json_object_get_string_len(v) > 0)
            return st_errf(err, ST_ERR_UNSUPPORTED, "%s: model.%s '%s' is not supported", t->path,
                           unsupported_str[i], json_object_get_string(v));
    t->byte_fallback = get_bool(m, "byte_fallback");
    t->fuse_unk = get_bool(m, "fuse_unk");
    t->ignore_merges = get_bool(m, "ignore_merges");
    if (!json_object_object_get_ex(m, "vocab", &vocab) || !json_object_is_type(vocab, json_type_object))
        return st_errf(err, ST_ERR_FORMAT, "%s: model.vocab is missing or not an object", t->path);
    if (!json_object_object_get_ex(m, "merges", &merges) || !json_object_is_type(merges, json_type_array))
        return st_errf(err, ST_ERR_FORMAT, "%s: model.merges is missing or not an array", t->path);

    /* ids: the model's and the added tokens' */
    int64_t max_id = -1;
    json_object_object_foreach(vocab, key, val) {
        (void)key;
        if (!json_object_is_type(val, json_type_int))
            return st_errf(err, ST_ERR_FORMAT, "%s: model.vocab['%s'] is not an integer", t->path, key);
        int64_t id = json_object_get_int64(val);
        if (id < 0 || id > INT32_MAX - 2)
            return st_errf(err, ST_ERR_FORMAT, "%s: model.vocab['%s'] = %lld is out of range", t->path, key,
                           (long long)id);
        if (id > max_id) max_id = id;
    }
    size_t n_added = added ? json_object_array_length(added) : 0;
    for (size_t i = 0; i < n_added; i++) {
        json_object *a = json_object_array_get_idx(added, i), *idv;
        if (!json_object_object_get_ex(a, "id", &idv) || !json_object_is_type(idv, json_type_int))
            return st_errf(err, ST_ERR_FORMAT, "%s: added_tokens[%zu].id is missing", t->path, i);
        int64_t id = json_object_get_int64(idv);
        if (id < 0 || id > INT32_MAX - 2)
            return st_errf(err, ST_ERR_FORMAT, "%s: added_tokens[%zu].id %lld is out of range", t->path, i,
                           (long long)id);
        if (id > max_id) max_id = id;
    }
    /* ids index tables: a real vocabulary numbers its tokens (almost) densely, and an id far
     * past the count of tokens would make those tables gigabytes of holes */
    size_t n_tokens = (size_t)json_object_object_length(vocab) + n_added;
    if ((size_t)(max_id + 1) > 2 * n_tokens + 1024)
        return st_errf(err, ST_ERR_FORMAT, "%s: the largest id, %lld, is far past the %zu tokens of model.vocab and "
                       "added_tokens (ids are numbered from 0, almost without gaps); the file is damaged",
                       t->path, (long long)max_id, n_tokens);
    t->n_ids = (size_t)(max_id + 1);
    t->id_str = calloc(t->n_ids ? t->n_ids : 1, sizeof *t->id_str);
    t->id_len = calloc(t->n_ids ? t->n_ids : 1, sizeof *t->id_len);
    size_t nv = (size_t)json_object_object_length(vocab);
    t->vocab_cap = tok_pow2_at_least(nv * 2 + 2);
    t->vocab = calloc(t->vocab_cap, sizeof *t->vocab);
    if (!t->id_str || !t->id_len || !t->vocab) return st_errf(err, ST_ERR_NOMEM, "%s: out of memory", t->path);
    st_status s;
    json_object_object_foreach(vocab, k2, v2) {
        int32_t id = (int32_t)json_object_get_int64(v2);
        char field[64];
        snprintf(field, sizeof field, "model.vocab");
        if ((s = tok_set_id_str(t, id, k2, strlen(k2), field, err)) != ST_OK) return s;
        tok_vocab_put(t, t->id_str[id], t->id_len[id], id);
    }

    t->unk_id = -1;
    if (json_object_object_get_ex(m, "unk_token", &v) && v) {
        t->unk_id = tok_vocab_find(t, json_object_get_string(v), (size_t)json_object_get_string_len(v));
        if (t->unk_id < 0)
            return st_errf(err, ST_ERR_FORMAT, "%s: model.unk_token '%s' is not in model.vocab", t->path,
                           json_object_get_string(v));
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b); /* as tokenizers spells them: {b:#04X} */
        t->byte_id[b] = tok_vocab_find(t, t->byte_chr[b], t->byte_chr_len[b]);
        t->fallback_id[b] = tok_vocab_find(t, name, 6);
    }

    size_t nm = json_object_array_length(merges);
    t->merges_cap = tok_pow2_at_least(nm * 2 + 2);
    t->merges = calloc(t->merges_cap, sizeof *t->merges);
    char *tmp = NULL;
    size_t tmp_cap = 0;
    if (!t->merges) return st_errf(err, ST_ERR_NOMEM, "%s: out of memory", t->path);
    for (size_t i = 0; i < nm; i++) {
        json_object *e = json_object_array_get_idx(merges, i);
        const char *a = NULL, *b = NULL;
        size_t la = 0, lb = 0;
        if (json_object_is_type(e, json_type_string)) {
            /* "a b": exactly one space (byte-level tokens spell a space as U+0120) */
            const char *str = json_object_get_string(e), *sp = strchr(str, ' ');
            if (sp && !strchr(sp + 1, ' ')) {
                a = str;
                la = (size_t)(sp - str);
                b = sp + 1;
                lb = strlen(b);
            }
        } else if (json_object_is_type(e, json_type_array) && json_object_array_length(e) == 2) {
            json_object *ea = json_object_array_get_idx(e, 0), *eb = json_object_array_get_idx(e, 1);
            if (json_object_is_type(ea, json_type_string) && json_object_is_type(eb, json_type_string)) {
                a = json_object_get_string(ea);
                la = (size_t)json_object_get_string_len(ea);
                b = json_object_get_string(eb);
                lb = (size_t)json_object_get_string_len(eb);
            }
        }
        if (!a) {
            free(tmp);
            return st_errf(err, ST_ERR_FORMAT, "%s: model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]",
                           t->path, i);
        }
        if (la + lb > tmp_cap) {
            tmp_cap = (la + lb) * 2 + 64;
            char *nt = realloc(tmp, tmp_cap);
            if (!nt) { free(tmp); return st_errf(err, ST_ERR_NOMEM, "%s: out of memory", t->path); }
            tmp = nt;
        }
        memcpy(tmp, a, la);
        memcpy(tmp + la, b, lb);
        int32_t ia = tok_vocab_find(t, a, la), ib = tok_vocab_find(t, b, lb), iab = tok_vocab_find(t, tmp, la + lb);
        if (ia < 0 || ib < 0 || iab < 0) {
            st_errf(err, ST_ERR_FORMAT, "%s: model.merges[%zu] ('%.*s' '%.*s'): token '%.*s' is not in model.vocab",
                    t->path, i, (int)la, a, (int)lb, b, ia < 0 ? (int)la : ib < 0 ? (int)lb : (int)(la + lb),
                    ia < 0 ? a : ib < 0 ? b : tmp);
            free(tmp);
            return ST_ERR_FORMAT;
        }
        tok_merge_put(t, ia, ib, (uint32_t)i, iab);
    }
    free(tmp);
    return ST_OK;
}

static st_status load_added(st_tokenizer *t, json_object *added, st_err *err) {
    for (int b = 0; b < 256; b++) t->added_first[ADDED_RAW][b] = t->added_first[ADDED_NORMALIZED][b] = -1;
    size_t n = added ? json_object_array_length(added) : 0;
    t->added = calloc(n ? n : 1, sizeof *t->added);
    if (!t->added) return st_errf(err, ST_ERR_NOMEM, "%s: out of memory", t->path);
    for (size_t i = 0; i < n; i++) {
        json_object *a = json_object_array_get_idx(added, i), *c, *idv;
        static const char *const flags[] = {"single_word", "lstrip", "rstrip"};
        for (int f = 0; f < 3; f++)
            if (get_bool(a, flags[f]))
                return st_errf(err, ST_ERR_UNSUPPORTED, "%s: added_tokens[%zu].%s true is not supported", t->path, i,
                               flags[f]);
        if (!json_object_object_get_ex(a, "content", &c) || !json_object_is_type(c, json_type_string) ||
            json_object_get_string_len(c) == 0)
            return st_errf(err, ST_ERR_FORMAT, "%s: added_tokens[%zu].content is missing or empty", t->path, i);
        json_object_object_get_ex(a, "id", &idv);
        int32_t id = (int32_t)json_object_get_int64(idv);
        char field[64];
        snprintf(field, sizeof field, "added_tokens[%zu]", i);
        st_status s = tok_set_id_str(t, id, json_object_get_string(c), (size_t)json_object_get_string_len(c), field, err);
        if (s != ST_OK) return s;
        added_tok *at = &t->added[t->n_added];
        at->s = t->id_str[id];
        at->len = t->id_len[id];
        at->id = id;
        if ((s = tok_dup_str(t, json_object_get_string(c), (size_t)json_object_get_string_len(c), &at->content, err)) !=
            ST_OK)
            return s;
        /* normalized defaults to true for a token that is not special, as AddedToken does */
        json_object *nv, *sv;
        int normalized = json_object_object_get_ex(a, "normalized", &nv)
                             ? json_object_get_boolean(nv)
                             : !(json_object_object_get_ex(a, "special", &sv) && json_object_get_boolean(sv));
        int pass = normalized ? ADDED_NORMALIZED : ADDED_RAW;
        if (normalized && t->n_norm > 0) {
            /* tokenizers looks for a normalized token's content normalized, in normalized text */
            size_t ml = 0;
            if ((s = tok_normalize(t, (const uint8_t *)at->s, at->len, &at->owned, &ml, err)) != ST_OK) {
                free(at->content);
                at->content = NULL;
                return s;
            }
            at->s = at->owned;
            at->len = (uint32_t)ml;
            /* and its token string (what decode sees) is the normalized one, as tokenizers'
             * id_to_token gives; an id the model's vocabulary also has keeps that string */
            if (tok_vocab_find(t, t->id_str[id], t->id_len[id]) != id) {
                char *ns;
                if ((s = tok_dup_str(t, at->owned, ml, &ns, err)) != ST_OK) {
                    free(at->content);
                    at->content = NULL;
                    return s;
                }
                free(t->id_str[id]);
                t->id_str[id] = ns;
                t->id_len[id] = (uint32_t)ml;
            }
        }
        t->n_added++;
        if (at->len == 0) continue;
        uint8_t first = (uint8_t)at->s[0];
        at->next = t->added_first[pass][first];
        t->added_first[pass][first] = t->n_added - 1;
    }
    return ST_OK;
}

static st_status load_root(st_tokenizer *t, json_object *root, st_err *err) {
    json_object *v, *added = NULL;
    if (!json_object_is_type(root, json_type_object))
        return st_errf(err, ST_ERR_FORMAT, "%s: the top level is not a JSON object", t->path);
    if (json_object_object_get_ex(root, "added_tokens", &v) && v) {
        if (!json_object_is_type(v, json_type_array))
            return st_errf(err, ST_ERR_FORMAT, "%s: added_tokens is not an array", t->path);
        added = v;
    }
    static const char *const must_be_null[] = {"truncation", "padding"};
    for (int i = 0; i < 2; i++)
        if (!is_null(root, must_be_null[i]))
            return st_errf(err, ST_ERR_UNSUPPORTED, "%s: %s is set: not supported (set it to null)", t->path,
                           must_be_null[i]);
    /* the post-processor only adds BOS/EOS around an encoding (add_special_tokens), which
     * st_tokenizer_encode never does: the kinds that do only that are accepted */
    if (!is_null(root, "post_processor")) {
        json_object_object_get_ex(root, "post_processor", &v);
        const char *ty = type_of(v);
        if (!ty || (strcmp(ty, "ByteLevel") != 0 && strcmp(ty, "TemplateProcessing") != 0 &&
                    strcmp(ty, "Sequence") != 0))
            return st_errf(err, ST_ERR_UNSUPPORTED, "%s: post_processor.type '%s' is not supported", t->path,
                           ty ? ty : "(missing)");
    }
    st_status s;
    if ((s = load_normalizer(t, root, err)) != ST_OK) return s;
    if ((s = load_model(t, root, added, err)) != ST_OK) return s;
    if ((s = load_added(t, added, err)) != ST_OK) return s;
    if ((s = load_pretok(t, root, err)) != ST_OK) return s;
    return load_decoder(t, root, err);
}

st_status tok_load_json(st_tokenizer *t, const char *buf, size_t len, st_err *err) {
    json_tokener *jt = json_tokener_new_ex(JSON_TOKENER_DEFAULT_DEPTH);
    if (!jt) return st_errf(err, ST_ERR_NOMEM, "tokenizer %s: out of memory", t->path);
    json_object *root = len <= (size_t)INT32_MAX ? json_tokener_parse_ex(jt, buf, (int)len) : NULL;
    enum json_tokener_error je = json_tokener_get_error(jt);
    size_t end = json_tokener_get_parse_end(jt);
    json_tokener_free(jt);
    if (!root || je != json_tokener_success) {
        json_object_put(root);
        return st_errf(err, ST_ERR_FORMAT, "tokenizer %s: malformed JSON at byte %zu: %s", t->path, end,
                       je == json_tokener_continue ? "the file ends early" : json_tokener_error_desc(je));
    }
    st_status s = load_root(t, root, err);
    json_object_put(root);
    return s;
}
