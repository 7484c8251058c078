"""Names of the metrics every worker exports: one source for the exporter, PromQL and dashboards.

Histograms are exported by prometheus-client as ``NAME_bucket``, ``NAME_sum`` and ``NAME_count``;
counters as ``NAME_total``. Use the ``*_TOTAL`` / ``*_SUM`` / ``*_COUNT`` helpers in queries.
"""

from __future__ import annotations

# Label names. The job label is not called "job": Prometheus sets its own ``job`` label on every
# scraped target and would rename ours to ``exported_job``.
LABEL_JOB = "heterotrain_job"
LABEL_RANK = "rank"
LABEL_GPU_CLASS = "gpu_class"
# Step histograms and counters also carry the plan version, so the rebalancer can average exactly
# the steps that ran under one split, whatever the scrape timing.
LABEL_PLAN_VERSION = "plan_version"
# Set by Prometheus from the pod, not by the worker.
LABEL_NAMESPACE = "namespace"
WORKER_LABELS: tuple[str, str, str] = (LABEL_JOB, LABEL_RANK, LABEL_GPU_CLASS)

# Per step, seconds (histograms).
STEP_COMPUTE_SECONDS = "heterotrain_worker_step_compute_seconds"
"""Forward + backward (+ local update) time of one step, including any simulated slowdown."""
STEP_SYNC_START_SECONDS = "heterotrain_worker_step_sync_start_seconds"
"""From step start until this rank's first synchronisation is launched (Cannikin's syncStart)."""
STEP_COMM_SECONDS = "heterotrain_worker_step_comm_seconds"
"""Time this rank spends in synchronisation per step (waiting for peers included)."""
STEP_SECONDS = "heterotrain_worker_step_seconds"
"""Wall time of one whole step."""

# Gauges.
LOCAL_BATCH = "heterotrain_worker_local_batch_size"
EPOCH = "heterotrain_worker_epoch"
LOSS = "heterotrain_worker_loss"
PLAN_VERSION = "heterotrain_worker_plan_version"
SIMULATED_SPEED = "heterotrain_worker_simulated_speed"
"""1.0 on real hardware; the HETEROTRAIN_SIMULATED_SPEED factor when compute is stretched."""
LOCAL_STEPS = "heterotrain_worker_local_steps_per_round"
"""Local steps in the last round (esync); 1 for the synchronous strategies."""
GRADIENT_NOISE_SCALE = "heterotrain_worker_gradient_noise_scale"
"""Latest B_noise = S/G estimate (data strategy, rank 0 only)."""
LAYER_SECONDS = "heterotrain_worker_layer_seconds_per_sample"
"""Per-sample seconds of one layer's forward and backward on this rank (hetpipe), by `layer`."""
LABEL_LAYER = "layer"

# Counters (exported with a ``_total`` suffix).
SAMPLES = "heterotrain_worker_samples"
STEPS = "heterotrain_worker_steps"

# Worker environment that sets the labels and the metrics port.
METRICS_PORT_ENV = "HETEROTRAIN_METRICS_PORT"
JOB_NAME_ENV = "HETEROTRAIN_JOB_NAME"
GPU_CLASS_ENV = "HETEROTRAIN_GPU_CLASS"
DEFAULT_METRICS_PORT = 9400


def total(counter: str) -> str:
    """Exported name of a counter."""
    return f"{counter}_total"


def histogram_sum(histogram: str) -> str:
    return f"{histogram}_sum"


def histogram_count(histogram: str) -> str:
    return f"{histogram}_count"


# --- Operator --------------------------------------------------------------------------------------
# Exported by the operator on --metrics-port. Label names for these series:
LABEL_QUEUE = "queue"
LABEL_PHASE = "phase"

