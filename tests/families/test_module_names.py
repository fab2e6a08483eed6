"""adapters.module_name: one walk of the model cached per model, used only while it still names the module; and
adapters.submodule, get_submodule read along the registered children."""

from __future__ import annotations

import pytest
import torch
import transformers as T
from torch import nn

from attnscope.families import attention_modules, family_of
from attnscope.families.adapters import module_name, submodule


def _bert() -> nn.Module:
    torch.manual_seed(0)
    return T.BertModel(T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                    intermediate_size=64, vocab_size=100)).eval()


def test_names_match_a_walk_of_the_model() -> None:
    model = _bert()
    for name, mod in model.named_modules():
        assert module_name(model, mod) == name


def test_bert_output_projection_is_the_layers_own() -> None:
    model = _bert()
    fam = family_of(model)
    assert fam is not None
    for layer, mod in enumerate(attention_modules(model)):
        assert fam.out_proj(model, mod) is model.encoder.layer[layer].attention.output.dense
        assert fam.out_proj(model, mod) is model.encoder.layer[layer].attention.output.dense  # from the cache


def test_a_replaced_module_is_found_not_the_cached_one() -> None:
    """The cache is filled, then the output projection and a whole attention module are replaced: the lookups
    follow the model as it is now (a cache trusted blindly would return the old projection, or fail)."""
    model = _bert()
    fam = family_of(model)
    assert fam is not None
    first = attention_modules(model)[0]
    assert fam.out_proj(model, first) is model.encoder.layer[0].attention.output.dense
    new_dense = nn.Linear(32, 32)
    model.encoder.layer[0].attention.output.dense = new_dense
    assert fam.out_proj(model, first) is new_dense
    # the first layer's attention module moved to the second layer: its sibling is now the second layer's
    model.encoder.layer[1].attention.self = first
    assert module_name(model, first) in {"encoder.layer.0.attention.self", "encoder.layer.1.attention.self"}
    del model.encoder.layer[0].attention.self
    assert module_name(model, first) == "encoder.layer.1.attention.self"
    assert fam.out_proj(model, first) is model.encoder.layer[1].attention.output.dense


def test_a_module_outside_the_model_is_refused() -> None:
    with pytest.raises(LookupError, match="is not part of"):
        module_name(_bert(), nn.Linear(2, 2))


def test_submodule_is_get_submodule() -> None:
    """Every name of a walk gives the very module get_submodule gives; a missing name, a name through an attribute
    that is not a child, and a child set to None fail as get_submodule fails (AttributeError)."""
    model = _bert()
    for name, mod in model.named_modules():
        assert submodule(model, name) is model.get_submodule(name) is mod
    model.encoder.layer[0].attention.output.dense = None  # type: ignore[assignment]
    for name in ["encoder.layer.9", "encoder.layer.0.nothing", "encoder.layer.0.attention.output.dense.weight",
                 "encoder.layer.0.attention.output.dense"]:
        with pytest.raises(AttributeError):
            model.get_submodule(name)
        with pytest.raises(AttributeError):
            submodule(model, name)
