"""Where the journal lives, so that no other user can switch it off.

The journal's path (``<fifo>.journal`` by default) is for the journal only, so each write
renames a new file over whatever is there (:func:`~aiotimer._edges.files.write_atomic`
with ``replace``): another user's file, a symlink or a FIFO planted there is taken back,
never opened, read, followed or written.

The kernel refuses that rename for another user's file in a sticky directory (``/tmp``)
unless the server may override the sticky bit (root, ``CAP_FOWNER``), and nothing takes
a directory's place. Then the journal goes to the **fallback**, a file in a private
directory of this user that no other user can create or enter:
``$XDG_RUNTIME_DIR/aiotimer-journals/`` (a per-user directory of the session), else
``$XDG_STATE_HOME/aiotimer-journals/`` (``~/.local/state/...``, made if missing),
named after the path (``<name>-<hash of the path>.journal``), so that the next server on
the same path finds it. Said once, in a warning line. Once the path can be written
again, the fallback is removed.

Reading: the path if it holds a regular file of this user (anything else is reported
and ignored: a planted journal is never believed), else the fallback. Blocking: the
journal calls it from its writer thread, and to load and keep.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from pathlib import Path
from typing import Final

from aiotimer._edges.files import make_private_dir, read_owned, remove_owned, write_atomic
from aiotimer.errors import UnsafePathError

__all__ = ["JournalFile", "fallback_path"]

logger = logging.getLogger("aiotimer")

_WHAT: Final[str] = "journal"
#: The fallback directory's name, in the per-user directory.
_FALLBACK_DIR: Final[str] = "aiotimer-journals"


def fallback_path(path: Path) -> Path | None:
    """The fallback file of the journal ``path`` (see the module docs; ``None``: this
    user has no home to put it in); its directory may not exist yet."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    state = os.environ.get("XDG_STATE_HOME")
    if runtime:
        base = Path(runtime)
    elif state:
        base = Path(state)
    else:
        try:
            base = Path.home() / ".local" / "state"
        except (RuntimeError, KeyError):  # no $HOME, no password entry
            return None
    real = Path(os.path.realpath(path.parent)) / path.name
    digest = hashlib.sha256(os.fsencode(real)).hexdigest()[:16]
    return base / _FALLBACK_DIR / f"{path.name}-{digest}.journal"


def _held(exc: OSError) -> bool:
    """Whether ``exc`` says something the server may not replace holds the path (not a
    full disk, say, which the fallback would not cure)."""
    return isinstance(exc, (PermissionError, UnsafePathError))


class JournalFile:
    """The journal's file at ``path``, or at its fallback while ``path`` is held by what
    the server may not replace (see the module docs). Blocking: call it off the loop."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fallback = fallback_path(path)
        self._elsewhere = False  # written to (or read from) the fallback
        self._said = False  # the move to the fallback was said
        self._fallback_checked = False  # a stale fallback was looked for after a write

    @property
    def where(self) -> Path:
        """Where the journal is now: ``path``, or the fallback."""
        return self._fallback if self._elsewhere and self._fallback is not None else self.path

    def read(self, max_bytes: int) -> bytes | None:
        """The journal (``None``: there is none, or none that may be believed)."""
        for each in (self.path, self._fallback):
            if each is None:
                continue
            try:
                data = read_owned(each, max_bytes, what=_WHAT)
            except FileNotFoundError:
                continue
            except OSError as exc:
                logger.error("cannot read journal %s (%s); ignored", each, exc)
                continue
            self._elsewhere = each == self._fallback
            return data
        return None

    def write(self, data: bytes) -> None:
        """Replace the journal with ``data``, at ``path`` or, where it is held, at the
        fallback.

        Raises:
            OSError: neither can be written.
        """
        try:
            write_atomic(self.path, data, 0o600, durable=False, what=_WHAT, replace=True)
        except OSError as exc:
            if self._fallback is None or not _held(exc):
                raise
            self._write_fallback(self._fallback, data, exc)
            return
        if self._fallback is not None and (self._elsewhere or not self._fallback_checked):
            self._fallback_checked = True
            with contextlib.suppress(OSError):  # stale, or none: the path is the journal
                remove_owned(self._fallback, what=_WHAT)
            if self._said:
                logger.warning("journal %s is written at its path again", self.path)
            self._elsewhere = self._said = False

    def _write_fallback(self, fallback: Path, data: bytes, held: OSError) -> None:
        try:
            if not os.environ.get("XDG_RUNTIME_DIR"):  # the state home may be new
                fallback.parent.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            make_private_dir(fallback.parent, what="journal directory")
            # Not durable: after a reboot the journal is void anyway (its boot id differs).
            write_atomic(fallback, data, 0o600, durable=False, what=_WHAT)
        except OSError as exc:
            raise OSError(f"{held}; and at {fallback}: {exc.strerror or exc}") from exc
        if not self._said:
            self._said = True
            logger.warning(
                "journal %s: the path is held by what this server may not replace (%s); "
                "journaling to %s, in a private directory of this user, instead",
                self.path,
                held,
                fallback,
            )
        self._elsewhere = True

    def remove(self) -> None:
        """Delete the journal (a stop with no live timer that would signal).

        Raises:
            OSError: it cannot be removed; something else at ``path`` is left alone.
        """
        if self._fallback is not None:
            with contextlib.suppress(OSError):
                remove_owned(self._fallback, what=_WHAT)
        if not self._elsewhere:
            remove_owned(self.path, what=_WHAT)
