"""schemathesis against the served OpenAPI schema: generated valid and invalid bodies, bounded examples.

Every response must be documented (status, content type, body schema), no input may give a 5xx,
bodies the schema rejects must be refused, and bodies it accepts must be served, except for the
three refusals a schema cannot express, which must then say so.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import positive_data_acceptance

from tests.support.serve import Server

EXAMPLES = 25
OPERATIONS = [("/api/trace", "POST"), ("/api/explain", "POST"), ("/api/neuron", "POST"), ("/api/models", "GET"),
              ("/healthz", "GET")]
# generate streams, ablate and patch run the model over and over: only their refusals are fuzzed here (a valid
# body is served in tests/serve/test_serve_generate.py and tests/serve/test_serve_interventions.py)
REFUSED_ONLY = [("/api/generate", "POST"), ("/api/ablate", "POST"), ("/api/patch", "POST")]
MAP = ("/api/trace/{id}/map", "GET")  # a made-up id is 404: its refusals are tested in test_serve_long.py
# Valid by the schema yet impossible for this text: more tokens than max_length with truncate=false, and
# a query token past the end of the text, a max_length that fits one text's special tokens but not a pair's.
# Each is refused with 422 and exactly this reason.
TEXT_DEPENDENT = ("tokens long, over the maximum of", "is out of range: this text has",
                  "too small: a text and its pair need",
                  "target is for encoder-decoder models")  # model-dependent: a target on a one-kind model


@pytest.fixture(scope="module")
def api_schema(server: Server) -> Any:
    return schemathesis.openapi.from_url(server.url + "openapi.json")


def test_the_schema_lists_every_operation(api_schema: Any) -> None:
    found = sorted((op.ok().path, op.ok().method.upper()) for op in api_schema.get_all_operations())
    assert found == sorted([*OPERATIONS, *REFUSED_ONLY, MAP])


CASES = [(p, m, GenerationMode.POSITIVE) for p, m in OPERATIONS] + \
        [(p, m, GenerationMode.NEGATIVE) for p, m in [*OPERATIONS, *REFUSED_ONLY] if m == "POST"]  # a GET: nothing


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


def test_stateful_trace_with_flow_then_explain(api_schema: Any) -> None:
    """schemathesis follows the schema's links: a trace that computes attention flow, then explain (or the
    neuron view) of the same text at generated layers, heads and tokens; no 5xx, every response documented."""
    steps: list[tuple[str, int, str]] = []

    linked = api_schema.exclude(path=[path for path, _ in REFUSED_ONLY])  # trace -> explain | neuron

    class Workflow(linked.as_state_machine()):  # type: ignore[misc]
        def before_call(self, case: Any) -> None:
            positive = case.meta is not None and case.meta.generation.mode is GenerationMode.POSITIVE
            if positive and case.operation.path == "/api/trace" and isinstance(case.body, dict):
                case.body.update(stages=["flow"], truncate=True)  # flow is [query, key], unlike every other array

        def validate_response(self, response: Any, case: Any, additional_checks: Any = None, **kwargs: Any) -> None:
            text = case.body.get("text") if isinstance(case.body, dict) else None
            steps.append((case.operation.path, response.status_code, str(text)))
            assert response.status_code < 500, response.text
            case.validate_response(response, excluded_checks=[positive_data_acceptance], transport_kwargs=kwargs)

    Workflow.run(settings=settings(max_examples=15, stateful_step_count=4, deadline=None, derandomize=True,
                                   database=None, suppress_health_check=list(HealthCheck)))
    flowed = {text for path, status, text in steps if path == "/api/trace" and status == 200}
    followed = [s for s in steps if s[0] in ("/api/explain", "/api/neuron") and s[2] in flowed and s[1] == 200]
    assert followed, steps[:20]
