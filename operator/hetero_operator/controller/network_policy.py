"""A NetworkPolicy per job (pure): its workers accept traffic from the same job's workers (any port:
the rendezvous, NCCL's and gloo's own ports) and from Prometheus on the metrics port, nothing else.

Per job rather than one policy for the chart: a shared policy could only let every worker reach
every other job's workers, since the job label's value differs per job.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field, field_validator
from pydantic.dataclasses import dataclass as settings

from hetero_operator.controller import names
from hetero_operator.resources import HeteroTrainJob

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


@settings(frozen=True)
class NetworkPolicyOptions:
    """A NetworkPolicy per job that lets in only its own workers and Prometheus (the operator's
    settings; the cluster's network plugin must enforce NetworkPolicies)."""

    enabled: Annotated[
        bool,
        Field(
            description="Create a NetworkPolicy with each job: its workers accept traffic only from the "
            "job's own workers and, on the metrics port, from Prometheus."
        ),
    ] = False
    prometheus_namespace: Annotated[
        str, Field(description="Namespace Prometheus runs in (empty: any namespace).")
    ] = "monitoring"
    prometheus_pod_labels: Annotated[
        str,
        Field(
            description="Labels of the Prometheus pods, as key=value pairs separated by commas (empty: "
            "every pod of prometheusNamespace)."
        ),
    ] = "app.kubernetes.io/name=prometheus"

    @field_validator("prometheus_pod_labels")
    @classmethod
    def _pairs(cls, text: str) -> str:
        parse_labels(text)
        return text


def parse_labels(text: str) -> dict[str, str]:
    """`a=b,c=d` as a mapping; a pair without `=` is an error that shows it."""
    labels: dict[str, str] = {}
    for pair in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{pair!r} is not key=value: write the labels as key=value,key=value")
        labels[key.strip()] = value.strip()
    return labels


def policy_name(job: str) -> str:
    return f"{job}-workers"


def _prometheus_peer(options: NetworkPolicyOptions) -> dict[str, Any]:
    peer: dict[str, Any] = {"podSelector": {"matchLabels": parse_labels(options.prometheus_pod_labels)}}
    if options.prometheus_namespace:
        peer["namespaceSelector"] = {"matchLabels": {NAMESPACE_NAME_LABEL: options.prometheus_namespace}}
    else:
        peer["namespaceSelector"] = {}
    return peer


def network_policy(
    job: HeteroTrainJob, options: NetworkPolicyOptions, metrics_port: int, owner: Mapping[str, Any]
) -> dict[str, Any]:
    """The job's policy; its owner reference makes the garbage collector delete it with the job."""
    workers = {"matchLabels": {names.LABEL_JOB: job.name}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": policy_name(job.name),
            "namespace": job.namespace,
            "labels": {names.LABEL_JOB: job.name, names.LABEL_MANAGED_BY: names.MANAGED_BY},
            "ownerReferences": [dict(owner)],
        },
        "spec": {
            "podSelector": workers,
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": workers}]},
                {"from": [_prometheus_peer(options)], "ports": [{"protocol": "TCP", "port": metrics_port}]},
            ],
        },
    }
