"""PromQL for a job's worker metrics and the parsing of Prometheus' answers into measurements."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import httpx

from hetero_operator import metric_names as names
from hetero_operator.rebalance.measurements import JobMeasurements, MetricsUnavailable, WorkerMeasurement
from hetero_operator.rebalance.watch import PARTS, RankTotals

RATE_WINDOW = "30s"
# The MetricsAvailable reason while Prometheus does not answer.
PROMETHEUS_UNAVAILABLE = "PrometheusUnavailable"


def selector(namespace: str, job: str, plan_version: int | None = None) -> str:
    parts = [f'{names.LABEL_NAMESPACE}="{namespace}"', f'{names.LABEL_JOB}="{job}"']
    if plan_version is not None:
        parts.append(f'{names.LABEL_PLAN_VERSION}="{plan_version}"')
    return "{" + ",".join(parts) + "}"


def mean_by_rank(histogram: str, sel: str) -> str:
    """Mean of a histogram per rank over every observation that matches `sel`."""
    by = f"sum by ({names.LABEL_RANK})"
    return f"{by} ({names.histogram_sum(histogram)}{sel}) / {by} ({names.histogram_count(histogram)}{sel})"


def job_queries(namespace: str, job: str, plan_version: int) -> dict[str, str]:
    """Every query the rebalancer needs for one job at one plan version."""
    versioned = selector(namespace, job, plan_version)
    current = selector(namespace, job)
    return {
        "compute": mean_by_rank(names.STEP_COMPUTE_SECONDS, versioned),
        "sync_start": mean_by_rank(names.STEP_SYNC_START_SECONDS, versioned),
        "comm": mean_by_rank(names.STEP_COMM_SECONDS, versioned),
        "step": mean_by_rank(names.STEP_SECONDS, versioned),
        "steps": f"sum by ({names.LABEL_RANK}) ({names.histogram_count(names.STEP_SECONDS)}{versioned})",
        "epoch": f"max({names.EPOCH}{current})",
        "samples_per_second": f"sum(rate({names.total(names.SAMPLES)}{current}[{RATE_WINDOW}]))",
        "noise_scale": f"max({names.GRADIENT_NOISE_SCALE}{current})",
        "staleness": f"time() - max(timestamp({names.EPOCH}{current}))",
    }


def _vector(body: Mapping[str, Any], query: str) -> list[tuple[dict[str, str], float]]:
    if body.get("status") != "success":
        raise MetricsUnavailable(
            f"Prometheus refused a query ({body.get('error', 'no reason given')}): {query}"
        )
    data = body.get("data") or {}
    if data.get("resultType") == "scalar":
        return [({}, float(data["result"][1]))]
    try:
        return [(dict(item["metric"]), float(item["value"][1])) for item in data.get("result", [])]
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise MetricsUnavailable(f"Prometheus answered in an unexpected shape for {query}") from err


def _scalar(rows: list[tuple[dict[str, str], float]]) -> float | None:
    return rows[0][1] if rows else None


def parse(plan_version: int, answers: Mapping[str, list[tuple[dict[str, str], float]]]) -> JobMeasurements:
    """Turn per-query answers into measurements (pure; missing ranks stay missing)."""

    def by_rank(key: str) -> dict[int, float]:
        out: dict[int, float] = {}
        for labels, value in answers.get(key, []):
            try:
                out[int(labels[names.LABEL_RANK])] = value
            except (KeyError, ValueError):
                continue
        return out

    compute, sync, comm, step, steps = (
        by_rank(k) for k in ("compute", "sync_start", "comm", "step", "steps")
    )
    workers = tuple(
        WorkerMeasurement(
            rank=rank,
            steps=int(steps.get(rank, 0)) if math.isfinite(steps.get(rank, 0)) else 0,
            compute_seconds=compute[rank],
            sync_start_seconds=sync.get(rank, math.nan),
            comm_seconds=comm.get(rank, math.nan),
            step_seconds=step.get(rank, math.nan),
        )
        for rank in sorted(compute)
    )
    epoch = _scalar(answers.get("epoch", []))
    return JobMeasurements(
        plan_version=plan_version,
        epoch=int(epoch) if epoch is not None and math.isfinite(epoch) else None,
        workers=workers,
        samples_per_second=_scalar(answers.get("samples_per_second", [])),
        noise_scale=_scalar(answers.get("noise_scale", [])),
        seconds_since_last_scrape=_scalar(answers.get("staleness", [])),
    )


Answers = dict[str, list[tuple[dict[str, str], float]]]


async def ask(client: httpx.AsyncClient, prometheus_url: str, queries: Mapping[str, str]) -> Answers:
    """Every query's answer; any transport or API failure is MetricsUnavailable."""
    answers: Answers = {}
    for key, query in queries.items():
        try:
            response = await client.get(
                f"{prometheus_url}/api/v1/query", params={"query": query}, timeout=5.0
            )
            body = response.json()
        except (httpx.HTTPError, ValueError) as err:
            raise MetricsUnavailable(
                f"Prometheus at {prometheus_url} is unreachable ({type(err).__name__})"
            ) from err
        answers[key] = _vector(body, query)
    return answers


