"""Model profiles from published throughputs, memory limits, and how trace rows become requests."""

from __future__ import annotations

import pytest
from sim_cases import row, three_class_cluster

from hetero_operator.resources import Strategy
from hetero_operator.scheduler import GPUClassInfo, PriorModel
from hetero_operator.simulator.jobs import JobSetupError, build_job
from hetero_operator.simulator.rates import per_gpu_rate
from hetero_operator.simulator.workloads import MODELS, RESNET18, RESNET50

K80 = GPUClassInfo("k80", 0.2, 12)
V100 = GPUClassInfo("v100", 1.0, 16)
PRIOR = PriorModel()


def test_published_rates_survive_the_conversion_to_planner_models() -> None:
    cluster = three_class_cluster()
    job = build_job(row("a", "resnet18", 1, 600), cluster, pipelines=False, prior=PRIOR)
    for gpu in cluster.classes:
        assert per_gpu_rate(job.request, gpu.name) == pytest.approx(RESNET18.rate_on(gpu))
    # ResNet-18 at batch 256: 16.99 iterations/s on a V100 and 2.51 on a K80 (Gavel's table).
    assert RESNET18.rate_on(V100) / RESNET18.rate_on(K80) == pytest.approx(16.9874 / 2.5097)


def test_every_model_is_faster_on_faster_classes() -> None:
    classes = three_class_cluster().classes
    for model in MODELS.values():
        rates = [model.rate_on(c) for c in sorted(classes, key=lambda c: c.relative_speed)]
        assert rates == sorted(rates)


def test_resnet50_does_not_fit_a_k80_alone() -> None:
    assert not RESNET50.fits(K80) and RESNET50.fits(V100)


def test_without_pipelines_a_big_model_is_kept_off_the_small_class() -> None:
    job = build_job(
        row("a", "resnet50", 2, 600),
        three_class_cluster(),
        pipelines=False,
        prior=PRIOR,
    )
    assert job.request.strategy is Strategy.DATA
    assert job.request.allowed_classes == ("v100", "p100")


def test_with_pipelines_a_big_model_runs_as_two_gpu_virtual_workers_anywhere() -> None:
    job = build_job(row("a", "resnet50", 2, 600), three_class_cluster(), pipelines=True, prior=PRIOR)
    assert job.request.strategy is Strategy.HETPIPE
    assert job.request.virtual_worker_size == 2
    assert job.request.allowed_classes == ()


def test_a_single_gpu_big_model_cannot_be_a_pipeline_and_stays_data_parallel() -> None:
    job = build_job(row("a", "resnet50", 1, 600), three_class_cluster(), pipelines=True, prior=PRIOR)
    assert job.request.strategy is Strategy.DATA and "k80" not in job.request.allowed_classes


def test_work_is_the_trace_duration_on_reference_gpus_and_ideal_runtime_is_below_it() -> None:
    short = build_job(
        row("a", "transformer", 4, 600),
        three_class_cluster(),
        pipelines=False,
        prior=PRIOR,
    )
    long = build_job(
        row("b", "transformer", 4, 1200),
        three_class_cluster(),
        pipelines=False,
        prior=PRIOR,
    )
    assert long.work_samples == pytest.approx(2 * short.work_samples)
    assert 0 < short.ideal_runtime_s < 600


def test_a_model_no_class_can_hold_is_refused_with_the_fix() -> None:
    only_k80 = three_class_cluster().__class__(
        classes=(K80,),
        nodes=tuple(n for n in three_class_cluster().nodes if n.gpu_class == "k80"),
    )
    with pytest.raises(JobSetupError, match=r"needs 14\.0 GiB per replica.*HetPipe"):
        build_job(row("a", "resnet50", 1, 600), only_k80, pipelines=False, prior=PRIOR)
