"""aiotimer.compat.torch: torch's servers as subclasses of its ABC, and the names torch's
tests and users reach into.

torch's own timer tests subclass the servers (or the ABC), patch ``_reap_worker``,
``is_process_running`` and ``log_debug_info_for_expired_timers``, run one watchdog round
with ``_run_watchdog()``, read ``_timers`` and ``_request_count``, send raw requests with
``FileTimerClient._send_request`` and call ``start()`` twice. Each test here pins one of
those on aiotimer's engine; the last ones pin the default-scope difference in real
processes. Fake workers use :class:`~aiotimer.testing.RecordingReaper` (nothing is
killed); tests with a FIFO or a process are marked ``process``.
"""

from __future__ import annotations

import inspect
import logging
import multiprocessing
import os
import queue
import signal
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from _pids import fake_pid
from _waits import WAIT, Events, wait_until

import aiotimer.compat.torch as timer
from aiotimer.compat.torch.local_timer import MultiprocessingRequestQueue
from aiotimer.events import ReapFailed, RequestRejected, WorkerExited, WorkerReaped
from aiotimer.testing import RecordingReaper

FAKE_PID, OTHER_FAKE_PID = fake_pid(1), fake_pid(2)
KILL, TERM = int(signal.SIGKILL), int(signal.SIGTERM)
FORK = multiprocessing.get_context("fork")


@pytest.fixture
def fifo(tmp_path: Path) -> str:
    return str(tmp_path / "timer.fifo")


def expired(pid: int, scope: str) -> timer.TimerRequest:
    return timer.TimerRequest(pid, scope, time.time() - 60)


def valid(pid: int, scope: str) -> timer.TimerRequest:
    return timer.TimerRequest(pid, scope, time.time() + 60)


def in_loop(server: timer.LocalTimerServer | timer.FileTimerServer, fn: Any, *args: Any) -> None:
    """Run ``fn(*args)`` in the server's loop thread (where the reaper lives)."""
    loop = server._thread.loop
    assert loop is not None
    loop.call_soon_threadsafe(fn, *args)


# -- subclassing ------------------------------------------------------------------------------


def test_the_servers_are_subclasses_of_torchs_abc_with_its_public_helpers() -> None:
    assert issubclass(timer.LocalTimerServer, timer.TimerServer)
    assert issubclass(timer.FileTimerServer, timer.TimerServer)
    check = inspect.getattr_static(timer.FileTimerServer, "is_process_running")
    assert isinstance(check, staticmethod)
    assert timer.FileTimerServer.is_process_running(os.getpid())
    for pid in (0, -3, FAKE_PID):  # a group, a group, nobody
        assert not timer.FileTimerServer.is_process_running(pid)


class DictServer(timer.TimerServer):
    """A server with a table of its own, written against torch's ABC."""

    def __init__(self, q: queue.Queue[Any]) -> None:
        super().__init__(MultiprocessingRequestQueue(q), max_interval=0.01)
        self.table: dict[tuple[int, str], timer.TimerRequest] = {}
        self.reaped: list[int] = []
        self.cleared: list[set[int]] = []

    def register_timers(self, timer_requests: list[timer.TimerRequest]) -> None:
        for r in timer_requests:
            if r.expiration_time < 0:
                self.table.pop((r.worker_id, r.scope_id), None)
            else:
                self.table[r.worker_id, r.scope_id] = r

    def clear_timers(self, worker_ids: set[int]) -> None:
        self.cleared.append(set(worker_ids))
        self.table = {k: r for k, r in self.table.items() if k[0] not in worker_ids}

    def get_expired_timers(self, deadline: float) -> dict[int, list[timer.TimerRequest]]:
        due: dict[int, list[timer.TimerRequest]] = {}
        for (pid, _), r in self.table.items():
            if r.expiration_time <= deadline:
                due.setdefault(pid, []).append(r)
        return due

    def _reap_worker(self, worker_id: int) -> bool:
        self.reaped.append(worker_id)
        return True


def test_a_server_with_a_table_of_its_own_runs_under_torchs_watchdog() -> None:
    q: queue.Queue[Any] = queue.Queue()
    server = DictServer(q)
    q.put(expired(FAKE_PID, "a"))
    q.put(valid(OTHER_FAKE_PID, "b"))
    server.start()
    try:
        wait_until(lambda: {FAKE_PID} in server.cleared)
    finally:
        server.stop()
    assert server.reaped == [FAKE_PID]
    assert list(server.table) == [(OTHER_FAKE_PID, "b")]


