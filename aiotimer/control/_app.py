"""The control API of a :class:`~aiotimer.server.TimerServer`: its routes.

``GET /v1/state[?limit=N]``, ``GET /v1/events[?since=N&limit=N]``, ``GET /metrics``,
``POST /v1/workers/<pid>/dump[?timeout=S]`` and ``GET /`` (the list of endpoints). Every
handler runs in the server's loop and does bounded work: the reads go through the
server's bounded :meth:`~aiotimer.server.TimerServer.snapshot`, nothing else, and
``/metrics`` is rendered at most once a second
(:class:`~aiotimer.control.metrics.RenderedMetrics`), so a churn of scrapes cannot take
the loop from expiry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Final, TypeVar

from aiotimer.control._http import HttpRequest, HttpResponse, error_response, json_response
from aiotimer.control.metrics import CONTENT_TYPE, RenderedMetrics, sample_of
from aiotimer.control.server import Route
from aiotimer.control.snapshot import DEFAULT_LIMIT, MAX_LIMIT, event_page, status_snapshot
from aiotimer.errors import ControlError

_N = TypeVar("_N", int, float)

if TYPE_CHECKING:
    from aiotimer.server import TimerServer

__all__ = ["MAX_DUMP_TIMEOUT", "server_routes"]

#: The longest stack dump wait an operator may ask for, in seconds.
MAX_DUMP_TIMEOUT: Final[float] = 30.0

ENDPOINTS: Final[dict[str, str]] = {
    "GET /v1/state?limit=N": "the server, its workers and timers, counters, scope statistics",
    "GET /v1/events?since=N&limit=N": "recent events numbered above N",
    "GET /metrics": "Prometheus text format",
    "POST /v1/workers/<pid>/dump?timeout=S": "a stack dump of a worker",
}


def server_routes(server: TimerServer, *, control: str | None = None) -> list[Route]:
    """The routes that serve ``server``'s state and operator actions; ``control`` is the
    control socket's path they are served on, if any (shown in the state)."""

    async def index(request: HttpRequest) -> HttpResponse:
        return json_response({"api": 1, "endpoints": ENDPOINTS})

    async def state(request: HttpRequest) -> HttpResponse:
        limit = int_param(request.query, "limit", DEFAULT_LIMIT, 0, MAX_LIMIT)
        return json_response(status_snapshot(server.snapshot(limit, sites=limit), control=control))

    async def events(request: HttpRequest) -> HttpResponse:
        since = int_param(request.query, "since", 0, 0, 2**62)
        limit = int_param(request.query, "limit", 1000, 0, MAX_LIMIT)
        return json_response(event_page(server.recent_events(since=since, limit=limit)))

    rendered = RenderedMetrics(lambda: sample_of(server.snapshot(0, sites=0, by_state=True)))

    async def metrics(request: HttpRequest) -> HttpResponse:
        return HttpResponse(200, rendered.body(), CONTENT_TYPE)

    async def dump(request: HttpRequest, pid: str) -> HttpResponse:
        timeout = _float(request.query, "timeout", 2.0, 0.0, MAX_DUMP_TIMEOUT)
        worker = int(pid)
        try:
            text = await server.dump_stacks(worker, timeout=timeout)
        except ValueError as exc:  # not one of its workers
            return error_response(404, str(exc))
        return json_response({"pid": worker, "stacks": text})

    return [
        Route("GET", r"/", index),
        Route("GET", r"/v1/state", state),
        Route("GET", r"/v1/events", events),
        Route("GET", r"/metrics", metrics),
        Route("POST", r"/v1/workers/(?P<pid>[0-9]{1,10})/dump", dump),
    ]


def int_param(query: Mapping[str, str], key: str, default: int, low: int, high: int) -> int:
    """Query parameter ``key`` as an integer in ``[low, high]`` (``default`` if absent)."""
    return _param(query, key, default, low, high, kind=int, noun="an integer")


def _float(query: Mapping[str, str], key: str, default: float, low: float, high: float) -> float:
    return _param(query, key, default, low, high, kind=float, noun="a number")


def _param(
    query: Mapping[str, str],
    key: str,
    default: _N,
    low: _N,
    high: _N,
    *,
    kind: Callable[[str], _N],
    noun: str,
) -> _N:
    text = query.get(key)
    if text is None:
        return default
    try:
        value = kind(text)
    except ValueError:
        raise ControlError(f"{key} must be {noun}, got {text!r}") from None
    if not low <= value <= high:
        bounds = f"{low} and {high}" if kind is int else f"{low:g} and {high:g}"
        raise ControlError(f"{key} must be between {bounds}, got {value!r}")
    return value
