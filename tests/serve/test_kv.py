"""The KV pool as `cellm serve` shares it: sized in cells, grown by need, shared
through the automatic prefix cache, and honest about what can never fit. The
bundled model's context is 256 positions."""
import concurrent.futures as cf
import time

import pytest

openai = pytest.importorskip("openai")

from conftest import Server  # noqa: E402

PROMPT = "In the beginning God created the heaven and the earth."


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="-", max_retries=0, timeout=120)


def settle(server, timeout=2.0):
    """The metrics once no generation holds cells (within `timeout`)."""
    t0 = time.monotonic()
    while True:
        m = server.metrics()
        if m["cellm_kv_cells_used"] == 0 or time.monotonic() - t0 > timeout:
            return m
        time.sleep(0.02)


@pytest.fixture(scope="module")
def small_pool():
    s = Server("--kv-cells", "512", "--max-sessions", "16")
    yield s
    assert s.stop() == 0


def test_the_pool_is_reported_in_cells(small_pool):
    m = small_pool.metrics()
    # One cell of the 512 is the scratch row padded slots write to.
    assert m["cellm_kv_cells_capacity"] == 511
    assert m["cellm_kv_cells_used"] + m["cellm_kv_cells_cached"] + m["cellm_kv_cells_free"] == 511


def test_a_request_that_can_never_fit_answers_400_naming_the_sizes(small_pool):
    c = client(small_pool)
    long_prompt = " ".join(["and"] * 300)  # past the context of 256
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="kjv-small", prompt=long_prompt, max_tokens=1)
    assert e.value.body["param"] == "prompt" and "256" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="kjv-small", prompt=PROMPT, max_tokens=250)
    assert e.value.body["param"] == "max_tokens" and "256" in e.value.body["message"]


def test_more_sessions_run_at_once_than_pool_over_context(small_pool):
    # 512 cells / 256 positions = 2 fixed slots; 16 short generations share the pool.
    c = client(small_pool)

    def one(i):
        r = c.completions.create(model="kjv-small", prompt=f"{i} {PROMPT}", max_tokens=16,
                                 seed=i, extra_body={"ignore_eos": True})
        return r.usage.completion_tokens

    with cf.ThreadPoolExecutor(16) as pool:
        assert list(pool.map(one, range(16), timeout=120)) == [16] * 16
    assert small_pool.metrics()["cellm_engine_steps_failed_total"] == 0


def test_distinct_prompts_keep_being_served_through_evictions(small_pool):
    c = client(small_pool)
    for i in range(40):  # ~40 x 30 cells cached in all: far more than the pool
        text = f"Verse {i}: " + " ".join(["the", "LORD", "said", str(i)] * 5)
        r = c.completions.create(model="kjv-small", prompt=text, max_tokens=8, seed=i)
        assert r.choices[0].finish_reason in ("stop", "length")
    m = settle(small_pool)
    assert m["cellm_prefix_cache_evicted_cells_total"] > 0
    assert m["cellm_kv_cells_used"] == 0
    assert m["cellm_kv_cells_cached"] + m["cellm_kv_cells_free"] == m["cellm_kv_cells_capacity"]


def test_a_second_chat_turn_hits_the_first_turns_cells(tmp_path_factory):
    import json
    import os

    from conftest import MODEL
    model = tmp_path_factory.mktemp("kjv-kvchat")
    for name in os.listdir(MODEL):
        if name != "tokenizer_config.json":
            os.symlink(os.path.join(MODEL, name), model / name)
    with open(os.path.join(MODEL, "tokenizer_config.json")) as f:
        config = json.load(f)
    # A reply is rendered back exactly as it was generated after "assistant:", so
    # the second prompt re-tokenizes the first turn to the same ids.
    config["chat_template"] = ("{% for m in messages %}{{ m['role'] }}:{{ m['content'] }}\n"
                               "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    s = Server("--model", str(model))
    try:
        c = client(s)
        messages = [{"role": "user", "content": "Who created the heaven?"}]
        first = c.chat.completions.create(model=model.name, messages=messages, max_tokens=12,
                                          temperature=0)
        messages += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "And the earth?"}]
        second = c.chat.completions.create(model=model.name, messages=messages, max_tokens=4,
                                           temperature=0)
        cached = second.usage.prompt_tokens_details.cached_tokens
        # Every committed token of the first turn: its prompt and all but its last
        # generated token (the last is sampled, never fed) — as far as the second
        # prompt re-tokenizes the reply to the same ids.
        assert cached >= first.usage.prompt_tokens + first.usage.completion_tokens - 1, \
            (cached, first.usage, first.choices[0].message.content)
        assert cached < second.usage.prompt_tokens
    finally:
        assert s.stop() == 0


def test_overcommit_preempts_and_every_stream_matches_an_unpreempted_run():
    prompts = [f"{i} And God said, Let there be" for i in range(8)]

    def run(server):
        c = client(server)

        def one(i):
            text = ""
            for chunk in c.completions.create(model="kjv-small", prompt=prompts[i], max_tokens=120,
                                              temperature=0, stream=True,
                                              extra_body={"ignore_eos": True}):
                text += chunk.choices[0].text if chunk.choices else ""
            return text

        with cf.ThreadPoolExecutor(8) as pool:
            return list(pool.map(one, range(8), timeout=300))

    big = Server("--kv-cells", "4096", "--max-sessions", "8")
    try:
        expected = run(big)
    finally:
        assert big.stop() == 0
    # 8 x ~130 cells do not fit 600: generations are preempted and resumed.
    small = Server("--kv-cells", "600", "--max-sessions", "8", "--kv-policy", "overcommit")
    try:
        got = run(small)
        m = settle(small)
        assert m["cellm_preemptions_total"] > 0
        assert m["cellm_kv_cells_used"] == 0
    finally:
        assert small.stop() == 0
    assert got == expected


def test_reserve_admits_only_what_fits_and_no_step_fails():
    s = Server("--kv-cells", "600", "--max-sessions", "8", "--kv-policy", "reserve")
    try:
        c = client(s)

        def one(i):
            r = c.completions.create(model="kjv-small", prompt=f"{i} {PROMPT}", max_tokens=120,
                                     seed=i, extra_body={"ignore_eos": True})
            return r.usage.completion_tokens

        with cf.ThreadPoolExecutor(8) as pool:
            assert list(pool.map(one, range(8), timeout=300)) == [120] * 8
        m = settle(s)
        assert m["cellm_engine_steps_failed_total"] == 0
        assert m["cellm_preemptions_total"] == 0
        assert m["cellm_kv_cells_used"] == 0
    finally:
        assert s.stop() == 0
