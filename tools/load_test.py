#!/usr/bin/env python3
"""Bounded load test for `cellm serve`: C concurrent streaming clients send
/v1/completions requests back to back for D seconds, then the script reports
throughput and time-to-first-token / inter-token-latency percentiles.

    python3 tools/load_test.py --url http://127.0.0.1:8080 --clients 64 --duration 60

Standard library only (http.client), one thread per client. A request still
running at the deadline is finished (bounded by --max-tokens) and counted.
"""
import argparse
import http.client
import json
import statistics
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of sending new requests")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--timeout", type=float, default=120.0, help="per-request socket timeout")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    u = urllib.parse.urlparse(args.url)
    host, port = u.hostname, u.port or 80

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
            except OSError as e:
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
    result = {
        "clients": args.clients,
        "duration_s": round(elapsed, 2),
        "max_tokens": args.max_tokens,
        "requests": sum(statuses.values()),
        "statuses": {str(k): v for k, v in statuses.items()},
        "requests_per_s": round(ok / elapsed, 2),
        "generated_tokens": tokens_total[0],
        "generated_tokens_per_s": round(tokens_total[0] / elapsed, 1),
        "ttft_ms": {p: round(1e3 * percentile(ttfts, p), 1) for p in (50, 90, 99)},
        "itl_ms": {p: round(1e3 * percentile(itls, p), 2) for p in (50, 90, 99)},
        "itl_mean_ms": round(1e3 * statistics.fmean(itls), 2) if itls else None,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
