"""The supervisor with real worker processes: restarts, budget, back-off, stopping.

Workers are tiny Python scripts (``WORKER`` below) whose behaviour is chosen by the
``TEST_MODE`` variable; timers and back-offs are short (0.05-0.5 s) so each run takes a
second or two. Tolerances: only orders and counts are asserted, plus generous upper
bounds on a run's duration and a CPU bound that a spinning loop could not meet.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import select
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import anyio
import pytest

from aiotimer import (
    Backoff,
    Escalation,
    ReapPolicy,
    RestartPolicy,
    RestartScope,
    RunOutcome,
    Supervisor,
)
from aiotimer._edges.lifecycle import LifecycleState
from aiotimer.events import (
    Event,
    RestartScheduled,
    SupervisorGaveUp,
    WorkerEnded,
    WorkerRunning,
    WorkerStarted,
)
from aiotimer.supervisor import WorkerState
from aiotimer.testing import wait_until

pytestmark = [pytest.mark.process, pytest.mark.timeout(60)]

WORKER = """
import os, subprocess, sys, time
from aiotimer import expires, launch_info

me = launch_info()
mode = os.environ["TEST_MODE"]
if mode == "hang-once":  # rank 1 hangs on its first attempt only
    if me.rank == 1 and me.restart_count == 0:
        with expires(after=0.2, scope="step"):
            time.sleep(60)
    with expires(after=5, scope="step"):
        time.sleep(0.3)
elif mode == "hang-always":
    if me.rank == 1:
        with expires(after=0.1, scope="step"):
            time.sleep(60)
    time.sleep(0.2)
elif mode == "stubborn":  # ignores SIGTERM, hangs once
    import signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if me.restart_count == 0:
        with expires(after=0.1, scope="stuck"):
            time.sleep(60)
elif mode == "hang-both-once":  # ranks coupled as by a collective: both hang, once
    if me.restart_count == 0:
        with expires(after=0.3, scope="collective"):
            time.sleep(60)
elif mode == "hog100":  # 100 tasks in blocks; one holds the loop: reaped, named
    import asyncio

    async def idle(started):
        async with expires(after=0.3, kill_after=0.3):
            started.set()
            await asyncio.sleep(60)

    async def hog(started):
        await started.wait()
        async with expires(after=30):
            time.sleep(60)  # blocks the loop: no task can be cancelled

    async def main():
        started = asyncio.Event()
        tasks = [asyncio.create_task(idle(started)) for _ in range(100)]
        await asyncio.create_task(hog(started), name="Task-hog")
        await asyncio.gather(*tasks)

    asyncio.run(main())
elif mode == "crash":
    sys.exit(3)
elif mode == "no-restart":
    sys.exit(93)
