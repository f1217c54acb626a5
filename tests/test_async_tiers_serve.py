"""The async face's two tiers against a real ``aiotimer serve``, on asyncio and uvloop.

Workers are fresh Python processes that find the server through the environment only.
One server per module runs with ``--dump`` (stack dump, then SIGKILL) and
``--event-log`` (another without ``--dump``); each test reads its own worker's records.

Tolerances: deadlines are 0.5-1.5 s, healthy items last ~10 ms, and every wait is
bounded (``BOUND``), so a stalled machine fails a test rather than hangs it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _procs import BOUND, env, events, serving

from aiotimer.control._format import format_status
from aiotimer.control.client import ControlClient
from aiotimer.wire import ENV_FIFO, TORCH_ENV_FIFO

pytestmark = [pytest.mark.process, pytest.mark.timeout(90)]

LOOPS = ["asyncio", "uvloop"]
#: Runs ``main()`` on the loop named by argv[1].
RUN = """
    import sys
    if sys.argv[1] == "uvloop":
        import uvloop
        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    else:
        runner = asyncio.Runner()
    with runner:
        runner.run(main())
"""


@pytest.fixture(scope="module", params=["--dump"])
def server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[tuple[Path, Path]]:
    """``aiotimer serve`` with an event log: (fifo, log), one for the module's tests
    (each worker is a new process; a test reads only its own worker's records). With
    ``--dump`` (the default param) every reap starts with a stack dump; without, only
    what requests ask for."""
    tmp = tmp_path_factory.mktemp("serve")
    fifo, log, dumps = tmp / "timer.fifo", tmp / "events.jsonl", tmp / "dumps"
    dumps.mkdir(mode=0o700)
    options = ["--event-log", str(log)]
    if request.param == "--dump":
        options += ["--dump-dir", str(dumps)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIOTIMER_DUMP_DIR", str(dumps))  # the server's and the workers'
        with serving(fifo, *options) as proc:
            yield fifo, log
            proc.send_signal(signal.SIGTERM)  # flushes the event log
            proc.wait(BOUND)


def spawn(fifo: Path, code: str, loop: str) -> subprocess.Popen[str]:
    environ = {k: v for k, v in env().items() if k not in (ENV_FIFO, TORCH_ENV_FIFO)}
    environ[ENV_FIFO] = str(fifo)
    environ.pop("AIOTIMER_DUMP_HOOK", None)  # the worker installs its dump hook
    script = textwrap.dedent(code) + textwrap.dedent(RUN)
    return subprocess.Popen(
        [sys.executable, "-c", script, loop],
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=BOUND)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return proc.returncode, out, err


def of(log: Path, pid: int, kind: str) -> list[dict[str, Any]]:
    """The records of ``kind`` about worker ``pid`` (the server is the module's)."""
    return [r for r in events(log) if r["event"] == kind and r.get("pid") == pid]


def wait_reaps(log: Path, pid: int) -> list[dict[str, Any]]:
    """The reap events of ``pid``, once there is one: the worker may die before the
    server has written the event of its reap."""
    deadline = time.monotonic() + BOUND
    while not (found := of(log, pid, "worker_reaped")) and time.monotonic() < deadline:
        time.sleep(0.02)
    return found


PIPELINE = """
    import asyncio
    from aiotimer import expires

    async def item(n, never):
        try:
            async with expires(after=1.5):
                if n in (17, 133):
                    await never.wait()  # an event that never comes
                await asyncio.sleep(0.01)
            return "ok"
        except TimeoutError:
            return "timeout"

    async def main():
        never = asyncio.Event()
        results = await asyncio.gather(*(item(n, never) for n in range(202)))
        print(results.count("ok"), results.count("timeout"), flush=True)
"""


@pytest.mark.parametrize("loop", LOOPS)
def test_two_stuck_tasks_of_two_hundred_and_two_time_out_and_nothing_is_reaped(
    server: tuple[Path, Path], loop: str
) -> None:
    fifo, log = server
    before = cancelled_total(fifo)
    worker = spawn(fifo, PIPELINE, loop)
    code, out, err = finish(worker)
    assert (code, out) == (0, "200 2\n"), err
    time.sleep(0.2)  # any reap would follow the timeouts within ms; give it time to show
    assert not of(log, worker.pid, "worker_reaped")
    # The first tier left its trace: each TimeoutError is an event (the block ended
    # shortly after its deadline, kill_after before its reap) and a metric.
    cancelled = of(log, worker.pid, "block_cancelled")
    assert len(cancelled) == 2, cancelled
    for record in cancelled:
        assert record["kill_after"] == 5.0 and 0 <= record["late"] < 1.0, record
    assert cancelled_total(fifo) == before + 2


def cancelled_total(fifo: Path) -> float:
    """The server's ``aiotimer_cancelled_total``, read from ``GET /metrics``."""
    metrics = ControlClient.for_fifo(fifo).metrics()
    [value] = [
        line.split()[1]
        for line in metrics.splitlines()
        if line.startswith("aiotimer_cancelled_total ")
    ]
    return float(value)


STUBBORN = """
    import asyncio
    from aiotimer import expires

    async def stubborn():
        async with expires(after=2.0, kill_after=60, scope="two-tier"):
            print("entered", flush=True)
            while True:
                try:
                    await asyncio.sleep(60)
                except asyncio.CancelledError:
                    print("cancelled", flush=True)  # swallowed: the block goes on

    async def main():
        await asyncio.create_task(stubborn(), name="stubborn")
"""


def test_status_shows_both_deadlines_of_a_two_tier_block_and_which_passed(
    server: tuple[Path, Path],
) -> None:
    """Before its deadline a two-tier block shows when its task will be cancelled and
    when the worker will be reaped; after it, that it was cancelled and when the reap
    comes (here 60 s later: the task swallows its cancellation)."""
    fifo, _ = server
    worker = spawn(fifo, STUBBORN, "asyncio")
    try:
        assert worker.stdout is not None and worker.stdout.readline() == "entered\n"
        # Before the block's deadline (2 s), once the server has read the acquire (a
        # trickle of input is read once per interval: aiotimer.sources._trickle).
        client = ControlClient.for_fifo(fifo)
        deadline = time.monotonic() + BOUND
        while True:
            before = client.state()
            mine = [t for t in before.timers if t.pid == worker.pid]
            if mine:
                break
            assert time.monotonic() < deadline, "the server did not read the acquire"
            time.sleep(0.02)
        [timer] = mine
        assert (timer.passed, timer.kill_after) == ("none", 60.0)
        assert timer.block_seconds_left is not None and 0 < timer.block_seconds_left <= 2.0
        assert timer.seconds_left == pytest.approx(timer.block_seconds_left + 60, abs=0.01)
        row = worker_row(format_status(before), worker.pid)
        assert "two-tier (cancel in " in row and ", reap in 6" in row, row
        # After it: the task was cancelled (the worker saw it), the block still runs.
        assert worker.stdout.readline() == "cancelled\n"
        row = worker_row(status(fifo), worker.pid)
        assert "two-tier (cancel due " in row and " ago, reap in 5" in row, row
        after = ControlClient.for_fifo(fifo).state()
        [timer] = [t for t in after.timers if t.pid == worker.pid]
        assert timer.passed == "block"
        assert timer.block_seconds_left is not None and timer.block_seconds_left < 0
    finally:
        worker.kill()
        finish(worker)


def status(fifo: Path, *options: str) -> str:
    """What ``aiotimer status --fifo FIFO`` prints (it must exit 0)."""
    done = subprocess.run(
        [sys.executable, "-m", "aiotimer", "status", "--fifo", str(fifo), *options],
        capture_output=True,
        text=True,
        env=env(),
        timeout=BOUND,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def worker_row(view: str, pid: int) -> str:
    [row] = [line for line in view.splitlines() if line.startswith(f"{pid} ")]
    return row


HOG = """
    import asyncio, time
    from aiotimer import expires

    async def innocent(started):
        async with expires(after=0.3, kill_after=1.0):  # the earliest deadline
            started.set()
            await asyncio.Event().wait()

    async def hog(started):
        await started.wait()
        async with expires(after=5.0, kill_after=1.0):
            time.sleep(60)  # blocks the loop: nothing can be cancelled

    async def main():
        started = asyncio.Event()
        print(time.monotonic(), flush=True)
        await asyncio.gather(
            asyncio.create_task(innocent(started), name="innocent"),
            asyncio.create_task(hog(started), name="hog"),
        )
"""


@pytest.mark.parametrize("server", ["--dump", "no --dump"], indirect=True)
@pytest.mark.parametrize("loop", LOOPS)
def test_a_blocked_loop_is_reaped_and_the_dump_names_the_task_that_holds_it(
    server: tuple[Path, Path], loop: str
) -> None:
    fifo, log = server
    worker = spawn(fifo, HOG, loop)
    assert worker.stdout is not None
    entered = float(worker.stdout.readline())
    code, _, err = finish(worker)
    died = time.monotonic() - entered  # an upper bound of the time of death
    assert code == -signal.SIGKILL, err
    # The innocent block's deadline (0.3 s) plus kill_after (1 s), then the dump: asked
    # for by the server's --dump, or else by the two-tier block itself (its process has
    # the hook, installed by its first block).
    assert 1.3 <= died < 1.3 + 5.0
    [reaped] = wait_reaps(log, worker.pid)
    expired = [r["scope_id"] for r in of(log, worker.pid, "timer_expired")]
    # The earliest deadline, whose task could not run, is what the server acted on ...
    assert [scope.rpartition("@")[2] for scope in expired] == ["innocent"], expired
    # ... and the reap's stack dump names the task that held the loop, and its block.
    stacks = reaped["stacks"]
    assert stacks is not None
    held = [line for line in stacks.splitlines() if line.startswith("The loop is held by")]
    assert len(held) == 1, stacks
    assert held[0].startswith("The loop is held by task 'hog', in aiotimer block(s) ")
    assert held[0].endswith("@hog"), held[0]
    # The timer the server acted on was the innocent block's second tier: its own
    # deadline had passed kill_after earlier.
    [expiry] = of(log, worker.pid, "timer_expired")
    assert expiry["kill_after"] == 1.0
    # `aiotimer status` lists what happened: the expiry (its block, how late) and the
    # reap (the task holding the loop, in its block).
    recent = status(fifo).split("recent reaps and refusals (newest last):\n")[1]
    mine = [line for line in recent.splitlines() if f"worker {worker.pid} " in line]
    assert len(mine) == 2, recent
    assert (
        "@innocent' of worker" in mine[0]
        and "its block outlived its own deadline by 1s (kill_after)" in mine[0]
    )
    assert "the loop was held by task 'hog' in block '" in mine[1], mine[1]


SWALLOWS = """
    import asyncio, time
    from aiotimer import expires

    async def stubborn():
        async with expires(after=0.3, kill_after=1.0, scope="swallows"):
            while True:
                try:
                    await asyncio.sleep(60)
                except asyncio.CancelledError:
                    print("cancelled, carrying on", flush=True)

    async def main():
        print(time.monotonic(), flush=True)
        await asyncio.create_task(stubborn(), name="stubborn")
"""


@pytest.mark.parametrize("loop", LOOPS)
def test_a_task_that_swallows_its_cancellation_is_reaped_kill_after_later(
    server: tuple[Path, Path], loop: str
) -> None:
    fifo, log = server
    worker = spawn(fifo, SWALLOWS, loop)
    assert worker.stdout is not None
    entered = float(worker.stdout.readline())
    assert worker.stdout.readline() == "cancelled, carrying on\n"  # tier 1 came
    code, _, err = finish(worker)
    died = time.monotonic() - entered
    assert code == -signal.SIGKILL, err
    assert 1.3 <= died < 1.3 + 5.0  # tier 2: deadline (0.3 s) + kill_after (1 s)
    [reaped] = wait_reaps(log, worker.pid)
    assert reaped["scopes"] == ["swallows"]


STALLS_OUTSIDE_BLOCKS = """
    import asyncio, time
    from aiotimer import loop_watchdog

    async def hog():
        await asyncio.sleep(0.3)
        time.sleep(60)  # outside any expires() block

    async def main():
        async with loop_watchdog(stall_after=0.5):
            print(time.monotonic(), flush=True)
            await asyncio.create_task(hog(), name="hog")
"""


@pytest.mark.parametrize("loop", LOOPS)
def test_the_loop_watchdog_reaps_a_stalled_loop_and_the_dump_names_the_task(
    server: tuple[Path, Path], loop: str
) -> None:
    fifo, log = server
    worker = spawn(fifo, STALLS_OUTSIDE_BLOCKS, loop)
    assert worker.stdout is not None
    entered = float(worker.stdout.readline())
    code, _, err = finish(worker)
    died = time.monotonic() - entered
    assert code == -signal.SIGKILL, err
    # The stall starts at ~0.3 s; reaped stall_after (0.5 s) to 1.25x that later.
    assert 0.3 + 0.5 <= died < 0.3 + 0.625 + 5.0
    [reaped] = wait_reaps(log, worker.pid)
    [scope] = reaped["scopes"]
    assert scope.startswith("<string>:")  # the loop_watchdog() line
    assert "The loop is held by task 'hog'\n" in reaped["stacks"]
