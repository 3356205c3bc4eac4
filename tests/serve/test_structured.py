"""Structured outputs by constrained decoding and the sampling controls, through the
official openai client against the real server: response_format (json_object,
json_schema), vLLM's guided_* and structured_outputs, the client's parse()
helper with a Pydantic model, and presence/frequency/repetition penalties,
logit_bias, min_tokens and stop_token_ids.

Models: the bundled kjv-small (given a chat template) for the many seeded samples,
and random-weight tiny models with real tokenizers (qwen3-tiny: byte-level BPE,
151k tokens; mistral-tiny: SentencePiece with byte fallback) assembled in temp
folders from tests/fixtures/models and ../shared/tokenizers.

Sampling for the validity checks: temperature 1, seeded, n = 8 per request. Every
output whose finish_reason is "stop" must validate; "length" cuts (max_tokens
reached mid-value) are counted apart and must stay rare (at most 5%). The
schemas bound their strings (maxLength) and arrays (maxItems), so outputs end;
json_object's strings are unbounded, so that test puts a small logit_bias (+4) on
the quote token to make a random model close its strings sooner."""
import concurrent.futures
import json
import os
import re
import shutil
import urllib.request

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pydantic = pytest.importorskip("pydantic")

from conftest import MODEL, ROOT, Server  # noqa: E402

SHARED = os.path.join(ROOT, "..", "shared")
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] | upper }}: {{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)
MESSAGES = [{"role": "user", "content": "Give me a record."}]
SAMPLES_PER_REQUEST = 8
MAX_LENGTH_CUT_FRACTION = 0.05


@pytest.fixture(scope="module")
def kjv(tmp_path_factory):
    model = tmp_path_factory.mktemp("kjv-structured")
    for name in os.listdir(MODEL):
        if name != "tokenizer_config.json":
            os.symlink(os.path.join(MODEL, name), model / name)
    with open(os.path.join(MODEL, "tokenizer_config.json")) as f:
        config = json.load(f)
    config["chat_template"] = TEMPLATE
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    s = Server("--model", str(model), "--max-sessions", "16")
    yield s
    assert s.stop() == 0


def tiny_model(tmp_path_factory, fixture, tokenizer):
    """A random-weight fixture model with a real tokenizer, or a skip without ../shared."""
    tok_dir = os.path.join(SHARED, "tokenizers", tokenizer)
    if not os.path.isdir(tok_dir):
        pytest.skip(f"no {tok_dir}")
    model = tmp_path_factory.mktemp(fixture)
    src = os.path.join(ROOT, "tests", "fixtures", "models", fixture)
    for name in os.listdir(src):
        os.symlink(os.path.join(src, name), model / name)
    for name in os.listdir(tok_dir):
        shutil.copy(os.path.join(tok_dir, name), model / name)
    return model


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    s = Server("--model", str(tiny_model(tmp_path_factory, "qwen3-tiny", "qwen3")),
               "--max-sessions", "16")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    s = Server("--model", str(tiny_model(tmp_path_factory, "mistral-tiny", "llama2")),
               "--max-sessions", "16")
    yield s
    assert s.stop() == 0


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def complete(server, **kw):
    kw.setdefault("model", client(server).models.list().data[0].id)
    kw.setdefault("prompt", "In the beginning")
    return client(server).completions.create(**kw)


def chat(server, **kw):
    kw.setdefault("model", client(server).models.list().data[0].id)
    kw.setdefault("messages", MESSAGES)
    return client(server).chat.completions.create(**kw)


def tokenize(server, text):
    req = urllib.request.Request(server.url + "/tokenize", method="POST",
                                 data=json.dumps({"prompt": text, "add_special_tokens": False}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["tokens"]


def token_id(server, text):
    ids = tokenize(server, text)
    assert len(ids) == 1, (text, ids)
    return ids[0]


def sample_texts(server, requests, endpoint="completions", **kw):
    """(texts that stopped, number cut by length) over `requests` seeded requests of n = 8,
    two at a time."""
    model = client(server).models.list().data[0].id

    def one(seed):
        if endpoint == "completions":
            r = complete(server, model=model, n=SAMPLES_PER_REQUEST, seed=1000 + seed, temperature=1, **kw)
            return [(c.text, c.finish_reason) for c in r.choices]
        r = chat(server, model=model, n=SAMPLES_PER_REQUEST, seed=1000 + seed, temperature=1, **kw)
        return [(c.message.content, c.finish_reason) for c in r.choices]

    stopped, cut = [], 0
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(one, range(requests)))
    for outs in results:
        for text, finish in outs:
            assert finish in ("stop", "length"), finish
            if finish == "stop":
                stopped.append(text)
            else:
                cut += 1
    return stopped, cut


def expect_valid(texts, cut, schema, minimum):
    for text in texts:
        value = json.loads(text)  # raises on anything that is not one JSON value
        jsonschema.validate(value, schema)
    total = len(texts) + cut
    assert len(texts) >= minimum, (len(texts), cut)
    assert cut <= MAX_LENGTH_CUT_FRACTION * total, f"{cut} of {total} cut by max_tokens"


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "role": {"enum": ["admin", "user", "guest"]},
        "version": {"const": 2},
        "active": {"type": "boolean"},
        "note": {"type": ["string", "null"], "maxLength": 8},
    },
    "required": ["name", "age", "role", "version"],
    "additionalProperties": False,
}
SHAPES = {
    "$defs": {
        "point": {
            "type": "object",
            "properties": {"x": {"type": "number"}, "y": {"type": "integer"}},
            "required": ["x", "y"],
            "additionalProperties": False,
        },
        "label": {"type": "string", "maxLength": 6},
    },
    "type": "object",
    "properties": {
        "points": {"type": "array", "items": {"$ref": "#/$defs/point"}, "minItems": 1, "maxItems": 3},
        "tags": {"type": "array", "items": {"$ref": "#/$defs/label"}, "maxItems": 4},
    },
    "required": ["points", "tags"],
    "additionalProperties": False,
}
EITHER = {
    "$defs": {
        "leaf": {
            "type": "object",
            "properties": {"id": {"type": "integer"}, "ok": {"type": "null"}},
            "required": ["id"],
            "additionalProperties": False,
        },
        "node": {
            "type": "object",
            "properties": {"kind": {"const": "node"}, "leaves": {"type": "array", "items": {"$ref": "#/$defs/leaf"},
                                                                 "maxItems": 2}},
            "required": ["kind", "leaves"],
            "additionalProperties": False,
        },
    },
    "anyOf": [
        {"$ref": "#/$defs/node"},
        {"type": "array", "items": {"enum": [1, "two", None, True]}, "maxItems": 5},
        {"type": "boolean"},
    ],
}


