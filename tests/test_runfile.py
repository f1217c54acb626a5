"""Run files, what is proven to be a dead run's leftover, and the parent-death
trampoline. Real (``sleep``) processes, a few milliseconds each."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from _pids import fake_pid

from aiotimer._edges.procfs import boot_id
from aiotimer.errors import UnsafePathError
from aiotimer.supervisor._proctree import with_parent_death_signal
from aiotimer.supervisor._runfile import (
    ProcessId,
    RunFile,
    RunRecord,
    _pid_namespace,
    runs_dir,
    sweep,
)

pytestmark = [pytest.mark.process, pytest.mark.timeout(30)]

#: A session leader that starts a child (with ``AIOTIMER_FIFO`` as given), prints its pid
#: and waits; killing the leader leaves the child in its session and process group.
LEADER = (
    "import os, subprocess, sys\n"
    "env = {**os.environ, **dict(a.split('=', 1) for a in sys.argv[1:])}\n"
    "child = subprocess.Popen(['sleep', '60'], env=env)\n"
    "print(child.pid, flush=True)\n"
    "sys.stdin.read()\n"
)


class Session:
    """A worker-like session leader and its child."""

    def __init__(self, *env: str) -> None:
        self.leader = subprocess.Popen(
            [sys.executable, "-c", LEADER, *env],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self.leader.stdout is not None
        self.child = int(self.leader.stdout.readline())
        self.pidfd = os.pidfd_open(self.child)

    @property
    def id(self) -> ProcessId:
        with open(f"/proc/{self.leader.pid}/stat", "rb") as f:
            start = int(f.read().rsplit(b")", 1)[1].split()[19])
        return ProcessId(self.leader.pid, start)

    def kill_leader(self) -> None:
        self.leader.kill()
        self.leader.wait()

    def child_alive(self) -> bool:
        return not select.select([self.pidfd], [], [], 0)[0]

    def close(self) -> None:
        if self.child_alive():
            os.kill(self.child, signal.SIGKILL)
        os.close(self.pidfd)
        self.leader.kill()
        self.leader.wait()
        for stream in (self.leader.stdin, self.leader.stdout):
            assert stream is not None
            stream.close()


@pytest.fixture
def sessions() -> Iterator[list[Session]]:
    made: list[Session] = []
    yield made
    for s in made:
        s.close()


def test_a_dead_runs_leftovers_are_stopped_and_nothing_else(
    tmp_path: Path, sessions: list[Session]
) -> None:
    fifo = str(tmp_path / "run" / "timer.fifo")
    ours = Session(f"AIOTIMER_FIFO={fifo}")
    scrubbed = Session()  # in a recorded session, but no sign of the run in its environment
    alive = Session()  # a recorded worker still alive: its whole session is the run's
    other = Session(f"AIOTIMER_FIFO={fifo}")  # the run's marker, but in no recorded session
    sessions += [ours, scrubbed, alive, other]
    record = RunRecord(
        boot_id=boot_id() or "",
        supervisor=ProcessId(fake_pid(1), 1),  # dead
        fifo=fifo,
        workers=(ours.id, scrubbed.id, alive.id),
        pid_ns=_pid_namespace(),
    )
    ours.kill_leader()
    scrubbed.kill_leader()
    runs = runs_dir(tmp_path)
    (runs / "run-1-1.json").write_bytes(msgspec.json.encode(record))
    (line,) = sweep(runs)
    assert "stopped 3 process(es) left by the run of supervisor" in line
    assert line.endswith(
        f"pids {', '.join(map(str, sorted([ours.child, alive.leader.pid, alive.child])))}"
    )
    deadline = time.monotonic() + 5
    while ours.child_alive() or alive.child_alive():
        assert time.monotonic() < deadline, "the leftovers were not stopped"
        time.sleep(0.01)
    assert scrubbed.child_alive(), "unproven: left alone"
    assert other.child_alive(), "not in a recorded session: left alone"
    assert os.listdir(runs) == [], "the run file is gone"


def test_a_live_runs_file_is_left_alone(tmp_path: Path) -> None:
    runs = runs_dir(tmp_path)
    run = RunFile(runs, str(tmp_path / "timer.fifo"))
    run.record([os.getpid()])
    assert sweep(runs) == []
    assert run.path.exists()
    run.remove()
    assert not run.path.exists()


def test_a_run_of_another_pid_namespace_is_left_alone(tmp_path: Path) -> None:
    # Another container sharing the directory: its supervisor's pid is nobody here, but
    # its run is not proven dead, so neither its run file nor its FIFO's directory goes.
    runtime = tmp_path / "aiotimer-elsewhere"
    runtime.mkdir(mode=0o700)
    (runtime / "timer.fifo").touch()
    record = RunRecord(
        boot_id=boot_id() or "",
        supervisor=ProcessId(fake_pid(1), 1),
        fifo=str(runtime / "timer.fifo"),
        pid_ns="pid:[1]",
    )
    runs = runs_dir(tmp_path)
    (runs / "run-1-1.json").write_bytes(msgspec.json.encode(record))
    assert sweep(runs) == []
    assert (runs / "run-1-1.json").exists()
    assert (runtime / "timer.fifo").exists()
    # The same record from this namespace is a dead run: its directory is removed.
    here = msgspec.structs.replace(record, pid_ns=_pid_namespace())
    (runs / "run-1-1.json").write_bytes(msgspec.json.encode(here))
    assert sweep(runs) == []
    assert not runtime.exists()
    assert os.listdir(runs) == []


def test_an_unreadable_run_file_is_said_and_removed(tmp_path: Path) -> None:
    runs = runs_dir(tmp_path)
    (runs / "run-1-1.json").write_bytes(b"{not json")
    (line,) = sweep(runs)
    assert line.startswith(f"run file {runs}/run-1-1.json removed unread: ")
    assert os.listdir(runs) == []


def test_a_squatted_run_directory_is_refused(tmp_path: Path) -> None:
    squat = tmp_path / f"aiotimer-runs-{os.geteuid()}"
    squat.mkdir(mode=0o777)
    squat.chmod(0o777)
    with pytest.raises(UnsafePathError, match="group or others may write"):
        runs_dir(tmp_path)


def test_the_child_becomes_its_command_with_its_signals_as_they_should_be() -> None:
    # The parent-death signal itself is proven in test_run_process.py (a supervisor and
    # its guard killed: the workers die with the supervisor).
    argv = with_parent_death_signal(["cat", "/proc/self/status"], signal.SIGKILL)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True)
    status = dict(line.split(":\t", 1) for line in done.stdout.splitlines())
    assert status["Name"] == "cat", "the same process became the command"
    assert not int(status["SigIgn"], 16) & (1 << (signal.SIGPIPE - 1)), "SIGPIPE not ignored"
    missing = with_parent_death_signal(["/nonexistent/command"], signal.SIGKILL)
    failed = subprocess.run(missing, capture_output=True, text=True, timeout=10, check=False)
    assert failed.returncode == 127
    assert "cannot run '/nonexistent/command'" in failed.stderr
