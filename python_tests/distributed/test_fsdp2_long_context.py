"""FSDP2 + PEFT LoRA + long_context=True: applied after fully_shard, layer offloading stays off (the
frozen base is sharded already, and explain() says so) and training matches FSDP2 with the model's
own checkpointing within the tiles' summation bound; applied before, with layer_offloading=False,
the same; applied before with layer offloading on, the first forward says what to do instead."""
import copy

import pytest
import torch

import torch_offload
from python_tests.support.fsdp2_cases import shard, tiny_llama
from python_tests.support.gloo_ranks import single_rank_mesh
from python_tests.support.tiled_training import _assert_same_training, _step

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _lora_pair():
    """(FSDP2 with the model's own checkpointing, an unsharded copy to apply ours to)."""
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS, init_lora_weights=False)
    reference = peft.get_peft_model(tiny_llama(0.0), config)
    ours = copy.deepcopy(reference)
    reference.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    reference.enable_input_require_grads()
    shard(reference.base_model.model)
    return reference, ours


def _trains_alike(reference, ours, handle):
    ids = torch.randint(0, 256, (1, 260))
    for _ in range(2):
        ref, got = _step(reference, ids), _step(ours, ids)
        assert got[1] and all("lora_" in name for name in got[1])
        _assert_same_training(ref, got, [""])
    assert handle.stats()["saves"] > 0 and handle.chunked_loss is not None and handle.tiled_mlp is not None


def test_applied_after_fully_shard_the_frozen_base_stays_sharded():
    with single_rank_mesh():
        reference, ours = _lora_pair()
        shard(ours.base_model.model)
        handle = torch_offload.apply(ours, long_context={"tile_tokens": 100})
        assert "layer offloading | off | the blocks' parameters are sharded" in handle.explain()
        assert handle.layers is None
        _trains_alike(reference, ours, handle)
        handle.remove()


def test_applied_before_fully_shard_without_layer_offloading():
    with single_rank_mesh():
        reference, ours = _lora_pair()
        handle = torch_offload.apply(ours, long_context={"tile_tokens": 100}, layer_offloading=False)
        shard(ours.base_model.model)
        _trains_alike(reference, ours, handle)
        handle.remove()


def test_applied_before_fully_shard_with_layer_offloading_says_what_to_do():
    with single_rank_mesh():
        _, ours = _lora_pair()
        handle = torch_offload.apply(ours, long_context={"tile_tokens": 100})
        assert handle.layers is not None  # not sharded yet: the frozen base goes to host memory
        shard(ours.base_model.model)
        with pytest.raises(RuntimeError, match=r"apply offloading after fully_shard \(long_context=True then "
                                               r"leaves layer offloading off"):
            _step(ours, torch.randint(0, 256, (1, 260)))


def test_full_fine_tune_with_fsdp2_cpu_offload_policy():
    """Every parameter trained, FSDP2 keeping the sharded weights, gradients and AdamW's state in host
    memory (CPUOffloadPolicy) and long_context=True applied after fully_shard: it trains as FSDP2 with
    the same policy and the model's own checkpointing."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    with single_rank_mesh():
        reference, ours = tiny_llama(0.0), tiny_llama(0.0)
        reference.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        for model in (reference, ours):
            shard(model, offload_policy=CPUOffloadPolicy(pin_memory=False))
        handle = torch_offload.apply(ours, long_context={"tile_tokens": 100})
        assert handle.layers is None  # nothing frozen: the weights are FSDP2's to place
        optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (reference, ours)]
        ids = torch.randint(0, 256, (1, 260))
        ref, got = _step(reference, ids), _step(ours, ids)
        assert len(got[1]) == len(list(ours.parameters()))  # every parameter has its gradient
        _assert_same_training(ref, got, [""])
        for optimizer in optimizers:
            optimizer.step()
        # After AdamW's step on gradients a few ulps apart, the weights are that close too.
        (ref_loss, ref_grads), (loss, grads) = _step(reference, ids), _step(ours, ids)
        assert torch.allclose(loss, ref_loss, rtol=1e-5)
        for name, grad in grads.items():
            assert ((grad - ref_grads[name]).norm() / ref_grads[name].norm()).item() < 1e-4, name
        assert handle.stats()["saves"] > 0 and handle.chunked_loss is not None
        handle.remove()
