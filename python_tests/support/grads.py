"""Gradients of two models compared bit for bit."""
import torch


def assert_same_grads(model_a, model_b):
    for (name, a), (_, b) in zip(model_a.named_parameters(), model_b.named_parameters()):
        if a.grad is None or b.grad is None:
            assert a.grad is None and b.grad is None, name
            continue
        assert torch.equal(a.grad, b.grad), f"{name}: max diff {(a.grad - b.grad).abs().max()}"
