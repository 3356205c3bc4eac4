"""Tool calling and reasoning on /v1/chat/completions through the official openai
client, on tiny random models with the Qwen3 (Hermes-style calls, <think>), Llama
3.1 and Mistral v0.3 chat templates: constrained tool_choice (named, required)
always yields calls whose arguments validate against the tool's schema; histories
with tool calls and tool results render exactly as transformers renders them;
chat_template_kwargs reach the template; reasoning_content is split off; bad
tools / tool_choice get 400 naming the field."""
import json
import os
import urllib.error
import urllib.request

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

from conftest import ROOT, Server  # noqa: E402

SHARED = os.environ.get("CELLM_SHARED_DIR", os.path.join(ROOT, "..", "shared"))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
SOURCES = os.path.join(FIXTURES, "chat_templates", "sources")

# model fixture, tokenizer, template file (None: the tokenizer's own)
FAMILIES = {
    "qwen3": ("qwen3-tiny", "qwen3", None),
    "llama3": ("llama3-tiny", "llama3", os.path.join(SOURCES, "llama3.1.jinja")),
    "mistral": ("mistral-tiny", "llama2", os.path.join(SOURCES, "mistral-v0.3.jinja")),
}

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 6},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "detailed": {"type": "boolean"},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a zone.",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["utc", "local"]}, "24h": {"type": "boolean"}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _need(path):
    if not os.path.exists(path):
        pytest.skip(f"{path} is absent")


def model_folder(tmp_path_factory, family):
    fixture, tokenizer, _ = FAMILIES[family]
    src = os.path.join(FIXTURES, "models", fixture)
    tok = os.path.join(SHARED, "tokenizers", tokenizer)
    _need(src)
    _need(os.path.join(tok, "tokenizer.json"))
    folder = tmp_path_factory.mktemp(family)
    for d in (src, tok):
        for name in os.listdir(d):
            if not (folder / name).exists():
                os.symlink(os.path.join(d, name), folder / name)
    return folder


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_server(request, tmp_path_factory):
    family = request.param
    folder = model_folder(tmp_path_factory, family)
    template = FAMILIES[family][2]
    extra = ["--chat-template", template] if template else []
    s = Server("--model", str(folder), "--served-model-name", "m", "--max-sessions", "8", *extra)
    s.family = family
    s.folder = folder
    yield s
    assert s.stop() == 0


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def post(server, path, body):
    req = urllib.request.Request(server.url + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def check_call(call, allowed):
    assert call.type == "function"
    assert call.id
    assert call.function.name in allowed
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name])


def test_a_named_tool_choice_returns_a_valid_call(family_server):
    for seed in range(4):
        r = client(family_server).chat.completions.create(
            model="m", messages=ASK, tools=[WEATHER, TIME], max_tokens=150, seed=seed,
            tool_choice={"type": "function", "function": {"name": "get_weather"}})
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", c
        assert c.message.content is None
        assert len(c.message.tool_calls) == 1
        check_call(c.message.tool_calls[0], {"get_weather"})


def test_a_named_tool_choice_streams_a_valid_call(family_server):
    for seed in range(3):
        stream = client(family_server).chat.completions.create(
            model="m", messages=ASK, tools=[WEATHER, TIME], max_tokens=150, seed=seed, stream=True,
            tool_choice={"type": "function", "function": {"name": "get_time"}})
        calls, finish, content = {}, None, ""
        for chunk in stream:
            d = chunk.choices[0].delta
            content += d.content or ""
            for tc in d.tool_calls or []:
                entry = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                entry["id"] += tc.id or ""
                entry["name"] += tc.function.name or ""
                entry["arguments"] += tc.function.arguments or ""
            if chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        assert finish == "tool_calls"
        assert content == ""
        assert list(calls) == [0]
        assert calls[0]["name"] == "get_time" and calls[0]["id"]
        jsonschema.validate(json.loads(calls[0]["arguments"]), SCHEMAS["get_time"])


def test_required_with_two_tools_calls_them_validly(family_server):
    names = set()
    for seed in range(6):
        r = client(family_server).chat.completions.create(
            model="m", messages=ASK, tools=[WEATHER, TIME], max_tokens=150, seed=seed,
            tool_choice="required")
        c = r.choices[0]
        if c.finish_reason == "length":
            continue  # several calls may not fit max_tokens; nothing to check then
        assert c.finish_reason == "tool_calls"
        assert c.message.tool_calls
        for call in c.message.tool_calls:
            check_call(call, {"get_weather", "get_time"})
            names.add(call.function.name)
        assert len({call.id for call in c.message.tool_calls}) == len(c.message.tool_calls)
    assert names  # at least one seed finished


