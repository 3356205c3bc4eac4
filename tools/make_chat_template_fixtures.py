#!/usr/bin/env python3
"""Writes tests/fixtures/chat_templates/*.json: chat templates rendered by Python
jinja2 configured as Hugging Face transformers configures it, for
tests/text/chat_template_test.cpp.

Usage: python3 tools/make_chat_template_fixtures.py [--shared /work/shared]

The environment: ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True) with the loopcontrols extension and a {% generation %} tag,
transformers' tojson filter (json.dumps, ensure_ascii=False, keys unsorted),
raise_exception, and strftime_now formatting the FIXED time NOW (the C++ test
passes the same time to ChatTemplate::parse). Variables: messages,
add_generation_prompt, bos_token, eos_token, tools=None, documents=None.

<name>.json for each real model template (from <shared>/tokenizers/<name>/
tokenizer_config.json, and the repo's models/*/ when one has a template):
  {"name", "source", "template", "bos_token", "eos_token", "now", "cases": [case...]}
synthetic.json: {"now", "bos_token", "eos_token", "templates": [{"name", "template",
  "cases": [case...]}]} where the templates exercise every supported construct.
A case: {"conversation", "messages", "add_generation_prompt"} and either
"expected" (the rendered text) or "error" (jinja2's message; "raised": true when
it came from raise_exception).
"""
import argparse
import datetime
import json
import os

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

NOW = datetime.datetime(2024, 7, 26, 14, 30, 5)
REAL_TEMPLATES = ["llama3", "qwen3", "llama2"]


class RaisedException(jinja2.exceptions.TemplateError):
    pass


