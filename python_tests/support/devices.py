"""The devices a test runs on: every device-generic test runs on CPU (CI) and, where present, on CUDA."""
import pytest
import torch

HAS_CUDA = torch.cuda.is_available()

_needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")


def cuda_only(test):
    """A CUDA-only test: skipped without a device, and selected by `pytest -m cuda` on the GPU machine."""
    return pytest.mark.cuda(_needs_cuda(test))


DEVICES = ["cpu", pytest.param("cuda", marks=[_needs_cuda, pytest.mark.cuda])]
