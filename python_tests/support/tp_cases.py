"""What each gloo rank runs for test_dtensor_boundaries.py: a stack of blocks under sequence
parallelism (torch.distributed.tensor.parallel: SequenceParallel norm, ColwiseParallel /
RowwiseParallel linears), so that each block's input is a DTensor sharded on the sequence dim
(Shard(1)). Trained under torch_offload and under the reference (torch's checkpoint for
hidden_states, plain training for all): fp32 losses and gradients must be bit-equal.

Every rank checks its own results; the verdicts are gathered, so rank 0 reports a failure of either.
"""
import traceback
import weakref

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                               parallelize_module)
from torch.utils.checkpoint import checkpoint as torch_checkpoint

import torch_offload

BATCH, SEQ, DIM, FFN, BLOCKS = 2, 16, 32, 64, 3


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, FFN)
        self.down = nn.Linear(FFN, DIM)
        self.dropout = nn.Dropout(0.1)  # on the local (column-sharded) activation: CPU RNG replayed

    def forward(self, x):
        return x + self.down(self.dropout(nn.functional.gelu(self.up(self.norm(x)))))


class Stack(nn.Module):
    def __init__(self, mesh, checkpointed=False):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.checkpointed = checkpointed  # the reference for hidden_states: torch's checkpoint
        plan = {"norm": SequenceParallel(), "up": ColwiseParallel(input_layouts=Shard(1)),
                "down": RowwiseParallel(output_layouts=Shard(1), use_local_output=False)}
        for layer in self.layers:
            parallelize_module(layer, mesh, plan)

    def forward(self, x):
        for layer in self.layers:
            x = torch_checkpoint(layer, x, use_reentrant=False) if self.checkpointed else layer(x)
        return x


def _step(model, mesh, after_forward=None):
    x_full = torch.randn(BATCH, SEQ, DIM, generator=torch.Generator().manual_seed(1))
    x = distribute_tensor(x_full, mesh, [Shard(1)]).requires_grad_()
    torch.manual_seed(99)  # the same dropout masks in both models
    loss = model(x).full_tensor().pow(2).mean()
    if after_forward is not None:
        after_forward()
    loss.backward()
    grads = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
    grads["input"] = x.grad.full_tensor()
    return loss.detach(), grads, x.to_local().numel() * x.to_local().element_size()


def _compare(ours, reference):
    (loss_ours, grads_ours, _), (loss_ref, grads_ref, _) = ours, reference
    assert torch.equal(loss_ours, loss_ref), f"loss {loss_ours} vs {loss_ref}"
    assert grads_ours.keys() == grads_ref.keys()
    for name in grads_ref:
        a, b = grads_ours[name], grads_ref[name]
        assert torch.equal(a, b), f"{name}: max diff {(a - b).abs().max()}"


def _record_inputs(model):
    """What the first norm receives, in the forward and in the recompute: (type, placements, shape, stride)."""
    seen = []

    def hook(module, args):
        x = args[0]
        seen.append((type(x).__name__, getattr(x, "placements", None), tuple(x.shape), x.stride()))

    model.layers[1].norm.register_forward_pre_hook(hook)
    return seen


def _watch_inputs(layers):
    """Weak references to the DTensor inputs of `layers` (the boundaries offloading must free)."""
    refs = []
    for layer in layers:
        layer.norm.register_forward_pre_hook(lambda m, args: refs.append(weakref.ref(args[0])))
    return refs


def _assert_freed(refs):
    # Only autograd's saves could still hold a block input after the forward: offloaded, none does.
    alive = [type(ref()).__name__ for ref in refs if ref() is not None]
    assert refs and not alive, f"{len(alive)} of {len(refs)} block inputs still alive after forward: {alive}"


def hidden_states(mesh, steps=2):
    ours, reference = Stack(mesh), Stack(mesh, checkpointed=True)
    handle = torch_offload.apply(ours, "hidden_states")
    seen = _record_inputs(ours)
    refs = _watch_inputs(ours.layers[1:])  # the first block's input is the caller's leaf
    for _ in range(steps):
        refs.clear()  # the recompute in backward adds its own inputs
        result = _step(ours, mesh, after_forward=lambda: _assert_freed(refs))
        _compare(result, _step(reference, mesh))
    # Per step: the block runs in forward and once more in backward, on the same DTensor.
    assert len(seen) == 2 * steps and len(set(seen)) == 1, seen
    assert seen[0][:2] == ("DTensor", (Shard(1),)) and seen[0][2] == (BATCH, SEQ, DIM), seen[0]
    local_bytes = result[2]
    stats = handle.stats()
    # Each block's input, as its local shard (half the sequence), every step.
    assert stats["bytes_to_host"] == steps * BLOCKS * local_bytes, (stats["bytes_to_host"], local_bytes)
    assert stats["bytes_to_device"] == stats["bytes_to_host"]


def checkpoint_direct(mesh, use_reentrant=False):
    """torch_offload.checkpoint on a DTensor input, without apply()."""
    ours, reference = Stack(mesh), Stack(mesh, checkpointed=True)
    manager = torch_offload.OffloadManager()
    ours.forward = lambda x: _chain(ours, x, manager, use_reentrant)
    _compare(_step(ours, mesh), _step(reference, mesh))
    assert torch_offload.stats(manager)["bytes_to_host"] == BLOCKS * BATCH * (SEQ // 2) * DIM * 4


def _chain(model, x, manager, use_reentrant):
    for layer in model.layers:
        x = torch_offload.checkpoint(layer, x, manager=manager, use_reentrant=use_reentrant)
    return x


def all_mode(mesh, steps=2):
    ours, reference = Stack(mesh), Stack(mesh)
    handle = torch_offload.apply(ours, "all", min_bytes=0)
    refs = _watch_inputs(ours.layers[1:-1])  # all mode keeps the last block resident
    for _ in range(steps):
        refs.clear()
        _compare(_step(ours, mesh, after_forward=lambda: _assert_freed(refs)), _step(reference, mesh))
    stats = handle.stats()
    assert stats["bytes_to_host"] > 0 and stats["bytes_to_device"] == stats["bytes_to_host"], stats


CASES = {"hidden_states": hidden_states, "checkpoint": checkpoint_direct,
         "checkpoint_reentrant": lambda mesh: checkpoint_direct(mesh, use_reentrant=True), "all": all_mode}


def run_all(rank, world_size):
    mesh = init_device_mesh("cpu", (world_size,))
    verdicts = {}
    for name, case in CASES.items():
        try:
            case(mesh)
            verdicts[name] = "ok"
        except Exception:
            verdicts[name] = f"rank {rank}: " + traceback.format_exc(limit=6)
    every = [None] * world_size
    dist.all_gather_object(every, verdicts)
    return {name: next((v[name] for v in every if v[name] != "ok"), "ok") for name in CASES}
