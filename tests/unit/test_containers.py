"""A pod's container as `podman run` arguments (pure): security context, volumes, command and args."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hetero_operator.testbed.containers import (
    ContainerConfigError,
    RunSpec,
    command_args,
    namespace_hosts,
    quantity_bytes,
    run_argv,
    volume_args,
)

DIRS = {"plan": Path("/agent/p/plan"), "tmp": Path("/agent/p/tmp"), "ckpt": Path("/agent/claims/ns/c")}


def worker_pod(**container_changes: Any) -> dict[str, Any]:
    """Shaped like the operator's worker pods: restricted security context, plan, /tmp and claim."""
    container = {
        "name": "worker",
        "image": "localhost/heterotrain/trainer:abc",
        "command": ["heterotrain", "worker", "digits"],
        "env": [{"name": "RANK", "value": "0"}],
        "volumeMounts": [
            {"name": "plan", "mountPath": "/etc/heterotrain/plan", "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "ckpt", "mountPath": "/ckpt"},
        ],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        **container_changes,
    }
    return {
        "metadata": {"name": "w-0", "namespace": "ns", "uid": "u-1"},
        "spec": {
            "hostname": "g0-0",
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 1000,
                "runAsGroup": 1000,
                "fsGroup": 1000,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [container],
            "volumes": [
                {"name": "plan", "configMap": {"name": "job-plan"}},
                {"name": "tmp", "emptyDir": {}},
                {"name": "ckpt", "persistentVolumeClaim": {"claimName": "c"}},
            ],
        },
    }


def spec(image_user: str = "1000:1000", env: dict[str, str] | None = None) -> RunSpec:
    return RunSpec(
        pod_uid="u-1",
        hostname="g0-0",
        env=env or {"RANK": "0", "POD_IP": "127.10.0.2"},
        volume_dirs=DIRS,
        hosts={"g0-1.svc1.ns.svc": "127.10.0.3"},
        limits=("--ulimit=nofile=1024:1024",),
        agent_root="/agent",
        image_user=image_user,
    )


def test_the_operators_worker_pod_becomes_a_restricted_podman_run() -> None:
    pod = worker_pod()
    argv = run_argv(pod, pod["spec"]["containers"][0], spec())
    image_at = argv.index("localhost/heterotrain/trainer:abc")
    options, after_image = argv[:image_at], argv[image_at + 1 :]
    assert options[0] == "run"
    for expected in (
        "--rm",
        "--pull=never",
        "--name=heterotrain-pod-u-1",
        "--network=host",
        "--hostname=g0-0",
        "--user=1000:1000",
        "--group-add=1000",
        "--read-only",
        "--read-only-tmpfs=false",
        "--security-opt=no-new-privileges",
        "--cap-drop=all",
        "--mount=type=bind,source=/agent/p/plan,destination=/etc/heterotrain/plan,ro=true",
        "--mount=type=bind,source=/agent/p/tmp,destination=/tmp",
        "--mount=type=bind,source=/agent/claims/ns/c,destination=/ckpt",
        "--add-host=g0-1.svc1.ns.svc:127.10.0.3",
        "--env=RANK=0",
        "--env=POD_IP=127.10.0.2",
        '--entrypoint=["heterotrain", "worker", "digits"]',
        "--ulimit=nofile=1024:1024",
    ):
        assert expected in options, expected
    assert not any(o.startswith("--privileged") or o.startswith("--cap-add") for o in options)
    assert after_image == []


def test_command_replaces_the_entrypoint_and_args_replace_cmd() -> None:
    env = {"N": "7"}
    assert command_args({"args": ["worker", "$(N)"]}, env) == ([], ["worker", "7"])
    assert command_args({"command": ["python", "-c"], "args": ["print($(N))", "$(MISSING)"]}, env) == (
        ['--entrypoint=["python", "-c"]'],
        ["print(7)", "$(MISSING)"],
    )
    assert command_args({}, env) == ([], [])


@pytest.mark.parametrize(
    ("pod_user", "image_user", "fragment"),
    [
        (None, "", "image will run as root"),
        (None, "0", "image will run as root"),
        (None, "heterotrain", r"non-numeric user \(heterotrain\)"),
        (0, "1000", "runAsUser 0"),
    ],
)
def test_run_as_non_root_refuses_a_root_or_unknown_user(
    pod_user: int | None, image_user: str, fragment: str
) -> None:
    pod = worker_pod()
    pod["spec"]["securityContext"].pop("runAsUser")
    if pod_user is not None:
        pod["spec"]["containers"][0]["securityContext"]["runAsUser"] = pod_user
    with pytest.raises(ContainerConfigError, match=fragment) as caught:
        run_argv(pod, pod["spec"]["containers"][0], spec(image_user=image_user))
    assert caught.value.reason == "CreateContainerConfigError"


def test_a_numeric_non_root_image_user_passes_without_run_as_user() -> None:
    pod = worker_pod()
    pod["spec"]["securityContext"].pop("runAsUser")
    argv = run_argv(pod, pod["spec"]["containers"][0], spec(image_user="1000:1000"))
    assert not any(a.startswith("--user=") for a in argv), "the image's own USER applies"


def test_container_fields_win_over_the_pods() -> None:
    pod = worker_pod(securityContext={"runAsUser": 2000, "capabilities": {"add": ["NET_BIND_SERVICE"]}})
    argv = run_argv(pod, pod["spec"]["containers"][0], spec())
    assert "--user=2000:1000" in argv and "--cap-add=net_bind_service" in argv
    assert "--read-only" not in argv and "--security-opt=no-new-privileges" not in argv


def test_memory_empty_dir_is_a_tmpfs_and_unsupported_volumes_are_named() -> None:
    pod = worker_pod()
    pod["spec"]["volumes"][1] = {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}}
    args = volume_args(pod, pod["spec"]["containers"][0], DIRS)
    # The kernel's tmpfs takes a byte count, not a Kubernetes quantity: 64Mi = 64 * 2**20.
    assert "--mount=type=tmpfs,destination=/tmp,tmpfs-mode=1777,tmpfs-size=67108864" in args
    pod["spec"]["volumes"][1] = {"name": "tmp", "hostPath": {"path": "/"}}
    with pytest.raises(ContainerConfigError, match=r"volume tmp \(hostPath\) is not supported"):
        volume_args(pod, pod["spec"]["containers"][0], DIRS)


