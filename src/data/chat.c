/* chat.c - chat templates (ChatML as Qwen2/2.5 use it, Qwen3's, Llama-3's and 3.1's) rendered as
 * transformers renders them, the assistant mask over the tokens, and packing JSON lines of
 * conversations (chat.h).
 *
 * The templates are not interpreted: strata knows the families' renderings and recognises a
 * tokenizer_config.json template by pieces of its text. A Jinja interpreter would accept
 * templates whose rendering nobody checked; this refuses them and says so.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "strata/chat.h"

/* ---- recognising a template ------------------------------------------------------- */

/* The template without whitespace and without the two-character escape \n (a Jinja string
 * literal's newline), so pieces match however the file indents or escapes them. */
static char *squeeze(const char *s) {
    size_t n = strlen(s), k = 0;
    char *o = malloc(n + 1);
    if (!o) return NULL;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\\' && (s[i + 1] == 'n' || s[i + 1] == 't')) { i++; continue; }
        if (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') continue;
        o[k++] = s[i];
    }
    o[k] = 0;
    return o;
}

#define QWEN25_SYSTEM "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
#define QWEN2_SYSTEM "You are a helpful assistant."

static st_status refuse(const char *text, const char *why, st_err *err) {
    size_t n = strcspn(text, "\n");
    return st_errf(err, ST_ERR_UNSUPPORTED,
                   "chat_template not recognised (%s); its first line: \"%.*s%s\". strata renders ChatML as Qwen2/2.5 "
                   "use it, Qwen3's, Llama-3's and Llama-3.1's templates; if the data should be rendered as one of "
                   "those, say so with --chat_format chatml|llama3|qwen3|llama3.1", why, (int)(n > 160 ? 160 : n), text,
                   n > 160 ? "..." : "");
}

/* The pieces of Qwen3's template (squeezed) that render system, user and assistant messages,
 * in this order: the first system message, the last user query (a user message that is not a
 * tool response), each message with the assistant's reasoning cut out of its content and put
 * back in a think block after the last query, <|im_end|>. What lies between them renders tools,
 * tool calls and the generation prompt, which strata refuses or does not use. */
static const char *const QWEN3_PIECES[] = {
    "{%-ifmessages[0].role=='system'%}{{-'<|im_start|>system'+messages[0].content+'<|im_end|>'}}{%-endif%}"
    "{%-endif%}",
    "{%-setns=namespace(multi_step_tool=true,last_query_index=messages|length-1)%}{%-formessageinmessages[::-1]%}"
    "{%-setindex=(messages|length-1)-loop.index0%}{%-ifns.multi_step_toolandmessage.role==\"user\"andmessage."
    "contentisstringandnot(message.content.startswith('<tool_response>')andmessage.content.endswith('</tool_"
    "response>'))%}{%-setns.multi_step_tool=false%}{%-setns.last_query_index=index%}{%-endif%}{%-endfor%}",
    "{%-formessageinmessages%}{%-ifmessage.contentisstring%}{%-setcontent=message.content%}{%-else%}{%-set"
    "content=''%}{%-endif%}{%-if(message.role==\"user\")or(message.role==\"system\"andnotloop.first)%}{{-'<|im_"
    "start|>'+message.role+''+content+'<|im_end|>'+''}}{%-elifmessage.role==\"assistant\"%}{%-setreasoning_"
    "content=''%}{%-ifmessage.reasoning_contentisstring%}{%-setreasoning_content=message.reasoning_content%}"
    "{%-else%}{%-if'</think>'incontent%}{%-setreasoning_content=content.split('</think>')[0].rstrip('').split("
    "'<think>')[-1].lstrip('')%}{%-setcontent=content.split('</think>')[-1].lstrip('')%}{%-endif%}{%-endif%}"
    "{%-ifloop.index0>ns.last_query_index%}{%-ifloop.lastor(notloop.lastandreasoning_content)%}{{-'<|im_start"
    "|>'+message.role+'<think>'+reasoning_content.strip('')+'</think>'+content.lstrip('')}}{%-else%}{{-'<|im_"
    "start|>'+message.role+''+content}}{%-endif%}{%-else%}{{-'<|im_start|>'+message.role+''+content}}{%-endif%}",
    "{{-'<|im_end|>'}}{%-elifmessage.role==\"tool\"%}",
};

