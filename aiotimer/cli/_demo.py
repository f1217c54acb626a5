"""``aiotimer demo``: a timer server, a few worker processes, one slow item and one
worker that gets stuck.

What it shows, in about six seconds (the two tiers of an ``async with`` block):

1. an embedded :class:`~aiotimer.server.TimerServer` on a temporary FIFO;
2. ``--workers`` worker processes, started with only ``AIOTIMER_FIFO`` in their
   environment (no ``configure()``: ``expires()`` discovers the server), each running a
   small async pipeline in which every item is processed inside
   ``async with expires(after=DEADLINE, kill_after=KILL_AFTER):``, with a nested block
   per stage;
3. the first tier: in worker 1, item ``--slow-item`` waits on a slow upstream; at its
   deadline its task is cancelled, ``TimeoutError`` comes out of the block, the item is
   skipped and the pipeline goes on (the server reports ``block_cancelled``);
4. the second tier: after ``--hang-after`` seconds the last worker calls
   ``time.sleep(3600)`` inside a coroutine, a stand-in for a C call that never returns.
   Its event loop is blocked, so no cancellation can run; ``KILL_AFTER`` seconds after
   the first deadline among its open blocks (the other task's stage, ``DEADLINE / 2``)
   the server asks for its stacks (which name the task holding the loop) and kills it;
5. every event as it happens, and a summary. The exit status is 0 exactly when the
   stuck worker was reaped and every other worker handled all its items.

``main(["--worker", ...])`` is what the demo runs in each worker process.
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

from aiotimer.cli._args import one_line_errors, positive
from aiotimer.client import expires
from aiotimer.core import format_seconds
from aiotimer.events import BlockCancelled, Event, TimerExpired, WorkerReaped, signal_name
from aiotimer.server import TimerServer, loop_factory
from aiotimer.wire import ENV_FIFO

__all__ = ["configure_parser", "main", "run_demo"]

_STUCK_MARK = "stuck"
_DONE_MARK = "finished"
_TIMED_OUT_MARK = "timed out"


# -- the worker ----------------------------------------------------------------------------


async def _pipeline(args: argparse.Namespace, hang_at: float | None) -> None:
    """Two consumers take items from a queue; each item is one timed block with two
    nested timed stages. Item ``args.slow_item`` outlives its deadline (if given); at
    ``hang_at`` (monotonic) the next item blocks the loop."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(args.items):
        queue.put_nowait(n)
    deadline, kill_after, stage_time = args.deadline, args.kill_after, args.stage_time

    async def consumer() -> None:
        while not queue.empty():
            n = queue.get_nowait()
            started = time.monotonic()
            try:
                async with expires(after=deadline, kill_after=kill_after):
                    if hang_at is not None and started >= hang_at:
                        print(
                            f"item {n}: {_STUCK_MARK} in a blocking call (time.sleep)", flush=True
                        )
                        time.sleep(3600)  # a C call that never returns: the loop is blocked
                    if n == args.slow_item:
                        print(f"item {n}: waiting on a slow upstream", flush=True)
                        await asyncio.sleep(deadline * 10)  # outlives the deadline
                    async with expires(after=deadline / 2, kill_after=kill_after):  # fetch
                        await asyncio.sleep(stage_time * random.uniform(0.5, 1.5))
                    async with expires(after=deadline / 2, kill_after=kill_after):  # transform
                        await asyncio.sleep(stage_time * random.uniform(0.5, 1.5))
            except TimeoutError:
                took = time.monotonic() - started
                print(f"item {n} {_TIMED_OUT_MARK} after {took:.2f}s (TimeoutError): skipped")
                continue
            print(f"item {n} done in {time.monotonic() - started:.2f}s", flush=True)

    async with anyio.create_task_group() as tg:
        tg.start_soon(consumer, name="consumer-1")  # the name is in each block's scope id
        tg.start_soon(consumer, name="consumer-2")
    print(f"{_DONE_MARK} {args.items} items", flush=True)


def _worker_main(args: argparse.Namespace) -> int:
    hang_at = None if args.hang_after is None else time.monotonic() + args.hang_after
    asyncio.run(_pipeline(args, hang_at))
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
    slow_item: int | None
    process: anyio.abc.Process | None = None
    pid: int = 0
    items_done: int = 0
    items_timed_out: int = 0
    finished: bool = False
    returncode: int | None = None
    reaped: list[WorkerReaped] = field(default_factory=list)
    expired: list[TimerExpired] = field(default_factory=list)
    cancelled: list[BlockCancelled] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"worker {self.index}"


class _StdoutGone(Exception):
    """Whoever read the demo's output stopped reading (``aiotimer demo | head``)."""


