"""The `heterotrain` command: one typer app assembled from small command groups."""

from __future__ import annotations

import sys

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


def operator_app() -> typer.Typer:
    """`heterotrain operator` alone (its options are its settings model's: see `cli.operator`)."""
    app = typer.Typer(name="heterotrain", add_completion=False)
    app.command("operator", help=OPERATOR_HELP, context_settings=OPERATOR_CONTEXT, add_help_option=False)(
        operator_command
    )
    app.callback()(_group)  # a group, so that `operator` stays a subcommand
    return app


def worker_app() -> typer.Typer:
    """`heterotrain worker` alone: every worker pod starts with it, so it skips the other commands'
    imports (the simulator's scipy, the API's fastapi, the kubernetes client: about a second of CPU)."""
    from hetero_operator.cli.runtime import worker

    app = typer.Typer(name="heterotrain", add_completion=False)
    app.command("worker")(worker)
    app.callback()(_group)  # a group, so that `worker` stays a subcommand
    return app


def _group() -> None:
    """Train on heterogeneous GPU pools."""


def main() -> None:
    if sys.argv[1:2] == ["operator"]:
        operator_app()()
    elif sys.argv[1:2] == ["worker"]:
        worker_app()()
    else:
        build_app()()
