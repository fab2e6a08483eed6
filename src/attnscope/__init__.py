"""attnscope: open up the self-attention inside real transformer models."""

from attnscope.check import TOLERANCE, CheckReport
from attnscope.errors import AttnscopeError
from attnscope.models import DEFAULT_MODEL, Model, load_model
from attnscope.tokens import Token
from attnscope.trace import Trace, trace

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MODEL",
    "TOLERANCE",
    "AttnscopeError",
    "CheckReport",
    "Model",
    "Token",
    "Trace",
    "load_model",
    "trace",
]
