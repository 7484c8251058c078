"""How many GPUs this machine has, and the marks of tests that need more than one."""

from __future__ import annotations

import pytest
import torch


def gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def need_gpus(count: int) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        gpus() < count,
        reason=f"needs {count} GPUs: NCCL refuses two ranks on one GPU (ncclInvalidUsage: duplicate GPU)",
    )
