"""`cellm serve` is safe to expose: --api-key guards every endpoint but /health
(/metrics too unless --metrics-public), every limit is a 4xx that names it, and no
error answer reveals where the server keeps its files or what its code is made of.
Everything stays on loopback; every wait is bounded."""
import http.client
import json
import os
import socket

import pytest

from conftest import MODEL

PROMPT = "And God said, Let there be light"
BEYOND = "<|beyond|>"


def exchange(port, method, path, body=None, headers=None, timeout=30):
    """(status, body text) of one request on its own connection; body may be bytes."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
        h = {"Content-Type": "application/json"} if data is not None else {}
        h.update(headers or {})
        conn.request(method, path, body=data, headers=h)
        r = conn.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    finally:
        conn.close()


def raw(port, data, timeout=10):
    """Sends raw bytes; (status, body text) of the answer, or (None, "") if none came."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(data)
        except OSError:
            pass
        reply = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                reply += chunk
                head, sep, rest = reply.partition(b"\r\n\r\n")
                if sep and b"content-length:" in head.lower():
                    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                    if len(rest) >= length:
                        break
        except OSError:
            pass
    if not reply.startswith(b"HTTP/1."):
        return None, ""
    return int(reply.split(b" ")[1]), reply.partition(b"\r\n\r\n")[2].decode("utf-8", "replace")


def error_of(text):
    err = json.loads(text)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


