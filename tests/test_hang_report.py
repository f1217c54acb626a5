"""The hang report's pure core: dumps read into frames, ranks grouped by place."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiotimer._edges.clock import MonotonicClock
from aiotimer.cluster._hang import MAX_PART_BYTES, encode_part, publish_part, read_job_report
from aiotimer.cluster._memory import MemoryStore
from aiotimer.core._table import Timer
from aiotimer.events import Event, HangReported
from aiotimer.hang import (
    MAX_REPORT_TEXT,
    DumpFirstPolicy,
    Frame,
    HangReporter,
    RankStacks,
    build_report,
    parse_stacks,
)
from aiotimer.reapers._policy import ReapPolicy
from aiotimer.reapers._stackbound import StackCaps, StackTextBound
from aiotimer.reapers._steps import DumpStacks, SendSignal
from aiotimer.supervisor._pool import Attempt, pidfd
from aiotimer.testing import FakeClock
from aiotimer.wire import Request

FAULTHANDLER = """\
Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.12/threading.py", line 355 in wait
  File "/srv/aux.py", line 5 in helper

Thread 0x00007f0000000002 (most recent call first):
  File "/srv/data.py", line 88 in load_batch
  File "/srv/train.py", line 30 in main
=== aiotimer asyncio tasks: pid 1, now ===
no asyncio event loop is running in the main thread
"""

COLLECTIVE = """\
Current thread 0x00007f0000000002 (most recent call first):
  File "/venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py", \
line 2501 in all_reduce
  File "/venv/lib/python3.12/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/srv/train.py", line 120 in main
"""

ASYNCIO = """\
=== aiotimer asyncio tasks: pid 1, now ===
2 task(s) in <loop>
The loop is held by task 'Task-1', in aiotimer block(s) step
Task 'Task-1' (running):
    open aiotimer block(s): step
    main at /srv/t.py:10
    inner at /srv/t.py:20
    (running: interrupted in the innermost frame above)
Task 'Task-2' (pending):
    other at /srv/t.py:5
"""

PY_SPY = """\
Process 42: python t.py
Python v3.12.3 (/usr/bin/python3.12)

Thread 42 (idle): "MainThread"
    load_batch (data.py:88)
    main (train.py:10)
Thread 43 (idle): "Thread-1"
    run (threading.py:1)
