"""The server's engine as a pure machine (``server._machine``), driven directly on a
fake clock by a model of the shell: one source whose transport holds what the workers
wrote, read late (the loop stalls), and drained when the machine asks for input.

The properties: a release written before its timer's deadline is never applied after
that timer was acted on; nothing is acted on while a worker's input written before the
deadline is unread or a request for input is open; the caps hold."""

from __future__ import annotations

import itertools
import math
import signal
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest
from _pids import fake_pid
from hypothesis import given, settings
from hypothesis import strategies as st

from aiotimer.events import TimerExpired, WorkerExited, WorkerUnknown
from aiotimer.reapers._policy import ReapPolicy
from aiotimer.server._effects import (
    Acted,
    ActOn,
    Arm,
    JournalAcquired,
    JournalForgot,
    JournalReleased,
    MachineError,
    NeedInput,
    Pin,
    ProceedReap,
)
from aiotimer.server._machine import Machine
from aiotimer.wire import Decoded, Request

if TYPE_CHECKING:
    from aiotimer.server._effects import Effect


OWN = fake_pid(99)
WORKERS = [fake_pid(n) for n in (1, 2, 3, 4)]
SCOPES = ["a", "b", "c"]
WALL = 1e9  # the wall clock's offset from the monotonic one
KILL = int(signal.SIGKILL)


@dataclass(frozen=True, slots=True)
class Written:
    """A request as its worker wrote it into the transport."""

    id: int
    req: Request
    at: float


