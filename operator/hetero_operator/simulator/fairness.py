"""Multi-tenant runs: one queue per tenant, each tenant's share of the cluster, and fairness measures.

Finish-time fairness (Themis, NSDI 2020; Gavel's "finish time fairness" policy): a tenant's rho is its
average JCT in the shared cluster over its average JCT alone on its own share of the cluster (its
weight over all weights, of every class). rho <= 1: sharing cost it nothing. Jain's index over the
tenants' rho is 1 when every tenant is treated alike and 1/n when one tenant takes all the slack.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from hetero_operator.scheduler.queues import ClassQuota, QueueInfo
from hetero_operator.simulator.cluster import Cluster, ClusterSpec, NodeGroupSpec, build_cluster


class FairnessSetupError(ValueError):
    """Tenant weights cannot split this cluster; the message names the fix."""


def shares(weights: Mapping[str, float]) -> dict[str, float]:
    total = sum(weights.values())
    return {tenant: weight / total for tenant, weight in weights.items()}


def tenant_queues(
    cluster: Cluster, weights: Mapping[str, float], cohort: str = "cluster"
) -> tuple[QueueInfo, ...]:
    """One queue per tenant: its weight, a nominal quota of its share of every class (rounded down),
    borrowing without limit from the others in one cohort."""
    totals = cluster.gpus_per_class()
    return tuple(
        QueueInfo(
            tenant,
            weight=weights[tenant],
            cohort=cohort,
            quotas={c: ClassQuota(int(total * share)) for c, total in totals.items()},
        )
        for tenant, share in shares(weights).items()
    )


def share_of_cluster(spec: ClusterSpec, share: float) -> Cluster:
    """The cluster with ``share`` of every node group's nodes (a tenant's isolated slice)."""
    groups = []
    for group in spec.node_groups:
        nodes = group.nodes * share
        if abs(nodes - round(nodes)) > 1e-9 or round(nodes) < 1:
            raise FairnessSetupError(
                f"nodeGroups[{group.gpu_class}].nodes: {group.nodes} nodes cannot be split into a share of "
                f"{share:.3f}; use a node count that every tenant's share divides"
            )
        groups.append(NodeGroupSpec.model_validate({**group.model_dump(), "nodes": round(nodes)}))
    return build_cluster(spec.model_copy(update={"node_groups": groups}))


def finish_time_fairness(shared_jct: float, isolated_jct: float) -> float:
    if isolated_jct <= 0:
        raise ValueError(f"isolated_jct: must be positive, got {isolated_jct}")
    return shared_jct / isolated_jct


def jain_index(values: Iterable[float]) -> float:
    """(sum x)^2 / (n * sum x^2): 1 when all are equal."""
    xs: Sequence[float] = list(values)
    if not xs or not any(xs):
        raise ValueError("values: need at least one non-zero value")
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))
