"""The local process node agent: a small kubelet for test-bed nodes labelled as local process nodes.

It keeps those nodes Ready (status and Lease), runs every pod bound to them on its own loopback
address, as a host process or, on a container node, as a podman container of its image under its
security context; mirrors ConfigMap and Secret volumes into directories, reports pod status like a
kubelet (Running, then Succeeded or Failed with the exit code, or Waiting with a reason), and on
deletion stops the pod (SIGTERM, grace period, SIGKILL) before removing the pod object.

Run by the test bed as `python -m hetero_operator.testbed.agent --kubeconfig K --root DIR`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from hetero_operator.plan import SIMULATED_SPEED_FILE_ENV, TERMINATION_LOG_ENV
from hetero_operator.testbed import pod_status, pod_volumes, processes
from hetero_operator.testbed.container_node import ContainerNode
from hetero_operator.testbed.containers import ContainerConfigError
from hetero_operator.testbed.local_pods import (
    PodNotReadyToStart,
    claim_pod_network,
    dns_names,
    node_slowdown,
    node_true_speed,
    nth_pod_ip,
    pod_env,
    process_plan,
    speed_for_node,
    write_speed,
)
from hetero_operator.testbed.node_heartbeat import NodeHeartbeat
from hetero_operator.testbed.nodes import CONTAINER_RUNTIME, LOCAL_NODE_LABEL, LOCAL_RUNTIME_LABEL
from hetero_operator.testbed.termination import new_termination_log, termination_message
from hetero_operator.warm_start import WarmProcess, spawn

log = logging.getLogger("heterotrain.agent")
POLL_SECONDS = 0.3
MAX_GRACE_SECONDS = 30.0
POD_NETWORK_LOCKS = "heterotrain-pod-networks"
RETRY_SECONDS = 2.0


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class RunningPod:
    uid: str
    namespace: str
    name: str
    ip: str
    directory: Path
    process: subprocess.Popen[bytes] | None = None
    started_at: str = ""
    finished: bool = False
    kill_deadline: float | None = None
    config_maps: dict[str, str] = field(default_factory=dict)  # volume dir -> ConfigMap name
    downward: dict[str, dict[str, Any]] = field(default_factory=dict)  # volume dir -> Downward API volume
    in_container: bool = False  # started by podman on a container node
    reported_running: bool = False
    retry_at: float = 0.0  # a pod that cannot start yet is tried again from then on
    waiting: tuple[str, str] | None = None  # the reason and message last reported
    node: str = ""
    speed_file: Path | None = None  # a process pod's simulated speed, re-read by its worker
    base_speed: float = 1.0  # its class's simulated speed, before its node's slowdown
    termination_log: Path | None = None  # the file behind the container's terminationMessagePath


class Agent:
    def __init__(self, api_client: client.ApiClient, root: Path, speed_scale: float = 1.0) -> None:
        # Objects from the API are handled as plain data; the client's generated types add nothing here.
        self.core: Any = client.CoreV1Api(api_client)
        self.custom: Any = client.CustomObjectsApi(api_client)
        self.root = root
        self.speed_scale = speed_scale
        self.true_speeds: dict[str, float | None] = {}  # per node, from its true-speed annotation
        self.pods: dict[str, RunningPod] = {}
        # Test beds can run side by side on one machine (a parallel test run, several users): each
        # agent hands out addresses from its own part of the local pod range, held while it lives.
        self.pod_network, self._network_claim = claim_pod_network(
            Path(tempfile.gettempdir()) / POD_NETWORK_LOCKS
        )
        self.ip_index = 0
        self.used_ips: set[str] = set()
        self.ports: dict[tuple[str, str], str] = {}
        self.heartbeat = NodeHeartbeat(self.core, client.CoordinationV1Api(api_client))
        self.stopping = False
        self.containers: ContainerNode | None = None  # created for the first pod of a container node

    # ---- nodes --------------------------------------------------------------------------------
    def local_nodes(self) -> list[Any]:
        return list(self.core.list_node(label_selector=f"{LOCAL_NODE_LABEL}=true").items)

    # ---- pods ---------------------------------------------------------------------------------
    def _next_ip(self) -> str:
        while True:
            ip = nth_pod_ip(self.ip_index, self.pod_network)
            self.ip_index += 1
            if ip not in self.used_ips:
                self.used_ips.add(ip)
                return ip

    def sync(self) -> None:
        nodes = self.local_nodes()
        if not nodes and not self.pods:
            return
        for node in nodes:
            self.heartbeat.beat(node)
        try:
            classes = self.custom.list_cluster_custom_object("heterotrain.io", "v1alpha1", "gpuclasses")[
                "items"
            ]
        except ApiException:
            classes = []  # the API is not installed yet: no simulated speeds
        all_pods: list[Any] = []
        for node in nodes:
            all_pods += self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={node.metadata.name}"
            ).items
        seen = set()
        for pod in all_pods:
            seen.add(pod.metadata.uid)
            if pod.status and pod.status.pod_ip:
                self.used_ips.add(pod.status.pod_ip)
        dns = self._dns(all_pods)
        node_labels = {n.metadata.name: dict(n.metadata.labels or {}) for n in nodes}
        slowdowns = {n.metadata.name: node_slowdown(n.metadata.annotations or {}) for n in nodes}
        self.true_speeds = {n.metadata.name: node_true_speed(n.metadata.annotations or {}) for n in nodes}
        for pod in all_pods:
            try:
                self._sync_pod(pod, dns, classes, node_labels)
            except ApiException as err:
                if err.status != 404:
                    log.warning("pod %s/%s: %s", pod.metadata.namespace, pod.metadata.name, err.reason)
        for uid in list(self.pods):
            if uid not in seen:  # deleted behind our back: make sure its process is gone
                self._kill(self.pods.pop(uid))
        for running in self.pods.values():
            if running.speed_file is not None:
                write_speed(running.speed_file, running.base_speed / slowdowns.get(running.node, 1.0))

    def _dns(self, pods: list[Any]) -> dict[str, str]:
        names: dict[str, str] = {}
        for pod in pods:
            ip = (
                self.pods[pod.metadata.uid].ip
                if pod.metadata.uid in self.pods
                else (pod.status.pod_ip if pod.status else None)
            )
            if ip:
                for name in dns_names(self.core.api_client.sanitize_for_serialization(pod)):
                    names[name] = ip
        return names

    def _sync_pod(
        self,
        pod: Any,
        dns: dict[str, str],
        classes: list[dict[str, Any]],
        node_labels: dict[str, dict[str, str]],
    ) -> None:
        uid = pod.metadata.uid
        running = self.pods.get(uid)
        if pod.metadata.deletion_timestamp is not None:
            self._delete(pod, running)
            return
        phase = pod.status.phase if pod.status else None
        if phase in ("Succeeded", "Failed"):
            return
        if running is None:
            if phase == "Running":
                # Started by an earlier agent that is gone: its process is lost, as on a node reboot.
                self._report_exit(pod, 137, "the local process node agent restarted")
                return
            running = RunningPod(
                uid,
                pod.metadata.namespace,
                pod.metadata.name,
                self._next_ip(),
                self.root / "pods" / pod.metadata.namespace / f"{pod.metadata.name}-{uid[:8]}",
            )
            self.pods[uid] = running
            # Publish the address first so that siblings can resolve this pod before it starts.
            self.core.patch_namespaced_pod_status(
                pod.metadata.name,
                pod.metadata.namespace,
                {"status": {"podIP": running.ip, "podIPs": [{"ip": running.ip}], "hostIP": "127.0.0.1"}},
            )
            dns.update(
                dict.fromkeys(dns_names(self.core.api_client.sanitize_for_serialization(pod)), running.ip)
            )
        if running.process is None:
            self._start(pod, running, dns, classes, node_labels)
            return
        self._refresh_config_maps(running)
        if running.downward:
            pod_volumes.project_downward(
                self.core.api_client.sanitize_for_serialization(pod), running.downward
            )
        code = running.process.poll()
        # A container is Running once podman has created and started it, not when `podman run` is.
        waiting = code is None and not running.reported_running and self.containers is not None
        if waiting and self.containers is not None and self.containers.is_running(running.uid):
            running.started_at = _now()
            self._report_running(pod, running)
        if code is not None and not running.finished:
            running.finished = True
            self._report_exit(pod, code, termination_message(running.termination_log), running.started_at)

    def _start(
        self,
        pod: Any,
        running: RunningPod,
        dns: dict[str, str],
        classes: list[dict[str, Any]],
        node_labels: dict[str, dict[str, str]],
    ) -> None:
        if time.monotonic() < running.retry_at:
            return
        pod_dict = self.core.api_client.sanitize_for_serialization(pod)
        running.directory.mkdir(parents=True, exist_ok=True)
        volume_dirs, running.config_maps = pod_volumes.volume_dirs(pod_dict, self.root, running.directory)
        running.downward = pod_volumes.downward_volumes(pod_dict, volume_dirs)
        stores = pod_volumes.read_stores(self.core, running.namespace)
        if not pod_volumes.mirror(pod_dict, volume_dirs, running.config_maps, stores):
            return  # a ConfigMap is not there yet; try again on the next pass
        pod_volumes.project_downward(pod_dict, running.downward)
        labels = node_labels.get(pod.spec.node_name, {})
        relative = self.true_speeds.get(pod.spec.node_name) or speed_for_node(labels, classes)
        speed = None if relative is None else relative * self.speed_scale
        port_map = self._master_port_map(pod_dict, dns)
        running.termination_log = new_termination_log(running.directory)
        try:
            if labels.get(LOCAL_RUNTIME_LABEL) == CONTAINER_RUNTIME:
                env = pod_env(pod_dict, running.ip, *stores, dns, speed, port_map)
                if self.containers is None:
                    self.containers = ContainerNode(self.root)
                launch = self.containers.launch(
                    pod_dict, running.directory, volume_dirs, env, dns, running.termination_log
                )
                (argv, process_env, cwd), running.in_container = launch, True
            else:
                plan = process_plan(
                    pod_dict, running.ip, running.directory, volume_dirs, *stores, dns, speed, port_map
                )
                argv, process_env, cwd = plan.argv, plan.env, plan.cwd
                # A process cannot have the file mounted at its container path: it is told where it is.
                process_env = {**process_env, TERMINATION_LOG_ENV: str(running.termination_log)}
                if speed is not None:
                    running.node, running.base_speed = pod.spec.node_name, speed
                    running.speed_file = running.directory / "simulated-speed"
                    write_speed(running.speed_file, speed)
                    process_env = {**process_env, SIMULATED_SPEED_FILE_ENV: str(running.speed_file)}
        except PodNotReadyToStart as why:
            log.info("pod %s/%s waits: %s", running.namespace, running.name, why)
            return
        except ContainerConfigError as err:
            self._report_waiting(pod, running, err.reason, str(err))
            return
        except ValueError as err:
            running.finished = True
            self._report_exit(pod, 128, f"cannot run as a local process: {err}")
            return
        self._spawn(pod, running, argv, process_env, cwd)

    def _spawn(self, pod: Any, running: RunningPod, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        log_path = running.directory / "container.log"
        try:
            with log_path.open("ab") as sink:
                # Warm (torch imported already) when the test run has a warm server and the pod runs
                # this environment's Python; otherwise as a fresh process.
                running.process = spawn(
                    argv,
                    env=env,
                    cwd=cwd,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
        except OSError as err:
            # Like a kubelet whose container cannot start: the pod fails with the reason (exit 127).
            running.finished = True
            self._report_exit(pod, 127, f"cannot start {argv[0]}: {err.strerror}")
            return
        # What /proc shows the process running: a warm child runs the warm server's interpreter.
        binary = sys.executable if isinstance(running.process, WarmProcess) else argv[0]
        (running.directory / "pid").write_text(json.dumps({"pid": running.process.pid, "binary": binary}))
        running.started_at = _now()
        log.info(
            "started %s/%s as pid %d on %s", running.namespace, running.name, running.process.pid, running.ip
        )
        if not running.in_container:
            self._report_running(pod, running)

    def _report_running(self, pod: Any, running: RunningPod) -> None:
        running.reported_running = True
        container = pod.spec.containers[0]
        body = pod_status.running(running.ip, running.started_at, container.name, container.image or "")
        self.core.patch_namespaced_pod_status(running.name, running.namespace, body)

    def _master_port_map(self, pod: dict[str, Any], dns: dict[str, str]) -> dict[tuple[str, str], str]:
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env") or []}
        addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
        if addr and port:
            key = (dns.get(addr, addr), port)
            if key not in self.ports:
                self.ports[key] = str(processes.free_port())
        return self.ports

    def _refresh_config_maps(self, running: RunningPod) -> None:
        for volume_dir, cm_name in running.config_maps.items():
            try:
                data = self.core.read_namespaced_config_map(cm_name, running.namespace).data or {}
            except ApiException:
                continue
            pod_volumes.write_files(Path(volume_dir), data)

    def _report_exit(self, pod: Any, code: int, message: str | None, started_at: str = "") -> None:
        container = pod.spec.containers[0]
        body = pod_status.terminated(container.name, container.image or "", code, message, started_at, _now())
        self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, body)
        log.info("pod %s/%s exited with %d", pod.metadata.namespace, pod.metadata.name, code)

    def _report_waiting(self, pod: Any, running: RunningPod, reason: str, message: str) -> None:
        running.retry_at = time.monotonic() + RETRY_SECONDS
        if running.waiting == (reason, message):
            return
        running.waiting = (reason, message)
        container = pod.spec.containers[0]
        body = pod_status.waiting(container.name, container.image or "", reason, message)
        self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, body)
        log.info("pod %s/%s waits: %s: %s", pod.metadata.namespace, pod.metadata.name, reason, message)

    def _delete(self, pod: Any, running: RunningPod | None) -> None:
        if running is not None and running.process is not None and running.process.poll() is None:
            if running.kill_deadline is None:
                grace = min(float(pod.metadata.deletion_grace_period_seconds or 30), MAX_GRACE_SECONDS)
                running.kill_deadline = time.monotonic() + grace
                self._signal(running, signal.SIGTERM)
                return
            if time.monotonic() < running.kill_deadline:
                return
            self._kill(running)
        self.pods.pop(pod.metadata.uid, None)
        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0)

    def _signal(self, running: RunningPod, signum: signal.Signals) -> None:
        """Signal the pod's process group, or its container through podman (which owns that process)."""
        if running.in_container and self.containers is not None:
            self.containers.signal(running.uid, signum)
            return
        if running.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(running.process.pid, signum)

    def _kill(self, running: RunningPod) -> None:
        if running.process is None or running.process.poll() is not None:
            return
        self._signal(running, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            running.process.wait(timeout=10)

    def shutdown(self) -> None:
        """Stop every pod (SIGTERM, then SIGKILL after 5 s); the pods are left for the API server's
        owners to clean up."""
        alive = [r for r in self.pods.values() if r.process is not None and r.process.poll() is None]
        for signum, wait_seconds in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            for running in alive:
                self._signal(running, signum)
            deadline = time.monotonic() + wait_seconds
            for running in alive:
                assert running.process is not None
                with contextlib.suppress(subprocess.TimeoutExpired):
                    running.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            alive = [r for r in alive if r.process is not None and r.process.poll() is None]

    def run(self) -> None:
        while not self.stopping:
            try:
                self.sync()
            except ApiException as err:
                log.warning("API error: %s %s", err.status, err.reason)
            except Exception:  # keep the node alive through transient faults, as a kubelet does
                log.exception("sync failed")
            time.sleep(POLL_SECONDS)
        self.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--root", required=True, type=Path)
    parser.add_argument(
        "--speed-scale",
        type=float,
        default=1.0,
        help="Multiply every simulated speed by this (time dilation, so simulated GPUs share few cores).",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    api_client = config.new_client_from_config(config_file=args.kubeconfig)
    agent = Agent(api_client, args.root, args.speed_scale)

    def stop(_signum: int, _frame: object) -> None:
        agent.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    agent.run()


if __name__ == "__main__":
    main()
