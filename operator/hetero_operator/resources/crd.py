"""Generate the CustomResourceDefinitions in `crds/` from the pydantic models.

python -m hetero_operator.resources.crd --out crds/          # write the YAML files
python -m hetero_operator.resources.crd --out crds/ --check  # exit 1 if they are out of date
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hetero_operator.generated_files import generator_main, stale_names
from hetero_operator.resources.base import GROUP, VERSION
from hetero_operator.resources.objects import (
    GPUClass,
    HeteroQueue,
    HeteroTrainJob,
    WorkloadProfile,
    _CustomObject,
)
from hetero_operator.resources.openapi import structural_schema
from hetero_operator.resources.structural import structural_violations

HEADER = "# Generated from the pydantic models by `python -m hetero_operator.resources.crd`. Do not edit.\n"
CATEGORIES = ["heterotrain"]


@dataclass(frozen=True)
class PrinterColumn:
    """One column of `kubectl get`."""

    name: str
    type: str
    json_path: str
    description: str

    def to_crd(self) -> dict[str, str]:
        return {
            "name": self.name,
            "type": self.type,
            "jsonPath": self.json_path,
            "description": self.description,
        }


AGE = PrinterColumn("Age", "date", ".metadata.creationTimestamp", "Time since the object was created.")

JOB_COLUMNS = (
    PrinterColumn("Phase", "string", ".status.phase", "Where the job is in its life."),
    PrinterColumn("GPUs", "integer", ".status.allocation.totalGpus", "GPUs the job holds."),
    PrinterColumn("Classes", "string", ".status.allocation.classes", "GPUs held per GPUClass."),
    PrinterColumn("Strategy", "string", ".spec.parallelism.strategy", "Parallel training strategy."),
    PrinterColumn("Epoch", "integer", ".status.progress.epoch", "Epochs completed."),
    PrinterColumn("Samples/s", "number", ".status.progress.samplesPerSecond", "Training throughput."),
    AGE,
)
GPU_CLASS_COLUMNS = (
    PrinterColumn("Speed", "number", ".spec.relativeSpeed", "Prior speed relative to the reference GPU."),
    PrinterColumn("Measured", "number", ".status.measuredSpeed", "Measured speed, on the prior's scale."),
    PrinterColumn(
        "Workloads", "integer", ".status.measuredWorkloads", "Workloads the measured speed comes from."
    ),
    PrinterColumn("Memory(GiB)", "number", ".spec.memoryGiB", "Memory of one GPU."),
    PrinterColumn("Resource", "string", ".spec.resourceName", "Extended resource that counts the GPUs."),
    PrinterColumn("Nodes", "integer", ".status.nodes", "Ready, schedulable nodes of this class."),
    PrinterColumn("GPUs", "integer", ".status.gpus", "Allocatable GPUs of this class."),
    PrinterColumn("Free", "integer", ".status.freeGpus", "GPUs of this class no running pod requests."),
    AGE,
)
QUEUE_COLUMNS = (
    PrinterColumn("Weight", "number", ".spec.weight", "Fair-share weight."),
    PrinterColumn("Cohort", "string", ".spec.cohort", "Queues that lend each other unused quota."),
    PrinterColumn("Usage", "string", ".status.summary", "GPUs held over nominal quota, per GPUClass."),
    PrinterColumn("Share", "number", ".status.share", "Weighted charged usage: lower is served first."),
    PrinterColumn("Running", "integer", ".status.runningJobs", "Jobs holding GPUs."),
    PrinterColumn("Pending", "integer", ".status.pendingJobs", "Jobs waiting for GPUs."),
    AGE,
)

PROFILE_COLUMNS = (
    PrinterColumn("Throughput", "string", ".status.summary", "Samples/s of compute of one GPU, per class."),
    PrinterColumn("Jobs", "integer", ".status.jobs", "Jobs whose measurements it keeps."),
    PrinterColumn("Updated", "date", ".status.updatedAt", "When the last measurement arrived."),
    AGE,
)
_STANDARD_FIELDS = {
    "apiVersion": {
        "description": "Versioned schema of this representation of an object: heterotrain.io/v1alpha1.",
        "type": "string",
        "maxLength": 64,
    },
    "kind": {"description": "REST resource this object represents.", "type": "string", "maxLength": 64},
    # The API server owns metadata's schema and refuses anything here beyond the type.
    "metadata": {"type": "object"},
}


class NonStructuralSchemaError(ValueError):
    """The generated schema would be refused by the API server."""


def object_schema(model: type[_CustomObject]) -> dict[str, Any]:
    """The openAPIV3Schema of a resource: spec and status from the model, standard apiVersion and kind."""
    schema = structural_schema(model)
    properties = {**schema["properties"], **_STANDARD_FIELDS}
    schema["properties"] = {
        name: properties[name] for name in ("apiVersion", "kind", "metadata", "spec", "status")
    }
    schema["required"] = ["spec"]
    problems = structural_violations(schema)
    if problems:
        raise NonStructuralSchemaError(f"{model.__name__}: " + "; ".join(problems))
    return schema


def custom_resource_definition(
    model: type[_CustomObject], columns: tuple[PrinterColumn, ...]
) -> dict[str, Any]:
    """A complete apiextensions.k8s.io/v1 CustomResourceDefinition for `model`."""
    kind = model.__name__
    names: dict[str, Any] = {
        "kind": kind,
        "listKind": f"{kind}List",
        "plural": model.PLURAL,
        "singular": kind.lower(),
        "categories": CATEGORIES,
    }
    if model.SHORT_NAMES:
        names["shortNames"] = list(model.SHORT_NAMES)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{model.PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": names,
            "scope": "Namespaced" if model.NAMESPACED else "Cluster",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [column.to_crd() for column in columns],
                    "schema": {"openAPIV3Schema": object_schema(model)},
                }
            ],
        },
    }


def all_crds() -> dict[str, dict[str, Any]]:
    """File name to CRD, for every resource of the API."""
    crds = (
        custom_resource_definition(HeteroTrainJob, JOB_COLUMNS),
        custom_resource_definition(GPUClass, GPU_CLASS_COLUMNS),
        custom_resource_definition(HeteroQueue, QUEUE_COLUMNS),
        custom_resource_definition(WorkloadProfile, PROFILE_COLUMNS),
    )
    return {f"{crd['metadata']['name']}.yaml": crd for crd in crds}


def render(crd: dict[str, Any]) -> str:
    """The YAML text written to `crds/`, byte for byte."""
    return HEADER + yaml.safe_dump(crd, sort_keys=False, width=110, allow_unicode=True)


def rendered_files() -> dict[str, str]:
    return {name: render(crd) for name, crd in all_crds().items()}


def stale_files(out: Path) -> list[str]:
    """Names of CRD files in `out` that are missing or differ from the generator's output."""
    return stale_names(out, rendered_files())


def main(argv: list[str] | None = None) -> int:
    return generator_main(
        argv,
        "Generate the heterotrain.io CRDs from the pydantic models.",
        Path("crds"),
        rendered_files,
        "hetero_operator.resources.crd",
    )


if __name__ == "__main__":
    sys.exit(main())
