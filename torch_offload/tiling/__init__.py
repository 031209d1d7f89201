"""Sequence-tiled compute for long sequences: a position-wise module (a transformer's MLP) computed
over tiles of the sequence, so that none of its tokens x intermediate tensors exists at once
(sequence_tiles.py); tile_mlp() installs it on a model's MLPs (tiled_mlp.py)."""
