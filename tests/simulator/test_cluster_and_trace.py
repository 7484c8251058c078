"""Cluster files and traces: formats, errors that name the field, seeded generation."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_cases import row

from hetero_operator.simulator.cluster import (
    ClusterFileError,
    load_cluster,
    parse_cluster,
)
from hetero_operator.simulator.trace import (
    DURATION_RANGE_S,
    TraceError,
    generate_trace,
    load_trace,
    trace_from_csv,
    trace_to_csv,
)
from hetero_operator.simulator.workloads import MODELS

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "sim"


def test_example_clusters_have_the_advertised_sizes() -> None:
    small = load_cluster(EXAMPLES / "cluster-64.yaml")
    large = load_cluster(EXAMPLES / "cluster-2000.yaml")
    assert (small.total_gpus, len(small.classes)) == (64, 3)
    assert (large.total_gpus, len(large.classes)) == (2000, 4)
    assert len({n.name for n in large.nodes}) == len(large.nodes)


def test_example_trace_loads_and_fits_the_small_cluster() -> None:
    jobs = load_trace(EXAMPLES / "trace-64.csv")
    assert len(jobs) >= 20
    assert all(job.gpus_min <= 16 for job in jobs)


def test_node_group_of_unknown_class_is_rejected_by_field() -> None:
    doc = {
        "classes": [{"name": "v100", "relativeSpeed": 1, "memoryGiB": 16}],
        "nodeGroups": [{"gpuClass": "a100", "nodes": 1, "gpusPerNode": 8}],
    }
    with pytest.raises(
        ClusterFileError,
        match=r"nodeGroups\.0\.gpuClass: 'a100' is not one of the classes",
    ):
        parse_cluster(doc)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"classes": [], "nodeGroups": []}, r"^classes: "),
        (
            {
                "classes": [{"name": "v", "relativeSpeed": 0, "memoryGiB": 16}],
                "nodeGroups": [{"gpuClass": "v", "nodes": 1, "gpusPerNode": 8}],
            },
            r"^classes\.0\.relativeSpeed: ",
        ),
        (
            {
                "classes": [{"name": "v", "relativeSpeed": 1, "memoryGiB": 16}],
                "nodeGroups": [{"gpuClass": "v", "nodes": 1, "gpusPerNode": 8}],
                "extra": 1,
            },
            r"^extra: unknown field",
        ),
    ],
)
def test_bad_cluster_fields_are_named(doc: object, message: str) -> None:
    with pytest.raises(ClusterFileError, match=message):
        parse_cluster(doc)


def test_same_seed_same_trace_and_another_seed_differs() -> None:
    assert generate_trace(7, 50, 100.0) == generate_trace(7, 50, 100.0)
    assert generate_trace(7, 50, 100.0) != generate_trace(8, 50, 100.0)


def test_higher_load_compresses_arrivals() -> None:
    light = generate_trace(1, 200, 100.0, load=0.5)
    heavy = generate_trace(1, 200, 100.0, load=1.0)
    assert heavy[-1].arrival_s == pytest.approx(light[-1].arrival_s / 2, rel=1e-3)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    jobs=st.integers(1, 60),
    max_gpus=st.sampled_from([1, 4, 16, 32]),
)
def test_generated_traces_are_well_formed_and_round_trip_through_csv(
    seed: int, jobs: int, max_gpus: int
) -> None:
    trace = generate_trace(seed, jobs, 64.0, max_gpus=max_gpus)
    arrivals = [j.arrival_s for j in trace]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0
    assert all(1 <= j.gpus_min <= j.gpus_max <= max_gpus for j in trace)
    assert all(DURATION_RANGE_S[0] <= j.duration_s <= DURATION_RANGE_S[1] for j in trace)
    assert trace_from_csv(trace_to_csv(trace)) == trace


def test_durations_are_heavy_tailed() -> None:
    durations = sorted(j.duration_s for j in generate_trace(5, 2000, 100.0))
    mean = sum(durations) / len(durations)
    median = durations[len(durations) // 2]
    assert mean > 2 * median  # a log-normal tail: a few long jobs carry much of the work


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("job_id,arrival_s\nj,0\n", r"^header: missing column\(s\) model"),
        (
            trace_to_csv([row("a", "resnet18", 2, 60)]).replace("resnet18", "vgg"),
            r"^line 2: model: unknown model 'vgg'",
        ),
        (
            trace_to_csv([row("a", "resnet18", 2, 60)]).replace(",2,2,", ",4,2,"),
            r"^line 2: gpus_max: must be >= gpus_min",
        ),
        (
            trace_to_csv([row("a", "resnet18", 1, 60), row("a", "resnet18", 1, 60)]),
            r"^job_id: must be unique",
        ),
    ],
)
def test_bad_trace_rows_are_named(text: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        trace_from_csv(text)


def test_gpu_classes_round_trip_and_an_old_trace_without_the_column_still_loads() -> None:
    restricted = row("a", "resnet18", 1, 60).model_copy(update={"gpu_classes": ("a100", "v100")})
    text = trace_to_csv([restricted, row("b", "resnet18", 1, 60, arrival_s=1.0)])
    assert ",a100|v100\n" in text
    assert trace_from_csv(text) == [restricted, row("b", "resnet18", 1, 60, arrival_s=1.0)]
    old = "job_id,arrival_s,model,gpus_min,gpus_max,duration_s,priority\na,0,resnet18,1,1,60,0\n"
    assert trace_from_csv(old)[0].gpu_classes == ()


def test_an_unknown_class_in_a_row_is_named_with_its_line_column_and_fix() -> None:
    text = trace_to_csv(
        [
            row("a", "resnet18", 1, 60),
            row("b", "resnet18", 1, 60, arrival_s=1.0).model_copy(update={"gpu_classes": ("h100",)}),
        ]
    )
    with pytest.raises(
        TraceError, match=r"^line 3: gpu_classes: unknown class\(es\) h100; use classes of the cluster \(v100"
    ):
        trace_from_csv(text, known_classes=("v100", "p100", "k80"))
    with pytest.raises(TraceError, match=r"^line 2: gpu_classes: 'V100\|\|k80' must be distinct lowercase"):
        trace_from_csv(trace_to_csv([row("a", "resnet18", 1, 60)]).replace(",0,\n", ",0,V100||k80\n"))


def test_about_a_third_of_generated_jobs_are_restricted_to_classes_that_can_hold_them() -> None:
    cluster = load_cluster(EXAMPLES / "cluster-64.yaml")
    trace = generate_trace(11, 900, 40.0, cluster=cluster)
    restricted = [j for j in trace if j.gpu_classes]
    assert 0.25 < len(restricted) / len(trace) < 0.40  # 1/3 drawn; rows with one possible class stay free
    totals = cluster.gpus_per_class()
    for job in restricted:
        assert 1 <= len(job.gpu_classes) <= 2
        for name in job.gpu_classes:
            assert MODELS[job.model].fits(cluster.class_info(name)) and totals[name] >= job.gpus_min
    # The other columns do not depend on the cluster being given.
    plain = generate_trace(11, 900, 40.0)
    assert [j.model_copy(update={"gpu_classes": ()}) for j in trace] == plain
