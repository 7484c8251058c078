"""`heterotrain plan KIND FILE|-`: the planner as a JSON-in, JSON-out what-if tool.

Exit codes: 0 with the answer as JSON on stdout; 2 with a message on stderr naming the field when
the input is invalid or no plan satisfies it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from hetero_operator.planner.api import KINDS, solve_json
from hetero_operator.planner.errors import PlanningError

app = typer.Typer(help="Solve planning problems: JSON in, JSON out.", no_args_is_help=True)

SourceArg = Annotated[str, typer.Argument(metavar="FILE|-", help="JSON request file, or - for stdin.")]

INVALID_INPUT = 2


def describe_validation_error(exc: ValidationError) -> str:
    """One line per problem: ``field.path: what is wrong``."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field; remove it (see docs/planner.md for the contract)"
        lines.append(f"{loc}: {msg}" if loc else msg)
    return "\n".join(lines)


def _read(source: str) -> str:
    if source == "-":
        return sys.stdin.read()
    path = Path(source)
    if not path.is_file():
        typer.echo(f"FILE: {source} does not exist", err=True)
        raise typer.Exit(INVALID_INPUT)
    return path.read_text()


def _run(kind: str, source: str) -> None:
    try:
        answer = solve_json(kind, _read(source))
    except ValidationError as exc:
        typer.echo(f"invalid {kind} request:\n{describe_validation_error(exc)}", err=True)
        raise typer.Exit(INVALID_INPUT) from None
    except PlanningError as exc:
        typer.echo(f"no {kind} plan: {exc}", err=True)
        raise typer.Exit(INVALID_INPUT) from None
    typer.echo(answer)


def _register(kind: str, summary: str) -> None:
    def command(source: SourceArg) -> None:
        _run(kind, source)

    command.__doc__ = summary
    app.command(name=kind)(command)


_SUMMARIES = {
    "batch": "Optimal integer local batches across unequal GPUs (OptPerf).",
    "pipeline": "Minimum-bottleneck pipeline partition and GPU order for one virtual worker.",
    "dreamddp": "DreamDDP layer-sync schedule over a period of H iterations.",
    "esync": "ESync local step counts per device for one round.",
    "sesgd": "SESGD shuffled groups for each step from a shared seed.",
    "vw": "Group GPUs into virtual workers (NP, ED, HD or auto).",
}
assert set(_SUMMARIES) == set(KINDS)
for _kind, _summary in _SUMMARIES.items():
    _register(_kind, _summary)
