"""BENCHMARKS.md's Runtime section, rendered from the committed artifacts in bench/results/ alone.

    python bench/runtime_report.py            # rewrite the section in BENCHMARKS.md
    python bench/runtime_report.py --print    # show it

Every figure in the section comes from an artifact; a run whose simulated speeds did not hold is
shown as such, with no efficiency or speed-up claimed for it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks_md import replace_section
from runtime_fidelity import (
    DRIFT_LIMIT,
    EFFICIENCY_TARGET,
    OF_IDEAL_TARGET,
    RATIO_TOLERANCE,
    SPEEDUP_OF_IDEAL_TARGET,
    machine_label,
)

RESULTS = Path(__file__).resolve().parent / "results"
HEADING = "## Runtime"


def load_artifacts(directory: Path = RESULTS) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The committed runs: (simulated-speed runs, real-hardware runs), each sorted by file name."""
    simulated: list[dict[str, Any]] = []
    real: list[dict[str, Any]] = []
    paths = [*directory.glob("runtime_balance-*.json"), *directory.glob("runtime_real_hetero-*.json")]
    for path in sorted(paths):
        run = json.loads(path.read_text())
        run["artifact"] = f"bench/results/{path.name}"
        (real if run.get("benchmark") == "runtime_real_hetero" else simulated).append(run)
    return simulated, real


def _ratios(values: list[float]) -> str:
    return " : ".join(f"{v:.3g}" for v in values)


def _verdict(run: dict[str, Any]) -> str:
    if not run["speeds_held"]:
        return "**invalid: simulated speeds not held**"
    if not run["valid"]:
        drifted = any("drifted" in problem for problem in run["problems"])
        return "**invalid: the host drifted**" if drifted else "**invalid: above the ideal**"
    if not run["targets_met"]:
        return "valid, targets missed"
    return "targets met" if run["time_dilation"] == 1 else "targets met, dilated (not the undilated target)"


def simulated_row(run: dict[str, Any]) -> str:
    phases = (run["solo_ratios"], *(run[p]["achieved_ratios"] for p in ("even", "data", "even_again")))
    valid = run["valid"]
    cells = [
        run["mode"] + (" (quick)" if run["quick"] else ""),
        _ratios(run["simulated_speeds"]),
        " / ".join(_ratios(r) for r in phases),
        f"{max(run['ratio_deviation'].values()):.1%}",
        f"{run['even']['samples_per_s']:.0f} / {run['even_again']['samples_per_s']:.0f}",
        f"{run['data']['samples_per_s']:.0f}",
        f"{run['speedup_vs_even']:.2f}" if valid else "-",
        f"{run['ideal_speedup']:.2f}",
        f"{run['speedup_of_ideal']:.3f}" if valid else "-",
        f"{run['efficiency']:.3f}" if valid else "-",
        " / ".join(str(b) for b in run["data"]["local_batches"]),
        _verdict(run),
        f"[json]({run['artifact'].removeprefix('bench/')})",
    ]
    return "| " + " | ".join(cells) + " |"


