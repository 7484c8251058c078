"""Helpers for the tests against the real Kueue on the test bed: queues, jobs, Workloads, status."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from hetero_operator.kueue import constants, queues
from hetero_operator.kueue.admission import WorkloadAdmission, read_admission
from hetero_operator.kueue.workload import ProposedMix, build_workload
from hetero_operator.resources import GPUClass, GPUClassSpec, HeteroTrainJob
from hetero_operator.testbed.cluster import Testbed

REPO = Path(__file__).resolve().parents[2]
WORKLOADS = "workloads.v1beta2.kueue.x-k8s.io"
GPU = "nvidia.com/gpu"
LOCAL_QUEUE = "team"


def example_classes() -> dict[str, GPUClassSpec]:
    documents = yaml.safe_load_all((REPO / "examples" / "gpuclasses.yaml").read_text())
    return {d["metadata"]["name"]: GPUClass.from_k8s(d).spec for d in documents if d}


class KueueQueue:
    """One ResourceFlavor per example GPU class (named after it), a ClusterQueue with a GPU quota per
    flavor and a LocalQueue in `namespace`; Workloads built by the builder for real HeteroTrainJobs."""

    def __init__(self, bed: Testbed, namespace: str, quotas: Mapping[str, int]) -> None:
        self.bed, self.namespace = bed, namespace
        self.classes = example_classes()
        self.cluster_queue = f"{namespace}-gpus"
        objects = [queues.resource_flavor(name, spec) for name, spec in self.classes.items()]
        objects.append(queues.cluster_queue(self.cluster_queue, GPU, quotas, preempt_lower_priority=True))
        objects.append(queues.local_queue(LOCAL_QUEUE, namespace, self.cluster_queue))
        bed.apply_objects(objects)

    def job(self, name: str, priority: int = 0) -> HeteroTrainJob:
        """A HeteroTrainJob labelled for the LocalQueue, as the API server returns it (with its uid).
        No operator runs on this bed: the job only owns its Workload."""
        body = {
            "apiVersion": "heterotrain.io/v1alpha1",
            "kind": "HeteroTrainJob",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": {constants.QUEUE_NAME_LABEL: LOCAL_QUEUE},
            },
            "spec": {
                "image": "heterotrain/trainer:test",
                "gpus": {"min": 1, "max": 16},
                "batch": {"global": 64},
                "epochs": 1,
                "priority": priority,
            },
        }
        self.bed.kubectl("create", "-f", "-", input=yaml.safe_dump(body))
        return HeteroTrainJob.from_k8s(self.get("heterotrainjob", name))

    def submit(self, job: HeteroTrainJob, workers_per_class: Mapping[str, int]) -> str:
        workload = build_workload(job, ProposedMix.of(workers_per_class), self.classes)
        self.bed.kubectl("create", "-f", "-", input=yaml.safe_dump(workload))
        return str(workload["metadata"]["name"])

    def get(self, kind: str, name: str) -> dict[str, Any]:
        return json.loads(self.bed.kubectl("get", kind, name, "-n", self.namespace, "-o", "json").stdout)  # type: ignore[no-any-return]

    def read(self, workload: str) -> WorkloadAdmission:
        return read_admission(self.get(WORKLOADS, workload))

    def usage(self) -> dict[str, int]:
        """GPUs in use per flavor, as Kueue's ClusterQueue status counts them."""
        status = json.loads(
            self.bed.kubectl("get", "clusterqueue", self.cluster_queue, "-o", "json").stdout
        ).get("status", {})
        return {
            flavor["name"]: int(resource["total"])
            for flavor in status.get("flavorsUsage", [])
            for resource in flavor["resources"]
            if resource["name"] == GPU
        }

    def apply_status(
        self, workload: str, build: Callable[[dict[str, Any], dt.datetime], dict[str, Any]]
    ) -> None:
        """Apply a status patch as Kueue's admission field manager; on a conflict (Kueue wrote the
        Workload meanwhile), read it again and rebuild the patch."""
        for _ in range(5):
            patch = build(self.get(WORKLOADS, workload), dt.datetime.now(dt.UTC))
            result = self.bed.kubectl(
                "apply",
                "--server-side",
                "--force-conflicts",
                f"--field-manager={constants.ADMISSION_FIELD_MANAGER}",
                "--subresource=status",
                "-f",
                "-",
                input=yaml.safe_dump(patch),
                check=False,
            )
            if result.returncode == 0:
                return
            if "modified" not in result.stderr and "Conflict" not in result.stderr:
                raise subprocess.CalledProcessError(
                    result.returncode, result.args, result.stdout, result.stderr
                )
            time.sleep(0.2)
        raise AssertionError(f"status of {workload} kept conflicting")
