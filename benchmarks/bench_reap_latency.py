"""Reap latency: deadline -> signal sent, with 100k live timers under ingest load.

Run::

    python -m benchmarks.bench_reap_latency            # full run
    python -m benchmarks.bench_reap_latency --quick    # fewer samples, 10k timers
    python -m benchmarks.bench_reap_latency --real 5   # plus 5 real children, SIGKILL

The bulk of the samples use a reaper that only timestamps its signals (nothing is
killed; a signalled pid is reported as exited 1 ms later, about when a small SIGKILLed
process's pidfd turns readable), so thousands of deadlines can be measured, each on its
own worker. Like the default reaper it signals synchronously, so the server sends each
first signal inline, in its expiry handler. Meanwhile the table holds ``--timers``
far-future timers and a background task feeds the server wire lines (acquire + release
pairs) through the codec. The reference, measured in the same run under the same load,
is a bare timer: a task doing ``await asyncio.sleep(...)`` until the same kind of
deadline. ``--real N`` also reaps N real child processes with
:class:`~aiotimer.reapers.SignalReaper` and reports their latency separately.

It prints p50/p99/max for each, the cyclic GC's pauses during each measurement, the
load average (the machine may be shared) and the p99 ratio to the bare timer. Note that
under uvloop a bare ``asyncio.sleep`` may wake up to ~1 ms *early* (libuv timers have
millisecond resolution), a negative latency that flatters the reference; the server
never fires a timer early, it sleeps again.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

import anyio

from aiotimer.reapers import SignalReaper
from aiotimer.server import TimerServer, loop_factory
from aiotimer.testing import MemorySource
from aiotimer.wire import Request, encode
from benchmarks._util import GcPauses, format_table

BASE_PID = 1_000_000  # fake pids for the timestamping reaper: never real processes
#: Seconds from SIGKILL to the exit being seen: a small Python child's pidfd turns
#: readable ~0.7-1 ms after pidfd_send_signal on the 2-core test machine.
EXIT_AFTER = 0.001


class TimestampReaper:
    """A reaper that records when each pid was signalled, kills nothing, and reports a
    signalled pid as exited :data:`EXIT_AFTER` seconds later, as a SIGKILLed worker
    would be, so the server forgets it as it would a real one (and its reap waits for
    that exit as it would for a real one's)."""

    def __init__(self) -> None:
        self.signalled: dict[int, float] = {}
        self._exited: dict[int, anyio.Event] = {}

    def attach(self, pid: int, *, start_time: int | None = None) -> bool:
        self._exited[pid] = anyio.Event()
        return True

    async def wait_exit(self, pid: int) -> None:
        await self._exited[pid].wait()

    def signal(self, pid: int, signum: int, *, group: bool = False) -> None:
        self.signalled.setdefault(pid, time.monotonic())
        if pid in self._exited:
            asyncio.get_running_loop().call_later(EXIT_AFTER, self._exited[pid].set)

    async def dump_stacks(self, pid: int, timeout: float) -> str | None:
        return None

    def detach(self, pid: int) -> None:
        self._exited.pop(pid, None)


class CpuShare:
    """The process's CPU time over the wall time of a ``with`` block (the server, the
    load generator and the measuring code share the process)."""

    def __init__(self) -> None:
        self.cpu = self.wall = 0.0

    def __enter__(self) -> CpuShare:
        self.cpu, self.wall = time.process_time(), time.monotonic()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.cpu = time.process_time() - self.cpu
        self.wall = time.monotonic() - self.wall

    def summary(self) -> str:
        """``1.23 s over 6.00 s wall (20%)``."""
        return f"{self.cpu:.2f} s over {self.wall:.2f} s wall ({self.cpu / self.wall:.0%})"


class TimestampSignalReaper(SignalReaper):
    """The real reaper, recording when each signal was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.signalled: dict[int, float] = {}

    def signal(self, pid: int, signum: int, *, group: bool = False) -> None:
        super().signal(pid, signum, group=group)
        self.signalled.setdefault(pid, time.monotonic())


async def background_load(source: MemorySource, rate: int, stop: anyio.Event) -> int:
    """Feed ``rate`` requests/s (acquire+release pairs, as wire lines) until ``stop``."""
    pid = os.getpid() + 1  # a live-looking pid; the timestamping reaper accepts any
    sent, tick = 0, 0.005
    per_tick = max(2, int(rate * tick) // 2 * 2)
    far = time.time() + 3600
    while not stop.is_set():
        lines = []
        for i in range(per_tick // 2):
            scope = f"load#{i}"
            lines.append(encode(Request(pid, scope, far, 9)))
            lines.append(encode(Request(pid, scope, -1, 0)))
        source.push_bytes(b"".join(lines))
        sent += per_tick
        await anyio.sleep(tick)
    return sent


def percentiles(samples: Sequence[float]) -> tuple[float, float, float]:
    """p50, p99 and max of ``samples`` (seconds), in milliseconds."""
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return statistics.median(ordered) * 1e3, p99 * 1e3, ordered[-1] * 1e3


async def measure_server(
    args: argparse.Namespace,
) -> tuple[list[float], int, GcPauses, CpuShare]:
    reaper = TimestampReaper()
    source = MemorySource("bench")
    deadlines: dict[int, float] = {}
    if args.gc == "freeze-start":
        gc.freeze()  # what a process that only serves can do once imports are done
    async with TimerServer(sources=[source], reaper=reaper) as server:
        far_wall, far_mono = time.time() + 3600, time.monotonic() + 3600
        for i in range(args.timers):  # the live table
            server.submit(Request(BASE_PID - 1 - i % 1000, f"live#{i}", far_wall, 9, mono=far_mono))
        if args.gc == "freeze":
            gc.freeze()  # the live table moves to the permanent generation
        stop = anyio.Event()
        with GcPauses() as pauses, CpuShare() as cpu:
            async with anyio.create_task_group() as tg:
                tg.start_soon(background_load, source, args.load, stop)
                for n in range(args.samples):
                    pid = BASE_PID + n
                    after = random.uniform(0.005, 0.02)
                    deadline = time.monotonic() + after
                    deadlines[pid] = deadline
                    server.submit(Request(pid, "measured", time.time() + after, 9, mono=deadline))
                    await anyio.sleep(random.uniform(0.0005, 0.003))
                await anyio.sleep(0.1)
                stop.set()
        requests = server.snapshot(0, sites=0).counters.requests
    gc.unfreeze()
    latencies = [reaper.signalled[p] - d for p, d in deadlines.items() if p in reaper.signalled]
    missing = len(deadlines) - len(latencies)
    if missing:
        print(f"WARNING: {missing} measured timers were never signalled", file=sys.stderr)
    return latencies, requests, pauses, cpu


async def measure_bare_sleep(args: argparse.Namespace) -> tuple[list[float], GcPauses, CpuShare]:
    source = MemorySource("bench")
    latencies: list[float] = []

    async def one(after: float) -> None:
        deadline = time.monotonic() + after
        await asyncio.sleep(after)
        latencies.append(time.monotonic() - deadline)

    async with TimerServer(sources=[source], reaper=TimestampReaper()):
        stop = anyio.Event()
        with GcPauses() as pauses, CpuShare() as cpu:
            async with anyio.create_task_group() as tg:
                tg.start_soon(background_load, source, args.load, stop)
                async with anyio.create_task_group() as timers:
                    for _ in range(args.samples):
                        timers.start_soon(one, random.uniform(0.005, 0.02))
                        await anyio.sleep(random.uniform(0.0005, 0.003))
                stop.set()
    return latencies, pauses, cpu


async def measure_real(count: int) -> list[float]:
    reaper = TimestampSignalReaper()
    children = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        for _ in range(count)
    ]
    deadlines: dict[int, float] = {}
    try:
        async with TimerServer(reaper=reaper) as server:
            for i, child in enumerate(children):
                after = 0.2 + 0.05 * i
                deadlines[child.pid] = time.monotonic() + after
                server.acquire("real", after, pid=child.pid)
            with anyio.fail_after(30):
                while any(c.poll() is None for c in children):
                    await anyio.sleep(0.01)
    finally:
        for child in children:
            child.kill()
            child.wait()
    return [reaper.signalled[p] - d for p, d in deadlines.items() if p in reaper.signalled]


async def amain(args: argparse.Namespace) -> None:
    server, requests, server_gc, server_cpu = await measure_server(args)
    bare, bare_gc, bare_cpu = await measure_bare_sleep(args)
    rows = []
    for name, samples in [("aiotimer: deadline -> signal", server), ("bare asyncio.sleep", bare)]:
        p50, p99, worst = percentiles(samples)
        rows.append([name, str(len(samples)), f"{p50:.3f}", f"{p99:.3f}", f"{worst:.3f}"])
    if args.real:
        real = await measure_real(args.real)
        p50, p99, worst = percentiles(real)
        rows.append(
            ["aiotimer, real SIGKILL", str(len(real)), f"{p50:.3f}", f"{p99:.3f}", f"{worst:.3f}"]
        )
    print(
        f"reap latency with {args.timers:,} live timers, background ingest ~{args.load:,} req/s "
        f"({requests:,} requests applied), loop={args.loop}, gc={args.gc}"
    )
    print(format_table(["timer", "samples", "p50 ms", "p99 ms", "max ms"], rows))
    print(f"GC pauses while measuring aiotimer: {server_gc.summary()}")
    print(f"GC pauses while measuring bare sleep: {bare_gc.summary()}")
    print(f"CPU while measuring aiotimer: {server_cpu.summary()}")
    print(f"CPU while measuring bare sleep: {bare_cpu.summary()}")
    with open("/proc/loadavg") as f:  # the machine may be shared: say how busy it was
        print(f"load average at the end: {f.read().strip()}")
    s99, b99 = percentiles(server)[1], percentiles(bare)[1]
    verdict = "OK" if s99 < 2.0 else "ABOVE TARGET"
    print(f"p99 aiotimer / bare sleep = {s99 / b99:.2f}x; target p99 < 2 ms: {verdict}")


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples and timers")
    parser.add_argument("--timers", type=int, default=None, help="live timers (100k)")
    parser.add_argument("--samples", type=int, default=None, help="measured deadlines (3000)")
    parser.add_argument("--load", type=int, default=20_000, help="background requests/s")
    parser.add_argument("--real", type=int, default=0, help="also reap N real children")
    parser.add_argument("--loop", default="auto", choices=["auto", "asyncio", "uvloop"])
    parser.add_argument(
        "--gc",
        default="default",
        choices=["default", "freeze-start", "freeze"],
        help="freeze-start: gc.freeze() before the server starts (the import-time objects); "
        "freeze: gc.freeze() once the live table is built (full collections then skip "
        "its 1000 workers' state; see the GC pauses lines)",
    )
    args = parser.parse_args(argv)
    logging.getLogger("aiotimer").setLevel(logging.CRITICAL + 1)  # events are not the point
    args.timers = args.timers if args.timers is not None else (10_000 if args.quick else 100_000)
    args.samples = args.samples if args.samples is not None else (300 if args.quick else 3000)
    with asyncio.Runner(loop_factory=loop_factory(args.loop)) as runner:
        runner.run(amain(args))


if __name__ == "__main__":
    main()
