"""How a pod bound to a container node becomes `podman run`: pure functions from the pod object (and its
volumes' host directories) to podman's arguments, enforcing the pod's security context as a kubelet
does (user and group, non-root check, read-only root, capabilities, no privilege escalation).

Pods here share the host's network, as process pods do: each binds its own loopback address, which
is its pod IP, and sibling pods' DNS names are written into its /etc/hosts.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetero_operator.testbed.local_pods import expand

CONTAINER_NAME_PREFIX = "heterotrain-pod-"
POD_UID_LABEL = "heterotrain.io/pod-uid"
AGENT_ROOT_LABEL = "heterotrain.io/agent-root"
SUPPORTED_VOLUMES = ("configMap", "secret", "downwardAPI", "emptyDir", "persistentVolumeClaim")


class ContainerConfigError(ValueError):
    """The pod cannot start as written (a kubelet reports the reason and keeps it Waiting)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class SecurityContext:
    """The pod's security context with the container's on top (the container's fields win)."""

    run_as_user: int | None = None
    run_as_group: int | None = None
    run_as_non_root: bool = False
    fs_group: int | None = None
    supplemental_groups: tuple[int, ...] = ()
    read_only_root: bool = False
    privileged: bool = False
    allow_privilege_escalation: bool = True
    drop: tuple[str, ...] = ()
    add: tuple[str, ...] = ()
    seccomp: str = "RuntimeDefault"


def effective_security(pod: Mapping[str, Any], container: Mapping[str, Any]) -> SecurityContext:
    pod_level = pod.get("spec", {}).get("securityContext") or {}
    own = container.get("securityContext") or {}

    def pick(key: str) -> Any:
        return own[key] if own.get(key) is not None else pod_level.get(key)

    capabilities = own.get("capabilities") or {}
    seccomp = (own.get("seccompProfile") or pod_level.get("seccompProfile") or {}).get(
        "type", "RuntimeDefault"
    )
    return SecurityContext(
        run_as_user=pick("runAsUser"),
        run_as_group=pick("runAsGroup"),
        run_as_non_root=bool(pick("runAsNonRoot")),
        fs_group=pod_level.get("fsGroup"),
        supplemental_groups=tuple(pod_level.get("supplementalGroups") or ()),
        read_only_root=bool(own.get("readOnlyRootFilesystem")),
        privileged=bool(own.get("privileged")),
        allow_privilege_escalation=own.get("allowPrivilegeEscalation") is not False,
        drop=tuple(capabilities.get("drop") or ()),
        add=tuple(capabilities.get("add") or ()),
        seccomp=seccomp,
    )


def check_non_root(security: SecurityContext, image_user: str) -> None:
    """runAsNonRoot as a kubelet checks it: the user that will run must be known and not 0."""
    if not security.run_as_non_root:
        return
    if security.run_as_user is not None:
        if security.run_as_user == 0:
            raise ContainerConfigError(
                "CreateContainerConfigError", "container's runAsUser breaks non-root policy (runAsUser 0)"
            )
        return
    user = image_user.split(":")[0]
    if not user or user in ("0", "root"):
        raise ContainerConfigError(
            "CreateContainerConfigError", "container has runAsNonRoot and image will run as root"
        )
    if not user.isdigit():
        raise ContainerConfigError(
            "CreateContainerConfigError",
            f"container has runAsNonRoot and image has non-numeric user ({user}), cannot verify user is "
            "non-root",
        )


def security_args(security: SecurityContext) -> list[str]:
    args: list[str] = []
    if security.run_as_user is not None:
        group = "" if security.run_as_group is None else f":{security.run_as_group}"
        args.append(f"--user={security.run_as_user}{group}")
    for group_id in (security.fs_group, *security.supplemental_groups):
        if group_id is not None:
            args.append(f"--group-add={group_id}")
    if security.read_only_root:
        # podman's own tmpfs mounts on /tmp, /run and /var/tmp would undo part of a read-only root.
        args += ["--read-only", "--read-only-tmpfs=false"]
    if security.privileged:
        args.append("--privileged")
    if not security.allow_privilege_escalation:
        args.append("--security-opt=no-new-privileges")
    args += [f"--cap-drop={cap.lower()}" for cap in security.drop]
    args += [f"--cap-add={cap.lower()}" for cap in security.add]
    if security.seccomp == "Unconfined":
        args.append("--security-opt=seccomp=unconfined")
    elif security.seccomp not in ("RuntimeDefault", ""):
        raise ContainerConfigError(
            "CreateContainerConfigError", f"seccompProfile type {security.seccomp} is not supported here"
        )
    return args


