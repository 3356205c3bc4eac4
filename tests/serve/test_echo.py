"""/v1/completions with echo: the prompt's own log-probabilities (as evaluation
harnesses such as lm-evaluation-harness ask for them: echo, logprobs, max_tokens 0),
through the official openai client against the real server. The prompt's scores are
checked against the log-probabilities the same tokens get when the server generates
them greedily; the shape follows OpenAI's legacy completions (the first token's entries
null, top_logprobs holding the chosen token too)."""
import json
import math
import urllib.error
import urllib.request

import pytest

openai = pytest.importorskip("openai")

PROMPT = "In the beginning God created"
OTHER = "And God said, Let there be light"
# kjv-small's logits agree within 2e-3 between a decode and a prefill of the same
# tokens (kjv_parity_test); log-softmax keeps that order.
TOL = 5e-3


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def complete(server, **kw):
    kw.setdefault("model", "kjv-small")
    kw.setdefault("prompt", PROMPT)
    kw.setdefault("temperature", 0)
    return client(server).completions.create(**kw)


def post(server, path, body):
    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def tokenize(server, text, special=True):
    status, body = post(server, "/tokenize", {"prompt": text, "add_special_tokens": special})
    assert status == 200, body
    return body["tokens"]


def check_shape(lp, n_top, text):
    """OpenAI's legacy logprobs: parallel lists, the first entry null, every other
    top_logprobs holding at most n_top + 1 entries, the chosen one among them with its own
    log-probability; each token stands in `text` at its text_offset, but for a special
    token ("<|bos|>"), which takes no room."""
    n = len(lp.tokens)
    assert len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    assert lp.token_logprobs[0] is None
    assert lp.top_logprobs[0] is None
    assert lp.text_offset[0] == 0
    for i in range(n):
        token, at = lp.tokens[i], lp.text_offset[i]
        special = token.startswith("<|") and token.endswith("|>")
        if not special:
            assert text[at:at + len(token)] == token, (i, token, text[at:])
        if i + 1 < n:
            assert lp.text_offset[i + 1] == at + (0 if special else len(token))
        else:
            assert at + (0 if special else len(token)) == len(text)
        if i == 0:
            continue
        value, top = lp.token_logprobs[i], lp.top_logprobs[i]
        assert value is not None and value <= 0.0 and math.isfinite(value)
        assert 1 <= len(top) <= n_top + 1, top
        assert token in top
        assert abs(top[token] - value) < 1e-6
        assert all(v <= 0.0 for v in top.values())


def test_max_tokens_0_returns_the_prompt_and_its_logprobs(server):
    r = complete(server, echo=True, max_tokens=0, logprobs=2)
    c = r.choices[0]
    assert c.text == PROMPT
    assert c.finish_reason == "length"
    assert r.usage.completion_tokens == 0
    assert len(c.logprobs.tokens) == r.usage.prompt_tokens == len(tokenize(server, PROMPT))
    check_shape(c.logprobs, 2, c.text)
    assert c.logprobs.tokens[0] == "<|bos|>"


def test_prompt_logprobs_equal_the_logprobs_of_the_same_tokens_generated(server):
    ids = tokenize(server, PROMPT)
    generated = complete(server, prompt=ids, max_tokens=8, logprobs=1)
    lp = generated.choices[0].logprobs
    assert len(lp.tokens) == 8
    # The generated tokens' ids: each token's text encodes back to one id here.
    gen_ids = [tokenize(server, t, special=False) for t in lp.tokens]
    assert all(len(g) == 1 for g in gen_ids), gen_ids
    gen_ids = [g[0] for g in gen_ids]
    status, body = post(server, "/detokenize", {"tokens": gen_ids})
    assert status == 200 and body["prompt"] == generated.choices[0].text

    scored = complete(server, prompt=ids + gen_ids, echo=True, max_tokens=0, logprobs=1)
    s = scored.choices[0].logprobs
    check_shape(s, 1, scored.choices[0].text)
    assert s.tokens[len(ids):] == lp.tokens
    for got, want in zip(s.token_logprobs[len(ids):], lp.token_logprobs):
        assert abs(got - want) < TOL, (s.token_logprobs[len(ids):], lp.token_logprobs)
    # Greedy: each generated token is its row's most likely one, in the scores too.
    for tok, top in zip(s.tokens[len(ids):], s.top_logprobs[len(ids):]):
        assert max(top, key=top.get) == tok

    # echo with generation: the prompt's entries, then the generated tokens'.
    both = complete(server, prompt=ids, echo=True, max_tokens=8, logprobs=1).choices[0]
    assert both.text == PROMPT + generated.choices[0].text
    b = both.logprobs
    check_shape(b, 1, both.text)
    assert b.tokens == s.tokens
    for got, want in zip(b.token_logprobs[1:], s.token_logprobs[1:]):
        assert abs(got - want) < TOL


