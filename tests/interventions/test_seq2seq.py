"""Head gates on encoder-decoder models, addressed by kind (encoder, decoder, cross): open gates change nothing bit for
bit, a zeroed cross head equals an independent computation, ablate and its CLI read the teacher-forced target."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch

import attnscope
from attnscope import families
from attnscope.capture import capturing, intervening
from attnscope.errors import AttnscopeError
from attnscope.interventions import ablate
from attnscope.interventions.seq2seq import kind_edit, kind_gates, kind_means, layout, seq2seq_inputs, seq2seq_measures
from tests.interventions.test_gates import assert_zeroed_head_is_the_others_projected
from tests.support.cli import run as _run
from tests.support.cli import saved
from tests.support.interventions import EVERY_ENCODER_DECODER

FAMILIES = EVERY_ENCODER_DECODER
SOURCE, TARGET = "the cat sat on the mat", "a dog ran"
TOL = 1e-5


def _forward(m: attnscope.Model, inputs: dict[str, torch.Tensor],
             scale: dict[str, torch.Tensor] | None) -> torch.Tensor:
    rows = {k: v.expand(2, -1).contiguous() for k, v in inputs.items()}
    with torch.no_grad():
        if scale is None:
            return m.model(**rows).logits  # type: ignore[no-any-return]
        edit = kind_edit(m, scale)
        edit.reset()
        with intervening(m.model, edit):
            return m.model(**rows).logits  # type: ignore[no-any-return]


@pytest.mark.parametrize("family", FAMILIES)
def test_open_gates_change_nothing_bit_for_bit(seq2seq: Callable[[str], attnscope.Model], family: str) -> None:
    m = seq2seq(family)
    inputs, _, _ = seq2seq_inputs(m, SOURCE, TARGET, 64)
    open_ = kind_gates(m, [], None)
    plain, gated = _forward(m, inputs, None), _forward(m, inputs, {k: v.expand(-1, 2, -1) for k, v in open_.items()})
    assert torch.equal(plain, gated)
    for kind in ("encoder", "decoder", "cross"):  # each kind's gates do act
        closed = {k: torch.ones(v.shape[0], 2, v.shape[2]) for k, v in open_.items()}
        closed[kind][:, 1] = 0.0
        shut = _forward(m, inputs, closed)
        assert torch.equal(shut[0], plain[0]) and not torch.equal(shut[1], plain[1])


def test_zeroed_cross_head_equals_projection_of_the_other_heads(seq2seq: Callable[[str], attnscope.Model]) -> None:
    m = seq2seq("bart")
    inputs, _, _ = seq2seq_inputs(m, SOURCE, TARGET, 64)
    layer, head = 1, 2
    scale = kind_gates(m, [("cross", layer, head)], None)  # row 0 open, row 1 without cross 1.2
    rows = {k: v.expand(2, -1).contiguous() for k, v in inputs.items()}
    edit = kind_edit(m, scale)
    edit.reset()
    with torch.no_grad(), intervening(m.model, edit), capturing(m.model) as cap:
        m.model(**rows)
    cross = families.seq2seq_modules(m.model)["cross"][layer]
    at = next(i for i, c in enumerate(cap.calls) if c.module is cross)
    # row 0's context is row 1's before the gate (the encoder and the layers below are the same)
    assert_zeroed_head_is_the_others_projected(cap.calls[at].context, cap.output[at],
                                               families.seq2seq_params(m.model)["cross"][layer], head)


def test_mean_ablation_lets_in_each_kinds_mean(seq2seq: Callable[[str], attnscope.Model]) -> None:
    m = seq2seq("bart")
    inputs, _, _ = seq2seq_inputs(m, SOURCE, TARGET, 64)
    means = kind_means(m, inputs)
    for kind, layer in (("encoder", 1), ("cross", 0)):
        edit = kind_edit(m, kind_gates(m, [(kind, layer, 1)], None), means)
        edit.reset()
        with torch.no_grad(), intervening(m.model, edit), capturing(m.model) as cap:
            m.model(**{k: v.expand(2, -1) for k, v in inputs.items()})
        call = next(c for c in cap.calls if c.module is families.seq2seq_modules(m.model)[kind][layer])
        mean = means[kind][layer][0, 1, 0]  # type: ignore[index]
        assert torch.equal(call.context[1, 1], mean.expand_as(call.context[1, 1]))  # [query, d_head]
        assert not torch.equal(call.context[0, 1], call.context[1, 1])
        own = call.context[0, 1].mean(0)  # the untouched row's context, averaged over its real queries
        assert (own - mean).abs().max() <= TOL
    result = ablate(SOURCE, [("cross", 0, 1)], model=m, target=TARGET, mode="mean")
    assert result.mode == "mean" and result.ablated is not None and result.ablated["d_target_logprob"] != 0


def test_ablate_reads_the_models_own_target_logprob(seq2seq: Callable[[str], attnscope.Model]) -> None:
    m = seq2seq("t5")
    result = ablate(SOURCE, [("cross", 1, 2), ("encoder", 0, 3)], model=m, target=TARGET)
    inputs, _, labels = seq2seq_inputs(m, SOURCE, TARGET, 64)
    with torch.no_grad():
        logprobs = m.model(**inputs, labels=torch.tensor([labels])).logits.log_softmax(-1)[0]  # [target, vocab]
        loss = float(m.model(**inputs, labels=torch.tensor([labels])).loss)
    assert abs(result.clean["target_logprob"] - float(logprobs[range(len(labels)), labels].sum())) <= TOL
    assert abs(result.clean["loss"] - loss) <= TOL  # the model's own loss
    assert result.ablated is not None and result.ablated["d_target_logprob"] != 0
    grid = ablate(SOURCE, [("cross", 1, 2)], model=m, target=TARGET, each=True, attention="cross")
    assert grid.grid is not None and grid.grid["d_target_logprob"].shape == layout(m)["cross"]
    with torch.no_grad():
        alone = seq2seq_measures(m, {k: v.expand(2, -1) for k, v in inputs.items()}, labels,
                                 kind_edit(m, kind_gates(m, [("cross", 0, 1)], None)))
    change = float(alone["target_logprob"][1] - alone["target_logprob"][0])
    assert abs(grid.grid["d_target_logprob"][0, 1] - change) <= TOL


def test_bad_input_is_one_line(seq2seq: Callable[[str], attnscope.Model]) -> None:
    m = seq2seq("marian")
    for heads, what in (([(0, 0)], "names no kind of attention: .* encoder, decoder, cross"),
                        ([("self", 0, 0)], "names no kind"), ([("cross", 2, 0)], "cross layer 2 is out of range"),
                        ([("decoder", 0, 4)], "decoder head 4 is out of range")):
        with pytest.raises(AttnscopeError, match=what) as err:
            ablate(SOURCE, heads, model=m, target=TARGET)  # type: ignore[arg-type]
        assert "\n" not in str(err.value)
    with pytest.raises(AttnscopeError, match="give target="):
        ablate(SOURCE, [("cross", 0, 0)], model=m)
    with pytest.raises(AttnscopeError, match="the target is empty"):
        ablate(SOURCE, [("cross", 0, 0)], model=m, target="  ")
    for attention in (None, "self"):
        with pytest.raises(AttnscopeError, match=f"attention {attention!r} is not a kind"):
            ablate(SOURCE, [("cross", 0, 0)], model=m, target=TARGET, each=True, attention=attention)
    with pytest.raises(AttnscopeError, match="add each=True"):
        ablate(SOURCE, [("cross", 0, 0)], model=m, target=TARGET, attention="cross")
    with pytest.raises(AttnscopeError, match="reference= is not read on an encoder-decoder"):
        ablate(SOURCE, [("cross", 0, 0)], model=m, target=TARGET, mode="mean", reference=["a text"])


def test_one_kind_models_take_plain_heads(tiny_model: Callable[[str], attnscope.Model]) -> None:
    m = tiny_model("bert")
    with pytest.raises(AttnscopeError, match="one kind of attention: write heads as \\(layer, head\\)"):
        ablate("a text", [("cross", 0, 0)], model=m)
    with pytest.raises(AttnscopeError, match="one kind: leave it out"):
        ablate("a text", [(0, 0)], model=m, attention="cross")


@pytest.fixture(scope="module")
def marian_dir(seq2seq: Callable[[str], attnscope.Model], tmp_path_factory: pytest.TempPathFactory) -> str:
    return saved(seq2seq("marian"), tmp_path_factory, "marian")


def test_cli_ablate_by_kind(capsys: pytest.CaptureFixture[str], seq2seq: Callable[[str], attnscope.Model],
                            marian_dir: str) -> None:
    code, out, _ = _run(capsys, "ablate", SOURCE, "--model", marian_dir, "--target", TARGET,
                        "--heads", "cross:1.2,encoder:0.3", "--each", "--attention", "cross", "--format", "json")
    d = json.loads(out)
    direct = ablate(SOURCE, [("cross", 1, 2), ("encoder", 0, 3)], model=seq2seq("marian"), target=TARGET)
    assert code == 0 and d["heads"] == [["cross", 1, 2], ["encoder", 0, 3]] and d["attention"] == "cross"
    assert direct.ablated is not None
    assert d["ablated"]["d_target_logprob"] == pytest.approx(direct.ablated["d_target_logprob"], abs=1e-5)
    assert len(d["grid"]["d_target_logprob"]) == 2
    code, out, _ = _run(capsys, "ablate", SOURCE, "--model", marian_dir, "--target", TARGET, "--heads", "cross:0.1")
    assert code == 0 and "cross:0.1" in out
    for argv, what in ((["--heads", "1.2", "--target", TARGET], "names no kind of attention"),
                       (["--heads", "cross:0.1"], "give target= \\(--target TEXT\\)"),
                       (["--heads", "self:0.1", "--target", TARGET], "names no kind"),
                       (["--heads", "cross:5.1", "--target", TARGET], "cross layer 5 is out of range")):
        code, _, err = _run(capsys, "ablate", SOURCE, "--model", marian_dir, *argv)
        assert code == 2 and len(err.strip().splitlines()) == 1
        assert __import__("re").search(what, err), err
