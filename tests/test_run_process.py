"""``aiotimer run`` under hostile use: a worker's forged line, SIGKILL of the supervisor
(with and without its guard), a stderr nobody reads.

Workers are tiny scripts (``WORKER``, behaviour chosen by ``TEST_MODE``). Processes are
pinned with pidfds, so a pid reused meanwhile is never taken for a worker. Tolerances:
"after 3 s" is waited for as a condition (every pinned process exited) bounded by 3 s
from the SIGKILL; other waits are bounded by 20 s.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.process, pytest.mark.timeout(60)]

WORKER = """
import json, os, subprocess, sys, time

mode = os.environ["TEST_MODE"]
if mode == "forge":  # name a process that is not ours, with a deadline 0.2 s away
    line = {"version": 1, "pid": int(os.environ["TEST_VICTIM"]), "scope_id": "forged",
            "expiration_time": time.time() + 0.2, "signal": 9}
    fd = os.open(os.environ["AIOTIMER_FIFO"], os.O_WRONLY)
    os.write(fd, json.dumps(line).encode() + b"\\n")
    os.close(fd)
elif mode == "tree":  # a grandchild in the worker's session and group
    child = subprocess.Popen(["sleep", "60"])
    with open(os.environ["TEST_PIDS"], "a") as f:
        f.write(f"{os.getpid()} {child.pid}\\n")
elif mode == "noisy":  # fills stderr, a pipe nobody reads, and blocks there
    sys.stderr.write("x" * 200_000)
time.sleep(60)
"""

BOUND = 20.0


@pytest.fixture
def worker(tmp_path: Path) -> list[str]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    return [sys.executable, str(script)]


def run(worker: list[str], mode: str, *options: str, **popen: object) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TEST_MODE": mode, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.update(popen.pop("env", {}))  # type: ignore[arg-type]
    return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-m", "aiotimer", "run", *options, "--", *worker], env=env, **popen
    )


def wait_for(test: object, what: str, timeout: float = BOUND) -> None:
    deadline = time.monotonic() + timeout
    while not test():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.02)


def test_a_forged_line_naming_another_process_is_refused(worker: list[str], tmp_path: Path) -> None:
    victim = subprocess.Popen(["sleep", "60"])  # the test's child: no descendant of the run
    log = tmp_path / "events.jsonl"
    sup = run(worker, "forge", "--event-log", str(log), stderr=subprocess.DEVNULL,
              env={"TEST_VICTIM": str(victim.pid)})  # fmt: skip
    try:

        def refused() -> list[dict[str, object]]:
            raw = log.read_bytes() if log.exists() else b""
            complete = raw[: raw.rfind(b"\n") + 1].splitlines()
            return [
                r
                for r in map(json.loads, complete)
                if r["event"] == "signal_refused" and r["pid"] == victim.pid
            ]

        wait_for(refused, "the forged acquire's deadline was refused")
        assert "not a descendant of the server" in str(refused()[0]["reason"])
        assert victim.poll() is None, "the unrelated process was not signalled"
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(timeout=BOUND) == 128 + signal.SIGTERM
    finally:
        sup.kill()
        sup.wait()
        victim.kill()
        victim.wait()


def test_sigterm_ends_run_though_nobody_reads_its_stderr(worker: list[str]) -> None:
    r, w = os.pipe()
    try:
        sup = run(worker, "noisy", "--nproc", "2", "--stop-timeout", "1", stderr=w)
        os.close(w)
        w = -1
        # The workers' 400 KB cannot all go into the 64 KiB pipe: it is full.
        wait_for(lambda: _pipe_full(r), "stderr filled")
        sup.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert sup.wait(timeout=BOUND) == 128 + signal.SIGTERM
        assert time.monotonic() - signalled < 10
    finally:
        if w >= 0:
            os.close(w)
        os.close(r)


def _pipe_full(fd: int) -> bool:
    """More than 60,000 bytes wait in the pipe (it holds 65,536)."""
    buf = bytearray(4)
    fcntl.ioctl(fd, termios.FIONREAD, buf)
    return int.from_bytes(buf, sys.byteorder) >= 60_000
