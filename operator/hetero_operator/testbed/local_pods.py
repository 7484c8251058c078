"""How a pod bound to a local process node becomes a host process: pure functions from the pod object
(and what the cluster knows about it) to the argv, environment and working directory of the process.

A local process node stands in for a kubelet on a laptop: the image is ignored, the container's command
runs with the project's own Python environment, every pod gets its own loopback address, volumes become
directories, and cluster DNS names of sibling pods resolve to their loopback addresses.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from hetero_operator.plan import SIMULATED_SPEED_ENV
from hetero_operator.testbed.nodes import TRUE_SPEED_ANNOTATION

# Local pods get addresses from their own loopback range, apart from KWOK's fake pods. Each node agent
# claims one part of it, so test beds running side by side never hand out the same address.
LOCAL_POD_NETWORK = ipaddress.IPv4Network("127.10.0.0/16")
AGENT_NETWORK_PREFIX = 20  # 16 parts of 4,094 usable addresses
POD_IP_ENV = "POD_IP"
_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


class PodNotReadyToStart(Exception):
    """Something the pod refers to (a sibling's address, a ConfigMap) does not exist yet."""


@dataclass(frozen=True)
class ProcessPlan:
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    volume_dirs: dict[str, Path] = field(default_factory=dict)


def claim_pod_network(lock_dir: Path) -> tuple[ipaddress.IPv4Network, IO[str]]:
    """A part of the local pod range that no other live agent on this machine holds, and the open
    file whose exclusive lock is the claim: it ends with the process, however the process ends."""
    try:
        lock_dir.mkdir(parents=True)
        lock_dir.chmod(0o1777)  # shared by every user's agents, like /tmp itself
    except FileExistsError:
        pass
    for network in LOCAL_POD_NETWORK.subnets(new_prefix=AGENT_NETWORK_PREFIX):
        try:  # read-only, so a lock file another user created can be locked too
            handle = os.fdopen(
                os.open(lock_dir / f"{network.network_address}.lock", os.O_RDONLY | os.O_CREAT, 0o644), "r"
            )
        except PermissionError:
            continue  # another user's part, not created yet: leave it to them
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        return network, handle
    raise RuntimeError(
        f"every part of the local pod range {LOCAL_POD_NETWORK} is held by a running node agent "
        f"(locks in {lock_dir}): stop a test bed with local nodes first"
    )


def nth_pod_ip(index: int, network: ipaddress.IPv4Network) -> str:
    """The index-th usable address of `network` (skipping network and .0/.255 hosts)."""
    hosts = network.num_addresses
    candidate = index + 2
    while candidate < hosts:
        address = network.network_address + candidate
        if str(address).split(".")[-1] not in ("0", "255"):
            if index == 0:
                return str(address)
            index -= 1
        candidate += 1
    raise RuntimeError(f"the local pod addresses of {network} are exhausted")


def dns_names(pod: Mapping[str, Any]) -> list[str]:
    """The names cluster DNS gives a pod with `hostname` and `subdomain` (a headless Service)."""
    spec = pod.get("spec", {})
    hostname, subdomain = spec.get("hostname"), spec.get("subdomain")
    if not hostname or not subdomain:
        return []
    namespace = pod["metadata"].get("namespace", "default")
    base = f"{hostname}.{subdomain}"
    return [
        base,
        f"{base}.{namespace}",
        f"{base}.{namespace}.svc",
        f"{base}.{namespace}.svc.cluster.local",
    ]


# A node annotation that slows a local process node's simulated GPU down by this factor while its
# pods run (a noisy neighbour, throttling): `kubectl annotate node N testbed.heterotrain.io/slowdown=2`.
SLOWDOWN_ANNOTATION = "testbed.heterotrain.io/slowdown"


def node_true_speed(annotations: Mapping[str, str]) -> float | None:
    """The node's true simulated speed, or None when unset (or not a number in (0, 1])."""
    try:
        speed = float(annotations.get(TRUE_SPEED_ANNOTATION, ""))
    except ValueError:
        return None
    return speed if 0 < speed <= 1 else None


def node_slowdown(annotations: Mapping[str, str]) -> float:
    """The node's slowdown factor (>= 1; 1 when unset or not a number >= 1)."""
    try:
        factor = float(annotations.get(SLOWDOWN_ANNOTATION, "1"))
    except ValueError:
        return 1.0
    return factor if factor >= 1.0 else 1.0


def write_speed(path: Path, speed: float) -> None:
    """Write a pod's current simulated speed where its worker reads it (only when it changed)."""
    text = f"{speed:.6g}\n"
    if not path.exists() or path.read_text() != text:
        temporary = path.with_suffix(".tmp")
        temporary.write_text(text)
        temporary.replace(path)  # atomic: a worker never reads half a number


def speed_for_node(node_labels: Mapping[str, str], gpu_classes: Sequence[Mapping[str, Any]]) -> float | None:
    """Simulated speed of a node: its GPUClass's relativeSpeed over the fastest class's (so in (0, 1])."""
    speeds = [float(c.get("spec", {}).get("relativeSpeed", 0) or 0) for c in gpu_classes]
    fastest = max(speeds, default=0.0)
    for gpu_class, speed in zip(gpu_classes, speeds, strict=True):
        selector = gpu_class.get("spec", {}).get("nodeSelector") or {}
        if selector and all(node_labels.get(k) == v for k, v in selector.items()) and fastest > 0:
            return speed / fastest
    return None


def _field_ref(pod: Mapping[str, Any], path: str, pod_ip: str) -> str:
    meta = pod.get("metadata", {})
    simple = {
        "status.podIP": pod_ip,
        "status.hostIP": "127.0.0.1",
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": pod.get("spec", {}).get("nodeName", ""),
        "spec.serviceAccountName": pod.get("spec", {}).get("serviceAccountName", ""),
    }
    if path in simple:
        return str(simple[path])
    match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    raise ValueError(f"unsupported fieldRef {path!r}")


def downward_api_files(pod: Mapping[str, Any], volume: Mapping[str, Any]) -> dict[str, str]:
    """The files of a Downward API volume, as a kubelet writes them: labels and annotations one
    `key="value"` per line, sorted, the value a quoted string literal; other fields their value."""
    files: dict[str, str] = {}
    meta = pod.get("metadata", {})
    for item in (volume.get("downwardAPI") or {}).get("items") or []:
        path = (item.get("fieldRef") or {}).get("fieldPath", "")
        if path in ("metadata.labels", "metadata.annotations"):
            values = meta.get(path.split(".", 1)[1]) or {}
            files[item["path"]] = "".join(f"{key}={json.dumps(str(values[key]))}\n" for key in sorted(values))
        elif path:
            files[item["path"]] = _field_ref(pod, path, pod.get("status", {}).get("podIP", ""))
    return files


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: known variables are replaced, unknown references stay as written."""
    return _VAR_REF.sub(lambda m: env.get(m.group(1), m.group(0)), value)


def _rewrite_paths(value: str, mounts: Mapping[str, Path]) -> str:
    for mount_path, local in sorted(mounts.items(), key=lambda item: -len(item[0])):
        if value == mount_path or value.startswith(mount_path.rstrip("/") + "/"):
            return str(local) + value[len(mount_path.rstrip("/")) :]
    return value


def container_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    pod_ip: str,
    config_maps: Mapping[str, Mapping[str, str]],
    secrets: Mapping[str, Mapping[str, str]],
) -> dict[str, str]:
    """The container's environment as a kubelet would compute it (value, fieldRef, ConfigMap, Secret)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        if "configMapRef" in source:
            data = config_maps.get(source["configMapRef"]["name"])
            if data is None:
                raise PodNotReadyToStart(f"ConfigMap {source['configMapRef']['name']} does not exist yet")
            env.update({source.get("prefix", "") + k: v for k, v in data.items()})
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item:
            env[name] = expand(str(item["value"]), env)
            continue
        ref = item.get("valueFrom") or {}
        if "fieldRef" in ref:
            env[name] = _field_ref(pod, ref["fieldRef"]["fieldPath"], pod_ip)
        elif "configMapKeyRef" in ref or "secretKeyRef" in ref:
            kind, key_ref = (
                ("ConfigMap", ref["configMapKeyRef"])
                if "configMapKeyRef" in ref
                else ("Secret", ref["secretKeyRef"])
            )
            store = config_maps if kind == "ConfigMap" else secrets
            data = store.get(key_ref["name"])
            if data is None or key_ref["key"] not in data:
                if key_ref.get("optional"):
                    continue
                raise PodNotReadyToStart(f"{kind} {key_ref['name']} key {key_ref['key']} does not exist yet")
            env[name] = data[key_ref["key"]]
        else:
            env[name] = ""
    return env


def sibling_pod_names(env: Mapping[str, str]) -> list[str]:
    """Values that are a pod's cluster DNS name (host.subdomain.namespace.svc[.cluster.local])."""
    found = []
    for value in env.values():
        labels = value.split(".")
        if (len(labels) == 4 and labels[-1] == "svc") or (
            len(labels) == 6 and labels[-3:] == ["svc", "cluster", "local"]
        ):
            found.append(value)
    return found


def resolve_names(env: dict[str, str], names: Mapping[str, str]) -> dict[str, str]:
    """Replace values that are sibling pods' DNS names with their loopback addresses."""
    return {key: names.get(value, value) for key, value in env.items()}


def host_argv(argv: list[str]) -> list[str]:
    """Run the container's command with this project's Python environment instead of the image."""
    if not argv:
        raise ValueError("the container has no command: local process nodes ignore the image's entrypoint")
    bin_dir = Path(sys.executable).parent
    first = argv[0]
    if first in ("python", "python3") or re.fullmatch(r"python3\.\d+", first):
        return [sys.executable, *argv[1:]]
    if "/" not in first and (bin_dir / first).exists():
        return [str(bin_dir / first), *argv[1:]]
    return list(argv)


def pod_env(
    pod: Mapping[str, Any],
    pod_ip: str,
    config_maps: Mapping[str, Mapping[str, str]],
    secrets: Mapping[str, Mapping[str, str]],
    dns: Mapping[str, str],
    simulated_speed: float | None,
    port_map: Mapping[tuple[str, str], str] | None = None,
) -> dict[str, str]:
    """The first container's environment on a local node, process or container: sibling pods' names
    resolved to their addresses, the rendezvous port made unique, the pod's address and speed added."""
    containers = pod.get("spec", {}).get("containers") or []
    if not containers:
        raise ValueError("the pod has no containers")
    env = container_env(pod, containers[0], pod_ip, config_maps, secrets)
    env = resolve_names(env, dns)
    unresolved = sibling_pod_names(env)
    if unresolved:
        # As before cluster DNS has the record: starting now would bake in a name no host resolver knows.
        raise PodNotReadyToStart(f"{unresolved[0]} has no address yet")
    if port_map and "MASTER_ADDR" in env and "MASTER_PORT" in env:
        # Pods here share one network namespace: a job's rendezvous port is made unique per master.
        env["MASTER_PORT"] = port_map.get((env["MASTER_ADDR"], env["MASTER_PORT"]), env["MASTER_PORT"])
    env.setdefault(POD_IP_ENV, pod_ip)
    if simulated_speed is not None:
        env.setdefault(SIMULATED_SPEED_ENV, f"{simulated_speed:g}")
    env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


def process_plan(
    pod: Mapping[str, Any],
    pod_ip: str,
    pod_dir: Path,
    volume_dirs: Mapping[str, Path],
    config_maps: Mapping[str, Mapping[str, str]],
    secrets: Mapping[str, Mapping[str, str]],
    dns: Mapping[str, str],
    simulated_speed: float | None,
    port_map: Mapping[tuple[str, str], str] | None = None,
) -> ProcessPlan:
    """Everything needed to start the pod's first container as a host process."""
    env = pod_env(pod, pod_ip, config_maps, secrets, dns, simulated_speed, port_map)
    container = pod["spec"]["containers"][0]
    mounts = {
        m["mountPath"]: volume_dirs[m["name"]]
        for m in container.get("volumeMounts") or []
        if m["name"] in volume_dirs
    }
    env = {k: _rewrite_paths(v, mounts) for k, v in env.items()}
    raw_argv = [*(container.get("command") or []), *(container.get("args") or [])]
    # Container paths are rewritten before the command is mapped onto this host's Python environment:
    # the host's own paths (which may lie under a mounted directory such as /tmp) stay as they are.
    argv = host_argv([_rewrite_paths(expand(a, env), mounts) for a in raw_argv])
    bin_dir = str(Path(sys.executable).parent)
    base_env = {
        "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(pod_dir),
        "PYTHONUNBUFFERED": "1",
    }
    if os.environ.get("PYTHONPATH"):
        # A checkout run through PYTHONPATH (not the installed one) runs its pods from the same sources.
        base_env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    working_dir = container.get("workingDir")
    cwd = Path(_rewrite_paths(working_dir, mounts)) if working_dir else pod_dir
    return ProcessPlan(argv=argv, env={**base_env, **env}, cwd=cwd, volume_dirs=dict(volume_dirs))
