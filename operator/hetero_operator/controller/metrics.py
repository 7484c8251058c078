"""The operator's Prometheus metrics (names from `metric_names`), on their own registry."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from hetero_operator import metric_names as names

CYCLE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0)
PLACEMENT_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.queue_length = Gauge(
            names.OPERATOR_QUEUE_LENGTH, "Jobs waiting to be placed.", [names.LABEL_QUEUE], registry=r
        )
        self.cycle_seconds = Histogram(
            names.OPERATOR_CYCLE_SECONDS,
            "Wall time of one scheduling cycle.",
            buckets=CYCLE_BUCKETS,
            registry=r,
        )
        self.schedule_seconds = Histogram(
            names.OPERATOR_SCHEDULE_SECONDS,
            "Time of the pure schedule() call.",
            buckets=CYCLE_BUCKETS,
            registry=r,
        )
        self.placement_seconds = Histogram(
            names.OPERATOR_PLACEMENT_SECONDS,
            "Time from job creation to its first placement.",
            buckets=PLACEMENT_BUCKETS,
            registry=r,
        )
        self.jobs = Gauge(names.OPERATOR_JOBS, "HeteroTrainJobs by phase.", [names.LABEL_PHASE], registry=r)
        self.gpus_allocated = Gauge(
            names.OPERATOR_GPUS_ALLOCATED, "GPUs held by placed jobs.", [names.LABEL_GPU_CLASS], registry=r
        )
        self.preemptions = Counter(names.OPERATOR_PREEMPTIONS, "Jobs stopped to make room.", registry=r)
        self.restarts = Counter(names.OPERATOR_RESTARTS, "Worker-group restarts after failures.", registry=r)
        self.placements = Counter(names.OPERATOR_PLACEMENTS, "Jobs placed.", registry=r)

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        start_http_server(port, addr=address, registry=self.registry)

    def set_queue_lengths(self, lengths: Mapping[str, int]) -> None:
        # The default queue is always reported, so an empty queue reads 0 rather than no data.
        _set_all(self.queue_length, {DEFAULT_QUEUE: 0, **lengths})

    def set_jobs_by_phase(self, counts: Mapping[str, int]) -> None:
        _set_all(self.jobs, counts)

    def set_gpus_allocated(self, counts: Mapping[str, int]) -> None:
        _set_all(self.gpus_allocated, counts)


DEFAULT_QUEUE = "default"


def _set_all(gauge: Gauge, values: Mapping[str, int]) -> None:
    """Replace every labelled value, so labels that vanished drop to nothing rather than linger."""
    gauge.clear()
    for label, value in values.items():
        gauge.labels(label).set(value)
