#!/usr/bin/env python3
"""gen_chat_fixtures.py - chat templates rendered by Hugging Face transformers, for test_chat.

Writes, for tests/test_chat.c and tests/test_data_pack_chat.sh:
  tests/fixtures/chat_qwen25/    tokenizer.json + tokenizer_config.json with Qwen2.5-Instruct's
                                 chat_template (ChatML, default system line "You are Qwen, ...")
  tests/fixtures/chat_qwen2/     the same tokenizer with Qwen2-Instruct's template (ChatML,
                                 default system line "You are a helpful assistant.")
  tests/fixtures/chat_llama3/    the same tokenizer with Meta-Llama-3-Instruct's template
                                 (header ids, content | trim, <|eot_id|>, BOS first)
  tests/fixtures/chat_unknown/   a template no family matches (Llama-3.1's opening), refused
  tests/fixtures/chat_convs.jsonl  the conversations, one JSON object a line
  tests/fixtures/chat_expected.json  per directory and line: the text transformers'
                                 apply_chat_template renders, the ids of tokenizer(text,
                                 add_special_tokens=False), and the assistant mask from
                                 transformers' return_assistant_tokens_mask
The tokenizer is tests/fixtures/tok_llama3.json (byte-level BPE trained by
gen_tokenizer_fixtures.py) with the families' special tokens added.

The template strings are the ones the models ship (written here from the released
tokenizer_config.json files). The assistant mask comes from a copy of each template with
{% generation %} ... {% endgeneration %} around the assistant's content and end-of-turn token;
the script checks that the copy renders the same text as the original.
Needs PyPI transformers (4.48 is the project's reference; no model framework is needed):
    pip install transformers==4.48.0 && python3 tools/gen_chat_fixtures.py
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "tests", "fixtures")

QWEN25 = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are "
    "provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
    "            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n")
# The assistant line with the generation markers (content and <|im_end|>, not the newline after).
QWEN25_GEN = QWEN25.replace(
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n",
    "        {%- if message.role == \"assistant\" %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' }}{% generation %}{{ message.content + '<|im_end|>' }}"
    "{% endgeneration %}{{ '\\n' }}\n"
    "        {%- else %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "        {%- endif %}\n")

QWEN2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
         "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
         "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
         "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
QWEN2_GEN = QWEN2.replace(
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}",
    "{% if message['role'] == 'assistant' %}{{'<|im_start|>' + message['role'] + '\\n'}}{% generation %}"
    "{{message['content'] + '<|im_end|>'}}{% endgeneration %}{{'\\n'}}{% else %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endif %}")

LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}"
          "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ "
          "message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + "
          "content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
LLAMA3_GEN = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% if loop.index0 == 0 %}{{ bos_token }}{% endif %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] | trim + '<|eot_id|>' }}"
    "{% endgeneration %}{% else %}{{ message['content'] | trim + '<|eot_id|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")

# Llama-3.1's template opens like this; it adds a dated system header strata does not render.
UNKNOWN = ("{{- bos_token }}\n{%- if custom_tools is defined %}\n    {%- set tools = custom_tools %}\n{%- endif %}\n"
           "{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n")

CONVS = [
    {"messages": [{"role": "user", "content": "Hello, who are you?"},
                  {"role": "assistant", "content": "I am a small model. How can I help?"}]},
    {"messages": [{"role": "system", "content": "You answer in one word."},
                  {"role": "user", "content": "Capital of France?"},
                  {"role": "assistant", "content": "Paris."},
                  {"role": "user", "content": "And of Japan? 東京 or 京都"},
                  {"role": "assistant", "content": "東京 🙂"}]},
    {"messages": [{"role": "user", "content": "  spaces around\n"},
                  {"role": "assistant", "content": "\u00a0trimmed?\t\n"},
                  {"role": "system", "content": "a late system turn"},
                  {"role": "user", "content": "def f(x):\n    return x+1"},
                  {"role": "assistant", "content": "x = 12345; print(f(x))"}]},
    {"prompt": "Say hi.", "completion": "hi"},
    {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
     "completion": [{"role": "assistant", "content": "4"}]},
]

DIRS = {"chat_qwen25": (QWEN25, QWEN25_GEN, None, "<|im_end|>"),
        "chat_qwen2": (QWEN2, QWEN2_GEN, None, "<|im_end|>"),
        "chat_llama3": (LLAMA3, LLAMA3_GEN, "<|begin_of_text|>", "<|eot_id|>")}
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>"]


def messages_of(conv):
    if "messages" in conv:
        return conv["messages"]
    p, c = conv["prompt"], conv["completion"]
    p = [{"role": "user", "content": p}] if isinstance(p, str) else p
    c = [{"role": "assistant", "content": c}] if isinstance(c, str) else c
    return p + c


def tokenizer_json():
    d = json.load(open(os.path.join(FIX, "tok_llama3.json")))
    # keep <|endoftext|>; drop the fixture's non-special 'x<|im' (it would match inside "x<|im_end|>")
    d["added_tokens"] = [a for a in d["added_tokens"] if a["content"] == "<|endoftext|>"]
    nid = 600  # contiguous after the model vocabulary, as `tokenizers` numbers added tokens
    for s in SPECIALS:
        d["added_tokens"].append({"id": nid, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                                  "normalized": False, "special": True})
        nid += 1
    return d


def main():
    from transformers import AutoTokenizer
    tj = tokenizer_json()
    expected = {}
    for name, (tmpl, gen, bos, eos) in list(DIRS.items()) + [("chat_unknown", (UNKNOWN, None, None, "<|eot_id|>"))]:
        d = os.path.join(FIX, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w") as f:
            json.dump(tj, f, ensure_ascii=False)
        cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
               "add_bos_token": False, "chat_template": tmpl}
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(cfg, f, ensure_ascii=False, indent=2)
        if gen is None:
            continue
        tok = AutoTokenizer.from_pretrained(d)
        rows = []
        for conv in CONVS:
            msgs = messages_of(conv)
            text = tok.apply_chat_template(msgs, tokenize=False)
            assert text == tok.apply_chat_template(msgs, tokenize=False, chat_template=gen), (name, conv)
            out = tok.apply_chat_template(msgs, tokenize=True, chat_template=gen, return_dict=True,
                                          return_assistant_tokens_mask=True)
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert ids == out["input_ids"], (name, conv)
            rows.append({"text": text, "ids": ids, "mask": out["assistant_masks"]})
        expected[name] = rows
    with open(os.path.join(FIX, "chat_convs.jsonl"), "w") as f:
        for c in CONVS:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    with open(os.path.join(FIX, "chat_expected.json"), "w") as f:
        json.dump(expected, f, ensure_ascii=False, indent=0)
    print("wrote", ", ".join(sorted(expected)), "and chat_unknown,", sum(len(v) for v in expected.values()), "rows")


if __name__ == "__main__":
    main()
