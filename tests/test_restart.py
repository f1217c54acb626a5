"""The restart policy (pure): exit classification, back-off, budget, slot states."""

from __future__ import annotations

import math
import random
import signal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiotimer.supervisor._exits import ExitKind, ExitReason, classify_exit
from aiotimer.supervisor._restart import (
    Backoff,
    Finish,
    GiveUp,
    Restart,
    RestartPlanner,
    RestartPolicy,
    RestartScope,
    WorkerState,
)

KILL = int(signal.SIGKILL)
CRASH = ExitReason(ExitKind.CRASHED, exit_code=1)
REAPED = ExitReason(ExitKind.REAPED, signal=KILL, scopes=("step",))


def planner(nproc: int = 2, **policy: object) -> RestartPlanner:
    policy.setdefault("backoff", Backoff(initial=1.0, cap=8.0, factor=2.0, jitter=0.0))
    return RestartPlanner(RestartPolicy(**policy), nproc, random.Random(0).random)  # type: ignore[arg-type]


def start_all(p: RestartPlanner, now: float = 0.0) -> None:
    for s in p.slots:
        p.started(s.rank, now)


# -- classification ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("returncode", "reaped", "stopped", "kind"),
    [
        (0, None, False, ExitKind.SUCCEEDED),
        (3, None, False, ExitKind.CRASHED),
        (-KILL, None, False, ExitKind.SIGNALLED),
        (-KILL, ("s",), False, ExitKind.REAPED),
        (0, ("s",), False, ExitKind.REAPED),
        (-KILL, ("s",), True, ExitKind.REAPED),  # reaped while being stopped
        (0, None, True, ExitKind.STOPPED),
    ],
)
def test_classify_exit(
    returncode: int, reaped: tuple[str, ...] | None, stopped: bool, kind: ExitKind
) -> None:
    reason = classify_exit(returncode, reaped_scopes=reaped, stopped=stopped)
    assert reason.kind is kind
    if returncode < 0:
        assert (reason.signal, reason.exit_code) == (-returncode, None)
    else:
        assert (reason.signal, reason.exit_code) == (None, returncode)


def test_reasons_describe_themselves() -> None:
    assert REAPED.describe() == "reaped (SIGKILL): block 'step' outlived its timer"
    assert CRASH.describe() == "crashed (exit code 1)"
    assert classify_exit(-KILL).describe() == "killed by SIGKILL"


# -- back-off ---------------------------------------------------------------------------


@given(
    initial=st.floats(0.001, 10),
    cap=st.floats(0.001, 100),
    factor=st.floats(1, 4),
    jitter=st.floats(0, 0.99),
    n=st.integers(0, 5000),
    u=st.floats(0, 1, exclude_max=True),
)
def test_backoff_delay_stays_within_jitter_and_cap(
    initial: float, cap: float, factor: float, jitter: float, *, n: int, u: float
) -> None:
    cap = max(cap, initial)  # an initial delay above the cap is refused (see below)
    b = Backoff(initial, cap, factor, jitter)
    base = math.exp(min(math.log(cap), math.log(initial) + n * math.log(factor)))
    d = b.delay(n, u)
    assert 0 <= d <= cap
    assert base * (1 - jitter) * (1 - 1e-9) <= d <= base * (1 + jitter) * (1 + 1e-9)


@given(
    n=st.integers(0, 20), u1=st.floats(0, 1, exclude_max=True), u2=st.floats(0, 1, exclude_max=True)
)
def test_default_backoff_grows_until_the_cap(n: int, u1: float, u2: float) -> None:
    b = Backoff()
    if b.initial * b.factor ** (n + 1) * (1 + b.jitter) < b.cap:
        assert b.delay(n + 1, u2) > b.delay(n, u1)


def test_a_zero_initial_backoff_never_waits() -> None:
    # --backoff 0:2 once divided by zero on the first restart.
    assert [Backoff(initial=0, cap=2).delay(n, 0.5) for n in range(3)] == [0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "kwargs",
    [{"initial": -1}, {"cap": math.inf}, {"factor": 0.5}, {"jitter": 1.0}, {"initial": math.nan}],
)
def test_backoff_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Backoff(**kwargs)


