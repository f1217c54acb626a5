"""The per-worker state machine (WatchedWorker) and the Watchlist that drives it."""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable

import anyio
import pytest

from aiotimer.reapers._watch import TransitionError, WatchedWorker, Watchlist, WatchState
from aiotimer.testing import RecordingReaper, settle

UNPINNED, PINNED, REAPING, GONE = (
    WatchState.UNPINNED,
    WatchState.PINNED,
    WatchState.REAPING,
    WatchState.GONE,
)
PID = 4242

_CHANGES: dict[str, Callable[[WatchedWorker], object]] = {
    "pin": WatchedWorker.pin,
    "begin_reap": WatchedWorker.begin_reap,
    "end_reap": WatchedWorker.end_reap,
    "go": WatchedWorker.go,
}
#: The module docs' table: (state, change) -> next state; every other pair is refused.
ALLOWED = {
    (UNPINNED, "pin"): PINNED,
    (PINNED, "begin_reap"): REAPING,
    (REAPING, "end_reap"): PINNED,
    (UNPINNED, "go"): GONE,
    (PINNED, "go"): GONE,
    (REAPING, "go"): GONE,
    (GONE, "go"): GONE,
    (GONE, "end_reap"): GONE,
}


def worker_in(state: WatchState) -> WatchedWorker:
    """A worker brought to ``state`` through allowed transitions only."""
    worker = WatchedWorker(PID, UNPINNED if state is UNPINNED else PINNED)
    if state is REAPING:
        worker.begin_reap()
    elif state is GONE:
        worker.go()
    assert worker.state is state
    return worker


@pytest.mark.parametrize("state", list(WatchState))
@pytest.mark.parametrize("change", list(_CHANGES))
def test_every_transition_follows_the_table(state: WatchState, change: str) -> None:
    worker = worker_in(state)
    after = ALLOWED.get((state, change))
    if after is None:
        with pytest.raises(TransitionError, match=f"worker {PID} is {state.value}: it cannot"):
            _CHANGES[change](worker)
        assert worker.state is state, "a refused change changes nothing"
    else:
        _CHANGES[change](worker)
        assert worker.state is after
        assert worker.gone is (after is GONE)


@pytest.mark.parametrize("state", [REAPING, GONE])
def test_a_worker_starts_pinned_or_unpinned(state: WatchState) -> None:
    with pytest.raises(TransitionError, match="starts pinned or unpinned"):
        WatchedWorker(PID, state)


def test_go_says_whether_it_changed_anything_and_the_repr_shows_the_state() -> None:
    worker = WatchedWorker(PID, PINNED)
    assert repr(worker) == f"<WatchedWorker {PID} pinned>"
    assert worker.go() is True
    assert worker.go() is False
    assert repr(worker) == f"<WatchedWorker {PID} gone>"


@pytest.mark.asyncio
async def test_going_wakes_the_waiters_and_cancels_the_watcher() -> None:
    worker = WatchedWorker(PID, PINNED)
    woken: list[str] = []

    async def wait() -> None:
        await worker.wait_gone()
        woken.append("waiter")

    async def watcher() -> None:
        with anyio.CancelScope() as worker.watcher:
            await anyio.sleep_forever()
        woken.append("watcher")

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        tg.start_soon(watcher)
        await settle()
        assert woken == []
        worker.go()
    assert sorted(woken) == ["waiter", "watcher"]
    with anyio.fail_after(1):
        await worker.wait_gone()  # gone already: returns at once


class _Descriptors(RecordingReaper):
    """Attaching raises ``OSError(code)`` ``failures`` times, then works."""

    def __init__(self, failures: int, code: int = errno.EMFILE) -> None:
        super().__init__()
        self.failures, self.code = failures, code

    def attach(self, pid: int, *, start_time: int | None = None) -> bool:
        if self.failures > 0:
            self.failures -= 1
            raise OSError(self.code, "attach failed")
        return super().attach(pid, start_time=start_time)


@pytest.mark.asyncio
async def test_the_watchlist_pins_watches_and_forgets_a_worker_once() -> None:
    reaper, gone = RecordingReaper(nonexistent={7}), []
    async with anyio.create_task_group() as tg:
        watchlist = Watchlist(task_group=tg, reaper=reaper, on_gone=lambda *a: gone.append(a))
        assert watchlist.attach(7, None) is False  # no such process: unknown, no record
        assert 7 not in watchlist.by_pid
        assert watchlist.attach(PID, None) is True
        worker = watchlist.get(PID)
        assert worker is not None and worker.state is PINNED
        await settle()
        assert reaper.methods(PID) == ["attach", "wait_exit"]
        worker.begin_reap()
        assert watchlist.is_reaping(PID)
        reaper.exit(PID)
        await settle()
        assert gone == [(PID, "exited")] and worker.gone
        assert PID not in watchlist.by_pid and watchlist.pids() == ()
        assert reaper.methods(PID)[-1] == "detach"
        watchlist.gone(worker, "gone before signal")  # seen again: no second report
        worker.end_reap()  # the reap ends after its worker has gone: no change
        assert gone == [(PID, "exited")]


@pytest.mark.asyncio
async def test_out_of_descriptors_a_worker_is_kept_unpinned_and_pinned_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reaper = _Descriptors(failures=2)
    async with anyio.create_task_group() as tg:
        watchlist = Watchlist(task_group=tg, reaper=reaper, on_gone=lambda *a: None)
        with caplog.at_level(logging.CRITICAL, logger="aiotimer"):
            assert watchlist.attach(PID, 123) is True
        assert "out of file descriptors" in caplog.text
        worker = watchlist.get(PID)
        assert worker is not None and worker.state is UNPINNED and worker.start_time == 123
        assert watchlist.pin_again(worker) is False  # still none free
        assert worker.state is UNPINNED
        assert watchlist.pin_again(worker) is True
        assert worker.state is PINNED
        await settle()
        assert reaper.methods(PID) == ["attach", "wait_exit"]  # watched once pinned
        watchlist.close()
        assert watchlist.pids() == () and reaper.methods(PID)[-1] == "detach"
        tg.cancel_scope.cancel()


@pytest.mark.asyncio
async def test_a_worker_found_gone_when_pinned_again_goes() -> None:
    reaper, gone = _Descriptors(failures=1), []
    reaper.nonexistent.add(PID)
    async with anyio.create_task_group() as tg:
        watchlist = Watchlist(task_group=tg, reaper=reaper, on_gone=lambda *a: gone.append(a))
        assert watchlist.attach(PID, None) is True
        worker = watchlist.get(PID)
        assert worker is not None
        assert watchlist.pin_again(worker) is False
        assert worker.gone and gone == [(PID, "gone before signal")]


@pytest.mark.asyncio
async def test_any_other_attach_failure_makes_the_worker_unknown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with anyio.create_task_group() as tg:
        reaper = _Descriptors(failures=1, code=errno.EIO)
        watchlist = Watchlist(task_group=tg, reaper=reaper, on_gone=lambda *a: None)
        with caplog.at_level(logging.ERROR, logger="aiotimer"):
            assert watchlist.attach(PID, None) is False
        assert f"reaper.attach({PID}) raised" in caplog.text
        assert PID not in watchlist.by_pid
