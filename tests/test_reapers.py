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
from aiotimer.reapers import NoDump, Reaper, SignalReaper
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
        reaper.signal(1, signal.SIGTERM)
    reaper.signal(1, signal.SIGTERM)
    assert await reaper.dump_stacks(1, 1.0) == "stack"
    reaper.signal(1, signal.SIGKILL)  # in exit_on: the pid is now exited
    with pytest.raises(ProcessGoneError):
        reaper.signal(1, signal.SIGKILL)
    with anyio.fail_after(1):
        await reaper.wait_exit(1)
    reaper.detach(1)
    reaper.signal(2, signal.SIGTERM, group=True)
    assert reaper.calls[-1] == ReaperCall("signal", 2, signal.SIGTERM, group=True)
    assert reaper.signals() == [(1, signal.SIGTERM), (1, signal.SIGKILL), (2, signal.SIGTERM)]
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
        reaper.signal(child.pid, signal.SIGKILL)
    assert child.wait(5) == -signal.SIGKILL
    with pytest.raises(ProcessGoneError):
        reaper.signal(child.pid, signal.SIGKILL)
    assert await reaper.dump_stacks(child.pid, 0.1) == NoDump("the worker has exited")
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
    reaper.signal(child.pid, signal.SIGTERM)
    assert child.wait(5) == -signal.SIGTERM
    reaper.close()


@pytest.mark.process
@pytest.mark.timeout(20)
def test_signal_reaper_signals_synchronously_without_a_loop(child: subprocess.Popen[bytes]) -> None:
    reaper = SignalReaper()
    with pytest.raises(RefusedTargetError):
        reaper.signal(os.getpid(), signal.SIGKILL)
    with pytest.raises(RefusedTargetError):
        reaper.signal(child.pid, signal.SIGKILL)  # not attached yet
    assert reaper.attach(child.pid)
    reaper.signal(child.pid, signal.SIGKILL)
    assert child.wait(5) == -signal.SIGKILL
    with pytest.raises(ProcessGoneError):
        reaper.signal(child.pid, signal.SIGKILL)
    reaper.close()


@pytest.mark.process
@pytest.mark.asyncio
async def test_signal_reaper_refuses_and_reports_unknown() -> None:
    reaper = SignalReaper()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert not reaper.attach(gone.pid)  # no such process (reaped child)
    with pytest.raises(RefusedTargetError):
        reaper.signal(os.getpid(), signal.SIGKILL)
    with pytest.raises(RefusedTargetError):
        reaper.signal(12345678, signal.SIGKILL)  # never attached
    assert reaper.attach(1)
    with pytest.raises(RefusedTargetError):
        reaper.signal(1, signal.SIGKILL)
    reaper.close()


@pytest.mark.process
@pytest.mark.timeout(20)
@pytest.mark.asyncio
async def test_signal_reaper_never_signals_a_worker_without_the_dump_hook(
    child: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    reaper = SignalReaper(dump_dir=tmp_path, py_spy=False)
    assert reaper.attach(child.pid)
    no_hook = await reaper.dump_stacks(child.pid, 0.5)
    assert isinstance(no_hook, NoDump)
    assert no_hook.reason.startswith("no dump hook in the worker")
    assert no_hook.reason.endswith("the py-spy fallback is off")
    await anyio.sleep(0.1)
    assert child.poll() is None  # SIGUSR1 would have killed it
    assert await reaper.dump_stacks(4_000_000, 0.5) == NoDump("the worker was never pinned")
    reaper.close()
