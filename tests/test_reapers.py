"""Reapers: the recording fake (unit) and the default SignalReaper (real processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from aiotimer.errors import ProcessGoneError, ReapError, RefusedTargetError
from aiotimer.reapers import NonBlockingReaper, Reaper, SignalReaper, as_nonblocking
from aiotimer.testing import ReaperCall, RecordingReaper


def test_both_reapers_satisfy_the_protocol() -> None:
    assert isinstance(SignalReaper(), Reaper)
    assert isinstance(RecordingReaper(), Reaper)


@pytest.mark.asyncio
async def test_recording_reaper_records_fails_and_exits() -> None:
    reaper = RecordingReaper(nonexistent={3}, stack_dump="stack")
    assert reaper.attach(1) and not reaper.attach(3)
    reaper.fail_signals(1, times=1)
    with pytest.raises(ReapError):
        await reaper.signal(1, signal.SIGTERM)
    await reaper.signal(1, signal.SIGTERM)
    assert await reaper.dump_stacks(1, 1.0) == "stack"
    await reaper.signal(1, signal.SIGKILL)  # in exit_on: the pid is now exited
    with pytest.raises(ProcessGoneError):
        await reaper.signal(1, signal.SIGKILL)
    with anyio.fail_after(1):
        await reaper.wait_exit(1)
    reaper.detach(1)
    assert reaper.signals() == [(1, signal.SIGTERM), (1, signal.SIGKILL)]
    assert reaper.calls[0] == ReaperCall("attach", 1)
    assert reaper.methods(1) == [
        "attach",
        "signal_failed",
        "signal",
        "dump_stacks",
        "signal",
        "signal_gone",
        "wait_exit",
        "detach",
    ]


def test_recording_reaper_signals_nowait_the_same_way() -> None:
    reaper = RecordingReaper()
    reaper.fail_signals(1, times=1)
    with pytest.raises(ReapError):
        reaper.signal_nowait(1, signal.SIGTERM)
    reaper.signal_nowait(1, signal.SIGTERM, group=True)
    reaper.signal_nowait(1, signal.SIGKILL)  # in exit_on: the pid is now exited
    with pytest.raises(ProcessGoneError):
        reaper.signal_nowait(1, signal.SIGKILL)
    assert reaper.calls == [
        ReaperCall("signal_failed", 1, signal.SIGTERM),
        ReaperCall("signal", 1, signal.SIGTERM, group=True),
        ReaperCall("signal", 1, signal.SIGKILL),
        ReaperCall("signal_gone", 1, signal.SIGKILL),
    ]


class OnlyAsyncReaper:
    """A custom reaper without ``signal_nowait``."""

    def attach(self, pid: int) -> bool:
        return True

    async def wait_exit(self, pid: int) -> None:
        await anyio.sleep_forever()

    async def signal(self, pid: int, signum: int, *, group: bool = False) -> None:
        pass

    async def dump_stacks(self, pid: int, timeout: float) -> str | None:
        return None

    def detach(self, pid: int) -> None:
        pass


class FilteringReaper(RecordingReaper):
    """Overrides ``signal`` only: the inherited ``signal_nowait`` would bypass it."""

    async def signal(self, pid: int, signum: int, *, group: bool = False) -> None:
        await super().signal(pid, signum, group=group)


class FilteringBothReaper(FilteringReaper):
    """Overrides both, so its ``signal_nowait`` may stand in for its ``signal``."""

    def signal_nowait(self, pid: int, signum: int, *, group: bool = False) -> None:
        super().signal_nowait(pid, signum, group=group)


def test_which_reapers_the_server_may_signal_inline() -> None:
    for reaper in (SignalReaper(), RecordingReaper(), FilteringBothReaper()):
        assert isinstance(reaper, NonBlockingReaper)
        assert as_nonblocking(reaper) is reaper
    assert isinstance(OnlyAsyncReaper(), Reaper)
    assert as_nonblocking(OnlyAsyncReaper()) is None
    assert isinstance(FilteringReaper(), NonBlockingReaper)
    assert as_nonblocking(FilteringReaper()) is None


@pytest.mark.asyncio
async def test_recording_reaper_exit_wakes_a_pending_wait() -> None:
    reaper = RecordingReaper()
    reaper.attach(5)
    async with anyio.create_task_group() as tg:
        tg.start_soon(reaper.wait_exit, 5)
        await anyio.lowlevel.checkpoint()
        reaper.exit(5)
    assert reaper.methods(5) == ["attach", "wait_exit"]


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.process
@pytest.mark.timeout(20)
@pytest.mark.asyncio
async def test_signal_reaper_kills_pinned_child_and_sees_it_exit(
    child: subprocess.Popen[bytes],
) -> None:
    reaper = SignalReaper()
    assert reaper.attach(child.pid)
    async with anyio.create_task_group() as tg:
        tg.start_soon(reaper.wait_exit, child.pid)
        await reaper.signal(child.pid, signal.SIGKILL)
    assert child.wait(5) == -signal.SIGKILL
    with pytest.raises(ProcessGoneError):
        await reaper.signal(child.pid, signal.SIGKILL)
    assert await reaper.dump_stacks(child.pid, 0.1) is None
    reaper.detach(child.pid)
    reaper.detach(child.pid)  # idempotent


@pytest.mark.process
@pytest.mark.timeout(20)
@pytest.mark.asyncio
async def test_signal_reaper_detach_while_waiting_then_reattach(
    child: subprocess.Popen[bytes],
) -> None:
    reaper = SignalReaper()
    assert reaper.attach(child.pid)
    with anyio.move_on_after(0.05):
        async with anyio.create_task_group() as tg:
            tg.start_soon(reaper.wait_exit, child.pid)
            await anyio.lowlevel.checkpoint()
            reaper.detach(child.pid)  # the pending wait closes the handle when it ends
            await anyio.sleep(1)
    assert reaper.attach(child.pid)  # a fresh pin
    await reaper.signal(child.pid, signal.SIGTERM)
    assert child.wait(5) == -signal.SIGTERM
    reaper.close()


@pytest.mark.process
@pytest.mark.timeout(20)
def test_signal_reaper_signals_nowait_like_signal(child: subprocess.Popen[bytes]) -> None:
    reaper = SignalReaper()
    with pytest.raises(RefusedTargetError):
        reaper.signal_nowait(os.getpid(), signal.SIGKILL)
    with pytest.raises(RefusedTargetError):
        reaper.signal_nowait(child.pid, signal.SIGKILL)  # not attached yet
    assert reaper.attach(child.pid)
    reaper.signal_nowait(child.pid, signal.SIGKILL)
    assert child.wait(5) == -signal.SIGKILL
    with pytest.raises(ProcessGoneError):
        reaper.signal_nowait(child.pid, signal.SIGKILL)
    reaper.close()


@pytest.mark.process
@pytest.mark.asyncio
async def test_signal_reaper_refuses_and_reports_unknown() -> None:
    reaper = SignalReaper()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert not reaper.attach(gone.pid)  # no such process (reaped child)
    with pytest.raises(RefusedTargetError):
        await reaper.signal(os.getpid(), signal.SIGKILL)
    with pytest.raises(RefusedTargetError):
        await reaper.signal(12345678, signal.SIGKILL)  # never attached
    assert reaper.attach(1)
    with pytest.raises(RefusedTargetError):
        await reaper.signal(1, signal.SIGKILL)
    reaper.close()


@pytest.mark.process
@pytest.mark.timeout(20)
@pytest.mark.asyncio
async def test_signal_reaper_never_signals_a_worker_without_the_dump_hook(
    child: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    reaper = SignalReaper(dump_dir=tmp_path, py_spy=False)
    assert reaper.attach(child.pid)
    assert await reaper.dump_stacks(child.pid, 0.5) is None
    await anyio.sleep(0.1)
    assert child.poll() is None  # SIGUSR1 would have killed it
    assert await reaper.dump_stacks(4_000_000, 0.5) is None  # never attached
    reaper.close()
