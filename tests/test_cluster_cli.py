"""The cluster command-line glue: node options, the missing extra, the job status view."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys

import anyio
import pytest
from _etcd import EtcdServer, free_port

from aiotimer.cluster import NodePublisher, NodeStatus, connect
from aiotimer.cluster._args import add_job_status_arguments, add_node_arguments, node_config
from aiotimer.cluster._cli import run_job_status, server_status
from aiotimer.errors import ClusterError, MissingExtraError
from aiotimer.events import WorkerInfo
from aiotimer.server import TimerServer
from aiotimer.testing import RecordingReaper, wait_until

pytestmark = pytest.mark.timeout(30)


def node_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_node_arguments(parser)
    return parser


def status_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--fifo")
    add_job_status_arguments(parser, where)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--watch", nargs="?", const=2.0, type=float)
    parser.add_argument("--timeout", type=float, default=5.0)
    return parser.parse_args(argv)


def test_node_options_default_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIOTIMER_RUN_ID", raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "torch-job")
    args = node_parser().parse_args(["--etcd", "127.0.0.1:2379"])
    config = node_config(args)
    assert config is not None
    assert (config.job, config.ttl) == ("torch-job", 10)
    assert config.node  # the host name
    monkeypatch.setenv("AIOTIMER_RUN_ID", "ours")
    assert node_parser().parse_args([]).job == "ours", "AIOTIMER_RUN_ID comes first"
    assert node_config(node_parser().parse_args([])) is None, "no --etcd: no cluster"


def test_node_options_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AIOTIMER_RUN_ID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ClusterError, match="--etcd needs a job id"):
        node_config(node_parser().parse_args(["--etcd", "h:1"]))
    with pytest.raises(ClusterError, match="--etcd-ttl must be at least 1"):
        node_config(node_parser().parse_args(["--etcd", "h:1", "--job", "j", "--etcd-ttl", "0"]))


def test_a_missing_extra_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "aetcd", None)
    monkeypatch.delitem(sys.modules, "aiotimer.cluster._etcd", raising=False)
    with pytest.raises(MissingExtraError) as info:
        connect("127.0.0.1:2379")
    assert str(info.value) == (
        "aiotimer[etcd] is required for --etcd: pip install 'aiotimer[etcd]'"
    )


def test_status_without_a_job_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("AIOTIMER_RUN_ID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    assert run_job_status(status_args("--etcd", "127.0.0.1:1")) == 4
    assert "--etcd needs --job" in capsys.readouterr().err


def test_status_of_an_unreachable_etcd_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    dead = f"127.0.0.1:{free_port()}"
    args = status_args("--etcd", dead, "--job", "j", "--timeout", "2")
    assert run_job_status(args) == 3
    assert f"etcd at {dead} is unavailable" in capsys.readouterr().err


@pytest.mark.etcd
def test_status_lists_a_published_node_and_exits_3_once_it_left(
    etcd: EtcdServer, capsys: pytest.CaptureFixture[str]
) -> None:
    status = NodeStatus(
        role="server",
        workers=(WorkerInfo(pid=4242, state="running", timers=1),),
        live_timers=1,
    )

    async def main() -> None:
        store = connect(etcd.endpoint)
        try:
            publisher = NodePublisher(store, job="j", node="n1", describe=lambda: status)
            async with publisher:
                args = status_args("--etcd", etcd.endpoint, "--job", "j", "--json")
                assert await anyio.to_thread.run_sync(run_job_status, args) == 0
        finally:
            await store.aclose()

    anyio.run(main)
    view = json.loads(capsys.readouterr().out)
    assert [n["node"] for n in view["nodes"]] == ["n1"]
    (rec,) = view["nodes"]
    assert (rec["status"], rec["live_timers"], rec["workers"][0]["pid"]) == ("running", 1, 4242)
    assert view["totals"]["running"] == 1
    # The node left cleanly: the human view says so, and nothing runs (exit 3).
    assert run_job_status(status_args("--etcd", etcd.endpoint, "--job", "j")) == 3
    out = capsys.readouterr().out
    assert "job j: 1 nodes (0 running, 0 stale, 0 lost, 1 left)" in out
    assert "outcome stopped" in out


@pytest.mark.asyncio
async def test_server_status_reports_live_timers_per_worker() -> None:
    async with TimerServer(reaper=RecordingReaper()) as server:
        server.acquire("a", 60)
        server.acquire("b", 60)
        await wait_until(lambda: len(server.get_state().timers) == 2)
        status = server_status(server)
    assert status.role == "server"
    assert status.live_timers == 2
    assert [(w.pid, w.timers) for w in status.workers] == [(os.getpid(), 2)]
    assert status.ranks == ()
    assert status.counters["acquired"] == 2


def test_status_watch_refreshes_until_interrupted(etcd: EtcdServer) -> None:
    watch = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aiotimer",
            "status",
            "--etcd",
            etcd.endpoint,
            "--job",
            "j",
            "--watch",
            "0.1",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert watch.stdout is not None
        lines = [watch.stdout.readline() for _ in range(6)]  # 3 views of 2 lines each
        assert [line.startswith("job j: 0 nodes") for line in lines] == [True, False] * 3
        watch.send_signal(signal.SIGINT)
        assert watch.wait(timeout=10) == 0
    finally:
        watch.kill()
        watch.wait()
        if watch.stdout is not None:
            watch.stdout.close()
