"""Issue 5 "done when", with real processes: the real server (FIFO + SignalReaper), real
workers (written to ``tmp_path``, started with ``sys.executable``) sending torch-format
lines, real signals.

Tolerances are generous (2 busy cores, shared): deadlines and graces are short (tenths of
a second) and every wait is bounded by seconds; the assertions are about *what* happened
and in which order, and about lower bounds (a SIGKILL never comes before the grace ends),
never about how fast.
"""

from __future__ import annotations

import array
import fcntl
import json
import os
import signal
import subprocess
import sys
import termios
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

import _lines
import anyio
import pytest

from aiotimer import diagnostics
from aiotimer._edges.procfs import read_start_time
from aiotimer.core._stats import SUGGESTION_SAMPLES
from aiotimer.errors import ProcessGoneError
from aiotimer.events import (
    Event,
    ReapAbandoned,
    SignalRefused,
    SignalSent,
    StacksDumped,
    TimerExpired,
    WorkerExited,
    WorkerReaped,
    WorkerSurvived,
)
from aiotimer.reapers import NoDump, SignalReaper
from aiotimer.reapers._identity import PinnedProcess
from aiotimer.reapers._policy import Escalation, ReapPolicy
from aiotimer.server import TimerServer
from aiotimer.sources.fifo import READ_INTERVAL

pytestmark = [pytest.mark.process, pytest.mark.timeout(30)]

REPO = Path(__file__).resolve().parent.parent
E = TypeVar("E", bound=Event)
KILL, TERM = int(signal.SIGKILL), int(signal.SIGTERM)
#: The bound on every wait for something that should happen within a fraction of a second.
BOUND = 15.0

# Shared by every worker: torch's FileTimerClient way of writing (open, one write, close),
# plus aiotimer's extension keys when given.
PRELUDE = r"""
import asyncio, json, os, signal, subprocess, sys, threading, time
FIFO = sys.argv[1]
def send(scope, after, sig=9, **ext):
    expiration = -1 if after is None else time.time() + after
    line = json.dumps({"version": 1, "pid": os.getpid(), "scope_id": scope,
                       "expiration_time": expiration, "signal": sig, **ext}) + "\n"
    fd = os.open(FIFO, os.O_WRONLY)
    os.write(fd, line.encode())
    os.close(fd)
def say(*words):
    print(*words, flush=True)
"""


def start(tmp_path: Path, fifo: Path, body: str, *args: str) -> subprocess.Popen[str]:
    script = tmp_path / "worker.py"
    script.write_text(PRELUDE + body)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, str(script), str(fifo), *args]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)


def read_line(proc: subprocess.Popen[str], timeout: float = BOUND) -> str:
    return _lines.read_line(proc, timeout)


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=BOUND)
    if proc.stdout is not None:
        proc.stdout.close()


async def wait_exit(proc: subprocess.Popen[str], timeout: float = BOUND) -> int | None:
    """Poll (the test only) until ``proc`` exits; its return code, or None."""
    with anyio.move_on_after(timeout):
        while proc.poll() is None:
            await anyio.sleep(0.01)
    return proc.returncode


def of(events: list[Event], kind: type[E]) -> list[E]:
    return [e for e in events if isinstance(e, kind)]


async def wait_for(events: list[Event], kind: type[E], count: int = 1) -> list[E]:
    with anyio.fail_after(BOUND):
        while len(of(events, kind)) < count:
            await anyio.sleep(0.01)
    return of(events, kind)


def gone(pid: int) -> bool:
    """True if ``pid`` does not exist or has exited (a zombie nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in (b"Z", b"X")


@asynccontextmanager
async def serving(
    tmp_path: Path, policy: ReapPolicy, **kwargs: Any
) -> AsyncIterator[tuple[TimerServer, Path, list[Event]]]:
    events: list[Event] = []
    fifo = tmp_path / "timer.fifo"
    server = TimerServer(fifo=fifo, policy=policy, on_event=events.append, **kwargs)
    async with server:
        yield server, fifo, events


# -- SIGTERM, grace, SIGKILL --------------------------------------------------------------

STUBBORN = r"""
signal.signal(signal.SIGTERM, lambda *_: say("got SIGTERM, carrying on"))
send("stubborn", 0.3)
say("ready")
while True:
    time.sleep(1)
