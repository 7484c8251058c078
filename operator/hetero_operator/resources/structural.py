"""Check a CRD schema against the rules the API server applies, before the API server sees it.

Covers what Kubernetes calls a structural schema (a type on every node, no references or type
unions), the CEL rule fields, and this project's own bar: a description on every field and a size
bound on every list, map and string so CEL cost estimates stay finite.
"""

from __future__ import annotations

import re
from typing import Any

# Every key a CRD schema node may carry, in the order the generator writes them (so its YAML diff
# stays readable).
SCHEMA_KEYS = (
    "description",
    "type",
    "format",
    "enum",
    "default",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "nullable",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "items",
    "additionalProperties",
    "required",
    "properties",
    "x-kubernetes-validations",
)
ALLOWED_KEYS = frozenset(SCHEMA_KEYS)
TYPES = frozenset({"object", "array", "string", "integer", "number", "boolean"})
FORMATS = frozenset({"date-time", "date", "int32", "int64", "float", "double", "byte", "uri", "email"})
CEL_REASONS = frozenset(
    {"FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired", "FieldValueDuplicate"}
)
LIST_TYPES = frozenset({"atomic", "set", "map"})
FLOAT64_EXACT_INTEGER = 2**53
_PYTHON_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}
_FIELD_PATH_SEGMENT = re.compile(r"^\.([A-Za-z_][A-Za-z0-9_]*)")


def structural_violations(schema: dict[str, Any], path: str = "") -> list[str]:
    """Every rule the schema breaks, each as `path: what is wrong`; empty when the schema is fine."""
    problems: list[str] = []
    properties = dict(schema.get("properties", {}))
    metadata = properties.pop("metadata", None)
    if metadata is not None and metadata != {"type": "object"}:
        problems.append("<root>.metadata: must be exactly {type: object}; the API server owns its schema")
    _check_node({**schema, "properties": properties}, path or "<root>", problems, is_property=False)
    return problems


def _check_node(node: dict[str, Any], path: str, problems: list[str], *, is_property: bool) -> None:
    problems.extend(
        f"{path}: {key} is not allowed in a CRD schema" for key in sorted(set(node) - ALLOWED_KEYS)
    )
    free_form = node.get("x-kubernetes-preserve-unknown-fields") is True
    node_type = node.get("type")
    if node_type not in TYPES:
        problems.append(f"{path}: type must be one of {sorted(TYPES)}, got {node_type!r}")
        return
    if is_property and not node.get("description"):
        problems.append(f"{path}: missing description")
    if "format" in node and node["format"] not in FORMATS:
        problems.append(f"{path}: unknown format {node['format']!r}")
    for key in ("minimum", "maximum"):
        # The API server reads bounds as float64; integers beyond 2**53 lose precision and are refused.
        if node_type == "integer" and key in node and abs(node[key]) > FLOAT64_EXACT_INTEGER:
            problems.append(f"{path}: {key} {node[key]} is beyond what a float64 holds exactly")
    for key in ("exclusiveMinimum", "exclusiveMaximum"):
        if key in node and not isinstance(node[key], bool):
            problems.append(f"{path}: {key} must be a boolean beside minimum/maximum")
    if "default" in node:
        _check_value(node["default"], node, f"{path}.default", problems)
    if "enum" in node:
        for value in node["enum"]:
            _check_value(value, {**node, "enum": None}, f"{path}.enum", problems)
    if node_type == "string" and "maxLength" not in node and "enum" not in node and "format" not in node:
        problems.append(f"{path}: string without maxLength (CEL cost and object size are unbounded)")
    if node_type == "array":
        _check_array(node, path, problems)
    if node_type == "object":
        _check_object(node, path, problems, free_form=free_form)
    _check_validations(node, path, problems)


