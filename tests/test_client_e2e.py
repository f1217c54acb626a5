"""End to end: real worker processes, a real server, real signals.

The server runs in this process (thread mode) on a FIFO in a temporary directory; the
workers are fresh Python processes that find it through the environment only (no
``configure()``). Workers of one test are started together so that interpreter start-up
(up to a few seconds on a busy 2-core machine) is paid once per test.

Tolerances: deadlines are 1-2.5 s, healthy blocks last a few ms, and every wait is
bounded by a generous ``WAIT`` so a stalled machine fails a test instead of hanging it.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiotimer.events import Event, WorkerReaped
from aiotimer.server import TimerServer, TimerServerThread
from aiotimer.wire import ENV_FIFO, MARKER_SUFFIX, TORCH_ENV_FIFO

pytestmark = pytest.mark.process

#: The longest a test waits for its workers (they normally finish within ~5 s).
WAIT = 40.0
KILLED = -signal.SIGKILL


class Harness:
    """A server in a thread plus helpers to start workers against its FIFO."""

    def __init__(self, tmp_path: Path) -> None:
        self.fifo = tmp_path / "timer.fifo"
        self.events: list[Event] = []
        self.thread = self.new_server()
        self.procs: list[subprocess.Popen[str]] = []

    def new_server(self) -> TimerServerThread:
        thread = TimerServerThread(TimerServer(fifo=self.fifo, on_event=self.events.append))
        thread.start()
        return thread

    def spawn(
        self, code: str, *, env_var: str = ENV_FIFO, stdin: bool = False
    ) -> subprocess.Popen[str]:
        env = {k: v for k, v in os.environ.items() if k not in (ENV_FIFO, TORCH_ENV_FIFO)}
        env[env_var] = str(self.fifo)
        proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)],
            env=env,
            stdin=subprocess.PIPE if stdin else None,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        return proc

    def wait(self, proc: subprocess.Popen[str]) -> tuple[int, str, str]:
        out, err = proc.communicate(timeout=WAIT)
        return proc.returncode, out, err

    def reaped_pids(self) -> set[int]:
        return {e.pid for e in self.events if isinstance(e, WorkerReaped)}

    def was_reaped(self, pid: int) -> bool:
        """Whether the server reported reaping ``pid`` (the event may trail the death)."""
        deadline = time.monotonic() + 5.0
        while pid not in self.reaped_pids() and time.monotonic() < deadline:
            time.sleep(0.01)
        return pid in self.reaped_pids()

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
        self.thread.stop(WAIT)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path)
    yield h
    h.close()


SYNC_WORKER = """
    import time
    from aiotimer.client import expires
    for i in range(20):
        with expires(after=1.0):
            with expires(after=1.0):
                time.sleep(0.002)
    with expires(after=1.0):
        if {stuck}:
            time.sleep(60)
    print("done", flush=True)
"""

ASYNC_WORKER = """
    import asyncio, time
    from aiotimer.client import expires
    async def main():
        for i in range(20):
            async with expires(after=1.0):
                async with expires(after=1.0):
                    await asyncio.sleep(0.002)
        async with expires(after=1.0):
            if {stuck}:
                time.sleep(60)  # a blocking call: the event loop is stuck too
        print("done", flush=True)
    asyncio.run(main())
"""

THREADS_WORKER = """
    import threading, time
    from aiotimer.client import expires
    def work(n):
        for i in range(20):
            with expires(after=2.0):
                with expires(after=2.0):
                    time.sleep(0.001)
        if {stuck} and n == 3:
            with expires(after=1.0):
                time.sleep(60)
    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads: t.start()
    for t in threads: t.join()
    print("done", flush=True)
"""

TASKS_WORKER = """
    import asyncio, random
    from aiotimer.client import expires
    async def item(n):
        async with expires(after=2.5):
            await asyncio.sleep(random.uniform(0, 0.05))
            async with expires(after=2.5):
                await asyncio.sleep(random.uniform(0, 0.05))
                async with expires(after=2.5):
                    await asyncio.sleep(0)
    async def main():
        await asyncio.gather(*(item(n) for n in range(300)))
        print("done", flush=True)
    asyncio.run(main())
