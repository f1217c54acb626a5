"""The account of an event log (aiotimer.control._history): pure, fed event dicts."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from aiotimer.control._history import HistoryReader, decode_event, format_history, history_dict
from aiotimer.events import (
    Event,
    HangReported,
    RequestRejected,
    RestartScheduled,
    ServerStarted,
    ServerStopped,
    StacksDumped,
    SupervisorStopped,
    TimerExpired,
    WorkerEnded,
    WorkerReaped,
    WorkerStarted,
)

T0 = 1_795_000_000.0


def started(rank: int, pid: int, attempt: int, t: float) -> WorkerStarted:
    return WorkerStarted(time=T0 + t, rank=rank, pid=pid, attempt=attempt, restarts=attempt - 1)


def ended(rank: int, pid: int, reason: str, t: float, **kw: Any) -> WorkerEnded:
    fields: dict[str, Any] = {
        "exit_code": None if reason == "reaped" else (0 if reason == "succeeded" else 1),
        "signal": 9 if reason == "reaped" else None,
        "scopes": (),
        "uptime": 1.0,
        "start_failure": False,
        "state": "backoff",
    }
    fields.update(kw)
    return WorkerEnded(time=T0 + t, rank=rank, pid=pid, reason=reason, **fields)


def expired(pid: int, t: float, scope: str = "step") -> TimerExpired:
    return TimerExpired(
        time=T0 + t, pid=pid, scope_id=scope, signal=9, late=0.0016, report_only=False,
        action="SIGKILL", kill_after=5.0,
    )  # fmt: skip


def reaped(pid: int, t: float, stacks: str | None = None) -> WorkerReaped:
    return WorkerReaped(
        time=T0 + t, pid=pid, signal=9, group=False, scopes=("step",), step=1, steps=1,
        stacks=stacks,
    )  # fmt: skip


def restart(t: float) -> RestartScheduled:
    return RestartScheduled(time=T0 + t, ranks=(0,), delay=1.0, restarts=(1,), attempt=1, budget=3)


def server(t: float = 0.0) -> ServerStarted:
    return ServerStarted(time=T0 + t, pid=77, sources=("fifo:/run/t.fifo",))


def read(*events: Event | object) -> HistoryReader:
    reader = HistoryReader()
    for e in events:
        reader.feed(e.to_dict() if isinstance(e, Event) else e)
    return reader


REAPED_THEN_SUCCEEDED = (
    server(),
    started(0, 100, 1, 0.1),
    expired(100, 2.0),
    reaped(100, 2.1),
    ended(0, 100, "reaped", 2.2, scopes=("step",)),
    restart(2.2),
    started(0, 101, 2, 3.2),
    ended(0, 101, "succeeded", 4.0, state="succeeded"),
    ServerStopped(time=T0 + 4.1, timers=0, counters={"requests": 4, "reaped": 1}),
    SupervisorStopped(time=T0 + 4.2, outcome="succeeded", exit_code=0, workers=()),
)


def test_a_reaped_then_restarted_rank() -> None:
    reader = read(*REAPED_THEN_SUCCEEDED)
    text = format_history(reader, "ev.jsonl")
    assert "0     2         reaped, restarted, then succeeded (exit code 0)" in text
    # when, which block, how late
    [first] = [line for line in text.splitlines() if "attempt 1" in line]
    assert "block 'step' outlived its timer" in first
    assert "expired 1.6ms after its reap deadline" in first
    assert "5s" in first and "(kill_after)" in first
    assert "no stack dump" in first
    assert "after worker 0 reaped (SIGKILL)" in text  # the restart's cause
    assert "requests 4" in text and "reaped 1" in text
    assert "recent reaps and refusals (newest last):" in text
    assert "rank 0: timer 'step' of worker 100 expired" in text
    assert text.endswith("outcome: succeeded (exit code 0)\n")
    data = history_dict(reader)
    assert data["ranks"][0]["story"] == "reaped, restarted, then succeeded (exit code 0)"
    assert data["exit_code"] == 0 and data["restarts"] == 1


def test_the_task_or_the_innermost_frame_that_held_the_worker() -> None:
    dump = (
        "Thread 0x7f (most recent call first):\n"
        '  File "/w/io.py", line 12 in read_forever\n'
        '  File "/w/main.py", line 3 in <module>\n'
    )
    reader = read(
        started(0, 100, 1, 0.0),
        StacksDumped(time=T0 + 1, pid=100, text=dump, step=1, steps=2),
        reaped(100, 1.5, stacks=dump),
        ended(0, 100, "reaped", 1.6),
        started(1, 200, 1, 0.0),
        ended(1, 200, "reaped", 1.6, task="Task-7", scopes=("s",)),
    )
    text = format_history(reader, "ev.jsonl")
    assert 'innermost frame: File "/w/io.py", line 12 in read_forever' in text
    assert "task 'Task-7' held the loop" in text


def test_only_the_last_run_is_told_and_the_earlier_are_counted() -> None:
    reader = read(*REAPED_THEN_SUCCEEDED, server(10.0), started(0, 300, 1, 10.1))
    text = format_history(reader, "ev.jsonl")
    assert "ev.jsonl holds 2 runs" in text and "succeeded (exit code 0)" in text
    assert "0     1         still running" in text
    assert "outcome: no end in the log" in text


def test_a_plain_server_its_refusals_and_hang_reports() -> None:
    rejected = RequestRejected(time=T0 + 1, reason="bad json", line="{", source="fifo")
    hang = HangReported(
        time=T0 + 2, summary="rank 1 differs", ranks=2, odd=(1,), missing=(), seconds=0.2,
        files=(), report="whole report",
    )  # fmt: skip
    reader = read(server(), rejected, rejected, hang)
    text = format_history(reader, "ev.jsonl")
    assert text.startswith("server, server pid 77 on fifo:/run/t.fifo")
    assert "request_rejected 2" in text
    assert "rejected input from fifo: bad json" in text
    assert "hang report in 0.20s: rank 1 differs" in text


def test_what_is_no_event_is_counted_not_fatal() -> None:
    reader = read(
        server(), {"event": "from_the_future", "time": 1.0}, {"event": "worker_started"},
        [1, 2], None, "text",
    )  # fmt: skip
    assert reader.run.unreadable == 5
    assert "5 line(s) not read" in format_history(reader, "ev.jsonl")


def test_every_event_kind_reads_back_as_itself() -> None:
    for e in REAPED_THEN_SUCCEEDED:
        back = decode_event(e.to_dict())
        assert back is not None and back.kind == e.kind and back.time == e.time


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)
KNOWN = st.sampled_from([e.to_dict() for e in REAPED_THEN_SUCCEEDED])
MUTATED = st.tuples(KNOWN, st.text(max_size=8), JSON).map(lambda t: {**t[0], t[1]: t[2]})


@given(st.lists(KNOWN | MUTATED | JSON, max_size=30))
def test_any_log_is_read_without_an_error(lines: list[object]) -> None:
    reader = read(*lines)
    format_history(reader, "ev.jsonl")
    history_dict(reader)
    if reader.past_total == 0:  # one run: each line is one of its events, or unreadable
        assert reader.run.events + reader.run.unreadable == len(lines)
