"""A short block after a run of long ones is reaped on time, with a real ``aiotimer
serve`` and real workers using aiotimer's client over the FIFO.

While input trickles in, the server reads the FIFO once per interval learned from the
leads it has read (0.25 s after blocks of 10 s), and an acquire waiting in the pipe is
unknown to the expiry. aiotimer's client rings the FIFO's bell after an acquire due
sooner than that (``aiotimer.sources._bell``), so the server reads it at once.

The bound is generous for a loaded 2-core machine (the reap is ~1 ms late unloaded),
and fails without the bell: there the hung 0.05 s block is reaped up to 0.25 s late,
more than 0.05 s in ~60% of rounds (each round 0.03-0.06 s late or more in
runs on 3bc4109). A fresh server per round, since a server that has read one short lead
paces its reads by it for a minute.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import _procs
import pytest

pytestmark = [pytest.mark.process, pytest.mark.timeout(150)]

#: How late after its deadline the short block's reap may be and count as on time.
LATE = 0.05
ROUNDS = 4

# A worker: long blocks back to back (their lines trickle in), then a 0.05 s block that
# hangs. It prints the short block's wall-clock deadline first.
WORKER = r"""
import sys, time
from aiotimer import expires
for i in range(40):
    with expires(after=10.0, scope=f"long#{i}"):
        time.sleep(0.01)
deadline = time.time() + 0.05
with expires(after=0.05, scope="short"):
    print(deadline, flush=True)
    time.sleep(60)
"""


def reap_late(tmp_path: Path, round_: int) -> float:
    """One round: a fresh server, one worker; seconds from the short block's deadline
    to the server's signal (its ``worker_reaped`` record)."""
    fifo = tmp_path / f"timer{round_}.fifo"
    log = tmp_path / f"events{round_}.jsonl"
    with _procs.serving(fifo, "--event-log", str(log), "--no-control", "--no-journal"):
        worker = subprocess.Popen(
            [sys.executable, "-c", WORKER],
            stdout=subprocess.PIPE,
            text=True,
            env={**_procs.env(), "AIOTIMER_FIFO": str(fifo)},
        )
        try:
            assert worker.stdout is not None
            deadline = float(worker.stdout.readline())
            worker.wait(timeout=_procs.BOUND)
            assert worker.returncode == -9, "the hung block's worker was not SIGKILLed"
            end = time.monotonic() + _procs.BOUND
            while True:
                records = _procs.events(log)
                sent = [
                    float(r["time"])
                    for r in records
                    if r["event"] == "worker_reaped" and r["pid"] == worker.pid
                ]
                if sent:
                    break
                assert time.monotonic() < end, "no worker_reaped record"
                time.sleep(0.01)
        finally:
            if worker.poll() is None:
                worker.kill()
            worker.communicate()
    reaped = [r for r in records if r["event"] in ("timer_expired", "worker_reaped")]
    assert all(r.get("scope_id", "short") == "short" for r in reaped), reaped
    return sent[0] - deadline


def test_a_short_block_after_long_ones_is_reaped_on_time(tmp_path: Path) -> None:
    late = [reap_late(tmp_path, n) for n in range(ROUNDS)]
    print("reap of the 0.05 s block, ms after its deadline:", [round(x * 1e3, 1) for x in late])
    assert max(late) < LATE, f"reaped {max(late) * 1e3:.0f} ms late (bound {LATE * 1e3:.0f} ms)"
