"""HetPipe's parameter server for Wave Synchronous Parallel: global weights plus per-VW clocks.

A virtual worker (VW) finishes clock c when every one of its stages has pushed the summed update
of wave c; the global clock is the minimum over VWs. A pull can ask to wait until the global clock
reaches a bound, which is how the WSP admission gate blocks a VW that is too far ahead.

It also settles when a job asked to stop (checkpoint first) stops: VWs run at their own pace, so
the first push that carries a stop request fixes a wave count every stage can still reach (one more
than the most waves any stage has pushed); each stage stops once it has pushed that many, so all
end at the same wave and the checkpoint's sampler position holds for every VW.

It runs as a separate light process on rank 0 (numpy only), listens on rank 0's pod address, admits
only the job's ranks (`job_peers`) and speaks JSON plus raw arrays (`wire`):
`python -m hetero_runtime.hetpipe_ps` with its configuration on stdin.
"""

from __future__ import annotations

import json
import socketserver
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np

from hetero_runtime import wire
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


class ParameterServer:
    def __init__(self, stages_per_vw: list[int]) -> None:
        self.stages_per_vw = stages_per_vw
        self.weights: dict[str, np.ndarray] = {}
        self.local_clock = [0] * len(stages_per_vw)
        self.pushed: dict[tuple[int, int], set[int]] = {}
        self.waves_pushed: dict[tuple[int, int], int] = {}  # (vw, stage) -> waves pushed
        self.stop_after: int | None = None
        self.condition = threading.Condition()

    def global_clock(self) -> int:
        return min(self.local_clock)

    def initialize(self, weights: dict[str, np.ndarray]) -> None:
        with self.condition:
            for name, value in weights.items():
                self.weights.setdefault(name, value.copy())

    def push(
        self, vw: int, stage: int, clock: int, deltas: dict[str, np.ndarray], stop: bool = False
    ) -> tuple[int, int | None]:
        """Apply a stage's wave update; returns the global clock afterwards and the wave count at
        which every stage stops (None while no stop was asked for)."""
        with self.condition:
            unknown = sorted(set(deltas) - set(self.weights))
            if unknown:
                raise KeyError(f"parameters never initialised: {unknown[:3]}")
            for name, delta in deltas.items():
                self.weights[name] += delta
            self.waves_pushed[(vw, stage)] = clock + 1
            if stop and self.stop_after is None:
                self.stop_after = max(self.waves_pushed.values()) + 1
            done = self.pushed.setdefault((vw, clock), set())
            done.add(stage)
            if len(done) == self.stages_per_vw[vw]:
                del self.pushed[(vw, clock)]
                self.local_clock[vw] = max(self.local_clock[vw], clock + 1)
                self.condition.notify_all()
            return self.global_clock(), self.stop_after

    def pull(self, names: list[str], min_clock: int, timeout: float) -> tuple[dict[str, np.ndarray], int]:
        """Weights once the global clock reaches `min_clock`, and the clock they reflect."""
        deadline = time.monotonic() + timeout
        with self.condition:
            while self.global_clock() < min_clock:
                if not self.condition.wait(timeout=max(0.0, deadline - time.monotonic())):
                    raise TimeoutError(f"global clock stuck at {self.global_clock()} < {min_clock}")
            missing = [name for name in names if name not in self.weights]
            if missing:
                raise KeyError(f"parameters never initialised: {missing[:3]}")
            return {name: self.weights[name].copy() for name in names}, self.global_clock()

    def answer(self, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict[str, Any], Any]:
        """One request's reply (header, arrays)."""
        op = header.get("op")
        if op == "init":
            self.initialize(arrays)
            return {"ok": True}, None
        if op == "push":
            clock, stop_after = self.push(
                int(header["vw"]), int(header["stage"]), int(header["clock"]), arrays, bool(header["stop"])
            )
            return {"clock": clock, "stop_after": stop_after}, None
        if op == "pull":
            names = [str(n) for n in header["names"]]
            weights, clock = self.pull(names, int(header["min_clock"]), float(header["timeout"]))
            return {"clock": clock}, weights
        return {"error": f"unknown operation {op!r}"}, None

    def serve(self, peers: JobPeers, host: str, port: int) -> socketserver.ThreadingTCPServer:
        server_state = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                try:
                    admit(self.request, self.rfile, self.client_address[0], peers, "hetpipe parameter server")
                except PeerRefused:
                    return
                while True:
                    try:
                        header, arrays = wire.receive(self.rfile)
                    except wire.WireError:
                        return
                    try:
                        reply, out = server_state.answer(header, arrays)
                    except (KeyError, ValueError, TypeError, TimeoutError) as error:
                        reply, out = {"error": str(error)}, None
                    wire.send(self.request, reply, out)

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        server = socketserver.ThreadingTCPServer((host, port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server


class ParameterServerError(RuntimeError):
    """The parameter server refused a request."""


class ParameterServerClient:
    def __init__(
        self, host: str, port: int, own: str, rank: int, token: str, timeout_seconds: float = 120.0
    ) -> None:
        self.timeout = timeout_seconds
        self.sock = connect(host, port, own, {"rank": rank, "token": token}, timeout_seconds)
        self.stream = self.sock.makefile("rb")

    def _call(self, header: dict[str, Any], arrays: dict[str, np.ndarray] | None = None) -> tuple[Any, Any]:
        wire.send(self.sock, header, arrays)
        reply, out = wire.receive(self.stream)
        if "error" in reply:
            raise ParameterServerError(reply["error"])
        return reply, out

    def initialize(self, weights: dict[str, np.ndarray]) -> None:
        self._call({"op": "init"}, weights)

    def push(
        self, vw: int, stage: int, clock: int, deltas: dict[str, np.ndarray], stop: bool = False
    ) -> tuple[int, int | None]:
        reply, _ = self._call({"op": "push", "vw": vw, "stage": stage, "clock": clock, "stop": stop}, deltas)
        stop_after = reply["stop_after"]
        return int(reply["clock"]), None if stop_after is None else int(stop_after)

    def pull(self, names: list[str], min_clock: int) -> tuple[dict[str, np.ndarray], int]:
        reply, weights = self._call(
            {"op": "pull", "names": names, "min_clock": min_clock, "timeout": self.timeout}
        )
        return weights, int(reply["clock"])

    def close(self) -> None:
        self.stream.close()
        self.sock.close()


def start_server_process(
    peers: JobPeers, host: str, port: int, stages_per_vw: list[int]
) -> tuple[subprocess.Popen[bytes], int]:
    """Run the server beside this worker; the process and the port it listens on (`port`, or the
    system's choice when 0)."""
    return start_service(
        "hetero_runtime.hetpipe_ps", service_config(peers, host, port, stages_per_vw=stages_per_vw)
    )


def main() -> None:
    config = json.loads(sys.stdin.read())
    server = ParameterServer([int(x) for x in config["stages_per_vw"]])
    listening = server.serve(JobPeers.from_json(config["peers"]), str(config["host"]), int(config["port"]))
    report_listening(listening.server_address[1])
    serve_while_parent_lives(int(config["parent"]))


if __name__ == "__main__":
    main()
