"""The test bed's slowed nodes: the slowdown annotation and the speed file a worker re-reads."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from hetero_operator.testbed.local_pods import (
    SLOWDOWN_ANNOTATION,
    node_slowdown,
    node_true_speed,
    write_speed,
)
from hetero_operator.testbed.nodes import TRUE_SPEED_ANNOTATION, FakeNode, node_manifest


def test_the_slowdown_annotation_is_a_factor_of_at_least_one() -> None:
    assert node_slowdown({}) == 1.0
    assert node_slowdown({SLOWDOWN_ANNOTATION: "2"}) == 2.0
    assert node_slowdown({SLOWDOWN_ANNOTATION: "0.5"}) == 1.0  # a node is never made faster than its GPU
    assert node_slowdown({SLOWDOWN_ANNOTATION: "fast"}) == 1.0


def test_the_speed_file_holds_the_current_speed(tmp_path: Path) -> None:
    path = tmp_path / "simulated-speed"
    write_speed(path, 0.25)
    assert path.read_text() == "0.25\n"
    write_speed(path, 0.125)
    assert float(path.read_text()) == 0.125
    assert not path.with_suffix(".tmp").exists()


def test_a_node_lists_true_speed_is_annotated_on_its_node_and_read_back_by_the_agent() -> None:
    local = {"name": "n", "gpuClass": "slow", "gpus": 1, "local": True}
    node = FakeNode.model_validate({**local, "speed": 0.35})
    annotations = node_manifest(node)["metadata"]["annotations"]
    assert annotations[TRUE_SPEED_ANNOTATION] == "0.35"
    assert node_true_speed(annotations) == 0.35
    without = node_manifest(
        FakeNode.model_validate({"name": "n", "gpuClass": "slow", "gpus": 1, "local": True})
    )
    assert node_true_speed(without["metadata"]["annotations"]) is None
    for bad in ("", "0", "1.5", "-1", "fast"):
        assert node_true_speed({TRUE_SPEED_ANNOTATION: bad}) is None, bad


def test_a_true_speed_on_a_simulated_node_is_refused_by_name() -> None:
    with pytest.raises(ValidationError, match="speed needs local: true"):
        FakeNode.model_validate({"name": "kwok-0", "gpuClass": "slow", "gpus": 1, "speed": 0.5})
