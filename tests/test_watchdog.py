"""``watchdog()``: kicks push the deadline; client-side rate limiting keeps its guarantee."""

from __future__ import annotations

import asyncio
import time

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiotimer.errors import ServerUnavailableError
from aiotimer.testing import FakeClock, RecordingClient
from aiotimer.watchdog import LoopWatchdog, Watchdog, loop_watchdog, watchdog
from aiotimer.wire import Request


def test_entry_is_the_first_kick_and_exit_releases() -> None:
    clock, client = FakeClock(100.0), RecordingClient()
    with watchdog(30, client=client, clock=clock) as wd:
        assert isinstance(wd, Watchdog)
        [first] = client.requests
        assert first.mono == 130.0
        assert first.expiration_time == clock.time() + 30
        assert first.scope_id.startswith("test_watchdog.py:")
    assert client.requests[-1].is_release
    assert client.requests[-1].scope_id == first.scope_id


def test_kicks_within_the_interval_are_recorded_not_sent() -> None:
    clock, client = FakeClock(), RecordingClient()
    with watchdog(10, client=client, clock=clock, min_kick_interval=1.0) as wd:
        for _ in range(7):
            clock.advance(0.125)  # exact in binary: no rounding at the boundary
            wd.kick()
        assert wd.sent == 1 and wd.last_kick == 0.875
        clock.advance(0.125)
        wd.kick()  # 1.0 s after the last one sent: goes out
        assert wd.sent == 2
        assert client.acquires()[-1].mono == pytest.approx(11.0)
        assert wd.server_deadline == pytest.approx(11.0)


def test_default_interval_is_a_tenth_of_the_timeout() -> None:
    assert watchdog(30, client=RecordingClient()).min_kick_interval == 3.0


@pytest.mark.parametrize("interval", [-1.0, 10.0, 11.0])
def test_interval_must_be_below_the_timeout(interval: float) -> None:
    with pytest.raises(ValueError):
        watchdog(10, client=RecordingClient(), min_kick_interval=interval)


def test_kick_outside_the_block_is_an_error() -> None:
    wd = watchdog(10, client=RecordingClient())
    with pytest.raises(RuntimeError):
        wd.kick()
    with wd:
        pass
    with pytest.raises(RuntimeError):
        wd.kick()


def test_body_exception_is_not_masked_by_a_failing_release() -> None:
    client = RecordingClient()
    client.fail_release = ServerUnavailableError("gone")
    with pytest.raises(KeyError), watchdog(10, client=client):
        raise KeyError("body")


@pytest.mark.asyncio
async def test_async_face_kicks_by_awaiting() -> None:
    clock, client = FakeClock(), RecordingClient()
    async with watchdog(5, client=client, clock=clock, min_kick_interval=0.5) as wd:
        for _ in range(10):
            clock.advance(0.25)
            await wd.akick()
            await anyio.lowlevel.checkpoint()
    assert wd.sent == 1 + 5  # entry, then every second kick
    assert client.requests[-1].is_release
    assert "exited" in repr(wd)


@given(
    timeout=st.floats(0.5, 100),
    fraction=st.floats(0, 0.9),
    gaps=st.lists(st.floats(0, 20), max_size=60),
)
def test_the_server_deadline_stays_within_the_guarantee(
    timeout: float, fraction: float, gaps: list[float]
) -> None:
    """After every kick: last + timeout - interval <= server deadline <= last + timeout."""
    clock, client = FakeClock(), RecordingClient()
    interval = timeout * fraction
    with watchdog(timeout, client=client, clock=clock, min_kick_interval=interval) as wd:
        for gap in gaps:
            clock.advance(gap)
            wd.kick()
            deadline = client.acquires()[-1].mono
            assert deadline is not None
            assert deadline == wd.server_deadline
            slack = 1e-9 * max(1.0, abs(deadline))
            assert wd.last_kick + timeout - interval - slack <= deadline
            assert deadline <= wd.last_kick + timeout + slack


# -- the loop watchdog ------------------------------------------------------------------


@pytest.mark.asyncio
async def test_the_loop_watchdog_keeps_the_deadline_ahead_while_the_loop_runs() -> None:
    client = RecordingClient()
    async with loop_watchdog(0.2, client=client, scope="loop") as lw:
        assert isinstance(lw, LoopWatchdog) and lw.period == pytest.approx(0.05)
        entered = time.monotonic()
        [first] = client.requests
        assert first.mono is not None
        assert entered - 0.25 <= first.mono - 0.25 <= entered  # stall_after + period ahead
        while len(client.acquires()) < 3:  # the kicker runs on the loop
            await asyncio.sleep(0.01)
        for kick in client.acquires():
            assert kick.scope_id == "loop" and kick.signal == 9
    count = len(client.requests)
    assert client.requests[-1].is_release
    await asyncio.sleep(0.2)  # four periods: the kicker is gone
    assert len(client.requests) == count


class FlakyClient(RecordingClient):
    """Fails the second acquire, as a client does while its server is away."""

    def send(self, request: Request) -> None:
        if not request.is_release and len(self.acquires()) == 1 and not self.failed:
            self.failed = True
            raise ServerUnavailableError("no server read the FIFO (test)")
        super().send(request)

    failed = False


@pytest.mark.asyncio
async def test_a_kick_that_fails_is_logged_and_the_loop_watchdog_kicks_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = FlakyClient()
    async with loop_watchdog(0.2, client=client, scope="loop"):
        with anyio.fail_after(10):
            while len(client.acquires()) < 3:  # entry, then kicks after the failed one
                await asyncio.sleep(0.01)
    assert client.failed and client.requests[-1].is_release
    assert "a kick was not delivered (ServerUnavailableError" in caplog.text


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_stall_after_must_be_a_finite_number_above_zero(bad: float) -> None:
    with pytest.raises(ValueError, match="stall_after"):
        loop_watchdog(bad, client=RecordingClient())