/* Llama-3.1's: BOS, the fixed date, the first system message taken out (trimmed), the system
 * turn with the knowledge cutoff and the date, then each message as Llama-3's. */
static const char *const LLAMA31_PIECES[] = {
    "{{-bos_token}}",
    "{%-ifnotdate_stringisdefined%}{%-setdate_string=\"26Jul2024\"%}{%-endif%}",
    "{%-ifmessages[0]['role']=='system'%}{%-setsystem_message=messages[0]['content']|trim%}{%-setmessages="
    "messages[1:]%}{%-else%}{%-setsystem_message=\"\"%}{%-endif%}",
    "{{-\"<|start_header_id|>system<|end_header_id|>\"}}{%-ifbuiltin_toolsisdefinedortoolsisnotnone%}",
    "{{-\"CuttingKnowledgeDate:December2023\"}}{{-\"TodayDate:\"+date_string+\"\"}}{%-iftoolsisnotnoneand"
    "nottools_in_user_message%}",
    "{{-system_message}}{{-\"<|eot_id|>\"}}",
    "{%-formessageinmessages%}{%-ifnot(message.role=='ipython'ormessage.role=='tool'or'tool_calls'inmessage)%}"
    "{{-'<|start_header_id|>'+message['role']+'<|end_header_id|>'+message['content']|trim+'<|eot_id|>'}}{%-elif"
    "'tool_calls'inmessage%}",
};

/* Every piece in sq, each after the one before. */
static int pieces_in_order(const char *sq, const char *const *pieces, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const char *at = strstr(sq, pieces[i]);
        if (!at) return 0;
        sq = at + strlen(pieces[i]);
    }
    return 1;
}

/* The family of a template text, or ST_CHAT_NONE with *why set. */
static st_chat_format recognise(const char *sq, const char **name, const char **sys, const char **why) {
    *sys = NULL;
    *why = "no known family's pieces";
    if (pieces_in_order(sq, QWEN3_PIECES, sizeof QWEN3_PIECES / sizeof *QWEN3_PIECES) &&
        !strstr(sq, "<|im_start|>systemYou")) {
        *name = "qwen3";
        return ST_CHAT_QWEN3;
    }
    if (strstr(sq, "<think>") || strstr(sq, "reasoning_content")) {
        *why = "it renders reasoning (<think>), but not as Qwen3's template does";
        return ST_CHAT_NONE;
    }
    if (strstr(sq, "<|im_start|>") && strstr(sq, "<|im_end|>") &&
        (strstr(sq, "'<|im_start|>'+message['role']+'") || strstr(sq, "'<|im_start|>'+message.role+'"))) {
        if (strstr(sq, "YouareQwen,createdbyAlibabaCloud.Youareahelpfulassistant.")) {
            *name = "qwen2.5", *sys = QWEN25_SYSTEM;
            return ST_CHAT_CHATML;
        }
        if (strstr(sq, "'<|im_start|>systemYouareahelpfulassistant.<|im_end|>'")) {
            *name = "qwen2", *sys = QWEN2_SYSTEM;
            return ST_CHAT_CHATML;
        }
        if (strstr(sq, "<|im_start|>system")) {
            *why = "ChatML with a default system message strata does not know";
            return ST_CHAT_NONE;
        }
        *name = "chatml";
        return ST_CHAT_CHATML;
    }
    if (!strncmp(sq, "{{-bos_token}}", 14) && !strstr(sq, "strftime_now") &&
        pieces_in_order(sq, LLAMA31_PIECES, sizeof LLAMA31_PIECES / sizeof *LLAMA31_PIECES)) {
        *name = "llama3.1";
        return ST_CHAT_LLAMA31;
    }
    if (strstr(sq, "CuttingKnowledgeDate")) {
        *why = strstr(sq, "strftime_now") ? "a dated system header with today's date (Llama-3.2's) is not rendered"
                                          : "a dated system header that is not Llama-3.1's";
        return ST_CHAT_NONE;
    }
    if (strstr(sq, "'<|start_header_id|>'+message['role']+'<|end_header_id|>") &&
        strstr(sq, "message['content']|trim+'<|eot_id|>'") && strstr(sq, "bos_token+content")) {
        *name = "llama3";
        return ST_CHAT_LLAMA3;
    }
    return ST_CHAT_NONE;
}

