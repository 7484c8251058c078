"""The `heterotrain` command: one typer app assembled from small command groups."""

from __future__ import annotations

import typer

from hetero_operator.cli import demo, jobs, plan, runtime, simulate, testbed
from hetero_operator.cli.operator import OPERATOR_CONTEXT, OPERATOR_HELP, operator_command

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


def main() -> None:
    app()
