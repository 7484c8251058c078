"""`heterotrain operator`: run the operator against a kubeconfig or the in-cluster service account.

Its options are the operator's settings model (`hetero_operator.manager.settings`): `--help` lists
every one with its description and default."""

from __future__ import annotations

import sys

import typer
from pydantic import ValidationError

OPERATOR_HELP = "Run the heterotrain operator: validate, place, launch and restart HeteroTrainJobs."


def parse_settings(args: list[str]) -> object:
    """The settings from command-line arguments (and HETEROTRAIN_ environment variables)."""
    from pydantic_settings import CliApp

    from hetero_operator.manager.settings import OperatorSettings

    return CliApp.run(OperatorSettings, cli_args=args)


def operator_command(ctx: typer.Context) -> None:
    """Run the heterotrain operator (`heterotrain operator --help` lists its settings)."""
    from hetero_operator.manager.main import run
    from hetero_operator.manager.settings import OperatorSettings

    try:
        settings = parse_settings(list(ctx.args))
    except ValidationError as error:
        for problem in error.errors():
            where = "--" + ".".join(str(p).replace("_", "-") for p in problem["loc"])
            print(f"heterotrain operator: {where}: {problem['msg']}", file=sys.stderr)
        raise typer.Exit(2) from None
    assert isinstance(settings, OperatorSettings)
    run(settings)


OPERATOR_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}
