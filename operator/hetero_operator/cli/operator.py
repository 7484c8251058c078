"""`heterotrain operator`: run the operator against a kubeconfig or the in-cluster service account."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

OPERATOR_HELP = "Run the heterotrain operator: validate, place, launch and restart HeteroTrainJobs."


def operator_command(
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            "--kubeconfig", help="Kubeconfig file. Default: KUBECONFIG, ~/.kube/config, in-cluster."
        ),
    ] = None,
    namespace: Annotated[
        list[str] | None,
        typer.Option("--namespace", "-n", help="Watch only this namespace (repeatable). Default: all."),
    ] = None,
    metrics_port: Annotated[
        int, typer.Option("--metrics-port", help="Serve Prometheus metrics on this port (0: off).")
    ] = 8080,
    peering: Annotated[
        str | None,
        typer.Option(
            "--peering", help="kopf peering name for HA (needs the KopfPeering CRDs). Default: standalone."
        ),
    ] = None,
    peering_priority: Annotated[
        int | None,
        typer.Option(
            "--peering-priority",
            help="This replica's peering priority (highest acts). Default: from the start time, so the "
            "oldest replica acts and replicas never share a priority (kopf pauses every replica on a tie).",
        ),
    ] = None,
    peering_lifetime: Annotated[
        int,
        typer.Option(
            "--peering-lifetime",
            min=1,
            help="Seconds a replica's peering entry lives without renewal: the longest a standby waits "
            "before it takes over from a replica that died.",
        ),
    ] = 60,
    checkpoint_grace: Annotated[
        float,
        typer.Option(
            "--checkpoint-grace", help="Seconds workers get to save a checkpoint before they are stopped."
        ),
    ] = 30.0,
    prometheus_url: Annotated[
        str | None,
        typer.Option(
            "--prometheus-url",
            help="Prometheus that scrapes the workers; enables rebalancing between epochs.",
            envvar="HETEROTRAIN_PROMETHEUS_URL",
        ),
    ] = None,
    api_port: Annotated[
        int,
        typer.Option("--api-port", help="Serve the HTTP API (pools, jobs, what-if) on this port (0: off)."),
    ] = 0,
    cycle_log: Annotated[
        Path | None,
        typer.Option("--cycle-log", help="Append each scheduling cycle's duration and size to this file."),
    ] = None,
    kueue: Annotated[
        bool,
        typer.Option(
            "--kueue",
            help="Submit jobs labelled kueue.x-k8s.io/queue-name to Kueue (v1beta2 API; Kueue must be "
            "installed): each gets a Workload with one pod set per GPU class and starts once admitted.",
        ),
    ] = False,
    kueue_repropose_after: Annotated[
        float,
        typer.Option(
            "--kueue-repropose-after",
            min=1.0,
            help="Seconds a job's Workload may wait for admission before the job asks for the best mix "
            "the queue's unused quota admits instead.",
        ),
    ] = 300.0,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    """Run the heterotrain operator: validate, place, launch and restart HeteroTrainJobs."""
    from hetero_operator.manager.main import OperatorOptions, run

    run(
        OperatorOptions(
            kubeconfig=kubeconfig,
            namespaces=tuple(namespace or ()),
            metrics_port=metrics_port,
            peering=peering,
            peering_priority=peering_priority,
            peering_lifetime_seconds=peering_lifetime,
            verbose=verbose,
            checkpoint_grace_seconds=checkpoint_grace,
            prometheus_url=prometheus_url,
            api_port=api_port,
            cycle_log=cycle_log,
            kueue=kueue,
            kueue_repropose_after_seconds=kueue_repropose_after,
        )
    )


if __name__ == "__main__":
    typer.run(operator_command)
