"""The generated CRDs: structural, up to date, and in agreement with the pydantic models.

Without an API server, the CRD is exercised by a small emulation of what the API server does with a
create request: apply schema defaults, validate against the OpenAPI schema (jsonschema, draft 4 like
OpenAPI v3.0), reject unknown fields (kubectl's strict field validation), reject duplicates in set and
map lists, and evaluate every CEL rule (cel-python).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetero_operator.resources import (
    GPUClass,
    HeteroQueue,
    HeteroTrainJob,
    InvalidResourceError,
    checkpoint_storage,
    job_limits,
    job_spec,
    parallelism,
    pod_template,
    queue,
)
from hetero_operator.resources.base import CelRule
from hetero_operator.resources.crd import all_crds, main, render, stale_files
from hetero_operator.resources.structural import resolve_field_path, structural_violations

REPO = Path(__file__).resolve().parents[2]
CRD_DIR = REPO / "crds"
EXAMPLES = REPO / "examples"
INVALID_CASES = yaml.safe_load((REPO / "tests" / "data" / "invalid_manifests.yaml").read_text())
UPDATES = yaml.safe_load((REPO / "tests" / "data" / "job_updates.yaml").read_text())
CRDS = all_crds()
SCHEMAS = {
    crd["spec"]["names"]["kind"]: crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for crd in CRDS.values()
}
MODELS: dict[str, type[HeteroTrainJob] | type[GPUClass] | type[HeteroQueue]] = {
    "HeteroTrainJob": HeteroTrainJob,
    "GPUClass": GPUClass,
    "HeteroQueue": HeteroQueue,
}


# --- an emulation of the API server's create path ---------------------------------------------------


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Fill in schema defaults the way the API server does, recursing into defaulted objects too."""
    if isinstance(value, dict) and schema.get("type") == "object":
        result = dict(value)
        for name, child in schema.get("properties", {}).items():
            if name not in result and "default" in child:
                result[name] = copy.deepcopy(child["default"])
            if name in result:
                result[name] = apply_defaults(child, result[name])
        if isinstance(schema.get("additionalProperties"), dict):
            result = {
                key: apply_defaults(schema["additionalProperties"], item) for key, item in result.items()
            }
        return result
    if isinstance(value, list) and "items" in schema:
        return [apply_defaults(schema["items"], item) for item in value]
    return value


def k8s_path(parts: Any) -> str:
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def openapi_errors(schema: dict[str, Any], obj: Any) -> list[str]:
    errors = []
    for error in jsonschema.Draft4Validator(schema).iter_errors(obj):
        path = k8s_path(error.absolute_path)
        missing = re.match(r"'(.+?)' is a required property", error.message)
        if missing:
            path = f"{path}.{missing.group(1)}" if path else missing.group(1)
        errors.append(f"{path}: {error.message}")
    return errors


def walk(schema: dict[str, Any], value: Any, path: str) -> Iterator[tuple[dict[str, Any], Any, str]]:
    """Every (schema node, value, field path) pair present in the object."""
    yield schema, value, path
    if isinstance(value, dict):
        for name, child in schema.get("properties", {}).items():
            if name in value:
                yield from walk(child, value[name], f"{path}.{name}" if path else name)
        if isinstance(schema.get("additionalProperties"), dict):
            for key, item in value.items():
                yield from walk(schema["additionalProperties"], item, f"{path}[{key}]")
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            yield from walk(schema["items"], item, f"{path}[{index}]")


def strict_field_errors(schema: dict[str, Any], obj: Any) -> list[str]:
    errors = []
    for node, value, path in walk(schema, obj, ""):
        if isinstance(value, dict) and "properties" in node:
            errors += [f'unknown field "{path}.{name}"' for name in value if name not in node["properties"]]
    return errors


def list_type_errors(schema: dict[str, Any], obj: Any) -> list[str]:
    errors = []
    for node, value, path in walk(schema, obj, ""):
        if not isinstance(value, list):
            continue
        if node.get("x-kubernetes-list-type") == "set":
            keys = [repr(item) for item in value]
        elif node.get("x-kubernetes-list-type") == "map":
            keys = [repr([item.get(key) for key in node["x-kubernetes-list-map-keys"]]) for item in value]
        else:
            continue
        errors += [
            f"{path}[{index}]: Duplicate value" for index, key in enumerate(keys) if key in keys[:index]
        ]
    return errors


_CEL = celpy.Environment()
_PROGRAMS: dict[str, Any] = {}


