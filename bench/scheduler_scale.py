"""The operator at scale, end to end on its own test bed.

1,000 KWOK nodes x 8 GPUs in 4 classes; 500 HeteroTrainJobs created at once (mixed sizes, class
lists, priorities and 4 queues, all fitting). The operator runs as it would in production, with
Prometheus configured (the progress poller and a rebalancer task per running job are live).
Measured: jobs per second to Running (a job counts once all its worker pods are Running), every
scheduling cycle's raw duration, the requests the operator sent per job by verb and resource (and
all the API server served), the operator's memory.

    python bench/scheduler_scale.py [--quick] [--write]   # run, write the artifact and the table
    python bench/scheduler_scale.py --render              # the table from the committed artifact
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import kubernetes
from prometheus_client.parser import text_string_to_metric_families

from benchmarks_md import publish, replace_section
from hetero_operator import metric_names
from hetero_operator.controller import launcher, names
from hetero_operator.controller.launcher import ClassLaunchInfo, LaunchSettings
from hetero_operator.controller.plans import initial_plan
from hetero_operator.resources import HeteroTrainJob
from hetero_operator.resources.job_status import Allocation as StatusAllocation
from hetero_operator.resources.job_status import WorkerAllocation
from hetero_operator.testbed.cluster import NODE_LEASE_SECONDS, Testbed
from hetero_operator.testbed.nodes import FakeNode, NodeList, node_manifest
from progress import steps

CLASSES = {"a100": 1.0, "l4": 0.7, "v100": 0.5, "t4": 0.25}
GPUS_PER_NODE = 8
PRODUCT_LABEL = "nvidia.com/gpu.product"
SECTION = "## Operator at scale"
JOBS_API = ("heterotrain.io", "v1alpha1", "heterotrainjobs")
REPO = Path(__file__).resolve().parents[1]


def gpu_classes() -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "heterotrain.io/v1alpha1",
            "kind": "GPUClass",
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": {PRODUCT_LABEL: name},
                "memoryGiB": 32,
                "relativeSpeed": speed,
                "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
            },
        }
        for name, speed in CLASSES.items()
    ]


def nodes(count: int) -> NodeList:
    per_class = count // len(CLASSES)
    return NodeList(
        nodes=[
            FakeNode(name=f"{name}-{i}", gpuClass=name, gpus=GPUS_PER_NODE, labels={PRODUCT_LABEL: name})
            for name in CLASSES
            for i in range(per_class)
        ]
    )


def jobs(count: int, seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    manifests = []
    for i in range(count):
        size = rng.choice([1, 1, 2, 2, 4, 4, 8, 16])
        allowed = rng.sample(sorted(CLASSES), rng.randint(1, 4)) if rng.random() < 0.7 else []
        spec: dict[str, Any] = {
            "image": "heterotrain/trainer:bench",
            "command": ["heterotrain", "worker"],
            "gpus": {"min": size, "max": size},
            "batch": {"global": 512},
            "epochs": 1,
            "queue": f"q{rng.randrange(4)}",
            "priority": rng.choice([0, 0, 0, 1, 2]),
        }
        if allowed:
            spec["gpuClasses"] = allowed
        manifests.append(
            {
                "apiVersion": "heterotrain.io/v1alpha1",
                "kind": "HeteroTrainJob",
                "metadata": {"name": f"job-{i:04d}", "namespace": f"team-{i % 4}"},
                "spec": spec,
            }
        )
    return manifests


class PlacementWatch:
    """Jobs running, from watches on jobs and worker pods (listing thousands of pods every half second
    would load the API server the benchmark measures). Records when the last job had all its pods
    Running."""

    def __init__(self, api: kubernetes.client.ApiClient, expected: int) -> None:
        self._lock = threading.Lock()
        self._expected = expected
        self._pods: dict[str, tuple[str, bool]] = {}  # pod key -> (job key, Running)
        self._bound: Counter[str] = Counter()
        self._wanted: dict[str, int] = {}  # job key -> GPUs allocated (total pods wanted)
        self._placed: set[str] = set()
        self.all_placed_at: float | None = None
        self._stopped = False
        self._core = kubernetes.client.CoreV1Api(api)
        self._custom = kubernetes.client.CustomObjectsApi(api)
        for kind in ("pods", "jobs"):
            version = self._relist(kind)
            threading.Thread(target=self._follow, args=(kind, version), daemon=True).start()

    def _request(self, kind: str, **options: Any) -> Any:
        if kind == "pods":
            return self._core.list_pod_for_all_namespaces(
                label_selector=names.LABEL_JOB, _preload_content=False, **options
            )
        return self._custom.list_cluster_custom_object(*JOBS_API, _preload_content=False, **options)

    def _relist(self, kind: str) -> str:
        """Start over from a list (at first, and when the API server ends a watch that fell behind)."""
        listed = json.loads(self._request(kind).data)
        with self._lock:
            if kind == "pods":
                self._pods.clear()
                self._bound.clear()
            else:
                self._wanted.clear()
        handle = self._on_pod if kind == "pods" else self._on_job
        for item in listed["items"]:
            handle("ADDED", item)
        with self._lock:
            for job in list(self._wanted):
                self._update(job)
        return str(listed["metadata"]["resourceVersion"])

    def _follow(self, kind: str, version: str) -> None:
        handle = self._on_pod if kind == "pods" else self._on_job
        while not self._stopped:
            try:
                response = self._request(kind, watch=True, resource_version=version, timeout_seconds=900)
                buffer = b""
                for chunk in response.stream(65536):
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        if event["type"] == "ERROR":
                            raise RuntimeError(event["object"].get("message", "watch error"))
                        handle(event["type"], event["object"])
                        version = event["object"]["metadata"]["resourceVersion"]
            except Exception as error:  # stop() closes the stream; anything else is worth a line
                if self._stopped:
                    return
                print(f"  {kind} watch ended ({error!r}); listing again", file=sys.stderr, flush=True)
            else:
                if self._stopped:
                    return
                print(f"  {kind} watch closed by the API server; listing again", file=sys.stderr, flush=True)
            version = self._relist(kind)

    def _on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        name = f"{meta['namespace']}/{meta['name']}"
        job = f"{meta['namespace']}/{meta['labels'][names.LABEL_JOB]}"
        with self._lock:
            old = self._pods.pop(name, None)
            if old is not None and old[1]:
                self._bound[old[0]] -= 1
            if kind != "DELETED":
                running = (pod.get("status") or {}).get("phase") == "Running"
                self._pods[name] = (job, running)
                self._bound[job] += running
            self._update(job)

    def _on_job(self, kind: str, job: dict[str, Any]) -> None:
        key = f"{job['metadata']['namespace']}/{job['metadata']['name']}"
        allocation = (job.get("status") or {}).get("allocation") or {}
        with self._lock:
            if kind != "DELETED" and allocation.get("workers"):
                self._wanted[key] = int(allocation["totalGpus"])
            else:
                self._wanted.pop(key, None)
            self._update(key)

    def _update(self, job: str) -> None:
        wanted = self._wanted.get(job)
        if wanted is not None and self._bound[job] >= wanted:
            self._placed.add(job)
        else:
            self._placed.discard(job)
        if self.all_placed_at is None and len(self._placed) >= self._expected:
            self.all_placed_at = time.monotonic()

    def placed(self) -> int:
        with self._lock:
            return len(self._placed)

    def bound_pods(self) -> int:
        with self._lock:
            return sum(self._bound.values())

    def stop(self) -> None:
        """The watch threads end with the test bed (closing a stream another thread reads can block)."""
        self._stopped = True


def create_nodes(core: kubernetes.client.CoreV1Api, node_list: NodeList, timeout: float = 300) -> None:
    """Create the fake nodes from 16 threads and wait until every one is Ready and the node lifecycle
    controller has lifted its not-ready taint (until then nothing may be placed there)."""
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda node: core.create_node(body=node_manifest(node)), node_list.nodes))  # type: ignore[arg-type]
    deadline = time.monotonic() + timeout
    while True:
        raw: Any = core.list_node(_preload_content=False)
        ready = sum(1 for node in json.loads(raw.data)["items"] if _usable(node))
        if ready >= len(node_list.nodes):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {ready} of {len(node_list.nodes)} nodes became Ready")
        time.sleep(1.0)


def _usable(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions") or []
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    taints = {t["key"] for t in node.get("spec", {}).get("taints") or []}
    return ready and taints <= {"kwok.x-k8s.io/node"}


def create_all(
    custom: kubernetes.client.CustomObjectsApi, manifests: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Create the jobs from 16 threads (kubectl throttles itself to a few requests a second); the
    objects as created."""

    def create(manifest: dict[str, Any]) -> dict[str, Any]:
        namespace = manifest["metadata"]["namespace"]
        return dict(
            custom.create_namespaced_custom_object(
                "heterotrain.io", "v1alpha1", namespace, "heterotrainjobs", manifest
            )
        )

    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(create, manifests))


