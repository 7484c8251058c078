"""`esync` under the script's own loop: rounds of local steps whose count follows each rank's speed.

Each rank draws minibatches of its planned size from its own shuffle of the data (the loader) and
its loop steps on them as it always does: its own optimizer, clipping, GradScaler and scheduler.
After each step the wrapper asks the job's state service whether to take another (ESync's
QUERY-STATE: the slowest rank takes one step, the others as many as end before it does). A rank
told READY waits in the round's all-reduce for the others, and the round ends as the runtime's
`esync` ends it: w ← w_start + ϵ·mean(Δ_i), the same model on every rank. The service, its rule and
the averaging are the runtime's own; only where the steps come from differs.
"""

from __future__ import annotations

import atexit
import subprocess
import time

from torch import nn

from hetero_operator.plan import ESyncParams
from hetero_runtime.esync_service import StateClient
from hetero_runtime.launcher import WorkerEnv
from hetero_runtime.strategies.base import broadcast_model, flat_parameters, trainable
from hetero_runtime.strategies.esync import end_round
from hetero_runtime.strategies.side_services import connect_state_service


class ESyncRounds:
    """One job's rounds on this rank (all ranks build it together: rank 0 starts the service)."""

    def __init__(self, env: WorkerEnv, model: nn.Module, config: ESyncParams) -> None:
        self.rank, self.world = env.rank, env.world_size
        self.config = config
        self.params = trainable(model)
        if self.world > 1:
            broadcast_model(model)  # a round starts from one model: a restored one included
        self.service: subprocess.Popen[bytes] | None
        self.client: StateClient | None
        self.service, self.client = connect_state_service(env, config)
        atexit.register(self.close)  # the service must not outlive a script that never calls close()
        self.round = 0
        self.steps = 0  # local steps in the round under way
        self.last_round_steps = 0
        self.round_samples = 0  # this rank's samples in it
        self.round_started = time.perf_counter()
        self.start = flat_parameters(self.params)

    def after_step(self, step_seconds: float, local_batch: int) -> int | None:
        """The step's optimizer step is done: another step (None), or the round ended and every rank
        together used this many samples in it."""
        assert self.client is not None, "the rounds were closed"
        self.steps += 1
        self.round_samples += local_batch
        # A rank at maxLocalSteps ends its round without asking; the service then waits for nobody.
        if self.steps < self.config.max_local_steps and not self.client.query(
            self.rank, self.steps, step_seconds
        ):
            return None
        return self._end_round()

    def _end_round(self) -> int:
        assert self.client is not None
        elapsed = time.perf_counter() - self.round_started
        (used,) = end_round(
            self.params,
            self.start,
            [float(self.round_samples)],
            self.config,
            self.world,
            self.round,
            self.config.round_timeout_seconds - elapsed,
        )
        self.round += 1
        self.client.reset(self.rank, self.round)
        self.last_round_steps = self.steps
        self.steps, self.round_samples = 0, 0
        self.round_started = time.perf_counter()
        self.start = flat_parameters(self.params)
        return round(used)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.service is not None:
            self.service.terminate()
            self.service.wait(timeout=10)
            self.service = None
