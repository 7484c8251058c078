"""How the API finds the Kubernetes API server and what it shares with the process around it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry

from hetero_operator.api.kube import KubeConnection
from hetero_operator.scheduler import SchedulerConfig


@dataclass(frozen=True)
class ApiSettings:
    """``kubeconfig``/``context`` (or, inside a pod, the service account) give the credentials the API
    reads with, unless ``connection`` is passed. ``registry`` is served on /metrics and receives the
    API's own request metrics (the operator passes its registry). ``readiness`` lets the host process
    hold /readyz until it is ready itself. ``scheduler`` must be the operator's scheduler settings so a
    what-if answers exactly as the operator would."""

    kubeconfig: Path | None = None
    context: str | None = None
    connection: KubeConnection | None = None
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    readiness: Callable[[], bool] | None = None
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    request_timeout_seconds: float = 15.0

    def kube_connection(self) -> KubeConnection:
        if self.connection is not None:
            return self.connection
        return KubeConnection.discover(self.kubeconfig, self.context)
