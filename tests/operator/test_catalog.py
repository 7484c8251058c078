"""The throughput catalog: workload keys, the recency-weighted median each WorkloadProfile estimates,
its write from a job's measurement, and a new job placed and split by it. Expectations are worked out
here by hand or by brute force, never taken from the code under test."""

from __future__ import annotations

import asyncio
import math
import re
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from tests.operator.builders import job, job_body, profile, put_profile
from tests.operator.inprocess import Cluster

from hetero_operator.controller.catalog import (
    class_speeds,
    estimate,
    observe,
    weighted_median,
    workload_key,
)
from hetero_operator.controller.metrics import OperatorMetrics
from hetero_operator.metric_names import WORKLOAD_SAMPLES_PER_SECOND
from hetero_operator.rebalance.catalog_writes import PROFILES, record_measurement
from hetero_operator.resources import HeteroTrainJob, WorkloadProfile
from hetero_operator.resources.base import DNS_LABEL_PATTERN
from hetero_operator.resources.workload_profile import MAX_OBSERVATIONS, ProfileObservation

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def spec(**fields: object) -> HeteroTrainJob:
    return job(**fields)


# --- keys ------------------------------------------------------------------------------------------


def test_the_same_image_command_and_args_are_one_workload_and_any_difference_another() -> None:
    base = spec(
        image="registry.example/ml/resnet:1.2", command=["python", "train.py"], args=["--depth", "50"]
    )
    same = spec(
        image="registry.example/ml/resnet:1.2", command=["python", "train.py"], args=["--depth", "50"]
    )
    other_args = spec(
        image="registry.example/ml/resnet:1.2", command=["python", "train.py"], args=["--depth", "18"]
    )
    other_tag = spec(
        image="registry.example/ml/resnet:1.3", command=["python", "train.py"], args=["--depth", "50"]
    )
    keys = [workload_key(j.spec) for j in (base, same, other_args, other_tag)]
    assert keys[0] == keys[1]
    assert len(set(keys)) == 3
    assert all(key.startswith("resnet-") for key in keys), keys


def test_a_named_workload_is_its_own_key() -> None:
    assert workload_key(spec(workload="bert-base").spec) == "bert-base"


@given(image=st.text(min_size=1, max_size=200).filter(lambda s: s.strip() != ""))
def test_every_derived_key_is_a_valid_object_name(image: str) -> None:
    key = workload_key(spec(image=image).spec)
    assert re.match(DNS_LABEL_PATTERN, key) and len(key) <= 63, key


# --- the estimate ----------------------------------------------------------------------------------


@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(1, 5)), min_size=1, max_size=20))
def test_the_weighted_median_is_the_lower_median_of_the_values_repeated_by_weight(
    pairs: list[tuple[int, int]],
) -> None:
    expanded = sorted(value for value, weight in pairs for _ in range(weight))
    lower_median = expanded[math.ceil(len(expanded) / 2) - 1]
    assert weighted_median((float(v), float(w)) for v, w in pairs) == lower_median


def observation(job_name: str, ms: dict[str, float], age_hours: float = 0.0) -> ProfileObservation:
    return ProfileObservation(
        job=f"team/{job_name}", measured_at=NOW - timedelta(hours=age_hours), measured=profile(ms)
    )


def per_sample(found: object, gpu_class: str) -> float:
    assert found is not None
    return next(c.compute_ms_per_sample for c in found.classes if c.gpu_class == gpu_class)  # type: ignore[attr-defined]


def test_one_outlying_job_does_not_move_the_estimate() -> None:
    observations = [observation(f"j{i}", {"fast": 1.0, "slow": 3.0}) for i in range(4)]
    observations.append(observation("noisy", {"fast": 10.0, "slow": 30.0}))
    found = estimate(observations, NOW, half_life_hours=168)
    assert per_sample(found, "fast") == 1.0 and per_sample(found, "slow") == 3.0


def test_recent_jobs_outweigh_a_majority_of_old_ones_once_the_model_drifted() -> None:
    # Three observations four weeks old (weight 1/16 each at a one-week half-life) against two fresh.
    old = [observation(f"old{i}", {"fast": 2.0}, age_hours=4 * 168) for i in range(3)]
    new = [observation(f"new{i}", {"fast": 1.0}) for i in range(2)]
    assert per_sample(estimate([*old, *new], NOW, half_life_hours=168), "fast") == 1.0
    assert per_sample(estimate([*old, *new], NOW, half_life_hours=0), "fast") == 2.0  # no decay: majority


def test_a_job_measuring_again_replaces_its_own_observation_and_only_the_newest_jobs_are_kept() -> None:
    status = observe(None, "team/a", profile({"fast": 2.0}), NOW)
    status = observe(status, "team/a", profile({"fast": 1.0}), NOW + timedelta(minutes=5))
    assert [o.job for o in status.observations] == ["team/a"] and per_sample(status.estimate, "fast") == 1.0
    for i in range(MAX_OBSERVATIONS + 3):
        status = observe(status, f"team/j{i}", profile({"fast": 1.0, "slow": 4.0}), NOW + timedelta(hours=i))
    assert len(status.observations) == MAX_OBSERVATIONS == status.jobs
    assert status.observations[-1].job == f"team/j{MAX_OBSERVATIONS + 2}"
    assert "team/a" not in {o.job for o in status.observations}
    assert status.summary == "fast 1000/s, slow 250/s"


