"""What does tracing an encoder-decoder cost next to its own forward pass? (issue 14)

A random-weight T5 the size of t5-small (6 + 6 layers, 8 heads, d_model 512; no pretrained encoder-decoder
ships here) with the bundled MiniLM tokenizer, one source and one target, in one process:
  (a) the model's eager forward with output_attentions and output_hidden_states (teacher-forced)
  (b) attnscope.trace_seq2seq: capture the three kinds, recompute each and check it
Prints the median CPU seconds of each (the process's CPU time: on a shared machine the wall clock measures
the queue too) and the ratio (b) / (a).

    .venv/bin/python benchmarks/bench_seq2seq.py [--repeats 5] [--threads 1] [--repeat-text 6]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import transformers as T

import attnscope


def _cpu_median(f: Callable[[], object], repeats: int) -> float:
    f()  # warm up
    times = []
    for _ in range(repeats):
        start = time.process_time()
        f()
        times.append(time.process_time() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat-text", type=int, default=6, help="how many times the sentences are repeated")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tok = attnscope.load_model().tokenizer
    torch.manual_seed(0)
    cfg = T.T5Config(vocab_size=30522, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_decoder_layers=6,
                     num_heads=8, pad_token_id=0, eos_token_id=102)
    cfg.decoder_start_token_id = 0
    model = T.T5ForConditionalGeneration(cfg)
    model.set_attn_implementation("eager")
    model.train(False)  # eval mode (transformers leaves eval() untyped)
    m = attnscope.load_model(model, tokenizer=tok)
    source = " ".join(["the quick brown fox jumps over the lazy dog"] * args.repeat_text)
    target = " ".join(["der schnelle braune fuchs springt"] * (args.repeat_text + 2))
    enc = tok(source, return_tensors="pt")
    decoder_ids = model.prepare_decoder_input_ids_from_labels(labels=tok(text_target=target, return_tensors="pt")
                                                              ["input_ids"])

    def forward() -> None:
        with torch.no_grad():
            model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], decoder_input_ids=decoder_ids,
                  output_attentions=True, output_hidden_states=True, use_cache=False)

    def traced() -> None:
        ed = attnscope.trace_seq2seq(source, target, model=m)
        assert ed.status() == "PASS"

    a, b = _cpu_median(forward, args.repeats), _cpu_median(traced, args.repeats)
    print(f"T5 (t5-small size, random weights), source {enc['input_ids'].shape[1]} tokens, target "
          f"{decoder_ids.shape[1]} tokens, {args.threads} thread(s), median of {args.repeats} (CPU seconds)")
    print(f"(a) eager forward, output_attentions: {a:.3f} s")
    print(f"(b) trace_seq2seq + check:             {b:.3f} s   (b)/(a) = {b / a:.2f}x")


if __name__ == "__main__":
    main()
