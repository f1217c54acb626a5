"""Learned timeouts on the server: the deadline set from the scope's value, shared by
every worker of the scope, never later than the client's; the expiry says which value
reaped; shadow mode reports and widens; the values survive a server restart."""

from __future__ import annotations

import importlib
import signal
import time
from pathlib import Path

import anyio
import msgspec
import pytest
from _pids import fake_pid

from aiotimer import Request, expires, learned
from aiotimer.client._fifo import FifoClient
from aiotimer.control._format import format_status
from aiotimer.control.metrics import render, sample_of
from aiotimer.control.snapshot import status_snapshot
from aiotimer.events import Event, LearnedWouldReap, TimerExpired
from aiotimer.reapers import ReapPolicy
from aiotimer.server import TimerServer
from aiotimer.testing import FakeClock, MemorySource, RecordingReaper, settle
from aiotimer.wire import Learned

KILL = int(signal.SIGKILL)
P1, P2 = fake_pid(11), fake_pid(12)
SPEC = learned(30)


def acquire(clock: FakeClock, pid: int, spec: Learned | None = SPEC, after: float = 30) -> Request:
    return Request(
        pid,
        "step",
        clock.time() + after,
        KILL,
        mono=clock.monotonic() + after,
        learned=spec,
    )


def steps(source: MemorySource, clock: FakeClock, pid: int, n: int, took: float = 0.05) -> None:
    for _ in range(n):
        source.push(acquire(clock, pid))
        clock.advance(took)
        source.push(Request(pid, "step", -1, 0))


@pytest.mark.asyncio
async def test_a_restarted_worker_starts_from_the_value_its_scope_learned() -> None:
    clock, source, events = FakeClock(), MemorySource(), list[Event]()
    async with TimerServer(
        sources=[source], clock=clock, reaper=RecordingReaper(), on_event=events.append
    ) as server:
        source.push(acquire(clock, P1))
        [timer] = server.get_state().timers
        assert timer.seconds_left == pytest.approx(30), "warm-up: initial"
        source.push(Request(P1, "step", -1, 0))
        steps(source, clock, P1, 200)
        source.push(acquire(clock, P2))  # another worker (a restart, another rank)
        [timer] = server.get_state().timers
        assert timer.seconds_left == pytest.approx(1.0)  # the floor
        clock.advance(1.0)
        await settle()
        [expired] = [e for e in events if isinstance(e, TimerExpired)]
        assert (expired.pid, expired.learned, expired.learned_samples) == (P2, 1.0, 201)
        assert "at its learned timeout 1s (from 201 samples)" in expired.describe()
        [summary] = server.snapshot().document.learned
        assert (summary.site, summary.samples, summary.value, summary.initial) == (
            "step",
            201,
            1.0,
            30.0,
        )


@pytest.mark.asyncio
async def test_timed_from_the_blocks_start_and_plain_blocks_untouched() -> None:
    clock, source = FakeClock(), MemorySource()
    async with TimerServer(sources=[source], clock=clock, reaper=RecordingReaper()) as server:
        steps(source, clock, P1, 100, took=1.0)  # learned: 5 x 1 s = 5 s
        line = acquire(clock, P1)
        clock.advance(0.2)  # the line is read late (a paced reader)
        source.push(line)
        [timer] = server.get_state().timers
        assert timer.seconds_left == pytest.approx(5.0 - 0.2)  # 5 s from the block's start
        source.push(acquire(clock, P1, spec=None, after=30.0))  # not learned: as sent
        [timer] = server.get_state().timers
        assert timer.seconds_left == pytest.approx(30.0)
        source.push(acquire(clock, P1))
        [timer] = server.get_state().timers
        assert timer.seconds_left == pytest.approx(5.0)