def cel_holds(rule: str, value: Any, old: Any = None) -> bool:
    if rule not in _PROGRAMS:
        _PROGRAMS[rule] = _CEL.program(_CEL.compile(rule))
    bindings = {"self": celpy.json_to_cel(value)}
    if old is not None:
        bindings["oldSelf"] = celpy.json_to_cel(old)
    result = _PROGRAMS[rule].evaluate(bindings)
    return isinstance(result, celpy.celtypes.BoolType) and bool(result)  # an evaluation error fails too


def is_transition_rule(rule: str) -> bool:
    """The API server runs a rule that reads oldSelf on updates only."""
    return "oldSelf" in rule


def cel_errors(schema: dict[str, Any], obj: Any) -> list[str]:
    errors = []
    for node, value, path in walk(schema, obj, ""):
        for validation in node.get("x-kubernetes-validations", []):
            if not is_transition_rule(validation["rule"]) and not cel_holds(validation["rule"], value):
                errors.append(f"{path}{validation.get('fieldPath', '')}: {validation['message']}")
    return errors


def emulated_create(manifest: dict[str, Any]) -> list[str]:
    """Errors the API server would report for creating `manifest`; empty when it would be accepted."""
    schema = SCHEMAS[manifest["kind"]]
    obj = apply_defaults(schema, manifest)
    return (
        openapi_errors(schema, obj)
        + strict_field_errors(schema, obj)
        + list_type_errors(schema, obj)
        + (cel_errors(schema, obj))
    )


def stored_job(phase: str | None, spec_change: dict[str, Any] | None = None) -> dict[str, Any]:
    """The update cases' base job with `spec_change` merged into its spec, defaulted, in `phase`."""
    obj = copy.deepcopy(UPDATES["base"])
    if spec_change is not None:
        obj["spec"] = merged(obj["spec"], spec_change)
    if phase is not None:
        obj["status"] = {"phase": phase}
    return dict(apply_defaults(SCHEMAS["HeteroTrainJob"], obj))


