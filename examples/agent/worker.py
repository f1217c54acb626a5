"""A worker for agent.py: a few timed steps; rank 1 hangs in its first attempt.

It needs no configuration: ``expires()`` finds the supervisor's timer server through
``AIOTIMER_FIFO``, and ``aiotimer.launch_info()`` says which rank and attempt this is.
"""

from __future__ import annotations

import time

from aiotimer import expires, launch_info


def main() -> None:
    me = launch_info()
    for step in range(3):
        with expires(after=1.0, scope=f"step-{step}"):
            if me.rank == 1 and me.restart_count == 0 and step == 1:
                print(f"rank 1: hanging in step {step}", flush=True)
                time.sleep(3600)  # stuck: the timer server reaps this process
            time.sleep(0.1)
    print(f"rank {me.rank}: done (restart count {me.restart_count})", flush=True)


if __name__ == "__main__":
    main()
