"""Counts Python interpreter starts for bench/suite_time.py: with this folder first on PYTHONPATH and
HETEROTRAIN_START_LOG naming a file, every interpreter that starts appends a line `cold PID COMMAND`
to it (warm starts are logged by the warm server, test-bed boots by the test bed). Then it runs the
sitecustomize it stands in front of, if there is one."""

import importlib.machinery
import importlib.util
import os
import sys

_log = os.environ.get("HETEROTRAIN_START_LOG")
if _log:
    try:
        with open(f"/proc/{os.getpid()}/cmdline", "rb") as _cmdline:
            _command = _cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
        with open(_log, "a") as _sink:
            _sink.write(f"cold {os.getpid()} {_command[:300]}\n")
    except OSError:
        pass
_here = os.path.dirname(os.path.abspath(__file__))
_rest = [entry for entry in sys.path if os.path.abspath(entry or ".") != _here]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _spec is not None and _spec.loader is not None and _spec.origin != os.path.abspath(__file__):
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