@dataclass(eq=False)
class World:
    """The shell, its clock and one source, as the machine sees them."""

    max_timers: int
    max_per_worker: int
    unknown: frozenset[int]  # workers the reaper cannot attach
    refused: frozenset[int]  # workers whose first signal is refused
    unpinned: frozenset[int] = frozenset()  # workers kept unpinned (out of descriptors)
    drains: bool = True
    now: float = 100.0
    buffer: list[Written] = field(default_factory=list)
    held: set[int] = field(default_factory=set)  # ids bounded by the last decision
    looking: frozenset[int] | bool | None = False  # the pass's pids; False: no pass
    reaping: set[int] = field(default_factory=set)
    begun: set[int] = field(default_factory=set)  # reaps begun, until they proceed
    acted: list[tuple[int, str, float, int]] = field(default_factory=list)
    acquire_ids: dict[tuple[int, str, float], int] = field(default_factory=dict)
    events: list[Effect] = field(default_factory=list)
    ids: itertools.count[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.machine = Machine(
            policy=ReapPolicy(),
            own_pid=OWN,
            own_uid=0,
            journal=True,
            max_timers=self.max_timers,
            max_timers_per_worker=self.max_per_worker,
        )
        self.machine.set_drains(1 if self.drains else 0)

    # -- what the workers and the loop do -------------------------------------------

    def write(self, pid: int, scope: str, timeout: float | None, sig: int) -> None:
        if timeout is None:
            req = Request(pid, scope, -1.0, 0)
        else:
            req = Request(pid, scope, WALL + self.now + timeout, sig, mono=self.now + timeout)
        written = Written(next(self.ids), req, self.now)
        if timeout is not None:
            self.acquire_ids[(pid, scope, self.now + timeout)] = written.id
        self.buffer.append(written)

    def read(self, count: int) -> None:
        """The source's read: the first ``count`` requests, as one batch; then the
        engine catches up (a turn of its decision, or a tick)."""
        taken, self.buffer = self.buffer[:count], self.buffer[count:]
        if taken:
            self.submit(taken)
            self.turn(1)

    def submit(self, taken: list[Written]) -> None:
        self.check_releases(taken)
        batch = Decoded(requests=[w.req for w in taken])
        self.carry(self.machine.submit(batch, "src", self.now, WALL + self.now))

    def turn(self, steps: int) -> None:
        """One turn of the loop: ``steps`` drain steps of the pass in progress (and its
        answer, once it is done), or a tick."""
        if self.looking is False:
            self.carry(self.machine.tick(self.now, WALL + self.now))
        for _ in range(steps):
            if self.looking is False:
                return
            nxt = self.next_held()
            if nxt is not None:
                self.buffer.remove(nxt)
                self.submit([nxt])
                continue
            self.looking = False
            self.carry(self.machine.input_taken(self.now, WALL + self.now))

    def exit(self, pid: int) -> None:
        if self.machine.watched(pid):
            self.reaping.discard(pid)
            self.carry(self.machine.gone(pid, "exited", WALL + self.now))

    # -- the shell ---------------------------------------------------------------------

    def next_held(self) -> Written | None:
        pids = self.looking
        for written in self.buffer:
            if written.id in self.held and (pids is None or written.req.pid in pids):  # type: ignore[operator]
                return written
        return None

    def carry(self, effects: list[Effect]) -> None:
        while effects:
            answer: list[Effect] = []
            for i, effect in enumerate(effects):
                if isinstance(effect, (Pin, ActOn, NeedInput)):
                    assert i == len(effects) - 1, "a question is the last effect"
                    assert self.machine.question is effect
                if isinstance(effect, Pin):
                    if effect.pid in self.unknown:
                        answer = self.machine.unattached(effect.pid)
                    else:
                        unpinned = effect.pid in self.unpinned
                        answer = self.machine.pinned(effect.pid, effect.pid % 2, unpinned=unpinned)
                elif isinstance(effect, NeedInput):
                    assert self.looking is False
                    if effect.hold:
                        self.held = {w.id for w in self.buffer}
                    self.looking = effect.pids
                elif isinstance(effect, ActOn):
                    answer = self.machine.acted(self.act_on(effect))
                elif isinstance(effect, ProceedReap):
                    assert effect.pid in self.begun
                    self.begun.discard(effect.pid)
                elif isinstance(effect, (Arm, JournalAcquired, JournalReleased, JournalForgot)):
                    pass
                else:
                    self.events.append(effect)
            effects = answer
        self.check_caps()

    def act_on(self, act: ActOn) -> Acted:
        timer = act.timer
        self.check_nothing_unread(timer.pid, timer.deadline)
        self.acted.append(
            (
                timer.pid,
                timer.scope_id,
                timer.deadline,
                self.acquire_ids[(*timer.key, timer.deadline)],
            )
        )
        if timer.pid in self.unpinned:
            return Acted.UNPINNED
        assert act.plan, "a report-only timer of a pinned worker needs no act"
        if timer.pid in self.reaping:
            return Acted.NOT_BEGUN
        self.begun.add(timer.pid)
        if timer.pid in self.refused:
            return Acted.REFUSED
        self.reaping.add(timer.pid)
        return Acted.BEGUN

    # -- the properties ----------------------------------------------------------------

    def check_nothing_unread(self, pid: int, deadline: float) -> None:
        """(b) Acting on ``pid`` at ``deadline``: no request for input is open, and
        nothing it wrote before the deadline is left unread."""
        assert self.looking is False
        unread = [w for w in self.buffer if w.req.pid == pid and w.at < deadline]
        assert not unread, f"acted on {pid} (deadline {deadline}) with {unread} unread"

    def check_releases(self, taken: list[Written]) -> None:
        """(a) No release written before a deadline is applied after that timer was
        acted on."""
        for written in taken:
            req = written.req
            if not req.is_release:
                continue
            for pid, scope, deadline, acquired in self.acted:
                if (pid, scope) == (req.pid, req.scope_id) and acquired < written.id:
                    assert written.at >= deadline, (
                        f"release {written} applied after its timer (deadline {deadline}) "
                        "was acted on"
                    )

    def check_caps(self) -> None:
        """(c) The caps hold."""
        table = self.machine.table
        assert len(table) <= self.max_timers
        assert all(n <= self.max_per_worker for _, n in table.worker_sizes())


PIDS = st.sampled_from([*WORKERS, OWN])
WRITE = st.tuples(
    st.just("write"),
    PIDS,
    st.sampled_from(SCOPES),
    st.sampled_from([None, 0.0, 0.5, 1.0, 2.0, 5.0]),
    st.sampled_from([KILL, KILL, 0]),
)
READ = st.tuples(st.just("read"), st.integers(1, 4))
ADVANCE = st.tuples(st.just("advance"), st.sampled_from([0.0, 0.3, 1.0, 3.0]))
TURN = st.tuples(st.just("turn"), st.integers(1, 3))
OPS = st.one_of(
    WRITE,
    WRITE,
    WRITE,
    WRITE,
    READ,
    ADVANCE,
    ADVANCE,
    TURN,
    TURN,
    st.tuples(st.just("exit"), st.sampled_from(WORKERS)),
)


def _run(world: World, ops: list[tuple[object, ...]]) -> None:
    for op in ops:
        kind = op[0]
        if kind == "write":
            _, pid, scope, timeout, sig = op
            world.write(pid, scope, timeout, sig)  # type: ignore[arg-type]
        elif kind == "read":
            world.read(op[1])  # type: ignore[arg-type]
        elif kind == "advance":
            world.now += op[1]  # type: ignore[operator]
        elif kind == "turn":
            world.turn(op[1])  # type: ignore[arg-type]
        else:
            world.exit(op[1])  # type: ignore[arg-type]
    # The loop catches up at last: every decision comes to act.
    if not world.drains:
        world.read(len(world.buffer))
    for _ in range(200):
        if world.looking is False and not world.machine.due(world.now):
            break
        world.turn(3)
    assert world.looking is False
    assert world.machine.question is None
    assert not world.machine.due(world.now)


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(OPS, min_size=20, max_size=80),
    caps=st.tuples(st.integers(1, 8), st.integers(1, 4)) | st.just((1000, 1000)),
    odd=st.tuples(*[st.frozensets(st.sampled_from(WORKERS), max_size=1)] * 3),
    drains=st.booleans(),
)
def test_the_machine_never_acts_before_the_input_written_before_the_deadline(
    ops: list[tuple[object, ...]],
    caps: tuple[int, int],
    odd: tuple[frozenset[int], frozenset[int], frozenset[int]],
    drains: bool,
) -> None:
    """``odd``: the workers that cannot be attached, whose first signal is refused, and
    that stay unpinned."""
    world = World(caps[0], caps[1], *odd, drains=drains)
    if not drains:
        # Without drains nothing can be read at a decision: the source reads all it
        # holds whenever it reads, and the loop ticks only after a read.
        ops = [("read", 100) if op[0] in ("read", "turn") else op for op in ops]
    _run(world, ops)