"""


@pytest.mark.asyncio
async def test_a_worker_ignoring_sigterm_is_killed_with_sigkill_after_the_grace(
    tmp_path: Path,
) -> None:
    grace = 0.8
    async with serving(tmp_path, ReapPolicy(Escalation(grace=grace))) as (_, fifo, events):
        worker = start(tmp_path, fifo, STUBBORN)
        try:
            assert read_line(worker) == "ready"
            assert await wait_exit(worker) == -KILL
            assert read_line(worker) == "got SIGTERM, carrying on"
        finally:
            stop(worker)
        [kill] = await wait_for(events, WorkerReaped)
        [term] = of(events, SignalSent)  # the soft step is sent, not reported as a reap
    assert [(e.pid, e.signal, e.step, e.steps) for e in (term, kill)] == [
        (worker.pid, TERM, 1, 2),
        (worker.pid, KILL, 2, 2),
    ]
    assert kill.time - term.time >= grace - 0.05  # never before the grace is over
    [expired] = of(events, TimerExpired)
    assert expired.action == "SIGTERM -> wait 0.8s -> SIGKILL"


# -- process groups -------------------------------------------------------------------------

FAMILY = r"""
os.setsid()  # the worker leads its own session and process group
kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        for _ in range(2)]
say(*(k.pid for k in kids))
send("family", 0.3, group=True)
time.sleep(60)
"""


@pytest.mark.asyncio
async def test_a_group_kill_takes_the_grandchildren_too(tmp_path: Path) -> None:
    async with serving(tmp_path, ReapPolicy()) as (_, fifo, events):
        worker = start(tmp_path, fifo, FAMILY)
        grandchildren = [int(pid) for pid in read_line(worker).split()]
        try:
            assert await wait_exit(worker) == -KILL
            with anyio.fail_after(BOUND):
                while not all(map(gone, grandchildren)):
                    await anyio.sleep(0.01)
        finally:
            stop(worker)
            for pid in grandchildren:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        [reaped] = await wait_for(events, WorkerReaped)
    assert (reaped.pid, reaped.signal, reaped.group) == (worker.pid, KILL, True)


IN_OUR_GROUP = r"""
send("sibling", 0.2, group=True)
say("ready")
time.sleep(60)
"""


@pytest.mark.asyncio
async def test_a_group_kill_in_the_servers_own_group_kills_the_worker_by_pid(
    tmp_path: Path,
) -> None:
    """`aiotimer serve ... &` then `python worker.py`: the worker shares the server's
    group. The group signal is refused (it would take the server), and the worker alone
    is killed instead, reported as such; the server (this process) lives on."""
    async with serving(tmp_path, ReapPolicy()) as (_, fifo, events):
        worker = start(tmp_path, fifo, IN_OUR_GROUP)  # shares the server's process group
        try:
            assert os.getpgid(worker.pid) == os.getpgrp()
            assert read_line(worker) == "ready"
            assert await wait_exit(worker) == -KILL
        finally:
            stop(worker)
        [reaped] = await wait_for(events, WorkerReaped)
    assert (reaped.pid, reaped.signal, reaped.group) == (worker.pid, KILL, False)
    [refused] = of(events, SignalRefused)
    assert (refused.pid, refused.group, refused.fallback) == (worker.pid, True, "pid")
    assert "server's own group" in refused.reason
    assert of(events, ReapAbandoned) == []


# -- stack dumps ----------------------------------------------------------------------------

STUCK = r"""
from aiotimer.diagnostics import install_dump_handler
install_dump_handler(dump_dir=sys.argv[2])

def blocking_io():
    time.sleep(60)

async def wait_for_work():
    await asyncio.Event().wait()

async def main():
    threading.Thread(target=blocking_io, name="io", daemon=True).start()
    send("stuck", 0.5, dump=True)
    asyncio.get_running_loop().call_soon(say, "ready")  # runs once main is parked
    await wait_for_work()

