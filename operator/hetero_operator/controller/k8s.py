"""A small async Kubernetes client on aiohttp (kopf's own HTTP library), with kopf's credentials.

Only what the operator writes goes through here (creates, patches, deletes, events); everything it
reads comes from kopf's watches and indexes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp
import kopf

from hetero_operator.kueue.constants import API_VERSION as KUEUE_API_VERSION
from hetero_operator.resources import GROUP, VERSION

CORE = "/api/v1"
HETEROTRAIN = f"/apis/{GROUP}/{VERSION}"
KUEUE = f"/apis/{KUEUE_API_VERSION}"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"  # JSON is YAML: server-side apply takes a JSON body

PLURALS = {
    "Pod": (CORE, "pods"),
    "Service": (CORE, "services"),
    "ConfigMap": (CORE, "configmaps"),
    "PersistentVolumeClaim": (CORE, "persistentvolumeclaims"),
    "Event": (CORE, "events"),
    "HeteroTrainJob": (HETEROTRAIN, "heterotrainjobs"),
    "WorkloadProfile": (HETEROTRAIN, "workloadprofiles"),
    "Workload": (KUEUE, "workloads"),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
}


class KubeError(RuntimeError):
    """The API server refused a request; `status` is the HTTP status code."""

    def __init__(self, status: int, method: str, path: str, detail: str) -> None:
        self.status = status
        super().__init__(f"{method} {path}: HTTP {status}: {detail}")


def path_of(kind: str, namespace: str, name: str | None = None, subresource: str | None = None) -> str:
    prefix, plural = PLURALS[kind]
    path = f"{prefix}/namespaces/{namespace}/{plural}"
    if name is not None:
        path += f"/{name}"
    if subresource is not None:
        path += f"/{subresource}"
    return path


def connection_info(kubeconfig_first: bool) -> kopf.ConnectionInfo:
    """Credentials from the kubeconfig (KUBECONFIG or ~/.kube/config) or the pod's service account."""
    settings = kopf.OperatorSettings()
    attempts = (
        (kopf.login_with_kubeconfig, kopf.login_with_service_account)
        if kubeconfig_first
        else (kopf.login_with_service_account, kopf.login_with_kubeconfig)
    )
    for attempt in attempts:
        try:
            info = attempt(settings=settings)
        except (kopf.LoginError, OSError):
            continue
        if info is not None:
            return info
    raise kopf.LoginError("no credentials: pass --kubeconfig, set KUBECONFIG or run in a cluster")