def first_fit(manifests: list[dict[str, Any]], node_count: int) -> list[StatusAllocation]:
    """Each job's gang on one class it allows (fastest first), a worker per GPU, nodes filled in order;
    the benchmark's jobs all fit."""
    free: dict[str, dict[str, int]] = {name: {} for name in CLASSES}
    for node in nodes(node_count).nodes:
        free[node.gpu_class][node.name] = GPUS_PER_NODE
    allocations = []
    for manifest in manifests:
        size, allowed = manifest["spec"]["gpus"]["min"], manifest["spec"].get("gpuClasses") or list(CLASSES)
        gpu_class = next(
            c for c in sorted(allowed, key=lambda c: -CLASSES[c]) if sum(free[c].values()) >= size
        )
        workers: list[WorkerAllocation] = []
        for node, count in free[gpu_class].items():
            take = min(count, size - len(workers))
            free[gpu_class][node] -= take
            workers += [
                WorkerAllocation(rank=len(workers) + i, node=node, gpu_class=gpu_class, gpus=1)
                for i in range(take)
            ]
            if len(workers) == size:
                break
        allocations.append(StatusAllocation.from_workers(workers))
    return allocations


def place_without_operator(
    api: kubernetes.client.ApiClient, bodies: list[dict[str, Any]], allocations: list[StatusAllocation]
) -> None:
    """What the operator writes for a job to run, and nothing else, from 16 threads: one status write
    with the allocation, then the job's Service, plan ConfigMap and worker pods, built by the
    operator's own builders (no events, no finalizer, no second status write)."""
    custom, core = kubernetes.client.CustomObjectsApi(api), kubernetes.client.CoreV1Api(api)
    tolerations = ({"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"},)
    settings = LaunchSettings(classes={name: ClassLaunchInfo(tolerations=tolerations) for name in CLASSES})
    create = {
        "Service": core.create_namespaced_service,
        "ConfigMap": core.create_namespaced_config_map,
        "Pod": core.create_namespaced_pod,
    }

    def place(body: dict[str, Any], allocation: StatusAllocation) -> None:
        job = HeteroTrainJob.from_k8s(body)
        namespace, name = job.namespace, job.name
        status = {"status": {"allocation": allocation.to_wire()}}
        # Responses stay raw: turning each into the client's models would cost more than the writes.
        custom.patch_namespaced_custom_object_status(
            *JOBS_API[:2], namespace, JOBS_API[2], name, status, _preload_content=False
        )
        plan = initial_plan(job.spec, allocation, CLASSES)
        for manifest in launcher.generation_manifests(job, allocation, plan, settings):
            create[manifest["kind"]](namespace, manifest, _preload_content=False)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(place, bodies, allocations))


