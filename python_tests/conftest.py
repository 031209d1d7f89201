"""The fixtures every folder shares (helpers that are not fixtures live in python_tests/support/)."""
import pytest
import torch
import torch._dynamo

import torch_offload  # noqa: F401  (loads the library and registers the Python fakes)


@pytest.fixture
def manager():
    return torch_offload.OffloadManager()


@pytest.fixture(params=["c", "python"])
def save_hooks(request, monkeypatch):
    """Runs a test with the C save hooks (pyext/save_hooks.cpp) and again with the Python ones they
    stand in for (what a build without Python's headers runs): both must decide alike."""
    from torch_offload._library import loading as _library
    from torch_offload.hooks import offload_hooks as activations
    if request.param == "python":
        monkeypatch.setattr(activations, "load_save_hooks", lambda: None)
    elif _library.load_save_hooks() is None:
        pytest.fail("the C save hooks were not built or not found next to the library")
    return request.param


@pytest.fixture
def fresh_dynamo():
    # The tests inspect the graphs our partitioner rewrites, so it must run: with inductor's and
    # AOTAutograd's on-disk caches on, a graph compiled by an earlier pytest run is loaded instead
    # (test_cache_hit_still_offloads covers that path).
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with torch.compiler.config.patch(force_disable_caches=True):
        yield
    torch._dynamo.reset()
