"""The worker's log format: every line names its rank, so the logs of a job's ranks can be merged."""

from __future__ import annotations

import logging


def configure_logging(rank: int) -> None:
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s",
    )
