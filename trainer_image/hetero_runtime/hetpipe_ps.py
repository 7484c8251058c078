"""HetPipe's parameter server for Wave Synchronous Parallel: global weights plus per-VW clocks.

A virtual worker (VW) finishes clock c when every one of its stages has pushed the summed update
of wave c; the global clock is the minimum over VWs. A pull can ask to wait until the global clock
reaches a bound, which is how the WSP admission gate blocks a VW that is too far ahead. It runs as
a separate light process on rank 0 (numpy only) and speaks length-prefixed pickles over TCP to the
job's own workers: `python -m hetero_runtime.hetpipe_ps PORT STAGES_OF_VW0,STAGES_OF_VW1,...`.
"""

from __future__ import annotations

import pickle
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np

_HEADER = struct.Struct("!Q")


def _send(sock: socket.socket, payload: Any) -> None:
    data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEADER.pack(len(data)) + data)


def _receive(stream: Any) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise ConnectionError("parameter server connection closed")
    (length,) = _HEADER.unpack(header)
    return pickle.loads(stream.read(length))


class ParameterServer:
    def __init__(self, stages_per_vw: list[int]) -> None:
        self.stages_per_vw = stages_per_vw
        self.weights: dict[str, np.ndarray] = {}
        self.local_clock = [0] * len(stages_per_vw)
        self.pushed: dict[tuple[int, int], set[int]] = {}
        self.condition = threading.Condition()

    def global_clock(self) -> int:
        return min(self.local_clock)

    def initialize(self, weights: dict[str, np.ndarray]) -> None:
        with self.condition:
            for name, value in weights.items():
                self.weights.setdefault(name, value.copy())

    def push(self, vw: int, stage: int, clock: int, deltas: dict[str, np.ndarray]) -> int:
        """Apply a stage's wave update; returns the global clock afterwards."""
        with self.condition:
            for name, delta in deltas.items():
                self.weights[name] += delta
            done = self.pushed.setdefault((vw, clock), set())
            done.add(stage)
            if len(done) == self.stages_per_vw[vw]:
                del self.pushed[(vw, clock)]
                self.local_clock[vw] = max(self.local_clock[vw], clock + 1)
                self.condition.notify_all()
            return self.global_clock()

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

    def serve(self, host: str, port: int) -> socketserver.ThreadingTCPServer:
        server_state = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                while True:
                    try:
                        op, args = _receive(self.rfile)
                    except ConnectionError:
                        return
                    if op == "init":
                        server_state.initialize(*args)
                        answer: Any = True
                    elif op == "push":
                        answer = server_state.push(*args)
                    elif op == "pull":
                        answer = server_state.pull(*args)
                    else:
                        answer = server_state.global_clock()
                    _send(self.request, answer)

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        server = socketserver.ThreadingTCPServer((host, port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server


class ParameterServerClient:
    def __init__(self, host: str, port: int, timeout_seconds: float = 120.0) -> None:
        self.timeout = timeout_seconds
        deadline = time.monotonic() + 60
        while True:
            try:
                self.sock = socket.create_connection((host, port), timeout=timeout_seconds)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.stream = self.sock.makefile("rb")

    def _call(self, op: str, *args: Any) -> Any:
        _send(self.sock, (op, args))
        return _receive(self.stream)

    def initialize(self, weights: dict[str, np.ndarray]) -> None:
        self._call("init", weights)

    def push(self, vw: int, stage: int, clock: int, deltas: dict[str, np.ndarray]) -> int:
        return int(self._call("push", vw, stage, clock, deltas))

    def pull(self, names: list[str], min_clock: int) -> tuple[dict[str, np.ndarray], int]:
        weights, clock = self._call("pull", names, min_clock, self.timeout)
        return weights, int(clock)

    def close(self) -> None:
        self.stream.close()
        self.sock.close()


def start_server_process(port: int, stages_per_vw: list[int]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "hetero_runtime.hetpipe_ps", str(port), ",".join(map(str, stages_per_vw))]
    )


def main(argv: list[str]) -> None:
    server = ParameterServer([int(x) for x in argv[1].split(",")])
    server.serve("0.0.0.0", int(argv[0]))
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1:])