async def fetch(
    client: httpx.AsyncClient, prometheus_url: str, namespace: str, job: str, plan_version: int
) -> JobMeasurements:
    """The job's measurements under one plan version."""
    answers = await ask(client, prometheus_url, job_queries(namespace, job, plan_version))
    return parse(plan_version, answers)


HISTOGRAMS = dict(
    zip(
        PARTS,
        (
            names.STEP_COMPUTE_SECONDS,
            names.STEP_SYNC_START_SECONDS,
            names.STEP_COMM_SECONDS,
            names.STEP_SECONDS,
        ),
        strict=True,
    )
)


def totals_queries(namespace: str, job: str, plan_version: int) -> dict[str, str]:
    """Each rank's step histograms summed and counted under one plan version (cumulative)."""
    sel, by = selector(namespace, job, plan_version), f"sum by ({names.LABEL_RANK})"
    queries = {}
    for part, histogram in HISTOGRAMS.items():
        queries[f"{part}_seconds"] = f"{by} ({names.histogram_sum(histogram)}{sel})"
        queries[f"{part}_steps"] = f"{by} ({names.histogram_count(histogram)}{sel})"
    return queries


def parse_totals(answers: Mapping[str, list[tuple[dict[str, str], float]]]) -> dict[int, RankTotals]:
    """Ranks with every part answered (pure)."""
    values: dict[int, dict[str, float]] = {}
    for key, rows in answers.items():
        for labels, value in rows:
            try:
                values.setdefault(int(labels[names.LABEL_RANK]), {})[key] = value
            except (KeyError, ValueError):
                continue
    keys = [(f"{p}_seconds", f"{p}_steps") for p in PARTS]
    return {
        rank: RankTotals(
            seconds=tuple(got[s] for s, _ in keys),  # type: ignore[arg-type]
            steps=tuple(got[n] for _, n in keys),  # type: ignore[arg-type]
        )
        for rank, got in sorted(values.items())
        if all(s in got and n in got and math.isfinite(got[s]) for s, n in keys)
    }


async def fetch_totals(
    client: httpx.AsyncClient, prometheus_url: str, namespace: str, job: str, plan_version: int
) -> dict[int, RankTotals]:
    return parse_totals(await ask(client, prometheus_url, totals_queries(namespace, job, plan_version)))


def layer_cost_query(namespace: str, job: str) -> str:
    """Each rank's measured per-sample seconds of each layer (hetpipe workers export them at start)."""
    by = f"max by ({names.LABEL_RANK}, {names.LABEL_LAYER})"
    return f"{by} ({names.LAYER_SECONDS}{selector(namespace, job)})"


def parse_layer_costs(rows: list[tuple[dict[str, str], float]]) -> dict[int, list[float]]:
    """Per rank, the costs in layer order; a rank with a gap in its layers is left out (pure)."""
    found: dict[int, dict[int, float]] = {}
    for labels, value in rows:
        try:
            found.setdefault(int(labels[names.LABEL_RANK]), {})[int(labels[names.LABEL_LAYER])] = value
        except (KeyError, ValueError):
            continue
    return {
        rank: [layers[i] for i in range(len(layers))]
        for rank, layers in found.items()
        if sorted(layers) == list(range(len(layers)))
    }


async def fetch_layer_costs(
    client: httpx.AsyncClient, prometheus_url: str, namespace: str, job: str
) -> dict[int, list[float]]:
    query = layer_cost_query(namespace, job)
    answers = await ask(client, prometheus_url, {"layers": query})
    return parse_layer_costs(answers["layers"])
