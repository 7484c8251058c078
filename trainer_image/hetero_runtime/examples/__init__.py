"""Runnable examples; each module exposes `build_job() -> TrainingJob` and `main()`."""

from __future__ import annotations

EXAMPLES = {
    "digits": "hetero_runtime.examples.digits",
    "tiny_lm": "hetero_runtime.examples.tiny_lm",
}
