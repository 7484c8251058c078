"""The rebalancer's settings: how running jobs are measured and rebalanced."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field
from pydantic.dataclasses import dataclass as settings


@settings(frozen=True)
class RebalancerTuning:
    """How running jobs are measured and rebalanced (the operator's settings)."""

    min_steps: Annotated[
        int, Field(ge=1, description="Steps every worker must have run under a plan before it is judged.")
    ] = 3
    max_staleness_seconds: Annotated[
        float, Field(gt=0, description="Worker metrics older than this are stale: no decision is taken.")
    ] = 60.0
    # A Prometheus that comes back finds the worker pods again and scrapes each within a few
    # intervals; a rank it has not scraped by then is missing in earnest.
    rediscovery_grace_seconds: Annotated[
        float,
        Field(ge=0, description="After a Prometheus outage, how long a rank without series is waited for."),
    ] = 30.0
    # A change is judged, and the new split decided, on the steps after the look that saw it alone:
    # a mean of fewer steps carries the steps' own noise (a busy host's) into the new split.
    min_confirming_steps: Annotated[
        int,
        Field(
            ge=1,
            description="Fewest steps after a change of speed that confirm it and size the new split.",
        ),
    ] = 10
    tick_seconds: Annotated[
        float, Field(gt=0, description="Seconds between two looks at every running job's metrics.")
    ] = 2.0
    # While Prometheus is away, look again sooner: the job should not finish an epoch still saying
    # so after it is back.
    retry_seconds: Annotated[
        float, Field(gt=0, description="Seconds between two looks while Prometheus does not answer.")
    ] = 0.5


@settings(frozen=True, kw_only=True)
class RebalancerSettings(RebalancerTuning):
    prometheus_url: str