def test_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        RestartPolicy(max_restarts=-1)
    with pytest.raises(ValueError):
        RestartPolicy(min_uptime=-0.1)
    RestartPolicy(window=math.inf)  # the budget never refills
    with pytest.raises(ValueError, match="window must be > 0"):
        RestartPolicy(window=0.0)  # it would count no restart: never give up


# -- decisions --------------------------------------------------------------------------


def test_worker_scope_restarts_only_the_failed_slot() -> None:
    p = planner(3)
    start_all(p)
    decision = p.exited(1, REAPED, now=5.0)
    assert decision == Restart(ranks=(1,), delay=1.0, restarts=(1,), attempt=1, budget=3)
    assert [s.state for s in p.slots] == [
        WorkerState.STARTING,
        WorkerState.BACKOFF,
        WorkerState.STARTING,
    ]
    assert [s.restarts for s in p.slots] == [0, 1, 0]


def test_group_scope_restarts_every_slot() -> None:
    p = planner(3, scope=RestartScope.GROUP)
    start_all(p)
    decision = p.exited(2, CRASH, now=5.0)
    assert isinstance(decision, Restart)
    assert decision.ranks == (0, 1, 2)
    assert decision.restarts == (1, 1, 1)
    # the others are stopped by the supervisor: their exits decide nothing
    assert p.exited(0, classify_exit(-15, stopped=True), now=5.1) is None
    assert p.slot(0).state is WorkerState.BACKOFF


def test_budget_gives_up_after_exactly_k_restarts() -> None:
    p = planner(1, max_restarts=2)
    decisions = []
    now = 0.0
    for _ in range(3):
        p.started(0, now)
        decisions.append(p.exited(0, REAPED, now=now + 1))
        now += 10
    assert [type(d) for d in decisions] == [Restart, Restart, GiveUp]
    assert len(p.slot(0).attempts) == 3
    assert p.slot(0).state is WorkerState.FATAL
    assert p.done()


def test_budget_window_refills() -> None:
    p = planner(1, max_restarts=1, window=60.0)
    p.started(0, 0.0)
    assert isinstance(p.exited(0, CRASH, now=10.0), Restart)
    p.started(0, 11.0)
    assert isinstance(p.exited(0, CRASH, now=70.0), Restart)  # the first one aged out
    p.started(0, 71.0)
    assert isinstance(p.exited(0, CRASH, now=80.0), GiveUp)


def test_backoff_grows_with_the_restarts_in_the_window() -> None:
    p = planner(1, max_restarts=10, window=100.0)
    delays = []
    now = 0.0
    for _ in range(5):
        p.started(0, now)
        d = p.exited(0, CRASH, now=now + 2)
        assert isinstance(d, Restart)
        delays.append(d.delay)
        now += 2 + d.delay
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0]


def test_exit_zero_succeeds_and_no_restart_code_fails_for_good() -> None:
    p = planner(2)
    start_all(p)
    assert p.exited(0, classify_exit(0), now=3.0) == Finish(0, WorkerState.SUCCEEDED)
    assert p.exited(1, classify_exit(93), now=3.0) == Finish(1, WorkerState.FAILED)
    assert p.done()
    assert p.restarts_in_window(3.0) == 0


def test_no_restart_code_in_group_scope_ends_the_run() -> None:
    p = planner(2, scope=RestartScope.GROUP, no_restart_exit_codes=frozenset({7}))
    start_all(p)
    decision = p.exited(1, classify_exit(7), now=3.0)
    assert isinstance(decision, GiveUp)
    assert p.slot(1).state is WorkerState.FAILED
    assert p.exited(0, classify_exit(-15, stopped=True), now=3.5) is None
    assert p.slot(0).state is WorkerState.STOPPED
    assert p.done()


def test_start_failure_is_an_exit_before_evidence_of_running() -> None:
    p = planner(2, min_uptime=5.0)
    start_all(p)
    assert p.healthy_at(0) == 5.0
    p.exited(0, CRASH, now=1.0)
    assert p.running(1)
    p.exited(1, CRASH, now=1.0)  # early, but it sent a timer request: it ran
    assert p.slot(0).start_failures == 1
    assert p.slot(1).start_failures == 0
    assert p.healthy_at(1) is None