asyncio.run(main())
"""


@pytest.mark.asyncio
async def test_the_dump_of_a_stuck_asyncio_worker_reaches_the_reaped_event(
    tmp_path: Path,
) -> None:
    log = tmp_path / "events.jsonl"
    policy = ReapPolicy(Escalation(dump_timeout=10.0, soft_signal=None))
    reaper = SignalReaper(dump_dir=tmp_path, py_spy=False)
    async with serving(tmp_path, policy, reaper=reaper, event_log=log) as (_, fifo, events):
        worker = start(tmp_path, fifo, STUCK, str(tmp_path))
        try:
            assert read_line(worker) == "ready"
            assert await wait_exit(worker) == -KILL
        finally:
            stop(worker)
        [dumped] = await wait_for(events, StacksDumped)
        [reaped] = await wait_for(events, WorkerReaped)
    text = dumped.text
    assert text is not None
    threads, tasks = text.split("=== aiotimer asyncio tasks", 1)
    assert "Current thread" in threads and "in blocking_io" in threads  # every thread
    assert "main at " in tasks and "wait_for_work at " in tasks  # the await chain
    assert text.rstrip().endswith(diagnostics.END_MARKER)
    assert (reaped.signal, reaped.step, reaped.steps, reaped.stacks) == (KILL, 2, 2, text)
    [logged] = [
        rec
        for rec in map(json.loads, log.read_text().splitlines())
        if rec["event"] == "worker_reaped"
    ]
    assert logged["stacks"] == text


NO_HOOK = r"""
def spinning_in_plain_python():
    send("plain", 0.3, dump=True)
    say("ready")
    while True:
        time.sleep(0.01)

spinning_in_plain_python()
"""


@pytest.mark.skipif(diagnostics.py_spy_executable() is None, reason="py-spy is not installed")
@pytest.mark.asyncio
async def test_a_worker_without_the_hook_is_dumped_by_py_spy_never_by_signal(
    tmp_path: Path,
) -> None:
    policy = ReapPolicy(Escalation(dump=True, dump_timeout=10.0, soft_signal=None))
    reaper = SignalReaper(dump_dir=tmp_path)
    async with serving(tmp_path, policy, reaper=reaper) as (_, fifo, events):
        worker = start(tmp_path, fifo, NO_HOOK)
        try:
            assert read_line(worker) == "ready"
            status = await wait_exit(worker)
        finally:
            stop(worker)
        [dumped] = await wait_for(events, StacksDumped)
    assert status == -KILL  # SIGUSR1 (no hook) would have killed it with -SIGUSR1
    assert dumped.text is not None and "spinning_in_plain_python" in dumped.text


@pytest.mark.asyncio
async def test_a_reap_without_a_dump_says_why(tmp_path: Path) -> None:
    """No hook in the worker and the py-spy fallback off: the kill still happens and the
    ``stacks_dumped`` event names both reasons."""
    policy = ReapPolicy(Escalation(dump=True, dump_timeout=2.0, soft_signal=None))
    reaper = SignalReaper(dump_dir=tmp_path, py_spy=False)
    async with serving(tmp_path, policy, reaper=reaper) as (_, fifo, events):
        worker = start(tmp_path, fifo, NO_HOOK)
        try:
            assert read_line(worker) == "ready"
            assert await wait_exit(worker) == -KILL
        finally:
            stop(worker)
        [dumped] = await wait_for(events, StacksDumped)
    assert dumped.text is None and dumped.reason is not None
    assert "no dump hook in the worker" in dumped.reason
    assert "install_dump_handler" in dumped.reason
    assert "py-spy fallback is off" in dumped.reason
    assert dumped.reason in dumped.describe()


ZERO_SETUP = r"""
os.environ["AIOTIMER_FIFO"] = FIFO
os.environ.pop("AIOTIMER_DUMP_HOOK", None)
from aiotimer import expires

def stuck_without_any_setup():
    with expires(after=0.3):
        say("ready")
        time.sleep(60)

