"""aiotimer.compat.torch: torch's API on aiotimer's engine, without torch.

The second half ports the scenarios of torch's own timer tests (``api_test.py``,
``local_timer_test.py``, ``file_based_local_timer_test.py``) to the compat module: the
polling ABC's watchdog round, the request queue, expired/valid/released timers, no client
configured, exception propagation, recursive scopes, many concurrent clients, a worker
that exits before releasing, and a stuck worker. Where aiotimer's semantics differ
(unique default scopes, no self-kill, no negative pids) the test pins aiotimer's.

Server-side scenarios use :class:`~aiotimer.testing.RecordingReaper` (nothing is killed)
unless they are about real processes; those are marked ``process`` and use generous,
documented tolerances.
"""

from __future__ import annotations

import json
import logging
import math
import multiprocessing
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from _pids import fake_pid
from _waits import WAIT, Events, wait_until
from hypothesis import given
from hypothesis import strategies as st

import aiotimer.compat.torch as timer
from aiotimer._edges.clock import MonotonicClock
from aiotimer.errors import (
    NotConfiguredError,
    ServerStateError,
    ServerUnavailableError,
    SourceError,
)
from aiotimer.events import (
    RequestRejected,
    ServerStarted,
    TimerExpired,
    WorkerExited,
    WorkerReaped,
)
from aiotimer.testing import RecordingReaper
from aiotimer.wire import LineDecoder, Request, encode

#: Pids for timers of fake workers (see tests/_pids.py): no process has them.
FAKE_PID, OTHER_FAKE_PID = fake_pid(1), fake_pid(2)

FORK = multiprocessing.get_context("fork")

LocalServer = tuple[timer.LocalTimerServer, "queue.Queue[Any]"]


# -- helpers ------------------------------------------------------------------------------


class RecordingClient(timer.TimerClient):
    """A TimerClient subclass (as users write them) that records its calls."""

    def __init__(self, fail_release: bool = False) -> None:
        self.calls: list[tuple[str, str, float | None]] = []
        self.fail_release = fail_release

    def acquire(self, scope_id: str, expiration_time: float) -> None:
        self.calls.append(("acquire", scope_id, expiration_time))

    def release(self, scope_id: str) -> None:
        self.calls.append(("release", scope_id, None))
        if self.fail_release:
            raise timer.TimerServerUnavailableError("server gone")


@pytest.fixture(autouse=True)
def _no_configured_client() -> Iterator[None]:
    timer.configure(None)
    yield
    timer.configure(None)


@pytest.fixture
def events() -> Events:
    return Events()


@pytest.fixture
def reaper() -> RecordingReaper:
    return RecordingReaper()


@pytest.fixture
def local_server(
    events: Events, reaper: RecordingReaper
) -> Iterator[tuple[timer.LocalTimerServer, queue.Queue[Any]]]:
    q: queue.Queue[Any] = queue.Queue()
    server = timer.LocalTimerServer(q, max_interval=0.01, reaper=reaper, on_event=events)
    server.start()
    yield server, q
    server.stop()


@pytest.fixture
def fifo(tmp_path: Path) -> str:
    return str(tmp_path / "timer.fifo")


@pytest.fixture
def file_server(fifo: str, events: Events) -> Iterator[timer.FileTimerServer]:
    """A FileTimerServer with the real reaper (for real-process scenarios)."""
    server = timer.FileTimerServer(fifo, "test", max_interval=0.01, on_event=events)
    server.start()
    yield server
    server.stop()


# -- the public surface -------------------------------------------------------------------


def test_public_surface_is_torchs_plus_typed_errors() -> None:
    torch_names = {
        "TimerRequest",
        "TimerClient",
        "TimerServer",
        "RequestQueue",
        "configure",
        "expires",
        "FileTimerRequest",
        "FileTimerClient",
        "FileTimerServer",
        "LocalTimerClient",
        "LocalTimerServer",
        "MultiprocessingRequestQueue",
        "log_debug_info_for_expired_timers",
    }
    errors = {"TimerNotConfiguredError", "TimerServerUnavailableError", "TimerRequestTooLargeError"}
    assert set(timer.__all__) == torch_names | errors
    for name in timer.__all__:
        assert getattr(timer, name).__doc__, name


