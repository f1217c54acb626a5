"""TimerServer, unit layer: FakeClock + RecordingReaper + MemorySource, no real processes."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import logging
import os
import signal
import threading
import time
from collections.abc import AsyncIterator
from collections.abc import Set as AbstractSet
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import anyio
import anyio.abc
import msgspec
import pytest
from _pids import fake_pid

from aiotimer import Request
from aiotimer._edges.clock import MonotonicClock
from aiotimer.control.snapshot import status_snapshot
from aiotimer.core._stats import SUGGESTION_SAMPLES
from aiotimer.errors import ProcessGoneError, RefusedTargetError, ServerStateError, SourceError
from aiotimer.events import (
    BlockCancelled,
    Event,
    LoopLagged,
    ReapAbandoned,
    ReapFailed,
    RequestRejected,
    ServerStarted,
    ServerStopped,
    SignalRefused,
    SignalSent,
    SourceFailed,
    StacksDumped,
    TimerAcquired,
    TimerEvicted,
    TimerExpired,
    TimerReleased,
    WorkerExited,
    WorkerReaped,
    WorkerSurvived,
    WorkerUnknown,
)
from aiotimer.reapers import NoDump
from aiotimer.reapers._policy import Escalation, ReapPolicy
from aiotimer.server import LifecycleState, ReapRetry, TimerServer, TimerServerThread
from aiotimer.server._engine import EXPIRE_BUDGET
from aiotimer.server._ingest import REPORTED_REJECTIONS
from aiotimer.sources import RequestSink
from aiotimer.sources._base import draining
from aiotimer.testing import FakeClock, MemorySource, RecordingReaper, settle
from aiotimer.wire import Decoded

E = TypeVar("E", bound=Event)
KILL = int(signal.SIGKILL)
TERM = int(signal.SIGTERM)
#: Made-up workers (see tests/_pids.py): never this process, pid 1 or a live one.
P1, P2, P3, P7, P100, P666, P4242 = map(fake_pid, (1, 2, 3, 7, 100, 666, 4242))


@dataclass
class Rig:
    server: TimerServer
    clock: FakeClock
    reaper: RecordingReaper
    source: MemorySource
    events: list[Event] = field(default_factory=list)

    def of(self, kind: type[E]) -> list[E]:
        return [e for e in self.events if isinstance(e, kind)]

    def acquire(self, pid: int, scope: str, at: float, sig: int = KILL, **ext: Any) -> None:
        """Acquire with a monotonic deadline ``at`` (the ``mono`` extension)."""
        wall = at + (self.clock.time() - self.clock.monotonic())
        self.source.push(Request(pid, scope, wall, sig, mono=at, **ext))

    def release(self, pid: int, scope: str) -> None:
        self.source.push(Request(pid, scope, -1, 0))

    async def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        await settle()


@asynccontextmanager
async def rig(**kwargs: Any) -> AsyncIterator[Rig]:
    clock = FakeClock()
    reaper = kwargs.pop("reaper", None) or RecordingReaper()
    also = kwargs.pop("on_event", None)
    source = MemorySource()
    more_sources = kwargs.pop("sources", ())
    events: list[Event] = []

    def on_event(event: Event) -> None:
        events.append(event)
        if also is not None:
            also(event)

    server = TimerServer(
        sources=[source, *more_sources], clock=clock, reaper=reaper, on_event=on_event, **kwargs
    )
    async with server:
        r = Rig(server, clock, reaper, source, events)
        await settle()
        yield r


# -- expiry ---------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_expires_exactly_at_deadline_not_before() -> None:
    async with rig() as r:
        r.acquire(P100, "a", at=10.0)
        await r.advance(9.999)
        assert r.reaper.signals() == []
        assert r.clock.next_wakeup() == 10.0
        await r.advance(0.001)
        assert r.reaper.signals() == [(P100, KILL)]
        [expired] = r.of(TimerExpired)
        assert (expired.pid, expired.scope_id, expired.late) == (P100, "a", 0.0)
        [reaped] = r.of(WorkerReaped)
        assert reaped.scopes == ("a",)
        assert r.server.get_state().timers == ()


@pytest.mark.asyncio
async def test_torch_line_deadline_is_translated_from_wall_clock() -> None:
    async with rig() as r:
        wall = r.clock.time() + 5.0
        r.source.push_bytes(
            b'{"version": 1, "pid": %d, "scope_id": "t.py#1", ' % P7
            + f'"expiration_time": {wall!r}, "signal": 15}}\n'.encode()
        )
        [timer] = r.server.get_state().timers
        assert timer.seconds_left == pytest.approx(5.0)
        assert timer.deadline == pytest.approx(wall)
        await r.advance(5.0)
        assert r.reaper.signals() == [(P7, TERM)]


@pytest.mark.asyncio
async def test_lag_runs_from_the_deadline_or_from_an_already_late_arrival() -> None:
    async with rig() as r:
        r.acquire(P1, "known", at=10.0)
        await r.advance(50.0)  # the loop wakes 40 s after a deadline it knew
        [lagged] = r.of(LoopLagged)
        assert lagged.lag == pytest.approx(40.0)
        r.acquire(P2, "arrived-late", at=10.0)  # 40 s past its deadline on arrival
        await settle()
        assert r.reaper.signals() == [(P1, KILL), (P2, KILL)]
        late = {e.pid: e.late for e in r.of(TimerExpired)}
        assert late == {P1: pytest.approx(40.0), P2: pytest.approx(40.0)}
        assert len(r.of(LoopLagged)) == 1  # the loop was not late for pid 2
        snap = r.server.snapshot(0)
    assert snap.reap_latency.count == 2
    assert snap.reap_latency.sum == pytest.approx(40.0)  # 40 s + 0 s
    assert snap.loop_lag.sum == pytest.approx(40.0)


@pytest.mark.asyncio
async def test_expiry_in_deadline_order() -> None:
    async with rig() as r:
        for pid, at in [(P1, 3.0), (P2, 1.0), (P3, 2.0)]:
            r.acquire(pid, f"s{pid}", at=at, sig=0)
        await r.advance(5.0)
        assert [e.pid for e in r.of(TimerExpired)] == [P2, P3, P1]


@pytest.mark.asyncio
async def test_earlier_deadline_rearms_sleeper_at_once() -> None:
    async with rig() as r:
        r.acquire(P1, "late", at=100.0)
        await settle()
        assert r.clock.next_wakeup() == 100.0
        r.acquire(P2, "early", at=5.0)
        await settle()
        assert r.clock.next_wakeup() == 5.0
        await r.advance(5.0)
        assert r.reaper.signals() == [(P2, KILL)]


@pytest.mark.asyncio
async def test_a_deadline_that_falls_while_the_loop_is_busy_is_handled_by_the_next_batch() -> None:
    async with rig() as r:
        r.acquire(P1, "a", at=1.0)
        await settle()
        r.clock.advance(1.0)  # the deadline falls; the expiry task has not run since
        r.release(P2, "other")  # any batch: the sink handles what came due before returning
        assert r.reaper.signals() == [(P1, KILL)]
        [expired] = r.of(TimerExpired)
        assert expired.late == 0.0
        await settle()  # the expiry task wakes up and finds nothing left to do
        assert len(r.of(TimerExpired)) == 1 and r.reaper.signals() == [(P1, KILL)]


class SleepRecordingClock(MonotonicClock):
    """The real clock, recording every deadline the server sleeps until."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []

    async def sleep_until(self, deadline: float) -> None:
        self.sleeps.append(deadline)
        await super().sleep_until(deadline)


