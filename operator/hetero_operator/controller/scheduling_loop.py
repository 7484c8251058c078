"""The one loop that changes jobs: debounced cycles over the indexes.

Each cycle reads one view of the cluster, steps every job's lifecycle (pure), builds the scheduler's
snapshot from the result, calls `schedule()` (pure) and hands both to the writers. Being the only
writer of job status after validation, it needs no locks.

Writes do not hold up the next cycle: each job's writes run in order on a chain of their own, and
until a status write has gone through, cycles see the status it carries (assumed, as a scheduler's
cache assumes a binding). A job's status is always written before its pods are created, so an
operator killed at any point restarts into a state it can finish without duplicates.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import aiohttp

from hetero_operator.controller import launcher, names
from hetero_operator.controller.conditions import owned_by_loop, patch_status
from hetero_operator.controller.facts import JobFacts
from hetero_operator.controller.inventory import ClusterView, build_snapshot, gpu_capacity, job_request
from hetero_operator.controller.k8s import CORE, HETEROTRAIN, KubeClient, KubeError, path_of
from hetero_operator.controller.lifecycle import (
    HOLDING_PHASES,
    ConditionType,
    DrainReason,
    JobEvent,
    LifecycleConfig,
    Observation,
    Role,
    Step,
    draining,
    invalid,
    is_true,
    next_generation,
    placed,
    reconcile,
    scheduling_role,
    validated,
    waiting,
)
from hetero_operator.controller.metrics import OperatorMetrics
from hetero_operator.controller.plans import PlanBuildError, initial_plan, plan_status
from hetero_operator.controller.rebalancers import Rebalancers
from hetero_operator.controller.validation import semantic_problems
from hetero_operator.plan import Plan as PlanDocument
from hetero_operator.rebalance.runner import RebalancerSettings
from hetero_operator.resources import GROUP, VERSION, HeteroTrainJob, HeteroTrainJobStatus, WorkerAllocation
from hetero_operator.resources import Allocation as StatusAllocation
from hetero_operator.scheduler import Allocation, Decisions, SchedulerConfig, schedule

log = logging.getLogger(__name__)

INDEX_NAMES = ("htj_classes", "htj_nodes", "htj_jobs", "htj_pods")
# A generation whose objects could not all be created is tried again after this long; one whose
# creation went through is left alone while the watches catch up (at thousands of pods they lag by
# tens of seconds), and only re-checked after RECHECK_CREATED_SECONDS.
RETRY_CREATION_SECONDS = 5.0
RECHECK_CREATED_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class _Creation:
    at: float  # time.monotonic() of the last state change
    state: str  # "queued" (behind a status write), "running", "done" or "failed"


@dataclass(frozen=True)
class LoopConfig:
    debounce_seconds: float = 0.2
    idle_wake_seconds: float = 10.0
    concurrency: int = 32
    namespaces: tuple[str, ...] = ()
    lifecycle: LifecycleConfig = field(default_factory=LifecycleConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    launch: launcher.LaunchSettings = field(default_factory=launcher.LaunchSettings)


@dataclass
class _Work:
    """One job in one cycle. `job` carries the status decided so far (lifecycle step, then the
    scheduler's decision); `_flush` writes it once, as one patch against `stored`, and then runs
    `after` (pod deletions, creations, Events) in the order the cycle queued them."""

    facts: JobFacts
    job: HeteroTrainJob
    step: Step
    stored: HeteroTrainJobStatus = field(default_factory=HeteroTrainJobStatus)
    after: list[Callable[[HeteroTrainJob], Awaitable[None]]] = field(default_factory=list)


def _status_of(job: HeteroTrainJob) -> HeteroTrainJobStatus:
    return job.status or HeteroTrainJobStatus()


def status_patch(old: HeteroTrainJobStatus, new: HeteroTrainJobStatus) -> dict[str, Any]:
    """A merge patch of the top-level status fields that changed (None removes a field), so fields
    other writers own (progress, rebalances) are left alone."""
    before, after = old.to_wire(), new.to_wire()
    patch: dict[str, Any] = {key: value for key, value in after.items() if before.get(key) != value}
    patch.update({key: None for key in before if key not in after})
    return patch


def _involved(namespace: str, name: str, uid: str) -> dict[str, str]:
    """The `involvedObject` of an Event about a job."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "HeteroTrainJob",
        "name": name,
        "namespace": namespace,
        "uid": uid,
    }


