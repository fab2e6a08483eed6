"""What the Ray engine tests share: the settings of every run, Ray's and the local engine's baseline."""

from attnscope.stats import Settings

# 80 sentences in 3 chunks of at most 32 (4 batches of 8): several chunks, buckets and a short last batch
SETTINGS = Settings(batch_size=8, limit=80, chunk_batches=4, checkpoint_every=2)
