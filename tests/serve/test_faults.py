"""Faults stay contained, against the real `cellm serve`: an executor failure fails
only its batch's requests; SIGTERM under load stops accepting, finishes or cancels
what is in flight within --shutdown-timeout and exits 0; a KV pool that cannot fit
in memory stops the start; clients stalled mid-request or mid-stream hold no worker
past --request-timeout; a thousand dropped connections leave the server serving.
Every wait is bounded; everything stays on loopback."""
import concurrent.futures as cf
import json
import os
import random
import re
import select
import signal
import socket
import struct
import subprocess
import threading
import time

import pytest

from conftest import BINARY, MODEL, Server

PROMPT = "And God said, Let there be light"
# An added token the tokenizer knows and the model's vocabulary (4096) does not:
# a prompt holding it encodes fine and is refused by the executor when it runs.
BEYOND = "<|beyond|>"


def http(port, method, path, body=None, timeout=30, headers=None):
    """(status, parsed JSON or text) of one request on its own connection."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        h = {"Content-Type": "application/json"} if data is not None else {}
        h.update(headers or {})
        conn.request(method, path, body=data, headers=h)
        r = conn.getresponse()
        text = r.read().decode("utf-8", "replace")
        try:
            return r.status, json.loads(text)
        except ValueError:
            return r.status, text
    finally:
        conn.close()


def sse_events(port, body, timeout=60):
    """The parsed data events of a streamed completion, [DONE] excluded."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps({**body, "stream": True}).encode(),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200, r.read()
        events = []
        for line in r.read().decode().splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
        return events
    finally:
        conn.close()


def wait_for(predicate, timeout, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def settled(server):
    m = server.metrics()
    return (m["cellm_kv_cells_used"] == 0 and m["cellm_sessions_running"] == 0
            and m["cellm_requests_running"] == 0 and m["cellm_requests_waiting"] == 0)


def completes(server, max_tokens=4):
    status, body = http(server.port, "POST", "/v1/completions",
                        {"prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True})
    return status == 200 and body["usage"]["completion_tokens"] == max_tokens


@pytest.fixture(scope="module")
def beyond_vocab_model(tmp_path_factory):
    """The bundled model with one more added token, id = vocab_size."""
    folder = tmp_path_factory.mktemp("beyond-vocab-model")
    for name in os.listdir(MODEL):
        if name != "tokenizer.json":
            os.symlink(os.path.join(MODEL, name), folder / name)
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


def test_an_executor_failure_fails_only_its_batchs_requests(start_server, beyond_vocab_model):
    # One generation at a time, so each executor step holds one request: the
    # requests whose prompt the executor refuses fail, every other one completes.
    s = start_server("--model", beyond_vocab_model, "--max-sessions", "1",
                     "--max-queued-requests", "32")
    good = {"prompt": PROMPT, "max_tokens": 24, "ignore_eos": True}
    bad = {"prompt": "In the beginning " + BEYOND + " God", "max_tokens": 24, "ignore_eos": True}

    def run(job):
        kind, body = job
        if kind == "stream":
            return kind, body is bad, sse_events(s.port, body)
        return kind, body is bad, http(s.port, "POST", "/v1/completions", body)

    jobs = [("plain", good)] * 8 + [("stream", good)] * 4 + [("plain", bad)] * 2 + [("stream", bad)] * 2
    random.Random(7).shuffle(jobs)
    with cf.ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(run, jobs, timeout=180))
    for kind, is_bad, result in results:
        if kind == "plain":
            status, body = result
            if is_bad:
                assert status == 500, (status, body)
                assert body["error"]["type"] == "server_error"
                assert "generation failed" in body["error"]["message"]
            else:
                assert status == 200, (status, body)
                assert body["usage"]["completion_tokens"] == 24
        else:
            errors = [e for e in result if "error" in e]
            reasons = [c["finish_reason"] for e in result for c in e.get("choices", []) if c["finish_reason"]]
            if is_bad:
                assert len(errors) == 1 and not reasons, result
                assert errors[0]["error"]["type"] == "server_error"
            else:
                assert not errors and reasons == ["length"], result
                assert len("".join(c["text"] for e in result for c in e["choices"])) > 0
    m = s.metrics()
    assert m["cellm_engine_steps_failed_total"] >= 4
    assert m['cellm_requests_finished_total{finish_reason="error"}'] == 4
    assert m['cellm_requests_finished_total{finish_reason="length"}'] == 12
    # The failed sessions' cells are freed, and the server keeps serving.
    assert wait_for(lambda: settled(s), 5), s.metrics()
    assert completes(s)
    assert s.stop() == 0


def start_streams(port, n_clients, body, on_event=None):
    """Threads that each stream `body` and record how their stream ended."""
    outcomes = [None] * n_clients
    first = [threading.Event() for _ in range(n_clients)]

    def one(i):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
                data = json.dumps({**body, "stream": True}).encode()
                sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(data) + data)
                text = b""
                while True:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    text += chunk
                    if b"data: " in text:
                        first[i].set()
                    if b"data: [DONE]" in text:
                        break
            events = [json.loads(e) for e in re.findall(rb"data: (\{.*?\})\n\n", text)]
            errors = [e for e in events if "error" in e]
            reasons = [c["finish_reason"] for e in events for c in e.get("choices", []) if c["finish_reason"]]
            outcomes[i] = {"errors": errors, "reasons": reasons, "done": b"data: [DONE]" in text}
        except OSError as e:
            outcomes[i] = {"exception": repr(e)}
        first[i].set()

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n_clients)]
    for t in threads:
        t.start()
    return threads, first, outcomes


