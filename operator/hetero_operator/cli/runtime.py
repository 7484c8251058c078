"""Worker-side commands (`heterotrain worker`, `heterotrain run-local`); torch is imported lazily."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from hetero_operator.plan import Strategy
from hetero_operator.warm_start import COLD_STARTS_ENV, WARM_START_ENV, warm_server

console = Console(stderr=True)


def worker(
    target: Annotated[
        list[str],
        typer.Argument(
            help="Bundled example (digits, tiny_lm), module with main() or script.py; or, after --, a "
            "command such as `-- python train.py ARGS`, run with torchrun's environment.",
            show_default=False,
        ),
    ],
) -> None:
    """Run one worker of a job; rank, world and plan location come from the environment."""
    from hetero_runtime.worker import exec_command, run_worker

    if len(target) == 1:
        run_worker(target[0])
    else:
        exec_command(target)


def run_local(
    target: Annotated[
        list[str],
        typer.Argument(
            help="Bundled example (digits, tiny_lm), module with main() or script.py; or, after --, a "
            "command such as `-- python train.py ARGS`, each worker started as `heterotrain worker --`.",
            show_default=False,
        ),
    ],
    workers: Annotated[int, typer.Option(min=1, help="Number of worker processes.")] = 3,
    speeds: Annotated[str, typer.Option(help="Simulated speed per worker, e.g. 1,0.5,0.25.")] = "",
    strategy: Annotated[Strategy, typer.Option(help="Training strategy.")] = Strategy.DATA,
    epochs: Annotated[int | None, typer.Option(min=1, help="Epochs (default: the example's).")] = None,
    global_batch: Annotated[int, typer.Option(min=1, help="Global batch size.")] = 64,
    work_dir: Annotated[
        Path | None, typer.Option(help="Plan, checkpoints, logs, results (default: a temp dir).")
    ] = None,
    max_restarts: Annotated[int, typer.Option(min=0, help="Restarts from checkpoint after a failure.")] = 2,
    timeout: Annotated[float, typer.Option(help="Give up after this many seconds.")] = 3600.0,
) -> None:
    """Run a whole job on this machine: one process per worker on loopback (gloo)."""
    from hetero_runtime.local import LocalJob, LocalJobSpec, example_layer_costs, initial_plan, parse_speeds

    try:
        speed_list = parse_speeds(speeds or ",".join(["1"] * workers), workers)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--speeds") from None
    directory = work_dir or Path(tempfile.mkdtemp(prefix="heterotrain-local-"))
    command = target if len(target) > 1 else None
    example = Path(target[0]).name if command else target[0]
    if command and strategy != Strategy.DATA:
        raise typer.BadParameter(
            "a training script of your own runs the data strategy only: drop --strategy",
            param_hint="--strategy",
        )
    costs = example_layer_costs(example) if strategy == Strategy.HETPIPE else None
    plan = initial_plan(strategy, speed_list, global_batch, layer_costs=costs)
    spec = LocalJobSpec(
        target=example,
        speeds=speed_list,
        work_dir=directory,
        plan=plan,
        epochs=epochs,
        max_restarts=max_restarts,
        command=command,
    )
    console.print(
        f"[bold]{example}[/]: {workers} workers, strategy [cyan]{strategy.value}[/], simulated speeds "
        f"{speed_list}, local batches {plan.local_batches}; files in {directory}"
    )
    with Progress(
        TextColumn("[bold blue]epoch"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("starting", total=epochs)

        def show(update: dict[str, Any]) -> None:
            # A script of the user's own reports no loss, and its epoch count only if it said so.
            loss = update.get("loss")
            shown = {"loss": loss} if loss is not None else {}
            shown.update(update.get("evaluation", {}))
            metrics = " ".join(f"{k}={v:.4f}" for k, v in shown.items())
            progress.update(
                task,
                completed=update["epoch"],
                total=update.get("epochs") or None,
                description=f"{metrics} plan=v{update['plan_version']}".lstrip(),
            )

        job = LocalJob(spec, on_progress=show)
        with warm_starts(directory):
            code = job.run(timeout)
    if code != 0:
        console.print(f"[red]job failed[/] (exit {code}); worker logs in {directory / 'logs'}")
        raise typer.Exit(code)
    final = job.results()[0].get("final_evaluation", {})  # a script of the user's own evaluates itself
    console.print(
        f"[green]done[/]{f': {final}' if final else ''} after {job.restarts} restart(s); "
        f"results in {directory / 'results'}"
    )


@contextlib.contextmanager
def warm_starts(directory: Path) -> Iterator[None]:
    """The job's workers (and their restarts) start warm, forked from one interpreter that imported
    torch once (`hetero_operator.warm_start`), unless a warm server runs already or
    HETEROTRAIN_COLD_STARTS=1 asks for fresh ones."""
    if os.environ.get(WARM_START_ENV) or os.environ.get(COLD_STARTS_ENV) == "1":
        yield
        return
    with warm_server(directory / "warm"):
        yield


def register(app: typer.Typer) -> None:
    """Add the runtime commands to the top-level app."""
    # After `--` every word is the command's (`-- python train.py --epochs 3`), options included.
    app.command("worker")(worker)
    app.command("run-local")(run_local)
