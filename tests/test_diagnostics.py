"""Stack dumps: the worker-side hook, the server-side collector, and real stuck workers."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import _lines
import anyio
import pytest
from _pids import fake_pid

from aiotimer import diagnostics
from aiotimer.diagnostics import (
    DEFAULT_DUMP_SIGNAL,
    END_MARKER,
    ENV_DUMP_DIR,
    collect_dump,
    dump_path_for,
    ensure_dump_handler,
    format_tasks,
    hook_info,
    install_dump_handler,
    py_spy_dump,
    read_dump,
    uninstall_dump_handler,
)
from aiotimer.reapers._dumps import NoDump, py_spy_dump_or_why
from aiotimer.reapers._left_dumps import MAX_KEPT_DUMPS, LeftDumps

REPO = Path(__file__).resolve().parent.parent


def never_signal(signum: int) -> None:
    raise AssertionError(f"must not signal (got {signum})")


# -- paths ------------------------------------------------------------------------------


def test_dump_path_for(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV_DUMP_DIR, raising=False)
    private = Path(tempfile.gettempdir()) / f"aiotimer-dumps-{os.geteuid()}"
    assert dump_path_for(42) == private / "aiotimer-dump-42.txt"
    monkeypatch.setenv(ENV_DUMP_DIR, str(tmp_path / "env"))
    assert dump_path_for(42) == tmp_path / "env" / "aiotimer-dump-42.txt"
    assert dump_path_for(7, tmp_path) == tmp_path / "aiotimer-dump-7.txt"


# -- the hook, in this process ------------------------------------------------------------


@pytest.fixture
def hook(tmp_path: Path) -> Iterator[Path]:
    before = signal.getsignal(DEFAULT_DUMP_SIGNAL)
    path = install_dump_handler(dump_dir=tmp_path)
    try:
        yield path
    finally:
        uninstall_dump_handler()
    assert signal.getsignal(DEFAULT_DUMP_SIGNAL) == before
    assert not path.exists()


def wait_for_marker(path: Path, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text()
        if END_MARKER in text:
            return text
        time.sleep(0.01)
    raise AssertionError(f"no end marker in {path} after {timeout}s")


def test_install_writes_a_header_that_identifies_this_process(hook: Path, tmp_path: Path) -> None:
    assert hook == dump_path_for(os.getpid(), tmp_path)
    assert hook.stat().st_mode & 0o777 == 0o600
    info = hook_info(os.getpid(), tmp_path)
    assert info is not None
    assert (info.pid, info.signum, info.path) == (os.getpid(), DEFAULT_DUMP_SIGNAL, hook)


def test_signal_dumps_threads_and_ends_with_the_marker(hook: Path) -> None:
    os.kill(os.getpid(), DEFAULT_DUMP_SIGNAL)
    text = wait_for_marker(hook)
    assert "Current thread" in text
    assert "in test_signal_dumps_threads_and_ends_with_the_marker" in text
    assert "no asyncio event loop is running" in text
    assert text.rstrip().endswith(END_MARKER)


@pytest.mark.asyncio
async def test_signal_inside_a_loop_dumps_the_running_task(hook: Path) -> None:
    async def parked() -> None:
        await asyncio.Event().wait()

    task = asyncio.create_task(parked(), name="parked")
    await asyncio.sleep(0)
    os.kill(os.getpid(), DEFAULT_DUMP_SIGNAL)
    text = wait_for_marker(hook)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    section = text.split("=== aiotimer asyncio tasks", 1)[1]
    assert "Task 'parked' (pending):" in section
    assert "parked at " in section
    assert "(running)" in section
    assert "test_signal_inside_a_loop_dumps_the_running_task at " in section


def test_install_refuses_other_threads_and_symlinks(tmp_path: Path) -> None:
    errors: list[BaseException] = []

    def install() -> None:
        try:
            install_dump_handler(dump_dir=tmp_path)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=install)
    thread.start()
    thread.join()
    assert len(errors) == 1
    assert isinstance(errors[0], RuntimeError)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    before = signal.getsignal(DEFAULT_DUMP_SIGNAL)
    with pytest.raises(OSError):
        install_dump_handler(link)
    assert signal.getsignal(DEFAULT_DUMP_SIGNAL) == before
    assert not (tmp_path / "elsewhere").exists()
    uninstall_dump_handler()  # nothing installed: a no-op


def test_reinstall_replaces_the_hook(tmp_path: Path) -> None:
    first = install_dump_handler(tmp_path / "first.txt")
    try:
        second = install_dump_handler(tmp_path / "second.txt", signum=signal.SIGUSR2)
        assert not first.exists()
        assert second.read_text().endswith(f"signal={int(signal.SIGUSR2)}\n")
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    finally:
        uninstall_dump_handler()


def test_ensure_installs_once_keeps_an_existing_hook_and_never_raises(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(ENV_DUMP_DIR, str(tmp_path))
    try:
        path = ensure_dump_handler()
        assert path == dump_path_for(os.getpid(), tmp_path) and path.exists()
        assert ensure_dump_handler() == path  # kept, not re-created
        custom = install_dump_handler(tmp_path / "custom.txt", signum=signal.SIGUSR2)
        assert ensure_dump_handler() == custom
        results: list[Path | None] = []
        uninstall_dump_handler()
        thread = threading.Thread(target=lambda: results.append(ensure_dump_handler()))
        thread.start()
        thread.join()
        assert results == [None]  # only the main thread can install
        monkeypatch.setenv(ENV_DUMP_DIR, str(tmp_path / "missing" / "too"))
        assert ensure_dump_handler() is None  # cannot create the file: logged, not raised
    finally:
        uninstall_dump_handler()


# -- formatting -------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_format_tasks_follows_the_await_chain() -> None:
    gate = asyncio.Event()

    async def innermost() -> None:
        await gate.wait()

    async def middle() -> None:
        await innermost()

    async def outer() -> None:
        await middle()

    stuck = asyncio.create_task(outer(), name="stuck")
    joiner = asyncio.create_task(asyncio.wait_for(stuck, 30), name="joiner")
    await asyncio.sleep(0.01)
    text = format_tasks(asyncio.get_running_loop())
    gate.set()
    await joiner
    lines = text.splitlines()
    stuck_at = lines.index("Task 'stuck' (pending):")
    chain = [line.strip().split(" at ")[0] for line in lines[stuck_at + 1 : stuck_at + 5]]
    assert chain == [
        "test_format_tasks_follows_the_await_chain.<locals>.outer",
        "test_format_tasks_follows_the_await_chain.<locals>.middle",
        "test_format_tasks_follows_the_await_chain.<locals>.innermost",
        "Event.wait",
    ]
    assert lines[stuck_at + 5].strip().startswith("awaiting <Future pending")
    assert f"{__file__}:" in lines[stuck_at + 1]
    assert "Task 'joiner' (pending):" in lines


# -- the server side ----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_no_hook_means_no_signal(tmp_path: Path) -> None:
    assert hook_info(os.getpid(), tmp_path) is None
    assert await collect_dump(os.getpid(), send_signal=never_signal, dump_dir=tmp_path) is None


@pytest.mark.parametrize(
    "header",
    [
        "aiotimer-dump-hook pid={pid} start=1 signal=10\n",  # an earlier process's file
        "aiotimer-dump-hook pid={other} start=- signal=10\n",  # another pid's file
        "something else entirely\n",
        "",
    ],
)
@pytest.mark.asyncio
async def test_stale_or_foreign_files_are_not_trusted(tmp_path: Path, header: str) -> None:
    pid = os.getpid()
    dump_path_for(pid, tmp_path).write_text(header.format(pid=pid, other=fake_pid(1)))
    assert hook_info(pid, tmp_path) is None
    assert await collect_dump(pid, send_signal=never_signal, dump_dir=tmp_path) is None


@pytest.mark.asyncio
async def test_a_hook_on_another_signal_is_not_signalled(tmp_path: Path) -> None:
    pid = os.getpid()
    dump_path_for(pid, tmp_path).write_text(f"aiotimer-dump-hook pid={pid} start=- signal=12\n")
    assert await collect_dump(pid, send_signal=never_signal, dump_dir=tmp_path, signum=10) is None


@pytest.mark.asyncio
async def test_read_dump_returns_only_the_new_complete_dump(tmp_path: Path) -> None:
    path = tmp_path / "dump.txt"
    old = f"header\nold dump\n{END_MARKER}\n"
    path.write_text(old)

    async def worker_writes_later() -> None:
        await anyio.sleep(0.05)
        with path.open("a") as f:
            f.write(f"new stacks\n{END_MARKER}\ntrailing junk")

    async with anyio.create_task_group() as tg:
        tg.start_soon(worker_writes_later)
        text = await read_dump(path, offset=len(old), timeout=10)
    assert text == f"new stacks\n{END_MARKER}\n"


@pytest.mark.asyncio
async def test_read_dump_times_out_with_partial_text_or_none(tmp_path: Path) -> None:
    path = tmp_path / "dump.txt"
    assert await read_dump(path, timeout=0.02) is None  # no file at all
    path.write_text("Current thread 0x1 (most recent call first):\n")
    text = await read_dump(path, timeout=0.02)
    assert text is not None
    assert text.startswith("Current thread")
    assert "dump incomplete" in text
    with pytest.raises(ValueError, match="timeout"):
        await read_dump(path, timeout=-1)


@pytest.mark.asyncio
async def test_py_spy_dump_is_none_without_py_spy(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    assert diagnostics.py_spy_executable() is None
    assert await py_spy_dump(os.getpid()) is None


# -- real stuck workers -------------------------------------------------------------------

WORKER = """
import asyncio, os, sys, time
from aiotimer.diagnostics import install_dump_handler

