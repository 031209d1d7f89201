"""What a new user hits first: errors that name apply() and the argument written, a warning when a
step offloaded nothing, remove() undoing every change to a Hugging Face model, clear errors for
tensors the engine cannot copy and for a CUDA restore without CUDA."""
import warnings
from pathlib import Path

import pytest
import torch

import torch_offload
from python_tests.support.devices import HAS_CUDA
from python_tests.support.llama import _tiny_llama


def _train_step(model):
    ids = torch.randint(0, 256, (1, 16))
    model(input_ids=ids, labels=ids).loss.backward()


# --- errors name apply() and the argument the user wrote ---

def test_min_bytes_in_hidden_states_mode_names_apply_and_the_argument():
    with pytest.raises(TypeError, match=r"apply\(mode='hidden_states'\) got an unexpected keyword "
                                        r"argument 'min_bytes' \(mode='hidden_states' offloads each "
                                        r"block's input whatever its size") as error:
        torch_offload.apply(_tiny_llama("cpu"), mode="hidden_states", min_bytes=0)
    assert "OffloadManager" not in str(error.value)


def test_unknown_keyword_names_apply_and_suggests_blocks():
    model = _tiny_llama("cpu")
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'layers' \(the blocks to wrap "
                                        r"are blocks=\[\.\.\.\]"):
        torch_offload.apply(model, layers=list(model.model.layers))
    with pytest.raises(TypeError, match=r"apply\(mode='all'\) got an unexpected keyword argument "
                                        r"'prefetch' \(did you mean prefetch_depth=\?\); mode='all' takes: "
                                        r"min_bytes, max_in_flight"):
        torch_offload.apply(model, "all", prefetch=2)
    # A misspelt mode= names what the user wrote and the mode apply() used for want of it.
    with pytest.raises(TypeError, match=r"^torch_offload.apply\(\) got an unexpected keyword argument 'mdoe' "
                                        r"\(did you mean mode=\?\); mode='hidden_states' \(the default\) "
                                        r"takes: disk_only, use_reentrant, max_in_flight") as error:
        torch_offload.apply(model, mdoe="all")
    for internal in ("synchronous", "release_sources_on_save"):  # the manager's, not apply()'s
        assert internal not in str(error.value)
    # An option of another mode says which mode takes it.
    with pytest.raises(TypeError, match=r"'policy' \(policy is for mode='selective'\)"):
        torch_offload.apply(model, "hidden_states", policy="attention")
    with pytest.raises(TypeError, match=r"apply\(mode=None\) got an unexpected keyword argument 'min_bytes'"):
        torch_offload.apply(model, None, layer_offloading=True, min_bytes=0)
    # A failed apply() leaves the model as it was: a later apply() works.
    assert "forward" not in model.model.layers[0].__dict__
    torch_offload.apply(model, "all", min_bytes=0)


def test_manager_with_activation_options():
    model = _tiny_llama("cpu")
    manager = torch_offload.OffloadManager()
    with pytest.raises(ValueError, match=r"either manager= or the options that build one \(max_in_flight\)"):
        torch_offload.apply(model, "all", manager=manager, max_in_flight=2)
    # min_bytes is a hook option, not a manager option: allowed with a ready manager.
    handle = torch_offload.apply(model, "all", manager=manager, min_bytes=0)
    _train_step(model)
    assert handle.manager is manager and manager.stats()["saves"] > 0


# --- a step that offloaded nothing says why, once ---