def percentile(values: list[float], q: float) -> float:
    """The q-quantile of raw values (linear between the two nearest ranks)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def cycles_of(log: Path, since: float) -> list[dict[str, Any]]:
    """The operator's own record of every cycle (its --cycle-log) from `since` (wall clock) on."""
    if not log.exists():
        return []
    cycles = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [c for c in cycles if c["at"] >= since]


def operator_requests(metrics_text: str) -> Counter[str]:
    """Requests the operator sent, by verb and resource (its own counter)."""
    counts: Counter[str] = Counter()
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == f"{metric_names.OPERATOR_KUBE_REQUESTS}_total":
                counts[f"{sample.labels['verb']} {sample.labels['resource']}"] += int(sample.value)
    return counts


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def request_counts(metrics_text: str) -> Counter[str]:
    """Requests counted in an API server's metrics text (`apiserver_request_total`), by verb,
    resource and subresource; watches aside (one lasts the whole run)."""
    counts: Counter[str] = Counter()
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name != "apiserver_request_total" or sample.labels.get("verb") == "WATCH":
                continue
            resource = sample.labels.get("resource", "")
            if sample.labels.get("subresource"):
                resource += "/" + sample.labels["subresource"]
            counts[f"{sample.labels.get('verb')} {resource}"] += int(sample.value)
    return counts