def _check_value(value: Any, node: dict[str, Any], path: str, problems: list[str]) -> None:
    """A shallow check that a default or enum value fits its node, as the API server requires."""
    expected = _PYTHON_TYPES[node["type"]]
    if (isinstance(value, bool) and node["type"] != "boolean") or not isinstance(value, expected):
        problems.append(f"{path}: {value!r} is not of type {node['type']}")
    elif node.get("enum") and value not in node["enum"]:
        problems.append(f"{path}: {value!r} is not one of {node['enum']}")
    elif isinstance(value, dict) and "properties" in node:
        unknown = sorted(set(value) - set(node["properties"]))
        if unknown:
            problems.append(f"{path}: unknown fields {unknown}")


def _check_array(node: dict[str, Any], path: str, problems: list[str]) -> None:
    if "items" not in node:
        problems.append(f"{path}: array without items")
        return
    if "maxItems" not in node:
        problems.append(f"{path}: array without maxItems (CEL cost is unbounded)")
    items = node["items"]
    _check_node(items, f"{path}[]", problems, is_property=False)
    list_type = node.get("x-kubernetes-list-type")
    if list_type is not None and list_type not in LIST_TYPES:
        problems.append(f"{path}: x-kubernetes-list-type must be one of {sorted(LIST_TYPES)}")
    if list_type == "map":
        keys = node.get("x-kubernetes-list-map-keys", [])
        required = set(items.get("required", []))
        if not keys:
            problems.append(f"{path}: a map list needs x-kubernetes-list-map-keys")
        for key in keys:
            if key not in required:
                problems.append(f"{path}: list map key {key!r} must be required in the items")
    if list_type == "set" and items.get("type") == "object":
        problems.append(f"{path}: a set list must hold scalars")


def _check_object(node: dict[str, Any], path: str, problems: list[str], *, free_form: bool) -> None:
    properties = node.get("properties", {})
    additional = node.get("additionalProperties")
    if properties and additional is not None:
        problems.append(f"{path}: properties and additionalProperties are mutually exclusive")
    for name in node.get("required", []):
        if name not in properties:
            problems.append(f"{path}: required field {name!r} is not a property")
    for name, child in properties.items():
        _check_node(child, f"{path}.{name}", problems, is_property=True)
    if isinstance(additional, dict):
        if "maxProperties" not in node:
            problems.append(f"{path}: map without maxProperties (CEL cost is unbounded)")
        _check_node(additional, f"{path}{{}}", problems, is_property=False)
    elif additional is not None:
        problems.append(f"{path}: additionalProperties must be a schema; mark free-form objects instead")
    # Declared fields of a free-form object are still typed and validated; a map schema is not.
    if free_form and additional is not None:
        problems.append(f"{path}: a free-form object must not also declare a map schema")


def _check_validations(node: dict[str, Any], path: str, problems: list[str]) -> None:
    for index, validation in enumerate(node.get("x-kubernetes-validations", [])):
        where = f"{path}.x-kubernetes-validations[{index}]"
        unknown = sorted(set(validation) - {"rule", "message", "fieldPath", "reason"})
        if unknown:
            problems.append(f"{where}: unknown keys {unknown}")
        if not validation.get("rule"):
            problems.append(f"{where}: missing rule")
        if not validation.get("message"):
            problems.append(f"{where}: missing message")
        if "reason" in validation and validation["reason"] not in CEL_REASONS:
            problems.append(f"{where}: reason must be one of {sorted(CEL_REASONS)}")
        if "fieldPath" in validation and resolve_field_path(node, validation["fieldPath"]) is None:
            problems.append(f"{where}: fieldPath {validation['fieldPath']!r} names no field of this object")


def resolve_field_path(node: dict[str, Any], field_path: str) -> dict[str, Any] | None:
    """The schema node a dotted path such as `.spec.gpus.min` names, or None when no such field exists."""
    current: dict[str, Any] | None = node
    remaining = field_path
    while remaining and current is not None:
        match = _FIELD_PATH_SEGMENT.match(remaining)
        if match is None:
            return None
        current = current.get("properties", {}).get(match.group(1))
        remaining = remaining[match.end() :]
    return current
