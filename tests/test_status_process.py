"""``aiotimer status`` and the control socket against real processes.

A real ``aiotimer serve``, real worker processes using ``expires()``, the real CLI, real
signals. Tolerance: a worker must show up in the status within 1 s of entering its
block (the request and the status call are each a few ms; 1 s is the claim we make).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec
import pytest

from aiotimer.control import ControlClient
from aiotimer.core._stats import StatsState

pytestmark = [pytest.mark.process, pytest.mark.timeout(60)]

ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}

WORKER = r"""
import sys, time
from aiotimer import FifoClient, configure, expires
configure(FifoClient(sys.argv[1]))
for _ in range(int(sys.argv[3])):
    with expires(after=10, scope="quick"):
        pass
with expires(after=60, scope=sys.argv[2]):
    print("entered", flush=True)
    time.sleep(60)
"""


def aiotimer(*args: str, timeout: float = 15) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiotimer", *args],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def wait_serving(fifo: Path, server: subprocess.Popen[str], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.poll() is None, server.stderr.read() if server.stderr else ""
        if aiotimer("status", "--fifo", str(fifo)).returncode == 0:
            return
        time.sleep(0.1)
    raise TimeoutError("the server did not serve its control socket in time")


@contextmanager
def serve(fifo: Path, *extra: str) -> Iterator[subprocess.Popen[str]]:
    argv = [sys.executable, "-m", "aiotimer", "serve", "--fifo", str(fifo), *extra]
    server = subprocess.Popen(argv, env=ENV, stderr=subprocess.PIPE, text=True)
    try:
        wait_serving(fifo, server)
        yield server
    finally:
        if server.poll() is None:
            server.kill()
        server.wait(10)
        if server.stderr is not None:
            server.stderr.close()


@contextmanager
def worker(fifo: Path, scope: str, quick_blocks: int = 0) -> Iterator[subprocess.Popen[str]]:
    argv = [sys.executable, "-c", WORKER, str(fifo), scope, str(quick_blocks)]
    child = subprocess.Popen(argv, env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "entered\n"
        yield child
    finally:
        child.kill()
        child.wait(10)
        if child.stdout is not None:
            child.stdout.close()


def test_status_shows_a_worker_its_scope_and_metrics(tmp_path: Path) -> None:
    fifo = tmp_path / "t.fifo"
    with serve(fifo) as server, worker(fifo, "train-step") as child:
        entered = time.monotonic()
        while True:
            out = aiotimer("status", "--fifo", str(fifo), "--json")
            assert out.returncode == 0, out.stderr
            state = json.loads(out.stdout)
            timers = [(t["pid"], t["scope_id"]) for t in state["timers"]]
            if (child.pid, "train-step") in timers:
                break
            assert time.monotonic() - entered < 1.0, f"not listed within 1 s: {state}"
        assert {"server", "workers", "timers", "counters", "scopes"} <= state.keys()
        assert state["server"]["pid"] == server.pid
        assert [w["pid"] for w in state["workers"]] == [child.pid]

        human = aiotimer("status", "--fifo", str(fifo))
        assert human.returncode == 0
        row = next(line for line in human.stdout.splitlines() if line.startswith(str(child.pid)))
        assert "timed" in row and "train-step" in row
        assert "RUNNING" in human.stdout.splitlines()[0]

        metrics = ControlClient.for_fifo(fifo).metrics()
        assert "aiotimer_live_timers 1.0" in metrics.splitlines()

        server.send_signal(signal.SIGUSR1)  # logs a summary; must not kill
        time.sleep(0.5)
        assert server.poll() is None
        assert aiotimer("status", "--fifo", str(fifo)).returncode == 0

        server.send_signal(signal.SIGTERM)
        assert server.wait(10) == 0
        assert server.stderr is not None
        assert "state summary (SIGUSR1)" in server.stderr.read()
    gone = aiotimer("status", "--fifo", str(fifo))
    assert gone.returncode == 3, gone.stderr
    assert aiotimer("status", "--control", str(tmp_path / "nothing.sock")).returncode == 3
    assert aiotimer("status").returncode == 4
    assert aiotimer("status", "--fifo", str(fifo), "--limit", "-1").returncode == 4


def _request_as(uid: int, path: str) -> str:
    """Fork a child that becomes ``uid`` and GETs /v1/state: what it got, as text."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.settimeout(5)
                    s.connect(path)
                    s.sendall(b"GET /v1/state HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    answer = s.recv(200).split(b"\r\n")[0].decode()
            except OSError as exc:
                answer = f"errno {exc.errno}"
            os.write(write, answer.encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        with os.fdopen(read, "rb") as f:
            return f.read().decode()
    finally:
        os.waitpid(pid, 0)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to become another user")
def test_another_user_is_refused() -> None:
    # A short, traversable base: the socket's own directory is what must protect it.
    base = Path(tempfile.mkdtemp(prefix="aiotimer-"))
    try:
        base.chmod(0o755)
        fifo, control = base / "t.fifo", base / "ctl" / "http.sock"
        with serve(fifo, "--control", str(control), "--event-log", str(base / "ev.log")):
            # The private directory (0700) and socket (0600) keep other users out...
            assert _request_as(65534, str(control)) == "errno 13"
            # ...and if someone loosens them, the peer check still refuses.
            control.parent.chmod(0o755)
            control.chmod(0o666)
            assert _request_as(65534, str(control)).startswith("HTTP/1.1 403")
            assert ControlClient(control).state().server.state == "running"
            time.sleep(0.3)  # the event log writes asynchronously
        log = [json.loads(line) for line in (base / "ev.log").read_text().splitlines()]
        refused = [e for e in log if e["event"] == "control_refused"]
        assert [e["uid"] for e in refused] == [65534]
    finally:
        for p in sorted(base.rglob("*"), reverse=True):
            p.unlink() if not p.is_dir() else p.rmdir()
        base.rmdir()


def test_statistics_survive_a_crash(tmp_path: Path) -> None:
    fifo, log = tmp_path / "t.fifo", tmp_path / "events.log"
    stats = tmp_path / "events.log.stats.json"
    with (
        serve(fifo, "--event-log", str(log), "--stats-interval", "0.2") as server,
        worker(fifo, "long", quick_blocks=25),
    ):
        deadline = time.monotonic() + 10
        while True:
            if stats.exists():
                saved = msgspec.json.decode(stats.read_bytes(), type=StatsState)
                if "quick" in saved.sites and saved.sites["quick"].sketch.count == 25:
                    break
            assert time.monotonic() < deadline, "statistics not saved within 10 s"
            time.sleep(0.05)
        server.send_signal(signal.SIGKILL)
        server.wait(10)
    saved = msgspec.json.decode(stats.read_bytes(), type=StatsState)
    assert saved.sites["quick"].sketch.count == 25
    # The next server on the same event log starts from them.
    with serve(fifo, "--event-log", str(log)):
        state = ControlClient.for_fifo(fifo).state()
    scopes = {s.site: s for s in state.scopes}
    assert scopes["quick"].count == 25
