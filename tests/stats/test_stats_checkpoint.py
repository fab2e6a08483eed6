"""Checkpoints: saved and loaded exactly, and a resume refused, naming the setting, whenever a setting that
changes the numbers differs. The guarded settings come from the Settings dataclass itself."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

import attnscope
from attnscope.errors import AttnscopeError
from attnscope.stats import Document, Settings, Source, checkpoint, new_state, process_documents
from attnscope.stats.engine import computation
from attnscope.stats.settings import guarded

# A changed value for every setting a resume must keep. A new field of Settings is guarded unless marked
# RESUME_MAY_CHANGE, and then needs a value here: test_every_guarded_setting_has_a_case fails until it has one.
CHANGED: dict[str, Any] = {
    "max_length": 128,
    "batch_size": 16,
    "word_level": True,
    "truncate": False,
    "limit": 100,
    "chunk_batches": 4,
    "cell_budget": 10_000,
    "metric_sets": ("norms",),
}


def test_every_guarded_setting_has_a_case() -> None:
    assert set(guarded()) == set(CHANGED)
    assert "checkpoint_every" not in guarded()  # how often a run saves changes no number


@pytest.fixture(scope="module")
def saved(minilm: attnscope.Model, ud_dev: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint of a few real documents, written with the default settings."""
    out = tmp_path_factory.mktemp("ckpt")
    docs = [Document("The cat sat on the mat.", "t:1"), Document("Dogs bark, cats do not.", "t:2")]
    state = process_documents(minilm, docs, Settings())
    checkpoint.save(out, _identity(minilm, ud_dev, Settings()), state, (0, 1), complete=False)
    return out


def _identity(model: attnscope.Model, ud_dev: Path, settings: Settings) -> dict[str, Any]:
    return checkpoint.identity(model, Source(str(ud_dev)), settings, computation(model, settings).names)


@pytest.mark.parametrize("name", sorted(CHANGED))
def test_a_changed_setting_is_refused_naming_it(name: str, saved: Path, minilm: attnscope.Model,
                                                 ud_dev: Path) -> None:
    before = (saved / checkpoint.FILE).read_bytes()
    changed = dataclasses.replace(Settings(), **{name: CHANGED[name]})
    with pytest.raises(AttnscopeError) as err:
        checkpoint.start(saved, _identity(minilm, ud_dev, changed), resume=True)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{saved / checkpoint.FILE} is from a run with other arguments")
    old, new = Settings().to_json()[name], changed.to_json()[name]
    assert f"settings.{name} {old} -> {new}" in message
    assert (saved / checkpoint.FILE).read_bytes() == before


def test_other_metrics_are_named_as_added(saved: Path, minilm: attnscope.Model, ud_dev: Path) -> None:
    with pytest.raises(AttnscopeError, match=r"metrics \+norm_cls, \+norm_sep, \+norm_punct, \+norm_other, \+other"):
        checkpoint.start(saved, _identity(minilm, ud_dev, Settings(metric_sets=("norms",))), resume=True)


def test_the_same_settings_resume_and_checkpoint_every_may_change(saved: Path, minilm: attnscope.Model,
                                                                   ud_dev: Path) -> None:
    for settings in (Settings(), Settings(checkpoint_every=3)):
        found = checkpoint.start(saved, _identity(minilm, ud_dev, settings), resume=True)
        assert found is not None and found.position == (0, 1) and not found.complete
        assert found.state.documents == 2


def test_save_and_load_are_exact(saved: Path, minilm: attnscope.Model) -> None:
    loaded = checkpoint.load(saved)
    raw = json.loads((saved / checkpoint.FILE).read_text(encoding="utf-8"))
    assert json.loads(json.dumps(loaded.state.to_dict())) == raw["state"]
    assert loaded.identity == raw["identity"] and loaded.position == (raw["chunk"], raw["batch"])
    assert checkpoint.saved_documents(saved) == 2
    fresh = new_state(minilm, Settings(), with_syntax=False)
    assert loaded.state.merge(fresh).to_dict() == loaded.state.to_dict()  # the same metrics and settings


def test_unreadable_checkpoints_are_one_line_errors(tmp_path: Path) -> None:
    assert checkpoint.saved_documents(tmp_path) is None
    (tmp_path / checkpoint.FILE).write_text("{not json", encoding="utf-8")
    with pytest.raises(AttnscopeError, match=r"^cannot read .*checkpoint.json \(.*\): choose another output"):
        checkpoint.load(tmp_path)
    (tmp_path / checkpoint.FILE).write_text('{"chunk": 0}', encoding="utf-8")
    with pytest.raises(AttnscopeError, match=r"is not a checkpoint of this attnscope version"):
        checkpoint.load(tmp_path)


def test_a_new_run_refuses_a_directory_in_use(saved: Path, minilm: attnscope.Model, ud_dev: Path) -> None:
    with pytest.raises(AttnscopeError, match="already exists and is not empty: pass resume=True"):
        checkpoint.start(saved, _identity(minilm, ud_dev, Settings()), resume=False)
