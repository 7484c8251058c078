"""Build the test bed's binaries from the Go module proxy into the versioned cache, once."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hetero_operator.testbed import versions

KUBERNETES_BINARIES = ("kube-apiserver", "kube-controller-manager", "kubectl")
# Where Kueue's module keeps its CRDs and webhook configuration; copied beside its binary.
KUEUE_CRD_DIR = "config/components/crd/bases"
KUEUE_WEBHOOK_DIR = "config/components/webhook"


@dataclass(frozen=True)
class GoBuild:
    """One `go build` or `go install` that produces some of the binaries."""

    produces: tuple[str, ...]
    version: str
    args: tuple[str, ...]
    module_dir: Path | None  # None: `go install pkg@version`, outside any module
    # Files from a required module's source, copied next to the binaries (Kueue's CRDs and webhook
    # configuration, which go with its binary): (module path, directories inside it).
    module_files: tuple[str, tuple[str, ...]] | None = None

    @property
    def directory(self) -> Path:
        """Cache directory of this build, keyed by its version and, for our modules, their go.mod."""
        key = self.version
        if self.module_dir is not None:
            go_mod = (self.module_dir / "go.mod").read_bytes()
            key += "-" + hashlib.sha256(go_mod).hexdigest()[:10]
        return versions.build_root() / f"{self.produces[0]}-{key}"


def _version_ldflags() -> str:
    minor = versions.KUBERNETES_VERSION.split(".")[1]
    flags = []
    # Unstamped builds report v0.0.0, which breaks version checks in clients such as helm.
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {package}.gitVersion={versions.KUBERNETES_VERSION}",
            f"-X {package}.gitMajor=1",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
        ]
    return " ".join(flags)


def _helm_ldflags() -> str:
    minor = versions.KUBERNETES_VERSION.split(".")[1]
    return (
        f"-s -w -X helm.sh/helm/v3/internal/version.version={versions.HELM_VERSION} "
        f"-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 "
        f"-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor={minor}"
    )


def go_builds() -> list[GoBuild]:
    return [
        GoBuild(
            produces=KUBERNETES_BINARIES,
            version=versions.KUBERNETES_VERSION,
            args=(
                "build",
                "-pgo=off",
                "-trimpath",
                "-ldflags",
                f"-s -w {_version_ldflags()}",
                *(f"k8s.io/kubernetes/cmd/{name}" for name in KUBERNETES_BINARIES),
            ),
            module_dir=versions.GO_MODULES / "k8s",
        ),
        GoBuild(
            produces=("etcd",),
            version=versions.ETCD_VERSION,
            args=("build", "-trimpath", "-ldflags", "-s -w", "-o", "{out}/etcd", "."),
            module_dir=versions.GO_MODULES / "etcd",
        ),
        GoBuild(
            produces=("kwok",),
            version=versions.KWOK_VERSION,
            args=(
                "install",
                "-trimpath",
                "-ldflags",
                "-s -w",
                f"sigs.k8s.io/kwok/cmd/kwok@{versions.KWOK_VERSION}",
            ),
            module_dir=None,
        ),
        GoBuild(
            produces=("helm",),
            version=versions.HELM_VERSION,
            args=(
                "install",
                "-trimpath",
                "-ldflags",
                _helm_ldflags(),
                f"helm.sh/helm/v3/cmd/helm@{versions.HELM_VERSION}",
            ),
            module_dir=None,
        ),
        GoBuild(
            produces=("kueue",),
            version=versions.KUEUE_VERSION,
            args=(
                "build",
                "-trimpath",
                "-ldflags",
                f"-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion={versions.KUEUE_VERSION} "
                f"-X sigs.k8s.io/kueue/pkg/version.GitCommit={versions.KUEUE_COMMIT}",
                "sigs.k8s.io/kueue/cmd/kueue",
            ),
            module_dir=versions.GO_MODULES / "kueue",
            module_files=("sigs.k8s.io/kueue", (KUEUE_CRD_DIR, KUEUE_WEBHOOK_DIR)),
        ),
        GoBuild(
            produces=("prometheus",),
            version=versions.PROMETHEUS_VERSION,
            args=(
                "build",
                "-trimpath",
                "-ldflags",
                f"-s -w -X github.com/prometheus/common/version.Version={versions.PROMETHEUS_VERSION}",
                "github.com/prometheus/prometheus/cmd/prometheus",
            ),
            module_dir=versions.GO_MODULES / "prometheus",
        ),
    ]


def missing_binaries() -> list[str]:
    return [name for b in go_builds() for name in b.produces if not (b.directory / name).exists()]


def _run_build(build: GoBuild, out: Path, log: Path) -> None:
    env = dict(os.environ, CGO_ENABLED="0", GOBIN=str(out), GOFLAGS="-mod=mod")
    args = [a.replace("{out}", str(out)) for a in build.args]
    if build.module_dir is not None and args[0] == "build" and "-o" not in args:
        args[1:1] = ["-o", str(out) + "/"]
    cwd = build.module_dir or Path(tempfile.gettempdir())
    with log.open("a") as sink:
        sink.write(f"$ go {' '.join(args)}  (in {cwd})\n")
        sink.flush()
        result = subprocess.run(["go", *args], cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        tail = log.read_text().splitlines()[-25:]
        raise RuntimeError(f"building {', '.join(build.produces)} failed; see {log}\n" + "\n".join(tail))
    if build.module_files is not None:
        _copy_module_files(build, env, out)


def _copy_module_files(build: GoBuild, env: dict[str, str], out: Path) -> None:
    """Copy directories of a required module's source (from the module cache) into `out`."""
    assert build.module_files is not None and build.module_dir is not None
    module, directories = build.module_files
    listed = subprocess.run(
        ["go", "list", "-m", "-json", module], cwd=build.module_dir, env=env, capture_output=True, text=True
    )
    if listed.returncode != 0:
        raise RuntimeError(f"could not locate the source of {module}: {listed.stderr.strip()}")
    source = Path(json.loads(listed.stdout)["Dir"])
    for directory in directories:
        for file in (source / directory).rglob("*"):
            if file.is_file():  # copyfile: the module cache is read-only, the copy need not be
                (out / file.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(file, out / file.relative_to(source))


def build_all(on_step: Callable[[str], None] | None = None) -> Path:
    """Build every missing binary into the cache and return the cache's root directory.

    Each build writes into a scratch directory first and is renamed into place only when it
    succeeded, so an interrupted build never leaves a half-written binary behind.
    """
    missing = [b for b in go_builds() if not all((b.directory / n).exists() for n in b.produces)]
    if missing and shutil.which("go") is None:
        raise RuntimeError("Go is not installed: the test bed is built from Go modules (Go >= 1.26)")
    root = versions.build_root()
    root.mkdir(parents=True, exist_ok=True)
    log = root / "build.log"
    for build in missing:
        if on_step:
            on_step(f"building {', '.join(build.produces)} (cached after the first time)")
        with tempfile.TemporaryDirectory(dir=root) as scratch:
            out = Path(scratch) / "bin"
            out.mkdir()
            _run_build(build, out, log)
            shutil.rmtree(build.directory, ignore_errors=True)
            os.replace(out, build.directory)
    return root


def binary(name: str) -> Path:
    """Path of a built test-bed binary."""
    for build in go_builds():
        if name in build.produces:
            path = build.directory / name
            if not path.exists():
                raise FileNotFoundError(f"{name} is not built yet; run `heterotrain testbed build`")
            return path
    known = sorted(n for b in go_builds() for n in b.produces)
    raise KeyError(f"unknown test-bed binary {name!r}; known: {', '.join(known)}")
