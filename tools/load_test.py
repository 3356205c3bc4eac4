#!/usr/bin/env python3
"""Bounded load test for `cellm serve`.

Streaming mode (the default): C concurrent streaming clients send /v1/completions
requests back to back for D seconds, then the script reports throughput and
time-to-first-token / inter-token-latency percentiles.

    python3 tools/load_test.py --url http://127.0.0.1:8080 --clients 64 --duration 600

Hostile mode: each client cycles through a mix of well-formed requests (streamed
and not, completions and chat) and hostile ones (malformed, oversized and deeply
nested bodies, garbage request lines, truncated bodies, streams dropped
mid-generation, clients that send or read slowly), for R rounds of D seconds:

    python3 tools/load_test.py --mode hostile --clients 16 --duration 40 --rounds 2 --pid PID

After each round it waits for the load to drain and reports, per kind, the status
counts, the 5xx answers, the connection errors (a request the server answered
with a reset or not at all, where an answer was due), how long the KV cells held
by generations (/metrics cellm_kv_cells_in_use; cells only the prefix cache holds
are cellm_kv_cells_cached) took to get back to zero, and the server's resident
memory (VmRSS of --pid, else /metrics process_resident_memory_bytes). The
growth of a round is its resident memory over the previous round's.

Standard library only (http.client, socket), one thread per client. A request
still running at the deadline is finished (bounded by --max-tokens) and counted.
--check makes the exit status 1 when a hostile run saw a 5xx, a connection
error, an answer of the wrong class, cells that did not drain within
--drain-limit seconds, or a round that grew resident memory by --max-growth
percent or more.
"""
import argparse
import http.client
import json
import os
import socket
import statistics
import struct
import sys
import threading
import time
import urllib.parse

PROMPTS = [
    "In the beginning God created",
    "And the LORD spake unto Moses, saying,",
    "The LORD is my shepherd;",
    "Blessed are the poor in spirit:",
    "And it came to pass in those days,",
    "For God so loved the world,",
    "Now the serpent was more subtil than any beast",
    "Let not your heart be troubled:",
]