def api_requests(core: kubernetes.client.CoreV1Api) -> Counter[str]:
    """The API server's own count of requests so far."""
    client = core.api_client
    # The test bed's kubeconfig authenticates with a client certificate: no header to add.
    return request_counts(client.call_api("GET", f"{client.configuration.host}/metrics").read().decode())


def cpu_by_process(pids: dict[str, int]) -> dict[str, float]:
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


def memory_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def run(
    node_count: int,
    job_count: int,
    profile_to: Path | None = None,
    keep_log: Path | None = None,
    node_lease_seconds: int = NODE_LEASE_SECONDS,
    with_operator: bool = True,
) -> dict[str, Any]:
    """Progress (set-up steps, then jobs running) goes to stderr; stdout carries only the report.
    Without the operator, the benchmark writes what the operator would for each job to run (see
    `place_without_operator`): what the test bed alone takes to run the same pods."""
    with (
        tempfile.TemporaryDirectory(prefix="heterotrain-scale-") as tmp,
        steps("jobs running", job_count) as progress,
    ):
        bed = Testbed(Path(tmp) / "testbed", node_lease_seconds=node_lease_seconds)
        started = time.monotonic()
        operator = None
        try:
            bed.up(None, on_step=lambda msg: progress.doing(f"test bed: {msg}"))
            api = kubernetes.config.new_client_from_config(str(bed.kubeconfig))
            custom = kubernetes.client.CustomObjectsApi(api)
            core = kubernetes.client.CoreV1Api(api)
            create_nodes(core, nodes(node_count))
            progress.doing(f"test bed with {node_count} nodes up in {time.monotonic() - started:.0f} s")
            bed.apply_objects(gpu_classes())
            for team in range(4):
                bed.kubectl("create", "namespace", f"team-{team}")
            port = _free_port()
            log, cycle_log = Path(tmp) / "operator.log", Path(tmp) / "cycles.jsonl"
            if with_operator:
                with log.open("wb") as out:
                    profile = ["-m", "cProfile", "-o", str(profile_to)] if profile_to else []
                    operator = subprocess.Popen(
                        [sys.executable, *profile, "-m", "hetero_operator", "operator", "--kubeconfig",
                         str(bed.kubeconfig), "--metrics-port", str(port), "--prometheus-url",
                         bed.prometheus_url, "--cycle-log", str(cycle_log), *(["-v"] if keep_log else [])],
                        stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=dict(os.environ),
                    )  # fmt: skip
                _wait(lambda: "indexes " in log.read_text(), 180, "the operator to start")
            manifests = jobs(job_count)
            watch = PlacementWatch(api, job_count)
            state = bed.state
            pids = {name: int(info["pid"]) for name, info in (state.processes if state else {}).items()}
            pids |= {"benchmark": os.getpid()} | ({"operator": operator.pid} if operator else {})
            metrics_url = f"http://127.0.0.1:{port}/metrics"
            cpu_before, requests_before = cpu_by_process(pids), api_requests(core)
            sent_before = (
                operator_requests(httpx.get(metrics_url, timeout=10).text) if operator else Counter()
            )
            # Allocated before the clock starts: the run without the operator times only its writes.
            allocations = first_fit(manifests, node_count) if operator is None else []
            wall0, t0 = time.time(), time.monotonic()
            created_jobs = create_all(custom, manifests)
            created = time.monotonic() - t0
            progress.doing(f"{job_count} jobs created in {created:.1f} s")
            if operator is None:
                place_without_operator(api, created_jobs, allocations)
            done = _until_running(watch, job_count, t0, progress)
            elapsed = (watch.all_placed_at or time.monotonic()) - t0
            cpu_after, requests_after = cpu_by_process(pids), api_requests(core)
            if operator is not None:
                sent = operator_requests(httpx.get(metrics_url, timeout=10).text) - sent_before
            watch.stop()
            cycles = cycles_of(cycle_log, wall0)
            durations = [c["seconds"] for c in cycles if c["at"] <= wall0 + elapsed + 1.0]
            return {
                "operator": operator is not None,
                "cores": os.cpu_count(),
                "nodes": node_count,
                "jobs": job_count,
                "node_lease_seconds": node_lease_seconds,
                "running": done,
                "seconds": round(elapsed, 3),
                "jobs_per_second": round(done / elapsed, 2),
                "create_seconds": round(created, 3),
                "cycle_seconds": durations,
                "cycles": len(durations),
                "cycle_p50": percentile(durations, 0.5),
                "cycle_p99": percentile(durations, 0.99),
                "cycle_max": max(durations, default=float("nan")),
                "rss_mib": round(memory_kib(operator.pid, "VmRSS") / 1024, 1) if operator else None,
                "peak_rss_mib": round(memory_kib(operator.pid, "VmHWM") / 1024, 1) if operator else None,
                "operator_requests": dict(sent.most_common()) if operator else {},
                # Requests the API server served meanwhile from every client (watches aside).
                "api_requests": dict((requests_after - requests_before).most_common()),
                # CPU seconds each process spent from the first create to the end of the run.
                "cpu_seconds": {
                    name: round(cpu_after[name] - cpu_before[name], 1)
                    for name in sorted(pids)
                    if cpu_after[name] > 0
                },
            }
        finally:
            log_file = Path(tmp) / "operator.log"
            if keep_log is not None and log_file.exists():
                keep_log.write_bytes(log_file.read_bytes())
            if log_file.exists():
                problems = [
                    line for line in log_file.read_text().splitlines() if "WARNING" in line or "ERROR" in line
                ]
                for line in problems[:20]:
                    print(f"  operator: {line}", file=sys.stderr, flush=True)
            if operator is not None:
                operator.terminate()
                try:
                    operator.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    operator.kill()
            bed.down()


