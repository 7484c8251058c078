"""Start and stop the test bed's long-running processes, each in its own process group."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    """A free TCP port on loopback (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# The Popen objects of the processes we launched, by pid, until their exit status is collected.
# Held so that none is garbage-collected: Popen's finaliser reaps a child that already ended (and
# the subprocess module reaps the others at the next Popen), which would take the exit status that
# exit_status() is there to report.
_children: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True)
class Launched:
    name: str
    pid: int
    binary: str
    log: Path


def launch(name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None) -> Launched:
    """Start `argv` detached from our process group, output to `<log_dir>/<name>.log`."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    with log.open("ab") as sink:
        proc = subprocess.Popen(
            argv,
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    _children[proc.pid] = proc
    # Popen returns once the child's close-on-exec files are closed, which the kernel does a moment
    # before /proc/<pid>/cmdline shows the new program (1 launch in 100 here): until it does,
    # is_running() would call the new process gone, and a start-up check would give up on it.
    deadline = time.monotonic() + 5.0
    while not is_running(proc.pid, argv[0]) and _state(proc.pid) not in (None, "Z"):
        if time.monotonic() > deadline:
            break
        time.sleep(0.001)
    return Launched(name=name, pid=proc.pid, binary=argv[0], log=log)


def wait_for_exec(pid: int, binary: str, timeout: float = 10.0) -> None:
    """Wait until `pid` runs `binary` (a launcher execs it) or has ended; whoever checks on it next
    reports which."""
    deadline = time.monotonic() + timeout
    while not is_running(pid, binary) and _state(pid) not in (None, "Z") and time.monotonic() < deadline:
        time.sleep(0.01)


def _state(pid: int) -> str | None:
    """The process's state letter from /proc (R, S, Z, ...); None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def is_running(pid: int, binary: str) -> bool:
    """True when `pid` is alive and still runs `binary` (guards against a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return cmdline == binary and _state(pid) not in (None, "Z")


def stop(pid: int, binary: str, grace_seconds: float = 10.0) -> None:
    """SIGTERM the process group we started, then SIGKILL it if it lingers."""
    if not is_running(pid, binary):
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline:
        _reap(pid)
        if not is_running(pid, binary):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    _reap(pid)


def _reap(pid: int) -> None:
    """Collect the exit status when the process is our child, so it does not stay a zombie."""
    exit_status(pid)


def exit_status(pid: int) -> str | None:
    """How our child `pid` ended ("exit code 1", "signal 9"), reaping it; None while it runs or when
    it is not our child (then nobody here can know)."""
    try:
        reaped, status = os.waitpid(pid, os.WNOHANG)
    except (ChildProcessError, ProcessLookupError):
        _forget(pid, None)
        return None
    if reaped == 0:
        return None
    code = os.waitstatus_to_exitcode(status)
    _forget(pid, code)
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit code {code}"


def _forget(pid: int, code: int | None) -> None:
    """Drop our hold on a reaped child; its Popen learns the code so it never waits on the pid again
    (which by then may belong to another process)."""
    proc = _children.pop(pid, None)
    if proc is not None:
        proc.returncode = 0 if code is None else code
