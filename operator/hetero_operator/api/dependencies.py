"""FastAPI dependencies: the caller (bearer token -> TokenReview), their rights (SubjectAccessReview)
and the read-only Kubernetes client. Tests may override `current_caller` and `access_control`."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from hetero_operator.api.access import AccessControl, Caller, Permission
from hetero_operator.api.kube import KubeReader

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="KubernetesToken",
    description="A Kubernetes bearer token, for example from `kubectl create token SERVICE_ACCOUNT`.",
)


def access_control(request: Request) -> AccessControl:
    access: AccessControl = request.app.state.access
    return access


def kube_reader(request: Request) -> KubeReader:
    kube: KubeReader = request.app.state.kube
    return kube


AccessDep = Annotated[AccessControl, Depends(access_control)]
KubeDep = Annotated[KubeReader, Depends(kube_reader)]


async def current_caller(
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)], access: AccessDep
) -> Caller:
    challenge = {"WWW-Authenticate": "Bearer"}
    if credentials is None or not credentials.credentials:
        raise HTTPException(
            401,
            "missing bearer token: send 'Authorization: Bearer TOKEN' (for example from "
            "`kubectl create token SERVICE_ACCOUNT -n NAMESPACE`)",
            headers=challenge,
        )
    caller = await access.authenticate(credentials.credentials)
    if caller is None:
        raise HTTPException(401, "the Kubernetes API server did not accept this token", headers=challenge)
    return caller


CallerDep = Annotated[Caller, Depends(current_caller)]


async def authorize(access: AccessControl, caller: Caller, *permissions: Permission) -> None:
    for permission in permissions:
        verdict = await access.check(caller, permission)
        if not verdict.allowed:
            because = f" ({verdict.reason})" if verdict.reason else ""
            raise HTTPException(
                403,
                f"user {caller.username!r} may not {permission.describe()}{because}; ask for an RBAC role",
            )
