"""Read the newest plan from its source and decide, purely, whether a worker may apply it.

Sources: a file (path or ``file://``), a Kubernetes ConfigMap read through the API server
(``configmap://NAMESPACE/NAME``), or any ``http(s)://`` URL that returns the plan JSON.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

import httpx
from pydantic import ValidationError

from hetero_operator.plan import PLAN_CONFIGMAP_KEY, Plan

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
KUBE_API_URL_ENV = "HETEROTRAIN_KUBE_API_URL"
KUBE_TOKEN_FILE_ENV = "HETEROTRAIN_KUBE_TOKEN_FILE"
KUBE_CA_FILE_ENV = "HETEROTRAIN_KUBE_CA_FILE"


class PlanSourceError(RuntimeError):
    """The plan could not be fetched (the source is down or the document is missing)."""


class PlanSource(Protocol):
    def read(self) -> str:
        """The current plan document (JSON text)."""
        ...


@dataclass(frozen=True)
class FilePlanSource:
    path: Path

    def read(self) -> str:
        try:
            return self.path.read_text()
        except OSError as error:
            raise PlanSourceError(f"cannot read plan file {self.path}: {error}") from error


@dataclass(frozen=True)
class UrlPlanSource:
    url: str
    timeout_seconds: float = 5.0

    def read(self) -> str:
        try:
            response = httpx.get(self.url, timeout=self.timeout_seconds)
            response.raise_for_status()
        except httpx.HTTPError as error:
            raise PlanSourceError(f"cannot fetch plan from {self.url}: {error}") from error
        return response.text


@dataclass(frozen=True)
class ConfigMapPlanSource:
    """Reads key `PLAN_CONFIGMAP_KEY` of a ConfigMap with the pod's service-account token."""

    namespace: str
    name: str
    api_url: str
    token: str | None
    verify: str | bool
    timeout_seconds: float = 5.0

    def read(self) -> str:
        url = f"{self.api_url.rstrip('/')}/api/v1/namespaces/{self.namespace}/configmaps/{self.name}"
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            response = httpx.get(url, headers=headers, verify=self.verify, timeout=self.timeout_seconds)
            response.raise_for_status()
            data = response.json().get("data") or {}
        except (httpx.HTTPError, ValueError) as error:
            raise PlanSourceError(f"cannot read ConfigMap {self.namespace}/{self.name}: {error}") from error
        if PLAN_CONFIGMAP_KEY not in data:
            raise PlanSourceError(f"ConfigMap {self.namespace}/{self.name} has no key {PLAN_CONFIGMAP_KEY!r}")
        return str(data[PLAN_CONFIGMAP_KEY])


def _in_cluster_api() -> tuple[str, str | None, str | bool]:
    url = os.environ.get(KUBE_API_URL_ENV)
    if url is None:
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if host is None:
            raise PlanSourceError(
                f"configmap plan source outside a cluster: set {KUBE_API_URL_ENV} to the API server URL"
            )
        url = f"https://{host}:{port}"
    token_file = Path(os.environ.get(KUBE_TOKEN_FILE_ENV, SERVICE_ACCOUNT_DIR / "token"))
    token = token_file.read_text().strip() if token_file.is_file() else None
    ca_file = Path(os.environ.get(KUBE_CA_FILE_ENV, SERVICE_ACCOUNT_DIR / "ca.crt"))
    verify: str | bool = str(ca_file) if ca_file.is_file() else url.startswith("https")
    return url, token, verify


def plan_source_from_spec(spec: str) -> PlanSource:
    """Turn a HETEROTRAIN_PLAN_SOURCE value into a source; raises ValueError on an unknown form."""
    parsed = urlparse(spec)
    if parsed.scheme in ("", "file"):
        return FilePlanSource(Path(parsed.path if parsed.scheme == "file" else spec))
    if parsed.scheme in ("http", "https"):
        return UrlPlanSource(spec)
    if parsed.scheme == "configmap":
        namespace, name = parsed.netloc, parsed.path.strip("/")
        if not namespace or not name or "/" in name:
            raise ValueError(f"plan source {spec!r}: write configmap://NAMESPACE/NAME")
        api_url, token, verify = _in_cluster_api()
        return ConfigMapPlanSource(namespace, name, api_url, token, verify)
    raise ValueError(
        f"plan source {spec!r} has unknown scheme {parsed.scheme!r}: use a path, file://, "
        "configmap://NAMESPACE/NAME or http(s)://"
    )


@dataclass(frozen=True)
class PlanDecision:
    """What a worker does with the document it just read."""

    action: str  # "apply", "defer", "ignore" or "refuse"
    plan: Plan | None
    reason: str


def judge_plan_text(text: str, current: Plan | None, world_size: int, epoch: int) -> PlanDecision:
    """Pure decision: apply now, defer to its epoch, ignore (not newer) or refuse (with the reason)."""
    try:
        candidate = Plan.from_json(text)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in item['loc']) or 'plan'}: {item['msg']}" for item in error.errors()
        )
        return PlanDecision("refuse", None, f"malformed plan: {problems}")
    if current is not None and candidate.version <= current.version:
        return PlanDecision(
            "ignore", candidate, f"version {candidate.version} is not newer than {current.version}"
        )
    misfit = candidate.fits_world(world_size)
    if misfit is not None:
        return PlanDecision("refuse", candidate, f"plan version {candidate.version} refused: {misfit}")
    if current is not None and candidate.strategy != current.strategy:
        return PlanDecision(
            "refuse",
            candidate,
            f"plan version {candidate.version} switches strategy {current.strategy.value} -> "
            f"{candidate.strategy.value}; a strategy change needs a restart from checkpoint",
        )
    if candidate.apply_at_epoch > epoch:
        return PlanDecision(
            "defer", candidate, f"plan version {candidate.version} waits for epoch {candidate.apply_at_epoch}"
        )
    return PlanDecision("apply", candidate, f"plan version {candidate.version} applies at epoch {epoch}")


class PlanTracker:
    """Rank 0's memory of the applied plan and of one deferred plan; logs every refusal."""

    def __init__(self, source: PlanSource | None, world_size: int, current: Plan | None = None) -> None:
        self.source = source
        self.world_size = world_size
        self.current = current
        self.pending: Plan | None = None

    def plan_for_epoch(self, epoch: int) -> Plan | None:
        """The plan to run `epoch` with: newest valid applicable one, else the current one."""
        if self.source is not None:
            try:
                text = self.source.read()
            except PlanSourceError as error:
                log.warning("keeping plan version %s: %s", self._version(), error)
            else:
                self._consider(judge_plan_text(text, self.current, self.world_size, epoch))
        if self.pending is not None and self.pending.apply_at_epoch <= epoch:
            self.current, self.pending = self.pending, None
            log.info("applying plan version %d at epoch %d", self.current.version, epoch)
        return self.current

    def _consider(self, decision: PlanDecision) -> None:
        if decision.action == "refuse":
            log.error("%s; keeping plan version %s", decision.reason, self._version())
        elif (
            decision.action in ("apply", "defer")
            and decision.plan is not None
            and (self.pending is None or decision.plan.version > self.pending.version)
        ):
            self.pending = decision.plan
            if decision.action == "defer":
                log.info(decision.reason)

    def _version(self) -> str:
        return "none" if self.current is None else str(self.current.version)
