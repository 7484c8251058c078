"""Every test here needs an NVIDIA GPU: without CUDA the whole directory is skipped."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU: torch.cuda.is_available() is False")
    for item in items:
        if "tests/gpu/" in item.nodeid:
            item.add_marker(skip)
