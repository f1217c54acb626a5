"""``python -m benchmarks.many_workers``: see the package docstring."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._util import format_table
from benchmarks.many_workers.measure import RunResult, run_one
from benchmarks.many_workers.plan import WORKLOADS, Workload
from benchmarks.many_workers.report import SCHEMA, environment, write_all
from benchmarks.many_workers.servers import SPECS, ServerSpec, torch_version
from benchmarks.many_workers.verdicts import headline, verdicts, warnings

MISSING_EXTRA = (
    "python -m benchmarks.many_workers needs the bench extra (matplotlib, tqdm): "
    'run  python -m pip install -e ".[bench]"  from the repository root ({error})'
)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    doc = __import__("benchmarks.many_workers").many_workers.__doc__ or ""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.many_workers",
        description=doc.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--workers", help="comma-separated worker counts (8,64,256,512; quick 8,64)"
    )
    parser.add_argument(
        "--servers",
        default=",".join(s.name for s in SPECS),
        help="comma-separated servers (default: all, torch ones when torch imports)",
    )
    parser.add_argument("--quick", action="store_true", help="short runs: under 2 minutes")
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when a verdict is MISSED (default: exit 0 after a measurement, "
        "whatever it shows)",
    )
    parser.add_argument("--out", default="many-workers-results", help="output directory")
    parser.add_argument("--duration", type=float, help="seconds of blocks per run (20; quick 3)")
    parser.add_argument(
        "--workload",
        choices=sorted(WORKLOADS),
        default="stress",
        help="what the blocks model: "
        + "; ".join(f"{name}: {p.models}" for name, p in sorted(WORKLOADS.items()))
        + " (default stress; --rate, --timeout and --hangs override it)",
    )
    parser.add_argument("--rate", type=float, help="blocks/s per worker (stress 10, training 2)")
    parser.add_argument("--timeout", type=float, help="seconds per block (stress 0.5, training 60)")
    parser.add_argument(
        "--hangs", type=int, help="hanging blocks per run (stress 200, quick 60; training 0)"
    )
    parser.add_argument(
        "--step-work",
        action="store_true",
        help="each block's work is 5-30%% of its step (1/rate), not of its timeout: "
        "blocks that end within their step, so few are open at once",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--server-nice",
        type=int,
        default=0,
        help="run every server at this nice value (e.g. -10, needs root or CAP_SYS_NICE): "
        "on a loaded host, the priority a timer server should have; default 0 (unchanged)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="run aiotimer's server under cProfile, writing DIR/aiotimer-WORKERS.prof",
    )
    args = parser.parse_args(argv)
    args.workers = args.workers or ("8,64" if args.quick else "8,64,256,512")
    args.duration = args.duration or (3.0 if args.quick else 20.0)
    preset = WORKLOADS[args.workload]
    args.rate = preset.rate if args.rate is None else args.rate
    args.timeout = preset.timeout if args.timeout is None else args.timeout
    if args.hangs is None:
        args.hangs = preset.hangs if preset.hangs is not None else (60 if args.quick else 200)
    args.work_of = 1.0 / args.rate if args.step_work else None
    return args


def _specs(names: str, torch: str | None) -> tuple[list[ServerSpec], list[str]]:
    """The servers to run, and why each asked for is skipped (``name: reason``)."""
    by_name = {s.name: s for s in SPECS}
    chosen: list[ServerSpec] = []
    skipped: list[str] = []
    for name in names.split(","):
        if name not in by_name:
            raise SystemExit(f"unknown server {name!r}; choose from {', '.join(by_name)}")
        spec = by_name[name]
        if spec.needs_torch and torch is None:
            skipped.append(f"{name}: torch is not importable")
            continue
        chosen.append(spec)
    for why in skipped:
        print(f"SKIPPED {why}", file=sys.stderr)
    return chosen, skipped


def conclude(runs: list[dict[str, Any]], *, check: bool) -> int:
    """Print what the runs show: the headline, each verdict (OK or MISSED) and the
    notes; return the exit status: 0 after a measurement, whatever it shows, unless
    ``check`` asks for 1 when a verdict is MISSED."""
    print(headline(runs))
    ok = True
    for claim, holds in verdicts(runs):
        print(f"{'OK    ' if holds else 'MISSED'} {claim}")
        ok = ok and holds
    for warning in warnings(runs):
        print(f"NOTE   {warning}")
    return 1 if check and not ok else 0


def _summary(runs: list[RunResult]) -> str:
    rows = []
    for r in runs:
        j = r.to_json()
        lat, lag = j["reap_latency_ms"], j["ingest_lag_ms"]
        rows.append(
            [
                r.server,
                str(r.workers),
                str(lat["n"]),
                *(f"{lat[k]:.2f}" if lat[k] is not None else "-" for k in ("p50", "p99", "max")),
                f"{lag['p50']:.2f}" if lag["p50"] is not None else "-",
                str(r.false_kills),
                str(r.missed),
                f"{j['requests_per_s']:,.0f}",
                str(r.failed_writes),
                f"{r.cpu_percent:.1f}",
                f"{r.rss_mb:.0f}",
                f"{j['host_lag_ms']['max']:.1f}" if j["host_lag_ms"]["max"] is not None else "-",
            ]
        )
    headers = ["server", "workers", "reaps", "p50 ms", "p99 ms", "max ms", "lag p50"]
    headers += ["false", "missed", "req/s", "failed", "CPU %", "RSS MB", "host lag max"]
    return format_table(headers, rows)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and write the report; 0 once measured (with ``--check``: 1
    when a verdict is MISSED)."""
    args = _parse(argv)
    try:
        import matplotlib  # noqa: F401, PLC0415
        import tqdm  # noqa: PLC0415
    except ImportError as error:
        raise SystemExit(MISSING_EXTRA.format(error=error)) from None
    torch = torch_version()
    specs, skipped = _specs(args.servers, torch)
    sizes = [int(n) for n in args.workers.split(",")]
    try:
        import uvloop  # noqa: F401, PLC0415

        loop = "uvloop"
    except ImportError:
        loop = "asyncio"
    env = environment(torch, loop)
    runs: list[RunResult] = []
    started = time.monotonic()
    with tqdm.tqdm(total=len(sizes) * len(specs), unit="run", disable=None) as bar:
        for size in sizes:
            load = Workload(
                size,
                args.duration,
                args.rate,
                args.timeout,
                args.hangs,
                args.seed,
                work_of=args.work_of,
            )
            for spec in specs:
                bar.set_description(f"{spec.name} x {size} workers")
                out = Path(args.out)
                runs.append(
                    run_one(
                        spec,
                        load,
                        out,
                        bar.refresh,
                        server_nice=args.server_nice,
                        profile=args.profile,
                    )
                )
                bar.update()
    config = {
        "workers": sizes,
        "servers": [s.name for s in specs],
        "skipped": skipped,
        "workload": args.workload,
        "work_of_s": args.work_of,
        "duration_s": args.duration,
        "rate_per_worker": args.rate,
        "timeout_s": args.timeout,
        "hangs_per_run": args.hangs,
        "seed": args.seed,
        "server_nice": args.server_nice,
        "quick": args.quick,
        "wall_s": round(time.monotonic() - started, 1),
    }
    command = "python -m benchmarks.many_workers " + shlex.join(argv or sys.argv[1:])
    env["load_average_end"] = list(os.getloadavg())
    results = {
        "schema": SCHEMA,
        "command": command.strip(),
        "environment": env,
        "config": config,
        "runs": [r.to_json() for r in runs],
    }
    paths = write_all(results, Path(args.out))
    for why in skipped:  # said first: the table and the verdicts below lack it
        print(f"SKIPPED {why}: no comparison with it is made")
    print(_summary(runs))
    for r in runs:
        for state in r.missed_states[:3]:
            print(f"missed ({r.server} x {r.workers}): {state}")
    status = conclude(results["runs"], check=args.check)
    print(f"wrote {', '.join(str(p) for p in paths)} in {config['wall_s']} s")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
