"""The many-workers harness: its pure plan and statistics, and a reduced quick run
that must write every output file with the documented schema."""

from __future__ import annotations

import csv
import html
import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the benchmarks live beside the package, not in it

from benchmarks.many_workers.__main__ import _parse, conclude  # noqa: E402
from benchmarks.many_workers.measure import percentiles  # noqa: E402
from benchmarks.many_workers.plan import PROBE_EVERY, Workload, plan_slots  # noqa: E402
from benchmarks.many_workers.report import PLOTS, _html  # noqa: E402
from benchmarks.many_workers.verdicts import (  # noqa: E402
    headline,
    reconciles,
    verdicts,
    warnings,
)


def test_plan_is_deterministic_and_places_every_hang() -> None:
    load = Workload(workers=16, duration=5.0, rate=10.0, timeout=0.5, hangs=40, seed=7)
    slots = plan_slots(load)
    assert slots == plan_slots(load)
    assert len(slots) == 16
    blocks = [b for s in slots for b in s]
    assert all(0.0 <= b.start < 5.0 for b in blocks)
    assert all(0.05 * 0.5 <= b.work <= 0.3 * 0.5 for b in blocks)
    hangs = [b for b in blocks if b.hang]
    # Two draws may pick the same block; nearly all land.
    assert 35 <= len(hangs) <= 40
    assert 0 < sum(b.probe for b in hangs) <= 40 // PROBE_EVERY
    for s in slots:
        assert [b.start for b in s] == sorted(b.start for b in s)


def test_the_training_workload_with_step_work_ends_each_block_within_its_step() -> None:
    args = _parse(["--workload", "training"])
    assert (args.rate, args.timeout, args.hangs, args.work_of) == (2.0, 60.0, 0, None)
    args = _parse(["--workload", "training", "--step-work"])
    assert args.work_of == 0.5
    load = Workload(8, 5.0, args.rate, args.timeout, args.hangs, 1, work_of=args.work_of)
    blocks = [b for s in plan_slots(load) for b in s]
    assert blocks and not any(b.hang for b in blocks)
    assert all(0.05 * 0.5 <= b.work <= 0.3 * 0.5 for b in blocks)


def test_explicit_options_override_the_workload_and_stress_is_the_default() -> None:
    args = _parse(["--workload", "training", "--timeout", "30", "--hangs", "3"])
    assert (args.rate, args.timeout, args.hangs) == (2.0, 30.0, 3)
    args = _parse([])
    assert (args.workload, args.rate, args.timeout, args.hangs, args.work_of) == (
        "stress",
        10.0,
        0.5,
        200,
        None,
    )
    assert _parse(["--quick"]).hangs == 60


def test_percentiles_nearest_rank() -> None:
    values = [float(v) for v in range(1, 1001)]
    assert percentiles(values) == {
        "p50": 500.0,
        "p90": 900.0,
        "p99": 990.0,
        "p99_9": 999.0,
        "max": 1000.0,
    }
    assert percentiles([]) == dict.fromkeys(("p50", "p90", "p99", "p99_9", "max"))


# A worker whose only block is an ingest probe; its sender signals the worker inside the
# acquire, i.e. before the worker starts waiting (as a fast server does), and reports
# whether the reap signal was blocked at that moment.
_PROBE_WORKER = """
import json, math, os, signal, sys, time
from benchmarks.many_workers import worker as w
from benchmarks.many_workers.plan import Block

slots = w.Slots(sys.argv[1], 1)
slots.t0 = time.monotonic()
seen = {}

class Sender:
    def acquire(self, scope, deadline):
        seen["blocked"] = w.REAP_SIGNAL in signal.pthread_sigmask(signal.SIG_BLOCK, [])
        with open(sys.argv[2], "w") as f:
            json.dump(seen, f)
        os.kill(os.getpid(), w.REAP_SIGNAL)
        return True

    def release(self, scope):
        return True

    def finish(self):
        pass

blocks = [Block(0.0, 0.1, hang=True, probe=True)]
w.run_worker(slots, slot=0, blocks=blocks, first=0, timeout=0.5,
             make_sender=Sender, go_fd=-1)
sys.exit(3)  # never reached: only the reap signal ends a hanging block
"""


