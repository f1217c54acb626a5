"""Which client a block uses when it names none: context-local, process-wide, or the
server the environment names.

A worker that finds its server through the environment also gets the stack-dump hook
(:func:`aiotimer.diagnostics.ensure_dump_handler`), installed by its first block in the
main thread, as :func:`configure` installs it; ``AIOTIMER_DUMP_HOOK=0`` leaves
``SIGUSR1`` alone.

The environment is read once: the FIFO path from ``AIOTIMER_FIFO`` (then torch's
``TORCHELASTIC_TIMER_FILE``) and its :class:`~aiotimer.FifoClient` are cached, and read
again only when one of the two variables changes (``os.environ[...] = ...``,
``monkeypatch.setenv``; a change made behind ``os.environ``'s back with ``os.putenv`` is
not seen by ``os.environ`` either) or after a fork. On CPython a change is detected by
the identity of the stored values (two dict lookups, see :class:`_Reading`), so a worker
found through the environment pays what a worker after :func:`configure` pays. Where
``os.environ`` has no such backing dict, the environment is read for every block.
"""

from __future__ import annotations

import contextvars
import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final

from aiotimer.client._fifo import FifoClient
from aiotimer.client._transport import TimerClient
from aiotimer.errors import NotConfiguredError
from aiotimer.wire import ENV_FIFO, TORCH_ENV_FIFO

__all__ = ["ENV_DUMP_HOOK", "configure", "current_client", "timer_server_configured", "use_client"]

#: Set to ``0`` to keep a worker that finds its server through the environment from
#: installing the stack-dump hook.
ENV_DUMP_HOOK: Final[str] = "AIOTIMER_DUMP_HOOK"

_configured: TimerClient | None = None
_context_client: Final[contextvars.ContextVar[TimerClient | None]] = contextvars.ContextVar(
    "aiotimer_client", default=None
)


def configure(client: TimerClient | None, *, dump_hook: bool = True) -> None:
    """Set the process-wide default client (``None`` removes it).

    Blocks that name no client, in a context without :func:`use_client`, use it.

    With ``dump_hook`` (the default), configuring a client also installs the worker-side
    stack-dump hook (:func:`aiotimer.diagnostics.ensure_dump_handler`: on ``SIGUSR1``
    every thread's stack and every asyncio task's await chain go to a file the server
    reads before reaping; any previous ``SIGUSR1`` handler is still called). It is
    installed only from the main thread and never raises; pass ``dump_hook=False`` to
    leave ``SIGUSR1`` alone.
    """
    global _configured
    _configured = client
    if client is not None and dump_hook:
        _ensure_dump_hook()


