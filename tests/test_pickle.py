"""A used model pickles (Ray ships models to workers): its hooks stay behind, its numbers do not change."""

from __future__ import annotations

import pickle

import numpy as np

import attnscope


def test_a_traced_model_round_trips_through_pickle(minilm: attnscope.Model) -> None:
    before = attnscope.trace("time flies like an arrow", model=minilm)  # leaves transformers' hooks behind
    copy = pickle.loads(pickle.dumps(minilm))
    assert copy.name == minilm.name and copy.model is not minilm.model
    after = attnscope.trace("time flies like an arrow", model=copy)
    assert np.array_equal(after.weights, before.weights) and after.check().ok
