"""The escalation policy (pure): plans as data, and the escalator on a fake clock."""

from __future__ import annotations

import signal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiotimer.cli import build_parser
from aiotimer.cli._args import policy_from_args
from aiotimer.core._table import Timer
from aiotimer.reapers._escalator import Escalator, Outcome, ReapRetry, Result, WaitUntil
from aiotimer.reapers._policy import Escalation, ReapPolicy
from aiotimer.reapers._steps import DumpStacks, SendSignal, Step, Wait, format_plan
from aiotimer.testing import FakeClock
from aiotimer.wire import Request

TERM = int(signal.SIGTERM)
KILL = int(signal.SIGKILL)
USR2 = int(signal.SIGUSR2)


def timer(
    sig: int = KILL,
    *,
    grace: float | None = None,
    group: bool = False,
    dump: bool = False,
    with_request: bool = True,
) -> Timer:
    request = Request(4242, "a.py:1#1", 10.0, sig, grace=grace, group=group, dump=dump)
    return Timer(4242, "a.py:1#1", 10.0, sig, request=request if with_request else None)


# -- plans ----------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [KILL, TERM, USR2])
@pytest.mark.parametrize("with_request", [True, False])
def test_torch_semantics_exactly_the_named_signal(sig: int, with_request: bool) -> None:
    assert ReapPolicy().plan(timer(sig, with_request=with_request)) == (SendSignal(sig),)


@pytest.mark.parametrize("sig", [0, -1])
def test_report_only_is_empty_even_with_a_ladder(sig: int) -> None:
    assert ReapPolicy().plan(timer(sig, grace=3, dump=True)) == ()
    assert ReapPolicy(Escalation(dump=True)).plan(timer(sig)) == ()


def test_request_grace_adds_soft_stage_then_sigkill() -> None:
    plan = ReapPolicy().plan(timer(TERM, grace=3.0))
    assert plan == (SendSignal(TERM), Wait(3.0), SendSignal(KILL))


def test_request_grace_with_sigkill_is_just_the_kill() -> None:
    assert ReapPolicy().plan(timer(KILL, grace=3.0)) == (SendSignal(KILL),)


def test_request_zero_grace_sends_both_signals_without_waiting() -> None:
    assert ReapPolicy().plan(timer(TERM, grace=0.0)) == (SendSignal(TERM), SendSignal(KILL))


def test_request_group_and_dump_without_grace_keep_its_signal() -> None:
    plan = ReapPolicy().plan(timer(USR2, group=True, dump=True))
    assert plan == (DumpStacks(2.0), SendSignal(USR2, group=True))


def test_server_ladder_applies_to_plain_torch_requests() -> None:
    policy = ReapPolicy(Escalation(dump=True, dump_timeout=1.5, grace=4.0))
    assert policy.plan(timer(KILL, with_request=False)) == (
        DumpStacks(1.5),
        SendSignal(TERM),
        Wait(4.0),
        SendSignal(KILL),
    )


def test_request_keys_override_and_add_to_the_ladder() -> None:
    policy = ReapPolicy(Escalation(grace=4.0))
    assert policy.plan(timer(KILL, grace=1.0, group=True, dump=True)) == (
        DumpStacks(2.0),
        SendSignal(TERM, group=True),
        Wait(1.0),
        SendSignal(KILL, group=True),
    )
    # A request cannot switch off what the server asks for.
    policy = ReapPolicy(Escalation(group=True, dump=True))
    assert policy.plan(timer(KILL)) == (
        DumpStacks(2.0),
        SendSignal(TERM, group=True),
        Wait(5.0),
        SendSignal(KILL, group=True),
    )


def test_ladder_without_soft_signal_is_dump_then_kill() -> None:
    policy = ReapPolicy(Escalation(dump=True, soft_signal=None, kill_signal=TERM))
    assert policy.plan(timer(KILL)) == (DumpStacks(2.0), SendSignal(TERM))


