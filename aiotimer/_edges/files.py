"""The one safe way to open what aiotimer owns: files and directories of this user only.

Paths the server or supervisor owns (journal, stats file, event log, marker, control
directory, dump directory, run files) may sit in shared directories, so every one is
opened here: no symlink is followed, nothing blocks on a FIFO or a device, only regular
files and directories of this user are used, reads are capped, and writes are atomic.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from aiotimer.wire._dumpfile import ENV_DUMP_DIR, dump_dir_for

__all__ = ["private_dump_dir"]


def private_dump_dir(
    dump_dir: str | os.PathLike[str] | None = None, *, create: bool = True
) -> Path:
    """:func:`dump_dir_for` ``(dump_dir)``, checked: a directory (not a symlink) of this
    user that neither group nor others can write to. Created with mode 0700 when missing
    and ``create`` (its parent must exist).

    Raises:
        OSError: it cannot be created, or it is not private (the message says why).
    """
    path = dump_dir_for(dump_dir)
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"dump directory {path} is not a directory (or a symlink)")
    if st.st_uid != os.geteuid():
        raise PermissionError(
            f"dump directory {path} belongs to uid {st.st_uid}, not to this user "
            f"({os.geteuid()}); refusing it (someone may have planted it). Set "
            f"{ENV_DUMP_DIR} to a directory of your own"
        )
    if st.st_mode & 0o022:
        raise PermissionError(
            f"dump directory {path} is writable by group or others (mode "
            f"{stat.S_IMODE(st.st_mode):04o}); use a private one (chmod 700)"
        )
    return path
