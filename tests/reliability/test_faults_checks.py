"""The fault tests' own checks, and the ledger that becomes RELIABILITY.md: each one must be able
to fail, so each is shown a broken cluster (or table) here as well as a sound one."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from tests.reliability.faults_cluster import (
    Snapshot,
    duplicate_workers,
    overcommitted_nodes,
    settled_problems,
)
from tests.reliability.faults_lifecycles import Finish, Kind, Lifecycle, next_move
from tests.reliability.faults_training import KillSeen, OutageSeen, kill_problems, outage_problems
from tests.reliability.ledger import Row, merge, parse, render, still_exists, write

from hetero_operator.controller import names

UID = "uid-1"


def pod(
    job: str, generation: int, rank: int, phase: str = "Running", node: str = "n0", owner: str = UID
) -> Any:
    return {
        "kind": "Pod",
        "metadata": {
            "name": names.pod_name(job, generation, rank),
            "labels": {
                names.LABEL_JOB: job,
                names.LABEL_RANK: str(rank),
                names.LABEL_GENERATION: str(generation),
            },
            "ownerReferences": [{"uid": owner}],
        },
        "spec": {"nodeName": node, "containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
        "status": {"phase": phase},
    }


def job(name: str, phase: str, generation: int, restarts: int = 0) -> Any:
    return {
        "metadata": {"name": name, "uid": UID},
        "status": {
            "phase": phase,
            "restarts": restarts,
            "allocation": {"generation": generation, "workers": [{"rank": 0}, {"rank": 1}]},
        },
    }


def snapshot(jobs: list[Any], pods: list[Any], nodes: dict[str, int] | None = None) -> Snapshot:
    return Snapshot({j["metadata"]["name"]: j for j in jobs}, pods, [], nodes or {"n0": 4, "n1": 4})


def test_duplicate_workers_are_two_live_pods_of_a_rank_or_two_live_generations() -> None:
    sound = snapshot([job("a", "Running", 1)], [pod("a", 0, 0, "Failed"), pod("a", 1, 0), pod("a", 1, 1)])
    assert duplicate_workers(sound) == {}
    twice = snapshot([job("a", "Running", 1)], [pod("a", 0, 0), pod("a", 1, 0)])
    assert duplicate_workers(twice) == {
        "a": ["2 live pods for rank 0", "live pods of generations [0, 1] at once"]
    }


def test_overcommit_counts_live_pods_on_nodes_that_exist() -> None:
    pods = [pod("a", 0, 0), pod("a", 0, 1), pod("b", 0, 0, node="n1"), pod("b", 0, 1, node="gone")]
    assert overcommitted_nodes(snapshot([], pods)) == []
    pods.append(pod("c", 0, 0))
    assert overcommitted_nodes(snapshot([], pods)) == ["n0: 6 GPUs in use of 4"]


def test_a_settled_job_keeps_only_its_last_generation_owned_by_it() -> None:
    done = [pod("a", 1, 0, "Succeeded"), pod("a", 1, 1, "Succeeded")]
    assert settled_problems(snapshot([job("a", "Succeeded", 1)], done), "a") == []
    stale = [*done, pod("a", 0, 0, "Failed")]
    assert settled_problems(snapshot([job("a", "Succeeded", 1)], stale), "a") == [
        f"pods of earlier generations left: {[names.pod_name('a', 0, 0)]}"
    ]
    foreign = [pod("a", 1, 0, "Succeeded", owner="other")]
    assert settled_problems(snapshot([job("a", "Succeeded", 1)], foreign), "a") == [
        f"{names.pod_name('a', 1, 0)} is not owned by the job"
    ]


def test_a_fail_once_lifecycle_fails_rank_0_then_finishes_the_next_generation() -> None:
    life = Lifecycle("a", Kind.FAIL_ONCE)
    half_there = snapshot([job("a", "Running", 0)], [pod("a", 0, 1)])
    assert next_move(life, half_there, 0.0) is None  # rank 0 has no pod yet: nothing is finished
    running0 = snapshot([job("a", "Running", 0)], [pod("a", 0, 0), pod("a", 0, 1)])
    assert next_move(life, running0, 0.0) == Finish((names.pod_name("a", 0, 0),), 1)
    assert next_move(life, running0, 0.1) is None  # once per generation
    running1 = snapshot([job("a", "Running", 1, restarts=1)], [pod("a", 1, 0), pod("a", 1, 1)])
    assert next_move(life, running1, 1.0) == Finish((names.pod_name("a", 1, 0), names.pod_name("a", 1, 1)), 0)
    wrong = snapshot(
        [job("a", "Succeeded", 1, restarts=2)], [pod("a", 1, 0, "Succeeded"), pod("a", 1, 1, "Succeeded")]
    )
    next_move(life, wrong, 2.0)
    assert life.done and life.problems == ["status.restarts is 2, expected 1"]


def test_training_verdicts_name_what_was_lost() -> None:
    sound = KillSeen(
        epochs_done=2,
        checkpoints=[1, 2],
        mid_epoch=True,
        generation_0_epochs=[1, 2],
        resumed=(2, 2),
        restarts=1,
        final_phase="Succeeded",
        final_epochs=[3, 4],
    )
    assert kill_problems(sound, epochs=4) == []
    lost_an_epoch = KillSeen(**{**sound.__dict__, "resumed": (1, 1), "final_epochs": [2, 3, 4]})
    assert kill_problems(lost_an_epoch, epochs=4) == [
        "resumed from (checkpoint, epochs done) (1, 1), expected (2, 2)",
        "the restarted workers trained epochs [2, 3, 4], expected 3..4",
    ]
    outage = OutageSeen(
        condition_during={"reason": "PrometheusUnavailable"},
        phase_during="Running",
        plans=(2, 3),
        rebalances=(1, 1),
        condition_after={"status": "True"},
        operator_survived=True,
        logged=True,
        slowed_rank=0,
        share_before=0.5,
        share_after=0.3,
        new_plan=4,
        new_plan_seconds=12.0,
    )
    assert outage_problems(outage) == ["a plan was written without metrics: version 2 -> 3"]
    unchanged = OutageSeen(**{**outage.__dict__, "plans": (2, 2), "share_after": 0.5})
    assert outage_problems(unchanged) == [
        "the new plan (version 4) did not shrink the slowed rank 0's share: 0.5 -> 0.5"
    ]
    never = OutageSeen(**{**outage.__dict__, "plans": (2, 2), "new_plan": None})
    assert outage_problems(never) == [
        "no new plan was written after Prometheus came back, with a node slowed meanwhile"
    ]


def test_ledger_round_trips_and_keeps_rows_of_tests_that_did_not_run(tmp_path: Path) -> None:
    old = [
        Row("fault", "a | b\nc", 3, 2, "one run", "checks | more", "t.py::one", "2026-01-01 10:00"),
        Row("security", "s", 1, 1, "nothing", "c", "s.py::two", "2026-01-01 10:00"),
        Row("security", "f", 4, 4, "nothing", "c", "s.py::three", "2026-01-01 10:00", "a fake API"),
    ]
    when = datetime.datetime(2026, 1, 2, 11, 30, tzinfo=datetime.UTC)
    text = render(old, 2, when)
    parsed = parse(text)
    assert parsed == [
        Row("fault", "a | b c", 3, 2, "one run", "checks | more", "t.py::one", "2026-01-01 10:00"),
        old[1],
        old[2],
    ]
    # Totals per area and per what the rows ran against; never one sum across them.
    assert "| security | test bed | 1 | 1 | 1 | 0 |" in text
    assert "| security | a fake API | 1 | 4 | 4 | 0 |" in text
    assert "Trials:" not in text and "(1 of the 3 rows here did not run on the test bed)" in text
    fresh = [Row("fault", "again", 3, 3, "nothing", "c", "t.py::one")]
    merged = merge(parsed, fresh, {"t.py::one", "t.py::gone"})
    assert [(row.what, row.test) for row in merged] == [
        ("again", "t.py::one"),
        ("s", "s.py::two"),
        ("f", "s.py::three"),
    ]
    target = tmp_path / "RELIABILITY.md"
    write(target, old, 2)
    write(target, fresh, 1, {"t.py::one"})
    rows = parse(target.read_text())
    assert [(row.what, row.run == "2026-01-01 10:00") for row in rows] == [
        ("again", False),
        ("s", True),
        ("f", True),
    ]
    assert "1 rows from this run, 2 kept from earlier runs" in target.read_text()
    # A kept row of a test that was renamed or removed goes with it.
    (tmp_path / "t.py").write_text("def one():\n    pass\n")
    gone = [
        Row("fault", "x", 1, 1, "nothing", "c", "t.py::two"),
        Row("fault", "y", 1, 1, "nothing", "c", "t.py::one"),
    ]
    assert [row.what for row in merge(gone, [], set(), still_exists(tmp_path))] == ["y"]
    # A file written before the Ran on column: its rows ran on the test bed.
    legacy = "## Fault\n\n| What | Trials | Survived | Lost | Checks | Test | Run |\n|---|\n"
    legacy += "| old | 2 | 2 | nothing | c | `t.py::old` | 2025-12-01 10:00 |\n"
    assert parse(legacy) == [Row("fault", "old", 2, 2, "nothing", "c", "t.py::old", "2025-12-01 10:00")]