class TimedReaper(RecordingReaper):
    """Records when (``time.monotonic()``) each signal was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.sent_at: list[float] = []

    def signal(self, pid: int, signum: int, *, group: bool = False) -> None:
        self.sent_at.append(time.monotonic())
        super().signal(pid, signum, group=group)


@pytest.mark.timeout(10)
@pytest.mark.asyncio
async def test_on_the_loop_clock_the_expiry_task_never_fires_early() -> None:
    clock, source, events = SleepRecordingClock(), MemorySource(), list[Event]()
    reaper = TimedReaper()
    server = TimerServer(sources=[source], clock=clock, reaper=reaper, on_event=events.append)
    async with server:
        deadline = time.monotonic() + 0.05
        source.push(Request(P1, "a", time.time() + 0.05, KILL, mono=deadline))
        with anyio.fail_after(5):
            while not any(isinstance(e, WorkerReaped) for e in events):
                await anyio.sleep(0.01)
    [expired] = [e for e in events if isinstance(e, TimerExpired)]
    assert 0.0 <= expired.late < 0.25  # ~1 ms unloaded; 1 s polling would fail this
    [sent] = reaper.sent_at
    assert deadline <= sent < deadline + 0.25
    # The engine sleeps until the deadline itself: the clock never wakes it early.
    assert clock.sleeps and set(clock.sleeps) == {deadline}


@pytest.mark.asyncio
async def test_release_in_time_prevents_reap() -> None:
    async with rig() as r:
        r.acquire(P1, "a", at=5.0)
        await r.advance(4.0)
        r.release(P1, "a")
        r.release(P1, "never-acquired")  # a no-op
        await r.advance(10.0)
        assert r.reaper.signals() == []
        counters = r.server.get_state().counters
        assert (counters.acquired, counters.released, counters.expired) == (1, 1, 0)


@pytest.mark.asyncio
async def test_acquire_replaces_deadline() -> None:
    async with rig() as r:
        r.acquire(P1, "a", at=5.0)
        r.acquire(P1, "a", at=50.0)
        await r.advance(10.0)
        assert r.reaper.signals() == []
        await r.advance(40.0)
        assert r.reaper.signals() == [(P1, KILL)]


@pytest.mark.asyncio
async def test_report_only_clears_only_itself() -> None:
    async with rig() as r:
        r.acquire(P1, "shadow", at=1.0, sig=0)
        r.acquire(P1, "real", at=9.0)
        await r.advance(1.0)
        [expired] = r.of(TimerExpired)
        assert expired.report_only and expired.scope_id == "shadow"
        assert [t.scope_id for t in r.server.get_state().timers] == ["real"]
        assert r.reaper.signals() == []


@pytest.mark.asyncio
async def test_reap_clears_the_workers_other_timers() -> None:
    async with rig() as r:
        r.acquire(P1, "first", at=1.0)
        r.acquire(P1, "second", at=9.0)
        r.acquire(P2, "other-worker", at=9.0)
        await r.advance(1.0)
        assert r.reaper.signals() == [(P1, KILL)]
        [reaped] = r.of(WorkerReaped)
        assert reaped.scopes == ("first", "second")
        assert [(t.pid, t.scope_id) for t in r.server.get_state().timers] == [(P2, "other-worker")]


@pytest.mark.asyncio
async def test_worker_exit_clears_timers_without_signal() -> None:
    async with rig() as r:
        r.acquire(P1, "a", at=5.0)
        r.acquire(P1, "b", at=6.0)
        await settle()
        assert r.server.get_state().workers == (P1,)
        r.reaper.exit(P1)
        await settle()
        [exited] = r.of(WorkerExited)
        assert (exited.pid, sorted(exited.cleared), exited.reason) == (P1, ["a", "b"], "exited")
        assert r.server.get_state().timers == ()
        assert r.server.get_state().workers == ()
        await r.advance(10.0)
        assert r.reaper.signals() == []
        assert r.reaper.methods(P1) == ["attach", "wait_exit", "detach"]


@pytest.mark.asyncio
async def test_worker_attached_once_and_reattached_after_exit() -> None:
    async with rig() as r:
        r.acquire(P1, "a", at=5.0)
        r.acquire(P1, "b", at=5.0)
        await settle()
        r.reaper.exit(P1)
        await settle()
        assert r.reaper.methods(P1) == ["attach", "wait_exit", "detach"]


@pytest.mark.asyncio
async def test_unknown_worker_is_dropped_with_an_event() -> None:
    async with rig(reaper=RecordingReaper(nonexistent={P666})) as r:
        r.acquire(P666, "ghost", at=1.0)
        [unknown] = r.of(WorkerUnknown)
        assert (unknown.pid, unknown.scope_id, unknown.source) == (P666, "ghost", "memory")
        assert r.server.get_state().timers == ()


@pytest.mark.asyncio
async def test_a_gone_workers_block_ended_in_a_later_read_keeps_its_tiers() -> None:
    """A worker gone before a paced reader got its lines (in two chunks): its acquire is
    reported unknown, but the release in the next chunk still says the block's tiers
    and counts its duration."""
    async with rig(reaper=RecordingReaper(nonexistent={P666})) as r:
        r.acquire(P666, "ghost@Task-1", at=3.0, kill_after=2.0)  # its own deadline: 1.0
        [unknown] = r.of(WorkerUnknown)
        assert unknown.pid == P666
        await r.advance(1.25)
        r.source.push(Request(P666, "ghost@Task-1", -1, 0, cancelled=True))
        await settle()
        [cancelled] = r.of(BlockCancelled)
        assert (cancelled.late, cancelled.kill_after) == (0.25, 2.0)
        [stats] = r.server.scope_stats()
        assert stats.count == 1 and stats.p50 == pytest.approx(1.25, rel=0.02)
        assert r.server.get_state().timers == () and r.reaper.signals() == []


@pytest.mark.asyncio
async def test_failed_reap_is_retried_with_backoff_and_never_reported_as_success() -> None:
    retry = ReapRetry(attempts=5, initial=0.1, maximum=5.0, factor=2.0)
    async with rig(reap_retry=retry) as r:
        r.reaper.fail_signals(P1, times=2)
        r.acquire(P1, "a", at=1.0)
        await r.advance(1.0)
        assert [(e.attempt, e.retry_in) for e in r.of(ReapFailed)] == [(1, 0.1)]
        assert r.of(WorkerReaped) == []
        await r.advance(0.1)
        assert [(e.attempt, e.retry_in) for e in r.of(ReapFailed)] == [(1, 0.1), (2, 0.2)]
        assert r.of(WorkerReaped) == []
        await r.advance(0.2)
        assert len(r.of(WorkerReaped)) == 1
        assert r.server.get_state().counters.reap_failed == 2


@pytest.mark.asyncio
async def test_reap_abandoned_after_last_attempt_and_worker_stays_watched() -> None:
    async with rig(reap_retry=ReapRetry(attempts=3, initial=1.0)) as r:
        r.reaper.fail_signals(P1, times=100)
        r.acquire(P1, "a", at=1.0)
        for _ in range(5):
            await r.advance(5.0)
        assert len(r.of(ReapFailed)) == 2
        [abandoned] = r.of(ReapAbandoned)
        assert abandoned.attempts == 3
        assert r.of(WorkerReaped) == []
        assert r.server.get_state().workers == (P1,)
        r.reaper.exit(P1)
        await settle()
        assert len(r.of(WorkerExited)) == 1


@pytest.mark.asyncio
@pytest.mark.parametrize("b_due", [2.5, 1.0])
async def test_a_refused_first_signal_abandons_its_timer_alone(b_due: float) -> None:
    """Timer ``a``'s signal is refused: its reap is abandoned, and the worker's timer
    ``b`` stays and reaps it at its own deadline (in the same slice too)."""
    async with rig() as r:
        r.reaper.fail_signals(P1, times=1, error=RefusedTargetError("kill policy: no"))
        r.acquire(P1, "a", at=1.0, sig=signal.SIGSTOP)
        r.acquire(P1, "b", at=b_due)
        await r.advance(1.0)
        [refused] = r.of(SignalRefused)
        assert (refused.signal, refused.reason) == (signal.SIGSTOP, "kill policy: no")
        assert len(r.of(ReapAbandoned)) == 1
        await r.advance(b_due - 1.0)
        [reaped] = r.of(WorkerReaped)
        assert (reaped.signal, reaped.scopes) == (KILL, ("b",))
        assert r.server.get_state().counters.expired == 2


@pytest.mark.asyncio
async def test_process_gone_at_signal_time_is_not_a_failure() -> None:
    async with rig() as r:
        r.reaper.fail_signals(P1, times=1, error=ProcessGoneError("gone"))
        r.acquire(P1, "a", at=1.0)
        await r.advance(1.0)
        [exited] = r.of(WorkerExited)
        assert exited.reason == "gone before signal"
        assert r.of(ReapFailed) == [] and r.of(WorkerReaped) == []


@pytest.mark.asyncio
async def test_grace_escalates_to_sigkill_unless_worker_exits() -> None:
    async with rig() as r:
        r.acquire(P1, "stubborn", at=1.0, sig=TERM, grace=2.0)
        r.acquire(P2, "polite", at=1.0, sig=TERM, grace=2.0)
        await r.advance(1.0)
        assert sorted(r.reaper.signals()) == [(P1, TERM), (P2, TERM)]
        r.reaper.exit(P2)
        await r.advance(2.0)
        assert sorted(r.reaper.signals()) == [(P1, KILL), (P1, TERM), (P2, TERM)]
        # Only the lethal step reaps; the soft signal before the grace is just sent.
        assert [(e.pid, e.step, e.steps) for e in r.of(SignalSent)] == [(P1, 1, 2), (P2, 1, 2)]
        assert [(e.pid, e.step, e.steps) for e in r.of(WorkerReaped)] == [(P1, 2, 2)]


@pytest.mark.asyncio
async def test_unkillable_worker_is_reported() -> None:
    policy = ReapPolicy(unkillable_after=3.0)
    async with rig(reaper=RecordingReaper(exit_on=()), policy=policy) as r:
        r.acquire(P1, "a", at=1.0)
        await r.advance(1.0)
        assert r.of(WorkerSurvived) == []
        await r.advance(3.0)
        [survived] = r.of(WorkerSurvived)
        assert survived.unkillable and survived.signal == KILL


@pytest.mark.asyncio
async def test_server_ladder_and_shadow_mode() -> None:
    ladder = ReapPolicy(Escalation(soft_signal=TERM, grace=1.0), shadow=True)
    async with rig(policy=ladder) as r:
        r.acquire(P1, "a", at=1.0)
        await r.advance(5.0)
        [expired] = r.of(TimerExpired)
        assert expired.report_only
        assert "would do: SIGTERM -> wait 1s -> SIGKILL" in expired.action
        assert r.reaper.signals() == []


@pytest.mark.asyncio
async def test_own_process_is_never_signalled() -> None:
    async with rig() as r:
        r.server.acquire("self", 1.0)  # pid defaults to the server's own
        await r.advance(1.0)
        [expired] = r.of(TimerExpired)
        assert expired.pid == os.getpid() and expired.report_only
        assert r.reaper.calls == []


@pytest.mark.asyncio
async def test_self_kill_after_reap_is_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    killed: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: killed.append((pid, sig)))
    async with rig() as r:
        r.acquire(P1, "a", at=1.0)
        await r.advance(1.0)
    assert killed == []
    async with rig(self_kill_after_reap=True) as r:
        r.acquire(P1, "a", at=1.0)
        await r.advance(1.0)
    assert killed == [(os.getpid(), KILL)]


@pytest.mark.asyncio
async def test_wall_clock_step_does_not_fire_a_mono_timer() -> None:
    async with rig() as r:
        r.acquire(P1, "a", at=10.0)
        r.clock.step_wall(3600.0)
        await r.advance(1.0)
        assert r.reaper.signals() == []
        r.clock.step_wall(-7200.0)
        await r.advance(9.0)
        assert r.reaper.signals() == [(P1, KILL)]


# -- the first signal, inline ------------------------------------------------------------------


@dataclass
class Witness:
    """What each event saw when it was emitted: the signals sent so far, and the task
    that emitted it (the expiry task when the first signal went out inline)."""

    reaper: RecordingReaper
    seen: list[tuple[str, list[tuple[int, int]], str]] = field(default_factory=list)

    def __call__(self, event: Event) -> None:
        if not isinstance(event, (TimerAcquired, TimerReleased, ServerStarted, ServerStopped)):
            task = anyio.get_current_task().name
            self.seen.append((event.kind, self.reaper.signals(), task))


EXPIRY, REAP1, WATCH1 = "aiotimer-expiry", f"aiotimer-reap-{P1}", f"aiotimer-watch-{P1}"


@pytest.mark.asyncio
async def test_first_signal_goes_out_inline_before_the_expiry_is_reported() -> None:
    reaper = RecordingReaper()
    witness = Witness(reaper)
    async with rig(reaper=reaper, on_event=witness) as r:
        r.acquire(P1, "a", at=1.0)
        await r.advance(1.0)
        assert witness.seen == [
            ("timer_expired", [(P1, KILL)], EXPIRY),
            ("worker_reaped", [(P1, KILL)], EXPIRY),
            ("worker_exited", [(P1, KILL)], WATCH1),
        ]
        await r.advance(10.0)  # its exit ended the reap: nothing more is sent or reported
        assert len(witness.seen) == 3
        assert r.server.get_state().counters.reaped == 1


@pytest.mark.asyncio
async def test_escalation_resumes_after_the_inline_first_step() -> None:
    reaper = RecordingReaper()
    witness = Witness(reaper)
    async with rig(reaper=reaper, on_event=witness) as r:
        r.acquire(P1, "a", at=1.0, sig=TERM, grace=2.0)
        r.acquire(P1, "b", at=5.0)
        await r.advance(1.0)
        assert witness.seen[-1] == ("signal_sent", [(P1, TERM)], EXPIRY)
        await r.advance(1.999)
        assert r.reaper.signals() == [(P1, TERM)]
        await r.advance(0.001)
        assert witness.seen[2:] == [
            ("worker_reaped", [(P1, TERM), (P1, KILL)], REAP1),
            ("worker_exited", [(P1, TERM), (P1, KILL)], WATCH1),
        ]
        [sent] = r.of(SignalSent)
        assert (sent.signal, sent.step, sent.steps) == (TERM, 1, 2)
        reaped = r.of(WorkerReaped)
        assert [(e.signal, e.step, e.steps, e.scopes) for e in reaped] == [
            (KILL, 2, 2, ("a", "b")),
        ]


@pytest.mark.asyncio
async def test_an_inline_failure_is_retried_with_backoff_by_the_reap_task() -> None:
    reaper = RecordingReaper()
    witness = Witness(reaper)
    retry = ReapRetry(attempts=3, initial=0.25, factor=2.0)  # binary-exact times
    async with rig(reaper=reaper, on_event=witness, reap_retry=retry) as r:
        r.reaper.fail_signals(P1, times=2)
        r.acquire(P1, "a", at=1.0)
        await r.advance(1.0)
        assert witness.seen == [("timer_expired", [], EXPIRY), ("reap_failed", [], EXPIRY)]
        await r.advance(0.125)
        assert r.reaper.methods(P1) == ["attach", "wait_exit", "signal_failed"]
        await r.advance(0.125)
        assert witness.seen[-1] == ("reap_failed", [], REAP1)
        await r.advance(0.5)
        assert witness.seen[-2] == ("worker_reaped", [(P1, KILL)], REAP1)
        assert [(e.attempt, e.retry_in) for e in r.of(ReapFailed)] == [(1, 0.25), (2, 0.5)]
        assert r.server.get_state().counters.reap_failed == 2


@pytest.mark.asyncio
async def test_an_inline_failure_can_abandon_at_once_and_a_later_timer_reaps_again() -> None:
    reaper = RecordingReaper()
    witness = Witness(reaper)
    async with rig(reaper=reaper, on_event=witness, reap_retry=ReapRetry(attempts=1)) as r:
        r.reaper.fail_signals(P1, times=1)
        r.acquire(P1, "a", at=1.0)
        await r.advance(1.0)
        assert witness.seen == [("timer_expired", [], EXPIRY), ("reap_abandoned", [], EXPIRY)]
        assert r.server.get_state().workers == (P1,)  # still watched
        r.acquire(P1, "again", at=2.0)
        await r.advance(1.0)
        assert witness.seen[2:] == [
            ("timer_expired", [(P1, KILL)], EXPIRY),
            ("worker_reaped", [(P1, KILL)], EXPIRY),
            ("worker_exited", [(P1, KILL)], WATCH1),
        ]


@pytest.mark.asyncio
async def test_a_dump_first_plan_sends_its_signals_from_the_reap_task() -> None:
    reaper = RecordingReaper(stack_dump="stacks")
    witness = Witness(reaper)
    policy = ReapPolicy(Escalation(dump=True, soft_signal=None))
    async with rig(reaper=reaper, on_event=witness, policy=policy) as r:
        r.acquire(P1, "a", at=1.0)
        await r.advance(1.0)
        assert witness.seen == [
            ("timer_expired", [], EXPIRY),
            ("stacks_dumped", [], REAP1),
            ("worker_reaped", [(P1, KILL)], REAP1),
            ("worker_exited", [(P1, KILL)], WATCH1),
        ]


# -- input -----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_bad_lines_are_rejected_one_by_one_and_valid_ones_apply() -> None:
    async with rig() as r:
        wall = r.clock.time()
        good = [
            f'{{"pid": {pid}, "scope_id": "s", "expiration_time": {wall + 5}, "signal": 9}}'
            for pid in (P1, P2, P3)
        ]
        bad = ["garbage", '{"pid": 0, "scope_id": "s", "expiration_time": 1, "signal": 9}']
        lines = [good[0], bad[0], good[1], bad[1], good[2]]
        r.source.push_bytes(("\n".join(lines) + "\n").encode())
        rejected = r.of(RequestRejected)
        assert len(rejected) == 2
        assert rejected[0].line == "garbage" and rejected[0].source == "memory"
        assert "pid" in rejected[1].reason
        assert sorted(t.pid for t in r.server.get_state().timers) == [P1, P2, P3]
        assert r.server.get_state().counters.rejected == 2


@pytest.mark.asyncio
async def test_a_read_of_garbage_reports_a_bounded_number_of_rejections() -> None:
    async with rig() as r:
        r.source.push_bytes(b"".join(b"junk %d\n" % i for i in range(1000)))
        rejected = r.of(RequestRejected)
        assert len(rejected) == REPORTED_REJECTIONS + 1
        assert [e.line for e in rejected[:2]] == ["junk 0", "junk 1"]
        summary = rejected[-1]
        assert summary.reason.startswith(f"{1000 - REPORTED_REJECTIONS:,} more bad line(s)")
        assert summary.line == f"junk {REPORTED_REJECTIONS}"
        assert r.server.get_state().counters.rejected == 1000


@pytest.mark.asyncio
async def test_invalid_api_request_is_rejected_not_raised() -> None:
    async with rig() as r:
        r.server.submit(Request(pid=-5, scope_id="x", expiration_time=1.0, signal=9))
        [rejected] = r.of(RequestRejected)
        assert rejected.source == "api"
        with pytest.raises(ValueError, match="finite"):
            r.server.acquire("x", float("nan"), pid=P1)


@pytest.mark.asyncio
async def test_request_events_are_opt_in() -> None:
    async with rig() as r:
        r.acquire(P1, "a", at=1.0)
        r.release(P1, "a")
        assert r.of(TimerAcquired) == [] and r.of(TimerReleased) == []
    async with rig(request_events=True) as r:
        r.acquire(P1, "a", at=1.0)
        r.release(P1, "a")
        [acq] = r.of(TimerAcquired)
        [rel] = r.of(TimerReleased)
        assert acq.expires_in == 1.0 and rel.scope_id == "a"


# -- lifecycle -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_lifecycle_start_stop_restart_and_misuse() -> None:
    events: list[Event] = []
    server = TimerServer(sources=[MemorySource()], reaper=RecordingReaper(), on_event=events.append)
    assert server.state is LifecycleState.CREATED and repr(server) == "<TimerServer created>"
    with pytest.raises(ServerStateError, match="created"):
        server.acquire("x", 1.0, pid=P1)
    await server.aclose()  # closing a never-started server is a no-op
    assert server.state is LifecycleState.CREATED
    await server.start()
    assert server.state is LifecycleState.RUNNING
    with pytest.raises(ServerStateError, match="running"):
        await server.start()
    server.acquire("x", 100.0, pid=P1)
    assert len(server.get_state().timers) == 1
    await server.aclose()
    await server.aclose()  # idempotent
    assert server.state is LifecycleState.STOPPED
    with pytest.raises(ServerStateError, match="stopped"):
        server.release("x", pid=P1)
    await server.start()  # a stopped server starts again, empty
    assert server.get_state().timers == ()
    await server.aclose()
    assert [type(e) for e in events] == [ServerStarted, ServerStopped] * 2
    assert isinstance(events[1], ServerStopped) and events[1].timers == 1


@pytest.mark.asyncio
async def test_start_and_stop_from_different_tasks() -> None:
    server = TimerServer(reaper=RecordingReaper())
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.start)
    assert server.state is LifecycleState.RUNNING
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.aclose)
    assert server.state is LifecycleState.STOPPED


class _FailingSource:
    def __init__(self, *, before_start: bool) -> None:
        self.before_start = before_start

    @property
    def name(self) -> str:
        return "failing"

    async def serve(
        self,
        sink: RequestSink,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        if self.before_start:
            raise SourceError("cannot open")
        task_status.started()
        await anyio.lowlevel.checkpoint()
        raise OSError("read failed")


@pytest.mark.asyncio
async def test_source_failing_to_start_fails_start() -> None:
    server = TimerServer(sources=[_FailingSource(before_start=True)], reaper=RecordingReaper())
    with pytest.raises(SourceError, match="cannot open"):
        await server.start()
    assert server.state is LifecycleState.STOPPED


@pytest.mark.asyncio
async def test_source_failing_later_is_reported_and_server_runs_on() -> None:
    events: list[Event] = []
    source = MemorySource()
    server = TimerServer(
        sources=[_FailingSource(before_start=False), source],
        clock=FakeClock(),
        reaper=RecordingReaper(),
        on_event=events.append,
    )
    async with server:
        await settle()
        [failed] = [e for e in events if isinstance(e, SourceFailed)]
        assert failed.source == "failing" and "read failed" in failed.error
        source.push(Request(P1, "a", 0.0, 9, mono=100.0))
        assert len(server.get_state().timers) == 1


@pytest.mark.asyncio
async def test_idle_server_makes_no_wakeups() -> None:
    async with TimerServer(reaper=RecordingReaper()) as server:
        await anyio.sleep(0.2)
        assert server.get_state().counters.wakeups == 0


# -- observability ---------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_get_state_and_repr() -> None:
    async with rig() as r:
        r.acquire(P1, "a", at=2.5)
        r.acquire(P2, "b", at=1.5)
        state = r.server.get_state()
        assert state.state is LifecycleState.RUNNING
        assert [t.scope_id for t in state.timers] == ["b", "a"]
        assert state.workers == (P1, P2)
        assert (state.next_deadline, state.next_expiry_in) == (1.5, 1.5)
        assert state.sources == ("memory",)
        assert state.counters.acquired == 2
        assert repr(r.server) == "<TimerServer running: 2 timers, 2 workers, next expiry in 1.5s>"


@pytest.mark.asyncio
async def test_callback_exceptions_are_contained(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[Event] = []

    def explode(event: Event) -> None:
        seen.append(event)
        raise RuntimeError("boom")

    clock, reaper, source = FakeClock(), RecordingReaper(), MemorySource()
    server = TimerServer(sources=[source], clock=clock, reaper=reaper, on_event=explode)
    with caplog.at_level(logging.ERROR, logger="aiotimer"):
        async with server:
            source.push(Request(P1, "a", 0.0, 9, mono=1.0))
            clock.advance(1.0)
            await settle()
            assert reaper.signals() == [(P1, KILL)]
    assert [type(e) for e in seen][-1] is ServerStopped
    assert "on_event callback raised" in caplog.text


@pytest.mark.asyncio
async def test_events_go_to_logging_with_structured_extra(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="aiotimer"):
        async with rig() as r:
            r.acquire(P1, "a", at=1.0)
            await r.advance(1.0)
    reaped = [rec for rec in caplog.records if f"SIGKILL to worker {P1}" in rec.getMessage()]
    assert reaped and reaped[0].levelno == logging.WARNING
    assert reaped[0].aiotimer["event"] == "worker_reaped"


@pytest.mark.asyncio
async def test_event_log_is_written_and_flushed_on_stop(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    async with rig(event_log=log) as r:
        r.acquire(P1, "a", at=1.0)
        await r.advance(1.0)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    kinds = [rec["event"] for rec in records]
    assert kinds == [
        "server_started",
        "timer_expired",
        "worker_reaped",
        "worker_exited",
        "server_stopped",
    ]
    assert records[2]["scopes"] == ["a"]


# -- the one record of the server's state -----------------------------------------------------


@pytest.mark.asyncio
async def test_the_snapshot_is_the_document_served_as_it_is_and_get_state_views_one() -> None:
    async with rig() as r:
        r.acquire(P1, "a@Task-1", at=7.0)
        await r.advance(1.0)
        snap = r.server.snapshot()
        doc = snap.document
        assert (doc.server.state, doc.server.next_expiry_in) == ("running", 6.0)
        assert status_snapshot(snap) is doc  # no copy
        served = status_snapshot(snap, control="/run/c.sock")
        assert served == msgspec.structs.replace(
            doc, server=msgspec.structs.replace(doc.server, control="/run/c.sock")
        )
        [timer] = doc.timers
        assert (timer.pid, timer.scope_id, timer.seconds_left) == (P1, "a@Task-1", 6.0)
        assert timer.deadline == pytest.approx(doc.time + 6.0)
        assert doc.counters == dataclasses.asdict(snap.counters)
        state = r.server.get_state()
        assert state.workers == (P1,)
        assert state.timers == state.snapshot.document.timers
        assert state.snapshot.document.timers_total == len(state.timers) == 1


# -- the two tiers of an async block, as the server sees them -------------------------------


@pytest.mark.asyncio
async def test_a_two_tier_block_shows_both_deadlines_and_its_cancellation_is_reported() -> None:
    async with rig() as r:
        r.acquire(P1, "a@Task-1", at=7.0, kill_after=5.0)  # its own deadline: 2.0
        await r.advance(1.0)
        [timer] = status_snapshot(r.server.snapshot()).timers
        assert (timer.passed, timer.kill_after) == ("none", 5.0)
        assert (timer.block_seconds_left, timer.seconds_left) == (1.0, 6.0)
        await r.advance(1.5)  # past its own deadline: the worker cancels its task
        [timer] = status_snapshot(r.server.snapshot()).timers
        assert (timer.passed, timer.block_seconds_left) == ("block", -0.5)
        r.source.push(Request(P1, "a@Task-1", -1, 0, cancelled=True))
        await settle()
        [cancelled] = r.of(BlockCancelled)
        assert (cancelled.pid, cancelled.scope_id) == (P1, "a@Task-1")
        assert (cancelled.late, cancelled.kill_after) == (0.5, 5.0)
        assert "hit its deadline: its task was cancelled" in cancelled.describe()
        counts = r.server.get_state().counters
        assert (counts.cancelled, counts.released, counts.expired) == (1, 1, 0)
        # Acquired and cancelled within one read (the fold): still counted and told.
        r.source.push(
            Request(P1, "b@Task-2", 100.0, KILL, mono=100.0, kill_after=5.0),
            Request(P1, "b@Task-2", -1, 0, cancelled=True),
        )
        # Its own deadline (2.0) passed at 2.25 by the worker's stamp, read at 2.5.
        r.source.push(
            Request(P1, "c@Task-3", 100.0, KILL, mono=3.0, kill_after=1.0),
            Request(P1, "c@Task-3", -1, 0, cancelled=True, at=2.25),
        )
        await settle()
        assert [(e.scope_id, e.late, e.kill_after) for e in r.of(BlockCancelled)][1:] == [
            ("b@Task-2", 0.0, 5.0),
            ("c@Task-3", 0.25, 1.0),
        ]
        assert r.server.get_state().counters.cancelled == 3
        assert r.reaper.signals() == []


@pytest.mark.asyncio
async def test_a_reaped_two_tier_block_says_its_own_deadline_passed_kill_after_earlier() -> None:
    async with rig() as r:
        r.acquire(P1, "a@Task-1", at=3.0, kill_after=2.0)
        await r.advance(3.0)
        [expired] = r.of(TimerExpired)
        assert (expired.late, expired.kill_after) == (0.0, 2.0)
        assert expired.describe() == (
            f"timer 'a@Task-1' of worker {P1} expired 0.0 ms after its reap deadline: its "
            "block outlived its own deadline by 2s (kill_after); action: SIGKILL"
        )
        listed = r.server.snapshot().document.recent[0]  # what status lists
        assert (listed.kind, listed.what) == ("timer_expired", expired.describe())
        assert (listed.pid, listed.late, listed.kill_after) == (P1, 0.0, 2.0)


# -- issue 5 wiring: duration statistics, overdue blocks, stack dumps ----------------------

SHADOW = ReapPolicy(Escalation(grace=1.0), shadow=True)


def site(r: Rig, name: str) -> tuple[int, float | None, int, float | None, float | None]:
    """(count, max, expirations, longest_expired, suggested_timeout) of site ``name``."""
    [s] = [s for s in r.server.get_state().scopes if s.site == name]
    return s.count, s.max, s.expirations, s.longest_expired, s.suggested_timeout


@pytest.mark.asyncio
async def test_released_blocks_feed_the_statistics_of_their_site() -> None:
    async with rig() as r:
        r.acquire(P1, "w.py:3#1", at=5.0)
        await r.advance(2.0)
        r.release(P1, "w.py:3#1")
        for n in range(2, SUGGESTION_SAMPLES + 1):
            r.acquire(P1, f"w.py:3#{n}", at=1000.0)
            await r.advance(1.0)
            r.release(P1, f"w.py:3#{n}")
        r.release(P1, "w.py:3#2")  # a second release of the same block adds nothing
        [summary] = r.server.get_state().scopes
        assert summary.site == "w.py:3"
        assert (summary.count, summary.p50, summary.max) == (SUGGESTION_SAMPLES, 1.0, 2.0)
        # max(1.5 * p99, 1.2 * max) = max(3.0, 2.4) -> 3.0 is already a nice number
        assert summary.suggested_timeout == 3.0
        assert r.server.scope_stats() == (summary,)
    [stopped] = r.of(ServerStopped)
    assert stopped.scopes == (summary,)
    assert r.server.scope_stats() == (summary,)  # the last run's, after the stop


@pytest.mark.asyncio
async def test_shadow_mode_records_the_expiry_and_the_late_release() -> None:
    async with rig(policy=SHADOW) as r:
        r.acquire(P1, "slow", at=1.0)
        await r.advance(1.0)
        [expired] = r.of(TimerExpired)
        assert "would do: SIGTERM -> wait 1s -> SIGKILL" in expired.action
        assert site(r, "slow") == (0, None, 1, 1.0, None)
        await r.advance(2.5)
        r.release(P1, "slow")  # the block ended 3.5 s after it began: its real duration
        assert site(r, "slow") == (1, 3.5, 1, 3.5, None)  # one duration: no suggestion
        assert r.reaper.signals() == []


@pytest.mark.asyncio
async def test_report_only_timers_are_overdue_too_but_reaped_ones_are_not() -> None:
    async with rig() as r:
        r.acquire(P1, "report", at=1.0, sig=0)
        r.acquire(P2, "reaped", at=1.0)
        await r.advance(1.0)
        await r.advance(1.0)
        r.release(P1, "report")
        r.release(P2, "reaped")  # too late: the worker was killed, no duration
        assert site(r, "report") == (1, 2.0, 1, 2.0, None)
        assert site(r, "reaped") == (0, None, 1, 1.0, None)


@pytest.mark.asyncio
async def test_overdue_blocks_are_forgotten_on_exit_and_on_reacquire() -> None:
    async with rig(policy=SHADOW) as r:
        r.acquire(P1, "gone", at=1.0)
        r.acquire(P2, "again", at=1.0)
        await r.advance(1.0)
        r.reaper.exit(P1)
        await settle()
        r.acquire(P2, "again", at=10.0)  # a new block under the same key
        await r.advance(1.0)
        r.release(P2, "again")  # measures the new block: 1 s, not 2 s
        r.acquire(P1, "gone", at=10.0)  # pid P1 again (re-attached) ...
        r.release(P1, "gone")  # ... its old overdue block is not counted
        assert site(r, "again") == (1, 1.0, 1, 1.0, None)
        assert site(r, "gone")[:3] == (1, 0.0, 1)


@pytest.mark.asyncio
async def test_the_dump_rides_on_stacks_dumped_and_each_reaped_event(tmp_path: Path) -> None:
    policy = ReapPolicy(Escalation(dump=True, dump_timeout=2.0, grace=1.0))
    reaper = RecordingReaper(stack_dump="Thread 0x1 in stuck_here")
    log = tmp_path / "events.jsonl"
    async with rig(policy=policy, reaper=reaper, event_log=log) as r:
        r.acquire(P1, "a", at=1.0)
        await r.advance(1.0)
        await r.advance(1.0)
        [dumped] = r.of(StacksDumped)
        assert (dumped.text, dumped.step, dumped.steps) == ("Thread 0x1 in stuck_here", 1, 3)
        reaped = r.of(WorkerReaped)
        assert [(e.signal, e.stacks) for e in reaped] == [(KILL, "Thread 0x1 in stuck_here")]
        assert [e.signal for e in r.of(SignalSent)] == [TERM]
        assert r.reaper.methods(P1)[2:5] == ["dump_stacks", "signal", "signal"]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [rec["stacks"] for rec in records if rec["event"] == "worker_reaped"] == [
        "Thread 0x1 in stuck_here"
    ]


class HangingDumpReaper(RecordingReaper):
    """A reaper whose dump never returns (a broken custom reaper)."""

    async def dump_stacks(self, pid: int, timeout: float) -> str | None:
        await super().dump_stacks(pid, timeout)
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


@pytest.mark.asyncio
async def test_a_dump_that_overruns_is_cut_off_and_the_kill_still_happens() -> None:
    policy = ReapPolicy(Escalation(dump=True, dump_timeout=2.0, soft_signal=None))
    async with rig(policy=policy, reaper=HangingDumpReaper()) as r:
        r.acquire(P1, "a", at=1.0)
        await r.advance(1.0)
        await r.advance(2.9)  # the reaper's own bound (2 s) plus most of DUMP_SLACK (1 s)
        assert r.reaper.signals() == []
        await r.advance(0.1)
        [dumped] = r.of(StacksDumped)
        assert dumped.text is None
        assert dumped.reason is not None and "cut off" in dumped.reason
        assert r.reaper.signals() == [(P1, KILL)]


@pytest.mark.asyncio
async def test_a_reaper_without_a_dump_says_why_on_the_event() -> None:
    policy = ReapPolicy(Escalation(dump=True, dump_timeout=2.0, soft_signal=None))
    reaper = RecordingReaper(stack_dump=NoDump("no dump hook in the worker"))
    async with rig(policy=policy, reaper=reaper) as r:
        r.acquire(P1, "a", at=1.0)
        await r.advance(1.0)
        [dumped] = r.of(StacksDumped)
        assert (dumped.text, dumped.reason) == (None, "no dump hook in the worker")
        assert "no dump hook in the worker" in dumped.describe()
        assert r.reaper.signals() == [(P1, KILL)]


# -- thread mode -----------------------------------------------------------------------------


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_thread_mode_reaps_and_stops(loop: Literal["asyncio", "uvloop"]) -> None:
    reaped = threading.Event()
    events: list[Event] = []

    def on_event(event: Event) -> None:
        events.append(event)
        if isinstance(event, WorkerReaped):
            reaped.set()

    server = TimerServer(reaper=RecordingReaper(), on_event=on_event)
    runner = TimerServerThread(server, loop=loop)
    with runner:
        assert runner.running and server.state is LifecycleState.RUNNING
        server.acquire("from-another-thread", 0.05, pid=P4242)  # thread-safe
        assert reaped.wait(10.0), "the timer did not expire within 10 s"
        with pytest.raises(ServerStateError, match="already started"):
            runner.start()
    assert not runner.running and server.state is LifecycleState.STOPPED
    runner.stop()  # idempotent
    runner.start()  # and restartable
    runner.stop(timeout=10.0)
    assert [e.kind for e in events].count("server_started") == 2
    assert not any(t.name == "aiotimer-server" for t in threading.enumerate())


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_thread_mode_requests_apply_in_order_before_a_later_call(
    loop: Literal["asyncio", "uvloop"],
) -> None:
    server = TimerServer(reaper=RecordingReaper())
    with TimerServerThread(server, loop=loop):
        for i in range(50):  # new workers: each one attaches (anyio primitives, a task)
            server.acquire(f"s{i}", 60.0, pid=P1 + i)
        # Taken in the loop, after every request this thread submitted: all 50, always.
        assert len(server.get_state().timers) == 50
        assert server.get_state().workers == tuple(range(P1, P1 + 50))
    with pytest.raises(ServerStateError):
        server.release("s0", pid=P1)


@pytest.mark.asyncio
async def test_acquire_from_a_plain_loop_callback_is_applied() -> None:
    reaper = RecordingReaper()
    async with TimerServer(reaper=reaper) as server:
        asyncio.get_running_loop().call_soon(
            lambda: server.acquire("from-a-callback", 60.0, pid=P4242)
        )
        with anyio.fail_after(5):
            while not server.get_state().timers:
                await anyio.sleep(0.001)
        assert server.get_state().workers == (P4242,)


def test_thread_mode_start_failure_is_raised_in_caller() -> None:
    server = TimerServer(sources=[_FailingSource(before_start=True)], reaper=RecordingReaper())
    runner = TimerServerThread(server)
    with pytest.raises(SourceError, match="cannot open"):
        runner.start()
    assert not runner.running


# -- bounded work and caps -------------------------------------------------------------------


@pytest.mark.asyncio
async def test_timer_caps_reject_new_timers_clearly_but_let_existing_ones_move() -> None:
    async with rig(max_timers=3, max_timers_per_worker=2) as r:
        for scope in ("a", "b", "c"):
            r.acquire(P1, scope, at=10.0)
        await settle()
        [per_worker] = r.of(RequestRejected)
        assert f"worker {P1} holds 2 timers (max_timers_per_worker=2)" in per_worker.reason
        assert per_worker.line == f"acquire 'c' of pid {P1}" and per_worker.pid == P1
        r.acquire(P1, "a", at=20.0)  # an existing key may still move
        r.acquire(P2, "x", at=10.0)
        r.acquire(P3, "y", at=10.0)  # the fourth timer in all: P1, holding most, makes room
        await settle()
        [evicted] = r.of(TimerEvicted)
        assert (evicted.pid, evicted.holds, evicted.for_pid) == (P1, 2, P3)
        r.acquire(P2, "z", at=10.0)  # everyone holds one now: nobody makes room
        await settle()
        refused = r.of(RequestRejected)[-1]
        assert "the server holds 3 timers (max_timers=3)" in refused.reason
        assert refused.pid == P2
        state = r.server.get_state()
        assert sorted(t.pid for t in state.timers) == sorted([P1, P2, P3])
        assert (state.counters.rejected, state.counters.cap_rejected) == (2, 2)
        assert state.counters.evicted == 1


@pytest.mark.asyncio
async def test_many_timers_of_one_worker_expiring_together_make_one_reap_and_one_event() -> None:
    async with rig() as r:
        for i in range(5000):
            r.acquire(P1, f"s{i}", at=1.0)
        r.acquire(P2, "other", at=1.0)
        await settle()
        await r.advance(1.0)
        assert sorted(r.reaper.signals()) == [(P1, KILL), (P2, KILL)]
        assert [e.pid for e in r.of(TimerExpired)] == [P1, P2]
        [reaped] = [e for e in r.of(WorkerReaped) if e.pid == P1]
        assert len(reaped.scopes) == 100 and reaped.omitted == 4900
        assert r.server.get_state().timers == ()


# -- draining before an expiry ----------------------------------------------------------------


class HeldSource:
    """A source whose input is only ever read by its drain (as a FIFO's is, when the
    loop stalled and the reader task has not run yet). Its drain finds a due worker in
    what it holds exactly when a held request names one."""

    name = "held"

    def __init__(self, pause: float = 0.0) -> None:
        self.held: list[Request] = []
        self.looked: list[set[int]] = []
        self.drained = 0
        self.pause = pause  # wall time each step waits without using the CPU
        self._due = 0  # held requests the current drain returns

    def hold(self) -> None:
        pass

    def look(self, pids: AbstractSet[int] | None) -> bool:
        self.looked.append(set(pids) if pids is not None else {-1})
        named = [i for i, req in enumerate(self.held) if pids is None or req.pid in pids]
        self._due = named[-1] + 1 if named else 0
        return self._due > 0

    def step(self) -> Decoded | None:
        if self._due <= 0:
            return None
        time.sleep(self.pause)
        self.drained += 1
        self._due -= 1
        return Decoded([self.held.pop(0)], [])

    async def serve(
        self,
        sink: RequestSink,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        with draining(sink, self):
            task_status.started()
            await anyio.sleep_forever()


@pytest.mark.asyncio
async def test_a_release_waiting_in_a_source_wins_over_its_deadline() -> None:
    held = HeldSource()
    async with rig(sources=[held]) as r:
        r.acquire(P1, "a", at=1.0)
        r.acquire(P2, "b", at=1.0)
        await settle()
        held.held += [Request(P1, "a", -1, 0), Request(P3, "c", -1, 0)]
        await r.advance(1.0)
        assert r.reaper.signals() == [(P2, KILL)]  # 1 released in time, 2 did not
        # Applied up to the last request naming a due worker (and all before it).
        assert held.held == [Request(P3, "c", -1, 0)] and held.drained == 1
        # Then, once reaped worker 2 is gone, for what it wrote before its timers go.
        assert held.looked == [{P1, P2}, {P2}]


@pytest.mark.asyncio
async def test_input_naming_no_due_worker_is_left_to_the_reader() -> None:
    held = HeldSource()
    async with rig(sources=[held]) as r:
        r.acquire(P1, "a", at=1.0)
        await settle()
        held.held += [Request(P2, "b", -1, 0), Request(P3, "c", -1, 0)]
        await r.advance(1.0)
        assert r.reaper.signals() == [(P1, KILL)]
        assert held.drained == 0 and len(held.held) == 2


@pytest.mark.asyncio
async def test_an_expired_acquire_applied_by_a_drain_is_looked_for_before_it_is_acted_on() -> None:
    """Applying held input makes worker 3 due (its acquire has expired already): the
    drain is asked about it too, and its release, further on, wins."""
    held = HeldSource()
    async with rig(sources=[held]) as r:
        r.acquire(P1, "a", at=1.0)
        await settle()
        held.held += [
            Request(P3, "late", 0.0, KILL, mono=0.5),
            Request(P1, "a", -1, 0),
            Request(P3, "late", -1, 0),
        ]
        await r.advance(1.0)
        assert r.reaper.signals() == []
        assert held.looked == [{P1}, {P3}] and held.held == []


class BrokenSource(HeldSource):
    """A drain that raises in ``look`` or in ``step``."""

    def __init__(self, broken: str) -> None:
        super().__init__()
        self.name = f"broken-{broken}"
        self.broken = broken

    def look(self, pids: AbstractSet[int] | None) -> bool:
        if self.broken == "look":
            raise RuntimeError("look failed")
        return super().look(pids)

    def step(self) -> Decoded | None:
        if self.broken == "step":
            raise RuntimeError("step failed")
        return super().step()


@pytest.mark.asyncio
@pytest.mark.parametrize("broken", ["look", "step"])
async def test_a_broken_drain_is_logged_and_skipped_and_the_others_still_win(
    broken: str, caplog: pytest.LogCaptureFixture
) -> None:
    held, bad = HeldSource(), BrokenSource(broken)
    async with rig(sources=[bad, held]) as r:
        r.acquire(P1, "a", at=1.0)
        r.acquire(P2, "b", at=1.0)
        await settle()
        held.held.append(Request(P1, "a", -1, 0))
        bad.held.append(Request(P2, "b", -1, 0))
        with caplog.at_level(logging.ERROR, logger="aiotimer"):
            await r.advance(1.0)
        assert f"draining broken-{broken} before an expiry failed" in caplog.text
        assert r.reaper.signals() == [(P2, KILL)]  # P1 released through the healthy drain
        assert held.held == [] and bad.held == [Request(P2, "b", -1, 0)]


@pytest.mark.asyncio
async def test_with_more_timers_due_than_a_slice_the_drains_look_for_anyone() -> None:
    held = HeldSource()
    async with rig(sources=[held]) as r:
        for pid in range(P2, P2 + EXPIRE_BUDGET + 10):
            r.acquire(pid, "a", at=1.0)
        await settle()
        held.held += [Request(P2, "a", -1, 0), Request(P7, "a", -1, 0)]
        await r.advance(1.0)
        assert held.looked[0] == {-1}  # anyone: too many due to name them
        killed = {pid for pid, _ in r.reaper.signals()}
        assert killed == set(range(P2, P2 + EXPIRE_BUDGET + 10)) - {P2, P7}


@pytest.mark.asyncio
async def test_a_server_starved_of_cpu_still_drains_every_waiting_release() -> None:
    """The drain budget counts the server's CPU time: 20 drains of 1 ms of wall time
    each (4 times the budget in wall time) all run before the expiry is acted on."""
    held = HeldSource(pause=0.001)
    reaper = RecordingReaper()
    async with TimerServer(sources=[held], reaper=reaper, clock=MonotonicClock()) as server:
        deadline = time.monotonic() + 0.2
        pids = range(P1, P1 + 20)
        submit = server.submit
        for pid in pids:
            submit(Request(pid, "a", 0.0, KILL, mono=deadline))
        held.held += [Request(pid, "a", -1, 0) for pid in pids]
        await anyio.sleep(deadline + 0.2 - time.monotonic())
        assert reaper.signals() == []
        assert held.held == [] and server.get_state().timers == ()


class _OutOfDescriptors(RecordingReaper):
    """Attaching fails with EMFILE ``failures`` times, then works."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def attach(self, pid: int, *, start_time: int | None = None) -> bool:
        if self.failures > 0:
            self.failures -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return super().attach(pid, start_time=start_time)


