"""The cost of keeping your own loop: heterotrain's HeteroModel and HeteroDataLoader against plain
DistributedDataParallel with a DistributedSampler, on an even split, same script, same run, same
ranks, one step of each in turn. Overhead = the median over rounds of (wrapped median step ÷ plain
median step of that round) − 1, target ≤ 3%: interleaving the steps keeps a busy host's drift out of
the ratio. The host's load average is recorded beside it.

    python bench/byos_overhead.py [--workers 2] [--width 1024] [--global-batch 256] [--rounds 20]
                                  [--steps 10] [--out FILE]
    python bench/byos_overhead.py --report-only   # BENCHMARKS.md's section from the artifact

The run keeps its artifact and writes its section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from bench_workers import run_workers
from benchmarks_md import publish
from runtime_fidelity import machine, machine_label

RESULTS = Path(__file__).resolve().parent / "results"
OVERHEAD_TARGET = 0.03


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--global-batch", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=RESULTS / "byos_overhead.json")
    parser.add_argument("--report-only", action="store_true", help="regenerate the section from --out")
    args = parser.parse_args()
    if args.report_only:
        artifact = json.loads(args.out.read_text())
        publish(artifact, section(artifact, args.out), args.out, write=True)
        return
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "rank0.json"
        env = {
            "MASTER_ADDR": "127.0.0.1",
            "HETEROTRAIN_DEVICE": "cpu",
            "OMP_NUM_THREADS": "1",
            "BENCH_ROUNDS": str(args.rounds),
            "BENCH_STEPS": str(args.steps),
            "BENCH_GLOBAL_BATCH": str(args.global_batch),
            "BENCH_WIDTH": str(args.width),
            "BENCH_OUT": str(out),
        }
        script = Path(__file__).resolve().parent / "byos_overhead_worker.py"
        measured = run_workers(script, [env] * args.workers, out, timeout=900)
    overhead = measured["round_ratio_median"] - 1
    result: dict[str, Any] = {
        "benchmark": "byos_overhead",
        "workers": args.workers,
        "width": args.width,
        "global_batch": args.global_batch,
        "rounds": args.rounds,
        **measured,
        "overhead": overhead,
        "target": OVERHEAD_TARGET,
        "met": overhead <= OVERHEAD_TARGET,
        "machine": machine(),
        "load_average_1min_after": os.getloadavg()[0],
    }
    publish(result, section(result, args.out), args.out, write=True)


def section(result: dict[str, Any], artifact: Path) -> str:
    """BENCHMARKS.md's section for one run, from its artifact alone."""
    ratios = result["round_ratios"]
    slower = sum(1 for r in ratios if r > 1)
    verdict = "target met" if result["met"] else "target missed"
    link = (
        artifact.relative_to(RESULTS.parent.parent)
        if artifact.is_relative_to(RESULTS.parent.parent)
        else artifact
    )
    return "\n".join(
        [
            "## Your own script: the wrapper's overhead",
            "",
            "`bench/byos_overhead.py`: the same training step under plain DistributedDataParallel with a",
            "DistributedSampler and under `HeteroModel` and `HeteroDataLoader` on an even split, one step of",
            "each in turn on the same ranks. Overhead: the median over rounds of the wrapped median step",
            "over the plain one, minus 1.",
            "",
            "| machine | ranks | model | global batch | plain DDP ms/step | wrapped ms/step | overhead | "
            "rounds slower wrapped | target | load (1 min) after | artifact |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
            f"| {machine_label(result['machine'])} | {result['workers']} | MLP {result['width']} wide, "
            f"{result['parameters']:,} parameters | {result['global_batch']} | "
            f"{result['plain_median_s'] * 1e3:.2f} | {result['wrapped_median_s'] * 1e3:.2f} | "
            f"**{result['overhead']:+.1%}** | {slower} of {len(ratios)} | "
            f"<= {result['target']:.0%}: {verdict} | "
            f"{result['load_average_1min_after']:.1f} | [json]({link}) |",
            "",
            f"Per-round ratios from {min(ratios):.3f} to {max(ratios):.3f}.",
        ]
    )


if __name__ == "__main__":
    main()
