"""Cluster tests on a real etcd with real ``aiotimer run`` nodes (two per job, one machine).

Each node is an ``aiotimer run`` process; each worker is a tiny script that writes a
file named ``<node>-<rank>-<restart count>`` when it starts. Tolerances: the lease TTL
is 2 s here; "lost within the TTL" is checked against TTL + 1 s, read every 50 ms (etcd's
lessor checks expiry every 0.5 s); every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from _etcd import EtcdServer

from aiotimer.cluster import GenerationRecord, connect, read_view
from aiotimer.cluster._record import encode, generation_key
from aiotimer.errors import StoreUnavailableError

pytestmark = [pytest.mark.etcd, pytest.mark.process, pytest.mark.timeout(90)]

WORKER = """
import os, sys, time
from aiotimer import expires
from aiotimer.diagnostics import ensure_dump_handler

if os.environ.get("AIOTIMER_DUMP_HOOK") == "1":  # every rank answers by its hook, not py-spy
    ensure_dump_handler()
count = int(os.environ["AIOTIMER_RESTART_COUNT"])
node, rank, out = os.environ["TEST_NODE"], os.environ["RANK"], os.environ["TEST_OUT"]
open(os.path.join(out, f"{node}-{rank}-{count}"), "w").close()
hangs = node == os.environ.get("TEST_HANG_NODE") and rank == "0"
gens = os.environ.get("TEST_HANG_GENS")  # "0,1": hang in these, each on its own go file
if gens is None:
    hang_now, go = count == 0 or bool(os.environ.get("TEST_HANG_ALWAYS")), "go"
else:
    hang_now, go = str(count) in gens.split(","), f"go-{count}"
peers = int(os.environ.get("TEST_HANG_PEERS", "0"))  # wait until this many ranks started
if hang_now:
    if hangs:
        while not os.path.exists(os.path.join(out, go)) or peers > sum(
            n.endswith(f"-{count}") and not n.startswith("go") for n in os.listdir(out)
        ):
            time.sleep(0.05)
        with expires(after=0.3, scope="step"):
            time.sleep(60)
    time.sleep(float(os.environ.get("TEST_SLEEP", "60")))
