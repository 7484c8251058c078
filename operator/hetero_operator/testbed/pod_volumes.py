"""A local pod's volumes as host directories: claims under the agent's root (they outlive pods),
everything else under the pod's own directory; ConfigMaps and Secrets mirrored into theirs."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

from hetero_operator.testbed.local_pods import downward_api_files

Stores = tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]]  # ConfigMaps, Secrets by name


def volume_dirs(
    pod: dict[str, Any], agent_root: Path, pod_dir: Path
) -> tuple[dict[str, Path], dict[str, str]]:
    """(directory of each volume, ConfigMap name of each ConfigMap volume's directory); created."""
    namespace = pod["metadata"]["namespace"]
    dirs: dict[str, Path] = {}
    config_maps: dict[str, str] = {}
    for volume in pod["spec"].get("volumes") or []:
        name = volume["name"]
        if "persistentVolumeClaim" in volume:
            # Claims outlive pods: checkpoints written here survive a restart, as on a real volume.
            path = agent_root / "claims" / namespace / volume["persistentVolumeClaim"]["claimName"]
        else:
            path = pod_dir / "volumes" / name
        path.mkdir(parents=True, exist_ok=True)
        dirs[name] = path
        if "configMap" in volume:
            config_maps[str(path)] = volume["configMap"]["name"]
    return dirs, config_maps


def downward_volumes(pod: dict[str, Any], dirs: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Directory of each Downward API volume -> the volume (its files are kept current)."""
    return {str(dirs[v["name"]]): v for v in pod["spec"].get("volumes") or [] if "downwardAPI" in v}


def project_downward(pod: dict[str, Any], volumes: dict[str, dict[str, Any]]) -> None:
    """Labels and annotations as the pod has them now (the worker watches for the checkpoint
    annotation there), as a kubelet keeps a Downward API volume current."""
    for volume_dir, volume in volumes.items():
        write_files(Path(volume_dir), downward_api_files(pod, volume))


def read_stores(core: Any, namespace: str) -> Stores:
    config_maps = {
        item.metadata.name: dict(item.data or {}) for item in core.list_namespaced_config_map(namespace).items
    }
    secrets = {
        item.metadata.name: {k: base64.b64decode(v).decode() for k, v in (item.data or {}).items()}
        for item in core.list_namespaced_secret(namespace).items
    }
    return config_maps, secrets


def mirror(
    pod: dict[str, Any], dirs: dict[str, Path], config_map_dirs: dict[str, str], stores: Stores
) -> bool:
    """Write the pod's ConfigMap and Secret volumes; False while a ConfigMap it mounts does not exist."""
    config_maps, secrets = stores
    for volume_dir, cm_name in config_map_dirs.items():
        if cm_name not in config_maps:
            return False
        write_files(Path(volume_dir), config_maps[cm_name])
    for volume in pod["spec"].get("volumes") or []:
        if "secret" in volume and volume["secret"]["secretName"] in secrets:
            write_files(dirs[volume["name"]], secrets[volume["secret"]["secretName"]])
    return True


def write_files(directory: Path, data: dict[str, str]) -> None:
    """Write keys as files, atomically and only when changed (a reader never sees half a file)."""
    directory.mkdir(parents=True, exist_ok=True)
    for key, value in data.items():
        target = directory / key
        if target.exists() and target.read_text() == value:
            continue
        scratch = directory / f".{key}.tmp"
        scratch.write_text(value)
        os.replace(scratch, target)
