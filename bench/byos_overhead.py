"""The cost of keeping your own loop: heterotrain's HeteroModel and HeteroDataLoader against plain
DistributedDataParallel with a DistributedSampler, on an even split, same script, same run, same
ranks, one step of each in turn. Overhead = the median over rounds of (wrapped median step ÷ plain
median step of that round) − 1, target ≤ 3%: interleaving the steps keeps a busy host's drift out of
the ratio. The host's load average is recorded beside it.

    python bench/byos_overhead.py [--workers 2] [--width 1024] [--global-batch 256] [--rounds 20]
                                  [--steps 10] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from bench_workers import run_workers
from runtime_fidelity import machine

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
    args = parser.parse_args()
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
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"plain DDP {measured['plain_median_s'] * 1e3:.2f} ms/step, wrapped "
        f"{measured['wrapped_median_s'] * 1e3:.2f} ms/step: overhead {overhead:+.1%} "
        f"(target <= {OVERHEAD_TARGET:.0%}) -> {args.out}"
    )


if __name__ == "__main__":
    main()
