"""Events: every kind is a frozen record with a stable kind, JSON-ready and describable."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import anyio
import pytest

from aiotimer import events as ev
from aiotimer._eventlog import EventLog

SAMPLES: list[ev.Event] = [
    ev.ServerStarted(time=1.0, pid=10, sources=("fifo:/x",)),
    ev.ServerStopped(time=1.0, timers=2, counters={"expired": 1}),
    ev.SourceFailed(time=1.0, source="fifo:/x", error="OSError()"),
    ev.TimerAcquired(time=1.0, pid=1, scope_id="a", expires_in=2.0, signal=9, source="api"),
    ev.TimerReleased(time=1.0, pid=1, scope_id="a", source="api"),
    ev.TimerExpired(
        time=1.0, pid=1, scope_id="a", signal=9, late=0.001, report_only=False, action="SIGKILL"
    ),
    ev.WorkerReaped(time=1.0, pid=1, signal=9, group=False, scopes=("a", "b"), step=1, steps=1),
    ev.ReapFailed(time=1.0, pid=1, signal=9, error="EPERM", attempt=1, retry_in=0.1),
    ev.ReapAbandoned(time=1.0, pid=1, signal=9, error="EPERM", attempts=6),
    ev.WorkerSurvived(time=1.0, pid=1, signal=9, unkillable=True, waited=5.0),
    ev.StacksDumped(time=1.0, pid=1, text=None, step=1, steps=2),
    ev.WorkerExited(time=1.0, pid=1, cleared=("a",), reason="exited"),
    ev.WorkerUnknown(time=1.0, pid=1, scope_id="a", source="fifo:/x"),
    ev.RequestRejected(time=1.0, reason="malformed JSON", line="garbage", source="fifo:/x"),
]


def test_every_event_kind_has_a_sample_and_a_unique_kind() -> None:
    classes = {getattr(ev, name) for name in ev.__all__ if name not in {"Event", "signal_name"}}
    assert classes == {type(e) for e in SAMPLES}
    kinds = [e.kind for e in SAMPLES]
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


def test_signal_name() -> None:
    assert ev.signal_name(9) == "SIGKILL"
    assert ev.signal_name(0) == "signal 0"


@pytest.mark.asyncio
async def test_event_log_writes_json_lines_and_drops_when_full(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    log = EventLog(path, max_queued=2)
    for event in SAMPLES[:3]:
        log.put(event)  # the third does not fit: dropped, counted
    assert log.dropped == 1
    async with anyio.create_task_group() as tg:
        await tg.start(log.run)
        log.close()
    log.put(SAMPLES[4])  # after close: ignored
    lines = path.read_text().splitlines()
    assert [json.loads(line)["event"] for line in lines] == [
        "server_started",
        "server_stopped",
    ]