@pytest.mark.parametrize("name,schema", [("person", PERSON), ("shapes", SHAPES), ("either", EITHER)])
def test_json_schema_outputs_always_validate(qwen3, name, schema):
    rf = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
    texts, cut = sample_texts(qwen3, 8, max_tokens=450, extra_body={"response_format": rf})
    chat_texts, chat_cut = sample_texts(qwen3, 1, endpoint="chat", max_tokens=400,
                                        response_format=rf)
    # 8 * 8 + 8 = 72 samples per schema, 216 over the three.
    expect_valid(texts + chat_texts, cut + chat_cut, schema, minimum=68)


def test_json_object_outputs_always_parse_as_objects(qwen3):
    # A random model over 151k tokens rarely picks the one token that closes a
    # string; +10 on '"' makes strings end after a few tokens.
    quote = token_id(qwen3, '"')
    texts, cut = sample_texts(qwen3, 25, max_tokens=450,
                              extra_body={"response_format": {"type": "json_object"},
                                          "logit_bias": {str(quote): 10}})
    expect_valid(texts, cut, {"type": "object"}, minimum=190)


def test_guided_json_and_structured_outputs_take_a_schema(qwen3):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    for extra in ({"guided_json": schema}, {"guided_json": json.dumps(schema)},
                  {"structured_outputs": {"json": schema}}):
        texts, cut = sample_texts(qwen3, 1, max_tokens=200, extra_body=extra)
        expect_valid(texts, cut, schema, minimum=7)


def test_streamed_constrained_output_validates(qwen3):
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    stream = chat(qwen3, stream=True, seed=5, temperature=1, max_tokens=400, response_format=rf)
    text, finish = "", None
    for chunk in stream:
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    assert finish == "stop"
    jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.parametrize("pattern", [r"[0-9]{3}-[a-z]{2,5}", r"(yes|no|maybe)!?", r"\d+\.\d\d",
                                     r"[A-Z][a-z]{0,8} (and|or) [A-Z][a-z]{0,8}"])
