"""The OpenAPI document against the running app: every operation, schemathesis-generated requests.

The app runs in-process over ASGI and reads the test bed's API server for real. Only here is
authentication replaced (every caller is let in), because generated requests carry no tokens; the
real TokenReview and SubjectAccessReview paths are covered over HTTP in test_api_testbed.py.
"""

from __future__ import annotations

import pytest
import schemathesis
from api_bed import ApiBed
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.core.result import Ok
from schemathesis.generation.case import Case

from hetero_operator.api import ApiSettings, create_app
from hetero_operator.api.access import Caller, Permission, Verdict
from hetero_operator.api.dependencies import access_control, current_caller

pytestmark = pytest.mark.testbed

EXAMPLES_PER_OPERATION = 12
NOT_APPLICABLE = [
    # Everyone is let in on purpose here; test_api_testbed.py checks that auth is enforced.
    schemathesis.checks.ignored_auth,
    # The job spec's cross-field rules (the CRD's CEL rules: gpus.min <= gpus.max, one parameter block
    # per strategy, ...) cannot be written in JSON Schema, so schema-valid specs may rightly get 422.
    schemathesis.checks.positive_data_acceptance,
]


class LetEveryoneIn:
    async def authenticate(self, token: str) -> Caller | None:
        return Caller("schemathesis")

    async def check(self, caller: Caller, permission: Permission) -> Verdict:
        return Verdict(True)


def test_every_operation_conforms_to_its_openapi_description(api_bed: ApiBed) -> None:
    app = create_app(ApiSettings(kubeconfig=api_bed.testbed.kubeconfig))
    app.dependency_overrides[current_caller] = lambda: Caller("schemathesis")
    app.dependency_overrides[access_control] = LetEveryoneIn
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), f"the OpenAPI document is invalid: {result}"
        operations.append(result.ok())
    assert {op.path for op in operations} >= {
        "/api/v1/whatif",
        "/api/v1/jobs/{namespace}/{name}",
        "/api/v1/pools",
    }
    statuses: dict[str, set[int]] = {}
    for operation in operations:

        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            derandomize=True,
            database=None,
            deadline=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy())
        def conforms(case: Case) -> None:
            response = case.call_and_validate(excluded_checks=NOT_APPLICABLE)
            statuses.setdefault(case.operation.label, set()).add(response.status_code)

        conforms()
    # Generated data reached the handlers, not only the validation layer.
    assert 200 in statuses["GET /api/v1/pools"]
    assert 200 in statuses["POST /api/v1/whatif"], statuses
