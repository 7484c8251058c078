"""The operator's one source of time, injected so tests can run the loop on a clock they move."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float:
        """Wall-clock seconds since the epoch (what status timestamps and backoffs are in)."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary start that never jump (for timeouts and retries)."""
        ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