def test_required_without_parallel_calls_makes_exactly_one(family_server):
    for seed in range(3):
        r = client(family_server).chat.completions.create(
            model="m", messages=ASK, tools=[WEATHER, TIME], max_tokens=150, seed=seed,
            tool_choice="required", parallel_tool_calls=False)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls"
        assert len(c.message.tool_calls) == 1
        check_call(c.message.tool_calls[0], {"get_weather", "get_time"})


def history(family):
    call_id = "abcDEF123" if family == "mistral" else "call_abc123"
    return [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "get_weather", "arguments": {"unit": "celsius", "city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": call_id, "name": "get_weather", "content": "{\"temp\": 21}"},
        {"role": "assistant", "content": "It is 21 C."},
        {"role": "user", "content": "And the time?"},
    ]


def reference_ids(server, messages, tools=None, **kwargs):
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(server.folder))
    template = FAMILIES[server.family][2]
    extra = {"chat_template": open(template).read()} if template else {}
    text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                   tokenize=False, **extra, **kwargs)
    return tok(text, add_special_tokens=False)["input_ids"]


def test_a_history_with_tool_calls_renders_as_transformers_renders_it(family_server):
    messages = history(family_server.family)
    tools = [WEATHER, TIME]
    status, r = post(family_server, "/tokenize", {"messages": messages, "tools": tools})
    assert status == 200, r
    expected = reference_ids(family_server, messages, tools)
    assert r["tokens"] == expected
    # The chat endpoint renders the same prompt.
    c = client(family_server).chat.completions.create(model="m", messages=messages, tools=tools,
                                                      max_tokens=2, tool_choice="none")
    assert c.usage.prompt_tokens == len(expected)


def test_arguments_as_a_json_string_render_as_transformers_renders_them(family_server):
    messages = history(family_server.family)
    messages[2]["tool_calls"][0]["function"]["arguments"] = "{\"city\": \"Paris\"}"
    status, r = post(family_server, "/tokenize", {"messages": messages, "tools": [WEATHER]})
    assert status == 200, r
    assert r["tokens"] == reference_ids(family_server, messages, [WEATHER])


def test_tool_choice_none_shows_the_tools_but_parses_no_calls(family_server):
    tools = [WEATHER]
    # The template still sees the tools: the prompt is longer than without them.
    _, with_tools = post(family_server, "/tokenize", {"messages": ASK, "tools": tools})
    _, without = post(family_server, "/tokenize", {"messages": ASK})
    assert with_tools["count"] > without["count"]
    r = client(family_server).chat.completions.create(model="m", messages=ASK, tools=tools,
                                                      tool_choice="none", max_tokens=6, seed=1)
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason in ("length", "stop")
    assert r.usage.prompt_tokens == with_tools["count"]


def test_bad_tools_and_tool_choice_get_400_naming_the_field(family_server):
    weather = json.loads(json.dumps(WEATHER))
    cases = [
        ({"tools": {"a": 1}}, "tools"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "function": {"description": "x"}}]},
         "tools[0].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]},
         "tools[0].function.parameters"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
         "tools[0].function.parameters.type"),
        ({"tools": [weather, weather]}, "tools[1].function.name"),
        ({"tools": [weather], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice"),
        ({"tools": [weather], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [weather], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"chat_template_kwargs": [1]}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"type": "function"}]}]},
         "messages[0].tool_calls[0].function"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
         "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": "hi", "audio": {"id": "x"}}]}, "messages[0].audio"),
        ({"tools": [{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "patternProperties": {"a": {}}}}}],
          "tool_choice": "required"}, "tools"),
    ]
    for extra, param in cases:
        body = {"model": "m", "messages": ASK, "max_tokens": 4, **extra}
        status, r = post(family_server, "/v1/chat/completions", body)
        assert status == 400, (extra, r)
        assert r["error"]["param"] == param, (extra, r)


