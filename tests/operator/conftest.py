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
    chart_operator,
    chart_service_account,
    jobs_in,
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
    with chart_operator(testbed, chart_account, Path(tmp_path_factory.mktemp("operator"))) as process:
        yield process


@pytest.fixture
def jobs(testbed: Testbed, namespace: str) -> Iterator[Jobs]:
    with jobs_in(testbed, namespace) as handle:
        yield handle
