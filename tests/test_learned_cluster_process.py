"""Learned timeouts across the nodes of a job, on a real etcd with real ``aiotimer run``
nodes: node ``b`` starts after node ``a`` learned scope ``step``, and the hang in its
worker's very first step is reaped at ``a``'s value, not at ``initial`` (30 s).

Tolerance: the hang must be reaped within 8 s of its start (``a``'s value is ~1-2 s: 5 x
its longest step as its server read it, at least the 1 s floor); every wait is bounded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from _etcd import EtcdServer

from aiotimer.cluster import connect
from aiotimer.cluster._learned import SHARE_INTERVAL, LearnedRecord, learned_key
from aiotimer.cluster._record import decode

pytestmark = [pytest.mark.etcd, pytest.mark.process, pytest.mark.timeout(90)]

WORKER = """
import os, time
from aiotimer import expires, learned

out, node = os.environ["TEST_OUT"], os.environ["TEST_NODE"]
if node == "a":
    for _ in range(100):
        with expires(after=learned(initial=30), scope="step"):
            time.sleep(0.05)
    open(os.path.join(out, "a-done"), "w").close()
    time.sleep(60)
else:
    with expires(after=learned(initial=30), scope="step"):
        with open(os.path.join(out, "b-hang"), "w") as f:
            f.write(repr(time.time()))
        time.sleep(60)
"""


def node(etcd: EtcdServer, tmp: Path, name: str, job: str) -> subprocess.Popen[bytes]:
    with (tmp / f"{name}.log").open("ab") as log:
        return subprocess.Popen(
            [
                sys.executable, "-m", "aiotimer", "run", "--nproc", "1",
                "--max-restarts", "0", "--no-hang-report",
                "--etcd", etcd.endpoint, "--job", job, "--node", name, "--etcd-ttl", "3",
                "--event-log", str(tmp / f"{name}.jsonl"), "--stop-timeout", "2",
                "--", sys.executable, str(tmp / "worker.py"),
            ],
            env={**os.environ, "TEST_NODE": name, "TEST_OUT": str(tmp)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip


def published_step(etcd: EtcdServer, job: str) -> float | None:
    async def read() -> float | None:
        store = connect(etcd.endpoint, timeout=5)
        try:
            entry = await store.get(learned_key(job, "a"))
        finally:
            await store.aclose()
        record = None if entry is None else decode(LearnedRecord, entry.value)
        return None if record is None else record.values.get("step")

    return anyio.run(read)


def test_a_node_that_starts_late_times_its_first_step_at_the_jobs_value(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    (tmp_path / "worker.py").write_text(WORKER)
    job = f"job-{tmp_path.name}"
    a = node(etcd, tmp_path, "a", job)
    b = None
    try:
        deadline = time.monotonic() + 40
        while (value := published_step(etcd, job)) is None or not (tmp_path / "a-done").exists():
            assert a.poll() is None, (tmp_path / "a.log").read_text()
            assert time.monotonic() < deadline, "node a published its learned value"
            time.sleep(0.2)
        # a's worker sleeps once done, so a's value stops changing after its last share
        # went out (one every SHARE_INTERVAL): wait for two reads an interval apart to agree
        while True:
            time.sleep(SHARE_INTERVAL + 0.5)
            settled = published_step(etcd, job)
            if settled == value:
                break
            assert time.monotonic() < deadline, "node a's learned value settled"
            value = settled
        assert value is not None and 1.0 <= value <= 3.0
        b = node(etcd, tmp_path, "b", job)
        assert b.wait(timeout=40) != 0, "b's worker was reaped and b gave up"
        hung_at = float((tmp_path / "b-hang").read_text())
        events = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()]
        [expired] = [e for e in events if e["event"] == "timer_expired"]
        assert expired["scope_id"] == "step" and expired["report_only"] is False
        assert expired["learned"] == pytest.approx(value, rel=0.2), "the job's value"
        assert expired["learned_samples"] == 0, "b had learned nothing of its own"
        assert expired["time"] - hung_at < 8.0, "reaped long before initial (30 s)"
    finally:
        for child in (a, b):
            if child is not None and child.poll() is None:
                child.terminate()
                child.wait(timeout=20)
