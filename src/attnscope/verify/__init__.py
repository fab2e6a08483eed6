"""Verification: recompute each layer from its captured input and its own weights (`recompute`), and compare
recompute, capture and the model's own outputs stage by stage (`check`; `seq2seq` for the three kinds of an
encoder-decoder, `decoding` for each step of a generation). Results are `attnscope.records.check_report`."""
