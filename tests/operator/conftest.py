"""Fixtures for the operator's tests on the live test bed."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from tests.operator.live import REPO, TOLERATE_KWOK, Jobs, OperatorProcess

from hetero_operator.testbed.cluster import Testbed


def gpu_classes_tolerating_kwok() -> list[dict]:
    """The example GPU classes, tolerating the test bed's fake-node taint."""
    classes = [doc for doc in yaml.safe_load_all((REPO / "examples" / "gpuclasses.yaml").read_text()) if doc]
    for gpu_class in classes:
        gpu_class["spec"]["tolerations"] = [copy.deepcopy(TOLERATE_KWOK)]
    return classes


@pytest.fixture(scope="session")
def gpu_classes(testbed: Testbed) -> None:
    testbed.apply_objects(gpu_classes_tolerating_kwok())


@pytest.fixture(scope="module")
def operator(
    testbed: Testbed, gpu_classes: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """One operator per test module (tests clean up their jobs, so they can share it)."""
    log = Path(tmp_path_factory.mktemp("operator")) / "operator.log"
    process = OperatorProcess(testbed, log)
    process.start()
    try:
        yield process
    finally:
        process.stop()
        print(f"--- operator log ({log}) ---\n{process.tail(60)}")


@pytest.fixture
def jobs(testbed: Testbed, namespace: str) -> Iterator[Jobs]:
    handle = Jobs(testbed, namespace)
    try:
        yield handle
    finally:
        handle.delete_all()
