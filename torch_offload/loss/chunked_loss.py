"""chunked_causal_lm_loss(): a causal LM's loss (LM head + cross-entropy, Hugging Face's semantics)
computed over chunks of tokens, so that the logits never exist for the whole sequence.

At long context the logits dominate a step's memory: tokens x vocab in the model's dtype, their fp32
upcast inside the loss, log-softmax's saved output and the gradients (Llama-3-8B at 86k tokens: 22 GB
of bf16 logits alone). Here each chunk's logits are computed, reduced to a summed loss and dropped in
the forward; the backward computes them again chunk by chunk and turns each into the chunk's
gradient of the hidden states and its contribution to the weight's gradient. Live at once: one
chunk's logits, their gradient written over them on CUDA (2 bytes x chunk_tokens x vocab in bf16);
elsewhere also their upcast and its gradients (about 16 bytes x chunk_tokens x vocab).

Off CUDA, per chunk the same kernels as the unchunked loss run (F.linear, .float(), F.cross_entropy
and their backward), so each token's loss and each hidden-state gradient row are what Hugging Face's
loss gives as long as the matrix products give the same rows for a chunk as for the whole sequence.
On CUDA one kernel computes a chunk's loss and its logits' gradient (cross_entropy_grad.py: the
logits read twice, no float32 copy), equal to those kernels' results to float32 rounding. What
differs as well is summation order: the loss is a sum of chunk sums, and the weight's gradient a sum
of per-chunk products (accumulated in the weight's dtype, one rounding per chunk) instead of one
product over every token. In fp32 the results are equal to about 1e-6 relative, not bit for bit.

grads_in_forward=True: each chunk's gradients are computed in the forward, right after its loss,
for an upstream gradient of 1 on the returned loss (the logits are computed once, not again in
backward: the LM head's product over every token, 8.6 TFLOP per step for Llama-3-8B at 8k), and kept
until backward, which returns them times its incoming gradient. The gradients are bit for bit those
of grads_in_forward=False when backward starts from the returned loss (loss.backward(), or a sum
with other terms); another incoming gradient g costs a multiplication of each by g (exact for powers
of two, such as a GradScaler's; one rounding otherwise, e.g. a loss divided by the accumulation
steps). Memory: the hidden states' and the weight's gradients (tokens x hidden, vocab x hidden, in
their dtypes) exist from the loss on instead of from its backward. One backward per forward
(retain_graph and a second backward raise an error). The work is done even if no backward follows.
"""
from typing import Optional

import torch
import torch.nn.functional as F

from .._library.dtensors import is_dtensor
from .cross_entropy_grad import cross_entropy_grad_

DEFAULT_CHUNK_TOKENS = 2048


def shifted_labels(labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Hugging Face's shift: position i is scored against labels[i + 1], the last position against
    nothing (ignore_index)."""
    return F.pad(labels, (0, 1), value=ignore_index)[..., 1:]


# Under torch.compile the loss runs eagerly (a graph break): a loop over chunks whose logits never
# coexist, a kernel that writes the gradient over them, gradients kept on ctx for grads_in_forward.
@torch.compiler.disable
def chunked_causal_lm_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: Optional[torch.Tensor] = None, *,
                           bias: Optional[torch.Tensor] = None, chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
                           ignore_index: int = -100, num_items_in_batch=None,
                           shift_labels: Optional[torch.Tensor] = None, grads_in_forward: bool = False) -> torch.Tensor:
    """Hugging Face's ForCausalLMLoss(F.linear(hidden, weight, bias), labels), chunk_tokens tokens
    at a time: the fp32 mean cross-entropy over the tokens whose (shifted) label is not
    ignore_index, or the sum divided by num_items_in_batch when given (gradient accumulation).

    hidden: [..., tokens, hidden_size]; weight: [vocab, hidden_size] (the LM head's); labels: [...,
    tokens], shifted here, or shift_labels already shifted (as Hugging Face takes them).
    grads_in_forward: see the module's docstring."""
    if not isinstance(chunk_tokens, int) or isinstance(chunk_tokens, bool) or chunk_tokens < 1:
        raise ValueError(f"torch_offload.chunked_causal_lm_loss: chunk_tokens={chunk_tokens!r}; "
                         "expected a positive int")
    for name, t in (("hidden", hidden), ("weight", weight), ("bias", bias)):
        if is_dtensor(t):
            raise TypeError(f"torch_offload.chunked_causal_lm_loss: {name} is a DTensor ({t.placements}); "
                            "it needs plain tensors: under FSDP2 call it inside the forward of the module "
                            "that owns the weight (where fully_shard has gathered it); a tensor- or "
                            "sequence-parallel LM head is not supported")
    if shift_labels is None:
        if labels is None:
            raise ValueError("torch_offload.chunked_causal_lm_loss: pass labels or shift_labels")
        shift_labels = shifted_labels(labels, ignore_index)
    targets = shift_labels.reshape(-1).to(hidden.device)
    hidden = hidden.reshape(-1, hidden.shape[-1])
    if targets.numel() != hidden.shape[0]:
        raise ValueError(f"torch_offload.chunked_causal_lm_loss: {hidden.shape[0]} hidden-state rows but "
                         f"{targets.numel()} labels")
    divisor = (targets != ignore_index).sum() if num_items_in_batch is None else num_items_in_batch
    if torch.is_tensor(divisor):
        divisor = divisor.to(hidden.device)
    if grads_in_forward:
        return _CrossEntropyGradsInForward.apply(hidden, weight, bias, targets, chunk_tokens, ignore_index, divisor)
    total = _ChunkedCrossEntropy.apply(hidden, weight, bias, targets, chunk_tokens, ignore_index)
    return total / divisor  # as Hugging Face: a sum over tokens, then one division


def _chunk_loss(hidden, weight, bias, targets, ignore_index):
    """One chunk's summed loss, computed as Hugging Face's loss computes it."""
    logits = F.linear(hidden, weight, bias)
    return F.cross_entropy(logits.float(), targets, ignore_index=ignore_index, reduction="sum")


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of F.linear(hidden, weight, bias) against targets; saves only its inputs."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk_tokens, ignore_index):
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk_tokens):
            end = start + chunk_tokens
            total += _chunk_loss(hidden[start:end], weight, bias, targets[start:end], ignore_index)
        ctx.save_for_backward(hidden, weight, bias, targets)
        ctx.chunk_tokens, ctx.ignore_index = chunk_tokens, ignore_index
        ctx.compute_dtype = _compute_dtype(hidden, weight)  # backward runs outside the forward's autocast
        return total

    @staticmethod
    def backward(ctx, grad_total):
        hidden, weight, bias, targets = ctx.saved_tensors
        grads = _chunked_grads(hidden, weight, bias, targets, ctx.chunk_tokens, ctx.ignore_index, grad_total,
                               ctx.needs_input_grad[:3], ctx.compute_dtype)
        return (*grads, None, None, None)