"""


def test_faulthandler_main_thread_is_the_last_block() -> None:
    parsed = parse_stacks(FAULTHANDLER)
    assert parsed.main[0] == Frame("load_batch", "/srv/data.py", 88)
    assert [f.function for f in parsed.main] == ["load_batch", "main"]
    assert parsed.task == ()


def test_asyncio_section_gives_the_holding_task_innermost_first() -> None:
    parsed = parse_stacks(ASYNCIO)
    assert parsed.task_name == "Task-1"
    assert [f.function for f in parsed.task] == ["inner", "main"]
    assert parsed.blocks == ("step",)


def test_py_spy_main_thread_by_name() -> None:
    parsed = parse_stacks(PY_SPY)
    assert parsed.main[0].where == "load_batch (data.py:88)"


def test_unknown_text_gives_no_frames() -> None:
    assert parse_stacks("garbage\n\n  File nothing") == parse_stacks("")


def test_the_odd_rank_leads_and_names_the_users_line() -> None:
    ranks = [
        RankStacks.from_dump(r, 100 + r, FAULTHANDLER if r == 2 else COLLECTIVE, blocks=["step"])
        for r in range(4)
    ]
    report = build_report(ranks, cause="timer step of rank 0 expired")
    assert report.odd == (2,)
    assert report.summary() == (
        "rank 2 of 4 differs: in `load_batch` (data.py:88) inside block `step`; "
        "3 ranks in `all_reduce` (train.py:120) inside block `step`"
    )
    text = report.to_text()
    assert text.index("rank 2 (pid 102) dump") < text.index("rank 0 (pid 100) dump")
    data = json.loads(json.dumps(report.to_dict()))
    assert data["odd"] == [2]
    assert [[r["rank"] for r in g["ranks"]] for g in data["groups"]] == [[2], [0, 1, 3]]
    back = [RankStacks.from_dict(r) for g in data["groups"] for r in g["ranks"]]
    assert build_report(back).summary() == report.summary()


def test_a_rank_without_answer_is_reported_as_such() -> None:
    ranks = [RankStacks.from_dump(r, 100 + r, COLLECTIVE) for r in range(3)]
    ranks.append(RankStacks(rank=3, pid=103, missing="stopped (SIGSTOP)"))
    report = build_report(ranks)
    assert report.summary().startswith("rank 3 of 4 differs: no answer (stopped (SIGSTOP))")


def test_ties_are_said_as_ties() -> None:
    ranks = [RankStacks.from_dump(r, 1, COLLECTIVE if r < 2 else FAULTHANDLER) for r in range(4)]
    report = build_report(ranks)
    assert report.odd == ()
    assert report.summary().startswith("no single odd one out (2 groups of 2 tie): ranks 0, 1")


def test_a_rank_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        build_report([RankStacks(rank=1), RankStacks(rank=1)])


def test_the_text_is_bounded() -> None:
    big = COLLECTIVE + "x" * 100_000
    report = build_report([RankStacks.from_dump(r, r, big) for r in range(100)])
    assert len(report.to_text()) <= MAX_REPORT_TEXT


PLACES = [
    Frame("all_reduce", "/srv/train.py", 120),
    Frame("load_batch", "/srv/data.py", 88),
    Frame("barrier", "/srv/train.py", 140),
]


@st.composite
def rank_sets(draw: st.DrawFn) -> list[RankStacks]:
    n = draw(st.integers(1, 24))
    out = []
    for rank in draw(st.permutations(list(range(n)))):
        kind = draw(st.integers(0, len(PLACES)))
        if kind == len(PLACES):
            out.append(RankStacks(rank=rank, missing="no hook"))
        else:
            out.append(RankStacks(rank=rank, main=(PLACES[kind],)))
    return out


@given(rank_sets())
def test_grouping_against_a_naive_model(ranks: list[RankStacks]) -> None:
    report = build_report(ranks)
    listed = [r.rank for g in report.groups for r in g.ranks]
    assert sorted(listed) == sorted(r.rank for r in ranks)  # every rank exactly once
    naive: dict[object, set[int]] = {}
    for r in ranks:
        naive.setdefault(r.key, set()).add(r.rank)
    assert sorted(sorted(g) for g in naive.values()) == sorted(
        sorted(r.rank for r in g.ranks) for g in report.groups
    )
    sizes = [len(g) for g in naive.values()]
    smallest = min(sizes)
    unique = sizes.count(smallest) == 1 and len(sizes) > 1
    summary = report.summary()
    if unique:
        minority = next(g for g in naive.values() if len(g) == smallest)
        assert set(report.odd) == minority
        assert {r.rank for r in report.groups[0].ranks} == minority
        assert " differ" in summary.split(":")[0]
    else:
        assert report.odd == ()
        if len(sizes) > 1:
            assert summary.startswith(f"no single odd one out ({sizes.count(smallest)} groups")
    assert [len(g.ranks) for g in report.groups] == sorted(sizes)


# -- the job-level report: each node's part in the store ---------------------------------


@pytest.mark.asyncio
async def test_parts_of_two_nodes_make_one_job_report() -> None:
    store = MemoryStore(FakeClock())
    assert await read_job_report(store, "j") is None
    a = build_report([RankStacks.from_dump(r, 1, COLLECTIVE) for r in range(2)], cause="x")
    b = build_report(
        [RankStacks.from_dump(0, 2, FAULTHANDLER), RankStacks.from_dump(1, 3, COLLECTIVE)]
    )
    old = build_report([RankStacks(rank=0, missing="gone")])
    assert await publish_part(store, job="j", node="a", generation=0, report=old)
    assert await publish_part(store, job="j", node="a", generation=1, report=a)
    assert await publish_part(store, job="j", node="b", generation=1, report=b)
    await store.put("/aiotimer/v1/j/hang/00000001/c", b"garbage")  # logged, ignored
    report = await read_job_report(store, "j")
    assert report is not None and report.generation == 1
    assert report.summary().startswith("rank 0 on b of 4 differs: in `load_batch`")
    big = build_report([RankStacks.from_dump(r, r, COLLECTIVE + "x" * 8000) for r in range(200)])
    assert len(encode_part(big, node="a", generation=2)) <= MAX_PART_BYTES


# -- the supervisor's collection, on real child processes ----------------------------------

CHILD = """
import sys, time
from aiotimer.diagnostics import install_dump_handler
if sys.argv[1] == "hook":
    install_dump_handler(dump_dir=sys.argv[2])
def hang():
    print("ready", flush=True)
    time.sleep(60)
