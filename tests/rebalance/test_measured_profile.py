"""The job's measured model per GPU class: what the rebalancer keeps in the job's status, and what the
scheduler places the job with next time (a restart, a resize, a requeue)."""

from __future__ import annotations

import pytest
from tests.operator.builders import allocation, job, job_body
from tests.rebalance.test_rebalance import (
    EVEN,
    FIXED_MS,
    MS_PER_SAMPLE_AT_FULL_SPEED,
    SPEEDS,
    policy,
    simulate,
)
from tests.scheduler.scheduler_cases import job as scheduled_job
from tests.scheduler.scheduler_cases import nodes

from hetero_operator.controller.facts import JobFacts
from hetero_operator.controller.inventory import job_request
from hetero_operator.planner import ClusterModel, WorkerModel
from hetero_operator.rebalance.decide import decide
from hetero_operator.rebalance.history import record
from hetero_operator.rebalance.job_status import measured_profile, published_status
from hetero_operator.resources import HeteroTrainJobStatus, MeasuredProfile
from hetero_operator.scheduler import ClassProfile, GPUClassInfo, Snapshot, schedule
from hetero_operator.scheduler import MeasuredProfile as SchedulerProfile


def test_workers_of_one_class_are_averaged_into_its_model() -> None:
    model = ClusterModel(
        (WorkerModel(1.0, 2.0, 0.5, 1.0), WorkerModel(3.0, 4.0, 1.5, 3.0), WorkerModel(8.0, 0.0, 4.0, 0.0)),
        t_o=5.0,
        t_u=1.0,
    )
    profile = measured_profile(model, ["fast", "fast", "slow"], plan_version=3)
    assert [(c.gpu_class, c.workers) for c in profile.classes] == [("fast", 2), ("slow", 1)]
    fast, slow = profile.classes
    assert (fast.compute_ms_per_sample, fast.compute_fixed_ms) == (2.0, 3.0)
    assert (fast.sync_ready_ms_per_sample, fast.sync_ready_fixed_ms) == (1.0, 2.0)
    assert (slow.compute_ms_per_sample, slow.compute_fixed_ms) == (8.0, 0.0)
    assert (profile.overlapped_allreduce_ms, profile.last_bucket_allreduce_ms, profile.plan_version) == (
        5,
        1,
        3,
    )


def test_a_decision_publishes_the_speeds_it_measured() -> None:
    history = record({}, simulate(EVEN), EVEN)
    first = decide(EVEN, history, policy(), simulate(EVEN), apply_at_epoch=2)
    assert first.plan is not None
    history = record(history, simulate(first.plan), first.plan)
    second = decide(first.plan, history, policy(min_improvement=0.0), simulate(first.plan), apply_at_epoch=3)
    status = HeteroTrainJobStatus(allocation=allocation(("n0", "fast"), ("n1", "medium"), ("n2", "slow")))
    patch = published_status(status, first.plan, second, 0.0)
    profile = MeasuredProfile.model_validate(patch["measured"])
    per_sample = {c.gpu_class: c.compute_ms_per_sample for c in profile.classes}
    # simulate(): MS_PER_SAMPLE_AT_FULL_SPEED / speed per sample, FIXED_MS / speed per step.
    for gpu_class, speed in zip(("fast", "medium", "slow"), SPEEDS, strict=True):
        expected = MS_PER_SAMPLE_AT_FULL_SPEED / speed
        assert per_sample[gpu_class] == pytest.approx(expected, rel=0.25), (gpu_class, profile)
        assert (
            next(c for c in profile.classes if c.gpu_class == gpu_class).compute_fixed_ms
            <= 2 * FIXED_MS / speed
        )
    assert profile.plan_version == first.plan.version


def test_the_scheduler_places_a_job_again_with_what_it_measured() -> None:
    measured = MeasuredProfile.model_validate(
        {
            "classes": [
                {
                    "gpuClass": "slow",
                    "computeMsPerSample": 0.5,
                    "computeFixedMs": 2.0,
                    "syncReadyMsPerSample": 0.25,
                    "syncReadyFixedMs": 1.0,
                    "workers": 2,
                }
            ],
            "overlappedAllreduceMs": 4.0,
            "lastBucketAllreduceMs": 1.0,
            "planVersion": 3,
        }
    )
    model, facts = job(), JobFacts.from_body(job_body())
    status = HeteroTrainJobStatus(measured=measured)
    request = job_request(facts, model, status, holding=False)
    assert request.profile is not None
    assert dict(request.profile.per_class) == {"slow": ClassProfile(0.5, 2.0, 0.25, 1.0)}
    assert (request.profile.t_o_ms, request.profile.t_u_ms) == (4.0, 1.0)
    unmeasured = job_request(facts, model, HeteroTrainJobStatus(), holding=False)
    assert unmeasured.profile is None


def test_a_measured_profile_can_turn_the_class_order_of_the_priors_around() -> None:
    # Priors say fast is 4x slow. A job that ran on both measured the opposite (a model that does not
    # gain from the faster GPU, as Gavel's table shows for recommendation): it goes to slow next time.
    # A class it has not run on is scaled from one it has by the priors, so one measured class alone
    # keeps the priors' order.
    classes = (GPUClassInfo("fast", 1.0, 16.0), GPUClassInfo("slow", 0.25, 16.0))
    node_list = (*nodes("fast", 1, 2), *nodes("slow", 1, 2))
    fast_model, slow_model = ClassProfile(4.0, 1.0, 2.0, 0.5), ClassProfile(0.5, 1.0, 0.25, 0.5)

    def measured(per_class: dict[str, ClassProfile]) -> SchedulerProfile:
        return SchedulerProfile.from_mapping(per_class, 1.0, 0.5)

    cases = (
        (None, "fast"),
        (measured({"fast": fast_model}), "fast"),
        (measured({"slow": slow_model}), "fast"),
        (measured({"fast": fast_model, "slow": slow_model}), "slow"),
    )
    for profile, expected in cases:
        request = scheduled_job("a", 2, profile=profile)
        decisions = schedule(Snapshot(classes=classes, nodes=node_list, jobs=(request,), now=0.0))
        placed = decisions.place[request.key]
        assert {w.gpu_class for w in placed.workers} == {expected}, (profile, placed)
