"""Wire-codec throughput against stdlib ``json``, measured in the same run.

Run from the repository root::

    python -m benchmarks.bench_codec            # 8 MiB of torch lines
    python -m benchmarks.bench_codec --quick    # a fraction of a second

Decoding: the stream is cut into 64 KiB chunks as ``os.read`` returns them (so lines
straddle chunks) and fed to :class:`~aiotimer.wire.LineDecoder`. The references, on the same
chunks:

* ``split only`` — the physical limit: carry the partial line over and ``split`` lines;
* ``json.loads`` — what torch's server does per line: split, ``json.loads``, and read
  its four keys (``pid``, ``scope_id``, ``expiration_time``, ``signal``), here without
  any validation.

The same again with 1% garbage lines, which sends every chunk down the decoder's exact
line-by-line path (the reference catches the errors torch would crash on).

Encoding: :func:`~aiotimer.wire.encode` against torch's ``json.dumps`` of the request dict
plus newline, encoded to bytes.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aiotimer.wire import LineDecoder, Request, encode
from benchmarks._util import Timing, format_table, time_repeated

CHUNK = 64 * 1024
GARBAGE = [
    b"this is not json",
    b'{"version": 1, "pid": "oops", "scope_id": "x", "expiration_time": 1.0, "signal": 9}',
    b'{"version": 1, "pid": 42, "scope_id": "x", "expir',
    b'{"version": 1, "pid": 42, "scope_id": "", "expiration_time": 1.0, "signal": 9}',
]


def torch_requests(count: int, rng: random.Random) -> list[Request]:
    """Requests shaped like a torch job's: a few workers, file:line scopes, ~half releases."""
    out = []
    for i in range(count):
        pid = 40_000 + rng.randrange(64)
        scope = f"/workspace/train.py#{rng.randrange(1000)}"
        release = i % 2 == 1
        exp = -1.0 if release else 1_763_712_000.0 + rng.uniform(0, 3600)
        out.append(Request(pid, scope, exp, 0 if release else 9))
    return out