def announce():
    print(os.getpid(), flush=True)

async def stuck_forever():
    asyncio.get_running_loop().call_soon(announce)  # runs once this task is parked
    await asyncio.Event().wait()

async def blocked_in_sleep():
    announce()
    time.sleep(60)

async def main(mode):
    install_dump_handler()
    if mode == "fork":
        if os.fork() == 0:
            announce()
            time.sleep(60)
            os._exit(0)
        announce()
        time.sleep(60)
    elif mode == "sleep":
        await blocked_in_sleep()
    elif mode == "gil":
        announce()
        sum(range(10**15))  # C code holding the GIL: Python-level handlers cannot run
    else:
        await stuck_forever()

mode, loop = sys.argv[1], sys.argv[2]
if loop == "uvloop":
    import uvloop
    uvloop.run(main(mode))
else:
    asyncio.run(main(mode))
"""
NO_HOOK_WORKER = "import time; print('ready', flush=True); time.sleep(60)"


def read_line(proc: subprocess.Popen[str], timeout: float = 20.0) -> str:
    return _lines.read_line(proc, timeout)


def start(tmp_path: Path, code: str, *args: str) -> subprocess.Popen[str]:
    script = tmp_path / "worker.py"
    script.write_text(code)
    env = {**os.environ, ENV_DUMP_DIR: str(tmp_path), "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, str(script), *args], stdout=subprocess.PIPE, text=True, env=env
    )


def stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait(timeout=20)
    assert proc.stdout is not None
    proc.stdout.close()


def collect(pid: int, tmp_path: Path, timeout: float) -> str | None:
    # The tolerance is generous: the worker runs on a busy 2-core machine.
    return anyio.run(
        lambda: collect_dump(
            pid, send_signal=lambda s: os.kill(pid, s), dump_dir=tmp_path, timeout=timeout
        )
    )


LOOPS = ["asyncio", "uvloop"]


@pytest.mark.process
@pytest.mark.timeout(40)
@pytest.mark.parametrize("loop", LOOPS)
def test_dump_of_a_worker_stuck_awaiting(tmp_path: Path, loop: str) -> None:
    proc = start(tmp_path, WORKER, "await", loop)
    try:
        pid = int(read_line(proc))
        text = collect(pid, tmp_path, timeout=15)
        assert proc.poll() is None, "the dump signal must not kill the worker"
    finally:
        stop(proc)
    assert text is not None
    threads, tasks = text.split("=== aiotimer asyncio tasks", 1)
    assert "Current thread" in threads
    assert "worker.py" in threads
    assert "stuck_forever at " in tasks
    assert "main at " in tasks
    assert text.rstrip().endswith(END_MARKER)


@pytest.mark.process
@pytest.mark.timeout(40)
@pytest.mark.parametrize("loop", LOOPS)
def test_dump_of_a_worker_blocked_in_time_sleep(tmp_path: Path, loop: str) -> None:
    proc = start(tmp_path, WORKER, "sleep", loop)
    try:
        pid = int(read_line(proc))
        text = collect(pid, tmp_path, timeout=15)
    finally:
        stop(proc)
    assert text is not None
    threads, tasks = text.split("=== aiotimer asyncio tasks", 1)
    assert "in blocked_in_sleep" in threads  # faulthandler: 'File ..., line 9 in blocked_in_sleep'
    assert "blocked_in_sleep at " in tasks
    assert "(running)" in tasks
    assert "stuck" not in tasks  # the only task is the running one


@pytest.mark.process
@pytest.mark.timeout(40)
def test_dump_of_a_worker_holding_the_gil_has_the_thread_stacks(tmp_path: Path) -> None:
    proc = start(tmp_path, WORKER, "gil", "asyncio")
    try:
        pid = int(read_line(proc))
        time.sleep(0.2)  # let it enter the C loop
        text = collect(pid, tmp_path, timeout=1.0)
    finally:
        stop(proc)
    assert text is not None
    assert "Current thread" in text
    assert "in main" in text
    assert END_MARKER not in text
    assert "dump incomplete" in text


@pytest.mark.process
@pytest.mark.timeout(40)
def test_a_forked_child_dumps_to_its_own_file(tmp_path: Path) -> None:
    proc = start(tmp_path, WORKER, "fork", "asyncio")
    pids = {int(read_line(proc)), int(read_line(proc))}
    (child,) = pids - {proc.pid}
    try:
        info = hook_info(child, tmp_path)
        assert info is not None
        assert info.pid == child
        assert hook_info(proc.pid, tmp_path) is not None
        text = collect(child, tmp_path, timeout=15)
        assert text is not None
        assert "Current thread" in text
        assert END_MARKER in text
        assert END_MARKER not in dump_path_for(proc.pid, tmp_path).read_text()
    finally:
        os.kill(child, signal.SIGKILL)
        stop(proc)


@pytest.mark.process
@pytest.mark.timeout(40)
def test_a_worker_without_the_hook_is_never_signalled(tmp_path: Path) -> None:
    proc = start(tmp_path, NO_HOOK_WORKER)
    try:
        assert read_line(proc) == "ready"
        assert collect(proc.pid, tmp_path, timeout=1.0) is None
        assert proc.poll() is None  # SIGUSR1 would have killed it
    finally:
        stop(proc)


@pytest.mark.process
@pytest.mark.timeout(40)
@pytest.mark.skipif(
    diagnostics.py_spy_executable() is None, reason="py-spy is not installed (extra: diagnostics)"
)
def test_py_spy_dump_of_a_real_worker(tmp_path: Path) -> None:
    proc = start(tmp_path, NO_HOOK_WORKER)
    try:
        assert read_line(proc) == "ready"
        text = anyio.run(lambda: py_spy_dump(proc.pid, timeout=30))
    finally:
        stop(proc)
    assert text is not None
    assert "<module>" in text


FAKE_PY_SPY = """#!/bin/sh
n=$(cat "$0.count" 2>/dev/null || echo 0); echo $((n + 1)) > "$0.count"
case "$FAKE_PY_SPY" in
  crash-once) [ "$n" = 0 ] && kill -SEGV $$; echo "Thread 1 (idle): MainThread" ;;
  crash) kill -SEGV $$ ;;
  refuse) echo "Permission denied (os error 13)" >&2; exit 1 ;;
