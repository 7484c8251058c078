"""The test bed's slowed nodes: the slowdown annotation and the speed file a worker re-reads."""

from __future__ import annotations

from pathlib import Path

from hetero_operator.testbed.local_pods import SLOWDOWN_ANNOTATION, node_slowdown, write_speed


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
