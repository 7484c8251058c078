"""Prometheus exporter of what each worker measures, under the shared metric names."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from hetero_operator import metric_names as names

# Steps last from milliseconds (small models on CPU) to tens of seconds (large models).
_STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True)
class StepRecord:
    compute_seconds: float
    sync_start_seconds: float
    comm_seconds: float
    step_seconds: float
    local_batch: int


class WorkerMetrics:
    """One registry per worker; `serve` exposes it over HTTP."""

    def __init__(self, job: str, rank: int, gpu_class: str) -> None:
        self.registry = CollectorRegistry()
        labels = names.WORKER_LABELS
        self._values = (job, str(rank), gpu_class)
        # Per-step series also carry the plan version: the rebalancer averages exactly one split's steps.
        step_labels = (*labels, names.LABEL_PLAN_VERSION)
        self._plan_version = "0"

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, step_labels, registry=self.registry, buckets=_STEP_BUCKETS)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=self.registry)

        self.compute = histogram(names.STEP_COMPUTE_SECONDS, "Forward+backward time per step")
        self.sync_start = histogram(names.STEP_SYNC_START_SECONDS, "Step start until first sync")
        self.comm = histogram(names.STEP_COMM_SECONDS, "Synchronisation time per step")
        self.step = histogram(names.STEP_SECONDS, "Wall time per step")
        self.local_batch = gauge(names.LOCAL_BATCH, "Local batch size of this rank")
        self.epoch = gauge(names.EPOCH, "Current epoch")
        self.loss = gauge(names.LOSS, "Training loss of the last step")
        self.plan_version = gauge(names.PLAN_VERSION, "Version of the plan in effect")
        self.simulated_speed = gauge(names.SIMULATED_SPEED, "Simulated fraction of full speed (1 = real)")
        self.local_steps = gauge(names.LOCAL_STEPS, "Local steps in the last round")
        self.noise_scale = gauge(names.GRADIENT_NOISE_SCALE, "Gradient noise scale estimate")
        self.layer_seconds = Gauge(
            names.LAYER_SECONDS,
            "Per-sample seconds of one layer's forward and backward",
            (*labels, names.LABEL_LAYER),
            registry=self.registry,
        )
        self.samples = Counter(names.SAMPLES, "Samples trained on", step_labels, registry=self.registry)
        self.steps = Counter(names.STEPS, "Steps taken", step_labels, registry=self.registry)
        self.simulated_speed.labels(*self._values).set(1.0)
        self.local_steps.labels(*self._values).set(1)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        start_http_server(port, addr=addr, registry=self.registry)

    def record_step(self, record: StepRecord) -> None:
        v = (*self._values, self._plan_version)
        self.compute.labels(*v).observe(record.compute_seconds)
        self.sync_start.labels(*v).observe(record.sync_start_seconds)
        self.comm.labels(*v).observe(record.comm_seconds)
        self.step.labels(*v).observe(record.step_seconds)
        self.local_batch.labels(*self._values).set(record.local_batch)
        self.samples.labels(*v).inc(record.local_batch)
        self.steps.labels(*v).inc()

    def set_loss(self, loss: float) -> None:
        self.loss.labels(*self._values).set(loss)

    def set_epoch(self, epoch: int) -> None:
        self.epoch.labels(*self._values).set(epoch)

    def set_plan_version(self, version: int) -> None:
        self.plan_version.labels(*self._values).set(version)
        self._plan_version = str(version)

    def set_simulated_speed(self, speed: float) -> None:
        self.simulated_speed.labels(*self._values).set(speed)

    def set_local_steps(self, steps: int) -> None:
        self.local_steps.labels(*self._values).set(steps)

    def set_layer_costs(self, seconds_per_sample: list[float]) -> None:
        for layer, seconds in enumerate(seconds_per_sample):
            self.layer_seconds.labels(*self._values, str(layer)).set(seconds)

    def set_noise_scale(self, value: float) -> None:
        self.noise_scale.labels(*self._values).set(value)
