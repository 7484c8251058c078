"""What a runtime benchmark phase shows, as pure functions: the speeds the workers really had, how far
their ratios are from the claimed ones, the speed-up those speeds allow, and whether the run holds.

A worker's achieved speed in a phase is its samples per second of compute (local batch ÷ mean
compute time of a step). With speeds v_i, an even split of B samples over n workers takes
B / (n · min v) per step and a split proportional to speed B / Σ v, so the ideal speed-up of a
balanced split over the even one is Σ v / (n · min v): 7/3 for 1 : 0.5 : 0.25.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RATIO_TOLERANCE = 0.05  # achieved speed ratios more than 5% off the claimed ones: the run fails
EFFICIENCY_TARGET = 0.95
SPEEDUP_OF_IDEAL_TARGET = 0.95
ABOVE_IDEAL_TOLERANCE = 0.02  # a speed-up this far above what the speeds allow is a broken measurement


def achieved_speeds(local_batches: Sequence[int], compute_seconds: Sequence[float]) -> list[float]:
    """Samples per second of compute of each worker (a worker with no samples has no measured speed:
    0)."""
    return [b / t if b > 0 and t > 0 else 0.0 for b, t in zip(local_batches, compute_seconds, strict=True)]


def ratios(speeds: Sequence[float]) -> list[float]:
    """Speeds relative to the first worker's."""
    return [s / speeds[0] for s in speeds]


def ratio_deviation(speeds: Sequence[float], claimed: Sequence[float]) -> float:
    """The largest relative gap between an achieved and a claimed speed ratio (first worker = 1)."""
    got, want = ratios(speeds), ratios(claimed)
    return max(abs(g / w - 1.0) for g, w in zip(got, want, strict=True))


def ideal_speedup(balanced_speeds: Sequence[float], even_speeds: Sequence[float]) -> float:
    """The speed-up of a perfectly balanced split over the even split, given the speeds each had."""
    return sum(balanced_speeds) / (len(even_speeds) * min(even_speeds))


def ideal_over_split(
    balanced_speeds: Sequence[float], split: Sequence[int], speeds: Sequence[float]
) -> float:
    """The speed-up a perfectly balanced split at `balanced_speeds` allows over `split` run at
    `speeds` (each worker's samples/s of compute; a worker given no samples does not count): the
    balanced rate, sum of speeds, over the split's, its samples over its slowest worker's time."""
    busiest = max(b / v for b, v in zip(split, speeds, strict=True) if b > 0)
    return sum(balanced_speeds) * busiest / sum(split)


# Host drift: the two even phases (before and after the balanced one) may differ by at most this
# much, or the host changed speed under the run and the comparison between phases is not fair.
DRIFT_LIMIT = 0.05


def drift_problem(even_rate: float, even_again_rate: float) -> tuple[float, str | None]:
    """The host's drift between the two even phases, and why the run is invalid if it is too large."""
    drift = even_again_rate / even_rate - 1.0
    if abs(drift) <= DRIFT_LIMIT:
        return drift, None
    return drift, f"the host drifted {drift:+.1%} between the two even phases (limit {DRIFT_LIMIT:.0%})"


OF_IDEAL_TARGET = 0.9  # the balanced split reaches at least this share of the ideal over each baseline


def baseline_comparison(
    balanced_rate: float,
    balanced_speeds: Sequence[float],
    rate: float,
    split: Sequence[int],
    speeds: Sequence[float],
) -> dict[str, Any]:
    """The balanced run against one baseline run of the same job: its speed-up, the ideal the
    measured speeds allow over the baseline's split, and the share of that ideal reached."""
    ideal = ideal_over_split(balanced_speeds, split, speeds)
    speedup = balanced_rate / rate
    return {
        "local_batches": list(split),
        "samples_per_s": rate,
        "speedup": speedup,
        "ideal_speedup": ideal,
        "of_ideal": speedup / ideal,
        "target_met": speedup / ideal >= OF_IDEAL_TARGET,
        "above_ideal": speedup > ideal * (1 + ABOVE_IDEAL_TOLERANCE),
    }


@dataclass(frozen=True)
class Verdict:
    speeds_held: bool  # every measured phase within RATIO_TOLERANCE of the claimed ratios
    above_ideal: bool  # the speed-up exceeds what the achieved speeds allow: a broken measurement
    efficiency_met: bool
    speedup_met: bool
    reasons: tuple[str, ...]

    @property
    def valid(self) -> bool:
        return self.speeds_held and not self.above_ideal

    @property
    def targets_met(self) -> bool:
        return self.valid and self.efficiency_met and self.speedup_met


def judge(phase_deviations: dict[str, float], speedup: float, ideal: float, efficiency: float) -> Verdict:
    """The run's verdict from each phase's ratio deviation and the headline figures."""
    reasons = [
        f"phase {name}: achieved speed ratios {deviation:.1%} off the claimed ones (limit "
        f"{RATIO_TOLERANCE:.0%}): the host did not give the simulated speeds"
        for name, deviation in phase_deviations.items()
        if deviation > RATIO_TOLERANCE
    ]
    above = speedup > ideal * (1 + ABOVE_IDEAL_TOLERANCE)
    if above:
        reasons.append(f"speed-up {speedup:.3f} exceeds the {ideal:.3f} the achieved speeds allow")
    return Verdict(
        speeds_held=all(d <= RATIO_TOLERANCE for d in phase_deviations.values()),
        above_ideal=above,
        efficiency_met=efficiency >= EFFICIENCY_TARGET,
        speedup_met=speedup >= SPEEDUP_OF_IDEAL_TARGET * ideal,
        reasons=tuple(reasons),
    )


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    return None


def machine(gpus: Sequence[str] = ()) -> dict[str, Any]:
    """The machine a run measured, for the artifact and the table."""
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "memory_gib": _memory_gib(),
        "gpus": list(gpus),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }


def machine_label(info: dict[str, Any]) -> str:
    gpus = ", ".join(info.get("gpus") or []) or "no GPU"
    return f"{info['cores']} cores ({info['cpu']}), {info['memory_gib']} GiB, {gpus}"
