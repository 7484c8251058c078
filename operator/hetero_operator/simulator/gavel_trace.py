"""Gavel's Philly-derived job traces as `heterotrain simulate` traces (see `trace` for the CSV).

Source: stanford-futuredata/gavel (MIT licence), ``scheduler/traces/msr/seed=<n>/<vc>.trace`` (one
Philly virtual cluster each, jobs sampled from the Philly job table) and the per-job-type throughputs
of ``scheduler/simulation_throughputs.json``. `examples/sim/traces/gavel/SOURCE.md` names the commit
and the files kept; the paper is Narayanan et al., "Heterogeneity-Aware Cluster Scheduling Policies for
Deep Learning Workloads", OSDI 2020.

Gavel's lines are tab-separated. Two layouts exist, told apart by their number of fields:

- 7 fields (the Philly-derived ``msr`` traces): ``job_type, command, num_steps_arg, needs_data_dir,
  total_steps, arrival_time, scale_factor``;
- 10 fields (the current layout, e.g. ``traces/physical_cluster``): ``job_type, command,
  working_directory, num_steps_arg, needs_data_dir, total_steps, scale_factor, priority_weight, SLO,
  arrival_time``.

``job_type`` is e.g. ``ResNet-18 (batch size 32)``; ``total_steps`` the job's iterations;
``scale_factor`` its GPUs; ``arrival_time`` seconds from the trace's start. Throughputs are
iterations/s of one job alone on ``scale_factor`` GPUs of one worker type (v100, p100, k80), keyed
``(job_type, scale_factor)``; `isolated_throughputs` keeps only those (the file also holds co-located
pairs). How each row is built, and what is exact:

- ``job_id``: ``gavel-<n>``, ``n`` the 0-based line of the source file (dropped lines leave gaps).
- ``arrival_s``: ``arrival_time`` (exact).
- ``gpus_min = gpus_max = scale_factor`` (exact: Gavel's jobs are rigid).
- ``duration_s``: ``total_steps / v100(job_type, scale_factor)``, the job's time alone on
  ``scale_factor`` V100s by Gavel's measured throughput: exact where that figure exists. Gavel
  measured Recommendation, CycleGAN and A3C on one GPU only, and no type beyond 8 GPUs; for a
  missing ``(job_type, scale_factor)`` the figure at the largest measured scale factor ``s`` below it
  is scaled linearly, ``v100(job_type, s) * scale_factor / s`` (perfect scaling: an approximation
  that, if anything, shortens the job). `Conversion.approximated` lists those rows.
- ``model``: the heterotrain model of the job type's family (`MODEL_OF_FAMILY`: ResNet-18 ->
  resnet18, ResNet-50 -> resnet50, Transformer -> transformer, LM -> lm, Recommendation ->
  recommendation, CycleGAN -> cyclegan). Approximated: the simulator's speeds on other classes, its
  memory needs and its scaling over GPUs are that model's (`workloads.MODELS`, measured at one batch
  size, mostly from Gavel's own table) rather than Gavel's figures for this job type's batch size.
  The V100 duration above is Gavel's either way; what differs is how much faster or slower the job
  runs on a P100 or K80 (e.g. Gavel's ResNet-18 at batch 32 runs 4.2x faster on a V100 than on a
  K80, and faster still on a P100; heterotrain's resnet18 profile, batch 256, 6.8x and 0.6x). And
  heterotrain's resnet50 needs 14 GiB per replica, more than a K80 has, so it never runs on one
  (Gavel measured ResNet-50 on K80s). A3C has no heterotrain model: its rows are dropped and listed
  in `Conversion.dropped`.
- ``priority``: 0. Gavel's ``priority_weight`` (10-field layout) is a fair-share weight, not a
  priority level, and its SLO has no heterotrain counterpart: both are ignored.
- ``gpu_classes``: empty (any class; Gavel constrains no job to a type).
- ``workload``: a key per job type (``gavel-resnet-18-bs32``): Gavel's throughputs are per job type,
  so two jobs of one type train the same model the same way, as a workload key says.

Run as ``python -m hetero_operator.simulator.gavel_trace TRACE THROUGHPUTS OUT.csv [--jobs N]``;
THROUGHPUTS is either Gavel's ``simulation_throughputs.json`` or the isolated subset that
``--extract`` writes from it (what `examples/sim/traces/gavel/` keeps).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hetero_operator.simulator.trace import TraceJob, trace_to_csv

WORKER_TYPES = ("v100", "p100", "k80")
REFERENCE_WORKER = "v100"
MODEL_OF_FAMILY: Mapping[str, str] = {
    "ResNet-18": "resnet18",
    "ResNet-50": "resnet50",
    "Transformer": "transformer",
    "LM": "lm",
    "Recommendation": "recommendation",
    "CycleGAN": "cyclegan",
}
# Gavel's throughput keys are the repr of a (job_type, scale_factor) tuple.
_KEY = re.compile(r"^\('(?P<type>[^']+)', (?P<scale>\d+)\)$")
_BATCH = re.compile(r"^(?P<family>.+?) \(batch size (?P<batch>\d+)\)$")

# worker type -> job type -> scale factor -> iterations/s of the job alone.
Throughputs = Mapping[str, Mapping[str, Mapping[int, float]]]


class GavelTraceError(ValueError):
    """A Gavel trace line or throughput file is malformed; the message names the line."""


@dataclass(frozen=True, slots=True)
class GavelJob:
    line: int  # 0-based line of the source file
    job_type: str
    total_steps: int
    scale_factor: int
    arrival_s: float


@dataclass(frozen=True, slots=True)
class Conversion:
    rows: list[TraceJob]
    # (line, reason) of each source line left out.
    dropped: list[tuple[int, str]] = field(default_factory=list)
    # Lines whose V100 throughput was scaled from a smaller scale factor.
    approximated: list[int] = field(default_factory=list)


def parse_line(text: str, line: int) -> GavelJob:
    """One Gavel trace line (7- or 10-field layout; see the module docstring)."""
    fields = text.rstrip("\r\n").split("\t")
    if len(fields) == 7:
        job_type, steps, arrival, scale = fields[0], fields[4], fields[5], fields[6]
    elif len(fields) == 10:
        job_type, steps, scale, arrival = fields[0], fields[5], fields[6], fields[9]
    else:
        raise GavelTraceError(f"line {line}: expected 7 or 10 tab-separated fields, got {len(fields)}")
    try:
        job = GavelJob(line, job_type.strip(), int(steps), int(scale), float(arrival))
    except ValueError as exc:
        raise GavelTraceError(f"line {line}: {exc}") from None
    if job.total_steps < 1 or job.scale_factor < 1 or job.arrival_s < 0:
        raise GavelTraceError(f"line {line}: steps and scale factor must be >= 1 and arrival >= 0")
    return job


def parse_trace(text: str) -> list[GavelJob]:
    return [parse_line(raw, n) for n, raw in enumerate(text.splitlines()) if raw.strip()]


def isolated_throughputs(raw: Mapping[str, object]) -> dict[str, dict[str, dict[int, float]]]:
    """The one-job (not co-located) figures of Gavel's ``simulation_throughputs.json`` for v100, p100
    and k80, zeros (configurations that did not run) left out."""
    out: dict[str, dict[str, dict[int, float]]] = {}
    for worker in WORKER_TYPES:
        entries = raw.get(worker)
        if not isinstance(entries, Mapping):
            raise GavelTraceError(f"throughputs: no {worker!r} table")
        for key, value in entries.items():
            match = _KEY.match(str(key))
            alone = value.get("null") if isinstance(value, Mapping) else None
            if match is None or not isinstance(alone, int | float) or alone <= 0:
                continue
            out.setdefault(worker, {}).setdefault(match["type"], {})[int(match["scale"])] = float(alone)
    return out


def load_throughputs(path: Path) -> Throughputs:
    """Gavel's full throughput file, or the isolated subset `write_throughputs` wrote."""
    raw = json.loads(path.read_text())
    if "steps_per_s" in raw:
        return {
            worker: {
                job_type: {int(s): float(v) for s, v in scales.items()} for job_type, scales in types.items()
            }
            for worker, types in raw["steps_per_s"].items()
        }
    return isolated_throughputs(raw)


