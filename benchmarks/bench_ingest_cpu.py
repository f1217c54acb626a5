"""The server's CPU per ingested line, in process: decoding and the engine's ``submit``
against a reader that only splits lines, on the same chunks, in the same run.

Run from the repository root::

    python -m benchmarks.bench_ingest_cpu            # 4 writers x 50k lines, best of 5
    python -m benchmarks.bench_ingest_cpu --quick    # a fraction of a second
    python -m benchmarks.bench_ingest_cpu --chunk 16384,65536

The lines are those of :mod:`benchmarks.bench_ingest`'s writers (acquire/release pairs
over 50 scopes per pid, without the final expired acquire), of ``--writers`` pids
interleaved line by line, cut into reads of ``--chunk`` bytes (default: the FIFO
source's ``CHUNK_SIZE``). Rows, each timed over the whole stream:

* ``split only`` — carry the partial line over and ``split``: the floor (what
  ``bench_ingest``'s reader (a) does);
* ``decode`` — :meth:`~aiotimer.wire.LineDecoder.feed` per chunk;
* ``submit`` — :meth:`Engine.submit` of the decoded batches (decoded beforehand), in a
  fresh engine as ``aiotimer serve`` builds it (a journal, a recording reaper that
  attaches every pid, no request events);
* ``decode + submit`` — both, chunk by chunk: what the server's read loop costs per line
  beyond the read itself.

Then, per read size, the work between two deadline checks at its worst: one read of
nothing but garbage lines (:data:`benchmarks.bench_codec.GARBAGE`) decoded and submitted,
in milliseconds (its rejection events go nowhere here; a server also writes them out).

The cyclic GC stays on (as in the server) unless ``--no-gc``. This isolates the CPU the
server spends per line from the scheduling noise of the end-to-end benchmark, whose
ratio it predicts: the server is the serial bottleneck there.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import anyio

from aiotimer._edges.clock import MonotonicClock
from aiotimer.events import Event
from aiotimer.reapers._escalator import ReapRetry
from aiotimer.reapers._policy import ReapPolicy
from aiotimer.server._engine import Engine
from aiotimer.server._journal import Journal
from aiotimer.sources.fifo import CHUNK_SIZE
from aiotimer.testing import RecordingReaper
from aiotimer.wire import Decoded, LineDecoder
from benchmarks._util import Timing, format_table, time_repeated
from benchmarks.bench_codec import GARBAGE, chunks_of, split_only
from benchmarks.bench_ingest import writer_lines

FIRST_PID = 1_000_000  # fake writer pids: the recording reaper attaches any


def stream(writers: int, count: int) -> bytes:
    """``writers`` writers' lines (no final expired acquire), interleaved line by line."""
    per_writer = [writer_lines(FIRST_PID + w, count + 1)[:-1] for w in range(writers)]
    return b"".join(line for group in zip(*per_writer, strict=True) for line in group)


def decode(chunks: list[bytes]) -> list[Decoded]:
    """Every chunk fed to one LineDecoder, the batches kept (for the submit row)."""
    feed = LineDecoder().feed
    return [feed(chunk) for chunk in chunks]


def decode_only(chunks: list[bytes]) -> None:
    """Every chunk fed to one LineDecoder, each batch dropped (as the server does)."""
    feed = LineDecoder().feed
    for chunk in chunks:
        feed(chunk)


