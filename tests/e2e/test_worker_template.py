"""A job's `spec.template`, live: the operator merges it into the worker pods it creates, the API
server stores them, and the local process nodes run them like a kubelet, so each worker sees the
template's ConfigMap volume, its `envFrom`, its variables (expanded after the operator's) and its
annotation beside everything the operator sets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.operator.live import Jobs, OperatorProcess, jobs_in

from hetero_operator import plan as contract
from hetero_operator.controller import names
from hetero_operator.testbed.cluster import Testbed

pytestmark = [pytest.mark.testbed, pytest.mark.slow, pytest.mark.timeout(600)]

MOTD = "checkpoints go to the shared claim\n"
# What each worker prints: what it sees of the template, and the operator's own variables.
REPORT = f"""
import json, os
report = {{key: os.environ.get(key) for key in ("RANK", "WORLD_SIZE", "GREETING", "TAGGED_RANK")}}
report["motd"] = open(os.environ["MOTD_FILE"]).read()
report["annotations"] = open(os.environ["{contract.POD_ANNOTATIONS_FILE_ENV}"]).read()
print("REPORT " + json.dumps(report))
"""


@pytest.fixture(scope="module")
def testbed(bed: Testbed) -> Testbed:
    """This module's own test bed (the e2e modules' `bed`): three local process nodes, which run their
    pods as processes; named `testbed` so that the shared `namespace` fixture makes its namespace here."""
    return bed


def config_map(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def worker_reports(bed: Testbed, namespace: str, pod: dict[str, Any]) -> list[dict[str, Any]]:
    """The REPORT lines the pod's process printed (the agent keeps its output in the pod's directory)."""
    meta = pod["metadata"]
    log = bed.root / "local-pods" / "pods" / namespace / f"{meta['name']}-{meta['uid'][:8]}" / "container.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return [json.loads(line.removeprefix("REPORT ")) for line in lines if line.startswith("REPORT ")]


def test_a_worker_sees_what_the_template_adds_and_the_job_succeeds(
    testbed: Testbed, namespace: str, tmp_path: Path
) -> None:
    jobs = Jobs(testbed, namespace)
    template = {
        "metadata": {"labels": {"team": "vision"}, "annotations": {"example.com/owner": "alice"}},
        "spec": {
            "volumes": [{"name": "extra", "configMap": {"name": "motd"}}],
            "containers": [
                {
                    "name": "worker",
                    "volumeMounts": [{"name": "extra", "mountPath": "/etc/extra", "readOnly": True}],
                    "envFrom": [{"configMapRef": {"name": "train-env"}}],
                    "env": [
                        {"name": "TAGGED_RANK", "value": "rank-$(RANK)"},
                        {"name": "MOTD_FILE", "value": "/etc/extra/motd"},
                    ],
                }
            ],
        },
    }
    manifest = jobs.manifest(
        "templated",
        gpus=2,
        command=["python", "-c", REPORT],
        gpuClasses=["fast", "medium", "slow"],
        template=template,
        restartPolicy={"maxRestarts": 0, "backoffSeconds": 0},
    )
    jobs.apply(config_map("motd", {"motd": MOTD}), config_map("train-env", {"GREETING": "hello"}))
    operator = OperatorProcess(testbed, tmp_path / "operator.log")
    operator.start()
    try:
        with jobs_in(testbed, namespace, timeout=60, until_gone=True):
            jobs.apply(manifest)
            final = jobs.wait_phase("templated", "Succeeded", timeout=120)
            pods = jobs.pods("templated")
    finally:
        operator.stop()
        print(f"--- operator log ---\n{operator.tail(40)}")
    assert final["phase"] == "Succeeded"
    assert [p["metadata"]["name"] for p in pods] == ["templated-g0-w0", "templated-g0-w1"]

    # What each worker saw: the template's volume, envFrom, variables and annotation, and the
    # operator's RANK and WORLD_SIZE beside them.
    for rank, pod in enumerate(pods):
        assert pod["status"]["phase"] == "Succeeded"
        reports = worker_reports(testbed, namespace, pod)
        assert len(reports) == 1, reports
        (report,) = reports
        assert report["RANK"] == str(rank) and report["WORLD_SIZE"] == "2"
        assert report["TAGGED_RANK"] == f"rank-{rank}", "template variables expand the operator's"
        assert report["GREETING"] == "hello"
        assert report["motd"] == MOTD
        assert 'example.com/owner="alice"' in report["annotations"].splitlines()

    # The pods the API server stored: the template's fields merged beside the operator's.
    for rank, pod in enumerate(pods):
        meta, spec = pod["metadata"], pod["spec"]
        assert meta["labels"]["team"] == "vision"
        assert meta["labels"][names.LABEL_JOB] == "templated"
        assert meta["labels"][names.LABEL_RANK] == str(rank)
        assert meta["annotations"]["example.com/owner"] == "alice"
        assert meta["annotations"]["prometheus.io/scrape"] == "true"
        assert {"plan", "podinfo", "tmp", "dshm", "extra"} <= {v["name"] for v in spec["volumes"]}
        assert {"name": "extra", "configMap": {"name": "motd", "defaultMode": 420}} in spec["volumes"]
        (worker,) = spec["containers"]
        assert worker["name"] == "worker" and worker["command"] == ["python", "-c", REPORT]
        assert worker["envFrom"] == [{"configMapRef": {"name": "train-env"}}]
        mounts = {m["name"]: m["mountPath"] for m in worker["volumeMounts"]}
        assert mounts["extra"] == "/etc/extra" and "plan" in mounts and "podinfo" in mounts
        env = [e["name"] for e in worker["env"]]
        assert {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"} <= set(env)
        assert env.index("RANK") < env.index("TAGGED_RANK"), "the template's variables come after"
