"""Request bodies: one declaration per field gives both the validation and the OpenAPI schema.

The fields that several endpoints running a model share (`model_field`, `max_length_field`) are declared here, with
the token limits they stand for (`validate_tokens`, `refuse_over_limit`; a request's max_length is
`Service.max_length`).

A body that breaks a rule gets 422 with one line naming the field, the rule and what was sent.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnscope.errors import AttnscopeError
from attnscope.numbers import is_count

if TYPE_CHECKING:
    from starlette.requests import Request

    from attnscope.models import Model
    from attnscope.serve.service import Service
    from attnscope.serve.settings import Settings

ENCODINGS = ("base64", "list")
# A non-space character, the same set in Python and in ECMA-262 (whose \s differs on \x1c-\x1f, \x85, \ufeff).
_NONBLANK = r"[^\s\x1c-\x1f\x85\ufeff]"


class RequestError(Exception):
    """A request the server refuses: an HTTP status and a one-line message for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Field:
    """One JSON body field: its type, bounds, default and the words a client reads."""

    name: str
    type: str  # "string" | "integer" | "number" | "boolean" | "array" (of strings)
    description: str
    required: bool = False
    nullable: bool = False
    default: Any = None
    minimum: float | None = None  # integers and numbers
    maximum: float | None = None
    exclusive_minimum: bool = False  # numbers: the minimum itself is refused (a temperature of 0)
    max_length: int | None = None  # strings: characters; arrays: items
    enum: tuple[str, ...] | None = None  # strings, or the items of an array
    empty: str = "give a sentence"  # strings: what to send instead of a blank one

    def schema(self) -> dict[str, Any]:
        """This field as an OpenAPI 3.0 schema."""
        s: dict[str, Any] = {"type": self.type, "description": self.description}
        if self.type == "array":
            item: dict[str, Any] = {"type": "string"}
            if self.enum is not None:
                item["enum"] = list(self.enum)
            s.update(items=item, uniqueItems=True)
        elif self.enum is not None:
            s["enum"] = [*self.enum, None] if self.nullable else list(self.enum)
        if self.type == "string" and self.enum is None:
            s.update(minLength=1, pattern=_NONBLANK)
        for key, value in (("minimum", self.minimum), ("maximum", self.maximum)):
            if value is not None:
                s[key] = value
        if self.exclusive_minimum:
            s["exclusiveMinimum"] = True  # OpenAPI 3.0: a flag on minimum
        if self.max_length is not None:
            s["maxItems" if self.type == "array" else "maxLength"] = self.max_length
        if self.nullable:
            s["nullable"] = True
        if not self.required and self.default is not None:
            s["default"] = list(self.default) if isinstance(self.default, tuple) else self.default
        return s

    def parse(self, value: Any) -> Any:
        """The value, checked; raises RequestError(422) naming the field and the rule."""
        if value is None:
            if self.nullable:
                return None
            raise self._bad("must not be null", value)
        if self.type == "string":
            return self._string(value)
        if self.type == "integer":
            return self._integer(value)
        if self.type == "number":
            return self._number(value)
        if self.type == "boolean":
            if not isinstance(value, bool):
                raise self._bad("must be true or false", value)
            return value
        return self._array(value)

    def _string(self, value: Any) -> str:
        if not isinstance(value, str):
            raise self._bad("must be a string", value)
        if self.enum is not None and value not in self.enum:
            raise self._bad(f"must be one of {', '.join(map(repr, self.enum))}", value)
        if self.max_length is not None and len(value) > self.max_length:
            raise self._bad(f"is {len(value)} characters long, over the limit of {self.max_length}: "
                            "shorten it", None)
        if not re.search(_NONBLANK, value):
            raise self._bad(f"is empty: {self.empty}", value)
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise self._bad(f"is not valid Unicode text (an unpaired surrogate at character {exc.start})",
                            None) from exc
        return value

    def _integer(self, value: Any) -> int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._bad("must be an integer", value)
        low = -math.inf if self.minimum is None else self.minimum
        high = math.inf if self.maximum is None else self.maximum
        if not low <= value <= high:
            span = f"from {self.minimum}" + ("" if self.maximum is None else f" to {self.maximum}")
            raise self._bad(f"must be {span}", value)
        return value

    def _number(self, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._bad("must be a number", value)
        number = float(value)
        if not math.isfinite(number):
            raise self._bad("must be a finite number", None)
        low = -math.inf if self.minimum is None else self.minimum
        high = math.inf if self.maximum is None else self.maximum
        if number < low or number > high or (self.exclusive_minimum and number == low):
            joint = "and at most" if self.exclusive_minimum else "to"
            upper = "" if self.maximum is None else f" {joint} {self.maximum}"
            span = f"{'above' if self.exclusive_minimum else 'from'} {self.minimum}{upper}"
            raise self._bad(f"must be {span}", value)
        return number

    def _array(self, value: Any) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._bad("must be a list of strings", value)
        unknown = [v for v in value if self.enum is not None and v not in self.enum]
        if unknown:
            raise self._bad(f"has {unknown[0]!r}; the choices are {', '.join(self.enum or ())}", None)
        if len(set(value)) != len(value):
            raise self._bad("names an item twice", value)
        return tuple(value)

    def _bad(self, rule: str, value: Any) -> RequestError:
        sent = "" if value is None and rule != "must not be null" else f" (got {_preview(value)})"
        return RequestError(422, f"field {self.name!r} {rule}{sent}")


def _preview(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 40 else text[:37] + "..."


def model_field(models: Sequence[str]) -> Field:
    """The `model` field of an endpoint that runs a model: one of `models` (the served names), null for the default."""
    return Field("model", "string", "A model this server serves (GET /api/models); null for the default.",
                 nullable=True, enum=tuple(models))


def max_length_field(settings: Settings) -> Field:
    """The `max_length` field: the most tokens of each text (refused over it, not cut), at most the server's."""
    return Field("max_length", "integer", "Maximum tokens of each text, special tokens included (a longer text is "
                 f"refused, not cut); null for the server's limit ({settings.max_tokens}) or the model's, whichever "
                 "is smaller.", nullable=True, minimum=2, maximum=settings.max_tokens)


def validate_tokens(service: Service, m: Model, *texts: str) -> None:
    """Refuse (AttnscopeError: 422) a text whose tokens (special tokens included) are over the server's max_tokens."""
    for text in texts:
        refuse_over_limit(service, len(m.tokenizer(text)["input_ids"]))


def refuse_over_limit(service: Service, n: int, what: str = "the text") -> None:
    """Refuse (AttnscopeError: 422) `what`, n tokens long, when that is over the server's max_tokens."""
    if n > service.settings.max_tokens:
        raise AttnscopeError(f"{what} is {n} tokens long, over this server's limit of "
                             f"{service.settings.max_tokens}: shorten it")


def parse_body(data: Any, fields: Sequence[Field]) -> dict[str, Any]:
    """Every field's value (defaults filled in); unknown or missing fields are errors."""
    if not isinstance(data, dict):
        raise RequestError(422, f"the body must be a JSON object with the fields {_names(fields)}")
    known = {f.name for f in fields}
    unknown = sorted(set(data) - known)
    if unknown:
        raise RequestError(422, f"unknown field {unknown[0]!r}: the fields are {_names(fields)}")
    out: dict[str, Any] = {}
    for f in fields:
        if f.name not in data:
            if f.required:
                raise RequestError(422, f"field {f.name!r} is required")
            out[f.name] = f.default
        else:
            out[f.name] = f.parse(data[f.name])
    return out


def _names(fields: Sequence[Field]) -> str:
    return ", ".join(f.name for f in fields)


def body_schema(fields: Sequence[Field]) -> dict[str, Any]:
    """A request body's OpenAPI schema: a closed object of these fields."""
    return {
        "type": "object",
        "additionalProperties": False,
        "required": [f.name for f in fields if f.required],
        "properties": {f.name: f.schema() for f in fields},
    }


def parse_json(body: bytes) -> Any:
    """Strict JSON: no NaN or Infinity literals, UTF-8 only; anything else is a 422."""
    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(body.decode("utf-8"), parse_constant=no_constant)
    except UnicodeDecodeError as exc:
        raise RequestError(422, f"the body is not UTF-8 (byte {exc.start}): send JSON text") from exc
    except RecursionError as exc:
        raise RequestError(422, "the body is nested too deeply: send a flat JSON object") from exc
    except ValueError as exc:
        raise RequestError(422, f"the body is not valid JSON: {exc}") from exc


async def read_json(request: Request, limit: int) -> Any:
    """The body as JSON, refusing (413) as soon as it is over the limit, before reading it all."""
    declared = request.headers.get("content-length", "")
    if is_count(declared) and int(declared) > limit:
        raise RequestError(413, f"the body is {int(declared)} bytes, over the limit of {limit}: send less text")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise RequestError(413, f"the body is over the limit of {limit} bytes: send less text")
    return parse_json(bytes(body))
