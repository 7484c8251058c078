"""`heterotrain jobs | describe | whatif | logs | api` against the test bed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
import yaml
from api_bed import ApiBed, free_port
from api_cases import job_spec
from typer.testing import CliRunner

from hetero_operator.cli.jobs import describe_command, jobs_command, logs_command, whatif_command
from hetero_operator.testbed.nodes import FakeNode, NodeList

pytestmark = pytest.mark.testbed

app = typer.Typer()
app.command("jobs")(jobs_command)
app.command("describe")(describe_command)
app.command("whatif")(whatif_command)
app.command("logs")(logs_command)


def _run(bed: ApiBed, *args: str) -> Any:
    result = CliRunner().invoke(
        app,
        [*args, "--kubeconfig", str(bed.testbed.kubeconfig)],
        env={"COLUMNS": "250"},
        catch_exceptions=False,
    )
    return result


def test_jobs_lists_phase_gpus_and_why_a_job_waits(api_bed: ApiBed) -> None:
    result = _run(api_bed, "jobs", "-n", api_bed.namespace)
    assert result.exit_code == 0, result.output
    lines = {line.split("│")[1].strip(): line for line in result.output.splitlines() if "train-" in line}
    assert set(lines) == {"train-running", "train-queued"}
    assert "Running" in lines["train-running"] and f"{api_bed.fast}:4" in lines["train-running"]
    assert "1/3" in lines["train-running"] and "512.0" in lines["train-running"]
    assert "Queued" in lines["train-queued"] and "waiting for the test" in lines["train-queued"]


def test_jobs_in_every_namespace_as_json(api_bed: ApiBed) -> None:
    result = _run(api_bed, "jobs", "-A", "-o", "json")
    assert result.exit_code == 0, result.output
    mine = {
        (j["namespace"], j["name"]) for j in json.loads(result.output) if j["namespace"] == api_bed.namespace
    }
    assert mine == {(api_bed.namespace, "train-running"), (api_bed.namespace, "train-queued")}


def test_describe_shows_allocation_plan_throughput_and_history(api_bed: ApiBed) -> None:
    result = _run(api_bed, "describe", "train-running", "-n", api_bed.namespace)
    assert result.exit_code == 0, result.output
    out = result.output
    for title in ("Allocation (generation 0)", "Plan and throughput", "Rebalance history", "Conditions"):
        assert title in out
    worker_rows = [line for line in out.splitlines() if api_bed.node("fast-0") in line]
    assert len(worker_rows) == 4 and all(" 32 " in row for row in worker_rows)
    assert "1 -> 2" in out and "+12.5%" in out and "MeasuredSpeeds" in out
    assert "32, 32, 32, 32" in out and "512.0" in out


def test_describe_of_a_missing_job_says_where_it_looked(api_bed: ApiBed) -> None:
    result = _run(api_bed, "describe", "nope", "-n", api_bed.namespace)
    assert result.exit_code == 1
    assert f"no HeteroTrainJob 'nope' in namespace '{api_bed.namespace}'" in result.output


def _spec_file(tmp_path: Path, spec: dict[str, Any]) -> str:
    path = tmp_path / "job.yaml"
    manifest = {
        "apiVersion": "heterotrain.io/v1alpha1",
        "kind": "HeteroTrainJob",
        "metadata": {"name": "try"},
    }
    path.write_text(yaml.safe_dump({**manifest, "spec": spec}))
    return str(path)


def test_whatif_places_against_the_live_pool_and_creates_nothing(api_bed: ApiBed, tmp_path: Path) -> None:
    before = api_bed.testbed.kubectl("get", "htj,pods", "-n", api_bed.namespace, "-o", "name").stdout
    spec = _spec_file(tmp_path, job_spec(2, 2, [api_bed.fast, api_bed.slow], priority=500))
    as_json = _run(api_bed, "whatif", spec, "-n", api_bed.namespace, "-o", "json")
    assert as_json.exit_code == 0, as_json.output
    result = json.loads(as_json.output)
    assert result["schedulable"] and result["allocation"]["classes"] == f"{api_bed.slow}:2"
    table = _run(api_bed, "whatif", spec, "-n", api_bed.namespace)
    assert "would be placed now" in table.output and "Placement" in table.output
    assert f"{result['predictedSamplesPerSecond']:.1f}" in table.output
    assert api_bed.testbed.kubectl("get", "htj,pods", "-n", api_bed.namespace, "-o", "name").stdout == before


def test_whatif_explains_per_class_why_a_job_would_wait(api_bed: ApiBed, tmp_path: Path) -> None:
    spec = _spec_file(tmp_path, job_spec(16, 16, [api_bed.slow]))
    result = _run(api_bed, "whatif", spec, "-n", api_bed.namespace)
    assert result.exit_code == 0, result.output
    assert "would wait" in result.output and "Per GPU class" in result.output
    row = next(line for line in result.output.splitlines() if line.startswith(f"│ {api_bed.slow} "))
    # The queued job arrived first and takes the slow node's GPUs in the same cycle.
    assert "0 of 16 GPUs free" in row
    assert "cannot start until GPU nodes are added" in result.output


def test_whatif_refuses_a_bad_spec_naming_the_field(api_bed: ApiBed, tmp_path: Path) -> None:
    spec = job_spec(2)
    spec["gpus"] = {"min": 3, "max": 2}
    result = _run(api_bed, "whatif", _spec_file(tmp_path, spec))
    assert result.exit_code == 2
    assert "spec.gpus.min" in result.output


def _log_pod(bed: ApiBed, job: str, rank: int, text: str) -> dict[str, Any]:
    labels = {"heterotrain.io/job": job, "heterotrain.io/rank": str(rank), "heterotrain.io/generation": "0"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{job}-g0-w{rank}", "namespace": bed.namespace, "labels": labels},
        "spec": {
            "nodeName": bed.node("local"),
            "restartPolicy": "Never",
            "containers": [
                {"name": "worker", "image": "ignored", "command": ["python", "-c", f"print({text!r})"]}
            ],
        },
    }


def _wait_finished(bed: ApiBed, pods: list[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = bed.testbed.kubectl(
            "get", "pods", "-n", bed.namespace, *pods, "-o", "jsonpath={.items[*].status.phase}"
        )
        if out.stdout.split() == ["Succeeded"] * len(pods):
            return
        time.sleep(0.3)
    raise AssertionError(f"pods {pods} did not finish: {out.stdout}")


@pytest.fixture
def local_node(api_bed: ApiBed) -> Iterator[str]:
    """A local process node for this test only: the node agent serves every local node in one loop."""
    name = api_bed.node("local")
    api_bed.testbed.apply_nodes(
        NodeList(nodes=[FakeNode(name=name, gpuClass=api_bed.local_class, gpus=1, local=True)])
    )
    try:
        yield name
    finally:
        api_bed.testbed.kubectl("delete", "node", name, "--wait=false", check=False)


def test_logs_of_workers_on_a_local_process_node(api_bed: ApiBed, local_node: str) -> None:
    pods = [_log_pod(api_bed, "logjob", rank, f"hello from rank {rank}") for rank in (0, 1)]
    api_bed.testbed.apply_objects(pods)
    _wait_finished(api_bed, [p["metadata"]["name"] for p in pods])
    both = _run(api_bed, "logs", "logjob", "-n", api_bed.namespace)
    assert both.exit_code == 0, both.output
    assert both.output.splitlines() == [
        "==> logjob-g0-w0 (rank 0) <==",
        "hello from rank 0",
        "==> logjob-g0-w1 (rank 1) <==",
        "hello from rank 1",
    ]
    one = _run(api_bed, "logs", "logjob", "--rank", "1", "-n", api_bed.namespace)
    assert one.output == "hello from rank 1\n"
    missing = _run(api_bed, "logs", "logjob", "--rank", "7", "-n", api_bed.namespace)
    assert missing.exit_code == 1 and "no worker pods rank 7" in missing.output


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_api_command_serves_until_interrupted(api_bed: ApiBed, stop: signal.Signals) -> None:
    port = free_port()
    script = "import typer; from hetero_operator.cli.jobs import api_command; typer.run(api_command)"
    argv = [
        sys.executable,
        "-c",
        script,
        "--kubeconfig",
        str(api_bed.testbed.kubeconfig),
        "--port",
        str(port),
    ]
    # Started as a shell's background job is (SIGINT ignored from the start): it must stop anyway.
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=os.environ,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        deadline = time.monotonic() + 60
        ready = None
        while time.monotonic() < deadline and process.poll() is None:
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        assert ready is not None and ready.json()["ready"], ready.text if ready else process.poll()
        assert httpx.get(f"http://127.0.0.1:{port}/api/v1/jobs", timeout=5).status_code == 401
    finally:
        process.send_signal(stop)
        output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output
    assert f"heterotrain API on http://127.0.0.1:{port}" in output
