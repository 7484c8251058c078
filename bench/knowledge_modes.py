"""What a simulated policy knows of each job's speeds, as the scheduling benchmarks run it: the
operator's measured knowledge by default, the oracle beside it on the same traces."""

from __future__ import annotations

from typing import Any

from hetero_operator.simulator.engine import EngineOptions
from hetero_operator.simulator.knowledge import KnowledgeMode, KnowledgeSettings

MEASURED = KnowledgeMode.MEASURED.value
ORACLE = KnowledgeMode.ORACLE.value
MODES = (MEASURED, ORACLE)  # the default first
# The measured run's average JCT may be this much above the oracle run's.
ORACLE_TOLERANCE = 0.10
DESCRIPTION = (
    "Policies see what the operator would know (`knowledge: measured`): a job is placed by the "
    "GPU classes' relativeSpeed priors until its workload key has been measured, by its own first "
    "five minutes of training on a class or by an earlier job with the key (half the generated jobs "
    "rerun an earlier job's key); then by the catalog's measurement for the classes it ran on, the "
    "others scaled from those by the priors. The oracle run (`knowledge: oracle`) gives every policy "
    "every job's true speeds from its arrival; progress always follows the true speeds."
)


def options(mode: str, **settings: Any) -> EngineOptions:
    """Engine options with ``mode``'s knowledge (other `EngineOptions` fields as keywords)."""
    return EngineOptions(knowledge=KnowledgeSettings(mode=KnowledgeMode(mode)), **settings)