def garbage_read(size: int) -> bytes:
    """Garbage lines, as many as fit in a read of ``size`` bytes."""
    lines = [GARBAGE[i % len(GARBAGE)] + b"\n" for i in range(size // 16 + 1)]
    data = b"".join(lines)[:size]
    return data[: data.rfind(b"\n") + 1]


def new_engine(tg: anyio.abc.TaskGroup, journal_dir: Path) -> Engine:
    """An engine as ``aiotimer serve`` builds one (default policy, a journal)."""

    def emit(event: Event) -> None:
        pass

    return Engine(
        task_group=tg,
        clock=MonotonicClock(),
        reaper=RecordingReaper(),
        policy=ReapPolicy(),
        emit=emit,
        retry=ReapRetry(),
        request_events=False,
        self_kill_after_reap=False,
        journal=Journal(journal_dir / "timer.journal"),
    )


async def measure(chunks: list[bytes], lines: int, repeat: int, keep_gc: bool) -> dict[str, Timing]:
    """Every row's timing over ``chunks``."""
    batches = decode(chunks)
    if sum(len(b.requests) for b in batches) != lines or any(b.rejections for b in batches):
        raise AssertionError("the decoder lost or rejected lines")
    timings: dict[str, Timing] = {}
    with tempfile.TemporaryDirectory(prefix="aiotimer-bench-") as tmp:
        async with anyio.create_task_group() as tg:
            engines = [new_engine(tg, Path(tmp)) for _ in range(2 * repeat)]

            def submit(i: int) -> None:
                engine = engines[i]
                for batch in batches:
                    engine.submit(batch, "bench")

            def decode_submit(i: int) -> None:
                engine, feed = engines[repeat + i], LineDecoder().feed
                for chunk in chunks:
                    engine.submit(feed(chunk), "bench")

            def timed(run: Callable[[int], object]) -> Timing:
                return time_repeated(run, units=lines, repeat=repeat, keep_gc=keep_gc)

            timings["split only"] = timed(lambda _: split_only(chunks))
            timings["decode"] = timed(lambda _: decode_only(chunks))
            timings["submit"] = timed(submit)
            timings["decode + submit"] = timed(decode_submit)
            garbage = garbage_read(len(chunks[0]))
            engine = new_engine(tg, Path(tmp))
            timings["a read of garbage"] = time_repeated(
                lambda _: engine.submit(LineDecoder().feed(garbage), "bench"),
                units=1,
                repeat=repeat,
                keep_gc=keep_gc,
            )
            engine.close()
            for engine in engines:
                if len(engine.table) or engine.counts.requests != lines:
                    raise AssertionError("the engine did not apply every line")
                engine.close()
            tg.cancel_scope.cancel()
    return timings


def _us(t: Timing) -> str:
    return f"{t.best * 1e6:.3f} ({t.median * 1e6:.3f})"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print us per line, with ratios to the split-only reader."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_ingest_cpu", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--writers", type=int, default=4, help="interleaved pids (4)")
    parser.add_argument("--lines", type=int, default=50_000, help="lines per writer (50k)")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per row (5)")
    parser.add_argument(
        "--chunk", default=str(CHUNK_SIZE), help=f"bytes per read, comma-separated ({CHUNK_SIZE})"
    )
    parser.add_argument("--no-gc", action="store_true", help="pause the GC in timed runs")
    parser.add_argument("--quick", action="store_true", help="small (smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.lines, args.repeat = min(args.lines, 2_000), min(args.repeat, 2)
    if args.lines % 2:
        parser.error("--lines must be even (acquire/release pairs)")
    data = stream(args.writers, args.lines)
    lines = args.writers * args.lines
    print(
        f"ingest CPU in process: {args.writers} writers x {args.lines:,} lines, "
        f"best of {args.repeat} runs (median in brackets), GC {'off' if args.no_gc else 'on'}"
    )
    rows = []
    for size in (int(s) for s in args.chunk.split(",")):
        chunks = chunks_of(data, size)
        timings = anyio.run(measure, chunks, lines, args.repeat, not args.no_gc)
        floor = timings.pop("split only")
        worst = timings.pop("a read of garbage")
        rows.append([f"split only ({size // 1024} KiB reads)", _us(floor), "1.0x"])
        for name, t in timings.items():
            ratio = f"{t.best / floor.best:.1f}x"
            rows.append([f"{name} ({size // 1024} KiB reads)", _us(t), ratio])
        worst_ms = f"{worst.best * 1e3:.2f} ms ({worst.median * 1e3:.2f})"
        rows.append([f"a {size // 1024} KiB read of garbage lines", worst_ms, ""])
    print(format_table(["what", "us per line", "vs split only"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
