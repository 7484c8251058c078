"""Pipeline partitioning of a layer sequence over the GPUs of one virtual worker (HetPipe).

Every GPU gets a non-empty contiguous range of layers. Stage q's time is its layers' compute time
at the GPU's speed plus receiving activations (forward) and gradients (backward) from its
neighbours; its memory holds weights, gradients and optimizer state plus one stashed weight
version and one set of activations per in-flight minibatch: ``m_q = nm`` except ``m = 1`` on the
last stage. The objective is the bottleneck (largest stage time).

For a fixed GPU order an exact DP over (stage, prefix) solves it in O(k L^2); orders are searched
depth-first with shared prefixes, skipping orders that only swap interchangeable GPUs (same speed,
memory and node) and pruning prefixes that cannot beat the best bottleneck found.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from hetero_operator.planner.errors import PlanningError

FloatArray = NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Layer:
    time_ms: float  # at speed 1.0
    activation_mb: float  # sent to the next stage when this layer ends a stage
    param_mb: float
    stash_mb: float  # activations kept per in-flight minibatch


@dataclass(frozen=True, slots=True)
class Gpu:
    name: str
    speed: float
    memory_mb: float
    node: str


@dataclass(frozen=True, slots=True)
class Link:
    latency_ms: float
    mb_per_ms: float

    def time_ms(self, mb: float | FloatArray) -> float | FloatArray:
        return self.latency_ms + mb / self.mb_per_ms


@dataclass(frozen=True, slots=True)
class Links:
    same_node: Link
    cross_node: Link

    def between(self, a: Gpu, b: Gpu) -> Link:
        return self.same_node if a.node == b.node else self.cross_node


@dataclass(frozen=True, slots=True)
class PipelinePlan:
    order: tuple[str, ...]
    stages: tuple[tuple[int, ...], ...]
    stage_ms: tuple[float, ...]
    bottleneck_ms: float
    memory_mb: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class _Prefix:
    """Prefix sums over layers, index j = first j layers."""

    time: FloatArray
    params: FloatArray
    stash: FloatArray
    act: FloatArray  # act[j] = activation of layer j-1 (the last layer of a stage ending at j)

    @staticmethod
    def build(layers: Sequence[Layer]) -> _Prefix:
        def cum(values: list[float]) -> FloatArray:
            return np.concatenate(([0.0], np.cumsum(np.asarray(values, dtype=np.float64))))

        act = np.concatenate(([0.0], np.asarray([x.activation_mb for x in layers], dtype=np.float64)))
        return _Prefix(
            time=cum([x.time_ms for x in layers]),
            params=cum([x.param_mb for x in layers]),
            stash=cum([x.stash_mb for x in layers]),
            act=act,
        )


def stage_memory_mb(layers: Sequence[Layer], in_flight: int) -> float:
    """Memory of one stage holding ``in_flight`` minibatches: (2+m)*params + m*stash."""
    params = sum(x.param_mb for x in layers)
    stash = sum(x.stash_mb for x in layers)
    return (2 + in_flight) * params + in_flight * stash


def _stage_matrix(
    pre: _Prefix,
    gpu: Gpu,
    in_link: Link | None,
    out_link: Link | None,
    in_flight: int,
) -> FloatArray:
    """T[i, j]: time of this stage holding layers [i, j) (inf where empty or out of memory)."""
    n = pre.time.size
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    with np.errstate(invalid="ignore"):
        t = (pre.time[None, :] - pre.time[:, None]) / gpu.speed
        if in_link is not None:
            t = t + np.asarray(in_link.time_ms(pre.act), dtype=np.float64)[:, None]
        if out_link is not None:
            t = t + np.asarray(out_link.time_ms(pre.act), dtype=np.float64)[None, :]
        mem = (2 + in_flight) * (pre.params[None, :] - pre.params[:, None]) + in_flight * (
            pre.stash[None, :] - pre.stash[:, None]
        )
    bad = (j <= i) | (mem > gpu.memory_mb * (1 + 1e-12))
    return np.where(bad, np.inf, t)


def _in_flight(stage: int, stages: int, nm: int) -> int:
    return 1 if stage == stages - 1 else nm


def _dp_step(best_prev: FloatArray, matrix: FloatArray) -> tuple[FloatArray, NDArray[np.int64]]:
    """f[j] = min_i max(f_prev[i], T[i, j]), with the smallest argmin i."""
    cand = np.maximum(best_prev[:, None], matrix)
    arg = np.argmin(cand, axis=0)
    return cand[arg, np.arange(cand.shape[1])], arg


def _class_key(gpu: Gpu) -> tuple[float, float, str]:
    return (gpu.speed, gpu.memory_mb, gpu.node)


def partition_pipeline(
    layers: Sequence[Layer],
    gpus: Sequence[Gpu],
    nm: int,
    links: Links,
    *,
    fixed_order: bool = False,
) -> PipelinePlan:
    """Minimum-bottleneck partition (and GPU order unless ``fixed_order``); exact.

    Ties: the first order in the GPUs' listed order (lexicographic over interchangeable classes),
    then the earliest cuts. Raises ``PlanningError`` naming the failing limit when nothing fits.
    """
    k, n_layers = len(gpus), len(layers)
    if k == 0:
        raise PlanningError("gpus: at least one GPU is needed")
    if n_layers < k:
        raise PlanningError(f"layers: {n_layers} layers cannot give each of {k} GPUs a non-empty stage")
    if nm < 1:
        raise PlanningError("nm: must be at least 1")
    pre = _Prefix.build(layers)
    search = _OrderSearch(pre, list(gpus), nm, links)
    if fixed_order:
        search.evaluate(list(range(k)))
    else:
        search.run()
    if search.best_order is None:
        raise PlanningError(_explain_infeasible(layers, gpus, nm))
    return _build_plan(layers, gpus, nm, links, search.best_order, search.best_cuts)


class _OrderSearch:
    """Depth-first search over distinct GPU orders with prefix-shared DP rows."""

    def __init__(self, pre: _Prefix, gpus: list[Gpu], nm: int, links: Links) -> None:
        self.pre, self.gpus, self.nm, self.links = pre, gpus, nm, links
        self.k = len(gpus)
        self.n = pre.time.size - 1
        self.best = math.inf
        self.best_order: list[int] | None = None
        self.best_cuts: list[int] = []
        keys: list[tuple[float, float, str]] = []
        self.members: dict[tuple[float, float, str], list[int]] = {}
        for idx, gpu in enumerate(gpus):
            key = _class_key(gpu)
            if key not in self.members:
                keys.append(key)
                self.members[key] = []
            self.members[key].append(idx)
        self.keys = keys

    def _start(self) -> FloatArray:
        f = np.full(self.n + 1, np.inf)
        f[0] = 0.0
        return f

    def _row(
        self, stage: int, prev: int | None, cur: int, nxt: int | None, f_prev: FloatArray
    ) -> tuple[FloatArray, NDArray[np.int64]]:
        g = self.gpus
        in_link = None if prev is None else self.links.between(g[prev], g[cur])
        out_link = None if nxt is None else self.links.between(g[cur], g[nxt])
        matrix = _stage_matrix(self.pre, g[cur], in_link, out_link, _in_flight(stage, self.k, self.nm))
        f, arg = _dp_step(f_prev, matrix)
        # Stage `stage` must leave at least one layer for each later stage.
        f[self.n - (self.k - 1 - stage) + 1 :] = np.inf
        return f, arg

    def evaluate(self, order: list[int]) -> None:
        f = self._start()
        args = []
        for q, cur in enumerate(order):
            prev = order[q - 1] if q > 0 else None
            nxt = order[q + 1] if q + 1 < self.k else None
            f, arg = self._row(q, prev, cur, nxt, f)
            args.append(arg)
        self._offer(order, f, args)

    def _offer(self, order: list[int], f: FloatArray, args: list[NDArray[np.int64]]) -> None:
        value = float(f[self.n])
        if value < self.best:
            self.best = value
            self.best_order = list(order)
            cuts = [self.n]
            for arg in reversed(args):
                cuts.append(int(arg[cuts[-1]]))
            self.best_cuts = cuts[::-1]

    def run(self) -> None:
        remaining = {key: len(v) for key, v in self.members.items()}
        used = {key: 0 for key in self.keys}
        order: list[int] = []
        args: list[NDArray[np.int64]] = []

        def descend(f_done: FloatArray) -> None:
            # f_done covers stages 0..len(order)-2; the last chosen GPU's stage awaits its successor.
            if float(np.min(f_done)) >= self.best:
                return
            if len(order) == self.k:
                q = self.k - 1
                prev = order[q - 1] if q > 0 else None
                f, arg = self._row(q, prev, order[q], None, f_done)
                self._offer(order, f, [*args, arg])
                return
            for key in self.keys:
                if remaining[key] == 0:
                    continue
                nxt = self.members[key][used[key]]
                remaining[key] -= 1
                used[key] += 1
                if order:
                    q = len(order) - 1
                    prev = order[q - 1] if q > 0 else None
                    f, arg = self._row(q, prev, order[q], nxt, f_done)
                    args.append(arg)
                    order.append(nxt)
                    descend(f)
                    order.pop()
                    args.pop()
                else:
                    order.append(nxt)
                    descend(f_done)
                    order.pop()
                remaining[key] += 1
                used[key] -= 1

        descend(self._start())


def _build_plan(
    layers: Sequence[Layer],
    gpus: Sequence[Gpu],
    nm: int,
    links: Links,
    order: list[int],
    cuts: list[int],
) -> PipelinePlan:
    stages = tuple(tuple(range(cuts[q], cuts[q + 1])) for q in range(len(order)))
    times = stage_times(layers, [gpus[i] for i in order], stages, links)
    memory = tuple(
        stage_memory_mb([layers[i] for i in st], _in_flight(q, len(order), nm)) for q, st in enumerate(stages)
    )
    return PipelinePlan(
        order=tuple(gpus[i].name for i in order),
        stages=stages,
        stage_ms=times,
        bottleneck_ms=max(times),
        memory_mb=memory,
    )


def stage_times(
    layers: Sequence[Layer], ordered_gpus: Sequence[Gpu], stages: Sequence[Sequence[int]], links: Links
) -> tuple[float, ...]:
    """Time of every stage of a given partition (the contract's formula, written out directly)."""
    k = len(ordered_gpus)
    out = []
    for q, (gpu, stage) in enumerate(zip(ordered_gpus, stages, strict=True)):
        t = sum(layers[i].time_ms for i in stage) / gpu.speed
        if q > 0:
            t += float(links.between(ordered_gpus[q - 1], gpu).time_ms(layers[stage[0] - 1].activation_mb))
        if q < k - 1:
            t += float(links.between(gpu, ordered_gpus[q + 1]).time_ms(layers[stage[-1]].activation_mb))
        out.append(t)
    return tuple(out)


def _explain_infeasible(layers: Sequence[Layer], gpus: Sequence[Gpu], nm: int) -> str:
    biggest = max(g.memory_mb for g in gpus)
    for idx, layer in enumerate(layers):
        if stage_memory_mb([layer], 1) > biggest:
            return (
                f"memory_mb: layer {idx} alone needs {stage_memory_mb([layer], 1):g} MB "
                "even as the last stage "
                f"(in-flight 1), more than the largest GPU ({biggest:g} MB)"
            )
    total_cap = sum(g.memory_mb for g in gpus)
    need = stage_memory_mb(layers, 1)
    if need > total_cap:
        return f"memory_mb: the model needs at least {need:g} MB in total but the GPUs hold {total_cap:g} MB"
    return (
        f"memory_mb: no contiguous partition fits every GPU's memory with nm={nm} in-flight minibatches "
        "on the non-last stages; lower nm, add GPUs or use GPUs with more memory"
    )


def max_in_flight(
    layers: Sequence[Layer], gpus: Sequence[Gpu], links: Links, *, limit: int = 64, fixed_order: bool = False
) -> int:
    """Max_m: the largest nm (up to ``limit``) for which some partition fits; 0 if none does."""
    lo, hi = 0, limit
    while lo < hi:  # memory only grows with nm, so feasibility is monotone
        mid = (lo + hi + 1) // 2
        try:
            partition_pipeline(layers, gpus, mid, links, fixed_order=fixed_order)
            lo = mid
        except PlanningError:
            hi = mid - 1
    return lo


def choose_nm(
    virtual_workers: Sequence[Sequence[Gpu]], layers: Sequence[Layer], links: Links, *, limit: int = 64
) -> int:
    """One Nm for every virtual worker: the smallest that reaches the best predicted throughput.

    Each VW's throughput at nm is ``min(nm / sum(stage_ms), 1 / bottleneck_ms)`` (fill-limited,
    then bottleneck-limited); Nm cannot exceed the smallest Max_m. The slowest VW sets the pace,
    so the job's throughput at nm is that of its slowest VW.
    """
    cap = min(max_in_flight(layers, vw, links, limit=limit) for vw in virtual_workers)
    if cap == 0:
        raise PlanningError("memory_mb: some virtual worker cannot hold even one minibatch")
    best_nm, best_thr = 1, -1.0
    for nm in range(1, cap + 1):
        thr = math.inf
        for vw in virtual_workers:
            plan = partition_pipeline(layers, vw, nm, links)
            thr = min(thr, nm / sum(plan.stage_ms), 1.0 / plan.bottleneck_ms)
        if thr > best_thr * (1 + 1e-12):
            best_nm, best_thr = nm, thr
    return best_nm


def compute_only_cuts(layer_costs: Sequence[float], stage_speeds: Sequence[float], nm: int) -> list[int]:
    """Stage boundaries (each stage's first layer, the first stage's 0 left out) of the minimum-
    bottleneck partition of layers costing ``layer_costs`` over GPUs of ``stage_speeds`` in that
    order, when only compute counts (no memory limit, free links)."""
    if len(stage_speeds) == 1:
        return []
    layers = [Layer(time_ms=cost, activation_mb=0.0, param_mb=0.0, stash_mb=0.0) for cost in layer_costs]
    gpus = [
        Gpu(name=f"stage{i}", speed=speed, memory_mb=math.inf, node="local")
        for i, speed in enumerate(stage_speeds)
    ]
    free = Link(latency_ms=0.0, mb_per_ms=math.inf)
    plan = partition_pipeline(layers, gpus, nm, Links(free, free), fixed_order=True)
    return [stage[0] for stage in plan.stages[1:]]
