"""schemathesis against the served OpenAPI schema: generated valid and invalid bodies, bounded examples.

Every response must be documented (status, content type, body schema), no input may give a 5xx,
bodies the schema rejects must be refused, and bodies it accepts must be served, except for the
two refusals a schema cannot express, which must then say so.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import positive_data_acceptance
from serve_support import Server

EXAMPLES = 25
OPERATIONS = [("/api/trace", "POST"), ("/api/explain", "POST"), ("/api/neuron", "POST"), ("/api/models", "GET"),
              ("/healthz", "GET")]
# Valid by the schema yet impossible for this text: more tokens than max_length with truncate=false, and
# a query token past the end of the text. Each is refused with 422 and exactly this reason.
TEXT_DEPENDENT = ("tokens long, over the maximum of", "is out of range: this text has")


@pytest.fixture(scope="module")
def api_schema(server: Server) -> Any:
    return schemathesis.openapi.from_url(server.url + "openapi.json")


def test_the_schema_lists_every_operation(api_schema: Any) -> None:
    found = sorted((op.ok().path, op.ok().method.upper()) for op in api_schema.get_all_operations())
    assert found == sorted(OPERATIONS)


CASES = [(p, m, GenerationMode.POSITIVE) for p, m in OPERATIONS] + \
        [(p, m, GenerationMode.NEGATIVE) for p, m in OPERATIONS if m == "POST"]  # a GET has nothing to break


@pytest.mark.parametrize(("path", "method", "mode"), CASES, ids=[f"{m} {p} {g.value}" for p, m, g in CASES])
def test_api_conforms_to_its_schema(api_schema: Any, path: str, method: str, mode: GenerationMode) -> None:
    operation = api_schema[path][method]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              phases=[Phase.explicit, Phase.generate],
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
    def check(case: Any) -> None:
        response = case.call_and_validate(excluded_checks=[positive_data_acceptance])
        if mode is GenerationMode.POSITIVE and response.status_code != 200:
            assert response.status_code == 422, response.text
            assert any(reason in response.json()["error"] for reason in TEXT_DEPENDENT), response.text

    check()