def test_regex_outputs_always_match(kjv, pattern):
    texts, cut = sample_texts(kjv, 4, max_tokens=40, extra_body={"guided_regex": pattern})
    assert cut <= MAX_LENGTH_CUT_FRACTION * (len(texts) + cut)
    for text in texts:
        assert re.fullmatch(pattern, text), (pattern, text)


@pytest.mark.parametrize("model", ["kjv", "qwen3"])
def test_choice_outputs_are_one_of_the_choices(request, model):
    server = request.getfixturevalue(model)
    choices = ["Genesis", "Exodus", "Leviticus", "the Book of Numbers", "Deut"]
    seen = set()
    for extra in ({"guided_choice": choices}, {"structured_outputs": {"choice": choices}}):
        texts, cut = sample_texts(server, 4, extra_body=extra, max_tokens=20)
        assert cut == 0
        assert all(t in choices for t in texts), texts
        seen.update(texts)
    if model == "qwen3":
        assert len(seen) >= 3  # sampled, not fixed (kjv-small always prefers one)


def test_a_gbnf_grammar_constrains_the_output(kjv):
    grammar = 'root ::= greeting " " name "."\ngreeting ::= "Hail" | "Peace"\nname ::= [A-Z] [a-z]{1,6}\n'
    texts, cut = sample_texts(kjv, 3, max_tokens=30, extra_body={"guided_grammar": grammar})
    assert cut == 0
    for text in texts:
        assert re.fullmatch(r"(Hail|Peace) [A-Z][a-z]{1,6}\.", text), text


class Verse(pydantic.BaseModel):
    book: str = pydantic.Field(max_length=10)
    chapter: int
    testament: str = pydantic.Field(json_schema_extra={"enum": ["old", "new"]})
    canonical: bool


def test_the_clients_parse_helper_returns_a_pydantic_object(qwen3):
    c = client(qwen3)
    model = c.models.list().data[0].id
    parse = getattr(c.chat.completions, "parse", None) or c.beta.chat.completions.parse
    r = parse(model=model, messages=MESSAGES, response_format=Verse, seed=3, temperature=1,
              max_tokens=400)
    verse = r.choices[0].message.parsed
    assert isinstance(verse, Verse)
    assert verse.testament in ("old", "new")
    assert r.choices[0].finish_reason == "stop"


def test_real_vocabularies_byte_level_and_sentencepiece(qwen3, mistral):
    for server in (qwen3, mistral):
        choices = ["naïve café", "東京", "emoji 😀", "plain words"]
        texts, cut = sample_texts(server, 2, extra_body={"guided_choice": choices}, max_tokens=30)
        assert cut == 0 and all(t in choices for t in texts), texts
        pattern = r"(yes|no) [a-z]{2,5} [0-9]{1,3}"
        texts, cut = sample_texts(server, 2, extra_body={"guided_regex": pattern}, max_tokens=40)
        assert cut == 0
        assert all(re.fullmatch(pattern, t) for t in texts), texts
        schema = {"type": "object", "properties": {"w": {"type": "string", "maxLength": 4},
                                                   "k": {"enum": ["a", "b"]}},
                  "required": ["w", "k"], "additionalProperties": False}
        rf = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
        texts, cut = sample_texts(server, 2, extra_body={"response_format": rf}, max_tokens=150)
        expect_valid(texts, cut, schema, minimum=15)


# The sampling controls.

def test_logit_bias_forces_and_bans_a_token(kjv):
    the = token_id(kjv, " the")
    r = complete(kjv, max_tokens=6, temperature=1, seed=1, logit_bias={str(the): 100})
    assert r.choices[0].text == " the" * 6
    greedy = complete(kjv, max_tokens=8, temperature=0)
    first = tokenize(kjv, greedy.choices[0].text)[0]
    banned = complete(kjv, max_tokens=8, temperature=0, logit_bias={str(first): -100})
    assert banned.choices[0].text != greedy.choices[0].text


