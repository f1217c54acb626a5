"""The micro-benchmarks still run and print their tables (no speed is asserted).

Each benchmark's ``main()`` runs in-process in its quickest mode; one test also runs the
documented ``python -m benchmarks.bench_table`` form from the repository root.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _repo_root_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))


def test_bench_table_quick(capsys: pytest.CaptureFixture[str]) -> None:
    bench_table = importlib.import_module("benchmarks.bench_table")
    assert bench_table.main(["--quick", "--sizes", "1000,3000", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "live timers" in out
    assert "\n1,000 " in out
    assert "\n3,000 " in out
    assert "cost per op at 3,000 live timers = " in out


def test_bench_codec_quick(capsys: pytest.CaptureFixture[str]) -> None:
    bench_codec = importlib.import_module("benchmarks.bench_codec")
    assert bench_codec.main(["--quick", "--mib", "0.1", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    for row in (
        "decode: json.loads + 4 keys",
        "decode: LineDecoder.feed",
        "1% garbage: LineDecoder.feed",
        "encode: aiotimer.wire.encode",
    ):
        assert row in out
    assert out.count("x\n") >= 7  # every row has its ratio to json


@pytest.mark.process
@pytest.mark.timeout(60)
def test_benchmarks_run_as_modules_from_the_repo_root() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_table", "--quick", "--sizes", "500,1000"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "cost per op at 1,000 live timers" in done.stdout


def test_bench_status_quick(capsys: pytest.CaptureFixture[str]) -> None:
    bench_status = importlib.import_module("benchmarks.bench_status")
    assert bench_status.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "GET /v1/state" in out and "GET /metrics" in out
    assert "a status call (GET /v1/state) costs the loop" in out


@pytest.mark.process
@pytest.mark.timeout(60)
def test_bench_ingest_quick_measures_the_whole_server(capsys: pytest.CaptureFixture[str]) -> None:
    bench_ingest = importlib.import_module("benchmarks.bench_ingest")
    assert bench_ingest.main(["--quick", "--lines", "2000", "--probes", "10"]) in (0, 1)
    out = capsys.readouterr().out
    assert "(a) split-only reader #1" in out
    assert "(b) aiotimer serve #1" in out
    assert "(c) decode-only #1" in out
    assert "incomplete" in out and "/8,000" not in out  # every line was applied or decoded
    assert "ratio (b)/(a): median of 1 paired rounds" in out
    assert "decoding alone, (c)/(a): median " in out
    assert "reap latency while ingest is saturated, deadline -> signal received: " in out


def test_bench_fifo_wake_quick(capsys: pytest.CaptureFixture[str]) -> None:
    bench_fifo_wake = importlib.import_module("benchmarks.bench_fifo_wake")
    assert bench_fifo_wake.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "source adds" in out
    for loop in ("asyncio", "uvloop"):
        assert loop in out


def test_bench_ingest_cpu_quick(capsys: pytest.CaptureFixture[str]) -> None:
    bench_ingest_cpu = importlib.import_module("benchmarks.bench_ingest_cpu")
    assert bench_ingest_cpu.main(["--quick", "--chunk", "4096,16384"]) == 0
    out = capsys.readouterr().out
    for row in ("split only", "decode", "submit", "decode + submit"):
        assert f"{row} (4 KiB reads)" in out and f"{row} (16 KiB reads)" in out


def test_bench_ingest_writers_make_their_lines_from_the_template() -> None:
    bench_ingest = importlib.import_module("benchmarks.bench_ingest")
    template = bench_ingest.lines_template(301)
    lines = bench_ingest.own_lines(template, 4321)
    assert len(lines) == 301 and all(line.endswith(b"\n") for line in lines)
    for mine, theirs in zip(lines, template.splitlines(keepends=True), strict=True):
        assert json.loads(mine) == {**json.loads(theirs), "pid": 4321}


@pytest.mark.process
@pytest.mark.timeout(60)
def test_bench_reap_cpu_quick_reaps_every_hung_worker(capsys: pytest.CaptureFixture[str]) -> None:
    bench_reap_cpu = importlib.import_module("benchmarks.bench_reap_cpu")
    # A worker the server does not reap would hang the round: it ends only when all were.
    assert bench_reap_cpu.main(["--reaps", "3", "--batch", "2", "--no-torch"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("aiotimer"))
    assert row.split()[1] == "3"
    assert float(row.split()[-1]) > 0  # CPU per reap was measured


def test_bench_quota_quick(capsys: pytest.CaptureFixture[str]) -> None:
    bench_quota = importlib.import_module("benchmarks.bench_quota")
    assert bench_quota.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "refusal us" in out and "\n   1,000 " in out
