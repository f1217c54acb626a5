"""Process limits a watchdog needs raised: one descriptor per watched worker.

The server pins every worker with a pidfd, so it holds one descriptor per live worker
besides its own. A soft ``RLIMIT_NOFILE`` of 1024 (a common default) would make the
1,000th worker impossible to pin; :func:`raise_open_file_limit` lifts the soft limit to
the hard one, which needs no privilege.
"""

from __future__ import annotations

import logging

__all__ = ["raise_open_file_limit"]

logger = logging.getLogger("aiotimer")


def raise_open_file_limit() -> tuple[int, int] | None:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit.

    Returns the ``(soft, hard)`` limits now in force, or ``None`` where the platform has
    no such limit. Never raises: a refusal is logged and the old limits are returned.
    """
    try:
        import resource  # noqa: PLC0415 (POSIX only)
    except ImportError:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard or (hard != resource.RLIM_INFINITY and soft > hard):
        return soft, hard
    target = hard
    if hard == resource.RLIM_INFINITY:
        target = 1 << 20  # Linux's nr_open default: an unlimited hard limit is refused
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError) as exc:
        logger.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, exc)
        return soft, hard
    return target, hard