@pytest.mark.process
@pytest.mark.timeout(20)
def test_importing_the_module_does_not_import_torch() -> None:
    code = "import sys, aiotimer.compat.torch; sys.exit('torch' in sys.modules)"
    root = Path(__file__).resolve().parent.parent
    assert subprocess.run([sys.executable, "-c", code], cwd=root, check=False).returncode == 0


def test_typed_errors_satisfy_torchs_except_clauses() -> None:
    assert issubclass(timer.TimerNotConfiguredError, RuntimeError)
    assert issubclass(timer.TimerNotConfiguredError, NotConfiguredError)
    assert issubclass(timer.TimerServerUnavailableError, BrokenPipeError)
    assert issubclass(timer.TimerServerUnavailableError, ServerUnavailableError)
    assert issubclass(timer.TimerRequestTooLargeError, RuntimeError)


def test_clients_and_queue_are_the_abcs() -> None:
    q: queue.Queue[Any] = queue.Queue()
    assert isinstance(timer.LocalTimerClient(q), timer.TimerClient)
    assert isinstance(timer.FileTimerClient("/nonexistent"), timer.TimerClient)
    assert isinstance(timer.MultiprocessingRequestQueue(q), timer.RequestQueue)
    with pytest.raises(TypeError):
        timer.TimerClient()  # type: ignore[abstract]


# -- requests -----------------------------------------------------------------------------


def test_timer_request_compares_by_value_like_torchs() -> None:
    a = timer.TimerRequest(1, "s", 5.0)
    assert a == timer.TimerRequest(1, "s", 5.0)
    assert a != timer.TimerRequest(1, "s", 6.0)
    assert a != (1, "s", 5.0)
    with pytest.raises(TypeError):
        hash(a)
    assert repr(a) == "TimerRequest(worker_id=1, scope_id='s', expiration_time=5.0)"


def test_file_timer_request_compares_signal_and_version() -> None:
    a = timer.FileTimerRequest(1, "s", 5.0, signal=9)
    assert a.worker_pid == 1
    assert a.version == 1
    assert a == timer.FileTimerRequest(1, "s", 5.0, signal=9)
    assert a != timer.FileTimerRequest(1, "s", 5.0, signal=15)
    assert timer.FileTimerRequest(1, "s", 5.0).signal == 0  # torch's default: report only


def test_to_json_is_torchs_line() -> None:
    line = timer.FileTimerRequest(4242, "train.py#42", 1763712000.25, 9).to_json()
    assert line == (
        '{"version": 1, "pid": 4242, "scope_id": "train.py#42", '
        '"expiration_time": 1763712000.25, "signal": 9}'
    )
    assert (
        timer.FileTimerRequest(4242, "train.py#42", -1)
        .to_json()
        .endswith('"expiration_time": -1, "signal": 0}')
    )


@given(
    pid=st.integers(1, 2**31 - 1),
    scope=st.text(min_size=1, max_size=40),
    expiration=st.one_of(
        st.floats(0, 1e12, allow_nan=False, allow_infinity=False), st.integers(0, 2**40)
    ),
    sig=st.integers(-64, 64),
)
def test_to_json_is_what_aiotimers_codec_writes_and_reads(
    pid: int, scope: str, expiration: float, sig: int
) -> None:
    request = timer.FileTimerRequest(pid, scope, expiration, sig)
    line = request.to_json().encode("ascii") + b"\n"
    assert encode(Request(pid=pid, scope_id=scope, expiration_time=expiration, signal=sig)) == line
    decoded = LineDecoder().feed(line)
    assert decoded.rejections == []
    [back] = decoded.requests
    assert (back.pid, back.scope_id, back.expiration_time, back.signal) == (
        pid,
        scope,
        expiration,
        sig,
    )


# -- configure / expires ------------------------------------------------------------------


def test_no_client_configured_raises_a_typed_runtime_error() -> None:
    with pytest.raises(timer.TimerNotConfiguredError, match="configure"), timer.expires(after=1):
        pytest.fail("the block must not run")
    with pytest.raises(RuntimeError):  # torch's except clause still works
        timer.expires(after=1).__enter__()