class GenerationTag(jinja2.ext.Extension):
    """transformers' {% generation %}...{% endgeneration %}: renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_environment():
    def raise_exception(message):
        raise RaisedException(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return NOW.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def m(role, content):
    return {"role": role, "content": content}


CONVERSATIONS = {
    "user_only": [m("user", "Hello!")],
    "system_user": [m("system", "You are a helpful assistant."), m("user", "What is 2+2?")],
    "multi_turn": [
        m("system", "Be brief."),
        m("user", "Hi there"),
        m("assistant", "Hello! How can I help?"),
        m("user", "Tell me a joke."),
    ],
    "assistant_last": [m("user", "Say hi"), m("assistant", "Hi!")],
    "empty_content": [m("user", "")],
    "empty_system": [m("system", ""), m("user", ""), m("assistant", "")],
    "unicode": [
        m("user", "héllo wörld — 你好 🌍 Ωμέγα"),
        m("assistant", "ça va ✓ — ありがとう"),
        m("user", "ẞ ǅ ﬁ \u00a0nbsp \u200bzwsp"),
    ],
    "quotes_newlines": [
        m("system", "Line one\nLine two\r\nTab\there"),
        m("user", "He said \"hi\" and 'bye' \\ backslash {{ not a tag }} {% neither %}"),
        m("assistant", "\n\n  padded answer  \n\n"),
        m("user", "trailing newline\n"),
    ],
    "whitespace_only": [m("user", "   \n\t  ")],
    "thinking": [
        m("user", "What is 3*4?"),
        m("assistant", "<think>\nmultiply\n</think>\n\n12"),
        m("user", "And 5*6?"),
    ],
    "thinking_last": [
        m("user", "What is 3*4?"),
        m("assistant", "<think>\nreason here\n</think>\n\nIt is 12."),
    ],
    "tool_turns": [
        m("user", "Weather in Paris?"),
        m("assistant", "Let me check."),
        m("tool", "<tool_response>sunny</tool_response>"),
        m("tool", "22C"),
        m("user", "<tool_response>x</tool_response>"),
    ],
    "system_only": [m("system", "Only a system message.")],
    "two_users": [m("user", "first"), m("user", "second")],
    "long": [m("user" if i % 2 == 0 else "assistant", f"message number {i} " + "x" * (i % 7))
             for i in range(40)],
    "empty": [],
}

REAL_CASES = ["user_only", "system_user", "multi_turn", "assistant_last", "empty_content",
              "empty_system", "unicode", "quotes_newlines", "whitespace_only", "thinking",
              "thinking_last", "tool_turns", "system_only", "two_users", "long", "empty"]


def render(env, template, bos, eos, conversation, add_generation_prompt):
    messages = CONVERSATIONS[conversation]
    case = {"conversation": conversation, "messages": messages,
            "add_generation_prompt": add_generation_prompt}
    try:
        compiled = env.from_string(template)
        case["expected"] = compiled.render(messages=messages,
                                           add_generation_prompt=add_generation_prompt,
                                           bos_token=bos, eos_token=eos, tools=None,
                                           documents=None)
    except RaisedException as e:
        case["error"] = str(e)
        case["raised"] = True
    except Exception as e:  # any jinja2 or Python error: the C++ side must fail too
        case["error"] = f"{type(e).__name__}: {e}"
    return case


def token_string(config, key):
    value = config.get(key)
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def chat_template_of(config):
    t = config.get("chat_template")
    if isinstance(t, list):
        t = next((e["template"] for e in t if e.get("name") == "default"), None)
    return t


# Well-known templates (as published with their models, lightly abridged) and
# small templates that exercise one construct each. Each entry: name, template,
# and optionally the conversations to render (default: multi_turn) and which
# add_generation_prompt values (default: both).
SYNTHETIC = [
    # --- well-known model templates -------------------------------------------
    ("llama2_chat",
     "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
     "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
     "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
     "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
     "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
     "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
     "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
     "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
     "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
     "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}",
     ["user_only", "system_user", "multi_turn", "assistant_last", "unicode", "quotes_newlines",
      "two_users", "empty"]),
    ("mistral_instruct",
     "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
     "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
     "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}"
     "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
     "{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant "
     "roles are supported!') }}{% endif %}{% endfor %}",
     ["user_only", "system_user", "assistant_last", "unicode", "two_users"]),
    ("chatml",
     "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
     " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
     "{{ '<|im_start|>assistant\n' }}{% endif %}",
     ["system_user", "multi_turn", "unicode", "quotes_newlines", "empty"]),
    ("gemma",
     "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
     "supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != "
     "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
     "user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}"
     "{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
     "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
     "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}",
     ["user_only", "system_user", "assistant_last", "quotes_newlines", "unicode"]),
    ("phi3",
     "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + "
     "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + "
     "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
     "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
     "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}",
     ["multi_turn", "empty_content"]),
    ("zephyr",
     "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + "
     "message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n"
     "{{ '<|system|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == "
     "'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n"
     "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n"
     "{% endfor %}",
     ["multi_turn", "assistant_last", "quotes_newlines"]),
    ("llama32_with_dates", r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
""", ["user_only", "system_user", "multi_turn", "tool_turns", "unicode", "quotes_newlines"]),
    ("deepseek_like_namespace",
     "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
     "{% set ns = namespace(is_first=false, is_tool=false, system_prompt='') %}"
     "{%- for message in messages %}{%- if message['role'] == 'system' %}"
     "{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor %}"
     "{{bos_token}}{{ns.system_prompt}}{%- for message in messages %}"
     "{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}"
     "{{'<｜User｜>' + message['content']}}{%- endif %}"
     "{%- if message['role'] == 'assistant' %}{% set content = message['content'] %}"
     "{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}"
     "{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor -%}"
     "{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜><think>\\n'}}{% endif %}",
     ["multi_turn", "thinking", "thinking_last", "unicode"]),
    ("macro_turns",
     "{%- macro turn(role, text, close=true) -%}\n<{{ role }}>{{ text | trim }}"
     "{% if close %}</{{ role }}>{% endif %}\n{%- endmacro -%}\n"
     "{%- for message in messages -%}{{ turn(message.role, message.content, close=not loop.last) }}\n"
     "{%- endfor -%}{%- if add_generation_prompt %}{{ turn('assistant', '', close=false) }}{% endif %}",
     ["multi_turn", "unicode", "assistant_last"]),
    # --- whitespace control ----------------------------------------------------
    ("ws_trim_blocks", "{% if true %}\nyes\n{% endif %}\nafter\n", None, [True]),
    ("ws_lstrip_blocks", "line\n    {% if true %}\n    indented\n    {% endif %}\nend", None, [True]),
    ("ws_minus_both", "a   {%- if true -%}   b   {%- endif -%}   c", None, [True]),
    ("ws_minus_variable", "x  \n  {{- 'y' -}}  \n  z", None, [True]),
    ("ws_plus_disables_lstrip", "a\n    {%+ if true %}b{% endif %}\n", None, [True]),
    ("ws_plus_disables_trim", "{% if true +%}\nkept newline{% endif %}", None, [True]),
    ("ws_comment", "a\n  {# a comment #}\nb {#- tight -#}   c\n{# multi\nline #}\nd", None, [True]),
    ("ws_variable_not_lstripped", "a\n    {{ 'x' }}\n    {% if true %}y{% endif %}", None, [True]),
    ("ws_trailing_newline_dropped", "text\n\n", None, [True]),
    ("ws_tag_after_text_same_line", "abc  {% if true %}def{% endif %}  \n  ghi", None, [True]),
    ("ws_crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc", None, [True]),
    ("raw_block", "{% raw %}{{ not evaluated }} {% if %}{% endraw %}|done", None, [True]),
    # --- literals and printing ---------------------------------------------------
    ("literal_strings", "{{ 'single' }}|{{ \"double\" }}|{{ 'esc\\'aped' }}|{{ \"tab\\tnl\\nuni\\u00e9\\x41\" }}|{{ 'a' 'b' }}", None, [True]),
    ("literal_numbers", "{{ 42 }}|{{ -7 }}|{{ 3.5 }}|{{ 1_000 }}|{{ 1e3 }}|{{ 2.5e-3 }}|{{ 0.1 + 0.2 }}|{{ 1e100 }}|{{ 10 / 4 }}|{{ 6 / 3 }}", None, [True]),
    ("literal_constants", "{{ true }}|{{ True }}|{{ false }}|{{ none }}|{{ None }}|{{ [] }}|{{ {} }}", None, [True]),
    ("literal_containers", "{{ [1, 'two', 3.0, none, true, [4]] }}|{{ {'a': 1, 'b': [2, 'c'], 'd': {'e': none}} }}|{{ (1, 2) }}|{{ (1,) }}|{{ ['it\\'s', \"q\\\"\"] }}", None, [True]),
    ("print_undefined", "[{{ nothing }}][{{ messages[99] }}][{{ messages[0].missing }}]", None, [True]),
    # --- operators -----------------------------------------------------------
    ("arithmetic", "{{ 7 + 3 }} {{ 7 - 10 }} {{ 6 * 7 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 1.5 * 2 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}", None, [True]),
    ("precedence", "{{ 2 + 3 * 4 }} {{ (2 + 3) * 4 }} {{ -2 ** 2 }} {{ 2 * 3 ~ 4 }} {{ (1 + 2) ~ (3 + 4) }} {{ not true or true }} {{ not (true or true) }}", None, [True]),
    ("string_ops", "{{ 'a' + 'b' }}|{{ 'x' ~ 1 ~ none ~ true }}|{{ 'ab' * 3 }}|{{ 3 * 'c' }}|{{ [1] + [2, 3] }}|{{ [0] * 3 }}", None, [True]),
    ("comparisons", "{{ 1 == 1.0 }} {{ 1 != 2 }} {{ 'a' < 'b' }} {{ 2 <= 2 }} {{ 3 > 4 }} {{ 3 >= 3 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ [1, 2] == [1, 2] }} {{ {'a': 1} == {'a': 1} }} {{ none == none }} {{ true == 1 }}", None, [True]),
    ("membership", "{{ 'ell' in 'hello' }} {{ 2 in [1, 2] }} {{ 'role' in messages[0] }} {{ 'x' not in 'abc' }} {{ 5 not in [1] }} {{ 'tool_calls' in messages[0] }}", None, [True]),
    ("logic_values", "{{ 0 or 'fallback' }}|{{ 'first' or 'second' }}|{{ '' and 'x' }}|{{ 1 and 'y' }}|{{ none or [] or 'z' }}|{{ not '' }}", None, [True]),
    ("conditional_expression", "{{ 'yes' if true else 'no' }}|{{ 'yes' if 0 else 'no' }}|[{{ 'only' if false }}]|{{ 'a' if false else 'b' if true else 'c' }}", None, [True]),
    # --- variables, attributes, subscripts -----------------------------------------
    ("attribute_and_item", "{{ messages[0].role }}|{{ messages[0]['content'] }}|{{ messages[-1].content }}|{{ messages[1]['role'] }}|{{ {'k': {'n': 'deep'}}.k.n }}|{{ [10, 20][1] }}|{{ 'hello'[1] }}|{{ 'hello'[-1] }}", None, [True]),
    ("slices", "{{ [1,2,3,4,5][1:] }}|{{ [1,2,3,4,5][:2] }}|{{ [1,2,3,4,5][::-1] }}|{{ [1,2,3,4,5][1:4:2] }}|{{ [1,2,3,4,5][-2:] }}|{{ 'abcdef'[2:4] }}|{{ 'héllo'[::-1] }}|{{ [1,2,3][5:] }}|{{ messages[1:]|length }}", None, [True]),
    ("set_and_scope", "{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}[{{ x }}]{% endfor %}{{ x }}{% if true %}{% set y = 'if-leaks' %}{% endif %}{{ y }}", None, [True]),
    ("set_tuple_and_block", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set block %}inside {{ a + b }}{% endset %}[{{ block }}]{% set t = (1, 'x') %}{{ t[1] }}", None, [True]),
    ("namespace", "{% set ns = namespace(count=0, names=[]) %}{% for m in messages %}{% set ns.count = ns.count + 1 %}{% set ns.names = ns.names + [m.role] %}{% endfor %}{{ ns.count }} {{ ns.names|join(',') }} {{ ns.missing is defined }}", None, [True]),
    ("namespace_dict_init", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{% set ns.a = 'changed' %}{{ ns.a }}", None, [True]),
    # --- loops ------------------------------------------------------------------
    ("loop_variables", "{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }};{% endfor %}", None, [True]),
    ("loop_else", "{% for x in [] %}never{% else %}empty list{% endfor %}|{% for x in [1] %}{{ x }}{% else %}no{% endfor %}", None, [True]),
    ("loop_filter", "{% for m in messages if m.role != 'system' %}{{ loop.index }}:{{ m.role }} {% endfor %}", None, [True]),
    ("loop_break_continue", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}", None, [True]),
    ("loop_nested", "{% for i in range(3) %}{% for j in range(i) %}{{ i }}{{ j }}{{ loop.last }} {% endfor %}{{ loop.index }}|{% endfor %}", None, [True]),
    ("loop_dict_items", "{% for k, v in {'b': 1, 'a': 2}.items() %}{{ k }}={{ v }};{% endfor %}{% for k in {'x': 1, 'y': 2} %}{{ k }}{% endfor %}{% for (k, v) in {'z': 3}|items %}{{ k }}{{ v }}{% endfor %}", None, [True]),
    ("loop_string_and_previtem", "{% for c in 'abc' %}{{ c }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('+', '-') }}{% endfor %}", None, [True]),
    ("loop_undefined_iterable", "{% for x in nothing %}x{% else %}none{% endfor %}", None, [True]),
    ("range_forms", "{{ range(4)|list }}{{ range(2, 5)|list }}{{ range(10, 0, -3)|list }}{{ range(0)|list }}", None, [True]),
    # --- filters ------------------------------------------------------------------
    ("filters_strings", "{{ '  pad  '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ 'Hello'|upper }}|{{ 'Hello'|lower }}|{{ 'hello WORLD'|capitalize }}|{{ 'hello wORLD-x(y'|title }}|{{ 'a-b-c'|replace('-', '+') }}|{{ 'aaa'|replace('a', 'b', 2) }}|{{ 42|string }}|{{ none|string }}", None, [True]),
    ("filters_length_and_default", "{{ messages|length }}|{{ 'héllo'|length }}|{{ {'a': 1}|count }}|{{ nothing|length }}|{{ nothing|default('dflt') }}|{{ ''|default('dflt') }}|{{ ''|default('dflt', true) }}|{{ none|default('dflt') }}|{{ 'set'|d('x') }}", None, [True]),
    ("filters_numbers", "{{ '42'|int }}|{{ '4.7'|int }}|{{ 'x'|int }}|{{ 'x'|int(7) }}|{{ 3.9|int }}|{{ '2.5'|float }}|{{ -3|abs }}|{{ 2.5|round }}|{{ 3.14159|round(2) }}|{{ 2.1|round(0, 'ceil') }}|{{ [1, 2, 3]|sum }}|{{ [3, 1, 2]|max }}|{{ [3, 1, 2]|min }}", None, [True]),
    ("filters_lists", "{{ [3, 1, 2]|sort }}|{{ ['b', 'A', 'c']|sort }}|{{ [3, 1, 2]|sort(reverse=true) }}|{{ [1, 2, 1, 3]|unique|list }}|{{ [1, 2, 3]|reverse|list }}|{{ 'abc'|reverse }}|{{ [1, 2, 3]|first }}|{{ [1, 2, 3]|last }}|{{ 'xyz'|first }}|{{ 'xyz'|list }}|{{ [1, 2, 3]|join('-') }}|{{ ['a', 'b']|join }}", None, [True]),
    ("filters_dicts", "{{ {'b': 2, 'a': 1}|items|list }}|{{ {'b': 2, 'a': 1}|dictsort }}|{{ {'k': 'v'}|list }}|{{ {'b': 2, 'a': 1}|dictsort(by='value', reverse=true) }}", None, [True]),
    ("filters_select_map", "{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|join(' / ') }}|{{ messages|rejectattr('role', 'eq', 'user')|map(attribute='role')|list }}|{{ [1, 2, 3, 4]|select('odd')|list }}|{{ [1, 2, 3, 4]|reject('even')|list }}|{{ ['a', 'b']|map('upper')|join }}|{{ [{'x': 1}, {}]|map(attribute='x', default=0)|list }}|{{ messages|selectattr('content')|list|length }}", None, [True]),
    ("filters_tojson", "{{ {'b': [1, 2.5, none, true, 'é\"\\n'], 'a': {}}|tojson }}|{{ {'z': 1, 'a': [1, {'q': 'r'}]}|tojson(indent=2) }}|{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}|{{ 'str'|tojson }}|{{ [1, 2]|tojson(separators=(',', ':')) }}|{{ messages[0]|tojson }}|{{ [[], {}]|tojson(indent=4) }}", None, [True]),
    ("filters_indent_and_wordcount", "{{ 'a\nb\n\nc'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}|{{ 'a\n\nb'|indent('> ', blank=true) }}|{{ 'one two  three'|wordcount }}|{{ [1, 2, 3, 4, 5]|batch(2)|list }}", None, [True]),
    ("filter_chain_on_expression", "{{ messages|length - 1 }}|{{ (messages|length) * 2 }}|{{ -3|abs }}|{{ messages[0].content|upper|replace('B', 'b') }}", None, [True]),
    # --- tests ----------------------------------------------------------------------
    ("tests_types", "{{ 'x' is string }} {{ 1 is string }} {{ {} is mapping }} {{ [] is mapping }} {{ [] is iterable }} {{ 'x' is iterable }} {{ 1 is iterable }} {{ 1 is number }} {{ 1.5 is number }} {{ 'x' is number }} {{ 1 is integer }} {{ 1.0 is float }} {{ true is boolean }} {{ none is none }} {{ 0 is none }} {{ [] is sequence }}", None, [True]),
    ("tests_defined", "{{ x is defined }} {{ x is undefined }} {{ messages is defined }} {{ messages[0].nope is defined }} {{ x is not defined }} {{ none is not none }} {{ range is callable }} {{ nothing is iterable }}", None, [True]),
    ("tests_values", "{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ true is true }} {{ 1 is true }} {{ false is false }} {{ 2 is eq 2 }} {{ 2 is equalto(3) }} {{ 2 is lt 3 }} {{ 2 is gt 3 }} {{ 'a' is in 'abc' }} {{ 'abc' is lower }} {{ 'ABC' is upper }} {{ none is sameas none }} {{ 1 is ne 1 }} {{ 2 is ge 2 }} {{ 2 is le 1 }}", None, [True]),
    # --- methods -----------------------------------------------------------------
    ("string_methods", "{{ '  x  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '  x'.lstrip() }}|{{ 'x  '.rstrip() }}|{{ '\n\nx\n'.lstrip('\n') }}|{{ 'hello'.startswith('he') }}|{{ 'hello'.endswith('lo') }}|{{ 'hello'.startswith(('x', 'h')) }}|{{ 'a,b,,c'.split(',') }}|{{ '  a  b c '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'Hi'.upper() }}{{ 'Hi'.lower() }}|{{ 'aXa'.replace('a', 'b') }}|{{ 'hello world'.title() }}|{{ 'hello'.capitalize() }}|{{ 'hello'.find('l') }}|{{ 'hello'.count('l') }}|{{ '-'.join(['a', 'b']) }}|{{ 'a\nb\r\nc'.splitlines() }}", None, [True]),
    ("dict_methods", "{% set d = {'a': 1, 'b': 2} %}{{ d.get('a') }}|{{ d.get('z') }}|{{ d.get('z', 'dflt') }}|{{ d.keys()|list }}|{{ d.values()|list }}|{{ d.items()|list }}|{{ d['items'] is defined }}", None, [True]),
    ("method_on_message_content", "{% for m in messages %}{{ m.content.strip().split(' ')[0]|lower }};{% endfor %}", ["multi_turn", "quotes_newlines"], [True]),
    ("method_on_unicode_content", "{% for m in messages %}{{ m.content.strip().split(' ')[0] }}|{{ m.content[1:4] }}|{{ m.content|length }}|{{ m.content.split() }};{% endfor %}", ["unicode"], [True]),
    # --- functions, macros, misc -------------------------------------------------------
    ("strftime_now", "{{ strftime_now('%Y-%m-%d %H:%M:%S') }}|{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%A %B %j') }}", None, [True]),
    ("macros", "{% macro greet(name, punct='!') %}Hello {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }}|{{ greet('b', '?') }}|{{ greet(punct='.', name='c') }}|{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(5) }}|{% macro missing(x) %}[{{ x }}]{% endmacro %}{{ missing() }}", None, [True]),
    ("macro_sees_globals", "{% set top = 'T' %}{% macro m() %}{{ top }}{{ messages|length }}{% endmacro %}{{ m() }}", None, [True]),
    ("generation_tag", "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}|{% endfor %}", None, [True]),
    ("bos_eos_and_generation_prompt", "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools }}|{{ documents is none }}", None, [True, False]),
    ("dict_literal_keys", "{% set d = {'a': 1, 'a': 2, 1: 'one'} %}{{ d }}|{{ d[1] }}|{{ d.a }}", None, [True]),
    # --- errors (jinja2 raises; so must the C++ side) --------------------------------
    ("error_raise_exception", "{% if messages|length > 1 %}{{ raise_exception('Too many messages: ' ~ messages|length) }}{% endif %}ok", ["user_only", "multi_turn"], [True]),
    ("error_undefined_call", "{{ undefined_function() }}", None, [True]),
    ("error_type_concat", "{{ 'a' + 1 }}", None, [True]),
    ("error_attribute_of_undefined", "{{ nothing.attribute }}", None, [True]),
    ("error_division_by_zero", "{{ 1 / 0 }}", None, [True]),
    ("error_not_callable", "{{ messages() }}", None, [True]),
    ("error_iterate_number", "{% for x in 5 %}{% endfor %}", None, [True]),
    ("error_compare_types", "{{ 1 < 'a' }}", None, [True]),
    ("error_concat_precedence", "{{ 1 + 2 ~ 3 + 4 }}", None, [True]),
    ("error_empty_messages_index", "{{ messages[0].role }}", ["empty"], [True]),
    ("error_tojson_undefined", "{{ nothing|tojson }}", None, [True]),
    ("error_range_too_big", "{{ range(1000000)|length }}", None, [True]),
    ("error_set_attribute_non_namespace", "{% set d = {} %}{% set d.x = 1 %}", None, [True]),
]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shared", default="/work/shared")
    args = parser.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out_dir = os.path.join(root, "tests", "fixtures", "chat_templates")
    os.makedirs(out_dir, exist_ok=True)
    env = make_environment()
    now = [NOW.year, NOW.month, NOW.day, NOW.hour, NOW.minute, NOW.second]

    sources = [(name, os.path.join(args.shared, "tokenizers", name)) for name in REAL_TEMPLATES]
    models_dir = os.path.join(root, "models")
    for model in sorted(os.listdir(models_dir)) if os.path.isdir(models_dir) else []:
        sources.append((model, os.path.join(models_dir, model)))
    for name, folder in sources:
        with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
            config = json.load(f)
        template = chat_template_of(config)
        jinja_path = os.path.join(folder, "chat_template.jinja")
        if os.path.exists(jinja_path):
            with open(jinja_path, encoding="utf-8") as f:
                template = f.read()
        if template is None:
            print(f"{name}: no chat template (ChatTemplate::load must say NotFound)")
            continue
        bos, eos = token_string(config, "bos_token"), token_string(config, "eos_token")
        cases = [render(env, template, bos, eos, conv, agp)
                 for conv in REAL_CASES for agp in (False, True)]
        fixture = {"name": name, "source": os.path.relpath(folder, args.shared)
                   if folder.startswith(args.shared) else os.path.relpath(folder, root),
                   "template": template, "bos_token": bos, "eos_token": eos, "now": now,
                   "cases": cases}
        with open(os.path.join(out_dir, f"{name}.json"), "w", encoding="utf-8") as f:
            json.dump(fixture, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"{name}: {len(cases)} cases, {sum('error' in c for c in cases)} errors")

    bos, eos = "<s>", "</s>"
    templates = []
    for entry in SYNTHETIC:
        name, template = entry[0], entry[1]
        conversations = entry[2] if len(entry) > 2 and entry[2] else ["multi_turn"]
        prompts = entry[3] if len(entry) > 3 else [False, True]
        cases = [render(env, template, bos, eos, conv, agp)
                 for conv in conversations for agp in prompts]
        templates.append({"name": name, "template": template, "cases": cases})
    with open(os.path.join(out_dir, "synthetic.json"), "w", encoding="utf-8") as f:
        json.dump({"now": now, "bos_token": bos, "eos_token": eos, "templates": templates}, f,
                  ensure_ascii=False, indent=1)
        f.write("\n")
    n_cases = sum(len(t["cases"]) for t in templates)
    n_errors = sum("error" in c for t in templates for c in t["cases"])
    print(f"synthetic: {len(templates)} templates, {n_cases} cases, {n_errors} errors")


if __name__ == "__main__":
    main()
