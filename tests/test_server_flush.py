"""TimerServer.flush: one synchronous round (take what the sources hold, apply it, reap
what is due), unit layer: FakeClock + RecordingReaper + test_server's HeldSource, whose
input reaches the server only through its drain, as a FIFO's bytes wait for its read
loop."""

from __future__ import annotations

import signal

import pytest
from _pids import fake_pid
from test_server import HeldSource

from aiotimer import Request
from aiotimer.errors import ServerStateError
from aiotimer.events import Event, TimerExpired
from aiotimer.server import TimerServer
from aiotimer.testing import FakeClock, RecordingReaper, settle

KILL = int(signal.SIGKILL)
P1, P2, P3 = map(fake_pid, (1, 2, 3))


def acquire(clock: FakeClock, pid: int, scope: str, at: float) -> Request:
    return Request(pid, scope, at + clock.time() - clock.monotonic(), KILL, mono=at)


@pytest.mark.asyncio
async def test_flush_applies_held_input_reaps_what_is_due_and_rearms_for_the_rest() -> None:
    clock, reaper, source = FakeClock(), RecordingReaper(), HeldSource()
    async with TimerServer(sources=[source], clock=clock, reaper=reaper) as server:
        await settle()
        now = clock.monotonic()
        source.held += [
            acquire(clock, P1, "due", now - 1),
            acquire(clock, P2, "later", now + 5),
            acquire(clock, P3, "done", now + 1),
            Request(P3, "done", -1, 0),
        ]
        server.flush()
        # Synchronously: everything held is applied, the due worker reaped.
        assert source.held == []
        assert reaper.signals() == [(P1, KILL)]
        assert [(t.pid, t.scope_id) for t in server.get_state().timers] == [(P2, "later")]
        assert server.get_state().counters.requests == 4
        # The expiry task (asleep with an empty table before) wakes at the new deadline.
        clock.advance(4.999)
        await settle()
        assert reaper.signals() == [(P1, KILL)]
        clock.advance(0.001)
        await settle()
        assert reaper.signals() == [(P1, KILL), (P2, KILL)]


@pytest.mark.asyncio
async def test_flush_with_nothing_held_and_nothing_due_changes_nothing() -> None:
    clock, reaper = FakeClock(), RecordingReaper()
    async with TimerServer(sources=[HeldSource()], clock=clock, reaper=reaper) as server:
        server.flush()
        assert server.get_state().counters.requests == 0
        assert reaper.calls == []


@pytest.mark.asyncio
async def test_flush_refuses_a_server_not_running_and_its_own_event_callback() -> None:
    clock, source = FakeClock(), HeldSource()
    refused: list[str] = []

    def on_event(event: Event) -> None:
        if isinstance(event, TimerExpired):
            try:
                server.flush()
            except RuntimeError as exc:
                refused.append(str(exc))

    server = TimerServer(sources=[source], clock=clock, reaper=RecordingReaper(), on_event=on_event)
    with pytest.raises(ServerStateError, match="not running"):
        server.flush()
    async with server:
        source.held.append(acquire(clock, P1, "due", clock.monotonic()))
        server.flush()
    assert len(refused) == 1
    assert "event callback" in refused[0]
    with pytest.raises(ServerStateError, match="not running"):
        server.flush()
