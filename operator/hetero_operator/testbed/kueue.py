"""Kueue in the test bed: its CRDs, its controller manager on loopback, and its webhooks.

Kueue expects to run in a pod behind a Service, with certificates mounted under /etc/kueue. Here it
runs as a host process instead:
- its webhooks listen on 127.0.0.1 with a certificate from the test bed's CA, and the webhook
  configurations call them by URL (the API server here cannot route to a Service);
- only the webhooks of Kueue's own objects and of batch Jobs are installed: the Pod, Deployment and
  StatefulSet webhooks would gate every pod of the bed, and their integrations are off;
- the metrics server reads a certificate from a hard-coded /etc/kueue/metrics/certs when Kueue does
  not issue its own, so Kueue starts in a private mount namespace whose /etc is the host's /etc
  with that directory laid over it (the host's /etc is never written);
- leader election is off; the visibility server, which needs certificates of its own under a
  hard-coded path, is off.
"""

from __future__ import annotations

import base64
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from hetero_operator.testbed import build, certs, processes
from hetero_operator.testbed.cluster import Testbed, TestbedError

NAMESPACE = "kueue-system"
COMPONENT = "kueue"
# HeteroTrainJob registered as a framework Kueue does not reconcile itself: Kueue then knows that
# pods whose controller is a HeteroTrainJob belong to a job that manages its own Workload.
HETEROTRAIN_FRAMEWORK = "HeteroTrainJob.v1alpha1.heterotrain.io"
FRAMEWORKS = ("batch/job",)
# Webhooks kept: Kueue's own objects, and batch Jobs (the integration left on). None gates pods.
WEBHOOK_GROUPS = frozenset({"kueue.x-k8s.io", "batch"})
_METRICS_CERT_DIR = "kueue/metrics/certs"  # under /etc, where Kueue looks for it

# Runs in the new mount namespace: a tmpfs holds an upper layer with the metrics certificate, an
# overlay puts it over /etc, then the shell becomes Kueue. Arguments: scratch dir, cert dir, argv.
_NAMESPACE_SCRIPT = f"""set -e
scratch=$1; certs=$2; shift 2
mount -t tmpfs -o mode=0700 heterotrain-kueue "$scratch"
mkdir -p "$scratch/upper/{_METRICS_CERT_DIR}" "$scratch/work"
cp "$certs/tls.crt" "$certs/tls.key" "$scratch/upper/{_METRICS_CERT_DIR}/"
mount -t overlay heterotrain-kueue-etc -o "lowerdir=/etc,upperdir=$scratch/upper,workdir=$scratch/work" /etc
exec "$@"
"""


def manifests_dir() -> Path:
    """Kueue's CRDs and webhook configuration, copied from its module beside its binary."""
    return build.binary("kueue").parent


def crd_files() -> list[Path]:
    return sorted((manifests_dir() / build.KUEUE_CRD_DIR).glob("*.yaml"))


def kueue_config(webhook_port: int, health_port: int, metrics_port: int, cert_dir: Path) -> dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2) for one test bed."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": list(FRAMEWORKS), "externalFrameworks": [HETEROTRAIN_FRAMEWORK]},
        "featureGates": {"VisibilityOnDemand": False},
    }


def _kept(webhook: dict[str, Any]) -> bool:
    groups = {group for rule in webhook.get("rules") or [] for group in rule.get("apiGroups") or []}
    return bool(groups) and groups <= WEBHOOK_GROUPS


