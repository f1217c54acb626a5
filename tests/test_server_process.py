"""TimerServer with real FIFOs, real worker processes and real signals.

"On time" means the server's signal left within ``LATE`` seconds after the deadline, as
the :class:`~aiotimer.events.WorkerReaped` event's timestamp (taken right after the
signal) shows: ~1 ms unloaded, so the bound only absorbs scheduling noise on a small,
shared machine; any return to polling (torch polls every second or more) fails it.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.queues
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from aiotimer.events import Event, RequestRejected, WorkerExited, WorkerReaped
from aiotimer.server import TimerServer

pytestmark = [pytest.mark.process, pytest.mark.timeout(30)]

#: How late after its deadline a signal may leave and still count as "on time".
LATE = 0.5

# A worker written the way torch's FileTimerClient writes: open, one write, close.
WORKER = r"""
import json, os, sys, time
fifo = sys.argv[1]
after, release_after, sleep = map(float, sys.argv[2:5])
def send(expiration, sig):
    line = json.dumps({"version": 1, "pid": os.getpid(), "scope_id": "work.py#3",
                       "expiration_time": expiration, "signal": sig}) + "\n"
    fd = os.open(fifo, os.O_WRONLY)
    os.write(fd, line.encode())
    os.close(fd)
send(time.time() + after, 9)
print(time.time() + after, flush=True)
if release_after >= 0:
    time.sleep(release_after)
    send(-1, 0)
