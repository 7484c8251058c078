"""Shared pieces of the `heterotrain.io/v1alpha1` models: wire naming, CEL rules, common field types.

Python code uses snake_case; the Kubernetes wire format uses camelCase. Every model forbids unknown
fields so a typo in a manifest is an error that names the field, not a silently ignored setting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

GROUP = "heterotrain.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# Bounds that keep the API server's CEL cost estimator happy and objects reasonably small.
MAX_NAME_LENGTH = 253
MAX_LABEL_VALUE_LENGTH = 63
MAX_GPU_CLASSES = 16
MAX_WORKERS = 1024
MAX_STRING_LENGTH = 4096

DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

# A Kubernetes object name such as a GPUClass or node name.
ObjectName = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_NAME_LENGTH, pattern=DNS_SUBDOMAIN_PATTERN)
]
# A Kubernetes resource quantity ("500m", "4", "16Gi", "1.5G"), as the API server parses one.
QUANTITY_PATTERN = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$"
Quantity = Annotated[str, StringConstraints(max_length=32, pattern=QUANTITY_PATTERN)]
LabelValue = Annotated[str, StringConstraints(max_length=MAX_LABEL_VALUE_LENGTH)]
BoundedString = Annotated[str, StringConstraints(max_length=MAX_STRING_LENGTH)]

CelReason = Literal["FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired", "FieldValueDuplicate"]


@dataclass(frozen=True)
class CelRule:
    """One cross-field rule, enforced by the API server as CEL and by the models in Python.

    `message` is shared by both so a user sees the same words whichever side rejects the object.
    `field_path` is relative to the object the rule is attached to (for example `.min`).
    """

    rule: str
    message: str
    field_path: str | None = None
    reason: CelReason | None = None

    def violation(self, details: str) -> PydanticCustomError:
        """The error a model validator raises when this rule fails; `details` shows the values found.
        The field path rides along so errors point at the same field the API server names."""
        return PydanticCustomError(
            "cross_field_rule",
            "{message} ({details})",
            {"message": self.message, "details": details, "field_path": self.field_path or ""},
        )

    def to_openapi(self) -> dict[str, str]:
        validation = {"rule": self.rule, "message": self.message}
        if self.field_path is not None:
            validation["fieldPath"] = self.field_path
        if self.reason is not None:
            validation["reason"] = self.reason
        return validation


def cel_rules(*rules: CelRule) -> dict[str, Any]:
    """`json_schema_extra` that attaches CEL rules to a model's schema node."""
    return {"x-kubernetes-validations": [rule.to_openapi() for rule in rules]}


class WireModel(BaseModel):
    """Base for every API model: camelCase on the wire, snake_case in Python, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=False,
        validate_default=True,
    )

    def to_wire(self) -> dict[str, Any]:
        """The camelCase JSON form with unset optional fields left out, as the API server stores it."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class InvalidResourceError(ValueError):
    """A manifest or API object that breaks the API's rules. `problems` holds one
    `spec.field.path: what is wrong` line per error, in the API server's path style."""

    def __init__(self, kind: str, name: str, problems: list[str]) -> None:
        self.kind = kind
        self.name = name
        self.problems = problems
        super().__init__(f"{kind} {name!r} is invalid:\n  " + "\n  ".join(problems))


def field_path(location: tuple[int | str, ...]) -> str:
    """pydantic's error location as a Kubernetes field path: ('spec', 'env', 0, 'name') -> spec.env[0].name"""
    path = ""
    for part in location:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def describe_errors(error: ValidationError) -> list[str]:
    """One `field.path: message` line per validation error."""
    lines = []
    for detail in error.errors(include_url=False):
        context = detail.get("ctx") or {}
        path = field_path(detail["loc"]) + str(context.get("field_path", ""))
        message = detail["msg"].removeprefix("Value error, ")
        lines.append(f"{path or '<object>'}: {message}")
    return lines
