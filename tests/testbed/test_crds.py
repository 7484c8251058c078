"""The CRDs on a live API server: examples apply, invalid manifests are refused naming the field,
`kubectl explain` teaches the API, and `kubectl get htj` shows the printer columns."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from hetero_operator.resources import (
    API_VERSION,
    Allocation,
    Batch,
    HeteroTrainJob,
    HeteroTrainJobSpec,
    HeteroTrainJobStatus,
    Phase,
    Plan,
    Progress,
    WorkerAllocation,
)

pytestmark = pytest.mark.testbed

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
INVALID_CASES = yaml.safe_load((REPO / "tests" / "data" / "invalid_manifests.yaml").read_text())


def kubernetes_manifests() -> list[Path]:
    """Files in examples/ whose every document is a Kubernetes object (nodes.yaml is not)."""
    manifests = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
        if docs and all(isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc for doc in docs):
            manifests.append(path)
    return manifests


def get_json(testbed: Any, *args: str) -> Any:
    return json.loads(testbed.kubectl("get", *args, "-o", "json").stdout)


def contains(big: Any, small: Any) -> bool:
    """Every field of `small` is in `big` with the same value (the server adds defaults)."""
    if isinstance(small, dict):
        return isinstance(big, dict) and all(
            key in big and contains(big[key], value) for key, value in small.items()
        )
    return bool(big == small)


def normalised(value: Any) -> Any:
    """Empty lists and maps are the same as absent ones on the wire."""
    if isinstance(value, dict):
        return {key: normalised(item) for key, item in value.items() if item not in ([], {}, None)}
    if isinstance(value, list):
        return [normalised(item) for item in value]
    return value


def test_examples_select_the_manifests_by_content() -> None:
    names = {path.name for path in kubernetes_manifests()}
    assert "nodes.yaml" not in names
    assert {"gpuclasses.yaml", "job-digits.yaml", "job-hetpipe.yaml", "job-esync.yaml"} <= names
    assert {"job-dreamddp.yaml", "job-sesgd.yaml"} <= names


@pytest.mark.parametrize("manifest", kubernetes_manifests(), ids=lambda path: path.name)
def test_example_manifest_applies(testbed: Any, namespace: str, manifest: Path) -> None:
    docs = list(yaml.safe_load_all(manifest.read_text()))
    # Cluster-scoped objects outlive the test's namespace: the ones this test creates are deleted
    # again, since a HeteroQueue left behind would make every later job on the shared bed wait
    # (once any queue exists, each job must name one).
    cluster_scoped = [
        f"{doc['kind'].lower()}.heterotrain.io/{doc['metadata']['name']}"
        for doc in docs
        if doc["kind"] != "HeteroTrainJob"
    ]
    existing = (
        testbed.kubectl("get", *cluster_scoped, "--ignore-not-found", "-o", "name").stdout.split()
        if cluster_scoped
        else []
    )
    created = [name for name in cluster_scoped if name not in existing]
    try:
        result = testbed.kubectl("apply", "-n", namespace, "-f", "-", input=manifest.read_text())
        assert result.returncode == 0
        for doc in docs:
            scope = ["-n", namespace] if doc["kind"] == "HeteroTrainJob" else []
            kind = f"{doc['kind'].lower()}.heterotrain.io"
            stored = get_json(testbed, kind, doc["metadata"]["name"], *scope)
            assert contains(stored["spec"], doc["spec"]), stored["spec"]
    finally:
        if created:
            testbed.kubectl("delete", *created, "--ignore-not-found", check=False)


def test_server_defaults_equal_model_defaults(testbed: Any, namespace: str) -> None:
    manifest = {
        "apiVersion": API_VERSION,
        "kind": "HeteroTrainJob",
        "metadata": {"name": "minimal"},
        "spec": {"image": "trainer:1", "gpus": {"min": 1, "max": 2}, "batch": {"global": 8}, "epochs": 1},
    }
    testbed.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest))
    stored = get_json(testbed, "htj", "minimal", "-n", namespace)
    model = HeteroTrainJob.from_k8s(stored)
    assert stored["spec"]["parallelism"] == {"strategy": "data"}
    assert normalised(stored["spec"]) == normalised(model.to_k8s()["spec"])


@pytest.mark.parametrize("case", INVALID_CASES, ids=[case["id"] for case in INVALID_CASES])
def test_invalid_manifest_is_refused_naming_the_field(
    testbed: Any, namespace: str, case: dict[str, Any]
) -> None:
    manifest = case["manifest"]
    result = testbed.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest), check=False)
    assert result.returncode != 0, f"accepted {case['why']}: {result.stdout}"
    assert case["field"] in result.stderr, result.stderr
    kind = f"{manifest['kind'].lower()}.heterotrain.io"
    missing = testbed.kubectl("get", kind, manifest["metadata"]["name"], "-n", namespace, check=False)
    assert missing.returncode != 0 and "NotFound" in missing.stderr


def test_kubectl_explain_prints_the_batch_descriptions(testbed: Any) -> None:
    # The API server publishes a new CRD's OpenAPI a moment after it is Established.
    deadline = time.monotonic() + 60
    while True:
        result = testbed.kubectl("explain", "htj.spec.batch", check=False)
        if result.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    batch_description = HeteroTrainJobSpec.model_fields["batch"].description or ""
    assert " ".join(batch_description.split()) in text
    for field in Batch.model_fields.values():
        assert " ".join((field.description or "").split()) in text, field.description
    for name in ("global", "min", "max", "adaptive", "perGpuClassMax"):
        assert (
            f"{name} <" in text
        )  # `kubectl explain` lists each field with its type, e.g. `global <integer>`


def test_kubectl_get_shows_the_printer_columns(testbed: Any, namespace: str) -> None:
    testbed.kubectl("apply", "-n", namespace, "-f", str(EXAMPLES / "job-digits.yaml"))
    status = HeteroTrainJobStatus(
        phase=Phase.RUNNING,
        allocation=Allocation.from_workers(
            [
                WorkerAllocation(rank=0, node="gpu-fast-0", gpu_class="fast", gpus=1),
                WorkerAllocation(rank=1, node="gpu-medium-0", gpu_class="medium", gpus=1),
                WorkerAllocation(rank=2, node="gpu-slow-0", gpu_class="slow", gpus=1),
            ]
        ),
        plan=Plan(
            version=1, epoch=2, global_batch=112, local_batches=[64, 32, 16], predicted_iteration_seconds=0.2
        ),
        progress=Progress(epoch=2, samples_per_second=560.5, eta_seconds=16),
    )
    patch = json.dumps({"status": status.to_wire()})
    testbed.kubectl(
        "patch", "htj", "digits", "-n", namespace, "--subresource=status", "--type=merge", "-p", patch
    )

    lines = testbed.kubectl("get", "htj", "-n", namespace).stdout.splitlines()
    assert lines[0].split() == ["NAME", "PHASE", "GPUS", "CLASSES", "STRATEGY", "EPOCH", "SAMPLES/S", "AGE"]
    row = lines[1].split()
    assert row[:7] == ["digits", "Running", "3", "fast:1,medium:1,slow:1", "data", "2", "560.5"]
    stored = HeteroTrainJob.from_k8s(get_json(testbed, "htj", "digits", "-n", namespace))
    assert stored.status == status


def test_status_is_validated_too(testbed: Any, namespace: str) -> None:
    testbed.kubectl("apply", "-n", namespace, "-f", str(EXAMPLES / "job-digits.yaml"))
    bad = {
        "status": {"phase": "Flying", "restarts": -1, "rebalances": [{"time": datetime.now(UTC).isoformat()}]}
    }
    result = testbed.kubectl(
        "patch",
        "htj",
        "digits",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(bad),
        check=False,
    )
    assert result.returncode != 0
    for field in ("status.phase", "status.restarts", "status.rebalances[0].epoch"):
        assert field in result.stderr, result.stderr


UPDATES = yaml.safe_load((REPO / "tests" / "data" / "job_updates.yaml").read_text())


def test_fields_fixed_while_workers_run_are_refused_naming_the_field(testbed: Any, namespace: str) -> None:
    """One stored job walked through the update cases: each phase is written through the status
    subresource, then the spec change is sent as a merge patch."""
    base = UPDATES["base"]
    name = base["metadata"]["name"]
    testbed.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(base))

    def change(case: dict[str, Any]) -> Any:
        if case["phase"] is not None:
            status = json.dumps({"status": {"phase": case["phase"]}})
            testbed.kubectl(
                "patch", "htj", name, "-n", namespace, "--subresource=status", "--type=merge", "-p", status
            )
        patch = json.dumps({"spec": case["change"]})
        return testbed.kubectl(
            "patch", "htj", name, "-n", namespace, "--type=merge", "-p", patch, check=False
        )

    for case in UPDATES["refused"]:
        result = change(case)
        assert result.returncode != 0, f"accepted {case['id']}: {result.stdout}"
        expected = f"{case['field']}: Forbidden: {case['field']} cannot change while the job's workers run"
        assert expected in result.stderr, result.stderr
    stored = get_json(testbed, "htj", name, "-n", namespace)
    assert stored["spec"]["image"] == base["spec"]["image"]
    for case in [c for c in UPDATES["allowed"] if c["phase"] is not None]:
        result = change(case)
        assert result.returncode == 0, f"refused {case['id']}: {result.stderr}"