OPERATOR_QUEUE_LENGTH = "heterotrain_operator_queue_length"
"""Gauge per queue: jobs waiting to be placed after the last scheduling cycle."""
OPERATOR_CYCLE_SECONDS = "heterotrain_operator_scheduling_cycle_seconds"
"""Histogram: wall time of one whole cycle (lifecycle steps, schedule(), applying its decisions)."""
OPERATOR_SCHEDULE_SECONDS = "heterotrain_operator_schedule_seconds"
"""Histogram: time of the pure schedule() call alone."""
OPERATOR_PLACEMENT_SECONDS = "heterotrain_operator_creation_to_placement_seconds"
"""Histogram: from a job's creation to its first placement."""
OPERATOR_JOBS = "heterotrain_operator_jobs"
"""Gauge per phase: HeteroTrainJobs the operator sees."""
OPERATOR_GPUS_ALLOCATED = "heterotrain_operator_gpus_allocated"
"""Gauge per GPU class (label gpu_class): GPUs held by placed jobs."""
OPERATOR_PREEMPTIONS = "heterotrain_operator_preemptions"
"""Counter: jobs stopped (checkpoint first) to make room, resizes included."""
OPERATOR_RESTARTS = "heterotrain_operator_restarts"
"""Counter: worker-group restarts after a failure."""
OPERATOR_PLACEMENTS = "heterotrain_operator_placements"
"""Counter: jobs placed."""
QUEUE_GPUS = "heterotrain_queue_gpus"
"""Gauge per queue and GPU class: GPUs the queue's jobs hold after the last cycle."""
QUEUE_NOMINAL_GPUS = "heterotrain_queue_nominal_gpus"
"""Gauge per queue and GPU class: the queue's nominal quota."""
QUEUE_BORROWED_GPUS = "heterotrain_queue_borrowed_gpus"
"""Gauge per queue and GPU class: GPUs held beyond nominal quota, lent by the queue's cohort."""
QUEUE_CHARGED_USAGE = "heterotrain_queue_charged_usage"
"""Gauge per queue: charged usage in reference-GPU seconds, decayed by the charging half-life."""
QUEUE_SHARE = "heterotrain_queue_share"
"""Gauge per queue: weighted share (charged usage plus what it holds, over its weight); lowest is
served first."""
LABEL_VERB = "verb"
LABEL_RESOURCE = "resource"
OPERATOR_KUBE_REQUESTS = "heterotrain_operator_kube_requests"
"""Counter per verb and resource (pods, heterotrainjobs/status, ...): requests the operator sent to the
Kubernetes API server, its watches aside."""

# --- Operator HTTP API -------------------------------------------------------------------------------
LABEL_ROUTE = "route"
LABEL_METHOD = "method"
LABEL_CODE = "code"

API_REQUESTS = "heterotrain_api_requests"
"""Counter per route (path template), method and status code: requests to the operator's HTTP API."""
API_REQUEST_SECONDS = "heterotrain_api_request_seconds"
"""Histogram per route and method: time to answer one API request."""

# --- Operator: GPU inventory and plans --------------------------------------------------------------
OPERATOR_GPUS_CAPACITY = "heterotrain_operator_gpus_capacity"
"""Gauge per GPU class (label gpu_class): GPUs on Ready, schedulable nodes of the class."""
OPERATOR_GPUS_FREE = "heterotrain_operator_gpus_free"
"""Gauge per GPU class: of the capacity, GPUs no live pod requests."""
LABEL_WORKLOAD = "workload"
WORKLOAD_SAMPLES_PER_SECOND = "heterotrain_workload_samples_per_second"
"""Gauge per workload key and GPU class (labels workload, gpu_class): the throughput catalog's estimate
of one GPU's samples/s of compute for the workload (its WorkloadProfile)."""
JOB_PREDICTED_STEP_SECONDS = "heterotrain_job_predicted_step_seconds"
"""Gauge per job (labels namespace, heterotrain_job, plan_version): the planner's predicted time of one
global step under the plan in effect; only the current plan version's series is kept."""