def test_shadow_plans_nothing_but_knows_what_it_would_do() -> None:
    policy = ReapPolicy(Escalation(), shadow=True)
    assert policy.shadow
    assert policy.plan(timer(KILL)) == ()
    assert policy.intended(timer(KILL)) == (SendSignal(TERM), Wait(5.0), SendSignal(KILL))
    assert ReapPolicy(shadow=True).intended(timer(USR2)) == (SendSignal(USR2),)
    assert "shadow" in repr(policy)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"grace": -1.0},
        {"grace": float("nan")},
        {"dump_timeout": float("inf")},
        {"kill_signal": 0},
        {"soft_signal": -15},
    ],
)
def test_escalation_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        Escalation(**kwargs)  # type: ignore[arg-type]


def test_format_plan() -> None:
    assert format_plan(()) == "nothing (report only)"
    assert format_plan(Escalation(dump=True, group=True).steps()) == (
        "dump stacks (2s) -> SIGTERM to group -> wait 5s -> SIGKILL to group"
    )
    assert format_plan((SendSignal(200),)) == "signal 200"


signals = st.integers(min_value=-2, max_value=64)
graces = st.none() | st.floats(min_value=0, max_value=1e6)
ladders = st.none() | st.builds(
    Escalation,
    dump=st.booleans(),
    dump_timeout=st.floats(min_value=0, max_value=60),
    soft_signal=st.none() | st.integers(min_value=1, max_value=64),
    grace=st.floats(min_value=0, max_value=60),
    kill_signal=st.integers(min_value=1, max_value=64),
    group=st.booleans(),
)


@given(
    ladder=ladders,
    sig=signals,
    grace=graces,
    group=st.booleans(),
    dump=st.booleans(),
    shadow=st.booleans(),
)
def test_plan_shape_properties(
    *,
    ladder: Escalation | None,
    sig: int,
    grace: float | None,
    group: bool,
    dump: bool,
    shadow: bool,
) -> None:
    policy = ReapPolicy(ladder, shadow=shadow)
    t = timer(sig, grace=grace, group=group, dump=dump)
    plan = policy.plan(t)
    intended = policy.intended(t)
    assert plan == (() if shadow else intended)
    if sig <= 0:
        assert intended == ()
        return
    if ladder is None and grace is None and not group and not dump:
        assert intended == (SendSignal(sig),)
        return
    # A real ladder: at most one dump, first; waits only between signals; ends in a signal.
    assert isinstance(intended[-1], SendSignal)
    assert [i for i, s in enumerate(intended) if isinstance(s, DumpStacks)] in ([], [0])
    for i, step in enumerate(intended):
        if isinstance(step, Wait):
            assert isinstance(intended[i - 1], SendSignal)
            assert isinstance(intended[i + 1], SendSignal)
    sent = [s for s in intended if isinstance(s, SendSignal)]
    assert all(s.group == (group or (ladder is not None and ladder.group)) for s in sent)
    assert any(isinstance(s, DumpStacks) for s in intended) == (
        dump or (ladder is not None and ladder.dump)
    )


# -- the escalator ----------------------------------------------------------------------


class Worker:
    """A fake worker for the escalator: dies on the listed signals, maybe after a delay."""

    def __init__(self, clock: FakeClock, dies_on: set[int], delay: float = 0.0) -> None:
        self.clock = clock
        self.dies_on = dies_on
        self.delay = delay
        self.death: float | None = None
        self.received: list[tuple[float, int]] = []

    @property
    def alive(self) -> bool:
        return self.death is None or self.clock.monotonic() < self.death

    def signal(self, signum: int) -> None:
        assert self.alive, "signalled a dead worker"
        self.received.append((self.clock.monotonic(), signum))
        if signum in self.dies_on and self.death is None:
            self.death = self.clock.monotonic() + self.delay