def merged(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """An RFC 7386 JSON merge patch applied to `base`."""
    result = dict(base)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = value
    return result


def emulated_update(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Errors the API server's transition rules give for replacing `old` by `new` (they sit on the
    root of the schema: see test_transition_rules_sit_on_the_root)."""
    schema = SCHEMAS[new["kind"]]
    return [
        f"{validation.get('fieldPath', '').lstrip('.')}: {validation['message']}"
        for validation in schema.get("x-kubernetes-validations", [])
        if is_transition_rule(validation["rule"]) and not cel_holds(validation["rule"], new, old)
    ]


def example_manifests() -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{path.name}#{index}", document)
        for path in sorted(EXAMPLES.glob("*.yaml"))
        for index, document in enumerate(yaml.safe_load_all(path.read_text()))
        if isinstance(document, dict) and document.get("kind") in SCHEMAS
    ]


def cel_rules_in(schema: dict[str, Any]) -> list[str]:
    return [
        validation["rule"]
        for node, _, _ in walk_schema(schema)
        for validation in node.get("x-kubernetes-validations", [])
    ]


def walk_schema(schema: dict[str, Any]) -> Iterator[tuple[dict[str, Any], None, None]]:
    yield schema, None, None
    for child in schema.get("properties", {}).values():
        yield from walk_schema(child)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from walk_schema(schema[key])


# --- the checked-in files -----------------------------------------------------------------------------


def test_checked_in_crds_equal_the_generator_output() -> None:
    assert sorted(path.name for path in CRD_DIR.glob("*.yaml")) == sorted(CRDS)
    assert stale_files(CRD_DIR) == [], "run: python -m hetero_operator.resources.crd --out crds/"


def test_cli_writes_the_crds_and_check_mode_spots_drift(tmp_path: Path) -> None:
    assert main(["--out", str(tmp_path)]) == 0
    for name, crd in CRDS.items():
        assert (tmp_path / name).read_text() == render(crd)
    assert main(["--out", str(tmp_path), "--check"]) == 0
    drifted = tmp_path / "gpuclasses.heterotrain.io.yaml"
    drifted.write_text(drifted.read_text().replace("relativeSpeed", "relSpeed"))
    assert main(["--out", str(tmp_path), "--check"]) == 1


def test_crd_names_scope_and_subresources() -> None:
    job = CRDS["heterotrainjobs.heterotrain.io.yaml"]["spec"]
    gpu_class = CRDS["gpuclasses.heterotrain.io.yaml"]["spec"]
    assert (job["scope"], job["names"]["shortNames"], job["names"]["plural"]) == (
        "Namespaced",
        ["htj"],
        "heterotrainjobs",
    )
    assert (gpu_class["scope"], gpu_class["names"]["plural"]) == ("Cluster", "gpuclasses")
    queue_crd = CRDS["heteroqueues.heterotrain.io.yaml"]["spec"]
    assert (queue_crd["scope"], queue_crd["names"]["plural"], queue_crd["names"]["shortNames"]) == (
        "Cluster",
        "heteroqueues",
        ["hq"],
    )
    for spec in (job, gpu_class, queue_crd):
        (version,) = spec["versions"]
        assert (spec["group"], version["name"], version["subresources"]) == (
            "heterotrain.io",
            "v1alpha1",
            {"status": {}},
        )


# --- structure ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_schema_is_structural_and_bounded(kind: str) -> None:
    assert structural_violations(SCHEMAS[kind]) == []


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ({"type": "object", "properties": {"a": {"$ref": "#/x", "description": "d"}}}, "$ref is not allowed"),
        ({"type": "object", "properties": {"a": {"description": "d"}}}, "type must be one of"),
        ({"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}}}, "missing description"),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "array", "description": "d", "items": {"type": "integer"}}},
            },
            "array without maxItems",
        ),
        (
            {"type": "object", "properties": {"a": {"type": "string", "description": "d"}}},
            "string without maxLength",
        ),
        (
            {"type": "object", "properties": {"a": {"type": "integer", "description": "d", "default": "x"}}},
            "is not of type integer",
        ),
        (
            {
                "type": "object",
                "x-kubernetes-validations": [{"rule": "true", "message": "m", "fieldPath": ".b"}],
            },
            "names no field",
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "number", "description": "d", "exclusiveMinimum": 0}},
            },
            "must be a boolean",
        ),
        (
            {"type": "object", "properties": {"metadata": {"type": "object", "description": "d"}}},
            "the API server owns its schema",
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "integer", "description": "d", "maximum": 2**63 - 1}},
            },
            "beyond what a float64 holds exactly",
        ),
    ],
)
def test_structural_checker_catches(schema: dict[str, Any], problem: str) -> None:
    assert any(problem in line for line in structural_violations(schema)), structural_violations(schema)


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_printer_columns_point_at_schema_fields(kind: str) -> None:
    crd = next(crd for crd in CRDS.values() if crd["spec"]["names"]["kind"] == kind)
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    for column in columns:
        if column["jsonPath"] != ".metadata.creationTimestamp":
            assert resolve_field_path(SCHEMAS[kind], column["jsonPath"]) is not None, column
    if kind == "HeteroTrainJob":
        names = [column["name"] for column in columns]
        assert names == ["Phase", "GPUs", "Classes", "Strategy", "Epoch", "Samples/s", "Age"]


def test_every_model_rule_is_in_the_crd_exactly_once() -> None:
    declared = {
        value.rule
        for module in (job_spec, parallelism, pod_template, checkpoint_storage, queue)
        for value in [
            *vars(module).values(),
            *parallelism.STRATEGY_PARAMETER_RULES.values(),
            *job_limits.IMMUTABLE_WHILE_RUNNING,
            *pod_template.OWNED_POD_FIELDS.values(),
        ]
        if isinstance(value, CelRule)
    }
    in_crd = [rule for schema in SCHEMAS.values() for rule in cel_rules_in(schema)]
    assert len(in_crd) == len(set(in_crd))
    assert set(in_crd) == declared
    for rule in in_crd:  # every rule compiles as CEL
        _CEL.compile(rule)


# --- behaviour under the emulated API server ------------------------------------------------------------


@pytest.mark.parametrize(("name", "manifest"), example_manifests())
def test_examples_are_accepted(name: str, manifest: dict[str, Any]) -> None:
    assert emulated_create(manifest) == []


@pytest.mark.parametrize("case", INVALID_CASES, ids=[case["id"] for case in INVALID_CASES])
def test_invalid_manifests_are_rejected_naming_the_field(case: dict[str, Any]) -> None:
    errors = emulated_create(case["manifest"])
    assert any(case["field"] in error for error in errors), errors


def test_every_cel_rule_is_exercised_by_an_invalid_case() -> None:
    broken = set()
    for case in INVALID_CASES:
        schema = SCHEMAS[case["manifest"]["kind"]]
        obj = apply_defaults(schema, case["manifest"])
        for node, value, _ in walk(schema, obj, ""):
            broken |= {
                v["rule"]
                for v in node.get("x-kubernetes-validations", [])
                if not is_transition_rule(v["rule"]) and not cel_holds(v["rule"], value)
            }
    for case in UPDATES["refused"]:
        old, new = stored_job(case["phase"]), stored_job(case["phase"], case["change"])
        broken |= {
            v["rule"]
            for v in SCHEMAS["HeteroTrainJob"]["x-kubernetes-validations"]
            if not cel_holds(v["rule"], new, old)
        }
    assert broken == {rule for schema in SCHEMAS.values() for rule in cel_rules_in(schema)}


def test_transition_rules_sit_on_the_root() -> None:
    root = SCHEMAS["HeteroTrainJob"]
    on_root = [v["rule"] for v in root["x-kubernetes-validations"]]
    everywhere = [rule for rule in cel_rules_in(root) if is_transition_rule(rule)]
    assert on_root == everywhere
    assert len(on_root) == len(job_limits.FIELDS_FIXED_WHILE_RUNNING)


@pytest.mark.parametrize("case", UPDATES["refused"], ids=[case["id"] for case in UPDATES["refused"]])
def test_changes_under_running_workers_are_refused_naming_the_field(case: dict[str, Any]) -> None:
    old, new = stored_job(case["phase"]), stored_job(case["phase"], case["change"])
    errors = emulated_update(old, new)
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"{case['field']}: {case['field']} cannot change while the job's workers run")
    assert "delete and recreate" in errors[0]


@pytest.mark.parametrize("case", UPDATES["allowed"], ids=[case["id"] for case in UPDATES["allowed"]])
def test_allowed_changes_pass_the_transition_rules(case: dict[str, Any]) -> None:
    old, new = stored_job(case["phase"]), stored_job(case["phase"], case["change"])
    assert emulated_update(old, new) == []
    assert emulated_create(new) == []


def normalised(value: Any) -> Any:
    """Empty lists and maps are the same as absent ones on the wire."""
    if isinstance(value, dict):
        return {key: normalised(item) for key, item in value.items() if item not in ([], {}, None)}
    if isinstance(value, list):
        return [normalised(item) for item in value]
    return value


@pytest.mark.parametrize(("name", "manifest"), example_manifests())
def test_crd_defaults_equal_model_defaults(name: str, manifest: dict[str, Any]) -> None:
    defaulted = apply_defaults(SCHEMAS[manifest["kind"]], manifest)
    model = MODELS[manifest["kind"]].from_k8s(manifest)
    assert normalised(defaulted["spec"]) == normalised(model.to_k8s()["spec"])


CLASS_NAMES = ["fast", "medium", "slow"]


@st.composite
def candidate_jobs(draw: st.DrawFn) -> dict[str, Any]:
    """Job manifests near the edges of the cross-field rules; some valid, some not."""
    strategy = draw(st.sampled_from(["data", "hetpipe", "esync", "dreamddp", "sesgd"]))
    blocks = draw(st.sets(st.sampled_from(["hetpipe", "esync", "dreamddp", "sesgd"]), max_size=2))
    block_values = {
        "hetpipe": {"virtualWorkerSize": draw(st.integers(1, 8)), "allocationPolicy": "HD"},
        "esync": {"maxLocalSteps": draw(st.integers(1, 8))},
        "dreamddp": {"period": draw(st.integers(1, 8))},
        "sesgd": {"groups": draw(st.integers(1, 8))},
    }
    batch: dict[str, Any] = {"global": draw(st.integers(1, 8))}
    for bound in ("min", "max"):
        if draw(st.booleans()):
            batch[bound] = draw(st.integers(1, 8))
    limits = draw(
        st.dictionaries(st.sampled_from([*CLASS_NAMES, "Not_A_Name"]), st.integers(1, 64), max_size=2)
    )
    if limits:
        batch["perGpuClassMax"] = limits
    return {
        "apiVersion": "heterotrain.io/v1alpha1",
        "kind": "HeteroTrainJob",
        "metadata": {"name": "candidate"},
        "spec": {
            "image": "heterotrain/trainer:0.1.0",
            "gpus": {"min": draw(st.integers(1, 6)), "max": draw(st.integers(1, 6))},
            "gpuClasses": draw(st.lists(st.sampled_from(CLASS_NAMES), max_size=3, unique=True)),
            "parallelism": {"strategy": strategy, **{block: block_values[block] for block in blocks}},
            "batch": batch,
            "epochs": 1,
        },
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(candidate_jobs())
def test_cel_rules_and_model_validators_agree(manifest: dict[str, Any]) -> None:
    try:
        job = HeteroTrainJob.from_k8s(manifest)
    except InvalidResourceError as error:
        python_errors = error.problems
    else:
        python_errors = []
        # What the model writes back is accepted too, and reads back to the same model.
        assert emulated_create(job.to_k8s()) == []
        assert HeteroTrainJob.from_k8s(job.to_k8s()) == job
    crd_errors = emulated_create(manifest)
    assert bool(python_errors) == bool(crd_errors), (python_errors, crd_errors)
