"""What a run shows: its headline, the claims it bears out or not, and its caveats.

The console and ``report.html`` print the same lines (:func:`headline`,
:func:`verdicts`, :func:`warnings`), from the runs as ``results.json`` holds them.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = [
    "FEW_SAMPLES",
    "REAP_P99_TARGET_MS",
    "TORCH_REFERENCE",
    "headline",
    "reconciles",
    "verdicts",
    "warnings",
]

#: A percentile resting on fewer samples than this is flagged.
FEW_SAMPLES = 100
#: The server whose CPU aiotimer's is held against: torch's file server as torch's
#: elastic agent runs it.
TORCH_REFERENCE = "torch-file-0.1"
#: aiotimer's published target for its reap latency p99, in ms (the performance table:
#: "reap latency, deadline -> signal sent, p99 < 2 ms"), which every size is held to.
REAP_P99_TARGET_MS: Final[float] = 2.0


def _ours(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in runs if r["server"] == "aiotimer"]


def _peer(runs: list[dict[str, Any]], server: str, workers: int) -> dict[str, Any] | None:
    return next((r for r in runs if r["server"] == server and r["workers"] == workers), None)


def reconciles(run: dict[str, Any]) -> bool:
    """Whether the run's hang counts add up: planned = met + skipped, and met = reaped
    + missed + killed early (before the deadline, a false kill)."""
    met = run["hangs_reaped"] + run["missed_hangs"] + run["early_kills"]
    return run["hangs_planned"] == run["hangs_met"] + run["hangs_skipped"] and (
        run["hangs_met"] == met
    )


def headline(runs: list[dict[str, Any]]) -> str:
    """One sentence: aiotimer's latency, kills and CPU beside torch's, over the sizes."""
    ours = _ours(runs)
    if not ours:
        return "aiotimer was not run."
    sizes = ", ".join(str(r["workers"]) for r in ours)
    p99s = [r["reap_latency_ms"]["p99"] for r in ours if r["reap_latency_ms"]["p99"] is not None]
    worst = f"p99 reap latency at most {max(p99s):.2f} ms" if p99s else "no reaps measured"
    wrong = sum(r["false_kills"] + r["missed"] for r in ours)
    text = f"At {sizes} workers, aiotimer: {worst}, {wrong} false kills or missed reaps"
    ratios = []
    for r in ours:
        torch = _peer(runs, TORCH_REFERENCE, r["workers"])
        if torch is not None and torch["cpu_percent"] > 0:
            ratios.append(r["cpu_percent"] / torch["cpu_percent"])
    if ratios:
        text += (
            f", server CPU {min(ratios):.2g}-{max(ratios):.2g}x {TORCH_REFERENCE}'s"
            if len(ratios) > 1
            else f", server CPU {ratios[0]:.2g}x {TORCH_REFERENCE}'s"
        )
    return text + "."


def verdicts(runs: list[dict[str, Any]]) -> list[tuple[str, bool]]:
    """The harness's claims, each with whether this run bears it out: aiotimer's own
    targets (0 false kills and missed reaps, p99 below :data:`REAP_P99_TARGET_MS`), and
    its standing beside torch's servers run alongside (p99 below their best p50, CPU at
    most :data:`TORCH_REFERENCE`'s)."""
    ours = _ours(runs)
    out = [
        (
            "aiotimer: 0 false kills and 0 missed reaps in every run",
            bool(ours) and all(r["false_kills"] == 0 and r["missed"] == 0 for r in ours),
        ),
        (
            "counts reconcile in every run: hangs planned = met + skipped, "
            "met = reaped + missed + killed early",
            all(reconciles(r) for r in runs),
        ),
    ]
    for r in ours:
        p99 = r["reap_latency_ms"]["p99"]
        if p99 is not None:
            out.append(
                (
                    f"{r['workers']} workers: aiotimer p99 {p99:.2f} ms < "
                    f"{REAP_P99_TARGET_MS:g} ms (aiotimer's target)",
                    p99 < REAP_P99_TARGET_MS,
                )
            )
        torch_p50 = [
            t["reap_latency_ms"]["p50"]
            for t in runs
            if t["server"] != "aiotimer" and t["workers"] == r["workers"]
        ]
        torch_p50 = [p for p in torch_p50 if p is not None]
        if torch_p50 and r["reap_latency_ms"]["p99"] is not None:
            p99 = r["reap_latency_ms"]["p99"]
            out.append(
                (
                    f"{r['workers']} workers: aiotimer p99 {p99:.2f} ms < best torch p50 "
                    f"{min(torch_p50):.2f} ms",
                    p99 < min(torch_p50),
                )
            )
        torch = _peer(runs, TORCH_REFERENCE, r["workers"])
        if torch is not None:
            out.append(
                (
                    f"{r['workers']} workers: aiotimer server CPU {r['cpu_percent']:.2f} % "
                    f"<= {TORCH_REFERENCE} {torch['cpu_percent']:.2f} %",
                    r["cpu_percent"] <= torch["cpu_percent"],
                )
            )
    return out


def warnings(runs: list[dict[str, Any]]) -> list[str]:
    """Caveats: percentiles on few samples, and missed hangs the latencies leave out."""
    out = []
    for r in runs:
        n = r["reap_latency_ms"]["n"]
        if 0 < n < FEW_SAMPLES:
            out.append(
                f"{r['server']} x {r['workers']}: its percentiles rest on {n} reaps "
                f"(fewer than {FEW_SAMPLES}): its p99 is its slowest reap; more --hangs "
                "give a steadier tail"
            )
        if r["missed_hangs"]:
            out.append(
                f"{r['server']} x {r['workers']}: {r['missed_hangs']} hangs were never "
                "reaped: its latency percentiles leave them out (the CDF stops short of 1)"
            )
    return out
