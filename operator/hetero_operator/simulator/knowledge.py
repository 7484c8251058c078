"""What the scheduling policies know of each job's speed on each GPU class.

Every policy sees a job through the `JobRequest` the engine puts in its snapshot, and the engine
takes the request's ``profile`` (measured per-class speeds) from one `Knowledge`, so no policy,
baselines included, can see more than another. Two modes:

- ``measured`` (the default): what the operator knows. A job nobody has measured has no profile,
  and the scheduler predicts it from the priors (`PriorModel` on each class's relativeSpeed). Once a
  run has trained ``measure_after_s`` on its GPUs (its first epoch: the rebalancer measures a job
  between epochs), the classes it ran on are measured: the job keeps its own measurement (as
  ``status.measured``) and the catalog records it under the job's workload key and strategy (as
  `controller.catalog.observe` does: the job's newest observation replaces its earlier one, the
  latest ``MAX_OBSERVATIONS`` jobs are kept, each term is their recency-weighted median). A job goes
  by its own measurement, else by its key's estimate (`controller.catalog.known_profile`); a class
  neither has measured is estimated from a measured one by the priors' ratio (the scheduler's own
  rule, `scheduler.throughput`).
- ``oracle``: every job's true profile from its arrival (the simulator before it had knowledge).

Only decisions go by this: a job's progress in the engine always follows its true speeds.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from hetero_operator.controller.catalog import DEFAULT_HALF_LIFE_HOURS, weighted_median
from hetero_operator.resources.workload_profile import MAX_OBSERVATIONS
from hetero_operator.scheduler import ClassProfile, MeasuredProfile
from hetero_operator.simulator.jobs import JobSetupError, SimJob

# An epoch's length is not in a trace: five minutes of training stands for the first epoch after
# which the rebalancer has a measurement (every worker past its minimum steps).
MEASURE_AFTER_S = 300.0


class KnowledgeMode(StrEnum):
    MEASURED = "measured"
    ORACLE = "oracle"


@dataclass(frozen=True, slots=True)
class KnowledgeSettings:
    """``noise``: standard deviation of the log of a measured speed over the true one (0: exact),
    drawn per job, class and measurement from ``seed``."""

    mode: KnowledgeMode = KnowledgeMode.MEASURED
    measure_after_s: float = MEASURE_AFTER_S
    noise: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.measure_after_s) and self.measure_after_s >= 0):
            raise ValueError(f"measure_after_s: must be a finite number >= 0, got {self.measure_after_s}")
        if not (math.isfinite(self.noise) and self.noise >= 0):
            raise ValueError(f"noise: must be a finite number >= 0, got {self.noise}")


@dataclass(frozen=True, slots=True)
class Observation:
    """One job's measurement: per class, its model and the GPUs that measured it; when it was taken."""

    job: str
    at_s: float
    classes: tuple[tuple[str, ClassProfile, int], ...]
    t_o_ms: float
    t_u_ms: float

    def profile(self) -> MeasuredProfile:
        return MeasuredProfile.from_mapping({c: p for c, p, _ in self.classes}, self.t_o_ms, self.t_u_ms)


def scaled(profile: ClassProfile, speed_factor: float) -> ClassProfile:
    """The class model of a GPU ``speed_factor`` times as fast."""
    return ClassProfile(
        profile.alpha_ms / speed_factor,
        profile.beta_ms / speed_factor,
        profile.alpha_sync_ms / speed_factor,
        profile.beta_sync_ms / speed_factor,
    )


def recency(at_s: float, now_s: float) -> float:
    """An observation's weight: halves every `DEFAULT_HALF_LIFE_HOURS` of its age (the catalog's)."""
    age_hours = max(now_s - at_s, 0.0) / 3600.0
    return math.pow(0.5, age_hours / DEFAULT_HALF_LIFE_HOURS)


_TERMS = ("alpha_ms", "beta_ms", "alpha_sync_ms", "beta_sync_ms")


