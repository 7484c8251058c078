"""A container's main process as the host kernel sees it: an expectation independent of podman's own
account of what it set up."""

from __future__ import annotations

from pathlib import Path

from hetero_operator.testbed.container_store import Engine


def kernel_view(engine: Engine, name: str) -> dict[str, str] | None:
    """The container's main process as the host kernel sees it (uid, capabilities, root mount); None
    while it is not running."""
    inspected = engine.run("podman", "inspect", "--format", "{{.State.Pid}}", name, check=False)
    pid = inspected.stdout.strip()
    if inspected.returncode != 0 or pid in ("", "0") or not Path(f"/proc/{pid}").exists():
        return None
    try:
        status_text = Path(f"/proc/{pid}/status").read_text()
        mounts = Path(f"/proc/{pid}/mountinfo").read_text()
    except OSError:
        return None  # it has just exited
    status = dict(line.split(":", 1) for line in status_text.splitlines() if ":" in line)
    root_mount = next(line.split() for line in mounts.splitlines() if line.split()[4] == "/")
    return {"uid": status["Uid"].split()[0], "caps": status["CapEff"].strip(), "root_options": root_mount[5]}
