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

from benchmarks.many_workers.verdicts import headline, verdicts, warnings

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


_COUNTS = ("hangs_planned", "hangs_met", "hangs_skipped", "hangs_reaped", "missed_hangs")
#: ``results.csv``'s column names as ``report.html`` shows them.
HUMAN = {
    "server": "server",
    "workers": "workers",
    "latency_basis": "latency to",
    "n": "reaps",
    "reap_p50_ms": "p50 ms",
    "reap_p90_ms": "p90 ms",
    "reap_p99_ms": "p99 ms",
    "reap_p99_9_ms": "p99.9 ms",
    "reap_max_ms": "max ms",
    "exit_p50_ms": "exit p50 ms",
    "exit_p99_ms": "exit p99 ms",
    "ingest_lag_p50_ms": "ingest lag p50 ms",
    "ingest_lag_p99_ms": "ingest lag p99 ms",
    "false_kills": "false kills",
    "late_kills": "deserved late kills",
    "missed": "missed reaps",
    "errors": "worker errors",
    "requests_per_s": "requests/s",
    "failed_writes": "failed writes",
    "cpu_percent": "server CPU %",
    "rss_mb": "server RSS MB",
    "live_timers": "live timers",
    "host_lag_p99_ms": "host lag p99 ms",
    "host_lag_max_ms": "host lag max ms",
    "realtime_observed": "real-time waits",
    "hangs_planned": "hangs planned",
    "hangs_met": "hangs met",
    "hangs_skipped": "hangs skipped",
    "hangs_reaped": "hangs reaped",
    "missed_hangs": "hangs missed",
}


def _csv_rows(runs: Sequence[dict[str, Any]]) -> list[list[object]]:
    header: list[object] = ["server", "workers", "latency_basis", "n"]
    header += [f"reap_{k}_ms" for k in ("p50", "p90", "p99", "p99_9", "max")]
    header += ["exit_p50_ms", "exit_p99_ms", "ingest_lag_p50_ms", "ingest_lag_p99_ms"]
    header += ["false_kills", "late_kills", "missed", "errors", "requests_per_s"]
    header += ["failed_writes", "cpu_percent", "rss_mb", "live_timers"]
    header += ["host_lag_p99_ms", "host_lag_max_ms", "realtime_observed"]
    header += ["hangs_planned", "hangs_met", "hangs_skipped", "hangs_reaped", "missed_hangs"]
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
            + [run[k] for k in _COUNTS]
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
            missed = run["missed_hangs"]
            if not values:
                continue
            # A missed hang is a reap that never came: the curve stops short of 1.
            ys = [(i + 1) / (len(values) + missed) for i in range(len(values))]
            label = f"{run['server']} (n={len(values)}" + (f", {missed} missed)" if missed else ")")
            ax.step(values, ys, where="post", label=label, color=colours[run["server"]])
        ax.set_xscale("log")
        ax.set_title(f"{size} workers")
        ax.set_xlabel("reap latency after the deadline (ms, log scale: no zero)")
        ax.set_ylabel("fraction of hangs reaped")
        ax.set_ylim(0, 1.02)
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
    ax.set_ylabel("reap latency p99 (ms, log scale: no zero)")
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
        ax.set_ylim(bottom=0)  # from zero: a 0.5 MB change must not look steep
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


def _verdict_items(runs: list[dict[str, Any]]) -> str:
    items = [
        f'<li class="{"ok" if holds else "missed"}">{"OK" if holds else "MISSED"}: '
        f"{html.escape(claim)}</li>"
        for claim, holds in verdicts(runs)
    ]
    items += [f'<li class="note">NOTE: {html.escape(w)}</li>' for w in warnings(runs)]
    return "".join(items)


def _skipped(results: dict[str, Any]) -> str:
    """The servers asked for and not run, and why: said before anything else."""
    skipped = results["config"].get("skipped", [])
    return "".join(
        f'<p class="missed"><strong>SKIPPED {html.escape(why)}</strong>: no comparison '
        "with it is made below.</p>\n"
        for why in skipped
    )


def _cpu_table(runs: list[dict[str, Any]]) -> str:
    """Every server's CPU (% of one core) at every size, side by side."""
    servers = list(dict.fromkeys(r["server"] for r in runs))
    sizes = sorted({r["workers"] for r in runs})
    cpu = {(r["server"], r["workers"]): r["cpu_percent"] for r in runs}
    head = "".join(f"<th>{html.escape(s)}</th>" for s in servers)
    body = "".join(
        f"<tr><td>{n}</td>"
        + "".join(f"<td>{cpu[s, n]:.2f}</td>" if (s, n) in cpu else "<td>—</td>" for s in servers)
        + "</tr>"
        for n in sizes
    )
    return (
        "<h2>Server CPU (% of one core) over each run</h2>"
        f"<table><tr><th>workers</th>{head}</tr>{body}</table>"
    )


def _html(results: dict[str, Any], rows: list[list[object]], out: Path) -> str:
    env = results["environment"]
    env_rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>"
        for k, v in {**env, **results["config"]}.items()
    )
    runs = results["runs"]
    head = "".join(f"<th>{html.escape(HUMAN.get(str(h), str(h)))}</th>" for h in rows[0])
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
.headline {{ font-size: 1.2em; font-weight: 600; }}
.ok {{ color: #17612a; }} .missed {{ color: #a01818; }} .note {{ color: #8a5a00; }}
</style></head><body>
<h1>Many workers: reap latency, false kills, missed reaps, server cost</h1>
{_skipped(results)}<p class="headline">{html.escape(headline(runs))}</p>
<ul class="verdicts">{_verdict_items(runs)}</ul>
{_cpu_table(runs)}
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
