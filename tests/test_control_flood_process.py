"""A flood of TCP connections on ``--metrics-port`` never stops the watchdog.

A real ``aiotimer serve --metrics-port P`` with ``RLIMIT_NOFILE`` at 256 (soft and
hard), a local client holding 400 connections to the port (past the server's descriptor
limit) and opening new ones throughout, and a sentinel worker whose block hangs. The
control plane serves 16 connections and closes the rest at once, so the server never
runs out of descriptors; its reaping is in another failure domain anyway.

Tolerances: the sentinel's signal leaves within 100 ms of its deadline (the claim: the
flood costs the loop a few accepts, not the deadline); everything else waits up to 10 s.
"""

from __future__ import annotations

import collections
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.process, pytest.mark.timeout(90)]

ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
FD_LIMIT = 256
HELD = 400
REAP_BOUND = 0.1

SENTINEL = r"""
import json, os, sys, time
deadline = time.time() + float(sys.argv[2])
line = json.dumps({"version": 1, "pid": os.getpid(), "scope_id": "sentinel",
                   "expiration_time": deadline, "signal": 9}) + "\n"
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_NONBLOCK)
os.write(fd, line.encode())
os.close(fd)
print(repr(deadline), flush=True)
time.sleep(60)  # hung
"""


def aiotimer(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiotimer", *args],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def few_descriptors() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


class Flood(threading.Thread):
    """Opens connections to ``port`` and holds the last :data:`HELD` of them; once
    that many are held it goes on opening one a millisecond (closing the oldest)."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.held: collections.deque[socket.socket] = collections.deque()
        self.opened = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                conn = socket.create_connection(("127.0.0.1", self.port), timeout=2)
            except OSError:
                time.sleep(0.001)
                continue
            self.opened += 1
            self.held.append(conn)
            if len(self.held) > HELD:
                self.held.popleft().close()
                time.sleep(0.001)

    def end(self) -> None:
        self.stop.set()
        self.join(10)
        while self.held:
            self.held.popleft().close()


def metrics(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer.decode()


def wait_for(condition: object, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.02)


def test_a_connection_flood_on_the_metrics_port_never_stops_reaping(tmp_path: Path) -> None:
    fifo, log, port = tmp_path / "t.fifo", tmp_path / "events.log", free_port()
    argv = [
        sys.executable, "-m", "aiotimer", "serve", "--fifo", str(fifo),
        "--metrics-port", str(port), "--event-log", str(log), "--no-journal",
    ]  # fmt: skip
    # preexec_fn only calls setrlimit (no lock a thread of ours could hold).
    server = subprocess.Popen(
        argv,
        env=ENV,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=few_descriptors,  # noqa: PLW1509
    )
    flood = Flood(port)
    sentinel = None
    try:
        wait_for(lambda: aiotimer("status", "--fifo", str(fifo)).returncode == 0, "serving")
        flood.start()
        wait_for(lambda: flood.opened > HELD, f"{HELD} connections held")
        sentinel = subprocess.Popen(
            [sys.executable, "-c", SENTINEL, str(fifo), "1.0"],
            env=ENV,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert sentinel.stdout is not None
        sent = sentinel.stdout.readline()
        assert sent, f"the sentinel could not send (the server's exit status: {server.poll()})"
        deadline = float(sent)
        assert sentinel.wait(10) == -signal.SIGKILL  # reaped while the flood goes on
        assert flood.is_alive() and flood.opened > 2 * HELD
        flood.end()
        assert server.poll() is None, "the server died"
        status = aiotimer("status", "--fifo", str(fifo), "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["server"]["state"] == "running"
        wait_for(lambda: "aiotimer_reaps_total 1.0" in metrics(port), "metrics answered")
        server.send_signal(signal.SIGTERM)
        assert server.wait(10) == 0
    finally:
        flood.end()
        for proc in (sentinel, server):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert sentinel.stdout is not None and server.stderr is not None
    sentinel.stdout.close()
    stderr = server.stderr.read()
    server.stderr.close()
    events = [json.loads(line) for line in log.read_text().splitlines()]
    [expired] = [e for e in events if e["event"] == "timer_expired"]
    [reaped] = [e for e in events if e["event"] == "worker_reaped"]
    assert expired["pid"] == reaped["pid"] == sentinel.pid
    assert expired["late"] < REAP_BOUND
    assert reaped["time"] - deadline < REAP_BOUND, f"reaped {reaped['time'] - deadline:.3f} s late"
    # The refusals are counted, not logged one by one (thousands of them).
    refused = [line for line in stderr.splitlines() if "closed a new one" in line]
    assert 1 <= len(refused) <= 10, stderr[-2000:]