def test_all_mode_under_min_bytes_warns_once_with_the_reason():
    model = _tiny_llama("cpu")
    torch_offload.apply(model, "all")  # default min_bytes=1 MiB: larger than every activation here
    with pytest.warns(torch_offload.NothingOffloadedWarning,
                      match=r"offloaded nothing: \d+ saved tensors were under min_bytes=1048576 "
                            r"\(the largest: \d+ bytes\); pass a smaller min_bytes"):
        _train_step(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _train_step(model)  # once only


def test_offloading_steps_do_not_warn():
    for mode, options in (("all", {"min_bytes": 0}), ("modules", {"min_bytes": 0, "targets": ["*.mlp"]}),
                          ("hidden_states", {})):
        model = _tiny_llama("cpu")
        handle = torch_offload.apply(model, mode, **options)
        with warnings.catch_warnings():
            warnings.simplefilter("error", torch_offload.NothingOffloadedWarning)
            _train_step(model)
            with torch.no_grad():  # nothing saved at all: no warning either
                model(input_ids=torch.randint(0, 256, (1, 16)))
        assert handle.stats()["saves"] > 0


def test_modules_mode_under_min_bytes_warns():
    model = _tiny_llama("cpu")
    torch_offload.apply(model, "modules", targets=["*.mlp"])
    with pytest.warns(torch_offload.NothingOffloadedWarning, match="under min_bytes=1048576"):
        _train_step(model)


def test_context_where_every_saved_tensor_is_kept_warns():
    w = torch.nn.Parameter(torch.randn(64, 64))
    x = torch.randn(8, 64)
    with pytest.warns(torch_offload.NothingOffloadedWarning,
                      match=r"all 1 saved tensors were parameters, buffers or views of them"):
        with torch_offload.offload_activations("all", min_bytes=0, keep=[x]):
            y = x @ w  # saves x (kept) for w's gradient
    y.sum().backward()
    assert torch.equal(w.grad, x.t() @ torch.ones(8, 64))


# --- remove() undoes everything apply() changed ---

@pytest.mark.parametrize("mode", ["hidden_states", "all"])
def test_remove_restores_hf_checkpointing_and_cache(mode):
    model = _tiny_llama("cpu")
    model.config.use_cache = True
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    layer = model.model.layers[0]
    checkpoint_function = layer._gradient_checkpointing_func
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = torch_offload.apply(model, mode, **({"min_bytes": 0} if mode == "all" else {}))
    assert not model.is_gradient_checkpointing
    assert model.config.use_cache is (mode != "hidden_states")
    handle.remove()
    assert model.is_gradient_checkpointing and model.config.use_cache is True
    assert layer._gradient_checkpointing_func is checkpoint_function
    assert all(m.gradient_checkpointing for m in model.model.layers)


def test_remove_leaves_checkpointing_off_when_it_was_off():
    model = _tiny_llama("cpu")
    torch_offload.apply(model).remove()
    assert not model.is_gradient_checkpointing and model.config.use_cache is False


# --- clear errors for tensors the engine cannot copy ---

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


def test_hooks_keep_tensors_they_cannot_copy(manager):
    # A saved nested tensor (strided layout, but no sizes) stays resident rather than failing the step.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parts = [torch.randn(2, 4), torch.randn(3, 4)]
        nested = torch.nested.nested_tensor(parts, requires_grad=True)
        ones = torch.nested.nested_tensor([torch.ones(2, 4), torch.ones(3, 4)])
    with pytest.warns(torch_offload.NothingOffloadedWarning, match="all 1 saved tensors were"):
        with torch_offload.offload_activations("all", min_bytes=0, manager=manager):
            y = (nested * 1).sin()  # sin saves its (nested, non-leaf) input
    y.backward(ones)
    for grad, part in zip(nested.grad.unbind(), parts):
        assert torch.equal(grad, part.cos())


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


# --- an in-place change of a checkpointed block's input, in the user's terms ---

@pytest.mark.parametrize("use_reentrant", [False, True])
def test_block_input_modified_in_place_names_what_the_user_did(use_reentrant):
    block = torch.nn.Linear(4, 4)
    h = torch.randn(2, 4, requires_grad=True) * 2  # a block input: an op output, as hidden states are
    out = torch_offload.checkpoint(block, h, use_reentrant=use_reentrant)
    with torch.no_grad():
        h.add_(1)
    with pytest.raises(RuntimeError) as error:
        out.sum().backward()
    message = str(error.value)
    assert message.startswith("torch_offload.checkpoint: a checkpointed block's input (a tensor saved for "
                              "backward, torch.float32 [2, 4] on cpu, ")
    assert "was modified in place after it was saved: it is at version 1; expected version 0 instead" in message
    # Ops the user never called are not named.
    assert "offload_save" not in message and "offload_restore" not in message


def test_raw_ops_still_name_offload_save_and_offload_restore(manager):
    x = torch.randn(8)
    handle = torch.ops.offload.offload_save(x, manager.id())
    x.mul_(2)
    x.add_(1)
    with pytest.raises(RuntimeError, match=r"^offload_restore: the tensor passed to offload_save was "
                                           r"modified in place after it was saved \(its version went from "
                                           r"0 to 2\)"):
        torch.ops.offload.offload_restore(handle, "cpu", manager.id())
