"""A real training job on the local process nodes, and what its workers and checkpoints show.

Worker pods there are host processes: their output is in `<bed>/local-pods/pods/<ns>/<pod>-<uid>/`
(`container.log`, and `pid` with the process id), and the checkpoint claim is a directory under
`<bed>/local-pods/claims/<ns>/`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetero_operator.controller import names
from hetero_operator.plan import PROGRESS_PREFIX
from hetero_operator.testbed.cluster import Testbed

CHECKPOINT_DIR = "/checkpoints"
RESUMED = re.compile(r"resuming from \S*checkpoint-epoch-(\d+)\.pt \((\d+) epochs done\)")


def digits_job(name: str, namespace: str, epochs: int) -> dict[str, Any]:
    """The digits example on the three process nodes, checkpointing every epoch, restarting at once."""
    return {
        "apiVersion": "heterotrain.io/v1alpha1",
        "kind": "HeteroTrainJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "image": "heterotrain/trainer:0.1.0",
            "command": ["heterotrain", "worker", "digits"],
            "gpus": {"min": 3, "max": 3},
            "gpuClasses": ["fast", "medium", "slow"],
            "parallelism": {"strategy": "data"},
            # Epochs of a few seconds: long enough to be scraped and to be killed in the middle of.
            "env": [
                {"name": "DIGITS_HIDDEN", "value": "1024"},
                {"name": "DIGITS_PASSES_PER_EPOCH", "value": "3"},
            ],
            "batch": {"global": 512},
            "epochs": epochs,
            "checkpoint": {"path": CHECKPOINT_DIR, "everyEpochs": 1},
            "restartPolicy": {"maxRestarts": 2, "backoffSeconds": 0},
            "rebalance": {"enabled": True, "everyEpochs": 1, "minImprovement": 0.05, "initialSplit": "even"},
        },
    }


@dataclass(frozen=True)
class WorkerRun:
    """One worker pod's process on a process node."""

    pod: str
    directory: Path

    @property
    def log(self) -> str:
        path = self.directory / "container.log"
        return path.read_text(errors="replace") if path.exists() else ""

    @property
    def pid(self) -> int | None:
        path = self.directory / "pid"
        return int(json.loads(path.read_text())["pid"]) if path.exists() else None

    def progress(self) -> list[dict[str, Any]]:
        """The per-epoch lines rank 0 prints once an epoch (and its checkpoint) is done."""
        return [
            json.loads(line[len(PROGRESS_PREFIX) :])
            for line in self.log.splitlines()
            if line.startswith(PROGRESS_PREFIX)
        ]

    def resumed(self) -> tuple[int, int] | None:
        """(checkpoint file epoch, epochs done) this worker resumed from, if it did."""
        found = RESUMED.search(self.log)
        return (int(found.group(1)), int(found.group(2))) if found else None


def worker_run(bed: Testbed, namespace: str, job: str, generation: int, rank: int) -> WorkerRun | None:
    pod = names.pod_name(job, generation, rank)
    found = sorted((bed.root / "local-pods" / "pods" / namespace).glob(f"{pod}-*"))
    return WorkerRun(pod, found[-1]) if found else None


def checkpoints(bed: Testbed, namespace: str, job: str) -> list[int]:
    """Epoch numbers of the checkpoints in the job's claim."""
    directory = bed.root / "local-pods" / "claims" / namespace / names.checkpoint_claim_name(job)
    return sorted(int(m.group(1)) for p in directory.glob("*.pt") if (m := re.search(r"(\d+)\.pt$", p.name)))


# --- what was seen, and the verdicts -------------------------------------------------------------


@dataclass
class KillSeen:
    epochs_done: int = -1  # finished epochs in rank 0's log when the worker was killed
    checkpoints: list[int] = field(default_factory=list)  # on the volume at the kill
    mid_epoch: bool = False  # no epoch ended while the kill was under way
    generation_0_epochs: list[int] = field(default_factory=list)
    resumed: tuple[int, int] | None = None  # (checkpoint file epoch, epochs done) of the new rank 0
    restarts: int = 0
    final_phase: str | None = None
    final_epochs: list[int] = field(default_factory=list)  # epochs the last generation trained