def test_client_interaction_explicit_client_and_scope() -> None:
    configured = RecordingClient()
    timer.configure(configured)
    client = RecordingClient()
    client.acquire = mock.MagicMock(wraps=client.acquire)  # type: ignore[method-assign]
    client.release = mock.MagicMock(wraps=client.release)  # type: ignore[method-assign]
    before = time.time()
    with timer.expires(after=1, scope="test", client=client):
        pass
    client.acquire.assert_called_once_with("test", mock.ANY)
    client.release.assert_called_once_with("test")
    expiration = client.acquire.call_args.args[1]
    assert before + 1 <= expiration <= time.time() + 1
    assert configured.calls == []


def test_happy_path_uses_the_configured_client() -> None:
    client = RecordingClient()
    timer.configure(client)
    with timer.expires(after=0.5):
        pass
    assert [c[0] for c in client.calls] == ["acquire", "release"]
    assert client.calls[0][1] == client.calls[1][1]


def test_exception_propagation_and_release() -> None:
    client = RecordingClient()
    timer.configure(client)
    with pytest.raises(RuntimeError, match="foobar"), timer.expires(after=1):
        raise RuntimeError("foobar")
    assert [c[0] for c in client.calls] == ["acquire", "release"]


def test_a_failing_release_never_hides_the_blocks_exception() -> None:
    timer.configure(RecordingClient(fail_release=True))
    with pytest.raises(KeyError), timer.expires(after=1):
        raise KeyError("body")
    with pytest.raises(BrokenPipeError), timer.expires(after=1):  # no body error: it surfaces
        pass


def test_default_scopes_are_unique_and_name_the_caller() -> None:
    client = RecordingClient()
    scopes = []
    for _ in range(2):
        with timer.expires(after=1, client=client):
            scopes.append(client.calls[-1][1])
    assert scopes[0] != scopes[1]
    assert all(s.startswith("test_compat_torch.py:") for s in scopes)
    assert scopes[0].rpartition("#")[0] == scopes[1].rpartition("#")[0]


def test_expires_is_a_decorator_as_torchs_contextmanager_is() -> None:
    """torch's ``@timer.expires(after=5)`` works: every call is a block."""
    client = RecordingClient()

    @timer.expires(after=5, client=client)
    def step(x: int) -> int:
        return x + 1

    @timer.expires(after=5, scope="shared", client=client)
    def shared() -> None:
        pass

    assert (step(1), step(2)) == (2, 3)
    shared()
    shared()
    kinds = [c[0] for c in client.calls]
    assert kinds == ["acquire", "release"] * 4
    scopes = [c[1] for c in client.calls if c[0] == "acquire"]
    assert scopes[0] != scopes[1]  # a default scope: one id per call, at the same line
    assert scopes[0].rpartition("#")[0] == scopes[1].rpartition("#")[0]
    assert scopes[2:] == ["shared", "shared"]


def test_a_block_is_entered_once() -> None:
    block = timer.expires(after=1, client=RecordingClient())
    with block:
        pass
    with pytest.raises(RuntimeError, match="once"), block:
        pass


# -- clients without a server -------------------------------------------------------------


def test_file_client_without_server_raises_broken_pipe_in_bounded_time(tmp_path: Path) -> None:
    client = timer.FileTimerClient(str(tmp_path / "no-server"), connect_timeout=0.2)
    timer.configure(client)
    started = time.monotonic()
    with pytest.raises(timer.TimerServerUnavailableError) as info, timer.expires(after=0.1):
        pass
    assert isinstance(info.value, BrokenPipeError)
    assert time.monotonic() - started < 5.0  # 0.2 s asked; generous for a busy machine


def test_local_client_puts_torch_shaped_requests() -> None:
    q: queue.Queue[Any] = queue.Queue()
    client = timer.LocalTimerClient(q)
    with timer.expires(after=30, scope="s", client=client):
        pass
    acquire, release = q.get_nowait(), q.get_nowait()
    assert (acquire.worker_id, acquire.scope_id, acquire.signal) == (os.getpid(), "s", 9)
    assert time.time() < acquire.expiration_time <= time.time() + 30
    assert acquire.mono == pytest.approx(time.monotonic() + 30, abs=5)
    assert (release.worker_id, release.scope_id, release.expiration_time) == (os.getpid(), "s", -1)


