"""Mixed precision under one contract for the whole job: `spec.precision` auto | fp32 | bf16 | fp16.

Each rank computes in the format its device does best; what the ranks exchange must carry one scale.
So the job's precision is decided once, from every rank's device (gathered when the workers join, see
`worker_session`), by the same pure function on every rank (`job_precision`):

- `data` (the runtime's loop, and a script's `HeteroModel`): auto gives bf16 on a GPU that has it
  (A100, H100), fp16 on one that has not (V100, T4) and fp32 on a CPU. If any rank computes in fp16,
  every rank scales its loss by one job-wide loss scale (the same GradScaler settings everywhere, its
  bf16 and fp32 ranks included). The weighted all-reduce then sums gradients that all carry that
  scale, every rank unscales the same sum by the same scale, and an overflow on any rank is an
  overflow in every rank's sum: every rank skips that step and halves its scale, together.
- `esync`, `dreamddp`, `sesgd`: each rank steps on its own gradient and the ranks average fp32
  parameters, so ranks in bf16 and fp32 mix freely. fp16, whose loss scale would then be each
  rank's own, is not offered: auto picks fp32 on a GPU without bf16.
- `hetpipe`: stages hand activations and their gradients to each other, so the whole job computes in
  one format: auto gives bf16 if every rank has it (GPUs only), else fp32; fp16 is not offered.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hetero_operator.plan import PRECISION_ENV, Precision, Strategy

log = logging.getLogger(__name__)

_DTYPES = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}
BF16_MIN_COMPUTE_CAPABILITY = 8  # Ampere: A100, A10, L4, H100 (a V100 is 7.0, a T4 7.5)

# The job-wide loss scaler: the same settings on every rank, so that ranks which take the same
# decisions (they do: they all see the same summed gradient) keep the same scale. torch's defaults.
INITIAL_LOSS_SCALE = 2.0**16
LOSS_SCALE_GROWTH_FACTOR = 2.0
LOSS_SCALE_BACKOFF_FACTOR = 0.5
LOSS_SCALE_GROWTH_INTERVAL = 2000


class PrecisionError(ValueError):
    """The requested precision cannot run on some rank's device or under the job's strategy."""


@dataclass(frozen=True)
class RankFacts:
    """What the precision contract needs to know of one rank: its device, and the precision it was
    asked for (spec.precision: the same on every rank of a job the operator starts)."""

    type: str  # cpu | cuda
    has_bf16: bool
    name: str = ""
    requested: Precision = Precision.AUTO

    def describe(self) -> str:
        return f"{self.type} ({self.name})" if self.name else self.type


def device_has_bf16(device: torch.device) -> bool:
    """bf16 in hardware: any CPU (autocast supports it), a GPU from compute capability 8.0. Not
    `torch.cuda.is_bf16_supported()`, which also answers yes for a slow emulation on older GPUs."""
    if device.type != "cuda":
        return True
    return torch.cuda.get_device_capability(device)[0] >= BF16_MIN_COMPUTE_CAPABILITY


def rank_facts(device: torch.device, requested: Precision) -> RankFacts:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    return RankFacts(device.type, device_has_bf16(device), name, requested)


def resolve_precision(
    requested: Precision, device_type: str, has_bf16: bool, strategy: Strategy
) -> Precision:
    """The format one rank computes in under `data` or a local-step strategy; raises PrecisionError
    naming the setting and the fix."""
    if requested is Precision.AUTO:
        if device_type != "cuda":
            return Precision.FP32
        if has_bf16:
            return Precision.BF16
        return Precision.FP16 if strategy is Strategy.DATA else Precision.FP32
    if requested is Precision.BF16 and not has_bf16:
        raise PrecisionError(
            f"{PRECISION_ENV}=bf16 (spec.precision): this GPU has no bf16 (compute capability < 8.0): "
            "use fp16, fp32 or auto"
        )
    if requested is Precision.FP16 and strategy is not Strategy.DATA:
        raise PrecisionError(
            f"{PRECISION_ENV}=fp16 (spec.precision) needs loss scaling, which the {strategy.value} strategy "
            "does not synchronise: use bf16, fp32 or auto, or the data strategy"
        )
    return requested


@dataclass(frozen=True)
class JobPrecision:
    """Every rank's format, and whether all of them scale their loss by the job-wide loss scale."""

    ranks: tuple[Precision, ...]
    loss_scaled: bool

    def describe(self) -> str:
        formats = ", ".join(f"rank {r} {p.value}" for r, p in enumerate(self.ranks))
        return f"{formats}; {'one job-wide loss scale' if self.loss_scaled else 'no loss scaling'}"


