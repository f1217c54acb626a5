"""Writing a run's results: ``results.json``, ``results.csv``, PNG plots, ``report.html``."""

from __future__ import annotations

import base64
import csv
import html
import json
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["SCHEMA", "environment", "write_all"]

#: ``results.json``'s schema id; bump the number when a field changes meaning.
SCHEMA = "aiotimer.bench.many_workers/1"
#: Latencies are drawn on a log axis: anything at or below this floor (ms) sits on it.
LOG_FLOOR_MS = 0.01
PLOTS = ("latency_cdf.png", "p99_vs_workers.png", "cpu_rss_vs_workers.png")


def _commit() -> str:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip()


def environment(torch: str | None, loop: str) -> dict[str, Any]:
    """Where and on what the run happened."""
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "loop": loop,
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cores": os.cpu_count(),
        "load_average": list(os.getloadavg()),
        "commit": _commit(),
        "torch": torch if torch is not None else "not importable: torch servers skipped",
    }


def _csv_rows(runs: Sequence[dict[str, Any]]) -> list[list[object]]:
    header: list[object] = ["server", "workers", "latency_basis", "n"]
    header += [f"reap_{k}_ms" for k in ("p50", "p90", "p99", "p99_9", "max")]
    header += ["exit_p50_ms", "exit_p99_ms", "ingest_lag_p50_ms", "ingest_lag_p99_ms"]
    header += ["false_kills", "late_kills", "missed", "errors", "requests_per_s"]
    header += ["failed_writes", "cpu_percent", "rss_mb", "live_timers"]
    header += ["host_lag_p99_ms", "host_lag_max_ms", "realtime_observed"]
    rows: list[list[object]] = [header]
    for run in runs:
        reap, ex, lag = run["reap_latency_ms"], run["exit_latency_ms"], run["ingest_lag_ms"]
        rows.append(
            [run["server"], run["workers"], run["latency_basis"], reap["n"]]
            + [reap[k] for k in ("p50", "p90", "p99", "p99_9", "max")]
            + [ex["p50"], ex["p99"], lag["p50"], lag["p99"]]
            + [run[k] for k in ("false_kills", "late_kills", "missed", "errors")]
            + [round(run["requests_per_s"], 1), run["failed_writes"]]
            + [round(run["cpu_percent"], 2), round(run["rss_mb"], 1), run["live_timers"]]
            + [run["host_lag_ms"]["p99"], run["host_lag_ms"]["max"], run["realtime_observed"]]
        )
    return rows


def _plot(runs: Sequence[dict[str, Any]], out: Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    servers = list(dict.fromkeys(r["server"] for r in runs))
    sizes = sorted({r["workers"] for r in runs})
    colours = {s: f"C{i}" for i, s in enumerate(servers)}

    fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 4), squeeze=False)
    for ax, size in zip(axes[0], sizes, strict=True):
        for run in (r for r in runs if r["workers"] == size):
            values = sorted(max(v, LOG_FLOOR_MS) for v in run["samples_ms"]["reap"])
            if not values:
                continue
            ys = [(i + 1) / len(values) for i in range(len(values))]
            label = f"{run['server']} (n={len(values)})"
            ax.step(values, ys, where="post", label=label, color=colours[run["server"]])
        ax.set_xscale("log")
        ax.set_title(f"{size} workers")
        ax.set_xlabel("reap latency after the deadline (ms, log)")
        ax.set_ylabel("fraction of reaps")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(out / PLOTS[0], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for server in servers:
        pts = [(r["workers"], r["reap_latency_ms"]["p99"]) for r in runs if r["server"] == server]
        pts = [(x, max(y, LOG_FLOOR_MS)) for x, y in pts if y is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=server, color=colours[server])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("worker processes")
    ax.set_ylabel("reap latency p99 (ms, log)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / PLOTS[1], dpi=110)
    plt.close(fig)

    fig, (cpu_ax, rss_ax) = plt.subplots(1, 2, figsize=(10, 4))
    for server in servers:
        mine = [r for r in runs if r["server"] == server]
        xs = [r["workers"] for r in mine]
        cpu_ax.plot(xs, [r["cpu_percent"] for r in mine], marker="o", label=server)
        rss_ax.plot(xs, [r["rss_mb"] for r in mine], marker="o", label=server)
    for ax, what in ((cpu_ax, "server CPU (% of one core)"), (rss_ax, "server peak RSS (MB)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("worker processes")
        ax.set_ylabel(what)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / PLOTS[2], dpi=110)
    plt.close(fig)


def _fmt(value: object) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def _html(results: dict[str, Any], rows: list[list[object]], out: Path) -> str:
    env = results["environment"]
    env_rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>"
        for k, v in {**env, **results["config"]}.items()
    )
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in rows[0])
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(c))}</td>" for c in row) + "</tr>"
        for row in rows[1:]
    )
    images = "".join(
        f'<figure><img alt="{name}" src="data:image/png;base64,'
        f'{base64.b64encode((out / name).read_bytes()).decode()}"></figure>'
        for name in PLOTS
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>aiotimer: many workers</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; font-size: 0.85em; margin-bottom: 1.5em; }}
th, td {{ border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: right; }}
th {{ background: #f3f3f3; }} img {{ max-width: 100%; }}
</style></head><body>
<h1>Many workers: reap latency, false kills, missed reaps, server cost</h1>
<p>Command: <code>{html.escape(results["command"])}</code>. Latency is measured from each
hanging block's planned deadline (open loop) to its first reap signal
(<code>latency_basis</code> "exit": to the process exit, for servers that only
<code>SIGKILL</code>); the ingest lag from the write of an already-expired acquire to its
signal; the host lag from each of the harness's own 0.1 s timer wake-ups to when it
ran (the host's scheduling noise in the same run). The method:
<code>benchmarks/many_workers/__init__.py</code>.</p>
<h2>Results</h2><table><tr>{head}</tr>{body}</table>
{images}
<h2>Environment and settings</h2><table>{env_rows}</table>
</body></html>
"""


def write_all(results: dict[str, Any], out: Path) -> list[Path]:
    """Write every output file under ``out``; return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    rows = _csv_rows(results["runs"])
    with open(out / "results.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    _plot(results["runs"], out)
    (out / "report.html").write_text(_html(results, rows, out))
    return [out / n for n in ("results.json", "results.csv", *PLOTS, "report.html")]