def throughputs_document(throughputs: Throughputs, source: str) -> dict[str, object]:
    return {
        "source": source,
        "units": "iterations/s of one job alone on scale_factor GPUs of the worker type",
        "steps_per_s": {
            worker: {
                job_type: {
                    str(s): throughputs[worker][job_type][s] for s in sorted(throughputs[worker][job_type])
                }
                for job_type in sorted(throughputs[worker])
            }
            for worker in WORKER_TYPES
            if worker in throughputs
        },
    }


def model_of(job_type: str) -> str | None:
    """The heterotrain model of the job type's family; None where there is none (A3C)."""
    match = _BATCH.match(job_type)
    return MODEL_OF_FAMILY.get(match["family"] if match else job_type)


def workload_key(job_type: str) -> str:
    """``ResNet-18 (batch size 32)`` -> ``gavel-resnet-18-bs32``."""
    match = _BATCH.match(job_type)
    name = f"{match['family']}-bs{match['batch']}" if match else job_type
    return "gavel-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def reference_steps_per_s(throughputs: Throughputs, job_type: str, scale_factor: int) -> tuple[float, bool]:
    """V100 iterations/s of the job on ``scale_factor`` GPUs, and whether it is Gavel's own figure
    (True) or scaled linearly from the largest smaller scale factor measured (False)."""
    measured = throughputs.get(REFERENCE_WORKER, {}).get(job_type, {})
    if scale_factor in measured:
        return measured[scale_factor], True
    below = [s for s in measured if s < scale_factor]
    if not below:
        raise GavelTraceError(
            f"throughputs: no V100 figure for {job_type!r} at {scale_factor} GPU(s) or fewer"
        )
    s = max(below)
    return measured[s] * scale_factor / s, False


