"""Interventions: head ablation, activation patching, attention knockout and head importance.

Every edit runs inside the real forward pass through capture's registered attention function
(capture.intervening); with nothing to change, the outputs are the untouched model's, bit for bit.
"""

from __future__ import annotations

from attnscope.interventions.ablate import Ablation, ablate
from attnscope.interventions.gates import HeadEdit, parse_heads

__all__ = ["Ablation", "HeadEdit", "ablate", "parse_heads"]
