"""The control socket in process: endpoints, limits, access, events and metrics.

The server runs in the test's loop with a recording reaper and a control plane composed
around it; the blocking client talks to it from a worker thread, as ``aiotimer status``
would from another process.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeVar

import anyio
import pytest
from _pids import fake_pid

from aiotimer import Escalation, ReapPolicy
from aiotimer import events as ev
from aiotimer.control import ControlClient, ControlPlane, StatusSnapshot
from aiotimer.core import Timer
from aiotimer.errors import ControlError, ServerUnavailableError
from aiotimer.server import TimerInfo, TimerServer
from aiotimer.server import _view as server_view
from aiotimer.server._document import timer_info
from aiotimer.testing import MemorySource, RecordingReaper, settle, wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]

_T = TypeVar("_T")

#: Made-up workers (see tests/_pids.py): never this process, pid 1 or a live one.
P4242, P4343 = fake_pid(4242), fake_pid(4343)


async def call(fn: Callable[[], _T]) -> _T:
    """Run the blocking client call ``fn`` in a thread, as another process would."""
    return await anyio.to_thread.run_sync(fn)


@asynccontextmanager
async def serving(
    tmp_path: Path, *, metrics_port: int | None = None, **kwargs: object
) -> AsyncIterator[tuple[TimerServer, ControlClient, list[ev.Event]]]:
    seen: list[ev.Event] = []
    kwargs.setdefault("reaper", RecordingReaper())
    path = tmp_path / "ctl" / "http.sock"
    server = TimerServer(
        sources=[MemorySource()],
        on_event=seen.append,
        **kwargs,  # type: ignore[arg-type]
    )
    async with server, ControlPlane(server, path=path, metrics_port=metrics_port):
        yield server, ControlClient(path, timeout=5.0), seen


def reaped(server: TimerServer) -> int:
    return server.snapshot(0).counters.reaped


async def test_state_lists_timers_workers_and_counters(tmp_path: Path) -> None:
    async with serving(tmp_path) as (server, client, _):
        server.acquire("load", 60, pid=P4242)
        server.acquire("step", 30, pid=P4242)
        server.acquire("mine", 90)  # the server's own process: listed, never watched
        snap = await call(client.state)
    assert isinstance(snap, StatusSnapshot)
    assert snap.server.pid == os.getpid() and snap.server.state == "running"
    assert snap.server.control == str(tmp_path / "ctl" / "http.sock")
    assert [(t.pid, t.scope_id) for t in snap.timers] == [
        (P4242, "step"),
        (P4242, "load"),
        (os.getpid(), "mine"),
    ]
    assert 29 < snap.timers[0].seconds_left <= 30
    assert abs(snap.timers[0].deadline - (time.time() + snap.timers[0].seconds_left)) < 1
    workers = {w.pid: w for w in snap.workers}
    assert workers[P4242].state == "timed" and workers[P4242].timers == 2
    assert set(workers[P4242].scopes) == {"load", "step"}
    assert workers[os.getpid()].timers == 1
    assert snap.counters["acquired"] == 3 and snap.timers_total == 3
    assert not snap.truncated


async def test_lists_are_cut_at_the_limit_with_exact_totals(tmp_path: Path) -> None:
    async with serving(tmp_path) as (server, client, _):
        for i in range(50):
            server.acquire(f"s{i}", 100 - i, pid=fake_pid(1000 + i % 10))
        snap = await call(lambda: client.state(limit=5))
    assert [t.scope_id for t in snap.timers] == ["s49", "s48", "s47", "s46", "s45"]
    assert snap.timers_total == 50 and snap.workers_total == 10
    assert len(snap.workers) == 5 and snap.truncated


async def test_events_since_a_number(tmp_path: Path) -> None:
    async with serving(tmp_path) as (server, client, _):
        first = await call(client.events)
        assert [e["event"] for e in first.events] == ["server_started"]
        server.acquire("late", 0, pid=P4242)  # expires at once: expired, then reaped
        await wait_until(lambda: reaped(server) == 1)
        page = await call(lambda: client.events(since=first.last))
    kinds = [e["event"] for e in page.events]
    assert kinds[:2] == ["timer_expired", "worker_reaped"]
    assert [e["seq"] for e in page.events] == list(range(first.last + 1, page.last + 1))
    assert page.missed == 0


async def test_metrics_come_from_the_servers_own_state(tmp_path: Path) -> None:
    async with serving(tmp_path) as (server, client, _):
        server.acquire("a", 60, pid=P4242)
        server.acquire("b", 0, pid=P4343)
        await wait_until(lambda: reaped(server) == 1)
        text = await call(client.metrics)
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    assert float(lines["aiotimer_live_timers"]) == 1
    assert float(lines['aiotimer_workers{state="timed"}']) == 1
    assert float(lines["aiotimer_requests_total"]) == 2
    assert float(lines["aiotimer_reaps_total"]) == 1
    assert float(lines["aiotimer_reap_latency_seconds_count"]) == 1
    assert float(lines['aiotimer_reap_latency_seconds_bucket{le="+Inf"}']) == 1


async def test_dump_of_a_worker_on_demand(tmp_path: Path) -> None:
    reaper = RecordingReaper(stack_dump="Thread 0x1 (most recent call first)")
    async with serving(tmp_path, reaper=reaper) as (server, client, _):
        server.acquire("a", 60, pid=P4242)
        text = await call(lambda: client.dump(P4242, timeout=1))
        with pytest.raises(ControlError, match="404"):
            await call(lambda: client.dump(fake_pid(999), timeout=1))
    assert text == reaper.stack_dump
    assert reaper.methods(P4242).count("dump_stacks") == 1
    assert "signal" not in reaper.methods(P4242)


async def test_bad_requests_get_clear_errors(tmp_path: Path) -> None:
    async with serving(tmp_path) as (_, client, _):
        with pytest.raises(ControlError, match=r"404.*no such endpoint"):
            await call(lambda: client.get("/v2/state"))
        with pytest.raises(ControlError, match=r"405.*use GET"):
            await call(lambda: client.request("POST", "/v1/state"))
        with pytest.raises(ControlError, match=r"400.*limit must be"):
            await call(lambda: client.get("/v1/state", {"limit": "lots"}))


async def test_socket_and_directory_are_private(tmp_path: Path) -> None:
    server = TimerServer(sources=[MemorySource()], reaper=RecordingReaper())
    async with server, ControlPlane(server, path=tmp_path / "ctl" / "http.sock") as plane:
        path = plane.path
        assert path is not None
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert not path.exists() and not path.parent.exists()  # cleaned up on stop
    assert plane.path is None


async def test_a_live_socket_is_never_taken_over(tmp_path: Path) -> None:
    async with serving(tmp_path) as (_, client, _):
        second = TimerServer(sources=[MemorySource()])
        plane = ControlPlane(second, path=client.path)
        with pytest.raises(ControlError, match="another server listens"):
            await plane.start()
        assert (await call(client.state)).server.state == "running"


async def test_a_stale_socket_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "ctl" / "http.sock"
    path.parent.mkdir()
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(str(path))  # bound, never listening: what a killed server leaves
    async with serving(tmp_path) as (_, client, _):
        assert (await call(client.state)).server.state == "running"


async def test_something_else_in_the_way_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ctl" / "http.sock"
    path.parent.mkdir()
    path.write_text("not a socket")
    plane = ControlPlane(TimerServer(sources=[MemorySource()]), path=path)
    with pytest.raises(ControlError, match="not a socket"):
        await plane.start()
    assert path.read_text() == "not a socket"


async def test_nothing_serves_a_missing_socket(tmp_path: Path) -> None:
    client = ControlClient(tmp_path / "none.sock")
    with pytest.raises(ServerUnavailableError, match="missing"):
        await call(client.state)


async def test_the_fifo_marker_names_the_control_socket(tmp_path: Path) -> None:
    fifo = tmp_path / "t.fifo"
    async with (
        TimerServer(fifo=fifo, reaper=RecordingReaper()) as server,
        ControlPlane(server) as plane,
    ):
        assert plane.path == tmp_path / "t.fifo.control" / "http.sock"
        snap = await call(ControlClient.for_fifo(fifo).state)
        assert snap.server.fifo == str(fifo)
        assert snap.server.control == str(plane.path)
    # The plane started first names its socket from the marker's first write, and the
    # marker stops naming it once the plane stops (the server still runs).
    server = TimerServer(fifo=fifo, reaper=RecordingReaper())
    async with ControlPlane(server) as plane, server:
        assert (await call(ControlClient.for_fifo(fifo).state)).server.state == "running"
        await plane.aclose()
        with pytest.raises(ControlError, match="without a control socket"):
            ControlClient.for_fifo(fifo)
    async with TimerServer(fifo=fifo, reaper=RecordingReaper()):  # no plane composed
        with pytest.raises(ControlError, match="without a control socket"):
            ControlClient.for_fifo(fifo)


async def test_a_plane_without_a_path_beside_no_fifo_is_a_clear_error() -> None:
    plane = ControlPlane(TimerServer(sources=[MemorySource()]))
    with pytest.raises(ControlError, match="no FIFO to put it beside"):
        await plane.start()
    assert repr(plane) == "<ControlPlane created>"  # refused before it started


async def test_async_on_event_is_awaited_in_order_and_cannot_stall(tmp_path: Path) -> None:
    got: list[str] = []
    release = anyio.Event()

    async def slow(event: ev.Event) -> None:
        await release.wait()  # a callback stuck on I/O
        got.append(event.kind)

    reaper = RecordingReaper()
    async with TimerServer(sources=[MemorySource()], reaper=reaper, on_event=slow) as server:
        for i in range(3):
            server.acquire(f"t{i}", 0, pid=fake_pid(4000 + i))
        # Expiry and reaping went on while the callback was stuck.
        await wait_until(lambda: len(reaper.signals()) == 3)
        release.set()
        await wait_until(lambda: got.count("worker_reaped") == 3)
    assert got[0] == "server_started" and got[-1] == "server_stopped"


async def test_events_iterator_ends_when_the_server_stops(tmp_path: Path) -> None:
    kinds: list[str] = []
    server = TimerServer(sources=[MemorySource()], reaper=RecordingReaper())
    async with anyio.create_task_group() as tg:

        async def read() -> None:
            async for event in server.events():
                kinds.append(event.kind)

        tg.start_soon(read)
        await settle()
        async with server:
            server.acquire("x", 0, pid=P4242)
            await wait_until(lambda: "worker_reaped" in kinds)
    assert kinds[0] == "server_started" and kinds[-1] == "server_stopped"


async def test_a_blocked_loop_is_reported_as_loop_lag(tmp_path: Path) -> None:
    async with serving(tmp_path, lag_threshold=0.1) as (server, client, seen):
        server.acquire("x", 0.05, pid=P4242)
        time.sleep(0.4)  # the host program blocks the loop past the deadline
        await wait_until(lambda: any(isinstance(e, ev.LoopLagged) for e in seen))
        snap = await call(client.state)
    lag = next(e for e in seen if isinstance(e, ev.LoopLagged))
    assert 0.25 < lag.lag < 5 and lag.expired == 1
    assert snap.server.max_loop_lag == lag.lag


async def test_a_snapshot_from_another_thread_is_taken_in_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Copied in the loop, built in the caller's thread: converting a full listing's
    timers to the document's rows does not hold up the loop."""
    converted_in: set[int] = set()

    def recording(timer: Timer, wall: float, mono: float) -> TimerInfo:
        converted_in.add(threading.get_ident())
        return timer_info(timer, wall, mono)

    monkeypatch.setattr(server_view, "timer_info", recording)
    async with serving(tmp_path) as (server, _, _):
        server.acquire("x", 60, pid=P4242)
        snap = await call(server.snapshot)
        assert converted_in and threading.get_ident() not in converted_in
        converted_in.clear()
        assert server.snapshot().document.timers[0].scope_id == "x"  # in the loop: built here
        assert converted_in == {threading.get_ident()}
    assert snap.document.timers_total == 1 and snap.document.timers[0].scope_id == "x"


