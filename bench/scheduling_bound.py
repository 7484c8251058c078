"""How much better than `greedy-fastest` any policy could be on the scheduling traces.

For every data-parallel job of a trace (HetPipe jobs aside), its contention-free JCT: the engine's
start-up time plus its work at the best rate any single class it allows gives it, at any size from
gpus.min to gpus.max, as if it had the cluster to itself from the moment it arrived. No policy
beats that on a single class: the jobs can only be slower when they share the cluster. The ratio
of `greedy-fastest`'s average JCT over the same jobs to this average is the most any single-class
policy can gain over it on the trace. `greedy-fastest` and `heterotrain` are simulated again on the
same traces (seeds 1, 2, 3, restart cost x1), so all three averages cover the same jobs: seeing
the speeds the operator would have measured (`knowledge: measured`), and again with the oracle's
knowledge (every job's true speeds from its arrival). The bound does not depend on knowledge.

Writes bench/results/scheduling_bound.json; ``--write`` also regenerates BENCHMARKS.md's
"## Scheduling: the contention-free bound" section, ``--from-json FILE`` only that.

    python bench/scheduling_bound.py [--workers N] [--write]
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks_md import publish, rendered_from_json, section_arguments
from hetero_operator.resources import Strategy
from hetero_operator.simulator.cluster import load_cluster
from hetero_operator.simulator.engine import simulate
from hetero_operator.simulator.jobs import build_job
from hetero_operator.simulator.policies import make_policy
from hetero_operator.simulator.rates import best_single_class_set
from hetero_operator.simulator.trace import generate_trace
from knowledge_modes import MEASURED, MODES, ORACLE, options
from scheduling_policies import AVG_TARGET_LOADS, AVG_TARGET_RATIO, SCENARIOS, SEEDS, Scenario, capacity

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Scheduling: the contention-free bound"
ARTIFACT = ROOT / "bench" / "results" / "scheduling_bound.json"
POLICIES = ("greedy-fastest", "heterotrain")


def run_seed(scenario: Scenario, seed: int) -> dict[str, Any]:
    cluster = load_cluster(ROOT / "examples" / "sim" / scenario.cluster_file)
    trace = generate_trace(
        seed, scenario.jobs, capacity(cluster), scenario.load, max_gpus=scenario.max_gpus, cluster=cluster
    )
    engine = options(MEASURED)
    catalog = tuple(sorted(cluster.classes, key=lambda c: c.name))
    per_node = {
        c.name: max(n.gpus_allocatable for n in cluster.nodes if n.gpu_class == c.name) for c in catalog
    }
    bound: dict[str, float] = {}
    held: Counter[str] = Counter()  # GPU-seconds each class holds for the bound's placements
    for row in trace:
        job = build_job(row, cluster, pipelines=True, prior=engine.prior)
        if job.request.strategy is not Strategy.HETPIPE:  # pipelines are not data-parallel sets
            rate, gpu_class, size = best_single_class_set(job.request, per_node, catalog, engine.prior)
            bound[row.job_id] = engine.startup_s + job.work_samples / rate
            held[str(gpu_class)] += size * bound[row.job_id]
    averages = {"bound": statistics.fmean(bound.values())}
    span = max(row.arrival_s for row in trace) - min(row.arrival_s for row in trace)
    gpus = cluster.gpus_per_class()
    demand = {c.name: held[c.name] / (gpus[c.name] * span) for c in catalog}
    for mode in MODES:
        for policy in POLICIES:
            name = policy if mode == MEASURED else f"{policy} ({ORACLE})"
            result = simulate(cluster, trace, make_policy(policy), options(mode))
            jct = {o.job_id: o.jct_s for o in result.outcomes}
            averages[name] = statistics.fmean(jct[job] for job in bound)
            averages[f"{name} (all jobs)"] = statistics.fmean(jct.values())
    return {
        "seed": seed,
        "data_parallel_jobs": len(bound),
        "jobs": len(trace),
        "avg_jct": averages,
        "bound_demand_over_capacity": demand,
    }


def summarise(scenario: Scenario, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Seed means of each average, and the ratios over greedy-fastest's."""
    keys = runs[0]["avg_jct"]
    mean = {key: statistics.fmean(r["avg_jct"][key] for r in runs) for key in keys}
    greedy = mean["greedy-fastest"]
    return {
        "name": scenario.name,
        "load": scenario.load,
        "seeds": runs,
        "avg_jct": mean,
        "greedy_over_heterotrain": greedy / mean["heterotrain"],
        "greedy_over_bound": greedy / mean["bound"],
        "greedy_over_heterotrain_all_jobs": mean["greedy-fastest (all jobs)"]
        / mean["heterotrain (all jobs)"],
        "greedy_over_heterotrain_oracle": mean[f"greedy-fastest ({ORACLE})"]
        / mean[f"heterotrain ({ORACLE})"],
        "bound_demand_over_capacity": {
            name: statistics.fmean(r["bound_demand_over_capacity"][name] for r in runs)
            for name in runs[0]["bound_demand_over_capacity"]
        },
    }


