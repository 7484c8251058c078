"""Run the operator: kopf's settings and credentials, from the operator's settings (`settings`)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable
from datetime import UTC, datetime

import kopf

from hetero_operator.controller import names
from hetero_operator.controller.k8s import connection_info
from hetero_operator.controller.peering import (
    PeeringConfig,
)
from hetero_operator.manager import handlers
from hetero_operator.manager.settings import OperatorSettings

# Importing the modules registers the handlers and indexes with kopf.
assert handlers


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
    settings: kopf.OperatorSettings, options: OperatorSettings, peering: PeeringConfig | None = None
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


def run(options: OperatorSettings) -> None:
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
    if options.kueue.enabled:
        handlers.register_kueue_indexes()
    peering = options.peering_config(datetime.now(UTC))
    memo = kopf.Memo(
        connection=connection_info(
            kubeconfig_first=options.kubeconfig is not None or "KUBECONFIG" in os.environ
        ),
        loop_config=options.loop_config(),
        metrics_port=options.metrics_port,
        api_port=options.api_port,
        rebalancer=options.rebalancer_settings(),
        peering=peering,
    )

    @kopf.on.startup()
    def _configure(settings: kopf.OperatorSettings, **_: object) -> None:
        configure(settings, options, peering)

    asyncio.run(
        kopf.operator(
            clusterwide=not options.namespace,
            namespaces=list(options.namespace),
            standalone=peering is None,
            peering_name=peering.name if peering else None,
            priority=peering.priority if peering else None,
            identity=peering.identity if peering else None,  # type: ignore[arg-type]  # a str NewType
            memo=memo,
        )
    )
