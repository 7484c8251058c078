"""Serving the API with uvicorn, either inside an existing asyncio loop (the operator's) or alone."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI


class _EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to the process it runs in."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class ApiStartError(RuntimeError):
    """The API could not start (for example, the port is taken)."""


async def serve(app: FastAPI, host: str, port: int, log_level: str = "warning") -> None:
    """Serve ``app`` until this coroutine is cancelled, then shut down gracefully.

    Runs in the caller's event loop, so the operator can start it as one more task. Access logs are
    off: request lines are counted in /metrics instead, and headers (tokens) are never logged."""
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False, lifespan="on")
    server = _EmbeddedServer(config)
    task = asyncio.ensure_future(_run(server, host, port))
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        server.should_exit = True
        await task
        raise


async def serve_until_signalled(app: FastAPI, host: str, port: int, log_level: str = "warning") -> None:
    """Serve ``app`` alone until SIGINT or SIGTERM (what a pod is stopped with), then shut down
    gracefully. The handlers are installed here, not inherited: a process started in the background
    by a shell begins with SIGINT ignored."""
    loop, main = asyncio.get_running_loop(), asyncio.current_task()
    assert main is not None
    for stop in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(stop, main.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await serve(app, host, port, log_level)


async def _run(server: uvicorn.Server, host: str, port: int) -> None:
    try:
        await server.serve()
    except SystemExit as error:  # uvicorn exits the process when it cannot bind or start
        raise ApiStartError(f"the API could not start on {host}:{port}; see the log above") from error
    if not server.started:
        raise ApiStartError(f"the API could not start on {host}:{port}; see the log above")