st_status st_chat_template_init(st_chat_template *t, const char *template_text, const char *format,
                                const char *bos_text, st_err *err) {
    memset(t, 0, sizeof *t);
    static const char *const FORMAT_NAME[] = {NULL, "chatml", "llama3", "qwen3", "llama3.1"};
    st_chat_format want = ST_CHAT_NONE;
    if (format) {
        for (int f = ST_CHAT_CHATML; f <= ST_CHAT_LLAMA31; f++)
            if (!strcmp(format, FORMAT_NAME[f])) want = (st_chat_format)f;
        if (want == ST_CHAT_NONE)
            return st_errf(err, ST_ERR_INVALID, "--chat_format '%s': give chatml, llama3, qwen3 or llama3.1", format);
    }
    st_chat_format got = ST_CHAT_NONE;
    const char *name = NULL, *sys = NULL, *why = "the tokenizer has no chat_template";
    if (template_text) {
        char *sq = squeeze(template_text);
        if (!sq) return st_errf(err, ST_ERR_NOMEM, "chat template: out of memory");
        got = recognise(sq, &name, &sys, &why);
        free(sq);
    }
    if (want == ST_CHAT_NONE) {
        if (got == ST_CHAT_NONE) {
            if (!template_text)
                return st_errf(err, ST_ERR_INVALID, "the tokenizer has no chat_template (tokenizer_config.json "
                               "or chat_template.jinja); give --chat_format chatml|llama3|qwen3|llama3.1");
            return refuse(template_text, why, err);
        }
        want = got;
    } else if (got != want) {
        sys = NULL; /* the family named, without the unknown template's extras */
        name = FORMAT_NAME[want];
    }
    t->format = want;
    t->name = name;
    t->default_system = sys;
    if (want == ST_CHAT_LLAMA3 || want == ST_CHAT_LLAMA31) {
        if (!bos_text || !*bos_text || strlen(bos_text) >= sizeof t->bos)
            return st_errf(err, ST_ERR_INVALID, "the Llama-3 templates begin with the BOS token, but the tokenizer "
                           "names none (tokenizer_config.json bos_token)");
        snprintf(t->bos, sizeof t->bos, "%s", bos_text);
    }
    return ST_OK;
}

/* ---- rendering ---------------------------------------------------------------------- */

static int put(st_chat_text *c, const char *s, size_t n) {
    if (c->len + n + 1 > c->cap) {
        size_t nc = (c->len + n + 1) * 2 + 256;
        char *t = realloc(c->text, nc);
        if (!t) return -1;
        c->text = t, c->cap = nc;
    }
    memcpy(c->text + c->len, s, n);
    c->len += n;
    c->text[c->len] = 0;
    return 0;
}
#define PUTS(c, s) put(c, s, strlen(s))

static int mark(st_chat_text *c, size_t pos) {
    if (c->n_span == c->span_cap) {
        size_t nc = c->span_cap ? c->span_cap * 2 : 16;
        size_t *s = realloc(c->span, nc * sizeof *s);
        if (!s) return -1;
        c->span = s, c->span_cap = nc;
    }
    c->span[c->n_span++] = pos;
    return 0;
}

/* Python's str.isspace for the code points Jinja's trim strips. */
static int py_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
           cp == 0x3000;
}

/* The code point at s[i] (n bytes left) and its length; an invalid byte is one code point
 * that is not a space. */
static uint32_t utf8_at(const unsigned char *s, size_t n, size_t *len) {
    unsigned c = s[0];
    int k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!k || (size_t)k > n) { *len = 1; return 0xfffd; }
    uint32_t cp = k == 1 ? c : c & (0x7f >> k);
    for (int j = 1; j < k; j++) {
        if ((s[j] & 0xc0) != 0x80) { *len = 1; return 0xfffd; }
        cp = cp << 6 | (s[j] & 0x3f);
    }
    *len = (size_t)k;
    return cp;
}

/* Jinja's trim: [*a, *b) of s without leading and trailing whitespace. */
static void trim(const char *s, size_t n, size_t *a, size_t *b) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, l;
    while (i < n && py_space(utf8_at(u + i, n - i, &l))) i += l;
    size_t e = n;
    while (e > i) {
        size_t st = e - 1;
        while (st > i && e - st < 4 && (u[st] & 0xc0) == 0x80) st--; /* start of the last code point */
        if (utf8_at(u + st, e - st, &l) != 0xfffd && st + l == e && py_space(utf8_at(u + st, e - st, &l))) e = st;
        else break;
    }
    *a = i, *b = e;
}

