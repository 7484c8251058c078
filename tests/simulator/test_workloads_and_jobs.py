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


def test_the_speed_up_between_two_classes_depends_on_the_model() -> None:
    # Gavel's isolated throughputs (iterations/s, V100 over K80): Recommendation is slower on the
    # V100, ResNet-18 almost 7x faster, the LSTM language model in between.
    assert MODELS["recommendation"].rate_on(V100) / MODELS["recommendation"].rate_on(K80) == pytest.approx(
        7.470 / 10.441
    )
    assert MODELS["lm"].rate_on(V100) / MODELS["lm"].rate_on(K80) == pytest.approx(64.742 / 17.142)
    assert RESNET18.rate_on(V100) / RESNET18.rate_on(K80) == pytest.approx(16.9874 / 2.5097)


def test_a_second_source_keeps_its_own_ratio_to_the_v100() -> None:
    # Sia's ResNet-50 on one GPU: A100 572 and V100 464 samples/s; the V100 rate is Gavel's 2.846 x 128.
    a100 = GPUClassInfo("a100", 2.0, 40)
    assert RESNET50.rate_on(a100) == pytest.approx(2.8460 * 128 * 572 / 464)
    # Sia's YOLOv3: the A100 (27 samples/s) is slower than the V100 (32).
    assert MODELS["yolov3"].rate_on(a100) == pytest.approx(27.0)
    assert MODELS["yolov3"].rate_on(V100) == pytest.approx(32.0)


def test_a_class_without_a_published_figure_is_estimated_from_its_relative_speed() -> None:
    bert = MODELS["bert"]
    assert bert.rate_on(K80) == pytest.approx(33.0 * 0.2)
    assert bert.estimated_classes() == ("k80", "p100")
    assert RESNET18.estimated_classes() == ()


def test_at_least_six_model_families_under_canonical_class_names() -> None:
    assert len(MODELS) >= 6
    for model in MODELS.values():
        assert all(name == name.lower() and " " not in name for name in model.samples_per_s)
        assert "v100" in model.samples_per_s  # the reference class the estimates scale from


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


def test_a_rows_gpu_classes_become_the_jobs_allowed_classes_in_its_order() -> None:
    trace_row = row("a", "transformer", 1, 600).model_copy(update={"gpu_classes": ("k80", "v100")})
    job = build_job(trace_row, three_class_cluster(), pipelines=True, prior=PRIOR)
    assert job.request.allowed_classes == ("k80", "v100")


def test_a_big_model_limited_to_classes_it_does_not_fit_keeps_to_them_as_pipelines() -> None:
    trace_row = row("a", "resnet50", 2, 600).model_copy(update={"gpu_classes": ("k80",)})
    job = build_job(trace_row, three_class_cluster(), pipelines=True, prior=PRIOR)
    assert job.request.strategy is Strategy.HETPIPE and job.request.allowed_classes == ("k80",)
    with pytest.raises(JobSetupError, match=r"allow larger classes in gpu_classes"):
        build_job(trace_row, three_class_cluster(), pipelines=False, prior=PRIOR)


def test_a_row_naming_a_class_the_cluster_lacks_is_refused_with_the_fix() -> None:
    trace_row = row("a", "transformer", 1, 600).model_copy(update={"gpu_classes": ("h100",)})
    with pytest.raises(JobSetupError, match=r"job a: gpu_classes names h100.*fix the trace row"):
        build_job(trace_row, three_class_cluster(), pipelines=False, prior=PRIOR)
