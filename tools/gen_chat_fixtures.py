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
  tests/fixtures/chat_qwen3/     Qwen3's template (reasoning in <think></think> after the last
                                 user query), <think> and </think> as added tokens
  tests/fixtures/chat_llama31/   Meta-Llama-3.1-Instruct's (a system turn with "Cutting Knowledge
                                 Date" and the fixed "Today Date: 26 Jul 2024" first)
  tests/fixtures/chat_convs2.jsonl, chat_expected2.json  the same for chat_qwen3 and
                                 chat_llama31 over CONVS and CONVS2 (reasoning before and after
                                 the last query, tool responses as the last user message, ...)
  tests/fixtures/chat_convs.jsonl  the conversations, one JSON object a line
  tests/fixtures/chat_expected.json  per directory and line: the text transformers'
                                 apply_chat_template renders, the ids of tokenizer(text,
                                 add_special_tokens=False), and the assistant mask from
                                 transformers' return_assistant_tokens_mask
The tokenizer is tests/fixtures/tok_llama3.json (byte-level BPE trained by
gen_tokenizer_fixtures.py) with the families' special tokens added.

The template strings are the ones the models ship (written here from the released
tokenizer_config.json files; Qwen3's and Llama-3.1's from memory of them, as they could not be
downloaded here: strata recognises a file whose pieces match these, and refuses one that differs
in a piece that renders system, user or assistant messages). The assistant mask comes from a copy of each template with
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

# Qwen3 (Qwen3-*B, the hybrid thinking models of 2025-04): written here from memory of the
# released tokenizer_config.json (it could not be downloaded here). Past the last user query
# the assistant's reasoning is rendered in <think></think> (empty for the last message when it
# has none); before it, the reasoning is dropped.
QWEN3 = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- messages[0].content + '\\n\\n' }}\n"
    "    {%- endif %}\n"
    "    {{- \"# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided "
    "with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n"
    "{%- for message in messages[::-1] %}\n"
    "    {%- set index = (messages|length - 1) - loop.index0 %}\n"
    "    {%- if ns.multi_step_tool and message.role == \"user\" and message.content is string and "
    "not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}\n"
    "        {%- set ns.multi_step_tool = false %}\n"
    "        {%- set ns.last_query_index = index %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- for message in messages %}\n"
    "    {%- if message.content is string %}\n"
    "        {%- set content = message.content %}\n"
    "    {%- else %}\n"
    "        {%- set content = '' %}\n"
    "    {%- endif %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {%- set reasoning_content = '' %}\n"
    "        {%- if message.reasoning_content is string %}\n"
    "            {%- set reasoning_content = message.reasoning_content %}\n"
    "        {%- else %}\n"
    "            {%- if '</think>' in content %}\n"
    "                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1]"
    ".lstrip('\\n') %}\n"
    "                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}\n"
    "            {%- endif %}\n"
    "        {%- endif %}\n"
    "        {%- if loop.index0 > ns.last_query_index %}\n"
    "            {%- if loop.last or (not loop.last and reasoning_content) %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + "
    "'\\n</think>\\n\\n' + content.lstrip('\\n') }}\n"
    "            {%- else %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    "            {%- endif %}\n"
    "        {%- else %}\n"
    "            {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    "        {%- endif %}\n"
    "        {%- if message.tool_calls %}\n"
    "            {%- for tool_call in message.tool_calls %}\n"
    "                {%- if (loop.first and content) or (not loop.first) %}\n"
    "                    {{- '\\n' }}\n"
    "                {%- endif %}\n"
    "                {%- if tool_call.function %}\n"
    "                    {%- set tool_call = tool_call.function %}\n"
    "                {%- endif %}\n"
    "                {{- '<tool_call>\\n{\"name\": \"' }}\n"
    "                {{- tool_call.name }}\n"
    "                {{- '\", \"arguments\": ' }}\n"
    "                {%- if tool_call.arguments is string %}\n"
    "                    {{- tool_call.arguments }}\n"
    "                {%- else %}\n"
    "                    {{- tool_call.arguments | tojson }}\n"
    "                {%- endif %}\n"
    "                {{- '}\\n</tool_call>' }}\n"
    "            {%- endfor %}\n"
    "        {%- endif %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if loop.first or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}")