def test_stop_token_ids_end_the_output_without_their_text(kjv):
    full = complete(kjv, max_tokens=12, temperature=0, logprobs=0)
    tokens = full.choices[0].logprobs.tokens
    # A position whose token string is one token, seen nowhere before it.
    for k in range(2, len(tokens)):
        ids = tokenize(kjv, tokens[k])
        earlier = [tokenize(kjv, t) for t in tokens[:k]]
        if len(ids) == 1 and all(ids[0] not in e for e in earlier):
            break
    else:
        pytest.fail(f"no usable token in {tokens}")
    r = complete(kjv, max_tokens=12, temperature=0, extra_body={"stop_token_ids": [ids[0]]})
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == "".join(tokens[:k])
    assert r.usage.completion_tokens == k + 1
    # Chat too.
    c = chat(kjv, max_tokens=12, temperature=0)
    stop_at = tokenize(kjv, c.choices[0].message.content)
    assert stop_at
    r = chat(kjv, max_tokens=12, temperature=0, extra_body={"stop_token_ids": [stop_at[0]]})
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == ""


def test_min_tokens_keeps_eos_away(kjv):
    eos = 1  # kjv-small's <|eos|>
    # logit_bias +100 on EOS would end every output at once; min_tokens holds it back.
    r = complete(kjv, max_tokens=10, temperature=0, logit_bias={str(eos): 100})
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 1
    r = complete(kjv, max_tokens=10, temperature=0, logit_bias={str(eos): 100}, extra_body={"min_tokens": 4})
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == 5  # four held back, then EOS
    assert r.choices[0].text
    r = chat(kjv, max_tokens=10, temperature=0, logit_bias={str(eos): 100}, extra_body={"min_tokens": 10})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 10


@pytest.mark.parametrize("field,value", [("presence_penalty", 2.0), ("frequency_penalty", 2.0),
                                         ("repetition_penalty", 3.0), ("frequency_penalty", -2.0)])
def test_penalties_change_a_seeded_sample_reproducibly(kjv, field, value):
    base = complete(kjv, max_tokens=40, temperature=1, seed=21)
    extra = {field: value}
    a = complete(kjv, max_tokens=40, temperature=1, seed=21, extra_body=extra)
    b = complete(kjv, max_tokens=40, temperature=1, seed=21, extra_body=extra)
    assert a.choices[0].text == b.choices[0].text
    assert a.choices[0].text != base.choices[0].text
    c1 = chat(kjv, max_tokens=30, temperature=1, seed=4, extra_body=extra)
    c2 = chat(kjv, max_tokens=30, temperature=1, seed=4, extra_body=extra)
    assert c1.choices[0].message.content == c2.choices[0].message.content


def test_neutral_values_change_nothing(kjv):
    base = complete(kjv, max_tokens=20, temperature=1, seed=8)
    same = complete(kjv, max_tokens=20, temperature=1, seed=8, presence_penalty=0, frequency_penalty=0,
                    logit_bias={}, extra_body={"repetition_penalty": 1.0, "min_tokens": 0,
                                               "stop_token_ids": [], "response_format": {"type": "text"}})
    assert same.choices[0].text == base.choices[0].text


BAD = [
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"frequency_penalty": "x"}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"repetition_penalty": -1.5}, "repetition_penalty"),
    ({"logit_bias": {"99999": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"logit_bias": {"x": 1}}, "logit_bias"),
    ({"logit_bias": [1, 2]}, "logit_bias"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 9, "max_tokens": 4}, "min_tokens"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"stop_token_ids": [4096]}, "stop_token_ids"),
    ({"stop_token_ids": "1"}, "stop_token_ids"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer",
                                                                                           "multipleOf": 3}}}},
     "response_format.json_schema.schema"),
    ({"guided_regex": "[0-9"}, "guided_regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_grammar": "root ::= missing"}, "guided_grammar"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs.regex"),
    ({"structured_outputs": {"structural_tag": "x"}}, "structured_outputs.structural_tag"),
    ({"guided_regex": "a+", "response_format": {"type": "json_object"}}, "guided_regex"),
    ({"guided_regex": "a+", "ignore_eos": True}, "ignore_eos"),
    ({"guided_choice": ["a"], "min_tokens": 2}, "min_tokens"),
]


@pytest.mark.parametrize("extra,param", BAD)
def test_bad_values_answer_400_naming_the_field(kjv, extra, param):
    for call in (complete, chat):
        extra = dict(extra)
        max_tokens = extra.pop("max_tokens", 8)
        with pytest.raises(openai.BadRequestError) as e:
            call(kjv, max_tokens=max_tokens, extra_body=extra)
        assert e.value.body["param"] == param, e.value.body
        assert param.split(".")[0] in e.value.body["message"], e.value.body