class _Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.style = _Style(sys.stdout.isatty() and "NO_COLOR" not in os.environ)
        self.t0 = time.monotonic()
        self.gone = False  # stdout was closed: finish quietly
        self.scope: anyio.CancelScope | None = None
        stuck = args.workers  # the last worker gets stuck; the first has the slow item
        slow = None if args.slow_item < 0 or stuck == 1 else args.slow_item
        self.workers = [
            _Worker(i, i == stuck, slow if i == 1 else None) for i in range(1, args.workers + 1)
        ]

    def say(self, text: str, code: str = "") -> None:
        stamp = self.style(f"+{time.monotonic() - self.t0:6.3f}s", "2")
        self.write(f"{stamp} {self.style(text, code) if code else text}")

    def write(self, line: str) -> None:
        """Print ``line``; once stdout is closed, print nothing more and end the demo."""
        if self.gone:
            return
        try:
            print(line, flush=True)
        except BrokenPipeError:
            # Nothing may be printed any more, not even by the interpreter's last flush.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
            self.gone = True
            if self.scope is not None:
                self.scope.cancel()

    def by_pid(self, pid: int) -> _Worker | None:
        return next((w for w in self.workers if w.pid == pid), None)

    def on_event(self, event: Event) -> None:
        worker = self.by_pid(getattr(event, "pid", 0))
        who = f"[{worker.name}] " if worker else ""
        code = "1;33" if isinstance(event, TimerExpired | BlockCancelled) else ""
        if isinstance(event, WorkerReaped):
            code = "1;31"
        if worker is not None:
            if isinstance(event, WorkerReaped):
                worker.reaped.append(event)
            elif isinstance(event, TimerExpired):
                worker.expired.append(event)
            elif isinstance(event, BlockCancelled):
                worker.cancelled.append(event)
        self.say(f"server: {who}{event.describe()}", code)

    def intro(self) -> None:
        args, last = self.args, self.workers[-1]
        self.say(
            f"aiotimer demo: {args.workers} workers; each item runs in async with "
            f"expires(after={args.deadline:g}, kill_after={args.kill_after:g})",
            "1",
        )
        self.say(
            f"  at {args.deadline:g}s an item's task is cancelled (TimeoutError) and the "
            f"pipeline goes on; a worker whose item has not ended {args.kill_after:g}s "
            "later (its loop is blocked) is reaped"
        )
        slow = self.workers[0].slow_item
        if slow is not None:
            self.say(f"  worker 1's item {slow} waits on a slow upstream: it times out")
        first = args.deadline / 2  # a stage's: the first deadline among its open blocks
        self.say(
            f"  {last.name} blocks its event loop {args.hang_after:g}s after it starts: no "
            f"task of it can be cancelled, and it is reaped {args.kill_after:g}s "
            f"(kill_after) after the first deadline among its open blocks (another task's "
            f"stage, {first:g}s): about {first + args.kill_after:g}s later"
        )

    async def run(self) -> bool:
        workdir = Path(tempfile.mkdtemp(prefix="aiotimer-demo-"))
        fifo = workdir / "timer.fifo"
        try:
            with anyio.CancelScope() as self.scope:
                self.intro()
                async with TimerServer(fifo=fifo, on_event=self.on_event):
                    await self.supervise(fifo)
                    # Let the server report the exits it is noticing before it stops.
                    await anyio.sleep(0.05)
        finally:
            with anyio.CancelScope(shield=True):
                for worker in self.workers:
                    if worker.process is not None:
                        if worker.process.returncode is None:
                            worker.process.kill()
                        await worker.process.aclose()
            shutil.rmtree(workdir, ignore_errors=True)
        return self.summary()

    async def supervise(self, fifo: Path) -> None:
        """Start every worker, follow its output, and wait for all to end (killing them
        past ``--budget``)."""
        args = self.args
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

    async def spawn(self, worker: _Worker, fifo: Path) -> None:
        args = self.args
        command = [
            sys.executable,
            "-c",  # not -m: the package imports this module first
            "import sys; from aiotimer.cli._demo import main; sys.exit(main())",
            "--worker",
            f"--items={args.items}",
            f"--stage-time={args.stage_time}",
            f"--deadline={args.deadline}",
            f"--kill-after={args.kill_after}",
        ]
        if worker.stuck:
            command.append(f"--hang-after={args.hang_after}")
        if worker.slow_item is not None:
            command.append(f"--slow-item={worker.slow_item}")
        # Only the discovery variable: the worker never calls configure().
        env = {**os.environ, ENV_FIFO: str(fifo), "PYTHONUNBUFFERED": "1"}
        # Ctrl-C is the demo's to handle (it stops its workers): each worker runs in a
        # session of its own, which a terminal's Ctrl-C does not reach, so none prints a
        # traceback of its own; the demo kills them when it ends, whatever ends it.
        worker.process = await anyio.open_process(
            command, env=env, stderr=None, start_new_session=True
        )
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
                elif f" {_TIMED_OUT_MARK} " in line:
                    worker.items_timed_out += 1
                    self.say(f"[{worker.name}] {line}", "33")
                elif line.startswith(_DONE_MARK):
                    worker.finished = True
                    self.say(f"[{worker.name}] {line}", "32")
                elif _STUCK_MARK in line:
                    self.say(f"[{worker.name}] {line}", "1;35")
                else:
                    self.say(f"[{worker.name}] {line}")

    def summary(self) -> bool:
        if self.gone:
            return False
        self.write("")
        self.write(self.style("summary", "1"))
        ok = True
        for w in self.workers:
            good, outcome = self.outcome(w)
            ok = ok and good
            mark = self.style("ok  ", "32") if good else self.style("FAIL", "1;31")
            self.write(f"  {mark} {w.name} (pid {w.pid}): {outcome}")
        verdict = (
            "the stuck worker was reaped; the others were left alone"
            if ok
            else "something went wrong (see above)"
        )
        self.write(self.style(verdict, "1;32" if ok else "1;31"))
        return ok and not self.gone

    def outcome(self, w: _Worker) -> tuple[bool, str]:
        """Whether worker ``w`` did what the demo expects of it, and what it did."""
        if w.stuck:
            if w.returncode == -signal.SIGKILL and w.reaped and w.expired:
                late = format_seconds(w.expired[0].late)
                return True, (
                    f"stuck, reaped with {signal_name(w.reaped[0].signal)} {late} after "
                    f"its reap deadline, {self.args.kill_after:g}s (kill_after) after the "
                    "first deadline among its open blocks"
                )
            return False, f"stuck, NOT reaped (exit status {w.returncode})"
        items = w.items_done + w.items_timed_out
        good = (
            w.finished
            and w.returncode == 0
            and not w.reaped
            and items == self.args.items
            and w.items_timed_out == (w.slow_item is not None)
        )
        if not good:
            return False, f"did not finish (exit status {w.returncode}, {items} items)"
        if w.items_timed_out:
            return True, (
                f"handled all {items} items: {w.items_done} done, {w.items_timed_out} timed "
                "out at its deadline (TimeoutError; the server saw it cancelled) and skipped"
            )
        return True, f"finished all {items} items"


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add the demo's options to ``parser`` (used by ``aiotimer demo``)."""
    one_line_errors(parser)
    parser.add_argument("--workers", type=positive, default=4, help="worker processes (default 4)")
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
        help="each item's expires(after=...): its task is cancelled then (default 2.0)",
    )
    parser.add_argument(
        "--kill-after",
        type=_positive,
        default=2.0,
        metavar="SECONDS",
        help="each item's expires(kill_after=...): a worker whose item has not ended this "
        "long after its deadline is reaped (default 2.0; the library's default is 5)",
    )
    parser.add_argument(
        "--slow-item",
        type=int,
        default=3,
        metavar="N",
        help="the item of worker 1 that outlives its deadline (default 3; -1: none)",
    )
    parser.add_argument("--items", type=positive, default=8, help="items per worker (default 8)")
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


#: The exit status when stdout was closed early (``aiotimer demo | head``): that of a
#: process ended by SIGPIPE, as a plain writer would be.
EXIT_STDOUT_GONE = 128 + signal.SIGPIPE


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo described by parsed ``args``; 0 when the stuck worker was reaped and
    every other worker handled its items, 1 otherwise, 141 when stdout was closed."""
    # The demo prints every event itself; keep the server's log records off stderr.
    logging.getLogger("aiotimer").addHandler(logging.NullHandler())
    demo = _Demo(args)
    with asyncio.Runner(loop_factory=loop_factory("auto")) as runner:
        ok = runner.run(demo.run())
    if demo.gone:
        return EXIT_STDOUT_GONE
    return 0 if ok else 1


def _worker_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aiotimer demo worker")
    parser.add_argument("--items", type=int, required=True)
    parser.add_argument("--stage-time", type=_positive, required=True)
    parser.add_argument("--deadline", type=_positive, required=True)
    parser.add_argument("--kill-after", type=_positive, required=True)
    parser.add_argument("--hang-after", type=_positive, default=None)
    parser.add_argument("--slow-item", type=int, default=None)
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
