"""How the API finds the Kubernetes API server and what it shares with the process around it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry

from hetero_operator.api.health import DEFAULT_MAX_STALL_SECONDS, HostChecks
from hetero_operator.api.kube import KubeConnection
from hetero_operator.scheduler import SchedulerConfig


@dataclass(frozen=True)
class ApiSettings:
    """``kubeconfig``/``context`` (or, inside a pod, the service account) give the credentials the API
    reads with, unless ``connection`` is passed. ``registry`` is served on /metrics and receives the
    API's own request metrics (the operator passes its registry). ``host`` adds the host process's
    own checks to /healthz and /readyz; ``max_event_loop_stall_seconds`` is how long the serving event
    loop may go without running its heartbeat before /healthz fails. ``probe_timeout_seconds`` bounds
    the API server call /readyz makes (shorter than a probe's timeout). ``scheduler`` must be the
    operator's scheduler settings so a what-if answers exactly as the operator would."""

    kubeconfig: Path | None = None
    context: str | None = None
    connection: KubeConnection | None = None
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    host: HostChecks | None = None
    max_event_loop_stall_seconds: float = DEFAULT_MAX_STALL_SECONDS
    probe_timeout_seconds: float = 3.0
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    request_timeout_seconds: float = 15.0

    def kube_connection(self) -> KubeConnection:
        if self.connection is not None:
            return self.connection
        return KubeConnection.discover(self.kubeconfig, self.context)