def webhook_configurations(manifests: list[dict[str, Any]], port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """Kueue's webhook configurations with only the kept webhooks, each calling Kueue on loopback."""
    ca_bundle = base64.b64encode(ca_pem).decode()
    result = []
    for manifest in manifests:
        webhooks = []
        for webhook in manifest.get("webhooks") or []:
            if not _kept(webhook):
                continue
            path = webhook["clientConfig"]["service"]["path"]
            url = f"https://127.0.0.1:{port}{path}"
            webhooks.append({**webhook, "clientConfig": {"url": url, "caBundle": ca_bundle}})
        name = f"kueue-{manifest['metadata']['name']}"  # as Kueue's own install names them
        result.append({**manifest, "metadata": {"name": name}, "webhooks": webhooks})
    return result


def namespaced_argv(argv: list[str], scratch: Path, cert_dir: Path, as_root: bool) -> list[str]:
    """`argv` started in a private mount namespace with the metrics certificate under /etc/kueue.
    Without root, a user namespace maps the caller to root inside it, which may mount there."""
    unshare = ["unshare", "--mount", "--propagation", "private"]
    if not as_root:
        unshare[1:1] = ["--user", "--map-root-user"]
    return [*unshare, "sh", "-c", _NAMESPACE_SCRIPT, "sh", str(scratch), str(cert_dir), *argv]


def start(bed: Testbed, on_step: Callable[[str], None] | None = None) -> None:
    """Install Kueue's CRDs and start Kueue on a running test bed (nothing when it already runs)."""
    say = on_step or (lambda _msg: None)
    if bed.component_status().get(COMPONENT):
        say("Kueue already running")
        return
    build.build_all(on_step=say)
    say("installing Kueue's CRDs")
    _install_crds(bed)
    bed.apply_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}])
    ports = _allocate_ports(bed)
    say("starting Kueue")
    binary = str(build.binary("kueue"))
    bed.run_component(COMPONENT, _argv(bed, binary, ports), binary=binary)
    bed.wait_for(lambda: _ready(ports["kueue_health"]), COMPONENT, 90)
    # Only now: a webhook configuration that points at a Kueue not yet serving would refuse objects.
    manifests = (manifests_dir() / build.KUEUE_WEBHOOK_DIR / "manifests.yaml").read_text()
    ca = bed.pki.ca_cert.read_bytes()
    documents = [m for m in yaml.safe_load_all(manifests) if m]
    bed.apply_objects(webhook_configurations(documents, ports["kueue_webhook"], ca))


def _allocate_ports(bed: Testbed) -> dict[str, int]:
    state = bed.state
    if state is None:
        raise TestbedError(f"the test bed in {bed.root} is not up; run `heterotrain testbed up`")
    for name in ("kueue_webhook", "kueue_health", "kueue_metrics"):
        state.ports[name] = processes.free_port()
    state.save(bed.state_file)
    return state.ports


def _argv(bed: Testbed, binary: str, ports: dict[str, int]) -> list[str]:
    """Write Kueue's certificate and configuration under `<bed>/kueue` and return its command line."""
    home = bed.root / "kueue"
    shutil.rmtree(home, ignore_errors=True)
    cert_dir, scratch = home / "certs", home / "namespace"
    scratch.mkdir(parents=True)
    certs.issue_serving_cert(bed.pki, cert_dir / "tls.crt", cert_dir / "tls.key", "kueue-webhook")
    config = home / "config.yaml"
    settings = kueue_config(ports["kueue_webhook"], ports["kueue_health"], ports["kueue_metrics"], cert_dir)
    config.write_text(yaml.safe_dump(settings))
    argv = [binary, f"--config={config}", f"--kubeconfig={bed.kubeconfig}", "--zap-log-level=info"]
    return namespaced_argv(argv, scratch, cert_dir, as_root=os.geteuid() == 0)


def _install_crds(bed: Testbed) -> None:
    directory = manifests_dir() / build.KUEUE_CRD_DIR
    if not crd_files():
        raise TestbedError(f"no Kueue CRDs in {directory}; rebuild with `heterotrain testbed build`")
    # v1beta2 is the storage version; no conversion webhook runs here, so clients use v1beta2 only.
    bed.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(directory))
    bed.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(directory))


def _ready(health_port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{health_port}/readyz", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False