/* The last occurrence of pat in s[0, n), or NULL. */
static const char *memrmem_str(const char *s, size_t n, const char *pat) {
    size_t pl = strlen(pat);
    for (size_t i = n >= pl ? n - pl + 1 : 0; i-- > 0;)
        if (!memcmp(s + i, pat, pl)) return s + i;
    return NULL;
}

/* Python's lstrip('\n') and rstrip('\n') on [*a, *b). */
static void lstrip_nl(const char *s, size_t *a, size_t b) {
    while (*a < b && s[*a] == '\n') (*a)++;
}
static void rstrip_nl(const char *s, size_t a, size_t *b) {
    while (*b > a && s[*b - 1] == '\n') (*b)--;
}

static int has_affix(const char *s, size_t n, const char *pre, const char *suf) {
    size_t pl = strlen(pre), sl = strlen(suf);
    return n >= pl && n >= sl && !memcmp(s, pre, pl) && !memcmp(s + n - sl, suf, sl);
}

/* Qwen3's template for system, user and assistant messages (chat.h). */
static int render_qwen3(st_chat_text *c, const st_chat_msg *m, size_t n) {
    int bad = 0;
    if (!strcmp(m[0].role, "system"))
        bad = PUTS(c, "<|im_start|>system\n") || put(c, m[0].content, m[0].content_len) || PUTS(c, "<|im_end|>\n");
    size_t last_query = n - 1; /* the last user message that is not a tool response */
    for (size_t i = n; i-- > 0;)
        if (!strcmp(m[i].role, "user") &&
            !has_affix(m[i].content, m[i].content_len, "<tool_response>", "</tool_response>")) {
            last_query = i;
            break;
        }
    for (size_t i = 0; i < n && !bad; i++) {
        const char *s = m[i].content;
        size_t len = m[i].content_len;
        if (strcmp(m[i].role, "assistant")) {
            if (i > 0 || strcmp(m[i].role, "system"))
                bad = bad || PUTS(c, "<|im_start|>") || PUTS(c, m[i].role) || PUTS(c, "\n") || put(c, s, len) ||
                       PUTS(c, "<|im_end|>\n");
            continue;
        }
        /* content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') is the
         * reasoning, content.split('</think>')[-1].lstrip('\n') the answer */
        size_t ra = 0, rb = 0, ca = 0, cb = len;
        const char *close = memmem(s, len, "</think>", 8);
        if (close) {
            rb = (size_t)(close - s);
            rstrip_nl(s, 0, &rb);
            const char *open = memrmem_str(s, rb, "<think>");
            ra = open ? (size_t)(open - s) + 7 : 0;
            lstrip_nl(s, &ra, rb);
            ca = (size_t)(memrmem_str(s, len, "</think>") - s) + 8;
            lstrip_nl(s, &ca, cb);
        }
        bad |= PUTS(c, "<|im_start|>assistant\n");
        bad |= mark(c, c->len);
        if (i > last_query && (i == n - 1 || rb > ra)) {
            rstrip_nl(s, ra, &rb); /* reasoning_content.strip('\n') */
            lstrip_nl(s, &ca, cb);
            bad = bad || PUTS(c, "<think>\n") || put(c, s + ra, rb - ra) || PUTS(c, "\n</think>\n\n");
        }
        bad = bad || put(c, s + ca, cb - ca) || PUTS(c, "<|im_end|>");
        bad |= mark(c, c->len);
        bad |= PUTS(c, "\n");
    }
    return bad;
}

