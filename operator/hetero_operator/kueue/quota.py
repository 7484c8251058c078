"""How many GPUs of each class a ClusterQueue can admit: its quota per ResourceFlavor, matched to the
GPU classes the way Kueue matches a pod set to a flavor.

Kueue gives each pod set (here: one GPU class) one flavor per resource: the first flavor of the
ClusterQueue's resource group, in its order, whose node labels agree with the pod set's node
selector on every label key the group's flavors use. The supported layout is one ResourceFlavor per
GPU class (node labels = the class's node selector). Where one flavor would serve several classes,
only the fastest of them is counted on it, so a proposal never asks a flavor for more than it has.
Borrowing from a cohort is not counted: a proposal fits the queue's own nominal quota.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hetero_operator.controller.facts import ClassFacts
from hetero_operator.kueue.facts import ClusterQueueFacts, FlavorFacts, ResourceGroup


@dataclass(frozen=True, slots=True)
class ClassQuota:
    """The flavor a GPU class's pod set would get in a ClusterQueue, and its GPUs."""

    gpu_class: str
    flavor: str
    nominal: int
    used: int

    @property
    def unused(self) -> int:
        return max(0, self.nominal - self.used)


def flavor_fits(node_labels: Mapping[str, str], selector: Mapping[str, str], keys: frozenset[str]) -> bool:
    """Kueue's check: the flavor's labels agree with the selector on the keys its group uses."""
    return all(node_labels.get(key) == value for key, value in selector.items() if key in keys)


def _group_keys(group: ResourceGroup, flavors: Mapping[str, FlavorFacts]) -> frozenset[str]:
    return frozenset(
        key for f in group.flavors if f.flavor in flavors for key in flavors[f.flavor].node_labels
    )


def class_quotas(
    queue: ClusterQueueFacts, flavors: Mapping[str, FlavorFacts], classes: Iterable[ClassFacts]
) -> dict[str, ClassQuota]:
    """Each GPU class the queue offers quota for, with its flavor; classes it offers none for are
    left out. Faster classes claim a shared flavor first."""
    result: dict[str, ClassQuota] = {}
    claimed: set[str] = set()
    for gpu_class in sorted(classes, key=lambda c: (-c.relative_speed, c.name)):
        resource = gpu_class.resource_name
        found = _first_flavor(queue, flavors, gpu_class, claimed)
        if found is None:
            continue
        flavor, nominal = found
        claimed.add(flavor)
        result[gpu_class.name] = ClassQuota(gpu_class.name, flavor, nominal, queue.used(flavor, resource))
    return result


def _first_flavor(
    queue: ClusterQueueFacts, flavors: Mapping[str, FlavorFacts], gpu_class: ClassFacts, claimed: set[str]
) -> tuple[str, int] | None:
    resource = gpu_class.resource_name
    for group in queue.groups:
        if resource not in group.covered:
            continue
        keys = _group_keys(group, flavors)
        for quota in group.flavors:
            known = flavors.get(quota.flavor)
            if known is None or quota.flavor in claimed:
                continue
            if (
                flavor_fits(known.node_labels, gpu_class.node_selector, keys)
                and quota.nominal.get(resource, 0) > 0
            ):
                return quota.flavor, quota.nominal[resource]
    return None


def fits(mix: Mapping[str, int], quotas: Mapping[str, ClassQuota], unused: bool) -> bool:
    """Whether every class of `mix` (GPUs per class) fits its flavor's nominal quota, or its unused
    quota when `unused`."""
    for gpu_class, gpus in mix.items():
        quota = quotas.get(gpu_class)
        if quota is None or gpus > (quota.unused if unused else quota.nominal):
            return False
    return True