# Every endpoint, with a body each accepts.
ENDPOINTS = [
    ("GET", "/v1/models", None),
    ("GET", "/v1/models/kjv-small", None),
    ("POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 2}),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    ("POST", "/tokenize", {"prompt": PROMPT}),
    ("POST", "/detokenize", {"tokens": [5, 6]}),
    ("GET", "/metrics", None),
    ("GET", "/no/such/endpoint", None),
]


def test_the_api_key_guards_every_endpoint_but_health(start_server):
    s = start_server("--api-key", "sesame-0123456789")
    for method, path, body in ENDPOINTS:
        for auth in [None, "Bearer wrong", "Bearer sesame-0123456788", "Bearer sesame-0123456789x",
                     "sesame-0123456789", "Bearer "]:
            headers = {"Authorization": auth} if auth is not None else {}
            status, text = exchange(s.port, method, path, body, headers)
            assert status == 401, (method, path, auth, status, text)
            assert error_of(text)["code"] == "invalid_api_key"
        status, text = exchange(s.port, method, path, body, {"Authorization": "Bearer sesame-0123456789"})
        assert status != 401, (method, path, status, text)
        if path != "/no/such/endpoint":
            assert status < 500, (method, path, status, text)
    assert exchange(s.port, "GET", "/health")[0] == 200
    # A 401 before the body is read closes the connection: the body is never taken
    # for a next request.
    body = json.dumps({"prompt": PROMPT}).encode()
    with socket.create_connection(("127.0.0.1", s.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
                     + body + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 401") and reply.count(b"HTTP/1.1 ") == 1, reply
    assert s.stop() == 0


def test_metrics_can_be_public_while_the_api_stays_guarded(start_server):
    s = start_server("--api-key", "sesame", "--metrics-public")
    status, text = exchange(s.port, "GET", "/metrics")
    assert status == 200 and "cellm_kv_cells_used" in text
    assert exchange(s.port, "GET", "/v1/models")[0] == 401
    assert s.stop() == 0


def test_without_a_key_metrics_stay_open(server):
    assert exchange(server.port, "GET", "/metrics")[0] == 200


def assert_limit(status, text, expected_status, *mentions, param=None):
    assert status == expected_status, (status, text)
    err = error_of(text)
    for m in mentions:
        assert m in err["message"], (m, err)
    if param is not None:
        assert err["param"] == param, err


def test_every_limit_is_a_4xx_that_names_it(server):
    p = server.port
    # The header section, one header line, the request line.
    assert_limit(*raw(p, b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-Filler: 0123456789\r\n" * 1000 + b"\r\n"),
                 431, "16384 bytes")
    assert_limit(*raw(p, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n"),
                 431, "8192 bytes")
    assert_limit(*raw(p, b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"), 414, "8192 bytes")
    # The body, whether its length is declared or it comes in chunks.
    assert_limit(*exchange(p, "POST", "/v1/completions", b'{"prompt": "' + b"a" * (5 << 20) + b'"}'),
                 413, "4194304 bytes")
    chunk = b"%x\r\n" % (1 << 16) + b"a" * (1 << 16) + b"\r\n"
    assert_limit(*raw(p, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                      + chunk * 80), 413, "4194304 bytes")
    # JSON nesting.
    deep = b'{"prompt": "a", "metadata": ' + b"[" * 200 + b"]" * 200 + b"}"
    assert_limit(*exchange(p, "POST", "/v1/completions", deep), 400, "128 levels")
    assert_limit(*exchange(p, "POST", "/v1/chat/completions", deep), 400, "128 levels")
    # Request fields.
    assert_limit(*exchange(p, "POST", "/v1/completions", {"prompt": PROMPT, "n": 33}), 400, "32", param="n")
    assert_limit(*exchange(p, "POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 5000}),
                 400, "max_tokens (5000)", param="max_tokens")
    assert_limit(*exchange(p, "POST", "/v1/completions", {"prompt": "and the LORD said " * 200}),
                 400, "at most", param="prompt")
    assert_limit(*exchange(p, "POST", "/v1/completions", {"prompt": PROMPT, "stop": ["x"] * 17}),
                 400, "16", param="stop")
    assert_limit(*exchange(p, "POST", "/v1/completions", {"prompt": PROMPT, "stop": ["x" * 257]}),
                 400, "256 bytes", param="stop")
    assert_limit(*exchange(p, "POST", "/v1/completions", {"prompt": PROMPT, "logprobs": 21}),
                 400, "20", param="logprobs")
    # Still serving.
    status, text = exchange(p, "POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 2})
    assert status == 200, text


@pytest.fixture(scope="module")
def copied_model(tmp_path_factory):
    """The bundled model under a temporary folder, with no chat template (so chat
    requests fail naming a file of the folder) and one added token beyond the
    model's vocabulary (so a prompt holding it fails in the executor)."""
    folder = tmp_path_factory.mktemp("private-model-folder")
    for name in os.listdir(MODEL):
        if name not in ("tokenizer.json", "tokenizer_config.json"):
            os.symlink(os.path.join(MODEL, name), folder / name)
    with open(os.path.join(MODEL, "tokenizer_config.json")) as f:
        config = json.load(f)
    config.pop("chat_template", None)
    with open(folder / "tokenizer_config.json", "w") as f:
        json.dump(config, f)
    with open(os.path.join(MODEL, "tokenizer.json")) as f:
        tokenizer = json.load(f)
    with open(os.path.join(MODEL, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    tokenizer["added_tokens"].append({"id": vocab, "content": BEYOND, "single_word": False,
                                      "lstrip": False, "rstrip": False, "normalized": False,
                                      "special": False})
    with open(folder / "tokenizer.json", "w") as f:
        json.dump(tokenizer, f)
    return str(folder)


HOSTILE = [
    ("POST", "/v1/completions", b""),
    ("POST", "/v1/completions", b"{"),
    ("POST", "/v1/completions", b"[1, 2]"),
    ("POST", "/v1/completions", b'{"prompt": "\xff\xfe"}'),
    ("POST", "/v1/completions", b'{"prompt": "a", "max_tokens": 1e400}'),
    ("POST", "/v1/completions", b'{"prompt": [99999999]}'),
    ("POST", "/v1/completions", b'{"prompt": "a", "model": "gpt-9"}'),
    ("POST", "/v1/completions", b'{"prompt": "a", "tools": []}'),
    ("POST", "/v1/completions", b'{"prompt": "a", "logit_bias": {"1": 5}}'),
    ("POST", "/v1/completions", json.dumps({"prompt": "In the beginning " + BEYOND, "max_tokens": 4}).encode()),
    ("POST", "/v1/completions",
     json.dumps({"prompt": "In the beginning " + BEYOND, "max_tokens": 4, "stream": True}).encode()),
    ("POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()),
    ("POST", "/v1/chat/completions", b'{"messages": 5}'),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi", "name": "x"}]}'),
    ("POST", "/tokenize", json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()),
    ("POST", "/tokenize", b'{"prompt": 5}'),
    ("POST", "/detokenize", b'{"tokens": [-1]}'),
    ("POST", "/detokenize", b'{"tokens": "abc"}'),
    ("GET", "/v1/models/nope", None),
    ("GET", "/../../etc/passwd", None),
    ("GET", "/no/such/endpoint", None),
    ("DELETE", "/v1/models", None),
    ("POST", "/v1/completions", b'{"prompt": "a", "metadata": ' + b"[" * 500 + b"]" * 500 + b"}"),
]


def test_error_answers_never_reveal_paths_or_internals(start_server, copied_model):
    s = start_server("--model", copied_model)
    bodies = []
    for method, path, body in HOSTILE:
        status, text = exchange(s.port, method, path, body)
        if status >= 400 or "error" in text:
            bodies.append((path, status, text))
    for data in [b"GARBAGE\r\n\r\n", b"GET /health HTTP/1.1\r\n" + b"X: y\r\n" * 3000 + b"\r\n",
                 b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n"]:
        status, text = raw(s.port, data)
        if status is not None:
            bodies.append(("raw", status, text))
    assert len(bodies) >= len(HOSTILE)
    assert any(status == 500 for _, status, _ in bodies)  # the executor's refusal
    assert any("chat template" in text for _, _, text in bodies)  # names a file of the folder
    real = os.path.realpath(copied_model)
    for path, status, text in bodies:
        for secret in (copied_model, real, MODEL, os.path.realpath(MODEL), "/work/", "/tmp/", "/home/",
                       ".cpp", ".h:", "std::", "what():"):
            assert secret not in text, (path, status, secret, text)
    assert s.stop() == 0
