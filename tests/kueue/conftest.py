"""Fixtures for the operator's tests against the real Kueue: the operator with `--kueue`, running as
the chart's ServiceAccount installed with `kueue.enabled`, so the chart's Kueue RBAC is proven too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.operator.conftest import gpu_classes_tolerating_kwok
from tests.operator.live import ChartAccount, Jobs, OperatorProcess, account_kubeconfig, chart_service_account

from hetero_operator.testbed.cluster import Testbed

GRACE_SECONDS = 6.0  # long enough to see the workers asked for a checkpoint before they stop
REPROPOSE_SECONDS = 600  # no re-proposal during these tests (the in-process tests cover it)


@pytest.fixture(scope="session")
def kueue_gpu_classes(kueue_testbed: Testbed) -> None:
    kueue_testbed.apply_objects(gpu_classes_tolerating_kwok())


@pytest.fixture(scope="session")
def kueue_chart_account(
    kueue_testbed: Testbed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ChartAccount]:
    home = tmp_path_factory.mktemp("helm-kueue")
    with chart_service_account(kueue_testbed, home, {"kueue": {"enabled": True}}) as account:
        yield account


@pytest.fixture(scope="module")
def kueue_operator(
    kueue_testbed: Testbed,
    kueue_gpu_classes: None,
    kueue_chart_account: ChartAccount,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    directory = Path(tmp_path_factory.mktemp("kueue-operator"))
    kubeconfig = account_kubeconfig(kueue_testbed, kueue_chart_account, directory / "operator.kubeconfig")
    log = directory / "operator.log"
    args = ("--kueue", "--kueue-repropose-after", str(REPROPOSE_SECONDS))
    process = OperatorProcess(kueue_testbed, log, GRACE_SECONDS, args, kubeconfig)
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
def kueue_jobs(kueue_testbed: Testbed, kueue_namespace: str) -> Iterator[Jobs]:
    handle = Jobs(kueue_testbed, kueue_namespace)
    try:
        yield handle
    finally:
        handle.delete_all(timeout=60)
