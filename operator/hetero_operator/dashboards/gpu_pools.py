"""The "GPU pools" dashboard: what the operator holds and how fast it places jobs."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from hetero_operator import metric_names as names
from hetero_operator.dashboards import queries as q
from hetero_operator.dashboards.panels import FULL_WIDTH, Query, new_dashboard, row, single_stat, time_series

UID = "heterotrain-gpu-pools"
GPU_CLASS = (names.LABEL_GPU_CLASS,)
QUEUE_CLASS = (names.LABEL_QUEUE, names.LABEL_GPU_CLASS)
ALLOCATED = q.summed(names.OPERATOR_GPUS_ALLOCATED)
CAPACITY = q.summed(names.OPERATOR_GPUS_CAPACITY)


def gpu_pools() -> Dashboard:
    return (
        new_dashboard(
            UID,
            "heterotrain / GPU pools",
            "GPU capacity and allocation per GPU class, job queues, time to placement and scheduling "
            "latency of the heterotrain operator.",
            ["heterotrain", "scheduler"],
        )
        .with_row(row("Allocation"))
        .with_panel(
            single_stat(
                "GPUs allocated",
                "GPUs held by placed jobs, all classes.",
                [Query(q.summed(names.OPERATOR_GPUS_ALLOCATED))],
                "none",
            )
        )
        .with_panel(
            single_stat(
                "Jobs queued",
                "Jobs waiting to be placed, all queues.",
                [Query(q.summed(names.OPERATOR_QUEUE_LENGTH))],
                "none",
            )
        )
        .with_panel(
            single_stat(
                "Placements per hour",
                "Jobs placed per hour over the rate window.",
                [Query(f"3600 * {q.per_second(names.OPERATOR_PLACEMENTS)}")],
                "none",
            )
        )
        .with_panel(
            single_stat(
                "Median time to placement",
                "Median time from a job's creation to its first placement.",
                [Query(q.histogram_quantile(0.5, names.OPERATOR_PLACEMENT_SECONDS))],
                "s",
            )
        )
        .with_panel(
            time_series(
                "GPUs allocated per class",
                "GPUs held by placed jobs, stacked by GPU class.",
                [Query(q.summed(names.OPERATOR_GPUS_ALLOCATED, GPU_CLASS), "{{gpu_class}}")],
                "none",
                stacked=True,
            )
        )
        .with_panel(
            time_series(
                "Jobs by phase",
                "HeteroTrainJobs the operator sees, per phase.",
                [Query(q.summed(names.OPERATOR_JOBS, (names.LABEL_PHASE,)), "{{phase}}")],
                "none",
                stacked=True,
            )
        )
        .with_row(row("Capacity per GPU class"))
        .with_panel(
            single_stat(
                "GPU capacity",
                "GPUs on Ready, schedulable nodes, all classes.",
                [Query(q.summed(names.OPERATOR_GPUS_CAPACITY))],
                "none",
                width=8,
            )
        )
        .with_panel(
            single_stat(
                "GPUs free",
                "Of the capacity, GPUs no running pod requests, all classes.",
                [Query(q.summed(names.OPERATOR_GPUS_FREE))],
                "none",
                width=8,
            )
        )
        .with_panel(
            single_stat(
                "Allocated share of capacity",
                "GPUs held by placed jobs over the GPUs on Ready, schedulable nodes.",
                [Query(f"{ALLOCATED} / {CAPACITY}")],
                "percentunit",
                width=8,
            )
        )
        .with_panel(
            time_series(
                "Capacity and allocation per class",
                "Per GPU class: GPUs on Ready, schedulable nodes (capacity), GPUs held by placed jobs "
                "(allocated) and GPUs no running pod requests (free).",
                [
                    Query(q.summed(names.OPERATOR_GPUS_CAPACITY, GPU_CLASS), "{{gpu_class}} capacity"),
                    Query(q.summed(names.OPERATOR_GPUS_ALLOCATED, GPU_CLASS), "{{gpu_class}} allocated"),
                    Query(q.summed(names.OPERATOR_GPUS_FREE, GPU_CLASS), "{{gpu_class}} free"),
                ],
                "none",
            )
        )
        .with_panel(
            time_series(
                "Allocated share per class",
                "GPUs held by placed jobs over the class's capacity.",
                [
                    Query(
                        f"{q.summed(names.OPERATOR_GPUS_ALLOCATED, GPU_CLASS)} / "
                        f"{q.summed(names.OPERATOR_GPUS_CAPACITY, GPU_CLASS)}",
                        "{{gpu_class}}",
                    )
                ],
                "percentunit",
            )
        )
        .with_row(row("Queues and placement"))
        .with_panel(
            time_series(
                "Queue length",
                "Jobs waiting to be placed after each scheduling cycle, per queue.",
                [Query(q.summed(names.OPERATOR_QUEUE_LENGTH, (names.LABEL_QUEUE,)), "{{queue}}")],
                "none",
            )
        )
        .with_panel(
            time_series(
                "Time to placement",
                "From a job's creation to its first placement.",
                [
                    Query(q.histogram_quantile(0.5, names.OPERATOR_PLACEMENT_SECONDS), "p50"),
                    Query(q.histogram_quantile(0.9, names.OPERATOR_PLACEMENT_SECONDS), "p90"),
                    Query(q.histogram_mean(names.OPERATOR_PLACEMENT_SECONDS), "mean"),
                ],
                "s",
            )
        )
        .with_panel(
            time_series(
                "Placements, preemptions and restarts",
                "Per minute: jobs placed, jobs stopped to make room, worker groups restarted after failures.",
                [
                    Query(f"60 * {q.per_second(names.OPERATOR_PLACEMENTS)}", "placements"),
                    Query(f"60 * {q.per_second(names.OPERATOR_PREEMPTIONS)}", "preemptions"),
                    Query(f"60 * {q.per_second(names.OPERATOR_RESTARTS)}", "restarts"),
                ],
                "none",
                width=FULL_WIDTH,
            )
        )
        .with_row(row("Fair share across queues"))
        .with_panel(
            time_series(
                "GPUs held per queue",
                "GPUs each HeteroQueue's jobs hold, per GPU class, beside its nominal quota.",
                [
                    Query(q.summed(names.QUEUE_GPUS, QUEUE_CLASS), "{{queue}} {{gpu_class}}"),
                    Query(q.summed(names.QUEUE_NOMINAL_GPUS, QUEUE_CLASS), "{{queue}} {{gpu_class}} nominal"),
                ],
                "none",
            )
        )
        .with_panel(
            time_series(
                "Borrowed GPUs",
                "GPUs each queue holds beyond its nominal quota, lent by its cohort; reclaimed (checkpoint "
                "first) when their owner needs them.",
                [Query(q.summed(names.QUEUE_BORROWED_GPUS, QUEUE_CLASS), "{{queue}} {{gpu_class}}")],
                "none",
            )
        )
        .with_panel(
            time_series(
                "Share",
                "Weighted share per queue: charged usage plus what it holds, over its weight. The lowest "
                "is served first.",
                [Query(q.summed(names.QUEUE_SHARE, (names.LABEL_QUEUE,)), "{{queue}}")],
                "none",
            )
        )
        .with_panel(
            time_series(
                "Charged usage",
                "Usage per queue in reference-GPU seconds (GPU seconds times each job's speed on the "
                "class), decayed by the charging half-life.",
                [Query(q.summed(names.QUEUE_CHARGED_USAGE, (names.LABEL_QUEUE,)), "{{queue}}")],
                "none",
            )
        )
        .with_row(row("Throughput catalog"))
        .with_panel(
            time_series(
                "Measured throughput per workload and class",
                "Samples/s of compute of one GPU, per workload key and GPU class, as the throughput "
                "catalog (WorkloadProfiles) estimates it from the jobs that ran: what new jobs of the "
                "workload are placed and first split by.",
                [
                    Query(
                        q.summed(
                            names.WORKLOAD_SAMPLES_PER_SECOND, (names.LABEL_WORKLOAD, names.LABEL_GPU_CLASS)
                        ),
                        "{{workload}} {{gpu_class}}",
                    )
                ],
                "none",
                width=FULL_WIDTH,
            )
        )
        .with_row(row("Scheduling latency"))
        .with_panel(
            time_series(
                "Scheduling cycle",
                "Wall time of one whole scheduling cycle: reading state, schedule(), applying decisions.",
                [
                    Query(q.histogram_quantile(0.5, names.OPERATOR_CYCLE_SECONDS), "p50"),
                    Query(q.histogram_quantile(0.99, names.OPERATOR_CYCLE_SECONDS), "p99"),
                ],
                "s",
            )
        )
        .with_panel(
            time_series(
                "schedule() alone",
                "Time of the pure placement decision, without API calls.",
                [
                    Query(q.histogram_quantile(0.5, names.OPERATOR_SCHEDULE_SECONDS), "p50"),
                    Query(q.histogram_quantile(0.99, names.OPERATOR_SCHEDULE_SECONDS), "p99"),
                ],
                "s",
            )
        )
    )
