"""Where control sockets live by default."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["MAX_SOCKET_PATH", "default_control_path", "fits_socket"]

#: The longest path a Unix socket can be bound to on Linux (``sun_path`` less the NUL).
MAX_SOCKET_PATH = 107


def fits_socket(path: str | os.PathLike[str]) -> bool:
    """Whether a Unix socket can be bound at ``path`` (it is short enough)."""
    return len(os.fsencode(path)) <= MAX_SOCKET_PATH


def default_control_path(fifo: str | os.PathLike[str]) -> Path:
    """Where a server on FIFO ``fifo`` puts its control socket by default:
    ``<fifo>.control/http.sock`` (a private directory beside the FIFO)."""
    fifo = Path(fifo)
    return fifo.with_name(fifo.name + ".control") / "http.sock"