"""

TTL = 2


class Job:
    """Nodes of one job, started as ``aiotimer run`` processes."""

    def __init__(self, etcd: EtcdServer, tmp_path: Path) -> None:
        self.etcd = etcd
        self.name = f"job-{tmp_path.name}"
        self.out = tmp_path / "out"
        self.out.mkdir()
        self.script = tmp_path / "worker.py"
        self.script.write_text(WORKER)
        self.tmp = tmp_path
        self.nodes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, node: str, *extra: str, **env: str) -> subprocess.Popen[bytes]:
        with (self.tmp / f"{node}.log").open("ab") as log:
            child = self._popen(node, log, extra, env)
        self.nodes[node] = child
        return child

    def _popen(
        self, node: str, log: Any, extra: tuple[str, ...], env: dict[str, str]
    ) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "aiotimer",
                "run",
                "--nproc",
                "2",
                "--etcd",
                self.etcd.endpoint,
                "--job",
                self.name,
                "--node",
                node,
                "--etcd-ttl",
                str(TTL),
                "--min-uptime",
                "0.1",
                "--backoff",
                "0.1",
                "--stop-timeout",
                "2",
                *extra,
                "--",
                sys.executable,
                str(self.script),
            ],
            env={**os.environ, "TEST_NODE": node, "TEST_OUT": str(self.out), **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def log(self, node: str) -> str:
        return (self.tmp / f"{node}.log").read_text(errors="replace")

    def wait_log(self, node: str, text: str, timeout: float = 10.0) -> None:
        """Wait until ``text`` is in node's log (a running node's log writer writes a
        moment after the event it logs); fails after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while text not in self.log(node):
            assert time.monotonic() < deadline, f"{text!r} never logged: {self.log(node)}"
            time.sleep(0.02)

    def hang_report(self) -> tuple[int, dict[str, Any]]:
        """``aiotimer status --etcd ... --hang-report --json``: exit code and report."""
        done = subprocess.run(
            [sys.executable, "-m", "aiotimer", "status", "--etcd", self.etcd.endpoint,
             "--job", self.name, "--hang-report", "--json"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        return done.returncode, json.loads(done.stdout) if done.returncode == 0 else {
            "stderr": done.stderr
        }

    def status(self) -> tuple[int, dict[str, Any]]:
        """``aiotimer status --etcd ... --json``: its exit code and its JSON view."""
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "aiotimer",
                "status",
                "--etcd",
                self.etcd.endpoint,
                "--job",
                self.name,
                "--json",
            ],
            capture_output=True,
            timeout=30,
            check=False,
        )
        view = json.loads(done.stdout) if done.stdout.strip() else {}
        return done.returncode, view

    def wait_status(self, test: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
        """The job view once ``test`` holds for it, read every 0.1 s in this process (as
        ``aiotimer status --json`` prints it: starting that CLI for every read cost a
        second of CPU each); fails after ``timeout`` seconds."""

        async def poll() -> dict[str, Any]:
            store = connect(self.etcd.endpoint, timeout=5)
            view: dict[str, Any] = {}
            try:
                with anyio.move_on_after(timeout):
                    while True:
                        with contextlib.suppress(StoreUnavailableError):
                            read = await read_view(store, self.name, now=time.time())
                            view = json.loads(json.dumps(read.to_json()))
                            if test(view):
                                return view
                        await anyio.sleep(0.1)
            finally:
                await store.aclose()
            raise AssertionError(f"status never matched in {timeout}s; last: {view}")

        return anyio.run(poll)

    def started(self) -> set[str]:
        return {p.name for p in self.out.iterdir() if not p.name.startswith("go")}

    def wait_started(self, names: set[str], timeout: float) -> None:
        """Wait until every worker in ``names`` has started (fails after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while not names <= self.started():
            assert time.monotonic() < deadline, f"never started: {names - self.started()}"
            assert all(n.poll() is None for n in self.nodes.values()), "a node exited"
            time.sleep(0.05)

    def stop_all(self) -> None:
        for child in self.nodes.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in self.nodes.values():
            try:
                child.wait(timeout=20)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


@contextlib.contextmanager
def running_job(etcd: EtcdServer, tmp_path: Path) -> Iterator[Job]:
    job = Job(etcd, tmp_path)
    try:
        yield job
    finally:
        job.stop_all()


@pytest.fixture
def job(etcd: EtcdServer, tmp_path: Path) -> Iterator[Job]:
    with running_job(etcd, tmp_path) as job:
        yield job


def nodes(view: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["node"]: n for n in view.get("nodes", [])}


def running_workers(view: dict[str, Any], node: str) -> list[int]:
    rec = nodes(view).get(node)
    if rec is None or rec["status"] != "running":
        return []
    return [w["pid"] for w in rec.get("workers", []) if w["state"] == "healthy" and w["pid"]]


def test_a_hang_on_one_node_restarts_every_node_with_one_job_wide_count(job: Job) -> None:
    for node in ("a", "b"):
        job.start(
            node, "--restart-scope", "job", "--dump", "--hang-report-timeout", "3",
            TEST_HANG_NODE="b", TEST_SLEEP="60", AIOTIMER_DUMP_HOOK="1",
        )  # fmt: skip
    view = job.wait_status(lambda v: all(len(running_workers(v, n)) == 2 for n in "ab"), timeout=30)
    assert sorted(nodes(view)) == ["a", "b"]
    assert [nodes(view)[n]["generation"] for n in "ab"] == [0, 0]
    (job.out / "go").touch()  # node b's rank 0 now hangs: its timer expires in 0.3 s
    for node in ("a", "b"):
        assert job.nodes[node].wait(timeout=40) == 0, job.log(node)
    # Every rank of both nodes ran twice: restart count 0, then 1 (the job's generation).
    assert job.started() == {f"{n}-{r}-{c}" for n in "ab" for r in "01" for c in "01"}
    code, view = job.status()
    assert code == 3, "no node runs any more"
    assert view["generation"]["generation"] == 1
    assert (view["generation"]["node"], view["generation"]["rank"]) == ("b", 0)
    assert {n["node"]: (n["status"], n["outcome"]) for n in view["nodes"]} == {
        "a": ("left", "succeeded"),
        "b": ("left", "succeeded"),
    }
    assert "reaped (SIGKILL): block 'step' outlived its timer" in job.log("b")
    # Node b left with its last reap, so the view still shows it.
    assert [(r["node"], r["rank"], r["scopes"]) for r in view["recent_reaps"]] == [
        ("b", 0, ["step"])
    ]
    # Both nodes took their ranks' stacks before restarting: one report of the job,
    # read from etcd, names node b's rank 0 (its dump taken by its reap, --dump).
    code, report = job.hang_report()
    assert code == 0, report
    assert report["generation"] == 0 and report["odd"] == [0], report["summary"]
    assert report["summary"].startswith("rank 0 on b of 4 differs: in `<module>` (worker.py:"), (
        report["summary"]
    )
    assert "inside block `step`; 3 ranks in `<module>`" in report["summary"]
    ranks = sorted((r["node"], r["rank"]) for g in report["groups"] for r in g["ranks"])
    assert ranks == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert all(r["main"] for g in report["groups"] for r in g["ranks"]), report["text"]


def test_the_restart_budget_is_job_wide(job: Job) -> None:
    # Node b's rank 0 hangs in every generation, the others wait; one restart allowed.
    for node in ("a", "b"):
        job.start(
            node, "--restart-scope", "job", "--max-restarts", "1",
            TEST_HANG_NODE="b", TEST_HANG_ALWAYS="1", TEST_HANG_PEERS="4",
        )  # fmt: skip
    job.wait_status(lambda v: all(len(running_workers(v, n)) == 2 for n in "ab"), timeout=30)
    (job.out / "go").touch()
    for node in ("a", "b"):
        assert job.nodes[node].wait(timeout=40) == 3, job.log(node)  # 3: gave up
    # Generation 0, one job-wide restart to generation 1, then the job gives up.
    assert job.started() == {f"{n}-{r}-{c}" for n in "ab" for r in "01" for c in "01"}
    _, view = job.status()
    gen = view["generation"]
    assert gen["generation"] == 1
    # The failing node's own budget (it counts only its failures) runs out with the
    # job's; either way the job records the give-up and every node ends.
    assert "restart budget exhausted (1 restart" in gen["gave_up"]
    assert {n["node"]: n["outcome"] for n in view["nodes"]} == {"a": "gave_up", "b": "gave_up"}


def test_a_killed_node_shows_lost_within_the_lease_ttl(job: Job) -> None:
    for node in ("a", "b"):
        job.start(node, "--restart-scope", "group")
    view = job.wait_status(lambda v: all(len(running_workers(v, n)) == 2 for n in "ab"), timeout=30)
    orphans = running_workers(view, "b")

    async def lost_after() -> float:
        """Seconds from the SIGKILL until the job view says b is lost (read every 50 ms)."""
        store = connect(job.etcd.endpoint)
        try:
            job.nodes["b"].send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            with anyio.fail_after(TTL + 10):
                while True:
                    view = await read_view(store, job.name, now=time.time())
                    if {r.node: r.status for r in view.nodes}["b"] == "lost":
                        return time.monotonic() - killed_at
                    await anyio.sleep(0.05)
        finally:
            await store.aclose()

    try:
        # The lease was last renewed at most a heartbeat (TTL/3) before the kill, and
        # etcd's lessor checks expiry every 0.5 s: lost within TTL + 0.5 s, + 0.5 s slack.
        assert anyio.run(lost_after) <= TTL + 1.0
        job.nodes["b"].wait(timeout=10)
        code, view = job.status()
        assert (code, nodes(view)["a"]["status"], nodes(view)["b"]["status"]) == (
            0,
            "running",
            "lost",
        )
    finally:
        for pid in orphans:  # the killed supervisor could not stop its workers
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def test_a_second_node_with_a_taken_name_is_refused(job: Job) -> None:
    job.start("a")
    job.wait_status(lambda v: len(running_workers(v, "a")) == 2, timeout=30)
    clash = subprocess.run(
        [
            sys.executable,
            "-m",
            "aiotimer",
            "run",
            "--etcd",
            job.etcd.endpoint,
            "--job",
            job.name,
            "--node",
            "a",
            "--",
            sys.executable,
            "-c",
            "pass",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert clash.returncode == 5  # the run cannot start
    assert "node name 'a'" in clash.stderr
    assert "already published by a live node" in clash.stderr


def test_publishers_recover_from_an_etcd_restart_without_restarting_workers(
    own_etcd: EtcdServer, tmp_path: Path
) -> None:
    with running_job(own_etcd, tmp_path) as job:
        job.start("a", "--restart-scope", "job")
        view = job.wait_status(lambda v: len(running_workers(v, "a")) == 2, timeout=30)
        pids = running_workers(view, "a")
        job.etcd.stop(signal.SIGKILL)
        time.sleep(TTL + 1)  # down for longer than the lease's time to live
        job.etcd.start()
        restarted_at = time.time()
        view = job.wait_status(
            lambda v: nodes(v).get("a", {}).get("updated_at", 0) > restarted_at, timeout=15
        )
        assert running_workers(view, "a") == pids, "the workers were not restarted"
        assert [w["restarts"] for w in nodes(view)["a"]["workers"]] == [0, 0]
        assert job.nodes["a"].poll() is None
        assert job.started() == {"a-0-0", "a-1-0"}
        job.wait_log("a", "cluster store reachable again")


def test_the_next_hang_restarts_the_job_after_etcd_lost_its_data(
    own_etcd: EtcdServer, tmp_path: Path
) -> None:
    with running_job(own_etcd, tmp_path) as job:
        for node in "ab":
            job.start(node, "--restart-scope", "job", TEST_HANG_NODE="b", TEST_HANG_GENS="0,1")
        job.wait_status(lambda v: all(len(running_workers(v, n)) == 2 for n in "ab"), timeout=30)
        (job.out / "go-0").touch()  # b's rank 0 hangs: the job restarts to generation 1
        job.wait_started({f"{n}-{r}-1" for n in "ab" for r in "01"}, timeout=30)
        own_etcd.wipe()  # etcd back on an empty data directory: no generation, no leases
        (job.out / "go-1").touch()  # and b's rank 0 hangs again
        for node in "ab":
            assert job.nodes[node].wait(timeout=40) == 0, job.log(node)
        assert job.started() == {f"{n}-{r}-{c}" for n in "ab" for r in "01" for c in "012"}
        view = job.wait_status(lambda v: v.get("generation") is not None, timeout=10)
        assert view["generation"]["generation"] == 2


def test_a_late_node_starts_at_the_job_generation(job: Job) -> None:
    job.start("a", "--restart-scope", "job")
    # Both ranks running their script, not only spawned: a bump before then stops them
    # before they write their start.
    job.wait_started({"a-0-0", "a-1-0"}, timeout=30)

    async def bump() -> None:  # as if the job had restarted twice before b joined
        store = connect(job.etcd.endpoint)
        try:
            await store.put(generation_key(job.name), encode(GenerationRecord(generation=2)))
        finally:
            await store.aclose()

    anyio.run(bump)
    assert job.nodes["a"].wait(timeout=30) == 0, job.log("a")
    late = job.start("b", "--restart-scope", "job")
    assert late.wait(timeout=30) == 0, job.log("b")
    assert job.started() == {"a-0-0", "a-1-0", "a-0-2", "a-1-2", "b-0-2", "b-1-2"}


def test_a_standalone_server_publishes_its_workers_and_timers(job: Job) -> None:
    fifo = job.tmp / "timer.fifo"
    with (job.tmp / "serve.log").open("ab") as log:
        serve = subprocess.Popen(
            [sys.executable, "-m", "aiotimer", "serve", "--fifo", str(fifo), "--etcd",
             job.etcd.endpoint, "--job", job.name, "--node", "s1", "--etcd-ttl", str(TTL)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    job.nodes["s1"] = serve
    view = job.wait_status(lambda v: "s1" in nodes(v), timeout=30)
    assert nodes(view)["s1"]["role"] == "server"
    worker = subprocess.Popen(
        [sys.executable, "-c", "import time; from aiotimer import expires\n"
         "with expires(after=60, scope='long'):\n    time.sleep(60)"],
        env={**os.environ, "AIOTIMER_FIFO": str(fifo)},
    )  # fmt: skip
    try:
        view = job.wait_status(lambda v: nodes(v)["s1"]["live_timers"] == 1, timeout=15)
        assert [(w["pid"], w["timers"]) for w in nodes(view)["s1"]["workers"]] == [(worker.pid, 1)]
    finally:
        worker.kill()
        worker.wait()
    serve.send_signal(signal.SIGTERM)
    assert serve.wait(timeout=20) == 0
    code, view = job.status()
    assert (code, nodes(view)["s1"]["status"]) == (3, "left")
