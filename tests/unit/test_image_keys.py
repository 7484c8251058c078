"""Image tags are keys of their content: the same sources give the same tag, any change to what goes
into an image gives a new one, and what .dockerignore leaves out does not count."""

from __future__ import annotations

import shutil
from pathlib import Path

from hetero_operator.testbed import images
from hetero_operator.testbed.versions import REPO_ROOT


def copy_context(target: Path) -> Path:
    for entry in images.CONTEXT_PATHS:
        source = REPO_ROOT / entry
        if source.is_dir():
            shutil.copytree(source, target / entry, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (target / entry).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, target / entry)
    return target


def test_context_paths_are_what_dockerignore_lets_in() -> None:
    allowed = [
        line[1:].rstrip("/")
        for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    assert sorted(allowed) == sorted(images.CONTEXT_PATHS)


def test_tags_follow_the_content(tmp_path: Path) -> None:
    root = copy_context(tmp_path / "context")
    recipe = images.RECIPES[1]
    args = {"BASE_IMAGE": "localhost/heterotrain/base:0"}
    first = images.image_tag(recipe, args, root)
    assert first.startswith("localhost/heterotrain/trainer:")
    assert images.image_tag(recipe, args, root) == first

    cache = root / "operator" / "hetero_operator" / "__pycache__"
    cache.mkdir(exist_ok=True)
    (cache / "x.cpython-311.pyc").write_bytes(b"\0")
    assert images.image_tag(recipe, args, root) == first, "bytecode caches are not in the context"

    source = root / "trainer_image" / "hetero_runtime" / "trainer.py"
    source.write_text(source.read_text() + "\n# changed\n")
    changed = images.image_tag(recipe, args, root)
    assert changed != first

    assert images.image_tag(recipe, {"BASE_IMAGE": "localhost/heterotrain/base:1"}, root) != changed
    renamed = images.ImageRecipe("trainer", tmp_path / "Dockerfile")
    (tmp_path / "Dockerfile").write_text(recipe.dockerfile.read_text() + "\nLABEL x=y\n")
    assert images.image_tag(renamed, args, root) != changed


def test_build_args_pass_the_hosts_package_index_only_when_set() -> None:
    assert images.build_args("b", {}) == {"BASE_IMAGE": "b"}
    environ = {"PIP_EXTRA_INDEX_URL": "https://example.org/simple", "PIP_INDEX_URL": "", "HOME": "/root"}
    assert images.build_args("b", environ) == {
        "BASE_IMAGE": "b",
        "PIP_EXTRA_INDEX_URL": "https://example.org/simple",
    }


def test_the_dockerfiles_take_the_base_as_a_build_argument_with_a_registry_default() -> None:
    for recipe in images.RECIPES:
        lines = recipe.dockerfile.read_text().splitlines()
        assert "ARG BASE_IMAGE=python:3.11.11-slim-bookworm" in lines
        assert [line for line in lines if line.startswith("FROM ")] == ["FROM ${BASE_IMAGE}"]


def test_pruning_keeps_the_newest_builds_and_the_version_tags_image() -> None:
    repo = "localhost/heterotrain/trainer"
    listing = [
        {"Names": [f"{repo}:old1"], "Created": 100},
        {"Names": [f"{repo}:current", f"{repo}:0.1.0"], "Created": 50},  # an older checkout built last
        {"Names": [f"{repo}:new1"], "Created": 300},
        {"Names": [f"{repo}:new2"], "Created": 200},
        {"Names": ["localhost/heterotrain/operator:x"], "Created": 400},
    ]
    assert images.stale_tags(listing, repo, keep=3) == [f"{repo}:old1"]
    assert images.stale_tags(listing, repo, keep=1) == [f"{repo}:new1", f"{repo}:new2", f"{repo}:old1"]
