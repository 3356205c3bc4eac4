"""Errors, back-pressure, disconnects, hostile input and shutdown of `cellm serve`.
Every wait and loop is bounded; everything stays on loopback."""
import concurrent.futures as cf
import http.client
import json
import socket
import threading
import time

import pytest

openai = pytest.importorskip("openai")

class Reply:
    def __init__(self, status, body):
        self.status_code = status
        self.text = body.decode("utf-8", "replace")

    def json(self):
        return json.loads(self.text)


def request(server, method, path, body=None, timeout=60):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body is not None else {})
        r = conn.getresponse()
        return Reply(r.status, r.read())
    finally:
        conn.close()

PROMPT = "And God said, Let there be light"


def client(server, api_key="unused"):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0, timeout=60)


def post(server, body, path="/v1/completions"):
    return request(server, "POST", path, body if isinstance(body, bytes) else json.dumps(body).encode())


def raw_exchange(server, data, shut_write=True, timeout=10):
    """Sends raw bytes, returns the status code of the answer (or None if the
    server closed without one)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as s:
        s.sendall(data)
        if shut_write:
            s.shutdown(socket.SHUT_WR)
        reply = b""
        try:
            while b"\r\n" not in reply:
                chunk = s.recv(4096)
                if not chunk:
                    break
                reply += chunk
        except socket.timeout:
            return None
    if not reply.startswith(b"HTTP/1."):
        return None
    return int(reply.split(b" ")[1])


def assert_error(resp, status, param=None):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"]
    if param is not None:
        assert err["param"] == param, err


def test_invalid_fields_answer_400_naming_the_field(server):
    cases = [
        ({"prompt": PROMPT, "max_tokens": "ten"}, "max_tokens"),
        ({"prompt": PROMPT, "max_tokens": 0}, "max_tokens"),
        ({"prompt": PROMPT, "temperature": -1}, "temperature"),
        ({"prompt": PROMPT, "top_p": 7}, "top_p"),
        ({"prompt": PROMPT, "n": 0}, "n"),
        ({"prompt": PROMPT, "stop": 5}, "stop"),
        ({"prompt": PROMPT, "stream": "yes"}, "stream"),
        ({"prompt": PROMPT, "logprobs": 99}, "logprobs"),
        ({"prompt": PROMPT, "seed": 1.5}, "seed"),
        ({"prompt": 12}, "prompt"),
        ({"prompt": [1, -2]}, "prompt"),
        ({"prompt": [10 ** 30]}, "prompt"),
        ({}, "prompt"),
    ]
    for body, param in cases:
        assert_error(post(server, body), 400, param)


def test_the_openai_client_sees_bad_requests_as_400(server):
    with pytest.raises(openai.BadRequestError) as e:
        client(server).completions.create(model="kjv-small", prompt=PROMPT, max_tokens=-3)
    assert e.value.body["param"] == "max_tokens"


def test_a_prompt_over_the_session_budget_answers_400(server):
    long_prompt = "and the LORD said " * 200
    assert_error(post(server, {"prompt": long_prompt, "max_tokens": 4}), 400, "prompt")
    assert_error(post(server, {"prompt": PROMPT, "max_tokens": 100000}), 400, "max_tokens")


def test_an_unknown_model_answers_404(server):
    with pytest.raises(openai.NotFoundError) as e:
        client(server).completions.create(model="gpt-9", prompt=PROMPT, max_tokens=2)
    assert e.value.body["code"] == "model_not_found"


def test_a_wrong_api_key_answers_401(start_server):
    s = start_server("--api-key", "sesame")
    with pytest.raises(openai.AuthenticationError):
        client(s, api_key="wrong").completions.create(model="kjv-small", prompt=PROMPT, max_tokens=2)
    r = client(s, api_key="sesame").completions.create(model="kjv-small", prompt=PROMPT, max_tokens=2)
    assert r.usage.completion_tokens == 2
    assert request(s, "GET", "/health").status_code == 200  # open without a key
    assert s.stop() == 0


def test_a_full_admission_queue_answers_429_and_everything_else_completes(start_server):
    s = start_server("--max-sessions", "4", "--max-queued-requests", "8")
    body = {"model": "kjv-small", "prompt": PROMPT, "max_tokens": 32, "ignore_eos": True}
    barrier = threading.Barrier(100, timeout=30)

    def one(_):
        barrier.wait()
        r = post(s, body)
        return r.status_code, r.json()

    with cf.ThreadPoolExecutor(100) as pool:
        results = list(pool.map(one, range(100), timeout=180))
    codes = [c for c, _ in results]
    assert set(codes) <= {200, 429}, codes
    assert codes.count(429) > 0
    assert codes.count(200) >= 12  # 4 running + 8 queued at least
    for code, body in results:
        if code == 429:
            assert body["error"]["type"] == "rate_limit_error"
        else:
            assert body["usage"]["completion_tokens"] == 32
    m = s.metrics()
    assert m["cellm_requests_waiting"] == 0
    assert m["cellm_requests_running"] == 0
    assert s.stop() == 0


def test_clients_that_disconnect_mid_stream_free_their_cells(server):
    c = client(server)
    c.completions.create(model="kjv-small", prompt=PROMPT, max_tokens=2)  # snapshot cached
    deadline = time.monotonic() + 5
    baseline = server.metrics()["cellm_kv_cells_in_use"]
    while time.monotonic() < deadline:  # wait for the warm-up's cells to settle
        time.sleep(0.1)
        now = server.metrics()["cellm_kv_cells_in_use"]
        if now == baseline:
            break
        baseline = now

    def stream_then_leave(_):
        stream = c.completions.create(model="kjv-small", prompt=PROMPT, max_tokens=200,
                                      extra_body={"ignore_eos": True}, stream=True, temperature=1.0)
        got = 0
        for _chunk in stream:
            got += 1
            if got == 3:
                break
        stream.close()
        return got

    with cf.ThreadPoolExecutor(32) as pool:
        assert list(pool.map(stream_then_leave, range(32), timeout=120)) == [3] * 32
    t0 = time.monotonic()
    while time.monotonic() - t0 < 1.0:
        m = server.metrics()
        if m["cellm_kv_cells_in_use"] == baseline and m["cellm_sessions_running"] == 0:
            break
        time.sleep(0.02)
    m = server.metrics()
    assert m["cellm_kv_cells_in_use"] == baseline, (m["cellm_kv_cells_in_use"], baseline)
    assert m["cellm_sessions_running"] == 0
    assert m['cellm_requests_finished_total{finish_reason="cancelled"}'] >= 32


def test_hostile_input_gets_only_4xx_and_the_server_keeps_serving(server):
    bodies = [
        b"", b"{", b"[1,2,3]", b"null", b"\"text\"", b"{\"prompt\": \"abc\"",
        b"{\"prompt\": \"\xff\xfe\"}", b"{\"prompt\": \"\xc3\x28\"}",
        b"{\"prompt\": \"a\", \"max_tokens\": 1e400}",
        b"{\"prompt\": \"a\", \"max_tokens\": 99999999999999999999999}",
        b"{\"prompt\": \"a\", \"temperature\": 1e308}",
        b"{\"prompt\": \"a\", \"n\": -99999999999999}",
        b"{\"prompt\": \"a\", \"stop\": [1, 2]}",
        b"{\"prompt\": \"a\", \"stop\": [\"" + b"x" * 5000 + b"\"]}",
        b"{\"prompt\": [[1, 2], [-3]]}", b"{\"prompt\": [[1, 2], 7]}", b"{\"prompt\": [\"a\", []]}",
        b"{\"prompt\": {\"nested\": true}}",
        b"{\"prompt\": \"a\", \"seed\": \"seven\"}",
        b"{\"prompt\": \"a\", \"logit_bias\": {\"1\": 1000}}",
        b"{\"messages\": 5}",
        b"\x00\x01\x02\x03",
        b"{\"prompt\": \"" + b"[" * 10000 + b"\"}",
        b"[" * 100000,
    ]
    for body in bodies:
        r = post(server, body)
        assert 400 <= r.status_code < 500, (body[:60], r.status_code, r.text)
        assert "error" in r.json()
    for body in bodies[:8]:
        r = post(server, body, path="/v1/chat/completions")
        assert 400 <= r.status_code < 500, (body[:60], r.status_code)
    # Oversized: past the body limit.
    r = post(server, b"{\"prompt\": \"" + b"a" * (5 << 20) + b"\"}")
    assert r.status_code == 413
    # Truncated: a Content-Length the body never reaches.
    code = raw_exchange(server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                b"Content-Length: 100\r\n\r\n{\"prompt\": \"ab")
    assert code is None or 400 <= code < 500
    # Garbage request lines and headers.
    for data in [b"GARBAGE\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
                 b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n"]:
        code = raw_exchange(server, data)
        assert code is None or 400 <= code < 500, (data, code)
    # Still serving.
    r = client(server).completions.create(model="kjv-small", prompt=PROMPT, max_tokens=3)
    assert r.usage.completion_tokens == 3
    assert request(server, "GET", "/health").json() == {"status": "ok"}


def test_sigterm_cancels_in_flight_generations_and_exits_0(start_server):
    s = start_server()
    got_first = threading.Event()
    outcome = {}

    def streamer():
        try:
            stream = client(s).completions.create(model="kjv-small", prompt=PROMPT, max_tokens=240,
                                                  extra_body={"ignore_eos": True}, stream=True)
            for chunk in stream:
                got_first.set()
                for c in chunk.choices:
                    if c.finish_reason:
                        outcome.setdefault("reasons", set()).add(c.finish_reason)
            outcome["ended"] = True
        except Exception as e:  # the connection may end abruptly
            outcome["error"] = repr(e)
        got_first.set()

    t = threading.Thread(target=streamer, daemon=True)
    t.start()
    assert got_first.wait(30)
    t0 = time.monotonic()
    assert s.stop(timeout=15) == 0, "".join(s.log[-10:])
    assert time.monotonic() - t0 < 10
    t.join(10)
    assert outcome
    # Only OpenAI's finish reasons reach a client: the cancelled stream ends with an
    # error event (the client raises), never with finish_reason "cancelled".
    assert outcome.get("reasons", set()) <= {"stop", "length"}, outcome
    assert any("SIGTERM: stopping" in line for line in s.log)
