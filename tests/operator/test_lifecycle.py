"""The pure lifecycle, the inventory's snapshot and the status patch."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tests.operator.builders import TOLERATE_KWOK, allocation, job, pod

from hetero_operator.controller.facts import ClassFacts, JobFacts, NodeFacts, Taint
from hetero_operator.controller.inventory import ClusterView, build_snapshot, classify, job_request
from hetero_operator.controller.job_conditions import ConditionType, condition, is_true, set_condition
from hetero_operator.controller.job_cycle import arrival_times, status_patch
from hetero_operator.controller.lifecycle import (
    LifecycleConfig,
    Observation,
    Role,
    reconcile,
    scheduling_role,
)
from hetero_operator.controller.transitions import DrainReason, draining, invalid, queued, validated
from hetero_operator.resources import HeteroTrainJobStatus, Phase, Progress

NOW = 1_800_000_000.0
CONFIG = LifecycleConfig(checkpoint_grace_seconds=30)


def running_status(
    phase: Phase = Phase.RUNNING, generation: int = 0, restarts: int = 0
) -> HeteroTrainJobStatus:
    status = queued(job(), NOW - 100)
    return status.model_copy(
        update={
            "phase": phase,
            "allocation": allocation(("node-a", "fast"), ("node-b", "slow"), generation=generation),
            "restarts": restarts,
        }
    )


def step_for(
    status: HeteroTrainJobStatus, pods: list, now: float = NOW, lost: frozenset[str] = frozenset(), **spec
):
    return reconcile(Observation(job(status, **spec), tuple(pods), lost, now), CONFIG)


def workers(phase: str = "Running", generation: int = 0) -> list:
    return [
        pod(f"train-g{generation}-w0", phase, node="node-a", generation=generation, rank=0),
        pod(f"train-g{generation}-w1", phase, node="node-b", generation=generation, rank=1),
    ]


def test_an_unvalidated_job_is_left_alone() -> None:
    step = step_for(HeteroTrainJobStatus(), [])
    assert step.status == HeteroTrainJobStatus() and not step.ensure_generation


def test_starting_creates_missing_workers_then_runs_when_all_are_up() -> None:
    starting = running_status(Phase.STARTING)
    assert step_for(starting, workers()[:1]).ensure_generation
    step = step_for(starting, workers("Pending"))
    assert step.status.phase is Phase.STARTING and not step.ensure_generation
    step = step_for(starting, workers())
    assert step.status.phase is Phase.RUNNING
    assert is_true(step.status, ConditionType.PODS_READY)
    assert [e.reason for e in step.events] == ["Running"]


def test_all_workers_done_is_success() -> None:
    step = step_for(running_status(), workers("Succeeded"))
    assert step.status.phase is Phase.SUCCEEDED
    assert is_true(step.status, ConditionType.SUCCEEDED)


def test_a_failed_worker_restarts_the_group_after_a_doubling_backoff() -> None:
    pods = workers()
    pods[1] = pod("train-g0-w1", "Failed", node="node-b", rank=1, exit_code=3)
    spec: dict[str, Any] = {"restartPolicy": {"maxRestarts": 3, "backoffSeconds": 10}}
    step = step_for(running_status(restarts=1), pods, **spec)
    assert step.status.phase is Phase.RESTARTING and step.status.restarts == 2
    assert step.restarted and step.delete_pods == ("train-g0-w0",)
    assert step.wake_in == 20  # 10 s doubled for the second restart
    restarting = condition(step.status, ConditionType.RESTARTING)
    assert restarting is not None and "exit code 3" in restarting.message
    # During the backoff nothing starts; after it, the next generation starts on the same GPUs.
    waiting = step_for(step.status, [], now=NOW + 5, **spec)
    assert waiting.status.phase is Phase.RESTARTING and not waiting.ensure_generation
    restarted = step_for(step.status, [pods[1]], now=NOW + 21, **spec)
    assert restarted.status.phase is Phase.STARTING and restarted.ensure_generation
    assert restarted.status.allocation is not None and restarted.status.allocation.generation == 1
    assert step.status.allocation is not None
    assert restarted.status.allocation.workers == step.status.allocation.workers
    assert restarted.delete_pods == ("train-g0-w1",)  # the old generation's leftovers


def test_no_restarts_left_means_failed() -> None:
    pods = [pod("train-g0-w0", "Failed", exit_code=1), workers()[1]]
    step = step_for(running_status(restarts=1), pods, restartPolicy={"maxRestarts": 1})
    assert step.status.phase is Phase.FAILED
    assert is_true(step.status, ConditionType.FAILED)
    assert step.delete_pods == ("train-g0-w1",)


def test_a_worker_that_disappears_while_running_counts_as_a_failure() -> None:
    step = step_for(running_status(), workers()[:1])
    assert step.status.phase is Phase.RESTARTING


def test_node_loss_requeues_and_keeps_the_generation_counting() -> None:
    step = step_for(running_status(generation=4), workers(generation=4), lost=frozenset({"node-b"}))
    assert step.status.phase is Phase.QUEUED
    assert step.status.allocation is not None
    assert step.status.allocation.workers == [] and step.status.allocation.generation == 4
    assert step.force_delete_pods == ("train-g4-w1",) and step.delete_pods == ("train-g4-w0",)
    assert condition(step.status, ConditionType.PLACED).reason == "NodeLost"  # type: ignore[union-attr]
    assert step.status.restarts == 0  # not the job's fault


def test_suspend_drains_with_a_checkpoint_then_resume_requeues() -> None:
    step = step_for(running_status(), workers(), suspend=True)
    assert is_true(step.status, ConditionType.DRAINING)
    assert step.request_checkpoint == ("train-g0-w0", "train-g0-w1") and step.delete_pods == ()
    assert step.wake_in == 30
    annotated = [
        p.__class__(**{**{s: getattr(p, s) for s in p.__slots__}, "checkpoint_requested": True})
        for p in workers()
    ]
    during = step_for(step.status, annotated, now=NOW + 10, suspend=True)
    assert during.request_checkpoint == () and during.status.phase is Phase.RUNNING
    after = step_for(step.status, annotated, now=NOW + 31, suspend=True)
    assert after.status.phase is Phase.SUSPENDED
    assert after.delete_pods == ("train-g0-w0", "train-g0-w1")
    assert after.status.allocation is not None and after.status.allocation.workers == []
    resumed = step_for(after.status, [], now=NOW + 40, suspend=False)
    assert resumed.status.phase is Phase.QUEUED


def test_a_preempted_job_stops_early_once_its_workers_exited() -> None:
    status = draining(job(running_status()), DrainReason.PREEMPTED, "room for team/big", NOW)
    step = step_for(status, workers("Succeeded"), now=NOW + 1)
    assert step.status.phase is Phase.QUEUED  # finished workers under a drain are not a success
    assert condition(step.status, ConditionType.PLACED).reason == "Preempted"  # type: ignore[union-attr]
    assert not is_true(step.status, ConditionType.DRAINING)


def test_queued_jobs_wait_for_old_pods_before_they_can_be_placed() -> None:
    status = queued(job(), NOW)
    assert scheduling_role(job(status), status, []) is Role.QUEUED
    assert scheduling_role(job(status), status, workers()) is Role.NONE
    assert scheduling_role(job(running_status()), running_status(), workers()) is Role.HOLDING


def test_validation_queues_new_and_fixed_jobs_and_leaves_running_ones_running() -> None:
    fresh = validated(job(), NOW)
    assert fresh.phase is Phase.QUEUED and is_true(fresh, ConditionType.VALID)
    failed = invalid(None, ["spec.x: wrong"], NOW)
    assert failed.phase is Phase.FAILED
    assert validated(job(failed), NOW).phase is Phase.QUEUED
    running_but_invalid = invalid(running_status(), ["spec.x: wrong"], NOW)
    assert running_but_invalid.phase is Phase.RUNNING  # its workers are left alone
    fixed = validated(job(running_but_invalid), NOW)
    assert fixed.phase is Phase.RUNNING and is_true(fixed, ConditionType.VALID)


def test_an_identical_condition_changes_nothing_and_transitions_keep_their_time() -> None:
    status = set_condition(HeteroTrainJobStatus(), ConditionType.PLACED, False, "Unschedulable", "x", NOW)
    assert set_condition(status, ConditionType.PLACED, False, "Unschedulable", "x", NOW + 9) is status
    changed = set_condition(status, ConditionType.PLACED, False, "Unschedulable", "y", NOW + 9)
    before, after = condition(status, ConditionType.PLACED), condition(changed, ConditionType.PLACED)
    assert before is not None and after is not None
    assert after.message == "y" and after.last_transition_time == before.last_transition_time


def test_status_patch_touches_only_changed_fields() -> None:
    old = running_status().model_copy(update={"progress": Progress(epoch=2)})
    new = old.model_copy(update={"phase": Phase.SUCCEEDED, "allocation": None})
    assert status_patch(old, new) == {"phase": "Succeeded", "allocation": None}
    assert status_patch(old, old) == {}


# --- inventory -------------------------------------------------------------------------------------

FAST = ClassFacts("fast", {"gpu": "a100"}, "nvidia.com/gpu", 1.0, 80, 4, (TOLERATE_KWOK,))
SLOW = ClassFacts("slow", {"gpu": "t4"}, "nvidia.com/gpu", 0.25, 16, 1)
KWOK_TAINT = Taint("kwok.x-k8s.io/node", "fake", "NoSchedule")


def node(name: str, label: str, gpus: int = 4, **extra) -> NodeFacts:
    fields = {"ready": True, "unschedulable": False, "taints": (), **extra}
    return NodeFacts(name, {"gpu": label}, {"nvidia.com/gpu": gpus}, **fields)


def test_nodes_map_to_classes_and_untolerated_taints_make_them_unschedulable() -> None:
    nodes = [
        node("a", "a100", taints=(KWOK_TAINT,)),
        node("b", "t4", taints=(KWOK_TAINT,)),
        node("c", "a100", unschedulable=True),
        node("d", "a100", ready=False),
        node("e", "h100"),
    ]
    view = ClusterView.build([FAST, SLOW], nodes, [], [])
    assert classify(nodes[4], [FAST, SLOW]) is None
    schedulable = {name: view.schedulable(view.nodes[name]) for name in view.node_class}
    assert schedulable == {"a": True, "b": False, "c": False, "d": False}
    snapshot = build_snapshot(view, [], NOW)
    assert [(n.name, n.schedulable) for n in snapshot.nodes] == [
        ("a", True),
        ("b", False),
        ("c", False),
        ("d", False),
    ]


def test_gpus_used_by_others_count_foreign_pods_and_pods_beyond_an_allocation() -> None:
    status = running_status().model_copy(update={"allocation": allocation(("a", "fast"), ("a", "fast"))})
    facts = JobFacts("team", "train", "uid-1", "7", NOW, False, job(status))
    pods = [
        pod("train-g0-w0", node="a", rank=0),
        pod("train-g0-w1", node="a", rank=1),
        pod("train-g0-w2", node="a", rank=2),  # a worker beyond the allocation, still saving a checkpoint
        pod("other", node="a", job_name=None, generation=None, rank=None, gpus=1),
        pod("done", "Succeeded", node="b", job_name=None, generation=None, rank=None, gpus=4),
    ]
    view = ClusterView.build([FAST, SLOW], [node("a", "a100"), node("b", "t4")], [facts], pods)
    request = job_request(facts, facts.model, status, holding=True)  # type: ignore[arg-type]
    snapshot = build_snapshot(view, [request], NOW)
    used = {n.name: (n.gpus_used_by_others, n.gpus_releasing) for n in snapshot.nodes}
    assert used == {"a": (2, 1), "b": (0, 0)}, "the worker beyond the allocation is being handed back"
    assert snapshot.jobs[0].current is not None and snapshot.jobs[0].current.total_gpus == 2
    # The same pods without the job in the snapshot all count as someone else's, nothing coming back.
    without = {n.name: (n.gpus_used_by_others, n.gpus_releasing) for n in build_snapshot(view, [], NOW).nodes}
    assert without == {"a": (4, 0), "b": (0, 0)}


def test_a_running_jobs_eta_is_the_training_it_has_left_for_the_scheduler() -> None:
    progress = Progress(epoch=3, samples_per_second=50.0, eta_seconds=420.0)
    status = running_status().model_copy(
        update={"allocation": allocation(("a", "fast"), ("a", "fast")), "progress": progress}
    )
    facts = JobFacts("team", "train", "uid-1", "7", NOW, False, job(status))
    assert job_request(facts, facts.model, status, holding=True).remaining_s == 420.0  # type: ignore[arg-type]
    # Without GPUs there is nothing to resize; without an ETA the scheduler goes by throughput alone.
    assert job_request(facts, facts.model, status, holding=False).remaining_s is None  # type: ignore[arg-type]
    unknown = status.model_copy(update={"progress": Progress(epoch=0)})
    assert job_request(facts, facts.model, unknown, holding=True).remaining_s is None  # type: ignore[arg-type]
    # Measured 100 s ago: 320 s are left now.
    measured = progress.model_copy(update={"updated_at": datetime.fromtimestamp(NOW - 100, tz=UTC)})
    earlier = status.model_copy(update={"progress": measured})
    assert job_request(facts, facts.model, earlier, holding=True, now=NOW).remaining_s == 320.0  # type: ignore[arg-type]


def test_queueing_stamps_the_arrival_once() -> None:
    first = queued(job(), NOW + 0.123456)
    assert first.queued_at is not None and first.queued_at.timestamp() == NOW + 0.123456
    again = queued(job(first), NOW + 50)  # re-validated later: the place in the queue is kept
    assert again.queued_at == first.queued_at


def test_jobs_first_seen_together_arrive_in_creation_order() -> None:
    # Same creationTimestamp second; the later creation has the higher resourceVersion.
    later = JobFacts("team", "a-later", "uid-a", "120", NOW, False, job())
    earlier = JobFacts("team", "z-earlier", "uid-z", "99", NOW, False, job())
    older = JobFacts("team", "m-older", "uid-m", "500", NOW - 1, False, job())
    known = JobFacts("team", "known", "uid-k", "7", NOW - 9, False, job(queued(job(), NOW - 9)))
    arrivals = arrival_times([later, earlier, older, known], NOW + 5)
    assert "team/known" not in arrivals  # already queued: keeps its stamp
    order = sorted(arrivals, key=arrivals.__getitem__)
    assert order == ["team/m-older", "team/z-earlier", "team/a-later"]


def test_the_snapshot_orders_by_arrival_not_by_creation_second() -> None:
    head_status = queued(job(), NOW + 0.2)
    greedy_status = queued(job(), NOW + 0.7)
    head = JobFacts("team", "head", "uid-h", "10", NOW, False, job(head_status))
    greedy = JobFacts("team", "greedy", "uid-g", "11", NOW, False, job(greedy_status))
    head_request = job_request(head, job(head_status), head_status, holding=False)
    greedy_request = job_request(greedy, job(greedy_status), greedy_status, holding=False)
    assert head_request.created_at < greedy_request.created_at
