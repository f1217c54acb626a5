"""Never the wrong kill, with real processes: requests naming thread ids, processes of
another uid, processes that never registered, pids recycled while a request waited in the
pipe. Every one is refused (and reported), and the would-be victim lives on.

Bounds: a deadline of a few tenths of a second, then a bounded wait (seconds) for the
event that reports the refusal; survival is checked after it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from aiotimer import KillPolicy, SignalReaper, TimerServer
from aiotimer._process import read_start_time
from aiotimer._protocol import Request, encode
from aiotimer.errors import RefusedTargetError
from aiotimer.events import Event, SignalRefused, WorkerReaped, WorkerUnknown
from aiotimer.testing import wait_until

pytestmark = [pytest.mark.process, pytest.mark.timeout(40)]

REPO = Path(__file__).resolve().parent.parent
BOUND = 15.0


def write_line(fifo: Path, line: bytes) -> None:
    fd = os.open(fifo, os.O_WRONLY)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


# An embedding agent: runs the server in a thread of its own process (thread mode, as
# torch's agents do), plus a thread of its own work; prints the three ids.
AGENT = r"""
import json, os, sys, threading, time
from aiotimer import TimerServer, TimerServerThread
fifo, log = sys.argv[1], sys.argv[2]
work = threading.Thread(target=time.sleep, args=(60,), daemon=True)
work.start()
server = TimerServerThread(TimerServer(fifo=fifo, event_log=log))
server.start()
[loop] = [t for t in threading.enumerate() if t.name == "aiotimer-server"]
print(json.dumps({"pid": os.getpid(), "server": loop.native_id,
                  "work": work.native_id}), flush=True)
time.sleep(60)
"""


def events_of(log: Path) -> list[dict[str, object]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="thread ids via pidfds")
def test_thread_ids_of_the_server_and_of_its_agent_are_refused(tmp_path: Path) -> None:
    fifo, log = tmp_path / "t.fifo", tmp_path / "events.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT, str(fifo), str(log)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert agent.stdout is not None
        ids = json.loads(agent.stdout.readline())
        tids = [ids["server"], ids["work"]]
        assert ids["pid"] not in tids
        for tid in tids:
            write_line(fifo, encode(Request(tid, f"tid-{tid}", time.time() + 0.2, 9)))
        deadline = time.monotonic() + BOUND
        refused: set[int] = set()
        while refused != set(tids) and time.monotonic() < deadline:
            refused = {
                int(str(e["pid"]))
                for e in events_of(log)
                if e["event"] in {"signal_refused", "worker_unknown"}
            }
            time.sleep(0.05)
        assert refused == set(tids)
        assert agent.poll() is None  # the agent, and the server in it, live on
        assert not [e for e in events_of(log) if e["event"] == "worker_reaped"]
    finally:
        agent.kill()
        agent.wait()
        if agent.stdout is not None:
            agent.stdout.close()


# A worker that registers, then becomes another user (as root may), then hangs.
FOREIGN = r"""
import json, os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY)
line = {"version": 1, "pid": os.getpid(), "scope_id": "foreign",
        "expiration_time": time.time() + 0.3, "signal": 9}
os.setuid(65534)
os.write(fd, (json.dumps(line) + "\n").encode())
os.close(fd)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch a child to another uid")
@pytest.mark.asyncio
async def test_the_kill_policy_refuses_a_foreign_uid_target(tmp_path: Path) -> None:
    events: list[Event] = []
    fifo = tmp_path / "t.fifo"
    reaper = SignalReaper(kill_policy=KillPolicy(uids=frozenset({os.getuid()})))
    async with TimerServer(fifo=fifo, reaper=reaper, on_event=events.append):
        worker = subprocess.Popen(
            [sys.executable, "-c", FOREIGN, str(fifo)], stdout=subprocess.PIPE, text=True
        )
        try:
            await wait_until(lambda: any(isinstance(e, SignalRefused) for e in events), BOUND)
            assert worker.poll() is None
        finally:
            worker.kill()
            worker.wait()
            if worker.stdout is not None:
                worker.stdout.close()
    [refused] = [e for e in events if isinstance(e, SignalRefused)]
    assert refused.pid == worker.pid
    assert "belongs to uid 65534" in refused.reason
    assert not [e for e in events if isinstance(e, WorkerReaped)]


def test_an_unregistered_target_is_refused() -> None:
    reaper = SignalReaper()
    bystander = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(RefusedTargetError, match="never attached"):
            reaper.signal(bystander.pid, signal.SIGKILL)
        time.sleep(0.1)
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
        reaper.close()


@pytest.mark.asyncio
async def test_a_request_sent_by_an_earlier_owner_of_the_pid_pins_nothing(
    tmp_path: Path,
) -> None:
    """The start time a request was sent with must be the pinned process's."""
    events: list[Event] = []
    fifo = tmp_path / "t.fifo"
    bystander = subprocess.Popen(["sleep", "30"])
    try:
        start = read_start_time(bystander.pid)
        assert start is not None
        async with TimerServer(fifo=fifo, on_event=events.append):
            stale = Request(bystander.pid, "old", time.time() + 0.2, 9, start_time=start - 1)
            await anyio.to_thread.run_sync(write_line, fifo, encode(stale))
            await wait_until(lambda: any(isinstance(e, WorkerUnknown) for e in events), BOUND)
            await anyio.sleep(0.4)
        assert bystander.poll() is None
        assert not [e for e in events if isinstance(e, WorkerReaped)]
    finally:
        bystander.kill()
        bystander.wait()