# The assistant mask: all after "<|im_start|>assistant\n" (the think block, the content) and <|im_end|>.
QWEN3_GEN = QWEN3
for a, b in [("{{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + "
              "'\\n</think>\\n\\n' + content.lstrip('\\n') }}",
              "{{- '<|im_start|>' + message.role + '\\n' }}{% generation %}{{- '<think>\\n' + "
              "reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') + '<|im_end|>' }}"
              "{% endgeneration %}"),
             ("                {{- '<|im_start|>' + message.role + '\\n' + content }}\n",
              "                {{- '<|im_start|>' + message.role + '\\n' }}{% generation %}{{- content + '<|im_end|>' }}"
              "{% endgeneration %}\n"),
             ("            {{- '<|im_start|>' + message.role + '\\n' + content }}\n",
              "            {{- '<|im_start|>' + message.role + '\\n' }}{% generation %}{{- content + '<|im_end|>' }}"
              "{% endgeneration %}\n"),
             ("        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}",
              "        {{- '\\n' }}\n    {%- elif message.role == \"tool\" %}")]:
    assert QWEN3_GEN.count(a) == 1, a
    QWEN3_GEN = QWEN3_GEN.replace(a, b)

# Llama-3.1 (Meta-Llama-3.1-*-Instruct), written here from memory of the released
# tokenizer_config.json: a system header with the knowledge cutoff and a fixed date first,
# then Llama-3's turns.
LLAMA31 = (
    "{{- bos_token }}\n"
    "{%- if custom_tools is defined %}\n"
    "    {%- set tools = custom_tools %}\n"
    "{%- endif %}\n"
    "{%- if not tools_in_user_message is defined %}\n"
    "    {%- set tools_in_user_message = true %}\n"
    "{%- endif %}\n"
    "{%- if not date_string is defined %}\n"
    "    {%- set date_string = \"26 Jul 2024\" %}\n"
    "{%- endif %}\n"
    "{%- if not tools is defined %}\n"
    "    {%- set tools = none %}\n"
    "{%- endif %}\n"
    "\n"
    "{#- This block extracts the system message, so we can slot it into the right place. #}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- set system_message = messages[0]['content']|trim %}\n"
    "    {%- set messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {%- set system_message = \"\" %}\n"
    "{%- endif %}\n"
    "\n"
    "{#- System message + builtin tools #}\n"
    "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
    "{%- if builtin_tools is defined or tools is not none %}\n"
    "    {{- \"Environment: ipython\\n\" }}\n"
    "{%- endif %}\n"
    "{%- if builtin_tools is defined %}\n"
    "    {{- \"Tools: \" + builtin_tools | reject('equalto', 'code_interpreter') | join(\", \") + \"\\n\\n\"}}\n"
    "{%- endif %}\n"
    "{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n"
    "{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n"
    "{%- if tools is not none and not tools_in_user_message %}\n"
    "    {{- \"You have access to the following functions. To call a function, please respond with JSON for a "
    "function call.\" }}\n"
    "    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its "
    "value}.' }}\n"
    "    {{- \"Do not use variables.\\n\\n\" }}\n"
    "    {%- for t in tools %}\n"
    "        {{- t | tojson(indent=4) }}\n"
    "        {{- \"\\n\\n\" }}\n"
    "    {%- endfor %}\n"
    "{%- endif %}\n"
    "{{- system_message }}\n"
    "{{- \"<|eot_id|>\" }}\n"
    "\n"
    "{#- Custom tools are passed in a user message with some extra guidance #}\n"
    "{%- if tools_in_user_message and not tools is none %}\n"
    "    {#- Extract the first user message so we can plug it in here #}\n"
    "    {%- if messages | length != 0 %}\n"
    "        {%- set first_user_message = messages[0]['content']|trim %}\n"
    "        {%- set messages = messages[1:] %}\n"
    "    {%- else %}\n"
    "        {{- raise_exception(\"Cannot put tools in the first user message when there's no first user "
    "message!\") }}\n"
    "{%- endif %}\n"
    "    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}\n"
    "    {{- \"Given the following functions, please respond with a JSON for a function call \" }}\n"
    "    {{- \"with its proper arguments that best answers the given prompt.\\n\\n\" }}\n"
    "    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its "
    "value}.' }}\n"
    "    {{- \"Do not use variables.\\n\\n\" }}\n"
    "    {%- for t in tools %}\n"
    "        {{- t | tojson(indent=4) }}\n"
    "        {{- \"\\n\\n\" }}\n"
    "    {%- endfor %}\n"
    "    {{- first_user_message + \"<|eot_id|>\"}}\n"
    "{%- endif %}\n"
    "\n"
    "{%- for message in messages %}\n"
    "    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}\n"
    "        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
    "'<|eot_id|>' }}\n"
    "    {%- elif 'tool_calls' in message %}\n"
    "        {%- if not message.tool_calls|length == 1 %}\n"
    "            {{- raise_exception(\"This model only supports single tool-calls at once!\") }}\n"
    "        {%- endif %}\n"
    "        {%- set tool_call = message.tool_calls[0].function %}\n"
    "        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}\n"
    "            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
    "            {{- \"<|python_tag|>\" + tool_call.name + \".call(\" }}\n"
    "            {%- for arg_name, arg_val in tool_call.arguments | items %}\n"
    "                {{- arg_name + '=\"' + arg_val + '\"' }}\n"
    "                {%- if not loop.last %}\n"
    "                    {{- \", \" }}\n"
    "                {%- endif %}\n"
    "                {%- endfor %}\n"
    "            {{- \")\" }}\n"
    "        {%- else  %}\n"
    "            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
    "            {{- '{\"name\": \"' + tool_call.name + '\", ' }}\n"
    "            {{- '\"parameters\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- \"}\" }}\n"
    "        {%- endif %}\n"
    "        {%- if builtin_tools is defined %}\n"
    "            {#- This means we're in ipython mode #}\n"
    "            {{- \"<|eom_id|>\" }}\n"
    "        {%- else %}\n"
    "            {{- \"<|eot_id|>\" }}\n"
    "        {%- endif %}\n"
    "    {%- elif message.role == \"tool\" or message.role == \"ipython\" %}\n"
    "        {{- \"<|start_header_id|>ipython<|end_header_id|>\\n\\n\" }}\n"
    "        {%- if message.content is mapping or message.content is iterable %}\n"
    "            {{- message.content | tojson }}\n"
    "        {%- else %}\n"
    "            {{- message.content }}\n"
    "        {%- endif %}\n"
    "        {{- \"<|eot_id|>\" }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n")