hang()
"""


@pytest.mark.process
@pytest.mark.asyncio
async def test_the_reporter_reads_each_rank_and_names_one_without_answer(tmp_path: Path) -> None:
    dumps = tmp_path / "dumps"
    dumps.mkdir(mode=0o700)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    live = {}
    for rank, kind in enumerate(("hook", "none")):
        popen = subprocess.Popen(
            [sys.executable, str(script), kind, str(dumps)], env=env, stdout=subprocess.PIPE
        )
        assert popen.stdout is not None and popen.stdout.readline() == b"ready\n"
        live[rank] = Attempt(rank, 1, popen, pidfd(popen.pid), 0.0)
    events: list[Event] = []
    reporter = HangReporter(
        3.0, dump_dir=dumps, py_spy=False, clock=MonotonicClock(), emit=events.append
    )
    reporter.place(tmp_path)
    try:
        async with anyio.create_task_group() as tg:
            reporter.begin(tg, live, lambda: {live[0].pid: ("step",)}, cause="test")
            reporter.begin(tg, live, dict, cause="again")  # one report per restart
            with anyio.fail_after(5):
                await reporter.settle()
    finally:
        for att in live.values():
            att.popen.kill()
            att.popen.wait()
            assert att.popen.stdout is not None
            att.popen.stdout.close()
            if att.pidfd is not None:
                os.close(att.pidfd)
    (event,) = events
    assert isinstance(event, HangReported)
    assert event.missing == (1,) and event.seconds < 3.0
    assert reporter.last is not None
    assert reporter.last.summary().startswith("no single odd one out (2 groups of 1 tie)")
    assert "rank 0 in `hang` (child.py:8) inside block `step`" in event.summary
    assert "rank 1 no answer (no dump hook in the worker" in event.summary
    assert (tmp_path / "hang-report.txt").read_text() == reporter.last.to_text()


# -- a streamed dump, bounded -------------------------------------------------------------


def _spy_text(threads: int, depth: int, name: int) -> bytes:
    out = ["Process 7: python big.py", ""]
    for t in range(threads):
        label = "MainThread" if t == threads - 1 else f"t{t}"
        out.append(f'Thread {100 + t} (idle): "{label}"')
        out.extend(f"    f{i}_{'x' * name} (/srv/big.py:{i + 1})" for i in range(depth))
    return ("\n".join(out) + "\n").encode()


@given(
    threads=st.integers(1, 12),
    depth=st.integers(0, 12),
    name=st.integers(1, 300),
    chunk=st.integers(1, 997),
)
def test_a_streamed_dump_is_kept_within_its_caps(
    threads: int, depth: int, name: int, chunk: int
) -> None:
    caps = StackCaps(line=80, tail=30, frames=4, threads=3, read=1 << 20)
    data = _spy_text(threads, depth, name)
    bound = StackTextBound(caps)
    for i in range(0, len(data), chunk):
        assert bound.feed(data[i : i + chunk])
    text = bound.text()
    lines = text.splitlines()
    assert all(len(line) <= caps.line + 3 or line.startswith("[aiotimer") for line in lines)
    # at most the caps' threads (+ MainThread wherever it comes), each with its frames
    assert len(lines) <= 2 + (caps.threads + 1) * (caps.frames + 1) + 1
    parsed = parse_stacks(text)
    # the main thread is kept, and a cut frame still names its file and line
    assert [f.line for f in parsed.main] == list(range(1, min(depth, caps.frames) + 1))
    assert all(f.file == "/srv/big.py" for f in parsed.main)


def test_a_streamed_dump_stops_at_its_read_cap() -> None:
    bound = StackTextBound(StackCaps(read=1000))
    data = _spy_text(50, 50, 50)
    assert not bound.feed(data)
    assert bound.full
    assert bound.text().endswith("the rest not read (after 1000 bytes)]\n")
    assert not bound.feed(b"more")


# -- the supervisor's group scope: a dump before every reap ---------------------------------


def test_the_group_scope_policy_dumps_before_every_reap() -> None:
    def timer(sig: int = 9, dump: bool = False) -> Timer:
        return Timer(4242, "a.py:1#1", 10.0, sig, request=Request(4242, "s", 0.0, sig, dump=dump))

    plain = DumpFirstPolicy(ReapPolicy(), 9.0)
    assert plain.plan(Timer(4242, "a.py:1#1", 10.0, 9)) == (DumpStacks(9.0), SendSignal(9))
    assert plain.plan(timer(0)) == ()  # report only: nothing to dump before
    asked = plain.plan(timer(dump=True))
    assert [type(s) for s in asked].count(DumpStacks) == 1  # the request's own dump
    shadow = DumpFirstPolicy(ReapPolicy(shadow=True), 9.0)
    assert shadow.plan(timer()) == ()
    assert shadow.intended(timer())[0] == DumpStacks(9.0)
