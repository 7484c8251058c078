"""Keeps local nodes Ready, as a kubelet does: their status every half minute (or at once when it is
not Ready) and their Lease in kube-node-lease every tenth of its duration."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from kubernetes.client.exceptions import ApiException

from hetero_operator.testbed import pod_status
from hetero_operator.testbed.nodes import LOCAL_RUNTIME_LABEL

LEASE_SECONDS = 40
STATUS_HEARTBEAT_SECONDS = 30


class NodeHeartbeat:
    def __init__(self, core: Any, coordination: Any) -> None:
        self.core = core
        self.coordination = coordination
        self.last_status_beat: dict[str, float] = {}
        self.last_lease_beat: dict[str, float] = {}

    def beat(self, node: Any) -> None:
        name = node.metadata.name
        now = time.monotonic()
        ready = any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))
        if not ready or now - self.last_status_beat.get(name, 0) > STATUS_HEARTBEAT_SECONDS:
            runtime = (node.metadata.labels or {}).get(LOCAL_RUNTIME_LABEL, "process")
            stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            self.core.patch_node_status(name, pod_status.node_ready(name, runtime, stamp))
            self.last_status_beat[name] = now
        if now - self.last_lease_beat.get(name, 0) > LEASE_SECONDS / 4:
            self._renew_lease(name)
            self.last_lease_beat[name] = now

    def _renew_lease(self, node_name: str) -> None:
        renew = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        spec = {"holderIdentity": node_name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": renew}
        try:
            self.coordination.patch_namespaced_lease(node_name, "kube-node-lease", {"spec": spec})
        except ApiException as err:
            if err.status != 404:
                raise
            body = {"metadata": {"name": node_name, "namespace": "kube-node-lease"}, "spec": spec}
            self.coordination.create_namespaced_lease("kube-node-lease", body)