def _compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype the LM head's product has here: autocast's where it is on (it casts both operands of
    F.linear, float64 ones excepted), else the operands' own."""
    device = hidden.device.type
    if torch.is_autocast_enabled(device) and hidden.is_floating_point() and hidden.dtype != torch.float64:
        return torch.get_autocast_dtype(device)
    return torch.result_type(hidden, weight)


def _chunked_grads(hidden, weight, bias, targets, chunk_tokens, ignore_index, grad_total, needs,
                   compute_dtype, total=None):
    """The gradients of the summed loss times grad_total for hidden, weight and bias (None where
    `needs` says not needed), chunk by chunk; the summed loss is added into `total` when given.

    The products run in `compute_dtype`, the forward's (under autocast, its dtype: the logits, their
    gradient and the products' results in it, as autocast's backward computes them), and each
    gradient reaches its tensor's dtype, accumulated over the chunks there."""
    need_hidden, need_weight, need_bias = needs
    grad_hidden = torch.empty_like(hidden) if need_hidden else None
    grad_weight = grad_bias = None
    weight_c = weight.to(compute_dtype)  # .to() copies only where the dtype differs
    bias_c = None if bias is None else bias.to(compute_dtype)
    with torch.autocast(hidden.device.type, enabled=False):  # the dtypes are explicit from here
        for start in range(0, hidden.shape[0], chunk_tokens):
            end = start + chunk_tokens
            chunk = hidden[start:end]
            chunk_c = chunk.to(compute_dtype)
            # The loss and the logits' gradient (cross_entropy_grad.py); the LM head's two products by
            # hand, into the running results.
            loss, grad_logits = cross_entropy_grad_(F.linear(chunk_c, weight_c, bias_c), targets[start:end],
                                                    ignore_index, grad_total)
            if total is not None:
                total += loss
            if need_hidden:
                if hidden.dtype == compute_dtype:
                    torch.mm(grad_logits, weight_c, out=grad_hidden[start:end])
                else:
                    grad_hidden[start:end] = torch.mm(grad_logits, weight_c)
            if need_weight:
                if weight.dtype != compute_dtype:
                    part = grad_logits.t().mm(chunk_c).to(weight.dtype)
                    grad_weight = part if grad_weight is None else grad_weight.add_(part)
                elif grad_weight is None:
                    grad_weight = grad_logits.t().mm(chunk_c)
                else:  # no weight-sized temporary per chunk
                    grad_weight.addmm_(grad_logits.t(), chunk_c)
            if need_bias:
                part = grad_logits.sum(0).to(bias.dtype)
                grad_bias = part if grad_bias is None else grad_bias.add_(part)
            del loss, grad_logits
    return grad_hidden, grad_weight, grad_bias


class _CrossEntropyGradsInForward(torch.autograd.Function):
    """The mean (summed / divisor) cross-entropy of F.linear(hidden, weight, bias); its gradients are
    computed in forward, for an incoming gradient of 1, and kept for backward."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk_tokens, ignore_index, divisor):
        # What backward would receive through `total / divisor` for loss.backward(): 1 / divisor.
        scale = torch.ones((), dtype=torch.float32, device=hidden.device) / divisor
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        ctx.grads = _chunked_grads(hidden, weight, bias, targets, chunk_tokens, ignore_index, scale,
                                   ctx.needs_input_grad[:3], _compute_dtype(hidden, weight), total)
        return total / divisor

    @staticmethod
    def backward(ctx, grad_loss):
        grads = ctx.grads
        if grads is None:
            raise RuntimeError("torch_offload.chunked_causal_lm_loss(grads_in_forward=True): backward ran twice "
                               "through one forward (retain_graph); its gradients were computed once, in the "
                               "forward, and handed over; use grads_in_forward=False")
        ctx.grads = None  # handed over: nothing of them stays with the graph
        return (*(None if g is None else g * grad_loss for g in grads), None, None, None, None)