# -- MultiprocessingRequestQueue (local_timer_test.MultiprocessingRequestQueueTest) --------


def test_request_queue_get() -> None:
    q: queue.Queue[Any] = queue.Queue()
    rq = timer.MultiprocessingRequestQueue(q)
    assert rq.get(1, timeout=0.01) == []
    request = timer.TimerRequest(1, "test_scope", 0)
    q.put(request)
    assert rq.size() == 1
    assert rq.get(2, timeout=0.01) == [request]


def test_request_queue_get_size_waits_for_a_slow_producer() -> None:
    q: queue.Queue[Any] = queue.Queue()
    n, interval = 5, 0.02

    def produce() -> None:
        for i in range(n):
            q.put(timer.TimerRequest(i, "test_scope", 0))
            time.sleep(interval)

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        requests = timer.MultiprocessingRequestQueue(q).get(n, timeout=WAIT)
    finally:
        producer.join()
    assert [r.worker_id for r in requests] == list(range(n))


def test_request_queue_get_stops_at_its_timeout() -> None:
    q: queue.Queue[Any] = queue.Queue()
    q.put(timer.TimerRequest(1, "s", 0))
    started = time.monotonic()
    assert len(timer.MultiprocessingRequestQueue(q).get(10, timeout=0.1)) == 1
    assert 0.05 < time.monotonic() - started < 5.0


# -- the polling TimerServer ABC (api_test.TimerApiTest) ----------------------------------


class MockRequestQueue(timer.RequestQueue):
    def size(self) -> int:
        return 2

    def get(self, size: int, timeout: float) -> list[timer.TimerRequest]:
        return [timer.TimerRequest(1, "test_1", 0), timer.TimerRequest(2, "test_2", 0)]


class MockTimerServer(timer.TimerServer):
    """Reaping worker 1 raises, worker 2 succeeds, worker 3 fails; each has 2 timers."""

    def __init__(self, request_queue: timer.RequestQueue, max_interval: float) -> None:
        super().__init__(request_queue, max_interval)
        self.registered: list[list[timer.TimerRequest]] = []
        self.cleared: list[set[Any]] = []

    def register_timers(self, timer_requests: list[timer.TimerRequest]) -> None:
        self.registered.append(timer_requests)

    def clear_timers(self, worker_ids: set[Any]) -> None:
        self.cleared.append(worker_ids)

    def get_expired_timers(self, deadline: float) -> dict[Any, list[timer.TimerRequest]]:
        return {
            i: [timer.TimerRequest(i, f"test_{i}_0", 0), timer.TimerRequest(i, f"test_{i}_1", 0)]
            for i in range(1, 4)
        }

    def _reap_worker(self, worker_id: Any) -> bool:
        if worker_id == 1:
            raise RuntimeError("test error")
        return bool(worker_id == 2)


def test_watchdog_round_clears_reaped_and_raising_workers_only() -> None:
    request_queue = mock.Mock(wraps=MockRequestQueue())
    server = MockTimerServer(request_queue, max_interval=1)
    server._run_watchdog()
    request_queue.size.assert_called_once()
    request_queue.get.assert_called_with(2, 1)
    assert server.registered == [MockRequestQueue().get(2, 1)]
    assert server.cleared == [{1, 2}]


def test_polling_server_stop_is_idempotent_and_it_restarts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = MockTimerServer(MockRequestQueue(), max_interval=0.01)
    server.stop()  # never started: nothing to do
    server.start()
    server.start()  # torch would start a second watchdog thread: logged, ignored
    assert "MockTimerServer.start(): already running; ignored" in caplog.text
    wait_until(lambda: len(server.cleared) > 0)
    server.stop()
    server.stop()
    rounds = len(server.cleared)
    server.start()
    wait_until(lambda: len(server.cleared) > rounds)
    server.stop()


# -- LocalTimerServer (local_timer_test.LocalTimerServerTest) -----------------------------


