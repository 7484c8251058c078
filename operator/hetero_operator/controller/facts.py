"""What the operator keeps of each watched object: small frozen records parsed from API dictionaries.

The kopf indexes store these instead of whole bodies, so memory stays flat at thousands of pods and
every decision reads plain typed fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hetero_operator.controller import names
from hetero_operator.resources import (
    GPUClass,
    GPUClassStatus,
    HeteroQueue,
    HeteroQueueSpec,
    HeteroQueueStatus,
    HeteroTrainJob,
    InvalidResourceError,
)

TERMINAL_POD_PHASES = frozenset({"Succeeded", "Failed"})
SCHEDULING_TAINT_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


def _quantity(value: Any) -> int:
    """Extended resources are whole numbers; anything else counts as zero."""
    try:
        return int(str(value))
    except ValueError:
        return 0


def timestamp(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class NodeFacts:
    name: str
    labels: Mapping[str, str]
    allocatable: Mapping[str, int]
    ready: bool
    unschedulable: bool
    taints: tuple[Taint, ...] = ()

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> NodeFacts:
        metadata, spec, status = body.get("metadata", {}), body.get("spec") or {}, body.get("status") or {}
        conditions = status.get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        allocatable = {
            name: _quantity(value) for name, value in (status.get("allocatable") or {}).items() if "/" in name
        }
        taints = tuple(
            Taint(t.get("key", ""), t.get("value", "") or "", t.get("effect", ""))
            for t in spec.get("taints") or []
            if t.get("effect") in SCHEDULING_TAINT_EFFECTS
        )
        return cls(
            name=str(metadata.get("name", "")),
            labels=dict(metadata.get("labels") or {}),
            allocatable=allocatable,
            ready=ready,
            unschedulable=bool(spec.get("unschedulable", False)),
            taints=taints,
        )


@dataclass(frozen=True, slots=True)
class ClassFacts:
    """A valid GPUClass (invalid ones are left out of the index with a log line)."""

    name: str
    node_selector: Mapping[str, str]
    resource_name: str
    relative_speed: float
    memory_gib: float
    cost_weight: float
    tolerations: tuple[Mapping[str, Any], ...] = ()
    generation: int = 0
    reported: GPUClassStatus | None = None  # the status the class carries now

    @classmethod
    def from_model(cls, model: GPUClass) -> ClassFacts:
        spec = model.spec
        return cls(
            generation=int(model.metadata.get("generation") or 0),
            reported=model.status,
            name=model.name,
            node_selector=dict(spec.node_selector),
            resource_name=spec.resource_name,
            relative_speed=spec.relative_speed,
            memory_gib=spec.memory_gib,
            cost_weight=spec.cost_weight,
            tolerations=tuple(dict(t) for t in spec.tolerations or []),
        )

    def selects(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in self.node_selector.items())

    def tolerates(self, taint: Taint) -> bool:
        return any(_tolerates(toleration, taint) for toleration in self.tolerations)


def _tolerates(toleration: Mapping[str, Any], taint: Taint) -> bool:
    """Kubernetes toleration matching: empty key with Exists matches every taint."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.effect:
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return not key or key == taint.key
    return key == taint.key and str(toleration.get("value") or "") == taint.value


@dataclass(frozen=True, slots=True)
class PodFacts:
    namespace: str
    name: str
    node: str | None
    phase: str
    resources: Mapping[str, int] = field(default_factory=dict)
    job: str | None = None
    generation: int | None = None
    rank: int | None = None
    exit_code: int | None = None
    termination_message: str = ""  # what the finished container wrote at its terminationMessagePath
    deleting: bool = False
    checkpoint_requested: bool = False
    created_at: float | None = None
    waiting_reason: str | None = None  # why a container is not running yet, e.g. ErrImagePull
    waiting_message: str = ""

    @property
    def live(self) -> bool:
        """Still holding its node's resources (not finished)."""
        return self.phase not in TERMINAL_POD_PHASES

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> PodFacts:
        metadata, spec, status = body.get("metadata", {}), body.get("spec") or {}, body.get("status") or {}
        labels = metadata.get("labels") or {}
        annotations = metadata.get("annotations") or {}
        requested: dict[str, int] = {}
        for container in spec.get("containers") or []:
            resources = container.get("resources") or {}
            amounts = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
            for name, value in amounts.items():
                if "/" in name:
                    requested[name] = requested.get(name, 0) + _quantity(value)
        waiting_reason, waiting_message = _waiting(status)
        return cls(
            namespace=str(metadata.get("namespace", "")),
            name=str(metadata.get("name", "")),
            node=spec.get("nodeName") or None,
            phase=str(status.get("phase") or "Pending"),
            resources=requested,
            job=labels.get(names.LABEL_JOB),
            generation=_label_int(labels, names.LABEL_GENERATION),
            rank=_label_int(labels, names.LABEL_RANK),
            exit_code=_exit_code(status),
            termination_message=_termination_message(status),
            deleting=metadata.get("deletionTimestamp") is not None,
            checkpoint_requested=names.CHECKPOINT_REQUESTED_ANNOTATION in annotations,
            created_at=timestamp(metadata.get("creationTimestamp")),
            waiting_reason=waiting_reason,
            waiting_message=waiting_message,
        )


