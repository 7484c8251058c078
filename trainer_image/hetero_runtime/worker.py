"""Entry point of one worker process: `python -m hetero_runtime.worker EXAMPLE_OR_SCRIPT`."""

from __future__ import annotations

import importlib
import runpy
import sys
from pathlib import Path

from hetero_runtime.api import configure_logging
from hetero_runtime.examples import EXAMPLES
from hetero_runtime.launcher import worker_env_from_os


def run_worker(target: str) -> None:
    """Run a bundled example by name, a module path (pkg.mod, must define main()) or a script file."""
    env = worker_env_from_os()
    configure_logging(env.rank)
    if target.endswith(".py") or Path(target).is_file():
        runpy.run_path(target, run_name="__main__")
        return
    module = importlib.import_module(EXAMPLES.get(target, target))
    main = getattr(module, "main", None)
    if main is None:
        raise SystemExit(f"{target}: module {module.__name__} has no main() to run")
    main()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m hetero_runtime.worker EXAMPLE|MODULE|SCRIPT.py")
    run_worker(sys.argv[1])
