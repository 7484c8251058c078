"""The `Placed=False` message names, class by class, every filter that keeps a node from a waiting
job: an untolerated taint (with its key), a selector that matches no node, a cordon, a node that is
not Ready, a node without GPUs, and too few free GPUs. From node and class facts, through the
inventory's snapshot and one scheduler cycle, to the sentence a user reads."""

from __future__ import annotations

from tests.operator.builders import job

from hetero_operator.controller.facts import ClassFacts, JobFacts, NodeFacts, Taint
from hetero_operator.controller.inventory import ClusterView, build_snapshot, job_request
from hetero_operator.controller.transitions import queued
from hetero_operator.scheduler import schedule

NOW = 1_800_000_000.0
GPU = "nvidia.com/gpu"
CLASSES = ("tainted", "cordoned", "notready", "nogpus", "unmatched", "short", "mixed")


def gpu_class(name: str) -> ClassFacts:
    return ClassFacts(name, {"product": name}, GPU, 1.0, 16, 1)


def node(name: str, product: str, gpus: int = 4, **extra: object) -> NodeFacts:
    fields: dict = {"ready": True, "unschedulable": False, "taints": (), **extra}
    return NodeFacts(name, {"product": product}, {GPU: gpus}, **fields)


def placed_message() -> str:
    nodes = [
        node("t-0", "tainted", taints=(Taint("maintenance", "now", "NoSchedule"),)),
        node("c-0", "cordoned", unschedulable=True),
        node("r-0", "notready", ready=False),
        node("g-0", "nogpus", gpus=0),
        node("s-0", "short", gpus=2),
        node("m-0", "mixed", gpus=1),
        node("m-1", "mixed", ready=False),
        node("m-2", "mixed", taints=(Taint("dedicated", "", "NoExecute"),)),
    ]
    model = job(gpus={"min": 4, "max": 4}, gpuClasses=list(CLASSES))
    status = queued(model, NOW)
    facts = JobFacts("team", "train", "uid-1", "1", NOW, False, model.model_copy(update={"status": status}))
    view = ClusterView.build([gpu_class(name) for name in CLASSES], nodes, [facts], [])
    request = job_request(facts, model, status, holding=False)
    decisions = schedule(build_snapshot(view, [request], NOW))
    return decisions.unschedulable["team/train"].message


def class_phrase(message: str, name: str) -> str:
    (phrase,) = [part for part in message.split("; ") if part.startswith(f"class {name}:")]
    return phrase


def test_every_filter_is_named_for_its_class() -> None:
    message = placed_message()
    assert class_phrase(message, "tainted") == (
        "class tainted: no schedulable nodes (1 of 1 node excluded: 1 taint maintenance=now:NoSchedule "
        "not tolerated (tolerate it in the GPUClass's spec.tolerations))"
    )
    assert (
        class_phrase(message, "cordoned")
        == "class cordoned: no schedulable nodes (1 of 1 node excluded: 1 cordoned)"
    )
    assert class_phrase(message, "notready") == (
        "class notready: no schedulable nodes (1 of 1 node excluded: 1 not Ready)"
    )
    assert class_phrase(message, "nogpus") == (
        "class nogpus: no schedulable nodes (1 of 1 node excluded: 1 no nvidia.com/gpu allocatable)"
    )
    assert (
        class_phrase(message, "unmatched")
        == "class unmatched: no schedulable nodes (no node matches its nodeSelector)"
    )
    assert class_phrase(message, "short") == "class short: 2 of 4 GPUs free"
    mixed = class_phrase(message, "mixed")
    assert mixed.startswith("class mixed: 1 of 4 GPUs free, 2 of 3 nodes excluded: ")
    assert "1 not Ready" in mixed and "1 taint dedicated:NoExecute not tolerated" in mixed