stuck_without_any_setup()
"""


@pytest.mark.asyncio
async def test_a_worker_found_through_the_environment_has_the_dump_hook(
    tmp_path: Path,
) -> None:
    """No configure(), no install_dump_handler(): the first block (in the main thread)
    installs the hook, so the dump comes from the worker itself (py-spy is off)."""
    policy = ReapPolicy(Escalation(dump=True, dump_timeout=10.0, soft_signal=None))
    reaper = SignalReaper(dump_dir=tmp_path, py_spy=False)
    async with serving(tmp_path, policy, reaper=reaper) as (_, fifo, events):
        worker = start(
            tmp_path, fifo, f"os.environ['AIOTIMER_DUMP_DIR'] = {str(tmp_path)!r}\n" + ZERO_SETUP
        )
        try:
            assert read_line(worker) == "ready"
            assert await wait_exit(worker) == -KILL
        finally:
            stop(worker)
        [dumped] = await wait_for(events, StacksDumped)
    assert dumped.text is not None, dumped.reason
    assert "stuck_without_any_setup" in dumped.text


# -- exits on its own -------------------------------------------------------------------------

LEAVES = r"""
received = []
for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, lambda n, _: received.append(n))
send("short-lived", 0.6, grace=0.2, dump=True)
time.sleep(0.1)
say("signals received:", received)
"""


@pytest.mark.asyncio
async def test_a_worker_that_exits_on_its_own_is_never_signalled(tmp_path: Path) -> None:
    policy = ReapPolicy(Escalation(dump=True, grace=0.2, group=True))
    async with serving(tmp_path, policy) as (server, fifo, events):
        worker = start(tmp_path, fifo, LEAVES)
        try:
            assert read_line(worker) == "signals received: []"
            past_due = time.monotonic() + 0.6 + 0.3  # its deadline passed by then
            assert await wait_exit(worker) == 0
        finally:
            stop(worker)
        [exited] = await wait_for(events, WorkerExited)
        assert (exited.pid, exited.cleared, exited.reason) == (
            worker.pid,
            ("short-lived",),
            "exited",
        )
        await anyio.sleep(max(0.0, past_due - time.monotonic()))
        counters = server.get_state().counters
    assert (counters.expired, counters.reaped, counters.reap_failed) == (0, 0, 0)
    assert [e.kind for e in events if e.kind not in {"server_started", "server_stopped"}] == [
        "worker_exited"
    ]


# -- shadow mode (through the CLI) --------------------------------------------------------------

SHADOWED = r"""
for n, (timeout, duration) in enumerate([(0.5, 0.05), (0.5, 0.05), (0.2, 0.6)], 1):
    scope = f"job.py:7#{n}"  # the shape of a default scope id: site job.py:7
    send(scope, timeout)
    time.sleep(duration)
    send(scope, None, 0)
