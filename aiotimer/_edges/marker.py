"""The marker file beside an aiotimer server's FIFO: written by the server, read by clients.

Beside the FIFO ``P`` of an aiotimer server lies ``P + MARKER_SUFFIX``, one JSON object
that says an aiotimer server (not torch's) reads the pipe, so a client may keep one
descriptor open and send aiotimer's extension keys. It is written atomically (a temporary
file renamed over it) once the server reads, and removed when it stops; both through
:mod:`aiotimer._edges.files`, so a symlink or another user's file in its place is
refused, never written through or replaced.

The keys are the fields of :class:`Marker`. To publish something new (another socket,
an identity), add a field with a default: older readers ignore keys they do not know,
and newer readers see the default in an older server's marker. Readers never raise: a
missing, unreadable or malformed marker, or one naming another kind of server, reads as
no marker at all (the client then talks to the FIFO the way torch's server needs). A
reader may be another user than the server, so it accepts a marker of any owner, but
only a regular file (never a symlink, a FIFO or a device, which could block it) of at
most :data:`_MAX_MARKER_BYTES`, and only one of the FIFO's own owner when it says whose
FIFO it reads (``owner``): the server that made the FIFO wrote the marker, so one of
another user was planted (it could name a socket the planter listens on).

A server that cannot publish (the marker's path is squatted: another user's file, a
symlink) replaces what is there by a rename, which never opens or follows it; where
even that is refused (another user's file in a sticky directory), it serves without a
marker (:func:`publish_marker` says so in one line): clients then take it for torch's
server, which is slower but safe, and ignore the squatter's file, whose owner is not
the FIFO's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import msgspec

from aiotimer._edges.files import read_shared, remove_owned, write_atomic
from aiotimer.errors import UnsafePathError
from aiotimer.wire import MARKER_SUFFIX, PROTOCOL_VERSION

__all__ = [
    "AIOTIMER",
    "MARKER_MODE",
    "Marker",
    "MarkerFile",
    "marker_path",
    "publish_marker",
    "read_live_marker",
    "read_marker",
    "remove_marker",
    "write_marker",
]

#: The marker's permission bits: clients of other users may need to read it.
MARKER_MODE: Final[int] = 0o644
#: The most of a marker file a reader reads (a marker is a few hundred bytes).
_MAX_MARKER_BYTES: Final[int] = 65536
#: The ``server`` of every aiotimer marker.
AIOTIMER: Final[str] = "aiotimer"


class Marker(msgspec.Struct, frozen=True, kw_only=True):
    """What the marker says: which server reads the FIFO, and what else it offers.

    Unknown keys are ignored on reading (a newer server's marker still reads).
    """

    #: Always :data:`AIOTIMER`: a marker without it, or with another value, is not ours.
    server: str
    #: The process reading the FIFO (a client checks it is alive).
    pid: int | None = None
    #: The aiotimer version of that server.
    version: str | None = None
    #: The wire protocol version (torch's lines: ``1``).
    protocol: int = PROTOCOL_VERSION
    #: The path of the server's Unix socket for the same requests, if it offers one.
    socket: str | None = None
    #: The device and inode of the FIFO the server reads: a client refuses a path that
    #: now names another file (e.g. replaced by a symlink to someone else's FIFO).
    fifo_dev: int | None = None
    fifo_ino: int | None = None
    #: The path of the server's control socket (``aiotimer status``), if it serves one.
    control: str | None = None
    #: The FIFO's bell, if it has one: a client writes a byte there after an acquire
    #: with less than ``bell_lead`` seconds to its deadline, so the server reads the
    #: FIFO at once rather than at its trickle pace (:mod:`aiotimer.sources._bell`).
    #: The byte says the acquire's lead (:mod:`aiotimer._edges.ring`), which the server
    #: paces its reads by for at least ``bell_window`` seconds: a client that rang for
    #: a lead need not ring again within that time for one as long or longer (absent:
    #: ring every time).
    bell: str | None = None
    bell_lead: float | None = None
    bell_window: float | None = None
    #: The server times blocks by the worker's own clock: a client stamps both lines of
    #: a block with the ``at`` extension (to name stragglers, docs/stragglers.md).
    stamps: bool | None = None

    def reads(self, st: os.stat_result) -> bool:
        """Whether the file ``st`` describes is the FIFO this server reads (``True`` when
        the marker does not say, as older servers' markers do not)."""
        if self.fifo_ino is None or self.fifo_dev is None:
            return True
        return (st.st_dev, st.st_ino) == (self.fifo_dev, self.fifo_ino)


@dataclass(frozen=True, slots=True)
class MarkerFile:
    """A marker as read from disk, with the identity of the file it was read from.

    A server that publishes again (a restart, even in the same process) writes a new
    file, so two reads compare equal only while the same publication is in place.
    """

    marker: Marker
    inode: int
    mtime_ns: int
    #: The uid that owns the marker file.
    uid: int = -1


_decoder: Final = msgspec.json.Decoder(Marker)


def marker_path(fifo_path: str | os.PathLike[str]) -> str:
    """Where the marker of the FIFO at ``fifo_path`` lives."""
    return os.fspath(fifo_path) + MARKER_SUFFIX


def read_marker(
    fifo_path: str | os.PathLike[str], *, owner: int | None = None
) -> MarkerFile | None:
    """The marker beside ``fifo_path``, or ``None`` if there is no readable aiotimer one
    (or, with ``owner``, the FIFO's owner, none of that uid: see the module docs)."""
    try:
        data, st = read_shared(marker_path(fifo_path), _MAX_MARKER_BYTES, what="marker")
        marker = _decoder.decode(data)
    except (OSError, msgspec.DecodeError):
        return None
    if marker.server != AIOTIMER or (owner is not None and st.st_uid != owner):
        return None
    if marker.pid is not None and marker.pid <= 0:
        marker = msgspec.structs.replace(marker, pid=None)
    return MarkerFile(marker, st.st_ino, st.st_mtime_ns, st.st_uid)


def read_live_marker(
    fifo_path: str | os.PathLike[str], *, owner: int | None = None
) -> MarkerFile | None:
    """Like :func:`read_marker`, but ``None`` also when the named server has died
    (a stale marker left behind by a server that was killed)."""
    found = read_marker(fifo_path, owner=owner)
    if found is None:
        return None
    pid = found.marker.pid
    if pid is not None and pid != os.getpid():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # alive, owned by another user
    return found


def write_marker(
    fifo_path: str | os.PathLike[str],
    marker: Marker,
    extra: Mapping[str, object] | None = None,
) -> None:
    """Publish ``marker`` (plus ``extra`` keys, which never override its fields that are
    set) atomically beside ``fifo_path``, with mode :data:`MARKER_MODE`. Fields that are
    ``None`` are left out.

    Raises:
        UnsafePathError: something other than a regular file of this user is in the
            marker's place (left there).
        OSError: it cannot be written.
    """
    body: dict[str, object] = dict(extra or {})
    body.update((k, v) for k, v in msgspec.to_builtins(marker).items() if v is not None)
    # Not durable: after a reboot no marker is true anyway (it names a server's pid).
    write_atomic(
        marker_path(fifo_path), msgspec.json.encode(body), MARKER_MODE, durable=False, what="marker"
    )


def publish_marker(
    fifo_path: str | os.PathLike[str],
    marker: Marker,
    extra: Mapping[str, object] | None = None,
) -> str | None:
    """:func:`write_marker`, and when the path is squatted (a symlink, another user's
    file), replace the squatter by a rename (never opened, never followed). Never
    raises: returns ``None`` once published, else why not, in one line (the caller
    serves on without a marker; see the module docs).
    """
    try:
        write_marker(fifo_path, marker, extra)
    except UnsafePathError as exc:
        squatted = exc
    except OSError as exc:
        return f"cannot publish the marker {marker_path(fifo_path)}: {exc}"
    else:
        return None
    body: dict[str, object] = dict(extra or {})
    body.update((k, v) for k, v in msgspec.to_builtins(marker).items() if v is not None)
    try:
        write_atomic(
            marker_path(fifo_path),
            msgspec.json.encode(body),
            MARKER_MODE,
            durable=False,
            what="marker",
            replace=True,
        )
    except OSError as exc:
        return (
            f"{squatted}; replacing it failed too ({exc.strerror or exc}): serving without "
            "a marker, so clients take this server for torch's (one open per request, no "
            "socket or control socket found through the FIFO)"
        )
    return None


def remove_marker(fifo_path: str | os.PathLike[str], pid: int | None = None) -> None:
    """Remove the marker beside ``fifo_path`` if it names ``pid`` (default: this process);
    a marker another server published since is left alone.

    Raises:
        UnsafePathError: the marker naming ``pid`` is another user's file (left there).
        OSError: it cannot be removed.
    """
    found = read_marker(fifo_path)
    if found is not None and found.marker.pid == (os.getpid() if pid is None else pid):
        remove_owned(marker_path(fifo_path), what="marker")
