"""launch_info(): what started this process, from the environment, never raising."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aiotimer import LaunchInfo, launch_info
from aiotimer.client import Launcher


def test_nothing_launched_this() -> None:
    launch = launch_info({"RANK": "3"})
    assert launch == LaunchInfo(Launcher.NONE)
    assert not launch


def test_aiotimer_run_wins_over_the_torch_variables_it_also_sets() -> None:
    env = {
        "AIOTIMER_RUN_ID": "r1",
        "TORCHELASTIC_RUN_ID": "r1",
        "RANK": "1",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "AIOTIMER_RESTART_COUNT": "2",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "TORCHELASTIC_MAX_RESTARTS": "3",
        "AIOTIMER_FIFO": "/run/x/timer.fifo",
    }
    assert launch_info(env) == LaunchInfo(
        Launcher.AIOTIMER,
        rank=1,
        local_rank=1,
        world_size=4,
        restart_count=2,
        max_restarts=3,
        run_id="r1",
        fifo="/run/x/timer.fifo",
    )


def test_torchrun() -> None:
    env = {
        "TORCHELASTIC_RUN_ID": "job",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "2",
        "TORCHELASTIC_RESTART_COUNT": "1",
        "TORCHELASTIC_TIMER_FILE": "/tmp/t.fifo",
    }
    launch = launch_info(env)
    assert launch
    assert (launch.launcher, launch.restart_count, launch.fifo) == (
        Launcher.TORCHRUN,
        1,
        "/tmp/t.fifo",
    )


@given(st.dictionaries(st.sampled_from(["AIOTIMER_RUN_ID", "TORCHELASTIC_RUN_ID", "RANK",
       "LOCAL_RANK", "WORLD_SIZE", "AIOTIMER_RESTART_COUNT"]), st.text()))  # fmt: skip
def test_never_raises(env: dict[str, str]) -> None:
    launch = launch_info(env)
    assert isinstance(launch, LaunchInfo)
    if not launch:
        assert launch == LaunchInfo(Launcher.NONE)
