"""Who may talk to a job's side services (HetPipe's parameter server, ESync's state service).

The services listen on the address of the pod that runs them, never on every interface, and admit a
connection only if it says it is rank r of the job, comes from rank r's address, and presents the
job's token. The token is drawn by rank 0 at start and handed to the ranks through the process
group, so only processes that joined the job's rendezvous hold it. Messages are JSON and raw tensor
bytes (`wire`): nothing a peer sends is ever unpickled.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from hetero_runtime.wire import ByteStream

log = logging.getLogger(__name__)


class PeerRefused(ConnectionError):
    """A connection that is not a rank of the job."""


@dataclass(frozen=True)
class JobPeers:
    token: str
    addresses: tuple[str, ...]  # each rank's own address, by rank

    def to_json(self) -> dict[str, Any]:
        return {"token": self.token, "addresses": list(self.addresses)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobPeers:
        return cls(str(data["token"]), tuple(str(a) for a in data["addresses"]))

    def admits(self, hello: dict[str, Any], peer_address: str) -> str | None:
        """None when `hello` from `peer_address` is a rank of the job, else why it is refused."""
        rank = hello.get("rank")
        if not isinstance(rank, int) or not 0 <= rank < len(self.addresses):
            return f"rank {rank!r} is not a rank of this job"
        if peer_address != self.addresses[rank]:
            return f"rank {rank} connects from {peer_address}, not from its address {self.addresses[rank]}"
        token = hello.get("token")
        if not isinstance(token, str) or not hmac.compare_digest(token, self.token):
            return f"rank {rank} presented a wrong token"
        return None


def own_address(pod_ip: str | None, master_addr: str) -> str:
    """This worker's address: the pod's, else the one its host uses to reach rank 0."""
    if pod_ip:
        return pod_ip
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((socket.gethostbyname(master_addr), 9))  # no packet is sent for UDP connect
        return str(probe.getsockname()[0])


def connect(
    host: str, port: int, own: str, hello: dict[str, Any], timeout_seconds: float, wait_seconds: float = 60.0
) -> socket.socket:
    """A connection from this rank's own address (the service checks it), retried while the service
    starts, and introduced with `hello` (its rank and the job's token)."""
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=timeout_seconds, source_address=(own, 0))
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(json.dumps(hello).encode() + b"\n")
    return sock


HELLO_SECONDS = 5.0


def admit(
    connection: socket.socket, stream: ByteStream, peer_address: str, peers: JobPeers, service: str
) -> int:
    """Read a connection's hello line (within HELLO_SECONDS); its rank if admitted, else PeerRefused
    (logged). Nothing else is read from a connection before it is admitted."""
    connection.settimeout(HELLO_SECONDS)
    try:
        line = stream.readline(4096)
    except OSError:
        line = b""
    connection.settimeout(None)
    try:
        hello = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        hello = None
    why = peers.admits(hello, peer_address) if isinstance(hello, dict) else "no hello"
    if why is not None:
        log.warning("%s: refused a connection from %s: %s", service, peer_address, why)
        raise PeerRefused(why)
    assert isinstance(hello, dict)
    return int(hello["rank"])


def service_config(peers: JobPeers, host: str, port: int, **settings: Any) -> bytes:
    """What a service process reads from its stdin (the token never appears on a command line), with
    the worker that starts it, whose end ends the service."""
    parent = os.getpid()
    return json.dumps(
        {"peers": peers.to_json(), "host": host, "port": port, "parent": parent, **settings}
    ).encode()


def start_service(module: str, config: bytes) -> tuple[subprocess.Popen[bytes], int]:
    """Run a side service's module beside this worker, its configuration on stdin; the process and the
    port it listens on, which it reports once bound (port 0 in the configuration: the system's choice,
    so that no other process on the host can hold it first)."""
    process = subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(config)
    process.stdin.close()
    line = process.stdout.readline()
    process.stdout.close()
    if not line:
        code = process.wait(timeout=30)
        raise RuntimeError(f"{module} exited with {code} before it listened (its error is in this log above)")
    return process, int(json.loads(line)["port"])


def report_listening(port: int) -> None:
    """A service process's first and only line on stdout: the port it bound. Anything it prints later
    goes to stderr (the worker stopped reading)."""
    sys.stdout.write(json.dumps({"port": port}) + "\n")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())


def serve_while_parent_lives(parent: int, interval_seconds: float = 0.5) -> None:
    """A service process's last call: serve (on its threads) until the worker that started it
    (`parent`, from its configuration) is gone, however that worker ended: its close(), an exit that
    skipped its atexit handlers, a kill. The worker may end as soon as it has the port, before this
    call: its own parent id read here would then already name whoever adopted the service."""
    while os.getppid() == parent:
        time.sleep(interval_seconds)
