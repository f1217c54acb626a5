"""Never the wrong kill, with real processes: requests naming thread ids, processes of
another uid, processes that never registered, pids recycled while a request waited in the
pipe. Every one is refused (and reported), and the would-be victim lives on.

Bounds: a deadline of a few tenths of a second, then a bounded wait (seconds) for the
event that reports the refusal; survival is checked after it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from _pids import fake_pid

from aiotimer import KillPolicy, SignalReaper, TimerServer
from aiotimer._edges.procfs import read_start_time
from aiotimer.errors import RefusedTargetError
from aiotimer.events import Event, SignalRefused, WorkerReaped, WorkerUnknown
from aiotimer.testing import wait_until
from aiotimer.wire import Request, encode

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


# -- a stalled server ---------------------------------------------------------------------

# A worker that acquires (deadline AFTER seconds on), says so, then releases when told on
# stdin ("go"), or never ("hang").
STALL_WORKER = r"""
import json, os, sys, time
fifo, after, mode = sys.argv[1], float(sys.argv[2]), sys.argv[3]
def send(expiration, sig, **ext):
    line = json.dumps({"version": 1, "pid": os.getpid(), "scope_id": "block",
                       "expiration_time": expiration, "signal": sig, **ext}) + "\n"
    fd = os.open(fifo, os.O_WRONLY)
    os.write(fd, line.encode())
    os.close(fd)
send(time.time() + after, 9, mono=time.monotonic() + after)
print("acquired", flush=True)
if mode == "go":
    sys.stdin.readline()
    send(-1, 0)
    print("released", flush=True)
time.sleep(60)
"""


#: Each stall worker's deadline, seconds after its acquire.
STALL_AFTER = 1.5


@contextlib.contextmanager
def _stall_rig(
    tmp_path: Path, healthy: int
) -> Iterator[tuple[subprocess.Popen[bytes], list[subprocess.Popen[str]], float]]:
    """``aiotimer serve`` and ``healthy`` workers plus one that hangs, each holding one
    timer due ``STALL_AFTER`` s after it acquired, and a ``time.monotonic()`` by which
    every deadline has passed; torn down (server resumed first) on exit."""
    fifo, log = tmp_path / "t.fifo", tmp_path / "events.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    serve = [sys.executable, "-m", "aiotimer", "serve", "--fifo", str(fifo)]
    server = subprocess.Popen([*serve, "--event-log", str(log)], env=env)
    workers: list[subprocess.Popen[str]] = []
    try:
        deadline = time.monotonic() + BOUND
        while not fifo.with_name("t.fifo.aiotimer").exists():
            assert time.monotonic() < deadline and server.poll() is None
            time.sleep(0.02)
        for mode in ["go"] * healthy + ["hang"]:
            workers.append(
                subprocess.Popen(
                    [sys.executable, "-c", STALL_WORKER, str(fifo), str(STALL_AFTER), mode],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        for w in workers:
            assert w.stdout is not None and w.stdout.readline().strip() == "acquired"
        yield server, workers, time.monotonic() + STALL_AFTER + 0.3
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server.pid, signal.SIGCONT)
        server.terminate()
        server.wait(BOUND)
        for w in workers:
            w.kill()
            w.wait()
            for stream in (w.stdin, w.stdout):
                if stream is not None:
                    stream.close()


def _release(workers: list[subprocess.Popen[str]]) -> None:
    """Have each of ``workers`` release its timer, and wait until it has."""
    for w in workers:
        assert w.stdin is not None
        w.stdin.write("go\n")
        w.stdin.flush()
        assert w.stdout is not None and w.stdout.readline().strip() == "released"


def _resume_and_check(
    server: subprocess.Popen[bytes], workers: list[subprocess.Popen[str]]
) -> None:
    """SIGCONT the server: the hung (last) worker is reaped within 0.5 s, no other one."""
    os.kill(server.pid, signal.SIGCONT)
    resumed = time.monotonic()
    *healthy, hung = workers
    while hung.poll() is None and time.monotonic() - resumed < BOUND:
        time.sleep(0.005)
    reaped_after = time.monotonic() - resumed
    assert hung.returncode == -signal.SIGKILL
    assert reaped_after < 0.5
    time.sleep(0.3)
    assert [w.poll() for w in healthy] == [None] * len(healthy)  # no healthy worker killed


def test_a_stalled_server_kills_no_worker_that_released_in_time(tmp_path: Path) -> None:
    """5 workers release while the server is stopped (SIGSTOP), before their deadlines;
    one hangs. On SIGCONT the releases in the pipe win: 0 healthy workers killed, and
    the hung one is reaped within 0.5 s."""
    with _stall_rig(tmp_path, healthy=5) as (server, workers, passed):
        time.sleep(0.2)  # the server reads the acquires
        os.kill(server.pid, signal.SIGSTOP)
        _release(workers[:5])
        time.sleep(max(0.0, passed - time.monotonic()))  # every deadline passes meanwhile
        _resume_and_check(server, workers)


def _flood(fd: int, size: int, first_pid: int) -> int:
    """Write up to ``size`` bytes of other workers' lines (releases of timers nobody
    holds: applied, no-ops), in whole-line writes of at most ``PIPE_BUF`` bytes, without
    blocking; return how many were written."""
    lines = [
        json.dumps({"pid": first_pid + i, "scope_id": "s", "expiration_time": -1, "signal": 0})
        for i in range(40)
    ]
    piece = ("\n".join(lines) + "\n").encode()
    assert len(piece) <= select.PIPE_BUF
    written = 0
    while written < size:
        try:
            written += os.write(fd, piece)
        except BlockingIOError:
            break
    return written


def test_a_stalled_server_flooded_after_the_releases_kills_no_worker_that_released(
    tmp_path: Path,
) -> None:
    """As above, with the pipe nearly full when the server resumes: a little of other
    workers' input before the releases, most of a pipe's worth after them. The releases
    win, and the hung worker (named nowhere in the flood) is reaped without the server
    decoding the flood first."""
    with _stall_rig(tmp_path, healthy=3) as (server, workers, passed):
        flood_fd = os.open(tmp_path / "t.fifo", os.O_WRONLY | os.O_NONBLOCK)
        try:
            capacity = fcntl.fcntl(flood_fd, fcntl.F_GETPIPE_SZ)
            time.sleep(0.2)  # the server reads the acquires
            os.kill(server.pid, signal.SIGSTOP)
            assert _flood(flood_fd, 16 * 1024, first_pid=fake_pid(5000)) >= 16 * 1024
            _release(workers[:3])
            assert _flood(flood_fd, capacity, first_pid=fake_pid(6000)) > capacity // 2
            time.sleep(max(0.0, passed - time.monotonic()))  # every deadline passes meanwhile
            _resume_and_check(server, workers)
        finally:
            os.close(flood_fd)


# -- a pid recycled while its acquire waited in the pipe -----------------------------------

# Sends one acquire carrying its start time (as aiotimer's client does), then exits.
SHORT_LIVED = r"""
import json, os, sys, time
with open("/proc/self/stat", "rb") as f:
    start_time = int(f.read().rsplit(b")", 1)[1].split()[19])
