"""Fixtures for the operator's tests on the live test bed."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from tests.operator.live import (
    REPO,
    TOLERATE_KWOK,
    ChartAccount,
    Jobs,
    OperatorProcess,
    account_kubeconfig,
    chart_service_account,
)

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


@pytest.fixture(scope="session")
def chart_account(testbed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChartAccount]:
    """The chart's ServiceAccount and cluster-wide RBAC: the operator's only rights in these tests."""
    with chart_service_account(testbed, tmp_path_factory.mktemp("helm")) as account:
        yield account


@pytest.fixture(scope="module")
def operator(
    testbed: Testbed, gpu_classes: None, chart_account: ChartAccount, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """One operator per test module (tests clean up their jobs, so they can share it), running as the
    chart's ServiceAccount, so every test also proves the chart grants enough and no more is needed."""
    directory = Path(tmp_path_factory.mktemp("operator"))
    kubeconfig = account_kubeconfig(testbed, chart_account, directory / "operator.kubeconfig")
    log = directory / "operator.log"
    process = OperatorProcess(testbed, log, kubeconfig=kubeconfig)
    process.start()
    try:
        yield process
    finally:
        process.stop()
        print(f"--- operator log ({log}) ---\n{process.tail(60)}")
    refused = [
        line for line in log.read_text(errors="replace").splitlines() if "Forbidden" in line or " 403" in line
    ]
    assert not refused, f"the chart's ServiceAccount was refused: {refused[:5]}"


@pytest.fixture
def jobs(testbed: Testbed, namespace: str) -> Iterator[Jobs]:
    handle = Jobs(testbed, namespace)
    try:
        yield handle
    finally:
        handle.delete_all()