elif mode == "tree":  # a child that ignores SIGTERM, and a daemon that escapes with setsid
    child = subprocess.Popen([sys.executable, "-c", "import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE)
    child.stdout.readline()  # it ignores SIGTERM from now on
    daemon = subprocess.Popen([sys.executable, "-c", '''
import os, subprocess, sys, time
os.setsid()
p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(p.pid, flush=True)
'''], stdout=subprocess.PIPE, text=True)
    escaped = int(daemon.stdout.readline())
    daemon.wait()  # its parent is gone: the escaped grandchild is an orphan
    with open(os.environ["TEST_PIDS"], "a") as f:
        f.write(f"{os.getpid()} {child.pid} {escaped}\\n")
    time.sleep(60)
"""


@pytest.fixture
def worker(tmp_path: Path) -> list[str]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    return [sys.executable, str(script)]


def supervisor(
    command: list[str], tmp_path: Path, mode: str, events: list[Event], **kwargs: object
) -> Supervisor:
    env = {**os.environ, "TEST_MODE": mode, "TEST_PIDS": str(tmp_path / "pids")}
    kwargs.setdefault("stop_timeout", 2.0)
    kwargs.setdefault("on_event", events.append)
    return Supervisor(command, env=env, **kwargs)  # type: ignore[arg-type]


def policy(**kwargs: object) -> RestartPolicy:
    kwargs.setdefault("backoff", Backoff(initial=0.05, cap=1.0))
    kwargs.setdefault("min_uptime", 0.1)
    return RestartPolicy(**kwargs)  # type: ignore[arg-type]


def of(kind: type[Event], events: list[Event]) -> list[Event]:
    return [e for e in events if isinstance(e, kind)]


def starts(events: list[Event]) -> Counter[int]:
    return Counter(e.rank for e in events if isinstance(e, WorkerStarted))


def pin(pids: list[int]) -> list[int]:
    """pidfds of ``pids`` (running or not yet reaped): a pid that another process gets
    later (a concurrent test's, or after ``ns_last_pid`` was rewound) is not taken for
    one of them."""
    return [os.pidfd_open(pid) for pid in pids]


def running(pidfds: list[int]) -> int:
    """How many of the pinned processes have not exited (a pidfd is readable once its
    process has)."""
    ready, _, _ = select.select(pidfds, [], [], 0)
    return len(pidfds) - len(ready)


def close(pidfds: list[int]) -> None:
    for fd in pidfds:
        os.close(fd)


@pytest.mark.asyncio
async def test_worker_scope_restarts_only_the_hung_rank(worker: list[str], tmp_path: Path) -> None:
    events: list[Event] = []
    # a long min-uptime: each worker is seen running by its first timer request
    sup = supervisor(worker, tmp_path, "hang-once", events, nproc=3,
                     policy=policy(min_uptime=10.0))  # fmt: skip
    with anyio.fail_after(30):
        outcome = await sup.run()
    assert outcome is RunOutcome.SUCCEEDED
    assert starts(events) == {0: 1, 1: 2, 2: 1}
    (reaped,) = [e for e in of(WorkerEnded, events) if e.reason == "reaped"]
    assert (reaped.rank, reaped.scopes) == (1, ("step",))
    assert [e.ranks for e in of(RestartScheduled, events)] == [(1,)]
    # the restarted rank got its restart count; running is evidence-based
    assert [e.restarts for e in of(WorkerStarted, events) if e.rank == 1] == [0, 1]
    running = of(WorkerRunning, events)
    assert len(running) == 4
    assert {e.evidence for e in running} == {"sent a timer request"}


@pytest.mark.asyncio
async def test_group_scope_restarts_every_rank(worker: list[str], tmp_path: Path) -> None:
    events: list[Event] = []
    sup = supervisor(
        worker, tmp_path, "hang-once", events, nproc=3,
        policy=policy(scope=RestartScope.GROUP),
    )  # fmt: skip
    with anyio.fail_after(30):
        outcome = await sup.run()
    assert outcome is RunOutcome.SUCCEEDED
    assert starts(events) == {0: 2, 1: 2, 2: 2}
    assert [e.ranks for e in of(RestartScheduled, events)] == [(0, 1, 2)]
    assert {w.restarts for w in sup.get_state().workers} == {1}


@pytest.mark.asyncio
async def test_budget_gives_up_after_exactly_k_plus_one_attempts(
    worker: list[str], tmp_path: Path
) -> None:
    events: list[Event] = []
    pidfds: list[int] = []

    def record(event: Event) -> None:
        events.append(event)
        if isinstance(event, WorkerStarted):
            pidfds.extend(pin([event.pid]))

    sup = supervisor(worker, tmp_path, "hang-always", events, nproc=2,
                     policy=policy(max_restarts=2), on_event=record)  # fmt: skip
    started = time.monotonic()
    try:
        with anyio.fail_after(30):
            outcome = await sup.run()
        elapsed = time.monotonic() - started
        assert outcome is RunOutcome.GAVE_UP
        assert starts(events)[1] == 3
        assert len(of(SupervisorGaveUp, events)) == 1
        assert elapsed < 15  # three 0.1 s hangs, ~0.15 s of back-off, interpreter start-ups
        assert running(pidfds) == 0
    finally:
        close(pidfds)
    assert {w.state.value for w in sup.get_state().workers} == {"succeeded", "fatal"}


@pytest.mark.asyncio
async def test_backoff_delays_grow_and_start_failures_are_reported(
    worker: list[str], tmp_path: Path
) -> None:
    events: list[Event] = []
    sup = supervisor(worker, tmp_path, "crash", events,
                     policy=policy(max_restarts=4, min_uptime=5.0))  # fmt: skip
    with anyio.fail_after(30):
        outcome = await sup.run()
    assert outcome is RunOutcome.GAVE_UP
    delays = [e.delay for e in of(RestartScheduled, events)]
    assert len(delays) == 4
    assert all(b > a for a, b in itertools.pairwise(delays))
    ends = of(WorkerEnded, events)
    assert [(e.reason, e.exit_code, e.start_failure) for e in ends] == [("crashed", 3, True)] * 5
    # each restart waited its delay: the gap from an exit to the next start
    gaps = [s.time - e.time for e, s in zip(ends, of(WorkerStarted, events)[1:], strict=False)]
    assert all(g >= d * 0.9 for g, d in zip(gaps, delays, strict=True))
    (summary,) = sup.summary
    assert (summary.attempts, summary.start_failures) == (5, 5)


@pytest.mark.asyncio
async def test_no_restart_exit_code_is_not_restarted(worker: list[str], tmp_path: Path) -> None:
    events: list[Event] = []
    sup = supervisor(worker, tmp_path, "no-restart", events, nproc=2, policy=policy())
    with anyio.fail_after(30):
        outcome = await sup.run()
    assert outcome is RunOutcome.FAILED
    assert starts(events) == {0: 1, 1: 1}
    assert of(RestartScheduled, events) == []
    assert {w.state.value for w in sup.get_state().workers} == {"failed"}


@pytest.mark.asyncio
async def test_crash_loop_backoff_does_not_spin(worker: list[str], tmp_path: Path) -> None:
    """While a restart waits out a 1 s back-off, the supervisor's process sleeps."""
    events: list[Event] = []
    marks: list[tuple[float, float]] = []

    def on_event(event: Event) -> None:
        events.append(event)
        if isinstance(event, RestartScheduled | WorkerStarted):
            marks.append((time.monotonic(), time.process_time()))

    env = {**os.environ, "TEST_MODE": "crash"}
    sup = Supervisor(
        worker, env=env, on_event=on_event,
        policy=policy(max_restarts=1, backoff=Backoff(initial=1.0, cap=1.0, jitter=0.0)),
    )  # fmt: skip
    with anyio.fail_after(30):
        await sup.run()
    # marks: start, restart scheduled, start again
    (_, _), (wall0, cpu0), (wall1, cpu1) = marks
    assert wall1 - wall0 >= 0.95
    assert cpu1 - cpu0 < 0.1 * (wall1 - wall0), (cpu1 - cpu0, wall1 - wall0)


def run_tree(
    worker: list[str], pids_file: Path, *options: str, mode: str = "tree"
) -> subprocess.Popen[str]:
    """``aiotimer run [options] -- worker`` in ``mode`` ("tree": each worker writes its
    own pid and its children's as one line of ``pids_file``)."""
    env = {
        **os.environ,
        "TEST_MODE": mode,
        "TEST_PIDS": str(pids_file),
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    env.pop("AIOTIMER_DUMP_HOOK", None)  # an async worker installs its dump hook
    return subprocess.Popen(
        [sys.executable, "-m", "aiotimer", "run", *options, "--", *worker],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )


def scrape(port: int) -> list[str]:
    """``GET /metrics`` over TCP, as Prometheus does; retried while the port opens."""
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as got:
                return got.read().decode().splitlines()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_sigterm_to_run_leaves_no_process(worker: list[str], tmp_path: Path) -> None:
    """SIGTERM stops every worker's tree; the run exits 143 and says so; the workers
    stopped at the end are stopped, not waiting for a restart. Meanwhile the run is
    scraped over TCP (--metrics-port 0: the port the system chose is in the log)."""
    pids_file, log = tmp_path / "pids", tmp_path / "events.jsonl"
    run = run_tree(worker, pids_file, "--nproc", "2", "--stop-timeout", "0.5",
                   "--event-log", str(log), "--metrics-port", "0")  # fmt: skip
    pidfds: list[int] = []
    early: list[str] = []
    try:
        assert run.stderr is not None
        while not (early and "GET /metrics on 127.0.0.1:" in early[-1]):
            early.append(run.stderr.readline())
            assert early[-1], "".join(early)  # the log ended without saying the port
        port = int(early[-1].rsplit(":", 1)[1])
        deadline = time.monotonic() + 20
        while (not pids_file.exists() or len(pids_file.read_text().splitlines()) < 2) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.05)
        pids = [int(p) for line in pids_file.read_text().splitlines() for p in line.split()]
        assert len(pids) == 6
        pidfds = pin(pids)
        assert running(pidfds) == 6
        metrics = scrape(port)
        assert "aiotimer_restarts_total 0.0" in metrics
        assert sum(float(m.split()[1]) for m in metrics if m.startswith("aiotimer_workers{")) == 2
        run.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        _, rest = run.communicate(timeout=20)
        err = "".join(early) + rest
        stopped_in = time.monotonic() - signalled
        leftover = running(pidfds)
    finally:
        run.kill()
        close(pidfds)
    assert run.returncode == 128 + signal.SIGTERM, err
    assert leftover == 0
    assert "stopped" in err  # the summary table
    # the children ignoring SIGTERM needed the SIGKILL 0.5 s later; bounded well below 10 s
    assert 0.5 <= stopped_in < 10
    # What the log and the event log say is what happened: exit code 143, not 4.
    assert "supervisor stopped: stopped by SIGTERM (exit code 143)" in err
    ended = [line for line in err.splitlines() if ") stopped by the supervisor" in line]
    assert len(ended) == 2 and all(line.endswith("; now stopped") for line in ended), err
    records = [json.loads(line) for line in log.read_text().splitlines()]
    [stopped] = [r for r in records if r["event"] == "supervisor_stopped"]
    assert (stopped["exit_code"], stopped["signal"]) == (143, signal.SIGTERM)
    assert {r["state"] for r in records if r["event"] == "worker_ended"} == {"stopped"}


def test_a_reaped_worker_of_a_hundred_blocks_is_told_in_bounded_lines_naming_the_culprit(
    worker: list[str], tmp_path: Path
) -> None:
    """100 tasks in blocks; one task holds the loop: the blocks' second tier expires,
    the worker is reaped after a dump. Every line the run prints, each summary row and
    each worker_ended record stay under 300 characters, and name the task holding the
    loop first, where they used to list every open block."""
    log = tmp_path / "events.jsonl"
    run = run_tree(worker, tmp_path / "pids", "--max-restarts", "0", "--event-log", str(log),
                   mode="hog100")  # fmt: skip
    try:
        _, err = run.communicate(timeout=30)
    finally:
        run.kill()
    assert run.returncode == 3, err  # the budget (0 restarts) is exhausted: gave up
    lines = err.splitlines()
    assert max(map(len, lines)) < 300, max(lines, key=len)
    culprit = "task 'Task-hog' held the loop"
    [ended] = [line for line in lines if "worker 0 (pid" in line and "reaped (SIGKILL)" in line]
    assert culprit in ended and "(101 open)" in ended, ended
    [gave_up] = [line for line in lines if "supervisor gives up" in line]
    assert culprit in gave_up, gave_up
    [row] = [line for line in lines if line.startswith("0 ")]  # the summary table's
    assert "fatal" in row and culprit in row, row
    assert any("the loop was held by task 'Task-hog'" in line for line in lines)
    raw = [line for line in log.read_text().splitlines() if '"worker_ended"' in line]
    assert len(raw) == 1 and len(raw[0]) < 300, raw
    record = json.loads(raw[0])
    assert (record["task"], record["omitted"], len(record["scopes"])) == ("Task-hog", 98, 3)
    assert record["scopes"][0].endswith("@Task-hog")  # the culprit's block first


def test_coupled_ranks_reaped_together_cost_one_group_restart(
    worker: list[str], tmp_path: Path
) -> None:
    """Two ranks that hang together (as ranks of one collective do) are both reaped; in
    group scope that is one failure, one restart charged: a budget of one suffices. In
    worker scope each reaped rank costs a restart of its own, and the budget runs out.
    (On one event loop: what is pinned is the restart policy's arithmetic.)"""
    events: list[Event] = []

    async def run(scope: RestartScope) -> RunOutcome:
        sup = supervisor(worker, tmp_path, "hang-both-once", events, nproc=2,
                         policy=policy(scope=scope, max_restarts=1))  # fmt: skip
        with anyio.fail_after(30):
            return await sup.run()

    assert asyncio.run(run(RestartScope.GROUP)) is RunOutcome.SUCCEEDED
    # The first rank reaped ends the group: the other is reaped too, or stopped by the
    # group restart if that comes first; either way the restart is charged once.
    first, second = (e.reason for e in of(WorkerEnded, events)[:2])
    assert first == "reaped" and second in ("reaped", "stopped")
    [restart] = of(RestartScheduled, events)
    assert (restart.ranks, restart.attempt, restart.budget) == ((0, 1), 1, 1)
    assert starts(events) == {0: 2, 1: 2}
    events.clear()
    assert asyncio.run(run(RestartScope.WORKER)) is RunOutcome.GAVE_UP


@pytest.mark.asyncio
async def test_a_reap_through_a_ladder_is_reaped_and_unhealthy_meanwhile(
    worker: list[str], tmp_path: Path
) -> None:
    """SIGTERM (ignored), 1 s of grace, SIGKILL: UNHEALTHY while the ladder runs."""
    events: list[Event] = []
    ladder = ReapPolicy(Escalation(soft_signal=signal.SIGTERM, grace=1.0))
    sup = supervisor(worker, tmp_path, "stubborn", events, policy=policy(), reap_policy=ladder)
    with anyio.fail_after(30):
        async with sup:
            await wait_until(
                lambda: sup.get_state().workers[0].state is WorkerState.UNHEALTHY, timeout=15
            )
            outcome = await sup.wait()
    assert outcome is RunOutcome.SUCCEEDED
    first = of(WorkerEnded, events)[0]
    assert (first.reason, first.signal, first.scopes) == ("reaped", signal.SIGKILL, ("stuck",))
    assert starts(events) == {0: 2}


def test_a_second_signal_kills_at_once(worker: list[str], tmp_path: Path) -> None:
    """With --stop-timeout 60, SIGTERM waits for workers; a second signal SIGKILLs."""
    pids_file = tmp_path / "pids"
    run = run_tree(worker, pids_file, "--stop-timeout", "60")
    pidfds: list[int] = []
    try:
        deadline = time.monotonic() + 20
        while not pids_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        pidfds = pin([int(p) for p in pids_file.read_text().split()])
        run.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert run.poll() is None  # a child ignores SIGTERM: the stop waits for it
        run.send_signal(signal.SIGINT)
        signalled = time.monotonic()
        _, err = run.communicate(timeout=20)
        stopped_in = time.monotonic() - signalled
        leftover = running(pidfds)
    finally:
        run.kill()
        close(pidfds)
    assert run.returncode == 128 + signal.SIGTERM, err
    assert stopped_in < 10  # not the 60 s of --stop-timeout
    assert leftover == 0


@pytest.mark.asyncio
async def test_the_runtime_directory_lives_until_aclose() -> None:
    """A run that ends before its owner has composed a control socket in the private
    directory (a worker that exits at once) keeps the directory until aclose()."""
    sup = Supervisor(["true"])
    with anyio.fail_after(30):
        await sup.start()
        assert await sup.wait() is RunOutcome.SUCCEEDED
        await wait_until(lambda: sup.state is LifecycleState.STOPPED, timeout=15)
        assert sup.fifo is not None
        runtime = sup.fifo.parent
        assert runtime.is_dir()
        await sup.aclose()
    assert not runtime.exists()
