"""Opening the neuron view selects nothing (issue 29): it shows the first word's query while none is selected,
and the head view, the matrix and their exports keep the selection they had (before, the neuron tab pinned query
0 in the head view and the next head-view SVG drew one query's lines, 36,026 px tall)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attnscope.tracing.one_pass import Trace
from attnscope.views import to_html

QUERY = '.as-panel[data-view="neuron"] select[aria-label="query token (0-indexed)"]'
STATE = "() => document.getElementById('attnscope-root').attnscopeShown.state()"


def tab(page: Any, view: str) -> None:
    page.click(f'.as-tab[data-view="{view}"]')
    page.wait_for_selector(f'.as-panel[data-view="{view}"]', state="attached")


def test_the_neuron_tab_leaves_the_selection_alone(pair_trace: Trace, open_page: Callable[..., Any]) -> None:
    page = open_page(to_html(pair_trace, "all"), "neuron-selection").page
    assert page.evaluate(STATE)["query"] is None
    tab(page, "neuron")
    page.wait_for_selector('.as-panel[data-view="neuron"] .as-neuron-values')
    first_word = 1  # [CLS] is token 0: the neuron view shows the first word's query
    assert page.input_value(QUERY) == str(first_word)
    assert page.evaluate(STATE)["query"] is None  # shown, not selected
    tab(page, "head")
    assert page.evaluate(STATE)["query"] is None
    tab(page, "neuron")
    page.select_option(QUERY, "3")  # a query chosen in the neuron view is a selection, for every view
    assert page.evaluate(STATE)["query"] == 3