class OwnReap(timer.LocalTimerServer):
    """Reaps its own way: records the worker, signals nothing."""

    reaped: list[int]

    def _reap_worker(self, worker_id: int) -> bool:
        self.reaped.append(worker_id)
        return True


def test_a_subclass_reap_worker_does_every_reap() -> None:
    reaper, events = RecordingReaper(), Events()
    server = OwnReap(queue.Queue(), reaper=reaper, on_event=events)
    server.reaped = []
    with server:
        server.register_timers([valid(FAKE_PID, "b"), expired(FAKE_PID, "a")])
        [reaped] = events.wait_for(WorkerReaped)
    assert server.reaped == [FAKE_PID]
    assert set(reaped.scopes) == {"a", "b"}
    assert reaper.signals() == []  # the override replaced the signal


def test_a_subclass_that_overrides_a_table_method_is_told_what_it_changes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Counting(timer.LocalTimerServer):
        def register_timers(self, timer_requests: Any) -> None:
            super().register_timers(timer_requests)

    Counting(queue.Queue(), reaper=RecordingReaper())
    assert "Counting overrides register_timers()" in caplog.text
    assert "only explicit calls use it" in caplog.text


# -- the patch points torch's tests use -----------------------------------------------------


def test_patching_reap_worker_on_the_class_sees_every_reap() -> None:
    reaper, events = RecordingReaper(), Events()
    with mock.patch("aiotimer.compat.torch.LocalTimerServer._reap_worker") as reap:
        reap.return_value = True
        with timer.LocalTimerServer(queue.Queue(), reaper=reaper, on_event=events) as server:
            server.register_timers([expired(FAKE_PID, "a")])
            events.wait_for(WorkerReaped)
    reap.assert_called_once_with(FAKE_PID)
    assert reaper.signals() == []


def test_a_reap_worker_that_returns_false_is_reported_and_retried() -> None:
    reaper, events = RecordingReaper(), Events()
    with (
        mock.patch.object(
            timer.LocalTimerServer, "_reap_worker", side_effect=[False, True]
        ) as reap,
        timer.LocalTimerServer(queue.Queue(), reaper=reaper, on_event=events) as server,
    ):
        server.register_timers([expired(FAKE_PID, "a")])
        events.wait_for(WorkerReaped)
    [failed] = events.of(ReapFailed)
    assert "_reap_worker" in failed.error
    assert reap.call_count == 2


@pytest.mark.parametrize("running", [True, False])
def test_is_process_running_decides_whether_an_exited_workers_timers_stay(running: bool) -> None:
    reaper, events = RecordingReaper(), Events()
    with (
        mock.patch.object(timer.LocalTimerServer, "is_process_running") as check,
        mock.patch.object(timer.LocalTimerServer, "_reap_worker", return_value=True) as reap,
    ):
        check.return_value = running
        with timer.LocalTimerServer(queue.Queue(), reaper=reaper, on_event=events) as server:
            after = 0.3 if running else 60.0  # gone: the timer must not expire meanwhile
            server.register_timers([timer.TimerRequest(FAKE_PID, "a", time.time() + after)])
            in_loop(server, reaper.exit, FAKE_PID)  # the worker's pidfd says it exited
            if running:  # torch's view: still there, so its timer expires and is reaped
                events.wait_for(WorkerReaped)
                reap.assert_called_once_with(FAKE_PID)
            else:  # gone: its timers go at once, nothing can expire
                [exited] = events.wait_for(WorkerExited)
                assert exited.cleared == ("a",)
                reap.assert_not_called()
            assert server._timers == {}
    check.assert_called_once_with(FAKE_PID)


@pytest.mark.process
@pytest.mark.timeout(30)
def test_log_debug_info_is_called_through_the_module_torchs_tests_patch(fifo: str) -> None:
    reaper, events = RecordingReaper(), Events()
    patched = "aiotimer.compat.torch.file_based_local_timer.log_debug_info_for_expired_timers"
    with (
        mock.patch(patched) as debug_info,
        timer.FileTimerServer(fifo, "run-3", reaper=reaper, on_event=events) as server,
    ):
        request = timer.FileTimerRequest(FAKE_PID, "a", time.time() - 1, TERM)
        server.register_timers([request])
        events.wait_for(WorkerReaped)
    run_id, expired_timers = debug_info.call_args.args
    assert run_id == "run-3"
    [line] = expired_timers[FAKE_PID]
    assert '"scope_id": "a"' in line
    assert '"signal": 15' in line


