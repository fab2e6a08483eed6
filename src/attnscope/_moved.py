"""Old import paths of modules that moved into role packages, kept working (`attnscope.traces` is
`attnscope.records.trace`, the same module object). New code imports the new paths."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

MOVED = {
    "attnscope.traces": "attnscope.records.trace",
    "attnscope.generation": "attnscope.records.generation",
    "attnscope.seq2seq_generation": "attnscope.records.translation",
    "attnscope.report": "attnscope.records.check_report",
    "attnscope.arrays": "attnscope.records.arrays",
    "attnscope.storage": "attnscope.records.trace",
    "attnscope.seq2seq": "attnscope.tracing.seq2seq",
    "attnscope.generating": "attnscope.tracing.decoding",
    "attnscope.seq2seq_generating": "attnscope.tracing.seq2seq_decoding",
    "attnscope.seq2seq_traces": "attnscope.tracing.seq2seq_rows",
    "attnscope.recompute": "attnscope.verify.recompute",
    "attnscope.check": "attnscope.verify.check",
    "attnscope.seq2seq_check": "attnscope.verify.seq2seq",
    "attnscope.generate_check": "attnscope.verify.decoding",
    "attnscope.explain_kinds": "attnscope.explain.seq2seq",
    "attnscope.steps": "attnscope.explain.steps",
    "attnscope.render": "attnscope.explain.render",
    "attnscope.toy": "attnscope.explain.toy",
    "attnscope.stats.report": "attnscope.stats.report_page",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old name and loads it as the module at its new path."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(MOVED[spec.name])
        self._spec = module.__spec__  # the import system overwrites __spec__; exec_module puts it back
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._spec


def install() -> None:
    """Register the old names once per interpreter."""
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())
