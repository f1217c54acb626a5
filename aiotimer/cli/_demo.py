"""``aiotimer demo``: a timer server, a few worker processes, and one that gets stuck.

What it shows, in about five seconds:

1. an embedded :class:`~aiotimer.server.TimerServer` on a temporary FIFO;
2. ``--workers`` worker processes, started with only ``AIOTIMER_FIFO`` in their
   environment (no ``configure()``: ``expires()`` discovers the server), each running a
   small async pipeline in which every item is processed inside
   ``async with expires(after=DEADLINE):``, with a nested block per stage;
3. after ``--hang-after`` seconds one worker calls ``time.sleep(3600)`` inside a
   coroutine — a stand-in for a C call that never returns. Its event loop is blocked,
   so no in-process timeout can fire; the server kills it when the item's deadline
   passes;
4. every event as it happens, and a summary. The exit status is 0 exactly when the
   stuck worker was reaped and every other worker finished all its items.

Run ``python -m aiotimer.cli._demo --worker ...`` only through the demo: that is a worker.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc

from aiotimer.client._expires import expires
from aiotimer.events import Event, TimerExpired, WorkerReaped, signal_name
from aiotimer.server._server import TimerServer
from aiotimer.server._thread import loop_factory
from aiotimer.wire import ENV_FIFO

__all__ = ["configure_parser", "main", "run_demo"]

_STUCK_MARK = "stuck"
_DONE_MARK = "finished"


# -- the worker ----------------------------------------------------------------------------


async def _pipeline(items: int, stage_time: float, deadline: float, hang_at: float | None) -> None:
    """Two consumers take items from a queue; each item is one timed block with two
    nested timed stages. At ``hang_at`` (monotonic) the next item blocks the loop."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(items):
        queue.put_nowait(n)

    async def consumer() -> None:
        while not queue.empty():
            n = queue.get_nowait()
            started = time.monotonic()
            async with expires(after=deadline):
                if hang_at is not None and started >= hang_at:
                    print(f"item {n}: {_STUCK_MARK} in a blocking call (time.sleep)", flush=True)
                    time.sleep(3600)  # a C call that never returns: the loop is blocked
                async with expires(after=deadline / 2):  # stage 1: fetch
                    await asyncio.sleep(stage_time * random.uniform(0.5, 1.5))
                async with expires(after=deadline / 2):  # stage 2: transform
                    await asyncio.sleep(stage_time * random.uniform(0.5, 1.5))
            print(f"item {n} done in {time.monotonic() - started:.2f}s", flush=True)

    async with anyio.create_task_group() as tg:
        tg.start_soon(consumer)
        tg.start_soon(consumer)
    print(f"{_DONE_MARK} {items} items", flush=True)


def _worker_main(args: argparse.Namespace) -> int:
    hang_at = None if args.hang_after is None else time.monotonic() + args.hang_after
    asyncio.run(_pipeline(args.items, args.stage_time, args.deadline, hang_at))
    return 0


# -- the demo ------------------------------------------------------------------------------


