"""What ``loop_watchdog()`` costs a healthy event loop.

Run from the repository root::

    python -m benchmarks.bench_loop_watchdog            # about 10 s
    python -m benchmarks.bench_loop_watchdog --quick    # about 2 s

An idle asyncio loop (one task sleeping) runs for ``--seconds`` with and without a
``loop_watchdog(stall_after)`` whose kicks go into a FIFO drained by a reader process
(as in ``bench_client``). The figure is the loop thread's CPU time per second of loop
time, with and without the watchdog, and their difference per kick sent.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence

from aiotimer.client import FifoClient
from aiotimer.watchdog import loop_watchdog
from benchmarks.bench_client import draining_fifo


async def _idle(seconds: float, client: FifoClient | None, stall_after: float) -> tuple[float, int]:
    """Thread CPU seconds spent while the loop idles ``seconds``; kicks sent."""
    start = time.thread_time()
    if client is None:
        await asyncio.sleep(seconds)
        return time.thread_time() - start, 0
    async with loop_watchdog(stall_after, client=client, scope="bench-loop") as lw:
        await asyncio.sleep(seconds)
    return time.thread_time() - start, lw._watchdog.sent


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print its figures; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--seconds", type=float, default=None, help="loop time per case")
    parser.add_argument("--stall-after", type=float, default=1.0, help="the watchdog's limit")
    args = parser.parse_args(argv)
    seconds = args.seconds or (0.5 if args.quick else 4.0)
    with draining_fifo() as fifo, FifoClient(fifo) as client:
        # Warm up: connect the client, load what the first use loads.
        asyncio.run(_idle(0.1, client, args.stall_after))
        bare, _ = asyncio.run(_idle(seconds, None, args.stall_after))
        watched, kicks = asyncio.run(_idle(seconds, client, args.stall_after))
    extra = watched - bare
    print(
        f"idle loop, {seconds:g} s per case, loop_watchdog(stall_after={args.stall_after:g}): "
        f"{bare / seconds * 1e6:.0f} us CPU per second without, "
        f"{watched / seconds * 1e6:.0f} with ({kicks} kicks sent: "
        f"{extra / max(kicks, 1) * 1e6:.0f} us per kick, "
        f"{extra / seconds * 100:.3f} % of one core)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