def test_a_cached_prefix_is_still_scored_whole(server):
    prompt = "And the LORD spake unto Moses in the wilderness of Sinai"
    complete(server, prompt=prompt, max_tokens=2)  # leaves the prompt in the prefix cache
    first = complete(server, prompt=prompt, echo=True, max_tokens=0, logprobs=1)
    again = complete(server, prompt=prompt, echo=True, max_tokens=0, logprobs=1)
    for r in (first, again):
        assert r.usage.prompt_tokens_details.cached_tokens == 0
        check_shape(r.choices[0].logprobs, 1, prompt)
        assert len(r.choices[0].logprobs.tokens) == r.usage.prompt_tokens
    assert again.choices[0].logprobs.token_logprobs == first.choices[0].logprobs.token_logprobs


def test_batched_text_and_token_id_prompts(server):
    alone = [complete(server, prompt=p, echo=True, max_tokens=0, logprobs=3).choices[0]
             for p in (PROMPT, OTHER)]
    by_text = complete(server, prompt=[PROMPT, OTHER], echo=True, max_tokens=0, logprobs=3)
    by_ids = complete(server, prompt=[tokenize(server, PROMPT), tokenize(server, OTHER)],
                      echo=True, max_tokens=0, logprobs=3)
    for r in (by_text, by_ids):
        assert [c.index for c in r.choices] == [0, 1]
        for c, a, text in zip(r.choices, alone, (PROMPT, OTHER)):
            assert c.text == text
            assert c.finish_reason == "length"
            check_shape(c.logprobs, 3, text)
            assert c.logprobs.tokens == a.logprobs.tokens
            for got, want in zip(c.logprobs.token_logprobs[1:], a.logprobs.token_logprobs[1:]):
                assert abs(got - want) < TOL


def test_n_choices_share_the_prompt_logprobs(server):
    r = complete(server, echo=True, max_tokens=4, logprobs=1, n=3, temperature=1.0, seed=5)
    prompt_len = r.usage.prompt_tokens
    assert [c.index for c in r.choices] == [0, 1, 2]
    first = r.choices[0].logprobs
    for c in r.choices:
        assert c.text.startswith(PROMPT)
        check_shape(c.logprobs, 1, c.text)
        assert len(c.logprobs.tokens) == prompt_len + 4
        assert c.logprobs.token_logprobs[:prompt_len] == first.token_logprobs[:prompt_len]
        assert "".join(c.logprobs.tokens[prompt_len:]) == c.text[len(PROMPT):]


def test_streaming_echo_sends_the_prompt_and_its_logprobs_first(server):
    whole = complete(server, echo=True, max_tokens=5, logprobs=2).choices[0]
    only = complete(server, echo=True, max_tokens=0, logprobs=2).choices[0]
    for max_tokens, want in ((5, whole), (0, only)):
        text, tokens, values, finish, chunks = "", [], [], None, 0
        for chunk in complete(server, echo=True, max_tokens=max_tokens, logprobs=2, stream=True):
            for c in chunk.choices:
                chunks += 1
                if chunks == 1:
                    assert c.text.startswith(PROMPT)
                text += c.text
                if c.logprobs is not None:
                    tokens += c.logprobs.tokens
                    values += c.logprobs.token_logprobs
                if c.finish_reason:
                    finish = c.finish_reason
        assert text == want.text
        assert finish == "length"
        assert tokens == want.logprobs.tokens
        assert values[0] is None
        for got, expect in zip(values[1:], want.logprobs.token_logprobs[1:]):
            assert abs(got - expect) < TOL


def test_echo_without_logprobs_and_max_tokens_0(server):
    c = complete(server, echo=True, max_tokens=0).choices[0]
    assert c.text == PROMPT
    assert c.logprobs is None
    assert c.finish_reason == "length"


def test_max_tokens_0_without_echo_is_refused(server):
    status, body = post(server, "/v1/completions",
                        {"model": "kjv-small", "prompt": PROMPT, "max_tokens": 0, "logprobs": 1})
    assert status == 400, body
    assert body["error"]["param"] == "max_tokens"
    assert "echo" in body["error"]["message"]
    status, body = post(server, "/v1/completions",
                        {"model": "kjv-small", "prompt": PROMPT, "max_tokens": -1, "echo": True})
    assert status == 400 and body["error"]["param"] == "max_tokens"
    # Chat has no echo: max_tokens stays at least 1 there.
    status, body = post(server, "/v1/chat/completions",
                        {"model": "kjv-small", "messages": [{"role": "user", "content": "hi"}],
                         "max_tokens": 0})
    assert status == 400 and body["error"]["param"] == "max_tokens"
