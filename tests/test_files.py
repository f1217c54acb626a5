"""The one safe opener, on real FIFOs, symlinks, devices, other users' files and open
directories: each refusal is one line naming the path, and nothing ever blocks."""

from __future__ import annotations

import fcntl
import os
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from aiotimer._edges.files import (
    check_private_dir,
    create_exclusive,
    make_private_dir,
    open_owned_append,
    read_owned,
    read_shared,
    remove_owned,
    write_atomic,
)
from aiotimer.errors import UnsafePathError

T = TypeVar("T")
KEEP = b"someone else's, keep it\n"
NOBODY = 65534

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown to another user")


def at_once(call: Callable[[], T]) -> T:
    """``call()``'s result, failing (not hanging) if it blocks for 2 s (on a FIFO)."""
    out: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(2.0)
    assert not thread.is_alive(), "it blocked"
    if errors:
        raise errors[0]
    return out[0]


def refused(call: Callable[[], object], path: Path, problem: str) -> None:
    with pytest.raises(UnsafePathError) as info:
        at_once(call)
    message = str(info.value)
    assert isinstance(info.value, OSError)
    assert "\n" not in message and str(path) in message and problem in message, message


@pytest.fixture
def outside(tmp_path: Path) -> Iterator[Path]:
    """A file a planted symlink points at: never written, never read."""
    target = tmp_path / "outside"
    target.write_bytes(KEEP)
    yield target
    assert target.read_bytes() == KEEP


