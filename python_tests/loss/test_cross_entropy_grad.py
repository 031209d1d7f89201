"""cross_entropy_grad_: one chunk's summed loss and its logits' gradient, from the autograd kernels
off CUDA and from one Triton kernel on CUDA, both Hugging Face's cross-entropy."""
import pytest
import torch
import torch.nn.functional as F

from torch_offload.loss.cross_entropy_grad import BLOCK, cross_entropy_grad_

from ..support.devices import DEVICES, cuda_only


def _reference(logits, targets, ignore_index, grad_total):
    """The unchunked loss's kernels in float64: the loss and the gradient before their rounding."""
    x = logits.detach().double().requires_grad_()
    loss = F.cross_entropy(x, targets, ignore_index=ignore_index, reduction="sum")
    (grad,) = torch.autograd.grad(loss, x, grad_total.double())
    return loss.detach(), grad


def _case(device, dtype, tokens, vocab, ignore_index=-100, seed=0):
    generator = torch.Generator().manual_seed(seed)
    logits = (4 * torch.randn(tokens, vocab, generator=generator)).to(device=device, dtype=dtype)
    targets = torch.randint(0, vocab, (tokens,), generator=generator)
    targets[::5] = ignore_index  # some tokens ignored
    return logits, targets.to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# A vocabulary under one block, one that ends mid-block, and Llama-3's.
@pytest.mark.parametrize("vocab", [1000, BLOCK + 77, 128256])
def test_loss_and_gradient_are_the_cross_entropys(device, dtype, vocab):
    tokens = 64 if vocab > BLOCK else 257
    logits, targets = _case(device, dtype, tokens, vocab)
    grad_total = torch.tensor(1 / 3, device=device)
    want_loss, want_grad = _reference(logits, targets, -100, grad_total)
    loss, grad = cross_entropy_grad_(logits.clone(), targets, -100, grad_total)
    assert loss.dtype == torch.float32 and loss.shape == ()
    assert grad.dtype == dtype and grad.shape == logits.shape
    # Within 1e-6, or within twice the error of torch's own float32 loss: a float32 sum over 128256
    # logits is rounded in an order the CPU's vector width sets, 1.2e-6 off on some machines.
    torch_loss = F.cross_entropy(logits.float(), targets, ignore_index=-100, reduction="sum")
    torch_error = (torch_loss.double() - want_loss).abs()
    error = (loss.double() - want_loss).abs()
    assert error <= max(1e-6 * want_loss.abs(), 2 * torch_error), (loss, want_loss, torch_error)
    # The gradient in the logits' dtype: float32 arithmetic (exp(x - log-sum) loses ~|x - log-sum|
    # ulps), then one rounding to bf16.
    rtol, atol = (1e-4, 1e-9) if dtype == torch.float32 else (8e-3, 1e-7)
    torch.testing.assert_close(grad.double(), want_grad, rtol=rtol, atol=atol)
    assert not grad[targets == -100].any()  # ignored tokens: no gradient


@cuda_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_kernel_matches_the_autograd_kernels(dtype):
    # The kernel against the kernels it replaces (those of the CPU path, run on the GPU).
    logits, targets = _case("cuda", dtype, 300, 50257, ignore_index=-1, seed=1)
    grad_total = torch.tensor(0.25, device="cuda")
    x = logits.detach().requires_grad_()
    want = F.cross_entropy(x.float(), targets, ignore_index=-1, reduction="sum")
    (want_grad,) = torch.autograd.grad(want, x, grad_total)
    buffer = logits.clone()
    loss, grad = cross_entropy_grad_(buffer, targets, -1, grad_total)
    assert grad.data_ptr() == buffer.data_ptr()  # written over the logits: no copy of tokens x vocab
    torch.testing.assert_close(loss, want.detach(), rtol=1e-6, atol=0)
    torch.testing.assert_close(grad, want_grad, rtol=1e-5 if dtype == torch.float32 else 8e-3, atol=1e-8)


@cuda_only
def test_cuda_kernel_target_out_of_range_gives_nan():
    logits, targets = _case("cuda", torch.bfloat16, 8, 1000)
    targets[3] = 1000
    loss, _ = cross_entropy_grad_(logits, targets, -100, torch.tensor(1.0, device="cuda"))
    assert loss.isnan()


def test_cpu_path_raises_on_a_target_out_of_range():
    logits, targets = _case("cpu", torch.float32, 8, 100)
    targets[3] = 100
    with pytest.raises(IndexError):
        cross_entropy_grad_(logits, targets, -100, torch.tensor(1.0))