def drive(esc: Escalator, clock: FakeClock, worker: Worker, limit: int = 100) -> list[Step]:
    """The shell loop, on a fake clock: sleep until a deadline or the worker's death."""
    handed: list[Step] = []
    for _ in range(limit):
        action = esc.next(clock.monotonic(), Result.DONE if worker.alive else Result.EXITED)
        if action is None:
            return handed
        if isinstance(action, WaitUntil):
            assert action.deadline > clock.monotonic()
            wake = action.deadline
            if worker.death is not None:
                wake = min(wake, max(worker.death, clock.monotonic()))
            clock.advance(wake - clock.monotonic())
            continue
        handed.append(action)
        if isinstance(action, SendSignal):
            worker.signal(action.signum)
    raise AssertionError("escalator did not finish")


LADDER = (DumpStacks(2.0), SendSignal(TERM), Wait(5.0), SendSignal(KILL))


def test_worker_ignoring_sigterm_is_killed_after_the_grace() -> None:
    clock = FakeClock(start=100.0)
    worker = Worker(clock, dies_on={KILL})
    esc = Escalator(LADDER, confirm=1.0)
    assert drive(esc, clock, worker) == [DumpStacks(2.0), SendSignal(TERM), SendSignal(KILL)]
    assert worker.received == [(100.0, TERM), (105.0, KILL)]
    assert esc.outcome is Outcome.EXITED
    assert esc.next(clock.monotonic(), Result.EXITED) is None  # finished stays finished


def test_worker_obeying_sigterm_is_not_killed() -> None:
    clock = FakeClock()
    worker = Worker(clock, dies_on={TERM}, delay=0.5)
    esc = Escalator(LADDER, confirm=1.0)
    drive(esc, clock, worker)
    assert worker.received == [(0.0, TERM)]
    assert clock.monotonic() == 0.5
    assert esc.outcome is Outcome.EXITED
    assert esc.taken == (DumpStacks(2.0), SendSignal(TERM))


def test_worker_that_exited_on_its_own_is_never_signalled() -> None:
    esc = Escalator(LADDER, confirm=1.0)
    assert esc.next(0.0, Result.EXITED) is None
    assert esc.outcome is Outcome.EXITED
    assert esc.taken == ()


def test_unkillable_after_the_confirmation_window() -> None:
    clock = FakeClock()
    worker = Worker(clock, dies_on=set())
    esc = Escalator((SendSignal(KILL),), confirm=2.0)
    assert esc.next(0.0) == SendSignal(KILL)
    assert esc.next(0.0) == WaitUntil(2.0)
    assert esc.next(1.0) == WaitUntil(2.0)  # a spurious wake-up keeps the deadline
    assert esc.outcome is None
    assert esc.next(2.0) is None
    assert esc.outcome is Outcome.UNKILLABLE
    assert "unkillable" in repr(esc)
    del worker


def test_survived_when_the_last_signal_is_not_sigkill() -> None:
    clock = FakeClock()
    esc = Escalator((SendSignal(USR2),), confirm=1.0)
    drive(esc, clock, Worker(clock, dies_on=set()))
    assert esc.outcome is Outcome.SURVIVED


def test_without_confirmation_the_plan_is_done_after_the_last_step() -> None:
    esc = Escalator((SendSignal(KILL),))
    assert esc.next(0.0) == SendSignal(KILL)
    assert esc.next(0.0) is None
    assert esc.outcome is Outcome.DONE


def test_empty_plan_does_nothing() -> None:
    esc = ReapPolicy(shadow=True).escalator(timer(KILL))
    assert esc.next(0.0) is None
    assert esc.outcome is Outcome.NOTHING


def test_policy_escalator_uses_the_unkillable_window() -> None:
    policy = ReapPolicy(Escalation(grace=1.0), unkillable_after=3.0)
    esc = policy.escalator(timer(KILL))
    assert esc.plan == (SendSignal(TERM), Wait(1.0), SendSignal(KILL))
    clock = FakeClock()
    drive(esc, clock, Worker(clock, dies_on=set()))
    assert clock.monotonic() == 4.0
    assert esc.outcome is Outcome.UNKILLABLE


