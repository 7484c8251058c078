"""The test bed's pure parts: node manifests, Prometheus configuration, certificates, node lists."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID
from pydantic import ValidationError

from hetero_operator.testbed import certs
from hetero_operator.testbed.nodes import (
    GPU_RESOURCE,
    KWOK_ANNOTATION,
    LOCAL_NODE_LABEL,
    LOCAL_RUNTIME_LABEL,
    FakeNode,
    NodeList,
    node_manifest,
)
from hetero_operator.testbed.prometheus import LOOPBACK_ADDRESS, prometheus_config


def test_fake_node_manifest_carries_gpus_and_labels_and_no_taint() -> None:
    node = FakeNode.model_validate(
        {"name": "a100-0", "gpuClass": "a100", "gpus": 8, "labels": {"nvidia.com/gpu.product": "A100"}}
    )
    manifest = node_manifest(node)
    assert manifest["status"]["capacity"][GPU_RESOURCE] == "8"
    assert manifest["status"]["allocatable"][GPU_RESOURCE] == "8"
    assert manifest["metadata"]["labels"]["nvidia.com/gpu.product"] == "A100"
    assert manifest["metadata"]["annotations"][KWOK_ANNOTATION] == "fake"
    # Untainted, so the example GPUClasses (written for a real cluster) place jobs on it unchanged.
    assert "taints" not in manifest["spec"]


def test_local_node_is_not_managed_by_kwok() -> None:
    node = FakeNode(name="local-0", gpu_class="fast", gpus=1, local=True)
    manifest = node_manifest(node)
    assert KWOK_ANNOTATION not in manifest["metadata"]["annotations"]
    assert manifest["metadata"]["labels"][LOCAL_NODE_LABEL] == "true"
    assert manifest["metadata"]["labels"][LOCAL_RUNTIME_LABEL] == "process"
    container = node_manifest(FakeNode(name="c-0", gpu_class="fast", gpus=1, local=True, runtime="container"))
    assert container["metadata"]["labels"][LOCAL_RUNTIME_LABEL] == "container"


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"nodes": []}, "nodes"),
        ({"nodes": [{"name": "Bad_Name", "gpuClass": "a", "gpus": 1}]}, "name"),
        ({"nodes": [{"name": "n", "gpuClass": "a", "gpus": -1}]}, "gpus"),
        ({"nodes": [{"name": "n", "gpuClass": "a", "gpus": 1, "colour": "red"}]}, "colour"),
        (
            {"nodes": [{"name": "n", "gpuClass": "a", "gpus": 1}, {"name": "n", "gpuClass": "b", "gpus": 2}]},
            "unique",
        ),
        ({"nodes": [{"name": "n", "gpuClass": "a", "gpus": 1, "runtime": "container"}]}, "local: true"),
        ({"nodes": [{"name": "n", "gpuClass": "a", "gpus": 1, "local": True, "runtime": "vm"}]}, "runtime"),
    ],
)
def test_bad_node_lists_name_the_field(raw: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        NodeList.model_validate(raw)


def test_example_node_list_has_three_gpu_classes() -> None:
    path = Path(__file__).resolve().parents[2] / "examples" / "nodes.yaml"
    nodes = NodeList.model_validate(yaml.safe_load(path.read_text()))
    assert len({n.gpu_class for n in nodes.nodes}) >= 3


def test_prometheus_keeps_only_annotated_loopback_pods() -> None:
    config = prometheus_config(Path("/k/config"), "127.0.0.1:9090")
    pods = next(j for j in config["scrape_configs"] if j["job_name"] == "kubernetes-pods")
    assert pods["kubernetes_sd_configs"][0]["kubeconfig_file"] == "/k/config"
    keeps = [r for r in pods["relabel_configs"] if r.get("action") == "keep"]
    assert any(r["regex"] == "true" for r in keeps)
    assert any(r["regex"] == LOOPBACK_ADDRESS for r in keeps)


def test_loopback_pattern_rejects_other_addresses() -> None:
    import re

    pattern = re.compile(f"^(?:{LOOPBACK_ADDRESS})$")  # Prometheus anchors relabel regexes
    assert pattern.match("127.200.0.5:9400")
    assert not pattern.match("10.0.0.5:9400")
    assert not pattern.match("192.168.1.2:80")


def test_certificates_chain_to_the_ca_and_name_the_admin(tmp_path: Path) -> None:
    pki = certs.generate(tmp_path)
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    admin = x509.load_pem_x509_certificate(pki.admin_cert.read_bytes())
    server = x509.load_pem_x509_certificate(pki.server_cert.read_bytes())
    admin.verify_directly_issued_by(ca)
    server.verify_directly_issued_by(ca)
    assert admin.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == certs.ADMIN_USER
    assert admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:masters"
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    assert (pki.admin_key.stat().st_mode & 0o777) == 0o600


def test_local_pod_paths_map_mounts_but_not_the_hosts_own_programs(tmp_path: Path) -> None:
    import sys

    from hetero_operator.testbed.local_pods import process_plan

    pod = {
        "metadata": {"name": "w0", "namespace": "ns"},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "command": ["python", "-c", "pass", "/tmp/scratch/out"],
                    "env": [{"name": "PLAN", "value": "/etc/plan/plan.json"}],
                    "volumeMounts": [
                        {"name": "tmp", "mountPath": "/tmp"},
                        {"name": "plan", "mountPath": "/etc/plan"},
                    ],
                }
            ]
        },
    }
    volumes = {"tmp": tmp_path / "tmp", "plan": tmp_path / "plan"}
    plan = process_plan(pod, "127.10.0.2", tmp_path, volumes, {}, {}, {}, 0.5)
    # The interpreter is this host's (even when it lives under /tmp); container paths are mapped.
    assert plan.argv[0] == sys.executable
    assert plan.argv[-1] == str(tmp_path / "tmp" / "scratch" / "out")
    assert plan.env["PLAN"] == str(tmp_path / "plan" / "plan.json")
    assert plan.env["POD_IP"] == "127.10.0.2" and plan.env["HETEROTRAIN_SIMULATED_SPEED"] == "0.5"


def test_a_local_pod_waits_until_the_sibling_it_names_has_an_address(tmp_path: Path) -> None:
    import pytest

    from hetero_operator.testbed.local_pods import PodNotReadyToStart, process_plan

    master = "g0-w0.digits.team.svc"
    pod = {
        "metadata": {"name": "w1", "namespace": "team"},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "command": ["python", "-c", "pass"],
                    "env": [
                        {"name": "MASTER_ADDR", "value": master},
                        {"name": "METRICS_URL", "value": "prometheus.monitoring.svc"},  # a Service: left
                    ],
                }
            ]
        },
    }
    with pytest.raises(PodNotReadyToStart, match=master):
        process_plan(pod, "127.10.0.3", tmp_path, {}, {}, {}, {}, None)
    plan = process_plan(pod, "127.10.0.3", tmp_path, {}, {}, {}, {master: "127.10.0.2"}, None)
    assert plan.env["MASTER_ADDR"] == "127.10.0.2"
    assert plan.env["METRICS_URL"] == "prometheus.monitoring.svc"


def test_a_component_that_died_says_how(tmp_path: Path) -> None:
    import os
    import signal
    import time

    from hetero_operator.testbed import processes

    def ended(pid: int) -> str:
        deadline = time.monotonic() + 10
        while (how := processes.exit_status(pid)) is None:
            assert time.monotonic() < deadline, f"pid {pid} did not end"
            time.sleep(0.02)
        return how

    exits = processes.launch("exits", ["/bin/sh", "-c", "exit 3"], tmp_path)
    assert ended(exits.pid) == "exit code 3"
    killed = processes.launch("killed", ["/bin/sleep", "30"], tmp_path)
    assert processes.exit_status(killed.pid) is None  # still running
    os.kill(killed.pid, signal.SIGKILL)
    assert ended(killed.pid) == f"signal {signal.SIGKILL.value}"
    assert not processes.is_running(killed.pid, "/bin/sleep")
    assert processes.exit_status(killed.pid) is None  # reaped once; nothing left to tell


def test_a_launched_component_counts_as_running_from_the_moment_launch_returns(tmp_path: Path) -> None:
    # Without waiting in launch, about one launch in a hundred was called gone by the next check.
    import os
    import signal
    import time

    from hetero_operator.testbed import processes

    called_gone = 0
    for _ in range(300):
        launched = processes.launch("sleeper", ["/bin/sleep", "30"], tmp_path)
        called_gone += not processes.is_running(launched.pid, launched.binary)
        os.kill(launched.pid, signal.SIGKILL)
        while processes.exit_status(launched.pid) is None:
            time.sleep(0.001)
    assert called_gone == 0


def test_an_exit_status_survives_other_subprocesses_and_garbage_collection(tmp_path: Path) -> None:
    # The subprocess module reaps children whose Popen objects were dropped (at the next Popen, or in
    # the finaliser): a component that died during start-up was then reported with no exit status.
    import gc
    import subprocess
    import time

    from hetero_operator.testbed import processes

    exits = processes.launch("exits", ["/bin/sh", "-c", "exit 7"], tmp_path)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{exits.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the shell did not end"
        time.sleep(0.01)
    subprocess.run(["true"], check=True)
    gc.collect()
    assert processes.exit_status(exits.pid) == "exit code 7"


def test_a_downward_api_volume_holds_the_pods_annotations_as_a_kubelet_writes_them() -> None:
    from hetero_operator.testbed.local_pods import downward_api_files
    from hetero_runtime.stopping import parse_annotations

    pod = {
        "metadata": {
            "name": "w0",
            "labels": {"app": "x"},
            "annotations": {
                "b": 'say "hi"',
                "a": "1",
                "heterotrain.io/checkpoint-requested": "2026-01-01T00:00:00Z",
            },
        }
    }
    volume = {
        "name": "podinfo",
        "downwardAPI": {
            "items": [
                {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
                {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
            ]
        },
    }
    files = downward_api_files(pod, volume)
    assert files["name"] == "w0"
    # Sorted, one key="value" per line, the value quoted with its quotes escaped.
    assert files["annotations"] == (
        'a="1"\nb="say \\"hi\\""\nheterotrain.io/checkpoint-requested="2026-01-01T00:00:00Z"\n'
    )
    # The runtime reads back exactly what the pod carries.
    assert parse_annotations(files["annotations"]) == pod["metadata"]["annotations"]


def test_node_agents_side_by_side_claim_separate_pod_networks_until_they_end(tmp_path: Path) -> None:
    """Two test beds on one machine (a parallel test run) must never give two live pods one address."""
    import ipaddress

    from hetero_operator.testbed.local_pods import LOCAL_POD_NETWORK, claim_pod_network, nth_pod_ip

    first, first_claim = claim_pod_network(tmp_path)
    second, second_claim = claim_pod_network(tmp_path)
    try:
        assert first != second and not first.overlaps(second)
        assert first.subnet_of(LOCAL_POD_NETWORK) and second.subnet_of(LOCAL_POD_NETWORK)
        in_first = {nth_pod_ip(i, first) for i in range(300)}
        in_second = {nth_pod_ip(i, second) for i in range(300)}
        assert all(ipaddress.IPv4Address(a) in first for a in in_first)
        assert all(ipaddress.IPv4Address(a) in second for a in in_second)
        addresses = in_first | in_second
        assert len(addresses) == 600
        assert not any(a.endswith((".0", ".255")) for a in addresses)
    finally:
        second_claim.close()
    third, third_claim = claim_pod_network(tmp_path)  # the ended agent's part is free again
    first_claim.close()
    third_claim.close()
    assert third == second