st_status st_chat_render(const st_chat_template *t, const st_chat_msg *m, size_t n, st_chat_text *c, st_err *err) {
    c->len = 0;
    c->n_span = 0;
    if (n == 0) return st_errf(err, ST_ERR_INVALID, "a conversation with no messages");
    for (size_t i = 0; i < n; i++)
        if (strcmp(m[i].role, "system") && strcmp(m[i].role, "user") && strcmp(m[i].role, "assistant"))
            return st_errf(err, ST_ERR_UNSUPPORTED, "message %zu: role \"%s\"; the roles rendered are system, user "
                           "and assistant", i, m[i].role);
    int bad = 0; /* pieces are appended with ||, which orders them (| would not) and stops at a failure */
    if (t->format == ST_CHAT_CHATML) {
        if (t->default_system && strcmp(m[0].role, "system")) {
            bad = bad || PUTS(c, "<|im_start|>system\n") || PUTS(c, t->default_system) || PUTS(c, "<|im_end|>\n");
        }
        for (size_t i = 0; i < n && !bad; i++) {
            int asst = !strcmp(m[i].role, "assistant");
            bad = bad || PUTS(c, "<|im_start|>") || PUTS(c, m[i].role) || PUTS(c, "\n");
            if (asst) bad |= mark(c, c->len);
            bad = bad || put(c, m[i].content, m[i].content_len) || PUTS(c, "<|im_end|>");
            if (asst) bad |= mark(c, c->len);
            bad |= PUTS(c, "\n");
        }
    } else if (t->format == ST_CHAT_QWEN3) {
        bad |= render_qwen3(c, m, n);
    } else if (t->format == ST_CHAT_LLAMA3 || t->format == ST_CHAT_LLAMA31) {
        bad |= PUTS(c, t->bos);
        size_t first = 0;
        if (t->format == ST_CHAT_LLAMA31) { /* the system turn, with the first message when a system one */
            bad |= PUTS(c, "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
                           "Today Date: 26 Jul 2024\n\n");
            if (!strcmp(m[0].role, "system")) {
                size_t a, b;
                trim(m[0].content, m[0].content_len, &a, &b);
                bad |= put(c, m[0].content + a, b - a);
                first = 1;
            }
            bad |= PUTS(c, "<|eot_id|>");
        }
        for (size_t i = first; i < n && !bad; i++) {
            int asst = !strcmp(m[i].role, "assistant");
            size_t a, b;
            trim(m[i].content, m[i].content_len, &a, &b);
            bad = bad || PUTS(c, "<|start_header_id|>") || PUTS(c, m[i].role) || PUTS(c, "<|end_header_id|>\n\n");
            if (asst) bad |= mark(c, c->len);
            bad = bad || put(c, m[i].content + a, b - a) || PUTS(c, "<|eot_id|>");
            if (asst) bad |= mark(c, c->len);
        }
    } else {
        return st_errf(err, ST_ERR_INVALID, "chat template not initialised");
    }
    if (bad) return st_errf(err, ST_ERR_NOMEM, "chat template: out of memory rendering %zu messages", n);
    return ST_OK;
}

void st_chat_text_free(st_chat_text *c) {
    free(c->text);
    free(c->span);
    memset(c, 0, sizeof *c);
}

/* ---- tokens and mask ---------------------------------------------------------------- */

st_status st_chat_encode(const st_tokenizer *tok, const st_chat_text *c, st_chat_mask mode, int32_t **ids,
                         uint8_t **mask, size_t *cap, size_t *n, st_err *err) {
    size_t need = c->len + 16;
    for (int pass = 0; pass < 2; pass++) {
        if (need > *cap) {
            int32_t *ni = realloc(*ids, need * sizeof *ni);
            if (ni) *ids = ni;
            uint8_t *nm = ni ? realloc(*mask, need) : NULL;
            if (!nm) return st_errf(err, ST_ERR_NOMEM, "chat: out of memory for %zu tokens", need);
            *mask = nm, *cap = need;
        }
        st_status rc = st_tokenizer_encode(tok, c->text, c->len, *ids, *cap, n, err);
        if (rc == ST_OK) break;
        if (rc != ST_ERR_INVALID || *n <= *cap || pass) return rc;
        need = *n;
    }
    if (mode == ST_CHAT_MASK_ALL) {
        memset(*mask, 1, *n);
        return ST_OK;
    }
    /* Each token's bytes, in order, must be the text: then token k covers [at, at + len). */
    char buf[512];
    size_t at = 0, s = 0;
    for (size_t k = 0; k < *n; k++) {
        size_t len = 0;
        st_status rc = st_tokenizer_decode(tok, *ids + k, 1, buf, sizeof buf, &len, err);
        if (rc) return st_err_prefix(err, "chat: token %zu", k);
        if (at + len > c->len || memcmp(c->text + at, buf, len))
            return st_errf(err, ST_ERR_UNSUPPORTED,
                           "chat: token %zu (id %d) does not spell the rendered text at byte %zu: the tokenizer "
                           "changes the text (a normalizer), so the assistant mask cannot be placed; pack with "
                           "--mask all", k, (*ids)[k], at);
        while (s + 1 < c->n_span && c->span[s + 1] <= at) s += 2; /* spans ending at or before this token */
        (*mask)[k] = s + 1 < c->n_span && c->span[s] < at + len && at < c->span[s + 1] && len > 0;
        at += len;
    }
    if (at != c->len)
        return st_errf(err, ST_ERR_UNSUPPORTED, "chat: the tokens spell %zu of the rendered %zu bytes; pack with "
                       "--mask all", at, c->len);
    return ST_OK;
}

