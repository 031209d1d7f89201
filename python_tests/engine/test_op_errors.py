"""The ops' errors name what the user passed: tensors the engine cannot copy (sparse, quantized,
MKLDNN, nested, meta), a CUDA restore without CUDA (through the Python wrapper and the op itself),
and a saved tensor modified in place before its restore."""
import warnings

import pytest
import torch

import torch_offload
from python_tests.support.devices import HAS_CUDA


@pytest.mark.parametrize("make, error, message", [
    (lambda: torch.randn(4, 4).to_sparse(), TypeError, r"a sparse tensor \(torch.sparse_coo\)"),
    (lambda: torch.randn(4, 4).to_sparse_csr(), TypeError, r"a sparse tensor \(torch.sparse_csr\)"),
    (lambda: torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8), TypeError,
     r"a quantized tensor \(torch.qint8\)"),
    (lambda: torch.randn(4, 4).to_mkldnn(), TypeError, "an MKLDNN tensor"),
    (lambda: torch.nested.nested_tensor([torch.randn(2), torch.randn(3)]), TypeError, "a nested tensor"),
    (lambda: torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)], layout=torch.jagged),
     TypeError, "a nested tensor"),
    (lambda: torch.empty(4, device="meta"), ValueError, "on the meta device"),
], ids=["sparse_coo", "sparse_csr", "quantized", "mkldnn", "nested", "jagged", "meta"])
def test_offload_save_rejects_what_it_cannot_copy(manager, make, error, message):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested tensors are a prototype
        x = make()
    with pytest.raises(error, match="torch_offload.offload_save: x is " + message):
        torch.ops.offload.offload_save(x, manager.id())


@pytest.mark.skipif(HAS_CUDA, reason="checks the message on a machine without CUDA")
def test_restore_to_cuda_without_cuda_says_so(manager):
    handle = torch.ops.offload.offload_save(torch.randn(4), manager.id())
    with pytest.raises(RuntimeError, match=r"offload_restore: device='cuda', but CUDA is not available"):
        torch_offload.offload_restore(handle, "cuda", manager.id())


@pytest.mark.skipif(HAS_CUDA, reason="checks the message on a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda")])
def test_raw_restore_to_cuda_without_cuda_names_the_op_and_the_device(manager, device):
    # The op itself, not the Python wrapper: CUDA's own error would be "driver version is
    # insufficient" (or another of the driver's), naming neither.
    handle = torch.ops.offload.offload_save(torch.randn(4), manager.id())
    shown = str(torch.device(device))
    with pytest.raises(RuntimeError, match=rf"^offload_restore: device='{shown}', but no CUDA device is "
                                           r"visible to this process \(torch.cuda.is_available\(\) is False\)"):
        torch.ops.offload.offload_restore(handle, device, manager.id())
    with pytest.raises(RuntimeError, match=r"^offload_restore: device='meta' is not supported"):
        torch.ops.offload.offload_restore(handle, "meta", manager.id())
    # The handle is untouched: a CPU restore still works.
    assert torch.equal(torch.ops.offload.offload_restore(handle, "cpu", manager.id()), handle)


def test_raw_ops_still_name_offload_save_and_offload_restore(manager):
    x = torch.randn(8)
    handle = torch.ops.offload.offload_save(x, manager.id())
    x.mul_(2)
    x.add_(1)
    with pytest.raises(RuntimeError, match=r"^offload_restore: the tensor passed to offload_save was "
                                           r"modified in place after it was saved \(its version went from "
                                           r"0 to 2\)"):
        torch.ops.offload.offload_restore(handle, "cpu", manager.id())