def job_precision(ranks: Sequence[RankFacts], strategy: Strategy) -> JobPrecision:
    """The job's precision from every rank's device and request (the same answer on every rank);
    raises PrecisionError naming the rank whose device cannot take the requested format."""
    if strategy is Strategy.HETPIPE:
        return _one_format(ranks)
    formats = []
    for rank, facts in enumerate(ranks):
        try:
            formats.append(resolve_precision(facts.requested, facts.type, facts.has_bf16, strategy))
        except PrecisionError as error:
            raise PrecisionError(f"rank {rank} on {facts.describe()}: {error}") from None
    return JobPrecision(tuple(formats), loss_scaled=Precision.FP16 in formats)


def _one_format(ranks: Sequence[RankFacts]) -> JobPrecision:
    """hetpipe: one format on every rank, since stages exchange activations and their gradients:
    bf16 where every rank asks for it (or for auto on a GPU with bf16), else fp32."""
    for rank, facts in enumerate(ranks):
        if facts.requested is Precision.FP16:
            raise PrecisionError(
                f"rank {rank}: {PRECISION_ENV}=fp16 (spec.precision) needs loss scaling, which the hetpipe "
                "strategy does not synchronise: use bf16, fp32 or auto"
            )
        if facts.requested is Precision.BF16 and not facts.has_bf16:
            raise PrecisionError(
                f"rank {rank} on {facts.describe()}: {PRECISION_ENV}=bf16 (spec.precision): this GPU has no "
                "bf16: use fp32 or auto"
            )
    wants_bf16 = [
        facts.requested is Precision.BF16
        or (facts.requested is Precision.AUTO and facts.type == "cuda" and facts.has_bf16)
        for facts in ranks
    ]
    chosen = Precision.BF16 if all(wants_bf16) else Precision.FP32
    return JobPrecision(tuple(chosen for _ in ranks), loss_scaled=False)


def job_loss_scaler(device_type: str) -> torch.amp.GradScaler:
    """A GradScaler with the job-wide settings (every rank builds the same one)."""
    return torch.amp.GradScaler(
        device_type,
        init_scale=INITIAL_LOSS_SCALE,
        growth_factor=LOSS_SCALE_GROWTH_FACTOR,
        backoff_factor=LOSS_SCALE_BACKOFF_FACTOR,
        growth_interval=LOSS_SCALE_GROWTH_INTERVAL,
    )


class MixedPrecision:
    """Autocast for the forward pass in this rank's format and, when the job scales its loss, the
    job-wide loss scaler, whose steps every rank takes alike."""

    def __init__(self, precision: Precision, device: torch.device, loss_scaled: bool | None = None) -> None:
        if precision is Precision.AUTO:
            raise ValueError("resolve `auto` with job_precision() first")
        self.precision = precision
        self.device_type = device.type
        self.dtype = _DTYPES.get(precision)
        scaled = precision is Precision.FP16 if loss_scaled is None else loss_scaled
        self.scaler = job_loss_scaler(device.type) if scaled else None
        self.skipped_steps = 0

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.dtype is None:
            yield
            return
        with torch.autocast(self.device_type, dtype=self.dtype):
            yield

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    @property
    def loss_scale(self) -> float:
        """The factor the gradients carry until the step unscales them (1 without a scaler)."""
        return float(self.scaler.get_scale()) if self.scaler is not None else 1.0

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Unscale, step unless a gradient overflowed, adapt the scale; True when the step was taken.

        The scaler halves its scale exactly when it skipped, so comparing the scale before and after
        tells a skip without reaching into the scaler's internals."""
        if self.scaler is None:
            optimizer.step()
            return True
        before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        taken = self.scaler.get_scale() >= before
        if not taken:
            self.skipped_steps += 1
            log.info("loss scaling: a gradient overflowed at loss scale %g; step skipped", before)
        return taken

    def state_dict(self) -> dict[str, Any]:
        return {"precision": self.precision.value, "scaler": self.scaler.state_dict() if self.scaler else {}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The job-wide scaler's state, whatever format the saving rank computed in (rank 0's state is
        every rank's on a resume)."""
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


def rank_mixed_precision(job: JobPrecision, rank: int, device: torch.device) -> MixedPrecision:
    return MixedPrecision(job.ranks[rank], device, job.loss_scaled)
