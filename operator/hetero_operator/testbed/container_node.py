"""The container side of the local node agent: starts a pod's container with `podman run` (runc),
prepares its volumes' ownership as a kubelet does, signals and removes its containers."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hetero_operator.testbed.container_store import Engine, ulimit_args
from hetero_operator.testbed.containers import (
    AGENT_ROOT_LABEL,
    ContainerConfigError,
    RunSpec,
    container_name,
    namespace_hosts,
    run_argv,
)

WRITABLE_VOLUMES = ("emptyDir", "persistentVolumeClaim")
USED_MARKER = "containers-used"  # in the agent's root: it has started containers


def prepare_volumes(pod: Mapping[str, Any], dirs: Mapping[str, Path]) -> None:
    """Writable volumes are world-writable (an emptyDir's default mode, 0777) and, with an fsGroup,
    owned by that group with the set-group-id bit on their directories, as a kubelet leaves them."""
    spec = pod.get("spec", {})
    fs_group = (spec.get("securityContext") or {}).get("fsGroup")
    for volume in spec.get("volumes") or []:
        path = dirs.get(volume["name"])
        if path is None:
            continue
        writable = any(kind in volume for kind in WRITABLE_VOLUMES)
        if writable:
            path.chmod(0o777)
        if fs_group is None:
            continue
        for entry in [path, *path.rglob("*")]:
            os.chown(entry, -1, int(fs_group), follow_symlinks=False)
            if writable and entry.is_dir() and not entry.is_symlink():
                entry.chmod(entry.stat().st_mode | 0o2070)
            elif writable and entry.is_file():
                entry.chmod(entry.stat().st_mode | 0o060)


class ContainerNode:
    """podman on the test bed's own store, for the pods of every container node of one agent."""

    def __init__(self, agent_root: Path, engine: Engine | None = None) -> None:
        missing = [tool for tool in ("podman", "runc") if shutil.which(tool) is None]
        if missing:
            raise ContainerConfigError(
                "ContainerRuntimeNotReady",
                f"{' and '.join(missing)} not installed on this machine (testbed/bootstrap.sh installs them)",
            )
        self.agent_root = str(agent_root)
        self.engine = engine or Engine()
        self.image_users: dict[str, str] = {}
        agent_root.mkdir(parents=True, exist_ok=True)
        (agent_root / USED_MARKER).touch()
        self.remove_stale()

    def remove_stale(self) -> None:
        """Containers an earlier agent of this test bed left behind (it was killed): gone, as after a
        node reboot."""
        listed = self.engine.run(
            "podman", "ps", "--all", "--quiet", f"--filter=label={AGENT_ROOT_LABEL}={self.agent_root}"
        )
        stale = listed.stdout.split()
        if stale:
            self.engine.run("podman", "rm", "--force", "--time=0", *stale, check=False)

    def launch(
        self,
        pod: dict[str, Any],
        pod_dir: Path,
        volume_dirs: dict[str, Path],
        env: dict[str, str],
        dns: Mapping[str, str],
        termination_log: Path | None = None,
    ) -> tuple[list[str], dict[str, str], Path]:
        """The argv, environment and working directory of `podman run` for the pod's container;
        ContainerConfigError when it cannot start (yet)."""
        container = pod["spec"]["containers"][0]
        image = container.get("image") or ""
        if not self.engine.image_exists(image):
            raise ContainerConfigError(
                "ErrImageNeverPull", f'image "{image}" is not on this node, and no registry is reachable'
            )
        if image not in self.image_users:
            self.image_users[image] = self.engine.image_user(image)
        metadata = pod["metadata"]
        spec = RunSpec(
            pod_uid=metadata["uid"],
            hostname=pod["spec"].get("hostname") or metadata["name"],
            env=env,
            volume_dirs=volume_dirs,
            hosts=namespace_hosts(dns, metadata["namespace"]),
            limits=tuple(ulimit_args()),
            agent_root=self.agent_root,
            image_user=self.image_users[image],
            termination_log=termination_log,
        )
        argv = ["podman", *run_argv(pod, container, spec)]
        prepare_volumes(pod, volume_dirs)
        return argv, self.engine.env, pod_dir

    def is_running(self, pod_uid: str) -> bool:
        name = container_name(pod_uid)
        inspected = self.engine.run(
            "podman", "container", "inspect", "--format={{.State.Running}}", name, check=False
        )
        return inspected.returncode == 0 and inspected.stdout.strip() == "true"

    def signal(self, pod_uid: str, signum: signal.Signals) -> None:
        """podman owns the container's process: it delivers the signal (the foreground `podman run`
        then exits with the container, and removes it)."""
        self.engine.run("podman", "kill", f"--signal={signum.name}", container_name(pod_uid), check=False)


def remove_leftovers(agent_root: Path) -> None:
    """Once the agent has stopped: remove the containers it could not (it was killed first)."""
    if (agent_root / USED_MARKER).exists():
        ContainerNode(agent_root)  # which removes them as it starts
