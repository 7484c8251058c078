"""The test bed's Kueue pieces that need no cluster: build pin, configuration, webhooks, namespace."""

from __future__ import annotations

import base64
import ipaddress
import re
from pathlib import Path
from typing import Any

from cryptography import x509

from hetero_operator.resources import API_VERSION
from hetero_operator.testbed import build, certs, kueue, versions


def test_the_go_module_pins_the_version_the_build_stamps() -> None:
    go_mod = (versions.GO_MODULES / "kueue" / "go.mod").read_text()
    pinned = re.search(r"^require sigs\.k8s\.io/kueue (\S+)$", go_mod, re.M)
    assert pinned is not None and pinned[1] == versions.KUEUE_VERSION
    (kueue_build,) = [b for b in build.go_builds() if b.produces == ("kueue",)]
    flags = " ".join(kueue_build.args)
    assert f"version.GitVersion={versions.KUEUE_VERSION}" in flags
    assert kueue_build.directory.name.startswith(f"kueue-{versions.KUEUE_VERSION}-")


def test_config_keeps_kueue_on_loopback_without_leader_election_or_its_own_certificates() -> None:
    config = kueue.kueue_config(9443, 8081, 8443, Path("/bed/kueue/certs"))
    assert config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert config["webhook"] == {"host": "127.0.0.1", "port": 9443, "certDir": "/bed/kueue/certs"}
    assert config["health"]["healthProbeBindAddress"] == "127.0.0.1:8081"
    assert config["metrics"]["bindAddress"] == "127.0.0.1:8443"
    assert config["leaderElection"] == {"leaderElect": False}
    assert config["internalCertManagement"] == {"enable": False}
    assert config["manageJobsWithoutQueueName"] is False
    assert "pod" not in config["integrations"]["frameworks"]


def test_heterotrainjob_is_registered_as_an_external_framework_by_its_api_version() -> None:
    config = kueue.kueue_config(1, 2, 3, Path("/c"))
    group, version = API_VERSION.split("/")
    assert config["integrations"]["externalFrameworks"] == [f"HeteroTrainJob.{version}.{group}"]


def _webhook(name: str, group: str, path: str) -> dict[str, Any]:
    return {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": {"service": {"name": "webhook-service", "namespace": "system", "path": path}},
        "failurePolicy": "Fail",
        "rules": [
            {"apiGroups": [group], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["x"]}
        ],
        "sideEffects": "None",
    }


def test_only_webhooks_that_do_not_gate_pods_are_kept_and_they_call_loopback() -> None:
    manifests = [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "mutating-webhook-configuration"},
            "webhooks": [
                _webhook("mpod.kb.io", "", "/mutate--v1-pod"),
                _webhook("mdeployment.kb.io", "apps", "/mutate-apps-v1-deployment"),
                _webhook("mjob.kb.io", "batch", "/mutate-batch-v1-job"),
                _webhook("mworkload.kb.io", "kueue.x-k8s.io", "/mutate-kueue-x-k8s-io-v1beta2-workload"),
            ],
        }
    ]
    ca = b"-----BEGIN CERTIFICATE-----\nabc\n-----END CERTIFICATE-----\n"
    (configuration,) = kueue.webhook_configurations(manifests, 40123, ca)
    assert configuration["metadata"] == {"name": "kueue-mutating-webhook-configuration"}
    assert [w["name"] for w in configuration["webhooks"]] == ["mjob.kb.io", "mworkload.kb.io"]
    for webhook in configuration["webhooks"]:
        assert webhook["clientConfig"]["url"].startswith("https://127.0.0.1:40123/mutate-")
        assert base64.b64decode(webhook["clientConfig"]["caBundle"]) == ca
        assert "service" not in webhook["clientConfig"]
        assert webhook["failurePolicy"] == "Fail"


def test_kueue_starts_in_a_private_mount_namespace_with_a_user_namespace_only_without_root() -> None:
    argv = ["/bin/kueue", "--config=/c.yaml"]
    as_root = kueue.namespaced_argv(argv, Path("/s"), Path("/certs"), as_root=True)
    assert as_root[:4] == ["unshare", "--mount", "--propagation", "private"]
    assert as_root[-4:] == ["/s", "/certs", "/bin/kueue", "--config=/c.yaml"]
    script = as_root[as_root.index("-c") + 1]
    assert "-t overlay" in script and "lowerdir=/etc" in script and script.rstrip().endswith('exec "$@"')
    assert "kueue/metrics/certs" in script
    unprivileged = kueue.namespaced_argv(argv, Path("/s"), Path("/certs"), as_root=False)
    assert unprivileged[:3] == ["unshare", "--user", "--map-root-user"]


def test_the_webhook_certificate_is_signed_by_the_bed_ca_for_loopback(tmp_path: Path) -> None:
    pki = certs.generate(tmp_path / "pki")
    certs.issue_serving_cert(pki, tmp_path / "k" / "tls.crt", tmp_path / "k" / "tls.key", "kueue-webhook")
    cert = x509.load_pem_x509_certificate((tmp_path / "k" / "tls.crt").read_bytes())
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    assert cert.issuer == ca.subject
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in names.get_values_for_type(x509.IPAddress)