/* ---- JSON lines ----------------------------------------------------------------------- */

#define MAX_MSGS 4096

/* Append the messages of a JSON array to m. */
static st_status add_msgs(const st_chat_template *t, json_object *arr, const char *field, st_chat_msg *m, size_t *n,
                          st_err *err) {
    size_t k = json_object_array_length(arr);
    for (size_t i = 0; i < k; i++) {
        json_object *o = json_object_array_get_idx(arr, i), *r, *c;
        if (!json_object_is_type(o, json_type_object) || !json_object_object_get_ex(o, "role", &r) ||
            !json_object_is_type(r, json_type_string) || !json_object_object_get_ex(o, "content", &c) ||
            !json_object_is_type(c, json_type_string))
            return st_errf(err, ST_ERR_FORMAT, "\"%s\"[%zu] is not {\"role\": string, \"content\": string}", field, i);
        if (json_object_object_get_ex(o, "tool_calls", NULL))
            return st_errf(err, ST_ERR_UNSUPPORTED, "\"%s\"[%zu] has tool_calls, which strata does not render", field, i);
        if (t->format == ST_CHAT_QWEN3 && json_object_object_get_ex(o, "reasoning_content", NULL))
            return st_errf(err, ST_ERR_UNSUPPORTED, "\"%s\"[%zu] has reasoning_content, which strata does not render; "
                           "put the reasoning in the content as <think>...</think>", field, i);
        if (*n == MAX_MSGS) return st_errf(err, ST_ERR_INVALID, "more than %d messages", MAX_MSGS);
        m[*n].role = json_object_get_string(r);
        m[*n].content = json_object_get_string(c);
        m[*n].content_len = (size_t)json_object_get_string_len(c);
        (*n)++;
    }
    return ST_OK;
}

/* One side of a prompt/completion pair: a string (one message of role) or a list. */
static st_status add_side(const st_chat_template *t, json_object *v, const char *field, const char *role,
                          st_chat_msg *m, size_t *n, st_err *err) {
    if (json_object_is_type(v, json_type_array)) return add_msgs(t, v, field, m, n, err);
    if (!json_object_is_type(v, json_type_string))
        return st_errf(err, ST_ERR_FORMAT, "\"%s\" is neither a string nor a list of messages", field);
    m[*n].role = role;
    m[*n].content = json_object_get_string(v);
    m[*n].content_len = (size_t)json_object_get_string_len(v);
    (*n)++;
    return ST_OK;
}

st_status st_chat_render_json(const st_chat_template *t, const char *line, size_t len, st_chat_text *out,
                              st_err *err) {
    struct json_tokener *tk = json_tokener_new();
    if (!tk) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    json_object *o = json_tokener_parse_ex(tk, line, (int)len);
    enum json_tokener_error je = json_tokener_get_error(tk);
    json_tokener_free(tk);
    if (!o || je != json_tokener_success) {
        json_object_put(o);
        return st_errf(err, ST_ERR_FORMAT, "not valid JSON (%s)", json_tokener_error_desc(je));
    }
    st_chat_msg *m = malloc(MAX_MSGS * sizeof *m);
    size_t n = 0;
    st_status rc = ST_OK;
    json_object *v, *p, *c;
    if (!m) rc = st_errf(err, ST_ERR_NOMEM, "out of memory");
    else if (!json_object_is_type(o, json_type_object))
        rc = st_errf(err, ST_ERR_FORMAT, "not a JSON object");
    else if (json_object_object_get_ex(o, "messages", &v)) {
        if (!json_object_is_type(v, json_type_array))
            rc = st_errf(err, ST_ERR_FORMAT, "\"messages\" is not a list");
        else
            rc = add_msgs(t, v, "messages", m, &n, err);
    } else if (json_object_object_get_ex(o, "prompt", &p) && json_object_object_get_ex(o, "completion", &c)) {
        rc = add_side(t, p, "prompt", "user", m, &n, err);
        if (!rc) rc = add_side(t, c, "completion", "assistant", m, &n, err);
    } else {
        rc = st_errf(err, ST_ERR_FORMAT, "neither \"messages\" nor \"prompt\" and \"completion\"");
    }
    if (!rc) rc = st_chat_render(t, m, n, out, err);
    free(m);
    json_object_put(o);
    return rc;
}

