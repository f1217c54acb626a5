"""Process identity (aiotimer.reapers._identity.PinnedProcess) against real child processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import anyio
import pytest

from aiotimer._edges.procfs import ancestors, is_descendant, read_start_time, read_status
from aiotimer.errors import ProcessGoneError, ReapError, RefusedTargetError
from aiotimer.reapers._identity import PinnedProcess, server_identity

pytestmark = [pytest.mark.process, pytest.mark.timeout(20)]

HAS_PIDFD = hasattr(os, "pidfd_open")
#: How long a signalled child may take to be seen as exited, on a busy 2-core machine.
EXIT_BOUND = 5.0


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """A child that sleeps until killed (in this process's group)."""
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _wait_gone(pid: int) -> bool:
    """Poll until ``pid`` has no live process (zombies count as gone)."""
    deadline = time.monotonic() + EXIT_BOUND
    while time.monotonic() < deadline:
        try:
            read_start_time(pid)
        except ProcessGoneError:
            return True
        time.sleep(0.01)
    return False


def test_read_start_time_of_self_is_stable() -> None:
    first = read_start_time(os.getpid())
    assert isinstance(first, int)
    assert read_start_time(os.getpid()) == first


def test_pin_and_signal_a_real_child(child: subprocess.Popen[bytes]) -> None:
    with PinnedProcess.pin(child.pid) as worker:
        assert worker.pid == child.pid
        assert worker.start_time == read_start_time(child.pid)
        assert (worker.fileno() is not None) == HAS_PIDFD
        assert worker.is_alive()
        assert "alive" in repr(worker)
        worker.send_signal(signal.SIGTERM)
        assert child.wait(timeout=EXIT_BOUND) == -signal.SIGTERM
        assert not worker.is_alive()
        assert "exited" in repr(worker)


def test_signal_after_exit_is_process_gone(child: subprocess.Popen[bytes]) -> None:
    with PinnedProcess.pin(child.pid) as worker:
        child.kill()
        deadline = time.monotonic() + EXIT_BOUND
        while worker.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        # Not reaped yet: a zombie has exited all the same.
        with pytest.raises(ProcessGoneError):
            worker.send_signal(signal.SIGTERM)
        child.wait()
        with pytest.raises(ProcessGoneError):
            worker.send_signal(signal.SIGTERM)


def test_pin_of_dead_or_zombie_process_is_process_gone() -> None:
    proc = subprocess.Popen(["true"])
    assert _wait_gone(proc.pid)  # exited, still a zombie: not reaped yet
    with pytest.raises(ProcessGoneError):
        PinnedProcess.pin(proc.pid)
    proc.wait()
    with pytest.raises(ProcessGoneError):
        PinnedProcess.pin(proc.pid)


def test_recycled_pid_is_refused_via_start_time(child: subprocess.Popen[bytes]) -> None:
    actual = read_start_time(child.pid)
    assert actual is not None
    # A handle recorded for an earlier process that had the same pid.
    stale = PinnedProcess(child.pid, start_time=actual - 1)
    assert stale.fileno() is None
    assert not stale.is_alive()
    with pytest.raises(ProcessGoneError):
        stale.send_signal(signal.SIGKILL)
    with pytest.raises(ProcessGoneError):
        stale.send_signal(signal.SIGKILL, group=True)
    assert child.poll() is None, "the unrelated process must not have been signalled"
    stale.close()

    # The same path with the right start time does signal.
    with PinnedProcess(child.pid, start_time=actual) as same:
        assert same.is_alive()
        same.send_signal(signal.SIGKILL)
    assert child.wait(timeout=EXIT_BOUND) == -signal.SIGKILL


def test_refuses_pid_1_own_pid_and_nonpositive_pins() -> None:
    for pid in (0, -1, -os.getpgrp()):
        with pytest.raises(RefusedTargetError):
            PinnedProcess.pin(pid)
    with (
        PinnedProcess(1, start_time=None) as init,
        pytest.raises(RefusedTargetError),
    ):
        init.send_signal(signal.SIGKILL)
    with PinnedProcess.pin(os.getpid()) as me:
        with pytest.raises(RefusedTargetError):
            me.send_signal(signal.SIGKILL)
        with pytest.raises(RefusedTargetError):
            me.send_signal(signal.SIGKILL, group=True)


def test_refuses_the_servers_own_process_group(child: subprocess.Popen[bytes]) -> None:
    assert os.getpgid(child.pid) == os.getpgrp()
    with PinnedProcess.pin(child.pid) as worker, pytest.raises(RefusedTargetError):
        worker.send_signal(signal.SIGKILL, group=True)
    assert child.poll() is None


def test_group_signal_reaches_grandchildren() -> None:
    # A worker in its own session that forked a grandchild.
    proc = subprocess.Popen(
        ["sh", "-c", "sleep 60 & echo $!; wait"],
        start_new_session=True,
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        grandchild = int(proc.stdout.readline())
        with PinnedProcess.pin(proc.pid) as worker:
            worker.send_signal(signal.SIGKILL, group=True)
        assert proc.wait(timeout=EXIT_BOUND) == -signal.SIGKILL
        assert _wait_gone(grandchild)
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


_EPERM_PROBE = """
import os, signal, sys
from aiotimer.reapers._identity import PinnedProcess
from aiotimer.errors import ProcessGoneError, ReapError
os.setgid(65534)
os.setuid(65534)
with PinnedProcess.pin(int(sys.argv[1])) as worker:
    try:
        worker.send_signal(signal.SIGKILL)
    except ProcessGoneError:
        sys.exit("wrongly reported as gone")
    except ReapError as exc:
        print(exc)
        sys.exit(0)
sys.exit("the signal was sent")
"""


def test_permission_denied_is_a_reap_error(child: subprocess.Popen[bytes]) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to run the probe as another user")
    # Run the signalling side as 'nobody' against our (root-owned) child.
    probe = subprocess.run(
        [sys.executable, "-c", _EPERM_PROBE, str(child.pid)],
        capture_output=True,
        text=True,
        timeout=15,
        check=False,
    )
    assert probe.returncode == 0, probe.stderr
    assert "not permitted" in probe.stdout
    assert child.poll() is None


def test_close_is_idempotent_and_final(child: subprocess.Popen[bytes]) -> None:
    worker = PinnedProcess.pin(child.pid)
    worker.close()
    worker.close()
    assert worker.closed
    assert worker.fileno() is None
    assert not worker.is_alive()
    assert "closed" in repr(worker)
    with pytest.raises(ReapError):
        worker.send_signal(signal.SIGKILL)
    assert child.poll() is None


def test_unclosed_handle_warns(child: subprocess.Popen[bytes]) -> None:
    if not HAS_PIDFD:
        pytest.skip("only a pidfd is a resource to leak")
    worker = PinnedProcess.pin(child.pid)
    with pytest.warns(ResourceWarning):
        worker.__del__()
    assert worker.closed


@pytest.mark.asyncio
async def test_wait_exit_wakes_promptly_on_pidfd(child: subprocess.Popen[bytes]) -> None:
    if not HAS_PIDFD:
        pytest.skip("no pidfd on this OS")
    with PinnedProcess.pin(child.pid) as worker:
        woke_after: list[float] = []

        async def waiter() -> None:
            await worker.wait_exit()
            woke_after.append(time.monotonic() - killed_at)

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.sleep(0.05)
            assert not woke_after, "wait_exit returned while the worker was alive"
            killed_at = time.monotonic()
            child.kill()
            with anyio.fail_after(EXIT_BOUND):
                while not woke_after:
                    await anyio.sleep(0.005)
        # Promptly: far below any polling interval (tolerance for a busy machine).
        assert woke_after[0] < 1.0


@pytest.mark.asyncio
async def test_wait_exit_polls_without_pidfd(child: subprocess.Popen[bytes]) -> None:
    with PinnedProcess(child.pid, read_start_time(child.pid)) as worker:
        child.kill()
        with anyio.fail_after(EXIT_BOUND):
            await worker.wait_exit(poll_interval=0.01)
        assert not worker.is_alive()


def test_pin_rejects_non_int() -> None:
    with pytest.raises(TypeError):
        PinnedProcess.pin(True)
    with pytest.raises(TypeError):
        PinnedProcess.pin("12")  # type: ignore[arg-type]


@pytest.fixture
def thread_id() -> Iterator[int]:
    """The thread id of a thread of this process, alive for the test."""
    started, stop = threading.Event(), threading.Event()
    tid: list[int] = []

    def run() -> None:
        tid.append(threading.get_native_id())
        started.set()
        stop.wait(30)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(5)
    try:
        yield tid[0]
    finally:
        stop.set()
        thread.join(5)


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "no-pidfd"])
def test_a_thread_id_is_never_pinned(
    thread_id: int, pidfd: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tid is refused, never pinned through the start time (kill(tid) takes its process)."""
    assert thread_id != os.getpid()
    if pidfd and not HAS_PIDFD:
        pytest.skip("no pidfd_open here")
    if not pidfd:
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    with pytest.raises(RefusedTargetError, match=f"thread of process {os.getpid()}"):
        PinnedProcess.pin(thread_id)


def test_read_status_names_the_thread_group_and_parent(thread_id: int) -> None:
    me = read_status(os.getpid())
    assert me is not None
    assert (me.tgid, me.ppid, me.uid) == (os.getpid(), os.getppid(), os.getuid())
    thread = read_status(thread_id)
    assert thread is not None and thread.tgid == os.getpid()


def test_pin_refuses_a_start_time_that_differs(child: subprocess.Popen[bytes]) -> None:
    """A request sent by an earlier owner of the pid (another start time) pins nothing."""
    actual = read_start_time(child.pid)
    assert actual is not None
    with pytest.raises(ProcessGoneError, match="now names another process"):
        PinnedProcess.pin(child.pid, start_time=actual - 1)
    with PinnedProcess.pin(child.pid, start_time=actual) as worker:
        assert worker.start_time == actual


def test_ancestors_and_descendants(child: subprocess.Popen[bytes]) -> None:
    mine = ancestors(os.getpid())
    # The first process of a PID namespace (pid 1) has no parent there: getppid() is 0.
    assert mine[:1] == ((os.getppid(),) if os.getppid() else ())
    assert ancestors(child.pid)[: len(mine) + 1] == (os.getpid(), *mine)
    assert is_descendant(child.pid, os.getpid())
    assert not is_descendant(os.getpid(), child.pid)


def test_policy_facts_of_a_child_and_of_the_server(child: subprocess.Popen[bytes]) -> None:
    server = server_identity()
    assert (server.pid, server.uid, server.pgid) == (os.getpid(), os.geteuid(), os.getpgrp())
    assert server.ancestors == frozenset(ancestors(os.getpid()))
    assert os.getppid() in server.ancestors or os.getppid() == 0  # pid 1 has no parent
    with PinnedProcess.pin(child.pid) as worker:
        facts = worker.target(os.getpid())
        assert (facts.pid, facts.uid, facts.pgid) == (child.pid, os.getuid(), os.getpgrp())
        assert facts.registered and facts.descendant
        assert worker.target(child.pid).descendant is False
    assert not worker.target(os.getpid()).registered  # a closed handle proves nothing
