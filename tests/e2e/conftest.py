"""The test bed most end-to-end modules run on: the demo's three local process nodes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.beds import bed_of

from hetero_operator.testbed.cluster import Testbed
from hetero_operator.testbed.nodes import load_node_list
from hetero_operator.testbed.versions import REPO_ROOT

DEMO_NODES = REPO_ROOT / "tests" / "e2e" / "nodes.yaml"


@pytest.fixture(scope="session")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    """Three local process nodes of the demo's classes, and nothing else a job could land on; one bed
    for every end-to-end module that needs no other kind (a module may define its own `bed` instead).
    Each test leaves it clean (tests/bed_hygiene.py); a module that sets the nodes' true speeds
    takes them off again."""
    with bed_of(tmp_path_factory.mktemp("e2e-bed"), load_node_list(DEMO_NODES)) as testbed:
        yield testbed
