"""A small GPU pool of its own on the test bed, two jobs with status, RBAC'd service accounts and a
running API server, shared by the API and CLI tests.

The pool's nodes carry only this run's class label, so the example GPUClasses other tests apply never
claim them, and everything is removed at the end of the session.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from api_bed import (
    ApiBed,
    gpu_class_object,
    job_object,
    queued_status,
    rbac_objects,
    running_status,
    serving,
)

from hetero_operator.api import ApiSettings, create_app
from hetero_operator.testbed.cluster import Testbed
from hetero_operator.testbed.nodes import FakeNode, NodeList


# Module scope: its GPU classes and nodes are gone before other folders' tests share the test bed.
@pytest.fixture(scope="module")
def api_bed(testbed: Testbed) -> Iterator[ApiBed]:
    prefix = f"api-{uuid.uuid4().hex[:6]}"
    namespace = f"{prefix}-team"
    fast, slow, local_class = f"{prefix}-fast", f"{prefix}-slow", f"{prefix}-cpu"
    testbed.kubectl("create", "namespace", namespace)
    try:
        testbed.apply_objects(
            [
                gpu_class_object(fast, 1.0, 80),
                gpu_class_object(slow, 0.25, 16),
                gpu_class_object(local_class, 0.1, 8),
            ]
        )
        testbed.apply_nodes(
            NodeList(
                nodes=[
                    FakeNode(name=f"{prefix}-fast-0", gpuClass=fast, gpus=4),
                    FakeNode(name=f"{prefix}-slow-0", gpuClass=slow, gpus=4),
                ]
            )
        )
        testbed.apply_objects(rbac_objects(prefix, namespace))

        def token(account: str) -> str:
            return testbed.kubectl("create", "token", account, "-n", namespace).stdout.strip()

        bed = ApiBed(testbed, prefix, namespace, fast, slow, local_class, token("reader"), token("outsider"))
        testbed.apply_objects([job_object(bed, "train-running"), job_object(bed, "train-queued")])
        for name, status in (("train-running", running_status(bed)), ("train-queued", queued_status())):
            patch = json.dumps({"status": status.to_wire()})
            testbed.kubectl(
                "patch", "htj", name, "-n", namespace, "--subresource=status", "--type=merge", "-p", patch
            )
        yield bed
    finally:
        testbed.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        # One object per call: a single missing object must not keep the others (which other tests
        # would see in the shared test bed) from being deleted.
        for obj in (
            f"clusterrole/{prefix}-gpuclass-reader",
            f"clusterrolebinding/{prefix}-gpuclass-reader",
            f"gpuclass/{fast}",
            f"gpuclass/{slow}",
            f"gpuclass/{local_class}",
            f"node/{prefix}-fast-0",
            f"node/{prefix}-slow-0",
        ):
            testbed.kubectl("delete", obj, "--ignore-not-found", "--wait=true", "--timeout=30s", check=False)


@pytest.fixture(scope="module")
def api_url(api_bed: ApiBed) -> Iterator[str]:
    """The API served over real HTTP by `serve()`, in a thread with its own event loop."""
    with serving(create_app(ApiSettings(kubeconfig=api_bed.testbed.kubeconfig))) as url:
        yield url