async def test_a_worker_being_reaped_is_listed_as_reaping(tmp_path: Path) -> None:
    ladder = Escalation(soft_signal=signal.SIGTERM, grace=30.0, kill_signal=signal.SIGKILL)
    async with serving(tmp_path, policy=ReapPolicy(ladder)) as (server, client, seen):
        server.acquire("stuck", 0, pid=P4242)  # SIGTERM now, SIGKILL in 30 s
        server.acquire("fine", 60, pid=P4343)
        await wait_until(lambda: any(isinstance(e, ev.SignalSent) for e in seen))
        snap = await call(client.state)
        text = await call(client.metrics)
    assert {w.pid: w.state for w in snap.workers} == {P4242: "reaping", P4343: "timed"}
    assert 'aiotimer_workers{state="reaping"} 1.0' in text.splitlines()
    assert 'aiotimer_workers{state="idle"} 0.0' in text.splitlines()


async def test_metrics_over_loopback_tcp_only_metrics(tmp_path: Path) -> None:
    server = TimerServer(sources=[MemorySource()], reaper=RecordingReaper())
    async with server, ControlPlane(server, path=False, metrics_port=0) as plane:
        port = plane.metrics_port
        assert port is not None and plane.path is None
        server.acquire("a", 60, pid=P4242)

        def get(path: str) -> tuple[int, str]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as exc:
                return exc.code, ""

        status, text = await call(lambda: get("/metrics"))
        assert status == 200 and "aiotimer_live_timers 1.0" in text.splitlines()
        assert (await call(lambda: get("/v1/state")))[0] == 404
        assert repr(plane) == f"<ControlPlane running: metrics 127.0.0.1:{port}>"
