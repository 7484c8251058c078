"""`heterotrain testbed ...`: build, start, inspect and stop the local Kubernetes test bed."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from hetero_operator.testbed import build, images, kueue
from hetero_operator.testbed.cluster import Testbed, TestbedError
from hetero_operator.testbed.nodes import load_node_list
from hetero_operator.testbed.versions import REPO_ROOT

app = typer.Typer(
    help="The local test bed: a real Kubernetes control plane with fake GPU nodes.", no_args_is_help=True
)
console = Console(stderr=True)

DEFAULT_NODES = REPO_ROOT / "examples" / "nodes.yaml"
RootOption = Annotated[
    Path | None,
    typer.Option("--dir", help="Directory of the test bed (certificates, data, logs, kubeconfig)."),
]


@app.command("build")
def build_cmd() -> None:
    """Build every missing test-bed binary into the versioned cache (the first time takes a while)."""
    with console.status("building the test bed") as status:
        out = build.build_all(on_step=lambda msg: status.update(msg))
    console.print(f"binaries cached in {out}")


@app.command("images")
def images_cmd() -> None:
    """Build the base, operator and trainer images that are missing for these sources (buildah, no
    Docker engine or registry) and list them; cached by content in the test bed's container store."""
    try:
        with console.status("building images") as status:
            tags = images.ensure_images(on_step=lambda msg: status.update(msg))
    except RuntimeError as err:
        console.print(f"[red]{err}[/red]")
        raise typer.Exit(1) from err
    table = Table("image", "tag")
    for name, tag in tags.items():
        table.add_row(name, tag)
    Console().print(table)


@app.command("bin")
def bin_cmd(
    name: Annotated[str, typer.Argument(help="kubectl, kube-apiserver, etcd, kwok, helm, prometheus, ...")],
) -> None:
    """Print the path of one built test-bed binary."""
    try:
        typer.echo(build.binary(name))
    except (KeyError, FileNotFoundError) as err:
        console.print(f"[red]{err}[/red]")
        raise typer.Exit(2) from err


@app.command()
def up(
    nodes: Annotated[
        Path, typer.Option("--nodes", help="Node list YAML: nodes: [{name, gpuClass, gpus, labels}].")
    ] = DEFAULT_NODES,
    root: RootOption = None,
    with_kueue: Annotated[
        bool, typer.Option("--with-kueue", help="Also install Kueue's CRDs and start Kueue.")
    ] = False,
) -> None:
    """Start the test bed (idempotent) and create the GPU nodes. The last line is KUBECONFIG=<path>."""
    node_list = load_node_list(nodes) if nodes.exists() else None
    testbed = Testbed(root)
    try:
        with console.status("starting the test bed") as status:
            testbed.up(node_list, on_step=lambda msg: status.update(msg))
            if with_kueue:
                kueue.start(testbed, on_step=lambda msg: status.update(msg))
    except TestbedError as err:
        console.print(f"[red]test bed failed:[/red] {err}")
        raise typer.Exit(1) from err
    console.print(f"API server {testbed.apiserver_url}, Prometheus {testbed.prometheus_url}")
    typer.echo(f"KUBECONFIG={testbed.kubeconfig}")


@app.command()
def kubeconfig(root: RootOption = None) -> None:
    """Print the path of the test bed's kubeconfig."""
    typer.echo(Testbed(root).kubeconfig)


@app.command()
def status(root: RootOption = None) -> None:
    """Show each component and whether it runs; exit 1 when the test bed is not fully up."""
    testbed = Testbed(root)
    components = testbed.component_status()
    if not components:
        console.print("the test bed is down")
        raise typer.Exit(1)
    table = Table("component", "running", "log")
    state = testbed.state
    for name, running in components.items():
        log = state.processes[name]["log"] if state else ""
        table.add_row(name, "[green]yes[/green]" if running else "[red]no[/red]", log)
    Console().print(table)
    up_now = testbed.is_up()
    if up_now:
        Console().print(f"API server {testbed.apiserver_url}\nPrometheus {testbed.prometheus_url}")
        Console().print(f"KUBECONFIG={testbed.kubeconfig}")
    raise typer.Exit(0 if up_now else 1)


@app.command()
def down(root: RootOption = None) -> None:
    """Stop every test-bed process."""
    Testbed(root).down()
    console.print("the test bed is down")
