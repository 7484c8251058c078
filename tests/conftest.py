"""Shared fixtures: a live test bed per test session and a fresh namespace per test."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator

import pytest
from tests.bed_hygiene import beds_of, cluster_objects, forget_catalog
from tests.beds import fresh_namespace, running_bed

from hetero_operator.testbed import images
from hetero_operator.testbed.cluster import Testbed
from hetero_operator.testbed.container_store import Engine
from hetero_operator.warm_start import COLD_STARTS_ENV, DEFAULT_PRELOAD, OPERATOR_PRELOAD, warm_server


def pytest_configure(config: pytest.Config) -> None:
    """A SIGTERM (a CI time limit, say) ends the run like Ctrl-C, so fixtures still stop their test beds."""

    def interrupt(_signum: int, _frame: object) -> None:
        sys.exit(143)

    signal.signal(signal.SIGTERM, interrupt)


WARM_FOLDERS = (
    "tests/runtime",
    "tests/e2e",
    "tests/reliability",
    "tests/gpu",
    "tests/ship",
    "tests/kueue",
    "tests/operator",
)


ON_THE_BEDS = pytest.StashKey[list[tuple[Testbed, set[str]]]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> object:
    """After a test's set-up: what each test bed it runs on holds (see `bed_hygiene`)."""
    result = yield
    seen = []
    for bed in beds_of(getattr(item, "funcargs", {})):
        try:
            seen.append((bed, cluster_objects(bed)))
        except Exception:  # a bed that is not up (yet): nothing to hold the test to
            continue
    item.stash[ON_THE_BEDS] = seen
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """After its teardown: nothing of what it added is left on a bed that stays up."""
    result = yield
    for bed, before in item.stash.get(ON_THE_BEDS, []):
        try:
            forget_catalog(bed)
            left = cluster_objects(bed) - before
        except Exception:  # the bed went down with this teardown: nothing is left on it
            continue
        if left:
            raise AssertionError(
                f"{item.nodeid} left {', '.join(sorted(left))} on the shared test bed: a test deletes the "
                "cluster-scoped objects it creates, or the tests after it see them"
            )
    return result


TRAINING_FOLDERS = ("tests/e2e/", "tests/runtime/", "tests/gpu/")
# End-to-end modules that go with the control-plane tests, so that the two workers' shares come out
# about even: they mostly wait (on containers, on a start timeout), or what they assert does not
# depend on the simulated speeds holding (the steps a preempted job loses), and they boot their own
# beds, so they share none with the training lane.
OTHER_LANE_MODULES = ("tests/e2e/test_container_nodes.py", "tests/e2e/test_preemption_resume.py")


def lane_of(nodeid: str) -> str:
    """Which of the two workers a test runs on: the tests that train on this host's cores (end to
    end and runtime, but `OTHER_LANE_MODULES`) all on one, so that no two of them compete for the
    cores and each of their shared beds boots once; everything else on the other."""
    trains = nodeid.startswith(TRAINING_FOLDERS) and not nodeid.startswith(OTHER_LANE_MODULES)
    return "trains" if trains else "cluster"


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`make test` runs `-n 2 --dist loadgroup`: the work is split by `lane_of`, one lane a worker.
    (A scheduler of our own rather than xdist_group marks: pytest 9 keeps an item's node id when
    xdist appends the group to it, so the marks would group nothing.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByLane(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return lane_of(nodeid)

    return ByLane(config, log)


@pytest.fixture(scope="session", autouse=True)
def warm_starts(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One warm server for the run (hetero_operator.warm_start): the ranks, run-local workers, worker
    pods and operators that the tests start on this environment's Python begin with torch (or kopf)
    imported. Started
    only for runs with tests that start such processes; HETEROTRAIN_COLD_STARTS=1 starts them all fresh."""
    wanted = any(item.nodeid.startswith(WARM_FOLDERS) for item in request.session.items)
    if not wanted or os.environ.get(COLD_STARTS_ENV) == "1":
        yield
        return
    with warm_server(tmp_path_factory.mktemp("warm"), DEFAULT_PRELOAD + OPERATOR_PRELOAD):
        yield


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
