/* test_chat.c - chat templates and SFT loss masks (chat.h, st_data_pack_add_masked, the loader).
 *
 * - Each conversation of tests/fixtures/chat_convs.jsonl rendered with the Qwen2.5, Qwen2 and
 *   Llama-3 fixture directories equals the text transformers' apply_chat_template rendered, its
 *   ids equal tokenizer(text), and its assistant mask equals transformers'
 *   return_assistant_tokens_mask (tests/fixtures/chat_expected.json, tools/gen_chat_fixtures.py).
 * - The same for Qwen3 and Llama-3.1 (chat_qwen3, chat_llama31) over those conversations and
 *   seven more (tests/fixtures/chat_convs2.jsonl, chat_expected2.json): Qwen3's reasoning in
 *   <think></think> kept after the last user query and dropped before it, Llama-3.1's dated
 *   system turn.
 * - Templates are recognised however they are indented; an unknown one (another <think>
 *   handling, Llama-3.2's date of today, a changed piece of Qwen3's or Llama-3.1's, none at all)
 *   is refused quoting its first line and naming --chat_format.
 * - Packed with st_chat_pack_file, PREFIX.bin holds the ids and PREFIX.mask the mask, EOD 0.
 * - The loader gives target -1 exactly where the target token's mask byte is 0: on the chat
 *   pack in file order, and on a synthetic pack whose mask is a function of the token id,
 *   mixed with an unmasked source, shuffled, prefetched; a resumed loader continues with the
 *   same (inputs, targets) bit for bit; the shared data plane hands out the same loss_mask.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <json-c/json.h>

#include "strata/chat.h"
#include "strata/data.h"
#include "strata/tokenizer.h"
#include "testutil.h"

/* The fixture's lines (malloc'd, NUL-terminated, newline stripped). */
static int read_lines(const char *file, char **lines, int cap) {
    FILE *f = fopen(test_source_path(file), "r");
    if (!f) return -1;
    int n = 0;
    char *l = NULL;
    size_t lc = 0;
    ssize_t k;
    while (n < cap && (k = getline(&l, &lc, f)) > 0) {
        while (k && l[k - 1] == '\n') l[--k] = 0;
        lines[n++] = strdup(l);
    }
    free(l);
    fclose(f);
    return n;
}

static st_status load_dir(const char *dir, st_tokenizer **tok, st_chat_template *t, const char *fmt, st_err *err) {
    char rel[256];
    snprintf(rel, sizeof rel, "tests/fixtures/%s", dir);
    st_status rc = st_tokenizer_load(tok, test_source_path(rel), err);
    if (rc) return rc;
    return st_chat_template_init(t, st_tokenizer_chat_template(*tok), fmt,
                                 st_tokenizer_id_token(*tok, st_tokenizer_bos_id(*tok)), err);
}

/* Each line of convs rendered with each fixture directory: transformers' text, ids and mask
 * (the rows of expected under the directory's name). */
