"""Leave-one-out (Li, Monroe & Jurafsky 2016, "Understanding Neural Networks through Representation Erasure"):
each token's score is how much the objective falls when that token is taken away, f(x) - f(x without token i).

Two ways to take it away: removed (the token deleted, the others close up, positions shift) and replaced (its id
replaced by the baseline token: [MASK] where the tokenizer has one, else its pad, else its end-of-text token).
Every variant, and the unperturbed input as row 0, runs in batched forwards (Objective.score_edits).
Not taken away: an encoder-decoder's decoder start token. The user did not give it (the model puts it there), and
removing it leaves the first target nothing to be predicted from (a NaN row that turned that target's whole rank
agreement into NaN). Its score is NaN (null in JSON) in both modes, recorded in MethodScores.unscored with why,
and the rank agreement compares the methods over the other tokens (Attribution.ranked_tokens).
Cost: n + 1 forwards of n tokens (n - 1 + 1 for an encoder-decoder). Supports every kind of objective.
Check: row 0, computed in the batch beside the variants, equals the model's own forward from ids within
1e-5 x max(1, |f(x)|) (float32 matmuls over batches of other shapes round differently).

The helpers (removal_keep, replaced_ids, scores_of) score any set of deleted or replaced tokens: the faithfulness
measures over a corpus (issue 32) reuse them.
"""

from __future__ import annotations

import torch

from attnscope.attribution.methods import Context
from attnscope.attribution.objective import SEQ2SEQ, Objective, baseline_id
from attnscope.attribution.record import Cost, MethodCheck, MethodScores
from attnscope.errors import AttnscopeError
from attnscope.records.check_report import TOLERANCE


def removal_keep(n: int, removed: list[list[int]]) -> torch.Tensor:
    """[variant, token] bool: variant v keeps every token but those in removed[v]."""
    keep = torch.ones(len(removed), n, dtype=torch.bool)
    for v, positions in enumerate(removed):
        keep[v, positions] = False
    return keep


def replaced_ids(obj: Objective, replaced: list[list[int]], token_id: int | None = None) -> torch.Tensor:
    """[variant, token] ids: variant v has the baseline token (or token_id) at the positions in replaced[v]."""
    tid = baseline_id(obj.model) if token_id is None else token_id
    ids = obj.ids.expand(len(replaced), -1).clone()
    for v, positions in enumerate(replaced):
        ids[v, positions] = tid
    return ids


def scores_of(obj: Objective, removed: list[list[int]] | None = None, replaced: list[list[int]] | None = None,
              rows_tokens: int = 4096) -> torch.Tensor:
    """The objective [variant, target] (float64) of the input with, per variant, some tokens removed or replaced."""
    if removed is not None:
        return obj.score_edits(removal_keep(obj.n_tokens, removed), rows_tokens=rows_tokens)
    if replaced is None:
        raise AttnscopeError("say which tokens to take away: removed= or replaced=")
    keep = torch.ones(len(replaced), obj.n_tokens, dtype=torch.bool)
    return obj.score_edits(keep, replaced_ids(obj, replaced), rows_tokens=rows_tokens)


def _budget(ctx: Context, name: str) -> None:
    n, most = ctx.objective.n_tokens, ctx.settings.max_perturb_tokens
    if n > most:
        raise AttnscopeError(f"{name} over {n} tokens is beyond its budget of max_perturb_tokens={most} tokens (it "
                             f"runs {n + 1} forwards of {n} tokens): shorten the text, or raise max_perturb_tokens",
                             parameter="max_perturb_tokens")


DECODER_START = ("the decoder start token is not taken away: the model puts it there, not the user, and without it "
                 "the first target token has nothing to be predicted from")


def fixed_tokens(obj: Objective) -> dict[int, str]:
    """Token index -> why leave-one-out does not take it away: an encoder-decoder's decoder start token."""
    return {obj.n_source: DECODER_START} if obj.kind == SEQ2SEQ else {}


def _leave_one_out(ctx: Context, name: str, mode: str) -> MethodScores:
    _budget(ctx, name)
    obj = ctx.objective
    fixed = fixed_tokens(obj)
    taken = [i for i in range(obj.n_tokens) if i not in fixed]
    every: list[list[int]] = [[], *([i] for i in taken)]  # row 0: nothing taken away
    rows = (scores_of(obj, removed=every, rows_tokens=ctx.settings.edit_tokens) if mode == "removed" else
            scores_of(obj, replaced=every, rows_tokens=ctx.settings.edit_tokens))  # [1 + taken, target]
    scores = torch.full((obj.n_targets, obj.n_tokens), float("nan"), dtype=torch.float64)  # [target, token]
    scores[:, taken] = (rows[0][None, :] - rows[1:]).T.cpu()  # f(x) - f(x without token i); fixed ones stay NaN
    return MethodScores(method=name, scores=scores.numpy(), unit=_unit(obj),
                        check=unperturbed_check(obj, rows[0]),
                        cost=Cost(forwards=len(every), backwards=0, seconds=0.0), unscored=fixed,
                        settings={"mode": mode, **({"baseline": _baseline_token(obj)} if mode == "replaced" else {})})


def unperturbed_check(obj: Objective, batched: torch.Tensor) -> MethodCheck:
    """The unperturbed row of a batch of edits [target] against the model's own forward [target]."""
    own = obj.reference.double().cpu()
    err = ((batched.cpu() - own).abs() / own.abs().clamp(min=1.0)).max()
    worst = float(err)
    return MethodCheck(name="unperturbed forward", value=worst, bound=TOLERANCE, verified=bool(worst <= TOLERANCE),
                       detail="the unperturbed input, run in the batch with the edited ones, against the model's own "
                              "forward from ids: |a - b| / max(1, |b|)")


def _unit(obj: Objective) -> str:
    what = "cosine similarity" if obj.kind == "encoder" else "log-probability (nats)"
    return f"drop in {what}"


def _baseline_token(obj: Objective) -> str:
    return str(obj.model.tokenizer.convert_ids_to_tokens(baseline_id(obj.model)))


def removed(ctx: Context) -> MethodScores:
    """Leave-one-out with each token removed."""
    return _leave_one_out(ctx, "leave_one_out", "removed")


def replaced(ctx: Context) -> MethodScores:
    """Leave-one-out with each token replaced by the baseline token."""
    return _leave_one_out(ctx, "leave_one_out_replaced", "replaced")
