"""Pure manifest builders, the initial plan and semantic validation."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.operator.builders import TOLERATE_KWOK, allocation, job, job_body

from hetero_operator import metric_names
from hetero_operator import plan as contract
from hetero_operator.controller import launcher, names
from hetero_operator.controller.facts import JobFacts
from hetero_operator.controller.plans import PlanBuildError, initial_plan
from hetero_operator.controller.validation import job_problems
from hetero_operator.resources import Allocation, WorkerAllocation

SPEEDS = {"fast": 1.0, "medium": 0.5, "slow": 0.25}
SETTINGS = launcher.LaunchSettings(
    metrics_port=9400,
    master_port=29500,
    classes={"fast": launcher.ClassLaunchInfo("nvidia.com/gpu", (TOLERATE_KWOK,))},
)


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


def test_worker_pod_is_pinned_labelled_and_wired_to_the_runtime_contract() -> None:
    model = job(checkpoint={"path": "/ckpt"}, env=[{"name": "LOG_LEVEL", "value": "debug"}])
    chosen = allocation(("node-a", "fast"), ("node-b", "medium"), generation=3)
    pods = launcher.worker_pods(model, chosen, SETTINGS)
    assert [p["metadata"]["name"] for p in pods] == ["train-g3-w0", "train-g3-w1"]
    second = pods[1]
    assert second["spec"]["nodeName"] == "node-b"
    assert second["metadata"]["labels"][names.LABEL_JOB] == "train"
    assert second["metadata"]["labels"][names.LABEL_RANK] == "1"
    assert second["metadata"]["labels"][names.LABEL_GENERATION] == "3"
    assert second["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    env = env_of(second)
    assert env[contract.RANK_ENV] == "1"
    assert env[contract.WORLD_SIZE_ENV] == "2"
    assert env[contract.MASTER_ADDR_ENV] == "g3-w0.train.team.svc"
    assert env[contract.MASTER_PORT_ENV] == "29500"
    assert env[contract.PLAN_SOURCE_ENV] == f"{names.PLAN_MOUNT_DIR}/{contract.PLAN_CONFIGMAP_KEY}"
    assert env[contract.CHECKPOINT_DIR_ENV] == "/ckpt"
    assert env[metric_names.METRICS_PORT_ENV] == "9400"
    assert env[metric_names.JOB_NAME_ENV] == "train"
    assert env[metric_names.GPU_CLASS_ENV] == "medium"
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["LOG_LEVEL"] == "debug"
    # The rank-0 DNS name resolves through the headless Service named after the job.
    first = pods[0]
    assert (first["spec"]["hostname"], first["spec"]["subdomain"]) == ("g3-w0", "train")
    service = launcher.headless_service(model, SETTINGS)
    assert service["metadata"]["name"] == "train" and service["spec"]["clusterIP"] == "None"
    annotations = second["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == "9400"
    owner = second["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "HeteroTrainJob",
        "train",
        "uid-1",
        True,
    )


def test_workers_learn_the_precision_their_gpu_and_the_checkpoint_annotation() -> None:
    pod = launcher.worker_pods(job(precision="bf16"), allocation(("node-a", "fast")), SETTINGS)[0]
    env = env_of(pod)
    assert env[contract.PRECISION_ENV] == "bf16"
    assert env[contract.LOCAL_RANK_ENV] == "0"  # a pod sees only its own GPUs
    assert env[contract.POD_ANNOTATIONS_FILE_ENV] == "/etc/heterotrain/podinfo/annotations"
    assert (
        env_of(launcher.worker_pods(job(), allocation(("node-a", "fast")), SETTINGS)[0])[
            contract.PRECISION_ENV
        ]
        == "auto"
    )
    # The annotations reach the worker through a Downward API volume, which the kubelet refreshes.
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "podinfo")
    assert volume["downwardAPI"]["items"] == [
        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}
    ]
    mount = next(m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == "podinfo")
    assert mount == {"name": "podinfo", "mountPath": "/etc/heterotrain/podinfo", "readOnly": True}
    assert names.CHECKPOINT_REQUESTED_ANNOTATION == "heterotrain.io/checkpoint-requested"


def test_worker_pod_runs_locked_down() -> None:
    pod = launcher.worker_pod(
        job(), allocation(("node-a", "fast")), allocation(("node-a", "fast")).workers[0], SETTINGS
    )
    container = pod["spec"]["containers"][0]["securityContext"]
    assert container["runAsNonRoot"] is True
    assert container["readOnlyRootFilesystem"] is True
    assert container["allowPrivilegeEscalation"] is False
    assert container["capabilities"] == {"drop": ["ALL"]}
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    mounts = {m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert "/tmp" in mounts  # the only writable place besides the checkpoint volume


def test_workers_get_their_cpu_memory_and_a_memory_backed_dev_shm() -> None:
    model = job(
        workerResources={"cpu": "3500m", "memory": "24Gi", "sharedMemory": "8Gi"},
        env=[{"name": "NCCL_SOCKET_IFNAME", "value": "eth0"}, {"name": "NCCL_IB_DISABLE", "value": "1"}],
    )
    pod = launcher.worker_pods(model, allocation(("node-a", "fast")), SETTINGS)[0]
    container = pod["spec"]["containers"][0]
    assert container["resources"] == {
        "requests": {"nvidia.com/gpu": "1", "cpu": "3500m", "memory": "24Gi"},
        "limits": {"nvidia.com/gpu": "1", "memory": "24Gi"},  # no CPU limit: it would throttle steps
    }
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}} in pod["spec"]["volumes"]
    env = env_of(pod)
    assert (env["NCCL_SOCKET_IFNAME"], env["NCCL_IB_DISABLE"]) == ("eth0", "1")  # passed through as given


def test_without_worker_resources_only_gpus_are_requested_and_dev_shm_has_its_default() -> None:
    pod = launcher.worker_pods(job(), allocation(("node-a", "fast")), SETTINGS)[0]
    assert pod["spec"]["containers"][0]["resources"] == {
        "requests": {"nvidia.com/gpu": "1"},
        "limits": {"nvidia.com/gpu": "1"},
    }
    shm = next(v for v in pod["spec"]["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Gi"}  # a container's own is 64 MiB


@pytest.mark.parametrize(
    ("resources", "field"),
    [({"memory": "16GB"}, "memory"), ({"cpu": "four"}, "cpu"), ({"sharedMemory": "-1Gi"}, "sharedMemory")],
)
def test_worker_resources_that_are_not_quantities_are_refused_naming_the_field(
    resources: dict[str, str], field: str
) -> None:
    parsed, problems = job_problems(JobFacts.from_body(job_body(workerResources=resources)))
    assert parsed is None and any(p.startswith(f"spec.workerResources.{field}") for p in problems), problems


def test_tolerations_come_from_the_class_and_the_template_adds_to_them() -> None:
    extra = {"key": "team", "operator": "Equal", "value": "a", "effect": "NoSchedule"}
    model = job(template={"spec": {"tolerations": [extra], "priorityClassName": "training"}})
    chosen = allocation(("node-a", "fast"), ("node-b", "slow"))
    fast, slow = launcher.worker_pods(model, chosen, SETTINGS)
    assert fast["spec"]["tolerations"] == [TOLERATE_KWOK, extra]
    assert slow["spec"]["tolerations"] == [extra]  # the slow class has none of its own
    assert fast["spec"]["priorityClassName"] == "training"


def test_building_twice_gives_identical_manifests() -> None:
    model = job(checkpoint={"path": "/ckpt"})
    chosen = allocation(("node-a", "fast"), ("node-a", "fast"), ("node-b", "slow"), generation=1)
    plan = initial_plan(model.spec, chosen, SPEEDS)
    assert launcher.generation_manifests(model, chosen, plan, SETTINGS) == launcher.generation_manifests(
        model, chosen, plan, SETTINGS
    )


def test_every_manifest_is_valid_kubernetes() -> None:
    model = job(
        checkpoint={"path": "/ckpt"},
        template={
            "metadata": {"labels": {"team": "vision"}},
            "spec": {
                "tolerations": [TOLERATE_KWOK],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "imagenet"}}],
                "containers": [
                    {"name": "worker", "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
                    {"name": "logs", "image": "fluent/fluent-bit:3"},
                ],
            },
        },
        workerResources={"cpu": "2", "memory": "8Gi", "sharedMemory": "2Gi"},
    )
    chosen = allocation(("node-a", "fast"), ("node-b", "medium"))
    plan = initial_plan(model.spec, chosen, SPEEDS)
    manifests = launcher.generation_manifests(model, chosen, plan, SETTINGS)
    assert {m["kind"] for m in manifests} == {"Service", "ConfigMap", "PersistentVolumeClaim", "Pod"}
    for manifest in manifests:
        kubernetes_validate.validate(manifest, "1.36", strict=True)


def test_checkpoint_volume_only_for_directory_paths() -> None:
    assert launcher.checkpoint_claim(job(checkpoint={"path": "s3://bucket/run"}), SETTINGS) is None
    assert launcher.checkpoint_claim(job(), SETTINGS) is None
    claim = launcher.checkpoint_claim(job(checkpoint={"path": "/ckpt"}), SETTINGS)
    assert claim is not None and claim["metadata"]["name"] == "train-checkpoint"


def test_plan_config_map_holds_the_plan_document() -> None:
    model = job(gpus={"min": 3, "max": 3}, batch={"global": 112})
    chosen = allocation(("a", "fast"), ("b", "medium"), ("c", "slow"))
    config_map = launcher.plan_config_map(model, initial_plan(model.spec, chosen, SPEEDS))
    plan = contract.Plan.from_json(config_map["data"][contract.PLAN_CONFIGMAP_KEY])
    assert plan.version == 1 and plan.world_size == 3
    assert plan.local_batches == [64, 32, 16]  # 1 : 0.5 : 0.25 of 112


def test_per_class_caps_bound_the_initial_split() -> None:
    model = job(batch={"global": 100, "perGpuClassMax": {"fast": 30}}, gpuClasses=["fast", "slow"])
    plan = initial_plan(model.spec, allocation(("a", "fast"), ("b", "slow")), SPEEDS)
    assert plan.local_batches == [30, 70]


def test_sesgd_groups_must_divide_the_placed_workers() -> None:
    model = job(gpus={"min": 2, "max": 4}, parallelism={"strategy": "sesgd", "sesgd": {"groups": 2}})
    with pytest.raises(PlanBuildError, match="does not divide the 3 workers"):
        initial_plan(model.spec, allocation(("a", "fast"), ("a", "fast"), ("a", "fast")), SPEEDS)
    plan = initial_plan(model.spec, allocation(*[("a", "fast")] * 4), SPEEDS)
    assert plan.sesgd is not None and plan.sesgd.groups == 2


def test_hetpipe_plan_puts_each_virtual_worker_batch_on_its_first_stage() -> None:
    model = job(
        gpus={"min": 4, "max": 4},
        batch={"global": 80},
        parallelism={"strategy": "hetpipe", "hetpipe": {"virtualWorkerSize": 2}},
    )
    workers = [
        WorkerAllocation(rank=0, node="a", gpu_class="fast", gpus=1, virtual_worker=0, stage=0),
        WorkerAllocation(rank=1, node="a", gpu_class="fast", gpus=1, virtual_worker=0, stage=1),
        WorkerAllocation(rank=2, node="b", gpu_class="slow", gpus=1, virtual_worker=1, stage=0),
        WorkerAllocation(rank=3, node="b", gpu_class="slow", gpus=1, virtual_worker=1, stage=1),
    ]
    plan = initial_plan(model.spec, Allocation.from_workers(workers), SPEEDS)
    assert plan.hetpipe is not None
    assert plan.hetpipe.virtual_workers == [[0, 1], [2, 3]]
    assert plan.local_batches == [64, 0, 16, 0]  # virtual-worker speeds 2.0 and 0.5


DIGITS_LAYER_COSTS = [4161.0, 1.0, 4161.0, 1.0, 651.0]  # parameters + 1 of each layer, hidden 64


def test_hetpipe_plan_cuts_the_pipeline_by_layer_costs_at_the_stage_speeds() -> None:
    """One virtual worker over fast, medium and slow: the cuts are the hand-computed minimum-bottleneck
    ones ({0,1} | {2} | {3,4}: 4162, 8322 and 2608 at speeds 1, 0.5, 0.25), one virtual worker keeps the
    learning rate, and its first stage takes the whole batch."""
    model = job(
        gpus={"min": 3, "max": 3},
        batch={"global": 64},
        parallelism={"strategy": "hetpipe", "hetpipe": {"layerCosts": DIGITS_LAYER_COSTS}},
    )
    workers = [
        WorkerAllocation(rank=r, node=c, gpu_class=c, gpus=1, virtual_worker=0, stage=r)
        for r, c in enumerate(["fast", "medium", "slow"])
    ]
    plan = initial_plan(model.spec, Allocation.from_workers(workers), SPEEDS)
    assert plan.hetpipe is not None
    assert plan.hetpipe.virtual_workers == [[0, 1, 2]]
    assert plan.hetpipe.stage_boundaries == [[2, 3]]
    assert plan.learning_rate_scale == 1.0
    assert plan.local_batches == [64, 0, 0]


def test_hetpipe_plan_scales_the_learning_rate_by_one_over_the_virtual_workers() -> None:
    model = job(gpus={"min": 3, "max": 3}, batch={"global": 64}, parallelism={"strategy": "hetpipe"})
    workers = [
        WorkerAllocation(rank=r, node=c, gpu_class=c, gpus=1, virtual_worker=r, stage=0)
        for r, c in enumerate(["fast", "medium", "slow"])
    ]
    plan = initial_plan(model.spec, Allocation.from_workers(workers), SPEEDS)
    assert plan.hetpipe is not None and plan.hetpipe.stage_boundaries == [[], [], []]
    assert plan.learning_rate_scale == pytest.approx(1 / 3)


def test_hetpipe_plan_refuses_more_stages_than_layers() -> None:
    model = job(
        gpus={"min": 3, "max": 3},
        parallelism={"strategy": "hetpipe", "hetpipe": {"layerCosts": [1.0, 1.0]}},
    )
    workers = [
        WorkerAllocation(rank=r, node="a", gpu_class="fast", gpus=1, virtual_worker=0, stage=r)
        for r in range(3)
    ]
    with pytest.raises(PlanBuildError, match="layerCosts"):
        initial_plan(model.spec, Allocation.from_workers(workers), SPEEDS)


@settings(max_examples=40, deadline=None)
@given(
    classes=st.lists(st.sampled_from(sorted(SPEEDS)), min_size=1, max_size=12),
    extra=st.integers(min_value=0, max_value=500),
)
def test_initial_split_covers_the_batch_and_follows_speed(classes: list[str], extra: int) -> None:
    global_batch = len(classes) + extra
    model = job(gpus={"min": 1, "max": 16}, batch={"global": global_batch})
    plan = initial_plan(model.spec, allocation(*[("n", c) for c in classes]), SPEEDS)
    assert sum(plan.local_batches) == global_batch
    assert all(b >= 1 for b in plan.local_batches)
    for i, a in enumerate(classes):
        for j, b in enumerate(classes):
            if SPEEDS[a] > SPEEDS[b]:
                assert plan.local_batches[i] >= plan.local_batches[j] - 1


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (
            {
                "gpus": {"min": 4, "max": 5},
                "parallelism": {"strategy": "hetpipe", "hetpipe": {"virtualWorkerSize": 3}},
            },
            "spec.parallelism.hetpipe.virtualWorkerSize",
        ),
        (
            {"gpus": {"min": 3, "max": 3}, "parallelism": {"strategy": "sesgd", "sesgd": {"groups": 2}}},
            "spec.parallelism.sesgd.groups",
        ),
        ({"env": [{"name": "RANK", "value": "3"}]}, "spec.env[RANK]"),
        (
            {"template": {"spec": {"containers": [{"name": "worker", "ports": [{"containerPort": 9400}]}]}}},
            "spec.template.spec.containers[worker].ports[9400]",
        ),
    ],
)
def test_semantic_problems_name_the_field(spec: dict[str, Any], field: str) -> None:
    parsed, problems = job_problems(JobFacts.from_body(job_body(**spec)))
    assert parsed is not None
    assert len(problems) == 1 and problems[0].startswith(field), problems


def test_a_job_name_that_cannot_name_a_service_is_refused() -> None:
    _, problems = job_problems(JobFacts.from_body(job_body(name="9lives")))
    assert problems and problems[0].startswith("metadata.name")
    _, problems = job_problems(JobFacts.from_body(job_body(name="ok-name")))
    assert problems == []


def test_schema_errors_are_reported_as_problems_too() -> None:
    body = job_body()
    body["spec"]["gpus"] = {"min": 0, "max": 2}
    parsed, problems = job_problems(JobFacts.from_body(json.loads(json.dumps(body))))
    assert parsed is None and any(p.startswith("spec.gpus.min") for p in problems)
