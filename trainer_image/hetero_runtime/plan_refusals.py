"""Pure checks of the plan a training script runs under; each returns the message to stop with.
They need no torch, so the worker can refuse a plan before it starts the script."""

from __future__ import annotations

from hetero_operator.plan import Plan, Strategy

WRAPPED_STRATEGIES = (Strategy.DATA, Strategy.SESGD, Strategy.DREAMDDP, Strategy.ESYNC)
"""What a loop of the script's own can run: a synchronous step, or local steps then averaging."""


def strategy_refusal(plan: Plan) -> str | None:
    """`hetpipe` changes what a step is (a model cut into pipeline stages): it needs the runtime's
    loop."""
    if plan.strategy in WRAPPED_STRATEGIES:
        return None
    names = ", ".join(s.value for s in WRAPPED_STRATEGIES)
    return (
        f"plan version {plan.version} runs strategy {plan.strategy.value!r}, but a training script of your "
        f"own (hetero_runtime.wrap) runs {names} only: set spec.parallelism.strategy: data (or another of "
        "those), or hand the loop to hetero_runtime.api.TrainingJob to use " + repr(plan.strategy.value)
    )


def unmodified_script_refusal(plan: Plan) -> str | None:
    """`heterotrain worker -- CMD` runs a DDP script as it is: only the `data` strategy means what such a
    script does (every other strategy needs the wrapper, or the runtime's loop)."""
    if plan.strategy is Strategy.DATA:
        return None
    wrapped = plan.strategy in WRAPPED_STRATEGIES
    port = (
        "port the script to hetero_runtime.wrap (docs/porting.md) and start it without "
        "`heterotrain worker --` (command: [python, train.py])"
        if wrapped
        else "hand the loop to hetero_runtime.api.TrainingJob"
    )
    return (
        f"plan version {plan.version} runs strategy {plan.strategy.value!r}, but `heterotrain worker -- CMD` "
        "runs an unmodified DDP script, which synchronises every step as the 'data' strategy does: set "
        f"spec.parallelism.strategy: data, or {port} to use {plan.strategy.value!r}"
    )


def own_shuffle_refusal(plan: Plan, indexed: bool) -> str | None:
    """`esync` draws each rank's minibatches from the rank's own shuffle, so it needs indices."""
    if plan.strategy is not Strategy.ESYNC or indexed:
        return None
    return (
        f"plan version {plan.version} runs strategy 'esync', which draws each rank's minibatches from its "
        "own shuffle of an indexed dataset, but the loader reads a stream: give HeteroDataLoader a "
        "map-style dataset (__len__ and __getitem__), or set spec.parallelism.strategy: data"
    )
