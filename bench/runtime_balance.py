"""Runtime balance: the `data` strategy's measured split against the baselines a user would run
instead (the even split, the split the GPUClass priors give, the fastest worker alone), three
loopback gloo workers at simulated speeds 1 : 0.5 : 0.15, in one run. The priors say 1 : 0.5 : 0.25
(the spec-sheet figures of examples/gpuclasses.yaml): the slow GPU is slower for this model than its
class's prior, as the demo's is.

Each worker's compute is stretched to a per-sample cost calibrated solo at start (each rank alone,
all taking the slowest rank's figure), so a simulated GPU of speed s takes 1/s times the base
device's time for its samples, whatever CPU time the host charges it. Phases: calibrate, solo
(each worker alone: its solo speed), even (A), rebalancing rounds decided by the operator's own
functions, data (B), the priors' split, even again (A), the fastest worker alone. Per phase the run
reports the speed ratios the workers really achieved and the ideal speed-up those speeds allow over
each baseline, and it fails (exit 3) when achieved ratios are more than 5% off the claimed ones, or
(exit 4) when a speed-up exceeds its ideal or the two even phases differ by more than 5% (the host
drifted): then its figures cannot be true.

    python bench/runtime_balance.py [--quick] [--base-speed F] [--global-batch N] [--out FILE] [--render]

Writes its JSON artifact to bench/results/ (committed); `--render` then rebuilds BENCHMARKS.md's
Runtime section from the committed artifacts (bench/runtime_report.py does that alone).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench_workers import run_workers, write_artifact
from runtime_fidelity import (
    achieved_speeds,
    baseline_comparison,
    drift_problem,
    ideal_speedup,
    judge,
    machine,
    ratio_deviation,
    ratios,
)

SPEED_RATIOS = (1.0, 0.5, 0.15)  # how fast each simulated GPU truly runs this model
PRIOR_RATIOS = (1.0, 0.5, 0.25)  # what the classes' priors say (the operator's first split)
RESULTS = Path(__file__).resolve().parent / "results"
EXIT_SPEEDS_NOT_HELD = 3
EXIT_ABOVE_IDEAL = 4

# The simulated load (sum of speeds: the share of its time each worker computes) one core takes
# before the next core is used: the slow spells of a core are then common to the workers on it.
SHARED_CORE_LOAD = 0.5


def core_of_each_worker(speeds: list[float], cores: list[int]) -> list[int]:
    """A core for each simulated GPU: as few cores as the load fits in at SHARED_CORE_LOAD each.
    Workers that fit nowhere go, fastest first, to the least loaded core."""
    load = dict.fromkeys(cores, 0.0)
    out = [cores[0]] * len(speeds)
    for rank in sorted(range(len(speeds)), key=lambda r: -speeds[r]):
        fits = [c for c in cores if load[c] + speeds[rank] <= SHARED_CORE_LOAD]
        core = fits[0] if fits else min(cores, key=lambda c: (load[c], cores.index(c)))
        out[rank] = core
        load[core] += speeds[rank]
    return out


def physical_cores_first(cpus: list[int], topology: Path = Path("/sys/devices/system/cpu")) -> list[int]:
    """`cpus` with one logical CPU of each physical core first, then their hyper-thread siblings, each
    part in the given order. Two workers on siblings of one core slow each other while both compute,
    which a solo calibration never sees. A CPU whose topology cannot be read is a core of its own."""

    def core(cpu: int) -> tuple[str, ...] | int:
        where = topology / f"cpu{cpu}" / "topology"
        try:
            return tuple((where / name).read_text().strip() for name in ("physical_package_id", "core_id"))
        except OSError:
            return cpu

    seen: set[tuple[str, ...] | int] = set()
    first, siblings = [], []
    for cpu in cpus:
        key = core(cpu)
        (siblings if key in seen else first).append(cpu)
        seen.add(key)
    return first + siblings


def mode_label(time_dilation: float) -> str:
    return f"dilated x{time_dilation:g}" if time_dilation != 1 else "undilated"


def annotate_phase(phase: dict[str, Any], claimed: list[float]) -> list[float]:
    """Add the achieved speeds, their ratios and deviation, and the ideal speed-up they allow."""
    speeds = achieved_speeds(phase["local_batches"], [t / 1e3 for t in phase["worker_compute_ms"]])
    phase["achieved_samples_per_s"] = speeds
    phase["achieved_ratios"] = ratios(speeds)
    phase["ratio_deviation"] = ratio_deviation(speeds, claimed)
    phase["ideal_speedup"] = ideal_speedup(speeds, speeds)
    return speeds


def summarize(raw: dict[str, Any], claimed: list[float]) -> dict[str, Any]:
    """The run's figures and verdict from the workers' raw phases (pure)."""
    solo = raw["solo"]
    solo_speeds = achieved_speeds([s["local_batch"] for s in solo], [s["compute_s"] for s in solo])
    deviations = {"solo": ratio_deviation(solo_speeds, claimed)}
    speeds = {}
    for name in ("even", "data", "prior", "even_again"):
        if name in raw:  # runs before the priors' phase have none
            speeds[name] = annotate_phase(raw[name], claimed)
            deviations[name] = raw[name]["ratio_deviation"]
    even_rate = float(np.mean([raw["even"]["samples_per_s"], raw["even_again"]["samples_per_s"]]))
    even_speeds = [float(v) for v in np.mean([speeds["even"], speeds["even_again"]], axis=0)]
    speedup = raw["data"]["samples_per_s"] / even_rate
    ideal = ideal_speedup(speeds["data"], even_speeds)
    efficiency = raw["data"]["samples_per_s"] / sum(solo_speeds)
    verdict = judge(deviations, speedup, ideal, efficiency)
    drift, drifted = drift_problem(raw["even"]["samples_per_s"], raw["even_again"]["samples_per_s"])
    baselines = baseline_comparisons(raw, speeds, even_rate, even_speeds)
    # Beyond the verdict's own reasons: a host that drifted, a baseline beaten past its ideal.
    unsound = [drifted] if drifted else []
    unsound += [
        f"speed-up over {kind} {b['speedup']:.3f} exceeds the {b['ideal_speedup']:.3f} its speeds allow"
        for kind, b in baselines.items()
        if b["above_ideal"]
    ]
    return {
        "solo_samples_per_s": solo_speeds,
        "solo_ratios": ratios(solo_speeds),
        "ratio_deviation": deviations,
        "even_samples_per_s": even_rate,
        "host_drift": drift,
        "speedup_vs_even": speedup,
        "ideal_speedup": ideal,
        "nominal_ideal_speedup": ideal_speedup(claimed, claimed),
        "speedup_of_ideal": speedup / ideal,
        "efficiency": efficiency,
        "even_efficiency": even_rate / sum(solo_speeds),
        "speeds_held": verdict.speeds_held,
        "valid": verdict.valid and not unsound,
        "targets_met": verdict.targets_met,
        "baselines": baselines,
        "baseline_targets_met": bool(baselines) and all(b["target_met"] for b in baselines.values()),
        "problems": [*verdict.reasons, *unsound],
    }


def baseline_comparisons(
    raw: dict[str, Any], speeds: dict[str, list[float]], even_rate: float, even_speeds: list[float]
) -> dict[str, dict[str, Any]]:
    """The balanced phase against each baseline of the run (none for runs before the priors' and
    the lone fastest worker's phases): speed-up, the ideal its measured speeds allow, their ratio."""
    if "prior" not in raw or "fastest_alone" not in raw:
        return {}
    rate, balanced = raw["data"]["samples_per_s"], speeds["data"]
    alone = raw["fastest_alone"]
    alone_speeds = achieved_speeds(alone["local_batches"], [t / 1e3 for t in alone["worker_compute_ms"]])
    prior = raw["prior"]
    return {
        "even": baseline_comparison(rate, balanced, even_rate, raw["even"]["local_batches"], even_speeds),
        "prior": baseline_comparison(
            rate, balanced, prior["samples_per_s"], prior["local_batches"], speeds["prior"]
        ),
        "fastest_alone": baseline_comparison(
            rate, balanced, alone["samples_per_s"], alone["local_batches"], alone_speeds
        ),
    }


def follow_progress(path: Path, done: threading.Event) -> None:
    """Show rank 0's progress lines as a rich progress bar on stderr until `done` is set."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("calibrating, then solo runs", total=None)
        offset = 0
        while not done.wait(0.2):
            if not path.exists():
                continue
            with path.open() as lines:
                lines.seek(offset)
                chunk = lines.read()
            complete = chunk[: chunk.rfind("\n") + 1]
            offset += len(complete)
            for line in complete.splitlines()[-1:]:
                state = json.loads(line)
                split = "/".join(str(b) for b in state["split"])
                description = f"{state['phase']} [{split}]"
                bar.update(task, description=description, completed=state["done"], total=state["total"])


def supervise(config: dict[str, Any], timeout: float) -> dict[str, Any]:
    done = threading.Event()
    follower = threading.Thread(target=follow_progress, args=(Path(config["progress"]), done), daemon=True)
    follower.start()
    envs = [
        {
            "HETEROTRAIN_SIMULATED_SPEED": repr(ratio * config["base_speed"]),
            "OMP_NUM_THREADS": "1",
            "BENCH_CONFIG": json.dumps(config),
        }
        for ratio in SPEED_RATIOS
    ]
    try:
        return run_workers(
            Path(__file__).with_name("runtime_balance_worker.py"), envs, Path(config["out"]), timeout
        )
    finally:
        done.set()
        follower.join()


def run_config(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    quick = args.quick
    return {
        "global_batch": args.global_batch,
        "micro_batch": 16,
        "length": 64,
        "steps": 10 if quick else 40,
        "round_steps": 6 if quick else 16,
        "max_rounds": 4 if quick else 6,
        "solo_steps": 4 if quick else 10,
        "calibration_repeats": 5,
        "min_improvement": args.min_improvement,
        "base_speed": args.base_speed,
        "worker_cores": None
        if args.unpinned
        # Separate physical cores, the highest-numbered first (the first ones take most of a machine's
        # interrupts): the fastest simulated GPU has no slack to absorb a slower core.
        else core_of_each_worker(
            [r * args.base_speed for r in SPEED_RATIOS],
            physical_cores_first(sorted(os.sched_getaffinity(0), reverse=True)),
        ),
        "prior_ratios": list(PRIOR_RATIOS),
        "out": str(tmp / "result.json"),
        "progress": str(tmp / "progress.jsonl"),
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (about a third of a full run)")
    parser.add_argument(
        "--out", type=Path, help="artifact path (default bench/results/runtime_balance-MODE.json)"
    )
    parser.add_argument("--render", action="store_true", help="then rebuild BENCHMARKS.md's Runtime section")
    parser.add_argument(
        "--unpinned", action="store_true", help="let the OS place the workers (default: one core each load)"
    )
    parser.add_argument(
        "--base-speed",
        type=float,
        default=1.0,
        help="multiply every simulated speed by this (1 = undilated, the default; 0.25 = time dilation 4, "
        "as the test bed runs)",
    )
    parser.add_argument("--global-batch", type=int, default=1024, help="samples per synchronous step")
    parser.add_argument(
        "--min-improvement",
        type=float,
        default=0.01,
        help="the job's rebalance.minImprovement: smallest predicted gain worth a new split",
    )
    args = parser.parse_args()
    if not 0 < args.base_speed <= 1:
        parser.error(f"--base-speed: must be in (0, 1], got {args.base_speed}")
    if args.global_batch < len(SPEED_RATIOS):
        parser.error(f"--global-batch: needs at least one sample per worker ({len(SPEED_RATIOS)})")
    return args


def main() -> None:
    args = parse_args()
    claimed = [r * args.base_speed for r in SPEED_RATIOS]
    started, load_before = time.monotonic(), os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        config = run_config(args, Path(tmp))
        raw = supervise(config, timeout=900)
    dilation = 1 / args.base_speed
    result = {
        "benchmark": "runtime_balance",
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "mode": mode_label(dilation),
        "quick": args.quick,
        "time_dilation": dilation,
        "speed_ratios": list(SPEED_RATIOS),
        "prior_ratios": list(PRIOR_RATIOS),
        "simulated_speeds": claimed,
        "config": {k: v for k, v in config.items() if k not in ("out", "progress")},
        **raw,
        **summarize(raw, claimed),
        "seconds": time.monotonic() - started,
        "host_load": {"before": list(load_before), "after": list(os.getloadavg())},
    }
    suffix = "-quick" if args.quick else ""
    out = args.out or RESULTS / f"runtime_balance-{result['mode'].replace(' ', '-')}{suffix}.json"
    write_artifact(result, out, ("mode", "speedup_vs_even", "ideal_speedup", "efficiency"))
    for problem in result["problems"]:
        print(f"INVALID RUN: {problem}", file=sys.stderr)
    if args.render:
        from runtime_report import write_section

        write_section()
    if not result["speeds_held"]:
        raise SystemExit(EXIT_SPEEDS_NOT_HELD)
    if not result["valid"]:
        raise SystemExit(EXIT_ABOVE_IDEAL)


if __name__ == "__main__":
    main()
