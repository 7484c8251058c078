"""Batches staged one step ahead: on the CPU nothing is moved early, and everything arrives in order."""

from __future__ import annotations

import torch

from hetero_runtime.device import map_tensors, to_device
from hetero_runtime.prefetch import staged

CPU = torch.device("cpu")


def test_on_the_cpu_each_item_is_moved_only_when_asked_for() -> None:
    moved: list[int] = []

    def move(item: int) -> int:
        moved.append(item)
        return item * 10

    steps = staged(range(5), move, CPU)
    assert next(steps) == 0 and moved == [0]
    assert next(steps) == 10 and moved == [0, 1]
    assert list(steps) == [20, 30, 40] and moved == [0, 1, 2, 3, 4]


def test_a_loop_that_stops_early_moves_nothing_past_it() -> None:
    moved: list[int] = []
    for item in staged(range(100), lambda i: moved.append(i) or i, CPU):
        if item == 3:
            break
    assert moved == [0, 1, 2, 3]


def test_nested_batches_keep_their_shape() -> None:
    batch = {"x": torch.ones(2, 3), "pair": (torch.zeros(2), [torch.arange(2)]), "name": "digits"}
    same = to_device(batch, CPU, pin=False)
    assert same["x"] is batch["x"] and same["pair"][1][0] is batch["pair"][1][0]
    assert isinstance(same["pair"], tuple) and isinstance(same["pair"][1], list)
    assert same["name"] == "digits"
    doubled = map_tensors(batch, lambda t: t * 2)
    assert torch.equal(doubled["x"], torch.full((2, 3), 2.0)) and doubled["name"] == "digits"
