"""Sequence-tiled compute of a position-wise module (a transformer's MLP): no S x ffn tensor exists at
once.

A position-wise module computes each token on its own, so it can run over tiles of the sequence and
concatenate the outputs. The MLP of a long sequence is where one block's memory peaks: its
intermediates (gate, up, and their product) are S x ffn each, 3.5x the size of the block's input for
Llama's shapes. Tiled, the forward runs each tile under no_grad and keeps only the input; backward
recomputes each tile with grad and takes its gradients before the next, so at most one tile's
intermediates exist at a time, in forward and in backward.

Gradients: the input's gradient is computed tile by tile, each token's from its own row; the
parameters' gradients are sums over the tiles, added in tile order, where the untiled backward sums
over all tokens in one matrix product: the same terms in another order, so they agree to rounding
(fp32: relative error of a few ulps times the square root of the number of tiles), not bit for bit.
They reach autograd as this function's gradients (not accumulated into .grad behind its back), so
torch.autograd.grad, gradient hooks and FSDP2's reduction see them as from any other op.
"""
import math
from typing import Callable, Optional, Sequence

import torch


class _TiledCompute(torch.autograd.Function):
    """function(tile, *tensors) over the tiles of x; gradients for x and for the tensors that need
    them. The tensors are saved as they were in the forward. `computes_with_arguments`: the function
    computes with the tensors it is passed (then backward passes leaves of its own and takes the
    gradients with respect to them), rather than with tensors it holds (whose gradients are taken
    with respect to the saved tensors themselves)."""

    @staticmethod
    def forward(ctx, function: Callable, computes_with_arguments: bool, tile_tokens: int, dim: int,
                x: torch.Tensor, *tensors: torch.Tensor):
        ctx.function, ctx.tile_tokens, ctx.dim = function, tile_tokens, dim
        ctx.computes_with_arguments = computes_with_arguments
        ctx.save_for_backward(x, *tensors)
        with torch.no_grad():
            return torch.cat([function(tile, *tensors) for tile in x.split(tile_tokens, dim)], dim)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        x, *tensors = ctx.saved_tensors
        needs_x, needs_tensors = ctx.needs_input_grad[4], ctx.needs_input_grad[5:]
        if ctx.computes_with_arguments:
            tensors = [t.detach().requires_grad_(needed) for t, needed in zip(tensors, needs_tensors)]
        wanted = [t for t, needed in zip(tensors, needs_tensors) if needed]
        grad_x = torch.empty_like(x) if needs_x else None
        grad_tensors = [None] * len(wanted)
        offset = 0
        for tile, grad_tile in zip(x.split(ctx.tile_tokens, ctx.dim), grad_output.split(ctx.tile_tokens, ctx.dim)):
            tile = tile.detach().requires_grad_(needs_x)
            with torch.enable_grad():
                out = ctx.function(tile, *tensors)
            grads = torch.autograd.grad(out, ([tile] if needs_x else []) + wanted, grad_tile, allow_unused=True)
            if needs_x:
                grad_x.narrow(ctx.dim, offset, tile.shape[ctx.dim]).copy_(grads[0])
                grads = grads[1:]
            for i, grad in enumerate(grads):
                if grad is None:
                    continue
                if grad_tensors[i] is None:
                    grad_tensors[i] = grad
                else:
                    grad_tensors[i] += grad
            offset += tile.shape[ctx.dim]
        found = iter(grad_tensors)
        per_tensor = [next(found) if needed else None for needed in needs_tensors]
        return (None, None, None, None, grad_x, *per_tensor)


def _check_tile_tokens(tile_tokens, call: str) -> None:
    if not isinstance(tile_tokens, int) or tile_tokens < 1:
        raise ValueError(f"{call}: tile_tokens={tile_tokens!r}; expected an int >= 1")


def tiled_compute(function: Callable, x: torch.Tensor, tile_tokens: int, dim: int = -2,
                  params: Sequence[torch.Tensor] = ()) -> torch.Tensor:
    """function(x), computed over tiles of `tile_tokens` along `dim` (the sequence dimension).

    `function` must compute each position of `dim` on its own (a position-wise module: an MLP, a
    norm) and return one tensor with x's extent along `dim`; `params`: the tensors it computes with
    whose gradients are wanted (a module's parameters that require grad). With grad disabled the tiles
    run one after another and nothing is saved."""
    _check_tile_tokens(tile_tokens, "torch_offload.tiled_compute")
    dim = dim % x.dim()
    if x.shape[dim] <= tile_tokens:
        return function(x)
    params = [p for p in params if p.requires_grad]
    if not torch.is_grad_enabled() or not (x.requires_grad or params):
        return torch.cat([function(tile) for tile in x.split(tile_tokens, dim)], dim)
    return _TiledCompute.apply(lambda tile, *_: function(tile), False, tile_tokens, dim, x, *params)


def tiled_module_call(run: Callable, module: torch.nn.Module, x: torch.Tensor, tile_tokens: int,
                      dim: int = -2) -> torch.Tensor:
    """run(x) (the forward of `module`), computed over tiles along `dim`, where backward recomputes each
    tile with the parameter tensors `module` had in this forward, not those it has when backward runs:
    every parameter, frozen ones included, is saved for backward like any op's weight, so the tensors
    that layer offloading installs for a forward (and fetches again for backward), or that FSDP2
    unshards for it, are the ones the recompute uses."""
    dim = dim % x.dim()
    if x.shape[dim] <= tile_tokens:
        return run(x)
    slots = _parameter_slots(module)
    tensors = list(dict.fromkeys(tensor for _, _, tensor in slots))  # a shared parameter once
    if not torch.is_grad_enabled() or not (x.requires_grad or any(t.requires_grad for t in tensors)):
        return torch.cat([run(tile) for tile in x.split(tile_tokens, dim)], dim)
    position = {id(t): i for i, t in enumerate(tensors)}
    where = [(owner, name, position[id(tensor)]) for owner, name, tensor in slots]

    def with_tensors(tile, *values):
        installed = [(owner, name, owner._parameters[name]) for owner, name, _ in where]
        try:
            for owner, name, i in where:
                owner._parameters[name] = values[i]
            return run(tile)
        finally:
            for owner, name, previous in installed:
                owner._parameters[name] = previous

    return _TiledCompute.apply(with_tensors, True, tile_tokens, dim, x, *tensors)


def _parameter_slots(module: torch.nn.Module) -> list:
    """(submodule, name, tensor) for every parameter of `module`, as installed now."""
    return [(owner, name, tensor) for owner in module.modules() for name, tensor in owner._parameters.items()
            if tensor is not None]


def default_tile_tokens(tokens: int, width: int, intermediate: int, budget_bytes: Optional[int] = None,
                        element_size: int = 2, intermediates: int = 3) -> int:
    """Tokens per tile for a position-wise module of `intermediate` features per token at its widest
    (`intermediates` tensors of that width alive at once: an MLP's gate, up and their product) over
    `tokens` tokens of `width` features: the tile whose intermediates fit `budget_bytes` (default: the
    size of the input itself, tokens x width), in equal tiles. A tile of at least 1024 tokens keeps
    the matrix products large enough to run at full speed."""
    budget = budget_bytes if budget_bytes is not None else tokens * width * element_size
    per_token = max(1, intermediates * intermediate * element_size)
    tile = max(1024, budget // per_token)
    tiles = max(1, math.ceil(tokens / tile))
    return math.ceil(tokens / tiles)
