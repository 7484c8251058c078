"""Turn a pydantic JSON schema into the structural OpenAPI v3 schema a CustomResourceDefinition needs.

Kubernetes accepts only a subset of JSON Schema: no `$ref`, no `anyOf` that carries types, a `type` on
every node, `exclusiveMinimum` as a boolean beside `minimum`, and free-form objects marked with
`x-kubernetes-preserve-unknown-fields`. This module rewrites pydantic's output into that subset.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from hetero_operator.resources.structural import SCHEMA_KEYS

_NULL_BRANCH = {"type": "null"}


class UnsupportedSchemaError(ValueError):
    """A model uses a construct that has no structural OpenAPI equivalent."""


class _CrdJsonSchema(GenerateJsonSchema):
    """pydantic's generator, plus `default: {}` for fields whose default is a model built from its own
    defaults: the API server then fills in the nested defaults exactly as pydantic does."""

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        json_schema = super().default_schema(schema)
        factory = schema.get("default_factory")
        if "default" not in schema and isinstance(factory, type) and issubclass(factory, BaseModel):
            json_schema["default"] = factory().model_dump(mode="json", by_alias=True, exclude_defaults=True)
        return json_schema


def model_json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema in wire (camelCase) names, as a client would validate input."""
    return model.model_json_schema(by_alias=True, mode="validation", schema_generator=_CrdJsonSchema)


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's schema rewritten as a structural OpenAPI v3 schema (no references, typed nodes)."""
    schema = model_json_schema(model)
    definitions = schema.pop("$defs", {})
    return _convert(schema, definitions, path=model.__name__)


def _convert(node: dict[str, Any], definitions: dict[str, Any], path: str) -> dict[str, Any]:
    node = _inline(node, definitions, path)
    converted: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" or (key == "default" and value is None):
            continue
        if key == "properties":
            converted[key] = {
                name: _convert(child, definitions, f"{path}.{name}") for name, child in value.items()
            }
        elif key == "items":
            converted[key] = _convert(value, definitions, f"{path}[]")
        elif key == "additionalProperties":
            if value is True or value == {}:
                converted["x-kubernetes-preserve-unknown-fields"] = True
            elif value is not False:  # `false` is pydantic's extra="forbid"; Kubernetes prunes instead.
                converted[key] = _convert(value, definitions, f"{path}{{}}")
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            converted[bound] = value
            converted[key] = True
        elif key == "description":
            converted[key] = " ".join(value.split())  # docstrings carry line breaks; kubectl explain wraps
        elif key == "x-kubernetes-validations":
            converted[key] = [_ordered_validation(validation) for validation in value]
        elif key == "const":
            converted["enum"] = [value]
        elif key in ("anyOf", "oneOf", "allOf", "not", "$ref", "discriminator"):
            raise UnsupportedSchemaError(f"{path}: {key} has no structural OpenAPI form")
        else:
            converted[key] = value
    return _ordered(converted)


def _inline(node: dict[str, Any], definitions: dict[str, Any], path: str) -> dict[str, Any]:
    """Replace `$ref` by its definition and `anyOf: [X, null]` by X; keys beside them win."""
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        siblings = {key: value for key, value in node.items() if key != "$ref"}
        return _inline({**definitions[name], **siblings}, definitions, path)
    if "anyOf" in node:
        branches = [branch for branch in node["anyOf"] if branch != _NULL_BRANCH]
        if len(branches) != 1:
            raise UnsupportedSchemaError(f"{path}: a union of several types has no structural OpenAPI form")
        siblings = {key: value for key, value in node.items() if key != "anyOf"}
        inner = _inline(branches[0], definitions, path)
        # The field's own description beats the description of the type it refers to.
        return {**inner, **siblings}
    return node


def _ordered(node: dict[str, Any]) -> dict[str, Any]:
    rank = {key: index for index, key in enumerate(SCHEMA_KEYS)}
    return dict(sorted(node.items(), key=lambda item: (rank.get(item[0], len(rank)), item[0])))


def _ordered_validation(validation: dict[str, Any]) -> dict[str, Any]:
    order = ("rule", "message", "fieldPath", "reason")
    return {key: validation[key] for key in order if key in validation}
