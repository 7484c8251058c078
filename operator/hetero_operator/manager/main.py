"""Run the operator: kopf settings, credentials and the scheduling loop's configuration."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import kopf

from hetero_operator.controller import names
from hetero_operator.controller.k8s import connection_info
from hetero_operator.controller.kueue_step import KueueConfig
from hetero_operator.controller.lifecycle import LifecycleConfig
from hetero_operator.controller.peering import (
    DEFAULT_LIFETIME_SECONDS,
    PeeringConfig,
    own_identity,
    start_priority,
)
from hetero_operator.controller.scheduling_loop import LoopConfig
from hetero_operator.manager import handlers
from hetero_operator.rebalance.runner import RebalancerSettings

# Importing the modules registers the handlers and indexes with kopf.
assert handlers


@dataclass(frozen=True)
class OperatorOptions:
    kubeconfig: Path | None = None
    namespaces: tuple[str, ...] = ()
    metrics_port: int = 0
    peering: str | None = None
    peering_priority: int | None = None  # None: from the start time, older replicas first
    peering_lifetime_seconds: int = DEFAULT_LIFETIME_SECONDS
    verbose: bool = False
    checkpoint_grace_seconds: float = 30.0
    prometheus_url: str | None = None
    api_port: int = 0
    watch_timeout_seconds: int = 60
    cycle_log: Path | None = None
    kueue: bool = False
    kueue_repropose_after_seconds: float = 300.0
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
            cycle_log=self.cycle_log,
            kueue=KueueConfig(self.kueue_repropose_after_seconds) if self.kueue else None,
        )

    def peering_config(self, started: datetime) -> PeeringConfig | None:
        """This replica's place in the peering object; None when it runs alone."""
        if self.peering is None:
            return None
        priority = self.peering_priority if self.peering_priority is not None else start_priority(started)
        return PeeringConfig(
            name=self.peering,
            identity=own_identity(),
            priority=priority,
            lifetime_seconds=self.peering_lifetime_seconds,
            namespaces=self.namespaces,
        )


class NoDiffBase(kopf.DiffBaseStorage):
    """No handler here reacts to a change of an object (indexes and deletion events only), so
    nothing needs the last handled state; kopf's own storages would deep-copy every watched body,
    thousands of pods included, on every event to build it."""

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[kopf.FieldSpec] | None = None
    ) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def configure(
    settings: kopf.OperatorSettings, options: OperatorOptions, peering: PeeringConfig | None = None
) -> None:
    """kopf settings: its finalizer's name (never added: no daemons), no diff base, bookkeeping in
    annotations (the status schema is strict and would prune kopf's own fields), short watch
    timeouts so lost connections heal quickly."""
    settings.persistence.finalizer = names.KOPF_FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=names.GROUP)
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.posting.level = logging.DEBUG if options.verbose else logging.WARNING
    settings.watching.server_timeout = options.watch_timeout_seconds
    settings.watching.client_timeout = options.watch_timeout_seconds + 10
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 30
    settings.scanning.disabled = True
    settings.peering.standalone = peering is None
    if peering is not None:
        settings.peering.name = peering.name
        settings.peering.mandatory = True
        settings.peering.clusterwide = not peering.namespaces
        settings.peering.priority = peering.priority
        settings.peering.lifetime = peering.lifetime_seconds


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
    if options.kueue:
        handlers.register_kueue_indexes()
    peering = options.peering_config(datetime.now(UTC))
    memo = kopf.Memo(
        connection=connection_info(
            kubeconfig_first=options.kubeconfig is not None or "KUBECONFIG" in os.environ
        ),
        loop_config=options.loop_config(),
        metrics_port=options.metrics_port,
        api_port=options.api_port,
        rebalancer=RebalancerSettings(options.prometheus_url.rstrip("/")) if options.prometheus_url else None,
        peering=peering,
    )

    @kopf.on.startup()
    def _configure(settings: kopf.OperatorSettings, **_: object) -> None:
        configure(settings, options, peering)

    asyncio.run(
        kopf.operator(
            clusterwide=not options.namespaces,
            namespaces=list(options.namespaces),
            standalone=peering is None,
            peering_name=peering.name if peering else None,
            priority=peering.priority if peering else None,
            identity=peering.identity if peering else None,  # type: ignore[arg-type]  # a str NewType
            memo=memo,
        )
    )