static void test_fixture_rows(const char *expected, const char *convs, int want_lines, const char *const *dirs,
                              const char *const *names, int n_dirs) {
    json_object *exp = json_object_from_file(test_source_path(expected));
    char *lines[32];
    int nl = read_lines(convs, lines, 32);
    CHECK(exp && nl == want_lines, "fixtures missing: run tools/gen_chat_fixtures.py (%s: %d lines)", convs, nl);
    if (!exp || nl < 1) return;
    for (int d = 0; d < n_dirs; d++) {
        st_tokenizer *tok = NULL;
        st_chat_template t;
        st_err err = {0};
        st_status rc = load_dir(dirs[d], &tok, &t, NULL, &err);
        CHECK(rc == ST_OK, "%s: %s", dirs[d], err.msg);
        if (rc) { st_tokenizer_free(tok); continue; }
        CHECK(!strcmp(t.name, names[d]), "%s recognised as %s", dirs[d], t.name);
        json_object *rows = NULL;
        json_object_object_get_ex(exp, dirs[d], &rows);
        CHECK(rows && (int)json_object_array_length(rows) == nl, "%s: expected rows", dirs[d]);
        st_chat_text c = {0};
        int32_t *ids = NULL;
        uint8_t *mask = NULL;
        size_t cap = 0, n = 0;
        for (int i = 0; rows && i < nl; i++) {
            json_object *row = json_object_array_get_idx(rows, i), *jt, *ji, *jm;
            json_object_object_get_ex(row, "text", &jt);
            json_object_object_get_ex(row, "ids", &ji);
            json_object_object_get_ex(row, "mask", &jm);
            rc = st_chat_render_json(&t, lines[i], strlen(lines[i]), &c, &err);
            CHECK(rc == ST_OK, "%s line %d: %s", dirs[d], i + 1, err.msg);
            if (rc) continue;
            const char *want = json_object_get_string(jt);
            size_t wl = (size_t)json_object_get_string_len(jt);
            CHECK(c.len == wl && !memcmp(c.text, want, wl), "%s line %d renders\n%s\n-- transformers:\n%s", dirs[d],
                  i + 1, c.text, want);
            rc = st_chat_encode(tok, &c, ST_CHAT_MASK_ASSISTANT, &ids, &mask, &cap, &n, &err);
            CHECK(rc == ST_OK, "%s line %d encode: %s", dirs[d], i + 1, err.msg);
            if (rc) continue;
            size_t en = json_object_array_length(ji);
            int ids_ok = n == en, mask_ok = n == en;
            for (size_t k = 0; k < n && k < en; k++) {
                ids_ok &= ids[k] == json_object_get_int(json_object_array_get_idx(ji, k));
                mask_ok &= mask[k] == json_object_get_int(json_object_array_get_idx(jm, k));
            }
            CHECK(ids_ok, "%s line %d: %zu ids, transformers %zu, or they differ", dirs[d], i + 1, n, en);
            CHECK(mask_ok, "%s line %d: the assistant mask differs from transformers'", dirs[d], i + 1);
            rc = st_chat_encode(tok, &c, ST_CHAT_MASK_ALL, &ids, &mask, &cap, &n, &err);
            size_t ones = 0;
            for (size_t k = 0; k < n; k++) ones += mask[k];
            CHECK(rc == ST_OK && ones == n, "%s line %d: --mask all leaves %zu of %zu", dirs[d], i + 1, ones, n);
        }
        free(ids);
        free(mask);
        st_chat_text_free(&c);
        st_tokenizer_free(tok);
    }
    for (int i = 0; i < nl; i++) free(lines[i]);
    json_object_put(exp);
}