def _ensure_dump_hook() -> bool:
    """Install the dump hook unless one is there; whether this thread could (the main
    thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    # Imported on use: a worker that never times a block does not load the dump code.
    from aiotimer.client._dump_hook import ensure_dump_handler  # noqa: PLC0415

    ensure_dump_handler()
    return True


@contextmanager
def use_client(client: TimerClient) -> Iterator[TimerClient]:
    """Within the ``with`` block, in this context only, ``expires()`` uses ``client``.

    The override lives in a :mod:`contextvars` variable: other threads and other asyncio
    tasks (each task runs in a copy of its creator's context) are unaffected.
    """
    token = _context_client.set(client)
    try:
        yield client
    finally:
        _context_client.reset(token)


def current_client() -> TimerClient:
    """The client ``expires()`` would use here and now.

    In order: the context-local override (:func:`use_client`), the process-wide client
    (:func:`configure`), a :class:`FifoClient` for the FIFO named by ``AIOTIMER_FIFO``
    or torch's ``TORCHELASTIC_TIMER_FILE`` (one cached client per path).

    Raises:
        NotConfiguredError: none of these is set.
    """
    client = _context_client.get()
    if client is not None:
        return client
    if _configured is not None:
        return _configured
    client = _environment.client()
    if client is None:
        raise NotConfiguredError(
            "no timer client: call aiotimer.configure(FifoClient(path)) (or use "
            "use_client/expires(client=...)), or run the worker under a timer server: "
            f"`aiotimer serve --fifo PATH` and export {ENV_FIFO}=PATH "
            f"(torch's {TORCH_ENV_FIFO} works too)"
        )
    return client


def timer_server_configured() -> bool:
    """Whether ``expires()`` here has a client whose server may be there, without
    connecting to anything.

    True when a client is set (:func:`use_client`, :func:`configure`: whatever it points
    at), or when the first of ``AIOTIMER_FIFO`` and ``TORCHELASTIC_TIMER_FILE`` that is
    set names a path that is a FIFO now. So True does not prove that a server reads it
    (a crashed server leaves its FIFO behind), and False with a variable set means its
    path is not a FIFO (yet): ``expires()`` would still try that path for the client's
    ``connect_timeout`` and then raise :class:`~aiotimer.errors.ServerUnavailableError`.
    Use it to decide whether to time blocks at all, not as a health check
    (``aiotimer status`` is one).
    """
    if _context_client.get() is not None or _configured is not None:
        return True
    path = _environment.path()
    if path is None:
        return False
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False


@dataclass(frozen=True, slots=True)
class _Reading:
    """One reading of the environment: the answer, and what it was read from: CPython's
    ``os.environ._data`` (encoded names to encoded values) and the value objects stored
    there under the two names. Assigning a variable stores a new object, so the reading
    is current while both lookups still find the very same objects."""

    path: str | None
    client: FifoClient | None
    data: dict[bytes, bytes]
    keys: tuple[bytes, bytes]
    raw: tuple[bytes | None, bytes | None]

    def current(self) -> bool:
        """Whether the environment still says what it said then."""
        data, keys, raw = self.data, self.keys, self.raw
        return data.get(keys[0]) is raw[0] and data.get(keys[1]) is raw[1]


class _Environment:
    """The FIFO the environment names, and its client, read again only on a change."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: dict[str, FifoClient] = {}  # one per path, for the process's life
        self.reading: _Reading | None = None
        #: The dump hook is still to be installed (by the first block in the main thread).
        self.hook_pending = True

    def client(self) -> FifoClient | None:
        """The client for the FIFO the environment names, or ``None``."""
        reading = self.reading
        current = reading is not None and reading.current()
        client = reading.client if current and reading is not None else self._read()[1]
        if self.hook_pending and client is not None:
            self._hook()
        return client

    def _hook(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # cheap: a worker timing blocks only in threads pays this check
        off = os.environ.get(ENV_DUMP_HOOK, "1").strip().lower() in ("0", "false", "no", "off")
        if off or _ensure_dump_hook():
            self.hook_pending = False

    def path(self) -> str | None:
        """The FIFO path the environment names, or ``None``."""
        reading = self.reading
        if reading is not None and reading.current():
            return reading.path
        return self._read()[0]

    def _read(self) -> tuple[str | None, FifoClient | None]:
        environ = os.environ
        data = getattr(environ, "_data", None)
        encodekey = getattr(environ, "encodekey", None)
        keys = raw = None
        if not isinstance(data, dict):
            data = None
        elif encodekey is not None:
            # The raw values first: a change made while reading makes the next call
            # read again rather than keep a path that is already out of date.
            keys = (encodekey(ENV_FIFO), encodekey(TORCH_ENV_FIFO))
            raw = (data.get(keys[0]), data.get(keys[1]))
        path = environ.get(ENV_FIFO) or environ.get(TORCH_ENV_FIFO) or None
        client = None
        if path is not None:
            with self._lock:
                client = self._clients.get(path)
                if client is None:
                    client = self._clients[path] = FifoClient(path)
        if data is not None and keys is not None and raw is not None:
            self.reading = _Reading(path, client, data, keys, raw)
        # Without the backing dict no change could be seen: nothing is cached.
        return path, client

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        self.reading = None


_environment: Final = _Environment()
os.register_at_fork(after_in_child=_environment.after_fork_in_child)
