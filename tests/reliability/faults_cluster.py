"""What the fault tests look at: one consistent view of a namespace, and the invariants it must keep.

Every check is a pure function of a `Snapshot` that returns the problems it found (empty: it holds),
so a test can check after every poll and name exactly what broke.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import urllib3
from kubernetes.client import ApiClient
from tests.operator.live import OperatorProcess

from hetero_operator.controller import names
from hetero_operator.testbed.cluster import Testbed

GPU = "nvidia.com/gpu"
TERMINAL_POD_PHASES = ("Succeeded", "Failed")
Body = dict[str, Any]


@dataclass(frozen=True)
class Snapshot:
    jobs: dict[str, Body]  # by name
    pods: list[Body]  # labelled as a job's worker
    owned: list[Body]  # Services and ConfigMaps labelled as a job's
    node_gpus: dict[str, int]  # node name -> GPUs it has

    def job_pods(self, job: str) -> list[Body]:
        return [p for p in self.pods if _labels(p).get(names.LABEL_JOB) == job]

    def phase(self, job: str) -> str | None:
        return status(self.jobs[job]).get("phase") if job in self.jobs else None


def status(job: Body) -> Body:
    return dict(job.get("status") or {})


def _labels(body: Body) -> dict[str, str]:
    return dict(body["metadata"].get("labels") or {})


def _get(api: ApiClient, path: str, kind: str, **query: str) -> list[Body]:
    method, url, headers, body, post = api.param_serialize(
        "GET", path, query_params=list(query.items()), auth_settings=["BearerToken"]
    )
    response = api.call_api(method, url, headers, body, post, _request_timeout=10)
    if response.status != 200:
        raise RuntimeError(f"GET {path}: HTTP {response.status}")
    return [{**item, "kind": kind} for item in json.loads(response.read())["items"]]


def observe(api: ApiClient, namespace: str) -> Snapshot:
    """Pods first, then jobs: a job's status is written before its pods are created, so the jobs
    read second are never older than the pods."""
    selector = {"labelSelector": names.LABEL_JOB}
    pods = _get(api, f"/api/v1/namespaces/{namespace}/pods", "Pod", **selector)
    owned = _get(api, f"/api/v1/namespaces/{namespace}/services", "Service", **selector)
    owned += _get(api, f"/api/v1/namespaces/{namespace}/configmaps", "ConfigMap", **selector)
    jobs = _get(api, f"/apis/heterotrain.io/v1alpha1/namespaces/{namespace}/heterotrainjobs", "Job")
    nodes = _get(api, "/api/v1/nodes", "Node")
    return Snapshot(
        jobs={j["metadata"]["name"]: j for j in jobs},
        pods=pods,
        owned=owned,
        node_gpus={
            n["metadata"]["name"]: int((n["status"].get("capacity") or {}).get(GPU, 0)) for n in nodes
        },
    )


def client_for(kubeconfig: str) -> ApiClient:
    return kubernetes.config.new_client_from_config(kubeconfig)


def live(pod: Body) -> bool:
    return (pod.get("status") or {}).get("phase") not in TERMINAL_POD_PHASES


def rank_and_generation(pod: Body) -> tuple[int, int]:
    labels = _labels(pod)
    return int(labels[names.LABEL_RANK]), int(labels[names.LABEL_GENERATION])


# --- invariants that hold at every moment --------------------------------------------------------


def duplicate_workers(snapshot: Snapshot) -> dict[str, list[str]]:
    """Per job: two live pods for one rank, or live pods of two generations at once."""
    found: dict[str, list[str]] = defaultdict(list)
    by_job: dict[str, list[Body]] = defaultdict(list)
    for pod in snapshot.pods:
        if live(pod):
            by_job[_labels(pod)[names.LABEL_JOB]].append(pod)
    for job, pods in by_job.items():
        ranks = Counter(rank_and_generation(p)[0] for p in pods)
        generations = {rank_and_generation(p)[1] for p in pods}
        for rank, count in ranks.items():
            if count > 1:
                found[job].append(f"{count} live pods for rank {rank}")
        if len(generations) > 1:
            found[job].append(f"live pods of generations {sorted(generations)} at once")
    return dict(found)


def overcommitted_nodes(snapshot: Snapshot) -> list[str]:
    """Nodes whose live worker pods ask for more GPUs than the node has. (Pods still bound to a node
    that is gone are the node-loss tests' business: they hold no GPU anyone else could get.)"""
    used: Counter[str] = Counter()
    for pod in snapshot.pods:
        node = pod["spec"].get("nodeName")
        if node and live(pod) and not pod["metadata"].get("deletionTimestamp"):
            limits = pod["spec"]["containers"][0].get("resources", {}).get("limits") or {}
            used[node] += int(limits.get(GPU, 0))
    return [
        f"{node}: {gpus} GPUs in use of {snapshot.node_gpus.get(node, 0)}"
        for node, gpus in sorted(used.items())
        if node in snapshot.node_gpus and gpus > snapshot.node_gpus[node]
    ]


# --- invariants of a job at rest (finished, or deleted) ------------------------------------------


def orphans(snapshot: Snapshot) -> list[str]:
    """Objects labelled as a job's whose owner is not that job (gone, or an earlier job of its name)."""
    uids = {name: job["metadata"]["uid"] for name, job in snapshot.jobs.items()}
    problems = []
    for body in [*snapshot.pods, *snapshot.owned]:
        job = _labels(body)[names.LABEL_JOB]
        owners = {ref["uid"] for ref in body["metadata"].get("ownerReferences") or []}
        if uids.get(job) not in owners:
            problems.append(f"{body['kind']} {body['metadata']['name']} (job {job})")
    return problems


def settled_problems(snapshot: Snapshot, job: str) -> list[str]:
    """A finished job keeps only its last generation's pods (pod names make them one per rank),
    nothing live, and its objects are owned by it."""
    body = snapshot.jobs[job]
    allocation = status(body).get("allocation") or {}
    generation = allocation.get("generation")
    problems = []
    pods = snapshot.job_pods(job)
    stale = [p["metadata"]["name"] for p in pods if rank_and_generation(p)[1] != generation]
    if stale:
        problems.append(f"pods of earlier generations left: {stale}")
    still_live = [p["metadata"]["name"] for p in pods if live(p)]
    if still_live:
        problems.append(f"pods still live after the job finished: {still_live}")
    uid = body["metadata"]["uid"]
    for item in [*pods, *(o for o in snapshot.owned if _labels(o)[names.LABEL_JOB] == job)]:
        if uid not in {ref["uid"] for ref in item["metadata"].get("ownerReferences") or []}:
            problems.append(f"{item['metadata']['name']} is not owned by the job")
    return problems


def leftovers(snapshot: Snapshot, job: str) -> list[str]:
    """Anything still there of a deleted job."""
    found = [p["metadata"]["name"] for p in snapshot.job_pods(job)]
    found += [o["metadata"]["name"] for o in snapshot.owned if _labels(o)[names.LABEL_JOB] == job]
    if job in snapshot.jobs:
        found.append(f"the job itself (finalizers {snapshot.jobs[job]['metadata'].get('finalizers')})")
    return found


def describe(snapshot: Snapshot, job: str) -> str:
    """One line on a job for a failure message: phase, generation, conditions, pods."""
    body = snapshot.jobs.get(job)
    if body is None:
        return "gone"
    state = status(body)
    conditions = {c["type"]: f"{c['status']} {c.get('reason', '')}" for c in state.get("conditions") or []}
    pods = [
        f"{p['metadata']['name']} {(p.get('status') or {}).get('phase')}"
        + (" deleting" if p["metadata"].get("deletionTimestamp") else "")
        + (" told to exit" if EXIT_CODE_ANNOTATION in (p["metadata"].get("annotations") or {}) else "")
        for p in snapshot.job_pods(job)
    ]
    generation = (state.get("allocation") or {}).get("generation")
    return f"{state.get('phase')} generation {generation}, {conditions}, pods {pods}"


def remains(snapshot: Snapshot) -> list[str]:
    """Every job, worker pod and owned object still in the namespace."""
    return [
        f"{body['kind']} {body['metadata']['name']}"
        for body in [*snapshot.jobs.values(), *snapshot.pods, *snapshot.owned]
    ]


# --- acting on the cluster and watching it through faults -----------------------------------------

EXIT_CODE_ANNOTATION = "heterotrain.io/testbed-exit-code"
NUDGE_ANNOTATION = "heterotrain.io/testbed-nudge"
JOB_API = ("heterotrain.io", "v1alpha1")
# What the client raises while the API server (or etcd behind it) is down.
UNAVAILABLE = (OSError, urllib3.exceptions.HTTPError, kubernetes.client.ApiException, RuntimeError)


class Cluster:
    """One namespace seen through the Kubernetes client: act on jobs and pods, and poll a snapshot
    with the every-moment invariants checked on each poll (problems collect in `problems`)."""

    def __init__(self, kubeconfig: str, namespace: str) -> None:
        self.api = client_for(kubeconfig)
        self.namespace = namespace
        self.custom = kubernetes.client.CustomObjectsApi(self.api)
        self.core = kubernetes.client.CoreV1Api(self.api)
        self.problems: list[str] = []
        self.snapshot = Snapshot({}, [], [], {})

    def apply(self, manifest: Body) -> None:
        self.custom.create_namespaced_custom_object(*JOB_API, self.namespace, "heterotrainjobs", manifest)

    def delete(self, job: str) -> None:
        self.custom.delete_namespaced_custom_object(*JOB_API, self.namespace, "heterotrainjobs", job)

    def suspend(self, job: str, value: bool) -> None:
        patch = {"spec": {"suspend": value}}
        self.custom.patch_namespaced_custom_object(*JOB_API, self.namespace, "heterotrainjobs", job, patch)

    def finish(self, pods: list[str] | tuple[str, ...], code: int) -> None:
        patch = {"metadata": {"annotations": {EXIT_CODE_ANNOTATION: str(code)}}}
        for pod in pods:
            self.core.patch_namespaced_pod(pod, self.namespace, patch)

    def finish_job(self, job: str, code: int = 0) -> None:
        """End every live pod of the job's current generation with `code`. A job's status is written
        before its pods are created, so a snapshot can show a generation whose pods are not all there
        yet: wait for every one of its workers to have a pod first."""
        snapshot = self.until(
            lambda s: not missing_workers(s, job), 20, f"every worker of {job} to have a pod"
        )
        generation = (status(snapshot.jobs[job]).get("allocation") or {}).get("generation")
        self.finish(
            [
                p["metadata"]["name"]
                for p in snapshot.job_pods(job)
                if live(p) and rank_and_generation(p)[1] == generation
            ],
            code,
        )

    def nudge_kwok(self) -> list[str]:
        """KWOK does not retry a pod status write that failed while etcd was down (a kubelet would):
        touch every pod it still owes a transition (Pending, or told to exit) so it tries again."""
        owed = [
            p["metadata"]["name"]
            for p in self.snapshot.pods
            if live(p)
            and not p["metadata"].get("deletionTimestamp")
            and (
                (p.get("status") or {}).get("phase") == "Pending"
                or EXIT_CODE_ANNOTATION in (p["metadata"].get("annotations") or {})
            )
        ]
        patch = {"metadata": {"annotations": {NUDGE_ANNOTATION: str(time.time())}}}
        for pod in owed:
            self.core.patch_namespaced_pod(pod, self.namespace, patch)
        return owed

    def poll(self) -> Snapshot | None:
        """A fresh snapshot, or None while the control plane does not answer."""
        try:
            snapshot = observe(self.api, self.namespace)
        except UNAVAILABLE:
            return None
        for job, found in duplicate_workers(snapshot).items():
            self._note(*(f"{job}: {problem}" for problem in found))
        self._note(*overcommitted_nodes(snapshot))
        self.snapshot = snapshot
        return snapshot

    def until(self, done: Callable[[Snapshot], object], timeout: float, what: str) -> Snapshot:
        deadline = time.monotonic() + timeout
        while True:
            snapshot = self.poll()
            if snapshot is not None and done(snapshot):
                return snapshot
            if time.monotonic() > deadline:
                phases = {name: status(job).get("phase") for name, job in self.snapshot.jobs.items()}
                unsettled = {
                    name: describe(self.snapshot, name)
                    for name, phase in phases.items()
                    if phase not in ("Succeeded", "Queued")
                }
                raise AssertionError(
                    f"timed out after {timeout:.0f} s waiting for {what}; jobs: {phases}; "
                    f"unsettled: {unsettled}"
                )
            time.sleep(0.3)

    def _note(self, *problems: str) -> None:
        self.problems += [p for p in problems if p not in self.problems]


def running(snapshot: Snapshot, *jobs: str) -> bool:
    return all(snapshot.phase(job) == "Running" for job in jobs)


def workers_by_node(snapshot: Snapshot, job: str) -> dict[str, list[int]]:
    """The job's allocation: node -> ranks."""
    placed: dict[str, list[int]] = defaultdict(list)
    for worker in (status(snapshot.jobs[job]).get("allocation") or {}).get("workers") or []:
        placed[worker["node"]].append(worker["rank"])
    return dict(placed)


def missing_workers(snapshot: Snapshot, job: str) -> set[int]:
    """Ranks of the job's current allocation that have no pod of that generation yet."""
    allocation = status(snapshot.jobs[job]).get("allocation") or {}
    ranks = {worker["rank"] for worker in allocation.get("workers") or []}
    pods = [rank_and_generation(p) for p in snapshot.job_pods(job)]
    return ranks - {rank for rank, generation in pods if generation == allocation.get("generation")}


def generation(snapshot: Snapshot, job: str) -> int | None:
    allocation = status(snapshot.jobs[job]).get("allocation") or {}
    return allocation.get("generation") if allocation.get("workers") else None


@contextmanager
def operated_namespace(bed: Testbed, prefix: str, log: Path) -> Iterator[Cluster]:
    """A fresh namespace on the bed and an operator reading the bed's Prometheus; at the end the
    namespace's jobs are deleted, the operator stopped (its log's tail printed) and the namespace gone."""
    namespace = f"{prefix}-{uuid.uuid4().hex[:6]}"
    bed.kubectl("create", "namespace", namespace)
    operator = OperatorProcess(bed, log, extra_args=("--prometheus-url", bed.prometheus_url))
    operator.start()
    try:
        yield Cluster(str(bed.kubeconfig), namespace)
    finally:
        bed.kubectl("delete", "htj", "--all", "-n", namespace, "--wait=false", check=False)
        operator.stop()
        bed.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        print(f"--- operator log ---\n{operator.tail(60)}")
