"""Another user cannot starve or evict a worker's timers (real processes, real users).

``aiotimer serve`` with a socket open to everyone (mode 0666) and a small table
(``--max-timers 200``). A root worker (the victim) holds blocks; dozens of processes of
another user (uid 65534) fill the table over the same socket, each under the per-worker
cap. Two shapes, each of which left a hung block of the victim unwatched when the table
was shared per worker only:

* starvation: the other user's processes hold 4 timers each and fill the table; the
  victim, holding 3, opens a 4th block and hangs in it: it must get room, and be reaped;
* eviction: the victim holds 3 blocks, the oldest due soon, and hangs; the other user's
  processes, 3 timers each, overflow the table: the victim's oldest block must not be
  the one that makes room, and the victim is reaped at its deadline.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from _procs import BOUND, env, events, serving

from aiotimer.control.client import ControlClient

OTHER_USER = 65534
#: The other user's interpreter: it must be one that user may run (not one under /root).
SYSTEM_PYTHON = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
CAP = 200

pytestmark = [
    pytest.mark.process,
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run processes of another uid"),
    pytest.mark.skipif(SYSTEM_PYTHON is None, reason="needs a python3 that uid 65534 may run"),
]

# One process per size in argv[2] (comma-separated): each connects, acquires that many
# timers due in 300 s, and waits until its parent goes. The parent prints "ready" once
# every one has sent its lines.
FLOOD = r"""
import json, os, socket, sys, time
path, sizes = sys.argv[1], [int(n) for n in sys.argv[2].split(",")]
hold_r, hold_w = os.pipe()
done_r, done_w = os.pipe()
for size in sizes:
    if os.fork() == 0:
        os.close(hold_w)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.connect(path)
        for i in range(size):
            body = {"version": 1, "pid": os.getpid(), "scope_id": f"flood-{i}",
                    "expiration_time": time.time() + 300, "signal": 9,
                    "mono": time.monotonic() + 300}
            conn.send(json.dumps(body).encode() + b"\n")
        os.write(done_w, b"x")
        os.read(hold_r, 1)
        os._exit(0)
for _ in sizes:
    os.read(done_r, 1)
print("ready", flush=True)
sys.stdin.read()
"""

# The victim: blocks due after each of argv[2]'s seconds (comma-separated), then "in";
# on "go <seconds>" one more block, then "sent"; it never leaves them (it hangs).
VICTIM = r"""
import json, os, socket, sys, time
conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
conn.connect(sys.argv[1])
def block(name, after):
    body = {"version": 1, "pid": os.getpid(), "scope_id": name,
            "expiration_time": time.time() + after, "signal": 9,
            "mono": time.monotonic() + after}
    conn.send(json.dumps(body).encode() + b"\n")
for i, after in enumerate(sys.argv[2].split(",")):
    block(f"block-{i}", float(after))
print("in", flush=True)
for line in sys.stdin:
    block("next", float(line.split()[1]))
    print("sent", flush=True)
"""


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A directory the other user may traverse (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="aiotimer-quota-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def flood(sock: Path, sizes: list[int]) -> Iterator[subprocess.Popen[str]]:
    """Processes of the other user holding ``sizes`` timers each, until the block ends."""
    assert SYSTEM_PYTHON is not None
    proc = subprocess.Popen(
        [SYSTEM_PYTHON, "-c", FLOOD, str(sock), ",".join(map(str, sizes))],
        user=OTHER_USER,
        group=OTHER_USER,
        extra_groups=[],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd="/",
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=BOUND)


@contextmanager
def victim(sock: Path, afters: str) -> Iterator[subprocess.Popen[str]]:
    """A root worker holding blocks due after ``afters`` seconds (comma-separated)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", VICTIM, str(sock), afters],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env(),
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "in\n"
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=BOUND)


def wait_for_timers(fifo: Path, count: int) -> None:
    """Wait until the server holds ``count`` timers (fail after :data:`BOUND`)."""
    client = ControlClient.for_fifo(fifo)
    deadline = time.monotonic() + BOUND
    held = -1
    while time.monotonic() < deadline:
        held = client.state(limit=0).timers_total
        if held >= count:
            return
        time.sleep(0.05)
    pytest.fail(f"the server holds {held} timers, not {count}, after {BOUND} s")


@contextmanager
def server(public_dir: Path, tmp_path: Path) -> Iterator[tuple[Path, Path, Path]]:
    """``aiotimer serve`` with a 0666 socket in ``public_dir``: (fifo, socket, log)."""
    fifo, sock, log = tmp_path / "t.fifo", public_dir / "t.sock", tmp_path / "events.jsonl"
    options = ("--socket", str(sock), "--socket-mode", "0666", "--max-timers", str(CAP))
    with serving(fifo, *options, "--event-log", str(log)) as proc:
        deadline = time.monotonic() + BOUND
        while not sock.exists():
            assert time.monotonic() < deadline, "the server did not create its socket"
            time.sleep(0.01)
        yield fifo, sock, log
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(BOUND) == 0


def reaped(proc: subprocess.Popen[Any], within: float) -> bool:
    try:
        return proc.wait(within) == -signal.SIGKILL
    except subprocess.TimeoutExpired:
        return False


def test_another_users_processes_cannot_starve_a_worker_of_its_next_block(
    public_dir: Path, tmp_path: Path
) -> None:
    """49 processes x 4 timers + 1 of the other user fill the table around the victim's
    3 blocks; the victim's 4th block (due in 1.5 s) gets room and it is reaped."""
    with (
        server(public_dir, tmp_path) as (fifo, sock, log),
        victim(sock, "300,300,300") as worker,
        flood(sock, [4] * 49 + [1]),
    ):
        wait_for_timers(fifo, CAP)
        assert worker.stdin is not None and worker.stdout is not None
        worker.stdin.write("go 1.5\n")
        worker.stdin.flush()
        assert worker.stdout.readline() == "sent\n"
        assert reaped(worker, 1.5 + BOUND), "the victim's next block was refused: never reaped"
    records = events(log)
    refused = [r for r in records if r["event"] == "request_rejected" and r["pid"] == worker.pid]
    assert not refused, refused
    evicted = [r for r in records if r["event"] == "timer_evicted"]
    assert evicted and all(r["pid"] != worker.pid for r in evicted)
    assert any(r["for_pid"] == worker.pid for r in evicted)


def test_another_users_processes_cannot_evict_a_hung_workers_oldest_block(
    public_dir: Path, tmp_path: Path
) -> None:
    """The victim holds 3 blocks, the oldest due in 8 s, and hangs; 67 processes x 3
    timers of the other user overflow the table; the victim is reaped at 8 s."""
    due = 8.0
    with (
        server(public_dir, tmp_path) as (fifo, sock, log),
        victim(sock, f"{due},300,300") as worker,
    ):
        started = time.monotonic()
        with flood(sock, [3] * 67):
            wait_for_timers(fifo, CAP)
            flooded = time.monotonic() - started
            assert flooded < due - 1, f"the flood took {flooded:.1f} s: the test says nothing"
            assert reaped(worker, due + BOUND), "the victim's hung block was evicted: never reaped"
    records = events(log)
    assert all(r["pid"] != worker.pid for r in records if r["event"] == "timer_evicted")
    [reap] = [r for r in records if r["event"] == "worker_reaped" and r["pid"] == worker.pid]
    assert reap["scopes"][0] == "block-0"
