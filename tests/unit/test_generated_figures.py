"""Figures in README.md and BENCHMARKS.md are the committed artifacts rendered, never typed: each
generated part is compared with what its benchmark's renderer makes of its artifact today."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"


def bench_module(name: str) -> ModuleType:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module(name)


def section(heading: str) -> str:
    text = (REPO / "BENCHMARKS.md").read_text()
    start = text.index(heading + "\n")
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end != -1 else len(text)].rstrip("\n") + "\n"


def test_the_readme_demo_output_and_the_closed_loop_section_are_the_artifact_rendered() -> None:
    closed_loop = bench_module("closed_loop")
    artifact = json.loads(closed_loop.ARTIFACT.read_text())
    assert closed_loop.readme_block(artifact) in (REPO / "README.md").read_text()
    assert section(closed_loop.SECTION) == closed_loop.render(artifact)


def test_the_fair_share_section_is_the_artifact_rendered_and_judged_per_seed() -> None:
    fair_share = bench_module("fair_share")
    artifact = json.loads(fair_share.ARTIFACT.read_text())
    assert section(fair_share.SECTION) == fair_share.report(artifact)
    worst = [seed["runs"]["speed-priced"]["max_rho"] for seed in artifact["per_seed"]]
    every_seed = all(rho <= fair_share.MAX_RHO_TARGET for rho in worst)
    assert ("and in every seed: **met**" in section(fair_share.SECTION)) == every_seed


def test_the_real_trace_section_is_the_artifact_rendered() -> None:
    gavel_trace = bench_module("gavel_trace")
    artifact = json.loads(gavel_trace.ARTIFACT.read_text())
    assert section(gavel_trace.SECTION) == gavel_trace.report(artifact)


def test_the_lower_bound_section_is_the_artifact_rendered() -> None:
    scheduling_bound = bench_module("scheduling_bound")
    artifact = json.loads(scheduling_bound.ARTIFACT.read_text())
    assert section(scheduling_bound.SECTION) == scheduling_bound.report(artifact)