static void test_recognise(void) {
    st_chat_template t;
    st_err err = {0};
    /* Qwen2's template re-indented and with its \n escapes as real newlines: still Qwen2 */
    const char *q2 = "{% for message in messages %}\n  {% if loop.first and messages[0]['role'] != 'system' %}\n"
                     "    {{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}\n  {% endif %}\n"
                     "  {{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}\n"
                     "{% endfor %}";
    CHECK(st_chat_template_init(&t, q2, NULL, NULL, &err) == ST_OK && !strcmp(t.name, "qwen2") &&
          t.default_system && !strcmp(t.default_system, "You are a helpful assistant."), "re-indented Qwen2: %s", err.msg);
    /* plain ChatML: no default system message */
    const char *cm = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                     "'<|im_end|>' + '\\n'}}{% endfor %}";
    CHECK(st_chat_template_init(&t, cm, NULL, NULL, &err) == ST_OK && !strcmp(t.name, "chatml") && !t.default_system,
          "plain ChatML: %s", err.msg);
    /* ChatML with another default system line: not guessed */
    const char *other = "{%- if messages[0]['role'] != 'system' %}{{- '<|im_start|>system\\nYou are a pirate.<|im_end|>"
                        "\\n' }}{%- endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                        "'<|im_end|>'}}";
    st_status rc = st_chat_template_init(&t, other, NULL, NULL, &err);
    CHECK(rc == ST_ERR_UNSUPPORTED && strstr(err.msg, "{%- if messages[0]['role'] != 'system' %}") &&
          strstr(err.msg, "--chat_format"), "another default system line: %d %s", rc, err.msg);
    /* Qwen3-style reasoning: refused */
    const char *q3 = "{%- if tools %}\n{%- set content = message.content.split('</think>')[-1] %}\n"
                     "{{'<|im_start|>' + message.role + '\\n<think>\\n' + '<|im_end|>'}}";
    rc = st_chat_template_init(&t, q3, NULL, NULL, &err);
    CHECK(rc == ST_ERR_UNSUPPORTED && strstr(err.msg, "\"{%- if tools %}\"") && strstr(err.msg, "think"),
          "Qwen3-style: %d %s", rc, err.msg);
    /* the unknown fixture (Llama-3.1's opening) quoted by its first line; taken with a named format */
    st_tokenizer *tok = NULL;
    rc = load_dir("chat_unknown", &tok, &t, NULL, &err);
    CHECK(rc == ST_ERR_UNSUPPORTED && strstr(err.msg, "its first line: \"{{- bos_token }}\"") &&
          strstr(err.msg, "--chat_format chatml|llama3"), "unknown template: %d %s", rc, err.msg);
    st_tokenizer_free(tok);
    tok = NULL;
    rc = load_dir("chat_unknown", &tok, &t, "llama3", &err);
    CHECK(rc == ST_ERR_INVALID && strstr(err.msg, "BOS"), "llama3 without a BOS token: %d %s", rc, err.msg);
    st_tokenizer_free(tok);
    tok = NULL;
    rc = load_dir("chat_llama3", &tok, &t, "chatml", &err); /* the family named wins, without extras */
    CHECK(rc == ST_OK && t.format == ST_CHAT_CHATML && !t.default_system, "--chat_format chatml: %s", err.msg);
    st_tokenizer_free(tok);
    CHECK(st_chat_template_init(&t, NULL, NULL, NULL, &err) == ST_ERR_INVALID && strstr(err.msg, "--chat_format"),
          "no template: %s", err.msg);
    CHECK(st_chat_template_init(&t, cm, "vicuna", NULL, &err) == ST_ERR_INVALID && strstr(err.msg, "vicuna"),
          "bad format: %s", err.msg);
    /* Llama-3's trim is Python's str.strip: U+3000, U+2028, U+0085 go, U+200B (not a space) stays */
    CHECK(st_chat_template_init(&t, NULL, "llama3", "<B>", &err) == ST_OK, "%s", err.msg);
    st_chat_msg m[2] = {{"user", "\xe3\x80\x80 hi \xe2\x80\xa8\xc2\x85", 0}, {"assistant", "\xe2\x80\x8bok\n", 0}};
    m[0].content_len = strlen(m[0].content);
    m[1].content_len = strlen(m[1].content);
    st_chat_text c = {0};
    rc = st_chat_render(&t, m, 2, &c, &err);
    const char *want = "<B><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant"
                       "<|end_header_id|>\n\n\xe2\x80\x8bok<|eot_id|>";
    CHECK(rc == ST_OK && !strcmp(c.text, want) && c.n_span == 2 &&
          !strcmp(c.text + c.span[0], "\xe2\x80\x8bok<|eot_id|>") && c.span[1] == c.len, "trim: %s", c.text);
    st_chat_msg bad = {"tool", "x", 1};
    CHECK(st_chat_render(&t, &bad, 1, &c, &err) == ST_ERR_UNSUPPORTED && strstr(err.msg, "tool"), "role tool: %s",
          err.msg);
    CHECK(st_chat_render_json(&t, "{\"messages\": [{\"role\": \"user\"}]}", 33, &c, &err) == ST_ERR_FORMAT &&
          strstr(err.msg, "\"messages\"[0]"), "no content: %s", err.msg);
    st_chat_text_free(&c);
}

/* s with the first `from` replaced by `to` (malloc'd); NULL when from is not in s. */
static char *replace1(const char *s, const char *from, const char *to) {
    const char *at = strstr(s, from);
    if (!at) return NULL;
    size_t a = (size_t)(at - s), fl = strlen(from), tl = strlen(to), n = strlen(s);
    char *o = malloc(n - fl + tl + 1);
    if (!o) return NULL;
    memcpy(o, s, a);
    memcpy(o + a, to, tl);
    memcpy(o + a + tl, at + fl, n - a - fl + 1);
    return o;
}

/* Init from a template made by replacing `from` with `to` in the template of fixture dir:
 * the status, with the message in err. */
