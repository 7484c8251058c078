"""`heterotrain demo`: the test bed with GPU nodes of three classes and an example job."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.panel import Panel

from hetero_operator.testbed.cluster import Testbed, TestbedError
from hetero_operator.testbed.nodes import load_node_list
from hetero_operator.testbed.versions import REPO_ROOT

EXAMPLES = REPO_ROOT / "examples"
console = Console()


def demo(
    keep: Annotated[bool, typer.Option(help="Leave the test bed running after the demo.")] = True,
) -> None:
    """Bring up the test bed, install the API and example GPU classes, and submit the digits job."""
    testbed = Testbed()
    try:
        with console.status("starting the test bed") as status:
            testbed.up(load_node_list(EXAMPLES / "nodes.yaml"), on_step=lambda msg: status.update(msg))
            status.update("applying GPU classes and the example job")
            testbed.kubectl("apply", "-f", str(EXAMPLES / "gpuclasses.yaml"))
            testbed.kubectl("apply", "-f", str(EXAMPLES / "job-digits.yaml"))
    except TestbedError as err:
        console.print(f"[red]the test bed did not start:[/red] {err}")
        raise typer.Exit(1) from err
    shown = testbed.kubectl("get", "nodes,gpuclasses,htj", "-L", "nvidia.com/gpu.product").stdout
    console.print(Panel(shown.rstrip(), title="kubectl get nodes,gpuclasses,htj"))
    console.print(
        "The job is [bold]accepted and validated[/bold] by the API server. "
        "Next: the operator places it on a mix of GPU classes, starts its workers and rebalances "
        "their batches from Prometheus metrics."
    )
    console.print(f"Explore it yourself:  export KUBECONFIG={testbed.kubeconfig}")
    if not keep:
        testbed.down()
        console.print("test bed stopped")
