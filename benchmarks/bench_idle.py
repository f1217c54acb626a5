"""Idle wake-ups: how often an idle server (FIFO open, no timers) makes its loop turn.

Run::

    python -m benchmarks.bench_idle            # 5 s window
    python -m benchmarks.bench_idle --quick    # 1 s window

aiotimer's figure is the number of event-loop iterations during the window (counted by
wrapping the asyncio selector's ``select``; the benchmark therefore runs the stdlib
asyncio loop) plus the server's own ``wakeups`` counter. The reference, when torch is
importable, is torch's ``FileTimerServer`` at ``max_interval=0.1`` over the same window
(counted as calls of its watchdog step, after one client has connected, since before
that torch's thread is blocked in ``open()``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import selectors
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiotimer.server import TimerServer
from benchmarks._util import format_table


async def count_iterations(window: float) -> int:
    """Event-loop iterations (selector ``select`` calls) while idling for ``window`` s.

    The idling is a ``time.sleep`` in an executor thread (an ``asyncio.sleep`` would
    itself wake the loop); fetching its result costs a fixed iteration or two, which
    the bare-loop baseline measured the same way cancels out.
    """
    loop = asyncio.get_running_loop()
    selector: selectors.BaseSelector = loop._selector  # type: ignore[attr-defined]
    original = selector.select
    calls = 0

    def counting_select(timeout: float | None = None) -> list[Any]:
        nonlocal calls
        calls += 1
        return original(timeout)

    selector.select = counting_select  # type: ignore[method-assign]
    try:
        await loop.run_in_executor(None, time.sleep, window)
    finally:
        selector.select = original  # type: ignore[method-assign]
    return calls


async def aiotimer_idle(fifo: Path, window: float) -> tuple[int, int, int]:
    """(bare-loop iterations, server-loop iterations, expiry wake-ups) over ``window`` s."""
    baseline = await count_iterations(window)
    async with TimerServer(fifo=fifo) as server:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # a client connects and leaves
        os.close(fd)
        await asyncio.sleep(0.1)  # let the start-up settle
        iterations = await count_iterations(window)
        wakeups = server.snapshot(0, sites=0).counters.wakeups
    return baseline, iterations, wakeups


def torch_idle(fifo: Path, window: float) -> int | None:
    """Watchdog steps of torch's FileTimerServer(max_interval=0.1) over ``window`` s."""
    if importlib.util.find_spec("torch") is None:
        return None
    from torch.distributed.elastic.timer import (  # type: ignore[attr-defined]  # noqa: PLC0415
        FileTimerServer,
    )

    server = FileTimerServer(str(fifo), run_id="bench", max_interval=0.1)
    steps = 0
    original = server._run_watchdog
    lock = threading.Lock()

    def counting(fd: Any) -> None:
        nonlocal steps
        with lock:
            steps += 1
        original(fd)

    server._run_watchdog = counting  # type: ignore[method-assign]
    server.start()
    fd = os.open(fifo, os.O_WRONLY)  # unblocks torch's open(); then EOF as a client closes
    os.close(fd)
    time.sleep(0.2)
    with lock:
        steps = 0
    time.sleep(window)
    with lock:
        counted = steps
    server.stop()
    return counted


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 s window instead of 5 s")
    parser.add_argument("--window", type=float, default=None, help="seconds to observe")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch reference")
    args = parser.parse_args(argv)
    window = args.window if args.window is not None else (1.0 if args.quick else 5.0)
    with tempfile.TemporaryDirectory() as tmp:
        baseline, raw, wakeups = asyncio.run(aiotimer_idle(Path(tmp) / "a.fifo", window))
        torch_steps = None if args.no_torch else torch_idle(Path(tmp) / "t.fifo", window)
    iterations = raw - baseline
    print(f"loop iterations: {raw} with the server, {baseline} for a bare loop (baseline)")
    rows = [["aiotimer (loop iterations)", str(iterations), f"{iterations / window:.1f}"]]
    rows.append(["aiotimer (expiry wake-ups)", str(wakeups), f"{wakeups / window:.1f}"])
    if torch_steps is not None:
        rows.append(
            ["torch FileTimerServer, 0.1 s", str(torch_steps), f"{torch_steps / window:.1f}"]
        )
    print(f"idle wake-ups over {window:g} s, no timers, one client connected earlier")
    print(format_table(["server", "wake-ups", "per s"], rows))
    print(f"target 0: {'OK' if iterations == 0 and wakeups == 0 else 'ABOVE TARGET'}")


if __name__ == "__main__":
    main()