# -- a round, and the views torch's tests read ---------------------------------------------


@pytest.mark.process
@pytest.mark.timeout(30)
def test_a_round_takes_what_the_fifo_holds_and_reaps_what_is_due(fifo: str) -> None:
    reaper, events = RecordingReaper(), Events()
    server = timer.FileTimerServer(fifo, "run", reaper=reaper, on_event=events)
    server._run_watchdog()  # not started: the round starts it (an empty FIFO is fine)
    assert server.running
    client = timer.FileTimerClient(fifo)
    now = time.time()
    # The due timer last: the server's reader may apply lines before the round does, and
    # a reap drops only the timers its worker had when it began.
    client._send_request(timer.FileTimerRequest(FAKE_PID, "other", now + 60, TERM))
    client._send_request(timer.FileTimerRequest(OTHER_FAKE_PID, "kept", now + 60, KILL))
    client._send_request(timer.FileTimerRequest(OTHER_FAKE_PID, "gone", now + 60, KILL))
    client._send_request(timer.FileTimerRequest(OTHER_FAKE_PID, "gone", -1))
    client._send_request(timer.FileTimerRequest(-3, "group", now - 60, KILL))
    client._send_request(timer.FileTimerRequest(FAKE_PID, "stuck", now - 60, TERM))
    try:
        server._run_watchdog()
        # Synchronously: all six lines taken, the due worker reaped, the rest kept.
        assert reaper.signals() == [(FAKE_PID, TERM)]
        [kept] = server._timers.values()
        assert (kept.worker_pid, kept.scope_id, kept.signal) == (OTHER_FAKE_PID, "kept", KILL)
        assert list(server._timers) == [(OTHER_FAKE_PID, "kept")]
        assert server._request_count == 5  # valid requests; pid -3 is refused
        [rejected] = events.of(RequestRejected)
        assert "pid" in rejected.reason
        assert server.get_expired_timers(time.time()) == {}
    finally:
        client.close()
        server.run_once()
    assert not server.running
    assert server._request_count == 5  # the last run's, read after the stop


def test_a_round_on_an_empty_queue_starts_the_server_and_returns() -> None:
    reaper, events = RecordingReaper(), Events()
    q: queue.Queue[Any] = queue.Queue()
    server = timer.LocalTimerServer(q, max_interval=60, reaper=reaper, on_event=events)
    try:
        started = time.monotonic()
        server._run_watchdog()
        assert time.monotonic() - started < WAIT  # not max_interval: nothing was waited for
        assert server.running
        q.put(expired(FAKE_PID, "a"))
        server._run_watchdog()  # waits for the queue's reader to take the request
        events.wait_for(WorkerReaped)
        assert server._timers == {}
    finally:
        server.stop()


def test_a_second_start_is_logged_and_the_server_serves_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reaper = RecordingReaper()
    caplog.set_level(logging.WARNING, logger="aiotimer.compat.torch")
    with timer.LocalTimerServer(queue.Queue(), reaper=reaper) as server:
        server.start()
        assert "LocalTimerServer.start(): already running; ignored" in caplog.text
        server.register_timers([valid(FAKE_PID, "a")])
        assert list(server._timers) == [(FAKE_PID, "a")]


# -- default scopes: each block its own timer (torch: one per process) ----------------------


def _recursive(path: str, scope: str | None) -> None:
    """torch's recursion example, slowed down 8x so that load cannot change its outcome:
    4 nested 1 s blocks, 0.4 s of work each after the inner ones. The outer block runs
    1.6 s; with one shared timer, the innermost release (after 0.4 s) ends it."""
    timer.configure(timer.FileTimerClient(path))

    def func(n: int) -> None:
        if n > 0:
            with timer.expires(after=1.0, scope=scope):
                func(n - 1)
                time.sleep(0.4)

    func(4)


@pytest.mark.process
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("scope", "exitcode"),
    [(None, -signal.SIGKILL), ("shared", 0)],
    ids=["default-scopes-are-nested-timers", "a-shared-scope-is-torchs-one-timer"],
)
def test_the_recursion_example_is_killed_unless_its_blocks_share_a_scope(
    fifo: str, scope: str | None, exitcode: int
) -> None:
    with timer.FileTimerServer(fifo, "run"):
        p = FORK.Process(target=_recursive, args=(fifo, scope))
        p.start()
        p.join(WAIT)
        if p.exitcode is None:
            p.kill()
            p.join()
    assert p.exitcode == exitcode
