"""The server's surface beyond generation: /tokenize and /detokenize, model names
and aliases, /v1/models/{id}, CORS, a chat template from a file, and sampling
defaults from the model's generation_config.json."""
import json
import os
import subprocess
import urllib.error
import urllib.request

import pytest

openai = pytest.importorskip("openai")

from conftest import MODEL, Server  # noqa: E402

TEMPLATE = "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}" \
           "{% if add_generation_prompt %}<assistant>{% endif %}"


def model_copy(tmp_path_factory, name, files):
    """A copy of the bundled model (links) with some files replaced."""
    model = tmp_path_factory.mktemp(name)
    for f in os.listdir(MODEL):
        if f not in files:
            os.symlink(os.path.join(MODEL, f), model / f)
    for f, text in files.items():
        (model / f).write_text(text)
    return model


@pytest.fixture(scope="module")
def named_server(tmp_path_factory):
    template = tmp_path_factory.mktemp("tpl") / "chat.jinja"
    template.write_text(TEMPLATE)
    s = Server("--served-model-name", "scribe,kjv-alias", "--chat-template", str(template),
               "--allowed-origins", "https://app.example")
    yield s
    assert s.stop() == 0


class Reply:
    def __init__(self, status_code, headers, text):
        self.status_code, self.headers, self.text = status_code, headers, text

    def json(self):
        return json.loads(self.text)


def call(method, url, body=None, headers=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return Reply(r.status, r.headers, r.read().decode())
    except urllib.error.HTTPError as e:
        return Reply(e.code, e.headers, e.read().decode())


def post(server, path, body, headers=None):
    return call("POST", server.url + path, body, headers)


def test_tokenize_and_detokenize_round_trip(server):
    r = post(server, "/tokenize", {"prompt": "In the beginning God created"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == len(body["tokens"]) > 3
    assert body["max_model_len"] > 0
    plain = post(server, "/tokenize", {"prompt": "In the beginning", "add_special_tokens": False})
    assert len(plain.json()["tokens"]) <= len(body["tokens"])
    text = post(server, "/detokenize", {"tokens": plain.json()["tokens"]}).json()["prompt"]
    assert text == "In the beginning"
    # The ids are the ones a completion with this prompt counts.
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="-", max_retries=0)
    usage = c.completions.create(model="kjv-small", prompt="In the beginning God created",
                                 max_tokens=1).usage
    assert usage.prompt_tokens == body["count"]


def test_tokenize_refuses_bad_bodies_naming_the_field(server):
    for body, param in [({}, "prompt"), ({"prompt": 5}, "prompt"),
                        ({"prompt": "a", "messages": []}, "prompt"),
                        ({"prompt": "a", "extra": 1}, "extra"),
                        ({"prompt": "a", "add_special_tokens": "yes"}, "add_special_tokens")]:
        r = post(server, "/tokenize", body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["param"] == param
    for body in [{"tokens": [-1]}, {"tokens": [10 ** 9]}, {"tokens": "abc"}, {}]:
        r = post(server, "/detokenize", body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"
    # The bundled model has no chat template: messages cannot be tokenized.
    r = post(server, "/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "no_chat_template"


def test_served_names_are_listed_and_accepted(named_server):
    c = openai.OpenAI(base_url=named_server.url + "/v1", api_key="-", max_retries=0)
    ids = [m.id for m in c.models.list().data]
    assert ids == ["scribe", "kjv-alias"]
    for name in ids:
        assert c.completions.create(model=name, prompt="In", max_tokens=1).choices
        card = call("GET", named_server.url + "/v1/models/" + name).json()
        assert card["id"] == name and card["max_model_len"] > 0
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="kjv-small", prompt="In", max_tokens=1)


def test_a_chat_template_file_replaces_the_models(named_server):
    messages = [{"role": "user", "content": "hi"}]
    r = post(named_server, "/tokenize", {"messages": messages})
    assert r.status_code == 200, r.text
    text = post(named_server, "/detokenize", {"tokens": r.json()["tokens"]}).json()["prompt"]
    assert text.endswith("<user>hi<assistant>")
    c = openai.OpenAI(base_url=named_server.url + "/v1", api_key="-", max_retries=0)
    reply = c.chat.completions.create(model="scribe", messages=messages, max_tokens=3)
    assert reply.usage.prompt_tokens == len(r.json()["tokens"])


def test_cors_answers_allowed_origins_only(named_server):
    url = named_server.url + "/v1/completions"
    pre = call("OPTIONS", url, headers={"Origin": "https://app.example",
                                        "Access-Control-Request-Method": "POST"})
    assert pre.status_code == 204
    assert pre.headers["Access-Control-Allow-Origin"] == "https://app.example"
    assert "POST" in pre.headers["Access-Control-Allow-Methods"]
    r = call("POST", url, {"prompt": "In", "max_tokens": 1}, {"Origin": "https://app.example"})
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "https://app.example"
    other = call("POST", url, {"prompt": "In", "max_tokens": 1}, {"Origin": "https://evil.example"})
    assert "Access-Control-Allow-Origin" not in other.headers


def test_no_cors_headers_without_allowed_origins(server):
    r = post(server, "/v1/completions", {"prompt": "In", "max_tokens": 1},
             {"Origin": "https://app.example"})
    assert "Access-Control-Allow-Origin" not in r.headers


def test_generation_config_sets_the_default_sampling(tmp_path_factory):
    with open(os.path.join(MODEL, "generation_config.json")) as f:
        config = json.load(f)
    config["temperature"] = 0.0
    model = model_copy(tmp_path_factory, "kjv-greedy",
                       {"generation_config.json": json.dumps(config)})
    s = Server("--model", str(model))
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="-", max_retries=0)
        # temperature 0 by default: every unseeded answer is the greedy one.
        texts = {c.completions.create(model=model.name,
                                      prompt="And God said", max_tokens=12).choices[0].text
                 for _ in range(3)}
        assert len(texts) == 1
        greedy = c.completions.create(model=model.name, prompt="And God said", max_tokens=12,
                                      temperature=0).choices[0].text
        assert texts == {greedy}
    finally:
        assert s.stop() == 0


def test_a_malformed_generation_config_stops_the_start(tmp_path_factory):
    model = model_copy(tmp_path_factory, "kjv-badgen", {"generation_config.json": '{"top_p": "x"}'})
    from conftest import BINARY
    r = subprocess.run([BINARY, "serve", "--model", str(model), "--port", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "generation_config.json" in r.stderr and "'top_p'" in r.stderr