@pytest.mark.process
@pytest.mark.timeout(30)
def test_reap_signal_before_the_wait_is_taken_at_once(tmp_path: Path) -> None:
    """A signal that comes before the worker's wait must end that wait: with a Python
    handler it could land after the interpreter's last signal check and before the
    sleep's syscall, and the worker slept on (a 'missed' reap). The worker therefore
    keeps the signal blocked and takes it in its wait, where a pending one counts."""
    from benchmarks.many_workers import worker as w  # noqa: PLC0415

    slots_path, seen_path = tmp_path / "slots", tmp_path / "seen.json"
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_PROBE_WORKER), str(slots_path), str(seen_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(seen_path.read_text()) == {"blocked": True}
    slots = w.Slots(str(slots_path))
    assert slots.get(0, w.SIGNUM) == w.REAP_SIGNAL
    assert slots.get(0, w.HANG_DEADLINE) <= slots.get(0, w.SIGNAL_TIME)
    assert slots.get(0, w.HANG_PROBE) == 1.0


@pytest.mark.process
@pytest.mark.timeout(90)
def test_reduced_quick_run_writes_the_report(tmp_path: Path) -> None:
    servers = ["aiotimer"]
    if importlib.util.find_spec("torch") is not None:
        servers.append("torch-file-0.1")
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.many_workers",
            "--quick",
            "--workers",
            "4",
            "--duration",
            "1.5",
            "--hangs",
            "8",
            "--servers",
            ",".join(servers),
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=80,
        check=False,
    )
    assert done.returncode == 0, done.stderr  # measured, whatever the verdicts
    results = json.loads((out / "results.json").read_text())
    assert results["schema"] == "aiotimer.bench.many_workers/1"
    for key in ("python", "loop", "kernel", "cores", "load_average", "commit", "torch"):
        assert key in results["environment"]
    assert [r["server"] for r in results["runs"]] == servers
    for run in results["runs"]:
        assert run["workers"] == 4
        assert set(run["reap_latency_ms"]) >= {"p50", "p90", "p99", "max"}
        for key in ("false_kills", "missed", "cpu_percent", "rss_mb"):
            assert isinstance(run[key], int | float)
        assert run["requests"] > 0
        assert run["reap_latency_ms"]["n"] > 0
        assert run["host_lag_ms"]["n"] > 0  # the harness's own wake-ups, for reference
        reaps = run["reap_latency_ms"]["n"] + run["ingest_lag_ms"]["n"]
        assert 0 <= run["realtime_observed"] <= reaps
    ours = results["runs"][0]
    assert ours["false_kills"] == 0
    assert ours["missed"] == 0
    assert ours["errors"] == 0
    with (out / "results.csv").open() as f:
        rows = list(csv.reader(f))
    assert rows[0][:6] == ["server", "workers", "latency_basis", "n", "reap_p50_ms", "reap_p90_ms"]
    assert rows[0][6:8] == ["reap_p99_ms", "reap_p99_9_ms"]
    assert len(rows) == 1 + len(servers)
    for png in ("latency_cdf.png", "p99_vs_workers.png", "cpu_rss_vs_workers.png"):
        assert (out / png).read_bytes().startswith(b"\x89PNG")
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3
    assert "aiotimer: 0 false kills and 0 missed reaps in every run" in done.stdout
    for run in results["runs"]:
        assert reconciles(run), run
        assert run["hangs_met"] > 0
    # The page opens with what the console says, in words.
    assert html.escape(headline(results["runs"])) in page
    assert "OK: counts reconcile in every run" in page
    assert "<th>false kills</th>" in page and "<th>server CPU %</th>" in page
    assert "Server CPU (% of one core)" in page


