"""Supervisor: how fast a reaped worker is back, and what a back-off costs the supervisor.

Run::

    python -m benchmarks.bench_supervisor            # 10 restarts, a 2 s back-off
    python -m benchmarks.bench_supervisor --quick    # 3 restarts, a 0.5 s back-off

Two figures, each against a reference measured in the same run:

* **restart gap**: from the moment the supervisor sees a reaped worker's exit to the
  moment it has launched the next attempt (zero back-off), against the reference of
  a bare ``subprocess.Popen`` of the same command in a new session (the floor: the
  launch itself). The gap adds the leftover scan of the worker's session, the exit's
  classification, the policy and the events.
* **back-off CPU**: the supervisor process's CPU time while a restart waits out its
  back-off, against the wall time of that back-off (a polling loop would approach
  100%; sleeping until the deadline costs next to nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

from aiotimer import Backoff, RestartPolicy, Supervisor
from aiotimer.events import Event, RestartScheduled, WorkerEnded, WorkerStarted
from benchmarks._util import format_table

#: A worker that registers a timer and hangs in it: the server reaps it after 50 ms.
HANGER = (
    "import time\nfrom aiotimer import expires\nwith expires(after=0.05):\n    time.sleep(60)\n"
)
CRASHER = "raise SystemExit(1)"


def popen_reference(command: list[str], repeats: int) -> float:
    """Median seconds of a bare ``Popen`` in a new session (the process is then killed)."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True)
        times.append(time.perf_counter() - started)
        proc.kill()
        proc.wait()
    return statistics.median(times)


async def restart_gaps(restarts: int) -> list[float]:
    """Seconds from each reaped worker's exit (as seen) to its next attempt's launch."""
    ended: list[float] = []
    gaps: list[float] = []

    def on_event(event: Event) -> None:
        if isinstance(event, WorkerEnded):
            ended.append(time.perf_counter())
        elif isinstance(event, WorkerStarted) and ended:
            gaps.append(time.perf_counter() - ended.pop())

    policy = RestartPolicy(max_restarts=restarts, backoff=Backoff(initial=0.0, cap=0.0))
    await Supervisor(
        [sys.executable, "-c", HANGER], policy=policy, on_event=on_event, stop_timeout=1
    ).run()
    return gaps


async def backoff_cpu(backoff: float) -> tuple[float, float]:
    """``(wall, cpu)`` seconds of this process while one restart waits ``backoff`` s."""
    marks: list[tuple[float, float]] = []

    def on_event(event: Event) -> None:
        if isinstance(event, RestartScheduled | WorkerStarted):
            marks.append((time.monotonic(), time.process_time()))

    policy = RestartPolicy(
        max_restarts=1, min_uptime=0.0, backoff=Backoff(initial=backoff, cap=backoff, jitter=0)
    )
    await Supervisor([sys.executable, "-c", CRASHER], policy=policy, on_event=on_event).run()
    (wall0, cpu0), (wall1, cpu1) = marks[1], marks[2]  # scheduled -> relaunched
    return wall1 - wall0, cpu1 - cpu0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer restarts, shorter back-off")
    args = parser.parse_args(argv)
    restarts, backoff = (3, 0.5) if args.quick else (10, 2.0)

    reference = popen_reference([sys.executable, "-c", HANGER], repeats=restarts)
    gaps = asyncio.run(restart_gaps(restarts))
    wall, cpu = asyncio.run(backoff_cpu(backoff))
    gap = statistics.median(gaps)
    rows = [
        ("bare Popen, new session (reference)", f"{reference * 1000:.2f} ms", "1.0x"),
        (
            f"restart gap, median of {len(gaps)}",
            f"{gap * 1000:.2f} ms",
            f"{gap / reference:.1f}x",
        ),
        (f"back-off wall time ({backoff:g} s)", f"{wall * 1000:.0f} ms", "1.0x"),
        ("supervisor CPU during it", f"{cpu * 1000:.2f} ms", f"{cpu / wall:.4f}x"),
    ]
    print(format_table(("measure", "value", "vs reference"), rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
