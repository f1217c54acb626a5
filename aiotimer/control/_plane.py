"""The control plane an owner composes around a timer server or a supervisor.

The timer server knows nothing of it: :class:`ControlPlane` reads the server through its
public view (:meth:`~aiotimer.server.TimerServer.snapshot`, ``recent_events``,
``dump_stacks``), names its socket in the FIFO's marker through
:meth:`~aiotimer.server.TimerServer.advertise`, and reports refused peers through
:meth:`~aiotimer.server.TimerServer.emit`.

It is its own failure domain: its listeners run in a task it owns (the lifecycle of
:mod:`aiotimer._edges.lifecycle`), never in the server's task group. Whatever happens to
it (a flood of connections, ``accept()`` out of descriptors, a handler raising, a crash)
is logged and stays there: the server keeps reaping. Its listeners leave the server a
reserve of file descriptors for pinning workers. The rules each listener serves by
are in :mod:`aiotimer.control._listen` and :mod:`aiotimer.control.server`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import anyio

from aiotimer._edges.lifecycle import LifecycleState, OwnedTask, TaskOwner
from aiotimer._edges.limits import DescriptorReserve
from aiotimer.control._app import server_routes
from aiotimer.control._http import PeerCredentials
from aiotimer.control._paths import default_control_path, fits_socket
from aiotimer.control._supervisor_app import supervisor_routes
from aiotimer.control.server import (
    MAX_CONNECTIONS,
    REQUEST_TIMEOUT,
    ControlServer,
    Route,
    serve_tcp,
)
from aiotimer.errors import ControlError, ServerStateError
from aiotimer.events import ControlRefused
from aiotimer.server import TimerServer
from aiotimer.supervisor import Supervisor

__all__ = ["ControlPlane"]

logger = logging.getLogger("aiotimer.control")


class ControlPlane(TaskOwner):
    """Serves a timer server's (or a supervisor's) state and operator actions: the
    control socket (HTTP/1.1 + JSON on a Unix socket, see :mod:`aiotimer.control`) and,
    optionally, ``GET /metrics`` over TCP on ``127.0.0.1``.

    ::

        async with TimerServer(fifo=path) as server, ControlPlane(server):
            ...  # aiotimer status --fifo path

        async with Supervisor(cmd, nproc=4) as sup, ControlPlane(sup, path=ctl):
            ...  # aiotimer status --control ctl; restart and stop by rank

    or ``await plane.start()`` ... ``await plane.aclose()``, in the target's event loop.
    It may start before a timer server does (it then shows it ``created``, then
    ``starting``), so the marker names the socket from its first write; a supervisor
    must be started first (its server and FIFO exist from then on).

    Args:
        target: the :class:`~aiotimer.TimerServer`, or a started
            :class:`~aiotimer.Supervisor` (its workers by rank, restart and stop, then
            its server's routes).
        path: the control socket: a path, ``True`` for the default beside the FIFO
            (``<fifo>.control/http.sock``, see
            :func:`~aiotimer.control.default_control_path`), or ``False`` for none.
            The FIFO's marker names it while the plane serves.
        metrics_port: also serve ``GET /metrics`` over TCP on ``127.0.0.1`` at this port
            (``0``: any free port, see :attr:`metrics_port`), for scrapers that cannot
            read a Unix socket (no peer check there: metrics only).
        routes: further routes, matched before the built-in ones.
        max_connections: connections each listener serves at once; at the cap a new
            one takes the place of the one that has waited longest for its peer (for
            a request, or to take an answer), or is closed when all are busy.
        request_timeout: seconds a connection may take to send each request (or to take
            its answer) before it is closed.
        fd_reserve: file descriptors kept free for the server (it needs one per worker
            it pins): a connection that leaves fewer is closed at once. Default
            :data:`~aiotimer._edges.limits.DEFAULT_FD_RESERVE` (64), or a quarter of
            the soft ``RLIMIT_NOFILE`` when that is less, read at :meth:`start`.

    Raises (from :meth:`start`):
        ControlError: the socket's path is taken by a live server or by something else,
            or too long, or its directory is not private; the port cannot be bound;
            ``path=True`` and the server has no FIFO to put the socket beside.
        ServerStateError: a supervisor that has not started; a plane already started.
    """

    def __init__(
        self,
        target: TimerServer | Supervisor,
        *,
        path: str | os.PathLike[str] | bool = True,
        metrics_port: int | None = None,
        routes: Sequence[Route] = (),
        max_connections: int = MAX_CONNECTIONS,
        request_timeout: float = REQUEST_TIMEOUT,
        fd_reserve: int | None = None,
    ) -> None:
        if max_connections < 1 or not request_timeout > 0:
            raise ValueError("max_connections must be >= 1 and request_timeout > 0 seconds")
        if fd_reserve is not None and fd_reserve < 0:
            raise ValueError(f"fd_reserve must be >= 0, got {fd_reserve}")
        if metrics_port is not None and not 0 <= metrics_port <= 65535:
            raise ValueError(f"metrics_port must be 0..65535, got {metrics_port}")
        self._target = target
        self._path_arg = path
        self._port_arg = metrics_port
        self._routes = tuple(routes)
        self._max_connections = max_connections
        self._request_timeout = request_timeout
        self._fd_reserve = fd_reserve
        self._life = OwnedTask("control plane")
        self._path: Path | None = None
        self._port: int | None = None

    @property
    def path(self) -> Path | None:
        """The control socket's path while the plane serves one (else ``None``)."""
        return self._path

    @property
    def metrics_port(self) -> int | None:
        """The TCP port ``/metrics`` is served on, once bound (else ``None``)."""
        return self._port

    async def start(self) -> None:
        """Bind the listeners and start serving; return once they accept connections.

        Raises:
            ControlError: see the class docs.
            ServerStateError: see the class docs.
        """
        if self._life.state not in (LifecycleState.CREATED, LifecycleState.STOPPED):
            raise ServerStateError(f"cannot start a {self._life.state.value} control plane")
        server, extra = self._resolve()
        path = self._socket_path(server)
        await self._life.start(
            lambda ready: self._serve(ready, server, path, extra), name="aiotimer-control"
        )

    async def aclose(self) -> None:
        """Stop serving (the socket file is removed, the marker no longer names it).
        Idempotent; awaited in the loop the plane runs in."""
        await super().aclose()

    def _resolve(self) -> tuple[TimerServer, Callable[[str | None], list[Route]]]:
        """The server, and the target's own routes for a control path."""
        target = self._target
        if isinstance(target, TimerServer):
            return target, lambda control: []
        server = target.server
        if server is None:
            raise ServerStateError("start the supervisor before its control plane")
        return server, lambda control: supervisor_routes(target, control=control)

    def _socket_path(self, server: TimerServer) -> Path | None:
        if self._path_arg is False:
            return None
        if self._path_arg is not True:
            return Path(self._path_arg)
        fifo = server.fifo_path
        if fifo is None:
            raise ControlError(
                "no default control socket: the server has no FIFO to put it beside; "
                "pass path=PATH (or path=False)"
            )
        path = default_control_path(fifo)
        if not fits_socket(path):
            logger.warning(
                "no control socket: the default path %s is too long for a Unix socket; "
                "pass a shorter control path",
                path,
            )
            return None
        return path

    async def _serve(
        self,
        ready: Callable[[], None],
        server: TimerServer,
        path: Path | None,
        own_routes: Callable[[str | None], list[Route]],
    ) -> None:
        control = None if path is None else str(path)
        routes = [*self._routes, *own_routes(control), *server_routes(server, control=control)]

        def refused(peer: PeerCredentials) -> None:
            server.emit(ControlRefused(time=time.time(), pid=peer.pid, uid=peer.uid))

        # Read now: the server raised the soft limit when it started.
        reserve = (
            DescriptorReserve.for_limit()
            if self._fd_reserve is None
            else DescriptorReserve(self._fd_reserve)
        )

        async with anyio.create_task_group() as tg:
            if path is not None:
                unix = ControlServer(
                    path,
                    routes,
                    on_refused=refused,
                    max_connections=self._max_connections,
                    request_timeout=self._request_timeout,
                    reserve=reserve,
                )
                await tg.start(unix.serve)
            if self._port_arg is not None:
                metrics = [r for r in routes if (r.method, r.pattern) == ("GET", "/metrics")]
                self._port = await tg.start(
                    _serve_metrics,
                    metrics[:1],
                    self._port_arg,
                    self._max_connections,
                    self._request_timeout,
                    reserve,
                )
            self._path = path
            _advertise(server, control)
            ready()
            try:
                await self._life.wait_stop_requested()
            finally:
                if control is not None:
                    _advertise(server, None)
                self._path = self._port = None
                tg.cancel_scope.cancel()

    def __repr__(self) -> str:
        where = [f"socket {self._path}"] if self._path is not None else []
        where += [f"metrics 127.0.0.1:{self._port}"] if self._port is not None else []
        return f"<ControlPlane {self._life.state.value}{': ' if where else ''}{', '.join(where)}>"


async def _serve_metrics(
    routes: list[Route],
    port: int,
    max_connections: int,
    request_timeout: float,
    reserve: DescriptorReserve,
    *,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    await serve_tcp(
        routes,
        port,
        max_connections=max_connections,
        request_timeout=request_timeout,
        reserve=reserve,
        task_status=task_status,
    )


def _advertise(server: TimerServer, control: str | None) -> None:
    """Name (``None``: stop naming) the control socket in the server's FIFO marker (a
    marker that cannot be written is logged by the server: the plane serves on
    regardless)."""
    server.advertise(control=control)