def expired(pid: int, scope: str) -> timer.TimerRequest:
    return timer.TimerRequest(pid, scope, time.time() - 60)


def valid(pid: int, scope: str) -> timer.TimerRequest:
    return timer.TimerRequest(pid, scope, time.time() + 60)


def release(pid: int, scope: str) -> timer.TimerRequest:
    return timer.TimerRequest(pid, scope, -1)


def test_expired_timer_reaps_the_worker_and_clears_its_other_timers(
    local_server: LocalServer,
    events: Events,
    reaper: RecordingReaper,
) -> None:
    server, q = local_server
    q.put(expired(FAKE_PID, "test1"))
    q.put(valid(FAKE_PID, "test2"))
    [reaped] = events.wait_for(WorkerReaped)
    assert reaped.scopes == ("test1", "test2")
    assert reaper.signals() == [(FAKE_PID, signal.SIGKILL)]
    assert server.get_expired_timers(math.inf) == {}


def test_acquire_release_and_vacuous_release(
    local_server: LocalServer, reaper: RecordingReaper
) -> None:
    server, q = local_server
    q.put(valid(FAKE_PID, "test1"))
    q.put(release(FAKE_PID, "test1"))
    q.put(release(FAKE_PID, "test2"))
    wait_until(lambda: server.server.get_state().counters.requests == 3)
    assert server.get_expired_timers(math.inf) == {}
    assert reaper.signals() == []


def test_valid_timers_are_kept_and_nobody_is_reaped(
    local_server: LocalServer, reaper: RecordingReaper
) -> None:
    server, q = local_server
    for pid in (FAKE_PID, OTHER_FAKE_PID):
        for scope in ("test1", "test2"):
            q.put(valid(pid, scope))
    wait_until(lambda: server.server.get_state().counters.requests == 4)
    live = server.get_expired_timers(math.inf)
    assert {pid: sorted(r.scope_id for r in rs) for pid, rs in live.items()} == {
        FAKE_PID: ["test1", "test2"],
        OTHER_FAKE_PID: ["test1", "test2"],
    }
    assert all(type(r) is timer.TimerRequest for rs in live.values() for r in rs)
    assert server.get_expired_timers(time.time()) == {}
    assert reaper.signals() == []


def test_negative_worker_ids_are_rejected_not_signalled(
    local_server: LocalServer,
    events: Events,
    reaper: RecordingReaper,
) -> None:
    # torch's tests use pid -3 with os.kill mocked; a real os.kill(-3) signals process
    # group 3. aiotimer rejects such requests.
    _, q = local_server
    q.put(expired(-3, "test1"))
    [rejected] = events.wait_for(RequestRejected)
    assert "pid" in rejected.reason
    assert reaper.signals() == []


def test_register_and_clear_timers_apply_before_returning(
    local_server: LocalServer, reaper: RecordingReaper
) -> None:
    server, _ = local_server
    server.register_timers([valid(FAKE_PID, "a"), valid(FAKE_PID, "b"), valid(OTHER_FAKE_PID, "c")])
    assert {pid: len(rs) for pid, rs in server.get_expired_timers(math.inf).items()} == {
        FAKE_PID: 2,
        OTHER_FAKE_PID: 1,
    }
    server.clear_timers({FAKE_PID})
    assert list(server.get_expired_timers(math.inf)) == [OTHER_FAKE_PID]
    server.register_timers([release(OTHER_FAKE_PID, "c")])
    assert server.get_expired_timers(math.inf) == {}
    assert reaper.signals() == []
    with pytest.raises(TypeError, match="pid"):
        server.register_timers([timer.TimerRequest("worker-1", "a", 0)])


def test_server_lifecycle_stop_is_idempotent_and_restart_works(reaper: RecordingReaper) -> None:
    q: queue.Queue[Any] = queue.Queue()
    server = timer.LocalTimerServer(q, reaper=reaper)
    assert abs(server.get_last_progress_time() - time.time()) <= 2  # not started: now
    server.stop()
    with pytest.raises(ServerStateError):
        server.register_timers([valid(FAKE_PID, "a")])
    for _ in range(2):
        server.start()
        assert server.running
        server.start()  # logged and ignored, as torch's second start() is harmless
        assert server.running
        server.register_timers([valid(FAKE_PID, "a")])
        assert len(server.get_expired_timers(math.inf)[FAKE_PID]) == 1
        server.stop()
        server.stop()
        assert not server.running


