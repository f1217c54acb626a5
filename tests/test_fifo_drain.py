"""Before an expiry, a server reading a real FIFO applies what the pipe holds for the
due workers, and nothing more: a flood of other workers' lines, before or after theirs,
is left to the reader, in order, so it never delays the reap.

The loop is stalled on purpose: the test writes to the pipe and moves the (fake) clock
without awaiting, so the FIFO's reader task cannot run, then hands the server one
request of its own, which makes it handle the deadline that fell meanwhile right there.
What the server did is then read off its counters: how many requests it had applied
when it acted on the expiry. Every test runs twice: with the drain seeing the pipe's
contents through a copy (``tee(2)``, the lines it does not need stay in the pipe) and
with the drain reading them into the reader's backlog (where ``tee`` is missing).
"""

from __future__ import annotations

import array
import fcntl
import gc
import os
import pathlib
import termios
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import pytest
from _pids import fake_pid

from aiotimer import TimerServer
from aiotimer.events import Event, TimerExpired
from aiotimer.server import _drains
from aiotimer.sources import _fifo_reader
from aiotimer.sources.fifo import FifoSource
from aiotimer.testing import FakeClock, RecordingReaper, RecordingSink, settle
from aiotimer.wire import Request, encode

pytestmark = [pytest.mark.process, pytest.mark.timeout(30)]

KILL = 9
# Made-up workers (see tests/_pids.py), with digits that no flood line holds.
DUE, OTHER_DUE, LATE = fake_pid(4242), fake_pid(4343), fake_pid(4444)


