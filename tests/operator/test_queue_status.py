"""HeteroQueue in the operator: the inventory reads queues into the snapshot (usage charged on from
the status), a quota naming no GPUClass is left out with the field named, and the status after a
cycle counts GPUs per class against quota; expected values are worked out by hand."""

from __future__ import annotations

import math

from tests.operator.test_class_status import gpu_class, node

from hetero_operator.controller.facts import QueueFacts
from hetero_operator.controller.inventory import ClusterView, build_snapshot
from hetero_operator.controller.queue_status import charged_usage, desired_statuses
from hetero_operator.controller.queue_status_writes import MIN_INTERVAL_SECONDS, REFRESH_SECONDS, due_writes
from hetero_operator.resources import HeteroQueue, HeteroQueueStatus
from hetero_operator.scheduler import Allocation, JobRequest, SchedulerConfig, WorkerSlot, schedule
from hetero_operator.scheduler.charging import Charging

CHARGING = Charging(half_life_s=100.0)


def queue(name: str, nominal: int, status: dict[str, object] | None = None) -> QueueFacts:
    manifest: dict[str, object] = {
        "apiVersion": "heterotrain.io/v1alpha1",
        "kind": "HeteroQueue",
        "metadata": {"name": name},
        "spec": {
            "weight": 2,
            "quotas": [{"gpuClass": "v100", "nominal": nominal}, {"gpuClass": "h100", "nominal": 1}],
        },
    }
    if status is not None:
        manifest["status"] = status
    return QueueFacts.from_model(HeteroQueue.from_k8s(manifest))


def view(*queues: QueueFacts) -> ClusterView:
    return ClusterView.build([gpu_class("v100", "V100")], [node("n0", "V100", 4)], [], [], queues=queues)


def running(key: str, gpus: int, queue_name: str) -> JobRequest:
    slots = tuple(WorkerSlot(rank, "n0", "v100") for rank in range(gpus))
    return JobRequest(key, gpus, gpus, 64, 0.0, queue=queue_name, current=Allocation(slots))


def test_usage_is_charged_on_from_the_status_at_the_rate_held() -> None:
    facts = queue("a", 4, {"chargedUsage": 10.0, "chargedAt": 1000.0})
    tau = 100.0 / math.log(2)
    # 100 s (one half-life) at 2 reference GPUs: 10 / 2 + 2 * tau / 2.
    assert charged_usage(facts, 2.0, 1100.0, CHARGING) == 5.0 + tau
    assert charged_usage(queue("b", 4), 2.0, 1100.0, CHARGING) == 0.0  # never charged yet


def test_the_snapshot_has_the_queues_without_quotas_for_unknown_classes() -> None:
    facts = queue("a", 4, {"chargedUsage": 8.0, "chargedAt": 0.0})
    snapshot = build_snapshot(view(facts), [running("ns/x", 2, "a")], 100.0, CHARGING)
    (info,) = snapshot.queues
    assert dict(info.quotas) == {"v100": info.quota("v100")} and info.quota("v100").nominal == 4
    assert info.weight == 2.0
    tau = 100.0 / math.log(2)
    # One class: 2 GPUs cost 2 per second; 8 halves to 4 in the half-life, plus 2 * tau / 2.
    assert math.isclose(info.usage, 4.0 + tau)


def test_status_after_a_cycle_counts_gpus_against_quota_and_names_bad_fields() -> None:
    facts = queue("a", 1)
    jobs = [running("ns/x", 2, "a"), JobRequest("ns/y", 1, 1, 64, 5.0, queue="a")]
    snapshot = build_snapshot(view(facts), jobs, 0.0, CHARGING)
    decisions = schedule(snapshot, SchedulerConfig(charging=CHARGING, elastic=False, move_gain=None))
    status = desired_statuses(snapshot, decisions, {"a": facts}, CHARGING)["a"]
    # x holds 2 of a nominal 1 (no cohort: it was placed before the quota); y waits on the quota.
    assert "ns/y" not in decisions.place
    assert [(u.gpu_class, u.gpus, u.nominal, u.borrowed) for u in status.usage] == [("v100", 2, 1, 1)]
    assert status.summary == "v100 2/1"
    assert (status.running_jobs, status.pending_jobs) == (1, 1)
    tau = 100.0 / math.log(2)
    assert math.isclose(status.share, 2 * tau / 2.0, rel_tol=1e-6)  # (0 + rate 2 * tau) / weight 2
    assert (
        status.message is not None and "spec.quotas[1].gpuClass: no GPUClass named 'h100'" in status.message
    )


def test_status_writes_follow_counts_at_once_and_charges_now_and_then() -> None:
    before = HeteroQueueStatus(summary="v100 1/4", charged_usage=1.0, share=1.0, charged_at=0.0)
    recharged = before.model_copy(update={"charged_usage": 2.0, "charged_at": 10.0})
    recounted = recharged.model_copy(update={"summary": "v100 2/4"})
    sent = {"a": before}
    assert due_writes({"a": recharged}, {"a": before}, sent, {"a": 0.0}, 10.0) == {}
    assert due_writes({"a": recharged}, {"a": before}, sent, {"a": 0.0}, REFRESH_SECONDS) == {"a": recharged}
    assert due_writes({"a": recounted}, {"a": before}, sent, {"a": 0.0}, MIN_INTERVAL_SECONDS / 2) == {}
    assert due_writes({"a": recounted}, {"a": before}, sent, {"a": 0.0}, MIN_INTERVAL_SECONDS) == {
        "a": recounted
    }
