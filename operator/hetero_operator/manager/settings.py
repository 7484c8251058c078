"""Every setting of the operator, in one model: the options of `heterotrain operator` (`--GROUP.KEY`,
kebab-case, with this model's descriptions as help), environment variables (`HETEROTRAIN_`,
`__` between group and key) and the Helm chart's `operator.settings` values are all this model.

The groups are the configuration types the code itself uses (`SchedulerConfig`, `LaunchOptions`,
...), so a tunable is declared, validated and documented once."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Annotated

from pydantic import AliasChoices, Field
from pydantic.dataclasses import dataclass
from pydantic_settings import BaseSettings, SettingsConfigDict

from hetero_operator.controller.kueue_step import KueueConfig
from hetero_operator.controller.launcher import LaunchOptions, LaunchSettings
from hetero_operator.controller.lifecycle import LifecycleConfig
from hetero_operator.controller.peering import (
    DEFAULT_LIFETIME_SECONDS,
    PeeringConfig,
    own_identity,
    start_priority,
)
from hetero_operator.controller.scheduling_loop import LoopConfig, LoopTiming
from hetero_operator.rebalance.settings import RebalancerSettings, RebalancerTuning
from hetero_operator.scheduler import SchedulerConfig

# The groups the Helm chart renders from `operator.settings` (the rest come from other chart values).
CHART_GROUPS = ("loop", "lifecycle", "scheduler", "launch", "rebalancer")


@dataclass(frozen=True)
class KueueOptions(KueueConfig):
    enabled: Annotated[
        bool,
        Field(
            description="Submit jobs labelled kueue.x-k8s.io/queue-name to Kueue (v1beta2 API; Kueue must be "
            "installed): each gets a Workload with one pod set per GPU class and starts once admitted."
        ),
    ] = False


class OperatorSettings(BaseSettings):
    """Run the heterotrain operator: validate, place, launch and restart HeteroTrainJobs."""

    model_config = SettingsConfigDict(
        env_prefix="HETEROTRAIN_",
        env_nested_delimiter="__",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_prog_name="heterotrain operator",
        cli_use_class_docs_for_groups=True,
        extra="forbid",
    )

    kubeconfig: Path | None = Field(
        default=None, description="Kubeconfig file. Default: KUBECONFIG, ~/.kube/config, in-cluster."
    )
    namespace: list[str] = Field(
        default_factory=list,
        validation_alias=AliasChoices("n", "namespace"),
        description="Watch only this namespace (repeatable). Default: all.",
    )
    metrics_port: int = Field(
        default=8080, ge=0, le=65535, description="Serve Prometheus metrics here (0: off)."
    )
    api_port: int = Field(
        default=0, ge=0, le=65535, description="Serve the HTTP API (pools, jobs, what-if) here (0: off)."
    )
    prometheus_url: str | None = Field(
        default=None, description="Prometheus that scrapes the workers: progress and rebalancing need it."
    )
    peering: str | None = Field(
        default=None, description="kopf peering name for HA (needs the KopfPeering CRDs). Default: alone."
    )
    peering_priority: int | None = Field(
        default=None,
        description="This replica's peering priority (highest acts). Default: from the start time, so the "
        "oldest replica acts and replicas never share a priority (kopf pauses every replica on a tie).",
    )
    peering_lifetime: int = Field(
        default=DEFAULT_LIFETIME_SECONDS,
        ge=1,
        description="Seconds a replica's peering entry lives without renewal: the longest a standby waits "
        "before it takes over from a replica that died.",
    )
    watch_timeout_seconds: int = Field(
        default=60, ge=1, description="Seconds the API server keeps a watch open before kopf renews it."
    )
    cycle_log: Path | None = Field(
        default=None, description="Append each scheduling cycle's duration and size here (benchmarks)."
    )
    verbose: bool = Field(
        default=False, validation_alias=AliasChoices("v", "verbose"), description="Debug logging."
    )
    loop: LoopTiming = Field(default_factory=LoopTiming)
    lifecycle: LifecycleConfig = Field(default_factory=LifecycleConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    launch: LaunchOptions = Field(default_factory=LaunchOptions)
    rebalancer: RebalancerTuning = Field(default_factory=RebalancerTuning)
    kueue: KueueOptions = Field(default_factory=KueueOptions)

    def loop_config(self) -> LoopConfig:
        return LoopConfig(
            timing=self.loop,
            namespaces=tuple(self.namespace),
            lifecycle=self.lifecycle,
            scheduler=self.scheduler,
            launch=LaunchSettings(**asdict(self.launch)),
            cycle_log=self.cycle_log,
            kueue=KueueConfig(self.kueue.repropose_after_seconds) if self.kueue.enabled else None,
        )

    def rebalancer_settings(self) -> RebalancerSettings | None:
        """How running jobs are measured; None without Prometheus."""
        if not self.prometheus_url:
            return None
        return RebalancerSettings(**asdict(self.rebalancer), prometheus_url=self.prometheus_url.rstrip("/"))

    def peering_config(self, started: datetime) -> PeeringConfig | None:
        """This replica's place in the peering object; None when it runs alone."""
        if self.peering is None:
            return None
        priority = self.peering_priority if self.peering_priority is not None else start_priority(started)
        return PeeringConfig(
            name=self.peering,
            identity=own_identity(),
            priority=priority,
            lifetime_seconds=self.peering_lifetime,
            namespaces=tuple(self.namespace),
        )
