"""Warm starts: Python processes that begin with their heavy modules (torch, numpy, ...) imported.

A training process spends its first seconds importing torch (2.5 to 6 s of CPU on a small machine)
before it does anything. A warm server imports those modules once and then forks one child per start;
the child becomes the requested program (`python -m MODULE`, `python SCRIPT`, `python -c CODE`) in
milliseconds, with what a fresh interpreter would have:

- its argv, its environment (replaced whole), its working directory and its standard streams (the
  starter's file descriptors, passed over the socket), buffered as the interpreter buffers them
  (stdout by blocks, or lines on a terminal; stderr by lines; neither under PYTHONUNBUFFERED);
- `sys.path` as the interpreter builds it: the script's directory, the working directory for `-m`,
  '' for `-c`, then the interpreter's own entries;
- the signal dispositions exec gives: the starter's ignored signals still ignored, every other one
  default, then Python's own (its SIGINT handler unless SIGINT is ignored, SIGPIPE ignored),
  a session of its own when asked, fresh seeds for `random` and numpy's global generator, no exit
  handler but its own;
- its exit code: 0, a SystemExit's code, 1 after an uncaught exception (its traceback on stderr), or
  minus the signal's number when a signal ended it; its atexit handlers run as at a normal exit.

What it cannot have: interpreter options (a command with any, `-u` or `-X ...`, starts cold) and a
hash seed of its own (every child shares the server's). The modules were imported under the server's
environment: the runtime reads its settings when it runs, never at import.

`spawn(argv, ...)` starts warm through the server that WARM_START_ENV names, when there is one and it
can run the command, else as `subprocess.Popen` does; either way it returns a process with Popen's
interface (pid, poll, wait, communicate, send_signal, terminate, kill, returncode, stdout).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import io
import json
import os
import random
import runpy
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
import types
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

WARM_START_ENV = "HETEROTRAIN_WARM_START"
"""The socket of the warm server that starts this process's Python children, when one runs."""
START_LOG_ENV = "HETEROTRAIN_START_LOG"
"""A file to which the warm server appends a line `warm PID COMMAND` per start (bench/suite_time.py
counts them; bench/start_log counts the cold ones)."""
COLD_STARTS_ENV = "HETEROTRAIN_COLD_STARTS"
""""1": start no warm server (`heterotrain run-local`, the test suite); every process starts fresh."""
DEFAULT_PRELOAD = (
    "torch",
    "torch.distributed",
    "numpy",
    "sklearn.datasets",
    "sklearn.model_selection",
    "torchvision",
    "lightning.pytorch",
    "hetero_runtime.api",
    "hetero_runtime.wrap",
    "hetero_runtime.wrap.lightning",
    "hetero_runtime.worker",
    "hetero_operator.cli",
)
"""What the project's workers import (the examples' too), each skipped when not installed."""
OPERATOR_PRELOAD = ("kopf", "kubernetes", "hetero_operator.manager.main", "hetero_operator.manager.settings")
"""What `heterotrain operator` imports before it runs: for a server that also starts operators (the
test suite kills and restarts them many times)."""
REAP_SECONDS = 0.02  # how often the server looks for children that ended
READY_TIMEOUT = 180.0
MAX_REQUEST = 1 << 22


@dataclass(frozen=True)
class Program:
    """What a child becomes: `python -m module`, `python script` or `python -c code`, with its args."""

    kind: str  # module | script | code
    target: str
    args: tuple[str, ...]

    @property
    def argv(self) -> list[str]:
        """sys.argv as the interpreter sets it (runpy puts a module's file in place of its name)."""
        first = {"module": self.target, "script": self.target, "code": "-c"}[self.kind]
        return [first, *self.args]


def _resolved(command: str) -> str:
    """A command's path, found on PATH as exec finds it when it names no directory."""
    found = shutil.which(command) if "/" not in command else command
    return os.path.abspath(found or command)