# -- the protocol, by example ---------------------------------------------------------


def _machine(**kwargs: object) -> Machine:
    return Machine(policy=ReapPolicy(), own_pid=OWN, own_uid=0, journal=True, **kwargs)  # type: ignore[arg-type]


def test_a_first_acquire_asks_to_pin_its_worker_before_anything_is_applied() -> None:
    machine = _machine()
    pid = WORKERS[0]
    batch = Decoded([Request(pid, "a", WALL + 5.0, KILL, mono=5.0), Request(pid, "b", -1.0, 0)])
    effects = machine.submit(batch, "src", 0.0, WALL)
    assert effects == [Pin(pid, None)]
    assert len(machine.table) == 0
    with pytest.raises(MachineError):
        machine.tick(0.0, WALL)  # a question is open
    effects = machine.pinned(pid, 1000)
    assert [type(e) for e in effects] == [JournalAcquired]
    assert machine.watched(pid) and len(machine.table) == 1


def test_an_unattached_worker_s_acquires_are_reported_unknown() -> None:
    machine = _machine()
    pid = WORKERS[1]
    assert machine.submit(Decoded([Request(pid, "a", WALL + 5, KILL)]), "s", 0.0, WALL) == [
        Pin(pid, None)
    ]
    (event,) = machine.unattached(pid)
    assert isinstance(event, WorkerUnknown) and event.pid == pid
    assert len(machine.table) == 0 and not machine.watched(pid)


def test_with_drains_the_due_workers_input_is_asked_for_before_acting() -> None:
    machine = _machine()
    machine.set_drains(1)
    pid = WORKERS[0]
    machine.submit(Decoded([Request(pid, "a", WALL + 1, KILL, mono=1.0)]), "s", 0.0, WALL)
    machine.pinned(pid, 0)
    assert machine.tick(0.5, WALL + 0.5) == [Arm(1.0)]  # nothing due yet
    (need,) = machine.tick(2.0, WALL + 2)
    assert need == NeedInput(frozenset({pid}), hold=True)
    with pytest.raises(MachineError):
        machine.acted(Acted.BEGUN)  # nothing was asked to act on
    # The drain hands over a release written before the deadline: it wins.
    effects = machine.submit(Decoded([Request(pid, "a", -1.0, 0)]), "s", 2.0, WALL + 2)
    assert [type(e) for e in effects] == [JournalReleased]
    effects = machine.input_taken(2.0, WALL + 2)
    assert effects == [Arm(math.inf)]
    assert machine.counts.expired == 0 and machine.question is None


