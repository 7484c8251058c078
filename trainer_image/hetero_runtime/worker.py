"""Entry point of one worker process: `python -m hetero_runtime.worker EXAMPLE_OR_SCRIPT`, or
`python -m hetero_runtime.worker -- CMD ARGS...` to run a training script of the user's own the way
torchrun would."""

from __future__ import annotations

import importlib
import logging
import os
import runpy
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from hetero_operator.plan import Plan
from hetero_operator.warm_start import WARM_START_ENV, program_of, run_in_place
from hetero_runtime.examples import EXAMPLES
from hetero_runtime.launcher import WorkerEnv, worker_env_from_os
from hetero_runtime.plan_client import PlanSourceError, plan_source_from_spec
from hetero_runtime.plan_refusals import unmodified_script_refusal
from hetero_runtime.torchrun_env import torchrun_environment
from hetero_runtime.worker_logging import configure_logging

log = logging.getLogger(__name__)


def run_worker(target: str) -> None:
    """Run a bundled example by name, a module path (pkg.mod, must define main()), a Python script, or
    an executable (run as `exec_command` runs a command)."""
    env = worker_env_from_os()
    configure_logging(env.rank)
    if target.endswith(".py"):
        runpy.run_path(target, run_name="__main__")
        return
    if Path(target).is_file() or (target not in EXAMPLES and shutil.which(target) is not None):
        exec_command([target])  # an executable of the user's own (a shell script, say)
        return
    module = importlib.import_module(EXAMPLES.get(target, target))
    main = getattr(module, "main", None)
    if main is None:
        raise SystemExit(f"{target}: module {module.__name__} has no main() to run")
    main()


def initial_plan_refusal(env: WorkerEnv) -> str | None:
    """The refusal of the plan in force at launch, if one can be read now (else the script's own
    `hetero_runtime.wrap.init()` checks it once the plan is readable)."""
    if env.plan_source is None:
        return None
    try:
        plan = Plan.from_json(plan_source_from_spec(env.plan_source).read())
    except (PlanSourceError, ValueError) as error:
        log.warning("plan not checked before the script starts: %s", error)
        return None
    return unmodified_script_refusal(plan)


def exec_command(command: Sequence[str]) -> None:
    """Set up the environment as torchrun does, then become `command` (same process, same signals)."""
    if not command:
        raise SystemExit("heterotrain worker --: give the command to run, e.g. -- python train.py ARGS")
    env = worker_env_from_os()
    configure_logging(env.rank)
    refusal = initial_plan_refusal(env)
    if refusal is not None:
        raise SystemExit(refusal)
    os.environ.update(torchrun_environment(env, os.environ))
    sys.stdout.flush()
    sys.stderr.flush()
    program = program_of(command)
    if program is not None and os.environ.get(WARM_START_ENV):
        # This process started warm (torch imported): become the script here rather than exec a
        # cold interpreter for it, as exec would (same process, same signals, its exit code).
        raise SystemExit(run_in_place(program))
    try:
        os.execvp(command[0], list(command))
    except OSError as error:
        raise SystemExit(f"heterotrain worker -- {command[0]}: cannot run it ({error})") from None


def main(argv: Sequence[str]) -> None:
    if argv and argv[0] == "--":
        exec_command(argv[1:])
    elif len(argv) == 1:
        run_worker(argv[0])
    else:
        raise SystemExit("usage: python -m hetero_runtime.worker EXAMPLE|MODULE|SCRIPT.py | -- CMD ARGS...")


if __name__ == "__main__":
    main(sys.argv[1:])
