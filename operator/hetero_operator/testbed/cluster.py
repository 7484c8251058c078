"""The test bed as one object: start it, wait for it, use it, stop it.

Everything listens on 127.0.0.1 with ports the kernel hands out. What was started is recorded in
`state.json` under the test bed's directory, so `up` is idempotent across commands and `down` stops
exactly the processes this test bed started.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import yaml

from hetero_operator.testbed import build, certs, processes
from hetero_operator.testbed.container_node import remove_leftovers
from hetero_operator.testbed.kubeconfig import write_kubeconfig
from hetero_operator.testbed.nodes import NodeList, node_manifest
from hetero_operator.testbed.prometheus import prometheus_config
from hetero_operator.testbed.versions import REPO_ROOT, cache_root
from hetero_operator.warm_start import log_start

STAGES_FILE = Path(__file__).with_name("kwok-stages.yaml")
CRD_DIR = REPO_ROOT / "crds"
# A cluster IP range is required by the API server; nothing is ever routed to it.
SERVICE_CIDR = "10.96.0.0/24"
# Fake pods get addresses from a loopback range, so a stray scrape can never leave the machine.
FAKE_POD_CIDR = "127.200.0.0/16"
# Local process nodes run every simulated GPU at a quarter of its class's relativeSpeed (as a share of
# one CPU core). Three or more simulated GPUs then share this machine's cores without slowing each
# other down, so their speeds keep the ratios their GPUClasses give (1 : 0.5 : 0.25 stays exact).
LOCAL_SPEED_SCALE = 0.25


def default_root() -> Path:
    return cache_root() / "clusters" / "default"


@dataclass
class State:
    ports: dict[str, int]
    processes: dict[str, dict[str, Any]] = field(default_factory=dict)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> State | None:
        if not path.exists():
            return None
        raw = json.loads(path.read_text())
        return cls(ports=raw["ports"], processes=raw["processes"])


# The control plane's Go processes collect garbage when their heap has grown 4x instead of 2x: at
# a thousand nodes the API server spent a fifth of its CPU in the collector, and this host has
# memory to spare but only two cores.
COMPONENT_ENV = {"GOGC": "400"}

# A kubelet's default node lease (KWOK renews it every quarter of that).
NODE_LEASE_SECONDS = 40


class TestbedError(RuntimeError):
    """A test-bed component failed to start; the message says which and where its log is."""


class Testbed:
    """A local Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager), KWOK and
    Prometheus, rooted in one directory that holds certificates, data, logs and the kubeconfig."""

    __test__ = False  # not a pytest test class

    def __init__(self, root: Path | None = None, node_lease_seconds: int = NODE_LEASE_SECONDS) -> None:
        """`node_lease_seconds`: how long a fake node's lease lasts; KWOK renews it every quarter of
        that, as a kubelet does, so 1,000 nodes at the default send 100 lease writes a second."""
        self.root = (root or default_root()).resolve()
        self.node_lease_seconds = node_lease_seconds
        self.pki_dir = self.root / "pki"
        self.logs = self.root / "logs"
        self.kubeconfig = self.root / "kubeconfig"
        self.state_file = self.root / "state.json"
        self.operator_targets = self.root / "operator-targets.json"

    # ---- queries -------------------------------------------------------------------------------
    @property
    def state(self) -> State | None:
        return State.load(self.state_file)

    @property
    def apiserver_url(self) -> str:
        state = self._require_state()
        return f"https://127.0.0.1:{state.ports['apiserver']}"

    @property
    def prometheus_url(self) -> str:
        state = self._require_state()
        return f"http://127.0.0.1:{state.ports['prometheus']}"

    def _require_state(self) -> State:
        state = self.state
        if state is None:
            raise TestbedError(f"the test bed in {self.root} is not up; run `heterotrain testbed up`")
        return state

    def component_status(self) -> dict[str, bool]:
        state = self.state
        if state is None:
            return {}
        return {
            name: processes.is_running(info["pid"], info["binary"]) for name, info in state.processes.items()
        }

    def is_up(self) -> bool:
        status = self.component_status()
        return bool(status) and all(status.values()) and self._apiserver_ready()

    def _apiserver_ready(self) -> bool:
        try:
            return self._api_get("/readyz").status_code == 200
        except (httpx.HTTPError, OSError, TestbedError):
            return False

    def _api_get(self, path: str) -> httpx.Response:
        pki = self._pki_paths()
        tls = ssl.create_default_context(cafile=str(pki.ca_cert))
        tls.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
        with httpx.Client(verify=tls, timeout=3.0) as client:
            return client.get(self.apiserver_url + path)

    def _pki_paths(self) -> certs.Pki:
        d = self.pki_dir
        return certs.Pki(
            ca_cert=d / "ca.crt",
            ca_key=d / "ca.key",
            server_cert=d / "apiserver.crt",
            server_key=d / "apiserver.key",
            admin_cert=d / "admin.crt",
            admin_key=d / "admin.key",
            sa_key=d / "sa.key",
            sa_pub=d / "sa.pub",
        )

    # ---- kubectl ------------------------------------------------------------------------------
    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """Run the test bed's kubectl against this cluster. Raises with stderr when `check` fails."""
        result = subprocess.run(
            [str(build.binary("kubectl")), "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise subprocess.CalledProcessError(
                result.returncode, result.args, output=result.stdout, stderr=result.stderr
            )
        return result

    def apply_objects(self, objects: list[dict[str, Any]]) -> None:
        self.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(objects)
        )

    # ---- lifecycle ----------------------------------------------------------------------------
    def up(self, nodes: NodeList | None = None, on_step: Callable[[str], None] | None = None) -> None:
        """Start the test bed (or keep the one that is already up) and create `nodes`."""
        say = on_step or (lambda _msg: None)
        if self.is_up():
            say("test bed already up")
        else:
            self.down(quiet=True)
            build.build_all(on_step=say)
            log_start("bed", os.getpid(), str(self.root))
            self._start(say)
        self.install_crds()
        if nodes is not None:
            say(f"creating {len(nodes.nodes)} GPU nodes")
            self.apply_nodes(nodes)

    def _start(self, say: Callable[[str], None]) -> None:
        for sub in ("pki", "etcd", "prometheus"):
            shutil.rmtree(self.root / sub, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)
        names = ("etcd_client", "etcd_peer", "apiserver", "kwok", "prometheus")
        state = State(ports={name: processes.free_port() for name in names})
        state.save(self.state_file)
        say("generating certificates")
        pki = certs.generate(self.pki_dir)
        write_kubeconfig(self.kubeconfig, f"https://127.0.0.1:{state.ports['apiserver']}", pki)

        def start(name: str, argv: list[str]) -> None:
            self.run_component(name, argv, state=state)

        say("starting etcd")
        start("etcd", self._etcd_argv(state))
        self._wait(lambda: self._http_ok(f"http://127.0.0.1:{state.ports['etcd_client']}/health"), "etcd", 30)
        say("starting kube-apiserver")
        start("kube-apiserver", self._apiserver_argv(state, pki))
        self._wait(self._apiserver_ready, "kube-apiserver", 90)
        say("starting kube-controller-manager, KWOK and Prometheus")
        start("kube-controller-manager", self._controller_manager_argv(pki))
        start("kwok", self._kwok_argv(state))
        start("agent", self._agent_argv())
        self.scrape_operator(None)
        prom_config = self.root / "prometheus.yml"
        prom_config.write_text(
            yaml.safe_dump(
                prometheus_config(
                    self.kubeconfig, f"127.0.0.1:{state.ports['prometheus']}", self.operator_targets
                )
            )
        )
        start("prometheus", self._prometheus_argv(state, prom_config))
        self._wait(lambda: self._http_ok(f"{self.prometheus_url}/-/ready"), "prometheus", 60)

    def run_component(
        self, name: str, argv: list[str], binary: str | None = None, state: State | None = None
    ) -> None:
        """Start one long-running process and record it, so `status` watches it and `down` stops it.

        `binary`: the program the process ends up running when `argv[0]` only prepares its
        environment and then execs it (it is what a recycled pid is told apart by)."""
        state = state or self._require_state()
        launched = processes.launch(name, argv, self.logs, COMPONENT_ENV)
        program = binary or launched.binary
        if program != launched.binary:
            processes.wait_for_exec(launched.pid, program)
        state.processes[name] = {"pid": launched.pid, "binary": program, "log": str(launched.log)}
        state.save(self.state_file)

    def wait_for(self, ready: Callable[[], bool], name: str, timeout: float) -> None:
        """Wait until `ready()`; raise with the tail of the component's log if it exits or times out."""
        self._wait(ready, name, timeout)

    @property
    def pki(self) -> certs.Pki:
        return self._pki_paths()

    def _wait(self, ready: Callable[[], bool], name: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            info = (self.state or State(ports={})).processes.get(name)
            if info and not processes.is_running(info["pid"], info["binary"]):
                how = processes.exit_status(info["pid"]) or "no exit status (not our child)"
                raise TestbedError(
                    f"{name} (pid {info['pid']}) exited during start-up ({how}); log: {info['log']}\n"
                    f"{_tail(Path(info['log']))}"
                )
            time.sleep(0.3)
        log = self.logs / f"{name}.log"
        raise TestbedError(f"{name} was not ready within {timeout:.0f}s; log: {log}\n{_tail(log)}")

    @staticmethod
    def _http_ok(url: str) -> bool:
        try:
            return httpx.get(url, timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def down(self, quiet: bool = False) -> None:
        """Stop every process this test bed started (in reverse order) and forget its state."""
        state = self.state
        if state is None:
            return
        for _name, info in reversed(list(state.processes.items())):
            processes.stop(info["pid"], info["binary"])
        remove_leftovers(self.root / "local-pods")
        self.state_file.unlink(missing_ok=True)
        for sub in ("etcd", "prometheus", "kueue"):
            shutil.rmtree(self.root / sub, ignore_errors=True)

    def scrape_operator(self, address: str | None) -> None:
        """Have Prometheus scrape an operator running on this machine (None: stop scraping it)."""
        targets = [{"targets": [address], "labels": {"component": "operator"}}] if address else []
        scratch = self.operator_targets.with_suffix(".tmp")
        scratch.write_text(json.dumps(targets))
        scratch.replace(self.operator_targets)

    def stop_component(self, name: str) -> None:
        """Stop one component (fault injection); `start_component` brings it back with the same ports."""
        state = self._require_state()
        info = state.processes[name]
        processes.stop(info["pid"], info["binary"])

    def start_component(self, name: str, timeout: float = 60.0) -> None:
        state = self._require_state()
        argv = {"prometheus": lambda: self._prometheus_argv(state, self.root / "prometheus.yml")}[name]()
        launched = processes.launch(name, argv, self.logs, COMPONENT_ENV)
        state.processes[name] = {"pid": launched.pid, "binary": launched.binary, "log": str(launched.log)}
        state.save(self.state_file)
        self._wait(lambda: self._http_ok(f"{self.prometheus_url}/-/ready"), name, timeout)

    # ---- cluster content ----------------------------------------------------------------------
    def install_crds(self) -> None:
        files = sorted(CRD_DIR.glob("*.yaml"))
        if not files:
            return
        for crd in files:
            self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s", *(f"-f={f}" for f in files))
        # Established is not yet listable: a new resource's storage initializes after it, and until
        # then a list is refused (429, "storage is (re)initializing").
        for crd in files:
            spec = yaml.safe_load(crd.read_text())["spec"]
            version = next(v["name"] for v in spec["versions"] if v.get("storage"))
            path = f"/apis/{spec['group']}/{version}/{spec['names']['plural']}?limit=1"
            self._wait(partial(self._lists, path), path, 60.0)

    def _lists(self, path: str) -> bool:
        return self.kubectl("get", "--raw", path, check=False).returncode == 0

    def apply_nodes(self, nodes: NodeList, timeout: float = 60.0) -> None:
        manifests = [node_manifest(n) for n in nodes.nodes]
        self.kubectl("create", "-f", "-", input=yaml.safe_dump_all(manifests), check=False)
        names = [m["metadata"]["name"] for m in manifests]
        fake = [n.name for n in nodes.nodes if not n.local]
        if fake:
            self.kubectl(
                "wait", "--for=condition=Ready", f"--timeout={timeout:.0f}s", *(f"node/{n}" for n in fake)
            )
        missing = set(names) - set(
            self.kubectl("get", "nodes", "-o", "name").stdout.replace("node/", "").split()
        )
        if missing:
            raise TestbedError(f"nodes were not created: {sorted(missing)}")

    # ---- argv builders (pure) -----------------------------------------------------------------
    def _etcd_argv(self, state: State) -> list[str]:
        client = f"http://127.0.0.1:{state.ports['etcd_client']}"
        peer = f"http://127.0.0.1:{state.ports['etcd_peer']}"
        return [
            str(build.binary("etcd")),
            "--name=testbed",
            f"--data-dir={self.root / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=testbed={peer}",
            "--unsafe-no-fsync=true",
            "--auto-compaction-retention=1",
            "--quota-backend-bytes=4294967296",
            "--log-level=warn",
        ]

    def _apiserver_argv(self, state: State, pki: certs.Pki) -> list[str]:
        port = state.ports["apiserver"]
        return [
            str(build.binary("kube-apiserver")),
            f"--etcd-servers=http://127.0.0.1:{state.ports['etcd_client']}",
            f"--secure-port={port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            # The `kubernetes` Service endpoint cannot be a loopback address; nothing needs it here.
            "--endpoint-reconciler-type=none",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--tls-cert-file={pki.server_cert}",
            f"--tls-private-key-file={pki.server_key}",
            f"--client-ca-file={pki.ca_cert}",
            "--authorization-mode=RBAC",
            f"--service-account-issuer=https://127.0.0.1:{port}",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            # No kubelet creates default ServiceAccounts on time for the first pods of a namespace.
            "--disable-admission-plugins=ServiceAccount",
            "--allow-privileged=true",
            "--enable-priority-and-fairness=false",
            "--max-requests-inflight=0",
            "--max-mutating-requests-inflight=0",
            f"--cert-dir={self.pki_dir}",
            "--v=1",
        ]

    def _controller_manager_argv(self, pki: certs.Pki) -> list[str]:
        return [
            str(build.binary("kube-controller-manager")),
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            f"--root-ca-file={pki.ca_cert}",
            f"--service-account-private-key-file={pki.sa_key}",
            "--use-service-account-credentials=false",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            "--secure-port=0",
            # Nodes have no pod CIDRs and no cloud; pod IPs are loopback addresses, which Endpoints and
            # EndpointSlices refuse (their controllers would retry every headless Service forever).
            # Everything else (GC, namespaces, node lifecycle) runs.
            "--controllers=*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,-route,"
            "-endpoint,-endpointslice,-endpointslicemirroring",
            # A node is lost once its lease is this old (the default, 50 s, fits the default lease).
            f"--node-monitor-grace-period={max(50, self.node_lease_seconds + 10)}s",
            "--v=1",
        ]

    def _kwok_argv(self, state: State) -> list[str]:
        return [
            str(build.binary("kwok")),
            f"--kubeconfig={self.kubeconfig}",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            f"--config={STAGES_FILE}",
            f"--node-lease-duration-seconds={self.node_lease_seconds}",
            "--node-ip=127.0.0.1",
            f"--cidr={FAKE_POD_CIDR}",
            f"--server-address=127.0.0.1:{state.ports['kwok']}",
        ]

    def _agent_argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "hetero_operator.testbed.agent",
            f"--kubeconfig={self.kubeconfig}",
            f"--root={self.root / 'local-pods'}",
            f"--speed-scale={LOCAL_SPEED_SCALE}",
        ]

    def _prometheus_argv(self, state: State, config: Path) -> list[str]:
        return [
            str(build.binary("prometheus")),
            f"--config.file={config}",
            f"--storage.tsdb.path={self.root / 'prometheus'}",
            f"--web.listen-address=127.0.0.1:{state.ports['prometheus']}",
            "--web.enable-lifecycle",
            "--storage.tsdb.retention.time=2h",
            "--log.level=warn",
        ]


def _tail(log: Path, lines: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"
