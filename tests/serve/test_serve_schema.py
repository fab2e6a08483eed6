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
REFUSED_ONLY = [("/api/generate", "POST"), ("/api/ablate", "POST"), ("/api/patch", "POST"), ("/api/attribute", "POST"),
                ("/api/faithfulness", "POST"), ("/api/search", "POST"),  # search: 404 on a server without --index
                ("/api/qkmap", "POST"), ("/api/heads", "POST")]  # 404 without --index, --heads
# 404 on a server without --heads: its answer is tested in tests/serve/test_serve_corpus_views.py
UNLOADED = [("/api/heads", "GET")]
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
    assert found == sorted([*OPERATIONS, *REFUSED_ONLY, MAP, *UNLOADED])


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


# Numbers a careless or hostile client writes: digits that str.isdigit accepts and int() refuses (or reads), floats
# at the ends of float64 (subnormal, overflow, a signed zero) and NaN or infinity spelled as strings or huge ints.
ODD_NUMBERS: list[Any] = ["²", "٣", "1²", "٣.٣", "cross:².0", "².٣", 1e-300, 5e-324, 1e308, -1e308, -0.0, "nan",
                          "NaN", "-inf", "1e-300", "-0.0", 2**64, -(2**63)]
BASE_BODIES = {"/api/trace": {"text": "odd numbers"}, "/api/explain": {"text": "odd numbers"},
               "/api/neuron": {"text": "odd numbers"}, "/api/generate": {"prompt": "odd numbers"},
               "/api/ablate": {"text": "odd numbers", "heads": "0.0"},
               "/api/patch": {"clean": "odd numbers", "corrupt": "odd letters"},
               "/api/attribute": {"text": "odd numbers", "methods": "attention"},
               "/api/faithfulness": {"text": "odd numbers", "methods": "attention", "seeds": 1},
               "/api/search": {"text": "odd numbers", "token": 1, "layer": 0},
               "/api/qkmap": {"layer": 0}, "/api/heads": {"clusters": 2}}


def _validated(case: Any) -> Any:
    """The response, checked against the document (status, content type, schema), never a 5xx."""
    response = case.call()
    assert response.status_code < 500, (case.path, case.body, case.query, response.text[:300])
    case.validate_response(response, excluded_checks=[positive_data_acceptance])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error, str) and "\n" not in error
    return response


@pytest.mark.parametrize("path", sorted(BASE_BODIES))
def test_odd_numbers_in_every_body_field(api_schema: Any, path: str) -> None:
    """Each field of each body, one at a time, set to each odd number: a 4xx naming the field, or an answer."""
    operation = api_schema[path]["POST"]
    fields = operation.definition.raw["requestBody"]["content"]["application/json"]["schema"]["properties"]
    refused = 0
    for name in fields:
        for value in ODD_NUMBERS:
            response = _validated(operation.Case(body={**BASE_BODIES[path], name: value},
                                                      media_type="application/json"))
            refused += response.status_code == 422
    assert refused > len(fields) * len(ODD_NUMBERS) // 2  # most are refused; some are valid (a text "²")


def test_odd_numbers_in_the_map_query(api_schema: Any, server: Server) -> None:
    import httpx

    traced = httpx.post(server.url + "api/trace", json={"text": "Odd numbers, lazily.", "stages": [],
                                                        "payload": True, "maps": "lazy"}, timeout=60)
    trace_id = traced.json()["payload"]["maps"]["trace"]
    operation = api_schema["/api/trace/{id}/map"]["GET"]
    for name in ("source", "layer", "head", "precision", "level"):
        for value in ODD_NUMBERS:
            query = {"layer": "0", name: str(value)}
            response = _validated(operation.Case(path_parameters={"id": trace_id}, query=query))
            if name in ("layer", "head") and not str(value).isascii():
                assert response.status_code == 422 and "must be a whole number" in response.json()["error"]
