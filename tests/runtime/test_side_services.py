"""The parameter server and the ESync state service listen on one address, admit only the job's ranks
(rank, address and token), and read JSON and raw arrays only: a pickle is never loaded."""

from __future__ import annotations

import pickle
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hetero_runtime import wire
from hetero_runtime.esync_service import StateClient, StateService
from hetero_runtime.hetpipe_ps import ParameterServer, ParameterServerClient
from hetero_runtime.job_peers import JobPeers
from hetero_runtime.local import free_port

pytestmark = pytest.mark.ranks

TOKEN = "0123456789abcdef0123456789abcdef"
PEERS = JobPeers(TOKEN, ("127.0.0.1", "127.0.0.1", "127.0.0.3"))


def test_a_peer_is_admitted_only_as_a_rank_from_its_address_with_the_token() -> None:
    assert PEERS.admits({"rank": 1, "token": TOKEN}, "127.0.0.1") is None
    assert "not a rank" in str(PEERS.admits({"rank": 3, "token": TOKEN}, "127.0.0.1"))
    assert "not a rank" in str(PEERS.admits({"rank": "0", "token": TOKEN}, "127.0.0.1"))
    assert "not from its address" in str(PEERS.admits({"rank": 2, "token": TOKEN}, "127.0.0.1"))
    assert "wrong token" in str(PEERS.admits({"rank": 0, "token": "guess"}, "127.0.0.1"))


@pytest.fixture
def server() -> tuple[ParameterServer, int]:
    ps = ParameterServer([1, 2])
    port = free_port()
    served = ps.serve(PEERS, "127.0.0.1", port)
    yield ps, port
    served.shutdown()
    served.server_close()


def test_the_parameter_server_serves_its_ranks(server: tuple[ParameterServer, int]) -> None:
    _, port = server
    client = ParameterServerClient("127.0.0.1", port, "127.0.0.1", 0, TOKEN)
    client.initialize({"w": np.zeros(3, dtype=np.float32)})
    clock, stop_after = client.push(0, 0, 0, {"w": np.ones(3, dtype=np.float32)})
    assert (clock, stop_after) == (0, None)  # VW 1 has not pushed yet
    weights, clock = client.pull(["w"], 0)
    assert weights["w"].tolist() == [1.0, 1.0, 1.0] and clock == 0
    client.close()


def test_the_first_stop_request_fixes_a_wave_every_stage_can_reach() -> None:
    ps = ParameterServer([1, 2])
    ps.initialize({"w": np.zeros(1)})
    delta = {"w": np.zeros(1)}
    for wave in range(3):  # VW 0 (one stage) is three waves in; VW 1 has done one
        ps.push(0, 0, wave, delta)
    ps.push(1, 0, 0, delta)
    _, stop_after = ps.push(1, 1, 0, delta, stop=True)
    # Stage 0 of VW 0 saw no stop at its third push and may be running its fourth wave: all stop at 4.
    assert stop_after == 4
    assert ps.push(0, 0, 3, delta)[1] == 4  # later requests do not move it


def test_strangers_are_refused_and_pickles_never_loaded(server: tuple[ParameterServer, int]) -> None:
    _, port = server
    with pytest.raises(wire.WireError):  # the wrong token: the server closes the connection
        ParameterServerClient("127.0.0.1", port, "127.0.0.1", 0, "not-the-token").pull(["w"], 0)
    with pytest.raises(wire.WireError):  # rank 2 must come from 127.0.0.3
        ParameterServerClient("127.0.0.1", port, "127.0.0.1", 2, TOKEN).pull(["w"], 0)
    ran: list[str] = []

    class Payload:
        def __reduce__(self) -> tuple[object, ...]:
            return (ran.append, ("code ran",))

    data = pickle.dumps(("init", (Payload(),)))
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:  # the old wire format
        sock.sendall(struct.pack("!Q", len(data)) + data)
        assert sock.recv(16) == b""  # closed without an answer
    assert ran == []


def test_services_listen_on_their_address_only(server: tuple[ParameterServer, int]) -> None:
    _, port = server
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.2", port), timeout=2)


def test_the_state_service_answers_only_for_the_rank_it_admitted() -> None:
    service = StateService(3, 0.001)
    port = free_port()
    service.serve(PEERS, "127.0.0.1", port)
    try:
        client = StateClient("127.0.0.1", port, "127.0.0.1", 1, TOKEN)
        assert client.query(0, 0, 0.05) is False  # the service records it as rank 1, not rank 0
        assert service.records[1].step_seconds == pytest.approx(0.05) and service.records[0].step_seconds == 0
        client.close()
        stranger = StateClient("127.0.0.1", port, "127.0.0.1", 0, "guess")
        with pytest.raises(ConnectionError):
            stranger.query(0, 0, 0.05)
        stranger.close()
    finally:
        service.shutdown()


def test_wire_round_trips_numbers_and_refuses_objects() -> None:
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([7], dtype=np.int64)}
    message = wire.encode({"op": "x", "n": 1}, arrays)
    import io

    header, got = wire.receive(io.BytesIO(message))
    assert header == {"op": "x", "n": 1}
    assert all(np.array_equal(arrays[k], got[k]) and arrays[k].dtype == got[k].dtype for k in arrays)
    with pytest.raises(ValueError, match="cannot be sent"):
        wire.encode({}, {"o": np.array([object()])})
    forged = wire.encode({}, {"a": np.zeros(1)}).replace(b'"float64"', b'"object" ')
    with pytest.raises(wire.WireError, match="not allowed"):
        wire.receive(io.BytesIO(forged))


def test_a_service_process_ends_with_the_worker_that_started_it_however_the_worker_ends() -> None:
    """The worker starts the ESync state service, then ends with os._exit: no close(), no atexit
    handler. The service process is gone within seconds, not serving for ever."""
    worker = (
        "import os, sys\n"
        "from hetero_runtime.esync_service import start_service_process\n"
        "from hetero_runtime.job_peers import JobPeers\n"
        f"peers = JobPeers({TOKEN!r}, ('127.0.0.1',))\n"
        "process, port = start_service_process(peers, '127.0.0.1', 0, 1, 1.0)\n"
        "print(process.pid, flush=True)\n"
        "os._exit(0)\n"
    )
    assert_service_ends_with(worker)


def test_a_service_whose_worker_ended_before_it_began_watching_ends_too() -> None:
    """The worker may end as soon as it has the service's port, before the service starts watching
    for its end (a busy host delays the service): it still ends the service."""
    service = (
        "import sys, time\n"
        "from hetero_runtime.job_peers import serve_while_parent_lives\n"
        "time.sleep(1)  # the worker is gone by now\n"
        "serve_while_parent_lives(int(sys.argv[1]), 0.1)\n"
    )
    worker = (
        "import os, subprocess, sys\n"
        f"child = subprocess.Popen([sys.executable, '-c', {service!r}, str(os.getpid())],\n"
        "                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "print(child.pid, flush=True)\n"
        "os._exit(0)\n"
    )
    assert_service_ends_with(worker)


def assert_service_ends_with(worker: str) -> None:
    """Run ``worker`` (Python code that prints its service's pid and exits): the service is gone
    within seconds, not serving for ever."""
    done = subprocess.run([sys.executable, "-c", worker], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    service = int(done.stdout.split()[0])
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and running(service):
        time.sleep(0.1)
    assert not running(service), "the service outlived its worker"


def running(pid: int) -> bool:
    """The process exists and is not a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"
