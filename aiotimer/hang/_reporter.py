"""Hang reports: every rank's stacks, taken before anything of a group restart is killed.

When a worker's timer expires under a group (or job) restart scope, the server's reap of
it is about to begin: the kill of one rank wakes the others out of their collective with
an error, and their stacks are lost. So the supervisor's reaper hands the reap's first
action to :meth:`HangReporter.begin` *first*: it signals every other live rank's dump
hook at once (a short blocking read of each dump file's header, then the signal), and
only then does the reap proceed. A task reads the dumps (``py-spy`` for a worker without
the hook), waits for the reaped rank's own dump, which its reap takes before the kill
(:meth:`HangReporter.reap_policy`: the server's policy under the group scope), all
within ``timeout`` seconds, and groups them with the pure
:func:`~aiotimer.hang.build_report`. A worker that does not answer in time
(stopped, stuck in C code before the dump hook ran, no hook and no py-spy) is reported as
such. The restart waits for the report, never past the bound (:meth:`settle`). A job
restart that no local expiry began (another node's) takes its report when it starts.

The report goes to a ``hang_report`` event, to ``<event log>.hang.txt`` and
``.hang.json`` beside the event log (else ``hang-report.txt``/``.json`` in the run's
private runtime directory, removed with it), and stays as :attr:`HangReporter.last` for
``aiotimer status`` and the control API.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import signal
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol

import anyio
import anyio.abc
import anyio.to_thread

from aiotimer._edges.clock import Clock
from aiotimer._edges.files import write_atomic
from aiotimer.core import Timer
from aiotimer.events import Event, HangReported
from aiotimer.hang._report import HangReport, RankStacks, build_report
from aiotimer.reapers import (
    DumpStacks,
    NoDump,
    ReapPolicy,
    Step,
    prepare_dump,
    py_spy_dump_or_why,
    read_dump_or_why,
)
from aiotimer.wire import DEFAULT_DUMP_SIGNAL

if TYPE_CHECKING:
    from aiotimer.server import TimerServer


class RankProcess(Protocol):
    """What a hang report needs of a rank's running process (the supervisor's attempt)."""

    @property
    def pid(self) -> int:
        """The worker's pid."""
        ...

    @property
    def pidfd(self) -> int | None:
        """A pidfd of the worker, where the OS has them."""
        ...

    @property
    def timer_pids(self) -> Set[int]:
        """The other processes of the rank that hold timers."""
        ...

    @property
    def expired(self) -> tuple[str, ...]:
        """The scopes of the rank's timers that expired."""
        ...

    def exited(self) -> bool:
        """Whether the process has exited."""
        ...


__all__ = [
    "DEFAULT_HANG_REPORT_TIMEOUT",
    "DumpFirstPolicy",
    "HangReporter",
    "RankProcess",
    "open_scopes",
]

logger = logging.getLogger("aiotimer")

#: Seconds a restart may wait for the ranks' stacks. A restart of a training job costs
#: minutes (relaunch, rendezvous, reload a checkpoint); ten more seconds buy the one
#: record that says which rank hung, and give a dump hook time to finish even when the
#: worker's main thread is busy (py-spy takes about a second on a large process).
DEFAULT_HANG_REPORT_TIMEOUT: Final[float] = 10.0
#: The share of the bound a dump may take; the rest assembles and writes the report.
_READ_SHARE: Final[float] = 0.9


class DumpFirstPolicy(ReapPolicy):
    """``inner``'s plans, each reap of a rank beginning with its stack dump (within
    ``dump_timeout`` seconds) unless the plan takes one already: under the group scope
    the reaped rank's stacks belong in the hang report, and its kill waits for them
    (the restart waits for the report anyway)."""

    __slots__ = ("_inner", "dump_timeout")

    def __init__(self, inner: ReapPolicy, dump_timeout: float) -> None:
        super().__init__(
            inner.default, shadow=inner.shadow, unkillable_after=inner.unkillable_after
        )
        self._inner = inner
        self.dump_timeout = dump_timeout

    def intended(self, timer: Timer) -> tuple[Step, ...]:
        """The inner policy's plan, a :class:`DumpStacks` first when it signals."""
        plan = self._inner.intended(timer)
        if not plan or any(isinstance(step, DumpStacks) for step in plan):
            return plan
        return (DumpStacks(self.dump_timeout), *plan)


@dataclass(slots=True)
class _Ask:
    rank: int
    pid: int
    blocks: tuple[str, ...]
    asked: tuple[Path, int] | NoDump
    reaped: bool = False  # the rank whose reap began the report


