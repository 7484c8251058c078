"""The "Training job" dashboard: one job's workers, side by side, from the metrics every worker exports."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from hetero_operator import metric_names as names
from hetero_operator.dashboards import queries as q
from hetero_operator.dashboards.panels import (
    FULL_WIDTH,
    Query,
    label_variable,
    new_dashboard,
    row,
    single_stat,
    time_series,
)

UID = "heterotrain-training-job"
JOB_VARIABLE = "job"
# Every query selects the chosen job.
JOB = f'{names.LABEL_JOB}="${JOB_VARIABLE}"'
PER_WORKER = (names.LABEL_RANK, names.LABEL_GPU_CLASS)
WORKER_LEGEND = "rank {{rank}} ({{gpu_class}})"
PREDICTED = q.selector(names.JOB_PREDICTED_STEP_SECONDS, JOB)
PREDICTED_STEP = f"max by ({names.LABEL_PLAN_VERSION}) ({PREDICTED})"
MEASURED_STEP = f"max ({q.histogram_mean(names.STEP_SECONDS, PER_WORKER, JOB)})"


def training_job() -> Dashboard:
    return (
        new_dashboard(
            UID,
            "heterotrain / Training job",
            "One HeteroTrainJob's workers: local batch, throughput, iteration time (measured and as the "
            "planner predicted it), epoch progress, loss and rebalances.",
            ["heterotrain", "training"],
        )
        .with_variable(label_variable(JOB_VARIABLE, "Job", names.total(names.STEPS), names.LABEL_JOB))
        .with_row(row("Progress"))
        .with_panel(
            single_stat(
                "Epoch",
                "Highest epoch any worker has reached.",
                [Query(f"max ({q.selector(names.EPOCH, JOB)})")],
                "none",
            )
        )
        .with_panel(
            single_stat(
                "Samples per second",
                "Training throughput of the whole job.",
                [Query(q.per_second(names.SAMPLES, matchers=JOB))],
                "none",
            )
        )
        .with_panel(
            single_stat(
                "Plan version",
                "Version of the batch split in effect; it goes up by one at every rebalance.",
                [Query(f"max ({q.selector(names.PLAN_VERSION, JOB)})")],
                "none",
            )
        )
        .with_panel(
            single_stat(
                "Loss",
                "Training loss of the last step, averaged over workers.",
                [Query(f"avg ({q.selector(names.LOSS, JOB)})")],
                "none",
            )
        )
        .with_panel(
            time_series(
                "Epoch progress",
                "Epoch of each worker.",
                [Query(q.summed(names.EPOCH, PER_WORKER, JOB), WORKER_LEGEND)],
                "none",
            )
        )
        .with_panel(
            time_series(
                "Loss",
                "Training loss of the last step, per worker.",
                [Query(q.summed(names.LOSS, PER_WORKER, JOB), WORKER_LEGEND)],
                "none",
            )
        )
        .with_row(row("Balance"))
        .with_panel(
            time_series(
                "Local batch per worker",
                "Samples each worker processes per step; faster GPUs get larger shares after a rebalance.",
                [Query(q.summed(names.LOCAL_BATCH, PER_WORKER, JOB), WORKER_LEGEND)],
                "none",
            )
        )
        .with_panel(
            time_series(
                "Throughput per worker",
                "Samples per second of each worker, stacked: the top line is the job's throughput.",
                [Query(q.per_second(names.SAMPLES, PER_WORKER, JOB), WORKER_LEGEND)],
                "none",
                stacked=True,
            )
        )
        .with_panel(
            time_series(
                "Iteration time per worker",
                "Mean wall time of one step per worker. With a balanced split the lines meet.",
                [Query(q.histogram_mean(names.STEP_SECONDS, PER_WORKER, JOB), WORKER_LEGEND)],
                "s",
            )
        )
        .with_panel(
            time_series(
                "Iteration time: predicted and measured",
                "The planner's predicted time of one step under the plan in effect, against the measured "
                "one: a synchronous step ends with its slowest worker, so measured is the largest mean "
                "step time of any worker. The prediction steps with each new plan version.",
                [
                    Query(PREDICTED_STEP, "predicted (plan v{{plan_version}})"),
                    Query(MEASURED_STEP, "measured (slowest worker)"),
                ],
                "s",
            )
        )
        .with_panel(
            time_series(
                "Measured over predicted iteration time",
                "Above 1: steps take longer than the planner predicted (its speed priors or fitted model "
                "are optimistic); below 1: faster. Measured on the workers, predicted when the plan was "
                "written.",
                [Query(f"{MEASURED_STEP} / max ({PREDICTED})", "measured / predicted")],
                "none",
            )
        )
        .with_panel(
            time_series(
                "Compute and communication per worker",
                "Mean compute time (forward, backward, local update) and synchronisation time per step. "
                "A fast worker with long communication is waiting for slow ones.",
                [
                    Query(
                        q.histogram_mean(names.STEP_COMPUTE_SECONDS, PER_WORKER, JOB),
                        "compute rank {{rank}} ({{gpu_class}})",
                    ),
                    Query(
                        q.histogram_mean(names.STEP_COMM_SECONDS, PER_WORKER, JOB),
                        "sync rank {{rank}} ({{gpu_class}})",
                    ),
                ],
                "s",
            )
        )
        .with_panel(
            time_series(
                "Rebalances",
                "Plan version in effect (each step up is a rebalance) and how many rebalances happened in "
                "the last 15 minutes.",
                [
                    Query(f"max ({q.selector(names.PLAN_VERSION, JOB)})", "plan version"),
                    Query(q.changes_over(names.PLAN_VERSION, "15m", (), JOB), "rebalances / 15 min"),
                ],
                "none",
                width=FULL_WIDTH,
            )
        )
        .with_row(row("Strategy details"))
        .with_panel(
            time_series(
                "Simulated speed",
                "Fraction of full speed a worker runs at when its compute is deliberately stretched "
                "(1 on real hardware).",
                [Query(q.summed(names.SIMULATED_SPEED, PER_WORKER, JOB), WORKER_LEGEND)],
                "percentunit",
                width=8,
            )
        )
        .with_panel(
            time_series(
                "Local steps per round",
                "Local steps each worker took in its last round (1 for the synchronous strategies).",
                [Query(q.summed(names.LOCAL_STEPS, PER_WORKER, JOB), WORKER_LEGEND)],
                "none",
                width=8,
            )
        )
        .with_panel(
            time_series(
                "Gradient noise scale",
                "Latest estimate of the gradient noise scale (data-parallel strategy, rank 0).",
                [Query(f"max ({q.selector(names.GRADIENT_NOISE_SCALE, JOB)})", "noise scale")],
                "none",
                width=8,
            )
        )
    )
