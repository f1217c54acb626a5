"""Events: every kind is a frozen record with a stable kind, JSON-ready and describable."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import anyio
import pytest

from aiotimer import events as ev
from aiotimer._edges.eventlog import EventLog
from aiotimer.core._stats import ScopeStats
from aiotimer.events._reaping import MAX_DUMP_LINE

SUMMARY = ScopeStats(
    site="w.py:3",
    count=2,
    p50=0.1,
    p99=0.2,
    max=0.2,
    expirations=1,
    longest_expired=0.5,
    suggested_timeout=0.3,
)

SAMPLES: list[ev.Event] = [
    ev.ServerStarted(time=1.0, pid=10, sources=("fifo:/x",)),
    ev.ServerStopped(time=1.0, timers=2, counters={"expired": 1}, scopes=(SUMMARY,)),
    ev.SourceFailed(time=1.0, source="fifo:/x", error="OSError()"),
    ev.TimerAcquired(time=1.0, pid=1, scope_id="a", expires_in=2.0, signal=9, source="api"),
    ev.TimerReleased(time=1.0, pid=1, scope_id="a", source="api"),
    ev.TimerExpired(
        time=1.0, pid=1, scope_id="a", signal=9, late=0.001, report_only=False, action="SIGKILL"
    ),
    ev.WorkerReaped(time=1.0, pid=1, signal=9, group=False, scopes=("a", "b"), step=1, steps=1),
    ev.WorkerReaped(
        time=1.0, pid=1, signal=9, group=True, scopes=("a",), step=2, steps=2, stacks="Thread"
    ),
    ev.ReapFailed(time=1.0, pid=1, signal=9, error="EPERM", attempt=1, retry_in=0.1),
    ev.ReapAbandoned(time=1.0, pid=1, signal=9, error="EPERM", attempts=6),
    ev.WorkerSurvived(time=1.0, pid=1, signal=9, unkillable=True, waited=5.0),
    ev.StacksDumped(time=1.0, pid=1, text=None, step=1, steps=2),
    ev.StacksDumped(time=1.0, pid=1, text="Current thread 0x1", step=1, steps=2),
    ev.WorkerExited(time=1.0, pid=1, cleared=("a",), reason="exited"),
    ev.WorkerUnknown(time=1.0, pid=1, scope_id="a", source="fifo:/x"),
    ev.RequestRejected(time=1.0, reason="malformed JSON", line="garbage", source="fifo:/x"),
    ev.TimerEvicted(time=1.0, pid=1, scope_id="a", holds=900, for_pid=2, max_timers=1000),
    ev.EventsLost(time=1.0, count=3, error="No space left on device (ENOSPC)"),
    ev.WorkerStarted(time=1.0, rank=1, pid=7, attempt=2, restarts=1),
    ev.WorkerRunning(time=1.0, rank=1, pid=7, evidence="sent a timer request"),
    ev.WorkerEnded(
        time=1.0,
        rank=1,
        pid=7,
        reason="reaped",
        exit_code=None,
        signal=9,
        scopes=("a",),
        uptime=2.5,
        start_failure=False,
        state="backoff",
        omitted=99,
        task="Task-7",
    ),
    ev.RestartScheduled(time=1.0, ranks=(0, 1), delay=0.5, restarts=(1, 1), attempt=1, budget=3),
    ev.StragglerDetected(
        time=1.0,
        rank=2,
        pid=42,
        scope="step",
        ratio=1.6,
        basis="cycle",
        excess=0.024,
        window=20,
    ),
    ev.StragglerRecovered(time=1.0, rank=2, scope="step", ratio=1.02, window=20),
    ev.HangReported(
        time=1.0,
        summary="rank 2 of 4 differs: in `load_batch` (data.py:88)",
        ranks=4,
        odd=(2,),
        missing=(),
        seconds=0.5,
        files=("/x/events.jsonl.hang.txt",),
        report="hang report: ...",
    ),
    ev.SupervisorGaveUp(time=1.0, reason="restart budget exhausted"),
    ev.SupervisorStopped(
        time=1.0,
        outcome="succeeded",
        exit_code=0,
        workers=(
            ev.RankStatus(
                rank=0,
                state=ev.WorkerState.SUCCEEDED,
                attempts=2,
                restarts=1,
                start_failures=0,
                reasons=("crashed", "succeeded"),
                uptime=3.0,
            ),
        ),
    ),
    ev.SignalSent(time=1.0, pid=1, signal=15, group=True, step=1, steps=2),
    ev.SignalRefused(time=1.0, pid=1, signal=9, group=True, reason="own group", fallback="pid"),
    ev.SignalRefused(time=1.0, pid=1, signal=19, group=False, reason="SIGSTOP not allowed"),
    ev.LoopLagged(time=1.0, lag=2.74, expired=3),
    ev.ControlRefused(time=1.0, pid=77, uid=1000),
    ev.TimerExpired(
        time=1.0,
        pid=1,
        scope_id="a@Task-1",
        signal=9,
        late=0.001,
        report_only=False,
        action="SIGKILL",
        kill_after=5.0,
    ),
    ev.BlockCancelled(time=1.0, pid=1, scope_id="a@Task-1", late=0.002, kill_after=5.0),
    ev.BlockCancelled(time=1.0, pid=1, scope_id="a@Task-1"),
    ev.TimerExpired(
        time=1.0,
        pid=1,
        scope_id="step",
        signal=9,
        late=0.001,
        report_only=False,
        action="SIGKILL",
        learned=1.5,
        learned_samples=300,
    ),
    ev.LearnedWouldReap(
        time=1.0,
        pid=1,
        scope_id="step",
        duration=2.5,
        value=1.0,
        samples=150,
        initial=30.0,
        widened_to=12.5,
    ),
]


def test_every_event_kind_has_a_sample_and_a_unique_kind() -> None:
    helpers = {
        "Event",
        "ServerCounters",
        "signal_name",
        "clip_text",
        "exit_phrase",
        "holding_task",
        "MAX_LOGGED_TEXT",
        "MAX_REPORTED_SCOPES",
        "RankStatus",
        "WorkerState",
        "WorkerInfo",
        "by_rank",
        "MAX_LINE_SCOPE",
        "clip",
        "clip_scope",
    }
    classes = {getattr(ev, name) for name in ev.__all__ if name not in helpers}
    assert classes == {type(e) for e in SAMPLES}
    kinds = list(dict.fromkeys(e.kind for e in SAMPLES))
    assert len(kinds) == len(classes)
    assert len(set(kinds)) == len(kinds) and "event" not in kinds


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: e.kind)
def test_event_is_frozen_json_ready_and_describable(event: ev.Event) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.time = 2.0  # type: ignore[misc]
    data = event.to_dict()
    assert data["event"] == event.kind and data["time"] == 1.0
    assert json.loads(json.dumps(data)) == data
    assert event.describe() and event.describe() != event.kind
    assert event.level in {logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, 50}


def test_long_texts_are_whole_in_the_event_and_clipped_in_its_logged_forms() -> None:
    dump = "x" * (ev.MAX_LOGGED_TEXT + 10)
    dumped = ev.StacksDumped(time=1.0, pid=1, text=dump, step=1, steps=1)
    reaped = ev.WorkerReaped(
        time=1.0, pid=1, signal=9, group=False, scopes=("a",), step=2, steps=2, stacks=dump
    )
    assert dumped.text == dump and reaped.stacks == dump
    for logged in (dumped.to_dict()["text"], reaped.to_dict()["stacks"]):
        assert "x" * ev.MAX_LOGGED_TEXT in logged
        assert "x" * (ev.MAX_LOGGED_TEXT + 1) not in logged
        assert "10 more characters not logged" in logged
    # The log line of a dump is cut line by line too: nothing prints a line of 64 KiB.
    assert max(map(len, dumped.describe().splitlines())) <= MAX_DUMP_LINE
    assert "more characters not logged" in dumped.describe()
    assert "stack dump attached" in reaped.describe() and dump not in reaped.describe()
    assert ev.clip_text("short") == "short"


def test_server_stopped_carries_scope_statistics_as_plain_dicts() -> None:
    stopped = ev.ServerStopped(time=1.0, timers=0, counters={}, scopes=(SUMMARY,))
    [site] = stopped.to_dict()["scopes"]
    assert site == dataclasses.asdict(SUMMARY)
    assert "1 scope site" in stopped.describe()


def test_signal_name() -> None:
    assert ev.signal_name(9) == "SIGKILL"
    assert ev.signal_name(0) == "signal 0"


@pytest.mark.asyncio
async def test_event_log_drops_noise_past_its_bound_but_never_audit_records(
    tmp_path: Path,
) -> None:
    path = tmp_path / "log.jsonl"
    log = EventLog(path, max_queued=2)
    noise = ev.RequestRejected(time=1.0, reason="malformed JSON", line="x", source="fifo:/x")
    reaped = SAMPLES[6]
    for _ in range(5):
        log.put(noise)  # two fit, three are dropped and counted
        log.put(reaped)  # audit: always kept
    assert log.dropped == 3
    async with anyio.create_task_group() as tg:
        await tg.start(log.run)
        log.close()
    log.put(SAMPLES[4])  # after close: ignored
    kinds = [json.loads(line)["event"] for line in path.read_text().splitlines()]
    assert kinds.count("worker_reaped") == 5
    assert kinds.count("request_rejected") == 2
    assert kinds[-1] == "events_lost" and len(kinds) == 8  # the drops, counted at close
    assert json.loads(path.read_text().splitlines()[-1])["count"] == 3


@pytest.mark.asyncio
async def test_event_log_bounds_the_rate_of_rejections(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    log = EventLog(path, max_noise_rate=3)
    async with anyio.create_task_group() as tg:
        await tg.start(log.run)
        for i in range(10):
            log.put(ev.RequestRejected(time=1.0, reason="bad", line=f"x{i}", source="fifo:/x"))
        log.put(SAMPLES[6])  # audit: never rate-bounded
        log.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["event"] for r in records].count("request_rejected") == 3
    assert records[-2]["event"] == "worker_reaped"
    assert (records[-1]["event"], records[-1]["count"]) == ("events_lost", 7)
    assert log.dropped == 7


def test_the_task_holding_the_loop_is_read_off_a_dump() -> None:
    dump = (
        "=== aiotimer asyncio tasks: pid 7, ... ===\n"
        "The loop is held by task 'Task-201', in aiotimer block(s) w.py:3#201@Task-201, w.py:2#9\n"
        "Task 'Task-1' (pending):\n"
    )
    assert ev.holding_task(dump) == ("Task-201", "w.py:3#201@Task-201")
    assert ev.holding_task('The loop is held by task "it\'s"\n') == ("it's", None)
    assert ev.holding_task("Current thread 0x1 (most recent call first):\n") is None
    assert ev.holding_task(None) is None
    reaped = ev.WorkerReaped(
        time=1.0, pid=7, signal=9, group=False, scopes=("w.py:1#1@Task-2",) * 100,
        step=2, steps=2, stacks=dump, omitted=35,
    )  # fmt: skip
    assert reaped.describe() == (
        "sent SIGKILL to worker 7 (step 2/2): the loop was held by task 'Task-201' in block "
        "'w.py:3#201@Task-201'; 135 open block(s) cleared"
    )


def test_every_one_line_description_is_bounded_whatever_the_inputs() -> None:
    huge = "s" * 2048  # the longest scope id the wire accepts
    lines = [
        ev.TimerExpired(
            time=1.0, pid=2**31 - 1, scope_id=huge, signal=9, late=1.0, report_only=False,
            action="x" * 1000, kill_after=5.0,
        ),
        ev.WorkerReaped(
            time=1.0, pid=1, signal=9, group=True, scopes=(huge,) * 100, step=2, steps=2,
            omitted=10**6,
        ),
        ev.WorkerExited(time=1.0, pid=1, cleared=(huge,) * 100, reason="exited", omitted=5),
        ev.RequestRejected(time=1.0, reason="r" * 500, line="\x00" * 200, source="fifo:/x"),
        ev.WorkerEnded(
            time=1.0, rank=0, pid=1, reason="reaped", exit_code=None, signal=9,
            scopes=(huge,) * 3, uptime=1.0, start_failure=False, state="backoff",
            omitted=10**6, task="t" * 500,
        ),
        ev.RestartScheduled(
            time=1.0, ranks=tuple(range(1000)), delay=1.0, restarts=(1,) * 1000, attempt=1,
            budget=3,
        ),
    ]  # fmt: skip
    for event in lines:
        assert len(event.describe()) < 400, event.kind


def test_why_a_worker_ended_names_the_culprit_first() -> None:
    assert ev.exit_phrase("reaped", None, 9, scopes=("step",)) == (
        "reaped (SIGKILL): block 'step' outlived its timer"
    )
    assert ev.exit_phrase("stopped", None, 15) == "stopped by the supervisor (SIGTERM)"
    phrase = ev.exit_phrase("reaped", None, 9, scopes=("a@hog", "b"), omitted=8, task="hog")
    assert phrase == "reaped (SIGKILL): task 'hog' held the loop, in block 'a@hog' (10 open)"


def test_an_operators_restart_is_no_warning_and_says_it_is_not_charged() -> None:
    failure = ev.RestartScheduled(
        time=1.0, ranks=(1,), delay=0.5, restarts=(1,), attempt=1, budget=3
    )
    operator = ev.RestartScheduled(
        time=1.0, ranks=(1,), delay=0.0, restarts=(2,), attempt=1, budget=-1, cause="operator"
    )
    assert failure.log_level() == logging.WARNING
    assert failure.describe() == "restarting worker(s) 1 in 0.50s (restart 1 of 3 allowed)"
    assert operator.log_level() == logging.INFO
    assert "as the operator asked (not charged to the restart budget)" in operator.describe()
    stopped = ev.SupervisorStopped(
        time=1.0, outcome="stopped", exit_code=143, workers=(), signal=15
    )
    assert stopped.describe() == "supervisor stopped: stopped by SIGTERM (exit code 143)"
