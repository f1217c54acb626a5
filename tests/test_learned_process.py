"""Learned timeouts end to end: ``aiotimer run --nproc 1 --max-restarts 1`` over a worker
whose steps are ``expires(after=learned(initial=30), scope="step")``.

The worker runs 300 steps of ~50 ms (lognormal jitter: median 50 ms, sigma 0.25), then
hangs inside step 301; restarted, it hangs inside its very first step. Both hangs must
be reaped within 3 s of their start (the learned value is the 1 s floor: 5 x the longest
step, ~0.1 s, is below it), where ``initial`` would have taken 30 s; no healthy step may
be reaped. Tolerance: 3 s from the hang to the ``timer_expired`` event covers the 1 s
value plus 2 s of a loaded machine's lateness. The whole run takes ~20 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.process, pytest.mark.timeout(120)]

WORKER = """
import os, random, sys, time
from aiotimer import expires, learned

marks = open(os.environ["TEST_MARKS"], "a", buffering=1)
restarted = os.environ.get("AIOTIMER_RESTART_COUNT", "0") != "0"
rng = random.Random(7)
steps = 0 if restarted else 300
for i in range(steps + 1):
    with expires(after=learned(initial=30), scope="step"):
        if i == steps:  # the hang, inside the step
            marks.write(f"hang {os.getpid()} {time.time()!r} after {i}\\n")
            time.sleep(120)
        time.sleep(0.05 * rng.lognormvariate(0, 0.25))
"""


def test_a_hang_is_reaped_at_the_learned_value_before_and_after_a_restart(
    tmp_path: Path,
) -> None:
    script, marks, log = tmp_path / "worker.py", tmp_path / "marks", tmp_path / "events.jsonl"
    script.write_text(WORKER)
    env = {**os.environ, "TEST_MARKS": str(marks), "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "aiotimer",
            "run",
            "--nproc",
            "1",
            "--max-restarts",
            "1",
            "--backoff",
            "0.1",
            "--no-hang-report",
            "--event-log",
            str(log),
            "--",
            sys.executable,
            str(script),
        ],
        env=env,
        capture_output=True,
        timeout=100,
        check=False,
    )
    assert run.returncode != 0, "the second hang exhausts the restart budget"
    hangs = [line.split() for line in marks.read_text().splitlines()]
    assert [(h[0], h[4]) for h in hangs] == [("hang", "300"), ("hang", "0")], run.stderr[-2000:]
    events = [json.loads(line) for line in log.read_text().splitlines()]
    expired = [e for e in events if e["event"] == "timer_expired"]
    assert len(expired) == 2, f"no healthy step reaped: {expired}"
    for hang, event in zip(hangs, expired, strict=True):
        pid, hung_at = int(hang[1]), float(hang[2])
        assert event["pid"] == pid and event["scope_id"] == "step"
        assert event["report_only"] is False
        assert event["learned"] <= 2.0, "timed at the learned value, not at 30 s"
        assert event["learned_samples"] >= 250  # a block read with its release may not count
        assert event["time"] - hung_at < 3.0, "reaped within 3 s of the hang"
    assert not [e for e in events if e["event"] == "learned_would_reap"]