esac
"""


@pytest.mark.process
@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("mode", "runs", "why"),
    [
        ("crash-once", 2, None),
        ("crash", 3, "py-spy failed (exit status -11, 3 attempts)"),
        ("refuse", 1, "py-spy failed (exit status 1: Permission denied (os error 13))"),
    ],
)
def test_a_crashed_py_spy_is_run_again_and_a_refusal_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, runs: int, why: str | None
) -> None:
    exe = tmp_path / "py-spy"
    exe.write_text(FAKE_PY_SPY)
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_PY_SPY", mode)
    result = anyio.run(lambda: py_spy_dump_or_why(os.getpid(), timeout=20))
    assert int((tmp_path / "py-spy.count").read_text()) == runs
    if why is None:
        assert result == "Thread 1 (idle): MainThread\n"
    else:
        assert isinstance(result, NoDump) and result.reason == why


def test_module_surface() -> None:
    assert set(diagnostics.__all__) <= set(dir(diagnostics))


# -- dump files left by exited workers ----------------------------------------------------


def _left_file(folder: Path, pid: int, start: int) -> Path:
    path = folder / f"aiotimer-dump-{pid}.txt"
    path.write_text(f"aiotimer-dump-hook pid={pid} start={start} signal=10\n")
    return path


def test_an_exited_workers_dump_file_is_removed_and_no_other(tmp_path: Path) -> None:
    folder = tmp_path / "dumps"
    folder.mkdir(mode=0o700)
    mine, reused = fake_pid(1), fake_pid(2)
    left = LeftDumps(folder)
    path = _left_file(folder, mine, 77)
    other = _left_file(folder, reused, 99)  # a new process got the pid: started later
    left.exited(mine, 77)
    left.exited(reused, 77)
    left.exited(fake_pid(3), 5)  # left no file
    assert not path.exists() and other.exists()
    left.exited(reused, None)  # a start time unknown: never touched
    assert other.exists()


def test_kept_dump_files_are_bounded_oldest_first(tmp_path: Path) -> None:
    folder = tmp_path / "dumps"
    folder.mkdir(mode=0o700)
    left = LeftDumps(folder, keep=True)
    pids = [fake_pid(n) for n in range(1, MAX_KEPT_DUMPS + 4)]
    for pid in pids:
        _left_file(folder, pid, 1)
        left.exited(pid, 1)
    on_disk = {int(p.name[len("aiotimer-dump-") : -4]) for p in folder.iterdir()}
    assert on_disk == set(pids[3:])
    assert left.kept == tuple(folder / f"aiotimer-dump-{pid}.txt" for pid in pids[3:])
