"""Run a 2-rank torchrun job (CPU, gloo, loopback) under an aiotimer timer server.

    python examples/torchrun/launch.py

1. Start an aiotimer server in this process on a fresh FIFO and export its path as
   ``TORCHELASTIC_TIMER_FILE`` (torchrun passes it on to the workers, whose
   ``aiotimer.client.expires()`` finds the server through it).
2. Run ``torchrun --standalone --nproc-per-node 2 --max-restarts 1 worker.py``.
3. On the first attempt rank 1 hangs inside ``with expires(after=3)``; the server kills
   it at the deadline; torchrun restarts the group; the second attempt completes.
4. Print the server's events and exit 0 only if the hung rank was reaped by the server
   and the job finished after a restart (1 otherwise).

``TORCHELASTIC_ENABLE_FILE_TIMER`` is removed from the job's environment: with it,
torchrun would start torch's own ``FileTimerServer`` on the same path.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiotimer
from aiotimer.events import Event, WorkerReaped
from aiotimer.server import TimerServer, TimerServerThread
from aiotimer.wire import TORCH_ENV_FIFO

HERE = Path(__file__).resolve().parent
WORKER = HERE / "worker.py"


class EventLog:
    """Collects the server's events (called in the server's thread)."""

    def __init__(self) -> None:
        self.started = time.time()
        self._lock = threading.Lock()
        self._events: list[Event] = []

    def __call__(self, event: Event) -> None:
        with self._lock:
            self._events.append(event)

    def events(self) -> list[Event]:
        """Every event so far, in order."""
        with self._lock:
            return list(self._events)

    def print(self) -> None:
        """Print every event with its time since launch."""
        for event in self.events():
            print(f"  +{event.time - self.started:6.2f}s  {event.describe()}")


def job_environment(fifo: Path, status: Path, step_timeout: float) -> dict[str, str]:
    """The environment torchrun (and so every worker) runs with."""
    env = dict(os.environ)
    env.pop("TORCHELASTIC_ENABLE_FILE_TIMER", None)
    env[TORCH_ENV_FIFO] = str(fifo)
    env["AIOTIMER_EXAMPLE_STATUS"] = str(status)
    env["AIOTIMER_EXAMPLE_STEP_TIMEOUT"] = str(step_timeout)
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback only
    # Workers import aiotimer from wherever this launcher did (e.g. a source checkout).
    source_root = Path(aiotimer.__file__).resolve().parent.parent
    if (source_root / "pyproject.toml").exists():
        paths = [str(source_root), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
        env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def torchrun_command(monitor_interval: float) -> list[str]:
    """torchrun, run by this interpreter: 2 ranks on this host, one restart allowed."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        "--monitor-interval",
        str(monitor_interval),
        str(WORKER),
    ]


def hung_pid(status: Path) -> int | None:
    """The pid of rank 1 in the first attempt (the one that hangs), if it started."""
    path = status / "attempt0-rank1.pid"
    return int(path.read_text()) if path.exists() else None


def verdict(log: EventLog, status: Path, returncode: int | None) -> list[str]:
    """What went wrong (empty if the hung rank was reaped and the restart finished)."""
    problems = []
    hung = hung_pid(status)
    reaped = [e for e in log.events() if isinstance(e, WorkerReaped) and e.pid == hung]
    if hung is None:
        problems.append("rank 1 never started its first attempt")
    elif not reaped:
        problems.append(f"the hung rank 1 (pid {hung}) was not reaped by the timer server")
    for rank in (0, 1):
        if not (status / f"attempt1-rank{rank}.done").exists():
            problems.append(f"rank {rank} did not finish the second attempt (after the restart)")
    if returncode != 0:
        problems.append(f"torchrun exited with {returncode}")
    return problems


def main(argv: list[str] | None = None) -> int:
    """Run the job; 0 if the hung rank was reaped and the job finished after a restart."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step-timeout", type=float, default=3.0, help="seconds per step")
    parser.add_argument("--job-timeout", type=float, default=110.0, help="seconds for the job")
    parser.add_argument("--monitor-interval", type=float, default=0.5, help="torchrun's")
    args = parser.parse_args(argv)

    log = EventLog()
    with tempfile.TemporaryDirectory(prefix="aiotimer-torchrun-") as tmp:
        status = Path(tmp)
        fifo = status / "timer.fifo"
        env = job_environment(fifo, status, args.step_timeout)
        print(f"timer server on {fifo} ({TORCH_ENV_FIFO})", flush=True)
        returncode: int | None = None
        with TimerServerThread(TimerServer(fifo=fifo, on_event=log)):
            try:
                job = subprocess.run(
                    torchrun_command(args.monitor_interval),
                    env=env,
                    timeout=args.job_timeout,
                    check=False,
                )
                returncode = job.returncode
            except subprocess.TimeoutExpired:
                print(f"torchrun did not finish within {args.job_timeout}s", flush=True)
        print("timer server events:")
        log.print()
        problems = verdict(log, status, returncode)
        hung = hung_pid(status)

    if problems:
        for problem in problems:
            print(f"FAILED: {problem}")
        return 1
    print(
        f"OK: rank 1 (pid {hung}) hung, was reaped by the aiotimer server, torchrun "
        "restarted the group and both ranks finished the second attempt"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
