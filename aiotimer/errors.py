"""Typed exceptions shared by every aiotimer module.

A flat list: each class says in its docstring when it is raised. Catch
:class:`AiotimerError` to handle any of them.
"""

from __future__ import annotations

__all__ = [
    "AiotimerError",
    "ClientBackpressureError",
    "ClusterError",
    "ControlError",
    "EventLogError",
    "LaunchError",
    "LeaseLostError",
    "MissingExtraError",
    "NodeNameTakenError",
    "NotConfiguredError",
    "ProcessGoneError",
    "ReapError",
    "RefusedTargetError",
    "ServerStateError",
    "ServerUnavailableError",
    "SourceError",
    "StoreUnavailableError",
    "UnsafePathError",
]


class AiotimerError(Exception):
    """Base of every aiotimer error."""


class ServerUnavailableError(AiotimerError):
    """No timer server is reachable (the message says what to do)."""


class NotConfiguredError(AiotimerError):
    """No client configured and none discoverable."""


class ClientBackpressureError(AiotimerError):
    """The server's pipe stayed full past the bound."""


class SourceError(AiotimerError):
    """A request source cannot be opened (e.g. the path exists and is not our FIFO)."""


class ReapError(AiotimerError):
    """A reap (signal) failed: permission denied, refused target, ..."""


class ProcessGoneError(ReapError):
    """The pinned worker process no longer exists (or its pid was recycled)."""


class RefusedTargetError(ReapError):
    """The server refuses to signal this target (pid <= 1, itself, its own group)."""


class ServerStateError(AiotimerError):
    """A lifecycle misuse (start twice, etc.)."""


class MissingExtraError(AiotimerError):
    """An optional feature was asked for without its extra installed (the message names it)."""


class ClusterError(AiotimerError):
    """A failure of the cluster layer (etcd store, node publisher, job-wide restarts)."""


class StoreUnavailableError(ClusterError):
    """The store (etcd) cannot be reached; callers retry, publishers keep workers running."""


class LeaseLostError(ClusterError):
    """A write named a lease the store no longer has (it expired): grant a new one."""


class NodeNameTakenError(ClusterError):
    """Another live node of the job already publishes under this node name."""


class EventLogError(AiotimerError):
    """The event log file cannot be opened for appending (the message says why)."""


class LaunchError(AiotimerError):
    """A supervised worker's command cannot be run (not found, not executable)."""


class ControlError(AiotimerError):
    """The control socket cannot be set up (path too long, taken by a live server, not a
    socket), or a control request failed (the message has the server's answer)."""


class UnsafePathError(AiotimerError, OSError):
    """A file or directory aiotimer owns is refused: a symlink, a FIFO or a device where
    a regular file belongs, another user's, open to others' writes, or too large to read
    (the message names the path, what is wrong and what to do)."""
