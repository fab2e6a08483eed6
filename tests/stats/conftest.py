"""Fixtures of the corpus-statistics tests: the real UD English EWT dev set, read in place."""

from __future__ import annotations




