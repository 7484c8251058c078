"""What a process sees of its start, as JSON on stdout; then it ends as its first argument says:
`exit N`, `raise`, `signal`, or `end` (after an atexit handler that writes to stderr)."""

import atexit
import json
import os
import random
import signal
import sys

import __main__


def disposition(number: int) -> str:
    handler = signal.getsignal(number)
    if handler is signal.default_int_handler:
        return "python"
    return {signal.SIG_DFL: "default", signal.SIG_IGN: "ignore"}.get(handler, "other")  # type: ignore[call-overload]


report = {
    "argv": sys.argv,
    "path": sys.path,
    "cwd": os.getcwd(),
    "main_file": getattr(__main__, "__file__", None),
    "marker": os.environ.get("PROBE_MARKER"),
    "variables": sorted(os.environ),
    "signals": {
        name: disposition(getattr(signal, name))
        for name in ("SIGINT", "SIGTERM", "SIGPIPE", "SIGCHLD", "SIGUSR1", "SIGHUP")
    },
    "stdout": [sys.stdout.line_buffering, sys.stdout.isatty(), sys.stdout.write_through],
    "stderr": [sys.stderr.line_buffering, sys.stderr.errors],
    "session_leader": os.getsid(0) == os.getpid(),
    "random": random.random(),
}
print(json.dumps(report), flush=True)
how = sys.argv[1]
atexit.register(lambda: print("atexit ran", file=sys.stderr))
if how == "exit":
    sys.exit(int(sys.argv[2]))
if how == "raise":
    raise ValueError("probe failure")
if how == "signal":
    os.kill(os.getpid(), signal.SIGTERM)
