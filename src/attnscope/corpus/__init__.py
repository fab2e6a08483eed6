"""Corpus explorer (issue 33): index a corpus by what the model computes, then search it, exBERT-style.

- `index.py`: `build_index`, one streaming, checkpointed, resumable pass over a corpus (stats' sources and batches)
- `vectors.py`: one batch through the real model -> per token its place, UD labels, embedding and context per chosen
  layer, q and k and an attention summary per chosen head
- `store.py`: the on-disk format (raw little-endian arrays named by a manifest with sha256s) and `CorpusIndex`,
  its torch-free reader through memory maps
- `search.py`: exact cosine search (the reference) and matches; `ann.py`: the optional FAISS HNSW index
- `query.py`: `search`, from a text and a token to the nearest corpus tokens; `summary.py`: what the matches are
- `tags.py`: the stats reader plus each CoNLL-U word's UPOS
- `maps.py`: a head's queries and keys in 2-D (PCA, t-SNE or UMAP) with AttentionViz's normalisation (query/key
  maps' data)
- `head_sums.py`: what the heads pass sums per sentence (pairwise Jensen-Shannon distances, behaviour shares) and
  its .npz
- `heads.py`: `head_pass`, the streaming, checkpointed, resumable pass over a corpus for the heads' distances
- `head_groups.py`: heads grouped: UPGMA dendrogram, classical MDS map, behaviour labels, cross-model comparison

Submodules are imported on use: `import attnscope.corpus` loads no torch.
"""
