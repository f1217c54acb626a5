"""The statistics file beside the event log: saved atomically, loaded capped, and
nothing planted in its place is waited on, read without bound or written through."""

from __future__ import annotations

import logging
import os
import stat
import time
from pathlib import Path

import pytest

from aiotimer.core._stats import DurationStats
from aiotimer.server._statsfile import MAX_STATS_BYTES, StatsFile, stats_path_for


def sampled() -> DurationStats:
    stats = DurationStats()
    stats.record("train.py:42#1", 1.5)
    return stats


def test_saved_then_loaded_into_a_fresh_run(tmp_path: Path) -> None:
    path = stats_path_for(tmp_path / "events.jsonl")
    assert path.name == "events.jsonl.stats.json"
    StatsFile(path).save(sampled())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [path.name], "no temporary file is left"
    fresh = DurationStats()
    assert StatsFile(path).load_into(fresh) is True
    summary = fresh.summary("train.py:42")
    assert summary is not None and summary.count == 1


@pytest.mark.parametrize("plant", ["fifo", "symlink to /dev/zero", "larger than the cap"])
def test_anything_but_a_small_file_of_ours_is_reported_and_ignored_at_once(
    tmp_path: Path, plant: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "events.jsonl.stats.json"
    if plant == "fifo":
        os.mkfifo(path)
    elif plant == "larger than the cap":
        with path.open("wb") as f:
            f.truncate(MAX_STATS_BYTES + 1)  # sparse: costs no disk
    else:
        path.symlink_to("/dev/zero")
    started = time.monotonic()  # a FIFO or /dev/zero would hang it (pytest-timeout)
    with caplog.at_level(logging.WARNING, logger="aiotimer"):
        assert StatsFile(path).load_into(DurationStats()) is False
    assert time.monotonic() - started < 2.0
    [record] = caplog.records
    assert f"refusing the statistics file {path}" in record.getMessage()


def test_a_save_never_writes_through_or_replaces_a_planted_symlink(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, outside = tmp_path / "events.jsonl.stats.json", tmp_path / "outside"
    outside.write_bytes(b"keep")
    path.symlink_to(outside)
    (tmp_path / f"{path.name}.{os.getpid()}.tmp").symlink_to(outside)  # the old temp name
    with caplog.at_level(logging.ERROR, logger="aiotimer"):
        StatsFile(path).save(sampled())
    assert "could not save statistics" in caplog.text and "symbolic link" in caplog.text
    assert outside.read_bytes() == b"keep" and path.is_symlink()
    assert len(list(tmp_path.iterdir())) == 3, "no temporary file is left"