def _runs_this_interpreter(path: str) -> bool:
    """A script whose first line starts this interpreter (a console script of this environment)."""
    try:
        with open(path, "rb") as script:
            first = script.readline(512)
    except OSError:
        return False
    return first.strip() == b"#!" + os.fsencode(sys.executable)


def program_of(argv: Sequence[str]) -> Program | None:
    """The program a command line runs on this interpreter (`python ...`, or a script that starts
    this interpreter, such as a console script of this environment), when a warm child can run it
    (no interpreter option before it); None otherwise."""
    if not argv:
        return None
    first_path = _resolved(argv[0])
    if first_path != os.path.abspath(sys.executable):
        if _runs_this_interpreter(first_path):
            return Program("script", first_path, tuple(argv[1:]))
        return None
    if len(argv) < 2:
        return None
    first, rest = argv[1], tuple(argv[2:])
    if first == "-m" and rest:
        return Program("module", rest[0], rest[1:])
    if first == "-c" and rest:
        return Program("code", rest[0], rest[1:])
    if first.startswith("-"):
        return None
    return Program("script", first, rest)


@dataclass(frozen=True)
class Request:
    executable: str
    program: Program
    env: dict[str, str]
    cwd: str
    new_session: bool
    ignored_signals: tuple[int, ...] = ()  # the starter's: an exec'd child keeps them ignored

    @classmethod
    def from_json(cls, text: str) -> Request:
        body = json.loads(text)
        body["program"] = Program(**{**body["program"], "args": tuple(body["program"]["args"])})
        body["ignored_signals"] = tuple(body.get("ignored_signals") or ())
        return cls(**body)