def convert(jobs: Sequence[GavelJob], throughputs: Throughputs, limit: int | None = None) -> Conversion:
    """heterotrain trace rows of ``jobs`` (the first ``limit`` converted rows, if given)."""
    conversion = Conversion(rows=[])
    for job in jobs:
        if limit is not None and len(conversion.rows) >= limit:
            break
        model = model_of(job.job_type)
        if model is None:
            conversion.dropped.append((job.line, f"no heterotrain model for {job.job_type!r}"))
            continue
        rate, exact = reference_steps_per_s(throughputs, job.job_type, job.scale_factor)
        if not exact:
            conversion.approximated.append(job.line)
        conversion.rows.append(
            TraceJob(
                job_id=f"gavel-{job.line:05d}",
                arrival_s=job.arrival_s,
                model=model,
                gpus_min=job.scale_factor,
                gpus_max=job.scale_factor,
                duration_s=round(job.total_steps / rate, 3),
                priority=0,
                workload=workload_key(job.job_type),
            )
        )
    return conversion


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hetero_operator.simulator.gavel_trace",
        description="Convert a Gavel trace into a `heterotrain simulate --trace` CSV.",
    )
    parser.add_argument("trace", type=Path, nargs="?", help="Gavel .trace file")
    parser.add_argument("throughputs", type=Path, help="simulation_throughputs.json, or its isolated subset")
    parser.add_argument("out", type=Path, help="CSV (or, with --extract, JSON) to write")
    parser.add_argument("--jobs", type=int, default=None, help="keep only the first N converted jobs")
    parser.add_argument(
        "--extract", action="store_true", help="write the isolated throughputs subset instead (no trace)"
    )
    parser.add_argument("--source", default=None, help="with --extract: where the throughputs came from")
    args = parser.parse_args(argv)
    throughputs = load_throughputs(args.throughputs)
    if args.extract:
        document = throughputs_document(throughputs, args.source or str(args.throughputs))
        args.out.write_text(json.dumps(document, indent=1) + "\n")
        return 0
    if args.trace is None:
        parser.error("a trace file is needed unless --extract is given")
    conversion = convert(parse_trace(args.trace.read_text()), throughputs, args.jobs)
    args.out.write_text(trace_to_csv(conversion.rows))
    summary = {
        "rows": len(conversion.rows),
        "dropped": len(conversion.dropped),
        "approximated": len(conversion.approximated),
    }
    sys.stderr.write(json.dumps(summary) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
