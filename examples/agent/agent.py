"""An existing asyncio agent that embeds aiotimer's Supervisor (and its TimerServer).

The agent keeps doing its own work in the same event loop (here: a status line every
half second from ``Supervisor.get_state(server=False)``, and a timed stage of its own
through the embedded server's in-process API), while the supervisor runs two workers, has the timer
server reap the one that hangs, and restarts it. It composes a control plane over the
supervisor, so ``aiotimer status --control PATH`` shows the run from another shell.
Exits with the run's outcome: 0 when every worker finished.

    python examples/agent/agent.py
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from aiotimer import Backoff, RestartPolicy, Supervisor
from aiotimer.control import ControlPlane
from aiotimer.events import Event
from aiotimer.supervisor import format_summary

WORKER = Path(__file__).with_name("worker.py")


def show(event: Event) -> None:
    print(f"event: {event.describe()}", flush=True)


async def report_status(supervisor: Supervisor) -> None:
    """The agent's own periodic work: report what the supervisor sees."""
    while True:
        state = supervisor.get_state(server=False)  # the ranks only: no copy of the timers
        workers = ", ".join(f"{w.rank}:{w.state.value}" for w in state.workers)
        print(f"status: {workers} (restarts in window: {state.restarts_in_window})", flush=True)
        await asyncio.sleep(0.5)


async def main() -> int:
    supervisor = Supervisor(
        [sys.executable, str(WORKER)],
        nproc=2,
        policy=RestartPolicy(max_restarts=2, backoff=Backoff(initial=0.2, cap=2.0)),
        stop_timeout=2.0,
        on_event=show,
    )
    async with supervisor, ControlPlane(supervisor) as control:
        print(f"control socket: {control.path}", flush=True)
        server = supervisor.server
        assert server is not None
        # The agent times a stage of its own on the same server: report-only for the
        # agent's own process (the server never signals itself).
        server.acquire("agent-setup", after=5.0)
        status = asyncio.create_task(report_status(supervisor))
        await asyncio.sleep(0.1)  # ... the agent's own setup work ...
        server.release("agent-setup")
        outcome = await supervisor.wait()
        status.cancel()
    print(format_summary(supervisor.summary), end="")
    print(f"outcome: {outcome.name.lower()}")
    return int(outcome)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
