"""Where the scheduler's job completion time goes: its default configuration beside variants that
switch one decision off (or back to the former behaviour), on the busy 64-GPU traces of
`scheduling_policies` (loads 0.8 and 1.0, three seeds).

Each run splits the average JCT into queueing (arrival to first start) and running (first start to
finish, restarts included), and counts restarts and jobs that ran on more than one class. Every
variant sees the speeds the operator would have measured (`knowledge: measured`) and runs again with
the oracle's knowledge on the same traces; both go in the artifact. Writes
bench/results/scheduling_ablation.json; ``--write`` regenerates BENCHMARKS.md's "## Scheduler
ablation" section from it, ``--from-json FILE`` only that.

    python bench/scheduling_ablation.py [--write]
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks_md import rendered_from_json, replace_section, section_arguments
from hetero_operator.scheduler import SchedulerConfig
from hetero_operator.simulator.cluster import load_cluster
from hetero_operator.simulator.engine import simulate
from hetero_operator.simulator.policies import HeterotrainPolicy
from hetero_operator.simulator.trace import generate_trace
from knowledge_modes import DESCRIPTION, MEASURED, MODES, ORACLE, options
from scheduling_policies import SCENARIOS, SEEDS, Scenario, capacity

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Scheduler ablation"
ARTIFACT = ROOT / "bench" / "results" / "scheduling_ablation.json"
DEFAULT = SchedulerConfig()
# What the former configurations share: mixes whenever faster, near-ties to the fastest, no moves,
# and nothing taken back from jobs that grew.
FORMER = replace(
    DEFAULT,
    mix_gain=0.0,
    tie_tolerance=0.01,
    move_gain=None,
    reclaim_growth=False,
    reclaim_gain=None,
    restart_seconds=None,
)
# (name, configuration, HetPipe pipelines)
VARIANTS: tuple[tuple[str, SchedulerConfig, bool], ...] = (
    ("default", DEFAULT, True),
    ("no moves onto idle faster GPUs", replace(DEFAULT, move_gain=None), True),
    ("no growth toward gpus.max", replace(DEFAULT, elastic=False), True),
    (
        "growth and moves judged by throughput alone, not the time left (restart_seconds unset)",
        replace(DEFAULT, restart_seconds=None),
        True,
    ),
    (
        "starting jobs never take back what others grew into (reclaim_gain unset)",
        replace(DEFAULT, reclaim_gain=None),
        True,
    ),
    ("mix classes whenever faster (mix_gain 0)", replace(DEFAULT, mix_gain=0.0), True),
    ("near-ties to the fastest (tie_tolerance 0.01)", replace(DEFAULT, tie_tolerance=0.01), True),
    ("no HetPipe pipelines", DEFAULT, False),
    (
        "GPUs priced by cost while jobs wait (scarcity_price 0.75)",
        replace(DEFAULT, scarcity_price=0.75),
        True,
    ),
    ("no priority preemption", replace(DEFAULT, priority_preemption=False), True),
    ("head reservations on", replace(DEFAULT, head_reservations=True), True),
    (
        "mix_gain 0, tie 0.01, no growth, no moves (nearest the former simulated `heterotrain`)",
        replace(FORMER, elastic=False),
        True,
    ),
    (
        "mix_gain 0, tie 0.01, no moves, no reclaim, head reservations (nearest the former operator default)",
        replace(FORMER, head_reservations=True),
        True,
    ),
)


def run_variant(
    scenario: Scenario, seed: int, config: SchedulerConfig, pipelines: bool, mode: str = MEASURED
) -> dict[str, float]:
    cluster = load_cluster(ROOT / "examples" / "sim" / scenario.cluster_file)
    trace = generate_trace(
        seed, scenario.jobs, capacity(cluster), scenario.load, max_gpus=scenario.max_gpus, cluster=cluster
    )
    result = simulate(cluster, trace, HeterotrainPolicy(config, pipelines=pipelines), options(mode))
    outcomes = result.outcomes
    return {
        "avg_jct": statistics.fmean(o.jct_s for o in outcomes),
        "avg_queueing": statistics.fmean(o.queueing_delay_s for o in outcomes),
        "avg_running": statistics.fmean(o.jct_s - o.queueing_delay_s for o in outcomes),
        "restarts_per_job": sum(o.restarts for o in outcomes) / len(outcomes),
        "jobs_on_mixed_classes": float(sum(1 for o in outcomes if len(o.classes_used) > 1)),
    }


def report(document: dict[str, Any]) -> str:
    lines = [
        SECTION,
        "",
        "`python bench/scheduling_ablation.py --write` (artifact `bench/results/scheduling_ablation.json`): "
        "the default scheduler beside variants that change one decision, on the 64-GPU traces of the "
        f"section above (seeds {', '.join(map(str, document['seeds']))}; means over the seeds, hours). "
        "Running time counts from a job's first start, restarts included. The two last rows set the "
        "former defaults' options; the former code also started a job on a mix of classes when no single "
        "class had room, which no option restores.",
        "",
        _knowledge_note(document),
    ]
    for scenario in document["scenarios"]:
        lines += [
            f"### {scenario['name']}",
            "",
            "| variant | avg JCT | queueing | running | restarts/job | jobs on mixed classes | "
            "avg JCT, oracle |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, m in scenario["variants"].items():
            oracle = f"{m[ORACLE]['avg_jct'] / 3600:.2f}" if ORACLE in m else "-"
            lines.append(
                f"| {name} | {m['avg_jct'] / 3600:.2f} | {m['avg_queueing'] / 3600:.2f} | "
                f"{m['avg_running'] / 3600:.2f} | {m['restarts_per_job']:.2f} | "
                f"{m['jobs_on_mixed_classes']:.0f} | {oracle} |"
            )
        lines.append("")
    return "\n".join(lines)


def _knowledge_note(document: dict[str, Any]) -> str:
    if document.get("knowledge") != MEASURED:
        return (
            "This artifact predates knowledge modes: every variant saw every job's true speeds from its "
            "arrival (the oracle). Rerun the benchmark for the measured-knowledge figures.\n"
        )
    return f"{DESCRIPTION} The last column is the same variant with the oracle's knowledge.\n"


def measure_variant(scenario: Scenario, config: SchedulerConfig, pipelines: bool) -> dict[str, Any]:
    """Seed means under measured knowledge, and under the oracle's (``"oracle"``)."""
    means: dict[str, dict[str, float]] = {}
    for mode in MODES:
        runs = [run_variant(scenario, seed, config, pipelines, mode) for seed in SEEDS]
        means[mode] = {key: statistics.fmean(r[key] for r in runs) for key in runs[0]}
    return {**means[MEASURED], ORACLE: means[ORACLE]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    section_arguments(parser)
    args = parser.parse_args()
    if rendered_from_json(args, report):
        return
    scenarios = [s for s in SCENARIOS if s.cluster_file == "cluster-64.yaml" and s.load >= 0.8]
    document: dict[str, Any] = {"seeds": list(SEEDS), "knowledge": MEASURED, "scenarios": []}
    for scenario in scenarios:
        variants = {
            name: measure_variant(scenario, config, pipelines) for name, config, pipelines in VARIANTS
        }
        document["scenarios"].append({"name": scenario.name, "variants": variants})
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    ARTIFACT.write_text(json.dumps(document, indent=1) + "\n")
    print(report(document))
    if args.write:
        replace_section(report(document))


if __name__ == "__main__":
    main()
