"""A timer whose signal the kill policy refuses abandons only itself (real processes).

A worker (a torch-style client, which may name any signal on the wire) holds timer A
with signal 19 (SIGSTOP, which the default kill policy refuses) due at +1 s and timer B
with SIGKILL due at +2.5 s, and hangs. A's reap is refused and abandoned; B stays
watched and reaps the worker at its own deadline.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from _procs import BOUND, Sentinel, events, line, send, serving

pytestmark = [pytest.mark.process, pytest.mark.timeout(60)]


def test_a_refused_signal_leaves_the_workers_other_timers_watched(tmp_path: Path) -> None:
    fifo, log = tmp_path / "t.fifo", tmp_path / "events.jsonl"
    with serving(fifo, "--event-log", str(log)) as server, Sentinel() as worker:
        send(fifo, line(worker.pid, "A", 1.0, sig=signal.SIGSTOP))
        worker.arm(fifo, 2.5, scope="B")
        late = worker.lateness(BOUND)  # fails if B was dropped with A: never reaped
        assert late >= 0, f"reaped {-late:.2f} s before B's deadline"
        server.send_signal(signal.SIGTERM)
        assert server.wait(BOUND) == 0
    records = [r for r in events(log) if r.get("pid") == worker.pid]
    [refused] = [r for r in records if r["event"] == "signal_refused"]
    assert refused["signal"] == signal.SIGSTOP and "got 19 (SIGSTOP)" in refused["reason"]
    assert [r["event"] for r in records if r["event"] == "reap_abandoned"] == ["reap_abandoned"]
    [reaped] = [r for r in records if r["event"] == "worker_reaped"]
    assert (reaped["signal"], reaped["scopes"]) == (signal.SIGKILL, ["B"])
