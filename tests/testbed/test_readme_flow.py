"""The README's test-bed flow as written: `heterotrain testbed up --nodes examples/nodes.yaml` (a
test bed of its own, which installs the CRDs: the session's shared bed may hold other tests' jobs),
`kubectl apply -f examples/gpuclasses.yaml`, `heterotrain operator`, `kubectl apply -f
examples/job-digits.yaml`: the job reaches Running on the KWOK GPU nodes with the unmodified example
classes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.operator.live import OperatorProcess, wait_for

from hetero_operator.testbed.cluster import Testbed
from hetero_operator.testbed.nodes import load_node_list

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(150)]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def readme_bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    """`heterotrain testbed up --nodes examples/nodes.yaml`: the example nodes and nothing else."""
    bed = Testbed(tmp_path_factory.mktemp("readme-bed"))
    try:
        bed.up(load_node_list(REPO / "examples" / "nodes.yaml"))
        yield bed
    finally:
        bed.down()


def test_the_digits_example_runs_on_the_example_nodes(readme_bed: Testbed, tmp_path: Path) -> None:
    testbed, namespace = readme_bed, "default"
    testbed.kubectl("apply", "-f", str(REPO / "examples" / "gpuclasses.yaml"))
    operator = OperatorProcess(testbed, tmp_path / "operator.log")
    operator.start()
    try:
        testbed.kubectl("apply", "-n", namespace, "-f", str(REPO / "examples" / "job-digits.yaml"))

        def running() -> dict[str, Any] | None:
            job = json.loads(testbed.kubectl("get", "htj", "digits", "-n", namespace, "-o", "json").stdout)
            return job if (job.get("status") or {}).get("phase") == "Running" else None

        job = wait_for(running, 90, "the digits job to reach Running")
        workers = job["status"]["allocation"]["workers"]
        assert len(workers) == 3
        pods = json.loads(testbed.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]
        assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(w["node"] for w in workers)
        assert all(p["status"]["phase"] == "Running" for p in pods)
    finally:
        testbed.kubectl("delete", "htj", "--all", "-n", namespace, "--wait=false", check=False)
        operator.stop()
        print(f"--- operator log ---\n{operator.tail(40)}")