class WallClock(MonotonicClock):
    """The real monotonic clock with a wall clock the test sets (from any thread)."""

    def __init__(self, wall: float) -> None:
        self.wall = wall

    def time(self) -> float:
        return self.wall


def test_last_progress_time_is_the_loops_last_heartbeat(reaper: RecordingReaper) -> None:
    clock = WallClock(1000.0)
    server = timer.LocalTimerServer(queue.Queue(), reaper=reaper, clock=clock)
    with server:
        assert server.get_last_progress_time() == 1000  # started at 1000; asks for a beat
        server.register_timers([])  # a loop round trip: the beat has been answered
        clock.wall = 2000.0
        assert server.get_last_progress_time() == 1000  # the beat answered at 1000
        server.register_timers([])
        assert server.get_last_progress_time() == 2000
        server.register_timers([])  # that call's beat is answered too, at 2000
        # A stuck loop answers no beat: the value ages.
        release = threading.Event()
        loop = server._thread.loop
        assert loop is not None
        loop.call_soon_threadsafe(release.wait, 10.0)
        try:
            clock.wall = 3000.0
            server.get_last_progress_time()
            time.sleep(0.05)
            assert server.get_last_progress_time() == 2000
        finally:
            release.set()
        server.register_timers([])
        assert server.get_last_progress_time() == 3000


# -- recursive scopes (test_get_timer_recursive), on the queue server ---------------------


def test_recursive_default_scopes_are_nested_timers(
    local_server: LocalServer, events: Events
) -> None:
    # torch's default scope is file#line, so recursive calls share (re-acquire) one timer
    # and only the innermost deadline counts. aiotimer's default scopes are unique: each
    # level is its own timer, and the outer level (4 x 0.15 s of work, 0.5 s allowed)
    # expires. The server never signals its own process, so the expiry is report-only.
    _, q = local_server
    timer.configure(timer.LocalTimerClient(q))

    def func(n: int) -> None:
        if n > 0:
            with timer.expires(after=0.5):
                func(n - 1)
                time.sleep(0.15)

    func(4)
    [first, *_] = events.wait_for(TimerExpired)
    assert first.report_only
    assert first.pid == os.getpid()


def test_recursive_blocks_sharing_a_scope_reacquire_one_timer(
    local_server: LocalServer, events: Events
) -> None:
    # torch's behaviour, with an explicit scope: every level re-acquires the same timer and
    # every release ends it, so no timer lives longer than one level's 0.15 s (0.5 allowed).
    server, q = local_server
    timer.configure(timer.LocalTimerClient(q))

    def func(n: int) -> None:
        if n > 0:
            with timer.expires(after=0.5, scope="recursive"):
                func(n - 1)
                time.sleep(0.15)

    func(4)
    wait_until(lambda: server.server.get_state().counters.requests == 8)
    time.sleep(0.5)  # past every deadline: nothing may expire
    assert events.of(TimerExpired) == []


# -- FileTimerServer: torch's events, debug log, FIFO handling -----------------------------


