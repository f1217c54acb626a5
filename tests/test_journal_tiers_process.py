"""A two-tier timer survives a server restart with both tiers: the journal keeps the
request the wire carried, ``kill_after`` included, and the next server lists it so
(the timer's row, and the request itself under ``request``).

Real processes: ``python -m aiotimer serve`` twice on one FIFO, a ``sleep`` worker whose
two-tier acquire is written to the FIFO as a line, ``aiotimer status --json`` to read
the restored timer. Waits are bounded by ``BOUND`` (15 s); the timer's deadline is
minutes away, so nothing here races it.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
from _procs import BOUND, Sentinel, line, send, serving, status_until

pytestmark = [pytest.mark.process, pytest.mark.timeout(90)]


def timers_of(fifo: Path, pid: int) -> list[dict[str, Any]]:
    """The live timers of ``pid`` as ``aiotimer status --json`` lists them, once the
    server lists any (fails after ``BOUND`` seconds)."""
    found: list[dict[str, Any]] = status_until(
        fifo,
        lambda doc: [t for t in doc["timers"] if t["pid"] == pid],
        f"no timer of {pid} listed",
    )
    return found


def test_a_restored_two_tier_timer_keeps_its_kill_after(tmp_path: Path) -> None:
    fifo = tmp_path / "t.fifo"
    journal = Path(f"{fifo}.journal")
    with Sentinel() as worker:
        body = json.loads(line(worker.pid, "step", after=300.0))
        body["kill_after"] = 20.0
        with serving(fifo) as first:
            send(fifo, json.dumps(body).encode() + b"\n")
            (before,) = timers_of(fifo, worker.pid)
            assert before["kill_after"] == 20.0
            first.send_signal(signal.SIGTERM)  # a planned stop keeps the journal
            assert first.wait(BOUND) == 0
        (entry,) = json.loads(journal.read_bytes())["entries"]
        assert entry["kill_after"] == 20.0, entry
        with serving(fifo) as second:
            (after,) = timers_of(fifo, worker.pid)
            second.send_signal(signal.SIGTERM)
            assert second.wait(BOUND) == 0
        assert after["kill_after"] == 20.0, after
        assert after["request"]["kill_after"] == 20.0  # the record the wire carried
        assert after["request"]["start_time"] == entry["start_time"]
        assert after["block_deadline"] == pytest.approx(after["deadline"] - 20.0)
        assert after["deadline"] == pytest.approx(before["deadline"], abs=1.0)
