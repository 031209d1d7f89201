"""Selective offload's kept projection groups ("keep_fc1": products held on the device, neither copied
nor recomputed) and per-block policies (block_policies=): gradients bit-equal to torch's
checkpointing, the products really spared and really not copied, and the misuses named."""
import gc

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

import torch_offload
from python_tests.support.llama import _steps_match_plain, _tiny_llama
from python_tests.support.selective import LAYERS, matmuls_in_backward


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_kept_group_spares_its_products_without_copying_them(use_reentrant):
    torch.manual_seed(0)
    matmuls, copied = matmuls_in_backward(use_reentrant, policy="attention+qkv")
    torch.manual_seed(0)
    kept_matmuls, kept_copied = matmuls_in_backward(use_reentrant, policy="attention+qkv+keep_fc1")
    assert matmuls - kept_matmuls == LAYERS * 2  # gate and up products, per layer
    assert kept_copied == copied  # nothing more crossed the link


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_kept_group_trains_like_gradient_checkpointing(use_reentrant):
    ours, theirs = _tiny_llama("cpu", 0.0), _tiny_llama("cpu", 0.0)
    handle = torch_offload.apply(ours, "selective", ours.model.layers, policy="attention+qkv+keep_fc1",
                                 min_bytes=0, use_reentrant=use_reentrant)
    theirs.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    _steps_match_plain(ours, theirs, "cpu", steps=2)
    assert handle.stats()["live_handles"] == 0
    handle.remove()
    assert F.linear is torch._C._nn.linear


def test_block_policies_give_each_block_its_policy():
    # The last block keeps its up/gate products: 2 matmuls spared in its recompute only.
    policies = ["attention"] * (LAYERS - 1) + ["attention+keep_fc1"]
    torch.manual_seed(0)
    matmuls, copied = matmuls_in_backward(policy="attention")
    torch.manual_seed(0)
    mixed_matmuls, mixed_copied = matmuls_in_backward(block_policies=policies)
    assert matmuls - mixed_matmuls == 2
    assert mixed_copied == copied

    ours, theirs = _tiny_llama("cpu", 0.1), _tiny_llama("cpu", 0.1)
    handle = torch_offload.apply(ours, "selective", ours.model.layers, min_bytes=0,
                                 block_policies=["attention+qkv", "attention", "attention+out_proj+keep_fc1"])
    theirs.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    _steps_match_plain(ours, theirs, "cpu", steps=2)
    handle.remove()


class _UpBlock(nn.Module):
    """Attention, then an up projection whose product a "keep_fc1" policy keeps; `modify` changes
    that product in place after its use."""

    def __init__(self, modify=False):
        super().__init__()
        self.mlp = nn.Module()
        self.mlp.up_proj = nn.Linear(8, 8)
        self.modify = modify

    def forward(self, x):
        q = x.reshape(1, 1, -1, 8)
        x = F.scaled_dot_product_attention(q, q, q).reshape(x.shape)
        up = self.mlp.up_proj(x)
        out = up.exp()
        if self.modify:
            up.mul_(2)  # after it was kept
        return out


@pytest.mark.parametrize("shape", [(4, 8), (2, 4, 8)])  # 3-D: the caller gets a view of the kept product
def test_kept_product_modified_in_place_is_detected(shape):
    out = torch_offload.selective_checkpoint(_UpBlock(modify=True), torch.randn(*shape, requires_grad=True),
                                             policy="attention+keep_fc1", min_bytes=0)
    with pytest.raises(RuntimeError, match="modified in place after it was kept"):
        out.sum().backward()


def test_kept_products_of_a_forward_never_backpropagated_are_freed():
    block = _UpBlock()
    products = []  # the product's storage, held weakly
    block.mlp.up_proj.register_forward_hook(
        lambda module, args, out: products.append(StorageWeakRef(out.untyped_storage())))
    out = torch_offload.selective_checkpoint(block, torch.randn(2, 4, 8, requires_grad=True),
                                             policy="attention+keep_fc1", min_bytes=0)
    assert not products[0].expired()  # kept for the recompute
    del out
    gc.collect()
    assert products[0].expired(), "the kept product outlived its graph"


def test_kept_groups_and_block_policies_errors_name_the_case():
    model = _tiny_llama("cpu", 0.0)
    layers = model.model.layers
    with pytest.raises(ValueError, match=r"'attention\+fc1\+keep_fc1'.*distinct projection groups"):
        torch_offload.apply(model, "selective", layers, policy="attention+fc1+keep_fc1")
    with pytest.raises(ValueError, match=r"'attention\+keep_mlp'.*distinct projection groups"):
        torch_offload.apply(model, "selective", layers, policy="attention+keep_mlp")
    with pytest.raises(ValueError, match="block_policies has 2 entries for 3 blocks"):
        torch_offload.apply(model, "selective", layers, block_policies=["attention"] * 2)
    with pytest.raises(ValueError, match="not both"):
        torch_offload.apply(model, "selective", layers, policy="attention", block_policies=["attention"] * 3)
    with pytest.raises(ValueError, match="has no Linear modules in module preset 'fc1'"):
        torch_offload.apply(nn.Sequential(nn.Linear(2, 2)), "selective", blocks=[nn.Linear(2, 2)],
                            policy="attention+keep_fc1")
    assert "forward" not in layers[0].__dict__  # nothing was left wrapped
