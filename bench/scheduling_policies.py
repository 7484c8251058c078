"""Scheduling policies on a simulated heterogeneous cluster: average/p99 JCT, makespan, utilisation.

Each scenario generates one trace from a fixed seed (Poisson arrivals, log-normal durations, mixed
sizes; see `hetero_operator.simulator.trace`) and runs every policy on it with the simulator, which
drives the operator's own scheduler and planner. Prints JSON; ``--write`` replaces the
"## Scheduling policies" section of BENCHMARKS.md and writes plots under bench/plots/.

    python bench/scheduling_policies.py [--quick] [--write] [--runtime-json FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks_md import replace_section
from hetero_operator.simulator.cluster import Cluster, load_cluster
from hetero_operator.simulator.engine import SimulationResult, simulate
from hetero_operator.simulator.policies import POLICIES, make_policy
from hetero_operator.simulator.report import summarize, write_plots
from hetero_operator.simulator.trace import generate_trace
from hetero_operator.simulator.validation import compare_runtime_benchmark
from progress import Steps, steps

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Scheduling policies"
RECORDED_RUNTIME = ROOT / "tests" / "simulator" / "data" / "runtime_balance_recorded.json"
SPEED_TARGET_S = 60.0


@dataclass(frozen=True)
class Scenario:
    name: str
    cluster_file: str
    jobs: int
    load: float
    max_gpus: int
    seed: int = 1
    quick: bool = False


SCENARIOS = (
    Scenario("64-GPU, 3 classes", "cluster-64.yaml", 400, 0.5, 16, quick=True),
    Scenario("64-GPU, 3 classes, busier", "cluster-64.yaml", 400, 0.8, 16),
    Scenario("2000-GPU, 4 classes", "cluster-2000.yaml", 5000, 0.5, 32),
)
METRICS = ("avg_jct", "p99_jct", "makespan", "utilisation")


def capacity(cluster: Cluster) -> float:
    """V100-equivalent GPUs: the load a trace offers is relative to this."""
    return sum(n.gpus_allocatable * cluster.class_info(n.gpu_class).relative_speed for n in cluster.nodes)


def run_scenario(scenario: Scenario, plots: Path | None, progress: Steps) -> dict[str, Any]:
    cluster = load_cluster(ROOT / "examples" / "sim" / scenario.cluster_file)
    trace = generate_trace(
        scenario.seed, scenario.jobs, capacity(cluster), scenario.load, max_gpus=scenario.max_gpus
    )
    results: list[SimulationResult] = []
    for name in POLICIES:
        progress.doing(f"{scenario.name}: {name}")
        results.append(simulate(cluster, trace, make_policy(name)))
        progress.done()
    summaries = {r.policy: summarize(r) for r in results}
    if plots is not None:
        slug = scenario.name.split(",")[0].lower().replace(" ", "").replace("-gpu", "gpu")
        slug += "-busy" if "busier" in scenario.name else ""
        write_plots(results, plots / slug)
    hetero = summaries["heterotrain"]
    return {
        "cluster": scenario.cluster_file,
        "gpus": cluster.total_gpus,
        "classes": list(cluster.class_names),
        "jobs": scenario.jobs,
        "load": scenario.load,
        "seed": scenario.seed,
        "policies": summaries,
        "fifo_over_heterotrain_avg_jct": summaries["fifo"]["avg_jct"] / hetero["avg_jct"],
        "gavel_over_heterotrain_avg_jct": summaries["gavel"]["avg_jct"] / hetero["avg_jct"],
        "heterotrain_wall_seconds": hetero["wall_seconds"],
    }


def runtime_check(path: Path) -> list[dict[str, Any]]:
    comparisons = compare_runtime_benchmark(json.loads(path.read_text()))
    return [
        {
            "phase": c.phase,
            "predicted_samples_per_s": c.predicted_samples_per_s,
            "measured_samples_per_s": c.measured_samples_per_s,
            "relative_error": c.relative_error,
        }
        for c in comparisons
    ]


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f}"


def report(document: dict[str, Any]) -> str:
    lines = [
        SECTION,
        "",
        "`python bench/scheduling_policies.py --write` (`--quick`: the 64-GPU case alone). One trace per "
        "scenario from a fixed seed: Poisson arrivals offering the stated load of the cluster's "
        "V100-equivalent capacity, log-normal durations (median 30 min, 2 min to 1 day), 1-32 GPUs "
        "(mostly 1), models ResNet-18/ResNet-50/Transformer with per-class throughputs from the Gavel "
        "paper's table (ResNet-50 does not fit a 12 GiB K80 alone). Every policy runs the same trace in "
        f"the simulator. {platform.python_implementation()} {platform.python_version()}, 2-core machine.",
        "",
        "- `fifo`: strict FIFO gang, gpus.min GPUs of one class (the least-allocated class: speed-blind), "
        "no backfill.",
        "- `gavel`: max-min fairness over effective throughput (an LP per 6-minute round), one class per "
        "job, time-shared with checkpoint cost on every move.",
        "- `heterotrain`: the operator's scheduler with "
        "`SchedulerConfig(elastic=False, head_reservations=False)`: mixed classes with the planner's batch "
        "split, HetPipe virtual workers for ResNet-50, priority preemption.",
        "- `heterotrain-default`: the same scheduler with the operator's default configuration (elastic "
        "growth, head reservations).",
        "",
        "Times in hours; utilisation = allocated GPU time over capacity x makespan.",
        "",
    ]
    for result in document["scenarios"]:
        lines += [
            f"### {result['gpus']} GPUs ({', '.join(result['classes'])}), {result['jobs']} jobs, "
            f"load {result['load']}",
            "",
            "| policy | avg JCT | p50 JCT | p99 JCT | makespan | avg queueing | utilisation "
            "| jobs on mixed classes | restarts | sim wall s |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, s in result["policies"].items():
            lines.append(
                f"| {name} | {_hours(s['avg_jct'])} | {_hours(s['p50_jct'])} | {_hours(s['p99_jct'])} | "
                f"{_hours(s['makespan'])} | {_hours(s['avg_queueing_delay'])} | {s['utilisation']:.2f} | "
                f"{s['jobs_on_mixed_classes']} | {s['restarts']} | {s['wall_seconds']:.1f} |"
            )
        lines += [
            "",
            f"Average JCT: FIFO / heterotrain = **{result['fifo_over_heterotrain_avg_jct']:.2f}x**, "
            f"Gavel-like / heterotrain = **{result['gavel_over_heterotrain_avg_jct']:.2f}x**.",
            "",
        ]
    lines += [
        "Targets: heterotrain's average JCT at least 1.3x better than FIFO and no worse than Gavel-like; a "
        f"2,000-GPU, 5,000-job trace simulated in under {SPEED_TARGET_S:.0f} s. At the busier load, Gavel's "
        "time-sharing wins on average JCT: heavy-tailed jobs run to completion under heterotrain's queue, "
        "while Gavel gives every job a slice each round. Plots: `bench/plots/<scenario>/jct_cdf.png` and "
        "`utilisation_<policy>.png`.",
        "",
        "![JCT CDF, 64 GPUs](bench/plots/64gpu/jct_cdf.png) "
        "![JCT CDF, 2000 GPUs](bench/plots/2000gpu/jct_cdf.png)",
        "",
    ]
    if document.get("runtime_validation"):
        lines += [
            "Throughput model against a recorded `bench/runtime_balance.py` run (three workers at speeds 1, "
            "0.5, 0.25; the planner's iteration time for each phase's split from the measured per-worker "
            "compute and all-reduce times):",
            "",
            "| phase | predicted samples/s | measured samples/s | error |",
            "|---|---|---|---|",
        ]
        for row in document["runtime_validation"]:
            lines.append(
                f"| {row['phase']} | {row['predicted_samples_per_s']:.0f} | "
                f"{row['measured_samples_per_s']:.0f} | {100 * row['relative_error']:.1f}% |"
            )
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the 64-GPU case alone")
    parser.add_argument("--write", action="store_true", help="write the section into BENCHMARKS.md and plots")
    parser.add_argument(
        "--runtime-json",
        type=Path,
        default=RECORDED_RUNTIME,
        help="a bench/runtime_balance.py --json-out result",
    )
    args = parser.parse_args()
    started = time.perf_counter()
    plots = ROOT / "bench" / "plots" if args.write else None
    scenarios = [s for s in SCENARIOS if s.quick or not args.quick]
    with steps("simulations", len(scenarios) * len(POLICIES)) as progress:
        document: dict[str, Any] = {"scenarios": [run_scenario(s, plots, progress) for s in scenarios]}
    if args.runtime_json.exists():
        document["runtime_validation"] = runtime_check(args.runtime_json)
    document["total_seconds"] = time.perf_counter() - started
    print(json.dumps(document, indent=2))
    if args.write:
        replace_section(report(document))


if __name__ == "__main__":
    main()
