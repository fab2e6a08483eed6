"""Names a package exports from its modules, imported on first use (PEP 562), so importing the package stays
cheap: `import attnscope` loads neither torch nor transformers."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def exports(package: str, table: dict[str, str]) -> Callable[[str], Any]:
    """A module-level __getattr__ for `package`: each name of the table comes from the module it maps to."""
    def __getattr__(name: str) -> Any:
        if name in table:
            return getattr(importlib.import_module(table[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
