"""Shared fixtures: a live test bed per test session and a fresh namespace per test."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator

import pytest
from tests.beds import fresh_namespace, running_bed

from hetero_operator.testbed import images
from hetero_operator.testbed.cluster import Testbed
from hetero_operator.testbed.container_store import Engine


def pytest_configure(config: pytest.Config) -> None:
    """A SIGTERM (a CI time limit, say) ends the run like Ctrl-C, so fixtures still stop their test beds."""

    def interrupt(_signum: int, _frame: object) -> None:
        sys.exit(143)

    signal.signal(signal.SIGTERM, interrupt)


@pytest.fixture(scope="session")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    """A running test bed with the CRDs installed and the example GPU nodes Ready."""
    with running_bed(tmp_path_factory.mktemp("testbed")) as bed:
        yield bed


@pytest.fixture
def namespace(testbed: Testbed) -> Iterator[str]:
    with fresh_namespace(testbed, "t") as name:
        yield name


@pytest.fixture(scope="session")
def container_engine() -> Engine:
    """buildah and podman on the test bed's container store (under the cache directory)."""
    return Engine()


@pytest.fixture(scope="session")
def built_images(container_engine: Engine) -> dict[str, str]:
    """The base, operator and trainer images of these sources, by name. `make test`'s bootstrap builds
    them; here they are only looked up (or built, once per content, when run without it)."""
    return images.ensure_images(container_engine)
