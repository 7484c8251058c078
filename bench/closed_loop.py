"""The closed loop (`make demo`) as a benchmark: its report kept as an artifact, its table generated.

`make demo` runs the digits example on three local process nodes (GPUClass priors 1, 0.5 and 0.25;
true speeds set on the nodes) under the operator with Prometheus-driven rebalancing, after three
baselines of the same job with rebalancing off on the same nodes (even split, priors' split, fastest
GPU alone). This runs the same demo, keeps its report as
`bench/results/closed_loop.json` and writes BENCHMARKS.md's section from it. A second run (with its
own control) slows the fast node 2x once the split has settled and measures how soon the job is back
within 90% of the ideal for the new speeds.

    python bench/closed_loop.py --write    # run the demo, write the artifact and the section
    python bench/closed_loop.py --render   # the section from the committed artifact
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console

from benchmarks_md import publish, replace_section
from hetero_operator.demo.run import DemoSettings, demo_job, measured_speeds, run_demo
from hetero_operator.demo.slowdown import Slowdown, recovery, slowed_rank
from hetero_operator.rebalance.settings import RebalancerTuning
from hetero_operator.testbed.cluster import Testbed
from hetero_operator.testbed.nodes import load_node_list
from hetero_operator.testbed.versions import cache_root

REPO = Path(__file__).resolve().parents[1]
ARTIFACT = REPO / "bench" / "results" / "closed_loop.json"
DEMO_NODES = REPO / "examples" / "demo" / "nodes.yaml"
SECTION = "## Closed loop (make demo)"
# The target: with rebalancing, steady-state samples/s over the control's is at least this
# share of the ideal speed-up the measured speeds allow.
TARGET_OF_IDEAL = 0.9
# The issue's target on the demo: the measured split at least this much faster than the priors' split.
PRIOR_TARGET = 1.2
# After a mid-job slowdown of one worker: back within TARGET_OF_IDEAL of the new ideal in this many epochs.
TARGET_EPOCHS_BACK = 2
# What the rebalancer waits for to confirm a change of speed, as this commit's rebalancer does it.
CONFIRMING_STEPS = f"half an epoch, and at least {RebalancerTuning().min_confirming_steps} steps"
SLOWED_NODE = "local-fast"
SLOWDOWN_FACTOR = 2.0
SLOWDOWN_EPOCHS = 16
# Each run calibrates its simulated base device when its workers start, on a machine whose load at
# that moment varies: the control and the job can pace to bases far apart. The comparison brings the
# control to the job's base by the ratio of their measured compute speeds, which also scales the
# per-step costs that do not depend on the base: beyond this much apart it is not trusted, and the
# pair is run again (the discarded attempts stay in the artifact).
BASE_TOLERANCE = 0.1
ATTEMPTS = 3


def machine() -> str:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores, {memory:.0f} GiB"


def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    return done.stdout.strip()


def _trimmed(report: dict[str, Any]) -> dict[str, Any]:
    report.pop("status", None)  # the job's whole status: large, and its figures are in the rows
    report.pop("prometheus", None)  # a loopback address of a test bed that is gone
    return report


def comparable(report: dict[str, Any]) -> bool:
    ratio = (report.get("control") or {}).get("base_ratio")
    return ratio is not None and abs(ratio - 1) <= BASE_TOLERANCE


def discarded(report: dict[str, Any]) -> dict[str, Any]:
    control = report.get("control") or {}
    return {"base_ratio": control.get("base_ratio"), "of_ideal": control.get("of_ideal")}


def slowdown_attempt() -> dict[str, Any]:
    """The demo job with the fast node slowed once its split settled, after its own control run."""
    job = copy.deepcopy(demo_job())
    job["metadata"]["name"] = "slowdown"
    job["spec"]["epochs"] = SLOWDOWN_EPOCHS
    bed = Testbed(cache_root() / "clusters" / "demo")
    slowdown = Slowdown(bed, "slowdown", SLOWED_NODE, factor=SLOWDOWN_FACTOR, restore=False)
    try:
        with tempfile.TemporaryDirectory(prefix="closed-loop-slowdown-") as out:
            report = run_demo(DemoSettings(output=Path(out)), Console(stderr=True), bed, job, slowdown)
        seen = slowdown.seen()
        version = (seen.get("slowed") or {}).get("toVersion")
        at = slowdown.under_answer()
        split = slowdown.plans.get(version, []) if version is not None else []
        after = measured_speeds(bed.prometheus_url, "slowdown", split, [at], version) if split and at else []
        seen.update(speeds_after=after, measured_at=at, split_after=split)
    finally:
        slowdown.clear()
        bed.down()
    rank = slowed_rank(report.get("status") or {}, SLOWED_NODE)
    found = recovery(report, seen, rank, TARGET_OF_IDEAL, after) if rank is not None else {}
    return {"seen": seen, "recovery": found, "report": _trimmed(report)}


def slowdown_run() -> dict[str, Any]:
    tries = []
    for _ in range(ATTEMPTS):
        tries.append(slowdown_attempt())
        if comparable(tries[-1]["report"]):
            break
    return {**tries[-1], "discarded": [discarded(t["report"]) for t in tries[:-1]]}


def run() -> dict[str, Any]:
    reports = []
    for _ in range(ATTEMPTS):
        with tempfile.TemporaryDirectory(prefix="closed-loop-") as out:
            reports.append(_trimmed(run_demo(DemoSettings(output=Path(out)), Console(stderr=True))))
        if comparable(reports[-1]):
            break
    return {
        "machine": machine(),
        "commit": commit(),
        "node_speeds": {n.name: n.speed for n in load_node_list(DEMO_NODES).nodes if n.speed is not None},
        "target_of_ideal": TARGET_OF_IDEAL,
        "target_epochs_back": TARGET_EPOCHS_BACK,
        "confirming_steps": CONFIRMING_STEPS,
        "base_tolerance": BASE_TOLERANCE,
        "report": reports[-1],
        "discarded": [discarded(r) for r in reports[:-1]],
        "slowdown": slowdown_run(),
    }


def _scatter_line(found: dict[str, Any], back: int | None, report: dict[str, Any]) -> list[str]:
    """The steady share after the recovery, and how much single epochs scatter (their wall times)."""
    steady = [e for e in found["epochs"] if back is not None and e["epoch"] >= back]
    if len(steady) < 2:
        return []
    seconds = [e["seconds"] for e in steady]
    scatter = (max(seconds) - min(seconds)) / 2 / statistics.median(seconds)
    median = statistics.median(e["of_new_ideal"] for e in steady)
    line = f"- From then on: median {median:.2f} of the new ideal; single epochs scatter by ±{scatter:.1%} "
    if median <= 1 + scatter:
        return [
            line
            + "(their wall times), so an epoch a little above 1 is within that scatter, not above the ideal."
        ]
    return [
        line + "(their wall times): above the ideal by more than that scatter.",
        *_overhead_gap(report, median),
    ]


def _overhead_gap(report: dict[str, Any], share: float) -> list[str]:
    """Why a share of the ideal over the control can pass 1: the ideal takes the control's steps to
    spend as long outside compute as the job's; the job's own even-split epochs show whether they did.
    `share`: the share of the ideal measured over the control."""
    control = report.get("control") or {}
    rows = report.get("per_epoch") or []
    first = min((int(r["plan_version"]) for r in rows), default=None)
    even = [float(r["samples_per_second"]) for r in rows if int(r["plan_version"]) == first]
    steady = control.get("steady_samples_per_second")
    if not even or not steady:
        return []
    return [
        f"- That is not a speed-up above the ideal: the ideal takes the control's steps to spend as long "
        f"outside compute as the job's, and they spent longer. At the same compute speeds (after the base "
        f"correction), the control's even split ran {max(even) / steady - 1:.1%} slower than the job's own "
        f"even-split epochs ({steady:.0f} against {max(even):.0f} samples/s). Measured against the job's "
        f"own best even-split epoch instead, the share is {share * steady / max(even):.2f} of the ideal."
    ]


def _discarded_line(runs: list[dict[str, Any]], tolerance: float) -> list[str]:
    if not runs:
        return []
    ratios = ", ".join(f"{r['base_ratio']:.2f}" for r in runs if r.get("base_ratio") is not None)
    return [
        f"- {len(runs)} earlier attempt(s) discarded: the control and the job calibrated their simulated "
        f"base devices apart by more than {tolerance:.0%} (ratios {ratios}), which the base correction "
        "cannot bridge (it would scale per-step costs that do not depend on the base)."
    ]


def _batches(row: dict[str, Any]) -> str:
    return ", ".join(str(b) for b in row["local_batches"])


def _epoch_table(report: dict[str, Any]) -> list[str]:
    lines = ["| epoch | plan | local batches | samples/s | test accuracy |", "|---|---|---|---|---|"]
    for row in report["per_epoch"]:
        accuracy = row.get("accuracy")
        lines.append(
            f"| {row['epoch']} | v{row['plan_version']} | {_batches(row)} | "
            f"{row['samples_per_second']:.0f} | {'' if accuracy is None else f'{accuracy:.3f}'} |"
        )
    return lines


def _control_lines(
    control: dict[str, Any], target: float, report: dict[str, Any], truths: dict[str, float] | None = None
) -> list[str]:
    speeds = control.get("measured_speeds") or []
    slowest = min(speeds) if speeds else 0.0
    ratios = " : ".join(f"{v / slowest:.2f}" for v in speeds) if slowest else "n/a"
    raw, steady = control["raw_steady_samples_per_second"], control["steady_samples_per_second"]
    if control.get("base_ratio") is None:
        measured, own = control.get("measured_speeds") or [], control.get("own_speeds") or []
        return [
            f"- Control run: {raw:.0f} samples/s in its steady epochs, but not comparable with this run: "
            f"speeds were measured for {len(measured)} ranks under the control and {len(own)} under the "
            "job's even split (every rank is needed to bring both to one simulated base)."
        ]
    lines = [
        f"- Control run (the same job, rebalancing off, even split): {raw:.0f} samples/s in its steady "
        "epochs, brought to this run's simulated base by the median rank's ratio of measured speeds "
        f"({control['base_ratio']:.3f}): {steady:.0f} samples/s.",
        f"- Speeds measured under the control's even split (samples/s of compute per rank): "
        f"{', '.join(f'{v:.0f}' for v in speeds)}, i.e. {ratios} "
        f"({f'set on the nodes: {_ratios(truths)}' if truths else 'nominal 4 : 2 : 1'}).",
    ]
    ideal, speedup, of_ideal = control.get("ideal_speedup"), control.get("speedup"), control.get("of_ideal")
    if ideal and speedup and of_ideal:
        # Above the ideal is no speed-up but a broken comparison (the next lines say why): never met.
        verdict = "not judged: above the ideal" if of_ideal > 1 else "met" if of_ideal >= target else "missed"
        lines.append(
            f"- Steady state with rebalancing over the control: **{speedup:.2f}x**, against the ideal "
            f"{ideal:.2f}x those speeds allow (every worker busy the whole step): **{of_ideal:.0%} of the "
            f"ideal** (target {target:.0%}: {verdict})."
        )
    per_epoch = [x for x in control.get("of_ideal_per_epoch") or [] if x is not None]
    if per_epoch:
        lines.append(f"- Share of the ideal per epoch: {', '.join(f'{x:.2f}' for x in per_epoch)}.")
    if of_ideal and of_ideal > 1 and not report.get("baselines"):  # the job's first plan was the even split
        lines += _overhead_gap(report, of_ideal)
    return lines


def render(artifact: dict[str, Any]) -> str:
    report = artifact["report"]
    truths = artifact.get("node_speeds")
    nodes = (
        "three local process nodes of GPU classes whose priors (relativeSpeed) are 1, 0.5 and 0.25, each "
        f"running the model at a true speed set on the node independently of them ({_ratios(truths)}; CPU "
        "processes paced to those speeds), the operator with Prometheus-driven rebalancing and the "
        "product's defaults (the first split by the priors), and the digits example (global batch 1024). "
        "First three baselines, each the same job with `rebalance.enabled: false` on the same nodes: the "
        "even split, the priors' split, and the fastest GPU alone; then the job itself."
        if truths
        else "three local process nodes of classes with simulated relative speeds 1, 0.5 and 0.25 (CPU "
        "processes paced to those speeds), the operator with Prometheus-driven rebalancing, and the digits "
        "example (global batch 1024). First a control run of the same job with `rebalance.enabled: false` "
        "on the same nodes, then the job itself."
    )
    lines = [
        SECTION,
        "",
        f"`python bench/closed_loop.py --write` runs `make demo`'s closed loop: {nodes} Samples/s are "
        "measured by rank 0 per epoch. The section is generated from `bench/results/closed_loop.json`.",
        "",
        f"Run on {artifact['machine']} at commit {artifact['commit']}; phase {report.get('phase')}, "
        f"{len(report.get('rebalances') or [])} rebalances recorded.",
        "",
        *_epoch_table(report),
        "",
    ]
    control = report.get("control")
    if control:
        lines += _control_lines(control, artifact["target_of_ideal"], report, truths)
        lines += _discarded_line(
            artifact.get("discarded") or [], artifact.get("base_tolerance", BASE_TOLERANCE)
        )
    else:
        lines.append("- No control run in this artifact.")
    lines += _baseline_lines(report.get("baselines") or {}, artifact["target_of_ideal"])
    if speedup := report.get("speedup_vs_first_plan"):
        lines.append(
            f"- Steady state over the job's own best first-plan (priors' split) epoch: {speedup:.2f}x."
        )
    elif speedup := report.get("speedup_vs_even_epoch"):
        lines.append(f"- Steady state over the job's own best even-split epoch: {speedup:.2f}x.")
    if artifact.get("slowdown"):
        lines += ["", *_slowdown_lines(artifact["slowdown"], artifact["target_of_ideal"], artifact)]
    return "\n".join(lines) + "\n"


BASELINE_NAMES = {
    "even": "the even split",
    "prior": "the priors' split",
    "fastest_alone": "the fastest GPU alone",
}


def _baseline_lines(baselines: dict[str, Any], target: float) -> list[str]:
    """Each baseline's comparison: speed-up, the ideal the job's measured speeds allow over it, the
    share of it, and the verdicts (a share above 1 is a broken comparison, never met)."""
    lines = []
    for kind, compared in baselines.items():
        speedup, ideal, of_ideal = (
            compared.get("speedup"),
            compared.get("ideal_speedup"),
            compared.get("of_ideal"),
        )
        name = BASELINE_NAMES.get(kind, kind)
        if not (speedup and ideal and of_ideal):
            lines.append(f"- Against {name}: not comparable in this run (see the artifact).")
            continue
        verdict = "not judged: above the ideal" if of_ideal > 1 else "met" if of_ideal >= target else "missed"
        line = (
            f"- Against {name} (rebalancing off, base ratio {compared['base_ratio']:.3f}): "
            f"**{speedup:.2f}x**, against the ideal {ideal:.2f}x the job's measured speeds allow: "
            f"**{of_ideal:.0%} of the ideal** (target {target:.0%}: {verdict})"
        )
        if kind == "prior":
            line += (
                f"; the 1.2x target over the priors' split: {'met' if speedup >= PRIOR_TARGET else 'missed'}"
            )
        lines.append(line + ".")
    return lines


def _ratios(speeds: dict[str, float] | list[float] | None) -> str:
    values = list(speeds.values()) if isinstance(speeds, dict) else list(speeds or [])
    return " : ".join(f"{v:g}" for v in values)


def _slowdown_lines(run: dict[str, Any], target: float, artifact: dict[str, Any]) -> list[str]:
    seen, found = run["seen"], run.get("recovery") or {}
    lines = [
        "### A worker slowed mid-job",
        "",
        f"A second run of the job ({run['report'].get('epochs')} epochs, phase {run['report'].get('phase')}, "
        f"with its own control run): once its split had settled, node {seen['node']} (rank "
        f"{found.get('slowed_rank', '?')}) was slowed {seen['factor']:g}x (the test bed's slowdown "
        f"annotation) while rank 0 ran epoch {seen['slowed_in']}.",
        "",
    ]
    lines += _discarded_line(run.get("discarded") or [], artifact.get("base_tolerance", BASE_TOLERANCE))
    if not found:
        return [*lines, "- No recovery could be measured in this run (see the artifact)."]
    back, epochs_back = found.get("back_at_epoch"), found.get("epochs_to_back")
    goal = artifact.get("target_epochs_back", TARGET_EPOCHS_BACK)
    verdict = "met" if epochs_back is not None and epochs_back <= goal else "missed"
    lines += [
        "| epoch | seconds | share of the new ideal |",
        "|---|---|---|",
        *(f"| {e['epoch']} | {e['seconds']:.1f} | {e['of_new_ideal']:.2f} |" for e in found["epochs"]),
        "",
        f"- The ideal for the new speeds: the control's measured speeds with rank {found['slowed_rank']}'s "
        f"divided by the slowdown measured in the job ({found['measured_factor']:.2f}x, against the other "
        f"ranks; {seen['factor']:g}x asked): {found['new_ideal_speedup']:.2f}x the control's even split.",
        f"- The new split ran from epoch {found.get('new_split_from_epoch')}; back within {target:.0%} of "
        f"the new ideal at epoch {back}: **{epochs_back} epochs** after the one the slowdown began in "
        f"(target {goal}: {verdict}).",
        *_scatter_line(found, back, run["report"]),
        f"- Of those, the metrics' delay: a scrape interval and a rebalancer pass for each of the "
        f"rebalancer's two looks, about {found.get('metrics_delay_epochs')} of this run's short epochs; the "
        "rebalancer itself answers at the boundary after its confirming steps "
        f"({artifact.get('confirming_steps', 'half an epoch')}).",
    ]
    return lines


README = REPO / "README.md"
README_BLOCK = (
    "<!-- demo output: generated by bench/closed_loop.py from bench/results/closed_loop.json -->",
    "<!-- /demo output -->",
)


def readme_block(artifact: dict[str, Any]) -> str:
    """What `make demo` printed in the committed run, as README.md shows it: the first epoch, the
    first epoch of the second plan, and the summary line."""
    report = artifact["report"]
    rows = report.get("per_epoch") or []
    shown = rows[:1] + [r for r in rows if r["plan_version"] != rows[0]["plan_version"]][:1] if rows else []
    lines = [README_BLOCK[0], "```", "epoch  plan  local batches     samples/s"]
    lines += [
        f"{r['epoch']:<6} v{r['plan_version']:<4} {r['local_batches']!s:<17} {r['samples_per_second']:.0f}"
        for r in shown
    ]
    first_plan = report.get("speedup_vs_first_plan")
    speedup, accuracy = first_plan or report.get("speedup_vs_even_epoch"), report.get("final_accuracy")
    lines += ["..."] if len(rows) > len(shown) else []
    for kind, compared in (report.get("baselines") or {}).items():
        if compared.get("speedup") and compared.get("of_ideal"):
            name, ideal = kind.replace("_", " "), compared["ideal_speedup"]
            share = (
                f"above the {ideal:.2f}x the measured speeds allow: not a sound comparison"
                if compared["of_ideal"] > 1
                else f"{compared['of_ideal']:.0%} of the {ideal:.2f}x the measured speeds allow"
            )
            lines.append(f"against {name} (rebalancing off, same nodes): {compared['speedup']:.2f}x, {share}")
    if speedup and accuracy:
        over = "the job's first-plan epochs" if first_plan else "the even-split epoch"
        phase = report.get("phase")
        lines.append(f"phase {phase}; speed-up over {over}: {speedup:.2f}x; final accuracy {accuracy:.3f}")
    lines += ["```", f"(the run at commit {artifact['commit']}, on {artifact['machine']})", README_BLOCK[1]]
    return "\n".join(lines)


def replace_readme_block(block: str, path: Path = README) -> None:
    text = path.read_text()
    start, end = text.index(README_BLOCK[0]), text.index(README_BLOCK[1]) + len(README_BLOCK[1])
    path.write_text(text[:start] + block + text[end:])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--write", action="store_true", help="write the artifact and BENCHMARKS.md's section")
    parser.add_argument("--render", action="store_true", help="only render the committed artifact")
    args = parser.parse_args()
    if args.render:
        committed = json.loads(ARTIFACT.read_text())
        replace_section(render(committed))
        replace_readme_block(readme_block(committed))
        return
    artifact = run()
    publish(artifact, render(artifact), ARTIFACT, args.write)
    if args.write:
        replace_readme_block(readme_block(artifact))


if __name__ == "__main__":
    main()