def percentile(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def one_request(host, port, body, timeout):
    """Returns (ttft_s, [itl_s...], tokens, status)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        t0 = time.perf_counter()
        conn.request("POST", "/v1/completions", body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            r.read()
            return None, [], 0, r.status
        ttft, last, itls, tokens = None, None, [], 0
        for raw in r:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            now = time.perf_counter()
            event = json.loads(line[6:])
            if "error" in event:
                return ttft, itls, tokens, 500
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            for _choice in event.get("choices", []):
                # One chunk per delivery of the engine: a token (rarely more).
                if ttft is None:
                    ttft = now - t0
                else:
                    itls.append(now - last)
                last = now
        return ttft, itls, tokens, 200
    finally:
        conn.close()


# ---- hostile mode -------------------------------------------------------------------

MAX_BODY_BYTES = 4 << 20  # `cellm serve`'s body limit (413 past it)
MALFORMED = [
    b"", b"{", b"[1,2,3]", b"null", b"\"text\"", b"{\"prompt\": \"abc\"",
    b"{\"prompt\": \"\xff\xfe\"}", b"{\"prompt\": \"a\", \"max_tokens\": 1e400}",
    b"{\"prompt\": \"a\", \"n\": -99999999999999}", b"{\"prompt\": \"a\", \"stop\": [1, 2]}",
    b"{\"prompt\": [[1, 2], [-3]]}", b"{\"prompt\": {\"nested\": true}}",
    b"{\"prompt\": \"a\", \"seed\": \"seven\"}", b"{\"messages\": 5}", b"\x00\x01\x02\x03",
]
NESTED = [b"[" * 100000, b"{\"prompt\": " + b"[" * 5000 + b"]" * 5000 + b"}",
          b"{\"prompt\": \"a\", \"x\": " + b"{\"a\":" * 3000 + b"1" + b"}" * 3000 + b"}"]
GARBAGE = [b"GARBAGE\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
           b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
           b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n"]
CHAT_TEMPLATE_FREE_MESSAGES = [{"role": "user", "content": "Who made the heaven and the earth?"}]


def request_bytes(path, body, extra_headers=b""):
    """One request on a connection the server closes after its answer (read to the end)."""
    return (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\n" + extra_headers + b"Content-Length: %d\r\n\r\n" % len(body) + body)


def read_status(sock):
    """The status code of the answer on sock, None when the server closed without one."""
    reply = b""
    while b"\r\n" not in reply:
        chunk = sock.recv(4096)
        if not chunk:
            break
        reply += chunk
    if not reply.startswith(b"HTTP/1."):
        return None
    return int(reply.split(b" ")[1])


def read_to_end(sock, pause=0.0, size=65536):
    data = b""
    while True:
        chunk = sock.recv(size)
        if not chunk:
            return data
        data += chunk
        if pause:
            time.sleep(pause)


def http_post(host, port, path, body, timeout):
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        return r.status, data
    finally:
        conn.close()


def stream_ok(data):
    """A streamed answer ends with [DONE] and carries no error event."""
    return b"data: [DONE]" in data and b"\"error\"" not in data


class Hostile:
    """One request of each kind; each returns (outcome, expected) where outcome is a
    status code or "closed" (the server closed without an answer) and expected the
    set of acceptable outcome classes ("2xx", "4xx", "closed"). "error_event" is a
    200 stream that ended without [DONE] or with an error event (a 5xx in the tally)."""

    def __init__(self, host, port, timeout, max_tokens, chat):
        self.host, self.port, self.timeout, self.max_tokens = host, port, timeout, max_tokens
        self.kinds = ["complete", "stream", "malformed", "nested", "oversized", "dropped",
                      "slow_send", "slow_read", "truncated", "garbage"]
        if chat:
            self.kinds.insert(2, "chat")

    def body(self, seed, stream=False):
        return json.dumps({"prompt": PROMPTS[seed % len(PROMPTS)], "max_tokens": self.max_tokens,
                           "temperature": 0.8, "seed": seed, "stream": stream,
                           "ignore_eos": True}).encode()

    def connect(self):
        return socket.create_connection((self.host, self.port), timeout=self.timeout)

    def complete(self, seed):
        status, data = http_post(self.host, self.port, "/v1/completions", self.body(seed), self.timeout)
        if status == 200 and json.loads(data)["usage"]["completion_tokens"] != self.max_tokens:
            return "short", {"2xx"}
        return status, {"2xx"}

    def chat(self, seed):
        body = json.dumps({"messages": CHAT_TEMPLATE_FREE_MESSAGES, "max_tokens": self.max_tokens,
                           "seed": seed, "stream": seed % 2 == 0}).encode()
        return http_post(self.host, self.port, "/v1/chat/completions", body, self.timeout)[0], {"2xx"}

    def stream(self, seed):
        status, data = http_post(self.host, self.port, "/v1/completions", self.body(seed, True), self.timeout)
        if status == 200 and not stream_ok(data):
            return "error_event", {"2xx"}  # a 200 stream that failed: a server error
        return status, {"2xx"}

    def malformed(self, seed):
        body = MALFORMED[seed % len(MALFORMED)]
        path = "/v1/chat/completions" if seed % 3 == 0 else "/v1/completions"
        return http_post(self.host, self.port, path, body, self.timeout)[0], {"4xx"}

    def nested(self, seed):
        return http_post(self.host, self.port, "/v1/completions", NESTED[seed % len(NESTED)],
                         self.timeout)[0], {"4xx"}

    def oversized(self, seed):
        pad = b"a" * (MAX_BODY_BYTES + 1 + seed % 1000)
        return http_post(self.host, self.port, "/v1/completions",
                         b"{\"prompt\": \"" + pad + b"\"}", self.timeout)[0], {"4xx"}

    def dropped(self, seed):
        """A stream left after its first events: half closed normally, half reset."""
        with self.connect() as s:
            s.sendall(request_bytes("/v1/completions", self.body(seed, True)))
            got = b""
            while got.count(b"data: ") < 3:
                chunk = s.recv(4096)
                if not chunk:
                    return "closed", {"2xx"}
                got += chunk
            status = int(got.split(b" ")[1])
            if seed % 2:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return status, {"2xx"}

    def slow_send(self, seed):
        """The request dribbles in over about a second."""
        data = request_bytes("/v1/completions", self.body(seed, seed % 2 == 0))
        with self.connect() as s:
            step = max(1, len(data) // 10)
            for i in range(0, len(data), step):
                s.sendall(data[i:i + step])
                time.sleep(0.1)
            data = read_to_end(s)
        if not data.startswith(b"HTTP/1."):
            return "closed", {"2xx"}
        status = int(data.split(b" ")[1])
        if status == 200 and seed % 2 == 0 and not stream_ok(data):
            return "error_event", {"2xx"}
        return status, {"2xx"}

    def slow_read(self, seed):
        """A stream read a few bytes at a time with pauses (a slow consumer)."""
        with self.connect() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(request_bytes("/v1/completions", self.body(seed, True)))
            data = read_to_end(s, pause=0.01, size=256)
        if not data.startswith(b"HTTP/1."):
            return "closed", {"2xx"}
        status = int(data.split(b" ")[1])
        if status == 200 and not stream_ok(data):
            return "error_event", {"2xx"}
        return status, {"2xx"}

    def truncated(self, seed):
        """A Content-Length the body never reaches, then the write side closed."""
        body = self.body(seed)
        data = request_bytes("/v1/completions", body)
        with self.connect() as s:
            s.sendall(data[:len(data) - len(body) // 2])
            s.shutdown(socket.SHUT_WR)
            status = read_status(s)
        return ("closed" if status is None else status), {"4xx", "closed"}

    def garbage(self, seed):
        with self.connect() as s:
            s.sendall(GARBAGE[seed % len(GARBAGE)])
            s.shutdown(socket.SHUT_WR)
            status = read_status(s)
        return ("closed" if status is None else status), {"4xx", "closed"}


def outcome_class(outcome):
    if isinstance(outcome, int):
        return f"{outcome // 100}xx"
    return outcome


class ServerProbe:
    def __init__(self, host, port, pid):
        self.host, self.port, self.pid = host, port, pid

    def metrics(self):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            conn.request("GET", "/metrics")
            text = conn.getresponse().read().decode()
        finally:
            conn.close()
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def alive(self):
        if self.pid:
            return os.path.exists(f"/proc/{self.pid}")
        try:
            self.metrics()
            return True
        except OSError:
            return False

    def rss_bytes(self):
        if self.pid:
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
        return int(self.metrics().get("process_resident_memory_bytes", 0))

    def drain(self, limit_s):
        """Seconds until no generation holds cells or a session slot (None past limit_s)."""
        t0 = time.monotonic()
        while True:
            m = self.metrics()
            if (m["cellm_kv_cells_in_use"] == 0 and m["cellm_sessions_running"] == 0
                    and m["cellm_requests_running"] == 0 and m["cellm_requests_waiting"] == 0):
                return time.monotonic() - t0, m
            if time.monotonic() - t0 > limit_s:
                return None, m
            time.sleep(0.01)


def hostile_round(args, host, port, hostile):
    lock = threading.Lock()
    kinds = {}
    deadline = time.perf_counter() + args.duration

    def record(kind, outcome, expected):
        with lock:
            k = kinds.setdefault(kind, {"outcomes": {}, "unexpected": 0, "connection_errors": 0})
            k["outcomes"][str(outcome)] = k["outcomes"].get(str(outcome), 0) + 1
            if outcome == "connection_error":
                k["connection_errors"] += 1
            elif outcome_class(outcome) not in expected:
                k["unexpected"] += 1

    def client(i):
        n = 0
        while time.perf_counter() < deadline:
            kind = hostile.kinds[(i + n) % len(hostile.kinds)]
            seed = i * 100003 + n
            try:
                outcome, expected = getattr(hostile, kind)(seed)
            except (OSError, http.client.HTTPException) as e:
                outcome, expected = "connection_error", set()
                if args.verbose:
                    print(f"{kind}: {type(e).__name__}: {e}", file=sys.stderr)
            record(kind, outcome, expected)
            n += 1

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(args.clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(args.duration + args.timeout + 10)
    return kinds, time.perf_counter() - t0


def run_hostile(args, host, port):
    probe = ServerProbe(host, port, args.pid)
    chat = args.chat
    hostile = Hostile(host, port, args.timeout, args.max_tokens, chat)
    rounds = []
    rss_before = probe.rss_bytes()
    previous = rss_before
    failed = []
    for r in range(args.rounds):
        kinds, elapsed = hostile_round(args, host, port, hostile)
        drain_s, m = probe.drain(args.drain_limit)
        alive = probe.alive()
        if args.idle:
            time.sleep(args.idle)
        rss = probe.rss_bytes() if alive else 0
        five = sum(v for k in kinds.values() for o, v in k["outcomes"].items()
                   if o.startswith("5") or o == "error_event")
        conn_errors = sum(k["connection_errors"] for k in kinds.values())
        unexpected = sum(k["unexpected"] for k in kinds.values())
        growth = 100.0 * (rss - previous) / previous if previous else float("nan")
        rounds.append({
            "round": r + 1,
            "duration_s": round(elapsed, 2),
            "requests": sum(sum(k["outcomes"].values()) for k in kinds.values()),
            "5xx": five,
            "connection_errors": conn_errors,
            "unexpected": unexpected,
            "server_alive": alive,
            "cells_drained_s": None if drain_s is None else round(drain_s, 3),
            "kv_cells_in_use": m["cellm_kv_cells_in_use"],
            "kv_cells_cached": m.get("cellm_kv_cells_cached"),
            "rss_mb": round(rss / 2**20, 1),
            "rss_growth_pct": round(growth, 2),
            "kinds": kinds,
        })
        if five or conn_errors or unexpected or not alive or drain_s is None:
            failed.append(r + 1)
        if r > 0 and not growth < args.max_growth:
            failed.append(r + 1)
        previous = rss
        if not alive:
            break
    result = {"mode": "hostile", "clients": args.clients, "max_tokens": args.max_tokens,
              "kinds": hostile.kinds, "rss_before_mb": round(rss_before / 2**20, 1), "rounds": rounds,
              "ok": not failed}
    return result


# ---- streaming mode -----------------------------------------------------------------

def run_stream(args, host, port):
    lock = threading.Lock()
    ttfts, itls, statuses = [], [], {}
    tokens_total = [0]
    t_start = time.perf_counter()
    deadline = t_start + args.duration

    def client(i):
        n = 0
        while time.perf_counter() < deadline:
            body = {"prompt": PROMPTS[(i + n) % len(PROMPTS)], "max_tokens": args.max_tokens,
                    "temperature": args.temperature, "seed": i * 100003 + n, "stream": True,
                    "stream_options": {"include_usage": True}, "ignore_eos": True}
            try:
                ttft, gaps, tokens, status = one_request(host, port, body, args.timeout)
            except (OSError, http.client.HTTPException) as e:
                ttft, gaps, tokens, status = None, [], 0, type(e).__name__
            with lock:
                statuses[status] = statuses.get(status, 0) + 1
                tokens_total[0] += tokens
                if ttft is not None:
                    ttfts.append(ttft)
                itls.extend(gaps)
            n += 1

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(args.duration + args.timeout + 10)
    elapsed = time.perf_counter() - t_start

    ok = statuses.get(200, 0)
    return {
        "mode": "stream",
        "clients": args.clients,
        "duration_s": round(elapsed, 2),
        "max_tokens": args.max_tokens,
        "requests": sum(statuses.values()),
        "statuses": {str(k): v for k, v in statuses.items()},
        "errors": sum(v for k, v in statuses.items() if k != 200),
        "requests_per_s": round(ok / elapsed, 2),
        "generated_tokens": tokens_total[0],
        "generated_tokens_per_s": round(tokens_total[0] / elapsed, 1),
        "ttft_ms": {p: round(1e3 * percentile(ttfts, p), 1) for p in (50, 90, 99)},
        "itl_ms": {p: round(1e3 * percentile(itls, p), 2) for p in (50, 90, 99)},
        "itl_mean_ms": round(1e3 * statistics.fmean(itls), 2) if itls else None,
        "ok": ok == sum(statuses.values()),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--mode", choices=["stream", "hostile"], default="stream")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of sending new requests (a round's)")
    ap.add_argument("--rounds", type=int, default=2, help="hostile mode: rounds of --duration seconds")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--timeout", type=float, default=120.0, help="per-request socket timeout")
    ap.add_argument("--pid", type=int, help="hostile mode: the server's process id (its VmRSS)")
    ap.add_argument("--chat", action="store_true", help="hostile mode: mix in chat completions "
                    "(the model needs a chat template)")
    ap.add_argument("--drain-limit", type=float, default=1.0,
                    help="hostile mode: seconds the cells of generations may take to reach zero")
    ap.add_argument("--idle", type=float, default=0.0,
                    help="hostile mode: seconds to wait after a round before reading resident memory")
    ap.add_argument("--max-growth", type=float, default=3.0,
                    help="hostile mode with --check: the most a round after the first may grow, percent")
    ap.add_argument("--check", action="store_true", help="exit 1 when the run falls short (see above)")
    ap.add_argument("--verbose", action="store_true", help="print each connection error")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    u = urllib.parse.urlparse(args.url)
    host, port = u.hostname, u.port or 80

    result = run_hostile(args, host, port) if args.mode == "hostile" else run_stream(args, host, port)
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    if args.check and not result["ok"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
