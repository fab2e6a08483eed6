"""Input attribution: which input tokens a prediction depends on (issue 31)."""