def test_auto_parses_calls_in_the_template_format(family_server):
    """A call the model writes (here forced with a regex constraint) comes back as
    tool_calls with tool_choice auto, and as content with tool_choice none."""
    text = {
        "qwen3": '<tool_call>\\n\\{"name": "get_time", "arguments": \\{"zone": "utc"\\}\\}\\n</tool_call>',
        "llama3": '\\{"name": "get_time", "parameters": \\{"zone": "utc"\\}\\}',
        "mistral": '\\[TOOL_CALLS\\]\\[\\{"name": "get_time", "arguments": \\{"zone": "utc"\\}\\}\\]',
    }[family_server.family]
    base = {"model": "m", "messages": ASK, "tools": [TIME], "max_tokens": 80, "guided_regex": text}
    status, r = post(family_server, "/v1/chat/completions", {**base, "tool_choice": "auto"})
    assert status == 200, r
    c = r["choices"][0]
    assert c["finish_reason"] == "tool_calls", c
    assert c["message"]["content"] is None
    [call] = c["message"]["tool_calls"]
    assert call["function"]["name"] == "get_time"
    assert json.loads(call["function"]["arguments"]) == {"zone": "utc"}
    status, r = post(family_server, "/v1/chat/completions", {**base, "tool_choice": "none"})
    assert status == 200, r
    c = r["choices"][0]
    assert c["finish_reason"] == "stop"
    assert "get_time" in c["message"]["content"]
    assert "tool_calls" not in c["message"]


@pytest.fixture(scope="module")
def qwen3_server(tmp_path_factory):
    folder = model_folder(tmp_path_factory, "qwen3")
    s = Server("--model", str(folder), "--served-model-name", "m", "--max-sessions", "4")
    s.family = "qwen3"
    s.folder = folder
    yield s
    assert s.stop() == 0


def test_enable_thinking_reaches_the_template(qwen3_server):
    _, default = post(qwen3_server, "/tokenize", {"messages": ASK})
    _, off = post(qwen3_server, "/tokenize",
                  {"messages": ASK, "chat_template_kwargs": {"enable_thinking": False}})
    assert default["tokens"] == reference_ids(qwen3_server, ASK)
    assert off["tokens"] == reference_ids(qwen3_server, ASK, enable_thinking=False)
    assert off["tokens"] != default["tokens"]


def test_reasoning_is_split_into_reasoning_content(qwen3_server):
    # The random model is made to think (a regex constraint): the <think> block comes
    # back as reasoning_content, the rest as content, streamed and not.
    body = {"model": "m", "messages": ASK, "max_tokens": 60,
            "guided_regex": "<think>\\nhm [a-z]{3}\\n</think>\\n\\nYes [a-z]{2}"}
    status, r = post(qwen3_server, "/v1/chat/completions", body)
    assert status == 200, r
    m = r["choices"][0]["message"]
    assert m["reasoning_content"].startswith("hm ") and len(m["reasoning_content"]) == 6
    assert m["content"].startswith("Yes ") and len(m["content"]) == 6
    stream = client(qwen3_server).chat.completions.create(
        model="m", messages=ASK, max_tokens=60, stream=True,
        extra_body={"guided_regex": body["guided_regex"]})
    reasoning, content = "", ""
    for chunk in stream:
        d = chunk.choices[0].delta
        reasoning += getattr(d, "reasoning_content", None) or ""
        content += d.content or ""
    assert reasoning.startswith("hm ") and len(reasoning) == 6
    assert content.startswith("Yes ") and len(content) == 6
    # No think block: all content, reasoning_content null.
    status, r = post(qwen3_server, "/v1/chat/completions",
                     {**body, "guided_regex": "Plain [a-z]{2}"})
    assert r["choices"][0]["message"]["reasoning_content"] is None
    assert r["choices"][0]["message"]["content"].startswith("Plain ")


def test_tools_on_a_template_without_a_call_format_get_400(tmp_path_factory):
    folder = model_folder(tmp_path_factory, "qwen3")
    template = tmp_path_factory.mktemp("tpl") / "plain.jinja"
    template.write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    s = Server("--model", str(folder), "--served-model-name", "m", "--chat-template", str(template))
    try:
        status, r = post(s, "/v1/chat/completions",
                         {"model": "m", "messages": ASK, "tools": [WEATHER], "max_tokens": 2})
        assert status == 400 and "--tool-call-parser" in r["error"]["message"], r
        # tool_choice none needs no format; --tool-call-parser supplies one.
        status, _ = post(s, "/v1/chat/completions", {"model": "m", "messages": ASK, "tools": [WEATHER],
                                                     "tool_choice": "none", "max_tokens": 2})
        assert status == 200
    finally:
        assert s.stop() == 0
    s = Server("--model", str(folder), "--served-model-name", "m", "--chat-template", str(template), "--tool-call-parser", "hermes")
    try:
        r = client(s).chat.completions.create(
            model="m", messages=ASK, tools=[WEATHER], max_tokens=120, seed=3,
            tool_choice={"type": "function", "function": {"name": "get_weather"}})
        assert r.choices[0].finish_reason == "tool_calls"
        check_call(r.choices[0].message.tool_calls[0], {"get_weather"})
    finally:
        assert s.stop() == 0