class HangReporter:
    """Takes and keeps the hang reports of one supervised run (see the module docs).

    Args:
        timeout: the most seconds one report may take.
        event_log: the run's event log (the reports are written beside it), if any.
        dump_dir: the workers' dump directory (see :func:`aiotimer.diagnostics.dump_path_for`).
        py_spy: fall back to ``py-spy dump`` for a worker without the dump hook.
        clock: the time source.
        emit: reports the ``hang_report`` event.

    Raises:
        ValueError: ``timeout`` is not a positive finite number.
    """

    def __init__(
        self,
        timeout: float = DEFAULT_HANG_REPORT_TIMEOUT,
        *,
        event_log: str | os.PathLike[str] | None = None,
        dump_dir: str | os.PathLike[str] | None = None,
        py_spy: bool = True,
        clock: Clock,
        emit: Callable[[Event], None],
    ) -> None:
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"the hang report timeout must be > 0 seconds, got {timeout!r}")
        self.timeout = timeout
        #: The workers' dump directory (``None``: the default one).
        self.dump_dir = dump_dir
        self._py_spy = py_spy
        self._clock = clock
        self._emit = emit
        self._event_log = event_log
        self._out: tuple[Path, str] | None = None
        self._armed = True  # no report taken for the running attempts yet
        self._done: anyio.Event | None = None  # set when the report in progress is out
        self._reaped: dict[int, str | NoDump | None] = {}  # pid -> its reap's dump
        self._reaped_in = anyio.Event()
        self._asks: list[_Ask] = []  # the report in progress's
        #: The last report, if any.
        self.last: HangReport | None = None

    def reap_policy(self, policy: ReapPolicy | None) -> ReapPolicy:
        """``policy`` (default: torch's one signal) with a dump before every reap, so
        the reaped rank's stacks come into the report (:class:`DumpFirstPolicy`)."""
        inner = policy if policy is not None else ReapPolicy()
        return DumpFirstPolicy(inner, self.timeout * _READ_SHARE)

    def place(self, runtime_dir: Path) -> None:
        """Write reports beside the event log, else into ``runtime_dir``."""
        if self._event_log is not None:
            log = Path(self._event_log)
            self._out = (log.parent, f"{log.name}.hang")
        else:
            self._out = (runtime_dir, "hang-report")

    def begin(
        self,
        tg: anyio.abc.TaskGroup,
        live: Mapping[int, RankProcess],
        scopes: Callable[[], Mapping[int, tuple[str, ...]]],
        *,
        cause: str,
        reaped: RankProcess | None = None,
        dumping: bool = False,
    ) -> None:
        """Signal the dump hook of every ``live`` worker but ``reaped`` (whose reap is
        about to begin; ``dumping``: with a dump that :meth:`reap_dumped` hands over),
        now, and read the dumps in a task of ``tg``; once per restart (:meth:`rearm`).
        ``scopes`` reads the open timers by pid (the ranks' open blocks)."""
        if not self._armed:
            return
        open_timers = scopes()
        self._armed = False
        self._done = anyio.Event()
        asks = []
        for rank, att in sorted(live.items()):
            if att.exited():
                continue
            open_ = (s for p in (att.pid, *att.timer_pids) for s in open_timers.get(p, ()))
            blocks = tuple(dict.fromkeys((*att.expired, *open_)))
            if att is reaped:
                why = "its timer's reap killed it first: the reap's plan took no stack dump"
                asks.append(_Ask(rank, att.pid, blocks, NoDump(why), reaped=dumping))
                continue
            asks.append(_Ask(rank, att.pid, blocks, self._signal(att)))
        self._asks = asks
        tg.start_soon(self._finish, asks, cause, self._clock.monotonic())

    def expired(self, pid: int, scope: str) -> None:
        """Worker ``pid``'s timer ``scope`` expired: an open block of its rank, which
        the server's table no longer lists."""
        for ask in self._asks:
            if ask.pid == pid and scope not in ask.blocks:
                ask.blocks = (scope, *ask.blocks)

    def _signal(self, att: RankProcess) -> tuple[Path, int] | NoDump:
        try:
            prepared = prepare_dump(att.pid, DEFAULT_DUMP_SIGNAL, self.dump_dir)
            if not isinstance(prepared, NoDump):
                if att.pidfd is not None:
                    signal.pidfd_send_signal(att.pidfd, DEFAULT_DUMP_SIGNAL)
                else:  # pragma: no cover - no pidfds: our own unreaped child, pid not reused
                    os.kill(att.pid, DEFAULT_DUMP_SIGNAL)
        except OSError as exc:
            return NoDump(f"the dump signal failed: {exc}")
        return prepared

    def reap_dumped(self, pid: int, result: str | NoDump | None) -> None:
        """The reap that began the report took ``pid``'s dump: ``result``."""
        self._reaped[pid] = result
        self._reaped_in.set()

    async def settle(self) -> None:
        """Wait for the report in progress, if any (it ends within the bound)."""
        if self._done is not None:
            with anyio.move_on_after(self.timeout + 1):
                await self._done.wait()

    def rearm(self) -> None:
        """The restart is carried out: the next expiry takes a new report."""
        self._armed = True
        self._reaped.clear()

    async def _finish(self, asks: list[_Ask], cause: str, started: float) -> None:
        got: dict[int, RankStacks] = {}
        budget = self.timeout * _READ_SHARE
        try:
            with anyio.move_on_after(self.timeout):
                async with anyio.create_task_group() as tg:
                    for ask in asks:
                        tg.start_soon(self._read, ask, budget, got)
            for ask in asks:
                got.setdefault(
                    ask.rank,
                    RankStacks(
                        rank=ask.rank,
                        pid=ask.pid,
                        blocks=ask.blocks,
                        missing=f"no answer within {self.timeout:g}s",
                    ),
                )
            report = build_report(list(got.values()), cause=cause)
            self.last = report
            text, files = await anyio.to_thread.run_sync(self._write, report)
            missing = tuple(sorted(r.rank for r in got.values() if r.missing is not None))
            self._emit(
                HangReported(
                    time=self._clock.time(),
                    summary=report.summary(),
                    ranks=report.size,
                    odd=report.odd,
                    missing=missing,
                    seconds=round(self._clock.monotonic() - started, 3),
                    files=files,
                    report=text,
                )
            )
        finally:
            assert self._done is not None
            self._done.set()

    async def _read(self, ask: _Ask, budget: float, got: dict[int, RankStacks]) -> None:
        started = anyio.current_time()
        result: str | NoDump | None
        if ask.reaped:
            while ask.pid not in self._reaped:
                self._reaped_in = anyio.Event()
                await self._reaped_in.wait()
            result = self._reaped[ask.pid]
            if result is None:
                result = NoDump("its reap's dump gave no reason")
        elif isinstance(ask.asked, NoDump):
            result = ask.asked
            left = budget - (anyio.current_time() - started)
            if self._py_spy and not ask.asked.reason.startswith("its timer's reap"):
                spied = await py_spy_dump_or_why(ask.pid, timeout=left)
                result = (
                    spied
                    if isinstance(spied, str)
                    else NoDump(f"{ask.asked.reason}; {spied.reason}")
                )
        else:
            # The thread stacks come from the signal handler at once; the asyncio tasks
            # and the end marker only once the main thread runs Python again, which a
            # rank waiting in C code (a collective) does not: read_dump takes what came
            # a moment (END_GRACE) after the first part.
            result = await read_dump_or_why(ask.asked, timeout=budget)
        if isinstance(result, str):
            # Parsed in a worker thread: a dump of many deep threads takes a while to read.
            got[ask.rank] = await anyio.to_thread.run_sync(
                functools.partial(
                    RankStacks.from_dump, ask.rank, ask.pid, result, blocks=ask.blocks
                )
            )
        else:
            got[ask.rank] = RankStacks(
                rank=ask.rank, pid=ask.pid, blocks=ask.blocks, missing=result.reason
            )

    def _write(self, report: HangReport) -> tuple[str, tuple[str, ...]]:
        """The report's text, and the files it was written to (in a worker thread)."""
        text = report.to_text()
        if self._out is None:
            return text, ()
        folder, stem = self._out
        text_path, json_path = folder / f"{stem}.txt", folder / f"{stem}.json"
        data = json.dumps({"text": text, **report.to_dict()}, indent=1)
        try:
            for path, body in ((text_path, text), (json_path, data)):
                write_atomic(path, body.encode(), 0o644, durable=False, what="hang report")
        except OSError as exc:
            logger.error("the hang report could not be written to %s: %s", folder, exc)
            return text, ()
        return text, (str(text_path), str(json_path))


def open_scopes(server: TimerServer | None, nproc: int) -> dict[int, tuple[str, ...]]:
    """The open timers' scopes by pid of ``server``'s workers (a bounded snapshot)."""
    if server is None:
        return {}
    workers = server.snapshot(4 * nproc + 8, sites=0).document.workers
    return {w.pid: w.scopes for w in workers if w.pid is not None}
