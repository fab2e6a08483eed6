"""Input attribution (issue 31): which input tokens carry a prediction, by attention-, gradient- and
perturbation-based methods on the same objective, each method's scores printed beside its check.

    >>> from attnscope.attribution import attribute
    >>> a = attribute("The capital of France is", model="smollm2", methods="saliency,leave_one_out")
    >>> a.scores("saliency").shape   # [target, token]
    (1, 5)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnscope import _lazy

_EXPORTS = {
    "attribute": "attnscope.attribution.api",
    "Attribution": "attnscope.attribution.record",
    "MethodScores": "attnscope.attribution.record",
    "MethodCheck": "attnscope.attribution.record",
    "METHODS": "attnscope.attribution.methods",
    "Settings": "attnscope.attribution.methods",
}
__all__ = ["METHODS", "Attribution", "MethodCheck", "MethodScores", "Settings", "attribute"]

if TYPE_CHECKING:
    from attnscope.attribution.api import attribute
    from attnscope.attribution.methods import METHODS, Settings
    from attnscope.attribution.record import Attribution, MethodCheck, MethodScores

__getattr__ = _lazy.exports("attnscope.attribution", _EXPORTS)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
