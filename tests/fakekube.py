"""One small in-process Kubernetes for the tests that run the operator's pieces without a cluster.

It stands in for the API server behind `controller.k8s.KubeClient` (the same methods), with what the
operator relies on: resourceVersions that only grow, merge patches (RFC 7386) with a resourceVersion
precondition, the status subresource, finalizers and deletion timestamps, 409 on creating what
exists, 404 on what is gone, and server-side apply as far as one field manager goes: an apply sets
the top-level fields it carries and removes those the same manager set before and now leaves out
(the real API server tracks ownership down to list items; a test that needs more belongs on the
test bed). `indexes` are what kopf's watches would hold, built from the stored objects (or from a
moment in the past while the watch is held back). Faults can be injected per request. The live test
bed stays the place where the real API server is tested against.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tests.fake_indexes import Indexes

from hetero_operator.controller.k8s import KubeError

Key = tuple[str, str, str]  # (plural, namespace or "", name)
PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<namespace>[^/]+))?/(?P<plural>[a-z]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[a-z]+))?$"
)
KINDS = {
    "Pod": "pods",
    "Service": "services",
    "ConfigMap": "configmaps",
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "Event": "events",
    "Node": "nodes",
    "HeteroTrainJob": "heterotrainjobs",
    "GPUClass": "gpuclasses",
    "HeteroQueue": "heteroqueues",
    "WorkloadProfile": "workloadprofiles",
    "Workload": "workloads",
    "ClusterQueue": "clusterqueues",
    "LocalQueue": "localqueues",
    "ResourceFlavor": "resourceflavors",
}


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null removes, anything else replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge(result.get(key), value)
    return result


@dataclass
class Fault:
    method: str
    path_part: str
    status: int
    times: int


class FakeKube:
    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.patches: list[tuple[str, dict[str, Any]]] = []  # every merge patch that got through
        self._revision = itertools.count(1)
        self._uids = itertools.count(1)
        self._names = itertools.count(1)
        self._faults: list[Fault] = []
        self._before: list[tuple[str, str, Callable[[], None]]] = []
        self._held: dict[Key, dict[str, Any]] | None = None
        self._applied: dict[tuple[Key, str, str], set[str]] = {}  # (object, part, manager) -> fields
        self.now = start

    # --- faults and the watch -------------------------------------------------------------------

    def fail(self, method: str, path_part: str, status: int = 500, times: int = 1) -> None:
        """The next `times` requests of `method` whose path contains `path_part` fail with `status`."""
        self._faults.append(Fault(method, path_part, status, times))

    def before(self, method: str, path_part: str, action: Callable[[], None]) -> None:
        """Run `action` before every request of `method` whose path contains `path_part` (another
        writer getting in first)."""
        self._before.append((method, path_part, action))

    def hold_watch(self) -> None:
        """From now on the indexes show the cluster as it is at this moment (a lagging watch)."""
        self._held = copy.deepcopy(self.objects)

    def release_watch(self) -> None:
        self._held = None

    def _check(self, method: str, path: str) -> None:
        self.requests.append((method, path))
        for wanted, part, action in self._before:
            if wanted == method and part in path:
                action()
        for fault in self._faults:
            if fault.method == method and fault.path_part in path and fault.times > 0:
                fault.times -= 1
                raise KubeError(fault.status, method, path, "injected fault")

    def count(self, method: str, path_part: str = "") -> int:
        return sum(1 for m, p in self.requests if m == method and path_part in p)

    # --- the client's methods -------------------------------------------------------------------

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any] | None:
        self._check("GET", path)
        plural, namespace, name, _ = _parse(path)
        if name is None:
            return {"items": self._list(plural, namespace, (params or {}).get("labelSelector"))}
        found = self.objects.get((plural, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    async def list_items(self, path: str, params: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        body = await self.get(path, params)
        return list((body or {}).get("items") or [])

    async def create(self, manifest: Mapping[str, Any]) -> bool:
        self._check("POST", f"{manifest['kind']}/{manifest['metadata'].get('name', '')}")
        return self.put(manifest)

    async def create_or_replace_data(self, manifest: Mapping[str, Any]) -> None:
        if not await self.create(manifest):
            key = self._key_of(manifest)
            self._store(key, merge(self.objects[key], {"data": manifest["data"]}))

    def _patched(self, path: str, patch: Mapping[str, Any]) -> tuple[Key, str | None, dict[str, Any]] | None:
        """The object a patch of `path` changes (None: gone), after its resourceVersion precondition."""
        self._check("PATCH", path)
        plural, namespace, name, sub = _parse(path)
        key = (plural, namespace, name or "")
        current = self.objects.get(key)
        if current is None:
            return None
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != current["metadata"]["resourceVersion"]:
            raise KubeError(409, "PATCH", path, "the object has been modified")
        return key, sub, current

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any] | None:
        found = self._patched(path, patch)
        if found is None:
            return None
        key, sub, current = found
        plural = key[0]
        self.patches.append((path, copy.deepcopy(dict(patch))))
        if sub == "status":  # the status subresource changes the status alone
            body = {"status": patch["status"]} if "status" in patch else {}
        else:  # the main resource never changes the status
            body = {k: v for k, v in patch.items() if k != "status"}
            if "metadata" in body:
                body["metadata"] = {k: v for k, v in body["metadata"].items() if k != "resourceVersion"}
        updated = merge(current, body)
        if plural == "heterotrainjobs" and updated.get("spec") != current.get("spec"):
            updated["metadata"]["generation"] = current["metadata"].get("generation", 1) + 1
        self._store(key, updated)
        return self._finish_if_released(key)

    async def apply(
        self, path: str, manifest: Mapping[str, Any], field_manager: str
    ) -> dict[str, Any] | None:
        """Server-side apply (forced) of the part `path` names: the status subresource's `status`,
        or the object's other top-level fields."""
        found = self._patched(path, manifest)
        if found is None:
            return None
        key, sub, current = found
        part = "status" if sub == "status" else "spec"
        given = dict(manifest.get(part) or {})
        owned = self._applied.get((key, part, field_manager), set())
        updated = copy.deepcopy(current)
        target = updated.setdefault(part, {})
        for field_name in owned - set(given):
            target.pop(field_name, None)
        target.update(copy.deepcopy(given))
        self._applied[(key, part, field_manager)] = set(given)
        self._store(key, updated)
        return copy.deepcopy(updated)

    async def remove_finalizer(self, path: str, finalizers: Sequence[str], finalizer: str) -> None:
        self._check("PATCH", path)
        plural, namespace, name, _ = _parse(path)
        key = (plural, namespace, name or "")
        current = self.objects.get(key)
        if current is None or current["metadata"].get("finalizers", []) != list(finalizers):
            return  # the JSON patch's test failed (422) or the object is gone (404)
        remaining = [f for f in finalizers if f != finalizer]
        self._store(key, merge(current, {"metadata": {"finalizers": remaining or None}}))
        self._finish_if_released(key)

    async def delete(self, path: str, grace_seconds: int | None = None, uid: str | None = None) -> bool:
        self._check("DELETE", path)
        plural, namespace, name, _ = _parse(path)
        current = self.objects.get((plural, namespace, name or ""))
        if uid and current is not None and current["metadata"].get("uid") != uid:
            raise KubeError(409, "DELETE", path, "Precondition failed: UID in precondition does not match")
        return self.remove((plural, namespace, name or ""))

    async def delete_collection(self, kind: str, namespace: str, selector: str) -> None:
        self._check("DELETE", f"{kind}?{selector}")
        for item in self._list(KINDS[kind], namespace, selector):
            self.remove((KINDS[kind], namespace, item["metadata"]["name"]))

    async def close(self) -> None:
        return None

    # --- what tests do directly -----------------------------------------------------------------

    def put(self, manifest: Mapping[str, Any]) -> bool:
        """Create an object as the API server would; False if it exists."""
        body = copy.deepcopy(dict(manifest))
        metadata = body.setdefault("metadata", {})
        if "generateName" in metadata and "name" not in metadata:
            metadata["name"] = f"{metadata['generateName']}{next(self._names):05d}"
        key = self._key_of(body)
        if key in self.objects:
            return False
        metadata.setdefault("uid", f"uid-{next(self._uids)}")
        metadata.setdefault("creationTimestamp", _stamp(self.now))
        if key[0] == "heterotrainjobs":
            metadata.setdefault("generation", 1)
        self._store(key, body)
        return True

    def remove(self, key: Key) -> bool:
        """Delete: objects with finalizers get a deletion timestamp and stay until they are off."""
        current = self.objects.get(key)
        if current is None:
            return False
        if current["metadata"].get("finalizers"):
            if "deletionTimestamp" not in current["metadata"]:
                self._store(key, merge(current, {"metadata": {"deletionTimestamp": _stamp(self.now)}}))
            return True
        del self.objects[key]
        next(self._revision)
        return True

    def obj(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((KINDS[kind], namespace, name))

    def of_kind(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        plural = KINDS[kind]
        return [
            body
            for (p, ns, _), body in sorted(self.objects.items())
            if p == plural and (namespace is None or ns == namespace)
        ]

    def set_pod(
        self, namespace: str, name: str, phase: str, exit_code: int | None = None, waiting: str | None = None
    ) -> None:
        """What a kubelet reports: the pod's phase and, once it ended, its container's exit code, or
        while it cannot start, why its container waits (ErrImagePull, ...)."""
        key = ("pods", namespace, name)
        status: dict[str, Any] = {"phase": phase}
        if exit_code is not None:
            status["containerStatuses"] = [
                {"name": "worker", "state": {"terminated": {"exitCode": exit_code}}}
            ]
        if waiting is not None:
            state = {"waiting": {"reason": waiting, "message": f"{waiting} for the worker image"}}
            status["containerStatuses"] = [{"name": "worker", "state": state}]
        self._store(key, merge(self.objects[key], {"status": status}))

    @property
    def indexes(self) -> Indexes:
        """What kopf's indexes hold, read afresh on every access: the objects now, or as they were
        when the watch was held back."""
        return Indexes(lambda: self._held if self._held is not None else self.objects)

    # --- internals ------------------------------------------------------------------------------

    def _key_of(self, body: Mapping[str, Any]) -> Key:
        metadata = body["metadata"]
        return (KINDS[body["kind"]], metadata.get("namespace", ""), metadata["name"])

    def _store(self, key: Key, body: dict[str, Any]) -> None:
        body["metadata"]["resourceVersion"] = str(next(self._revision))
        self.objects[key] = body

    def _finish_if_released(self, key: Key) -> dict[str, Any] | None:
        body = self.objects[key]
        metadata = body["metadata"]
        if "deletionTimestamp" in metadata and not metadata.get("finalizers"):
            del self.objects[key]
            return None
        return copy.deepcopy(body)

    def _list(self, plural: str, namespace: str, selector: str | None) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(body)
            for (p, ns, _), body in sorted(self.objects.items())
            if p == plural and (not namespace or ns == namespace) and _selects(selector, body)
        ]


def _parse(path: str) -> tuple[str, str, str | None, str | None]:
    found = PATH.match(path.split("?")[0])
    if found is None:
        raise ValueError(f"not a Kubernetes API path: {path}")
    return found["plural"], found["namespace"] or "", found["name"], found["sub"]


def _selects(selector: str | None, body: Mapping[str, Any]) -> bool:
    if not selector:
        return True
    labels = body["metadata"].get("labels") or {}
    for term in selector.split(","):
        key, _, value = term.partition("=")
        if key not in labels or (value and labels[key] != value):
            return False
    return True


def _stamp(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ManualClock:
    """A clock the test moves. `sleep` returns at once after moving it, so tasks never wait."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start
        self.ticks = 0.0

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.ticks

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.ticks += seconds

    async def sleep(self, seconds: float) -> None:
        self.advance(seconds)
        await asyncio.sleep(0)