SIMULATED_HEAD = (
    "| Mode | Claimed speeds | Achieved ratios: solo / even / data / even again | Worst deviation "
    "| Even samples/s (A / A again) | `data` samples/s | Speed-up | Ideal speed-up of the achieved speeds "
    "| Speed-up ÷ ideal | Efficiency (÷ Σ solo) | Final split | Verdict | Artifact |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


BASELINES_HEAD = (
    "| Run | Against | Its split | Its samples/s | Speed-up of the measured split | Ideal its speeds allow "
    f"| ÷ ideal (target ≥ {OF_IDEAL_TARGET}) | Artifact |\n"
    "|---|---|---|---|---|---|---|---|"
)
BASELINE_NAMES = {"even": "even split", "prior": "the priors' split", "fastest_alone": "fastest worker alone"}


def baseline_rows(run: dict[str, Any]) -> list[str]:
    """The measured split against each baseline of one run (runs since those phases were added)."""
    label = run["mode"] + (" (quick)" if run["quick"] else "")
    rows = []
    for kind, compared in run.get("baselines", {}).items():
        shown = run["valid"] and run["speeds_held"]
        cells = [
            label,
            BASELINE_NAMES[kind],
            " / ".join(str(b) for b in compared["local_batches"]),
            f"{compared['samples_per_s']:.0f}",
            f"{compared['speedup']:.2f}" if shown else "-",
            f"{compared['ideal_speedup']:.2f}",
            (f"{compared['of_ideal']:.3f}" + ("" if compared["target_met"] else " (missed)"))
            if shown
            else "-",
            f"[json]({run['artifact'].removeprefix('bench/')})",
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def simulated_notes(run: dict[str, Any]) -> list[str]:
    """What each run's host did: calibration, overrun, drift, load, and why a run is invalid."""
    base = run["calibration"][0]["base_us_per_sample"]
    own = ", ".join(f"{c['own_us_per_sample']:.0f}" for c in run["calibration"])
    overrun = " / ".join(
        ", ".join(f"{s:.0%}" for s in run[p]["worker_overrun_share"]) for p in ("even", "data", "even_again")
    )
    load = run["host_load"]
    fastest = max(range(len(run["simulated_speeds"])), key=lambda r: run["simulated_speeds"][r])
    calibrated = run["calibration"][fastest]["own_us_per_sample"]
    running = " / ".join(
        f"{run[p]['worker_cpu_us_per_sample'][fastest] / calibrated - 1:+.0%}"
        for p in ("even", "data", "even_again")
    )
    lines = [
        f"- {run['mode']}{' (quick)' if run['quick'] else ''}, {run['finished']}, on "
        f"{machine_label(run['machine'])}: base device {base:.0f} µs per sample (solo calibrations {own}); "
        f"time beyond the simulated compute (overrun, per worker, even / data / even again) {overrun}; "
        f"the fastest worker's CPU time per sample running against its solo calibration {running}; "
        f"host drift between the two even phases {run['host_drift']:+.1%}; host load (1 min) "
        f"{load['before'][0]:.1f} before, {load['after'][0]:.1f} after; {len(run['rounds'])} rebalancing "
        f"rounds ({run['settled']}); "
        + (f"workers on cores {cores}." if (cores := run["config"]["worker_cores"]) else "workers unpinned.")
    ]
    lines += [f"  - {problem}" for problem in run["problems"]]
    return lines


def real_row(run: dict[str, Any]) -> str:
    workers = ", ".join(w["label"] for w in run["workers"])
    cells = [
        machine_label(run["machine"]),
        workers,
        f"{run['config']['global_batch']} × {run['config']['length']}",
        " / ".join(f"{v:.0f}" for v in run["solo_samples_per_s"]),
        f"{run['even']['samples_per_s']:.0f} / {run['even_again']['samples_per_s']:.0f}",
        f"{run['balanced']['samples_per_s']:.0f}",
        " / ".join(str(b) for b in run["balanced"]["local_batches"]),
        f"{run['speedup_vs_even']:.2f}",
        f"{run['ideal_speedup']:.2f}",
        f"{run['efficiency']:.3f}",
        f"{run['of_fastest_alone']:.3f}" if "of_fastest_alone" in run else "-",
        f"{run['sync_share']:.1%}" if "sync_share" in run else "-",
        " / ".join(f"{ms:.1f}" for ms in run["sync_alone_ms"]) if "sync_alone_ms" in run else "-",
        real_verdict(run),
        f"[json]({run['artifact'].removeprefix('bench/')})",
    ]
    return "| " + " | ".join(cells) + " |"


def real_verdict(run: dict[str, Any]) -> str:
    """The run's own verdict, unless its even phases drifted apart (runs from before that was judged
    at run time are judged here by the same rule)."""
    if abs(run["host_drift"]) > DRIFT_LIMIT and not str(run["verdict"]).startswith("**invalid"):
        return f"**invalid: the host drifted {run['host_drift']:+.1%}**"
    return str(run["verdict"])


REAL_HEAD = (
    "| Machine | Workers | Batch × length | Solo samples/s | Even samples/s (A / A again) "
    "| Balanced samples/s | Balanced split | Speed-up | Ideal speed-up | Efficiency (÷ Σ solo) "
    "| ÷ fastest alone | Sync share | All-reduce alone (ms) | Verdict | Artifact |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def simulated_section(runs: list[dict[str, Any]]) -> list[str]:
    if not runs:
        return ["No committed run yet: `python bench/runtime_balance.py` writes one."]
    config = runs[-1]["config"]
    lines = [
        f"`python bench/runtime_balance.py [--quick] [--base-speed F]` trains a 1-D conv net (3 × Conv1d, "
        f"32 channels, length {config['length']}) on 3 loopback gloo workers, global batch "
        f"{config['global_batch']}, each local batch computed in chunks of {config['micro_batch']} samples, "
        "with the same synchronous step (the weighted all-reduce of uneven gradients) on both sides.",
        "",
        "- **Simulated speed.** At start each worker, alone in turn, times its compute per sample; all take "
        "the slowest of those figures as the base device. A worker of speed s then stretches each chunk, "
        "by sleeping, to (samples so far × base cost) ÷ s: the work sets the time, not the CPU time the "
        "host charged (time a busy host takes beyond that shows as overrun).",
        "- **Slack.** The fastest worker runs at the base device's speed: it has no time to give back, so "
        "if its core computes slower while the job runs than it did calibrating alone, its speed is not "
        "held. Each run's notes give that fastest worker's CPU time per sample running against its "
        "calibration. `--base-speed` below 1 gives every worker slack at the same ratios; such a run is "
        "labelled dilated and does not count for the undilated target.",
        f"- **Phases.** Solo (each worker alone, {config['solo_steps']} steps of the even share: its solo "
        f"speed), even split A ({config['steps']} steps), rebalancing rounds of {config['round_steps']} "
        "steps decided by the operator's own functions (`hetero_operator.rebalance.decide`, "
        f"minImprovement {config['min_improvement']}), the settled split B ({config['steps']} steps), "
        "and the even split A again, so drift of the host between A and B shows.",
        "- **Achieved speeds** are each worker's samples per second of compute in a phase; their ratios "
        f"must be within {RATIO_TOLERANCE:.0%} of the claimed ones in every phase, or the run fails "
        "(exit 3) and is shown here as invalid, with no speed-up or efficiency claimed. The **ideal "
        "speed-up** is what the achieved speeds allow: Σ v (balanced) ÷ (n · min v) (even); a speed-up "
        "above it is a broken measurement. **Efficiency** is the balanced samples/s ÷ the sum of the "
        "workers' solo samples/s.",
        f"- **Targets**: efficiency ≥ {EFFICIENCY_TARGET}, speed-up ≥ {SPEEDUP_OF_IDEAL_TARGET} × the "
        "ideal, undilated.",
        "- **Baselines** (runs since they were added): besides the even split, the same job on the split "
        "the GPUClass priors give (what the operator starts a job on with nothing measured; the "
        "priors 1 : 0.5 : 0.25 are the spec sheet's, the slow GPU truly runs this model at 0.15) and "
        "the fastest worker alone with the whole global batch (no gradient exchange), both measured in "
        "the same run. The ideal over a baseline is Σ v (balanced) × its slowest worker's time per "
        f"sample ÷ its batch; target: the measured split reaches ≥ {OF_IDEAL_TARGET:.0%} of it over "
        f"each. The two even phases must agree within {DRIFT_LIMIT:.0%}, or the host drifted and the "
        "run is invalid (exit 4).",
        "",
        SIMULATED_HEAD,
        *[simulated_row(run) for run in runs],
        "",
    ]
    baselines = [row for run in runs for row in baseline_rows(run)]
    if baselines:
        lines += [BASELINES_HEAD, *baselines, ""]
    for run in runs:
        lines += simulated_notes(run)
    return lines


def real_section(runs: list[dict[str, Any]]) -> list[str]:
    lines = [
        "`python bench/runtime_real_hetero.py` runs the `data` strategy with no simulation on devices that "
        "really differ: a GPU worker beside CPU workers of different thread counts on a GPU machine, or "
        "CPU workers of different thread counts (on disjoint cores) on a CPU machine with 4 or more "
        "cores. The balanced split starts proportional to each worker's speed alone on a few samples; "
        "the operator's own rebalancer (`hetero_operator.rebalance`) then decides rounds from the "
        "speeds the workers show running together, as between epochs, until it settles; then solo "
        "speeds at that split, even split, balanced split, even "
        "split again. A GPU worker's dataset is pinned once and each batch is copied one step ahead, "
        "beside the compute. Target on a GPU machine: efficiency ≥ 0.90 against the solo speeds.",
        "",
        "**Batch × length** is the global batch and the samples' length (compute per sample at the same "
        "gradient size). **Sync share** is the part of the balanced step outside the slowest worker's "
        "compute: the all-reduce (staged through host memory for the GPU worker under gloo) and the "
        "step's launch, which no split removes; a small model on a fast GPU is bound by it. "
        "**All-reduce alone** is that all-reduce timed on each worker with no compute before it. "
        "**÷ fastest alone** is the balanced samples/s over the fastest worker's alone: the simplest "
        "thing a user could do instead is train on that device alone, and below 1 the slower workers "
        "cost more in synchronisation than they add.",
        "",
    ]
    if not runs:
        return [*lines, "No committed run yet."]
    lines += [REAL_HEAD, *[real_row(run) for run in runs], ""]
    for run in runs:
        lines += [f"- {run['artifact']}: {note}" for note in run["notes"]]
    return lines


WITHDRAWN = (
    "The figures this section showed before this change are withdrawn (git history keeps them): some "
    "claimed speed-ups above the ideal that speeds 1 : 0.5 : 0.25 allow. Their simulator stretched each "
    "step to its own CPU time ÷ speed, so any extra CPU time (cold caches after a sleep, another process) "
    "was multiplied by the slowdown (4 for the slowest worker, 16 in the dilated mode); the speeds the "
    "workers really had were never checked, and efficiency was divided by speeds measured in the same "
    "contended phase, not alone."
)


def render(simulated: list[dict[str, Any]], real: list[dict[str, Any]]) -> str:
    lines = [
        HEADING,
        "",
        "Generated by `python bench/runtime_report.py` from the artifacts in `bench/results/`.",
        "",
        "### Simulated speeds",
        "",
        *simulated_section(simulated),
        "",
        "### Real heterogeneous hardware",
        "",
        *real_section(real),
        "",
        "### Withdrawn figures",
        "",
        WITHDRAWN,
    ]
    return "\n".join(lines) + "\n"


def write_section() -> str:
    text = render(*load_artifacts())
    replace_section(text)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print the section instead of writing it")
    args = parser.parse_args()
    if args.print:
        print(render(*load_artifacts()), end="")
    else:
        write_section()


if __name__ == "__main__":
    main()
