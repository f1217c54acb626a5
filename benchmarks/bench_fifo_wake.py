"""The FIFO source's cost per wake-up: one line per wake, as when a server keeps up.

Run from the repository root::

    python -m benchmarks.bench_fifo_wake            # 20k wake-ups, best of 5, both loops
    python -m benchmarks.bench_fifo_wake --quick

A :class:`~aiotimer.sources.FifoSource` feeds a sink that only counts (reading at every
line, ``read_interval=0``, not once per interval as a trickle). The benchmark writes one
torch-format line to the FIFO, then waits (an ``asyncio.Event`` the sink sets) until
the source has delivered it, and again: every line costs the reader one wake-up, one
``read(2)`` and one batch. The reference in the same run is the same round trip through
a bare reader (the loop's ``add_reader`` callback reading the pipe, no decoding), so
the column to read is the difference: what the source adds per wake-up, in microseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import anyio
import uvloop

from aiotimer.sources import FifoSource
from aiotimer.wire import Decoded
from benchmarks._util import format_table

LINE = (
    b'{"version": 1, "pid": 4242, "scope_id": "train.py#42", "expiration_time": -1, "signal": 0}\n'
)


class _Sink:
    def __init__(self) -> None:
        self.event = asyncio.Event()

    def submit(self, batch: Decoded, source: str) -> None:
        self.event.set()


async def _source_round_trips(path: Path, n: int) -> float:
    sink = _Sink()
    async with anyio.create_task_group() as tg:
        await tg.start(FifoSource(path, read_interval=0).serve, sink)
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        try:
            start = time.perf_counter()
            for _ in range(n):
                sink.event.clear()
                os.write(fd, LINE)
                await sink.event.wait()
            elapsed = time.perf_counter() - start
        finally:
            os.close(fd)
        tg.cancel_scope.cancel()
    return elapsed


async def _bare_round_trips(n: int) -> float:
    loop = asyncio.get_running_loop()
    rfd, wfd = os.pipe()
    os.set_blocking(rfd, False)
    event = asyncio.Event()

    def readable() -> None:
        os.read(rfd, 65536)
        event.set()

    loop.add_reader(rfd, readable)
    try:
        start = time.perf_counter()
        for _ in range(n):
            event.clear()
            os.write(wfd, LINE)
            await event.wait()
        return time.perf_counter() - start
    finally:
        loop.remove_reader(rfd)
        os.close(rfd)
        os.close(wfd)


def _run(loop: str, coro: Callable[[], Coroutine[Any, Any, float]]) -> float:
    if loop == "uvloop":
        return uvloop.run(coro())
    return asyncio.run(coro())


def main(argv: Sequence[str] | None = None) -> int:
    """Print per-wake microseconds of the FIFO source and of a bare reader."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wakes", type=int, default=20_000, help="wake-ups per run (20k)")
    parser.add_argument("--repeat", type=int, default=5, help="runs, best kept (5)")
    parser.add_argument("--quick", action="store_true", help="small and one run")
    args = parser.parse_args(argv)
    n, repeat = (2_000, 1) if args.quick else (args.wakes, args.repeat)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "wake.fifo"
        for loop in ("asyncio", "uvloop"):
            source = min(_run(loop, lambda: _source_round_trips(path, n)) for _ in range(repeat))
            bare = min(_run(loop, lambda: _bare_round_trips(n)) for _ in range(repeat))
            rows.append(
                [
                    loop,
                    f"{source / n * 1e6:.1f}",
                    f"{bare / n * 1e6:.1f}",
                    f"{(source - bare) / n * 1e6:.1f}",
                ]
            )
    print(f"FIFO source, one line per wake-up: {n:,} wake-ups, best of {repeat}")
    print(format_table(["loop", "source us/wake", "bare us/wake", "source adds"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
