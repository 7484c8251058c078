"""The project's images, built without a Docker engine or a registry: a Debian base made with
debootstrap, then the operator and trainer images from the project's own Dockerfiles with buildah
(chroot isolation), the base given as the BASE_IMAGE build argument.

Each image is tagged with a key of its content (Dockerfile, base, build arguments and every file that
goes into it), so an image is built once per content and found again on later runs.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from hetero_operator import __version__
from hetero_operator.testbed.container_store import Engine, missing_tools
from hetero_operator.testbed.versions import REPO_ROOT

REPOSITORY = "localhost/heterotrain"
# The base: Debian's Python with venv, `python` on PATH and the CA bundle; docs, locales and apt's
# lists removed. Bump BASE_RECIPE when the way it is made changes.
BASE_RECIPE = 1
BASE_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
MIRROR_ENV = "HETEROTRAIN_DEBIAN_MIRROR"
PRUNED = ("var/cache/apt", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/info")
# What .dockerignore lets into the build context (a test holds the two together).
CONTEXT_PATHS = ("pyproject.toml", "README.md", "operator/hetero_operator", "trainer_image/hetero_runtime")
# The host's trust store, mounted read-only into build steps: pip reaches the index as the host does.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
PASSED_BUILD_ARGS = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")
BUILD_TIMEOUT_SECONDS = 3600
# Builds of each image kept in the store (several checkouts may share it); older ones are removed.
KEEP_BUILDS = 3


@dataclass(frozen=True)
class ImageRecipe:
    name: str
    dockerfile: Path


RECIPES = (
    ImageRecipe("operator", REPO_ROOT / "Dockerfile"),
    ImageRecipe("trainer", REPO_ROOT / "trainer_image" / "Dockerfile"),
)


def _digest(*parts: bytes) -> str:
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(len(part).to_bytes(8, "big"))
        hasher.update(part)
    return hasher.hexdigest()[:16]


def base_tag() -> str:
    recipe = {"recipe": BASE_RECIPE, "suite": BASE_SUITE, "packages": BASE_PACKAGES, "pruned": PRUNED}
    return f"{REPOSITORY}/base:{_digest(json.dumps(recipe, sort_keys=True).encode())}"


def context_files(root: Path = REPO_ROOT) -> Iterator[Path]:
    """Every file of the build context, in a stable order (bytecode caches left out, as .dockerignore
    does)."""
    for entry in CONTEXT_PATHS:
        path = root / entry
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in files:
            if "__pycache__" not in file.parts and file.suffix != ".pyc":
                yield file


def build_args(base: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    """BASE_IMAGE, and the host's package index settings where it has any."""
    environ = dict(os.environ) if environ is None else environ
    args = {"BASE_IMAGE": base}
    args.update({name: environ[name] for name in PASSED_BUILD_ARGS if environ.get(name)})
    return args


def image_tag(recipe: ImageRecipe, args: dict[str, str], root: Path = REPO_ROOT) -> str:
    """The content-keyed tag: the Dockerfile, the build arguments (the base's tag among them) and
    every file in the build context, with its path."""
    parts = [recipe.dockerfile.read_bytes(), json.dumps(args, sort_keys=True).encode()]
    for file in context_files(root):
        parts += [file.relative_to(root).as_posix().encode(), file.read_bytes()]
    return f"{REPOSITORY}/{recipe.name}:{_digest(*parts)}"


def version_tag(recipe: ImageRecipe) -> str:
    """The name the examples use (heterotrain/trainer:0.1.0), given to the newest build."""
    return f"{REPOSITORY}/{recipe.name}:{__version__}"


def wanted_tags() -> dict[str, str]:
    base = base_tag()
    args = build_args(base)
    return {"base": base, **{recipe.name: image_tag(recipe, args) for recipe in RECIPES}}


@contextmanager
def _build_lock(engine: Engine) -> Iterator[None]:
    """One build at a time on this store (several checkouts may share the cache)."""
    lock_path = engine.store.graph_root.parent / "build.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _logged(argv: list[str], log: Path, env: dict[str, str], stdin: IO[bytes] | None = None) -> None:
    started = time.monotonic()
    with log.open("a") as sink:
        sink.write(f"$ {' '.join(argv)}\n")
        sink.flush()
        result = subprocess.run(
            argv, env=env, stdin=stdin, stdout=sink, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_SECONDS
        )
        sink.write(f"# {argv[0]} exited {result.returncode} after {time.monotonic() - started:.0f} s\n")
    if result.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"{argv[0]} failed ({result.returncode}); see {log}\n{tail}")