def test_a_failed_signal_is_retried_after_a_growing_back_off_then_abandoned() -> None:
    esc = Escalator((SendSignal(TERM),), retry=ReapRetry(attempts=3, initial=0.5, factor=2.0))
    assert esc.next(0.0) == SendSignal(TERM) and esc.attempt == 1
    assert esc.next(0.0, Result.FAILED) == WaitUntil(0.5) and esc.backoff == 0.5
    assert esc.next(0.25) == WaitUntil(0.5)  # a spurious wake-up keeps the deadline
    assert esc.next(0.5) == SendSignal(TERM) and esc.attempt == 2
    assert esc.next(0.5, Result.FAILED) == WaitUntil(1.5) and esc.backoff == 1.0
    assert esc.next(1.5) == SendSignal(TERM) and esc.attempt == 3
    assert esc.next(1.5, Result.FAILED) is None
    assert esc.outcome is Outcome.ABANDONED
    assert esc.taken == (SendSignal(TERM),)  # retries are not new steps


def test_a_retried_signal_that_gets_through_resumes_the_plan() -> None:
    esc = Escalator((SendSignal(TERM), Wait(5.0), SendSignal(KILL)), confirm=1.0)
    assert esc.next(0.0) == SendSignal(TERM)
    assert esc.next(0.0, Result.FAILED) == WaitUntil(0.1)
    assert esc.next(0.1) == SendSignal(TERM)
    assert esc.next(0.1) == WaitUntil(5.1)  # the grace starts when TERM got through
    assert esc.next(5.1) == SendSignal(KILL) and esc.attempt == 1
    assert esc.next(5.1, Result.EXITED) is None
    assert esc.outcome is Outcome.EXITED


def test_a_refused_signal_is_abandoned_at_once() -> None:
    esc = Escalator((SendSignal(KILL),), retry=ReapRetry(attempts=6))
    assert esc.next(0.0) == SendSignal(KILL)
    assert esc.next(0.0, Result.REFUSED) is None
    assert (esc.outcome, esc.attempt) == (Outcome.ABANDONED, 1)


def test_a_worker_gone_during_a_back_off_is_never_signalled_again() -> None:
    esc = Escalator((SendSignal(KILL),))
    esc.next(0.0)
    assert isinstance(esc.next(0.0, Result.FAILED), WaitUntil)
    assert esc.next(0.05, Result.EXITED) is None
    assert esc.outcome is Outcome.EXITED


def test_escalator_rejects_a_negative_confirmation() -> None:
    with pytest.raises(ValueError, match="confirm"):
        Escalator((), confirm=-1.0)


steps = st.lists(
    st.one_of(
        st.builds(SendSignal, st.integers(min_value=1, max_value=64), st.booleans()),
        st.builds(Wait, st.floats(min_value=0, max_value=100)),
        st.builds(DumpStacks, st.floats(min_value=0, max_value=10)),
    ),
    max_size=8,
)


@given(steps, st.none() | st.floats(min_value=0, max_value=10))
def test_escalator_hands_out_every_step_to_an_immortal_worker(
    plan: list[Step], confirm: float | None
) -> None:
    clock = FakeClock()
    esc = Escalator(plan, confirm=confirm)
    handed = drive(esc, clock, Worker(clock, dies_on=set()))
    assert handed == [s for s in plan if not isinstance(s, Wait)]
    waited = sum(s.seconds for s in plan if isinstance(s, Wait))
    has_signal = any(isinstance(s, SendSignal) for s in plan)
    if plan and confirm is not None and has_signal:
        waited += confirm
    assert clock.monotonic() == pytest.approx(waited)
    assert esc.outcome in {Outcome.NOTHING, Outcome.DONE, Outcome.UNKILLABLE, Outcome.SURVIVED}


