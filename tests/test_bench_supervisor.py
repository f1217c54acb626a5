"""The supervisor benchmark still runs and prints its table (no speed is asserted)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.process
@pytest.mark.timeout(60)
def test_bench_supervisor_quick(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    bench = importlib.import_module("benchmarks.bench_supervisor")
    assert bench.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "restart gap, median of 3" in out
    assert "supervisor CPU during it" in out