def test_measured_classes_take_their_measured_ratio_and_the_others_keep_their_prior() -> None:
    priors = {"fast": 1.0, "medium": 0.5, "slow": 0.25}
    speeds = class_speeds(priors, profile({"fast": 1.0, "medium": 1.25}))  # 1000 and 800 samples/s
    assert speeds["fast"] / speeds["medium"] == 1000 / 800
    # The measured pair keeps its geometric mean on the priors' scale, so slow stays where it was.
    assert math.isclose(math.sqrt(speeds["fast"] * speeds["medium"]), math.sqrt(1.0 * 0.5))
    assert speeds["slow"] == 0.25
    assert class_speeds(priors, None) == priors


# --- the write -------------------------------------------------------------------------------------


def test_measurements_of_two_jobs_land_in_one_profile_created_on_the_first() -> None:
    async def scenario() -> None:
        cluster = Cluster({"fast-0": ("fast", 1)})
        first = HeteroTrainJob.from_k8s(job_body("first", image="ml/digits:1"))
        second = HeteroTrainJob.from_k8s(job_body("second", image="ml/digits:1"))
        key = workload_key(first.spec)
        assert await record_measurement(cluster.kube, first, profile({"fast": 2.0}), NOW.timestamp())
        assert await record_measurement(
            cluster.kube, second, profile({"fast": 1.0, "slow": 4.0}), NOW.timestamp()
        )
        stored = await cluster.kube.get(f"{PROFILES}/{key}")
        assert stored is not None
        written = WorkloadProfile.from_k8s(stored)
        assert written.spec.workload == key == written.name
        assert written.status is not None
        assert [o.job for o in written.status.observations] == ["team/first", "team/second"]
        assert per_sample(written.status.estimate, "slow") == 4.0

    asyncio.run(scenario())


# --- a new job placed and split by it ---------------------------------------------------------------


def first_split(workload: str, **rebalance: object) -> list[int]:
    """The first plan of a two-GPU job (one fast, one slow GPU) of `workload`, on a cluster whose catalog
    measured the workload `digits` at 1.0 and 1.6 ms per sample (the priors say 1 : 0.25)."""

    async def scenario() -> list[int]:
        cluster = Cluster({"fast-0": ("fast", 1), "slow-0": ("slow", 1)})
        put_profile(cluster, "digits", {"fast": 1.0, "slow": 1.6})
        spec = {"workload": workload, "gpus": {"min": 2, "max": 2}, "batch": {"global": 260}}
        cluster.submit("train", **spec, rebalance=rebalance)
        await cluster.cycle()
        return list(cluster.status("train")["plan"]["localBatches"])

    return asyncio.run(scenario())


def test_a_job_whose_workload_was_measured_is_split_by_the_measurement_not_the_prior() -> None:
    assert first_split("digits") == [160, 100]  # 260 split 1/1.0 : 1/1.6
    assert first_split("digits", initialSplit="prior") == [208, 52]  # 260 split 1 : 0.25
    assert first_split("never-measured") == [208, 52]
    assert first_split("digits", initialSplit="even") == [130, 130]


def test_the_operator_exports_each_workloads_speed_per_class() -> None:
    registry = CollectorRegistry()
    metrics = OperatorMetrics(registry)
    metrics.set_catalog({"digits": profile({"fast": 1.0, "slow": 4.0})})
    sample = registry.get_sample_value
    assert sample(WORKLOAD_SAMPLES_PER_SECOND, {"workload": "digits", "gpu_class": "fast"}) == 1000.0
    assert sample(WORKLOAD_SAMPLES_PER_SECOND, {"workload": "digits", "gpu_class": "slow"}) == 250.0
    metrics.set_catalog({})  # the profile was deleted: its series go
    assert sample(WORKLOAD_SAMPLES_PER_SECOND, {"workload": "digits", "gpu_class": "fast"}) is None


def placed_classes(slow_ms_per_sample: float, workload: str = "digits") -> str:
    """Where an elastic job (one or two GPUs) of the workload `digits` starts, on one fast and one slow
    GPU, when the catalog measured the workload at 1 ms per sample on fast and `slow_ms_per_sample` on
    slow (3 ms fixed per step on both, 5 ms of all-reduce: `profile`)."""

    async def scenario() -> str:
        cluster = Cluster({"fast-0": ("fast", 1), "slow-0": ("slow", 1)})
        put_profile(cluster, "digits", {"fast": 1.0, "slow": slow_ms_per_sample})
        cluster.submit("train", workload=workload, gpus={"min": 1, "max": 2}, batch={"global": 256})
        await cluster.cycle()
        return str(cluster.status("train")["allocation"]["classes"])

    return asyncio.run(scenario())


def test_a_gpu_the_workload_measured_too_slow_to_help_is_not_given_to_it() -> None:
    # Worked by hand, one step of 256 samples: fast alone 3 + 256 = 259 ms of compute. With a slow GPU
    # at 1.1 ms per sample the two share it 134 : 122 (both ~137 ms), and 6 ms of all-reduce that a
    # lone GPU does not pay: about 1.8x. At 100 ms per sample the slow GPU's share is at most ~3
    # samples a step, a 1% gain that the all-reduce alone outweighs.
    assert placed_classes(1.1) == "fast:1,slow:1"
    assert placed_classes(100.0) == "fast:1"
    # An unmeasured workload goes by the priors (slow a quarter of fast), which say the slow GPU helps.
    assert placed_classes(100.0, workload="never-measured") == "fast:1,slow:1"


def test_a_pipeline_of_the_same_code_is_another_workload() -> None:
    data = spec(image="ml/digits:1", command=["python", "train.py"])
    pipelined = spec(image="ml/digits:1", command=["python", "train.py"], parallelism={"strategy": "hetpipe"})
    assert workload_key(data.spec) != workload_key(pipelined.spec)