def _until_running(watch: PlacementWatch, job_count: int, t0: float, progress: Any) -> int:
    done, said = 0, 0.0
    while done < job_count and time.monotonic() - t0 < 600:
        done, pods = watch.placed(), watch.bound_pods()
        progress.reached(done, f"{pods} pods running")
        if not sys.stderr.isatty() and time.monotonic() - said > 10:
            said = time.monotonic()
            print(f"  {said - t0:5.0f} s: {done} jobs running, {pods} pods", file=sys.stderr, flush=True)
        time.sleep(0.5)
    return done


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.5)


ARTIFACT = REPO / "bench" / "results" / "scheduler_scale.json"
TARGETS = {"jobs_per_second": 20.0, "cycle_p99_seconds": 1.0, "operator_requests_per_job": 12.0}
DESCRIPTION = (
    "`python bench/scheduler_scale.py --write`: the operator as a process against its own test bed (real "
    "kube-apiserver and etcd, KWOK nodes of 8 GPUs in 4 classes, Prometheus), run as in production with "
    "`--prometheus-url` (its job-metrics poller and a rebalancer task per running job are live). All jobs "
    "are created at once from 16 client threads (mixed sizes 1-16 GPUs, class lists, priorities, 4 queues; "
    "all fit). A job counts once all its worker pods are Running (KWOK starts them), as seen by watches on "
    "jobs and pods; the clock starts before the first create and stops when the last job runs. Cycle "
    "latencies are quantiles of every cycle's raw duration, which the operator appends to its `--cycle-log` "
    "(a cycle: the view of the whole cluster, every job's lifecycle step, `schedule()`, and queueing the "
    "writes; the writes themselves run beside the cycles). Requests per job are the operator's own count of "
    "what it sent (`heterotrain_operator_kube_requests_total`, watches aside); below, everything the API "
    "server served meanwhile (its `apiserver_request_total`: KWOK's pod status updates and node leases, the "
    "controller manager, the benchmark's watches), and the CPU seconds each process spent (from /proc). "
    "Everything shares the 2-core machine. The last row is the same workload on a fresh test bed without "
    "the operator: the benchmark itself writes, from 16 threads, only what a job needs to run (one status "
    "write with a first-fit allocation, the Service, the plan ConfigMap and the worker pods, built by the "
    "operator's own builders), so its rate is what the test bed alone allows on this machine. The table is "
    "generated from `bench/results/scheduler_scale.json`."
)
COLUMNS = (
    "nodes",
    "jobs",
    "running",
    "seconds",
    "jobs/s to Running",
    "creating them took s",
    "cycles",
    "cycle p50 ms",
    "cycle p99 ms",
    "cycle max ms",
    "operator requests / job",
    "operator RSS MiB (peak)",
)