static st_status init_edited(const char *dir, const char *from, const char *to, st_chat_template *t, st_err *err) {
    st_tokenizer *tok = NULL;
    st_chat_template t0;
    st_status rc = load_dir(dir, &tok, &t0, NULL, err);
    CHECK(rc == ST_OK, "%s: %s", dir, err->msg);
    char *edited = rc ? NULL : replace1(st_tokenizer_chat_template(tok), from, to);
    CHECK(rc || edited, "%s: '%s' is not in its template", dir, from);
    rc = edited ? st_chat_template_init(t, edited, NULL, "<|begin_of_text|>", err) : ST_ERR_INVALID;
    free(edited);
    st_tokenizer_free(tok);
    return rc;
}

/* Qwen3 and Llama-3.1 are recognised by every piece that renders their conversations: one piece
 * changed is refused; --chat_format names them; Qwen3 refuses reasoning_content. */
static void test_recognise_more(void) {
    st_chat_template t;
    st_err err = {0};
    /* re-indented: still recognised */
    st_status rc = init_edited("chat_qwen3", "{%- for message in messages %}\n",
                               "{%- for message in messages %}\n\n      ", &t, &err);
    CHECK(rc == ST_OK && t.format == ST_CHAT_QWEN3 && !strcmp(t.name, "qwen3") && !t.default_system,
          "re-indented Qwen3: %s", err.msg);
    rc = init_edited("chat_llama31", "{{- system_message }}", "\t{{-   system_message  }}", &t, &err);
    CHECK(rc == ST_OK && t.format == ST_CHAT_LLAMA31 && !strcmp(t.name, "llama3.1") &&
              !strcmp(t.bos, "<|begin_of_text|>"),
          "re-indented Llama-3.1: %s", err.msg);
    /* one piece changed: refused, naming why and --chat_format */
    static const struct { const char *dir, *from, *to, *why; } bad[] = {
        {"chat_qwen3", "last_query_index=messages|length - 1", "last_query_index=0", "not as Qwen3's"},
        {"chat_qwen3", "'\\n</think>\\n\\n' + content.lstrip('\\n')", "'\\n</think>\\n' + content",
         "not as Qwen3's"},
        {"chat_qwen3", "{%- if messages[0].role == 'system' %}\n        {{- '<|im_start|>system\\n' + "
                       "messages[0].content + '<|im_end|>\\n' }}\n    {%- endif %}",
         "{{- '<|im_start|>system\\nYou are Qwen.<|im_end|>\\n' }}", "not as Qwen3's"},
        {"chat_llama31", "26 Jul 2024", "01 Jan 2025", "not Llama-3.1's"},
        {"chat_llama31", "{%- set date_string = \"26 Jul 2024\" %}",
         "{%- set date_string = strftime_now(\"%d %b %Y\") %}", "today's date"},
        {"chat_llama31", "message['content'] | trim + '<|eot_id|>'", "message['content'] + '<|eot_id|>'",
         "not Llama-3.1's"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        rc = init_edited(bad[i].dir, bad[i].from, bad[i].to, &t, &err);
        CHECK(rc == ST_ERR_UNSUPPORTED && strstr(err.msg, bad[i].why) &&
                  strstr(err.msg, "--chat_format chatml|llama3|qwen3|llama3.1"),
              "%s with '%s' changed: %s %s", bad[i].dir, bad[i].from, st_status_name(rc), err.msg);
    }
    /* named formats: any template, the family's rendering */
    CHECK(st_chat_template_init(&t, "{{ x }}", "qwen3", NULL, &err) == ST_OK && t.format == ST_CHAT_QWEN3 &&
              !strcmp(t.name, "qwen3"), "--chat_format qwen3: %s", err.msg);
    CHECK(st_chat_template_init(&t, "{{ x }}", "llama3.1", NULL, &err) == ST_ERR_INVALID && strstr(err.msg, "BOS"),
          "--chat_format llama3.1 without a BOS: %s", err.msg);
    CHECK(st_chat_template_init(&t, NULL, "llama3.1", "<B>", &err) == ST_OK && t.format == ST_CHAT_LLAMA31,
          "--chat_format llama3.1: %s", err.msg);
    st_chat_text c = {0};
    st_chat_msg sys_only = {"system", " \n only a system message\t", 0};
    sys_only.content_len = strlen(sys_only.content);
    CHECK(st_chat_render(&t, &sys_only, 1, &c, &err) == ST_OK &&
              !strcmp(c.text, "<B><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
                              "Today Date: 26 Jul 2024\n\nonly a system message<|eot_id|>") && c.n_span == 0,
          "Llama-3.1, one system message: %s", c.text);
    /* Qwen3: reasoning_content refused (strata renders the reasoning from the content) */
    CHECK(st_chat_template_init(&t, NULL, "qwen3", NULL, &err) == ST_OK, "%s", err.msg);
    const char *rj = "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", "
                     "\"content\": \"a\", \"reasoning_content\": \"r\"}]}";
    rc = st_chat_render_json(&t, rj, strlen(rj), &c, &err);
    CHECK(rc == ST_ERR_UNSUPPORTED && strstr(err.msg, "\"messages\"[1] has reasoning_content") &&
              strstr(err.msg, "<think>"), "Qwen3 reasoning_content: %s %s", st_status_name(rc), err.msg);
    st_chat_text_free(&c);
}

/* Pack the Qwen2.5 conversations, then check the files and the loader over them. */
static void test_pack_and_loader(const char *tmp) {
    st_tokenizer *tok = NULL;
    st_chat_template t;
    st_err err = {0};
    if (load_dir("chat_qwen25", &tok, &t, NULL, &err)) {
        CHECK(0, "%s", err.msg);
        st_tokenizer_free(tok);
        return;
    }
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s/sft", tmp);
    st_data_pack_writer *w = NULL;
    st_data_pack_meta meta = {.vocab_size = (int64_t)st_tokenizer_vocab_size(tok), .eod = st_tokenizer_eos_id(tok),
                           .tokenizer = "chat_qwen25", .mask_kind = "assistant"};
    st_chat_pack_stats cs = {0};
    st_status rc = st_data_pack_open(&w, prefix, ST_DATA_DTYPE_U16, &err);
    if (!rc) rc = st_data_pack_set_meta(w, &meta, &err);
    if (!rc) rc = st_chat_pack_file(w, tok, &t, ST_CHAT_MASK_ASSISTANT, (int32_t)meta.eod, 2,
                                    test_source_path("tests/fixtures/chat_convs.jsonl"), &cs, &err);
    if (!rc) rc = st_data_pack_close(w, &err);
    else st_data_pack_abort(w);
    CHECK(rc == ST_OK && cs.docs == 5, "pack: %s", err.msg);
    st_tokenizer_free(tok);
    if (rc) return;
    /* the files: ids and mask as the fixture says, the end-of-document id after each with mask 0 */
    json_object *exp = json_object_from_file(test_source_path("tests/fixtures/chat_expected.json")), *rows = NULL;
    json_object_object_get_ex(exp, "chat_qwen25", &rows);
    char path[600];
    snprintf(path, sizeof path, "%s.bin", prefix);
    size_t nb = 0, nm = 0;
    unsigned char *bin = test_slurp(path, &nb);
    snprintf(path, sizeof path, "%s.mask", prefix);
    unsigned char *mk = test_slurp(path, &nm);
    snprintf(path, sizeof path, "%s.json", prefix);
    size_t nj = 0;
    unsigned char *js = test_slurp(path, &nj);
    CHECK(js && strstr((char *)js, "\"mask\":\"sft.mask\"") && strstr((char *)js, "\"mask_kind\":\"assistant\""),
          "sidecar: %s", js ? (char *)js : "(none)");
    free(js);
    size_t at = 0;
    int ok = bin && mk && nm * 2 == nb && rows;
    for (int i = 0; ok && i < (int)json_object_array_length(rows); i++) {
        json_object *row = json_object_array_get_idx(rows, i), *ji, *jm;
        json_object_object_get_ex(row, "ids", &ji);
        json_object_object_get_ex(row, "mask", &jm);
        size_t n = json_object_array_length(ji);
        for (size_t k = 0; ok && k <= n; k++, at++) {
            uint16_t v;
            if (at >= nm) { ok = 0; break; }
            memcpy(&v, bin + 2 * at, 2);
            int want_id = k < n ? json_object_get_int(json_object_array_get_idx(ji, k)) : (int)meta.eod;
            int want_m = k < n ? json_object_get_int(json_object_array_get_idx(jm, k)) : 0;
            ok = v == want_id && mk[at] == want_m;
        }
    }
    CHECK(ok && at == nm, "packed ids/mask differ from the fixture at token %zu of %zu", at, nm);
    /* the loader in file order: sample 0 is tokens [0, T], so targets are -1 where mask[t+1] is 0 */
    st_data_loader_config cfg;
    st_data_loader_config_init(&cfg);
    cfg.n_sources = 1;
    cfg.sources[0].path = prefix;
    cfg.T = 64, cfg.B = 2, cfg.no_shuffle = 1, cfg.prefetch = 0, cfg.vocab_size = meta.vocab_size;
    st_data_loader *dl = NULL;
    rc = st_data_loader_open(&dl, &cfg, &err);
    CHECK(rc == ST_OK, "loader: %s", err.msg);
    if (!rc) {
        st_data_batch b;
        int32_t in[128], tg[128];
        rc = st_data_loader_next(dl, &b, &err);
        CHECK(rc == ST_OK, "next: %s", err.msg);
        if (!rc) {
            st_data_batch_targets(&b, in, tg);
            int good = 1, masked = 0;
            for (int r = 0; r < 2; r++)
                for (int k = 0; k < 64; k++) {
                    size_t tok_at = (size_t)r * 64 + (size_t)k + 1; /* the target's index in the file */
                    uint16_t v;
                    memcpy(&v, bin + 2 * tok_at, 2);
                    int32_t want = mk[tok_at] ? v : -1;
                    good &= tg[r * 64 + k] == want && b.tokens[r * 65 + k + 1] == v;
                    masked += want < 0;
                }
            CHECK(good && masked > 0 && masked < 128, "file-order targets are not -1 exactly where masked (%d masked)",
                  masked);
        }
        st_data_loader_close(dl);
    }
    free(bin);
    free(mk);
    json_object_put(exp);
}

#define SYN_MASK(tok) ((tok) % 3 != 0) /* the synthetic pack's mask: a function of the token id */

static int run_steps(st_data_loader *dl, int n, int32_t *in, int32_t *tg, int B, int T, st_err *err) {
    for (int s = 0; s < n; s++) {
        st_data_batch b;
        if (st_data_loader_next(dl, &b, err)) return -1;
        st_data_batch_targets(&b, in + (size_t)s * B * T, tg + (size_t)s * B * T);
    }
    return 0;
}

static void test_mix_shuffle_resume(const char *tmp) {
    st_err err = {0};
    char masked[512], plain[512];
    snprintf(masked, sizeof masked, "%s/syn", tmp);
    snprintf(plain, sizeof plain, "%s/plain", tmp);
    /* 40 documents of 5..44 tokens in [1, 99], mask by id; a plain pack without a mask */
    st_data_pack_writer *w = NULL;
    st_data_pack_meta meta = {.vocab_size = 100, .eod = 0, .tokenizer = "syn", .mask_kind = "assistant"};
    st_status rc = st_data_pack_open(&w, masked, ST_DATA_DTYPE_U16, &err);
    if (!rc) rc = st_data_pack_set_meta(w, &meta, &err);
    uint32_t x = 12345;
    for (int d = 0; d < 40 && !rc; d++) {
        int32_t tk[64];
        uint8_t m[64];
        int n = 5 + d;
        for (int i = 0; i < n; i++) {
            x = x * 1103515245u + 12345u;
            tk[i] = 1 + (int32_t)((x >> 16) % 99);
            m[i] = SYN_MASK(tk[i]);
        }
        rc = st_data_pack_add_masked(w, tk, m, (size_t)n, &err);
    }
    /* mixing documents with and without masks is refused */
    int32_t one = 5;
    if (!rc) {
        st_err e2 = {0};
        CHECK(st_data_pack_add(w, &one, 1, &e2) == ST_ERR_INVALID && strstr(e2.msg, "mask"), "unmasked doc: %s", e2.msg);
    }
    if (!rc) rc = st_data_pack_close(w, &err);
    else st_data_pack_abort(w);
    CHECK(rc == ST_OK, "synthetic pack: %s", err.msg);
    w = NULL;
    rc = st_data_pack_open(&w, plain, ST_DATA_DTYPE_U16, &err);
    if (!rc) rc = st_data_pack_set_meta(w, &meta, &err);
    for (int d = 0; d < 20 && !rc; d++) {
        int32_t tk[30];
        for (int i = 0; i < 30; i++) tk[i] = 1 + (d * 7 + i) % 99;
        rc = st_data_pack_add(w, tk, 30, &err);
    }
    if (!rc) rc = st_data_pack_close(w, &err);
    else st_data_pack_abort(w);
    CHECK(rc == ST_OK, "plain pack: %s", err.msg);
    if (rc) return;

    enum { T = 16, B = 3, STEPS = 8, CUT = 3 };
    st_data_loader_config cfg;
    st_data_loader_config_init(&cfg);
    cfg.n_sources = 2;
    cfg.sources[0] = (st_data_source_config){.path = masked, .weight = 0.6};
    cfg.sources[1] = (st_data_source_config){.path = plain, .weight = 0.4};
    cfg.T = T, cfg.B = B, cfg.seed = 7, cfg.prefetch = 2, cfg.vocab_size = 100;
    static int32_t in[STEPS * B * T], tg[STEPS * B * T], in2[STEPS * B * T], tg2[STEPS * B * T];
    st_data_loader *dl = NULL;
    rc = st_data_loader_open(&dl, &cfg, &err);
    CHECK(rc == ST_OK, "open: %s", err.msg);
    if (rc) return;
    st_data_loader_state st;
    rc = run_steps(dl, CUT, in, tg, B, T, &err);
    st_data_loader_get_state(dl, &st);
    if (!rc) rc = run_steps(dl, STEPS - CUT, in + CUT * B * T, tg + CUT * B * T, B, T, &err);
    CHECK(rc == ST_OK, "steps: %s", err.msg);
    st_data_loader_close(dl);
    /* every target: -1 iff it comes from the masked source and its id's mask is 0 (or it is
     * impossible to tell: EOD 0, mask 1 there since 0 % 3 == 0 -> masked too) */
    int bad = 0, n_masked = 0, n_kept = 0;
    dl = NULL;
    rc = st_data_loader_open(&dl, &cfg, &err);
    for (int s = 0; !rc && s < STEPS; s++) {
        st_data_batch b;
        rc = st_data_loader_next(dl, &b, &err);
        for (int r = 0; !rc && r < B; r++)
            for (int t = 0; t < T; t++) {
                int32_t tok = b.tokens[r * (T + 1) + t + 1], got = tg[(s * B + r) * T + t];
                int want_masked = b.source[r] == 0 && !SYN_MASK(tok);
                bad += want_masked ? got != -1 : got != tok;
                bad += in[(s * B + r) * T + t] != b.tokens[r * (T + 1) + t] || b.tokens[r * (T + 1) + t] < 0;
                n_masked += want_masked;
                n_kept += !want_masked;
            }
    }
    CHECK(rc == ST_OK && bad == 0 && n_masked > 0 && n_kept > 0, "mixed, shuffled: %d targets wrong (%d masked, %d kept): %s",
          bad, n_masked, n_kept, err.msg);
    /* resume after CUT steps, and once more without prefetch: the same inputs and targets */
    if (!rc) rc = st_data_loader_set_state(dl, &st, &err);
    if (!rc) rc = run_steps(dl, STEPS - CUT, in2 + CUT * B * T, tg2 + CUT * B * T, B, T, &err);
    size_t off = (size_t)CUT * B * T, len = (size_t)(STEPS - CUT) * B * T * sizeof(int32_t);
    CHECK(rc == ST_OK && !memcmp(in + off, in2 + off, len) && !memcmp(tg + off, tg2 + off, len),
          "resumed stream differs: %s", err.msg);
    st_data_loader_close(dl);
    cfg.prefetch = 0;
    dl = NULL;
    rc = st_data_loader_open(&dl, &cfg, &err);
    memset(in2, 0, sizeof in2);
    memset(tg2, 0, sizeof tg2);
    if (!rc) rc = st_data_loader_set_state(dl, &st, &err);
    if (!rc) rc = run_steps(dl, STEPS - CUT, in2 + CUT * B * T, tg2 + CUT * B * T, B, T, &err);
    CHECK(rc == ST_OK && !memcmp(in + off, in2 + off, len) && !memcmp(tg + off, tg2 + off, len),
          "resumed without prefetch differs: %s", err.msg);
    st_data_loader_close(dl);
    /* a mask file of the wrong size is refused by name */
    char mpath[600];
    snprintf(mpath, sizeof mpath, "%s.mask", masked);
    FILE *f = fopen(mpath, "ab");
    if (f) {
        fputc(1, f);
        fclose(f);
    }
    st_data_source *src = NULL;
    st_data_source_config sc = {.path = masked};
    rc = st_data_source_open(&src, &sc, &err);
    CHECK(rc == ST_ERR_FORMAT && strstr(err.msg, "syn.mask") && strstr(err.msg, "one byte a token"), "bad mask: %s",
          err.msg);
    st_data_source_close(src);
}

/* The shared data plane hands out the masked loss_mask a private loader gives (child process:
 * the consumer; this process: the producer). */
static int plane_consumer(const char *name, const st_data_loader_config *cfg) {
    st_err err = {0};
    st_data_plane *p;
    st_data_loader *dl;
    if (st_data_plane_attach(&p, name, 0, 20.0, &err) || st_data_loader_open(&dl, cfg, &err)) {
        fprintf(stderr, "plane consumer: %s\n", err.msg);
        return 1;
    }
    int bad = 0, zeros = 0;
    for (int s = 0; s < 8; s++) {
        st_data_batch a, b;
        if (st_data_plane_next(p, &a, &err) || st_data_loader_next(dl, &b, &err)) {
            fprintf(stderr, "plane consumer: %s\n", err.msg);
            return 1;
        }
        size_t ni = (size_t)b.B * b.T;
        bad += memcmp(a.loss_mask, b.loss_mask, ni) != 0 || memcmp(a.tokens, b.tokens, ni / b.T * (b.T + 1) * 4) != 0;
        for (size_t i = 0; i < ni; i++) zeros += !a.loss_mask[i];
    }
    st_data_loader_close(dl);
    st_data_plane_close(p);
    if (bad || !zeros) fprintf(stderr, "plane consumer: %d batches differ, %d masked targets\n", bad, zeros);
    return bad || !zeros;
}

static void test_plane(const char *tmp) {
    char masked[512], name[64];
    snprintf(masked, sizeof masked, "%s/sft", tmp); /* test_pack_and_loader's chat pack */
    snprintf(name, sizeof name, "strata-test-chat-%d", (int)getpid());
    st_data_loader_config cfg;
    st_data_loader_config_init(&cfg);
    cfg.n_sources = 1;
    cfg.sources[0].path = masked;
    cfg.T = 32, cfg.B = 2, cfg.seed = 3, cfg.prefetch = 2, cfg.vocab_size = 608;
    fflush(NULL);
    pid_t kid = fork(); /* no thread of this process is alive here */
    if (kid == 0) _exit(plane_consumer(name, &cfg));
    st_err err = {0};
    st_data_plane *p = NULL;
    CHECK(st_data_plane_serve(&p, name, &cfg, 0, 1, 0, &err) == ST_OK, "serve: %s", err.msg);
    int st = 0;
    waitpid(kid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the plane's consumer saw another loss_mask (status %d)", st);
    st_data_plane_close(p);
}

int main(void) {
    static const char *const dirs[] = {"chat_qwen25", "chat_qwen2", "chat_llama3"};
    static const char *const names[] = {"qwen2.5", "qwen2", "llama3"};
    test_fixture_rows("tests/fixtures/chat_expected.json", "tests/fixtures/chat_convs.jsonl", 5, dirs, names, 3);
    /* Qwen3 (reasoning kept after the last query, dropped before it) and Llama-3.1 (the dated
     * system turn) on those conversations and seven more */
    static const char *const dirs2[] = {"chat_qwen3", "chat_llama31"};
    static const char *const names2[] = {"qwen3", "llama3.1"};
    test_fixture_rows("tests/fixtures/chat_expected2.json", "tests/fixtures/chat_convs2.jsonl", 12, dirs2, names2, 2);
    test_recognise_more();
    test_recognise();
    const char *tmp = test_tmpdir();
    test_pack_and_loader(tmp);
    test_mix_shuffle_resume(tmp);
    test_plane(tmp);
    return test_finish("chat");
}
