"""The scheduling policies on a real trace: Gavel's Philly-derived one (examples/sim/traces/gavel,
its source and licence beside it) on Gavel's 36 V100 + 36 P100 + 36 K80 cluster, each policy seeing
the speeds the operator would have measured and again with the oracle's knowledge, against the lower
bound on average JCT (`heterotrain simulate --bound`). The artifact, bench/results/gavel_trace_sim.json,
comes from the `heterotrain simulate` commands it lists; this script renders BENCHMARKS.md's
"## Scheduling: a real trace" section from it.

    python bench/gavel_trace.py [--write | --from-json FILE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks_md import publish, rendered_from_json, section_arguments
from hetero_operator.simulator.lower_bound import share_closed

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Scheduling: a real trace"
ARTIFACT = ROOT / "bench" / "results" / "gavel_trace_sim.json"
POLICIES = ("fifo", "fifo-backfill", "greedy-fastest", "gavel", "heterotrain")
REAL_TRACE_CLOSED_TARGET = 0.4  # of greedy-fastest's distance to the bound, on real traces


def percent(share: float) -> str:
    return f"{round(share * 100)}%"


def _table(part: dict[str, Any], label: str) -> list[str]:
    bound = part["lower_bound"]["avg_jct"]
    lines = [
        f"{label}: bound {bound / 3600:.1f} h (the isolation bound "
        f"{part['lower_bound']['isolation_avg_jct'] / 3600:.1f} h).",
        "",
        "| policy | average JCT, measured | over the bound | p99 JCT | closed | average JCT, oracle "
        "| closed, oracle |",
        "|---|---|---|---|---|---|---|",
    ]
    measured, oracle = part["results"]["measured"]["policies"], part["results"]["oracle"]["policies"]
    for policy in POLICIES:
        seen, known = measured[policy], oracle[policy]
        shares = [
            share_closed(runs["greedy-fastest"]["avg_jct"], runs[policy]["avg_jct"], bound)
            for runs in (measured, oracle)
        ]
        lines.append(
            f"| {policy} | {seen['avg_jct'] / 3600:.1f} h | {seen['avg_jct'] / bound:.2f}x | "
            f"{seen['p99_jct'] / 3600:.0f} h | {percent(shares[0])} | {known['avg_jct'] / 3600:.1f} h | "
            f"{percent(shares[1])} |"
        )
    return [*lines, ""]


def report(document: dict[str, Any]) -> str:
    whole, prefix = document, document["prefix_200"]
    measured = whole["results"]["measured"]["policies"]
    best = min(POLICIES, key=lambda p: measured[p]["avg_jct"])
    share = share_closed(
        measured["greedy-fastest"]["avg_jct"],
        measured["heterotrain"]["avg_jct"],
        whole["lower_bound"]["avg_jct"],
    )
    verdict = "met" if share >= REAL_TRACE_CLOSED_TARGET else "missed"
    lines = [
        SECTION,
        "",
        f"{document['what']} (`python bench/gavel_trace.py` renders this from "
        "`bench/results/gavel_trace_sim.json`; the trace's source, licence and conversion are in "
        "`examples/sim/traces/gavel/SOURCE.md`). *closed* is (greedy - policy) / (greedy - bound). "
        f"{' '.join(document['notes'])}",
        "",
        *_table(whole, f"The whole trace ({measured['heterotrain']['jobs']} jobs)"),
        *_table(prefix, f"Its first {prefix['results']['measured']['policies']['heterotrain']['jobs']} jobs"),
        f"- Best average JCT on the whole trace: **{best}**. heterotrain closes {share:.0%} of "
        f"greedy-fastest's distance to the bound (target {REAL_TRACE_CLOSED_TARGET:.0%} on real traces): "
        f"**{verdict}**; gavel, which time-slices the queue every round "
        f"({measured['gavel']['preemptions']:,} preemptions against heterotrain's "
        f"{measured['heterotrain']['preemptions']:,}), is ahead of it here.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    section_arguments(parser)
    args = parser.parse_args()
    if rendered_from_json(args, report):
        return
    document = json.loads(ARTIFACT.read_text())
    publish(document, report(document), ARTIFACT, args.write)


if __name__ == "__main__":
    main()
