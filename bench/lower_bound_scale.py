"""How long the lower bound on average JCT takes at scale: 5,000 jobs on 2,000 GPUs in under a minute.

The trace is the scheduling-policies section's "2,000 GPUs, load 0.8" scenario (seed 1, four GPU
classes, examples/sim/cluster-2000.yaml); `hetero_operator.simulator.lower_bound` turns its rows
into the relaxation's jobs (their credits and peaks, from the true speeds) and solves the LP with
HiGHS. Writes bench/results/lower_bound_scale.json: the seconds each part took, the LP's size, the
bound and the isolation bound beside it, and the machine.

    python bench/lower_bound_scale.py [--seed N] [--resolution N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from hetero_operator.simulator.cluster import load_cluster
from hetero_operator.simulator.engine import EngineOptions
from hetero_operator.simulator.interval_lp import DEFAULT_RESOLUTION
from hetero_operator.simulator.lower_bound import bound_job, lower_bound_of_jobs
from hetero_operator.simulator.trace import generate_trace
from scheduling_policies import SCENARIOS, capacity

ROOT = Path(__file__).resolve().parents[1]
ARTIFACT = ROOT / "bench" / "results" / "lower_bound_scale.json"
SCENARIO = "2,000 GPUs, load 0.8"
TARGET_S = 60.0


def run(seed: int, resolution: int) -> dict[str, Any]:
    scenario = next(s for s in SCENARIOS if s.name == SCENARIO)
    cluster = load_cluster(ROOT / "examples" / "sim" / scenario.cluster_file)
    trace = generate_trace(
        seed, scenario.jobs, capacity(cluster), scenario.load, max_gpus=scenario.max_gpus, cluster=cluster
    )
    options = EngineOptions()
    started = time.perf_counter()
    jobs = [bound_job(row, cluster, options) for row in trace]
    jobs_s = time.perf_counter() - started
    found = lower_bound_of_jobs(jobs, cluster.gpus_per_class(), resolution=resolution)
    total_s = time.perf_counter() - started
    return {
        "scenario": SCENARIO,
        "seed": seed,
        "jobs": len(trace),
        "gpus": cluster.total_gpus,
        "gpus_per_class": cluster.gpus_per_class(),
        "resolution": resolution,
        "jobs_seconds": jobs_s,
        "lp_seconds": found.solve_s,
        "total_seconds": total_s,
        "target_seconds": TARGET_S,
        "within_target": total_s < TARGET_S,
        "solves": found.rounds,
        "variables": found.variables,
        "constraints": found.constraints,
        "bound_avg_jct_s": found.avg_jct_s,
        "isolation_avg_jct_s": found.isolation_avg_jct_s,
        "bound_over_isolation": found.avg_jct_s / found.isolation_avg_jct_s,
        "beyond_window_share": found.beyond_window_share,
    }


def machine() -> str:
    cores = len(os.sched_getaffinity(0))
    return f"{cores}-core {platform.machine()} ({platform.system()}), Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--resolution", type=int, default=DEFAULT_RESOLUTION)
    args = parser.parse_args()
    # The machine may be shared: the load average before the run says how much else was running.
    document = {
        "machine": machine(),
        "load_average_1min": os.getloadavg()[0],
        **run(args.seed, args.resolution),
    }
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    ARTIFACT.write_text(json.dumps(document, indent=1) + "\n")
    print(json.dumps(document, indent=1))


if __name__ == "__main__":
    main()