@given(steps, st.integers(min_value=1, max_value=64), st.floats(min_value=0, max_value=10))
def test_escalator_never_signals_a_dead_worker(plan: list[Step], fatal: int, delay: float) -> None:
    clock = FakeClock()
    worker = Worker(clock, dies_on={fatal}, delay=delay)
    esc = Escalator(plan, confirm=1.0)
    drive(esc, clock, worker)  # Worker.signal asserts it is alive
    if worker.death is not None and clock.monotonic() >= worker.death:
        assert esc.outcome is Outcome.EXITED


@given(
    steps,
    st.lists(st.booleans(), max_size=40),
    st.integers(min_value=1, max_value=4),
    st.one_of(st.none(), st.integers(min_value=1, max_value=64)),
)
def test_escalator_with_failing_signals_retries_each_at_most_the_attempts_then_abandons(
    plan: list[Step], failures: list[bool], attempts: int, fatal: int | None
) -> None:
    """Against a model: a signal that fails is handed out again after the back-off, up to
    ``attempts`` times; one more failure abandons the plan; a dead worker is never signalled
    again; otherwise every step is handed out in order."""
    clock = FakeClock()
    worker = Worker(clock, dies_on=set() if fatal is None else {fatal})
    retry = ReapRetry(attempts=attempts, initial=0.5, factor=2.0, maximum=2.0)
    esc = Escalator(plan, confirm=1.0, retry=retry)
    fails = iter(failures)
    tries: list[int] = []  # the attempt number of every signal handed out
    result = Result.DONE
    for _ in range(500):
        action = esc.next(clock.monotonic(), result)
        if action is None:
            break
        if isinstance(action, WaitUntil):
            assert action.deadline > clock.monotonic()
            clock.advance(action.deadline - clock.monotonic())
            result = Result.DONE if worker.alive else Result.EXITED
        elif isinstance(action, SendSignal):
            assert worker.alive
            tries.append(esc.attempt)
            if next(fails, False):
                result = Result.FAILED
            else:
                worker.signal(action.signum)
                result = Result.DONE if worker.alive else Result.EXITED
        else:
            result = Result.DONE
    else:
        raise AssertionError("escalator did not finish")
    assert all(1 <= n <= attempts for n in tries)
    handed = [s for s in plan if not isinstance(s, Wait)]
    assert list(esc.taken) == handed[: len(esc.taken)]
    if esc.outcome is Outcome.ABANDONED:
        assert tries and tries[-1] == attempts
    elif esc.outcome is not Outcome.EXITED:
        assert list(esc.taken) == handed  # not cut short: every step was handed out


# -- the `aiotimer serve` options that build a policy -----------------------------------------


def serve_policy(*options: str) -> ReapPolicy:
    return policy_from_args(build_parser().parse_args(["serve", "--fifo", "f", *options]))


def test_serve_without_reaping_options_keeps_torch_semantics() -> None:
    policy = serve_policy()
    assert (policy.default, policy.shadow, policy.unkillable_after) == (None, False, 5.0)
    assert serve_policy("--shadow").shadow


def test_serve_reaping_options_make_a_ladder() -> None:
    assert format_plan(serve_policy("--grace", "3").intended(timer())) == (
        "SIGTERM -> wait 3s -> SIGKILL"
    )
    assert format_plan(serve_policy("--group").intended(timer())) == "SIGKILL to group"
    dumped = serve_policy("--dump-dir", "/tmp", "--dump-timeout", "4", "--unkillable-after", "1")
    assert format_plan(dumped.intended(timer())) == "dump stacks (4s) -> SIGKILL"
    assert dumped.unkillable_after == 1.0
    full = serve_policy("--shadow", "--dump", "--grace", "0.5", "--group")
    assert full.shadow and full.plan(timer()) == ()
    assert format_plan(full.intended(timer())) == (
        "dump stacks (2s) -> SIGTERM to group -> wait 0.5s -> SIGKILL to group"
    )


@pytest.mark.parametrize("bad", ["-1", "nan", "inf", "soon"])
def test_serve_rejects_bad_durations(bad: str) -> None:
    with pytest.raises(SystemExit):
        serve_policy("--grace", bad)
