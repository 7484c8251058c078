"""The probe rules of /healthz and /readyz, without HTTP."""

from __future__ import annotations

import asyncio

import pytest

from hetero_operator.api.health import (
    Check,
    Heartbeat,
    OperatorChecks,
    details,
    inventory_check,
    passed,
    stall_check,
    task_check,
)


def test_inventory_is_ready_after_the_first_cycle_or_on_a_standby() -> None:
    waiting = inventory_check(cycles=0, standby=False)
    assert not waiting.ok and "kopf indexes" in waiting.detail
    assert inventory_check(cycles=1, standby=False) == Check(True)
    standby = inventory_check(cycles=0, standby=True)
    assert standby.ok and "standby" in standby.detail
    assert inventory_check(cycles=5, standby=True) == Check(True)


@pytest.mark.parametrize(("since", "ok"), [(0.0, True), (10.0, True), (10.5, False), (120.0, False)])
def test_a_stalled_event_loop_fails_liveness(since: float, ok: bool) -> None:
    check = stall_check(since, max_stall_seconds=10.0)
    assert check.ok is ok
    if not ok:
        assert f"{since:.1f} s" in check.detail and "blocks" in check.detail


def test_heartbeat_reads_its_clock() -> None:
    now = [100.0]
    beat = Heartbeat(period=1.0, max_stall_seconds=5.0, clock=lambda: now[0], last_tick=100.0)
    assert beat.check().ok
    now[0] = 106.0
    assert not beat.check().ok


def test_heartbeat_ticks_in_a_running_loop() -> None:
    async def scenario() -> tuple[float, float]:
        beat = Heartbeat(period=0.01, last_tick=0.0)
        task = asyncio.create_task(beat.run())
        await asyncio.sleep(0.05)
        task.cancel()
        return beat.last_tick, beat.clock()

    last, now = asyncio.run(scenario())
    assert 0 < now - last < 1.0


def test_task_checks_name_how_a_task_ended() -> None:
    async def scenario() -> dict[str, Check]:
        async def forever() -> None:
            await asyncio.sleep(3600)

        async def broken() -> None:
            raise RuntimeError("lost the API server")

        async def finished() -> None:
            return None

        running = asyncio.create_task(forever())
        failed = asyncio.create_task(broken())
        done = asyncio.create_task(finished())
        cancelled = asyncio.create_task(forever())
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.gather(failed, done, cancelled, return_exceptions=True)
        checks = {
            "running": task_check(running),
            "failed": task_check(failed),
            "done": task_check(done),
            "cancelled": task_check(cancelled),
            "missing": task_check(None),
        }
        running.cancel()
        return checks

    checks = asyncio.run(scenario())
    assert details(checks) == {
        "running": "ok",
        "failed": "ended: RuntimeError('lost the API server')",
        "done": "ended",
        "cancelled": "cancelled",
        "missing": "not started",
    }
    assert not passed(checks) and passed({"running": checks["running"]})


def test_operator_checks_read_their_sources_at_probe_time() -> None:
    cycles, standby = [0], [False]
    checks = OperatorChecks(
        cycles=lambda: cycles[0], tasks=lambda: {"schedulingLoop": None}, standby=lambda: standby[0]
    )
    assert not passed(checks.readiness())
    standby[0] = True
    assert passed(checks.readiness())
    standby[0], cycles[0] = False, 1
    assert details(checks.readiness()) == {"inventory": "ok"}
    assert details(checks.liveness()) == {"schedulingLoop": "not started"}
