"""Floods of connections on ``--metrics-port`` and the control socket never stop the
watchdog, even when they would take the server's last file descriptors.

A real ``aiotimer serve --metrics-port P`` with ``RLIMIT_NOFILE`` at 48 (soft and hard:
the server needs about 20 of its own, and each listener serves 16 connections), and two
local clients, one per listener, each holding its first 100 connections and opening
(and closing) a new one a millisecond. Without a reserve, the two listeners'
connections would take every descriptor left, and the hung workers that register
meanwhile could not be pinned (so not signalled: a bare pid may name another process).
The listeners keep a quarter of the limit free for the engine, so five sentinels whose
blocks hang are pinned and reaped on time, and the server answers ``aiotimer status``
and ``/metrics`` once the floods end.

Tolerances: every sentinel's signal leaves within 100 ms of its deadline (the claim: the
floods cost the loop a few accepts, not the deadline); everything else waits up to 10 s.
"""

from __future__ import annotations

import collections
import json
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from _procs import Sentinel, env, events

pytestmark = [pytest.mark.process, pytest.mark.timeout(90)]

FD_LIMIT = 48
HELD = 100
REAP_BOUND = 0.1


def aiotimer(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiotimer", *args],
        env=env(),
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
    """Opens connections with ``connect`` and holds the first :data:`HELD` of them until
    it ends; once that many are held it goes on opening one a millisecond, and closing
    it at once."""

    def __init__(self, connect: Callable[[], socket.socket]) -> None:
        super().__init__(daemon=True)
        self.connect = connect
        self.held: collections.deque[socket.socket] = collections.deque()
        self.opened = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                conn = self.connect()
            except OSError:
                time.sleep(0.001)
                continue
            self.opened += 1
            if len(self.held) < HELD:
                self.held.append(conn)
            else:
                conn.close()
                time.sleep(0.001)

    def end(self) -> None:
        self.stop.set()
        self.join(10)
        while self.held:
            self.held.popleft().close()


def tcp(port: int) -> Callable[[], socket.socket]:
    return lambda: socket.create_connection(("127.0.0.1", port), timeout=2)


def unix(path: str) -> Callable[[], socket.socket]:
    def connect() -> socket.socket:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(2)
        try:
            conn.connect(path)
        except OSError:
            conn.close()
            raise
        return conn

    return connect


def metrics(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer.decode()


def wait_for(condition: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.02)


def test_floods_on_both_listeners_never_take_the_descriptors_reaping_needs(
    tmp_path: Path,
) -> None:
    fifo, log, port = tmp_path / "t.fifo", tmp_path / "events.log", free_port()
    argv = [
        sys.executable, "-m", "aiotimer", "serve", "--fifo", str(fifo),
        "--metrics-port", str(port), "--event-log", str(log), "--no-journal",
    ]  # fmt: skip
    # preexec_fn only calls setrlimit (no lock a thread of ours could hold).
    server = subprocess.Popen(
        argv,
        env=env(),
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=few_descriptors,  # noqa: PLW1509
    )
    floods: list[Flood] = []
    sentinels: list[Sentinel] = []
    try:
        wait_for(lambda: aiotimer("status", "--fifo", str(fifo)).returncode == 0, "serving")
        control = json.loads(Path(f"{fifo}.aiotimer").read_text())["control"]
        floods = [Flood(tcp(port)), Flood(unix(control))]
        for flood in floods:
            flood.start()
        wait_for(lambda: all(f.opened > HELD for f in floods), f"{HELD} connections held")
        sentinels = [Sentinel() for _ in range(5)]
        for sentinel in sentinels:
            sentinel.arm(fifo, after=1.0)
        for sentinel in sentinels:
            sentinel.wait_dead(10)  # reaped while the floods go on
        assert all(f.is_alive() and f.opened > 2 * HELD for f in floods)
        for flood in floods:
            flood.end()
        assert server.poll() is None, "the server died"
        status = aiotimer("status", "--fifo", str(fifo), "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["server"]["state"] == "running"
        wait_for(lambda: "aiotimer_reaps_total 5.0" in metrics(port), "metrics answered")
        server.send_signal(signal.SIGTERM)
        assert server.wait(10) == 0
    finally:
        for flood in floods:
            flood.end()
        for sentinel in sentinels:
            sentinel.close()
        if server.poll() is None:
            server.kill()
            server.wait(10)
    assert server.stderr is not None
    stderr = server.stderr.read()
    server.stderr.close()
    records = events(log)
    late = [s.reap_latency(records) for s in sentinels]
    assert max(late) < REAP_BOUND, f"reaped late: {late}"
    assert not [r for r in records if r["event"] == "worker_unknown"], "a sentinel went unpinned"
    # The refusals are counted, not logged one by one (thousands of them).
    reserved = [line for line in stderr.splitlines() if "kept for pinning workers" in line]
    assert 1 <= len(reserved) <= 20, stderr[-2000:]
    assert "Traceback" not in stderr
