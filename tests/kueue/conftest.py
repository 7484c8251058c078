"""Fixtures for the operator's tests against the real Kueue: the operator with `--kueue`, running as
the chart's ServiceAccount installed with `kueue.enabled`, so the chart's Kueue RBAC is proven too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.beds import fresh_namespace, running_bed
from tests.operator import live
from tests.operator.conftest import gpu_classes_tolerating_kwok

from hetero_operator.testbed.cluster import Testbed


@pytest.fixture(scope="package")
def kueue_testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    """A test bed of its own with Kueue running (its CRDs, its webhooks on loopback). Separate from
    `testbed`, so a run without Kueue tests never starts Kueue; stopped once this folder's tests end,
    so it takes no CPU from the rest of the run."""
    with running_bed(tmp_path_factory.mktemp("kueue-testbed"), with_kueue=True) as bed:
        yield bed


@pytest.fixture
def kueue_namespace(kueue_testbed: Testbed) -> Iterator[str]:
    with fresh_namespace(kueue_testbed, "k") as name:
        yield name


GRACE_SECONDS = 6.0  # long enough to see the workers asked for a checkpoint before they stop
REPROPOSE_SECONDS = 600  # unless a test module sets its own REPROPOSE_SECONDS: no re-proposal


@pytest.fixture(scope="package")
def kueue_gpu_classes(kueue_testbed: Testbed) -> None:
    kueue_testbed.apply_objects(gpu_classes_tolerating_kwok())


@pytest.fixture(scope="package")
def kueue_chart_account(
    kueue_testbed: Testbed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[live.ChartAccount]:
    home = tmp_path_factory.mktemp("helm-kueue")
    with live.chart_service_account(kueue_testbed, home, {"kueue": {"enabled": True}}) as account:
        yield account


@pytest.fixture(scope="module")
def kueue_operator(
    kueue_testbed: Testbed,
    kueue_gpu_classes: None,
    kueue_chart_account: live.ChartAccount,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[live.OperatorProcess]:
    # Tests without an operator leave jobs in namespaces still being deleted; an operator started
    # among them would act on them and be refused there (nothing new may be created in them).
    live.wait_for(lambda: not leftover_jobs(kueue_testbed), 120, "the jobs of earlier tests gone")
    directory = Path(tmp_path_factory.mktemp("kueue-operator"))
    repropose = getattr(request.module, "REPROPOSE_SECONDS", REPROPOSE_SECONDS)
    args = ("--kueue.enabled", "--kueue.repropose-after-seconds", str(repropose))
    with live.chart_operator(kueue_testbed, kueue_chart_account, directory, GRACE_SECONDS, args) as process:
        yield process


def leftover_jobs(bed: Testbed) -> list[str]:
    items = json.loads(bed.kubectl("get", "heterotrainjobs", "--all-namespaces", "-o", "json").stdout)[
        "items"
    ]
    return [f"{i['metadata']['namespace']}/{i['metadata']['name']}" for i in items]


@pytest.fixture
def kueue_jobs(kueue_testbed: Testbed, kueue_namespace: str) -> Iterator[live.Jobs]:
    with live.jobs_in(kueue_testbed, kueue_namespace, timeout=60, until_gone=True) as handle:
        yield handle
