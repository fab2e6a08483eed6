"""Display defects found by a new user (issue 30): titles and notes wrap to the terminal, not to a narrow table;
whole numbers print as whole numbers."""

from __future__ import annotations

import numpy as np

from attnscope.explain.render import Cells, check_table, to_text
from attnscope.records.check_report import CheckReport, Comparison


def test_a_one_column_check_table_keeps_its_title_on_long_lines() -> None:
    """A NOT VERIFIED model has one comparison (weights vs the model): the table is 32 characters wide, its
    title and legend are not folded to that width."""
    report = CheckReport(1e-5, [Comparison("weights", "model", np.zeros((2, 2)))], "no adapter")
    text = to_text([check_table(report, 2, width=80)], width=80)
    first = text.splitlines()[0]
    assert first.startswith("max error per layer (0-indexed, max over heads): captured vs the independent")
    assert "(rel)" not in text  # no relative comparison, no note about them


def test_index_columns_print_as_integers_beside_decimals() -> None:
    pair = np.array([[0.0, 32.0, 4.0, 4.0, 1.0], [1.0, 33.0, 4.0, 2.7913, 1.0]], dtype=np.float32)
    cells = Cells(pair, None, ["i", "j", "position", "angle (rad)", "q_i"], integer_cols=("i", "j", "position"))
    assert cells.row(0) == ["0", "32", "4", "4.0000", "1.0000"]
    assert Cells(pair, None, None).row(0)[:3] == ["0.0000", "32.0000", "4.0000"]  # no label said so: decimals