_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")
_UNITS = {
    **{suffix: 1024**power for power, suffix in enumerate(("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{suffix: 1000**power for power, suffix in enumerate(("k", "M", "G", "T", "P", "E"), start=1)},
    "m": 1e-3,
}


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes quantity ("1Gi", "500M", "2") in bytes, rounded up: tmpfs takes plain byte counts."""
    match = _QUANTITY.match(quantity.strip())
    if match is None:
        raise ContainerConfigError("CreateContainerConfigError", f"sizeLimit {quantity!r} is not a quantity")
    number, suffix = match.groups()
    return max(1, math.ceil(float(number) * _UNITS[suffix or ""]))


def volume_args(pod: Mapping[str, Any], container: Mapping[str, Any], dirs: Mapping[str, Path]) -> list[str]:
    """Each volumeMount as a bind mount of its volume's host directory (ConfigMaps and Secrets
    read-only, as a kubelet mounts them) or, for an emptyDir in memory, a tmpfs."""
    volumes = {v["name"]: v for v in pod.get("spec", {}).get("volumes") or []}
    args: list[str] = []
    for mount in container.get("volumeMounts") or []:
        volume = volumes.get(mount["name"])
        if volume is None:
            raise ContainerConfigError(
                "CreateContainerConfigError", f"volumeMount {mount['name']} names no volume of the pod"
            )
        target = mount["mountPath"]
        empty_dir = volume.get("emptyDir")
        if empty_dir is not None and empty_dir.get("medium") == "Memory":
            limit = empty_dir.get("sizeLimit")
            size = f",tmpfs-size={quantity_bytes(str(limit))}" if limit else ""
            args.append(f"--mount=type=tmpfs,destination={target},tmpfs-mode=1777{size}")
            continue
        if not any(kind in volume for kind in SUPPORTED_VOLUMES):
            kinds = sorted(set(volume) - {"name"})
            raise ContainerConfigError(
                "CreateContainerConfigError",
                f"volume {mount['name']} ({', '.join(kinds)}) is not supported on container nodes: use "
                "configMap, secret, downwardAPI, emptyDir or persistentVolumeClaim",
            )
        source = dirs[mount["name"]]
        if mount.get("subPath"):
            source = source / mount["subPath"]
        read_only = bool(mount.get("readOnly")) or any(
            k in volume for k in ("configMap", "secret", "downwardAPI")
        )
        args.append(
            f"--mount=type=bind,source={source},destination={target}" + (",ro=true" if read_only else "")
        )
    return args


DEFAULT_TERMINATION_MESSAGE_PATH = "/dev/termination-log"


def termination_log_args(container: Mapping[str, Any], host_file: Path | None) -> list[str]:
    """The container's terminationMessagePath as a bind mount of a host file, as a kubelet mounts it."""
    if host_file is None:
        return []
    target = container.get("terminationMessagePath") or DEFAULT_TERMINATION_MESSAGE_PATH
    return [f"--mount=type=bind,source={host_file},destination={target}"]


def command_args(container: Mapping[str, Any], env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(entrypoint options, arguments after the image): `command` replaces the image's ENTRYPOINT
    (and drops its CMD), `args` replace its CMD."""
    command = [expand(c, env) for c in container.get("command") or []]
    args = [expand(a, env) for a in container.get("args") or []]
    if not command:
        return [], args
    return ["--entrypoint=" + json.dumps(command)], args


def container_name(pod_uid: str) -> str:
    return CONTAINER_NAME_PREFIX + pod_uid


@dataclass(frozen=True)
class RunSpec:
    """What `podman run` needs beyond the pod object."""

    pod_uid: str
    hostname: str
    env: Mapping[str, str]
    volume_dirs: Mapping[str, Path]
    hosts: Mapping[str, str]
    limits: tuple[str, ...]
    agent_root: str
    image_user: str
    termination_log: Path | None = None  # mounted at the container's terminationMessagePath


def run_argv(pod: Mapping[str, Any], container: Mapping[str, Any], spec: RunSpec) -> list[str]:
    """`podman run` for the pod's container, in the foreground: its exit status is the container's."""
    image = container.get("image")
    if not image:
        raise ContainerConfigError("InvalidImageName", "the container names no image")
    security = effective_security(pod, container)
    check_non_root(security, spec.image_user)
    entrypoint, args = command_args(container, spec.env)
    argv = [
        "run",
        "--rm",
        "--pull=never",
        f"--name={container_name(spec.pod_uid)}",
        f"--label={POD_UID_LABEL}={spec.pod_uid}",
        f"--label={AGENT_ROOT_LABEL}={spec.agent_root}",
        "--network=host",
        f"--hostname={spec.hostname}",
        "--log-driver=none",
        *spec.limits,
        *security_args(security),
        *volume_args(pod, container, spec.volume_dirs),
        *termination_log_args(container, spec.termination_log),
        *(f"--add-host={name}:{ip}" for name, ip in sorted(spec.hosts.items())),
        *(f"--env={key}={value}" for key, value in spec.env.items()),
    ]
    if container.get("workingDir"):
        argv.append(f"--workdir={container['workingDir']}")
    return [*argv, *entrypoint, image, *args]


def namespace_hosts(dns: Mapping[str, str], namespace: str) -> dict[str, str]:
    """The /etc/hosts entries a pod gets: its namespace's pod DNS names (host.subdomain.namespace...)."""
    return {name: ip for name, ip in dns.items() if name.split(".")[2:3] == [namespace]}