@pytest.mark.asyncio
async def test_out_of_descriptors_keeps_the_timer_and_pins_again_at_expiry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with rig(reaper=_OutOfDescriptors(failures=1)) as r:
        with caplog.at_level(logging.CRITICAL, logger="aiotimer"):
            r.acquire(P1, "a", at=1.0)
            await settle()
        assert "out of file descriptors" in caplog.text
        assert r.of(WorkerUnknown) == [], "never reported as an unknown worker"
        assert len(r.server.get_state().timers) == 1
        await r.advance(1.0)  # a descriptor is free again: pinned, then reaped
        assert r.reaper.signals() == [(P1, KILL)]


@pytest.mark.asyncio
async def test_still_out_of_descriptors_at_expiry_is_reported_never_signalled() -> None:
    async with rig(reaper=_OutOfDescriptors(failures=2)) as r:
        r.acquire(P1, "a", at=1.0)
        await r.advance(1.0)
        assert r.reaper.signals() == []
        [expired] = r.of(TimerExpired)
        assert expired.report_only and "file descriptors" in expired.action


@pytest.mark.asyncio
async def test_a_request_submitted_by_an_event_callback_waits_for_the_batch_to_end() -> None:
    """A callback that submits while the engine applies a batch does not cut into it:
    its release of B comes after the batch's acquire of B, so B ends released."""
    server_box: list[TimerServer] = []

    def on_event(event: Event) -> None:
        if isinstance(event, TimerAcquired) and event.scope_id == "a":
            server_box[0].release("b", pid=event.pid)

    async with rig(on_event=on_event, request_events=True) as r:
        server_box.append(r.server)
        wall = r.clock.time() + 60.0
        lines = [
            f'{{"pid": 900, "scope_id": "{s}", "expiration_time": {wall!r}, "signal": 9}}\n'
            for s in ("a", "b")
        ]
        r.source.push_bytes("".join(lines).encode())  # one batch
        await settle()
        assert [t.scope_id for t in r.server.get_state().timers] == ["a"]