"""


@pytest.mark.timeout(60)
def test_sync_async_threads_and_tasks_only_the_stuck_are_reaped(harness: Harness) -> None:
    workers = {
        (name, stuck): harness.spawn(code.format(stuck=stuck))
        for name, code in [
            ("sync", SYNC_WORKER),
            ("async", ASYNC_WORKER),
            ("threads", THREADS_WORKER),
        ]
        for stuck in (False, True)
    }
    tasks = harness.spawn(TASKS_WORKER)
    for (name, stuck), proc in workers.items():
        code, out, err = harness.wait(proc)
        if stuck:
            assert code == KILLED, (name, code, out, err)
            assert harness.was_reaped(proc.pid)
        else:
            assert (code, out) == (0, "done\n"), (name, err)
    code, out, err = harness.wait(tasks)
    assert (code, out) == (0, "done\n"), err
    healthy = {p.pid for (_, stuck), p in workers.items() if not stuck} | {tasks.pid}
    assert not healthy & harness.reaped_pids()
    assert len(harness.thread.server.get_state().timers) == 0


@pytest.mark.timeout(60)
def test_torch_variable_alone_is_enough(harness: Harness) -> None:
    ok = harness.spawn(SYNC_WORKER.format(stuck=False), env_var=TORCH_ENV_FIFO)
    stuck = harness.spawn(SYNC_WORKER.format(stuck=True), env_var=TORCH_ENV_FIFO)
    assert harness.wait(ok)[:2] == (0, "done\n")
    assert harness.wait(stuck)[0] == KILLED
    assert harness.was_reaped(stuck.pid)
    assert harness.reaped_pids() == {stuck.pid}


RESTART_WORKER = """
    import threading, time
    from aiotimer.client import expires
    def busy():  # keeps sending: it notices the restart and re-registers open blocks
        end = time.monotonic() + {busy_for}
        n = 0
        while time.monotonic() < end:
            with expires(after=2.0):
                time.sleep(0.01)
            n += 1
        print("busy", n, flush=True)
    t = threading.Thread(target=busy)
    t.start()
    if {stuck}:
        with expires(after=2.5, scope="stuck-block"):
            print("entered", flush=True)
            time.sleep(60)
    t.join()
    print("done", flush=True)
"""


@pytest.mark.timeout(60)
def test_clients_recover_from_a_server_restart(harness: Harness) -> None:
    healthy = harness.spawn(RESTART_WORKER.format(stuck=False, busy_for=4.0))
    stuck = harness.spawn(RESTART_WORKER.format(stuck=True, busy_for=60))
    assert stuck.stdout is not None
    assert stuck.stdout.readline() == "entered\n"
    first_events = len(harness.events)
    harness.thread.stop(WAIT)  # the server goes away (its FIFO with it) ...
    time.sleep(0.3)
    harness.thread = harness.new_server()  # ... and comes back, empty
    code, out, err = harness.wait(healthy)
    assert code == 0 and out.endswith("done\n"), err
    # The new server learnt the stuck block from the client's replay and reaps it.
    code, _, err = harness.wait(stuck)
    assert code == KILLED, err
    assert harness.was_reaped(stuck.pid)
    reaped = [e for e in harness.events[first_events:] if isinstance(e, WorkerReaped)]
    assert [e.pid for e in reaped] == [stuck.pid]
    assert "stuck-block" in reaped[0].scopes


NO_SERVER_WORKER = """
    import time
    from aiotimer.client import FifoClient, expires
    from aiotimer.errors import ServerUnavailableError
    client = FifoClient({path!r}, connect_timeout=0.5) if {explicit} else None
    started = time.monotonic()
    try:
        with expires(after=1, client=client):
            pass
    except ServerUnavailableError as exc:
        print(f"{{time.monotonic() - started:.3f}}", flush=True)
