"""Run the operator: kopf settings, credentials and the scheduling loop's configuration."""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import kopf

from hetero_operator.controller import handlers, names, rebalancing
from hetero_operator.controller.k8s import connection_info
from hetero_operator.controller.lifecycle import LifecycleConfig
from hetero_operator.controller.scheduling_loop import LoopConfig
from hetero_operator.rebalance.runner import RebalancerSettings

assert handlers and rebalancing  # importing the modules registers the handlers and indexes with kopf


@dataclass(frozen=True)
class OperatorOptions:
    kubeconfig: Path | None = None
    namespaces: tuple[str, ...] = ()
    metrics_port: int = 0
    peering: str | None = None
    verbose: bool = False
    checkpoint_grace_seconds: float = 30.0
    prometheus_url: str | None = None
    api_port: int = 0
    watch_timeout_seconds: int = 60
    loop: LoopConfig = field(default_factory=LoopConfig)

    def loop_config(self) -> LoopConfig:
        return LoopConfig(
            debounce_seconds=self.loop.debounce_seconds,
            idle_wake_seconds=self.loop.idle_wake_seconds,
            concurrency=self.loop.concurrency,
            namespaces=self.namespaces,
            lifecycle=LifecycleConfig(checkpoint_grace_seconds=self.checkpoint_grace_seconds),
            scheduler=self.loop.scheduler,
            launch=self.loop.launch,
        )


def configure(settings: kopf.OperatorSettings, options: OperatorOptions) -> None:
    """kopf settings: our finalizer, bookkeeping in annotations (the status schema is strict and
    would prune kopf's own fields), short watch timeouts so lost connections heal quickly."""
    settings.persistence.finalizer = names.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=names.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=names.GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.DEBUG if options.verbose else logging.WARNING
    settings.watching.server_timeout = options.watch_timeout_seconds
    settings.watching.client_timeout = options.watch_timeout_seconds + 10
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 30
    settings.scanning.disabled = True
    settings.peering.standalone = options.peering is None
    if options.peering is not None:
        settings.peering.name = options.peering
        settings.peering.mandatory = True
        settings.peering.clusterwide = not options.namespaces


def run(options: OperatorOptions) -> None:
    """Run until interrupted (SIGINT/SIGTERM stop it gracefully)."""
    logging.basicConfig(
        level=logging.DEBUG if options.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not options.verbose:
        logging.getLogger("kopf").setLevel(logging.WARNING)
        logging.getLogger("httpx").setLevel(logging.WARNING)
    if options.kubeconfig is not None:
        os.environ["KUBECONFIG"] = str(options.kubeconfig)
    memo = kopf.Memo(
        connection=connection_info(
            kubeconfig_first=options.kubeconfig is not None or "KUBECONFIG" in os.environ
        ),
        loop_config=options.loop_config(),
        metrics_port=options.metrics_port,
        api_port=options.api_port,
        rebalancer=RebalancerSettings(options.prometheus_url.rstrip("/")) if options.prometheus_url else None,
    )

    @kopf.on.startup()
    def _configure(settings: kopf.OperatorSettings, **_: object) -> None:
        configure(settings, options)

    asyncio.run(
        kopf.operator(
            clusterwide=not options.namespaces,
            namespaces=list(options.namespaces),
            standalone=options.peering is None,
            peering_name=options.peering,
            memo=memo,
        )
    )
