"""Many real worker processes against aiotimer's server and torch's, side by side.

Run from the repository root (needs the ``bench`` extra: ``pip install -e ".[bench]"``)::

    python -m benchmarks.many_workers                      # 8, 64, 256, 512 workers
    python -m benchmarks.many_workers --quick --out DIR    # under 2 minutes on 2 cores
    python -m benchmarks.many_workers --workers 8,512 --servers aiotimer,torch-file-0.1
    python -m benchmarks.many_workers --workload training --servers aiotimer,torch-file-0.1

**Workload** (:mod:`.plan`): every worker slot runs timed blocks at ``--rate`` per
second, each with ``--timeout`` seconds to its deadline and a short random amount of
work; ``--hangs`` of them, spread over slots and time, hang instead. ``--workload``
names the two loads it is run at: ``stress`` (the default: 10 blocks/s, 0.5 s
timeouts, 200 hangs) and ``training`` (a training loop: 1 block per step, 2 steps/s,
60 s timeouts, no hangs); an explicit ``--rate``, ``--timeout`` or ``--hangs``
overrides the preset's. A block's work is 5-30 % of its timeout (so a training run's
blocks overlap: ~10 open per worker), or with ``--step-work`` of its step (each ends
within its step: few open at once, which makes torch's polling cheap). The plan is fixed
by ``--seed`` and identical for every server. Workers are forked from the harness,
which has already imported everything they use, so hundreds start within seconds.

**Open loop** (:mod:`.worker`): each acquire carries its *planned* deadline and is sent
at its planned start (a block the worker reaches more than half a timeout late is
skipped and counted), so a server that falls behind cannot slow the workload down and
hide its own latency (no coordinated omission); latency runs from the planned deadline.

**Observing the reap**: workers ask to be reaped with ``SIGTERM``, keep it blocked and
wait for it in ``sigtimedwait`` (a Python signal handler can be deferred for as long as
a sleep lasts); a hung worker waits at the lowest real-time priority where the harness
may set one (root or ``CAP_SYS_NICE``; ``realtime_observed`` counts those reaps), so
that its signal is timed when it arrives, not when a busy host next lets the worker run.
On it they write ``time.monotonic()`` (``CLOCK_MONOTONIC``, one clock for all processes)
into a shared memory slot and exit, and the parent sees the exit on a pidfd. So each
reap has two times: the first signal and the process gone. torch's ``LocalTimerServer``
can only ``SIGKILL``: its runs are measured at the exit (``latency_basis`` ``"exit"``),
which favours it slightly less than the others' first-signal times favour them (a few
tenths of a millisecond on an idle host). Every 4th hang is an *ingest probe*: an
acquire already expired when written, whose latency is the server's write -> applied ->
signal lag (``ingest_lag_ms``). The host's own scheduling noise in the same run is
``host_lag_ms``: how late the parent ran after each of its 0.1 s timer wake-ups (it
sleeps in ``epoll`` in between, and uses well under 1% of a core).

**Verdicts** (:mod:`.measure`): a kill of a worker that had released every block before
its deadline is a *false kill*; a hang not reaped within the server's polling interval
plus 5 s is *missed* (the harness kills it, and records its ``/proc`` state in
``missed_states``), as is a worker still alive 2 s after the last block's miss window.
A reaped slot gets a fresh worker for its remaining blocks, as an agent would restart
it.

**Servers** (:mod:`.servers`): ``aiotimer serve`` with default settings;
torch 2.13's ``FileTimerServer`` at its default ``max_interval`` (10 s) and at 0.1 s
(torch's elastic agent's value), with torch's ``FileTimerClient``; ``LocalTimerServer``
at 0.1 s with ``LocalTimerClient``. torch's file server signals its own process after
each reap; the harness suppresses that one call so the server survives the first hang.
Without torch the harness says so and runs aiotimer alone. ``--server-nice N`` runs
every server, alike, at nice ``N`` (default: unchanged). Server CPU is the run time of
its threads over the run (``/proc/PID/task/*/schedstat``, to the nanosecond), RSS is the
peak of ``VmRSS`` sampled every 0.1 s.

**Output** (:mod:`.report`) in ``--out``: ``results.json`` (schema
:data:`~benchmarks.many_workers.report.SCHEMA`), ``results.csv``, three PNG plots and a
self-contained ``report.html``.
"""