def test_size_limits_are_turned_into_bytes() -> None:
    assert quantity_bytes("1Gi") == 2**30
    assert quantity_bytes("1.5Gi") == 3 * 2**29
    assert quantity_bytes("500M") == 500 * 10**6
    assert quantity_bytes("2") == 2
    with pytest.raises(ContainerConfigError, match="not a quantity"):
        quantity_bytes("1GB")


def test_a_container_without_image_cannot_start() -> None:
    pod = worker_pod(image="")
    with pytest.raises(ContainerConfigError) as caught:
        run_argv(pod, pod["spec"]["containers"][0], spec())
    assert caught.value.reason == "InvalidImageName"


def test_hosts_are_the_namespaces_pod_names_only() -> None:
    dns = {
        "g0-0.s": "127.10.0.2",
        "g0-0.s.ns": "127.10.0.2",
        "g0-0.s.ns.svc": "127.10.0.2",
        "g0-0.s.ns.svc.cluster.local": "127.10.0.2",
        "g0-0.s.other.svc": "127.10.0.9",
    }
    assert namespace_hosts(dns, "ns") == {
        "g0-0.s.ns": "127.10.0.2",
        "g0-0.s.ns.svc": "127.10.0.2",
        "g0-0.s.ns.svc.cluster.local": "127.10.0.2",
    }
