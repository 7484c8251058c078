"""Prometheus configuration for the test bed: discover annotated pods through the API server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SCRAPE_INTERVAL_SECONDS = 2

# Only loopback pod addresses are ever scraped: fake pods carry made-up IPs that must never be contacted.
LOOPBACK_ADDRESS = r"127\.\d+\.\d+\.\d+(:\d+)?"


OPERATOR_JOB = "heterotrain-operator"


def prometheus_config(
    kubeconfig: Path, self_address: str, operator_targets: Path | None = None
) -> dict[str, Any]:
    """Scrape itself, every pod annotated `prometheus.io/scrape: "true"`, and the operators listed in
    `operator_targets` (a file_sd file: operators run as host processes here, not as pods)."""
    pod_job: dict[str, Any] = {
        "job_name": "kubernetes-pods",
        "kubernetes_sd_configs": [{"role": "pod", "kubeconfig_file": str(kubeconfig)}],
        "relabel_configs": [
            {
                "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"],
                "action": "keep",
                "regex": "true",
            },
            {"source_labels": ["__meta_kubernetes_pod_phase"], "action": "keep", "regex": "Running"},
            {
                "source_labels": ["__address__", "__meta_kubernetes_pod_annotation_prometheus_io_port"],
                "regex": r"([^:]+)(?::\d+)?;(\d+)",
                "replacement": "$1:$2",
                "target_label": "__address__",
            },
            {"source_labels": ["__address__"], "action": "keep", "regex": LOOPBACK_ADDRESS},
            {
                "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_path"],
                "regex": "(.+)",
                "target_label": "__metrics_path__",
            },
            {"action": "labelmap", "regex": "__meta_kubernetes_pod_label_(.+)"},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        ],
    }
    jobs: list[dict[str, Any]] = [
        {"job_name": "prometheus", "static_configs": [{"targets": [self_address]}]},
        pod_job,
    ]
    if operator_targets is not None:
        jobs.append(
            {
                "job_name": OPERATOR_JOB,
                "file_sd_configs": [{"files": [str(operator_targets)], "refresh_interval": "5s"}],
            }
        )
    return {
        "global": {
            "scrape_interval": f"{SCRAPE_INTERVAL_SECONDS}s",
            "evaluation_interval": f"{SCRAPE_INTERVAL_SECONDS}s",
        },
        "scrape_configs": jobs,
    }