def per_job(counts: dict[str, int], jobs_count: int) -> float:
    return sum(counts.values()) / jobs_count


def render(artifact: dict[str, Any]) -> str:
    rows = artifact["runs"]
    lines = [
        SECTION,
        "",
        DESCRIPTION,
        "",
        f"Run on {artifact['machine']} at commit {artifact['commit']}.",
        "",
    ]
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        by_operator = r.get("operator", True)
        cells = [
            str(r["nodes"]) + ("" if by_operator else " (no operator)"),
            str(r["jobs"]),
            str(r["running"]),
            f"{r['seconds']:.1f}",
            f"{r['jobs_per_second']:.1f}",
            f"{r['create_seconds']:.1f}",
        ]
        if by_operator:
            cells += [
                str(r["cycles"]),
                f"{r['cycle_p50'] * 1000:.0f}",
                f"{r['cycle_p99'] * 1000:.0f}",
                f"{r['cycle_max'] * 1000:.0f}",
                f"{per_job(r['operator_requests'], r['jobs']):.2f}",
                f"{r['rss_mib']:.0f} ({r['peak_rss_mib']:.0f})",
            ]
        else:
            cells += ["–"] * (len(COLUMNS) - len(cells))
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Per run: the operator's requests per job, everything the API server served, CPU seconds:",
        "",
    ]
    for r in rows:
        sent = ", ".join(f"{what} {count / r['jobs']:.2f}" for what, count in r["operator_requests"].items())
        served = r["api_requests"]
        all_served = ", ".join(f"{what} {count / r['jobs']:.2f}" for what, count in served.items() if count)
        spent = ", ".join(f"{name} {seconds:.1f}" for name, seconds in r["cpu_seconds"].items())
        if not r.get("operator", True):
            lines.append(
                f"- without the operator: {r['nodes']} nodes, {r['jobs']} jobs in {r['seconds']:.1f} s"
            )
        else:
            lines.append(f"- {r['nodes']} nodes, {r['jobs']} jobs in {r['seconds']:.1f} s")
            lines.append(f"  - operator requests per job: {sent}")
        lines.append(f"  - API server, all clients, per job ({sum(served.values())} in all): {all_served}")
        lines.append(f"  - CPU seconds (two cores: 2 s a second): {spent}")
    targets = artifact["targets"]
    lines += ceiling(rows, targets["jobs_per_second"])
    lines += [
        "",
        "Targets on this 2-core machine (1,000 nodes, 500 jobs): at least "
        f"{targets['jobs_per_second']:g} jobs/s to Running, cycle p99 under "
        f"{targets['cycle_p99_seconds']:g} s from raw durations, at most "
        f"{targets['operator_requests_per_job']:g} operator requests per job on average.",
        "",
    ]
    return "\n".join(lines)


