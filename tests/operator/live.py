"""Helpers for the operator's tests on the live test bed: the operator as a subprocess, jobs applied
with kubectl, and polling with deadlines."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from tests.ship.cluster_helpers import service_account_kubeconfig
from tests.ship.helm_chart import helm, install_chart

from hetero_operator.controller import names
from hetero_operator.testbed.cluster import Testbed
from hetero_operator.warm_start import spawn

REPO = Path(__file__).resolve().parents[2]
TOLERATE_KWOK = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.25) -> T:
    """Poll until `check` returns something truthy; fail naming `what` and the last value seen."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}")
        time.sleep(interval)


@dataclass(frozen=True)
class ChartAccount:
    """The chart's ServiceAccount, installed with the chart's RBAC: the operator's rights in a cluster."""

    namespace: str
    name: str
    cluster_role: str


@contextmanager
def chart_service_account(
    testbed: Testbed, home: Path, extra_values: dict[str, Any] | None = None
) -> Iterator[ChartAccount]:
    """The chart installed in cluster-wide RBAC mode into a namespace of its own, with nothing but its
    ServiceAccount and RBAC (no CRDs, classes, dashboards or operator pod): uninstalled afterwards.
    `extra_values` add to the chart's values (for example turning the Kueue integration on)."""
    release = f"ht-{uuid.uuid4().hex[:6]}"
    namespace = f"heterotrain-{release}"
    values = {
        "replicaCount": 0,
        "crds": {"enabled": False},
        "gpuClasses": {"enabled": False},
        "dashboards": {"enabled": False},
        "watchNamespaces": [],
        **(extra_values or {}),
    }
    kubeconfig = str(testbed.kubeconfig)
    testbed.kubectl("create", "namespace", namespace)
    install_chart(release, namespace, kubeconfig, values, home)
    fullname = f"{release}-heterotrain"
    try:
        yield ChartAccount(namespace, fullname, f"{fullname}-cluster")
    finally:
        helm("uninstall", release, "-n", namespace, "--kubeconfig", kubeconfig, home=home, check=False)
        testbed.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def account_kubeconfig(testbed: Testbed, account: ChartAccount, path: Path) -> Path:
    """A kubeconfig with a fresh token of the chart's ServiceAccount (valid for an hour)."""
    return service_account_kubeconfig(testbed, account.namespace, account.name, path)