say("done")
"""


@contextmanager
def cli_server(tmp_path: Path, *options: str) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    fifo = tmp_path / "cli.fifo"
    argv = [sys.executable, "-m", "aiotimer", "serve", "--fifo", str(fifo), *options]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    server = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        deadline = time.monotonic() + BOUND
        while not fifo.exists():
            assert server.poll() is None, server.communicate()
            assert time.monotonic() < deadline, "the server did not create its FIFO"
            time.sleep(0.02)
        yield server, fifo
    finally:
        if server.poll() is None:
            server.kill()
        server.communicate()


def wait_drained(fifo: Path) -> None:
    """Return once the FIFO holds no unread bytes (then give the server a moment)."""
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a second reader that never reads
    try:
        deadline = time.monotonic() + BOUND
        unread = array.array("i", [1])
        while unread[0]:
            assert time.monotonic() < deadline, "the server did not read its FIFO"
            fcntl.ioctl(fd, termios.FIONREAD, unread)
            time.sleep(0.02)
    finally:
        os.close(fd)
    time.sleep(0.1)


@pytest.mark.timeout(40)
def test_shadow_mode_signals_nothing_and_reports_the_would_be_kill_and_statistics(
    tmp_path: Path,
) -> None:
    log = tmp_path / "events.jsonl"
    options = ["--shadow", "--grace", "1", "--event-log", str(log), "--loop", "asyncio"]
    with cli_server(tmp_path, *options) as (server, fifo):
        worker = start(tmp_path, fifo, SHADOWED)
        try:
            assert read_line(worker) == "done"
            assert worker.wait(timeout=BOUND) == 0
        finally:
            stop(worker)
        wait_drained(fifo)  # the last release has no ack: wait until the server read it
        server.send_signal(signal.SIGINT)
        out, err = server.communicate(timeout=BOUND)
    assert server.returncode == 0, err
    records = [json.loads(line) for line in log.read_text().splitlines()]
    kinds = [rec["event"] for rec in records]
    assert "worker_reaped" not in kinds and "stacks_dumped" not in kinds
    [expired] = [rec for rec in records if rec["event"] == "timer_expired"]
    assert expired["scope_id"] == "job.py:7#3" and expired["report_only"]
    assert expired["action"] == "nothing (shadow mode); would do: SIGTERM -> wait 1s -> SIGKILL"
    [site] = records[-1]["scopes"]
    assert (site["site"], site["count"], site["expirations"]) == ("job.py:7", 3, 1)
    # The overrunning 0.6 s block, measured at its late release: less the difference of
    # the two lines' transit to the server: a few ms under load, plus up to one read
    # interval when its acquire came in a trickle (aiotimer.sources._trickle).
    assert site["max"] >= 0.58 - READ_INTERVAL
    # The block that expired is reported as long as it really ran (not the 0.2 s it had
    # run when it expired), and no timeout is suggested from 3 durations.
    assert site["longest_expired"] == site["max"]
    assert site["suggested_timeout"] is None
    header, row, longest, legend = out.splitlines()
    assert header.startswith("site") and header.split()[-1] == "suggested"
    assert row.split()[:2] == ["job.py:7", "3"] and row.split()[5] == "1"
    assert row.split()[6] == row.split()[4] and row.split()[7] == "-"  # longest = max
    assert longest.startswith("longest: ")
    assert f"from {SUGGESTION_SAMPLES} durations or more ('-': fewer)" in legend


# -- a replaced process is never signalled ----------------------------------------------------

HOOKED_SLEEPER = r"""
from aiotimer.diagnostics import install_dump_handler
install_dump_handler(dump_dir=sys.argv[2])
say("ready")
time.sleep(60)
"""


def spawn_with_pid(
    pid: int, make: Callable[[], subprocess.Popen[str]], attempts: int = 50
) -> subprocess.Popen[str] | None:
    """Start ``make()`` so that it gets ``pid`` (root: via ``ns_last_pid``), or ``None``.

    Other processes on the machine may take the pid first; each miss is killed and the
    attempt repeated.
    """
    for _ in range(attempts):
        try:
            Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        except OSError:
            return None
        proc = make()
        if proc.pid == pid:
            return proc
        stop(proc)
    return None


@pytest.mark.timeout(40)
def test_a_pid_whose_process_was_replaced_is_never_signalled(tmp_path: Path) -> None:
    reaper = SignalReaper(dump_dir=tmp_path, py_spy=False)
    first = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], text=True)
    pid = first.pid
    assert reaper.attach(pid)
    start_time = read_start_time(pid)
    first.kill()
    first.wait()  # reaped: the pid is free for the kernel to hand out again
    # Start times count clock ticks (10 ms): a successor started within the same tick would
    # look identical to the start-time check (not to the pidfd), so let a few ticks pass.
    time.sleep(0.05)
    successor = spawn_with_pid(
        pid, lambda: start(tmp_path, tmp_path / "no.fifo", HOOKED_SLEEPER, str(tmp_path))
    )
    if successor is None:
        reaper.close()
        pytest.skip("cannot make the kernel reuse a pid here (needs root and ns_last_pid)")
    try:
        assert read_line(successor) == "ready"
        assert read_start_time(pid) != start_time  # a different process, same pid

        async def attempts() -> str | NoDump:
            with pytest.raises(ProcessGoneError):
                reaper.signal(pid, KILL)  # the pidfd still names the first process
            with pytest.raises(ProcessGoneError):
                reaper.signal(pid, KILL, group=True)
            return await reaper.dump_stacks(pid, 1.0)

        assert anyio.run(attempts) == NoDump("the worker has exited")
        # The start-time identity (the path without pidfds) refuses it just the same.
        with (
            PinnedProcess(pid, start_time) as stale,
            pytest.raises(ProcessGoneError),
        ):
            stale.send_signal(KILL)
        time.sleep(0.2)
        assert successor.poll() is None
        dump_file = diagnostics.dump_path_for(pid, tmp_path).read_text()
        assert "Current thread" not in dump_file  # not even asked for a dump
    finally:
        reaper.close()
        stop(successor)


# -- a worker that survives the last step ---------------------------------------------------

SURVIVOR = r"""
signal.signal(signal.SIGTERM, signal.SIG_IGN)
send("survivor", 0.2, sig=15)  # a torch client asking for SIGTERM only
say("ready")
time.sleep(60)
"""


@pytest.mark.asyncio
async def test_a_worker_surviving_the_last_signal_is_reported_and_kept_under_watch(
    tmp_path: Path,
) -> None:
    policy = ReapPolicy(unkillable_after=0.5)
    async with serving(tmp_path, policy) as (server, fifo, events):
        worker = start(tmp_path, fifo, SURVIVOR)
        try:
            assert read_line(worker) == "ready"
            [survived] = await wait_for(events, WorkerSurvived)
            assert (survived.pid, survived.signal, survived.unkillable) == (
                worker.pid,
                TERM,
                False,
            )
            [reaped] = of(events, WorkerReaped)
            assert survived.time - reaped.time >= 0.5 - 0.05
            assert worker.poll() is None
            assert server.get_state().workers == (worker.pid,)
            os.kill(worker.pid, signal.SIGKILL)  # it finally dies, much later
            [exited] = await wait_for(events, WorkerExited)
        finally:
            stop(worker)
    assert (exited.pid, exited.reason) == (worker.pid, "exited")
