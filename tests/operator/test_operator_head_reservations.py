"""Head reservations on the live test bed (`--scheduler.head-reservations`, off by default): a later
job may backfill free GPUs only where that never delays the head of its queue.

The example cluster has 8 GPUs per class (two nodes of 4): fast (speed 1), medium (0.5), slow (0.25).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.operator.live import ChartAccount, Jobs, OperatorProcess, chart_operator, wait_for
from tests.operator.test_operator_scheduling import classes_of, stays

from hetero_operator.testbed.cluster import Testbed

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def operator(
    testbed: Testbed, gpu_classes: None, chart_account: ChartAccount, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """This module's own operator, with head reservations on."""
    directory = Path(tmp_path_factory.mktemp("operator-reserving"))
    with chart_operator(
        testbed, chart_account, directory, extra_args=("--scheduler.head-reservations",)
    ) as process:
        yield process


# `head` and `greedy` are created within the same second, and "greedy" sorts first by name: the
# queue order must come from arrival (status.queuedAt), not creationTimestamp's whole seconds.
def test_backfill_never_delays_the_head_of_the_queue(operator: OperatorProcess, jobs: Jobs) -> None:
    jobs.apply(jobs.manifest("running", gpus=6, gpuClasses=["fast"]))
    jobs.wait_phase("running", "Running")
    jobs.apply(jobs.manifest("head", gpus=7, gpuClasses=["fast"]))
    wait_for(lambda: jobs.condition("head", "Placed"), 20, "the head to wait")
    jobs.apply(jobs.manifest("greedy", gpus=2, gpuClasses=["fast"]))
    wait_for(lambda: jobs.condition("greedy", "Placed"), 20, "greedy to be considered")
    jobs.apply(jobs.manifest("small", gpus=1, gpuClasses=["fast"]))
    # One free fast GPU can go to a later job: when `running` ends, 7 are still there for the head.
    jobs.wait_phase("small", "Running")
    # Two cannot: the head would then wait for more than `running` to finish.
    greedy = jobs.condition("greedy", "Placed")
    assert greedy is not None and greedy["status"] == "False"
    assert f"queued behind {jobs.namespace}/head" in greedy["message"]
    assert stays(lambda: jobs.phase("greedy") == "Queued", 2)
    jobs.finish(jobs.running_pods("running"), 0)
    jobs.wait_phase("head", "Running")
    assert classes_of(jobs, "head") == {"fast": 7}
