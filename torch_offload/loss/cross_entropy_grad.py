"""cross_entropy_grad_(): one chunk's summed cross-entropy and the gradient of its logits, the
gradient written over the logits.

The chunked loss needs, per chunk of tokens, the summed loss and the logits' gradient for a given
incoming gradient. Through autograd that is five passes over tokens x vocab elements, three of them
in float32 (the upcast, log-softmax, its backward, the cast back): at Llama-3's vocabulary about ten
bytes moved per logit, more than the LM head's own product costs at 2048 tokens. On CUDA one Triton
kernel does it instead: each row read twice in the logits' dtype (its maximum and sum of exponentials
online, then the gradient), computed in float32, and the gradient written in place, about three
bytes moved per logit and no float32 copy. Elsewhere (CPU, no Triton) the autograd kernels run, as
the unchunked loss runs them.

Both compute Hugging Face's loss: per token the log of the sum of exponentials of its logits less its
target's logit, 0 for a token whose target is ignore_index; and per logit (softmax - one-hot) times
the incoming gradient, 0 on ignored tokens, rounded once to the logits' dtype. The kernel's float32
arithmetic is ordered differently (an online maximum, the incoming gradient applied after the
one-hot), so the two agree to float32 rounding, not bit for bit. A target outside [0, vocab) that is
not ignore_index makes the autograd path raise (a device assert on CUDA) and the kernel's loss NaN.
"""
from typing import Tuple

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU build of torch: the autograd path
    triton = None

# Elements of a row each step of the kernel's loops reads, and the warps that read them: 16 values
# per thread, the fastest of the block sizes tried (4096 to 32768 elements, 8 to 32 warps) at
# Llama-3's vocabulary.
BLOCK = 4096
WARPS = 8
# The logits' dtypes the kernel is tested with on a GPU (python_tests/loss/test_cross_entropy_grad.py);
# others take the autograd path.
FUSED_DTYPES = (torch.bfloat16, torch.float32)


def cross_entropy_grad_(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                        grad_total: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(the summed cross-entropy of `logits` [tokens, vocab] against `targets` [tokens], float32;
    the gradient of that sum times `grad_total` (a scalar tensor) with respect to the logits, in
    their dtype). On CUDA with Triton the gradient is `logits` itself, overwritten."""
    if _fused(logits, targets):
        return _fused_cross_entropy_grad_(logits, targets, ignore_index, grad_total)
    with torch.enable_grad():
        logits = logits.detach().requires_grad_()
        loss = F.cross_entropy(logits.float(), targets, ignore_index=ignore_index, reduction="sum")
        (grad_logits,) = torch.autograd.grad(loss, logits, grad_total)
    return loss.detach(), grad_logits


def _fused(logits: torch.Tensor, targets: torch.Tensor) -> bool:
    return (triton is not None and logits.is_cuda and logits.dim() == 2 and logits.stride(1) == 1
            and logits.dtype in FUSED_DTYPES and targets.dim() == 1
            and targets.is_contiguous() and targets.device == logits.device)


def _fused_cross_entropy_grad_(logits, targets, ignore_index, grad_total):
    tokens, vocab = logits.shape
    losses = torch.empty(tokens, dtype=torch.float32, device=logits.device)
    scale = grad_total.detach().to(device=logits.device, dtype=torch.float32).reshape(1)
    if tokens:
        # Triton launches on the current device and its current stream: make them the logits'.
        with torch.cuda.device(logits.device):
            _cross_entropy_grad_kernel[(tokens,)](logits, logits.stride(0), targets, losses, scale, vocab,
                                                  ignore_index, BLOCK=min(BLOCK, triton.next_power_of_2(vocab)),
                                                  num_warps=WARPS)
    return losses.sum(), logits


if triton is not None:

    @triton.jit
    def _cross_entropy_grad_kernel(logits_ptr, row_stride, targets_ptr, losses_ptr, scale_ptr, vocab, ignore_index,
                                   BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        logits_ptr += row * row_stride
        target = tl.load(targets_ptr + row)
        columns = tl.arange(0, BLOCK)
        # Pass 1: the row's maximum and the sum of exponentials below it, online.
        maximum = float("-inf")
        total = 0.0
        for start in range(0, vocab, BLOCK):
            x = tl.load(logits_ptr + start + columns, mask=start + columns < vocab, other=float("-inf")).to(tl.float32)
            new_maximum = tl.maximum(maximum, tl.max(x, 0))
            total = total * tl.exp(maximum - new_maximum) + tl.sum(tl.exp(x - new_maximum), 0)
            maximum = new_maximum
        log_sum = maximum + tl.log(total)
        ignored = target == ignore_index
        valid = (target >= 0) & (target < vocab)
        target_logit = tl.load(logits_ptr + tl.where(valid, target, 0)).to(tl.float32)
        loss = tl.where(valid, log_sum - target_logit, float("nan"))
        tl.store(losses_ptr + row, tl.where(ignored, 0.0, loss))
        # Pass 2: (softmax - one-hot) x the incoming gradient, over the logits.
        scale = tl.where(ignored, 0.0, tl.load(scale_ptr))
        for start in range(0, vocab, BLOCK):
            mask = start + columns < vocab
            x = tl.load(logits_ptr + start + columns, mask=mask, other=0.0).to(tl.float32)
            probability = tl.exp(x - log_sum)
            grad = tl.where(start + columns == target, probability - 1.0, probability) * scale
            tl.store(logits_ptr + start + columns, grad.to(logits_ptr.dtype.element_ty), mask=mask)
