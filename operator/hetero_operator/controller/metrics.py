"""The operator's Prometheus metrics (names from `metric_names`), on their own registry."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from hetero_operator import metric_names as names
from hetero_operator.controller.actions import CyclePlan
from hetero_operator.controller.catalog import samples_per_second
from hetero_operator.controller.inventory import ClassCapacity, ClusterView, gpu_capacity
from hetero_operator.resources import HeteroQueueStatus, MeasuredProfile

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
        self.kube_requests = Counter(
            names.OPERATOR_KUBE_REQUESTS,
            "Requests sent to the Kubernetes API server, watches aside.",
            [names.LABEL_VERB, names.LABEL_RESOURCE],
            registry=r,
        )
        self.gpus_capacity = Gauge(
            names.OPERATOR_GPUS_CAPACITY,
            "GPUs on Ready, schedulable nodes.",
            [names.LABEL_GPU_CLASS],
            registry=r,
        )
        self.gpus_free = Gauge(
            names.OPERATOR_GPUS_FREE,
            "GPUs on Ready, schedulable nodes that no live pod requests.",
            [names.LABEL_GPU_CLASS],
            registry=r,
        )
        self.predicted_step_seconds = Gauge(
            names.JOB_PREDICTED_STEP_SECONDS,
            "The planner's predicted time of one global step under the plan in effect.",
            [names.LABEL_NAMESPACE, names.LABEL_JOB, names.LABEL_PLAN_VERSION],
            registry=r,
        )
        self._add_queue_metrics(r)
        self._add_catalog_metrics(r)
        self._plan_versions: dict[tuple[str, str], str] = {}

    def _add_catalog_metrics(self, r: CollectorRegistry) -> None:
        self.workload_speed = Gauge(
            names.WORKLOAD_SAMPLES_PER_SECOND,
            "The throughput catalog: samples/s of compute of one GPU, per workload and class.",
            [names.LABEL_WORKLOAD, names.LABEL_GPU_CLASS],
            registry=r,
        )

    def _add_queue_metrics(self, r: CollectorRegistry) -> None:
        """Per-queue usage, quota and fair-share gauges."""
        per_class = [names.LABEL_QUEUE, names.LABEL_GPU_CLASS]
        self.queue_gpus = Gauge(names.QUEUE_GPUS, "GPUs a queue's jobs hold.", per_class, registry=r)
        self.queue_nominal = Gauge(
            names.QUEUE_NOMINAL_GPUS, "A queue's nominal quota.", per_class, registry=r
        )
        self.queue_borrowed = Gauge(
            names.QUEUE_BORROWED_GPUS, "GPUs a queue holds beyond nominal quota.", per_class, registry=r
        )
        self.queue_charged = Gauge(
            names.QUEUE_CHARGED_USAGE,
            "Charged usage in reference-GPU seconds (decayed).",
            [names.LABEL_QUEUE],
            registry=r,
        )
        self.queue_share = Gauge(
            names.QUEUE_SHARE, "Weighted share: lowest is served first.", [names.LABEL_QUEUE], registry=r
        )

    def count_request(self, verb: str, resource: str) -> None:
        self.kube_requests.labels(verb, resource).inc()

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        start_http_server(port, addr=address, registry=self.registry)

    def set_queue_lengths(self, lengths: Mapping[str, int]) -> None:
        # The default queue is always reported, so an empty queue reads 0 rather than no data.
        _set_all(self.queue_length, {DEFAULT_QUEUE: 0, **lengths})

    def set_jobs_by_phase(self, counts: Mapping[str, int]) -> None:
        _set_all(self.jobs, counts)

    def set_gpus_allocated(self, counts: Mapping[str, int]) -> None:
        _set_all(self.gpus_allocated, counts)

    def set_gpu_capacity(self, capacity: Mapping[str, ClassCapacity]) -> None:
        _set_all(self.gpus_capacity, {name: c.total for name, c in capacity.items()})
        _set_all(self.gpus_free, {name: c.free for name, c in capacity.items()})

    def set_catalog(self, profiles: Mapping[str, MeasuredProfile]) -> None:
        """Every workload's estimate per class, replacing the last (a deleted profile's series go)."""
        self.workload_speed.clear()
        for workload, profile in profiles.items():
            for measured in profile.classes:
                self.workload_speed.labels(workload, measured.gpu_class).set(samples_per_second(measured))

    def set_predicted_step(self, namespace: str, job: str, plan_version: int, seconds: float | None) -> None:
        """The prediction of the job's plan in effect. The previous version's series is removed, so a
        job has one series at a time and a graph of it steps from version to version. A plan without
        a prediction leaves the job without a series rather than with a made-up value."""
        version = str(plan_version)
        known = seconds is not None and seconds > 0
        if self._plan_versions.get((namespace, job)) != version or not known:
            self.forget_job(namespace, job)
        if seconds is None or not known:
            return
        self.predicted_step_seconds.labels(namespace, job, version).set(seconds)
        self._plan_versions[(namespace, job)] = version

    def forget_job(self, namespace: str, job: str) -> None:
        """Drop a job's prediction (it stopped running)."""
        version = self._plan_versions.pop((namespace, job), None)
        if version is not None:
            self.predicted_step_seconds.remove(namespace, job, version)


DEFAULT_QUEUE = "default"


def _set_all(gauge: Gauge, values: Mapping[str, int]) -> None:
    """Replace every labelled value, so labels that vanished drop to nothing rather than linger."""
    gauge.clear()
    for label, value in values.items():
        gauge.labels(label).set(value)


def export_queues(metrics: OperatorMetrics, statuses: Mapping[str, HeteroQueueStatus]) -> None:
    """Each queue's usage, quota, borrowing and share, as its status says after this cycle."""
    for gauge in (
        metrics.queue_gpus,
        metrics.queue_nominal,
        metrics.queue_borrowed,
        metrics.queue_charged,
        metrics.queue_share,
    ):
        gauge.clear()
    for queue, status in statuses.items():
        metrics.queue_charged.labels(queue).set(status.charged_usage)
        metrics.queue_share.labels(queue).set(status.share)
        for usage in status.usage:
            metrics.queue_gpus.labels(queue, usage.gpu_class).set(usage.gpus)
            metrics.queue_nominal.labels(queue, usage.gpu_class).set(usage.nominal)
            metrics.queue_borrowed.labels(queue, usage.gpu_class).set(usage.borrowed)


def export_cycle(metrics: OperatorMetrics, plan: CyclePlan, view: ClusterView) -> None:
    """What one cycle counted and decided, as the operator's metrics."""
    counts = plan.counts
    metrics.placements.inc(counts.placements)
    metrics.restarts.inc(counts.restarts)
    metrics.preemptions.inc(counts.preemptions)
    for seconds in counts.first_placement_seconds:
        metrics.placement_seconds.observe(seconds)
    metrics.set_jobs_by_phase(plan.phases)
    metrics.set_queue_lengths(plan.decisions.metrics.queue_length)
    metrics.set_gpus_allocated(plan.decisions.metrics.gpus_allocated)
    # Capacity changes with nodes and pods; their index events wake a cycle, so it is current here.
    metrics.set_gpu_capacity(gpu_capacity(view))
    metrics.set_catalog(view.profiles)