@pytest.mark.process
@pytest.mark.timeout(30)
def test_log_event_receives_torchs_event_names(
    fifo: str, reaper: RecordingReaper, events: Events, caplog: pytest.LogCaptureFixture
) -> None:
    logged: list[tuple[str, timer.FileTimerRequest | None]] = []
    server = timer.FileTimerServer(
        fifo,
        "run-7",
        log_event=lambda name, r: logged.append((name, r)),
        reaper=reaper,
        on_event=events,
    )
    caplog.set_level(logging.INFO, logger="aiotimer.compat.torch")
    deadline = time.time() - 1
    server.start()
    try:
        server.register_timers(
            [
                timer.FileTimerRequest(FAKE_PID, "stuck", deadline, signal.SIGTERM),
                timer.FileTimerRequest(OTHER_FAKE_PID, "shadow", deadline, 0),
            ]
        )
        events.wait_for(WorkerReaped)
        events.wait_for(TimerExpired, count=2)
    finally:
        server.stop()
    names = [name for name, _ in logged]
    assert names[0] == "watchdog started"
    assert names[-1] == "watchdog stopped"
    assert sorted(names[1:-1]) == ["kill worker process", "timer expired", "timer expired"]
    requests = {(name, r.scope_id): r for name, r in logged if r is not None}
    kill = requests["kill worker process", "stuck"]
    assert (kill.worker_pid, kill.signal) == (FAKE_PID, signal.SIGTERM)
    assert kill.expiration_time == pytest.approx(deadline, abs=0.5)
    shadow = requests["timer expired", "shadow"]
    assert (shadow.worker_pid, shadow.signal) == (OTHER_FAKE_PID, 0)
    assert reaper.signals() == [(FAKE_PID, signal.SIGTERM)]
    debug = [
        r.getMessage() for r in caplog.records if "Timers expired for run:[run-7]" in r.getMessage()
    ]
    assert len(debug) == 2
    assert json.dumps("stuck") in debug[0] + debug[1]


def test_log_debug_info_is_silent_without_expired_timers(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="aiotimer.compat.torch")
    timer.log_debug_info_for_expired_timers("r", {})
    assert caplog.records == []
    timer.log_debug_info_for_expired_timers("r", {1: ["x"]})
    assert [r.getMessage() for r in caplog.records] == ["Timers expired for run:[r] [{1: ['x']}]."]


@pytest.mark.process
@pytest.mark.timeout(30)
def test_file_server_refuses_a_path_that_is_not_a_fifo(tmp_path: Path) -> None:
    path = tmp_path / "precious.txt"
    path.write_text("data")
    server = timer.FileTimerServer(str(path), "run")
    with pytest.raises(SourceError):  # torch's server would delete the file
        server.start()
    assert path.read_text() == "data"
    server.stop()


@pytest.mark.process
@pytest.mark.timeout(30)
def test_file_server_stop_removes_the_fifo_and_restart_recreates_it(
    fifo: str, reaper: RecordingReaper
) -> None:
    server = timer.FileTimerServer(fifo, "run", reaper=reaper)
    server.start()
    assert Path(fifo).is_fifo()
    server.stop()
    server.stop()
    assert not Path(fifo).exists()
    server.start()
    assert Path(fifo).is_fifo()
    server.stop()


@pytest.mark.process
@pytest.mark.timeout(30)
def test_file_client_talks_to_the_file_server(
    file_server: timer.FileTimerServer, events: Events
) -> None:
    client = timer.FileTimerClient(file_server.file_path)
    timer.configure(client)
    with timer.expires(after=60, scope="block"):
        wait_until(lambda: os.getpid() in file_server.get_expired_timers(math.inf))
        [live] = file_server.get_expired_timers(math.inf)[os.getpid()]
        assert isinstance(live, timer.FileTimerRequest)
        assert (live.scope_id, live.signal) == ("block", signal.SIGKILL)
        assert live.expiration_time == pytest.approx(time.time() + 60, abs=5)
    wait_until(lambda: file_server.get_expired_timers(math.inf) == {})
    with pytest.raises(timer.TimerRequestTooLargeError), timer.expires(after=1, scope="x" * 5000):
        pass
    client.close()


# -- real processes (file_based_local_timer_test.FileTimerTest) ---------------------------


def _stuck(path: str, after: float, duration: float) -> None:
    timer.configure(timer.FileTimerClient(path))
    with timer.expires(after=after):
        time.sleep(duration)


def _recursive(n: int, path: str | None) -> None:
    if path is not None:
        timer.configure(timer.FileTimerClient(path))
    if n > 0:
        with timer.expires(after=0.1):
            _recursive(n - 1, None)
            time.sleep(0.2)


@pytest.mark.process
@pytest.mark.timeout(30)
def test_a_stuck_worker_is_killed_promptly(file_server: timer.FileTimerServer) -> None:
    started = time.monotonic()
    p = FORK.Process(target=_stuck, args=(file_server.file_path, 0.1, 20))
    p.start()
    p.join(WAIT + 10)
    assert p.exitcode == -signal.SIGKILL
    assert time.monotonic() - started < WAIT  # far below the 20 s it would have slept


