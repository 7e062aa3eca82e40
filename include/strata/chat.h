/* chat.h - chat templates for SFT data: conversations rendered as the model families render
 * them, tokenized, with a loss mask over the assistant's tokens.
 *
 * Four templates, rendered byte for byte as Hugging Face transformers' apply_chat_template
 * renders the released ones (tests/fixtures/chat_expected.json and chat_expected2.json, from
 * tools/gen_chat_fixtures.py):
 *   - ChatML as Qwen2 / Qwen2.5 use it: "<|im_start|>ROLE\nCONTENT<|im_end|>\n" per message,
 *     preceded by the template's default system message when the first message is not a
 *     system one (Qwen2.5: "You are Qwen, created by Alibaba Cloud. ...", Qwen2: "You are a
 *     helpful assistant."; plain ChatML: none);
 *   - Qwen3 (the hybrid thinking models): ChatML without a default system message; an
 *     assistant message's "<think>R</think>C" is cut into reasoning R and answer C; after the
 *     last user query (a user message that is not a "<tool_response>...</tool_response>") an
 *     assistant message is rendered "<think>\nR\n</think>\n\nC" when it is the last message
 *     or has reasoning, and before it as C alone (the reasoning dropped);
 *   - Llama-3 (Meta-Llama-3-*-Instruct): BOS, then "<|start_header_id|>ROLE<|end_header_id|>
 *     \n\nCONTENT<|eot_id|>" per message, CONTENT stripped of leading and trailing whitespace
 *     as Jinja's trim (Python's str.strip) does;
 *   - Llama-3.1 (Meta-Llama-3.1-*-Instruct): Llama-3's, with a system turn always first:
 *     "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n" and the first
 *     message's content when it is a system one (trimmed).
 * A tokenizer_config.json template is recognised by the pieces of its text that make these
 * renderings (after removing whitespace), never guessed: anything else (another <think>
 * handling, Llama-3.2's date of today, tools) is refused quoting its first line, with a pointer
 * to --chat_format chatml|llama3|qwen3|llama3.1. The Qwen3 and Llama-3.1 template texts the
 * pieces come from were written from memory of the released files (tools/gen_chat_fixtures.py).
 *
 * Trainable spans (the assistant mask): each assistant message's content and its end-of-turn
 * token (<|im_end|>, <|eot_id|>), Qwen3's think block included, as transformers'
 * return_assistant_tokens_mask gives with {% generation %} around them; a token is trained on
 * when any of its bytes lies in a span.
 *
 * Data lines: {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}, or
 * {"prompt": P, "completion": C} where P and C are strings (one user and one assistant
 * message) or lists of messages (TRL's conversational prompt/completion).
 *
 * Example:
 *
 *     st_err err = {0};
 *     st_tokenizer *tok = NULL;
 *     st_chat_template t;
 *     if (st_tokenizer_load(&tok, "Qwen2.5-0.5B-Instruct", &err) ||   // a model directory
 *         st_chat_template_init(&t, st_tokenizer_chat_template(tok), NULL, NULL, &err)) {
 *         fprintf(stderr, "strata: %s\n", err.msg);                 // names the template
 *         st_tokenizer_free(tok);
 *         return 1;
 *     }
 *     st_chat_msg msgs[] = {{"user", "Hi!", 3}, {"assistant", "Hello.", 6}};
 *     st_chat_text c = {0};                     // reused across conversations
 *     int32_t *ids = NULL;
 *     uint8_t *mask = NULL;                     // 1: a target trained on (the assistant's)
 *     size_t cap = 0, n = 0;
 *     if (st_chat_render(&t, msgs, 2, &c, &err) == ST_OK &&
 *         st_chat_encode(tok, &c, ST_CHAT_MASK_ASSISTANT, &ids, &mask, &cap, &n, &err) == ST_OK)
 *         printf("%s: %zu tokens\n", t.name, n);
 *     free(ids);
 *     free(mask);
 *     st_chat_text_free(&c);
 *     st_tokenizer_free(tok);
 *
 * End of example.
 */