"""


@pytest.mark.timeout(60)
def test_no_server_is_a_typed_error_within_the_connect_timeout(harness: Harness) -> None:
    harness.thread.stop(WAIT)
    explicit = harness.spawn(NO_SERVER_WORKER.format(path=str(harness.fifo), explicit=True))
    default = harness.spawn(NO_SERVER_WORKER.format(path="", explicit=False))
    for proc, bound in ((explicit, 0.5), (default, 2.0)):  # 2.0: the default timeout
        code, out, err = harness.wait(proc)
        assert code == 0 and out, err
        assert bound <= float(out) < bound + 3.0  # 3 s of slack for a busy machine


def demo_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in (ENV_FIFO, TORCH_ENV_FIFO)}


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "status", "verdict"),
    [
        (
            ["--workers", "3", "--deadline", "1", "--kill-after", "1"],
            0,
            "the stuck worker was reaped",
        ),
        (["--workers", "2", "--deadline", "30", "--budget", "1"], 1, "NOT reaped"),
    ],
    ids=["reaped", "not-reaped-in-budget"],
)
def test_demo(args: list[str], status: int, verdict: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "aiotimer", "demo", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=WAIT,
        env=demo_env(),
    )
    assert done.returncode == status, done.stdout + done.stderr
    assert verdict in done.stdout
    assert "\x1b[" not in done.stdout  # no colours when stdout is not a terminal
    assert done.stderr == "", done.stderr
    if status == 0:
        # What the demo says is what it does: worker 1's slow item times out at its
        # deadline and the rest go on; the stuck worker is reaped kill_after (1 s) after
        # the first deadline among its open blocks (the other task's stage, 0.5 s), as
        # its introduction announced.
        out = done.stdout
        assert "(another task's stage, 0.5s): about 1.5s later" in out
        assert "[worker 1] item 3 timed out after 1." in out
        assert "1 timed out at its deadline (TimeoutError" in out
        assert "server: [worker 1] block " in out and "hit its deadline" in out
        stuck, reaped = (at(out, "[worker 3] item", "stuck"), at(out, "[worker 3] sent SIGKILL"))
        assert 1.5 - 0.3 <= reaped - stuck < 1.5 + 5.0, (stuck, reaped)


def at(out: str, *marks: str) -> float:
    """When the demo printed the first line with every one of ``marks`` (its stamp)."""
    line = next(line for line in out.splitlines() if all(m in line for m in marks))
    return float(line.split()[1].rstrip("s"))


@pytest.mark.timeout(60)
def test_demo_ends_quietly_when_its_reader_stops_reading() -> None:
    """`aiotimer demo | head`: no traceback, no worker left behind; the exit status of
    a writer that SIGPIPE ended."""
    demo = subprocess.Popen(
        [sys.executable, "-m", "aiotimer", "demo", "--workers", "2", "--deadline", "30"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=demo_env(),
    )
    assert demo.stdout is not None
    pidfds = []
    try:
        while len(pidfds) < 2:  # read until every worker has started ...
            line = demo.stdout.readline()
            assert line, "the demo ended early"
            if "started, pid " in line:
                pidfds.append(os.pidfd_open(int(line.rsplit(" ", 1)[1])))
        demo.stdout.close()  # ... then stop reading, as head does
        _, err = demo.communicate(timeout=WAIT)
        assert demo.returncode == 128 + signal.SIGPIPE
        assert err == "", err
        ready, _, _ = select.select(pidfds, [], [], WAIT)
        assert len(ready) == len(pidfds)  # every worker has exited
    finally:
        demo.kill()
        for fd in pidfds:
            os.close(fd)


# -- the client's rules: no phantom, no unfair late acquire, no lost release ------------


def send_line(proc: subprocess.Popen[str], text: str = "") -> None:
    assert proc.stdin is not None
    proc.stdin.write(text + "\n")
    proc.stdin.flush()


def read_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline()


PHANTOM_WORKER = """
    import sys, time
    from aiotimer.client import FifoClient, expires
    from aiotimer.errors import ServerUnavailableError
    client = FifoClient({path!r}, connect_timeout=0.3)
    with expires(after=5, client=client):
        pass
    print("connected", flush=True)
    sys.stdin.readline()  # the server has stopped
    try:
        with expires(after=1.0, scope="phantom", client=client):
            print("the body ran", flush=True)
    except ServerUnavailableError:
        print("refused", flush=True)
    sys.stdin.readline()  # a new server is up
    for _ in range(29):
        with expires(after=1.0, client=client):
            time.sleep(0.01)
    time.sleep(2.0)  # past the failed block's deadline: a replayed phantom is reaped
    print("done", flush=True)
