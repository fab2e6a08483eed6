"""What an attribution explains: one number per target token, as a function of the input embeddings.

- causal LM: the log-probability of each target token given the text and the target tokens before it (default
  target: the model's greedy next token); the input is the text followed by all but the last target token.
- encoder-decoder: the log-probability of each target token given the source and the previous target tokens
  (teacher-forced); the scored sequence is the source's tokens followed by the decoder's input tokens.
- encoder without a head (MiniLM): the cosine similarity of the mean-pooled sentence embedding (the mean over
  the attention mask of the last hidden states, as sentence-transformers pools) with the unperturbed one; one row.

Every method reads the objective the same way: `score_embeds` for gradients (a batch of embeddings in, [batch,
target] out) and `score_edits` for perturbations (tokens removed or replaced, rows compacted and padded).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from attnscope import families
from attnscope.errors import AttnscopeError, require_text
from attnscope.models import Model
from attnscope.tokens import Token, encode, fitting_max_length

CAUSAL, SEQ2SEQ, ENCODER = "causal", "seq2seq", "encoder"
EDIT_TOKENS = 4096  # token rows per batched forward of edited inputs (memory, not speed: 2 cores gain nothing more)


@dataclass(eq=False, kw_only=True)
class Objective:
    """The explained numbers of one input: ids and tokens of the scored sequence, targets, and how to score."""

    model: Model
    kind: str  # CAUSAL | SEQ2SEQ | ENCODER
    ids: torch.Tensor  # [token]: the scored sequence (seq2seq: source, then the decoder input)
    n_source: int  # seq2seq: tokens of ids that are the source; others: all of them
    positions: list[int]  # per target: the index in ids whose output predicts it (encoder: [])
    target_ids: list[int]
    tokens: list[Token]
    targets: list[str]
    description: str
    reference: torch.Tensor  # [target]: the model's own scores, from ids through its ordinary forward
    pooled: torch.Tensor | None = None  # encoder: the unperturbed pooled embedding [d_model]
    text: str = ""  # a text whose tokenization is meant to give ids (the input, plus a causal target's prefix)
    max_length: int = 0  # the tokenization's max_length
    type_ids: bool = False  # the tokenizer gives token_type_ids (all 0 for one text): passed as it would pass them

    @property
    def n_tokens(self) -> int:
        return int(self.ids.shape[0])

    @property
    def n_targets(self) -> int:
        return len(self.targets)

    @property
    def special(self) -> torch.Tensor:
        """[token] bool: the tokenizer's special tokens ([CLS], [SEP], BOS, a decoder's start token)."""
        return torch.tensor([t.special for t in self.tokens], dtype=torch.bool)

    def inputs(self) -> dict[str, torch.Tensor]:
        """The model's own inputs for the unperturbed sequence (batch of 1), as its forward takes them."""
        ids = self.ids[None].to(self.model.device)  # [1, token]
        if self.kind != SEQ2SEQ:
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids), **self._type_ids(ids)}
        src, dec = ids[:, :self.n_source], ids[:, self.n_source:]
        return {"input_ids": src, "attention_mask": torch.ones_like(src), "decoder_input_ids": dec}

    def _type_ids(self, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """token_type_ids [batch, token] of zeros where the tokenizer gives them (GPT-2 adds their embedding)."""
        return {"token_type_ids": torch.zeros_like(mask)} if self.type_ids and self.kind != SEQ2SEQ else {}

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """[batch, token] ids -> [batch, token, d_model]: the embeddings the model's forward starts from."""
        if self.kind != SEQ2SEQ:
            out: torch.Tensor = _embedding(self.model.model)(ids)
            return out
        enc = _embedding(self.model.model)(ids[:, :self.n_source])
        dec = _decoder_embedding(self.model.model)(ids[:, self.n_source:])
        return torch.cat([enc, dec], dim=1)

    def score_embeds(self, embeds: torch.Tensor, mask: torch.Tensor | None = None,
                     positions: torch.Tensor | None = None, n_source: int | None = None) -> torch.Tensor:
        """The objective of a batch: embeds [batch, token, d_model] -> [batch, target] (float32, differentiable).

        mask [batch, token] (default: all ones); positions [batch, target] the predicting positions (default:
        the input's); n_source: where the source ends in each row (seq2seq; default: the input's)."""
        b, n = embeds.shape[:2]
        mask = torch.ones(b, n, dtype=torch.long, device=embeds.device) if mask is None else mask
        if self.kind == ENCODER:
            return self._cosine(embeds, mask)
        if positions is None:
            positions = torch.tensor(self.positions, device=embeds.device).expand(b, -1)
        return self._log_probs(embeds, mask, positions, self.n_source if n_source is None else n_source)

    def _cosine(self, embeds: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = self.model.base(inputs_embeds=embeds, attention_mask=mask, **self._type_ids(mask))
        hidden = out.last_hidden_state  # [batch, token, d_model]
        pooled = mean_pool(hidden, mask)  # [batch, d_model]
        assert self.pooled is not None
        return F.cosine_similarity(pooled, self.pooled.to(pooled.dtype)[None], dim=-1)[:, None]  # [batch, 1]

    def _log_probs(self, embeds: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                   n_source: int) -> torch.Tensor:
        keep = torch.unique(positions.clamp(min=0))  # only these positions' logits: [vocab] per kept position
        if self.kind == CAUSAL:
            out = self.model.model(inputs_embeds=embeds, attention_mask=mask, logits_to_keep=keep,
                                   **self._type_ids(mask))
        else:
            out = self.model.model(inputs_embeds=embeds[:, :n_source], attention_mask=mask[:, :n_source],
                                   decoder_inputs_embeds=embeds[:, n_source:],
                                   decoder_attention_mask=mask[:, n_source:])
            keep = torch.arange(embeds.shape[1] - n_source, device=embeds.device)
        where = torch.searchsorted(keep, (positions - (n_source if self.kind == SEQ2SEQ else 0)).clamp(min=0))
        logits: torch.Tensor = _at_least_float32(out.logits)  # [batch, kept, vocab]
        picked = logits.gather(1, where[..., None].expand(-1, -1, logits.shape[-1]))  # [batch, target, vocab]
        targets = torch.tensor(self.target_ids, device=embeds.device)
        lp = picked.log_softmax(-1).gather(-1, targets.expand(picked.shape[0], -1)[..., None])[..., 0]
        return lp.masked_fill(positions < 0, float("nan"))  # a target with nothing left to predict it from

    def score_edits(self, keep: torch.Tensor, ids: torch.Tensor | None = None,
                    rows_tokens: int = EDIT_TOKENS) -> torch.Tensor:
        """Scores of edited inputs: keep [variant, token] bool (False: the token is removed, the rest close up),
        ids [variant, token] (default: the input's; a replaced token is a changed id). -> [variant, target]
        float64, without gradients; NaN for a causal target whose every preceding token was removed."""
        ids = self.ids.expand(keep.shape[0], -1) if ids is None else ids
        step = max(1, rows_tokens // max(1, self.n_tokens))
        out = [self._score_compacted(keep[i:i + step], ids[i:i + step]) for i in range(0, keep.shape[0], step)]
        return torch.cat(out).double()

    def _score_compacted(self, keep: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        s = self.n_source
        src, src_mask = _compact(ids[:, :s], keep[:, :s], self.model)
        parts, masks = [src], [src_mask]
        if self.kind == SEQ2SEQ:
            dec, dec_mask = _compact(ids[:, s:], keep[:, s:], self.model)
            parts, masks = [src, dec], [src_mask, dec_mask]
        joined, mask = torch.cat(parts, 1), torch.cat(masks, 1)  # [variant, token'], ids and mask
        positions = self._moved_positions(keep, int(src.shape[1]))  # [variant, target]
        with torch.no_grad():
            embeds = self.embed_split(joined, int(src.shape[1]))
            return self.score_embeds(embeds, mask, positions, int(src.shape[1]))

    def embed_split(self, ids: torch.Tensor, n_source: int) -> torch.Tensor:
        """embed() for rows whose source ends at n_source (padded rows of edited inputs)."""
        if self.kind != SEQ2SEQ:
            return self.embed(ids)
        enc = _embedding(self.model.model)(ids[:, :n_source])
        return torch.cat([enc, _decoder_embedding(self.model.model)(ids[:, n_source:])], dim=1)

    def _moved_positions(self, keep: torch.Tensor, n_source: int) -> torch.Tensor:
        """Where each target's predicting position lands once removed tokens close up: [variant, target]; -1 where
        it and everything before it in its segment were removed."""
        if self.kind == ENCODER:
            return torch.zeros(keep.shape[0], 0, dtype=torch.long, device=self.model.device)
        start = self.n_source if self.kind == SEQ2SEQ else 0  # the decoder's positions count from its first token
        cols = []
        for p in self.positions:
            kept_before = keep[:, start:p + 1].sum(dim=1) - 1  # [variant]: index of p, or of the last kept before it
            cols.append(torch.where(kept_before >= 0, kept_before + (n_source if self.kind == SEQ2SEQ else 0), -1))
        return torch.stack(cols, dim=1).to(self.model.device)


def _at_least_float32(t: torch.Tensor) -> torch.Tensor:
    """Log-probabilities in float32 from a bfloat16 model, in float64 from a float64 one (the gradient tests)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sentence-transformers' mean pooling: [batch, token, d_model] over the mask [batch, token] -> [batch, d_model]."""
    m = mask[..., None].to(hidden.dtype)
    return (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)


def _compact(ids: torch.Tensor, keep: torch.Tensor, m: Model) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's kept ids moved to the front, right-padded: ([rows, longest], mask [rows, longest])."""
    n_kept = keep.sum(dim=1)
    width = max(1, int(n_kept.max()))
    out = torch.full((ids.shape[0], width), _pad_id(m), dtype=ids.dtype)
    mask = torch.zeros(ids.shape[0], width, dtype=torch.long)
    for r in range(ids.shape[0]):
        kept = ids[r][keep[r].cpu()]
        out[r, :len(kept)], mask[r, :len(kept)] = kept, 1
    return out.to(m.device), mask.to(m.device)


def baseline_id(m: Model) -> int:
    """The baseline token: [MASK] where the tokenizer has one (BERT), else its pad token, else end-of-text."""
    tok = m.tokenizer
    for tid in (getattr(tok, "mask_token_id", None), tok.pad_token_id, tok.eos_token_id, tok.unk_token_id):
        if tid is not None:
            return int(tid)
    raise AttnscopeError(f"{m.name}'s tokenizer has no mask, pad, end-of-text or unknown token to use as a baseline")


def _pad_id(m: Model) -> int:
    tok = m.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return int(pad) if pad is not None else 0  # a padded position is masked: any id does


def _embedding(model: Any) -> Any:
    return model.get_input_embeddings()


def _decoder_embedding(model: Any) -> Any:
    decoder = model.get_decoder()
    return getattr(decoder, "embed_tokens", None) or model.get_input_embeddings()


def kind_of(m: Model) -> str:
    """CAUSAL for a decoder with its LM head, SEQ2SEQ for an encoder-decoder, ENCODER for an encoder."""
    if families.is_encoder_decoder(m.model):
        return SEQ2SEQ
    has_head = m.model is not m.base and m.model.get_output_embeddings() is not None  # type: ignore[no-untyped-call]
    if families.is_causal(m.model):
        if not has_head:
            raise AttnscopeError(f"{m.name} ({m.architecture}) is a decoder without its language-modeling head, so "
                                 "there is no next-token probability to explain: load it with its head "
                                 "(AutoModelForCausalLM)")
        return CAUSAL
    return ENCODER


def build_objective(m: Model, text: str, target: str | None = None, max_length: int | None = None,
                    truncate: bool = True) -> Objective:
    """The objective of text on m: what is explained, with the model's own scores of it."""
    require_text(text)
    kind = kind_of(m)
    max_length = fitting_max_length(m.max_positions) if max_length is None else max_length
    enc = encode(m.tokenizer, [text], max_length=max_length, truncate=truncate)
    tokens, ids = enc.tokens[0], enc.inputs["input_ids"][0]
    type_ids = "token_type_ids" in enc.inputs
    if kind == ENCODER:
        if target is not None:
            raise AttnscopeError(f"{m.name} ({m.architecture}) is an encoder without a head: what is explained is "
                                 "the cosine similarity of its pooled sentence embedding, not a predicted token, so "
                                 "it takes no target", parameter="target")
        obj = _encoder_objective(m, ids, tokens, type_ids)
        obj.text, obj.max_length = text, max_length
        return obj
    target_ids = _target_ids(m, target) if target is not None else [_greedy(m, kind, ids, type_ids)]
    obj = (_causal_objective(m, text, ids, tokens, target_ids, type_ids) if kind == CAUSAL
           else _seq2seq_objective(m, text, ids, tokens, target_ids))
    obj.max_length = max_length
    return obj


def _target_ids(m: Model, target: str) -> list[int]:
    ids: list[int] = m.tokenizer(target, add_special_tokens=False)["input_ids"]
    if not ids:
        raise AttnscopeError(f"the target {target!r} tokenizes to nothing with {m.name}'s tokenizer: give a target "
                             "with at least one token (e.g. ' Paris', with its leading space)", parameter="target")
    return ids


def _greedy(m: Model, kind: str, ids: torch.Tensor, type_ids: bool) -> int:
    """The model's greedy next token after ids (seq2seq: the first target token after its start token)."""
    with torch.no_grad():
        if kind == CAUSAL:
            extra = {"token_type_ids": torch.zeros_like(ids[None])} if type_ids else {}
            logits = m.model(input_ids=ids[None].to(m.device), **{k: v.to(m.device) for k, v in extra.items()})
            logits = logits.logits[0, -1]
        else:
            start = torch.tensor([[_decoder_start(m)]], device=m.device)
            logits = m.model(input_ids=ids[None].to(m.device), decoder_input_ids=start).logits[0, -1]
    return int(logits.argmax())


def _decoder_start(m: Model) -> int:
    start = getattr(m.model.config, "decoder_start_token_id", None)
    if start is None:
        raise AttnscopeError(f"{m.name} has no decoder_start_token_id in its config: attnscope cannot start its "
                             "decoder")
    return int(start)


def _decoded(m: Model, ids: list[int]) -> str:
    return str(m.tokenizer.decode(ids))


def _extra_tokens(m: Model, ids: list[int], first: int, special_ids: set[int], segment: int) -> list[Token]:
    strings = m.tokenizer.convert_ids_to_tokens(ids)
    return [Token(index=first + i, text=str(s), id=int(t), special=int(t) in special_ids, segment=segment)
            for i, (t, s) in enumerate(zip(ids, strings, strict=True))]


def _causal_objective(m: Model, text: str, ids: torch.Tensor, tokens: list[Token], target_ids: list[int],
                      type_ids: bool) -> Objective:
    n = int(ids.shape[0])
    full = torch.cat([ids, torch.tensor(target_ids[:-1], dtype=ids.dtype)])  # [token]: text, then target[:-1]
    tokens = tokens + _extra_tokens(m, target_ids[:-1], n, set(), segment=0)
    targets = [_decoded(m, [t]) for t in target_ids]
    what = _decoded(m, target_ids)
    desc = (f"log p({what!r} | {text!r})" if len(target_ids) == 1 else
            f"log p of each token of {what!r} after {text!r} and the target tokens before it")
    obj = Objective(model=m, kind=CAUSAL, ids=full, n_source=int(full.shape[0]),
                    positions=[n - 1 + t for t in range(len(target_ids))], target_ids=target_ids, tokens=tokens,
                    targets=targets, description=desc, reference=torch.empty(0),
                    text=text + _decoded(m, target_ids[:-1]), type_ids=type_ids)
    obj.reference = _own_scores(obj)
    return obj


def _seq2seq_objective(m: Model, text: str, ids: torch.Tensor, tokens: list[Token],
                       target_ids: list[int]) -> Objective:
    n = int(ids.shape[0])
    dec = [_decoder_start(m), *target_ids[:-1]]  # teacher-forced decoder input
    full = torch.cat([ids, torch.tensor(dec, dtype=ids.dtype)])
    tokens = tokens + _extra_tokens(m, dec, n, {_decoder_start(m)}, segment=1)
    targets = [_decoded(m, [t]) for t in target_ids]
    desc = (f"log p of each target token of {_decoded(m, target_ids)!r} given the source {text!r} and the "
            "previous target tokens (teacher-forced)")
    obj = Objective(model=m, kind=SEQ2SEQ, ids=full, n_source=n, positions=[n + t for t in range(len(target_ids))],
                    target_ids=target_ids, tokens=tokens, targets=targets, description=desc,
                    reference=torch.empty(0))
    obj.reference = _own_scores(obj)
    return obj


def _encoder_objective(m: Model, ids: torch.Tensor, tokens: list[Token], type_ids: bool) -> Objective:
    with torch.no_grad():
        inputs = {"input_ids": ids[None].to(m.device), "attention_mask": torch.ones(1, len(ids), device=m.device)}
        if type_ids:
            inputs["token_type_ids"] = torch.zeros_like(inputs["input_ids"])
        pooled = mean_pool(m.base(**inputs).last_hidden_state, inputs["attention_mask"])[0]  # [d_model]
    desc = ("cosine similarity of the mean-pooled sentence embedding with the unperturbed one (1 at the input "
            "itself)")
    obj = Objective(model=m, kind=ENCODER, ids=ids, n_source=int(ids.shape[0]), positions=[], target_ids=[],
                    tokens=tokens, targets=["sentence embedding"], description=desc, reference=torch.empty(0),
                    pooled=pooled, type_ids=type_ids)
    obj.reference = _own_scores(obj)
    return obj


def _own_scores(obj: Objective) -> torch.Tensor:
    """[target]: the objective through the model's ordinary forward from ids (the reference every check uses)."""
    m = obj.model
    with torch.no_grad():
        out = m.base(**obj.inputs()) if obj.kind == ENCODER else m.model(**obj.inputs())
    if obj.kind == ENCODER:
        assert obj.pooled is not None
        pooled = mean_pool(out.last_hidden_state, obj.inputs()["attention_mask"])
        cos: torch.Tensor = F.cosine_similarity(pooled, obj.pooled[None], dim=-1)  # [1]
        return cos
    offset = obj.n_source if obj.kind == SEQ2SEQ else 0
    rows = _at_least_float32(out.logits[0, [p - offset for p in obj.positions]])  # [target, vocab]
    lp: torch.Tensor = rows.log_softmax(-1).gather(-1, torch.tensor(obj.target_ids, device=rows.device)[:, None])
    return lp[:, 0]