line = {"version": 1, "pid": os.getpid(), "scope_id": "gone", "signal": 9,
        "expiration_time": time.time() + 1.0, "mono": time.monotonic() + 1.0,
        "start_time": start_time}
fd = os.open(sys.argv[1], os.O_WRONLY)
os.write(fd, (json.dumps(line) + "\n").encode())
"""


def spawn_with_pid(pid: int, argv: list[str], attempts: int = 50) -> subprocess.Popen[str] | None:
    """Start ``argv`` so that it gets ``pid`` (root: via ``ns_last_pid``), or ``None``."""
    for _ in range(attempts):
        try:
            Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        except OSError:
            return None
        proc = subprocess.Popen(argv, text=True)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


def test_an_acquire_queued_before_its_pid_was_recycled_never_hits_the_new_process(
    tmp_path: Path,
) -> None:
    """The worker sends its acquire while the server is stopped, exits, and its pid goes
    to a new process before the server reads the line: the new process is not pinned."""
    fifo, log = tmp_path / "t.fifo", tmp_path / "events.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    serve = [sys.executable, "-m", "aiotimer", "serve", "--fifo", str(fifo)]
    server = subprocess.Popen([*serve, "--event-log", str(log)], env=env)
    successor = None
    try:
        deadline = time.monotonic() + BOUND
        while not fifo.with_name("t.fifo.aiotimer").exists():
            assert time.monotonic() < deadline and server.poll() is None
            time.sleep(0.02)
        os.kill(server.pid, signal.SIGSTOP)
        worker = subprocess.Popen([sys.executable, "-c", SHORT_LIVED, str(fifo)])
        assert worker.wait(BOUND) == 0  # exited and reaped: its pid is free
        past_due = time.monotonic() + 1.0 + 0.3  # its acquire's deadline passed by then
        time.sleep(0.05)  # a few clock ticks, so the successor's start time differs
        successor = spawn_with_pid(
            worker.pid, [sys.executable, "-c", "import time; time.sleep(30)"]
        )
        if successor is None:
            pytest.skip("cannot make the kernel reuse a pid here (needs root and ns_last_pid)")
        os.kill(server.pid, signal.SIGCONT)
        deadline = time.monotonic() + BOUND
        while not [e for e in events_of(log) if e["event"] == "worker_unknown"]:
            assert time.monotonic() < deadline, "the stale acquire was never reported"
            time.sleep(0.05)
        time.sleep(max(0.0, past_due - time.monotonic()))
        assert successor.poll() is None
        events = events_of(log)
        assert [e["pid"] for e in events if e["event"] == "worker_unknown"] == [worker.pid]
        assert not [e for e in events if e["event"] in {"worker_reaped", "timer_expired"}]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server.pid, signal.SIGCONT)
        server.terminate()
        server.wait(BOUND)
        if successor is not None:
            successor.kill()
            successor.wait()