"""


@pytest.mark.timeout(60)
def test_a_failed_acquire_is_forgotten_not_replayed(harness: Harness) -> None:
    worker = harness.spawn(PHANTOM_WORKER.format(path=str(harness.fifo)), stdin=True)
    assert read_line(worker) == "connected\n"
    harness.thread.stop(WAIT)
    send_line(worker)
    assert read_line(worker) == "refused\n"
    first_events = len(harness.events)
    harness.thread = harness.new_server()
    send_line(worker)
    code, out, err = harness.wait(worker)
    assert (code, out) == (0, "done\n"), err
    scopes = {getattr(e, "scope_id", None) for e in harness.events[first_events:]}
    assert "phantom" not in scopes


LATE_ACQUIRE_WORKER = """
    import time
    from aiotimer.client import FifoClient, expires
    client = FifoClient({path!r}, connect_timeout=20)
    print("entering", flush=True)
    started = time.monotonic()
    with expires(after=1.0, client=client):
        print(f"entered {{time.monotonic() - started:.1f}}", flush=True)
        time.sleep(0.1)
    time.sleep(1.5)  # the server's deadline, had it counted the wait, passed long ago
    print("done", flush=True)
"""


@pytest.mark.timeout(60)
def test_an_acquire_delivered_late_is_timed_from_its_delivery(harness: Harness) -> None:
    harness.thread.stop(WAIT)  # no server while the worker enters its block
    worker = harness.spawn(LATE_ACQUIRE_WORKER.format(path=str(harness.fifo)))
    assert read_line(worker) == "entering\n"
    time.sleep(2.0)  # twice the block's time limit
    harness.thread = harness.new_server()
    assert float(read_line(worker).split()[1]) >= 1.0  # the acquire waited that long
    code, out, err = harness.wait(worker)
    assert (code, out) == (0, "done\n"), err
    assert worker.pid not in harness.reaped_pids()


RELEASE_RETRY_WORKER = """
    import logging, os, sys, time
    from aiotimer.client import FifoClient, expires
    logging.basicConfig()
    client = FifoClient({path!r}, write_timeout=0.3)
    with expires(after=4.0, scope="blk", client=client) as block:
        print("entered", flush=True)
        sys.stdin.readline()  # the server is stopped: fill its pipe with harmless lines
        fd = os.open({path!r}, os.O_WRONLY | os.O_NONBLOCK)
        line = (
            '{{"pid": %d, "scope_id": "filler", "expiration_time": -1, "signal": 0}}\\n'
            % os.getpid()
        ).encode()
        try:
            while True:
                os.write(fd, line)
        except BlockingIOError:
            pass
    print("left", flush=True)  # the release could not be written in time: no exception
    # 1.5 s past the deadline: killed unless the release reached the server.
    time.sleep(max(0.0, block.deadline + 1.5 - time.monotonic()))
    print("done", flush=True)