def kill_problems(seen: KillSeen, epochs: int) -> list[str]:
    done = seen.epochs_done
    problems = []
    if not seen.mid_epoch:
        problems.append("an epoch ended while the kill was under way: it was not mid-epoch")
    if done not in seen.checkpoints:
        problems.append(f"no checkpoint of epoch {done} on the volume at the kill: {seen.checkpoints}")
    if seen.generation_0_epochs[-1:] != [done]:
        problems.append(f"generation 0 trained on after the kill: epochs {seen.generation_0_epochs}")
    if seen.resumed != (done, done):
        problems.append(f"resumed from (checkpoint, epochs done) {seen.resumed}, expected ({done}, {done})")
    if seen.restarts != 1:
        problems.append(f"status.restarts is {seen.restarts}, expected 1")
    if seen.final_epochs != list(range(done + 1, epochs + 1)):
        problems.append(
            f"the restarted workers trained epochs {seen.final_epochs}, expected {done + 1}..{epochs}"
        )
    if seen.final_phase != "Succeeded":
        problems.append(f"the job ended {seen.final_phase}")
    return problems


@dataclass
class OutageSeen:
    down_seconds: float = 0.0
    condition_during: dict[str, Any] = field(default_factory=dict)  # MetricsAvailable
    phase_during: str | None = None
    plans: tuple[int | None, int | None] = (None, None)  # plan version before, and after an epoch down
    rebalances: tuple[int, int] = (0, 0)  # records before, and after an epoch down
    condition_after: dict[str, Any] = field(default_factory=dict)
    recovered_seconds: float | None = None  # from Prometheus's start to MetricsAvailable=True
    epoch_at_restart: int | None = None  # the last epoch finished when Prometheus started again
    operator_survived: bool = False
    logged: bool = False  # the operator's log names the outage
    # A node slowed during the outage makes a new split due once measurements return.
    slowed_rank: int | None = None
    share_before: float | None = None  # the slowed rank's share of the global batch in the outage's plan
    share_after: float | None = None  # and in the first plan written after Prometheus answered again
    new_plan: int | None = None  # its version
    new_plan_seconds: float | None = None  # from Prometheus answering (ready) to that plan seen
    first_plan: tuple[int, float] | None = None  # (version, seconds) of the first plan after it


def share(plan: dict[str, Any] | None, rank: int) -> float | None:
    """A rank's share of the global batch in a job's status.plan."""
    if not plan or rank >= len(plan.get("localBatches") or []):
        return None
    return float(plan["localBatches"][rank]) / float(plan["globalBatch"])


def outage_problems(seen: OutageSeen) -> list[str]:
    problems = []
    if seen.condition_during.get("reason") != "PrometheusUnavailable":
        problems.append(f"MetricsAvailable during the outage: {seen.condition_during}")
    if seen.plans[0] != seen.plans[1]:
        problems.append(f"a plan was written without metrics: version {seen.plans[0]} -> {seen.plans[1]}")
    if seen.rebalances[0] != seen.rebalances[1]:
        problems.append(f"a rebalance was recorded without metrics: {seen.rebalances}")
    if seen.phase_during != "Running":
        problems.append(f"the job was {seen.phase_during} during the outage")
    if seen.condition_after.get("status") != "True":
        problems.append(f"MetricsAvailable after Prometheus came back: {seen.condition_after}")
    if seen.new_plan is None:
        problems.append("no new plan was written after Prometheus came back, with a node slowed meanwhile")
    elif seen.share_after is None or seen.share_before is None or seen.share_after >= seen.share_before:
        problems.append(
            f"the new plan (version {seen.new_plan}) did not shrink the slowed rank {seen.slowed_rank}'s "
            f"share: {seen.share_before} -> {seen.share_after}"
        )
    if not seen.operator_survived:
        problems.append("the operator process did not survive")
    if not seen.logged:
        problems.append("the operator's log does not name the outage")
    return problems
