"""The projection groups' lookup (policies/projections.py) keeps no model alive."""
import gc
import weakref

import torch

import torch_offload
from python_tests.support.fsdp2_cases import shard, tiny_llama
from python_tests.support.gloo_ranks import single_rank_mesh
from python_tests.support.llama import _tiny_llama


def test_a_sharded_model_trained_with_projection_groups_is_freed_once_dropped():
    # fully_shard's hooks on each Linear refer back to its block: a strong reference to a block's
    # Linear would keep the block, and the model, alive.
    with single_rank_mesh():
        model = shard(tiny_llama(0.0))
        handle = torch_offload.apply(model, "selective", policy="attention+qkv+out_proj", min_bytes=0)
        ids = torch.randint(0, 256, (2, 32))
        model(input_ids=ids, labels=ids).loss.backward()
        assert handle.stats()["saves"] > 0
        handle.remove()
        dropped = weakref.ref(model)
        del model, handle
        gc.collect()
        assert dropped() is None


def test_a_projection_replaced_after_the_lookup_is_looked_up_again():
    model = _tiny_llama("cpu", 0.0)
    block = model.model.layers[0]
    from torch_offload.policies.projections import projection_weights

    before = projection_weights(block, ("out_proj",))
    block.self_attn.o_proj = torch.nn.Linear(64, 64, bias=False)
    gc.collect()
    after = projection_weights(block, ("out_proj",))
    assert after[0] is block.self_attn.o_proj.weight and after[0] is not before[0]
