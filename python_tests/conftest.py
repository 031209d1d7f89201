import pytest
import torch

import torch_offload  # noqa: F401  (loads the library and registers the Python fakes)

HAS_CUDA = torch.cuda.is_available()

_needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")


def cuda_only(test):
    """A CUDA-only test: skipped without a device, and selected by `pytest -m cuda` on the GPU machine."""
    return pytest.mark.cuda(_needs_cuda(test))


# Every device-generic test runs on CPU (CI) and, where present, on CUDA.
DEVICES = ["cpu", pytest.param("cuda", marks=[_needs_cuda, pytest.mark.cuda])]


@pytest.fixture
def manager():
    return torch_offload.OffloadManager()


def assert_same_grads(model_a, model_b):
    for (name, a), (_, b) in zip(model_a.named_parameters(), model_b.named_parameters()):
        if a.grad is None or b.grad is None:
            assert a.grad is None and b.grad is None, name
            continue
        assert torch.equal(a.grad, b.grad), f"{name}: max diff {(a.grad - b.grad).abs().max()}"


@pytest.fixture(params=["c", "python"])
def save_hooks(request, monkeypatch):
    """Runs a test with the C save hooks (pyext/save_hooks.cpp) and again with the Python ones they
    stand in for (what a build without Python's headers runs): both must decide alike."""
    from torch_offload._engine import library as _library
    from torch_offload.hooks import offload_hooks as activations
    if request.param == "python":
        monkeypatch.setattr(activations, "load_save_hooks", lambda: None)
    elif _library.load_save_hooks() is None:
        pytest.fail("the C save hooks were not built or not found next to the library")
    return request.param