TEST_BED_PROCESSES = ("etcd", "kube-apiserver", "kube-controller-manager", "kwok", "prometheus")


def ceiling(rows: list[dict[str, Any]], target: float) -> list[str]:
    """What the test bed's own CPU leaves an operator on these cores, from each run with the
    operator, and the rate of the run without it."""
    with_operator = [r for r in rows if r.get("operator", True) and "cores" in r]
    alone = [r for r in rows if not r.get("operator", True)]
    if not with_operator:
        return []
    lines = [""]
    for run in with_operator:
        bed = sum(run["cpu_seconds"].get(name, 0.0) for name in TEST_BED_PROCESSES)
        cores, jobs_count = run["cores"], run["jobs"]
        left = cores * jobs_count / target - bed
        lines.append(
            f"- The operator's run of {run['seconds']:.1f} s: the test bed's own processes spent {bed:.1f} "
            f"CPU seconds, so with an operator that cost nothing the {cores} cores would run at most about "
            f"{cores * jobs_count / bed:.1f} jobs/s. At {target:g} jobs/s the run would last "
            f"{jobs_count / target:.0f} s, leaving the operator {left:.1f} CPU seconds for {jobs_count} jobs "
            f"({1000 * left / jobs_count:.0f} ms a job); it spent {run['cpu_seconds']['operator']:.1f}."
        )
    for bare in alone:
        lines.append(
            f"- Without the operator, the benchmark writing only what each job needs "
            f"({bare['cpu_seconds'].get('benchmark', 0):.1f} CPU seconds, the Kubernetes Python client) ran "
            f"the same pods at {bare['jobs_per_second']:.1f} jobs/s."
        )
    lines += [
        "",
        f"The test bed's processes are {', '.join(TEST_BED_PROCESSES)}; node-lease renewals and scrapes "
        "among their work are paid by the second, the rest by the job.",
    ]
    return lines


def artifact_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    machine = (
        f"{os.cpu_count()} cores, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB"
    )
    return {"machine": machine, "commit": commit.stdout.strip(), "targets": TARGETS, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="100 nodes and 50 jobs")
    parser.add_argument("--write", action="store_true", help="write the artifact and BENCHMARKS.md's section")
    parser.add_argument("--render", action="store_true", help="only render the committed artifact")
    parser.add_argument("--profile", type=Path, help="run the operator under cProfile, writing stats here")
    parser.add_argument("--operator-log", type=Path, help="keep the operator's debug log here")
    parser.add_argument(
        "--node-lease-seconds",
        type=int,
        nargs="+",
        default=[NODE_LEASE_SECONDS],
        help="fake nodes' lease duration, renewed every quarter of it (default "
        f"{NODE_LEASE_SECONDS}, a kubelet's); several values run one after the other, a row each",
    )
    parser.add_argument(
        "--operator-only",
        action="store_true",
        help="skip the run without the operator (the benchmark writes the operator's objects itself)",
    )
    args = parser.parse_args()
    if args.render:
        replace_section(render(json.loads(ARTIFACT.read_text())))
        return
    node_count, job_count = (100, 50) if args.quick else (1000, 500)
    runs = [
        run(node_count, job_count, args.profile, args.operator_log, lease)
        for lease in args.node_lease_seconds
    ]
    if not args.operator_only:
        runs.append(run(node_count, job_count, with_operator=False))
    artifact = artifact_of(runs)
    publish(artifact, render(artifact), ARTIFACT, args.write)


if __name__ == "__main__":
    main()
