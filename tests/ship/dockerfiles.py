"""Read what a Dockerfile does (COPY sources, the pip install target, the entrypoint), check paths
against .dockerignore, and rebuild its Python environment in a fresh virtual environment."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from fnmatch import translate
from pathlib import Path

from packaging.requirements import Requirement

from hetero_operator.testbed.versions import cache_root

PIP = [sys.executable, "-m", "pip"]
# uv's cache of the project's requirements, filled once per machine and reused by every later run.
UV_CACHE = cache_root() / "uv-cache"


@dataclass(frozen=True)
class Dockerfile:
    copy_sources: tuple[str, ...]  # from the build context (COPY --from=... excluded)
    install_target: str  # what `pip install` installs, e.g. "/src" or "/src[runtime]"
    entrypoint: tuple[str, ...]


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    joined = re.sub(
        r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    )
    pairs = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            pairs.append((keyword.upper(), rest.strip()))
    return pairs


def parse(path: Path) -> Dockerfile:
    copies: list[str] = []
    targets: list[str] = []
    entrypoint: tuple[str, ...] = ()
    for keyword, rest in instructions(path.read_text()):
        if keyword == "COPY":
            words = shlex.split(rest)
            if any(w.startswith("--from") for w in words):
                continue
            copies += [w for w in words if not w.startswith("--")][:-1]
        elif keyword == "RUN" and "pip install" in rest:
            for command in rest.split("&&"):
                words = shlex.split(command.split("pip install", 1)[1]) if "pip install" in command else []
                # `pip install -r requirements.txt` installs the dependencies ahead of the project.
                if words and "-r" not in words:
                    targets += [w for w in words if not w.startswith("-")]
        elif keyword == "ENTRYPOINT":
            entrypoint = tuple(json.loads(rest))
    if len(targets) != 1:
        raise ValueError(f"{path}: expected one `pip install` target, found {targets}")
    return Dockerfile(tuple(copies), targets[0], entrypoint)


def _pattern(glob: str) -> re.Pattern[str]:
    # Docker's `**` matches any number of directories; fnmatch's `*` already crosses `/`.
    return re.compile(translate(glob.strip("/").replace("**/", "*").replace("/**", "*")))


def included(relative: str, dockerignore: str) -> bool:
    """Whether .dockerignore lets `relative` (or the directory it names) into the build context: the
    last pattern matching it or one of its parent directories decides; `!` patterns re-include."""
    rules = [line.strip() for line in dockerignore.splitlines() if line.strip() and not line.startswith("#")]
    parts = Path(relative.rstrip("/")).parts
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    verdict = True
    for rule in rules:
        negated = rule.startswith("!")
        pattern = _pattern(rule[1:] if negated else rule)
        if any(pattern.match(candidate) for candidate in candidates):
            verdict = negated
    return verdict


def install_extras(target: str) -> tuple[str, ...]:
    """Extras named in a pip target such as "/src[runtime]" (the directory pyproject.toml went to)."""
    match = re.fullmatch(r"(?:\.|/src)(?:\[([\w,\s-]+)\])?", target)
    if match is None:
        raise ValueError(f"pip install target {target!r} is not the project directory")
    return tuple(e.strip() for e in (match.group(1) or "").split(",") if e.strip())


def build_project_wheel(repo: Path, out: Path) -> Path:
    """The project's wheel, built with the current environment's setuptools (no network)."""
    subprocess.run(
        [*PIP, "wheel", "--no-deps", "--no-build-isolation", "--quiet", "--wheel-dir", str(out), str(repo)],
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("heterotrain-*.whl")
    return wheel


def requirements(wheel: Path, extras: tuple[str, ...], leave_out: frozenset[str]) -> list[str]:
    """The wheel's requirements for `extras`, from its METADATA, minus the distributions in `leave_out`."""
    with zipfile.ZipFile(wheel) as archive:
        (metadata_name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(archive.read(metadata_name).decode())
    wanted = []
    for line in metadata.get_all("Requires-Dist") or []:
        requirement = Requirement(line)
        if requirement.name.lower() in leave_out:
            continue
        environments = [{"extra": extra} for extra in ("", *extras)]
        if requirement.marker is None or any(requirement.marker.evaluate(env) for env in environments):
            requirement.marker = None
            wanted.append(str(requirement))
    return wanted


def fresh_venv(path: Path, wheel: Path, extras: tuple[str, ...], leave_out: frozenset[str]) -> Path:
    """A new virtual environment holding the project wheel and its requirements, nothing else. Returns
    its bin directory.

    uv stands in for pip here: it resolves the same requirements from the same index, but installs
    from its cache by linking files, in about two seconds instead of a minute for the ~60 wheels. The
    cache is filled from the package index on a machine's first run, and used offline after that."""
    uv = [str(Path(sys.executable).parent / "uv"), "--quiet", "--cache-dir", str(UV_CACHE)]
    subprocess.run([*uv, "venv", "--python", sys.executable, str(path)], check=True, capture_output=True)
    install = [*uv, "pip", "install", "--python", str(path / "bin" / "python")]
    wanted = requirements(wheel, extras, leave_out)
    if subprocess.run([*install, "--offline", *wanted], capture_output=True).returncode != 0:
        _run([*install, *wanted])
    _run([*install, "--offline", "--no-deps", str(wheel)])
    return path / "bin"


def _run(argv: list[str]) -> None:
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{result.stderr[-3000:]}")
