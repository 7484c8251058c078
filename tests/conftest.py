"""Shared fixtures: a live test bed per test session and a fresh namespace per test."""

from __future__ import annotations

import signal
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from hetero_operator.testbed import images, kueue
from hetero_operator.testbed.cluster import Testbed
from hetero_operator.testbed.container_store import Engine
from hetero_operator.testbed.nodes import load_node_list

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_NODES = REPO_ROOT / "examples" / "nodes.yaml"


def pytest_configure(config: pytest.Config) -> None:
    """A SIGTERM (a CI time limit, say) ends the run like Ctrl-C, so fixtures still stop their test beds."""

    def interrupt(_signum: int, _frame: object) -> None:
        sys.exit(143)

    signal.signal(signal.SIGTERM, interrupt)


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


@pytest.fixture(scope="session")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    """A running test bed with the CRDs installed and the example GPU nodes Ready."""
    with running_bed(tmp_path_factory.mktemp("testbed")) as bed:
        yield bed


@pytest.fixture
def namespace(testbed: Testbed) -> Iterator[str]:
    with fresh_namespace(testbed, "t") as name:
        yield name


@pytest.fixture(scope="session")
def kueue_testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    """A test bed of its own with Kueue running (its CRDs, its webhooks on loopback). Separate from
    `testbed`, so a run without Kueue tests never starts Kueue."""
    with running_bed(tmp_path_factory.mktemp("kueue-testbed"), with_kueue=True) as bed:
        yield bed


@pytest.fixture
def kueue_namespace(kueue_testbed: Testbed) -> Iterator[str]:
    with fresh_namespace(kueue_testbed, "k") as name:
        yield name


@pytest.fixture(scope="session")
def container_engine() -> Engine:
    """buildah and podman on the test bed's container store (under the cache directory)."""
    return Engine()


@pytest.fixture(scope="session")
def built_images(container_engine: Engine) -> dict[str, str]:
    """The base, operator and trainer images of these sources, by name. `make test`'s bootstrap builds
    them; here they are only looked up (or built, once per content, when run without it)."""
    return images.ensure_images(container_engine)