class _Style:
    """ANSI colours, only when stdout is a terminal and ``NO_COLOR`` is unset."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __call__(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.enabled else text


@dataclass
class _Worker:
    index: int
    stuck: bool
    process: anyio.abc.Process | None = None
    pid: int = 0
    items_done: int = 0
    finished: bool = False
    returncode: int | None = None
    reaped: list[WorkerReaped] = field(default_factory=list)
    expired: list[TimerExpired] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"worker {self.index}"


class _Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.style = _Style(sys.stdout.isatty() and "NO_COLOR" not in os.environ)
        self.t0 = time.monotonic()
        stuck = args.workers  # the last worker gets stuck
        self.workers = [_Worker(i, i == stuck) for i in range(1, args.workers + 1)]

    def say(self, text: str, code: str = "") -> None:
        stamp = self.style(f"+{time.monotonic() - self.t0:6.3f}s", "2")
        print(f"{stamp} {self.style(text, code) if code else text}", flush=True)

    def by_pid(self, pid: int) -> _Worker | None:
        return next((w for w in self.workers if w.pid == pid), None)

    def on_event(self, event: Event) -> None:
        worker = self.by_pid(getattr(event, "pid", 0))
        who = f"[{worker.name}] " if worker else ""
        code = "1;33" if isinstance(event, TimerExpired) else ""
        if isinstance(event, WorkerReaped):
            code = "1;31"
        if worker is not None and isinstance(event, WorkerReaped):
            worker.reaped.append(event)
        if worker is not None and isinstance(event, TimerExpired):
            worker.expired.append(event)
        self.say(f"server: {who}{event.describe()}", code)

    async def run(self) -> bool:
        args = self.args
        workdir = Path(tempfile.mkdtemp(prefix="aiotimer-demo-"))
        fifo = workdir / "timer.fifo"
        try:
            self.say(
                f"aiotimer demo: {args.workers} workers; every item must finish within "
                f"{args.deadline:g}s; worker {args.workers} will get stuck after "
                f"{args.hang_after:g}s",
                "1",
            )
            async with TimerServer(fifo=fifo, on_event=self.on_event):
                async with anyio.create_task_group() as tg:
                    for worker in self.workers:
                        await self.spawn(worker, fifo)
                        tg.start_soon(self.follow, worker)
                    with anyio.move_on_after(args.budget) as budget:
                        for worker in self.workers:
                            assert worker.process is not None
                            worker.returncode = await worker.process.wait()
                    if budget.cancelled_caught:
                        self.say(f"gave up after {args.budget:g}s; killing the workers", "1;31")
                        for worker in self.workers:
                            if worker.process is not None and worker.process.returncode is None:
                                worker.process.kill()
                                worker.returncode = await worker.process.wait()
                # Let the server report the exits it is noticing before it stops.
                await anyio.sleep(0.05)
        finally:
            for worker in self.workers:
                if worker.process is not None:
                    await worker.process.aclose()
            shutil.rmtree(workdir, ignore_errors=True)
        return self.summary()

    async def spawn(self, worker: _Worker, fifo: Path) -> None:
        args = self.args
        command = [
            sys.executable,
            "-m",
            "aiotimer.cli._demo",
            "--worker",
            f"--items={args.items}",
            f"--stage-time={args.stage_time}",
            f"--deadline={args.deadline}",
        ]
        if worker.stuck:
            command.append(f"--hang-after={args.hang_after}")
        # Only the discovery variable: the worker never calls configure().
        env = {**os.environ, ENV_FIFO: str(fifo), "PYTHONUNBUFFERED": "1"}
        worker.process = await anyio.open_process(command, env=env, stderr=None)
        worker.pid = worker.process.pid
        self.say(f"[{worker.name}] started, pid {worker.pid}", "36")

    async def follow(self, worker: _Worker) -> None:
        assert worker.process is not None and worker.process.stdout is not None
        buffered = b""
        async for chunk in worker.process.stdout:
            buffered += chunk
            *lines, buffered = buffered.split(b"\n")
            for raw in lines:
                line = raw.decode(errors="replace")
                if " done in " in line:
                    worker.items_done += 1
                    self.say(f"[{worker.name}] {line}", "2")
                elif line.startswith(_DONE_MARK):
                    worker.finished = True
                    self.say(f"[{worker.name}] {line}", "32")
                elif _STUCK_MARK in line:
                    self.say(f"[{worker.name}] {line}", "1;35")
                else:
                    self.say(f"[{worker.name}] {line}")

    def summary(self) -> bool:
        print()
        print(self.style("summary", "1"))
        ok = True
        for w in self.workers:
            if w.stuck:
                killed = w.returncode == -signal.SIGKILL and bool(w.reaped)
                outcome = (
                    f"stuck, reaped with {signal_name(w.reaped[0].signal)} "
                    f"({w.expired[0].late * 1000:.1f} ms after its deadline)"
                    if killed and w.expired
                    else f"stuck, NOT reaped (exit status {w.returncode})"
                )
                good = killed
            else:
                good = w.finished and w.returncode == 0 and not w.reaped
                outcome = (
                    f"finished all {w.items_done} items"
                    if good
                    else f"did not finish (exit status {w.returncode}, {w.items_done} items)"
                )
            ok = ok and good
            mark = self.style("ok  ", "32") if good else self.style("FAIL", "1;31")
            print(f"  {mark} {w.name} (pid {w.pid}): {outcome}")
        verdict = (
            "the stuck worker was reaped; the others were left alone"
            if ok
            else "something went wrong (see above)"
        )
        print(self.style(verdict, "1;32" if ok else "1;31"))
        return ok


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add the demo's options to ``parser`` (used by ``aiotimer demo``)."""
    parser.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    parser.add_argument(
        "--hang-after",
        type=_positive,
        default=0.5,
        metavar="SECONDS",
        help="when the last worker gets stuck, counted from its start (default 0.5)",
    )
    parser.add_argument(
        "--deadline",
        type=_positive,
        default=2.0,
        metavar="SECONDS",
        help="each item's expires(after=...) (default 2.0)",
    )
    parser.add_argument("--items", type=int, default=8, help="items per worker (default 8)")
    parser.add_argument(
        "--stage-time",
        type=_positive,
        default=0.1,
        metavar="SECONDS",
        help="mean duration of each of an item's two stages (default 0.1)",
    )
    parser.add_argument(
        "--budget",
        type=_positive,
        default=30.0,
        metavar="SECONDS",
        help="give up (exit 1) if the workers are not done by then (default 30)",
    )


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo described by parsed ``args``; 0 when the stuck worker was reaped and
    every other worker finished, 1 otherwise."""
    if args.workers < 1 or args.items < 1:
        print("aiotimer demo: --workers and --items must be at least 1", file=sys.stderr)
        return 2
    # The demo prints every event itself; keep the server's log records off stderr.
    logging.getLogger("aiotimer").addHandler(logging.NullHandler())
    with asyncio.Runner(loop_factory=loop_factory("auto")) as runner:
        ok = runner.run(_Demo(args).run())
    return 0 if ok else 1


def _worker_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m aiotimer.cli._demo --worker")
    parser.add_argument("--items", type=int, required=True)
    parser.add_argument("--stage-time", type=_positive, required=True)
    parser.add_argument("--deadline", type=_positive, required=True)
    parser.add_argument("--hang-after", type=_positive, default=None)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m aiotimer.cli._demo``: the demo (or, with a first argument ``--worker``, one
    of its workers)."""
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["--worker"]:
        return _worker_main(_worker_parser().parse_args(given[1:]))
    parser = argparse.ArgumentParser(prog="aiotimer demo", description=__doc__.split("\n")[0])
    configure_parser(parser)
    return run_demo(parser.parse_args(given))


if __name__ == "__main__":
    sys.exit(main())