_L31_TURN = ("        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
             "'<|eot_id|>' }}\n")
assert LLAMA31.count(_L31_TURN) == 1
LLAMA31_GEN = LLAMA31.replace(_L31_TURN, (
    "        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}\n"
    "        {%- if message['role'] == 'assistant' %}{% generation %}{{- message['content'] | trim + '<|eot_id|>' }}"
    "{% endgeneration %}{%- else %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endif %}\n"))

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

# More conversations for Qwen3 and Llama-3.1 (with CONVS in tests/fixtures/chat_convs2.jsonl):
# reasoning in <think></think> before and after the last user query, several or none, a last
# "user" message that is a tool response (not a query), no user at all, ending with a user.
CONVS2 = [
    {"messages": [{"role": "user", "content": "Why is the sky blue?"},
                  {"role": "assistant", "content": "<think>\nRayleigh scattering.\n</think>\n\nShort waves scatter more."}]},
    {"messages": [{"role": "system", "content": "  Think first.  "},
                  {"role": "user", "content": "2+3?"},
                  {"role": "assistant", "content": "<think>two plus three</think>5"},
                  {"role": "user", "content": "and 4+4?"},
                  {"role": "assistant", "content": "\n\n8\n"}]},
    {"messages": [{"role": "user", "content": "q1"},
                  {"role": "assistant", "content": "<think>\n\nr1\n\n</think>\n\n\na1"},
                  {"role": "assistant", "content": "a2 without reasoning"},
                  {"role": "assistant", "content": "x<think>inner</think>y</think>\nz"}]},
    {"messages": [{"role": "user", "content": "look it up"},
                  {"role": "assistant", "content": "<think>need a tool</think>calling"},
                  {"role": "user", "content": "<tool_response>\n42\n</tool_response>"},
                  {"role": "assistant", "content": "It is 42."}]},
    {"messages": [{"role": "system", "content": "You talk alone."},
                  {"role": "assistant", "content": "<think>r</think>monologue"}]},
    {"messages": [{"role": "user", "content": "first"},
                  {"role": "assistant", "content": "<think>old</think>reply"},
                  {"role": "user", "content": "a last question with no answer 東京 🙂"}]},
    {"messages": [{"role": "assistant", "content": "</think>only a closing tag"},
                  {"role": "user", "content": "<tool_response>not closed"},
                  {"role": "assistant", "content": "<think></think>"}]},
]

