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
import re
import select
import signal
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
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


def running(pidfds: list[int]) -> int:
    return len(pidfds) - len(select.select(pidfds, [], [], 0)[0])


def group_members(groups: set[int]) -> list[int]:
    """Live processes whose process group or session is one of ``groups``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] not in (b"Z", b"X") and {int(fields[2]), int(fields[3])} & groups:
            found.append(int(name))
    return found


@pytest.fixture
def pinned() -> Iterator[list[int]]:
    fds: list[int] = []
    yield fds
    for fd in fds:
        if running([fd]):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        os.close(fd)


def tree(
    tmp_path: Path,
    worker: list[str],
    pinned: list[int],
    stderr: int = subprocess.PIPE,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], list[int]]:
    """``aiotimer run --nproc 2`` in tree mode, once both workers wrote their pids: the
    run, and the workers' pids (each worker's, then its grandchild's), all pinned."""
    pids_file = tmp_path / "pids"
    env = {**(env or {}), "TEST_PIDS": str(pids_file)}
    sup = run(worker, "tree", "--nproc", "2", stderr=stderr, env=env)
    wait_for(
        lambda: pids_file.exists() and len(pids_file.read_text().splitlines()) == 2,
        "both workers started their grandchildren",
    )
    pids = [int(p) for p in pids_file.read_text().split()]
    pinned.extend(os.pidfd_open(p) for p in pids)
    return sup, pids


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


def test_sigkill_of_run_leaves_no_worker_nor_process_of_their_groups(
    worker: list[str], tmp_path: Path, pinned: list[int]
) -> None:
    sup, pids = tree(tmp_path, worker, pinned)
    workers = set(pids[0::2])
    sup.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    while running(pinned) or group_members(workers):
        assert time.monotonic() - killed_at < 3.0, (
            f"3 s after SIGKILL: {running(pinned)} of the workers and grandchildren run, "
            f"group members {group_members(workers)}"
        )
        time.sleep(0.02)
    _, err = sup.communicate(timeout=BOUND)
    # The grandchildren at least (no parent-death signal reaches them); a worker too if
    # the guard looked before that worker's own parent-death signal took it.
    stopped = re.search(rb"died without stopping its workers; stopped (\d+) process", err)
    assert stopped is not None, err
    assert 2 <= int(stopped[1]) <= 4


def test_the_next_run_stops_what_a_run_killed_with_its_guard_left(
    worker: list[str], tmp_path: Path, pinned: list[int]
) -> None:
    # Run files of their own: another test's run would sweep the dead run first.
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    private = {"XDG_RUNTIME_DIR": str(runtime)}
    # stderr: the grandchildren that survive hold a pipe open
    sup, _ = tree(tmp_path, worker, pinned, stderr=subprocess.DEVNULL, env=private)
    argv = Path(f"/proc/{sup.pid}/cmdline").read_bytes()
    (guard,) = [
        int(name)
        for name in os.listdir("/proc")
        if name.isdigit() and int(name) != sup.pid and _cmdline(name) == argv
    ]  # a fork of the run: the same command line
    os.kill(guard, signal.SIGKILL)
    sup.send_signal(signal.SIGKILL)
    sup.wait(timeout=BOUND)
    wait_for(lambda: running(pinned[0::2]) == 0, "the workers died with their supervisor")
    assert running(pinned[1::2]) == 2, "nobody stopped the grandchildren"
    nxt = subprocess.run(
        [sys.executable, "-m", "aiotimer", "run", "--", "true"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **private},
        capture_output=True,
        timeout=BOUND,
        check=False,
    )
    assert nxt.returncode == 0, nxt.stderr
    assert b"stopped 2 process(es) left by the run of supervisor" in nxt.stderr
    wait_for(lambda: running(pinned) == 0, "the next run stopped the grandchildren", 5)


def _cmdline(pid: str) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


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
