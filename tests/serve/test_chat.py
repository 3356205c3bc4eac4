"""/v1/chat/completions through the official openai client, on the bundled model
given a chat template (a copy of models/kjv-small whose tokenizer_config.json
names one)."""
import json
import os

import pytest

openai = pytest.importorskip("openai")

from conftest import MODEL, Server  # noqa: E402

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] | upper }}: {{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)
MESSAGES = [{"role": "system", "content": "Thou art a scribe."},
            {"role": "user", "content": "In the beginning God created"}]


@pytest.fixture(scope="module")
def chat_server(tmp_path_factory):
    model = tmp_path_factory.mktemp("kjv-chat")
    for name in os.listdir(MODEL):
        if name != "tokenizer_config.json":
            os.symlink(os.path.join(MODEL, name), model / name)
    with open(os.path.join(MODEL, "tokenizer_config.json")) as f:
        config = json.load(f)
    config["chat_template"] = TEMPLATE
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    s = Server("--model", str(model))
    yield s
    assert s.stop() == 0


def chat(server, **kw):
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    kw.setdefault("model", "kjv-chat0")
    kw.setdefault("messages", MESSAGES)
    return c.chat.completions.create(**kw)


def model_id(server):
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    return c.models.list().data[0].id


def test_chat_answers_with_an_assistant_message(chat_server):
    r = chat(chat_server, model=model_id(chat_server), max_tokens=12, temperature=0)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content
    assert r.choices[0].finish_reason == "length"
    # BOS + the rendered turns: more than the user's words alone.
    assert r.usage.prompt_tokens > 12
    assert r.usage.completion_tokens == 12


def test_chat_streaming_sends_deltas_that_add_up_to_the_answer(chat_server):
    m = model_id(chat_server)
    whole = chat(chat_server, model=m, max_tokens=20, temperature=0).choices[0].message.content
    pieces, roles, finish = [], [], None
    for chunk in chat(chat_server, model=m, max_tokens=20, temperature=0, stream=True):
        assert chunk.object == "chat.completion.chunk"
        for c in chunk.choices:
            if c.delta.role:
                roles.append(c.delta.role)
            if c.delta.content:
                pieces.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    assert roles == ["assistant"]
    assert "".join(pieces) == whole
    assert finish == "length"


def test_chat_streaming_ends_with_the_usage_when_asked(chat_server):
    m = model_id(chat_server)
    chunks = list(chat(chat_server, model=m, max_tokens=7, temperature=0, stream=True,
                       stream_options={"include_usage": True}))
    last = chunks[-1]
    assert last.object == "chat.completion.chunk"
    assert last.choices == []
    assert last.usage.completion_tokens == 7
    assert last.usage.prompt_tokens > 12
    assert last.usage.total_tokens == last.usage.prompt_tokens + 7
    # Only the last chunk carries it.
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_n_seeds_and_stop_strings(chat_server):
    m = model_id(chat_server)
    r = chat(chat_server, model=m, max_tokens=16, temperature=1.0, seed=5, n=3)
    texts = [c.message.content for c in r.choices]
    assert len(texts) == 3
    again = chat(chat_server, model=m, max_tokens=16, temperature=1.0, seed=5, n=3)
    assert [c.message.content for c in again.choices] == texts
    full = chat(chat_server, model=m, max_tokens=40, temperature=0).choices[0].message.content
    stop = full[10:13]
    cut = chat(chat_server, model=m, max_tokens=40, temperature=0, stop=stop)
    assert cut.choices[0].message.content == full[: full.find(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_chat_ends_with_stop_when_the_model_ends_its_turn(chat_server):
    r = chat(chat_server, model=model_id(chat_server), temperature=0)  # no max_tokens: the session's room
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens + r.usage.completion_tokens <= 256


def test_chat_logprobs(chat_server):
    r = chat(chat_server, model=model_id(chat_server), max_tokens=5, temperature=0, logprobs=True,
             top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == 5
    for entry in content:
        assert entry.logprob <= 0
        assert 1 <= len(entry.top_logprobs) <= 2


def test_bad_messages_answer_400(chat_server):
    m = model_id(chat_server)
    for messages, param in [([], "messages"), ([{"content": "x"}], "messages[0].role"),
                            ([{"role": "user", "content": 5}], "messages[0].content")]:
        with pytest.raises(openai.BadRequestError) as e:
            chat(chat_server, model=m, messages=messages)
        assert e.value.body["param"] == param


def test_a_model_without_a_chat_template_answers_400(server):
    with pytest.raises(openai.BadRequestError) as e:
        chat(server, model="kjv-small", max_tokens=4)
    assert e.value.body["code"] == "no_chat_template"


# Fields cellm does not implement, each answered with a 400 that names it.
UNSUPPORTED_CHAT = [
    # OpenAI's deprecated forms of tools and tool_choice (test_tools.py covers those).
    ("functions", [{"name": "f", "parameters": {}}]),
    ("function_call", "auto"),
    ("no_such_field", 1),
]


@pytest.mark.parametrize("name,value", UNSUPPORTED_CHAT)
def test_an_unimplemented_field_answers_400_naming_it(chat_server, name, value):
    with pytest.raises(openai.BadRequestError) as e:
        chat(chat_server, model=model_id(chat_server), max_tokens=2, extra_body={name: value})
    assert e.value.body["param"] == name
    assert name in e.value.body["message"]


def test_message_keys_the_server_cannot_render_answer_400(chat_server):
    # tool_calls, tool_call_id and name are rendered (test_tools.py); these are not.
    for extra in [{"audio": {"id": "a"}}, {"function_call": {"name": "f", "arguments": "{}"}},
                  {"tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]}]:
        key = next(iter(extra))
        messages = [{"role": "user", "content": "hi", **extra}]
        with pytest.raises(openai.BadRequestError) as e:
            chat(chat_server, model=model_id(chat_server), messages=messages, max_tokens=2)
        assert e.value.body["param"] == "messages[0]." + key


def test_bookkeeping_fields_are_accepted(chat_server):
    r = chat(chat_server, model=model_id(chat_server), max_tokens=2, temperature=0,
             extra_body={"metadata": {"run": "a"}, "store": False, "user": "u"})
    assert r.choices[0].message.role == "assistant"
