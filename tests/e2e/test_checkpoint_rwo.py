"""ReadWriteOnce checkpoint storage, live: the digits example on the three process nodes, its
checkpoints on a `ReadWriteOnce` claim, is suspended after its first epoch and resumed.

A ReadWriteOnce volume attaches to one node, so only rank 0's pod mounts the claim: rank 0 writes
every checkpoint there and, on the resume, reads the newest and sends it to the other ranks. What is
checked comes from the API server (the claim, the pods of both generations) and from what the
workers wrote (their logs and the claim's directory on the test bed): the stop every rank logged
names the checkpoint; the resumed generation, on every rank, starts from that checkpoint's position.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from tests.operator.live import OperatorProcess, wait_for
from tests.reliability.faults_cluster import (
    Cluster,
    Snapshot,
    live,
    missing_workers,
    rank_and_generation,
    status,
)
from tests.reliability.faults_training import CHECKPOINT_DIR, WorkerRun, digits_job, worker_run

from hetero_operator.controller import names
from hetero_operator.plan import CHECKPOINT_RANK0_ONLY_ENV
from hetero_operator.testbed.cluster import Testbed
from hetero_runtime.checkpoint import checkpoint_path, load

pytestmark = [pytest.mark.testbed, pytest.mark.slow, pytest.mark.timeout(600)]

JOB = "rwo"
EPOCHS = 5
SIZE = "1Gi"
WORLD = 3
# The digits example's own target; a single process at this batch and these epochs reaches 0.92-0.96.
TARGET_ACCURACY = 0.90
GRACE_SECONDS = 60.0  # long: the workers' own exit after their checkpoint ends the drain
STOPPED = re.compile(r"stopping on request \((.+?)\) at epoch (\d+) after (\d+) samples of it")
RESUMING = re.compile(r"resuming from (\S+) \((\d+) epochs done\)")
RESUMED = re.compile(r"resumed at epoch (\d+), (\d+) samples into it \(state (.+?)\)")


def rwo_job(namespace: str) -> dict[str, Any]:
    job = digits_job(JOB, namespace, epochs=EPOCHS)
    job["spec"]["checkpoint"] = {
        "path": CHECKPOINT_DIR,
        "everyEpochs": 1,
        "storage": {"accessMode": "ReadWriteOnce", "size": SIZE},
    }
    return job


def running_generation(
    cluster: Cluster, after: int | None, timeout: float
) -> tuple[int, list[dict[str, Any]]]:
    """(generation, its pods by rank) once the job runs a generation newer than `after` with a pod
    for every worker."""

    def started(s: Snapshot) -> bool:
        allocation = status(s.jobs.get(JOB) or {}).get("allocation") or {}
        found = allocation.get("generation")
        return (
            s.phase(JOB) == "Running"
            and bool(allocation.get("workers"))
            and found is not None
            and (after is None or found > after)
            and not missing_workers(s, JOB)
        )

    snapshot = cluster.until(started, timeout, f"a generation of {JOB} after {after} to run")
    current = int(status(snapshot.jobs[JOB])["allocation"]["generation"])
    pods = [p for p in snapshot.job_pods(JOB) if rank_and_generation(p)[1] == current]
    return current, sorted(pods, key=lambda p: rank_and_generation(p)[0])


def claims_and_mounts(pod: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(claims among the pod's volumes, mount paths of those volumes in its worker container)."""
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in pod["spec"].get("volumes") or []
        if "persistentVolumeClaim" in v
    }
    (worker,) = pod["spec"]["containers"]
    mounts = [m["mountPath"] for m in worker.get("volumeMounts") or [] if m["name"] in claims]
    return sorted(claims.values()), mounts


def env_of(pod: dict[str, Any]) -> dict[str, str | None]:
    (worker,) = pod["spec"]["containers"]
    return {e["name"]: e.get("value") for e in worker.get("env") or []}


def runs_of(bed: Testbed, namespace: str, generation: int) -> list[WorkerRun]:
    runs = [worker_run(bed, namespace, JOB, generation, rank) for rank in range(WORLD)]
    assert all(run is not None for run in runs), f"generation {generation}: a worker left no directory"
    return [run for run in runs if run is not None]