def busiest_class(scenario: dict[str, Any]) -> tuple[str, float]:
    """The class the bound asks most of, and its demand over capacity."""
    demand: dict[str, float] = scenario["bound_demand_over_capacity"]
    return max(demand.items(), key=lambda item: item[1])


def _knowledge(document: dict[str, Any]) -> str:
    if any("greedy_over_heterotrain_oracle" in s for s in document["scenarios"]):
        return (
            "Both policies see what the operator would have measured (see the scheduling-policies "
            "section); the column before the last is the same ratio with the oracle's knowledge."
        )
    return "This artifact predates knowledge modes: both policies saw every job's true speeds."


def report(document: dict[str, Any]) -> str:
    lines = [
        SECTION,
        "",
        "`python bench/scheduling_bound.py --write` (artifact `bench/results/scheduling_bound.json`): on the "
        "traces of the scheduling-policies section (seeds "
        f"{', '.join(map(str, document['seeds']))}), each data-parallel job's JCT if it had the cluster to "
        "itself from its arrival: start-up plus its work at the best rate one class it allows gives it, at "
        "any size from gpus.min to gpus.max (the simulator's rate model). No single-class placement does "
        "better, so greedy-fastest over this bound is the most any such policy can gain over greedy-fastest "
        "on these jobs. Mixed-class sets can beat it, by the `mix_gain` the default demands at least. "
        "HetPipe jobs (models too big for a class) are left out; the last column but one is over all jobs. "
        f"Means over the seeds, hours. {_knowledge(document)} The last column is what the bound asks of "
        "the class it asks most "
        "of: the GPU-seconds its placements hold there (start-up included) over that class's GPUs times "
        "the span in which the jobs arrive. Above 1, the bound wants more of that class than the cluster "
        "has while the jobs come in: some jobs must run on slower classes, and the bound is out of reach.",
        "",
        "| scenario | data-parallel jobs | greedy-fastest | heterotrain | bound | greedy / heterotrain | "
        "greedy / bound (most possible) | greedy / heterotrain, all jobs | greedy / heterotrain, oracle | "
        "busiest class at the bound |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in document["scenarios"]:
        avg = s["avg_jct"]
        jobs = statistics.fmean(r["data_parallel_jobs"] for r in s["seeds"])
        hours = " | ".join(f"{avg[key] / 3600:.3f}" for key in ("greedy-fastest", "heterotrain", "bound"))
        ratios = " | ".join(
            f"{s[key]:.3f}x"
            for key in ("greedy_over_heterotrain", "greedy_over_bound", "greedy_over_heterotrain_all_jobs")
        )
        busiest, demand = busiest_class(s)
        oracle = s.get("greedy_over_heterotrain_oracle")
        seen_all = "-" if oracle is None else f"{oracle:.3f}x"
        lines.append(
            f"| {s['name']} | {jobs:.0f} | {hours} | {ratios} | {seen_all} | {busiest} {demand:.2f} |"
        )
    lines.append("")
    for s in document["scenarios"]:
        if s["load"] not in AVG_TARGET_LOADS:
            continue
        room = s["greedy_over_bound"]
        share = (s["greedy_over_heterotrain"] - 1) / (room - 1) if room > 1 else float("nan")
        per_seed = ", ".join(
            f"{r['avg_jct']['greedy-fastest'] / r['avg_jct']['bound']:.3f}x" for r in s["seeds"]
        )
        verdict = (
            f"below the {AVG_TARGET_RATIO}x target: no single-class policy can meet it on these jobs"
            if room < AVG_TARGET_RATIO
            else f"the {AVG_TARGET_RATIO}x target asks for {(AVG_TARGET_RATIO - 1) / (room - 1):.0%} of it"
        )
        busiest, demand = busiest_class(s)
        lines.append(
            f"- {s['name']}: the most possible is {room:.3f}x (per seed {per_seed}), {verdict}; "
            f"heterotrain reaches {share:.0%} of that gain. The bound asks {demand:.2f}x of what the "
            f"{busiest} GPUs have."
        )
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    section_arguments(parser)
    args = parser.parse_args()
    if rendered_from_json(args, report):
        return
    tasks = [(scenario, seed) for scenario in SCENARIOS for seed in SEEDS]
    with ProcessPoolExecutor(args.workers) as pool:
        runs = list(pool.map(run_seed, *zip(*tasks, strict=True)))
    document: dict[str, Any] = {"seeds": list(SEEDS), "scenarios": []}
    for index, scenario in enumerate(SCENARIOS):
        document["scenarios"].append(summarise(scenario, runs[index * len(SEEDS) : (index + 1) * len(SEEDS)]))
    publish(document, report(document), ARTIFACT, args.write)


if __name__ == "__main__":
    main()
