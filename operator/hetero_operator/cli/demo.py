"""`heterotrain demo`: a real job on the local test bed that rebalances as it trains."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def demo(
    output: Annotated[Path, typer.Option(help="Where the report and the plot go.")] = Path("demo-output"),
    keep: Annotated[bool, typer.Option(help="Leave the test bed running afterwards.")] = False,
    timeout: Annotated[float, typer.Option(help="Give up after this many seconds.")] = 900.0,
) -> None:
    """Test bed with three local GPU nodes (priors 1, 0.5, 0.25; true speeds 1, 0.5, 0.15), the
    operator, and the digits example as a HeteroTrainJob after three baselines (even split, priors'
    split, fastest GPU alone): a live view while it trains, then a report and a plot."""
    from hetero_operator.demo.run import DemoSettings, main

    raise typer.Exit(main(DemoSettings(output=output, timeout_seconds=timeout, keep_cluster=keep)))
