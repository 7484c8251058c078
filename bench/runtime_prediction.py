"""Predicting the balanced run from the even run alone, for every committed runtime benchmark artifact.

For each `bench/results/runtime_balance-*.json` and `runtime_real_hetero-*.json`, the rebalancer's model
is learnt from the even-split phase only (`hetero_operator.simulator.balance_prediction`), OptPerf
chooses a split, and the prediction is compared with the balanced phase the same run measured
afterwards (`data` in runtime_balance, `balanced` in runtime_real_hetero). No run is repeated here: the
figures come from the artifacts. Writes bench/results/runtime_prediction.json; ``--write`` also
regenerates BENCHMARKS.md's "## Predicting the balanced run" section, ``--from-json FILE`` only that.
Exits 1 when a run's error at its own split is beyond the tolerance.

    python bench/runtime_prediction.py [--write] [--from-json bench/results/runtime_prediction.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks_md import publish, replace_section
from hetero_operator.simulator.balance_prediction import MeasuredPhase, predict_balanced
from hetero_operator.simulator.validation import TOLERANCE
from runtime_fidelity import machine_label

RESULTS = Path(__file__).resolve().parent / "results"
ARTIFACT = RESULTS / "runtime_prediction.json"
SOURCES = ("runtime_balance-*.json", "runtime_real_hetero-*.json")
BALANCED_PHASE = {"runtime_balance": "data", "runtime_real_hetero": "balanced"}
HEADING = "## Predicting the balanced run"

# Beyond this share of the global batch, the planner's split is not the one that ran: its promise is untested.
UNTESTED_SPLIT_DIFFERENCE = 0.02

# What an even phase would have to record for the full model, and does not (see the module's docstring).
MISSING = [
    "a second local batch size per worker in the even stage (e.g. a few steps at ±25% of the even "
    "share, same global batch): without it the fixed per-step compute cost cannot be told from the "
    "per-sample cost, and the model takes each worker's compute as a line through the origin",
    "per-worker sync-start times (`sync_start_ms`, measured by the benchmark workers but not written "
    "to the artifact): compute end is taken as the moment the gradients are ready",
    "the last gradient bucket's all-reduce alone (t_u): taken as 0, the whole all-reduce counted after "
    "compute ends",
    "per-step times, not only their means: no spread, so no error bar on the prediction",
]


def run_label(source: dict[str, Any]) -> str:
    if source["benchmark"] == "runtime_balance":
        return f"runtime_balance {source['mode']}"
    return f"runtime_real_hetero {source['config']['global_batch']} × {source['config']['length']}"


def source_verdict(source: dict[str, Any]) -> str:
    if source["benchmark"] == "runtime_balance":
        return "valid" if source.get("valid") else "simulated speeds not held"
    return str(source.get("verdict", "-"))


def predict_run(path: Path) -> dict[str, Any]:
    source = json.loads(path.read_text())
    balanced_key = BALANCED_PHASE[source["benchmark"]]
    even = MeasuredPhase.from_artifact(source["even"])
    balanced = MeasuredPhase.from_artifact(source[balanced_key])
    prediction = predict_balanced(even, balanced)
    return {
        "artifact": path.relative_to(RESULTS.parent.parent).as_posix(),
        "run": run_label(source),
        "machine": machine_label(source["machine"]),
        "source_verdict": source_verdict(source),
        "workers": len(even.local_batches),
        "global_batch": even.global_batch,
        "even_split": list(even.local_batches),
        "even_samples_per_s": even.samples_per_s,
        "even_model_samples_per_s": prediction.even_model_samples_per_s,
        "even_error": prediction.even_error,
        "balanced_phase": balanced_key,
        "run_split": list(balanced.local_batches),
        "measured_samples_per_s": balanced.samples_per_s,
        "predicted_split": list(prediction.predicted_split),
        "split_difference": prediction.split_difference,
        "predicted_at_run_split_samples_per_s": prediction.predicted_at_run_split_samples_per_s,
        "error_at_run_split": prediction.error_at_run_split,
        "predicted_samples_per_s": prediction.predicted_samples_per_s,
        "error": prediction.error,
        "within_tolerance": abs(prediction.error_at_run_split) <= TOLERANCE,
        "speed_per_sample_balanced_over_even": speed_change(source["even"], source[balanced_key]),
    }


def speed_change(even: dict[str, Any], balanced: dict[str, Any]) -> list[float]:
    """Per worker, its samples per second of compute in the balanced phase over the even phase's: 1
    where a line through the origin (the model's, from the even phase alone) holds."""

    def speeds(phase: dict[str, Any]) -> list[float]:
        return [b / ms for b, ms in zip(phase["local_batches"], phase["worker_compute_ms"], strict=True)]

    return [after / before for after, before in zip(speeds(balanced), speeds(even), strict=True)]


def build_document() -> dict[str, Any]:
    paths = sorted(path for pattern in SOURCES for path in RESULTS.glob(pattern))
    runs = [predict_run(path) for path in paths]
    errors = [abs(run["error_at_run_split"]) for run in runs]
    return {
        "benchmark": "runtime_prediction",
        "tolerance": TOLERANCE,
        "model": "rebalance.decide.speed_model from the even phase (one sample per worker), "
        "planner.optimal_split, planner.predict_iteration_time",
        "missing_from_the_even_phase": MISSING,
        "summary": {
            "runs": len(runs),
            "within_tolerance": sum(run["within_tolerance"] for run in runs),
            "median_abs_error_at_run_split": statistics.median(errors) if errors else None,
            "max_abs_error_at_run_split": max(errors) if errors else None,
        },
        "runs": runs,
    }


def split(values: list[int]) -> str:
    return " / ".join(str(v) for v in values)


def report(document: dict[str, Any]) -> str:
    summary = document["summary"]
    lines = [
        HEADING,
        "",
        "Generated by `python bench/runtime_prediction.py --write` from "
        "`bench/results/runtime_prediction.json`, which it computes from the artifacts of the Runtime "
        "section (no run is repeated). A check that can fail: "
        "the rebalancer's model is learnt from a run's **even-split phase alone** (each worker's compute "
        "time per sample, the all-reduce time of the worker that waited least: "
        "`rebalance.decide.speed_model` over `planner.fitting.fit_communication`), OptPerf "
        "(`planner.optimal_split`) chooses the split, and the prediction is compared with the balanced "
        "phase the same run measured afterwards.",
        "",
        "- **Error at the run's split**: the model's samples/s at the split the balanced phase really "
        "used, over the measured samples/s, minus 1: the model's extrapolation from the even split, the "
        f"check (tolerance ±{document['tolerance']:.0%}).",
        "- **Planner's split**: the split OptPerf chooses from the even phase, its largest difference from "
        "the run's split (share of the global batch), and the samples/s the planner promises for it against "
        "the balanced run's measured samples/s; where the splits differ that split never ran, so this is "
        "what was promised, not a measured error.",
        "- **Even phase self-error**: the model against the phase it was learnt from (time outside compute "
        "and all-reduce that the planner does not model).",
        "",
        "| Run | Machine | Source verdict | Even split | Even samples/s (measured / model) "
        "| Balanced split run | Measured samples/s | Predicted at the run's split "
        "| Error at the run's split | Planner's split "
        f"| Split difference | Promised samples/s (vs measured) | Within ±{document['tolerance']:.0%} |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in document["runs"]:
        lines.append(
            f"| [{run['run']}]({run['artifact']}) | {run['machine']} "
            f"| {run['source_verdict']} | {split(run['even_split'])} "
            f"| {run['even_samples_per_s']:.0f} / {run['even_model_samples_per_s']:.0f} "
            f"({run['even_error']:+.1%}) | {split(run['run_split'])} | {run['measured_samples_per_s']:.0f} "
            f"| {run['predicted_at_run_split_samples_per_s']:.0f} | **{run['error_at_run_split']:+.1%}** "
            f"| {split(run['predicted_split'])} | {run['split_difference']:.1%} "
            f"| {run['predicted_samples_per_s']:.0f} ({run['error']:+.1%}) "
            f"| {'yes' if run['within_tolerance'] else '**no**'} |"
        )
    median, worst = summary["median_abs_error_at_run_split"], summary["max_abs_error_at_run_split"]
    lines += [
        "",
        f"{summary['within_tolerance']} of {summary['runs']} runs within ±{document['tolerance']:.0%} at "
        f"the run's split; absolute error median {median:.1%}, worst {worst:.1%}. "
        "A source run marked invalid above (its simulated speeds did not hold) still tests the model: the "
        "model learns the speeds the workers really had in the even phase.",
        *untested_promises(document["runs"]),
        *missed(document["runs"]),
        "",
        "What the even phases do not record, so the model lacks it (what the benchmarks would have to "
        "write for the full model):",
        "",
        *[f"- {item}" for item in document["missing_from_the_even_phase"]],
    ]
    return "\n".join(lines) + "\n"


def missed(runs: list[dict[str, Any]]) -> list[str]:
    """A line on the runs beyond the tolerance: how far each worker's speed per sample moved between
    the even phase the model learnt from and the balanced phase it predicted."""
    beyond = [run for run in runs if not run["within_tolerance"]]
    if not beyond:
        return []
    names = "; ".join(
        f"{run['run']} on {run['machine']}: "
        + " / ".join(f"{x:.2f}" for x in run["speed_per_sample_balanced_over_even"])
        for run in beyond
    )
    return [
        "",
        "Runs beyond the tolerance, with each worker's compute speed per sample in the balanced phase "
        f"over the even phase's ({names}). The model, learnt from the even phase alone, takes that "
        "ratio as 1: a CPU worker moved from thousands of samples to a hundred is faster per sample "
        "(in cache), and a GPU slower on a smaller batch; the in-job rounds of the rebalancer measure "
        "the workers at the shares they will run.",
    ]


def untested_promises(runs: list[dict[str, Any]]) -> list[str]:
    """A line on the runs whose balanced phase used another split than the planner's."""
    untested = [run for run in runs if run["split_difference"] > UNTESTED_SPLIT_DIFFERENCE]
    if not untested:
        return []
    names = "; ".join(
        f"{run['run']} on {run['machine']}: {split(run['predicted_split'])} promised "
        f"{run['error']:+.1%} against the run's {split(run['run_split'])}"
        for run in untested
    )
    return [
        "",
        f"Where the run's split differs from the planner's by more than {UNTESTED_SPLIT_DIFFERENCE:.0%} "
        f"of the batch, the planner's promise is untested: a run at its split would test it ({names}; "
        "runtime_real_hetero runs the split its rebalancing rounds settled on, not the even-phase "
        "planner's).",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="keep the artifact and regenerate the section")
    parser.add_argument("--from-json", type=Path, help="only regenerate the section from this artifact")
    args = parser.parse_args()
    if args.from_json is not None:
        replace_section(report(json.loads(args.from_json.read_text())))
        return
    document = build_document()
    publish(document, report(document), ARTIFACT, args.write)
    if document["summary"]["within_tolerance"] < document["summary"]["runs"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
