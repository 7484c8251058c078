"""The images, built for real with buildah on a debootstrapped base and run with podman and runc: the
operator image answers /readyz against the test bed; the trainer image trains the digits example as
a non-root user on a read-only root filesystem."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from tests.operator.live import free_port, wait_for
from tests.ship.kernel_view import kernel_view

from hetero_operator.plan import Plan
from hetero_operator.testbed import images
from hetero_operator.testbed.cluster import Testbed
from hetero_operator.testbed.container_store import Engine, ulimit_args

pytestmark = [pytest.mark.testbed, pytest.mark.slow]
# The restrictions the chart and the operator put on their pods, as podman options.
RESTRICTED = [
    "--network=host",
    "--read-only",
    "--read-only-tmpfs=false",
    "--cap-drop=all",
    "--security-opt=no-new-privileges",
    "--log-driver=none",
]


@contextmanager
def detached(engine: Engine, argv: list[str]) -> Iterator[str]:
    name = f"heterotrain-test-{uuid.uuid4().hex[:8]}"
    engine.run("podman", "run", "--detach", f"--name={name}", *ulimit_args(), *argv)
    try:
        yield name
    finally:
        engine.run("podman", "rm", "--force", "--time=0", name, check=False)


def test_a_warm_build_builds_nothing(built_images: dict[str, str], container_engine: Engine) -> None:
    steps: list[str] = []
    again = images.ensure_images(container_engine, on_step=steps.append)
    assert steps == [], "every image of these sources was already in the store"
    assert again == built_images
    for tag in built_images.values():
        assert container_engine.image_exists(tag)


def test_the_operator_image_answers_readyz_against_the_testbed(
    testbed: Testbed, namespace: str, built_images: dict[str, str], container_engine: Engine, tmp_path: Path
) -> None:
    config = tmp_path / "config"
    config.mkdir(mode=0o755)
    (config / "kubeconfig").write_text(testbed.kubeconfig.read_text())
    (config / "kubeconfig").chmod(0o644)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    scratch.chmod(0o777)
    api_port, metrics_port = free_port(), free_port()
    argv = [
        *RESTRICTED,
        f"--mount=type=bind,source={config},destination=/etc/heterotrain,ro=true",
        f"--mount=type=bind,source={scratch},destination=/tmp",
        built_images["operator"],
        "--kubeconfig=/etc/heterotrain/kubeconfig",
        f"--namespace={namespace}",  # it acts on this test's namespace only
        f"--api-port={api_port}",
        f"--metrics-port={metrics_port}",
    ]
    with detached(container_engine, argv) as name:

        def ready() -> dict[str, object] | None:
            try:
                response = httpx.get(f"http://127.0.0.1:{api_port}/readyz", timeout=3)
            except httpx.HTTPError:
                return None
            return dict(response.json()) if response.status_code == 200 else None

        try:
            body = wait_for(ready, 120, "the operator container's /readyz")
        except AssertionError:
            logs = container_engine.run("podman", "logs", name, check=False)
            raise AssertionError(f"{logs.stdout[-3000:]}{logs.stderr[-3000:]}") from None
        view = wait_for(lambda: kernel_view(container_engine, name), 30, "the operator's process")
        metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
    assert body["ready"] is True
    assert view["uid"] == "10001", "the Dockerfile's USER, not root"
    assert view["caps"] == "0000000000000000"
    assert view["root_options"].split(",")[0] == "ro"
    assert metrics.status_code == 200 and "heterotrain" in metrics.text


def run_in_trainer_image(
    engine: Engine, image: str, tmp_path: Path, env: dict[str, str], script: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`script` (sh) as the image's user, restricted as the operator runs its workers, with one rank's
    environment and a plan of one worker at /etc/heterotrain/plan; /tmp is the returned folder."""
    plan_dir, scratch = tmp_path / "plan", tmp_path / "scratch"
    plan_dir.mkdir()
    scratch.mkdir()
    scratch.chmod(0o777)
    plan = Plan(version=1, world_size=1, global_batch=64, local_batches=[64])
    (plan_dir / "plan.json").write_text(plan.to_json())
    env = {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "HETEROTRAIN_PLAN_SOURCE": "/etc/heterotrain/plan/plan.json",
        "GLOO_SOCKET_IFNAME": "lo",
        **env,
    }
    argv = [
        "podman",
        "run",
        "--rm",
        *ulimit_args(),
        *RESTRICTED,
        f"--mount=type=bind,source={plan_dir},destination=/etc/heterotrain/plan,ro=true",
        f"--mount=type=bind,source={scratch},destination=/tmp",
        *(f"--env={key}={value}" for key, value in env.items()),
        '--entrypoint=["/bin/sh", "-c"]',
        image,
        script,
    ]
    run = subprocess.run(argv, env=engine.env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (run.returncode, run.stdout[-3000:], run.stderr[-3000:])
    return run, scratch


def test_the_trainer_image_trains_digits_as_non_root_on_a_read_only_root(
    built_images: dict[str, str], container_engine: Engine, tmp_path: Path
) -> None:
    env = {"HETEROTRAIN_EPOCHS": "5", "HETEROTRAIN_RESULT_FILE": "/tmp/result.json"}
    # The probe runs in the worker's own container, just before it: / must refuse a write.
    probe = "if touch /probe 2>/dev/null; then exit 90; fi; id -u > /tmp/uid; exec heterotrain worker digits"
    _, scratch = run_in_trainer_image(container_engine, built_images["trainer"], tmp_path, env, probe)
    assert (scratch / "uid").read_text().strip() == "1000"
    result_file = scratch / "result.json"
    assert result_file.stat().st_uid == 1000, "written by the image's user"
    result = json.loads(result_file.read_text())
    assert len(result["epochs"]) == 5
    assert result["final_evaluation"]["accuracy"] >= 0.90


def test_the_trainer_image_runs_the_hugging_face_example_through_the_worker(
    built_images: dict[str, str], container_engine: Engine, tmp_path: Path
) -> None:
    # A user's script, as `command: [python, -m, ...]` in a job runs it: transformers is in the image.
    script = (
        "exec heterotrain worker -- python -m hetero_runtime.examples.hf_causal_lm "
        "--epochs 3 --sentences 200 --out /tmp/hf.json"
    )
    _, scratch = run_in_trainer_image(container_engine, built_images["trainer"], tmp_path, {}, script)
    metrics = json.loads((scratch / "hf.json").read_text())
    assert metrics["vocabulary"] == 26 and metrics["world_size"] == 1
    # It learned the corpus beyond a uniform guess over its letters (ln 26), from about that.
    assert metrics["initial_loss"] > 0.95 * metrics["uniform_loss"]
    assert metrics["held_out_loss"] < 0.85 * metrics["uniform_loss"], metrics