@pytest.mark.process
@pytest.mark.timeout(30)
def test_a_recursive_worker_over_its_deadline_is_killed(file_server: timer.FileTimerServer) -> None:
    p = FORK.Process(target=_recursive, args=(2, file_server.file_path))
    p.start()
    p.join(WAIT + 10)
    assert p.exitcode == -signal.SIGKILL


def _nested(n: int, path: str | None) -> None:
    if path is not None:
        timer.configure(timer.FileTimerClient(path))
    if n > 0:
        with timer.expires(after=100):
            _nested(n - 1, None)
            time.sleep(0.001)


@pytest.mark.process
@pytest.mark.timeout(30)
def test_multiple_concurrent_clients(file_server: timer.FileTimerServer, events: Events) -> None:
    clients, per_client = 4, 10
    processes = [
        FORK.Process(target=_nested, args=(per_client, file_server.file_path))
        for _ in range(clients)
    ]
    for p in processes:
        p.start()
    for p in processes:
        p.join(WAIT + 10)
    assert [p.exitcode for p in processes] == [0] * clients
    file_server.run_once()  # apply what is in the FIFO, then stop (torch's test hook)
    assert not file_server.running
    assert file_server.server.get_state().counters.requests == 2 * clients * per_client
    assert events.of(WorkerReaped) == []


def _exit_before_release(path: str, acquired: Any) -> None:
    client = timer.FileTimerClient(path)
    client.acquire("test_scope", time.time() + 1)
    acquired.wait(WAIT)  # exits once the server holds the timer


@pytest.mark.process
@pytest.mark.timeout(30)
def test_a_worker_that_exits_before_releasing_is_forgotten_not_reaped(
    file_server: timer.FileTimerServer, events: Events
) -> None:
    acquired = FORK.Event()
    p = FORK.Process(target=_exit_before_release, args=(file_server.file_path, acquired))
    p.start()
    # The server holds the timer once it watches the worker: an exit before that would
    # make the pid unknown (dropped, not forgotten).
    wait_until(lambda: bool(file_server.get_expired_timers(math.inf)))
    deadline = time.time() + 1
    acquired.set()
    p.join(WAIT)
    assert p.exitcode == 0
    [exited] = events.wait_for(WorkerExited)
    assert (exited.pid, exited.cleared) == (p.pid, ("test_scope",))
    assert file_server.get_expired_timers(math.inf) == {}
    time.sleep(max(0.0, deadline + 0.5 - time.time()))  # past the deadline: nothing to reap
    assert events.of(WorkerReaped) == []
    assert events.of(TimerExpired) == []


def _serve_and_reap(path: str, self_kill: bool) -> None:
    """Run a FileTimerServer, reap one victim with SIGTERM; exit 0 if this process lives."""
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    reaped = threading.Event()
    server = timer.FileTimerServer(
        path,
        "run",
        self_kill=self_kill,
        on_event=lambda e: reaped.set() if isinstance(e, WorkerReaped) else None,
    )
    server.start()
    server.register_timers(
        [timer.FileTimerRequest(victim.pid, "s", time.time() - 1, signal.SIGTERM)]
    )
    ok = reaped.wait(WAIT)
    victim.wait()
    time.sleep(1.0 if self_kill else 0)  # room for the self-signal to land
    server.stop()
    os._exit(0 if ok and victim.returncode == -signal.SIGTERM else 3)


@pytest.mark.process
@pytest.mark.timeout(40)
@pytest.mark.parametrize(("self_kill", "exitcode"), [(False, 0), (True, -signal.SIGTERM)])
def test_the_server_kills_itself_only_when_asked(fifo: str, self_kill: bool, exitcode: int) -> None:
    p = FORK.Process(target=_serve_and_reap, args=(fifo, self_kill))
    p.start()
    p.join(WAIT + 10)
    assert p.exitcode == exitcode


def test_server_started_event_is_forwarded(local_server: LocalServer, events: Events) -> None:
    [started] = events.of(ServerStarted)
    assert started.sources == ("mpqueue",)