DIRS2 = {"chat_qwen3": (QWEN3, QWEN3_GEN, None, "<|im_end|>"),
         "chat_llama31": (LLAMA31, LLAMA31_GEN, "<|begin_of_text|>", "<|eot_id|>")}
# Qwen3's vocabulary has <think> and </think> as added tokens (not special)
EXTRA_TOKENS = {"chat_qwen3": ["<think>", "</think>"]}

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
    expected = write_dirs(AutoTokenizer, list(DIRS.items()) + [("chat_unknown", (UNKNOWN, None, None, "<|eot_id|>"))],
                          CONVS)
    with open(os.path.join(FIX, "chat_convs.jsonl"), "w") as f:
        for c in CONVS:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    with open(os.path.join(FIX, "chat_expected.json"), "w") as f:
        json.dump(expected, f, ensure_ascii=False, indent=0)
    print("wrote", ", ".join(sorted(expected)), "and chat_unknown,", sum(len(v) for v in expected.values()), "rows")
    expected2 = write_dirs(AutoTokenizer, list(DIRS2.items()), CONVS + CONVS2)
    with open(os.path.join(FIX, "chat_convs2.jsonl"), "w") as f:
        for c in CONVS + CONVS2:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    with open(os.path.join(FIX, "chat_expected2.json"), "w") as f:
        json.dump(expected2, f, ensure_ascii=False, indent=0)
    print("wrote", ", ".join(sorted(expected2)), sum(len(v) for v in expected2.values()), "rows")


def write_dirs(AutoTokenizer, dirs, convs):
    expected = {}
    for name, (tmpl, gen, bos, eos) in dirs:
        tj = tokenizer_json()
        nid = max(a["id"] for a in tj["added_tokens"]) + 1
        for t in EXTRA_TOKENS.get(name, []):
            tj["added_tokens"].append({"id": nid, "content": t, "single_word": False, "lstrip": False,
                                       "rstrip": False, "normalized": False, "special": False})
            nid += 1
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
        for conv in convs:
            msgs = messages_of(conv)
            text = tok.apply_chat_template(msgs, tokenize=False)
            assert text == tok.apply_chat_template(msgs, tokenize=False, chat_template=gen), (name, conv)
            out = tok.apply_chat_template(msgs, tokenize=True, chat_template=gen, return_dict=True,
                                          return_assistant_tokens_mask=True)
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert ids == out["input_ids"], (name, conv)
            rows.append({"text": text, "ids": ids, "mask": out["assistant_masks"]})
        expected[name] = rows
    return expected


if __name__ == "__main__":
    main()
