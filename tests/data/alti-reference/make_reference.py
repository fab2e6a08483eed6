"""Produce the ALTI reference fixture with the authors' own code (see SOURCE.md); not part of the package.

    python tests/data/alti-reference/make_reference.py AUTHORS_CHECKOUT PYAML_ENV_SITE OUT.npz

AUTHORS_CHECKOUT: a checkout of github.com/mt-upc/transformer-contributions (its src/ is imported from there,
unchanged); PYAML_ENV_SITE: a directory holding pyaml-env (their src/contributions.py reads its config with
it). Their ModelWrapper needs a model with a head (it reads output['logits']) at bert.encoder.layer, so the
bundled all-MiniLM-L6-v2 is loaded as BertForSequenceClassification: the encoder's weights are the real ones,
the classifier (unused by ALTI) is initialised with seed 0.
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import numpy as np
import torch

TEXT = "The capital of France is Paris, a city of light."


def their_functions(path: Path, names: tuple[str, ...]) -> dict[str, object]:
    """Their functions from utils_contributions.py, executed as written (the module itself imports datasets,
    ipywidgets and dotenv, which ALTI's normalisation and rollout do not use)."""
    tree = ast.parse(path.read_text())
    body = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in names]
    scope: dict[str, object] = {"torch": torch, "np": np, "F": torch.nn.functional}
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), scope)
    return scope


def main(checkout: str, site: str, out: str) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    sys.path[:0] = [checkout, site]
    os.chdir(checkout)  # their contributions.py parses ./src/config.yaml at import
    from src.contributions import ModelWrapper  # the authors' code
    from transformers import AutoTokenizer, BertForSequenceClassification

    from attnscope.models import bundled_model_path

    path = bundled_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = BertForSequenceClassification.from_pretrained(path, attn_implementation="eager").eval()
    batch = tokenizer(TEXT, return_tensors="pt")
    _, _, _, data = ModelWrapper(model)(batch)
    fns = their_functions(Path(checkout) / "src" / "utils_contributions.py",
                          ("normalize_contributions", "compute_joint_attention"))
    resultant_norm = torch.norm(torch.squeeze(data["resultants"]), p=1, dim=-1)
    normalized = fns["normalize_contributions"](data["contributions"], scaling="min_sum",  # type: ignore[operator]
                                                resultant_norm=resultant_norm)
    rolled = fns["compute_joint_attention"](normalized)  # type: ignore[operator]
    np.savez(out, text=np.array(TEXT), input_ids=batch["input_ids"][0].numpy(),
             contributions=normalized.numpy(), rolled=rolled.numpy(),
             distances=(-data["contributions"]).numpy(), resultants=data["resultants"].numpy())


if __name__ == "__main__":
    main(*sys.argv[1:4])
