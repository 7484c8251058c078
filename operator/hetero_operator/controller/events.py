"""Kubernetes Events about a job (pure builders): what `kubectl describe htj` lists under Events.

Every writer of a job's Events (the scheduling loop, the rebalancer) builds them here, so each names
its job the same way, uid included, and the API server names the Event itself (generateName).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hetero_operator.resources import GROUP, VERSION, HeteroTrainJob

COMPONENT = "heterotrain-operator"
MAX_MESSAGE = 1024


def involved(namespace: str, name: str, uid: str) -> dict[str, str]:
    """The `involvedObject` of an Event about a job."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "HeteroTrainJob",
        "name": name,
        "namespace": namespace,
        "uid": uid,
    }


def stamp(now: float) -> str:
    """An RFC 3339 time in whole seconds, as Events and annotations carry them."""
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_manifest(
    about: dict[str, str], event_type: str, reason: str, message: str, now: float
) -> dict[str, Any]:
    """A core/v1 Event on the object `about` (an `involved` mapping)."""
    when = stamp(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{about['name']}.", "namespace": about["namespace"]},
        "involvedObject": about,
        "type": event_type,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "firstTimestamp": when,
        "lastTimestamp": when,
        "count": 1,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
    }


def job_event(job: HeteroTrainJob, event_type: str, reason: str, message: str, now: float) -> dict[str, Any]:
    about = involved(job.namespace, job.name, str(job.metadata.get("uid", "")))
    return event_manifest(about, event_type, reason, message, now)
