"""Carry out cycle plans: each job's writes run in order on a chain of their own, beside the cycles.

A job's status is always written before its pods are created, so an operator killed at any point
restarts into a state it can finish without duplicates. Until a status write is stored, cycles see
the status it carries (`StatusCache`); object creation and Events run in the background, bounded,
because a cycle needs its status writes done (they make the next view right), not the thousands of
pods they lead to.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import replace
from typing import Any

import aiohttp

from hetero_operator.controller import launcher, names
from hetero_operator.controller.actions import (
    Action,
    CleanUp,
    CreateGeneration,
    CreateWorkload,
    CyclePlan,
    DeleteJob,
    DeletePods,
    DeleteWorkloads,
    InvalidMark,
    JobWrite,
    PatchWorkloadStatus,
    PostEvent,
    PublishPlan,
    RequestCheckpoint,
    SetWorkloadActive,
)
from hetero_operator.controller.clock import Clock
from hetero_operator.controller.cycle_plan import InFlight
from hetero_operator.controller.events import event_manifest, involved, job_event, stamp
from hetero_operator.controller.expectations import (
    CreationExpectations,
    CreationState,
    FinalizerExpectations,
    WorkloadExpectations,
)
from hetero_operator.controller.facts import JobFacts
from hetero_operator.controller.k8s import KubeClient, KubeError, path_of
from hetero_operator.controller.lifecycle import JobEvent
from hetero_operator.controller.status_cache import StatusCache
from hetero_operator.controller.status_writes import owned_by_loop, patch_status
from hetero_operator.controller.workload_writes import change_workload_status
from hetero_operator.resources import HeteroTrainJob

log = logging.getLogger(__name__)

WRITE_ERRORS = (KubeError, aiohttp.ClientError, TimeoutError)


class JobWriters:
    def __init__(
        self,
        client: KubeClient,
        clock: Clock,
        statuses: StatusCache,
        launch: launcher.LaunchSettings,
        freshest: Callable[[str], JobFacts | None],
        on_error: Callable[[], None],
        concurrency: int = 32,
    ) -> None:
        """`freshest(key)`: the newest stored body of a job (its conditions precondition a status
        write); `on_error`: called after a failed write, so the loop looks again soon."""
        self.client = client
        self.clock = clock
        self.statuses = statuses
        self.launch = launch
        self.freshest = freshest
        self.on_error = on_error
        self.creations = CreationExpectations(clock)
        self.finalizers = FinalizerExpectations(clock)
        self.workloads = WorkloadExpectations(clock)
        self._cleaning: set[str] = set()
        self._chains: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._limit = asyncio.Semaphore(concurrency)
        self._creation_limit = asyncio.Semaphore(concurrency)

    # --- what the next cycle must know ---------------------------------------------------------

    def in_flight(self, jobs: Mapping[str, JobFacts], workloads: Iterable[str] = ()) -> InFlight:
        """What is under way, for the pure cycle plan; forgets what the watch now shows
        (`workloads`: "namespace/name" of the Kueue Workloads it shows)."""
        for key, facts in jobs.items():
            if names.FINALIZER in facts.finalizers:
                self.finalizers.seen(key)
        self.finalizers.prune(set(jobs))
        self.creations.prune()
        generations = [
            (key, f.uid, f.model.status.allocation.generation)
            for key, f in jobs.items()
            if f.model is not None and f.model.status is not None and f.model.status.allocation is not None
        ]
        return InFlight(
            creations=self.creations.not_due(generations),
            finalizers=frozenset((k, f.uid) for k, f in jobs.items() if not self.finalizers.due(k, f.uid)),
            cleaning=frozenset(self._cleaning),
            busy=frozenset(self._chains),
            workloads=self.workloads.pending(set(workloads)),
        )

    # --- carrying out a plan -------------------------------------------------------------------

    def apply(self, plan: CyclePlan) -> None:
        """Queue every write of the plan (nothing here awaits)."""
        for facts in plan.add_finalizer:
            self.finalizers.adding(facts.key, facts.uid)
            self._enqueue(facts.key, lambda facts=facts: self._add_finalizer(facts))  # type: ignore[misc]
        for mark in plan.invalid:
            self._enqueue(mark.facts.key, lambda mark=mark: self._write_invalid(mark))  # type: ignore[misc]
        for write in plan.writes:
            self._submit(write)
        for clean in plan.clean_up:
            self._cleaning.add(clean.facts.key)
            self._background(self._clean_up(clean))

    def _submit(self, write: JobWrite) -> None:
        key = write.facts.key
        for action in write.actions:
            if isinstance(action, CreateGeneration):
                self.creations.mark((key, write.facts.uid, action.generation), CreationState.QUEUED)
            elif isinstance(action, CreateWorkload):
                self.workloads.creating(key, action.name)
        assumed = None
        if write.patch:
            phase = write.status.phase
            assumed = replace(write.facts, model=write.job, phase=phase.value if phase else None)
            self.statuses.assume(key, assumed)
        self._enqueue(key, lambda: self._write(write, assumed))

    async def _write(self, write: JobWrite, assumed: JobFacts | None) -> None:
        key, facts = write.facts.key, write.facts
        if write.patch:
            assert assumed is not None
            path = path_of("HeteroTrainJob", facts.namespace, facts.name, "status")
            try:
                body = await patch_status(
                    self.client, path, write.patch, owned_by_loop, self._known_body(key)
                )
            finally:
                self.statuses.settle(key, assumed)
            if body is None:
                return  # the job is gone
            self.statuses.wrote(key, JobFacts.from_body(body))
        for action in write.actions:
            await self._act(write.job, action)

    async def _act(self, job: HeteroTrainJob, action: Action) -> None:
        namespace = job.namespace
        if isinstance(action, DeletePods):
            grace = 0 if action.force else None
            for name in action.pods:
                await self.client.delete(path_of("Pod", namespace, name), grace_seconds=grace)
        elif isinstance(action, RequestCheckpoint):
            await self._request_checkpoint(namespace, action.pods)
        elif isinstance(action, PublishPlan):
            await self.client.create_or_replace_data(launcher.plan_config_map(job, action.plan))
        elif isinstance(action, CreateGeneration):
            self._background(self._create_generation(job, action))
        elif isinstance(action, PostEvent):
            self._background(self._post_event(job, action.event))
        elif isinstance(action, DeleteJob):
            uid = str(job.metadata.get("uid", "")) or None
            await self.client.delete(path_of("HeteroTrainJob", namespace, job.name), uid=uid)
        else:
            await self._act_on_workload(namespace, action)

    async def _act_on_workload(
        self,
        namespace: str,
        action: CreateWorkload | DeleteWorkloads | SetWorkloadActive | PatchWorkloadStatus,
    ) -> None:
        """A Kueue Workload's writes: each one safe to repeat (a second create is refused, a second
        status change finds nothing left to change)."""
        if isinstance(action, CreateWorkload):
            await self.client.create(action.manifest)
            for name in action.replaces:
                await self.client.delete(path_of("Workload", namespace, name))
        elif isinstance(action, DeleteWorkloads):
            for name in action.names:
                await self.client.delete(path_of("Workload", namespace, name))
        elif isinstance(action, SetWorkloadActive):
            patch = {"spec": {"active": action.active}}
            await self.client.merge_patch(path_of("Workload", namespace, action.name), patch)
        else:
            await change_workload_status(self.client, self.clock, namespace, action)

    async def _request_checkpoint(self, namespace: str, pods: Iterable[str]) -> None:
        when = stamp(self.clock.time())
        patch = {"metadata": {"annotations": {names.CHECKPOINT_REQUESTED_ANNOTATION: when}}}
        await asyncio.gather(
            *(self.client.merge_patch(path_of("Pod", namespace, name), patch) for name in pods)
        )

    async def _create_generation(self, job: HeteroTrainJob, action: CreateGeneration) -> None:
        """The generation's objects in order (pods last: they mount the rest); the plan only if the
        job has none."""
        key = (f"{job.namespace}/{job.name}", str(job.metadata.get("uid", "")), action.generation)
        allocation = job.status.allocation if job.status is not None else None
        if allocation is None or allocation.generation != action.generation:
            return
        self.creations.mark(key, CreationState.RUNNING)
        settings = replace(self.launch, classes=dict(action.classes))
        manifests = launcher.generation_manifests(job, allocation, action.plan, settings)
        try:
            for manifest in (m for m in manifests if m["kind"] != "Pod"):
                await self.client.create(manifest)
            await asyncio.gather(*(self.client.create(m) for m in manifests if m["kind"] == "Pod"))
        except BaseException:
            self.creations.mark(key, CreationState.FAILED)
            raise
        self.creations.mark(key, CreationState.DONE)

    async def _post_event(self, job: HeteroTrainJob, event: JobEvent) -> None:
        try:
            manifest = job_event(job, event.type, event.reason, event.message, self.clock.time())
            await self.client.create(manifest)
        except KubeError as error:
            log.warning("event for %s/%s not posted: %s", job.namespace, job.name, error)

    async def _write_invalid(self, mark: InvalidMark) -> None:
        facts = mark.facts
        path = path_of("HeteroTrainJob", facts.namespace, facts.name, "status")
        body = await patch_status(self.client, path, mark.status.to_wire(), owned_by_loop)
        if body is None:
            return
        self.statuses.wrote(facts.key, JobFacts.from_body(body))
        about = involved(facts.namespace, facts.name, facts.uid)
        message = "; ".join(mark.problems)
        event = event_manifest(about, "Warning", "InvalidSpec", message, self.clock.time())
        self._background(self._create(event))

    async def _create(self, manifest: Mapping[str, Any]) -> None:
        await self.client.create(manifest)

    async def _add_finalizer(self, facts: JobFacts) -> None:
        """Our finalizer on every job, so a deletion waits until its objects are removed. The body
        it returns is what the job's next status write is preconditioned on."""
        try:
            body = await self.client.merge_patch(
                path_of("HeteroTrainJob", facts.namespace, facts.name),
                {"metadata": {"finalizers": [*facts.finalizers, names.FINALIZER]}},
            )
        except BaseException:
            self.finalizers.failed(facts.key)  # the next cycle tries again
            raise
        if body is not None:
            self.statuses.wrote(facts.key, JobFacts.from_body(body))

    async def _clean_up(self, clean: CleanUp) -> None:
        """A deleted job: remove what it owns, then let the deletion finish."""
        facts = clean.facts
        try:
            await self.client.delete_collection("Pod", facts.namespace, names.job_selector(facts.name))
            for pod in clean.force_delete:
                await self.client.delete(path_of("Pod", facts.namespace, pod), grace_seconds=0)
            for kind, name in names.job_objects(facts.name):
                await self.client.delete(path_of(kind, facts.namespace, name))
            for workload in clean.workloads:
                await self.client.delete(path_of("Workload", facts.namespace, workload))
            await self.client.remove_finalizer(
                path_of("HeteroTrainJob", facts.namespace, facts.name), facts.finalizers, names.FINALIZER
            )
            self.statuses.forget(facts.key)
        finally:
            self._cleaning.discard(facts.key)
            self.on_error()  # not an error: the next cycle should look at once

    # --- chains and background work ------------------------------------------------------------

    def _known_body(self, key: str) -> dict[str, Any] | None:
        """The freshest resourceVersion and conditions of a job, for the precondition of a
        conditions write."""
        facts = self.freshest(key)
        if facts is None or facts.model is None:
            return None
        status = facts.model.status
        conditions = [c.to_wire() for c in status.conditions] if status is not None else []
        return {"metadata": {"resourceVersion": facts.resource_version}, "status": {"conditions": conditions}}

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
                except WRITE_ERRORS as error:
                    log.warning("%s", error)
                    self.statuses.drop(key)  # what the next cycle sees falls back to the watch
                    self.creations.write_failed(key)
                    self.workloads.failed(key)
                    self.on_error()

        task = asyncio.create_task(chained())
        self._chains[key] = task
        self._tasks.add(task)

        def done(finished: asyncio.Task[None]) -> None:
            self._tasks.discard(finished)
            if self._chains.get(key) is finished:
                del self._chains[key]

        task.add_done_callback(done)

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        """Beside the chains, bounded. Pods of a generation are current workers of a job that holds
        their GPUs, so no cycle double-books them, and the creation expectations keep cycles from
        creating them twice meanwhile."""

        async def limited() -> None:
            async with self._creation_limit:
                try:
                    await work
                except WRITE_ERRORS as error:
                    log.warning("%s", error)

        task = asyncio.create_task(limited())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settle(self) -> None:
        """Wait until every queued write and background task has ended (also those they start)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def stop(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
