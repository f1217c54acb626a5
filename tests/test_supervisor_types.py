"""How a run's outcome and each rank's status are read off the planner's slot records."""

from __future__ import annotations

import re

import pytest

from aiotimer.supervisor._exits import ExitKind, ExitReason, attempt_story
from aiotimer.supervisor._records import RunOutcome, format_summary, rank_status, run_outcome
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


def test_status_of_a_slot_running_and_between_attempts() -> None:
    crash = ExitReason(ExitKind.CRASHED, exit_code=1)
    slot = SlotRecord(
        2, S.HEALTHY, restarts=1, attempts=(Attempt(crash, uptime=0.5, start_failure=True),)
    )
    live = rank_status(slot, (4242, 3.0))
    assert (live.rank, live.state, live.pid, live.attempts, live.start_failures) == (
        2,
        S.HEALTHY,
        4242,
        2,
        1,
    )
    assert (live.uptime, live.attempt_uptime) == (3.5, 3.0)
    assert live.reasons == ("crashed (exit code 1)",)
    between = rank_status(slot, None)
    assert (between.pid, between.uptime, between.attempt_uptime, between.attempts) == (
        None,
        0.5,
        None,
        1,
    )


def test_the_summary_says_its_uptime_is_summed_over_attempts() -> None:
    crash = ExitReason(ExitKind.CRASHED, exit_code=1)
    done = ExitReason(ExitKind.SUCCEEDED, exit_code=0)
    slot = SlotRecord(
        1,
        S.SUCCEEDED,
        restarts=1,
        attempts=(
            Attempt(crash, uptime=1.25, start_failure=False),
            Attempt(done, uptime=2.0, start_failure=False),
        ),
    )
    header, row = format_summary([rank_status(slot, None)]).splitlines()
    assert re.split(r"\s{2,}", header)[4] == "total uptime"
    assert "3.2s" in row.split()
    assert row.endswith("crashed, restarted, then succeeded (exit code 0)")


@pytest.mark.parametrize(
    ("endings", "story"),
    [
        ([], "-"),
        (["succeeded"], "succeeded"),
        (["reaped", "succeeded"], "reaped, restarted, then succeeded"),
        (
            ["crashed"] * 3 + ["reaped", "stopped"],
            "crashed 3 times, restarted, reaped, restarted, then stopped",
        ),
        (
            ["crashed", "reaped"] * 10,
            "crashed, restarted, reaped, restarted, ... (12 more), restarted, crashed, restarted, "
            "reaped, restarted, crashed, restarted, reaped, restarted, crashed, restarted, "
            "then reaped",
        ),
    ],
)
def test_the_story_of_a_rank(endings: list[str], story: str) -> None:
    assert attempt_story(endings) == story