time.sleep(sleep)
"""


def spawn(
    fifo: Path, after: float, *, release_after: float = -1, sleep: float = 30.0
) -> subprocess.Popen[str]:
    argv = [sys.executable, "-c", WORKER, str(fifo), str(after), str(release_after), str(sleep)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)


async def wait_for_exit(child: subprocess.Popen[Any], timeout: float) -> int | None:
    """Poll (in the test only) until ``child`` exits; its return code, or None."""
    with anyio.move_on_after(timeout):
        while child.poll() is None:
            await anyio.sleep(0.01)
    return child.returncode


async def wait_for(
    events: list[Event], kind: type[Event], count: int = 1, timeout: float = 10.0
) -> None:
    with anyio.fail_after(timeout):
        while sum(isinstance(e, kind) for e in events) < count:
            await anyio.sleep(0.01)


@asynccontextmanager
async def serving(tmp_path: Path) -> AsyncIterator[tuple[TimerServer, Path, list[Event]]]:
    events: list[Event] = []
    fifo = tmp_path / "timer.fifo"
    async with TimerServer(fifo=fifo, on_event=events.append) as server:
        yield server, fifo, events


def _cleanup(child: subprocess.Popen[str]) -> None:
    if child.poll() is None:
        child.kill()
    child.wait()
    assert child.stdout is not None
    child.stdout.close()


@pytest.mark.asyncio
async def test_worker_killed_shortly_after_its_deadline(tmp_path: Path) -> None:
    async with serving(tmp_path) as (_server, fifo, events):
        child = spawn(fifo, after=0.5)
        try:
            assert child.stdout is not None
            deadline = float(child.stdout.readline())
            status = await wait_for_exit(child, timeout=10)
            killed_at = time.time()
        finally:
            _cleanup(child)
        assert status == -signal.SIGKILL
        assert deadline - 0.05 <= killed_at
        await wait_for(events, WorkerReaped)
        [reaped] = [e for e in events if isinstance(e, WorkerReaped)]
        assert (reaped.pid, reaped.scopes) == (child.pid, ("work.py#3",))
        assert deadline - 0.05 <= reaped.time <= deadline + LATE


@pytest.mark.asyncio
async def test_worker_that_releases_in_time_is_not_killed(tmp_path: Path) -> None:
    async with serving(tmp_path) as (_server, fifo, events):
        child = spawn(fifo, after=0.5, release_after=0.05, sleep=1.0)
        try:
            status = await wait_for_exit(child, timeout=10)
        finally:
            _cleanup(child)
        assert status == 0
        assert not any(isinstance(e, WorkerReaped) for e in events)


@pytest.mark.asyncio
async def test_malformed_lines_interleaved_with_valid_ones(tmp_path: Path) -> None:
    async with serving(tmp_path) as (server, fifo, events):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            wall = time.time() + 60
            good = [
                f'{{"version": 1, "pid": {child.pid}, "scope_id": "{s}", '
                f'"expiration_time": {wall}, "signal": 9}}'
                for s in "abc"
            ]
            bad = ["not json", '{"pid": "x"}', f'{{"pid": {child.pid}, "scope_id": ""}}']
            lines = [good[0], bad[0], bad[1], good[1], bad[2], good[2]]
            fd = os.open(fifo, os.O_WRONLY)
            try:
                os.write(fd, ("\n".join(lines) + "\n").encode())
            finally:
                os.close(fd)
            await wait_for(events, RequestRejected, count=3)
            with anyio.fail_after(10):
                while len(server.get_state().timers) < 3:
                    await anyio.sleep(0.01)
            assert sorted(t.scope_id for t in server.get_state().timers) == ["a", "b", "c"]
            assert sum(isinstance(e, RequestRejected) for e in events) == 3
        finally:
            child.kill()
            child.wait()


@pytest.mark.asyncio
async def test_writer_stalled_mid_line_does_not_delay_other_expiries(tmp_path: Path) -> None:
    async with serving(tmp_path) as (_server, fifo, events):
        stalled = os.open(fifo, os.O_WRONLY)
        try:
            os.write(stalled, b'{"version": 1, "pid": 4242, "scope_')  # and holds the pipe
            child = spawn(fifo, after=0.5)
            try:
                assert child.stdout is not None
                deadline = float(child.stdout.readline())
                status = await wait_for_exit(child, timeout=10)
            finally:
                _cleanup(child)
            assert status == -signal.SIGKILL
            await wait_for(events, WorkerReaped)
            [reaped] = [e for e in events if isinstance(e, WorkerReaped)]
            assert reaped.time <= deadline + LATE
        finally:
            os.close(stalled)


@pytest.mark.asyncio
async def test_worker_exit_clears_its_timers_without_any_signal(tmp_path: Path) -> None:
    async with serving(tmp_path) as (server, fifo, events):
        child = spawn(fifo, after=60, sleep=0.2)
        try:
            status = await wait_for_exit(child, timeout=10)
        finally:
            _cleanup(child)
        assert status == 0
        await wait_for(events, WorkerExited)
        [exited] = [e for e in events if isinstance(e, WorkerExited)]
        assert (exited.pid, exited.cleared, exited.reason) == (child.pid, ("work.py#3",), "exited")
        assert server.get_state().timers == ()
        assert server.get_state().counters.reaped == 0
        assert not any(isinstance(e, WorkerReaped) for e in events)


@pytest.mark.asyncio
async def test_stop_is_prompt_with_no_client_ever_connected(tmp_path: Path) -> None:
    server = TimerServer(fifo=tmp_path / "idle.fifo")
    await server.start()
    assert (tmp_path / "idle.fifo").exists()
    started = time.monotonic()
    with anyio.fail_after(5):
        await server.aclose()
    assert time.monotonic() - started < 2.0
    assert not (tmp_path / "idle.fifo").exists()
    assert server.get_state().counters.wakeups == 0


@dataclass
class TorchShapedRequest:
    """The shape of torch's ``TimerRequest`` (what ``LocalTimerClient`` puts on its queue)."""

    worker_id: int
    scope_id: str
    expiration_time: float


@pytest.mark.asyncio
async def test_queue_source_reaps_a_worker_on_time() -> None:
    queue: multiprocessing.queues.Queue[object] = multiprocessing.get_context("spawn").Queue()
    events: list[Event] = []
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        async with TimerServer(queue=queue, on_event=events.append) as server:
            assert server.get_state().sources == ("mpqueue",)
            deadline = time.time() + 0.3
            queue.put(TorchShapedRequest(child.pid, "queued", deadline))
            status = await wait_for_exit(child, timeout=10)
            assert status == -signal.SIGKILL
            await wait_for(events, WorkerReaped)
            [reaped] = [e for e in events if isinstance(e, WorkerReaped)]
            assert deadline <= reaped.time <= deadline + LATE
    finally:
        child.kill()
        child.wait()
        queue.close()
        queue.join_thread()