def build_base(engine: Engine, tag: str, log: Path) -> None:
    """debootstrap a minimal Debian with Python into a scratch directory and import it as `tag`."""
    mirror = os.environ.get(MIRROR_ENV) or DEFAULT_MIRROR
    scratch_parent = engine.store.graph_root.parent
    with tempfile.TemporaryDirectory(dir=scratch_parent, prefix="base-") as scratch:
        rootfs = Path(scratch) / "rootfs"
        include = ",".join(BASE_PACKAGES)
        argv = ["debootstrap", "--variant=minbase", f"--include={include}", BASE_SUITE, str(rootfs), mirror]
        _logged(argv, log, engine.env)
        for relative in PRUNED:
            target = rootfs / relative
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True, exist_ok=True)
        locales = rootfs / "usr/share/locale"
        for entry in locales.iterdir() if locales.is_dir() else []:
            if entry.is_dir():
                shutil.rmtree(entry)
        tar = subprocess.Popen(
            ["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE
        )
        try:
            _logged(
                ["podman", "import", "--change", 'CMD ["python3"]', "-", tag],
                log,
                engine.env,
                stdin=tar.stdout,
            )
        finally:
            if tar.stdout is not None:
                tar.stdout.close()
            tar.wait()


def build_image(engine: Engine, recipe: ImageRecipe, args: dict[str, str], tag: str, log: Path) -> None:
    """buildah build of one Dockerfile, tagged `tag` (its content key) and with the project's version."""
    argv = [
        "buildah",
        "build",
        "--isolation=chroot",
        "--pull=never",
        f"--file={recipe.dockerfile}",
    ]
    if engine.store.driver == "overlay":
        # Each step's layer is kept, so a change to the sources reuses the dependency layer. On vfs every
        # layer is a full copy of the tree (gigabytes each for the trainer): one layer per build there.
        argv.append("--layers")
    argv += [f"--build-arg={name}={value}" for name, value in args.items()]
    if HOST_CA_BUNDLE.is_file():
        argv.append(f"--volume={HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro")
    argv += [f"--tag={tag}", f"--tag={version_tag(recipe)}", str(REPO_ROOT)]
    try:
        _logged(argv, log, engine.env)
    except RuntimeError:
        # A failed step leaves its working container (gigabytes); no other build runs here (the lock).
        engine.run("buildah", "rm", "--all", check=False)
        raise


def stale_tags(listing: list[dict[str, Any]], repository: str, keep: int) -> list[str]:
    """Content-keyed tags of `repository` beyond the `keep` newest builds (`podman images --format
    json` rows), to be removed; the version tag's image is always among those kept."""
    builds: dict[str, tuple[int, bool]] = {}
    for row in listing:
        names = [str(n) for n in row.get("Names") or []]
        current = f"{repository}:{__version__}" in names
        for name in names:
            if name.startswith(f"{repository}:") and name != f"{repository}:{__version__}":
                builds[name] = (int(row.get("Created", 0)), current)
    ranked = sorted(builds, key=lambda name: (builds[name][1], builds[name][0]), reverse=True)
    return ranked[keep:]


def prune(engine: Engine) -> None:
    """Remove all but the newest builds of each image, and the cached layers only they used."""
    for recipe in RECIPES:
        repository = f"{REPOSITORY}/{recipe.name}"
        listing = json.loads(engine.run("podman", "images", "--format=json", repository).stdout or "[]")
        stale = stale_tags(listing, repository, KEEP_BUILDS)
        if stale:
            engine.run("podman", "rmi", *stale, check=False)
    engine.run("podman", "image", "prune", "--force", check=False)


def ensure_images(
    engine: Engine | None = None, on_step: Callable[[str], None] | None = None
) -> dict[str, str]:
    """Build whatever image is missing for the current sources; return every image's tag."""
    say = on_step or (lambda _msg: None)
    missing = missing_tools()
    if missing:
        raise RuntimeError(
            f"{', '.join(missing)} not installed: images are built with buildah, debootstrap and podman "
            "(Debian packages; testbed/bootstrap.sh installs them)"
        )
    engine = engine or Engine()
    tags = wanted_tags()
    log = engine.store.graph_root.parent / "build.log"
    built = False
    with _build_lock(engine):
        if not engine.image_exists(tags["base"]):
            say(f"building the base image {tags['base']} with debootstrap")
            build_base(engine, tags["base"], log)
        for recipe in RECIPES:
            if not engine.image_exists(tags[recipe.name]):
                say(f"building {tags[recipe.name]} with buildah")
                build_image(engine, recipe, build_args(tags["base"]), tags[recipe.name], log)
                built = True
            else:
                # A checkout that went back to older sources points the version tag at them again.
                engine.run("podman", "tag", tags[recipe.name], version_tag(recipe))
        if built:
            prune(engine)
    return tags
