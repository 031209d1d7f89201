"""Gradient checkpointing that keeps each checkpoint's first tensor input in host memory.

checkpoint.py: checkpoint(), the drop-in for torch.utils.checkpoint.checkpoint; nonreentrant.py: torch's
non-reentrant algorithm with its per-tensor hooks in C; reentrant.py: the reentrant variant (one
autograd node per block); block_input.py: the offloaded input both share; replay_state.py: the RNG
and autocast state a recompute replays; flat_args.py: flattening a call's arguments on the hot path.
"""
