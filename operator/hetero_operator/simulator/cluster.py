"""The simulated cluster: a small YAML file of GPU classes and groups of identical nodes.

```yaml
classes:
  - {name: v100, relativeSpeed: 1.0, memoryGiB: 16, costWeight: 2.0}
  - {name: k80, relativeSpeed: 0.2, memoryGiB: 12}
nodeGroups:
  - {gpuClass: v100, nodes: 4, gpusPerNode: 8}
  - {gpuClass: k80, nodes: 8, gpusPerNode: 4}
```

Node names are ``<class>-<index>`` unless a group sets ``namePrefix``. The result is the scheduler's
own `GPUClassInfo` and `NodeInfo` values, so the simulator feeds it exactly what the operator would.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hetero_operator.scheduler import GPUClassInfo, NodeInfo


class ClusterFileError(ValueError):
    """The cluster file is malformed; the message names the field and the fix."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class ClassSpec(_Strict):
    name: str = Field(min_length=1, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    relative_speed: float = Field(alias="relativeSpeed", gt=0, allow_inf_nan=False)
    memory_gib: float = Field(alias="memoryGiB", gt=0, allow_inf_nan=False)
    cost_weight: float = Field(default=1.0, alias="costWeight", ge=0, allow_inf_nan=False)


class NodeGroupSpec(_Strict):
    gpu_class: str = Field(alias="gpuClass", min_length=1)
    nodes: int = Field(ge=1)
    gpus_per_node: int = Field(alias="gpusPerNode", ge=1, le=64)
    name_prefix: str | None = Field(default=None, alias="namePrefix", min_length=1)


class ClusterSpec(_Strict):
    classes: list[ClassSpec] = Field(min_length=1)
    node_groups: list[NodeGroupSpec] = Field(alias="nodeGroups", min_length=1)

    @field_validator("classes")
    @classmethod
    def _unique_classes(cls, classes: list[ClassSpec]) -> list[ClassSpec]:
        repeated = sorted(n for n, k in Counter(c.name for c in classes).items() if k > 1)
        if repeated:
            raise ValueError(f"class names must be unique, repeated: {', '.join(repeated)}")
        return classes

    @model_validator(mode="after")
    def _groups_name_known_classes(self) -> ClusterSpec:
        known = {c.name for c in self.classes}
        for i, group in enumerate(self.node_groups):
            if group.gpu_class not in known:
                raise ValueError(
                    f"nodeGroups.{i}.gpuClass: {group.gpu_class!r} is not one of the classes "
                    f"({', '.join(sorted(known))}); add it under classes or fix the name"
                )
        return self


@dataclass(frozen=True, slots=True)
class Cluster:
    """Classes in file order (the order heterogeneity-unaware policies try them) and nodes."""

    classes: tuple[GPUClassInfo, ...]
    nodes: tuple[NodeInfo, ...]

    @property
    def class_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.classes)

    def gpus_per_class(self) -> dict[str, int]:
        totals = dict.fromkeys(self.class_names, 0)
        for node in self.nodes:
            totals[node.gpu_class] += node.gpus_allocatable
        return totals

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus_allocatable for n in self.nodes)

    def class_info(self, name: str) -> GPUClassInfo:
        for info in self.classes:
            if info.name == name:
                return info
        raise KeyError(name)


def build_cluster(spec: ClusterSpec) -> Cluster:
    classes = tuple(
        GPUClassInfo(c.name, c.relative_speed, c.memory_gib, cost_weight=c.cost_weight) for c in spec.classes
    )
    nodes: list[NodeInfo] = []
    next_index: Counter[str] = Counter()
    for group in spec.node_groups:
        prefix = group.name_prefix or group.gpu_class
        for _ in range(group.nodes):
            nodes.append(NodeInfo(f"{prefix}-{next_index[prefix]:04d}", group.gpu_class, group.gpus_per_node))
            next_index[prefix] += 1
    names = Counter(n.name for n in nodes)
    repeated = sorted(n for n, k in names.items() if k > 1)
    if repeated:
        raise ClusterFileError(
            f"nodeGroups: node names collide ({repeated[0]}); give groups distinct namePrefix"
        )
    return Cluster(classes, tuple(nodes))


def parse_cluster(data: object) -> Cluster:
    """Validate a decoded cluster document; errors name the field (``nodeGroups.0.nodes: ...``)."""
    try:
        spec = ClusterSpec.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        message = str(first["msg"]).removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            message = "unknown field; allowed: classes, nodeGroups (see the cluster file format)"
        raise ClusterFileError(f"{where}: {message}" if where else message) from exc
    return build_cluster(spec)


def load_cluster(path: Path) -> Cluster:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ClusterFileError(f"{path}: not valid YAML ({exc})") from exc
    return parse_cluster(data)
