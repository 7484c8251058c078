"""ReadWriteOnce checkpoints: only rank 0's pod mounts the volume. Three gloo processes resume a job
whose saved state only rank 0 can read; the other ranks see, at the same path, a stale newer-named
checkpoint (what a node-local directory might hold). Every rank must start from rank 0's newest
checkpoint, as read back from the file the test saved."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.runtime.spawn import run_ranks

from hetero_operator.plan import CHECKPOINT_DIR_ENV, CHECKPOINT_RANK0_ONLY_ENV
from hetero_runtime.checkpoint import checkpoint_path, save_atomic

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(120)]
WORLD = 3


def model_state(seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return torch.nn.Linear(4, 3).state_dict()


def test_every_rank_starts_from_rank_0s_checkpoint(tmp_path: Path) -> None:
    volume, stale = tmp_path / "rank0-volume", tmp_path / "elsewhere"
    save_atomic({"epochs_done": 1, "model": model_state(1)}, checkpoint_path(volume, 1))
    newest = checkpoint_path(volume, 3)
    save_atomic({"epochs_done": 3, "model": model_state(3)}, newest)
    save_atomic({"epochs_done": 9, "model": model_state(9)}, checkpoint_path(stale, 9))
    out = tmp_path / "out"
    out.mkdir()

    started = run_ranks(
        "resume_rank0_only.py",
        WORLD,
        out,
        extra_env={CHECKPOINT_RANK0_ONLY_ENV: "1"},
        rank_env=lambda rank: {CHECKPOINT_DIR_ENV: str(volume if rank == 0 else stale)},
    )

    saved = torch.load(newest, weights_only=True)  # the expectation: the file itself
    assert [rank["checkpoint_dir"] for rank in started] == [str(volume), None, None]
    for rank in started:
        assert rank["epochs_done"] == saved["epochs_done"] == 3
        for name, tensor in saved["model"].items():
            assert torch.equal(torch.tensor(rank["model"][name]), tensor), name