def estimate(observations: Sequence[Observation], now_s: float) -> MeasuredProfile | None:
    """Each class's terms and the all-reduce times, each the weighted median over the observations
    that measured it (weight: recency times the GPUs that measured the class)."""
    if not observations:
        return None
    weights = [recency(o.at_s, now_s) for o in observations]
    by_class: dict[str, list[tuple[ClassProfile, float]]] = {}
    for observation, weight in zip(observations, weights, strict=True):
        for name, profile, gpus in observation.classes:
            by_class.setdefault(name, []).append((profile, weight * gpus))
    per_class = {
        name: ClassProfile(*(weighted_median((getattr(p, t), w) for p, w in entries) for t in _TERMS))
        for name, entries in by_class.items()
    }
    pairs = list(zip(observations, weights, strict=True))
    return MeasuredProfile.from_mapping(
        per_class,
        weighted_median((o.t_o_ms, w) for o, w in pairs),
        weighted_median((o.t_u_ms, w) for o, w in pairs),
    )


@dataclass(slots=True)
class Knowledge:
    """The one source of every job's profile in the policies' snapshots; see the module's text."""

    settings: KnowledgeSettings = field(default_factory=KnowledgeSettings)
    _own: dict[str, MeasuredProfile] = field(default_factory=dict)
    _observations: dict[tuple[str, str], list[Observation]] = field(default_factory=dict)
    _estimates: dict[tuple[str, str], MeasuredProfile] = field(default_factory=dict)

    @property
    def oracle(self) -> bool:
        return self.settings.mode is KnowledgeMode.ORACLE

    def profile(self, job: SimJob) -> MeasuredProfile | None:
        """What the policies may know of ``job``'s speeds now."""
        if self.oracle:
            return job.request.profile
        own = self._own.get(job.key)
        return own if own is not None else self._estimates.get(catalog_key(job))

    def observe(self, job: SimJob, gpus_per_class: Mapping[str, int], at_s: float) -> None:
        """``job`` measured itself at ``at_s`` on ``gpus_per_class``: its own measurement and its
        key's catalog entry take it in."""
        truth = job.request.profile
        if truth is None:
            raise ValueError(f"jobs[{job.key}].profile: the simulator needs a true profile to measure")
        true_classes = dict(truth.per_class)
        classes = tuple(
            (name, scaled(true_classes[name], self._noise(job.key, name, at_s)), gpus)
            for name, gpus in sorted(gpus_per_class.items())
            if gpus > 0
        )
        observation = Observation(job.key, at_s, classes, truth.t_o_ms, truth.t_u_ms)
        self._own[job.key] = observation.profile()
        key = catalog_key(job)
        earlier = [o for o in self._observations.get(key, []) if o.job != job.key]
        kept = [*earlier, observation][-MAX_OBSERVATIONS:]
        self._observations[key] = kept
        found = estimate(kept, at_s)
        if found is not None:
            self._estimates[key] = found

    def _noise(self, job: str, gpu_class: str, at_s: float) -> float:
        if self.settings.noise == 0:
            return 1.0
        draw = random.Random(f"{self.settings.seed}/{job}/{gpu_class}/{at_s!r}")
        return math.exp(draw.gauss(0.0, self.settings.noise))


def catalog_key(job: SimJob) -> tuple[str, str]:
    """The catalog's key: the workload and the way it runs (a pipeline measures stages, not models)."""
    return job.trace.workload_key, job.request.strategy.value


def check_workload_models(jobs: Sequence[SimJob]) -> None:
    """A workload key names one model: what the catalog measured of it is that model's speed."""
    models: dict[str, str] = {}
    for job in jobs:
        key = job.trace.workload_key
        if models.setdefault(key, job.model.name) != job.model.name:
            raise JobSetupError(
                f"job {job.trace.job_id}: workload {key!r} runs model {models[key]} in an earlier row, "
                f"{job.model.name} here; one workload key is one model"
            )
