"""Semantic validation: what the CRD schema and its CEL rules cannot see (pure).

A job that passes the API server can still be one the operator cannot run; each problem names the
field and the fix, and ends up in the job's `Valid=False` condition.
"""

from __future__ import annotations

import re

from hetero_operator.controller import names
from hetero_operator.controller.facts import JobFacts
from hetero_operator.controller.launcher import RESERVED_ENV, LaunchOptions
from hetero_operator.controller.pod_guards import guard_problems
from hetero_operator.controller.template_checks import template_problems
from hetero_operator.resources import HeteroTrainJob
from hetero_operator.resources.parallelism import HetPipeParameters, SESGDParameters

DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def job_problems(
    facts: JobFacts, launch: LaunchOptions | None = None
) -> tuple[HeteroTrainJob | None, list[str]]:
    """The job as the watch parsed it, and every problem found (empty when the job can run)."""
    job = facts.model
    problems = list(facts.problems)
    if job is not None:
        launch = launch or LaunchOptions()
        if not facts.checked or facts.checked[0][0] != launch:
            facts.checked[:] = [(launch, tuple(semantic_problems(job, launch)))]
        problems += facts.checked[0][1]
    return job, problems


def semantic_problems(job: HeteroTrainJob, launch: LaunchOptions | None = None) -> list[str]:
    """Problems of the job as this operator would run it (its settings: ports, guards)."""
    launch = launch or LaunchOptions()
    problems = _spec_problems(job)
    problems += template_problems(job, launch.metrics_port, launch.master_port)
    problems += guard_problems(job, launch.guards)
    return problems


def _spec_problems(job: HeteroTrainJob) -> list[str]:
    problems: list[str] = []
    spec = job.spec
    if len(job.name) > names.MAX_JOB_NAME_LENGTH or not DNS_1035_LABEL.match(job.name):
        problems.append(
            f"metadata.name: {job.name!r} must start with a letter, use only lowercase letters, digits "
            f"and '-', and be at most {names.MAX_JOB_NAME_LENGTH} characters: it names the job's "
            "headless Service and worker pods"
        )
    sizes = range(spec.gpus.min, spec.gpus.max + 1)
    params = spec.parallelism.parameters()
    if isinstance(params, HetPipeParameters) and params.virtual_worker_size is not None:
        size = params.virtual_worker_size
        if not any(n % size == 0 for n in sizes):
            problems.append(
                f"spec.parallelism.hetpipe.virtualWorkerSize: no multiple of {size} lies between gpus.min "
                f"({spec.gpus.min}) and gpus.max ({spec.gpus.max}); change the size or the GPU range"
            )
    if isinstance(params, SESGDParameters) and params.groups is not None:
        groups = params.groups
        if not any(n % groups == 0 for n in sizes):
            problems.append(
                f"spec.parallelism.sesgd.groups: {groups} divides no worker count between gpus.min "
                f"({spec.gpus.min}) and gpus.max ({spec.gpus.max}); groups must be equal-sized"
            )
    for variable in spec.env:
        if variable.name in RESERVED_ENV:
            problems.append(
                f"spec.env[{variable.name}]: set by the operator for every worker; remove it from spec.env"
            )
    storage = spec.checkpoint.storage if spec.checkpoint is not None else None
    if storage is not None and storage.existing_claim == names.checkpoint_claim_name(job.name):
        problems.append(
            f"spec.checkpoint.storage.existingClaim: {storage.existing_claim!r} is the name of the claim the "
            "operator creates for this job and deletes with it; mount a claim of another name, or remove "
            "existingClaim to let the operator create it"
        )
    return problems