/* Packing: lines are read in batches; threads render and encode contiguous runs of a batch
 * (a shared counter hands out runs, several a thread); the runs are written in order, so the
 * output does not depend on the thread count. */
#define CHAT_BATCH_BYTES (8u << 20)
#define CHAT_BATCH_LINES 4096u
#define CHAT_RUNS_PER_THREAD 8
#define CHAT_MAX_THREADS 256

typedef struct chat_run {
    size_t a, b;          /* lines [a, b) of the batch */
    int32_t *ids;         /* their tokens, each line's followed by eod */
    uint8_t *mask;
    size_t n, cap;
    size_t *count;        /* [b - a] tokens of each line, eod included */
    size_t count_cap;
    size_t fail_line;     /* batch index of the line that failed */
    st_status rc;
    st_err err;
} chat_run;

typedef struct chat_batch {
    const st_tokenizer *tok;
    const st_chat_template *t;
    st_chat_mask mode;
    int32_t eod;
    char *text;           /* the lines, back to back */
    size_t *start;        /* [nl + 1] line k is text[start[k], start[k+1]) */
    size_t nl;
    chat_run *runs;
    size_t n_runs;
    atomic_size_t next;
} chat_batch;

static int run_grow(chat_run *r, size_t need) {
    if (r->n + need <= r->cap) return 0;
    size_t nc = (r->n + need) * 3 / 2 + 1024;
    int32_t *ni = realloc(r->ids, nc * sizeof *ni);
    if (!ni) return -1;
    r->ids = ni;
    uint8_t *nm = realloc(r->mask, nc);
    if (!nm) return -1;
    r->mask = nm, r->cap = nc;
    return 0;
}

static void chat_run_do(chat_batch *cb, chat_run *r) {
    st_chat_text c = {0};
    int32_t *ids = NULL;
    uint8_t *mask = NULL;
    size_t cap = 0, n = 0;
    r->n = 0;
    r->rc = ST_OK;
    if (r->b - r->a > r->count_cap) {
        size_t *nc = realloc(r->count, (r->b - r->a) * sizeof *nc);
        if (!nc) r->rc = st_errf(&r->err, ST_ERR_NOMEM, "out of memory");
        else r->count = nc, r->count_cap = r->b - r->a;
    }
    for (size_t k = r->a; k < r->b && !r->rc; k++) {
        r->count[k - r->a] = 0;
        size_t len = cb->start[k + 1] - cb->start[k];
        if (len == 0) continue; /* a blank line */
        r->rc = st_chat_render_json(cb->t, cb->text + cb->start[k], len, &c, &r->err);
        if (!r->rc) r->rc = st_chat_encode(cb->tok, &c, cb->mode, &ids, &mask, &cap, &n, &r->err);
        if (!r->rc && run_grow(r, n + 1)) r->rc = st_errf(&r->err, ST_ERR_NOMEM, "out of memory for %zu tokens", n + 1);
        if (r->rc) {
            r->fail_line = k;
            break;
        }
        memcpy(r->ids + r->n, ids, n * sizeof *ids);
        memcpy(r->mask + r->n, mask, n);
        r->ids[r->n + n] = cb->eod;
        r->mask[r->n + n] = cb->mode == ST_CHAT_MASK_ALL;
        r->n += n + 1;
        r->count[k - r->a] = n + 1;
    }
    free(ids);
    free(mask);
    st_chat_text_free(&c);
}

static void *chat_thread(void *arg) {
    chat_batch *cb = arg;
    for (size_t i; (i = atomic_fetch_add(&cb->next, 1)) < cb->n_runs;) chat_run_do(cb, &cb->runs[i]);
    return NULL;
}

/* Encode the batch on `threads` threads and write it; first_line: the file's line number of
 * batch line 0. */