@pytest.fixture
def foreign(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.skip("needs root to chown to another user")
    path = tmp_path / "foreign"
    path.write_bytes(KEEP)
    os.chown(path, NOBODY, NOBODY)
    return path


# -- reading ------------------------------------------------------------------------


def test_read_owned_reads_a_regular_file_up_to_the_cap(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    assert read_owned(path, 100) == b"x" * 100
    refused(lambda: read_owned(path, 99, what="journal"), path, "100 bytes, more than the 99")
    with pytest.raises(FileNotFoundError):
        read_owned(tmp_path / "missing", 10)


def test_read_owned_never_follows_a_symlink(tmp_path: Path, outside: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(outside)
    refused(lambda: read_owned(link, 1 << 20), link, "symbolic link")
    zero = tmp_path / "zero"
    zero.symlink_to("/dev/zero")
    refused(lambda: read_owned(zero, 1 << 20), zero, "symbolic link")


def test_read_owned_never_blocks_on_a_fifo_or_reads_a_device(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    refused(lambda: read_owned(fifo, 1 << 20), fifo, "it is a FIFO, not a regular file")
    refused(lambda: read_owned(Path("/dev/zero"), 1 << 20), Path("/dev/zero"), "device")


@root_only
def test_read_owned_refuses_another_users_file(foreign: Path) -> None:
    refused(lambda: read_owned(foreign, 1 << 20), foreign, f"belongs to uid {NOBODY}")


@root_only
def test_read_shared_reads_another_users_file_but_never_a_fifo(
    foreign: Path, tmp_path: Path, outside: Path
) -> None:
    data, st = read_shared(foreign, 1 << 20)
    assert data == KEEP and st.st_uid == NOBODY
    fifo, link = tmp_path / "fifo", tmp_path / "link"
    os.mkfifo(fifo)
    link.symlink_to(outside)
    refused(lambda: read_shared(fifo, 1 << 20), fifo, "FIFO")
    refused(lambda: read_shared(link, 1 << 20), link, "symbolic link")
    refused(lambda: read_shared(foreign, 3), foreign, "more than the 3")


# -- appending and creating ---------------------------------------------------------


def test_open_owned_append_creates_appends_and_blocks_on_writes(tmp_path: Path) -> None:
    path = tmp_path / "log"
    for text in (b"one\n", b"two\n"):
        fd = open_owned_append(path, 0o640)
        try:
            assert not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK
            os.write(fd, text)
        finally:
            os.close(fd)
    assert path.read_bytes() == b"one\ntwo\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640 & ~_umask()


def test_open_owned_append_refuses_a_fifo_with_or_without_a_reader(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    refused(lambda: open_owned_append(fifo, what="event log"), fifo, "refusing the event log")
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        refused(lambda: open_owned_append(fifo), fifo, "it is a FIFO, not a regular file")
        assert os.read(reader, 1) == b""  # nothing was written to it
    finally:
        os.close(reader)


def test_open_owned_append_refuses_symlinks_and_hard_links(tmp_path: Path, outside: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(outside)
    refused(lambda: open_owned_append(link), link, "symbolic link")
    hard = tmp_path / "hard"
    os.link(outside, hard)
    refused(lambda: open_owned_append(hard), hard, "other hard links")


@root_only
def test_open_owned_append_refuses_another_users_file(foreign: Path) -> None:
    refused(lambda: open_owned_append(foreign), foreign, f"belongs to uid {NOBODY}")
    assert foreign.read_bytes() == KEEP


def test_create_exclusive_replaces_only_a_stale_file_of_this_user(
    tmp_path: Path, outside: Path
) -> None:
    path = tmp_path / "dump"
    path.write_bytes(b"stale secrets")
    fd = create_exclusive(path, 0o600)
    try:
        os.write(fd, b"new")
    finally:
        os.close(fd)
    assert path.read_bytes() == b"new" and stat.S_IMODE(path.stat().st_mode) == 0o600
    fifo, link = tmp_path / "fifo", tmp_path / "link"
    os.mkfifo(fifo)
    link.symlink_to(outside)
    refused(lambda: create_exclusive(fifo, what="dump file"), fifo, "refusing the dump file")
    refused(lambda: create_exclusive(link), link, "symbolic link")
    assert fifo.is_fifo() and link.is_symlink()


@root_only
def test_create_exclusive_refuses_another_users_file(foreign: Path) -> None:
    refused(lambda: create_exclusive(foreign), foreign, f"belongs to uid {NOBODY}")
    assert foreign.read_bytes() == KEEP


# -- atomic writes and removal ------------------------------------------------------


def test_write_atomic_sets_the_exact_mode_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "marker"
    old = os.umask(0o077)
    try:
        write_atomic(path, b"first", 0o644)
    finally:
        os.umask(old)
    write_atomic(path, b"second", 0o644, durable=False)
    assert path.read_bytes() == b"second"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["marker"]


def test_write_atomic_temporary_names_are_unpredictable_and_cleaned_up(
    tmp_path: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "stats.json"
    old_name = tmp_path / f"stats.json.{os.getpid()}.tmp"
    old_name.symlink_to(outside)  # where the old predictable name pointed
    seen: list[str] = []

    def failing_replace(src: str, dst: object) -> None:
        seen.append(os.path.basename(src))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    for _ in range(2):
        with pytest.raises(OSError, match="No space"):
            write_atomic(path, b"data")
    # The random part is not the pid (which, in a fresh PID namespace, may be "1": a
    # digit of many a random name).
    randoms = {name.removeprefix("stats.json.").removesuffix(".tmp") for name in seen}
    assert len(randoms) == 2 and str(os.getpid()) not in randoms
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outside", old_name.name]


@pytest.mark.parametrize("plant", ["fifo", "symlink", "directory"])
def test_write_atomic_never_replaces_what_is_not_its_own_file(
    tmp_path: Path, outside: Path, plant: str
) -> None:
    path = tmp_path / "journal"
    if plant == "fifo":
        os.mkfifo(path)
    elif plant == "symlink":
        path.symlink_to(outside)
    else:
        path.mkdir()
    refused(lambda: write_atomic(path, b"x", what="journal"), path, f"refusing the journal {path}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["journal", "outside"]


@root_only
def test_write_atomic_and_remove_owned_leave_another_users_file(foreign: Path) -> None:
    refused(lambda: write_atomic(foreign, b"x"), foreign, f"belongs to uid {NOBODY}")
    refused(lambda: remove_owned(foreign), foreign, f"belongs to uid {NOBODY}")
    assert foreign.read_bytes() == KEEP


def test_remove_owned_removes_only_a_regular_file(tmp_path: Path, outside: Path) -> None:
    path, link = tmp_path / "f", tmp_path / "link"
    path.write_bytes(b"x")
    link.symlink_to(outside)
    assert remove_owned(path) is True
    assert remove_owned(path) is False
    refused(lambda: remove_owned(link), link, "symbolic link")
    assert link.is_symlink()


# -- directories --------------------------------------------------------------------


def test_make_private_dir_creates_0700_then_reuses_it(tmp_path: Path) -> None:
    path = tmp_path / "private"
    assert make_private_dir(path) is True
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert make_private_dir(path) is False
    check_private_dir(path)
    with pytest.raises(FileNotFoundError):
        make_private_dir(tmp_path / "missing" / "private")
    with pytest.raises(FileNotFoundError):
        check_private_dir(tmp_path / "missing")


def test_a_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    for mode in (0o770, 0o1777, 0o702):
        os.chmod(shared, mode)
        refused(lambda: make_private_dir(shared), shared, "group or others may write to it")
    os.chmod(shared, 0o755)  # readable is fine: only writes matter
    assert make_private_dir(shared) is False


def test_a_symlink_or_a_file_is_no_private_directory(tmp_path: Path) -> None:
    real, link, file = tmp_path / "real", tmp_path / "link", tmp_path / "file"
    real.mkdir(mode=0o700)
    link.symlink_to(real)
    file.write_bytes(b"")
    refused(lambda: make_private_dir(link, what="control directory"), link, "symbolic link")
    refused(lambda: check_private_dir(file), file, "it is a regular file, not a directory")


@root_only
def test_another_users_directory_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    refused(lambda: make_private_dir(theirs), theirs, f"belongs to uid {NOBODY}")


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old