class OperatorProcess:
    """`heterotrain operator` as a child process against the test bed (as `kubeconfig`'s user: the
    test bed's admin unless given, e.g. the chart's ServiceAccount)."""

    def __init__(
        self,
        testbed: Testbed,
        log: Path,
        grace_seconds: float = 2.0,
        extra_args: tuple[str, ...] = (),
        kubeconfig: Path | None = None,
    ) -> None:
        self.testbed = testbed
        self.kubeconfig = kubeconfig or testbed.kubeconfig
        self.extra_args = extra_args
        self.log = log
        self.grace_seconds = grace_seconds
        self.metrics_port = free_port()
        self.process: Any = None  # subprocess.Popen's interface, warm or fresh (warm_start.spawn)

    def start(self) -> None:
        argv = [
            sys.executable,
            "-m",
            "hetero_operator",
            "operator",
            "--kubeconfig",
            str(self.kubeconfig),
            "--metrics-port",
            str(self.metrics_port),
            "--lifecycle.checkpoint-grace-seconds",
            str(self.grace_seconds),
            *self.extra_args,
        ]
        # Warm when the test session runs a warm server: a restart then takes a fraction of a second
        # instead of the seconds its imports take, as a restarted pod's image would have them cached.
        with self.log.open("ab") as out:
            self.process = spawn(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=dict(os.environ))

    def kill(self) -> None:
        """SIGKILL: no cleanup of any kind, as when a node dies under the operator."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@contextmanager
def chart_operator(
    testbed: Testbed,
    account: ChartAccount,
    directory: Path,
    grace_seconds: float = 2.0,
    extra_args: tuple[str, ...] = (),
) -> Iterator[OperatorProcess]:
    """The operator running as the chart's ServiceAccount for a block (its kubeconfig and log in
    `directory`); its log's tail is printed at the end, and no request of it may have been refused:
    the chart grants enough."""
    kubeconfig = account_kubeconfig(testbed, account, directory / "operator.kubeconfig")
    process = OperatorProcess(testbed, directory / "operator.log", grace_seconds, extra_args, kubeconfig)
    process.start()
    try:
        yield process
    finally:
        process.stop()
        print(f"--- operator log ({process.log}) ---\n{process.tail(60)}")
    lines = process.log.read_text(errors="replace").splitlines()
    refused = [line for line in lines if "Forbidden" in line or " 403" in line]
    assert not refused, f"the chart's ServiceAccount was refused: {refused[:5]}"


@contextmanager
def jobs_in(
    testbed: Testbed, namespace: str, timeout: float = 30, until_gone: bool = False
) -> Iterator[Jobs]:
    """The jobs of `namespace`, all deleted (and their pods gone) at the end; `until_gone`: and the
    jobs themselves, so the operator has taken its finalizer off before anything stops it."""
    handle = Jobs(testbed, namespace)
    try:
        yield handle
    finally:
        handle.delete_all(timeout)
        if until_gone:
            wait_for(
                lambda: not handle.kubectl("get", "htj", "-o", "name").strip(), timeout, "the jobs to go"
            )


class Jobs:
    """HeteroTrainJobs and their pods in one namespace."""

    def __init__(self, testbed: Testbed, namespace: str) -> None:
        self.testbed = testbed
        self.namespace = namespace

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        return self.testbed.kubectl(*args, "-n", self.namespace, input=input, check=check).stdout

    def apply(self, *manifests: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(list(manifests)))

    def manifest(self, name: str, gpus: int | tuple[int, int] = 1, **spec: Any) -> dict[str, Any]:
        low, high = (gpus, gpus) if isinstance(gpus, int) else gpus
        body: dict[str, Any] = {
            "image": "heterotrain/trainer:test",
            "command": ["heterotrain", "worker"],
            "gpus": {"min": low, "max": high},
            "batch": {"global": 64},
            "epochs": 1,
            "restartPolicy": {"maxRestarts": 2, "backoffSeconds": 0},
        }
        body.update(spec)
        return {
            "apiVersion": "heterotrain.io/v1alpha1",
            "kind": "HeteroTrainJob",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": body,
        }

    def get(self, name: str) -> dict[str, Any]:
        return dict(json.loads(self.kubectl("get", "htj", name, "-o", "json")))

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.get(name).get("status") or {})

    def phase(self, name: str) -> str | None:
        return self.status(name).get("phase")

    def condition(self, name: str, kind: str) -> dict[str, Any] | None:
        return next((c for c in self.status(name).get("conditions", []) if c["type"] == kind), None)

    def wait_phase(self, name: str, phase: str, timeout: float = 30) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            status = self.status(name)
            return status if status.get("phase") == phase else None

        try:
            return wait_for(reached, timeout, f"{self.namespace}/{name} to be {phase}")
        except AssertionError as error:
            placed = self.condition(name, "Placed") or {}
            raise AssertionError(
                f"{error}; phase {self.phase(name)}, Placed: {placed.get('message')}"
            ) from None

    def pods(self, job: str | None = None) -> list[dict[str, Any]]:
        selector = f"{names.LABEL_JOB}={job}" if job else names.LABEL_JOB
        items = json.loads(self.kubectl("get", "pods", "-l", selector, "-o", "json"))["items"]
        return sorted(items, key=lambda p: p["metadata"]["name"])

    def running_pods(self, job: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.pods(job)
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]

    def finish(self, pods: list[dict[str, Any]], exit_code: int) -> None:
        names_ = [p["metadata"]["name"] for p in pods]
        self.kubectl(
            "annotate", "pods", *names_, f"heterotrain.io/testbed-exit-code={exit_code}", "--overwrite"
        )

    def events(self, name: str) -> list[str]:
        out = self.kubectl(
            "get",
            "events",
            "--field-selector",
            f"involvedObject.name={name},involvedObject.kind=HeteroTrainJob",
            "-o",
            "json",
        )
        return [
            e["reason"]
            for e in sorted(json.loads(out)["items"], key=lambda e: e["metadata"]["creationTimestamp"])
        ]

    def delete_all(self, timeout: float = 30) -> None:
        """Delete every job here and wait until their pods are gone, so the next test starts on free GPUs."""
        self.kubectl("delete", "htj", "--all", "--wait=false", check=False)
        wait_for(lambda: not self.pods() or None, timeout, f"the pods of {self.namespace} to go")