def resource_of(path: str) -> str:
    """The resource (and subresource) a request path names, e.g. pods or heterotrainjobs/status."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    if "namespaces" in parts and parts.index("namespaces") + 2 < len(parts):
        parts = parts[parts.index("namespaces") + 2 :]
    elif parts[:1] == ["api"]:
        parts = parts[2:]
    elif parts[:1] == ["apis"]:
        parts = parts[3:]
    return parts[0] if len(parts) < 3 else f"{parts[0]}/{parts[2]}"


class KubeClient:
    def __init__(
        self,
        info: kopf.ConnectionInfo,
        timeout: float = 30.0,
        max_connections: int = 64,
        on_request: Callable[[str, str], None] | None = None,
    ) -> None:
        """`on_request(verb, resource)`: told of every request sent (the operator counts them)."""
        self._base = info.server.rstrip("/")
        self._ssl = info.as_ssl_context()
        self._headers = {**info.as_http_headers(), "Accept": "application/json"}
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._on_request = on_request

    def _client(self) -> aiohttp.ClientSession:
        # Created lazily: a session belongs to the event loop it was made in.
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._max_connections, ssl=self._ssl)
            self._session = aiohttp.ClientSession(
                connector=connector, headers=self._headers, timeout=self._timeout
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _send(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | Sequence[Any] | None = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        accept: tuple[int, ...] = (),
    ) -> tuple[int, Any]:
        """(HTTP status, decoded JSON body) for a success or an accepted status; else KubeError."""
        if self._on_request is not None:
            self._on_request(method, resource_of(path))
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": content_type} if body is not None else None
        async with self._client().request(
            method, self._base + path, data=data, params=params, headers=headers
        ) as response:
            text = await response.text()
            if response.status < 300 or response.status in accept:
                return response.status, (json.loads(text) if text else {})
            raise KubeError(response.status, method, path, _detail(text))

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any] | None:
        status, body = await self._send("GET", path, params=params, accept=(404,))
        return None if status == 404 else dict(body)

    async def list_items(self, path: str, params: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        body = await self.get(path, params)
        return list((body or {}).get("items") or [])

    async def create(self, manifest: Mapping[str, Any]) -> bool:
        """Create the object; False if it already exists (a repeated reconcile), which is fine. An
        object without a namespace is cluster-scoped."""
        metadata = manifest["metadata"]
        kind = str(manifest["kind"])
        if "namespace" in metadata:
            path = path_of(kind, str(metadata["namespace"]))
        else:
            prefix, plural = PLURALS[kind]
            path = f"{prefix}/{plural}"
        status, _ = await self._send("POST", path, body=manifest, accept=(409,))
        return status != 409

    async def create_or_replace_data(self, manifest: Mapping[str, Any]) -> None:
        """Create a ConfigMap, or overwrite its data if it exists."""
        if not await self.create(manifest):
            metadata = manifest["metadata"]
            path = path_of(str(manifest["kind"]), str(metadata["namespace"]), str(metadata["name"]))
            await self.merge_patch(path, {"data": manifest["data"]})

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any] | None:
        """JSON merge patch; None if the object is gone."""
        status, body = await self._send("PATCH", path, body=patch, content_type=MERGE_PATCH, accept=(404,))
        return None if status == 404 else dict(body)

    async def apply(
        self, path: str, manifest: Mapping[str, Any], field_manager: str
    ) -> dict[str, Any] | None:
        """Server-side apply as `field_manager`, taking over fields others own (force); a
        resourceVersion in `manifest` makes it conditional (409 when the object changed). None if
        the object is gone."""
        params = {"fieldManager": field_manager, "force": "true"}
        status, body = await self._send(
            "PATCH", path, body=manifest, params=params, content_type=APPLY_PATCH, accept=(404,)
        )
        return None if status == 404 else dict(body)

    async def remove_finalizer(self, path: str, finalizers: Sequence[str], finalizer: str) -> None:
        """Take `finalizer` off the object, only if the list is still the one we saw (a JSON patch test),
        so another controller's finalizer added meanwhile is never dropped; 404/422 mean someone was
        quicker, and the next cycle looks again."""
        if finalizer not in finalizers:
            return
        index = list(finalizers).index(finalizer)
        ops = [
            {"op": "test", "path": "/metadata/finalizers", "value": list(finalizers)},
            {"op": "remove", "path": f"/metadata/finalizers/{index}"},
        ]
        await self._send("PATCH", path, body=ops, content_type=JSON_PATCH, accept=(404, 422))

    async def delete(self, path: str, grace_seconds: int | None = None, uid: str | None = None) -> bool:
        """Delete; False if it was already gone. `uid`: only that object, not a namesake created since
        (a 409 otherwise)."""
        params = {"gracePeriodSeconds": str(grace_seconds)} if grace_seconds is not None else None
        body = {"preconditions": {"uid": uid}} if uid else None
        status, _ = await self._send("DELETE", path, body=body, params=params, accept=(404,))
        return status != 404

    async def delete_collection(self, kind: str, namespace: str, selector: str) -> None:
        params = {"labelSelector": selector, "propagationPolicy": "Background"}
        await self._send("DELETE", path_of(kind, namespace), params=params, accept=(404,))


def _detail(text: str) -> str:
    try:
        return str(json.loads(text).get("message", text))
    except (ValueError, AttributeError):
        return text[:500]
