"""Discrete-event simulation of a GPU cluster driven by a scheduling policy.

Events are job arrivals, job completions and scheduling cycles. A cycle hands the policy one
`Snapshot` (the operator's input) and applies its `Decisions`: preemptions and shrinks first (GPUs
come back), then growths and placements. Cycles run only when something happened, at most once per
``cycle_interval_s`` (events in between are batched into one cycle, as the operator's work queue
does); round-based policies decide at their round boundaries instead.

A running job progresses at the samples/s the planner predicts for its GPUs from its true speeds
(see `rates`), after a start-up delay; the policy sees each job's speeds only as `knowledge` gives
them (by default, what the operator would have measured by then). A job that is preempted or resized
pays its checkpoint cost (save, then restore) on its next start. With queues, every queue's usage
is charged while its jobs hold GPUs, by the same `charging` functions the scheduler orders queues
with, and handed to the policy in each snapshot. Every GPU handed out is checked against the node's
capacity, so a policy that double-books a GPU stops the simulation with an error.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from hetero_operator.scheduler import Allocation, Decisions, JobRequest, PriorModel, Snapshot
from hetero_operator.scheduler.charging import Charging, accrue, charge_rate
from hetero_operator.scheduler.queues import QueueInfo
from hetero_operator.simulator.cluster import Cluster
from hetero_operator.simulator.jobs import SimJob, build_job
from hetero_operator.simulator.knowledge import Knowledge, KnowledgeSettings, check_workload_models
from hetero_operator.simulator.policies.base import SchedulingPolicy
from hetero_operator.simulator.rates import allocation_rate
from hetero_operator.simulator.trace import TraceJob


class SimulationError(RuntimeError):
    """The simulation cannot go on: a policy broke an invariant or jobs can never start."""


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """``cycle_interval_s``: least time between two event-driven cycles. ``startup_s``: pods
    starting and data loading before a job makes progress, paid at every (re)start."""

    cycle_interval_s: float = 30.0
    startup_s: float = 30.0
    prior: PriorModel = field(default_factory=PriorModel)
    # Scales what a restart costs (pods starting again plus the checkpoint's save and restore) for
    # sensitivity runs: 0 makes preemption and resizing free, 4 four times as dear. First starts
    # always pay ``startup_s``.
    restart_cost_scale: float = 1.0
    # Queues (the trace's tenants) and how their usage is charged: give the policy the same
    # `Charging` (a `SchedulerConfig.charging`) so it orders queues by what is charged here.
    queues: tuple[QueueInfo, ...] = ()
    charging: Charging = field(default_factory=Charging)
    # What the policy knows of each job's speeds: measured as the operator would, or the oracle.
    knowledge: KnowledgeSettings = field(default_factory=KnowledgeSettings)

    def __post_init__(self) -> None:
        if not (self.restart_cost_scale >= 0 and math.isfinite(self.restart_cost_scale)):
            raise ValueError(
                f"restart_cost_scale: must be a finite number >= 0, got {self.restart_cost_scale}"
            )


@dataclass(slots=True)
class JobOutcome:
    job_id: str
    model: str
    gpus_min: int
    arrival_s: float
    work_samples: float
    ideal_runtime_s: float
    tenant: str = "default"
    first_start_s: float | None = None
    finish_s: float | None = None
    restarts: int = 0
    gpu_seconds: float = 0.0
    classes_used: set[str] = field(default_factory=set)

    @property
    def jct_s(self) -> float:
        if self.finish_s is None:
            raise SimulationError(f"job {self.job_id} never finished")
        return self.finish_s - self.arrival_s

    @property
    def queueing_delay_s(self) -> float:
        if self.first_start_s is None:
            raise SimulationError(f"job {self.job_id} never started")
        return self.first_start_s - self.arrival_s


@dataclass(slots=True)
class SimulationResult:
    policy: str
    outcomes: list[JobOutcome]
    capacity: dict[str, int]
    busy_gpu_seconds: dict[str, float]
    # (time, GPUs allocated per class) whenever the allocation changed.
    timeline: list[tuple[float, dict[str, int]]]
    cycles: int
    preemptions: int
    resizes: int
    wall_seconds: float


@dataclass(slots=True)
class _Run:
    allocation: Allocation
    rate: float
    progress_from: float
    since: float
    charge: float = 0.0  # reference-GPU seconds per second charged to the job's queue
    measured: bool = False  # the run has trained long enough to be measured


@dataclass(order=True, slots=True)
class _Finish:
    time: float
    seq: int
    key: str = field(compare=False)
    version: int = field(compare=False)


class Simulation:
    """One run of one policy over one trace; `run()` returns the result."""

    def __init__(
        self,
        cluster: Cluster,
        trace: Sequence[TraceJob],
        policy: SchedulingPolicy,
        options: EngineOptions | None = None,
        on_finish: Callable[[int, int], None] | None = None,
    ) -> None:
        self.cluster = cluster
        self.policy = policy
        self.options = options or EngineOptions()
        self.catalog = tuple(sorted(cluster.classes, key=lambda c: c.name))
        self.capacity_of_node = {n.name: n.gpus_allocatable for n in cluster.nodes}
        self.class_of_node = {n.name: n.gpu_class for n in cluster.nodes}
        self.jobs: dict[str, SimJob] = {}
        for row in sorted(trace, key=lambda j: (j.arrival_s, j.job_id)):
            job = build_job(row, cluster, pipelines=policy.pipelines, prior=self.options.prior)
            self.jobs[job.key] = job
        self.arrivals = list(self.jobs.values())
        self.knowledge = Knowledge(self.options.knowledge)
        check_workload_models(self.arrivals)
        self.on_finish = on_finish
        self.outcomes = {
            key: JobOutcome(
                job.trace.job_id,
                job.model.name,
                job.trace.gpus_min,
                job.trace.arrival_s,
                job.work_samples,
                job.ideal_runtime_s,
                job.trace.tenant,
            )
            for key, job in self.jobs.items()
        }
        self.requests: dict[str, JobRequest] = {}
        self.active: dict[str, None] = {}
        self.remaining = {key: job.work_samples for key, job in self.jobs.items()}
        self.runs: dict[str, _Run] = {}
        self.version: Counter[str] = Counter()
        self.resumed: set[str] = set()
        self.node_used: Counter[str] = Counter()
        self.class_used: Counter[str] = Counter({c.name: 0 for c in cluster.classes})
        self.busy = dict.fromkeys(cluster.class_names, 0.0)
        self.timeline: list[tuple[float, dict[str, int]]] = [(0.0, dict(self.class_used))]
        self.class_by_name = {c.name: c for c in cluster.classes}
        self.gpus_per_class = cluster.gpus_per_class()
        self.usage = {q.name: 0.0 for q in self.options.queues}
        self.finishes: list[_Finish] = []
        self.seq = 0
        self.now = 0.0
        self.cycles = self.preemptions = self.resizes = self.finished = 0

    # --- GPU bookkeeping -------------------------------------------------------------------------

    def _claim(self, key: str, allocation: Allocation) -> None:
        for node, count in allocation.gpus_per_node().items():
            if self.node_used[node] + count > self.capacity_of_node[node]:
                raise SimulationError(
                    f"{self.policy.name}: job {key} was given {count} GPUs on {node}, which has only "
                    f"{self.capacity_of_node[node] - self.node_used[node]} free: a GPU would be double-booked"
                )
            self.node_used[node] += count
            self.class_used[self.class_of_node[node]] += count

    def _release(self, allocation: Allocation) -> None:
        for node, count in allocation.gpus_per_node().items():
            self.node_used[node] -= count
            self.class_used[self.class_of_node[node]] -= count

    def _advance(self, to: float) -> None:
        span = to - self.now
        if span > 0:
            for name, used in self.class_used.items():
                self.busy[name] += used * span
            if self.usage:
                charged = dict.fromkeys(self.usage, 0.0)
                for key, run in self.runs.items():
                    queue = self.jobs[key].request.queue
                    if queue in charged:
                        charged[queue] += run.charge
                for queue, rate in charged.items():
                    self.usage[queue] = accrue(self.usage[queue], rate, span, self.options.charging)
            self.now = to

    def _record(self) -> None:
        snapshot = dict(self.class_used)
        if self.timeline[-1][1] != snapshot:
            self.timeline.append((self.now, snapshot))

    # --- job life cycle --------------------------------------------------------------------------

    def _start(self, key: str, allocation: Allocation) -> None:
        request = replace(self.jobs[key].request, current=allocation)
        self._claim(key, allocation)
        rate = allocation_rate(request, allocation, self.catalog, self.options.prior)
        delay = self.options.startup_s
        if key in self.resumed:
            delay = self.options.restart_cost_scale * (self.options.startup_s + self.jobs[key].checkpoint_s)
        charge = charge_rate(
            request,
            allocation.gpus_per_class(),
            self.class_by_name,
            self.gpus_per_class,
            self.options.charging.pricing,
        )
        run = _Run(allocation, rate, self.now + delay, self.now, charge)
        self.runs[key] = run
        self.requests[key] = request
        outcome = self.outcomes[key]
        if outcome.first_start_s is None:
            outcome.first_start_s = self.now
        outcome.classes_used.update(allocation.gpus_per_class())
        self.version[key] += 1
        self.seq += 1
        done_at = run.progress_from + self.remaining[key] / rate
        heapq.heappush(self.finishes, _Finish(done_at, self.seq, key, self.version[key]))

    def _measure(self, key: str) -> None:
        """Once a run has trained `measure_after_s`, its classes are measured (its first epoch)."""
        run = self.runs[key]
        due = run.progress_from + self.options.knowledge.measure_after_s
        if not run.measured and self.now >= due:
            run.measured = True
            self.knowledge.observe(self.jobs[key], run.allocation.gpus_per_class(), due)

    def _stop(self, key: str) -> None:
        self._measure(key)
        run = self.runs.pop(key)
        self.remaining[key] -= run.rate * max(0.0, self.now - run.progress_from)
        self.outcomes[key].gpu_seconds += run.allocation.total_gpus * (self.now - run.since)
        self._release(run.allocation)
        self.version[key] += 1
        self.resumed.add(key)
        self.outcomes[key].restarts += 1
        self.requests[key] = self.jobs[key].request

    def _complete(self, key: str) -> None:
        self._measure(key)
        run = self.runs.pop(key)
        self.remaining[key] = 0.0
        outcome = self.outcomes[key]
        outcome.gpu_seconds += run.allocation.total_gpus * (self.now - run.since)
        outcome.finish_s = self.now
        self._release(run.allocation)
        del self.active[key]
        del self.requests[key]
        self.finished += 1
        if self.on_finish is not None:
            self.on_finish(self.finished, len(self.jobs))

    def _apply(self, decided: Decisions) -> None:
        """Apply one cycle's decisions: GPUs come back (preempt, shrink) before they are handed out."""
        for key in decided.preempt:
            self._stop(key)
            self.preemptions += 1
        for key, resize in (*decided.shrink.items(), *decided.grow.items()):
            self._stop(key)
            self._start(key, resize.allocation)
            self.resizes += 1
        for key, allocation in decided.place.items():
            if key in self.runs:
                raise SimulationError(f"{self.policy.name}: placed {key}, which is already running")
            self._start(key, allocation)

    def _time_left(self, key: str) -> float:
        """Seconds the running job still needs on its allocation (a restart's delay included)."""
        run = self.runs[key]
        done = run.rate * max(0.0, self.now - run.progress_from)
        return max(0.0, run.progress_from - self.now) + max(0.0, self.remaining[key] - done) / run.rate

    def _known(self, key: str) -> JobRequest:
        """The job as the policy sees it: speeds from `knowledge`; time left once its run is measured
        (the ETA the operator reads from the job's status), at once for the oracle."""
        request = self.requests[key]
        known = self.knowledge.profile(self.jobs[key])
        if known is not request.profile:
            request = replace(request, profile=known)
        run = self.runs.get(key)
        if run is not None and (run.measured or self.knowledge.oracle):
            return replace(request, remaining_s=self._time_left(key))
        return request

    def _cycle(self) -> Decisions:
        for key in self.runs:
            self._measure(key)
        jobs = tuple(self._known(key) for key in self.active)
        queues = tuple(replace(q, usage=self.usage[q.name]) for q in self.options.queues)
        snapshot = Snapshot(self.cluster.classes, self.cluster.nodes, jobs, now=self.now, queues=queues)
        self.cycles += 1
        decided = self.policy.decide(snapshot)
        self._apply(decided)
        return decided

    # --- event loop ------------------------------------------------------------------------------

    def _next_finish(self) -> float:
        while self.finishes:
            top = self.finishes[0]
            if top.version == self.version[top.key] and top.key in self.runs:
                return top.time
            heapq.heappop(self.finishes)
        return math.inf

    def run(self) -> SimulationResult:
        started = time.perf_counter()
        next_arrival = 0
        cycle_at: float | None = None
        last_cycle = -math.inf
        round_s = self.policy.round_s
        while True:
            arrival_at = (
                self.arrivals[next_arrival].trace.arrival_s if next_arrival < len(self.arrivals) else math.inf
            )
            moment = min(arrival_at, self._next_finish(), math.inf if cycle_at is None else cycle_at)
            if moment == math.inf:
                break
            self._advance(moment)
            changed = False
            while next_arrival < len(self.arrivals) and self.arrivals[next_arrival].trace.arrival_s <= moment:
                job = self.arrivals[next_arrival]
                self.active[job.key] = None
                self.requests[job.key] = job.request
                next_arrival += 1
                changed = True
            while self._next_finish() <= moment:
                self._complete(heapq.heappop(self.finishes).key)
                changed = True
            idle_round = False
            if cycle_at is not None and cycle_at <= moment:
                cycle_at = None
                last_cycle = moment
                decided = self._cycle()
                changed = bool(decided.preempt or decided.shrink)
                idle_round = not (decided.place or decided.preempt or decided.shrink or decided.grow)
            self._record()
            if not self.active:
                continue
            if round_s is None:
                if changed and cycle_at is None:
                    cycle_at = max(moment, last_cycle + self.options.cycle_interval_s)
                continue
            if idle_round and not self.runs and next_arrival == len(self.arrivals):
                break  # a round left every waiting job waiting and nothing else will happen
            if cycle_at is None:
                cycle_at = (
                    moment
                    if last_cycle == -math.inf
                    else last_cycle + round_s * max(1, math.ceil((moment - last_cycle) / round_s - 1e-9))
                )
        self._check_all_finished()
        self._record()
        return SimulationResult(
            policy=self.policy.name,
            outcomes=list(self.outcomes.values()),
            capacity=self.cluster.gpus_per_class(),
            busy_gpu_seconds=dict(self.busy),
            timeline=self.timeline,
            cycles=self.cycles,
            preemptions=self.preemptions,
            resizes=self.resizes,
            wall_seconds=time.perf_counter() - started,
        )

    def _check_all_finished(self) -> None:
        stuck = [self.jobs[key].trace.job_id for key in self.active]
        if stuck:
            raise SimulationError(
                f"{self.policy.name}: {len(stuck)} job(s) can never start on this cluster "
                f"(e.g. {', '.join(stuck[:3])}); check gpus_min against the GPUs of the classes they fit"
            )


def simulate(
    cluster: Cluster,
    trace: Sequence[TraceJob],
    policy: SchedulingPolicy,
    options: EngineOptions | None = None,
    on_finish: Callable[[int, int], None] | None = None,
) -> SimulationResult:
    """Run ``policy`` over ``trace`` on ``cluster``; ``on_finish(done, total)`` after each completion."""
    return Simulation(cluster, trace, policy, options, on_finish).run()
