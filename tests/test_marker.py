"""The marker beside a server's FIFO: one writer, one reader, keys easy to add."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from aiotimer._edges.marker import (
    AIOTIMER,
    MARKER_MODE,
    Marker,
    marker_path,
    publish_marker,
    read_live_marker,
    read_marker,
    remove_marker,
    write_marker,
)
from aiotimer.errors import UnsafePathError
from aiotimer.wire import MARKER_SUFFIX


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    return tmp_path / "timer.fifo"


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    return child.pid


def test_written_then_read_back(fifo: Path) -> None:
    marker = Marker(server=AIOTIMER, pid=os.getpid(), version="1.2.3")
    write_marker(fifo, marker, {"dump_dir": "/tmp/d"})
    assert marker_path(fifo) == str(fifo) + MARKER_SUFFIX
    assert stat.S_IMODE(os.stat(marker_path(fifo)).st_mode) == MARKER_MODE
    body = json.loads(Path(marker_path(fifo)).read_text())
    assert body == {"dump_dir": "/tmp/d", "server": "aiotimer", "pid": os.getpid(),
                    "version": "1.2.3", "protocol": 1}  # fmt: skip
    found = read_marker(fifo)
    assert found is not None and found.marker == marker
    assert [p.name for p in fifo.parent.iterdir()] == [fifo.name + MARKER_SUFFIX]


def test_extra_keys_never_override_the_typed_fields(fifo: Path) -> None:
    write_marker(fifo, Marker(server=AIOTIMER, pid=os.getpid()), {"pid": 1, "server": "x"})
    found = read_marker(fifo)
    assert found is not None and found.marker.pid == os.getpid()


def test_unset_fields_are_left_out_and_an_extra_key_fills_one(fifo: Path) -> None:
    write_marker(fifo, Marker(server=AIOTIMER), {"socket": "/run/s.sock"})
    body = json.loads(Path(marker_path(fifo)).read_text())
    assert body == {"server": "aiotimer", "protocol": 1, "socket": "/run/s.sock"}
    found = read_marker(fifo)
    assert found is not None and found.marker.socket == "/run/s.sock"


def test_unknown_keys_are_tolerated_and_missing_ones_default(fifo: Path) -> None:
    Path(marker_path(fifo)).write_text(
        json.dumps({"server": "aiotimer", "pid": 42, "socket": "/run/x.sock", "new": [1]})
    )
    found = read_marker(fifo)
    assert found is not None
    assert found.marker == Marker(server=AIOTIMER, pid=42, socket="/run/x.sock")


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b'{"pid": 42}',  # no server: not ours
        b'{"server": "torch", "pid": 42}',
        b'{"server": "aiotimer", "pid": "42"}',  # wrong type
    ],
)
def test_anything_else_reads_as_no_marker(fifo: Path, content: bytes) -> None:
    Path(marker_path(fifo)).write_bytes(content)
    assert read_marker(fifo) is None


def test_no_file_reads_as_no_marker(fifo: Path) -> None:
    assert read_marker(fifo) is None
    assert read_live_marker(fifo) is None


def test_a_nonpositive_pid_reads_as_unknown(fifo: Path) -> None:
    Path(marker_path(fifo)).write_text('{"server": "aiotimer", "pid": -5}')
    found = read_marker(fifo)
    assert found is not None and found.marker.pid is None


def test_a_dead_servers_marker_is_not_live(fifo: Path) -> None:
    write_marker(fifo, Marker(server=AIOTIMER, pid=dead_pid()))
    assert read_marker(fifo) is not None
    assert read_live_marker(fifo) is None
    write_marker(fifo, Marker(server=AIOTIMER, pid=os.getpid()))
    assert read_live_marker(fifo) is not None


def test_a_new_publication_reads_as_a_different_file(fifo: Path) -> None:
    marker = Marker(server=AIOTIMER, pid=os.getpid())
    write_marker(fifo, marker)
    first = read_marker(fifo)
    assert read_marker(fifo) == first
    write_marker(fifo, marker)  # the same content, published again (a restart)
    second = read_marker(fifo)
    assert first is not None and second is not None
    assert second.marker == first.marker and second != first


def test_remove_leaves_another_servers_marker(fifo: Path) -> None:
    write_marker(fifo, Marker(server=AIOTIMER, pid=os.getpid() + 1))
    remove_marker(fifo)
    assert read_marker(fifo) is not None
    remove_marker(fifo, pid=os.getpid() + 1)
    assert read_marker(fifo) is None
    remove_marker(fifo)  # nothing there: no error


def test_marker_struct_round_trips_through_msgspec() -> None:
    marker = Marker(server=AIOTIMER, pid=7, version="0.1.0")
    assert msgspec.json.decode(msgspec.json.encode(marker), type=Marker) == marker


@pytest.mark.parametrize("plant", ["fifo", "symlink to /dev/zero", "too large"])
def test_a_marker_that_is_no_small_regular_file_reads_as_none_at_once(
    fifo: Path, plant: str
) -> None:
    """A client of any user reads it: a planted FIFO or device never blocks it."""
    path = Path(marker_path(fifo))
    if plant == "fifo":
        os.mkfifo(path)
    elif plant == "too large":
        path.write_bytes(b'{"server": "aiotimer"' + b" " * 70_000 + b"}")
    else:
        path.symlink_to("/dev/zero")
    started = time.monotonic()
    assert read_marker(fifo) is None
    assert read_live_marker(fifo) is None
    assert time.monotonic() - started < 2.0


def test_publishing_never_writes_through_or_replaces_a_planted_file(
    fifo: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep")
    Path(marker_path(fifo)).symlink_to(outside)
    with pytest.raises(UnsafePathError, match=r"refusing the marker .*symbolic link"):
        write_marker(fifo, Marker(server=AIOTIMER, pid=os.getpid()))
    assert outside.read_bytes() == b"keep" and Path(marker_path(fifo)).is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outside", Path(marker_path(fifo)).name]


def test_a_squatted_path_is_taken_back_by_a_rename_never_written_through(
    fifo: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep")
    Path(marker_path(fifo)).symlink_to(outside)
    assert publish_marker(fifo, Marker(server=AIOTIMER, pid=os.getpid())) is None
    found = read_marker(fifo)
    assert found is not None and found.marker.pid == os.getpid()
    assert not Path(marker_path(fifo)).is_symlink() and outside.read_bytes() == b"keep"


def test_a_path_that_cannot_be_taken_back_is_said_in_one_line(
    fifo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Path(marker_path(fifo)).symlink_to("/nowhere")
    monkeypatch.setattr(os, "replace", _refused)
    why = publish_marker(fifo, Marker(server=AIOTIMER, pid=os.getpid()))
    assert why is not None and "\n" not in why
    assert why.startswith(f"refusing the marker {marker_path(fifo)}: it is a symbolic link")
    assert "replacing it failed too (Operation not permitted): serving without a marker" in why
    assert Path(marker_path(fifo)).is_symlink()
    assert [p.name for p in fifo.parent.iterdir()] == [Path(marker_path(fifo)).name]


def _refused(src: object, dst: object) -> None:
    raise PermissionError(1, "Operation not permitted")


def test_a_directory_in_the_way_is_never_replaced(fifo: Path) -> None:
    Path(marker_path(fifo)).mkdir()
    why = publish_marker(fifo, Marker(server=AIOTIMER, pid=os.getpid()))
    assert why is not None and "it is a directory" in why
    assert Path(marker_path(fifo)).is_dir()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the marker away")
def test_a_marker_of_another_owner_than_the_fifos_is_not_trusted(fifo: Path) -> None:
    write_marker(fifo, Marker(server=AIOTIMER, pid=os.getpid(), socket="/tmp/planted.sock"))
    os.chown(marker_path(fifo), 65534, 65534)
    found = read_marker(fifo)
    assert found is not None and found.uid == 65534
    assert read_marker(fifo, owner=0) is None and read_live_marker(fifo, owner=0) is None
    assert read_marker(fifo, owner=65534) == found
