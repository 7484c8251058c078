"""Multi-tenant simulation: the trace's tenant column, queue charging in the engine, fairness measures
and `heterotrain simulate --queues`; expected values are worked out by hand beside each check."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import typer
import yaml
from sim_cases import row
from typer.testing import CliRunner

from hetero_operator.cli.simulate import simulate as simulate_command
from hetero_operator.scheduler import SchedulerConfig
from hetero_operator.scheduler.charging import Charging
from hetero_operator.scheduler.queues import ClassQuota, QueueInfo
from hetero_operator.simulator.cluster import ClusterSpec, parse_cluster
from hetero_operator.simulator.engine import EngineOptions, Simulation
from hetero_operator.simulator.fairness import (
    FairnessSetupError,
    finish_time_fairness,
    jain_index,
    share_of_cluster,
    tenant_queues,
)
from hetero_operator.simulator.policies import HeterotrainPolicy
from hetero_operator.simulator.trace import TraceError, trace_from_csv, trace_to_csv

ONE_CLASS = {
    "classes": [{"name": "v100", "relativeSpeed": 1.0, "memoryGiB": 16}],
    "nodeGroups": [{"gpuClass": "v100", "nodes": 4, "gpusPerNode": 2}],
}


def test_the_tenant_column_is_optional_and_round_trips() -> None:
    old = "job_id,arrival_s,model,gpus_min,gpus_max,duration_s,priority,gpu_classes\nj-1,0,lm,1,1,60,0,\n"
    assert trace_from_csv(old)[0].tenant == "default"
    assert "tenant" not in trace_to_csv(trace_from_csv(old))
    rows = [row("j-1", "lm", 1, 60).model_copy(update={"tenant": "team-a"})]
    text = trace_to_csv(rows)
    assert text.splitlines()[0].endswith(",tenant")
    assert trace_from_csv(text) == rows
    with pytest.raises(TraceError, match="line 2: tenant"):
        trace_from_csv(text.replace("team-a", "Team A"))


def test_fairness_measures() -> None:
    assert finish_time_fairness(3.0, 2.0) == 1.5
    assert jain_index([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0]) == pytest.approx(0.5)  # (1)^2 / (2 * 1)
    assert jain_index([1.0, 3.0]) == pytest.approx(16 / 20)  # 4^2 / (2 * 10)


def test_a_tenants_slice_and_queues() -> None:
    spec = ClusterSpec.model_validate(ONE_CLASS)
    assert len(share_of_cluster(spec, 0.25).nodes) == 1
    with pytest.raises(FairnessSetupError, match=r"nodeGroups\[v100\].nodes"):
        share_of_cluster(spec, 1 / 3)
    queues = tenant_queues(parse_cluster(ONE_CLASS), {"a": 3.0, "b": 1.0})
    assert [(q.name, q.quota("v100").nominal, q.cohort) for q in queues] == [
        ("a", 6, "cluster"),
        ("b", 2, "cluster"),
    ]


def test_the_engine_charges_a_queue_for_the_gpus_its_jobs_hold() -> None:
    cluster = parse_cluster(ONE_CLASS)
    trace = [row("j-1", "lm", 2, 600).model_copy(update={"tenant": "a"})]
    charging = Charging(half_life_s=600.0)
    queue = QueueInfo("a", quotas={"v100": ClassQuota(8)})
    policy = HeterotrainPolicy(config=SchedulerConfig(charging=charging, elastic=False, move_gain=None))
    run = Simulation(cluster, trace, policy, EngineOptions(queues=(queue,), charging=charging))
    result = run.run()
    (outcome,) = result.outcomes
    assert outcome.first_start_s == 0.0 and outcome.finish_s is not None
    # One class: every GPU is the job's average GPU, so 2 GPUs cost 2 per second from start to finish;
    # usage then is 2 * tau * (1 - exp(-T / tau)).
    tau = 600.0 / math.log(2)
    assert run.usage["a"] == pytest.approx(2 * tau * (1 - math.exp(-outcome.finish_s / tau)))


def test_simulate_with_queues_reports_jct_per_tenant(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(ONE_CLASS))
    rows = [
        row(f"j-{i}", "lm", 1, 600, arrival_s=i).model_copy(update={"tenant": "ab"[i % 2]}) for i in range(4)
    ]
    trace = tmp_path / "trace.csv"
    trace.write_text(trace_to_csv(rows))
    queues = tmp_path / "queues.yaml"
    manifest = {"apiVersion": "heterotrain.io/v1alpha1", "kind": "HeteroQueue"}
    queues.write_text(
        yaml.safe_dump_all(
            [
                {
                    **manifest,
                    "metadata": {"name": n},
                    "spec": {"quotas": [{"gpuClass": "v100", "nominal": 4}]},
                }
                for n in "ab"
            ]
        )
    )
    app = typer.Typer()
    app.command()(simulate_command)
    args = ["--cluster", str(cluster), "--trace", str(trace), "--queues", str(queues)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (summary,) = json.loads(result.stdout)["results"]
    assert set(summary["avg_jct_by_tenant"]) == {"a", "b"}
    only_a = queues.read_text().split("---")[0]
    queues.write_text(only_a)
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 2
    assert "tenant b names no HeteroQueue" in refused.output
