"""What is explained (attribution.objective): the model's own numbers, read the same way by every method."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import attnscope
from attnscope.attribution.objective import build_objective, mean_pool
from attnscope.errors import AttnscopeError

TOL = 1e-5


def test_minilm_cosine_of_the_pooled_embedding(minilm: attnscope.Model) -> None:
    obj = build_objective(minilm, "time flies like an arrow")
    assert obj.kind == "encoder" and obj.targets == ["sentence embedding"]
    assert abs(float(obj.reference[0]) - 1.0) <= TOL  # the input against itself
    # pooled as sentence-transformers pools: the mean of the last hidden states over the mask, by hand
    with torch.no_grad():
        hidden = minilm.model(input_ids=obj.ids[None]).last_hidden_state[0]  # [token, d_model]
    assert torch.allclose(obj.pooled, hidden.mean(dim=0), atol=TOL)
    assert torch.equal(mean_pool(hidden[None], torch.ones(1, len(obj.ids))), hidden.mean(dim=0)[None])
    # one token removed: the cosine with the pooled embedding of the shorter input, computed directly
    keep = torch.ones(1, obj.n_tokens, dtype=torch.bool)
    keep[0, 2] = False
    with torch.no_grad():
        short = minilm.model(input_ids=obj.ids[keep[0]][None]).last_hidden_state[0].mean(dim=0)
    expected = torch.nn.functional.cosine_similarity(short, obj.pooled, dim=0)
    assert abs(float(obj.score_edits(keep)[0, 0]) - float(expected)) <= TOL


def test_smollm2_greedy_paris(smollm2: attnscope.Model) -> None:
    obj = build_objective(smollm2, "The capital of France is")
    assert obj.kind == "causal" and obj.targets == [" Paris"]
    assert obj.description == "log p(' Paris' | 'The capital of France is')"
    with torch.no_grad():
        logits = smollm2.model(input_ids=obj.ids[None]).logits[0, -1]
    assert abs(float(obj.reference[0]) - float(logits.log_softmax(-1)[obj.target_ids[0]])) <= TOL
    # the embeddings path every gradient method takes gives the same number (float32 rounding apart)
    with torch.no_grad():
        via_embeds = obj.score_embeds(obj.embed(obj.ids[None]))[0, 0]
    assert abs(float(via_embeds) - float(obj.reference[0])) <= TOL * max(1.0, abs(float(obj.reference[0])))


def test_removing_the_last_token_moves_the_prediction(smollm2: attnscope.Model) -> None:
    obj = build_objective(smollm2, "The capital of France is", target=" Paris")
    keep = torch.ones(1, obj.n_tokens, dtype=torch.bool)
    keep[0, -1] = False  # " is" gone: " Paris" is now predicted after " France"
    with torch.no_grad():
        logits = smollm2.model(input_ids=obj.ids[:-1][None]).logits[0, -1]
    expected = float(logits.log_softmax(-1)[obj.target_ids[0]])
    assert abs(float(obj.score_edits(keep)[0, 0]) - expected) <= TOL * max(1.0, abs(expected))


def test_multi_token_target_rows(smollm2: attnscope.Model) -> None:
    obj = build_objective(smollm2, "The capital of France is", target=" Paris is")
    assert obj.targets == [" Paris", " is"] and obj.n_tokens == 6 and obj.positions == [4, 5]


def test_seq2seq_scores_source_and_decoder_tokens(tiny_lm: Callable[[str], attnscope.Model]) -> None:
    m = tiny_lm("t5")
    obj = build_objective(m, "the capital of france", target="paris is")
    assert obj.kind == "seq2seq" and len(obj.targets) == 2
    assert obj.tokens[obj.n_source].special  # the decoder's start token
    src, dec = obj.ids[:obj.n_source], obj.ids[obj.n_source:]
    keep = torch.ones(1, obj.n_tokens, dtype=torch.bool)
    keep[0, 1] = False  # a source token removed: the encoder reads the rest
    with torch.no_grad():
        out = m.model(input_ids=src[keep[0, :obj.n_source]][None], decoder_input_ids=dec[None]).logits[0]
    expected = out.log_softmax(-1)[[0, 1], obj.target_ids]  # [target]
    assert torch.allclose(obj.score_edits(keep)[0].float(), expected, atol=TOL)


def test_bad_targets(smollm2: attnscope.Model, minilm: attnscope.Model,
                     tiny_lm: Callable[[str], attnscope.Model]) -> None:
    with pytest.raises(AttnscopeError, match="tokenizes to nothing") as exc:
        build_objective(tiny_lm("gpt2"), "the capital of france is", target="  ")
    assert exc.value.parameter == "target"
    with pytest.raises(AttnscopeError, match="not a predicted token, so it takes no target") as exc:
        build_objective(minilm, "time flies", target=" Paris")
    assert exc.value.parameter == "target" and "--" not in str(exc.value)  # the library speaks Python
