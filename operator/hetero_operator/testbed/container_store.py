"""The test bed's own container storage and engine settings, shared by buildah (builds) and podman
(runs): images live under the cache directory, runc is the runtime, cgroupfs the cgroup manager.

Nothing here needs a daemon, systemd or a registry. Every command gets its settings through
CONTAINERS_STORAGE_CONF and CONTAINERS_CONF, so the machine's own container configuration is left alone.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hetero_operator.testbed.versions import cache_root

TOOLS = ("buildah", "podman", "runc", "debootstrap")
STORAGE_DRIVER_ENV = "HETEROTRAIN_STORAGE_DRIVER"
# podman lowers its own RLIMIT_NPROC to this before starting a container, and runc (without
# CAP_SYS_RESOURCE) cannot raise a limit again: asking for more fails with "error setting rlimit type 6".
PODMAN_NPROC_CEILING = 32768


@dataclass(frozen=True)
class Store:
    """Where images and containers live, and which storage driver keeps them."""

    graph_root: Path
    run_root: Path
    driver: str

    @property
    def config_dir(self) -> Path:
        return self.graph_root.parent / f"config-{self.driver}"

    def storage_conf(self) -> str:
        return (
            "[storage]\n"
            f'driver = "{self.driver}"\n'
            f'graphroot = "{self.graph_root}"\n'
            f'runroot = "{self.run_root}"\n'
        )

    def containers_conf(self) -> str:
        return (
            "[engine]\n"
            'runtime = "runc"\n'
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "file"\n'
            f'tmp_dir = "{self.run_root / "libpod"}"\n'
        )


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    except OSError:
        return "boot"


def overlay_works(probe_dir: Path) -> bool:
    """Whether the kernel mounts overlayfs on this filesystem (root only; copy-on-write, no copies)."""
    probe_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=probe_dir) as scratch:
        parts = {name: Path(scratch) / name for name in ("lower", "upper", "work", "merged")}
        for path in parts.values():
            path.mkdir()
        options = f"lowerdir={parts['lower']},upperdir={parts['upper']},workdir={parts['work']}"
        mounted = subprocess.run(
            ["mount", "-t", "overlay", "overlay", "-o", options, str(parts["merged"])], capture_output=True
        )
        if mounted.returncode != 0:
            return False
        subprocess.run(["umount", str(parts["merged"])], capture_output=True)
        return True


def default_store() -> Store:
    """The cache's store: overlay where the kernel allows it, else vfs (full copies: slow and large).

    Runtime state goes under /run, keyed by boot, so nothing stale survives a reboot."""
    images_root = cache_root() / "containers"
    driver = os.environ.get(STORAGE_DRIVER_ENV) or ("overlay" if overlay_works(images_root) else "vfs")
    if driver not in ("overlay", "vfs"):
        raise ValueError(f"{STORAGE_DRIVER_ENV}={driver!r}: use overlay or vfs")
    run_root = Path("/run/heterotrain") / f"containers-{_boot_id()}-{driver}"
    return Store(graph_root=images_root / driver, run_root=run_root, driver=driver)


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def environment(store: Store) -> dict[str, str]:
    """The process environment for buildah and podman, with this store's configuration files."""
    store.config_dir.mkdir(parents=True, exist_ok=True)
    files = {"storage.conf": store.storage_conf(), "containers.conf": store.containers_conf()}
    for name, text in files.items():
        path = store.config_dir / name
        if not path.exists() or path.read_text() != text:
            scratch = path.with_suffix(".tmp")
            scratch.write_text(text)
            os.replace(scratch, path)
    return dict(
        os.environ,
        CONTAINERS_STORAGE_CONF=str(store.config_dir / "storage.conf"),
        CONTAINERS_CONF=str(store.config_dir / "containers.conf"),
    )


def ulimit_args() -> list[str]:
    """Limits a container may have here: the host's own, since without CAP_SYS_RESOURCE runc cannot
    raise them to podman's defaults (1048576 open files)."""
    _soft, files = resource.getrlimit(resource.RLIMIT_NOFILE)
    _soft, procs = resource.getrlimit(resource.RLIMIT_NPROC)
    procs = PODMAN_NPROC_CEILING if procs == resource.RLIM_INFINITY else min(procs, PODMAN_NPROC_CEILING)
    files = 1048576 if files == resource.RLIM_INFINITY else files
    return [f"--ulimit=nofile={files}:{files}", f"--ulimit=nproc={procs}:{procs}"]


class Engine:
    """buildah and podman on one store."""

    def __init__(self, store: Store | None = None) -> None:
        self.store = store or default_store()
        self.env = environment(self.store)

    def run(
        self, tool: str, *args: str, check: bool = True, timeout: float | None = 120
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([tool, *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise RuntimeError(
                f"{tool} {' '.join(args[:3])} failed ({result.returncode}): {result.stderr[-2000:]}"
            )
        return result

    def image_exists(self, image: str) -> bool:
        return self.run("podman", "image", "exists", image, check=False).returncode == 0

    def image_user(self, image: str) -> str:
        """The USER the image runs as ("" when it names none, which means root)."""
        return self.run("podman", "image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip()

    def image_size(self, image: str) -> int:
        return int(self.run("podman", "image", "inspect", "--format", "{{.Size}}", image).stdout.strip())
