"""Example request bodies: shown in the OpenAPI document and sent by the schema tests."""

from __future__ import annotations

from typing import Any

_EXAMPLE_SPEC = {
    "image": "heterotrain/trainer:0.1.0",
    "command": ["heterotrain", "worker", "digits"],
    "gpus": {"min": 2, "max": 4},
    "parallelism": {"strategy": "data"},
    "batch": {"global": 128},
    "epochs": 10,
}
WHAT_IF_EXAMPLES: dict[str, Any] = {
    "live": {
        "summary": "Against the cluster's GPUs now",
        "value": {"namespace": "ml", "spec": _EXAMPLE_SPEC},
    },
    "pool": {
        "summary": "Against a pool described in the request",
        "value": {
            "namespace": "ml",
            "spec": {**_EXAMPLE_SPEC, "gpuClasses": ["a100", "t4"]},
            "pool": {
                "classes": [
                    {"name": "a100", "relativeSpeed": 1.0, "memoryGiB": 80},
                    {"name": "t4", "relativeSpeed": 0.25, "memoryGiB": 16},
                ],
                "nodes": [
                    {"name": "a100-0", "gpuClass": "a100", "gpus": 2, "gpusUsed": 1},
                    {"name": "t4-0", "gpuClass": "t4", "gpus": 4},
                ],
            },
        },
    },
}
