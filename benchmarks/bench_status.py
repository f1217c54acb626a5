"""What a status request costs the server's event loop, with many live timers.

Run::

    python -m benchmarks.bench_status                 # 100k timers over 1,000 workers
    python -m benchmarks.bench_status --quick         # 10k timers

A server runs in this process with a recording reaper (nothing is signalled) and
``N`` live timers an hour away. A client *process* sends sequential HTTP requests over
the control socket; the figure is the CPU time of the *loop's* thread over the batch
(``time.thread_time``: accept, parse, snapshot, encode, send, close; the loop has
nothing else to do) divided by the number of requests, i.e. the time the server could
not spend on expiry. Best and worst of three batches. The longest synchronous
step (the snapshot and its encoding, one uninterrupted callback) is timed on its own
(thread CPU time, median and max).
The same requests against an empty server, in the same run, are the reference: the
ratio shows how little the table's size matters (lists are cut at ``--limit``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import anyio
import msgspec

from aiotimer.control import ControlPlane
from aiotimer.control.snapshot import DEFAULT_LIMIT, status_snapshot
from aiotimer.server import TimerServer, loop_factory
from aiotimer.testing import MemorySource, RecordingReaper
from benchmarks._util import format_table

__all__ = ["main"]


CLIENT = r"""
import sys
from aiotimer.control import ControlClient
client = ControlClient(sys.argv[1])
for _ in range(int(sys.argv[3])):
    client.get(sys.argv[2])
"""


def run_client(path: Path, target: str, requests: int) -> None:
    """Send ``requests`` sequential GETs of ``target`` from another process."""
    subprocess.run([sys.executable, "-c", CLIENT, str(path), target, str(requests)], check=True)


async def measure(
    timers: int, workers: int, requests: int, limit: int, rounds: int = 3
) -> dict[str, tuple[float, float]]:
    """Per endpoint: (best, worst) over ``rounds`` of the loop-thread CPU seconds per
    request, plus the longest synchronous step under the key ``"snapshot step"``
    (median, max)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "http.sock"
        server = TimerServer(sources=[MemorySource()], reaper=RecordingReaper())
        async with server, ControlPlane(server, path=path):
            for i in range(timers):
                server.acquire(f"scope-{i}", 3600 + i * 1e-3, pid=10_000 + i % max(1, workers))
            out: dict[str, tuple[float, float]] = {}
            for name, target in (
                ("GET /v1/state", f"/v1/state?limit={limit}"),
                ("GET /metrics", "/metrics"),
            ):
                per_request = []
                for _ in range(rounds):
                    t0 = time.thread_time()
                    await anyio.to_thread.run_sync(run_client, path, target, requests)
                    per_request.append((time.thread_time() - t0) / requests)
                out[name] = (min(per_request), max(per_request))
            steps = []
            for _ in range(requests):
                t0 = time.thread_time()
                msgspec.json.encode(status_snapshot(server.snapshot(limit, sites=limit)))
                steps.append(time.thread_time() - t0)
            out["snapshot step"] = (statistics.median(steps), max(steps))
            assert server.snapshot(0).document.timers_total == timers
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Print the table; return 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--timers", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=1_000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help="the list limit")
    parser.add_argument("--quick", action="store_true", help="10k timers, 5 requests a batch")
    parser.add_argument(
        "--loop",
        default="auto",
        choices=["auto", "asyncio", "uvloop"],
        help="event loop (default: auto, i.e. uvloop when installed, as aiotimer serve)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.timers, args.requests = 10_000, 5
    factory = loop_factory(args.loop)
    with asyncio.Runner(loop_factory=factory) as runner:
        empty = runner.run(measure(0, 0, args.requests, args.limit))
    with asyncio.Runner(loop_factory=factory) as runner:
        full = runner.run(measure(args.timers, args.workers, args.requests, args.limit))
    rows = [
        (
            name,
            f"{empty[name][0] * 1e3:.3f}",
            f"{full[name][0] * 1e3:.3f}",
            f"{full[name][1] * 1e3:.3f}",
            f"{full[name][0] / empty[name][0]:.1f}x" if empty[name][0] else "-",
        )
        for name in full
    ]
    print(
        f"loop-thread CPU per request, ms (best of 3 batches of {args.requests}); "
        f"{args.timers:,} timers over {args.workers:,} workers, limit {args.limit}, "
        f"{args.loop} loop; "
        f"load {os.getloadavg()[0]:.2f}"
    )
    print(
        format_table(
            ["request", "empty server", f"{args.timers:,} timers", "worst batch", "ratio"], rows
        )
    )
    state, scrape = full["GET /v1/state"][0], full["GET /metrics"][0]
    print(
        f"a status call (GET /v1/state) costs the loop {state * 1e3:.3f} ms (target < 1 ms); "
        f"a metrics scrape {scrape * 1e3:.3f} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
