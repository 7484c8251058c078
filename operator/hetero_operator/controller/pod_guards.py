"""What a job's pod template may ask of the cluster, checked against the administrator's guards (pure).

Host namespaces, privileged containers, added capabilities, another service account and a mounted
API token widen what a worker can reach beyond its job; each is refused unless the chart's
`operator.settings.launch.guards` value allows it. Each problem names the field and that value.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from pydantic import Field
from pydantic.dataclasses import dataclass as settings

from hetero_operator.controller.pod_merge import job_template
from hetero_operator.resources import HeteroTrainJob
from hetero_operator.resources.pod_template import TemplateContainer, TemplatePodSpec

GUARDS_VALUE = "operator.settings.launch.guards"


@settings(frozen=True)
class WorkerGuards:
    """What a job's spec.template may ask beyond restricted worker pods (all refused by default)."""

    allow_host_namespaces: Annotated[
        bool, Field(description="Allow hostNetwork, hostPID and hostIPC in a job's template.")
    ] = False
    allow_privileged: Annotated[
        bool, Field(description="Allow privileged containers in a job's template.")
    ] = False
    allow_added_capabilities: Annotated[
        bool, Field(description="Allow containers of a job's template to add Linux capabilities.")
    ] = False
    allow_service_accounts: Annotated[
        bool,
        Field(
            description="Allow a job's template to name a service account or mount an API token "
            "(automountServiceAccountToken, a serviceAccountToken projected volume)."
        ),
    ] = False


def _refused(field: str, what: str, value: str) -> str:
    return (
        f"{field}: {what} is refused on this cluster; the chart value {GUARDS_VALUE}.{value}=true allows it"
    )


def _containers(spec: TemplatePodSpec) -> Iterator[tuple[str, TemplateContainer]]:
    for kind, containers in (("containers", spec.containers), ("initContainers", spec.init_containers)):
        for container in containers:
            yield f"spec.template.spec.{kind}[{container.name}]", container


def _host_namespaces(spec: TemplatePodSpec) -> list[str]:
    chosen = {"hostNetwork": spec.host_network, "hostPID": spec.host_pid, "hostIPC": spec.host_ipc}
    return [
        _refused(f"spec.template.spec.{name}", "a host namespace", "allowHostNamespaces")
        for name, value in chosen.items()
        if value
    ]


def _container_privileges(spec: TemplatePodSpec, guards: WorkerGuards) -> list[str]:
    problems = []
    for path, container in _containers(spec):
        context = container.security_context
        if context is None:
            continue
        if context.privileged and not guards.allow_privileged:
            problems.append(
                _refused(f"{path}.securityContext.privileged", "a privileged container", "allowPrivileged")
            )
        if (
            context.capabilities is not None
            and context.capabilities.add
            and not guards.allow_added_capabilities
        ):
            added = ", ".join(context.capabilities.add)
            problems.append(
                _refused(
                    f"{path}.securityContext.capabilities.add", f"adding {added}", "allowAddedCapabilities"
                )
            )
    return problems


def _service_accounts(spec: TemplatePodSpec) -> list[str]:
    problems = []
    if spec.service_account_name:
        problems.append(
            _refused(
                "spec.template.spec.serviceAccountName", "another service account", "allowServiceAccounts"
            )
        )
    if spec.automount_service_account_token:
        problems.append(
            _refused(
                "spec.template.spec.automountServiceAccountToken",
                "a mounted API token",
                "allowServiceAccounts",
            )
        )
    for volume in spec.volumes:
        sources = (volume.model_extra or {}).get("projected", {}).get("sources", [])
        if any("serviceAccountToken" in source for source in sources):
            problems.append(
                _refused(
                    f"spec.template.spec.volumes[{volume.name}]",
                    "a mounted API token",
                    "allowServiceAccounts",
                )
            )
    return problems


def guard_problems(job: HeteroTrainJob, guards: WorkerGuards) -> list[str]:
    """Every guard the job's template breaks (empty when the template stays within them)."""
    spec = job_template(job).spec
    problems = [] if guards.allow_host_namespaces else _host_namespaces(spec)
    problems += _container_privileges(spec, guards)
    problems += [] if guards.allow_service_accounts else _service_accounts(spec)
    return problems