static st_status chat_flush(chat_batch *cb, int threads, st_data_pack_writer *w, const char *path, uint64_t first_line,
                            st_chat_pack_stats *stats, st_err *err) {
    if (!cb->nl) return ST_OK;
    size_t nr = (size_t)threads * CHAT_RUNS_PER_THREAD;
    if (nr > cb->nl) nr = cb->nl;
    size_t total = cb->start[cb->nl], k = 0;
    for (size_t r = 0; r < nr; r++) { /* contiguous runs of about total / nr bytes */
        cb->runs[r].a = k;
        size_t goal = total / nr * (r + 1);
        while (k < cb->nl && (r == nr - 1 || cb->start[k + 1] <= goal)) k++;
        cb->runs[r].b = k;
    }
    cb->n_runs = nr;
    atomic_store(&cb->next, 0);
    pthread_t th[CHAT_MAX_THREADS];
    int started = 0;
    for (int i = 1; i < threads && (size_t)i < nr; i++, started++)
        if (pthread_create(&th[i], NULL, chat_thread, cb)) break;
    chat_thread(cb); /* and the runs of threads that did not start */
    for (int i = 1; i <= started; i++) pthread_join(th[i], NULL);
    for (size_t r = 0; r < nr; r++) {
        chat_run *run = &cb->runs[r];
        if (run->rc) {
            *err = run->err;
            return st_err_prefix(err, "%s: line %llu", path, (unsigned long long)(first_line + run->fail_line));
        }
        size_t off = 0;
        for (size_t j = run->a; j < run->b; j++) {
            size_t m = run->count[j - run->a];
            if (!m) continue;
            st_status rc = st_data_pack_add_masked(w, run->ids + off, run->mask + off, m, err);
            if (rc) return st_err_prefix(err, "%s: line %llu", path, (unsigned long long)(first_line + j));
            for (size_t q = 0; q < m; q++) stats->trained += run->mask[off + q];
            off += m;
            stats->docs++;
            stats->tokens += m;
        }
    }
    cb->nl = 0;
    return ST_OK;
}

st_status st_chat_pack_file(st_data_pack_writer *w, const st_tokenizer *tok, const st_chat_template *t,
                            st_chat_mask mode, int32_t eod, int threads, const char *path,
                            st_chat_pack_stats *stats, st_err *err) {
    if (threads < 1) threads = 1;
    if (threads > CHAT_MAX_THREADS) threads = CHAT_MAX_THREADS;
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return st_errf(err, ST_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    chat_batch cb = {.tok = tok, .t = t, .mode = mode, .eod = eod};
    size_t tcap = CHAT_BATCH_BYTES + 4096;
    cb.text = malloc(tcap);
    cb.start = malloc((CHAT_BATCH_LINES + 1) * sizeof *cb.start);
    cb.runs = calloc((size_t)threads * CHAT_RUNS_PER_THREAD, sizeof *cb.runs);
    char *line = NULL;
    size_t lcap = 0;
    ssize_t got;
    uint64_t lineno = 0, first = 1;
    st_status rc = cb.text && cb.start && cb.runs ? ST_OK : st_errf(err, ST_ERR_NOMEM, "out of memory");
    if (!rc) cb.start[0] = 0;
    while (!rc && (got = getline(&line, &lcap, f)) >= 0) {
        lineno++;
        stats->bytes += (uint64_t)got;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) got--;
        size_t at = cb.start[cb.nl];
        if (at + (size_t)got > tcap) {
            size_t nc = (at + (size_t)got) * 3 / 2;
            char *nt = realloc(cb.text, nc);
            if (!nt) {
                rc = st_errf(err, ST_ERR_NOMEM, "%s: line %llu: out of memory", path, (unsigned long long)lineno);
                break;
            }
            cb.text = nt, tcap = nc;
        }
        memcpy(cb.text + at, line, (size_t)got);
        cb.start[++cb.nl] = at + (size_t)got;
        if (cb.nl == CHAT_BATCH_LINES || cb.start[cb.nl] >= CHAT_BATCH_BYTES) {
            rc = chat_flush(&cb, threads, w, path, first, stats, err);
            first = lineno + 1;
            cb.start[0] = 0;
        }
    }
    if (!rc) rc = chat_flush(&cb, threads, w, path, first, stats, err);
    if (!rc && ferror(f)) rc = st_errf(err, ST_ERR_IO, "%s: read error after line %llu", path, (unsigned long long)lineno);
    if (f != stdin) fclose(f);
    free(line);
    for (size_t r = 0; cb.runs && r < (size_t)threads * CHAT_RUNS_PER_THREAD; r++) {
        free(cb.runs[r].ids);
        free(cb.runs[r].mask);
        free(cb.runs[r].count);
    }
    free(cb.runs);
    free(cb.text);
    free(cb.start);
    return rc;
}