def refused_or_503(port):
    try:
        status, _ = http(port, "GET", "/v1/models", timeout=2)
        return status == 503
    except (ConnectionRefusedError, ConnectionResetError):
        return True
    except OSError:
        return False


def test_sigterm_lets_requests_in_flight_finish_and_refuses_new_ones(start_server):
    s = start_server("--shutdown-timeout", "20", "--max-sessions", "8")
    threads, first, outcomes = start_streams(
        s.port, 6, {"prompt": PROMPT, "max_tokens": 64, "ignore_eos": True})
    assert all(e.wait(30) for e in first)
    t0 = time.monotonic()
    s.proc.send_signal(signal.SIGTERM)
    # Stops accepting at once, while the streams still run.
    assert wait_for(lambda: refused_or_503(s.port), 2)
    for t in threads:
        t.join(30)
    assert s.proc.wait(30) == 0
    assert time.monotonic() - t0 < 20
    # Every stream finished as if nothing had happened.
    for o in outcomes:
        assert o == {"errors": [], "reasons": ["length"], "done": True}, outcomes
    assert not any("cancelling" in line for line in s.log), "".join(s.log[-10:])


def stalled_stream(port, body):
    """A streaming request whose client reads the answer's first bytes and then no
    more (a tiny receive buffer, so the server's writes back up). The socket."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", port))
    data = json.dumps({**body, "stream": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(data) + data)
    assert sock.recv(64).startswith(b"HTTP/1.1 200")
    return sock


# A stream of about 3 MB that takes seconds to generate on one CPU thread (ONE_THREAD):
# 16 choices of 240 tokens, each token with its 20 most likely alternatives.
BIG_STREAM = {"prompt": PROMPT, "max_tokens": 240, "n": 16, "logprobs": 20, "ignore_eos": True}
ONE_THREAD = ("--executor", "cpu", "--threads", "1")


def test_sigterm_cancels_what_cannot_finish_within_the_shutdown_timeout(start_server):
    s = start_server("--shutdown-timeout", "1", "--request-timeout", "60", *ONE_THREAD,
                     "--max-sessions", "32")
    stalled = stalled_stream(s.port, BIG_STREAM)
    threads, first, outcomes = start_streams(
        s.port, 2, {"prompt": PROMPT, "max_tokens": 240, "n": 4, "ignore_eos": True})
    assert all(e.wait(30) for e in first)
    t0 = time.monotonic()
    s.proc.send_signal(signal.SIGTERM)
    assert wait_for(lambda: refused_or_503(s.port), 2)
    # The stalled stream would hold its worker for the 60 s request timeout: the
    # shutdown timeout cuts it.
    assert s.proc.wait(15) == 0
    assert time.monotonic() - t0 < 1 + 6, time.monotonic() - t0
    for t in threads:
        t.join(10)
    stalled.close()
    assert any("shutdown timeout: cancelling" in line for line in s.log), "".join(s.log[-10:])
    # The clients that read their streams saw them end: finished, or an error event.
    for o in outcomes:
        assert "exception" not in o and o["done"], outcomes
        assert o["errors"] or o["reasons"] == ["length"] * 4, outcomes
        assert set(o["reasons"]) <= {"length"}, outcomes


def test_a_second_signal_cancels_at_once(start_server):
    s = start_server("--shutdown-timeout", "60", *ONE_THREAD)
    stalled = stalled_stream(s.port, BIG_STREAM)
    time.sleep(0.3)
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    t0 = time.monotonic()
    s.proc.send_signal(signal.SIGINT)
    assert s.proc.wait(15) == 0
    assert time.monotonic() - t0 < 6
    stalled.close()
    assert any("second signal: cancelling" in line for line in s.log), "".join(s.log[-10:])


def run_serve(*args, timeout=120):
    return subprocess.run([BINARY, "serve", "--model", MODEL, "--port", "0", "--executor", "cpu", *args],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=timeout)


def test_a_kv_pool_that_cannot_fit_in_memory_stops_the_start():
    r = run_serve("--kv-cells", "2000000000")
    assert r.returncode != 0
    assert "does not fit in memory" in r.stderr, r.stderr
    assert "--kv-cells 2000000000 x 8.0 KiB a cell = 14.9 TiB" in r.stderr, r.stderr
    assert "of RAM" in r.stderr or "memory limit" in r.stderr, r.stderr
    assert "listening" not in r.stderr
    r = run_serve("--kv-memory", "1000000")
    assert r.returncode != 0
    assert "does not fit in memory: --kv-memory 976.6 TiB" in r.stderr, r.stderr
    assert "listening" not in r.stderr


def drip(sock, data, until, interval=0.2):
    """Sends `data` a byte at a time (cycling) until `until` (monotonic) or the server
    answers or closes. What the server answered, b"" when it closed without an answer,
    None when it did neither."""
    sent = 0
    while time.monotonic() < until:
        readable, _, _ = select.select([sock], [], [], interval)
        if readable:
            try:
                return sock.recv(4096)
            except OSError:
                return b""
        try:
            sock.sendall(data[sent % len(data):sent % len(data) + 1])
        except OSError:
            return b""
        sent += 1
    return None


def test_clients_stalled_mid_request_hold_no_worker_past_the_request_timeout(start_server):
    # 2 sessions + 2 queued + 64: 68 workers. 80 clients that keep sending a byte every
    # 0.2 s (a per-read timeout never fires) would hold all of them.
    s = start_server("--max-sessions", "2", "--max-queued-requests", "2", "--request-timeout", "1")
    body = b'{"prompt": "' + b"a" * 200 + b'"}'
    socks = []
    for i in range(80):
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        if i % 2:  # the headers whole, the body dripped
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body))
            socks.append((sock, body))
        else:  # the request line, then header lines dripped
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            socks.append((sock, b"X-Slow: 1\r\n"))
    until = time.monotonic() + 6
    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(len(socks)) as pool:
        answers = pool.map(lambda sd: (drip(sd[0], sd[1], until), time.monotonic() - t0), socks)
        time.sleep(1.5)
        # Every worker is free again: 40 clients are all served at once, well before
        # the stalled clients would stop sending.
        with cf.ThreadPoolExecutor(40) as clients:
            t1 = time.monotonic()
            statuses = list(clients.map(lambda _: http(s.port, "GET", "/v1/models")[0], range(40),
                                        timeout=30))
            assert statuses == [200] * 40
            assert time.monotonic() - t1 < 3
        assert completes(s)
        answers = list(answers)
    for answer, elapsed in answers:
        # Answered 408 (or closed) after about a second, not when the client gave up.
        assert answer is not None and (answer == b"" or answer.startswith(b"HTTP/1.1 408")), answer
        assert elapsed < 4, elapsed
    assert sum(a.startswith(b"HTTP/1.1 408") for a, _ in answers) >= 40
    for sock, _ in socks:
        sock.close()
    assert s.stop() == 0


def test_a_client_stalled_mid_stream_is_cancelled_after_the_request_timeout(start_server):
    # 64 generations of 240 tokens: on one thread they take about twice as long as the
    # stall takes to be seen (the client's window filled, then the 1 s timeout), where 16
    # of them finished first on a fast machine.
    s = start_server("--request-timeout", "1", *ONE_THREAD, "--max-sessions", "64")
    before = s.metrics()['cellm_requests_finished_total{finish_reason="cancelled"}']
    t0 = time.monotonic()
    stalled = stalled_stream(s.port, {**BIG_STREAM, "n": 64})
    # Its generations are cancelled and their cells freed about a second after the
    # client stopped reading, long before they could have finished.
    assert wait_for(lambda: settled(s), 8), s.metrics()
    assert time.monotonic() - t0 < 8
    m = s.metrics()
    assert m['cellm_requests_finished_total{finish_reason="cancelled"}'] - before == 64
    assert m["cellm_generation_tokens_total"] < 64 * 240
    assert any("(client gone)" in line for line in s.log)
    stalled.close()
    assert completes(s)
    assert s.stop() == 0


def test_a_thousand_dropped_connections_leave_the_server_serving(start_server):
    s = start_server("--request-timeout", "2", "--max-sessions", "16", "--max-queued-requests", "16")
    request = json.dumps({"prompt": PROMPT, "max_tokens": 32, "ignore_eos": True}).encode()
    full = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(request) + request)
    streamed = json.dumps({"prompt": PROMPT, "max_tokens": 32, "ignore_eos": True, "stream": True}).encode()
    full_stream = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n" % len(streamed) + streamed)
    head_end = full.index(b"\r\n\r\n") + 4

    def one(i):
        kind = i % 6
        try:
            sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        except OSError as e:
            return repr(e)
        try:
            if kind == 1:  # mid-headers
                sock.sendall(full[:head_end // 2])
            elif kind == 2:  # mid-body
                sock.sendall(full[:head_end + len(request) // 2])
            elif kind == 3:  # a whole request, gone before the answer
                sock.sendall(full)
            elif kind == 4:  # a whole stream request, gone after its first bytes
                sock.sendall(full_stream)
                sock.recv(1)
            elif kind == 5:  # reset (RST) mid-headers
                sock.sendall(full[:10])
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        finally:
            sock.close()
        return None

    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(32) as pool:
        errors = [e for e in pool.map(one, range(1000), timeout=120) if e]
    assert not errors, errors[:5]
    assert time.monotonic() - t0 < 120
    # Still serving, everything the dropped clients started is gone.
    assert http(s.port, "GET", "/health")[0] == 200
    with cf.ThreadPoolExecutor(8) as pool:
        assert all(pool.map(lambda _: completes(s, 8), range(8), timeout=60))
    assert wait_for(lambda: settled(s), 10), s.metrics()
    assert s.proc.poll() is None
    assert s.stop() == 0