class Channel:
    """Newline-ended JSON messages over a stream socket, read without buffering past a message (so
    that a later `select` on the socket sees what is still to come)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._pending = b""

    def send(self, message: Mapping[str, Any]) -> None:
        self.sock.sendall(json.dumps(message).encode() + b"\n")

    def receive(self, timeout: float | None) -> dict[str, Any] | None:
        """The next message; None at the end of the stream. TimeoutError past `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._pending:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ready, _, _ = _select([self.sock], left)
            if not ready:
                raise TimeoutError
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return dict(json.loads(line))

    def close(self) -> None:
        self.sock.close()


def _select(sockets: list[socket.socket], timeout: float | None) -> tuple[list[Any], list[Any], list[Any]]:
    import select

    return select.select(sockets, [], [], timeout)


# --- the server ---------------------------------------------------------------------------------


def serve(socket_path: Path, preload: Sequence[str]) -> None:
    """Import `preload`, then fork a child for every request on `socket_path`, until stdin closes (its
    starter gone) or SIGTERM."""
    for name in preload:
        with contextlib.suppress(ImportError):  # an optional module (an extra that is not installed)
            importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(socket_path))
    listener.listen(128)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ)
    children: dict[int, Channel] = {}
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    print("ready", flush=True)  # what the starter waits for
    while not stopping:
        for key, _ in selector.select(REAP_SECONDS):
            if key.fileobj is listener:
                connection, _ = listener.accept()
                _serve_one(Channel(connection), listener, children)
            elif not os.read(sys.stdin.fileno(), 4096):
                stopping = True
        _reap(children)
    listener.close()
    socket_path.unlink(missing_ok=True)


def _serve_one(channel: Channel, listener: socket.socket, children: dict[int, Channel]) -> None:
    """Read one request and its three streams, and fork its child (or say why not)."""
    try:
        message, fds, _, _ = socket.recv_fds(channel.sock, MAX_REQUEST, 3)
        while not message.endswith(b"\n"):
            more = channel.sock.recv(MAX_REQUEST)
            if not more:
                raise OSError("the request ended early")
            message += more
        request = Request.from_json(message.decode())
    except (OSError, ValueError, TypeError, KeyError) as error:
        with contextlib.suppress(OSError):
            channel.send({"error": str(error)})
        channel.close()
        return
    if len(fds) != 3 or os.path.abspath(request.executable) != os.path.abspath(sys.executable):
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            channel.send({"error": f"this server runs {sys.executable}, not {request.executable}"})
        channel.close()
        return
    pid = os.fork()
    if pid == 0:
        listener.close()
        for other in children.values():
            other.close()
        channel.close()
        _become(request, fds)
    for fd in fds:
        os.close(fd)
    children[pid] = channel
    log_start("warm", pid, " ".join(request.program.argv))
    with contextlib.suppress(OSError):
        channel.send({"pid": pid})


def log_start(kind: str, pid: int, what: str) -> None:
    """One line in the start log, when the environment names one (nothing otherwise)."""
    path = os.environ.get(START_LOG_ENV)
    if path:
        with contextlib.suppress(OSError), open(path, "a") as sink:
            sink.write(f"{kind} {pid} {what[:300]}\n")


def _reap(children: dict[int, Channel]) -> None:
    """Tell each ended child's starter its exit code, as Popen.returncode has it."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        channel = children.pop(pid, None)
        if channel is not None:
            with contextlib.suppress(OSError):
                channel.send({"exit": os.waitstatus_to_exitcode(status)})
            channel.close()


def _become(request: Request, fds: Sequence[int]) -> None:
    """In the forked child: take the request's session, streams, signals, directory and environment,
    run the program, and end with its exit code."""
    code = 1
    try:
        if request.new_session:
            os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in set(fds) - {0, 1, 2}:
            os.close(fd)
        _default_signals(request.ignored_signals)
        os.chdir(request.cwd)
        os.environ.clear()
        os.environ.update(request.env)
        _fresh_streams()
        _fresh_state()
        code = run_in_place(request.program)
        with contextlib.suppress(Exception):
            atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        with contextlib.suppress(Exception):
            traceback.print_exc()
    os._exit(code)


def _default_signals(ignored: Sequence[int]) -> None:
    """A fresh interpreter's dispositions: handlers reset by exec, those the starter ignored still
    ignored (SIGINT included: Python installs its handler only over a default one), then Python's own."""
    for number in signal.valid_signals():
        if number in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            signal.signal(number, signal.SIG_IGN if number in ignored else signal.SIG_DFL)
    if signal.SIGINT not in ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)


# Python ignores these itself, and Popen restores them to default before it execs a child.
PYTHONS_OWN_IGNORED = frozenset({signal.SIGPIPE, signal.SIGXFSZ})


def ignored_signals() -> tuple[int, ...]:
    """The signals this process ignores that a child it execs would still ignore."""
    return tuple(
        int(number)
        for number in signal.valid_signals()
        if number not in PYTHONS_OWN_IGNORED and _ignored(number)
    )


def _ignored(number: int) -> bool:
    try:
        return signal.getsignal(number) == signal.SIG_IGN
    except (OSError, ValueError):
        return False


def _text_stream(fd: int, writing: bool, line_buffering: bool, unbuffered: bool) -> IO[str]:
    raw = io.FileIO(fd, "w" if writing else "r", closefd=False)
    buffered: Any = (
        raw if writing and unbuffered else (io.BufferedWriter(raw) if writing else io.BufferedReader(raw))
    )
    return io.TextIOWrapper(
        buffered,
        encoding=os.environ.get("PYTHONIOENCODING") or None,
        errors="backslashreplace" if fd == 2 else None,
        line_buffering=line_buffering,
        write_through=writing and unbuffered,
    )


def _fresh_streams() -> None:
    """sys.stdin, stdout and stderr over fds 0 to 2, buffered as the interpreter buffers them: stdout
    by blocks (by lines on a terminal), stderr by lines; both not at all under PYTHONUNBUFFERED."""
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdin = _text_stream(0, False, False, False)
    sys.stdout = _text_stream(1, True, not unbuffered and os.isatty(1), unbuffered)
    sys.stderr = _text_stream(2, True, not unbuffered, unbuffered)
    # The originals too, as the interpreter sets them (faulthandler and friends write there).
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr  # type: ignore[misc,assignment]


def _fresh_state() -> None:
    """What each fresh interpreter has of its own: random seeds, and no exit handler but its own."""
    atexit._clear()
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def run_in_place(program: Program) -> int:
    """Run the program in this process as `python` would run it, with the path `python` would give
    it; its exit code (the interpreter's own handling of SystemExit and uncaught exceptions)."""
    sys.argv = program.argv
    rest = sys.path[1:]
    try:
        if program.kind == "module":
            sys.path[:] = [os.getcwd(), *rest]
            runpy.run_module(program.target, run_name="__main__", alter_sys=True)
        elif program.kind == "script":
            sys.path[:] = [os.path.dirname(os.path.realpath(program.target)), *rest]
            runpy.run_path(program.target, run_name="__main__")
        else:
            sys.path[:] = ["", *rest]
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(program.target, "<string>", "exec"), main.__dict__)
    except SystemExit as end:
        return _exit_code(end.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)  # the interpreter ends by the signal after an uncaught Ctrl-C
        return 130
    except BaseException:
        kind, error, trace = sys.exc_info()
        assert kind is not None and error is not None
        trimmed = _program_frames(trace)
        sys.excepthook(kind, error.with_traceback(trimmed), trimmed)
        return 1
    return 0


def _program_frames(trace: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback from the program's own first frame on, as the interpreter prints it (without the
    frames of this module and runpy that started it)."""
    ours = {__file__, os.path.abspath(__file__), runpy.__file__, "<frozen runpy>"}
    while trace is not None and trace.tb_frame.f_code.co_filename in ours:
        trace = trace.tb_next
    return trace


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


# --- the starter ----------------------------------------------------------------------------------


class WarmServer:
    """A warm server of this interpreter with `preload` imported, until `close()`."""

    def __init__(self, directory: Path, preload: Sequence[str] = DEFAULT_PRELOAD) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.socket_path = directory / f"warm-{os.getpid()}-{time.monotonic_ns() % 10**9}.sock"
        # One thread for the libraries' pools: the server forks, and forked children inherit no thread.
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "hetero_operator.warm_start", str(self.socket_path), *preload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        assert self.process.stdout is not None
        selector = selectors.DefaultSelector()
        selector.register(self.process.stdout, selectors.EVENT_READ)
        ready = selector.select(READY_TIMEOUT) and self.process.stdout.readline().strip() == b"ready"
        selector.close()
        if not ready:
            self.close()
            raise RuntimeError(f"the warm server did not start within {READY_TIMEOUT:.0f} s")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()
        self.socket_path.unlink(missing_ok=True)


@contextlib.contextmanager
def warm_server(directory: Path, preload: Sequence[str] = DEFAULT_PRELOAD) -> Iterator[WarmServer]:
    """A warm server for the block, named in this process's environment, so that `spawn` here and in
    the processes started from here uses it; the environment as it was afterwards."""
    server = WarmServer(directory, preload)
    before = os.environ.get(WARM_START_ENV)
    os.environ[WARM_START_ENV] = str(server.socket_path)
    try:
        yield server
    finally:
        if before is None:
            os.environ.pop(WARM_START_ENV, None)
        else:
            os.environ[WARM_START_ENV] = before
        server.close()


class WarmProcess:
    """A warm child, with the part of subprocess.Popen's interface the project's launchers use."""

    def __init__(self, channel: Channel, pid: int, stdout: IO[Any] | None, args: list[str]) -> None:
        self._channel = channel
        self.pid = pid
        self.stdout = stdout
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(TimeoutError):
                self._ended(self._channel.receive(0.0))
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                self._ended(self._channel.receive(timeout))
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0) from None
        assert self.returncode is not None
        return self.returncode

    def _ended(self, message: dict[str, Any] | None) -> None:
        # No message: the server is gone, and its children with it (nobody is left to tell).
        self.returncode = int(message["exit"]) if message is not None else -int(signal.SIGKILL)
        self._channel.close()

    def communicate(self, timeout: float | None = None) -> tuple[Any, None]:
        deadline = None if timeout is None else time.monotonic() + timeout
        output = None
        if self.stdout is not None:
            output = _read_to_end(self.stdout, deadline, self.args)
            self.stdout.close()
        self.wait(None if deadline is None else max(deadline - time.monotonic(), 0.0))
        return output, None

    def send_signal(self, number: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, number)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _read_to_end(stream: IO[Any], deadline: float | None, args: list[str]) -> Any:
    """All that `stream` gives until its end; TimeoutExpired past `deadline`."""
    selector = selectors.DefaultSelector()
    selector.register(stream, selectors.EVENT_READ)
    chunks = []
    try:
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(args, 0.0)
            if not selector.select(left):
                continue
            chunk = os.read(stream.fileno(), 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        selector.close()
    data = b"".join(chunks)
    return data.decode() if isinstance(stream, io.TextIOBase) else data


def _fd(value: Any, default: int, opened: list[int]) -> int:
    """The file descriptor a stream argument of Popen's stands for."""
    if value is None:
        return default
    if value == subprocess.DEVNULL:
        fd = os.open(os.devnull, os.O_RDWR)
        opened.append(fd)
        return fd
    if isinstance(value, int):
        return value
    return int(value.fileno())


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    stdin: Any = None,
    stdout: Any = None,
    stderr: Any = None,
    text: bool = False,
    start_new_session: bool = False,
) -> Any:
    """Start `argv` warm when a warm server is named in the environment and can run it, else as
    subprocess.Popen does. stdout may be subprocess.PIPE; stderr subprocess.STDOUT."""
    program = program_of(argv)
    address = os.environ.get(WARM_START_ENV)
    if program is not None and address and Path(address).exists():
        request = Request(
            sys.executable,
            program,
            dict(os.environ if env is None else env),
            str(cwd or os.getcwd()),
            start_new_session,
            ignored_signals(),
        )
        started = _start_warm(address, request, stdin, stdout, stderr, text, list(argv))
        if started is not None:
            return started
    return subprocess.Popen(
        list(argv),
        env=env,
        cwd=cwd,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        text=text,
        start_new_session=start_new_session,
    )


def _start_warm(
    address: str, request: Request, stdin: Any, stdout: Any, stderr: Any, text: bool, args: list[str]
) -> WarmProcess | None:
    """The warm child, or None when the server cannot start it (the caller starts it cold)."""
    opened: list[int] = []
    reader: IO[Any] | None = None
    try:
        in_fd = _fd(stdin, 0, opened)
        if stdout == subprocess.PIPE:
            read_end, out_fd = os.pipe()
            opened.append(out_fd)
            reader = os.fdopen(read_end, "r" if text else "rb")
        else:
            out_fd = _fd(stdout, 1, opened)
        err_fd = out_fd if stderr == subprocess.STDOUT else _fd(stderr, 2, opened)
        channel = Channel(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        try:
            channel.sock.connect(address)
            payload = json.dumps(asdict(request)).encode() + b"\n"
            sent = socket.send_fds(channel.sock, [payload], [in_fd, out_fd, err_fd])
            channel.sock.sendall(payload[sent:])
            reply = channel.receive(READY_TIMEOUT)
        except (OSError, TimeoutError):
            reply = None
        if reply is None or "pid" not in reply:
            channel.close()
            if reader is not None:
                reader.close()
            return None
        return WarmProcess(channel, int(reply["pid"]), reader, args)
    finally:
        for fd in opened:
            os.close(fd)


if __name__ == "__main__":
    serve(Path(sys.argv[1]), sys.argv[2:])
