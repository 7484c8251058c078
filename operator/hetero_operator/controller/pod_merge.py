"""A job's `spec.template` merged into the worker pod the operator builds (pure).

The operator's fields always win: the template adds to lists (volumes, mounts, ports, env,
tolerations, sidecars, init containers) and sets what the operator leaves unset. Fields the
operator owns never reach here: the model refuses them (see resources/pod_template.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hetero_operator.resources import HeteroTrainJob
from hetero_operator.resources.pod_template import TemplateContainer, TemplatePodSpec, WorkerPodTemplate

Manifest = dict[str, Any]

# Lists the template's entries are appended to. The operator's come first: a template variable may
# refer to one of them, `$(RANK)`, as Kubernetes expands only variables defined before.
APPENDED_CONTAINER_LISTS = ("env", "envFrom", "volumeMounts", "ports")
APPENDED_POD_LISTS = ("volumes", "tolerations", "imagePullSecrets", "initContainers")


def job_template(job: HeteroTrainJob) -> WorkerPodTemplate:
    """The job's template; an empty one when it has none."""
    return job.spec.template if job.spec.template is not None else WorkerPodTemplate()


def merge_resources(operator: Mapping[str, Any], template: Mapping[str, Any]) -> Manifest:
    """The template's requests and limits with the operator's (GPUs, cpu, memory) on top."""
    merged: Manifest = {**template}
    for key in ("requests", "limits"):
        combined = {**(template.get(key) or {}), **(operator.get(key) or {})}
        if combined:
            merged[key] = combined
    return merged


def merge_security_context(operator: Mapping[str, Any], template: Mapping[str, Any]) -> Manifest:
    """The template's security context over the operator's; its added capabilities join the
    operator's `drop: [ALL]` rather than replacing it."""
    merged = {**operator, **template}
    if "capabilities" in template:
        merged["capabilities"] = {**operator.get("capabilities", {}), **template["capabilities"]}
    return merged


def merge_worker_container(container: Mapping[str, Any], template: TemplateContainer) -> Manifest:
    """The operator's worker container with the template's `worker` entry added."""
    extra = template.to_wire()
    merged = dict(container)
    for key, value in extra.items():
        if key == "name":
            continue
        if key in APPENDED_CONTAINER_LISTS:
            merged[key] = [*merged.get(key, []), *value]
        elif key == "resources":
            merged[key] = merge_resources(merged.get(key, {}), value)
        elif key == "securityContext":
            merged[key] = merge_security_context(merged.get(key, {}), value)
        else:
            merged.setdefault(key, value)
    return merged


def merge_pod_spec(spec: Mapping[str, Any], template: TemplatePodSpec) -> Manifest:
    """The operator's pod spec with the template's pod fields, sidecars and worker entry added."""
    merged = dict(spec)
    worker = template.worker()
    if worker is not None:
        merged["containers"] = [
            merge_worker_container(c, worker) if i == 0 else c for i, c in enumerate(spec["containers"])
        ]
    sidecars = [c.to_wire() for c in template.sidecars()]
    if sidecars:
        merged["containers"] = [*merged["containers"], *sidecars]
    for key, value in template.to_wire().items():
        if key == "containers":
            continue
        if key in APPENDED_POD_LISTS:
            merged[key] = [*merged.get(key, []), *value]
        elif key == "securityContext":
            merged[key] = {**merged.get(key, {}), **value}
        else:
            merged[key] = value
    return merged


def merge_metadata(metadata: Mapping[str, Any], template: WorkerPodTemplate) -> Manifest:
    """The template's labels and annotations beside the operator's (whose keys it may not use)."""
    merged = dict(metadata)
    for key in ("labels", "annotations"):
        extra = getattr(template.metadata, key)
        if extra:
            merged[key] = {**extra, **merged.get(key, {})}
    return merged
