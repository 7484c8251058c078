"""The `heterotrain` command: one typer app assembled from small command groups."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import typer

from hetero_operator.cli.operator import OPERATOR_CONTEXT, OPERATOR_HELP, operator_command


def build_app() -> typer.Typer:
    """Every command. Imported only when asked for: the operator's own start (every restart and
    failover) skips the simulator's, API's and test bed's imports."""
    from hetero_operator.cli import demo, jobs, plan, runtime, simulate, testbed

    app = typer.Typer(
        name="heterotrain",
        help="Train on heterogeneous GPU pools: test bed, planner, worker runtime and operator.",
        no_args_is_help=True,
        add_completion=False,
    )
    app.add_typer(testbed.app, name="testbed")
    app.add_typer(plan.app, name="plan")
    runtime.register(app)
    app.command("demo")(demo.demo)
    app.command("simulate")(simulate.simulate)
    app.command("jobs")(jobs.jobs_command)
    app.command("describe")(jobs.describe_command)
    app.command("whatif")(jobs.whatif_command)
    app.command("logs")(jobs.logs_command)
    app.command("api")(jobs.api_command)
    app.command("operator", help=OPERATOR_HELP, context_settings=OPERATOR_CONTEXT, add_help_option=False)(
        operator_command
    )
    return app


def one_command_app(name: str, command: Callable[..., None], **settings: Any) -> typer.Typer:
    """A group of one command, for the commands every pod starts with (`operator` on each restart and
    failover, `worker` in every training pod): the other commands' imports (the simulator's scipy, the
    API's fastapi, the kubernetes client) would cost each start about a second of CPU."""
    app = typer.Typer(name="heterotrain", add_completion=False)
    app.command(name, **settings)(command)
    app.callback()(_group)  # a group, so that the command stays a subcommand
    return app


def _group() -> None:
    """Train on heterogeneous GPU pools."""


def main() -> None:
    if sys.argv[1:2] == ["operator"]:
        # Its options are its settings model's (see `cli.operator`).
        one_command_app(
            "operator",
            operator_command,
            help=OPERATOR_HELP,
            context_settings=OPERATOR_CONTEXT,
            add_help_option=False,
        )()
    elif sys.argv[1:2] == ["worker"]:
        from hetero_operator.cli.runtime import worker

        one_command_app("worker", worker)()
    else:
        build_app()()
