"""A warm start is a fresh start but for the time it takes: a probe started warm sees the same argv,
sys.path, working directory, environment, signal dispositions, stream buffering and session as the
same probe started as a fresh interpreter, writes the same output and ends with the same exit code,
for every way of ending; and it draws random numbers of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hetero_operator.warm_start import WARM_START_ENV, Program, WarmProcess, program_of, spawn, warm_server

pytestmark = pytest.mark.ranks

PROBE = Path(__file__).parent / "scripts" / "warm_probe.py"
ENDINGS = {
    "end": (["end"], 0),
    "exit": (["exit", "3"], 3),
    "raise": (["raise"], 1),
    "signal": (["signal"], -15),
}


@pytest.fixture(scope="module")
def warm_socket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A warm server of the test's own (preloading a light module: what it preloads changes nothing)."""
    with warm_server(tmp_path_factory.mktemp("warm"), preload=("json",)) as server:
        yield str(server.socket_path)


def launch(
    argv: list[str], cwd: Path, env: dict[str, str], warm: str | None, monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `argv` run fresh (`warm` None) or warm through that server."""
    errors = cwd / f"stderr-{uuid.uuid4().hex[:6]}.txt"
    with errors.open("w") as sink:
        if warm is None:
            done = subprocess.run(
                argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=sink, text=True, timeout=60
            )
            code, out = done.returncode, done.stdout
        else:
            monkeypatch.setenv(WARM_START_ENV, warm)
            process = spawn(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=sink, text=True)
            monkeypatch.delenv(WARM_START_ENV)
            assert isinstance(process, WarmProcess)
            out, _ = process.communicate(timeout=60)
            code = process.returncode
    return code, out, errors.read_text()


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_a_warm_start_sees_and_ends_as_a_fresh_one(
    ending: str, warm_socket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args, expected_code = ENDINGS[ending]
    env = {**{k: v for k, v in os.environ.items() if k != WARM_START_ENV}, "PROBE_MARKER": "m1"}
    env["PYTHONUNBUFFERED"] = "1" if ending == "end" else ""
    argv = [sys.executable, str(PROBE), *args]
    fresh = launch(argv, tmp_path, env, None, monkeypatch)
    warm = launch(argv, tmp_path, env, warm_socket, monkeypatch)
    assert fresh[0] == warm[0] == expected_code, (fresh, warm)
    seen_fresh, seen_warm = json.loads(fresh[1]), json.loads(warm[1])
    assert seen_fresh.pop("random") != seen_warm.pop("random")
    assert seen_warm == seen_fresh
    assert warm[2] == fresh[2]  # the traceback (the program's frames only) and the atexit line
    if ending == "raise":
        assert "ValueError: probe failure" in warm[2] and "warm_start" not in warm[2]


def test_signals_the_starter_ignores_stay_ignored_as_across_exec(
    warm_socket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A starter in the background of a shell ignores SIGINT; a fresh interpreter it starts keeps
    SIGINT ignored (no KeyboardInterrupt handler), and so does a warm one."""
    previous = {number: signal.signal(number, signal.SIG_IGN) for number in (signal.SIGINT, signal.SIGUSR1)}
    try:
        env = {k: v for k, v in os.environ.items() if k != WARM_START_ENV}
        argv = [sys.executable, str(PROBE), "end"]
        fresh = json.loads(launch(argv, tmp_path, env, None, monkeypatch)[1])
        warm = json.loads(launch(argv, tmp_path, env, warm_socket, monkeypatch)[1])
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    assert fresh["signals"]["SIGINT"] == "ignore"  # the independent expectation: exec keeps it
    assert warm["signals"] == fresh["signals"]


def test_two_warm_starts_draw_different_random_numbers(
    warm_socket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = [sys.executable, str(PROBE), "end"]
    env = {"PATH": "/usr/bin:/bin"}
    first = json.loads(launch(argv, tmp_path, env, warm_socket, monkeypatch)[1])
    second = json.loads(launch(argv, tmp_path, env, warm_socket, monkeypatch)[1])
    assert first["random"] != second["random"] and first["variables"] == ["PATH"]


def test_modules_and_code_run_warm_and_options_run_cold() -> None:
    python = sys.executable
    assert program_of([python, "-m", "pkg.mod", "a"]) is not None
    assert program_of([python, "-c", "print(1)"]) is not None
    assert program_of([python, "train.py", "--epochs", "2"]) is not None
    assert program_of([python, "-u", "train.py"]) is None  # an interpreter option: cold
    assert program_of(["/bin/sh", "-c", "true"]) is None  # another program
    heterotrain = Path(python).parent / "heterotrain"  # a console script of this environment
    assert program_of([str(heterotrain), "worker", "digits"]) == Program(
        "script", str(heterotrain), ("worker", "digits")
    )


@pytest.mark.parametrize("kind", ["module", "code"])
def test_a_module_and_code_run_warm_see_what_they_would_fresh(
    kind: str, warm_socket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python -m MOD` (the working directory first on the path, argv[0] the module's file) and
    `python -c CODE` ('' first, argv[0] '-c')."""
    show = "import json, sys, __main__; print(json.dumps([sys.argv, sys.path[0], __main__.__name__]))"
    (tmp_path / "probe_module.py").write_text(show)
    argv = (
        [sys.executable, "-m", "probe_module", "x"] if kind == "module" else [sys.executable, "-c", show, "x"]
    )
    env = {k: v for k, v in os.environ.items() if k != WARM_START_ENV}
    fresh = launch(argv, tmp_path, env, None, monkeypatch)
    warm = launch(argv, tmp_path, env, warm_socket, monkeypatch)
    assert fresh[0] == warm[0] == 0 and json.loads(warm[1]) == json.loads(fresh[1]), (fresh, warm)