@pytest.mark.asyncio
async def test_in_shadow_mode_a_block_past_the_value_is_reported_and_widens_it() -> None:
    clock, source, events = FakeClock(), MemorySource(), list[Event]()
    async with TimerServer(
        sources=[source],
        clock=clock,
        reaper=RecordingReaper(),
        policy=ReapPolicy(shadow=True),
        on_event=events.append,
    ) as server:
        steps(source, clock, P1, 150)
        source.push(acquire(clock, P1))
        clock.advance(1.0)
        await settle()
        [expired] = [e for e in events if isinstance(e, TimerExpired)]
        assert expired.report_only and expired.learned == 1.0
        clock.advance(1.5)  # the block ends 2.5 s after it began: 2.5x the value
        source.push(Request(P1, "step", -1, 0))
        [would] = [e for e in events if isinstance(e, LearnedWouldReap)]
        assert (would.duration, would.value, would.initial) == (pytest.approx(2.5), 1.0, 30)
        assert would.widened_to == pytest.approx(12.5)  # at once: 5 x 2.5 s
        assert "the learned value would have reaped it" in would.describe()
        source.push(acquire(clock, P1))
        [timer] = server.get_state().timers
        assert timer.seconds_left == pytest.approx(12.5)


@pytest.mark.asyncio
async def test_the_learned_values_survive_a_server_restart(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    clock, source = FakeClock(), MemorySource()
    async with TimerServer(
        sources=[source], clock=clock, reaper=RecordingReaper(), event_log=log
    ) as server:
        steps(source, clock, P1, 150, took=0.5)
        [before] = server.snapshot().document.learned
    assert before.value == pytest.approx(2.5)
    clock, source = FakeClock(), MemorySource()
    async with TimerServer(
        sources=[source], clock=clock, reaper=RecordingReaper(), event_log=log
    ) as server:
        [after] = server.snapshot().document.learned
        assert (after.samples, after.value) == (150, pytest.approx(2.5))
        source.push(acquire(clock, P2))  # the first block of the new run
        [timer] = server.get_state().timers
        assert timer.seconds_left == pytest.approx(2.5)


@pytest.mark.asyncio
async def test_status_and_metrics_show_each_learned_scope() -> None:
    clock, source = FakeClock(), MemorySource()
    async with TimerServer(sources=[source], clock=clock, reaper=RecordingReaper()) as server:
        steps(source, clock, P1, 10)
        steps(source, clock, P1, 200, took=0.4)
        source.push(Request(P1, "warming", clock.time() + 60, KILL, learned=learned(60)))
        snap = server.snapshot(by_state=True)
    text = format_status(status_snapshot(snap))
    assert "LEARNED SCOPE  SAMPLES  IN FORCE        INITIAL" in text
    assert "step           210      2s              30s" in text
    assert "warming        0        60s (learning)  60s" in text
    state = msgspec.json.decode(msgspec.json.encode(status_snapshot(snap)))
    assert state["learned"][0] == {
        "site": "step",
        "samples": 210,
        "value": pytest.approx(2.0),
        "initial": 30.0,
        "learning": False,
    }
    metrics = render(lambda: sample_of(snap)).decode()
    assert 'aiotimer_learned_timeout_seconds{scope="step"} 2.0' in metrics
    assert 'aiotimer_learned_initial_seconds{scope="warming"} 60.0' in metrics
    assert 'aiotimer_learned_samples{scope="step"} 210.0' in metrics


def test_the_benchmark_runs_and_learned_kills_no_healthy_step(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bench = importlib.import_module("benchmarks.bench_learned")
    assert bench.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "false kills in all: learned(initial=600) 0, fixed 10x median " in out


@pytest.mark.asyncio
async def test_a_block_read_with_its_release_counts_from_its_own_start() -> None:
    """A paced reader may read a block's acquire and release in one batch (folded away):
    its duration still runs from the block's start, never zero."""
    clock, source = FakeClock(), MemorySource()
    async with TimerServer(sources=[source], clock=clock, reaper=RecordingReaper()) as server:
        source.push(acquire(clock, P1))  # the scope is learned from here on
        source.push(Request(P1, "step", -1, 0))
        for _ in range(150):
            line = acquire(clock, P2)
            clock.advance(0.4)
            source.push(line, Request(P2, "step", -1, 0))  # one read: folded
        [summary] = server.snapshot().document.learned
        assert summary.samples == 151
        assert summary.value == pytest.approx(2.0)  # 5 x 0.4 s; zeros would give the floor
        assert server.get_state().counters.released == 151


@pytest.mark.asyncio
async def test_a_stamped_release_is_timed_when_the_worker_sent_it() -> None:
    """A release read 2 s late (a paced reader) but stamped ``at`` its block's end
    teaches the block's 0.3 s, not 2.3 s; an unstamped one teaches what was read."""
    for stamped, value in ((True, 5 * 0.3), (False, 5 * 2.3)):
        clock, source = FakeClock(), MemorySource()
        async with TimerServer(sources=[source], clock=clock, reaper=RecordingReaper()) as server:
            for _ in range(120):  # the warm-up, then tightening 5% a sample from 30 s
                source.push(acquire(clock, P1))
                ended = clock.monotonic() + 0.3
                clock.advance(2.3)
                source.push(Request(P1, "step", -1, 0, at=ended if stamped else None))
            [summary] = server.snapshot().document.learned
            assert summary.value == pytest.approx(value, rel=0.02), stamped


@pytest.mark.asyncio
async def test_stamped_blocks_keep_their_durations_in_the_scope_statistics() -> None:
    """A paced reader gets a block's two lines in one read, or its release 2 s late:
    with the worker's stamps the statistics keep the block's 0.3 s, not 0 s or 2.3 s."""
    clock, source = FakeClock(), MemorySource()
    async with TimerServer(sources=[source], clock=clock, reaper=RecordingReaper()) as server:
        for _ in range(10):  # both lines read at once: folded within the batch
            start = clock.monotonic()
            acq = Request(P1, "a", clock.time() + 30, KILL, mono=start + 30, at=start)
            clock.advance(2.0)
            source.push(acq, Request(P1, "a", -1, 0, at=start + 0.3))
        for _ in range(10):  # the release read 2 s after the block ended
            start = clock.monotonic()
            source.push(Request(P1, "b", clock.time() + 30, KILL, mono=start + 30, at=start))
            clock.advance(2.3)
            source.push(Request(P1, "b", -1, 0, at=start + 0.3))
        stats = {s.site: s for s in server.scope_stats()}
        for site in ("a", "b"):
            assert stats[site].count == 10
            assert stats[site].p50 == pytest.approx(0.3, rel=0.02), site
            assert stats[site].max == pytest.approx(0.3, rel=0.02), site


@pytest.mark.asyncio
async def test_a_learned_blocks_lines_are_stamped_without_the_markers_stamps(
    tmp_path: Path,
) -> None:
    """Through a real FIFO and a plain server (its marker asks for no stamps): a learned
    block's lines carry the worker's times, so a paced reader that gets both lines in
    one read still learns the block's ~20 ms, not 0 s; a plain block's do not."""
    fifo = tmp_path / "t.fifo"
    async with TimerServer(fifo=fifo) as server:
        client = FifoClient(str(fifo))
        try:
            for _ in range(5):
                with expires(after=learned(30), scope="learned", client=client):
                    time.sleep(0.02)
                with expires(after=30, scope="plain", client=client):
                    time.sleep(0.02)
            deadline = time.monotonic() + 10
            while sum(s.count for s in server.scope_stats()) < 10:
                assert time.monotonic() < deadline, "10 blocks read within 10 s"
                await anyio.sleep(0.05)
        finally:
            client.close()
        stats = {s.site: s for s in server.scope_stats()}
    assert stats["learned"].count == 5 and stats["plain"].count == 5
    learned_p50 = stats["learned"].p50
    assert learned_p50 is not None and 0.019 <= learned_p50 < 1.0