def test_a_stopped_attempt_decides_nothing_whatever_its_reason() -> None:
    p = planner(2, scope=RestartScope.GROUP)
    start_all(p)
    assert isinstance(p.exited(1, REAPED, now=1.0), Restart)
    # rank 0 was reaped too, while the group restart was stopping it
    assert p.exited(0, REAPED, now=1.1, stopped=True) is None
    assert p.restarts_in_window(1.1) == 1
    assert p.slot(0).attempts[-1].start_failure is False


def test_transitions_are_guarded() -> None:
    p = planner(1)
    with pytest.raises(ValueError, match="init: cannot be exited"):
        p.exited(0, CRASH, now=0.0)
    p.started(0, 0.0)
    with pytest.raises(ValueError, match="starting: cannot be started"):
        p.started(0, 1.0)


def test_external_restart_sets_the_count_and_skips_the_budget() -> None:
    p = planner(2, max_restarts=0)
    start_all(p)
    d = p.restart((0, 1), now=1.0, budget=False, count=7)
    assert (d.delay, d.restarts) == (0.0, (7, 7))
    assert p.restarts_in_window(1.0) == 0


# -- a model check ----------------------------------------------------------------------

exits = st.sampled_from([CRASH, REAPED, classify_exit(-KILL), classify_exit(0), classify_exit(93)])


@given(
    scope=st.sampled_from(list(RestartScope)),
    k=st.integers(0, 4),
    window=st.sampled_from([5.0, 50.0, math.inf]),
    steps=st.lists(st.tuples(st.integers(0, 2), exits, st.floats(0, 20)), max_size=30),
)
def test_never_more_than_k_restarts_in_any_window(
    scope: RestartScope,
    k: int,
    window: float,
    steps: list[tuple[int, ExitReason, float]],
) -> None:
    p = planner(3, scope=scope, max_restarts=k, window=window)
    start_all(p)
    now = 0.0
    restarts: list[float] = []
    for rank, reason, dt in steps:
        now += dt
        if not p.slot(rank).state.alive:
            continue
        decision = p.exited(rank, reason, now)
        if isinstance(decision, Restart):
            restarts.append(now)
            assert rank in decision.ranks
            for r in decision.ranks:
                if p.slot(r).state.alive:  # group scope: stopped, then restarted
                    assert p.exited(r, classify_exit(-15, stopped=True), now) is None
                p.started(r, now + decision.delay)
        elif isinstance(decision, GiveUp):
            for s in p.slots:
                if s.state.alive:
                    p.exited(s.rank, classify_exit(-15, stopped=True), now)
            assert p.done()
            break
        # invariant: the budget holds over every window
        for t in restarts:
            assert sum(1 for u in restarts if t <= u < t + window) <= k
        assert all(s.state is not WorkerState.INIT for s in p.slots)


def test_a_reap_keeps_the_culprits_block_first_and_at_most_three_scopes() -> None:
    scopes = tuple(f"w.py:1#{n}@Task-{n}" for n in range(100))
    reason = classify_exit(
        -KILL, reaped_scopes=scopes, omitted=35, culprit=("hog", "w.py:9#101@hog")
    )
    assert reason.scopes == ("w.py:9#101@hog", scopes[0], scopes[1])
    # 135 blocks in all: the culprit's was one of the 35 not listed.
    assert (reason.omitted, reason.task) == (132, "hog")
    assert reason.describe() == (
        "reaped (SIGKILL): task 'hog' held the loop, in block 'w.py:9#101@hog' (135 open)"
    )


def test_an_initial_delay_above_the_cap_is_refused() -> None:
    with pytest.raises(ValueError, match=r"initial delay \(5s\) must not exceed the cap \(1s\)"):
        Backoff(initial=5, cap=1)


def test_a_restart_outside_the_budget_says_so() -> None:
    p = planner(max_restarts=1)
    decision = p.restart((0,), now=1.0, budget=False, cause="operator")
    assert (decision.budget, decision.attempt, decision.cause, decision.delay) == (
        -1,
        0,
        "operator",
        0.0,
    )
    assert p.restarts_in_window(1.0) == 0
