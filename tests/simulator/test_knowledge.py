"""What policies know of each job's speeds: the priors until its workload key has been measured, the
truth on the classes measured after that, everything at once under the oracle; progress always
follows the truth. Expected speeds are worked out from the published figures in `workloads`."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from sim_cases import row, three_class_cluster

from hetero_operator.scheduler import Decisions, JobRequest, PriorModel, Snapshot
from hetero_operator.scheduler.free_index import ClusterState
from hetero_operator.scheduler.throughput import class_rate_per_gpu
from hetero_operator.simulator.engine import EngineOptions, simulate
from hetero_operator.simulator.jobs import JobSetupError, build_job
from hetero_operator.simulator.knowledge import Knowledge, KnowledgeMode, KnowledgeSettings
from hetero_operator.simulator.policies.backfill import fastest_first
from hetero_operator.simulator.policies.base import commit_first_fitting, decisions
from hetero_operator.simulator.trace import (
    REPEAT_SHARE,
    TraceJob,
    generate_trace,
    trace_from_csv,
    trace_to_csv,
)

CLUSTER = three_class_cluster()
CATALOG = tuple(sorted(CLUSTER.classes, key=lambda c: c.name))
CLASSES = {c.name: c for c in CLUSTER.classes}
# ResNet-18 at batch 256, iterations/s (Gavel's paper, as in `workloads`): samples/s of one GPU.
RESNET18_K80 = 2.5097 * 256
RESNET18_V100 = 16.9874 * 256
MEASURED = EngineOptions(knowledge=KnowledgeSettings(mode=KnowledgeMode.MEASURED, measure_after_s=300.0))
ORACLE = EngineOptions(knowledge=KnowledgeSettings(mode=KnowledgeMode.ORACLE))


@dataclass
class PlaceOn:
    """Starts every waiting job on its gpus.min GPUs of one class and keeps what each cycle showed."""

    gpu_class: str
    name: str = "place-on"
    pipelines: bool = False
    round_s: float | None = None
    seen: list[tuple[float, dict[str, JobRequest]]] = field(default_factory=list)

    def decide(self, snapshot: Snapshot) -> Decisions:
        self.seen.append((snapshot.now, {j.key.split("/")[1]: j for j in snapshot.jobs}))
        state = ClusterState(snapshot)
        place = {}
        for job in snapshot.jobs:
            if job.current is None:
                allocation = commit_first_fitting(state, job, [self.gpu_class])
                if allocation is not None:
                    place[job.key] = allocation
        return decisions(snapshot, state, place, {}, {})

    def at(self, now: float) -> dict[str, JobRequest]:
        return next(jobs for when, jobs in self.seen if when == now)


def keyed(
    job_id: str, model: str, workload: str, arrival_s: float = 0.0, duration_s: float = 3600.0
) -> TraceJob:
    return row(job_id, model, 1, duration_s, arrival_s=arrival_s).model_copy(update={"workload": workload})


def rate(job: JobRequest, gpu_class: str) -> float:
    return class_rate_per_gpu(job, CLASSES[gpu_class], CATALOG, PriorModel())


def test_a_job_whose_key_was_never_measured_is_seen_by_the_priors() -> None:
    policy = PlaceOn("k80")
    simulate(CLUSTER, [keyed("a", "resnet18", "rn18")], policy, MEASURED)
    first = policy.at(0.0)["a"]
    assert first.profile is None and first.remaining_s is None
    # The prior: 10 ms per sample and 20 ms per step on a GPU of speed 1, divided by the class's speed.
    assert rate(first, "v100") == pytest.approx(1000 * 256 / (10 * 256 + 20))
    assert rate(first, "k80") == pytest.approx(0.2 * 1000 * 256 / (10 * 256 + 20))


def test_after_its_first_measured_run_a_job_sees_the_truth_there_and_the_priors_ratio_elsewhere() -> None:
    policy = PlaceOn("k80")
    trace = [keyed("a", "resnet18", "rn18"), keyed("probe", "lm", "lm-probe", arrival_s=1000.0)]
    simulate(CLUSTER, trace, policy, MEASURED)
    later = policy.at(1000.0)["a"]
    assert later.profile is not None and [name for name, _ in later.profile.per_class] == ["k80"]
    assert rate(later, "k80") == pytest.approx(RESNET18_K80)
    assert rate(later, "v100") == pytest.approx(RESNET18_K80 / 0.2)  # not the true 6.8x: never ran there
    assert later.remaining_s is not None and later.remaining_s > 0


def test_a_job_rerunning_a_measured_key_sees_the_truth_at_arrival_and_a_new_key_the_priors() -> None:
    policy = PlaceOn("k80")
    trace = [
        keyed("a", "resnet18", "rn18"),
        keyed("again", "resnet18", "rn18", arrival_s=1000.0),
        keyed("new", "resnet18", "rn18-other", arrival_s=1000.0),
    ]
    simulate(CLUSTER, trace, policy, MEASURED)
    seen = policy.at(1000.0)
    assert rate(seen["again"], "k80") == pytest.approx(RESNET18_K80)
    assert seen["new"].profile is None


def test_the_oracle_sees_every_class_true_speed_at_arrival() -> None:
    policy = PlaceOn("k80")
    simulate(CLUSTER, [keyed("a", "resnet18", "rn18")], policy, ORACLE)
    first = policy.at(0.0)["a"]
    assert rate(first, "v100") == pytest.approx(RESNET18_V100)
    assert rate(first, "k80") == pytest.approx(RESNET18_K80)
    assert first.remaining_s is None  # not running yet


@pytest.mark.parametrize("options", [MEASURED, ORACLE], ids=["measured", "oracle"])
def test_progress_follows_the_true_speed_whatever_the_policy_knows(options: EngineOptions) -> None:
    result = simulate(CLUSTER, [keyed("a", "resnet18", "rn18", duration_s=600.0)], PlaceOn("k80"), options)
    # 600 s of V100 work on a K80, after the 30 s start-up.
    assert result.outcomes[0].jct_s == pytest.approx(30.0 + 600.0 * RESNET18_V100 / RESNET18_K80)


def test_greedy_fastest_ranks_an_unmeasured_class_by_a_measured_one_scaled_by_the_priors() -> None:
    # Recommendation runs faster on a K80 than on a V100, but a job measured only on K80 cannot know.
    job = build_job(keyed("r", "recommendation", "rec"), CLUSTER, pipelines=False, prior=PriorModel())
    knowledge = Knowledge(KnowledgeSettings())
    knowledge.observe(job, {"k80": 1}, at_s=0.0)
    request = replace(job.request, profile=knowledge.profile(job))
    state = ClusterState(Snapshot(CLUSTER.classes, CLUSTER.nodes, (request,)))
    assert fastest_first(request, state, ["k80", "p100", "v100"]) == ["v100", "p100", "k80"]


def test_measurement_noise_is_seeded_and_small() -> None:
    job = build_job(keyed("a", "resnet18", "rn18"), CLUSTER, pipelines=False, prior=PriorModel())
    measured = []
    for _ in range(2):
        knowledge = Knowledge(KnowledgeSettings(noise=0.05, seed=7))
        knowledge.observe(job, {"k80": 2}, at_s=330.0)
        profile = knowledge.profile(job)
        assert profile is not None
        measured.append(rate(JobRequest("sim/a", 1, 1, 256, 0.0, profile=profile), "k80"))
    assert measured[0] == measured[1] != pytest.approx(RESNET18_K80, rel=1e-6)
    assert measured[0] == pytest.approx(RESNET18_K80, rel=0.25)


def test_one_workload_key_is_one_model() -> None:
    trace = [keyed("a", "resnet18", "shared"), keyed("b", "lm", "shared", arrival_s=10.0)]
    with pytest.raises(JobSetupError, match="workload 'shared' runs model resnet18"):
        simulate(CLUSTER, trace, PlaceOn("k80"), MEASURED)


def test_generated_traces_rerun_earlier_keys_of_the_same_model_at_about_the_stated_share() -> None:
    trace = generate_trace(5, 4000, 40.0, 0.8)
    model_of: dict[str, str] = {}
    reruns = 0
    for job in trace:
        reruns += job.workload in model_of
        assert model_of.setdefault(job.workload, job.model) == job.model
    # The first job of each model always brings a new key.
    assert reruns / len(trace) == pytest.approx(REPEAT_SHARE, abs=0.03)


def test_the_workload_column_is_optional_and_round_trips() -> None:
    old = "job_id,arrival_s,model,gpus_min,gpus_max,duration_s,priority\nj-1,0,lm,1,1,60,0\n"
    loaded = trace_from_csv(old)[0]
    assert loaded.workload == "" and loaded.workload_key == "job/j-1"
    assert "workload" not in trace_to_csv([loaded])
    rows = [keyed("j-1", "lm", "lm-w0001")]
    text = trace_to_csv(rows)
    assert text.splitlines()[0].endswith(",workload")
    assert trace_from_csv(text) == rows