def test_acting_reports_after_the_answer_and_proceeds_after_the_slice() -> None:
    machine = _machine()
    pid = WORKERS[2]
    reqs = [Request(pid, s, WALL + 1, KILL, mono=1.0) for s in ("a", "b", "c")]
    machine.submit(Decoded(reqs), "s", 0.0, WALL)
    machine.pinned(pid, 0)
    (act,) = [e for e in machine.tick(2.0, WALL + 2) if not isinstance(e, JournalReleased)]
    assert isinstance(act, ActOn) and act.timer.pid == pid and act.plan
    effects = [e for e in machine.acted(Acted.BEGUN) if not isinstance(e, JournalReleased)]
    expired, *rest = effects
    assert isinstance(expired, TimerExpired) and not expired.report_only
    proceed = next(e for e in rest if isinstance(e, ProceedReap))
    assert proceed.pid == pid and sorted(proceed.scopes) == ["a", "b", "c"]
    assert len(machine.table) == 0 and machine.counts.expired == 3


def test_a_gone_worker_s_timers_are_cleared() -> None:
    machine = _machine()
    pid = WORKERS[3]
    machine.submit(Decoded([Request(pid, "a", WALL + 9, KILL, mono=9.0)]), "s", 0.0, WALL)
    machine.pinned(pid, 0)
    effects = machine.gone(pid, "exited", WALL)
    assert effects[0] == JournalForgot(pid)
    assert isinstance(effects[1], WorkerExited) and effects[1].cleared == ("a",)
    assert len(machine.table) == 0 and not machine.watched(pid)


def test_a_worker_made_due_during_a_decision_is_looked_for_before_acting() -> None:
    """P2's expired acquire is read while the decision looks for P1; P2's release,
    written before the deadline and held at the decision, must win."""
    p1, p2 = WORKERS[0], WORKERS[1]
    world = World(1000, 1000, frozenset(), frozenset())
    _run(
        world,
        [
            ("write", p1, "a", 0.5, KILL),
            ("read", 1),
            ("write", p2, "a", 0.5, KILL),
            ("write", p2, "a", None, 0),
            ("write", p1, "b", 5.0, KILL),
            ("write", p1, "c", 5.0, KILL),
            ("write", p1, "b", 5.0, KILL),
            ("advance", 1.0),
            ("turn", 1),  # the decision: look for p1 (three held requests: three steps)
            ("read", 1),  # the source reads p2's expired acquire: p2 is due at it too
        ],
    )
    assert [(pid, scope) for pid, scope, _, _ in world.acted] == [(p1, "a")]


def test_timers_falling_due_during_a_decision_wait_for_the_next_one() -> None:
    """A timer due after the decision's instant is not acted on by it: its worker's
    input written meanwhile was not bounded by that decision."""
    p1, p2 = WORKERS[0], WORKERS[1]
    world = World(1000, 1000, frozenset(), frozenset())
    _run(
        world,
        [
            ("write", p1, "a", 0.5, KILL),
            ("write", p2, "a", 1.0, KILL),
            ("read", 2),
            ("write", p1, "b", 5.0, KILL),
            ("write", p1, "c", 5.0, KILL),
            ("advance", 0.7),
            ("turn", 1),  # the decision at 100.7: p1 due, two held requests to step
            ("advance", 0.2),
            ("write", p2, "a", None, 0),  # p2's release, before its deadline (101.0)
            ("advance", 0.3),  # p2 falls due during the decision
            ("turn", 1),
            ("turn", 1),
        ],
    )
    assert [(pid, scope) for pid, scope, _, _ in world.acted] == [(p1, "a")]


def test_a_report_only_expiry_asks_to_act_only_on_an_unpinned_worker() -> None:
    machine = _machine()
    pinned, unpinned = WORKERS[0], WORKERS[1]
    reqs = [Request(pid, "a", WALL + 1, 0, mono=1.0) for pid in (pinned, unpinned)]
    assert machine.submit(Decoded(reqs), "s", 0.0, WALL) == [Pin(pinned, None)]
    assert machine.pinned(pinned, 0) == [Pin(unpinned, None)]
    machine.pinned(unpinned, 0, unpinned=True)
    effects = machine.tick(2.0, WALL + 2)
    reported = [e for e in effects if isinstance(e, TimerExpired)]
    assert [e.pid for e in reported] == [pinned] and reported[0].report_only
    act = effects[-1]
    assert isinstance(act, ActOn) and act.timer.pid == unpinned and act.plan == ()
    effects = machine.acted(Acted.UNPINNED)
    (expired,) = [e for e in effects if isinstance(e, TimerExpired)]
    assert expired.report_only and "file descriptors" in expired.action
