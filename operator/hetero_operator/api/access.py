"""Who is calling and what they may read: the caller's Kubernetes token checked by the API server.

Authentication is a TokenReview of the bearer token; authorisation is a SubjectAccessReview of the
user it names, for the verb and resource an endpoint reads. The token itself is never logged, kept
or put into an error message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from hetero_operator.api.kube import SUBJECT_ACCESS_REVIEWS, TOKEN_REVIEWS, KubeReader
from hetero_operator.resources import GROUP


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated user as the API server knows it."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Permission:
    """A Kubernetes resource attribute check; ``namespace=None`` means cluster-wide."""

    verb: str
    resource: str
    namespace: str | None = None
    name: str | None = None
    group: str = GROUP

    def describe(self) -> str:
        what = f"{self.verb} {self.resource}.{self.group}"
        if self.name:
            what += f" {self.name!r}"
        return what + (f" in namespace {self.namespace!r}" if self.namespace else " cluster-wide")


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    reason: str = ""


class AccessControl(Protocol):
    async def authenticate(self, token: str) -> Caller | None:
        """The token's user, or None if the token is not valid."""
        ...

    async def check(self, caller: Caller, permission: Permission) -> Verdict: ...


# --- review bodies (pure) ------------------------------------------------------------------------


def token_review(token: str) -> dict[str, Any]:
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}


def caller_from_token_review(review: Mapping[str, Any]) -> Caller | None:
    status = review.get("status") or {}
    user = status.get("user") or {}
    if not status.get("authenticated") or not user.get("username"):
        return None
    extra = {key: tuple(values or ()) for key, values in (user.get("extra") or {}).items()}
    return Caller(
        username=str(user["username"]),
        uid=str(user.get("uid", "")),
        groups=tuple(user.get("groups") or ()),
        extra=extra,
    )


def access_review(caller: Caller, permission: Permission) -> dict[str, Any]:
    attributes: dict[str, str] = {
        "verb": permission.verb,
        "group": permission.group,
        "resource": permission.resource,
        "namespace": permission.namespace or "",
    }
    if permission.name:
        attributes["name"] = permission.name
    spec: dict[str, Any] = {
        "user": caller.username,
        "groups": list(caller.groups),
        "resourceAttributes": attributes,
    }
    if caller.uid:
        spec["uid"] = caller.uid
    if caller.extra:
        spec["extra"] = {key: list(values) for key, values in caller.extra.items()}
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


def verdict_from_access_review(review: Mapping[str, Any]) -> Verdict:
    status = review.get("status") or {}
    allowed = bool(status.get("allowed")) and not status.get("denied")
    reason = str(status.get("reason") or status.get("evaluationError") or "")
    return Verdict(allowed=allowed, reason=reason)


class KubernetesAccess:
    """AccessControl backed by the API server's TokenReview and SubjectAccessReview."""

    def __init__(self, kube: KubeReader) -> None:
        self.kube = kube

    async def authenticate(self, token: str) -> Caller | None:
        return caller_from_token_review(await self.kube.review(TOKEN_REVIEWS, token_review(token)))

    async def check(self, caller: Caller, permission: Permission) -> Verdict:
        review = await self.kube.review(SUBJECT_ACCESS_REVIEWS, access_review(caller, permission))
        return verdict_from_access_review(review)