def arrival_times(jobs: Iterable[JobFacts], now: float) -> dict[str, float]:
    """When each job seen for the first time in this cycle joins its queue: ``now`` plus a microsecond
    per job in creation order. creationTimestamp has whole seconds, so within a second the creating
    write's resourceVersion (etcd's global revision) tells which came first."""
    new = [
        f
        for f in jobs
        if f.model is not None and (f.model.status is None or f.model.status.queued_at is None)
    ]
    new.sort(key=lambda f: (f.created_at, _revision(f.resource_version), f.key))
    return {facts.key: now + index * 1e-6 for index, facts in enumerate(new)}


def _revision(resource_version: str) -> int:
    try:
        return int(resource_version)
    except ValueError:
        return 0


def _newer(candidate: str, than: str) -> bool:
    """resourceVersions from one etcd are increasing integers; anything else counts as not newer."""
    try:
        return int(candidate) > int(than)
    except ValueError:
        return False


class SchedulingLoop:
    def __init__(
        self,
        client: KubeClient,
        indexes: Mapping[str, Mapping[str, Iterable[object]]],
        config: LoopConfig,
        metrics: OperatorMetrics,
        rebalancer: RebalancerSettings | None = None,
    ) -> None:
        """`rebalancer`: where to measure running jobs; None leaves every job on its first plan."""
        self.client = client
        self.indexes = indexes
        self.config = config
        self.metrics = metrics
        self._wake = asyncio.Event()
        self._next_wake = config.idle_wake_seconds
        self._last_cycle_seconds = 0.0
        self._written: dict[str, JobFacts] = {}
        # Statuses handed to a job's write chain and not yet stored: what the next cycles see.
        self._assumed: dict[str, JobFacts] = {}
        self._chains: dict[str, asyncio.Task[None]] = {}
        # (job key, generation) -> how creating its objects went; the watch needs a while to show
        # new pods, and re-posting every object each cycle until then would only earn 409s.
        self._created: dict[tuple[str, str, int], _Creation] = {}  # (job key, uid, generation)
        # Deleted jobs whose objects are being removed (before our finalizer comes off).
        self._cleaning: set[str] = set()
        # Jobs our finalizer was added to (job key -> (uid, when)): the watch shows it a while later,
        # and adding it again meanwhile would cost a write per cycle.
        self._finalizing: dict[str, tuple[str, float]] = {}
        self._limit = asyncio.Semaphore(config.concurrency)
        self._creation_limit = asyncio.Semaphore(config.concurrency)
        self._tasks: set[asyncio.Task[None]] = set()
        self.rebalancers = (
            Rebalancers(client, rebalancer, metrics, self.freshest) if rebalancer is not None else None
        )
        self.cycles = 0

    def trigger(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            if self.rebalancers is not None:
                await self.rebalancers.stop()

    async def _run(self) -> None:
        await self.wait_for_indexes()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self._next_wake)
            # Debounce: gather the changes of a burst into one cycle, and never spend more than about
            # a third of the time in cycles (creation and the watches share this event loop, and
            # under a burst the API server needs the CPU more than a fresher decision does).
            pause = min(2 * self._last_cycle_seconds, 2.0)
            await asyncio.sleep(max(self.config.debounce_seconds, pause))
            self._wake.clear()
            self._next_wake = self.config.idle_wake_seconds
            started = time.perf_counter()
            try:
                await self.cycle()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("scheduling cycle failed; retrying")
                self._wake_in(1.0)
            self._last_cycle_seconds = time.perf_counter() - started
            self.metrics.cycle_seconds.observe(self._last_cycle_seconds)
            self.cycles += 1

    def _wake_in(self, seconds: float | None) -> None:
        if seconds is not None:
            self._next_wake = max(0.05, min(self._next_wake, seconds))

    # --- start-up -------------------------------------------------------------------------------

    async def wait_for_indexes(self, timeout: float = 60.0) -> None:
        """Hold the first cycle until the indexes hold everything that existed at start: deciding on
        a partial view could place a job twice or hand out GPUs that are taken."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                jobs, pods, nodes = await self._existing_objects()
                break
            except (KubeError, aiohttp.ClientError) as error:
                if time.monotonic() > deadline:
                    raise
                log.info("listing the cluster failed (%s); retrying", error)
                await asyncio.sleep(0.5)
        while time.monotonic() < deadline:
            view = self._view()
            seen_pods = {f"{p.namespace}/{p.name}" for p in view.all_pods()}
            if jobs <= set(view.jobs) and pods <= seen_pods and nodes <= set(view.nodes):
                log.info("indexes ready: %d jobs, %d pods, %d nodes", len(jobs), len(pods), len(nodes))
                return
            await asyncio.sleep(0.1)
        log.warning("indexes incomplete after %.0f s; starting anyway", timeout)

    async def _existing_objects(self) -> tuple[set[str], set[str], set[str]]:
        scopes = [f"/namespaces/{ns}" for ns in self.config.namespaces] or [""]
        jobs: set[str] = set()
        pods: set[str] = set()
        for scope in scopes:
            for item in await self.client.list_items(f"{HETEROTRAIN}{scope}/heterotrainjobs"):
                jobs.add(f"{item['metadata']['namespace']}/{item['metadata']['name']}")
            selector = {"labelSelector": names.LABEL_JOB}
            for item in await self.client.list_items(f"{CORE}{scope}/pods", selector):
                pods.add(f"{item['metadata']['namespace']}/{item['metadata']['name']}")
        nodes = {item["metadata"]["name"] for item in await self.client.list_items(f"{CORE}/nodes")}
        return jobs, pods, nodes

    async def _add_finalizer(self, facts: JobFacts) -> None:
        """Our finalizer on every job, so a deletion waits until its objects are removed. It runs on
        the job's write chain, and the body it returns is what the job's next status write is
        preconditioned on (beside the chain, every first status write met a 409 and read again)."""
        try:
            body = await self.client.merge_patch(
                path_of("HeteroTrainJob", facts.namespace, facts.name),
                {"metadata": {"finalizers": [*facts.finalizers, names.FINALIZER]}},
            )
        except BaseException:
            self._finalizing.pop(facts.key, None)  # the next cycle tries again
            raise
        if body is not None:
            self._written[facts.key] = JobFacts.from_body(body)

    def _finalizer_due(self, facts: JobFacts) -> bool:
        added = self._finalizing.get(facts.key)
        if added is None or added[0] != facts.uid:
            return True
        return time.monotonic() - added[1] > RECHECK_CREATED_SECONDS  # taken off since? add it again

    async def _clean_up(self, facts: JobFacts) -> None:
        """A deleted job: remove what it owns, then let the deletion finish."""
        try:
            await self.delete_job_objects(facts.namespace, facts.name)
            await self.client.remove_finalizer(
                path_of("HeteroTrainJob", facts.namespace, facts.name), facts.finalizers, names.FINALIZER
            )
            self._written.pop(facts.key, None)
        finally:
            self._cleaning.discard(facts.key)

    async def delete_job_objects(self, namespace: str, name: str) -> None:
        """Everything a deleted job owns. Pods on nodes that are gone or not Ready are force-deleted:
        no kubelet is left to confirm their end (the garbage collector would wait as long)."""
        view = self._view()
        await self.client.delete_collection("Pod", namespace, names.job_selector(name))
        for pod in view.pods_of(f"{namespace}/{name}"):
            node = view.nodes.get(pod.node or "")
            if node is None or not node.ready:
                await self.client.delete(path_of("Pod", namespace, pod.name), grace_seconds=0)
        for kind, object_name in (
            ("Service", names.service_name(name)),
            ("ConfigMap", names.plan_config_map_name(name)),
            ("PersistentVolumeClaim", names.checkpoint_claim_name(name)),
        ):
            await self.client.delete(path_of(kind, namespace, object_name))
        self.trigger()

    # --- one cycle ------------------------------------------------------------------------------

    def _view(self) -> ClusterView:
        get = self.indexes.get
        view = ClusterView.from_indexes(
            get("htj_classes") or {}, get("htj_nodes") or {}, get("htj_jobs") or {}, get("htj_pods") or {}
        )
        jobs = dict(view.jobs)
        for key, written in list(self._written.items()):
            indexed = jobs.get(key)
            if indexed is None or not _newer(written.resource_version, indexed.resource_version):
                del self._written[key]  # the watch caught up (or the job is gone)
            else:
                jobs[key] = written
        for key, assumed in self._assumed.items():
            if key in jobs:
                jobs[key] = assumed
        return ClusterView(view.classes, view.nodes, jobs, view.pods_by_job, view.node_class)

    async def cycle(self) -> Decisions:
        return self._decide()

    def _decide(self) -> Decisions:
        cycle_started = time.perf_counter()
        now = time.time()
        fresh = time.monotonic() - RECHECK_CREATED_SECONDS
        self._created = {
            key: c for key, c in self._created.items() if c.state in ("queued", "running") or c.at > fresh
        }
        view = self._view()
        self._finalizing = {k: v for k, v in self._finalizing.items() if k in view.jobs}
        work: dict[str, _Work] = {}
        invalid_jobs: list[tuple[JobFacts, list[str]]] = []
        arrivals = arrival_times(view.jobs.values(), now)
        for key, facts in sorted(view.jobs.items()):
            if facts.deleting:
                if names.FINALIZER in facts.finalizers and key not in self._cleaning:
                    self._cleaning.add(key)
                    self._background(self._clean_up(facts))
                continue
            if names.FINALIZER in facts.finalizers:
                self._finalizing.pop(key, None)
            elif self._finalizer_due(facts):
                self._finalizing[key] = (facts.uid, time.monotonic())
                self._enqueue(key, functools.partial(self._add_finalizer, facts))
            job, problems = facts.model, list(facts.problems)
            if job is not None:
                problems += semantic_problems(job)
            if job is None or problems:
                invalid_jobs.append((facts, problems))
                continue
            original = job
            checked = validated(job, arrivals.get(key, now))
            if checked != _status_of(job):
                job = job.model_copy(update={"status": checked})
            observation = Observation(
                job, view.pods_of(key), view.lost_nodes(_status_of(job).allocation), now
            )
            step = reconcile(observation, self.config.lifecycle)
            work[key] = _Work(facts, original, step, _status_of(original))
        # From here to the end of the cycle nothing awaits: the cycle decides on one view, and its
        # latency is its own work (the writes run on the per-job chains).
        for facts, problems in invalid_jobs:
            self._mark_invalid(facts, problems, now)
        for item in work.values():
            self._apply_step(item, view)
        requests = []
        for key, item in work.items():
            status = item.step.status
            role = scheduling_role(item.job, status, view.pods_of(key))
            if role is Role.QUEUED:
                requests.append(job_request(item.facts, item.job, status, holding=False))
            elif role is Role.HOLDING and not view.lost_nodes(status.allocation):
                requests.append(job_request(item.facts, item.job, status, holding=True))
        snapshot = build_snapshot(view, requests, now)
        started = time.perf_counter()
        decisions = schedule(snapshot, self.config.scheduler)
        self.metrics.schedule_seconds.observe(time.perf_counter() - started)
        scheduled = time.perf_counter()
        self._apply_decisions(decisions, work, view, now)
        for item in work.values():
            self._flush(item)
        self._export(work, decisions, view)
        if self.rebalancers is not None:
            self.rebalancers.sync(view.jobs)
        log.debug(
            "cycle: %d jobs, lifecycle+view %.3f s, schedule %.3f s, apply %.3f s (%d placed)",
            len(work),
            started - cycle_started,
            scheduled - started,
            time.perf_counter() - scheduled,
            len(decisions.place),
        )
        return decisions

    # --- per-job write chains -------------------------------------------------------------------

    def _enqueue(self, key: str, work: Callable[[], Awaitable[None]]) -> None:
        """Run `work` after every write already queued for this job (never beside one)."""
        previous = self._chains.get(key)

        async def chained() -> None:
            if previous is not None:
                with contextlib.suppress(Exception):
                    await previous
            async with self._limit:
                try:
                    await work()
                except (KubeError, aiohttp.ClientError, TimeoutError) as error:
                    log.warning("%s", error)
                    self._assumed.pop(key, None)  # what the next cycle sees falls back to the watch
                    self._creation_not_reached(key)
                    self._wake_in(1.0)
                    self.trigger()

        task = asyncio.create_task(chained())
        self._chains[key] = task
        self._tasks.add(task)

        def done(finished: asyncio.Task[None]) -> None:
            self._tasks.discard(finished)
            if self._chains.get(key) is finished:
                del self._chains[key]

        task.add_done_callback(done)

    # --- lifecycle actions ----------------------------------------------------------------------

    def _apply_step(self, item: _Work, view: ClusterView) -> None:
        step, namespace = item.step, item.facts.namespace
        item.job = item.job.model_copy(update={"status": step.status})
        create = step.ensure_generation and self._due_for_creation(item.facts, step.status)
        if create:
            self._mark_creating(item.facts, step.status)
        if create or step.force_delete_pods or step.delete_pods or step.request_checkpoint or step.events:

            async def then(job_now: HeteroTrainJob) -> None:
                for name in step.force_delete_pods:
                    await self.client.delete(path_of("Pod", namespace, name), grace_seconds=0)
                for name in step.delete_pods:
                    await self.client.delete(path_of("Pod", namespace, name))
                await self._request_checkpoint(namespace, step.request_checkpoint)
                if create:
                    self._background(self._create_generation(job_now, view))
                for event in step.events:
                    self._background(self._event(job_now, event))

            item.after.append(then)
        if step.restarted:
            self.metrics.restarts.inc()
        self._wake_in(step.wake_in)

    def _mark_invalid(self, facts: JobFacts, problems: list[str], now: float) -> None:
        """Valid=False naming every problem, and an InvalidSpec Event."""
        current = facts.model.status if facts.model is not None else None
        status = invalid(current, problems, now)
        if current is not None and status == current:
            return
        if current is None and facts.phase is not None:
            return  # unparsable, and already marked
        if facts.key in self._chains:
            return  # a write for it is on its way; the next cycle sees it
        path = path_of("HeteroTrainJob", facts.namespace, facts.name, "status")
        self._enqueue(facts.key, lambda: self._write_invalid(facts, path, status, problems))

    async def _write_invalid(
        self, facts: JobFacts, path: str, status: HeteroTrainJobStatus, problems: list[str]
    ) -> None:
        body = await patch_status(self.client, path, status.to_wire(), owned_by_loop)
        if body is not None:
            self._written[facts.key] = JobFacts.from_body(body)
            involved = _involved(facts.namespace, facts.name, facts.uid)
            message = "; ".join(problems)
            self._background(self.client.post_event(involved, "Warning", "InvalidSpec", message))

    def _flush(self, item: _Work) -> None:
        """Queue the job's one status patch for this cycle (if anything changed), then its actions.
        Until the patch is stored, cycles see the new status (assumed)."""
        new, afters, key = _status_of(item.job), list(item.after), item.facts.key
        patch = status_patch(item.stored, new)
        job = item.job

        async def run_afters() -> None:
            for after in afters:
                await after(job)

        if not patch:
            if afters:
                self._enqueue(key, run_afters)
            return
        assumed = replace(item.facts, model=job, phase=new.phase.value if new.phase else None)
        self._assumed[key] = assumed
        path = path_of("HeteroTrainJob", item.facts.namespace, item.facts.name, "status")

        async def write() -> None:
            try:
                body = await patch_status(self.client, path, patch, owned_by_loop, self._known_body(key))
            finally:
                if self._assumed.get(key) is assumed:
                    del self._assumed[key]
            if body is None:
                return  # the job is gone
            self._written[key] = JobFacts.from_body(body)
            await run_afters()

        self._enqueue(key, write)

    async def _request_checkpoint(self, namespace: str, pods: Iterable[str]) -> None:
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        patch = {"metadata": {"annotations": {names.CHECKPOINT_REQUESTED_ANNOTATION: stamp}}}
        await asyncio.gather(
            *(self.client.merge_patch(path_of("Pod", namespace, name), patch) for name in pods)
        )

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run object creation and events beside the cycles: a cycle needs its status writes done
        (they make the next snapshot right), not the thousands of pods they lead to. Pods of a
        generation are current workers of a job that holds their GPUs, so no cycle double-books
        them, and `_due_for_creation` keeps cycles from creating them twice meanwhile."""

        async def limited() -> None:
            async with self._creation_limit:
                try:
                    await work
                except (KubeError, aiohttp.ClientError) as error:
                    log.warning("%s", error)

        task = asyncio.create_task(limited())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def freshest(self, key: str) -> JobFacts | None:
        """The newest state of a job this replica has seen: the index or its own last write."""
        seen = [self._written.get(key)]
        for value in (self.indexes.get("htj_jobs") or {}).get(key) or ():
            if isinstance(value, JobFacts):
                seen.append(value)
        return max(
            (f for f in seen if f is not None and f.model is not None),
            key=lambda f: _revision(f.resource_version),
            default=None,
        )

    def _known_body(self, key: str) -> dict[str, Any] | None:
        """The freshest resourceVersion and conditions of a job, for the precondition of a
        conditions write."""
        facts = self.freshest(key)
        if facts is None or facts.model is None:
            return None
        conditions = [c.to_wire() for c in _status_of(facts.model).conditions]
        return {"metadata": {"resourceVersion": facts.resource_version}, "status": {"conditions": conditions}}

    def _mark_creating(self, facts: JobFacts, status: HeteroTrainJobStatus) -> None:
        """Creation is queued behind the status write: later cycles must not queue it again."""
        allocation = status.allocation
        if allocation is not None:
            self._created[(facts.key, facts.uid, allocation.generation)] = _Creation(
                time.monotonic(), "queued"
            )

    def _creation_not_reached(self, key: str) -> None:
        """A write of this job failed before its queued creation ran: let a later cycle retry it."""
        for mark, creation in list(self._created.items()):
            if mark[0] == key and creation.state == "queued":
                self._created[mark] = _Creation(time.monotonic(), "failed")

    def _due_for_creation(self, facts: JobFacts, status: HeteroTrainJobStatus) -> bool:
        allocation = status.allocation
        if allocation is None:
            return False
        created = self._created.get((facts.key, facts.uid, allocation.generation))
        if created is None:
            return True
        age = time.monotonic() - created.at
        if created.state == "failed":
            return age > RETRY_CREATION_SECONDS
        return created.state == "done" and age > RECHECK_CREATED_SECONDS

    async def _create_generation(
        self, job: HeteroTrainJob, view: ClusterView, plan: PlanDocument | None = None
    ) -> None:
        """Create a generation's objects; `plan` is the one a placement just built (it replaces any
        older plan ConfigMap), None when recreating, which keeps the plan the job already has."""
        status = _status_of(job)
        allocation = status.allocation
        if allocation is None or not allocation.workers:
            return
        key = (f"{job.namespace}/{job.name}", str(job.metadata.get("uid", "")), allocation.generation)
        self._created[key] = _Creation(time.monotonic(), "running")
        try:
            await self._create_objects(job, status, allocation, view, plan)
        except BaseException:
            self._created[key] = _Creation(time.monotonic(), "failed")
            raise
        self._created[key] = _Creation(time.monotonic(), "done")

    async def _create_objects(
        self,
        job: HeteroTrainJob,
        status: HeteroTrainJobStatus,
        allocation: StatusAllocation,
        view: ClusterView,
        placed_plan: PlanDocument | None,
    ) -> None:
        settings = launcher.LaunchSettings(
            metrics_port=self.config.launch.metrics_port,
            master_port=self.config.launch.master_port,
            checkpoint_storage=self.config.launch.checkpoint_storage,
            run_as_user=self.config.launch.run_as_user,
            classes=view.launch_classes(),
        )
        if placed_plan is not None:
            await self.client.create_or_replace_data(launcher.plan_config_map(job, placed_plan))
        else:
            version = status.plan.version if status.plan is not None else 1
            predicted = status.plan.predicted_iteration_seconds if status.plan is not None else None
            plan = initial_plan(job.spec, allocation, view.speeds(), version, predicted or None)
            await self.client.create(launcher.plan_config_map(job, plan))
        await self.client.create(launcher.headless_service(job, settings))
        claim = launcher.checkpoint_claim(job, settings)
        if claim is not None:
            await self.client.create(claim)
        await asyncio.gather(
            *(self.client.create(pod) for pod in launcher.worker_pods(job, allocation, settings))
        )

    async def _event(self, job: HeteroTrainJob, event: JobEvent) -> None:
        involved = _involved(job.namespace, job.name, str(job.metadata.get("uid", "")))
        try:
            await self.client.post_event(involved, event.type, event.reason, event.message)
        except KubeError as error:
            log.warning("event for %s/%s not posted: %s", job.namespace, job.name, error)

    # --- scheduler decisions --------------------------------------------------------------------

    def _apply_decisions(
        self, decisions: Decisions, work: Mapping[str, _Work], view: ClusterView, now: float
    ) -> None:
        for key, allocation in decisions.place.items():
            predicted = decisions.predicted_samples_per_second.get(key)
            self._place(work[key], allocation, predicted, view, now)
        for key, message in decisions.unschedulable.items():
            log.debug("%s waits: %s", key, message)
            self._wait(work[key], message, now)
        stops = [
            *((key, DrainReason.PREEMPTED, p.reason) for key, p in decisions.preempt.items()),
            *((key, DrainReason.RESIZED, r.reason) for key, r in decisions.shrink.items()),
            *((key, DrainReason.RESIZED, r.reason) for key, r in decisions.grow.items()),
        ]
        for key, reason, message in stops:
            self._stop(work[key], reason, message, view, now)

    def _place(
        self, item: _Work, allocation: Allocation, predicted: float | None, view: ClusterView, now: float
    ) -> None:
        job = item.job
        status = _status_of(job)
        workers = [
            WorkerAllocation(
                rank=slot.rank,
                node=slot.node,
                gpu_class=slot.gpu_class,
                gpus=slot.gpus,
                virtual_worker=slot.virtual_worker,
                stage=slot.stage,
            )
            for slot in allocation.workers
        ]
        generation = next_generation(status.allocation)
        chosen = StatusAllocation.from_workers(workers, generation=generation)
        version = status.plan.version + 1 if status.plan is not None else 1
        iteration = job.spec.batch.global_batch / predicted if predicted else None
        try:
            plan: PlanDocument = initial_plan(job.spec, chosen, view.speeds(), version, iteration)
        except PlanBuildError as error:
            self._wait(item, f"placement refused: {error}", now)
            return
        message = f"placed on {chosen.total_gpus} GPUs ({chosen.classes}), worker generation {generation}"

        async def then(job_now: HeteroTrainJob) -> None:
            if generation == 0:
                self.metrics.placement_seconds.observe(max(0.0, time.time() - item.facts.created_at))
            self._background(self._create_generation(job_now, view, plan))
            self._background(self._event(job_now, JobEvent("Normal", "Placed", message)))

        item.job = job.model_copy(update={"status": placed(job, chosen, plan_status(plan), predicted, now)})
        item.after.append(then)
        self._mark_creating(item.facts, _status_of(item.job))
        self.metrics.placements.inc()

    def _wait(self, item: _Work, message: str, now: float) -> None:
        item.job = item.job.model_copy(update={"status": waiting(item.job, message, now)})

    def _stop(self, item: _Work, reason: DrainReason, message: str, view: ClusterView, now: float) -> None:
        status = _status_of(item.job)
        if status.phase not in HOLDING_PHASES or is_true(status, ConditionType.DRAINING):
            return  # already stopping, or not holding GPUs any more
        pods = [p.name for p in view.pods_of(item.facts.key) if p.live and not p.deleting]
        event = JobEvent("Normal", reason.value, f"{message}; saving a checkpoint first")

        async def then(job_now: HeteroTrainJob) -> None:
            await self._request_checkpoint(item.facts.namespace, pods)
            self._background(self._event(job_now, event))

        item.job = item.job.model_copy(update={"status": draining(item.job, reason, message, now)})
        item.after.append(then)
        self.metrics.preemptions.inc()
        self._wake_in(self.config.lifecycle.checkpoint_grace_seconds)

    # --- metrics --------------------------------------------------------------------------------

    def _export(self, work: Mapping[str, _Work], decisions: Decisions, view: ClusterView) -> None:
        phases: Counter[str] = Counter()
        for item in work.values():
            phase = _status_of(item.job).phase
            phases[phase.value if phase is not None else "Unknown"] += 1
        self.metrics.set_jobs_by_phase(phases)
        self.metrics.set_queue_lengths(decisions.metrics.queue_length)
        self.metrics.set_gpus_allocated(decisions.metrics.gpus_allocated)
        # Capacity changes with nodes and pods; their index events wake a cycle, so it is current here.
        self.metrics.set_gpu_capacity(gpu_capacity(view))
