"""How a run's outcome and summaries are read off the planner's slot records."""

from __future__ import annotations

import pytest

from aiotimer.supervisor._exits import ExitKind, ExitReason
from aiotimer.supervisor._records import RunOutcome, run_outcome, worker_snapshot, worker_summaries
from aiotimer.supervisor._restart import Attempt, SlotRecord, WorkerState

S = WorkerState


@pytest.mark.parametrize(
    ("states", "gave_up", "outcome"),
    [
        ((S.SUCCEEDED, S.SUCCEEDED), False, RunOutcome.SUCCEEDED),
        ((S.SUCCEEDED, S.FAILED), False, RunOutcome.FAILED),
        ((S.FAILED, S.FATAL), False, RunOutcome.GAVE_UP),  # the budget ran out: that wins
        ((S.STOPPED, S.STOPPED), True, RunOutcome.GAVE_UP),  # a coordinator's give-up
        ((S.FAILED, S.STOPPED), True, RunOutcome.FAILED),
        ((S.SUCCEEDED, S.STOPPED), False, RunOutcome.STOPPED),
    ],
)
def test_run_outcome(states: tuple[WorkerState, ...], gave_up: bool, outcome: RunOutcome) -> None:
    slots = [SlotRecord(rank, state) for rank, state in enumerate(states)]
    assert run_outcome(slots, gave_up=gave_up) is outcome


def test_snapshot_and_summary_of_a_slot() -> None:
    crash = ExitReason(ExitKind.CRASHED, exit_code=1)
    slot = SlotRecord(
        2, S.HEALTHY, restarts=1, attempts=(Attempt(crash, uptime=0.5, start_failure=True),)
    )
    live = worker_snapshot(slot, (4242, 3.0))
    assert (live.pid, live.uptime, live.attempts, live.start_failures) == (4242, 3.0, 2, 1)
    assert live.reasons == (crash,)
    between = worker_snapshot(slot, None)
    assert (between.pid, between.uptime, between.attempts) == (None, None, 1)
    (summary,) = worker_summaries([slot])
    assert (summary.rank, summary.state, summary.attempts, summary.uptime) == (2, "healthy", 1, 0.5)
    assert summary.reasons == ("crashed (exit code 1)",)
