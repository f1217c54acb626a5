"""``aiotimer run``'s arguments and its usage errors (the runs themselves are in
test_supervisor_process.py)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from aiotimer import Backoff, RestartScope
from aiotimer.cli import build_parser, main
from aiotimer.cli._run import _policy


def test_defaults() -> None:
    args = build_parser().parse_args(["run", "--", "python", "-c", "pass"])
    policy = _policy(args)
    assert args.command == ["--", "python", "-c", "pass"]
    assert (args.nproc, args.stop_timeout) == (1, 10.0)
    assert policy.scope is RestartScope.WORKER
    assert (policy.max_restarts, policy.window, policy.min_uptime) == (3, 600.0, 1.0)
    assert policy.no_restart_exit_codes == frozenset({93})
    assert policy.backoff == Backoff()


def test_options() -> None:
    args = build_parser().parse_args(
        ["run", "--nproc", "4", "--restart-scope", "group", "--max-restarts", "0",
         "--restart-window", "inf", "--backoff", "0.5:8:3", "--min-uptime", "2",
         "--no-restart-exit-code", "93", "--no-restart-exit-code", "7", "--grace", "1",
         "--", "train"]
    )  # fmt: skip
    policy = _policy(args)
    assert policy.scope is RestartScope.GROUP
    assert (policy.max_restarts, policy.window) == (0, math.inf)
    assert policy.backoff == Backoff(initial=0.5, cap=8.0, factor=3.0)
    assert policy.no_restart_exit_codes == frozenset({93, 7})
    assert args.grace == 1.0


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--backoff", "1:2:3:4", "--", "x"],
        ["run", "--backoff", "1:2:0.5", "--", "x"],
        ["run", "--max-restarts", "-1", "--", "x"],
        ["run", "--min-uptime", "nan", "--", "x"],
    ],
)
def test_bad_options_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run"]) == 2
    assert "no command given" in capsys.readouterr().err


def test_a_command_that_cannot_run_exits_5() -> None:
    # In a process of its own: a run moves its process into the run's cgroup, which
    # must not be this test process (the tests after it would start there).
    done = subprocess.run(
        [sys.executable, "-m", "aiotimer", "run", "--", "/nonexistent/aiotimer-test-command"],
        check=False, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    assert done.returncode == 5, done.stderr
    assert "no such executable" in done.stderr