def _run(server: str, workers: int, **fields: Any) -> dict[str, Any]:
    """A run's entry in results.json with the fields the verdicts read."""
    run: dict[str, Any] = {
        "server": server,
        "workers": workers,
        "reap_latency_ms": {"p50": 0.5, "p99": 1.0, "n": 150},
        "false_kills": 0,
        "missed": 0,
        "cpu_percent": 1.0,
        "hangs_planned": 10,
        "hangs_met": 8,
        "hangs_skipped": 2,
        "hangs_reaped": 8,
        "missed_hangs": 0,
        "early_kills": 0,
    }
    run.update(fields)
    return run


def test_verdicts_hold_cpu_and_counts_against_the_run() -> None:
    runs = [
        _run("aiotimer", 8, cpu_percent=0.2),
        _run(
            "torch-file-0.1", 8, cpu_percent=0.3, reap_latency_ms={"p50": 40, "p99": 90, "n": 150}
        ),
        _run("aiotimer", 64, cpu_percent=0.9, hangs_skipped=1),
        _run("torch-file-0.1", 64, cpu_percent=0.8),
    ]
    said = dict(verdicts(runs))
    assert said["8 workers: aiotimer server CPU 0.20 % <= torch-file-0.1 0.30 %"]
    assert not said["64 workers: aiotimer server CPU 0.90 % <= torch-file-0.1 0.80 %"]
    assert not reconciles(runs[2])  # 10 planned, 8 met + 1 skipped
    assert not said[
        "counts reconcile in every run: hangs planned = met + skipped, "
        "met = reaped + missed + killed early"
    ]
    assert headline(runs) == (
        "At 8, 64 workers, aiotimer: p99 reap latency at most 1.00 ms, 0 false kills or "
        "missed reaps, server CPU 0.67-1.1x torch-file-0.1's."
    )


def test_warnings_flag_few_samples_and_missed_hangs() -> None:
    runs = [
        _run("aiotimer", 8),
        _run("torch-local-0.1", 8, reap_latency_ms={"p50": 40, "p99": 90, "n": 12}),
        _run("torch-file-0.1", 8, missed_hangs=3, hangs_reaped=5),
    ]
    notes = warnings(runs)
    assert len(notes) == 2
    assert "torch-local-0.1 x 8: its percentiles rest on 12 reaps" in notes[0]
    assert "torch-file-0.1 x 8: 3 hangs were never reaped" in notes[1]
    assert reconciles(runs[2])


def test_verdicts_hold_the_p99_to_the_target_not_only_to_torch() -> None:
    runs = [
        _run("aiotimer", 64, reap_latency_ms={"p50": 1.0, "p99": 23.5, "n": 150}),
        _run("torch-file-0.1", 64, reap_latency_ms={"p50": 30.0, "p99": 90.0, "n": 150}),
    ]
    said = dict(verdicts(runs))
    assert not said["64 workers: aiotimer p99 23.50 ms < 2 ms (aiotimer's target)"]
    assert said["64 workers: aiotimer p99 23.50 ms < best torch p50 30.00 ms"]


def test_a_missed_verdict_exits_1_only_with_check(capsys: pytest.CaptureFixture[str]) -> None:
    runs = [_run("aiotimer", 8, reap_latency_ms={"p50": 1.0, "p99": 23.5, "n": 150})]
    assert conclude(runs, check=False) == 0
    assert "MISSED 8 workers: aiotimer p99 23.50 ms < 2 ms" in capsys.readouterr().out
    assert conclude(runs, check=True) == 1
    assert conclude([_run("aiotimer", 8)], check=True) == 0


def test_a_skipped_server_is_said_at_the_top_of_the_page(tmp_path: Path) -> None:
    for name in PLOTS:
        (tmp_path / name).write_bytes(b"\x89PNG")
    results = {
        "environment": {},
        "config": {"skipped": ["torch-file-0.1: torch is not importable"]},
        "command": "python -m benchmarks.many_workers",
        "runs": [_run("aiotimer", 8)],
    }
    page = _html(results, [["server"], ["aiotimer"]], tmp_path)
    skipped = page.index("SKIPPED torch-file-0.1: torch is not importable")
    assert skipped < page.index('class="headline"') < page.index("<h2>")