"""


@pytest.mark.timeout(60)
def test_a_release_that_failed_is_retried_once_the_server_is_back(tmp_path: Path) -> None:
    """A release stuck behind a stopped server is neither raised nor dropped."""
    fifo = tmp_path / "serve.fifo"
    server = subprocess.Popen(
        [sys.executable, "-m", "aiotimer", "serve", "--fifo", str(fifo)],
        stderr=subprocess.DEVNULL,
    )
    worker: subprocess.Popen[str] | None = None
    try:
        marker = Path(str(fifo) + MARKER_SUFFIX)
        deadline = time.monotonic() + WAIT
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        worker = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(RELEASE_RETRY_WORKER.format(path=str(fifo)))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert read_line(worker) == "entered\n"
        server.send_signal(signal.SIGSTOP)
        send_line(worker)
        assert read_line(worker) == "left\n"
        time.sleep(0.5)
        server.send_signal(signal.SIGCONT)
        out, err = worker.communicate(timeout=WAIT)
        assert (worker.returncode, out) == (0, "done\n"), err
        assert "retried in the background" in err
    finally:
        server.send_signal(signal.SIGCONT)
        for proc in (worker, server):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


UNTIMED_WORKER = """
    import time
    from aiotimer.client import expires, expires_at
    for make in (
        lambda: expires(after=5, scope="x" * 3000),
        lambda: expires(after=5, scope=""),
        lambda: expires(after=5, scope="lone \\ud800 surrogate"),
        lambda: expires(after=5, signal=999),
        lambda: expires_at(time.time() + 5),
    ):
        try:
            with make():
                print("ran untimed", flush=True)
        except ValueError as exc:
            print("refused:", str(exc).split(",")[0], flush=True)
"""


@pytest.mark.timeout(60)
def test_blocks_the_server_would_reject_are_refused_at_entry(harness: Harness) -> None:
    code, out, err = harness.wait(harness.spawn(UNTIMED_WORKER))
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 5 and all(line.startswith("refused: ") for line in lines), out
    state = harness.thread.server.get_state()
    assert state.timers == () and state.counters.acquired == 0


# -- async blocks: cancel the stuck task first, reap only when the loop cannot -----------

# The pipeline case (200 healthy tasks, 2 stuck) runs against `aiotimer serve` on both
# loops in test_async_tiers_serve.py.

BLOCKED_LOOP_WORKER = """
    import asyncio, time
    from aiotimer.client import expires
    async def main():
        async with expires(after=0.5, kill_after=1.0, scope="blocks-the-loop") as block:
            print(block.deadline, flush=True)  # CLOCK_MONOTONIC: the same in every process
            time.sleep(60)  # a blocking call: the loop cannot cancel anything
    asyncio.run(main())
"""


@pytest.mark.timeout(60)
def test_a_blocked_loop_is_reaped_kill_after_past_the_deadline(harness: Harness) -> None:
    worker = harness.spawn(BLOCKED_LOOP_WORKER)
    deadline = float(read_line(worker))
    code, _, err = harness.wait(worker)
    died = time.monotonic() - deadline  # an upper bound of the time of death
    assert code == KILLED, err
    assert 1.0 <= died < 1.0 + 2.0  # kill_after past the deadline; slack for the load
    assert harness.was_reaped(worker.pid)
    [reaped] = [e for e in harness.events if isinstance(e, WorkerReaped)]
    assert "blocks-the-loop" in reaped.scopes


LOOP_WATCHDOG_WORKER = """
    import asyncio, time
    from aiotimer import loop_watchdog
    async def main():
        async with loop_watchdog(stall_after=0.5, scope="the-loop"):
            await asyncio.sleep(1.5)  # a healthy loop: three times stall_after, kept alive
            print(time.monotonic(), flush=True)  # CLOCK_MONOTONIC: the same everywhere
            time.sleep(60)  # the loop stops, outside any timed block
    asyncio.run(main())
"""


@pytest.mark.timeout(60)
def test_the_loop_watchdog_reaps_a_loop_that_stops_outside_any_block(
    harness: Harness,
) -> None:
    worker = harness.spawn(LOOP_WATCHDOG_WORKER)
    stopped = float(read_line(worker))
    code, _, err = harness.wait(worker)
    died = time.monotonic() - stopped  # an upper bound of the time of death
    assert code == KILLED, err
    assert 0.5 <= died < 0.625 + 2.0  # stall_after .. 1.25 x stall_after; slack for load
    assert harness.was_reaped(worker.pid)
    [reaped] = [e for e in harness.events if isinstance(e, WorkerReaped)]
    assert "the-loop" in reaped.scopes
