"""Starting and stopping the live test beds the fixtures share."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from hetero_operator.testbed import kueue
from hetero_operator.testbed.cluster import Testbed
from hetero_operator.testbed.nodes import TRUE_SPEED_ANNOTATION, NodeList, load_node_list

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_NODES = REPO_ROOT / "examples" / "nodes.yaml"
EXAMPLE_CLASSES = REPO_ROOT / "examples" / "gpuclasses.yaml"


@contextmanager
def bed_of(directory: Path, nodes: NodeList) -> Iterator[Testbed]:
    """A test bed of these nodes only, with the example GPU classes, stopped on the way out."""
    bed = Testbed(directory)
    try:
        bed.up(nodes)
        bed.kubectl("apply", "-f", str(EXAMPLE_CLASSES))
        yield bed
    finally:
        bed.down()


@contextmanager
def running_bed(directory: Path, with_kueue: bool = False) -> Iterator[Testbed]:
    """A test bed with the CRDs installed and the example GPU nodes Ready, stopped on the way out.
    Its directory (logs included) stays after the run."""
    bed = Testbed(directory)
    try:
        bed.up(load_node_list(EXAMPLE_NODES))
        if with_kueue:
            kueue.start(bed)
        yield bed
    finally:
        bed.down()


@contextmanager
def fresh_namespace(bed: Testbed, prefix: str) -> Iterator[str]:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    bed.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        bed.kubectl("delete", "namespace", name, "--wait=false", check=False)


@contextmanager
def true_speeds_on(bed: Testbed, speeds: Mapping[str, float]) -> Iterator[Mapping[str, float]]:
    """The nodes run each model at these true speeds (node name -> speed, set apart from the GPUClass
    priors) for the block; their own speeds again afterwards, for the tests after it on a shared bed."""
    for node, speed in speeds.items():
        bed.kubectl("annotate", "node", node, f"{TRUE_SPEED_ANNOTATION}={speed:g}", "--overwrite")
    try:
        yield speeds
    finally:
        for node in speeds:
            bed.kubectl("annotate", "node", node, f"{TRUE_SPEED_ANNOTATION}-", check=False)
