"""The control API of a :class:`~aiotimer.supervisor.Supervisor`: its routes.

A :class:`~aiotimer.control.ControlPlane` over a supervisor serves them before its
embedded server's own:

* ``GET /v1/state`` is the server's state with the workers as the supervisor sees them
  (one per rank: its state, restarts, current pid) and a ``supervisor`` section;
* ``GET /metrics`` counts workers by the supervisor's states and reports its restarts;
* ``POST /v1/ranks/<rank>/restart`` restarts a worker now (outside the restart budget);
* ``POST /v1/ranks/<rank>/stop`` stops a worker for good;
* ``GET /v1/hang-report`` is the last hang report (its text, summary and every rank's
  stacks; 404 when none was taken).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import TYPE_CHECKING

import msgspec

from aiotimer.control._app import ENDPOINTS, int_param
from aiotimer.control._http import HttpRequest, HttpResponse, error_response, json_response
from aiotimer.control.metrics import CONTENT_TYPE, MetricsSample, RenderedMetrics, sample_of
from aiotimer.control.server import Route
from aiotimer.control.snapshot import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    StatusSnapshot,
    SupervisorInfo,
    status_snapshot,
)
from aiotimer.errors import ServerStateError
from aiotimer.events import by_rank

if TYPE_CHECKING:
    from aiotimer.supervisor import Supervisor, SupervisorState

__all__ = ["SUPERVISOR_ENDPOINTS", "supervised", "supervisor_routes"]

SUPERVISOR_ENDPOINTS = {
    **ENDPOINTS,
    "POST /v1/ranks/<rank>/restart": "restart a worker now (outside the restart budget)",
    "POST /v1/ranks/<rank>/stop": "stop a worker for good",
    "GET /v1/hang-report": "the last hang report: which rank differs, every rank's stacks",
}


def supervised(snap: StatusSnapshot, sup: SupervisorState) -> StatusSnapshot:
    """``snap`` (a server's) with the workers as supervisor ``sup`` sees them.

    One row per rank (its state, restarts and current pid, with the timers the server
    lists for that pid), then any other worker the server lists (its own process); the
    recent reaps and refusals of a process it launched name its rank.
    """
    rows, others = by_rank(sup.workers, snap.workers)
    info = SupervisorInfo(
        run_id=sup.run_id,
        state=sup.state.value,
        command=sup.command,
        nproc=len(sup.workers),
        restarts=sum(w.restarts for w in sup.workers),
        restarts_in_window=sup.restarts_in_window,
        outcome=None if sup.outcome is None else sup.outcome.name.lower(),
        gave_up=sup.gave_up,
        hang_report=sup.hang_report,
    )
    unlisted = snap.workers_total - len(snap.workers)
    ranks = sup.ranks_by_pid
    recent = tuple(
        i if i.pid is None or i.pid not in ranks else msgspec.structs.replace(i, rank=ranks[i.pid])
        for i in snap.recent
    )
    return msgspec.structs.replace(
        snap,
        workers=rows + others,
        workers_total=len(sup.workers) + len(others) + unlisted,
        supervisor=info,
        recent=recent,
    )


def supervisor_routes(sup: Supervisor, *, control: str | None = None) -> list[Route]:
    """The routes that serve ``sup``'s state and operator actions; ``control`` is the
    control socket's path they are served on, if any (shown in the state)."""

    async def index(request: HttpRequest) -> HttpResponse:
        return json_response({"api": 1, "endpoints": SUPERVISOR_ENDPOINTS})

    async def state(request: HttpRequest) -> HttpResponse:
        limit = int_param(request.query, "limit", DEFAULT_LIMIT, 0, MAX_LIMIT)
        server = sup.server
        if server is None:
            return error_response(503, "the supervisor's timer server is not running")
        st = sup.get_state(server=False)
        # Enough rows to find every rank's pid among the server's workers.
        snap = server.snapshot(max(limit, len(st.workers) + 1), sites=limit)
        return json_response(supervised(status_snapshot(snap, control=control), st))

    def sample() -> MetricsSample:
        server = sup.server
        assert server is not None, "checked by the handler"
        workers = sup.get_state(server=False).workers
        return dataclasses.replace(
            sample_of(server.snapshot(0, sites=0, by_state=True)),
            workers=collections.Counter(w.state.value for w in workers),
            restarts=sum(w.restarts for w in workers),
            slowness={w.rank: w.slowness for w in workers if w.slowness is not None},
        )

    rendered = RenderedMetrics(sample)

    async def metrics(request: HttpRequest) -> HttpResponse:
        if sup.server is None:
            return error_response(503, "the supervisor's timer server is not running")
        return HttpResponse(200, rendered.body(), CONTENT_TYPE)

    async def hang_report(request: HttpRequest) -> HttpResponse:
        report = sup.hang_report
        if report is None:
            return error_response(404, "no hang report was taken in this run")
        return json_response({"text": report.to_text(), **report.to_dict()})

    async def restart(request: HttpRequest, rank: str) -> HttpResponse:
        return await act(int(rank), "restart")

    async def stop(request: HttpRequest, rank: str) -> HttpResponse:
        return await act(int(rank), "stop")

    async def act(rank: int, action: str) -> HttpResponse:
        try:
            if action == "restart":
                await sup.restart_workers([rank])
            else:
                await sup.stop_worker(rank)
        except IndexError as exc:
            return error_response(404, str(exc))
        except ServerStateError as exc:
            return error_response(409, str(exc))
        slot = sup.get_state(server=False).workers[rank]
        return json_response(
            {"rank": rank, "state": slot.state.value, "pid": slot.pid, "restarts": slot.restarts}
        )

    return [
        Route("GET", r"/", index),
        Route("GET", r"/v1/state", state),
        Route("GET", r"/metrics", metrics),
        Route("GET", r"/v1/hang-report", hang_report),
        Route("POST", r"/v1/ranks/(?P<rank>[0-9]{1,6})/restart", restart),
        Route("POST", r"/v1/ranks/(?P<rank>[0-9]{1,6})/stop", stop),
    ]
