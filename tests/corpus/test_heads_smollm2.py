"""The heads pass on the real SmolLM2 (causal, grouped-query attention: 30 layers x 9 heads) over a few UD sentences,
against its own traced attention, and its heads compared with MiniLM's by behaviour. Slow (~1 min)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy.spatial.distance import jensenshannon

import attnscope
from attnscope.corpus.head_groups import compare, groups
from attnscope.corpus.heads import head_pass
from attnscope.corpus.tags import TaggedSource
from attnscope.stats.settings import Settings
from attnscope.tracing.one_pass import trace

DOCS = 4


def test_smollm2_heads_against_its_traces_and_against_minilm(smollm2: attnscope.Model, minilm: attnscope.Model,
                                                              ud_dev: Path, tmp_path: Path) -> None:
    settings = Settings(max_length=24, batch_size=4, limit=DOCS)
    smol = head_pass(TaggedSource(str(ud_dev)), tmp_path / "smol", smollm2, settings=settings)
    assert smol.causal and smol.sums.units == 270
    docs = [d for _, d in zip(range(DOCS), TaggedSource(str(ud_dev)), strict=False)]
    traces = [trace(d.text, model=smollm2, max_length=24) for d in docs]
    maps = []  # [unit, query, key] each
    for t in traces:
        w = np.asarray(t.arrays["weights"], dtype=np.float64)
        maps.append(w.reshape(270, *w.shape[2:]))
    for a, b in ((0, 1), (9, 200), (100, 269)):
        want = np.mean([jensenshannon(m[a, t, : t + 1], m[b, t, : t + 1]) for m in maps for t in range(m.shape[1])])
        assert abs(smol.sums.distance()[a, b] - want) <= 1e-5
    sinks = [np.array([tok.special or i == 0 for i, tok in enumerate(t.tokens)]) for t in traces]
    share = sum(m[:, :, s].sum((1, 2)) for m, s in zip(maps, sinks, strict=True)) / smol.sums.tokens
    assert np.abs(smol.sums.means()["first_special"] - share).max() <= 1e-5
    g = groups(smol.sums, smol.syntax, smol.model, smol.causal)
    mini = head_pass(TaggedSource(str(ud_dev)), tmp_path / "mini", minilm, settings=settings)
    c = compare(g, groups(mini.sums, mini.syntax, mini.model, mini.causal))
    assert len(c.nearest) == 270 and c.columns[-1] == "syntax"
    assert c.counts["first/special"][0] > 90  # most SmolLM2 heads put half their weight or more on the first token
