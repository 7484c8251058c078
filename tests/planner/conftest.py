from __future__ import annotations

import pytest
from planner_cases import three_gpu_cluster

from hetero_operator.planner.batch import ClusterModel


@pytest.fixture
def cluster() -> ClusterModel:
    return three_gpu_cluster()
