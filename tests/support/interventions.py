"""The families the intervention tests run on."""

# every decoder and encoder family check supports (tests/interventions/test_gates.py asserts it, naming the exclusions)
EVERY_FAMILY = ("bert", "roberta", "electra", "distilbert", "albert", "gpt2", "llama", "mistral", "qwen2", "qwen3",
                "gemma2", "gemma3_text", "phi3", "gpt_neox", "olmo2", "gpt_oss", "modernbert")
# every encoder-decoder family check supports: their gates (by kind) are tested in tests/interventions/test_seq2seq.py
EVERY_ENCODER_DECODER = ("t5", "bart", "mbart", "marian")
