"""A small read-only Kubernetes client for the API and the CLI.

It only reads objects (GET) and asks the API server two questions that store nothing: TokenReview
(who is this token?) and SubjectAccessReview (may this user do that?). Credentials come from a
kubeconfig or from the pod's service account; service-account tokens are re-read before each request
because the kubelet rotates them.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx
from kubernetes import config as kube_config
from kubernetes.client import Configuration

from hetero_operator.resources import GROUP, VERSION

CORE = "/api/v1"
HETEROTRAIN = f"/apis/{GROUP}/{VERSION}"
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
SUBJECT_ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
# Only pods that still hold their node's resources matter for GPU accounting.
LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"


class KubeReadError(RuntimeError):
    """The API server answered with an error (``status`` is its HTTP code) or could not be reached
    (``status`` is None)."""

    def __init__(self, status: int | None, method: str, path: str, detail: str) -> None:
        self.status = status
        self.path = path
        self.detail = detail
        where = f"HTTP {status}" if status is not None else "unreachable"
        super().__init__(f"{method} {path}: {where}: {detail}")


@dataclass(frozen=True)
class KubeConnection:
    """Where the API server is and how to prove who we are."""

    server: str
    verify: ssl.SSLContext | bool
    authorization: Callable[[], str | None]

    @classmethod
    def from_configuration(cls, configuration: Configuration) -> KubeConnection:
        verify: ssl.SSLContext | bool = False
        if configuration.verify_ssl:
            context = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None)
            if configuration.cert_file and configuration.key_file:
                context.load_cert_chain(configuration.cert_file, configuration.key_file)
            verify = context

        def authorization() -> str | None:
            # Calls the refresh hook, so rotated service-account tokens are picked up. The kubernetes
            # client keeps a token under "BearerToken" (older releases: "authorization"), as its own
            # auth_settings() reads it.
            value = configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
            return str(value) if value else None

        return cls(server=str(configuration.host).rstrip("/"), verify=verify, authorization=authorization)

    @classmethod
    def from_kubeconfig(cls, path: Path | None = None, context: str | None = None) -> KubeConnection:
        """From ``path`` (or KUBECONFIG, or ~/.kube/config)."""
        configuration = Configuration()
        kube_config.load_kube_config(
            config_file=str(path) if path is not None else None,
            context=context,
            client_configuration=configuration,
            persist_config=False,
        )
        return cls.from_configuration(configuration)

    @classmethod
    def in_cluster(cls) -> KubeConnection:
        configuration = Configuration()
        kube_config.load_incluster_config(client_configuration=configuration)
        return cls.from_configuration(configuration)

    @classmethod
    def discover(cls, kubeconfig: Path | None = None, context: str | None = None) -> KubeConnection:
        """An explicit kubeconfig wins; inside a pod the service account; else the default kubeconfig."""
        if kubeconfig is None and context is None and "KUBERNETES_SERVICE_HOST" in os.environ:
            return cls.in_cluster()
        return cls.from_kubeconfig(kubeconfig, context)


class KubeReader:
    """Async reads against one API server; use as ``async with KubeReader(connection) as kube``."""

    def __init__(self, connection: KubeConnection, timeout: float = 15.0) -> None:
        self.connection = connection
        self._client = httpx.AsyncClient(
            base_url=connection.server,
            verify=connection.verify,
            timeout=timeout,
            headers={"Accept": "application/json"},
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._client.aclose()

    def _headers(self) -> dict[str, str]:
        value = self.connection.authorization()
        return {"Authorization": value} if value else {}

    async def _request(
        self,
        method: str,
        path: str,
        params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> httpx.Response:
        try:
            response = await self._client.request(
                method, path, params=params, json=body, headers=self._headers()
            )
        except httpx.HTTPError as error:
            raise KubeReadError(None, method, path, f"{type(error).__name__}: {error}") from None
        if not response.is_success:
            raise KubeReadError(response.status_code, method, path, _detail(response))
        return response

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        return dict((await self._request("GET", path, params)).json())

    async def get_or_none(self, path: str) -> dict[str, Any] | None:
        try:
            return await self.get(path)
        except KubeReadError as error:
            if error.status == 404:
                return None
            raise

    async def get_text(self, path: str, params: Mapping[str, str] | None = None) -> str:
        return (await self._request("GET", path, params)).text

    async def list_items(self, path: str, params: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        return list((await self.get(path, params)).get("items") or [])

    async def review(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST a review (TokenReview, SubjectAccessReview): the API server answers and stores nothing."""
        return dict((await self._request("POST", path, body=body)).json())

    # --- the objects heterotrain reads ----------------------------------------------------------

    async def gpu_classes(self) -> list[dict[str, Any]]:
        return await self.list_items(f"{HETEROTRAIN}/gpuclasses")

    async def nodes(self) -> list[dict[str, Any]]:
        return await self.list_items(f"{CORE}/nodes")

    async def workload_profiles(self) -> list[dict[str, Any]]:
        return await self.list_items(f"{HETEROTRAIN}/workloadprofiles")

    async def live_pods(self) -> list[dict[str, Any]]:
        return await self.list_items(f"{CORE}/pods", {"fieldSelector": LIVE_PODS})

    async def jobs(self, namespace: str | None = None) -> list[dict[str, Any]]:
        scope = f"/namespaces/{namespace}" if namespace else ""
        return await self.list_items(f"{HETEROTRAIN}{scope}/heterotrainjobs")

    async def job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self.get_or_none(f"{HETEROTRAIN}/namespaces/{namespace}/heterotrainjobs/{name}")

    async def queue(self, name: str) -> dict[str, Any] | None:
        return await self.get_or_none(f"{HETEROTRAIN}/heteroqueues/{name}")

    async def pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return await self.list_items(f"{CORE}/namespaces/{namespace}/pods", {"labelSelector": label_selector})

    async def node(self, name: str) -> dict[str, Any] | None:
        return await self.get_or_none(f"{CORE}/nodes/{name}")

    async def pod_log(self, namespace: str, pod: str, container: str, tail_lines: int | None = None) -> str:
        params = {"container": container}
        if tail_lines is not None:
            params["tailLines"] = str(tail_lines)
        return await self.get_text(f"{CORE}/namespaces/{namespace}/pods/{pod}/log", params)

    async def version(self) -> dict[str, Any]:
        return await self.get("/version")


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("message", response.text))[:500]
    except ValueError:
        return response.text[:500]