def _label_int(labels: Mapping[str, str], key: str) -> int | None:
    value = labels.get(key)
    return int(value) if value is not None and value.isdigit() else None


def _exit_code(status: Mapping[str, Any]) -> int | None:
    for container in status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated is not None:
            return int(terminated.get("exitCode", 0))
    return None


MAX_TERMINATION_MESSAGE = 1024


def _termination_message(status: Mapping[str, Any]) -> str:
    for container in status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated is not None:
            return str(terminated.get("message") or "").strip()[:MAX_TERMINATION_MESSAGE]
    return ""


MAX_WAITING_MESSAGE = 200


def _waiting(status: Mapping[str, Any]) -> tuple[str | None, str]:
    """Why a pod does not run yet: a waiting container's reason (init containers first), else a
    False pod condition's (Unschedulable, ...). The message is cut short: thousands of pods are kept."""
    containers = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    for container in containers:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            return str(waiting["reason"]), str(waiting.get("message") or "")[:MAX_WAITING_MESSAGE]
    for found in status.get("conditions") or []:
        if found.get("status") == "False" and found.get("reason"):
            return str(found["reason"]), str(found.get("message") or "")[:MAX_WAITING_MESSAGE]
    return None, ""


@dataclass(frozen=True, slots=True)
class JobFacts:
    """A HeteroTrainJob as the index keeps it: the parsed model, or why it does not parse."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    created_at: float
    deleting: bool
    model: HeteroTrainJob | None
    problems: tuple[str, ...] = ()
    phase: str | None = None
    finalizers: tuple[str, ...] = ()
    # The semantic problems found under the last settings the job was checked with: the index keeps one
    # object per version of the job and every cycle checks every job, so a version is checked once.
    checked: list[tuple[object, tuple[str, ...]]] = field(
        default_factory=list, init=False, compare=False, repr=False
    )

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> JobFacts:
        metadata = body.get("metadata", {})
        plain = {
            "apiVersion": body.get("apiVersion"),
            "kind": body.get("kind"),
            "metadata": dict(metadata),
            "spec": body.get("spec"),
            "status": body.get("status") or None,
        }
        problems: tuple[str, ...] = ()
        try:
            model: HeteroTrainJob | None = HeteroTrainJob.from_k8s(plain)
        except InvalidResourceError as error:
            model, problems = None, tuple(error.problems)
        return cls(
            namespace=str(metadata.get("namespace", "")),
            name=str(metadata.get("name", "")),
            uid=str(metadata.get("uid", "")),
            resource_version=str(metadata.get("resourceVersion", "")),
            created_at=timestamp(metadata.get("creationTimestamp")) or 0.0,
            deleting=metadata.get("deletionTimestamp") is not None,
            model=model,
            problems=problems,
            phase=(body.get("status") or {}).get("phase"),
            finalizers=tuple(metadata.get("finalizers") or ()),
        )


@dataclass(frozen=True)
class QueueFacts:
    """A valid HeteroQueue (invalid ones are left out of the index with a log line)."""

    name: str
    spec: HeteroQueueSpec
    reported: HeteroQueueStatus | None = None  # the status the queue carries now

    @classmethod
    def from_model(cls, model: HeteroQueue) -> QueueFacts:
        return cls(name=model.name, spec=model.spec, reported=model.status)
