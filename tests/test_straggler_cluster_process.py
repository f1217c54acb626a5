"""A straggler named job-wide: two ``aiotimer run`` nodes on a real etcd.

Each node runs ranks of ~40 ms steps (``tests/test_straggler_process.py``'s script);
on node ``b`` the last rank's steps are 1.6x longer. ``aiotimer status --etcd`` must
name it with its node, and only it, while the job runs: with 2 ranks per node as node
``b`` named it, with 1 rank per node by the comparison across the nodes. Bounded by 40 s
of polling (it is named about 2 s in on an idle box); the nodes are then stopped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _etcd import EtcdServer
from test_straggler_process import STEPS

pytestmark = [pytest.mark.etcd, pytest.mark.process, pytest.mark.timeout(90)]


@pytest.mark.parametrize(("nproc", "how"), [(2, ""), (1, " (across nodes)")])
def test_the_slow_rank_is_named_with_its_node_in_status_etcd(
    etcd: EtcdServer, tmp_path: Path, nproc: int, how: str
) -> None:
    script = tmp_path / "steps.py"
    script.write_text(STEPS)
    job = f"job-{tmp_path.name}"
    base = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "TEST_STEPS": "1000"}
    nodes = []
    for node, slow in (("a", "1.0"), ("b", "1.6")):
        run = [sys.executable, "-m", "aiotimer", "run", "--nproc", str(nproc)]
        run += ["--etcd", etcd.endpoint]
        run += ["--job", job, "--node", node, "--etcd-ttl", "2", "--stop-timeout", "2"]
        env = {**base, "TEST_SLOW": slow, "TEST_SLOW_RANK": str(nproc - 1)}
        nodes.append(
            subprocess.Popen(
                [*run, "--", sys.executable, str(script)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    status = [sys.executable, "-m", "aiotimer", "status", "--etcd", etcd.endpoint, "--job", job]
    try:
        deadline = time.monotonic() + 40
        while True:
            assert time.monotonic() < deadline, "the straggler named within 40 s"
            time.sleep(0.5)
            text = subprocess.run(
                status, capture_output=True, text=True, timeout=20, check=False, env=base
            ).stdout
            if "stragglers:" in text:
                break
        lines = text.splitlines()
        named = lines[lines.index("stragglers:") + 1 :]
        named = [line for line in named if line.startswith("  node ")]
        assert len(named) == 1 and named[0].startswith(f"  node b rank {nproc - 1} "), text
        assert named[0].endswith("x its peers in step" + how), text
        view = json.loads(
            subprocess.run(
                [*status, "--json"],
                capture_output=True,
                text=True,
                timeout=20,
                check=True,
                env=base,
            ).stdout
        )
        assert [(s["node"], s["rank"], s["job_wide"]) for s in view["stragglers"]] == [
            ("b", nproc - 1, bool(how))
        ]
    finally:
        for proc in nodes:
            proc.terminate()
        for proc in nodes:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