@pytest.fixture(autouse=True, params=["tee", "read"])
def peeking(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """``True``: the drain peeks through ``tee(2)``; ``False``: it reads the pipe."""
    if request.param == "read":
        monkeypatch.setattr(_fifo_reader, "open_peek", lambda fd: None)
        return False
    return True


@pytest.fixture(autouse=True)
def one_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests check what the server had applied when it acted, so each decision
    is taken in one turn of the loop: on a loaded machine the CPU time of the first
    pass (a copy and a scan of a pipe-full) may pass the slice a turn allows, and the
    decision would then go on in later turns, with the reader running in between."""
    monkeypatch.setattr(_drains, "DRAIN_SLICE", 10.0)


@dataclass
class Rig:
    server: TimerServer
    clock: FakeClock
    reaper: RecordingReaper
    events: list[Event]
    fd: int  # a non-blocking write descriptor on the FIFO
    capacity: int  # the pipe's capacity

    def requests(self) -> int:
        return self.server.get_state().counters.requests

    def in_pipe(self) -> int:
        """Bytes the pipe holds (not read by the server)."""
        count = array.array("i", [0])
        fcntl.ioctl(self.fd, termios.FIONREAD, count)
        return count[0]

    def write(self, data: bytes) -> None:
        """Write ``data`` in pipe-atomic pieces of whole lines (never blocks)."""
        view = memoryview(data)
        while view:
            piece = bytes(view[:4096])
            piece = piece[: piece.rfind(b"\n") + 1]
            assert os.write(self.fd, piece) == len(piece)
            view = view[len(piece) :]

    def stall_until(self, deadline: float) -> None:
        """Move the clock to ``deadline`` and make the server handle it at once, with
        the FIFO's reader task never run meanwhile (a stalled loop)."""
        self.clock.advance(deadline - self.clock.monotonic())
        self.server.submit(Request(fake_pid(1_000_000), "tick", -1, 0))  # an unrelated request


@asynccontextmanager
async def rig(tmp_path: pathlib.Path) -> AsyncIterator[Rig]:
    path = tmp_path / "t.fifo"
    clock, reaper, events = FakeClock(), RecordingReaper(), []
    server = TimerServer(
        sources=[FifoSource(path)], clock=clock, reaper=reaper, on_event=events.append
    )
    async with server:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        # As ``aiotimer serve`` does: a full pass of the collector over the whole test
        # session's heap (100+ ms) would otherwise eat the drain's CPU budget whenever
        # it falls in a drain, and make these tests depend on what ran before them.
        gc.collect()
        gc.freeze()
        try:
            capacity = fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
            await settle()
            yield Rig(server, clock, reaper, events, fd, capacity)
        finally:
            gc.unfreeze()
            os.close(fd)


def flood(lines: int, first_pid: int = fake_pid(5000)) -> bytes:
    """Releases of unknown timers of 100 other workers: applied, and no-ops."""
    return b"".join(encode(Request(first_pid + i % 100, f"s{i % 7}", -1, 0)) for i in range(lines))


def acquire(pid: int, scope: str, deadline: float) -> bytes:
    return encode(Request(pid, scope, 1.0, KILL, mono=deadline))


def release(pid: int, scope: str) -> bytes:
    return encode(Request(pid, scope, -1, 0))


async def settle_all(r: Rig, expected: int) -> None:
    """Let the reader apply what is left; the server must reach ``expected`` requests."""
    with anyio.fail_after(10):
        while r.requests() < expected:
            await anyio.sleep(0.01)
    assert r.requests() == expected


@pytest.mark.asyncio
async def test_a_release_behind_a_backlog_wins_and_the_flood_after_it_waits(
    tmp_path: pathlib.Path, peeking: bool
) -> None:
    async with rig(tmp_path) as r:
        r.server.submit(Request(DUE, "a", 1.0, KILL, mono=1.0))
        r.server.submit(Request(OTHER_DUE, "b", 1.0, KILL, mono=1.0))
        # Lines before the release and after it.
        before, after = flood(400), flood(r.capacity // 2 // 70, first_pid=fake_pid(6000))
        r.write(before + release(DUE, "a") + after)
        applied = r.requests()
        r.stall_until(1.0)
        # DUE released in time; OTHER_DUE, named nowhere, reaped at once.
        assert r.reaper.signals() == [(OTHER_DUE, KILL)]
        assert [e.pid for e in r.events if isinstance(e, TimerExpired)] == [OTHER_DUE]
        # Applied when it acted: the release alone (and the tick), not the flood around
        # it, left to the reader in order.
        lines_before = before.count(b"\n")
        assert r.requests() == applied + 1 + 1
        # Peeking, the lines after the release were left in the pipe: writers waiting
        # for room there were not woken.
        assert r.in_pipe() == (len(after) if peeking else 0)
        await settle_all(r, applied + lines_before + 1 + after.count(b"\n") + 1)
        assert r.reaper.signals() == [(OTHER_DUE, KILL)]


@pytest.mark.asyncio
async def test_a_due_worker_named_nowhere_is_reaped_before_any_of_the_flood(
    tmp_path: pathlib.Path, peeking: bool
) -> None:
    async with rig(tmp_path) as r:
        r.server.submit(Request(DUE, "a", 1.0, KILL, mono=1.0))
        data = flood(r.capacity * 2 // 3 // 70)
        r.write(data)
        applied = r.requests()
        r.stall_until(1.0)
        assert r.reaper.signals() == [(DUE, KILL)]
        assert r.requests() == applied + 1  # the tick alone: the flood waits, whole
        assert r.in_pipe() == (len(data) if peeking else 0)
        await settle_all(r, applied + 1 + data.count(b"\n"))  # then all of it, once


@pytest.mark.asyncio
async def test_an_expired_acquire_of_another_worker_waits_and_its_release_wins_too(
    tmp_path: pathlib.Path,
) -> None:
    """An acquire that has expired already (LATE's) before a due worker's release: the
    drain leaves it to the reader, in order (it names no due worker); once the reader
    applies it, its worker is due, and its release, further on in the pipe, wins."""
    async with rig(tmp_path) as r:
        r.server.submit(Request(DUE, "a", 1.0, KILL, mono=1.0))
        chunk = flood(200)
        rest = flood(r.capacity // 2 // 70, first_pid=fake_pid(6000))
        r.write(
            chunk
            + acquire(LATE, "late", deadline=0.5)
            + release(DUE, "a")
            + chunk
            + release(LATE, "late")
            + rest
        )
        applied = r.requests()
        r.stall_until(1.0)
        assert r.reaper.signals() == []
        assert r.server.get_state().timers == ()
        lines = chunk.count(b"\n")
        assert r.requests() == applied + 1 + 1  # DUE's release alone, and the tick
        await settle_all(r, applied + 2 * lines + 3 + rest.count(b"\n") + 1)
        assert r.reaper.signals() == []


@pytest.mark.asyncio
async def test_a_release_split_across_the_readers_partial_line_wins(
    tmp_path: pathlib.Path,
) -> None:
    """The reader has decoded the first half of the release line (it holds it as a
    partial line): the drain still finishes that line before it acts."""
    async with rig(tmp_path) as r:
        r.server.submit(Request(DUE, "a", 1.0, KILL, mono=1.0))
        line = release(DUE, "a")
        os.write(r.fd, line[:30])
        await settle()  # the reader holds the first 30 bytes
        r.write(line[30:] + flood(1000))
        r.stall_until(1.0)
        assert r.reaper.signals() == []
        assert r.server.get_state().timers == ()


def test_a_drain_never_reads_past_what_the_pipe_held_at_the_decision(peeking: bool) -> None:
    """Lines naming the due worker written after the decision are not the drain's:
    a flood of them cannot put the decision off; the read loop gets them, in order."""
    r, w = os.pipe2(os.O_NONBLOCK)
    try:
        sink = RecordingSink()
        reader = _fifo_reader.FifoReader(
            r, sink, "fifo:t", chunk_size=4096, max_line=4096, interval=0.0
        )
        before = b"".join(release(DUE, f"b{i}") for i in range(50))
        after = b"".join(release(DUE, f"a{i}") for i in range(50))
        os.write(w, before)
        reader.hold()
        os.write(w, after)
        assert reader.look({DUE})
        drained = []
        while (batch := reader.step()) is not None:
            drained += [req.scope_id for req in batch.requests]
        assert drained == [f"b{i}" for i in range(50)]
        count = array.array("i", [0])
        fcntl.ioctl(r, termios.FIONREAD, count)
        assert count[0] == len(after)  # left in the pipe, for the read loop
        reader.close()
    finally:
        os.close(r)
        os.close(w)


@pytest.mark.asyncio
async def test_a_decision_spread_over_many_turns_is_late_never_wrong(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no CPU time allowed per turn, every decision takes a step per turn, the
    reader running in between: the release still wins, and the worker named nowhere
    is reaped once the drain is done."""
    monkeypatch.setattr(_drains, "DRAIN_SLICE", 0.0)
    async with rig(tmp_path) as r:
        r.server.submit(Request(DUE, "a", 1.0, KILL, mono=1.0))
        r.server.submit(Request(OTHER_DUE, "b", 1.0, KILL, mono=1.0))
        before, after = flood(3000), flood(r.capacity // 2 // 70, first_pid=fake_pid(6000))
        names = b"".join(release(DUE, f"x{i}") for i in range(500))  # no-ops naming DUE
        r.write(before + names + release(DUE, "a") + names + after)
        r.stall_until(1.0)
        with anyio.fail_after(10):
            while not r.reaper.signals():
                await anyio.sleep(0.01)
        assert r.reaper.signals() == [(OTHER_DUE, KILL)]
        assert [e.pid for e in r.events if isinstance(e, TimerExpired)] == [OTHER_DUE]
