"""Slow-link strategies against per-step synchronisation, on an emulated slow network.

The benchmark builds one network namespace per worker, joined by veth pairs to a bridge, and
shapes every veth (both directions) with a token-bucket filter to `--rate` (bandwidth only: this
kernel has no netem qdisc, so latency is not emulated). It then trains the digits example with
the same plan on 4 equal-speed workers under each strategy and reports the mean epoch wall time,
its ratio to the per-step all-reduce baseline (`data`), and the final test accuracy. Everything it
creates is removed at the end. Needs root (ip netns, tc).

    python bench/runtime_slow_link.py [--quick] [--rate 20mbit]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hetero_operator.plan import Strategy
from hetero_runtime.local import LocalJob, LocalJobSpec, initial_plan
from progress import steps

WORKERS = 4
SUBNET = "10.231.7"
BRIDGE = "htbench0"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def _tc_rate(device: str, rate: str, namespace: str | None = None) -> None:
    prefix = ["ip", "netns", "exec", namespace] if namespace else []
    subprocess.run(
        [
            *prefix,
            "tc",
            "qdisc",
            "add",
            "dev",
            device,
            "root",
            "tbf",
            "rate",
            rate,
            "burst",
            "32kb",
            "latency",
            "400ms",
        ],
        check=True,
        capture_output=True,
    )


@contextmanager
def slow_network(workers: int, rate: str) -> Iterator[list[str]]:
    """Namespaces ht-bench-0.. with addresses SUBNET.1.., every link shaped to `rate`; torn down after."""
    namespaces = [f"ht-bench-{i}" for i in range(workers)]
    try:
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("link", "set", BRIDGE, "up")
        for i, ns in enumerate(namespaces):
            outside, inside = f"htb{i}o", f"htb{i}i"
            _ip("netns", "add", ns)
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", ns)
            _ip("link", "set", outside, "master", BRIDGE)
            _ip("link", "set", outside, "up")
            _ip("-n", ns, "addr", "add", f"{SUBNET}.{i + 1}/24", "dev", inside)
            _ip("-n", ns, "link", "set", inside, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _tc_rate(outside, rate)
            _tc_rate(inside, rate, ns)
        yield namespaces
    finally:
        for i, ns in enumerate(namespaces):
            subprocess.run(["ip", "link", "del", f"htb{i}o"], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)


def run_strategy(strategy: Strategy, namespaces: list[str], epochs: int, work_dir: Path) -> dict[str, Any]:
    speeds = [1.0] * len(namespaces)
    spec = LocalJobSpec(
        target="digits",
        speeds=speeds,
        work_dir=work_dir,
        plan=initial_plan(strategy, speeds, 64),
        epochs=epochs,
        max_restarts=0,
        master_addr=f"{SUBNET}.1",
        # gloo would otherwise pick the interface the host name resolves to (loopback).
        launch_prefixes=[
            ["ip", "netns", "exec", ns, "env", f"GLOO_SOCKET_IFNAME=htb{i}i"]
            for i, ns in enumerate(namespaces)
        ],
    )
    job = LocalJob(spec)
    code = job.run(900)
    if code != 0:
        raise SystemExit(f"{strategy.value} failed; see {spec.work_dir / 'logs'}")
    rank0 = job.results()[0]
    walls = [epoch["wall_seconds"] for epoch in rank0["epochs"]]
    return {
        "epoch_seconds": sum(walls[1:]) / max(len(walls) - 1, 1),  # the first epoch includes warm-up
        "accuracy": rank0["final_evaluation"]["accuracy"],
        "comm_seconds_per_epoch": sum(e["comm_seconds"] for e in rank0["epochs"][1:])
        / max(len(walls) - 1, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 epochs per strategy instead of 6")
    parser.add_argument("--rate", default="20mbit", help="bandwidth of every link (tc tbf rate)")
    args = parser.parse_args()
    epochs = 3 if args.quick else 6
    strategies = [Strategy.DATA, Strategy.DREAMDDP, Strategy.ESYNC, Strategy.SESGD]
    results: dict[str, Any] = {"workers": WORKERS, "link_rate": args.rate, "epochs": epochs}
    with (
        slow_network(WORKERS, args.rate) as namespaces,
        tempfile.TemporaryDirectory() as tmp,
        steps("strategies over the slow link", len(strategies)) as progress,
    ):
        for strategy in strategies:
            progress.doing(strategy.value)
            results[strategy.value] = run_strategy(strategy, namespaces, epochs, Path(tmp) / strategy.value)
            progress.done()
    base = results[Strategy.DATA.value]["epoch_seconds"]
    for strategy in strategies[1:]:
        results[strategy.value]["speedup_vs_data"] = base / results[strategy.value]["epoch_seconds"]
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
