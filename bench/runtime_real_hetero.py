"""Real heterogeneous hardware, no simulation: the `data` strategy's synchronous step on devices that
really differ, even split against the split the operator's rebalancer settles on, in one run.

- A machine with an NVIDIA GPU and many cores: one GPU worker beside CPU workers with different
  thread counts on disjoint cores (gloo for all: NCCL cannot reach a CPU worker).
- A CPU-only machine with 4 or more cores: CPU workers with different thread counts, disjoint cores.
- A smaller machine can only run equal single-thread workers (`--allow-small-host`): that exercises
  the code path and measures the strategy's overhead, but shows no heterogeneity, and says so.

Phases: each worker alone on a few samples, the split proportional to those speeds, then rounds
decided by the operator's own rebalancer from the speeds each worker shows with all of them running
(as between epochs) until it settles, solo again at each worker's share of that split (the speed it
will train at: a GPU is faster per sample on larger batches), even (A), balanced (B), even again (A).
Efficiency = B's samples/s ÷ Σ solo speeds. A GPU worker's dataset is pinned once and each batch is
copied one step ahead, beside the compute, as the runtime's loaders do.

The step's fixed part (the gradients' all-reduce, staged through host memory for the GPU under gloo,
and the launch of the step) is the same whatever the split, so a small model on a fast GPU is bound by
it; `--length` makes each sample more work for the same gradient size, and `sync_share` reports the
part of the balanced step that no split can remove.

    python bench/runtime_real_hetero.py [--quick] [--global-batch N] [--length L] [--steps N]
                                        [--even-steps N] [--allow-small-host] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench_workers import run_workers, write_artifact
from runtime_fidelity import achieved_speeds, drift_problem, ideal_speedup, machine

RESULTS = Path(__file__).resolve().parent / "results"
EFFICIENCY_TARGET_GPU = 0.90
MAX_WORKERS = 3
# A GPU worker's cores: one drives the GPU, one serves the collective's transfers (staged through host
# memory under gloo), as a pod for a GPU would request.
GPU_WORKER_CORES = 2
# The first split comes from each worker alone on this many samples; the operator's rebalancer then
# decides rounds of ROUND_STEPS steps from the workers' speeds with all of them running, at most
# MAX_ROUNDS, keeping a new split only when it measures MIN_IMPROVEMENT faster.
PROBE_BATCH = 512
ROUND_STEPS = 10
MAX_ROUNDS = 4
MIN_IMPROVEMENT = 0.01


@dataclass(frozen=True)
class WorkerPlan:
    device: str  # "cuda:0" or "cpu"
    threads: int
    cores: list[int]

    @property
    def label(self) -> str:
        return f"{self.device} ({self.threads} thread{'s' if self.threads > 1 else ''})"


def thread_counts(cores: int, workers: int) -> list[int]:
    """Halving thread counts (largest power of two up to half the cores, then half of it, ...) that
    fit in `cores`, at most `workers` of them."""
    counts: list[int] = []
    size = 1 << max(0, (cores // 2).bit_length() - 1)
    while len(counts) < workers and size >= 1 and sum(counts) + size <= cores:
        counts.append(size)
        size //= 2
    return counts


def plan_workers(cuda_devices: int, cores: list[int], allow_small_host: bool) -> list[WorkerPlan]:
    """Which workers a machine can run with devices that really differ (pure)."""
    plans: list[WorkerPlan] = []
    free = list(cores)
    if cuda_devices > 0 and len(free) > GPU_WORKER_CORES:
        plans.append(WorkerPlan("cuda:0", 1, [free.pop(0) for _ in range(GPU_WORKER_CORES)]))
    counts = thread_counts(len(free), MAX_WORKERS - len(plans))
    if not plans and len(set(counts)) < 2:
        if not allow_small_host:
            raise SystemExit(
                f"{len(cores)} usable core(s) and no GPU: workers with different thread counts on disjoint "
                "cores need 4 or more; --allow-small-host runs equal workers (no heterogeneity shown)"
            )
        counts = [1] * min(len(free), MAX_WORKERS)
    for count in counts:
        plans.append(WorkerPlan("cpu", count, [free.pop(0) for _ in range(count)]))
    if len(plans) < 2:
        raise SystemExit(f"{len(cores)} usable core(s): a run needs at least two workers")
    return plans


def proportional(global_batch: int, speeds: list[float]) -> list[int]:
    from hetero_operator.planner.batch import proportional_split

    n = len(speeds)
    return [int(b) for b in proportional_split(global_batch, speeds, [1] * n, [float("inf")] * n)]


def summarize(raw: dict[str, Any], plans: list[WorkerPlan], gpu_machine: bool) -> dict[str, Any]:
    """Figures, verdict and what the run could not show (pure)."""
    solo = raw["solo"]
    solo_speeds = achieved_speeds([s["local_batch"] for s in solo], [s["compute_s"] for s in solo])
    speeds = {
        name: achieved_speeds(raw[name]["local_batches"], [t / 1e3 for t in raw[name]["worker_compute_ms"]])
        for name in ("even", "balanced", "even_again")
    }
    even_rate = (raw["even"]["samples_per_s"] + raw["even_again"]["samples_per_s"]) / 2
    even_speeds = [(a + b) / 2 for a, b in zip(speeds["even"], speeds["even_again"], strict=True)]
    speedup = raw["balanced"]["samples_per_s"] / even_rate
    ideal = ideal_speedup(speeds["balanced"], even_speeds)
    efficiency = raw["balanced"]["samples_per_s"] / sum(solo_speeds)
    # The simplest thing a user could do instead: train on the fastest device alone.
    of_fastest_alone = raw["balanced"]["samples_per_s"] / max(solo_speeds)
    balanced_step = max(raw["balanced"]["worker_step_ms"])
    sync_share = 1.0 - raw["balanced"]["slowest_compute_per_step_ms"] / balanced_step
    heterogeneous = len({(p.device, p.threads) for p in plans}) > 1
    notes = []
    if not heterogeneous:
        notes.append(
            "the workers are equal (the host has too few cores for different thread counts on disjoint "
            "cores): this run shows the strategy's overhead, not balancing across devices that differ"
        )
    if not gpu_machine:
        notes.append(
            "no GPU on this machine: the GPU target (efficiency >= 0.90 with a GPU worker) is not shown"
        )
    computes = raw["balanced"]["worker_compute_ms"]
    fastest, gating = solo_speeds.index(max(solo_speeds)), computes.index(max(computes))
    if heterogeneous and gating != fastest:
        notes.append(
            f"the balanced step waited on {plans[gating].label} ({computes[gating]:.1f} ms of compute "
            f"against {computes[fastest]:.1f} ms on {plans[fastest].label}, "
            f"{raw['balanced']['local_batches'][gating]} samples): a small share on a slow worker "
            "varies from step to step, and the fast worker waits for it"
        )
    if heterogeneous and of_fastest_alone < 1.0:
        notes.append(
            f"{plans[fastest].label} alone would train {1 / of_fastest_alone:.2f}x as fast: the other "
            "workers add less than their share of the synchronisation costs"
        )
    drift, drifted = drift_problem(raw["even"]["samples_per_s"], raw["even_again"]["samples_per_s"])
    if drifted:
        notes.append(f"{drifted}: the phases between them ran on a host of another speed")
    broken = speedup > ideal * 1.02 or efficiency > 1.02
    if broken:
        verdict = "**invalid: above the limit the speeds allow**"
    elif drifted:
        verdict = "**invalid: the host drifted**"
    elif not heterogeneous:
        verdict = "equal workers: no heterogeneity shown"
    elif gpu_machine:
        verdict = "target met" if efficiency >= EFFICIENCY_TARGET_GPU else "target missed"
    else:
        verdict = "CPU workers only: measured"
    return {
        "solo_samples_per_s": solo_speeds,
        "achieved_samples_per_s": speeds,
        "even_samples_per_s": even_rate,
        "host_drift": drift,
        "speedup_vs_even": speedup,
        "ideal_speedup": ideal,
        "efficiency": efficiency,
        "of_fastest_alone": of_fastest_alone,
        "sync_share": sync_share,
        "heterogeneous": heterogeneous,
        "verdict": verdict,
        "notes": notes,
    }


def supervise(config: dict[str, Any], timeout: float) -> dict[str, Any]:
    envs = []
    for plan in config["workers"]:
        threads = str(plan["threads"])
        envs.append(
            {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "BENCH_CONFIG": json.dumps(config)}
        )
    script = Path(__file__).with_name("runtime_real_hetero_worker.py")
    return run_workers(script, envs, Path(config["out"]), timeout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps")
    parser.add_argument("--global-batch", type=int, default=1024)
    parser.add_argument("--length", type=int, default=64, help="sequence length: compute per sample")
    parser.add_argument("--steps", type=int, help="steps of the balanced phase (default 30, 10 with --quick)")
    parser.add_argument(
        "--even-steps", type=int, help="steps of each even phase, whose steps are long (default: --steps)"
    )
    parser.add_argument(
        "--allow-small-host", action="store_true", help="equal workers on a host with < 4 cores"
    )
    parser.add_argument(
        "--out", type=Path, help="artifact path (default bench/results/runtime_real_hetero-KIND.json)"
    )
    args = parser.parse_args()
    import torch

    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else []
    )
    plans = plan_workers(len(gpus), sorted(os.sched_getaffinity(0)), args.allow_small_host)
    started, load_before = time.monotonic(), os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        steps = args.steps or (10 if args.quick else 30)
        config = {
            "global_batch": args.global_batch,
            "channels": 32,
            "length": args.length,
            "steps": steps,
            "even_steps": args.even_steps or steps,
            "solo_steps": 5 if args.quick else 10,
            "probe_batch": PROBE_BATCH,
            "round_steps": ROUND_STEPS,
            "max_rounds": MAX_ROUNDS,
            "min_improvement": MIN_IMPROVEMENT,
            "workers": [asdict(p) for p in plans],
            "out": str(Path(tmp) / "result.json"),
        }
        raw = supervise(config, timeout=1800)
    result = {
        "benchmark": "runtime_real_hetero",
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(gpus),
        "quick": args.quick,
        "config": {k: v for k, v in config.items() if k != "out"},
        "workers": [{**asdict(p), "label": p.label} for p in plans],
        **raw,
        **summarize(raw, plans, bool(gpus)),
        "seconds": time.monotonic() - started,
        "host_load": {"before": list(load_before), "after": list(os.getloadavg())},
    }
    kind = "gpu" if gpus else f"cpu{len(os.sched_getaffinity(0))}"
    out = args.out or RESULTS / f"runtime_real_hetero-{kind}{'-quick' if args.quick else ''}.json"
    write_artifact(
        result,
        out,
        ("speedup_vs_even", "ideal_speedup", "efficiency", "of_fastest_alone", "sync_share", "verdict"),
    )
    for note in result["notes"]:
        print(f"note: {note}", file=sys.stderr)


if __name__ == "__main__":
    main()
