"""The one error type a user sees: a message that says what is wrong and what to do."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class AttnscopeError(Exception):
    """Bad input or an unavailable resource; the CLI prints it on one line and exits 2.

    parameter: the Python parameter the message names (e.g. "max_length"), so a front end can
    say it in its own words: the CLI renders it as its flag (--max-length).
    """

    def __init__(self, message: str, parameter: str | None = None) -> None:
        super().__init__(message)
        self.parameter = parameter


def validate_index(kind: str, value: int, count: int, owner: str = "this model") -> None:
    """Raise a one-line error naming the valid 0-indexed range when value is outside it."""
    if not 0 <= value < count:
        raise AttnscopeError(
            f"{kind} {value} is out of range: {owner} has {count} {kind}s, "
            f"valid values are 0..{count - 1} (0-indexed)"
        )


def require_text(text: object, what: str = "text", parameter: str | None = None) -> str:
    """The text itself, or a one-line error when it is empty or whitespace only."""
    if not isinstance(text, str) or not text.strip():
        raise AttnscopeError(f"the {what} is empty: give a sentence to trace", parameter=parameter)
    return text


def read_path(path: str | os.PathLike[str], read: Callable[[Path], T], kind: str) -> T:
    """read(path), a failure to open or decode the file turned into a one-line error; kind says what the
    file should be ("a text file")."""
    p = Path(path)
    try:
        return read(p)
    except FileNotFoundError as exc:
        raise AttnscopeError(f"cannot read {p}: no such file") from exc
    except IsADirectoryError as exc:
        raise AttnscopeError(f"cannot read {p}: it is a directory, give {kind}") from exc
    except UnicodeDecodeError as exc:
        raise AttnscopeError(f"cannot read {p}: it is not UTF-8 text (re-save it as UTF-8)") from exc
    except OSError as exc:
        raise AttnscopeError(f"cannot read {p}: {exc.strerror or exc}") from exc
