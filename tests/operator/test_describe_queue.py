"""`heterotrain describe queue NAME` renders quota, usage, borrowing and the queue's jobs."""

from __future__ import annotations

from rich.console import Console

from hetero_operator.api.models import JobSummary
from hetero_operator.cli.queue_tables import describe_queue
from hetero_operator.resources import HeteroQueue


def test_describe_queue_shows_quota_usage_and_jobs() -> None:
    queue = HeteroQueue.from_k8s(
        {
            "apiVersion": "heterotrain.io/v1alpha1",
            "kind": "HeteroQueue",
            "metadata": {"name": "research"},
            "spec": {
                "weight": 2,
                "cohort": "lab",
                "quotas": [{"gpuClass": "a100", "nominal": 4, "lendingLimit": 2}],
            },
            "status": {
                "usage": [{"gpuClass": "a100", "gpus": 6, "nominal": 4, "borrowed": 2}],
                "share": 12.5,
                "chargedUsage": 3600,
                "runningJobs": 1,
                "pendingJobs": 1,
            },
        }
    )
    jobs = [
        JobSummary(
            namespace="ml",
            name="big",
            queue="research",
            gpus=0,
            classes="",
            epoch=0,
            restarts=0,
            message="queue research may take only class a100: 0 GPUs more",
        )
    ]
    console = Console(width=200, record=True)
    console.print(describe_queue(queue, jobs))
    text = console.export_text()
    assert "HeteroQueue research" in text and "lab" in text
    assert "a100" in text and " 6 " in text and " 4 " in text  # held 6 of nominal 4, 2 borrowed
    assert "1 running, 1 pending" in text
    assert "ml/big" in text and "may take only class a100" in text
