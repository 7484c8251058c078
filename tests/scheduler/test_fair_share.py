"""Queues: quota per class within a cohort, speed-priced charging, fair-share order; every expected
value below is worked out by hand in the comment beside it."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import pytest
from scheduler_cases import job, nodes, run_with_current

from hetero_operator.scheduler import (
    ClassProfile,
    GPUClassInfo,
    MeasuredProfile,
    SchedulerConfig,
    Snapshot,
    SnapshotError,
    WaitCode,
    schedule,
)
from hetero_operator.scheduler.charging import (
    Charging,
    Pricing,
    accrue,
    charge_rate,
    equal_share_speed,
    job_speed,
    share,
)
from hetero_operator.scheduler.fair_share import fair_order
from hetero_operator.scheduler.queues import ClassQuota, QueueInfo
from hetero_operator.scheduler.quota import QuotaLedger
from hetero_operator.scheduler.reservations import NO_LIMIT

ONE_CLASS = (GPUClassInfo("v100", 1.0, 16),)
CLASSES = {"a100": GPUClassInfo("a100", 2.0, 40), "v100": GPUClassInfo("v100", 1.0, 16)}
STILL = SchedulerConfig(elastic=False, move_gain=None)


def _queue(name: str, nominal: int | None = None, **fields: object) -> QueueInfo:
    quotas = {} if nominal is None else {"v100": ClassQuota(nominal)}
    fields.setdefault("quotas", quotas)
    return QueueInfo(name, **fields)  # type: ignore[arg-type]


# --- quota ledger ----------------------------------------------------------------------------------


def test_a_queue_outside_a_cohort_gets_its_nominal_quota_only() -> None:
    ledger = QuotaLedger([_queue("a", 4)], {"a": {"v100": 3}})
    assert ledger.headroom("a", "v100") == 1  # 4 nominal - 3 used
    assert ledger.headroom("a", "a100") == 0  # no quota listed: nominal 0, nobody to borrow from


def test_a_cohort_lends_what_its_members_do_not_use() -> None:
    a = QueueInfo("a", cohort="c", quotas={"v100": ClassQuota(2)})
    b = QueueInfo("b", cohort="c", quotas={"v100": ClassQuota(6)})
    ledger = QuotaLedger([a, b], {"b": {"v100": 1}})
    # Pool: 2 + 6 lendable; used beyond guarantees (0 each): 1. a may take 0 + (8 - 1) = 7.
    assert ledger.headroom("a", "v100") == 7
    ledger.take("a", {"v100": 7})
    assert ledger.headroom("b", "v100") == 0  # the pool is used up: 1 + 7 = 8
    assert ledger.borrowed("a", "v100") == 5  # 7 used - 2 nominal
    assert ledger.owed("b", "v100") == 5  # 6 nominal - 1 used


def test_borrowing_and_lending_limits() -> None:
    a = QueueInfo("a", cohort="c", quotas={"v100": ClassQuota(2, borrowing_limit=1)})
    b = QueueInfo("b", cohort="c", quotas={"v100": ClassQuota(6, lending_limit=2)})
    ledger = QuotaLedger([a, b], {})
    # a: its own limit 2 + 1 = 3; the pool (2 + 2 lendable) would allow 4.
    assert ledger.headroom("a", "v100") == 3
    # b: guaranteed 6 - 2 = 4 of its own, plus the whole pool of 4.
    assert ledger.headroom("b", "v100") == 8
    ledger.take("b", {"v100": 5})
    # b uses 1 beyond its guarantee; a may take min(3, 0 + (4 - 1)) = 3.
    assert ledger.headroom("a", "v100") == 3
    ledger.take("b", {"v100": 2})  # b beyond guarantee: 3, pool left 1
    assert ledger.headroom("a", "v100") == 1


def test_unlimited_borrowing_is_bounded_by_the_pool_not_by_no_limit() -> None:
    a = QueueInfo("a", cohort="c", quotas={"v100": ClassQuota(0)})
    assert QuotaLedger([a], {}).headroom("a", "v100") == 0
    assert NO_LIMIT > 0


def test_bad_quotas_are_refused_naming_the_field() -> None:
    with pytest.raises(SnapshotError, match="lendingLimit"):
        ClassQuota(2, lending_limit=3)
    with pytest.raises(SnapshotError, match=r"queues\[a\].weight"):
        QueueInfo("a", weight=0)
    with pytest.raises(SnapshotError, match=r"queues\[a\].quotas: h100 is not a GPUClass"):
        Snapshot(ONE_CLASS, (), (), queues=(QueueInfo("a", quotas={"h100": ClassQuota(1)}),))


# --- charging --------------------------------------------------------------------------------------


def _profiled(key: str, a100_alpha: float) -> object:
    # Local batch 64 (global 64 on 1 GPU), beta 0: per-GPU rate = 1000 / alpha samples/s.
    profile = MeasuredProfile.from_mapping(
        {"a100": ClassProfile(a100_alpha, 0, 0, 0), "v100": ClassProfile(1.0, 0, 0, 0)}, 0, 0
    )
    return job(key, 1, global_batch=64, profile=profile)


def test_speed_pricing_charges_what_the_job_gains_on_the_class() -> None:
    fast_on_a100 = _profiled("x", 0.25)  # 4x a V100 (the reference, prior 1.0)
    assert job_speed(fast_on_a100, "a100", CLASSES) == pytest.approx(4.0)  # type: ignore[arg-type]
    # One A100 and three V100s: the job's equal-share speed is (1 * 4 + 3 * 1) / 4 = 1.75 per GPU.
    capacity = {"a100": 1, "v100": 3}
    assert equal_share_speed(fast_on_a100, CLASSES, capacity) == pytest.approx(1.75)  # type: ignore[arg-type]
    gpus = {"a100": 2, "v100": 1}

    def rate(pricing: Pricing) -> float:
        return charge_rate(fast_on_a100, gpus, CLASSES, capacity, pricing)  # type: ignore[arg-type]

    assert rate(Pricing.SPEED) == pytest.approx((2 * 4 + 1) / 1.75)
    assert rate(Pricing.CLASS) == pytest.approx(2 * 2.0 + 1)
    assert rate(Pricing.GPU) == pytest.approx(3.0)
    # Holding exactly its equal slice of every class costs one per GPU.
    assert charge_rate(fast_on_a100, capacity, CLASSES, capacity, Pricing.SPEED) == pytest.approx(4.0)  # type: ignore[arg-type]
    # Never measured: the class prior.
    assert job_speed(job("y", 1), "a100", CLASSES) == 2.0


def test_speed_without_a_measured_reference_class_uses_the_geometric_mean_anchor() -> None:
    classes = {"a100": GPUClassInfo("a100", 2.0, 40), "t4": GPUClassInfo("t4", 0.5, 16)}
    profile = MeasuredProfile.from_mapping(
        {"a100": ClassProfile(0.5, 0, 0, 0), "t4": ClassProfile(8.0, 0, 0, 0)}, 0, 0
    )
    # Rates 2000 and 125; measured/prior 1000 and 250: anchor sqrt(1000 * 250) = 500.
    measured = job("z", 1, global_batch=64, profile=profile)
    assert job_speed(measured, "a100", classes) == pytest.approx(4.0)
    assert job_speed(measured, "t4", classes) == pytest.approx(0.25)


def test_accrue_integrates_the_decay_exactly() -> None:
    charging = Charging(half_life_s=100.0)
    tau = 100.0 / math.log(2)
    # Nothing held: one half-life halves the usage.
    assert accrue(8.0, 0.0, 100.0, charging) == pytest.approx(4.0)
    # Rate 3 from 0 for one half-life: 3 * tau * (1 - 1/2).
    assert accrue(0.0, 3.0, 100.0, charging) == pytest.approx(1.5 * tau)
    # Two steps equal one step of their sum.
    assert accrue(accrue(5.0, 2.0, 30.0, charging), 2.0, 70.0, charging) == pytest.approx(
        accrue(5.0, 2.0, 100.0, charging)
    )
    # Share: (usage + rate * tau) / weight.
    assert share(QueueInfo("q", weight=2.0, usage=10.0), 1.0, charging) == pytest.approx((10.0 + tau) / 2.0)


# --- order and the cycle ---------------------------------------------------------------------------


def test_fair_order_serves_the_lowest_share_next_and_fifo_within_a_queue() -> None:
    jobs = [job("a1", 1, queue="a"), job("a2", 1, arrived=1, queue="a"), job("b1", 1, arrived=2, queue="b")]
    shares = {"a": 1.0, "b": 0.0}
    order = []
    for picked in fair_order(jobs, lambda j: (False, shares[j.queue])):
        order.append(picked.key)
        shares[picked.queue] += 5.0  # a pick raises its queue's share
    # b (share 0) first; then a (1 < 5), a again (6 > 5? no: b's lane is empty).
    assert order == ["ns/b1", "ns/a1", "ns/a2"]


def test_priority_beats_share() -> None:
    jobs = [job("a1", 1, queue="a", priority=1), job("b1", 1, queue="b")]
    shares = {"a": 9.0, "b": 0.0}
    assert [j.key for j in fair_order(jobs, lambda j: (False, shares[j.queue]))] == ["ns/a1", "ns/b1"]


def test_a_job_its_quota_holds_goes_before_one_that_would_borrow() -> None:
    jobs = [job("a1", 1, queue="a"), job("b1", 1, arrived=1, queue="b")]
    rank = {"a": (True, 0.0), "b": (False, 5.0)}  # a would borrow, though its share is lower
    assert [j.key for j in fair_order(jobs, lambda j: rank[j.queue])] == ["ns/b1", "ns/a1"]


def test_equal_weights_split_the_cluster_even_though_one_tenant_came_first() -> None:
    jobs = tuple(job(f"a{i}", 1, arrived=i, queue="a") for i in range(4)) + tuple(
        job(f"b{i}", 1, arrived=10 + i, queue="b") for i in range(4)
    )
    queues = (_queue("a"), _queue("b"))
    placed = schedule(Snapshot(ONE_CLASS, nodes("v100", 1, 4), jobs, queues=queues), STILL).place
    # No quotas listed and no cohort: nominal 0 everywhere, nothing may run.
    assert placed == {}
    pooled = (_queue("a", 4, cohort="c"), _queue("b", 4, cohort="c"))
    placed = schedule(Snapshot(ONE_CLASS, nodes("v100", 1, 4), jobs, queues=pooled), STILL).place
    # Shares alternate a, b, a, b: two each, the earliest of each queue.
    assert sorted(placed) == ["ns/a0", "ns/a1", "ns/b0", "ns/b1"]
    # Without queues: first come, first served.
    assert sorted(schedule(Snapshot(ONE_CLASS, nodes("v100", 1, 4), jobs), STILL).place) == [
        f"ns/a{i}" for i in range(4)
    ]


def test_weights_and_usage_history_tilt_the_split() -> None:
    jobs = tuple(job(f"{q}{i}", 1, arrived=i, queue=q) for q in "ab" for i in range(6))
    heavy = (_queue("a", 6, cohort="c", weight=2.0), _queue("b", 6, cohort="c"))
    placed = schedule(Snapshot(ONE_CLASS, nodes("v100", 1, 6), jobs, queues=heavy), STILL).place
    # Shares per GPU: a +tau/2, b +tau. Picks: a(0) b(0) a(.5) a(1)=b(1): a by arrival, then b, a.
    assert Counter(k[3] for k in placed) == Counter({"a": 4, "b": 2})
    tau = Charging().tau_s
    used = (_queue("a", 6, cohort="c", usage=3 * tau), _queue("b", 6, cohort="c"))
    placed = schedule(Snapshot(ONE_CLASS, nodes("v100", 1, 6), jobs, queues=used), STILL).place
    # a starts 3 GPUs' worth behind: b takes 3 first, then they alternate.
    assert Counter(k[3] for k in placed) == Counter({"a": 2, "b": 4})


def test_quota_caps_a_queue_even_with_free_gpus_and_says_so() -> None:
    jobs = (job("a0", 2, queue="a"), job("a1", 2, arrived=1, queue="a"))
    decisions = schedule(Snapshot(ONE_CLASS, nodes("v100", 1, 8), jobs, queues=(_queue("a", 3),)), STILL)
    assert list(decisions.place) == ["ns/a0"]
    reason = decisions.unschedulable["ns/a1"]
    assert reason.code is WaitCode.QUOTA_EXCEEDED
    assert "queue a may take only class v100: 1 GPU more" in reason.message


def test_a_job_naming_no_queue_waits_with_the_field_named() -> None:
    jobs = (job("x", 1, queue="nope"),)
    decisions = schedule(Snapshot(ONE_CLASS, nodes("v100", 1, 8), jobs, queues=(_queue("a", 3),)), STILL)
    reason = decisions.unschedulable["ns/x"]
    assert reason.code is WaitCode.UNKNOWN_QUEUE
    assert reason.message.startswith("spec.queue: no HeteroQueue named 'nope'")


def test_growth_stays_within_quota() -> None:
    jobs = (job("a0", 1, gpus_max=8, queue="a"),)
    snapshot = Snapshot(ONE_CLASS, nodes("v100", 1, 8), jobs, queues=(_queue("a", 3),))
    placed = schedule(snapshot, SchedulerConfig(move_gain=None)).place
    assert placed["ns/a0"].total_gpus <= 3


def test_running_jobs_count_against_quota_and_share() -> None:
    first = Snapshot(ONE_CLASS, nodes("v100", 1, 4), (job("a0", 2, queue="a"),), queues=(_queue("a", 3),))
    running = run_with_current(first, STILL)
    later = replace(running, jobs=(*running.jobs, job("a1", 2, arrived=5, queue="a")))
    assert schedule(later, STILL).unschedulable["ns/a1"].code is WaitCode.QUOTA_EXCEEDED


# --- reclaiming lent quota -------------------------------------------------------------------------


def _borrowed_cluster(a_nominal: int) -> Snapshot:
    """b runs eight 1-GPU jobs on 8 GPUs: 4 of its own and 4 borrowed from a (if a owns 4)."""
    queues = (_queue("a", a_nominal, cohort="c"), _queue("b", 8 - a_nominal, cohort="c"))
    jobs = tuple(job(f"b{i}", 1, arrived=i, queue="b", priority=5) for i in range(8))
    return run_with_current(Snapshot(ONE_CLASS, nodes("v100", 2, 4), jobs, queues=queues), STILL)


def test_an_owner_reclaims_lent_gpus_from_the_newest_borrowing_jobs_whatever_their_priority() -> None:
    running = _borrowed_cluster(4)
    assert all(j.current is not None for j in running.jobs)
    later = replace(running, jobs=(*running.jobs, job("a0", 2, arrived=20, queue="a")))
    decisions = schedule(later, STILL)
    # Victims: b's jobs on the lent class, newest first, until 2 GPUs are freed: b7 and b6.
    assert sorted(decisions.preempt) == ["ns/b6", "ns/b7"]
    assert "queue a reclaims" in decisions.preempt["ns/b7"].reason
    reason = decisions.unschedulable["ns/a0"]
    assert reason.code is WaitCode.PREEMPTING
    assert "reclaims the GPUs of its quota that other queues borrowed" in reason.message


def test_a_queue_that_owns_nothing_does_not_reclaim() -> None:
    running = _borrowed_cluster(0)
    later = replace(running, jobs=(*running.jobs, job("a0", 2, arrived=20, queue="a")))
    decisions = schedule(later, STILL)
    assert decisions.preempt == {}
    assert decisions.unschedulable["ns/a0"].code is WaitCode.QUOTA_EXCEEDED


def test_a_job_within_its_quota_is_placed_before_a_borrower_with_a_lower_share() -> None:
    queues = (_queue("a", 2, cohort="c"), _queue("b", 2, cohort="c", usage=100_000.0))
    first = Snapshot(ONE_CLASS, nodes("v100", 1, 4), (job("a0", 2, queue="a"),), queues=queues)
    running = run_with_current(first, STILL)
    later = replace(
        running, jobs=(*running.jobs, job("a1", 1, arrived=1, queue="a"), job("b0", 2, arrived=2, queue="b"))
    )
    # a's share (2 GPUs held: 2 * tau, about 10,400) is below b's (100,000 of history), but a1 would
    # borrow b's nominal GPUs while b0 fits b's own quota: b0 first, then nothing is left for a1.
    decisions = schedule(later, STILL)
    assert list(decisions.place) == ["ns/b0"]
    assert decisions.preempt == {}