#ifndef STRATA_CHAT_H
#define STRATA_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "strata/core.h"
#include "strata/data.h"
#include "strata/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Append-only. */
typedef enum st_chat_format {
    ST_CHAT_NONE = 0,
    ST_CHAT_CHATML = 1, /* Qwen2/2.5 and plain ChatML */
    ST_CHAT_LLAMA3 = 2, /* Meta-Llama-3 */
    ST_CHAT_QWEN3 = 3,  /* Qwen3: ChatML with <think> blocks */
    ST_CHAT_LLAMA31 = 4 /* Meta-Llama-3.1: Llama-3 with a dated system turn */
} st_chat_format;

typedef enum st_chat_mask {
    ST_CHAT_MASK_ASSISTANT = 0, /* train on the assistant's content and end-of-turn tokens */
    ST_CHAT_MASK_ALL = 1        /* train on every token */
} st_chat_mask;

typedef struct st_chat_template {
    st_chat_format format;
    const char *name;           /* "qwen2.5", "qwen2", "chatml", "qwen3", "llama3", "llama3.1" (static) */
    const char *default_system; /* ChatML: the system message added when none is first; or NULL */
    char bos[64];               /* Llama-3, 3.1: the BOS token's text (from the tokenizer) */
} st_chat_template;

/* Recognise template_text (tokenizer_config.json's chat_template; may be NULL) or take the
 * family named by format ("chatml", "llama3", "qwen3" or "llama3.1"; NULL: recognise). A named
 * format keeps the recognised template's default system message when the template is of that
 * family. bos_text is the tokenizer's BOS token text (NULL if none; Llama-3 and 3.1 need one).
 * ST_ERR_UNSUPPORTED for a template not recognised (quoting its first line), ST_ERR_INVALID
 * for a bad format. */
st_status st_chat_template_init(st_chat_template *t, const char *template_text, const char *format,
                                const char *bos_text, st_err *err);

/* One message: role and content as they are in the data (not NUL-terminated necessarily). */
typedef struct st_chat_msg {
    const char *role, *content;
    size_t content_len;
} st_chat_msg;

/* Rendered text and its trainable byte spans [span[2k], span[2k+1]). */
typedef struct st_chat_text {
    char *text;
    size_t len, cap;
    size_t *span;
    size_t n_span, span_cap; /* n_span: entries of span[] (2 a span) */
} st_chat_text;

/* Render messages into out (reused across calls; free with st_chat_text_free). Roles other
 * than system, user and assistant are refused. st_chat_render_json also refuses a message's
 * tool_calls, and with Qwen3 its reasoning_content (put the reasoning in the content as
 * "<think>...</think>"). */
st_status st_chat_render(const st_chat_template *t, const st_chat_msg *msgs, size_t n, st_chat_text *out,
                         st_err *err);
void st_chat_text_free(st_chat_text *c);

/* Tokens of a rendered text and their mask (1 = train on this token as a target): the ids of
 * st_tokenizer_encode over the whole text; with ST_CHAT_MASK_ASSISTANT a token is 1 when any
 * of its bytes lies in a span. Needs a tokenizer whose tokens spell the text byte for byte
 * (byte-level BPE): otherwise ST_ERR_UNSUPPORTED. *ids and *mask grow as needed (realloc). */
st_status st_chat_encode(const st_tokenizer *tok, const st_chat_text *c, st_chat_mask mode, int32_t **ids,
                         uint8_t **mask, size_t *cap, size_t *n, st_err *err);

/* Parse one JSON line (a conversation or a prompt/completion pair) and render it. */
st_status st_chat_render_json(const st_chat_template *t, const char *line, size_t len, st_chat_text *out,
                              st_err *err);

/* Pack a JSON-lines file of conversations into w: each conversation rendered, tokenized and
 * followed by eod (its mask byte 0, or 1 with ST_CHAT_MASK_ALL), with its mask; blank lines
 * are skipped. Batches of lines are encoded on `threads` threads and written in order (the
 * output does not depend on threads). Errors name the file and line. stats are added to
 * (documents, tokens, bytes of input, tokens trained). */
typedef struct st_chat_pack_stats {
    uint64_t docs, tokens, bytes, trained;
} st_chat_pack_stats;
st_status st_chat_pack_file(st_data_pack_writer *w, const st_tokenizer *tok, const st_chat_template *t,
                            st_chat_mask mode, int32_t eod, int threads, const char *path,
                            st_chat_pack_stats *stats, st_err *err);

#ifdef __cplusplus
}
#endif
#endif
