"""/v1/completions through the official openai client: text and token-id prompts,
streaming, n, stop strings, seeds, logprobs, prefix reuse."""
import concurrent.futures as cf

import pytest

openai = pytest.importorskip("openai")

PROMPT = "In the beginning God created"


def client(server, **kw):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60, **kw)


def complete(server, **kw):
    kw.setdefault("model", "kjv-small")
    kw.setdefault("prompt", PROMPT)
    return client(server).completions.create(**kw)


def stream_text(server, **kw):
    kw.setdefault("model", "kjv-small")
    kw.setdefault("prompt", PROMPT)
    texts, finish = {}, {}
    for chunk in client(server).completions.create(stream=True, **kw):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    return texts, finish


def test_a_text_prompt_completes_with_usage(server):
    r = complete(server, max_tokens=12, temperature=0)
    assert r.object == "text_completion"
    assert len(r.choices) == 1
    assert r.choices[0].text.strip()
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 12
    assert r.usage.prompt_tokens >= 4
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12


def test_token_id_prompt_matches_the_encoded_text(server):
    import subprocess

    from conftest import BINARY, MODEL

    out = subprocess.run([BINARY, "tokenize", "--model", MODEL, "--text", PROMPT, "--add-special"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    import json

    ids = json.loads(out)["ids"]
    assert ids and ids[0] == 0
    by_text = complete(server, max_tokens=10, temperature=0)
    by_ids = complete(server, prompt=ids, max_tokens=10, temperature=0)
    assert by_ids.usage.prompt_tokens == len(ids) == by_text.usage.prompt_tokens
    assert by_ids.choices[0].text == by_text.choices[0].text


def test_streaming_gives_the_same_text_as_one_answer(server):
    whole = complete(server, max_tokens=24, temperature=0).choices[0].text
    texts, finish = stream_text(server, max_tokens=24, temperature=0)
    assert texts[0] == whole
    assert finish[0] == "length"


def test_streaming_ends_with_done_and_usage_when_asked(server):
    import json
    import urllib.request

    body = {"model": "kjv-small", "prompt": PROMPT, "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}}
    req = urllib.request.Request(server.url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.headers["Content-Type"] == "text/event-stream"
        lines = [l for l in r.read().decode().split("\n") if l]
    assert lines[-1] == "data: [DONE]"

    usage = json.loads(lines[-2][len("data: "):])["usage"]
    assert usage["completion_tokens"] == 5


def test_n_choices_share_the_prompt_and_sample_with_their_own_seeds(server):
    r = complete(server, max_tokens=16, temperature=1.0, seed=11, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    texts = [c.text for c in r.choices]
    assert len(set(texts)) >= 2, texts
    assert r.usage.completion_tokens == 48
    # Choice i samples with seed + i: choice 1 of seed 11 is choice 0 of seed 12.
    alone = complete(server, max_tokens=16, temperature=1.0, seed=12)
    assert alone.choices[0].text == texts[1]
    again = complete(server, max_tokens=16, temperature=1.0, seed=11, n=3)
    assert [c.text for c in again.choices] == texts
    streamed, finish = stream_text(server, max_tokens=16, temperature=1.0, seed=11, n=3)
    assert [streamed[i] for i in range(3)] == texts
    assert set(finish) == {0, 1, 2}


def test_stop_strings_end_the_text_before_them_and_never_leak(server):
    full = complete(server, max_tokens=40, temperature=0).choices[0].text
    assert len(full) > 30, full
    stop = full[15:19]
    cut = full[: full.find(stop)]
    r = complete(server, max_tokens=40, temperature=0, stop=[stop, "@@never@@"])
    assert r.choices[0].text == cut
    assert r.choices[0].finish_reason == "stop"
    texts, finish = stream_text(server, max_tokens=40, temperature=0, stop=stop)
    assert texts[0] == cut
    assert stop not in texts[0]
    assert finish[0] == "stop"


def test_seeded_sampling_is_reproducible_across_runs_and_under_load(server):
    kw = dict(max_tokens=24, temperature=0.9, top_p=0.95, seed=1234)
    first = complete(server, **kw).choices[0].text
    assert complete(server, **kw).choices[0].text == first
    other = [complete(server, **{**kw, "seed": s}).choices[0].text for s in (1, 2)]
    assert any(o != first for o in other)
    with cf.ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(complete, server, **kw) for _ in range(12)]
        futures += [pool.submit(complete, server, **{**kw, "seed": 99 + i}) for i in range(12)]
        results = [f.result(timeout=120) for f in futures]
    assert all(r.choices[0].text == first for r in results[:12])


def test_logprobs_report_the_sampled_token_and_top_alternatives(server):
    r = complete(server, max_tokens=6, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert lp is not None
    assert len(lp.tokens) == 6
    assert len(lp.token_logprobs) == 6
    assert "".join(lp.tokens) == r.choices[0].text
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert value <= 0.0
        assert 1 <= len(top) <= 3
        # Greedy: the sampled token is the most likely one.
        assert abs(max(top.values()) - value) < 1e-4
    texts, _ = stream_text(server, max_tokens=6, temperature=0, logprobs=2)
    assert texts[0] == r.choices[0].text


def test_echo_prepends_the_prompt(server):
    r = complete(server, max_tokens=4, temperature=0, echo=True)
    assert r.choices[0].text.startswith(PROMPT)


def test_a_repeated_prompt_is_served_from_the_prefix_cache(server):
    prompt = "And the LORD spake unto Moses, saying, Speak unto the children of Israel"
    before = server.metrics()
    complete(server, prompt=prompt, max_tokens=4, temperature=0)
    r = complete(server, prompt=prompt, max_tokens=4, temperature=0)
    after = server.metrics()
    assert r.usage.prompt_tokens_details.cached_tokens == r.usage.prompt_tokens - 1
    assert after["cellm_prefix_cache_hits_total"] >= before["cellm_prefix_cache_hits_total"] + 1
    assert after["cellm_prefix_cache_lookups_total"] >= before["cellm_prefix_cache_lookups_total"] + 2


@pytest.mark.parametrize("name,value", [("messages", []),
                                        ("max_completion_tokens", 3), ("metadata", {}),
                                        ("no_such_field", True)])
def test_fields_outside_the_completions_allowlist_answer_400_naming_them(server, name, value):
    with pytest.raises(openai.BadRequestError) as e:
        complete(server, max_tokens=2, extra_body={name: value})
    assert e.value.body["param"] == name


def test_a_batch_of_prompts_answers_each_with_its_own_choices(server):
    token_prompt = [int(t) for t in _tokenize(server, "Let there be light")]
    batch = ["In the beginning God created", "And the earth was", token_prompt]
    r = complete(server, prompt=batch, max_tokens=6, n=2, seed=11)
    assert [c.index for c in r.choices] == list(range(6))
    # Each prompt's choices are what the same request alone gives.
    for k, p in enumerate(batch):
        alone = complete(server, prompt=p, max_tokens=6, n=2, seed=11)
        assert [c.text for c in r.choices[2 * k:2 * k + 2]] == [c.text for c in alone.choices]
    single = [complete(server, prompt=p, max_tokens=6, n=2, seed=11).usage for p in batch]
    assert r.usage.prompt_tokens == sum(u.prompt_tokens for u in single)
    assert r.usage.completion_tokens == sum(u.completion_tokens for u in single)
    # Streamed, the same texts arrive under the same indexes.
    texts, finish = stream_text(server, prompt=batch, max_tokens=6, n=2, seed=11)
    assert [texts[i] for i in range(6)] == [c.text for c in r.choices]
    assert set(finish) == set(range(6))


def test_a_batch_larger_than_the_sessions_answers_400(server):
    with pytest.raises(openai.BadRequestError) as e:
        complete(server, prompt=["a"] * 20, n=2, max_tokens=1)
    assert e.value.body["param"] == "prompt" and "40 sessions" in e.value.body["message"]


def _tokenize(server, text):
    import json
    import urllib.request
    req = urllib.request.Request(server.url + "/tokenize", data=json.dumps({"prompt": text}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["tokens"]
