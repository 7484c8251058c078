"""ESync's state query service: after every local step a worker asks whether to take another.

The rule (ESync's QUERY-STATE): stop if you are the slowest worker, if the slowest has already
stopped, or if one more step of yours would not end at least ε before the slowest finishes its
current step. Times are stamped with the service's own clock on receipt, so worker clock skew
cannot corrupt the prediction. Rank 0 runs it as a separate light process, so the service never
competes with rank 0's training loop for the interpreter lock; it listens on rank 0's pod address,
admits only the job's ranks (`job_peers`) and speaks JSON lines over TCP:
`python -m hetero_runtime.esync_service` with its configuration on stdin.
"""

from __future__ import annotations

import json
import socketserver
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from hetero_runtime.job_peers import (
    JobPeers,
    PeerRefused,
    admit,
    connect,
    report_listening,
    serve_while_parent_lives,
    service_config,
    start_service,
)

RECENT_STEPS = 5


@dataclass
class DeviceRecord:
    step_seconds: float = 0.0  # c: median of the device's recent step times
    last_finish: float = 0.0  # service clock when it reported finishing that step
    ready: bool = False
    round: int = 0


def decide_ready(
    records: dict[int, DeviceRecord], rank: int, local_steps: int, margin: float, now: float
) -> bool:
    """Pure QUERY-STATE decision for `rank` after `local_steps` steps this round."""
    if local_steps == 0:
        return False
    me = records[rank]
    slowest = max(records, key=lambda r: (records[r].step_seconds, r))
    other = records[slowest]
    if other.round < me.round:  # the slowest has not finished the previous aggregation yet
        return False
    rest = other.step_seconds - (now - other.last_finish)
    return slowest == rank or other.ready or me.step_seconds + margin > rest


class StateService:
    """Thread-safe record keeping plus the decision; `serve` exposes it on a TCP port."""

    def __init__(self, world_size: int, margin_seconds: float) -> None:
        self.margin = margin_seconds
        self.records = {rank: DeviceRecord() for rank in range(world_size)}
        self.recent: dict[int, list[float]] = {}
        self.lock = threading.Lock()
        self.server: socketserver.ThreadingTCPServer | None = None

    def query(self, rank: int, local_steps: int, step_seconds: float) -> bool:
        with self.lock:
            now = time.monotonic()
            record = self.records[rank]
            if step_seconds > 0:  # a median of recent steps: one step delayed by the OS is not a slow device
                recent = self.recent.setdefault(rank, [])
                recent[:] = [*recent[-(RECENT_STEPS - 1) :], step_seconds]
                record.step_seconds = statistics.median(recent)
            record.last_finish = now
            ready = decide_ready(self.records, rank, local_steps, self.margin, now)
            if ready:
                record.ready = True
            return ready

    def reset(self, rank: int, round_index: int) -> None:
        with self.lock:
            record = self.records[rank]
            record.ready, record.round, record.last_finish = False, round_index, time.monotonic()

    def serve(self, peers: JobPeers, host: str, port: int) -> None:
        service = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                try:
                    rank = admit(
                        self.request, self.rfile, self.client_address[0], peers, "esync state service"
                    )
                except PeerRefused:
                    return
                for line in self.rfile:
                    try:
                        message = json.loads(line)
                        op = message["op"]
                        if op == "query":
                            answer = service.query(rank, int(message["k"]), float(message["c"]))
                        elif op == "reset":
                            service.reset(rank, int(message["round"]))
                            answer = True
                        else:
                            return
                    except (ValueError, KeyError, TypeError):
                        return  # a malformed message ends the connection
                    self.wfile.write(b"1\n" if answer else b"0\n")

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.server = socketserver.ThreadingTCPServer((host, port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def shutdown(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


class StateClient:
    """A worker's connection to the service (one request in flight at a time); the service knows
    the rank from the connection's hello, so a message cannot speak for another rank."""

    def __init__(self, host: str, port: int, own: str, rank: int, token: str, timeout: float = 60.0) -> None:
        self.sock = connect(host, port, own, {"rank": rank, "token": token}, timeout)
        self.reader = self.sock.makefile("rb")

    def _call(self, message: dict[str, object]) -> bool:
        self.sock.sendall(json.dumps(message).encode() + b"\n")
        answer = self.reader.readline().strip()
        if not answer:
            raise ConnectionError("the esync state service closed the connection")
        return answer == b"1"

    def query(self, rank: int, local_steps: int, step_seconds: float) -> bool:
        del rank  # the service answers for the rank this connection introduced itself as
        return self._call({"op": "query", "k": local_steps, "c": step_seconds})

    def reset(self, rank: int, round_index: int) -> None:
        del rank
        self._call({"op": "reset", "round": round_index})

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


def start_service_process(
    peers: JobPeers, host: str, port: int, world_size: int, margin_seconds: float
) -> tuple[subprocess.Popen[bytes], int]:
    """Run the service beside this worker (the caller terminates it when training ends); the process
    and the port it listens on (`port`, or the system's choice when 0)."""
    config = service_config(peers, host, port, world_size=world_size, margin_seconds=margin_seconds)
    return start_service("hetero_runtime.esync_service", config)


def main() -> None:
    config = json.loads(sys.stdin.read())
    service = StateService(int(config["world_size"]), float(config["margin_seconds"]))
    service.serve(JobPeers.from_json(config["peers"]), str(config["host"]), int(config["port"]))
    assert service.server is not None
    report_listening(service.server.server_address[1])
    serve_while_parent_lives(int(config["parent"]))


if __name__ == "__main__":
    main()
