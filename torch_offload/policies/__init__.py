"""Selective offload: inside a checkpointed block a policy decides, per op output, whether it is kept
on the device, recomputed in backward or offloaded through the engine.

named_policies.py: the named policy functions (torch_offload.policies.attention, attention_save) and how a
policy argument resolves; projections.py: the projection groups of the named policies
("attention+qkv+out_proj"); store.py: what one block offloads or keeps; interception.py and
captured_calls.py: the named policies without a dispatch mode over the block; per_op.py: any policy
function, per op, through dispatch modes (selective_offload_contexts).
"""
from .named_policies import ATTENTION_OPS, POLICIES, SAVES_PER_BLOCK, attention, attention_save, resolve

__all__ = ["ATTENTION_OPS", "POLICIES", "SAVES_PER_BLOCK", "attention", "attention_save", "resolve"]