def test_a_read_write_once_checkpoint_claim_carries_a_suspended_job_over(
    bed: Testbed, tmp_path: Path
) -> None:
    namespace = f"rwo-{uuid.uuid4().hex[:6]}"
    bed.kubectl("create", "namespace", namespace)
    cluster = Cluster(str(bed.kubeconfig), namespace)
    operator = OperatorProcess(bed, tmp_path / "operator.log", grace_seconds=GRACE_SECONDS)
    claim_name = names.checkpoint_claim_name(JOB)
    claim_dir = bed.root / "local-pods" / "claims" / namespace / claim_name
    times: dict[str, float] = {}
    started = time.monotonic()
    operator.start()
    try:
        cluster.apply(rwo_job(namespace))
        first, first_pods = running_generation(cluster, None, 180)
        times["running"] = time.monotonic() - started
        rank0 = wait_for(lambda: worker_run(bed, namespace, JOB, first, 0), 30, "rank 0's process")
        wait_for(rank0.progress, 180, "the first epoch to end")
        times["first epoch"] = time.monotonic() - started
        cluster.suspend(JOB, True)
        # Workers that stopped on their own after the checkpoint stay as finished pods while the job is
        # suspended (the operator deletes the earlier generation's pods once the next one starts).
        cluster.until(
            lambda s: s.phase(JOB) == "Suspended" and not any(live(p) for p in s.job_pods(JOB)),
            120,
            f"{JOB} to be suspended with its workers stopped",
        )
        times["suspended"] = time.monotonic() - started
        on_suspension = sorted(p.name for p in claim_dir.glob("*.pt"))
        cluster.suspend(JOB, False)
        second, second_pods = running_generation(cluster, first, 180)
        times["resumed"] = time.monotonic() - started
        final = cluster.until(lambda s: s.phase(JOB) in ("Succeeded", "Failed"), 240, f"{JOB} to finish")
        times["finished"] = time.monotonic() - started
        claim = json.loads(bed.kubectl("get", "pvc", claim_name, "-n", namespace, "-o", "json").stdout)
    finally:
        bed.kubectl("delete", "htj", "--all", "-n", namespace, "--wait=false", check=False)
        operator.stop()
        print(f"--- operator log ---\n{operator.tail(30)}")
    print("seconds from apply: " + ", ".join(f"{what} {at:.1f}" for what, at in times.items()))
    assert final.phase(JOB) == "Succeeded", status(final.jobs[JOB])
    generations_left = {rank_and_generation(p)[1] for p in final.job_pods(JOB)}
    assert generations_left == {second}, "the first generation's pods are deleted"

    # The claim the operator created, as the API server stored it.
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"]["requests"] == {"storage": SIZE}
    owners = [(o["kind"], o["name"]) for o in claim["metadata"].get("ownerReferences") or []]
    assert owners == [("HeteroTrainJob", JOB)]

    # Both generations: only rank 0's pod mounts the claim, at the checkpoint path; the other ranks
    # are told that only rank 0 has the volume.
    assert second > first
    for pods in (first_pods, second_pods):
        assert [rank_and_generation(p)[0] for p in pods] == list(range(WORLD))
        assert [claims_and_mounts(p) for p in pods] == [([claim_name], [CHECKPOINT_DIR]), ([], []), ([], [])]
        for pod in pods[1:]:
            assert env_of(pod).get(CHECKPOINT_RANK0_ONLY_ENV) == "1", pod["metadata"]["name"]

    # The stop: every first-generation rank stopped at the same position, and rank 0 saved it on
    # the claim (the newest checkpoint there when the job was suspended).
    first_runs, second_runs = runs_of(bed, namespace, first), runs_of(bed, namespace, second)
    stops = [STOPPED.search(run.log) for run in first_runs]
    assert all(stops), [run.log[-1500:] for run, stop in zip(first_runs, stops, strict=True) if not stop]
    positions = {(int(s.group(2)), int(s.group(3))) for s in stops if s is not None}
    assert len(positions) == 1, f"the ranks stopped at different positions: {positions}"
    ((epoch, consumed),) = positions
    saved = checkpoint_path(claim_dir, epoch, consumed)
    # On the claim at the suspension: one checkpoint per epoch done, and the stop's.
    assert set(on_suspension) == {checkpoint_path(claim_dir, done).name for done in range(1, epoch + 1)} | {
        saved.name
    }
    state = load(saved)
    assert state["epochs_done"] == epoch and state["position"] == {"epoch": epoch, "consumed": consumed}
    assert 1 <= epoch < EPOCHS, "the stop came after the first epoch and before the last"
    first_progress = [line["epoch"] for line in first_runs[0].progress()]
    assert first_progress == list(range(1, epoch + 1))

    # The resume: rank 0 read that file from the claim; every rank reports starting at its position,
    # the others from the state rank 0 sent them; rank 0's epochs continue after the saved one.
    resuming = [RESUMING.search(run.log) for run in second_runs]
    assert resuming[0] is not None and Path(resuming[0].group(1)) == saved, second_runs[0].log[-1500:]
    assert int(resuming[0].group(2)) == epoch
    assert resuming[1:] == [None, None], "only rank 0 reads a checkpoint file"
    resumed = [[m.groups() for m in RESUMED.finditer(run.log)] for run in second_runs]
    assert resumed == [
        [(str(epoch), str(consumed), "read from the checkpoint")],
        [(str(epoch), str(consumed), "received from rank 0")],
        [(str(epoch), str(consumed), "received from rank 0")],
    ]
    assert all(not RESUMED.search(run.log) for run in first_runs), "the first generation started fresh"
    progress = second_runs[0].progress()
    assert [line["epoch"] for line in progress] == list(range(epoch + 1, EPOCHS + 1))

    # Checkpoints exist on the claim only: one per epoch and the one the stop took, nowhere else on
    # the test bed (no rank wrote to a directory of its own).
    expected = {checkpoint_path(claim_dir, done) for done in range(1, EPOCHS + 1)} | {saved}
    assert {p for p in claim_dir.iterdir() if p.suffix == ".pt"} == expected
    everywhere = {p for p in bed.root.rglob("*.pt")}
    assert everywhere == expected, sorted(str(p) for p in everywhere - expected)

    accuracy = (progress[-1].get("evaluation") or {}).get("accuracy")
    print(
        f"stopped at epoch {epoch} after {consumed} samples of it; resumed in generation {second}; "
        f"accuracy per epoch {[round((p.get('evaluation') or {}).get('accuracy', 0), 3) for p in progress]}"
    )
    assert accuracy is not None and accuracy >= TARGET_ACCURACY
