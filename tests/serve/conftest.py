"""Starts the real `cellm serve` (CELLM_BINARY) with the bundled model on a free
loopback port and hands tests its base URL. Every wait is bounded."""
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request

import pytest

ROOT = os.environ.get("CELLM_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
BINARY = os.environ.get("CELLM_BINARY", os.path.join(ROOT, "build", "cellm"))
MODEL = os.path.join(ROOT, "models", "kjv-small")
START_TIMEOUT_S = 60


class Server:
    def __init__(self, *extra):
        if not os.path.exists(BINARY):
            pytest.fail(f"cellm binary not found at {BINARY} (set CELLM_BINARY)")
        model = [] if "--model" in extra else ["--model", MODEL]
        self.args = [BINARY, "serve", *model, "--port", "0", *extra]
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log = []
        self.port = None
        ready = threading.Event()

        def pump():
            for line in self.proc.stderr:
                self.log.append(line)
                m = re.search(r"listening on http://[^:]+:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                    ready.set()
            ready.set()

        self.reader = threading.Thread(target=pump, daemon=True)
        self.reader.start()
        if not ready.wait(START_TIMEOUT_S) or self.port is None:
            self.stop()
            pytest.fail("cellm serve did not start:\n" + "".join(self.log))
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.05)

    def metrics(self):
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as r:
            text = r.read().decode()
        values = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
        return values

    def stop(self, sig=signal.SIGTERM, timeout=15):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(5)
        return self.proc.returncode


@pytest.fixture(scope="session")
def server():
    s = Server("--max-sessions", "32", "--max-queued-requests", "64")
    yield s
    assert s.stop() == 0, "".join(s.log[-20:])


@pytest.fixture(scope="session")
def start_server():
    started = []

    def start(*extra):
        s = Server(*extra)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()
