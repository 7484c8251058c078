"""The runtime benchmarks' arithmetic and reports: achieved speeds and their ratios, the ideal speed-up
they allow, the verdict, the worker layouts, and BENCHMARKS.md's Runtime section as the committed
artifacts render it."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
BENCHMARKS_MD = BENCH.parent / "BENCHMARKS.md"


def bench_module(name: str) -> ModuleType:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def fidelity() -> ModuleType:
    return bench_module("runtime_fidelity")


@pytest.fixture(scope="module")
def balance() -> ModuleType:
    return bench_module("runtime_balance")


def test_the_ideal_speedup_of_1_05_025_is_seven_thirds(fidelity: ModuleType) -> None:
    assert fidelity.ideal_speedup([1.0, 0.5, 0.25], [1.0, 0.5, 0.25]) == pytest.approx(7 / 3)
    # Equal speeds gain nothing from balancing.
    assert fidelity.ideal_speedup([2.0, 2.0], [2.0, 2.0]) == pytest.approx(1.0)


def test_achieved_speeds_and_their_distance_from_the_claim(fidelity: ModuleType) -> None:
    speeds = fidelity.achieved_speeds([400, 200, 100], [0.1, 0.1, 0.1])
    assert speeds == pytest.approx([4000, 2000, 1000])
    assert fidelity.ratios(speeds) == pytest.approx([1.0, 0.5, 0.25])
    assert fidelity.ratio_deviation(speeds, [1.0, 0.5, 0.25]) == pytest.approx(0.0)
    # The old undilated row's implied speeds, 1 : 0.39 : 0.18, are 22% and 28% off the claim.
    assert fidelity.ratio_deviation([1.0, 0.39, 0.18], [1.0, 0.5, 0.25]) == pytest.approx(0.28)
    assert fidelity.achieved_speeds([0, 10], [0.0, 0.5]) == [0.0, 20.0]


def test_the_verdict(fidelity: ModuleType) -> None:
    held = fidelity.judge({"even": 0.01, "data": 0.04}, speedup=2.25, ideal=7 / 3, efficiency=0.96)
    assert held.valid and held.targets_met and not held.reasons
    broken = fidelity.judge({"even": 0.01, "data": 0.08}, speedup=2.25, ideal=7 / 3, efficiency=0.96)
    assert not broken.speeds_held and not broken.valid and "phase data" in broken.reasons[0]
    above = fidelity.judge({"data": 0.0}, speedup=3.16, ideal=7 / 3, efficiency=0.96)
    assert above.above_ideal and not above.valid
    short = fidelity.judge({"data": 0.0}, speedup=2.0, ideal=7 / 3, efficiency=0.90)
    assert short.valid and not short.targets_met and not short.efficiency_met and not short.speedup_met


def phase(batches: list[int], speeds: list[float], samples_per_s: float) -> dict[str, Any]:
    return {
        "local_batches": batches,
        "worker_compute_ms": [1e3 * b / v for b, v in zip(batches, speeds, strict=True)],
        "samples_per_s": samples_per_s,
    }


def test_a_run_at_the_claimed_speeds_summarizes_to_the_known_figures(balance: ModuleType) -> None:
    """Speeds 4000 : 2000 : 1000 samples/s and batch 1050: even steps last 350 / 1000 s, balanced
    ones 1050 / 7000 s, so the speed-up is 7/3; a run at 96% of each rate is 96% efficient."""
    speeds = [4000.0, 2000.0, 1000.0]
    raw = {
        "solo": [{"local_batch": 350, "compute_s": 350 / v} for v in speeds],
        "even": phase([350, 350, 350], speeds, 3000.0 * 0.96),
        "data": phase([600, 300, 150], speeds, 7000.0 * 0.96),
        "even_again": phase([350, 350, 350], speeds, 3000.0 * 0.96),
    }
    summary = balance.summarize(raw, [1.0, 0.5, 0.25])
    assert summary["ideal_speedup"] == pytest.approx(7 / 3)
    assert summary["speedup_vs_even"] == pytest.approx(7 / 3)
    assert summary["efficiency"] == pytest.approx(0.96)
    assert summary["even_efficiency"] == pytest.approx(3000 * 0.96 / 7000)
    assert summary["valid"] and summary["targets_met"]
    assert max(summary["ratio_deviation"].values()) == pytest.approx(0.0)
    raw["data"] = phase([600, 300, 150], [4000.0, 2000.0, 800.0], 6000.0)  # the slow worker fell behind
    slower = balance.summarize(raw, [1.0, 0.5, 0.25])
    assert not slower["speeds_held"] and slower["ratio_deviation"]["data"] == pytest.approx(0.2)


def test_the_balanced_run_against_each_baseline_a_user_would_run(balance: ModuleType) -> None:
    """True speeds 4000 : 2000 : 600 samples/s, batch 1320: balanced steps last 1320 / 6600 s. The
    priors' 4 : 2 : 1 split is 754 / 377 / 189, whose steps wait 189 / 600 s on the slow worker; the
    fastest worker alone takes 1320 / 4000 s; the even split 440 / 600 s. The balanced run reaches 96%
    of its rate, the baselines all of theirs: 96% of each ideal."""
    speeds = [4000.0, 2000.0, 600.0]
    claimed = [1.0, 0.5, 0.15]
    raw = {
        "solo": [{"local_batch": 440, "compute_s": 440 / v} for v in speeds],
        "even": phase([440, 440, 440], speeds, 1320 / (440 / 600)),
        "data": phase([800, 400, 120], speeds, 6600 * 0.96),
        "prior": phase([754, 377, 189], speeds, 1320 / (189 / 600)),
        "even_again": phase([440, 440, 440], speeds, 1320 / (440 / 600)),
        "fastest_alone": {
            "local_batches": [1320, 0, 0],
            "worker_compute_ms": [1e3 * 1320 / 4000, 0.0, 0.0],
            "samples_per_s": 4000.0,
        },
    }
    baselines = balance.summarize(raw, claimed)["baselines"]
    assert baselines["prior"]["ideal_speedup"] == pytest.approx(6600 * (189 / 600) / 1320)
    assert baselines["fastest_alone"]["ideal_speedup"] == pytest.approx(6600 / 4000)
    assert baselines["even"]["ideal_speedup"] == pytest.approx(6600 / (3 * 600))
    for compared in baselines.values():
        assert compared["of_ideal"] == pytest.approx(0.96) and compared["target_met"]
    # The host slowed by 10% between the even phases: the run says so and is not valid.
    raw["even_again"] = phase([440, 440, 440], speeds, 0.9 * 1320 / (440 / 600))
    drifted = balance.summarize(raw, claimed)
    assert not drifted["valid"] and "drifted -10.0%" in drifted["problems"][-1]
    # A run faster than its speeds allow over the fastest worker alone is a broken measurement.
    raw["even_again"] = raw["even"]
    raw["fastest_alone"]["samples_per_s"] = 3000.0
    broken = balance.summarize(raw, claimed)
    assert broken["baselines"]["fastest_alone"]["above_ideal"] and not broken["valid"]


def test_simulated_gpus_share_a_core_while_their_load_fits_in_half_of_it(balance: ModuleType) -> None:
    assert balance.core_of_each_worker([0.25, 0.125, 0.0625], [0, 1]) == [0, 0, 0]
    assert balance.core_of_each_worker([1.0, 0.5, 0.25], [0, 1]) == [0, 1, 1]
    assert balance.core_of_each_worker([1.0, 0.5, 0.25], [0, 1, 2, 3]) == [0, 1, 2]
    assert balance.core_of_each_worker([1.0, 0.5], [3]) == [3, 3]


def test_workers_go_to_separate_physical_cores_before_hyper_thread_siblings(
    balance: ModuleType, tmp_path: Path
) -> None:
    for cpu, core in {0: 0, 1: 0, 2: 1, 3: 1}.items():  # two cores of two hyper-threads each
        where = tmp_path / f"cpu{cpu}" / "topology"
        where.mkdir(parents=True)
        (where / "physical_package_id").write_text("0\n")
        (where / "core_id").write_text(f"{core}\n")
    cores = balance.physical_cores_first([3, 2, 1, 0], tmp_path)
    assert cores == [3, 1, 2, 0]
    assert balance.core_of_each_worker([1.0, 0.5, 0.25], cores) == [3, 1, 2]
    # No topology to read: every CPU counts as a core of its own, in the order given.
    assert balance.physical_cores_first([5, 4], tmp_path / "missing") == [5, 4]


def test_real_hardware_workers_differ_or_say_they_cannot() -> None:
    real = bench_module("runtime_real_hetero")
    assert real.thread_counts(4, 3) == [2, 1]
    assert real.thread_counts(8, 3) == [4, 2, 1]
    gpu = real.plan_workers(1, list(range(16)), allow_small_host=False)
    assert [(p.device, p.threads) for p in gpu] == [("cuda:0", 1), ("cpu", 4), ("cpu", 2)]
    assert len({c for p in gpu for c in p.cores}) == sum(len(p.cores) for p in gpu)  # disjoint cores
    cpu4 = real.plan_workers(0, [0, 1, 2, 3], allow_small_host=False)
    assert [(p.threads, p.cores) for p in cpu4] == [(2, [0, 1]), (1, [2])]
    with pytest.raises(SystemExit, match="need 4 or more"):
        real.plan_workers(0, [0, 1], allow_small_host=False)
    small = real.plan_workers(0, [0, 1], allow_small_host=True)
    assert [(p.threads, p.cores) for p in small] == [(1, [0]), (1, [1])]


def test_a_real_hardware_run_whose_host_drifted_claims_nothing() -> None:
    """Two workers at 300 and 100 samples/s of compute; the even phase after the balanced one ran 22%
    faster than the one before it (as a run on a shared machine once did)."""
    real = bench_module("runtime_real_hetero")

    def phase(batches: list[int], rate: float) -> dict[str, Any]:
        computes = [1e3 * batches[0] / 300, 1e3 * batches[1] / 100]
        return {
            "local_batches": batches,
            "worker_compute_ms": computes,
            "samples_per_s": rate,
            "worker_step_ms": [max(computes) * 1.05] * 2,
            "slowest_compute_per_step_ms": max(computes),
        }

    raw = {
        "solo": [{"local_batch": 300, "compute_s": 1.0}, {"local_batch": 100, "compute_s": 1.0}],
        "even": phase([200, 200], 190.0),
        "balanced": phase([300, 100], 380.0),
        "even_again": phase([200, 200], 190.0),
    }
    plans = [real.WorkerPlan("cuda:0", 1, [0]), real.WorkerPlan("cpu", 4, [1, 2, 3, 4])]
    steady = real.summarize(raw, plans, gpu_machine=True)
    assert steady["verdict"] == "target met", steady
    raw["even_again"] = phase([200, 200], 190.0 * 1.22)
    drifted = real.summarize(raw, plans, gpu_machine=True)
    assert drifted["host_drift"] == pytest.approx(0.22)
    assert drifted["verdict"] == "**invalid: the host drifted**"
    assert any("drifted +22.0%" in note for note in drifted["notes"])


def test_benchmarks_md_runtime_section_is_the_committed_artifacts_rendered() -> None:
    report = bench_module("runtime_report")
    simulated, real = report.load_artifacts()
    assert simulated, "no committed artifact of bench/runtime_balance.py in bench/results/"
    expected = report.render(simulated, real)
    text = BENCHMARKS_MD.read_text()
    start = text.index(report.HEADING + "\n")
    end = text.find("\n## ", start + len(report.HEADING))
    assert text[start : end if end != -1 else len(text)] == expected