def stream(lines: list[bytes], total: int, garbage_every: int = 0) -> tuple[bytes, int]:
    """About ``total`` bytes of lines, every ``garbage_every``-th one garbage.

    Returns the bytes and how many valid lines they hold.
    """
    out: list[bytes] = []
    size = i = bad = 0
    while size < total:
        if garbage_every and i % garbage_every == garbage_every - 1:
            line = GARBAGE[(i // garbage_every) % len(GARBAGE)] + b"\n"
            bad += 1
        else:
            line = lines[i % len(lines)]
        out.append(line)
        size += len(line)
        i += 1
    return b"".join(out), i - bad


def chunks_of(data: bytes, size: int = CHUNK) -> list[bytes]:
    """``data`` in reads of ``size`` bytes."""
    return [data[i : i + size] for i in range(0, len(data), size)]


def decode_aiotimer(chunks: list[bytes]) -> int:
    """Feed every chunk to a fresh LineDecoder; return the requests decoded."""
    decoder = LineDecoder()
    n = 0
    for chunk in chunks:
        n += len(decoder.feed(chunk).requests)
    return n


def decode_json(chunks: list[bytes]) -> int:
    """Torch's per-line parse (json.loads + 4 keys), skipping lines it cannot parse."""
    rest = b""
    out: list[tuple[object, object, object, object]] = []
    for chunk in chunks:
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        for line in lines:
            try:
                r = json.loads(line)
                out.append((r["pid"], r["scope_id"], r["expiration_time"], r["signal"]))
            except (ValueError, KeyError, TypeError):
                continue
    return len(out)


def split_only(chunks: list[bytes]) -> int:
    """Only carry partial lines over and split: the floor any decoder pays."""
    rest = b""
    n = 0
    for chunk in chunks:
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        n += len(lines)
    return n


def encode_torch_style(req: Request) -> bytes:
    """What torch's FileTimerClient writes, as bytes."""
    exp = -1 if req.is_release else req.expiration_time
    d = {
        "version": 1,
        "pid": req.pid,
        "scope_id": req.scope_id,
        "expiration_time": exp,
        "signal": req.signal,
    }
    return (json.dumps(d) + "\n").encode()


@dataclass(frozen=True, slots=True)
class Row:
    """One measured way of doing one job, with the reference it is compared to."""

    name: str
    timing: Timing
    reference: Timing | None


def time_decode(fn: Callable[[list[bytes]], int], chunks: list[bytes], repeat: int) -> Timing:
    """Lines per run of ``fn`` over ``chunks``, timed ``repeat`` times."""
    lines = sum(c.count(b"\n") for c in chunks)
    return time_repeated(lambda _: fn(chunks), units=lines, repeat=repeat)


def time_encode(fn: Callable[[Request], bytes], reqs: list[Request], repeat: int) -> Timing:
    """Requests per run of ``fn`` over ``reqs``, timed ``repeat`` times."""

    def run(_: int) -> None:
        for r in reqs:
            fn(r)

    return time_repeated(run, units=len(reqs), repeat=repeat)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print lines/s with ratios to stdlib json."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_codec", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="a small stream (smoke test)")
    parser.add_argument("--mib", type=float, help="MiB of lines to decode (default 8)")
    parser.add_argument("--repeat", type=int, help="timed runs per row (default 5)")
    args = parser.parse_args(argv)
    mib = args.mib or (0.25 if args.quick else 8.0)
    repeat = args.repeat or (2 if args.quick else 5)

    rng = random.Random(1)
    reqs = torch_requests(1000, rng)
    lines = [encode(r) for r in reqs]
    if any(line != encode_torch_style(r) for line, r in zip(lines, reqs, strict=True)):
        raise AssertionError("encode() no longer writes torch's bytes")
    clean_data, clean_valid = stream(lines, int(mib * 2**20))
    dirty_data, dirty_valid = stream(lines, int(mib * 2**20), garbage_every=100)
    clean, dirty = chunks_of(clean_data), chunks_of(dirty_data)
    # Speed means nothing unless every valid line is decoded (json, which does not
    # validate, also "accepts" two of the garbage shapes).
    if (decode_aiotimer(clean), decode_json(clean)) != (clean_valid, clean_valid):
        raise AssertionError("a decoder lost lines of the clean stream")
    if decode_aiotimer(dirty) != dirty_valid or decode_json(dirty) < dirty_valid:
        raise AssertionError("a decoder lost valid lines of the 1% garbage stream")

    ref_clean = time_decode(decode_json, clean, repeat)
    ref_dirty = time_decode(decode_json, dirty, repeat)
    ref_encode = time_encode(encode_torch_style, reqs * 20, repeat)
    rows = [
        Row("decode: split only (floor)", time_decode(split_only, clean, repeat), ref_clean),
        Row("decode: json.loads + 4 keys", ref_clean, ref_clean),
        Row("decode: LineDecoder.feed", time_decode(decode_aiotimer, clean, repeat), ref_clean),
        Row("1% garbage: json.loads + 4 keys", ref_dirty, ref_dirty),
        Row("1% garbage: LineDecoder.feed", time_decode(decode_aiotimer, dirty, repeat), ref_dirty),
        Row("encode: json.dumps(dict)", ref_encode, ref_encode),
        Row("encode: aiotimer.wire.encode", time_encode(encode, reqs * 20, repeat), ref_encode),
    ]
    print(
        f"wire codec: {mib:g} MiB of torch lines in {CHUNK // 1024} KiB chunks, "
        f"best of {repeat} runs (median in brackets)"
    )
    table = [
        [
            row.name,
            f"{row.timing.rate / 1e6:.2f} M/s",
            f"{row.timing.best * 1e9:.0f} ({row.timing.median * 1e9:.0f})",
            "" if row.reference is None else f"{row.reference.best / row.timing.best:.2f}x",
        ]
        for row in rows
    ]
    print(format_table(["what", "rate", "ns per line", "speed vs json"], table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
