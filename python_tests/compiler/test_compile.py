"""Offloading inside torch.compile graphs: fullgraph, no graph breaks, our ops in the forward and
backward graphs, gradients equal to eager."""
import contextlib
import copy
import warnings

import pytest
import torch
import torch._dynamo

import torch_offload
from python_tests.support.compiled_graphs import BOUNDARY_BYTES, _check_graphs, _targets, _two_steps_bit_equal
from python_tests.support.devices import DEVICES
from python_tests.support.llama import _deterministic_attention, _tiny_llama

# The tests inspect the graphs our partitioner rewrites (conftest.fresh_dynamo).
pytestmark = pytest.mark.usefixtures("fresh_dynamo")


@contextlib.contextmanager
def _deterministic_algorithms():
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def _nothing_offloaded_at(record) -> list:
    """Where each NothingOffloadedWarning of `record` points (torch warns of its own too)."""
    return [w.filename for w in record if w.category is torch_offload.NothingOffloadedWarning]


# As support/compiled_graphs.py's, but here: a warning points at the line that ran the step, which
# test_min_bytes_keeps_small_tensors_resident_and_says_so_once expects in this file.
def _grads(model, ids, device):
    model.zero_grad(set_to_none=True)
    with _deterministic_attention(device):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["hidden_states", "all"])
def test_compiled_matches_eager_bit_for_bit(device, mode):
    # aot_eager runs the same partitioned, rewritten graphs with eager kernels: any difference from
    # eager would come from our rewrite.
    base = _tiny_llama(device, dropout=0.0)
    eager = copy.deepcopy(base)
    eager.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    compiled = torch_offload.compile(copy.deepcopy(base), mode, fullgraph=True, backend="aot_eager",
                                     **({"min_bytes": BOUNDARY_BYTES} if mode == "all" else {}))
    _two_steps_bit_equal(eager, compiled, device)
    partitioner = compiled.offload_partitioner
    # hidden_states: the 3 layer inputs (the first is the embedding output); on CUDA also the causal
    # mask that the math SDPA kernel (chosen for deterministic gradients) builds in the graph: every
    # layer's recompute takes it, so it is a checkpoint input too, offloaded whatever its size.
    _check_graphs(partitioner, expect_boundaries=3 if mode == "hidden_states" else None,
                  also=("where",) if device == "cuda" else ())
    stats = partitioner.manager.stats()
    per_step = len(partitioner.offloaded[0])
    assert stats["saves"] == stats["restores"] == 2 * per_step
    assert stats["live_handles"] == 0


@pytest.mark.parametrize("device", DEVICES)
def test_inductor_hidden_states_matches_compiled_checkpointing(device):
    # Inductor fuses differently around the extern restore kernel, so the comparison with torch's
    # compiled checkpointing is to float32 rounding, not to the bit.
    base = _tiny_llama(device, dropout=0.0)
    reference = copy.deepcopy(base)
    reference.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    reference = torch.compile(reference, fullgraph=True)
    compiled = torch_offload.compile(copy.deepcopy(base), "hidden_states", fullgraph=True)
    ids = torch.randint(0, 256, (2, 32), device=device)
    loss_r, grads_r = _grads(reference, ids, device)
    loss_c, grads_c = _grads(compiled, ids, device)
    torch.testing.assert_close(loss_c, loss_r, rtol=1e-6, atol=1e-6)
    for a, b in zip(grads_c, grads_r):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch._dynamo.utils.counters["graph_break"]
    # Inductor's graphs on CUDA also save a materialised constant (a mask) that feeds the recompute;
    # it is a checkpoint input too, offloaded whatever its size. The three layer inputs always are.
    _check_graphs(compiled.offload_partitioner)
    offloaded = compiled.offload_partitioner.offloaded[0]
    assert "embedding" in offloaded and sum(name.startswith("add") for name in offloaded) == 2
    assert compiled.offload_partitioner.manager.stats()["bytes_to_host"] >= 3 * BOUNDARY_BYTES


def test_min_bytes_keeps_small_tensors_resident_and_says_so_once():
    base = _tiny_llama("cpu", dropout=0.0)
    compiled = torch_offload.compile(base, "all", min_bytes=1 << 30, backend="aot_eager")
    ids = torch.randint(0, 256, (1, 16))
    with pytest.warns(torch_offload.NothingOffloadedWarning,
                      match=r"^torch_offload.compile\(mode='all'\): the compiled graphs offload nothing: \d+ saved "
                            r"tensors were under min_bytes=1073741824 \(the largest: \d+ bytes\); pass a smaller "
                            r"min_bytes") as record:
        _grads(compiled, ids, "cpu")
    assert _nothing_offloaded_at(record) == [__file__]  # the line that ran the step
    assert compiled.offload_partitioner.offloaded == [[]]
    assert compiled.offload_partitioner.manager.stats()["saves"] == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch_offload.NothingOffloadedWarning)
        _grads(compiled, ids, "cpu")  # once


def test_hidden_states_without_checkpointed_blocks_says_nothing_is_offloaded():
    # blocks=[]: nothing runs under checkpointing, so no saved value is a checkpoint input.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    compiled = torch_offload.compile(model, "hidden_states", blocks=[], backend="aot_eager")
    with pytest.warns(torch_offload.NothingOffloadedWarning,
                      match=r"mode='hidden_states'\): the compiled graphs offload nothing: no saved tensor is a "
                            r"checkpoint input \(1 saved tensor feeds no recomputed region\): the blocks did not run "
                            r"under gradient checkpointing.*; 2 saved tensors are graph inputs \(parameters"):
        compiled(torch.randn(2, 8)).sum().backward()


def test_hidden_states_offloads_every_checkpoint_input_whatever_its_size_as_eager():
    # 16 KiB layer boundaries, under the 1 MiB that compile() used to apply to every mode: eager
    # hidden_states offloads each block input whatever its size, and so does the compiled mode.
    base = _tiny_llama("cpu", dropout=0.0)
    eager = copy.deepcopy(base)
    handle = torch_offload.apply(eager, "hidden_states")
    ids = torch.randint(0, 256, (2, 32))
    _grads(eager, ids, "cpu")
    compiled = torch_offload.compile(copy.deepcopy(base), "hidden_states", backend="aot_eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch_offload.NothingOffloadedWarning)
        _grads(compiled, ids, "cpu")
    offloaded = compiled.offload_partitioner.offloaded
    assert len(offloaded) == 1 and sorted(offloaded[0]) == ["add_14", "add_8", "embedding"], offloaded
    assert compiled.offload_partitioner.manager.stats()["saves"] == handle.stats()["saves"] == 3


def test_min_bytes_follows_the_eager_modes():
    from torch_offload.modes import ActivationsOptions, SelectiveOptions

    with pytest.raises(TypeError, match=r"^torch_offload.compile\(mode='hidden_states'\) got an unexpected keyword "
                                        r"argument 'min_bytes' \(mode='hidden_states' offloads every checkpoint "
                                        r"input whatever its size; min_bytes is for modes 'selective' and 'all'\)"):
        torch_offload.compile(torch.nn.Linear(2, 2), "hidden_states", min_bytes=0)
    with pytest.raises(TypeError, match=r"^torch_offload.OffloadPartitioner\(mode='hidden_states'\) got an "
                                        r"unexpected keyword argument 'min_bytes'"):
        torch_offload.OffloadPartitioner(torch_offload.OffloadManager(), "hidden_states", 1 << 20)
    with pytest.raises(ValueError, match=r"compile\(mode='all'\): min_bytes=-1; expected an int >= 0"):
        torch_offload.compile(torch.nn.Linear(2, 2), "all", min_bytes=-1)
    # The defaults are the eager modes' own.
    manager = torch_offload.OffloadManager()
    assert torch_offload.OffloadPartitioner(manager, "selective").min_bytes == SelectiveOptions().min_bytes == 64 << 10
    assert torch_offload.OffloadPartitioner(manager, "all").min_bytes == ActivationsOptions().min_bytes == 1 << 20


def test_unknown_mode_and_backend_are_errors():
    with pytest.raises(ValueError, match="unknown mode 'disk'"):
        torch_offload.compile(torch.nn.Linear(2, 2), "disk")
    with pytest.raises(ValueError, match="backend must be"):
        torch_offload.compile(torch.nn.Linear(2, 2), "all", backend="cudagraphs")


def test_cache_hit_still_offloads(tmp_path, monkeypatch):
    # A second process compiling the same model loads the graphs from inductor's cache and skips the
    # partitioner; the cached graphs must still call our ops (the manager id is in the cache key).
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    # Inductor's CPU code for the embedding's backward adds token rows into the weight's gradient
    # with atomic adds from its OpenMP threads: where a token occurs three times or more the sum's
    # order, so its last bits, differ from run to run, in one compiled model as much as between
    # two. Under torch's deterministic mode inductor calls aten's index_put_ there instead, and the
    # equality below is exact.
    base = _tiny_llama("cpu", dropout=0.0)
    manager = torch_offload.OffloadManager()
    ids = torch.randint(0, 256, (2, 32))
    with torch.compiler.config.patch(force_disable_caches=False), _deterministic_algorithms():
        first = torch_offload.compile(copy.deepcopy(base), "hidden_states", manager=manager,
                                      fullgraph=True)
        loss_first, grads_first = _grads(first, ids, "cpu")
        assert first.offload_partitioner.graphs, "the first compile must partition"
        torch._dynamo.reset()
        manager.reset_stats()
        second = torch_offload.compile(copy.deepcopy(base), "hidden_states", manager=manager, fullgraph=True)
        loss_second, grads_second = _grads(second, ids, "cpu")
    assert not second.offload_partitioner.graphs, "expected the graphs to come from the cache"
    stats = manager.stats()
    assert stats["saves"] == stats["restores"] == 3, stats
    assert torch.equal(loss_second, loss_first)
    for a, b in zip(grads_second, grads_first):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", ["cpu"])
def test_selective_offloads_attention_outputs_bit_for_bit(device):
    # Reference: torch's selective checkpointing that keeps the attention outputs on the device.
    # Ours: the same outputs saved, but offloaded; the backward graph must not recompute attention.
    # CPU only: bit-exactness on CUDA needs the math SDPA, which decomposes before any policy sees
    # an attention op (the GPU benchmark checks the fused kernels' path).
    import functools

    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    base = _tiny_llama(device, dropout=0.0)
    eager = copy.deepcopy(base)
    eager.gradient_checkpointing_enable(gradient_checkpointing_kwargs={
        "use_reentrant": False,
        "context_fn": functools.partial(create_selective_checkpoint_contexts, torch_offload.policies.attention_save)})
    compiled = torch_offload.compile(copy.deepcopy(base), "selective", min_bytes=BOUNDARY_BYTES,
                                     fullgraph=True, backend="aot_eager")
    _two_steps_bit_equal(eager, compiled, device)
    partitioner = compiled.offload_partitioner
    _check_graphs(partitioner)
    offloaded = partitioner.offloaded[0]
    # 3 layer inputs + each layer's attention output (its logsumexp is under min_bytes here).
    assert len(offloaded) == 6, offloaded
    from torch_offload.policies import ATTENTION_OPS
    _, bwd = partitioner.graphs[0]
    assert not any(t in ATTENTION_OPS for t in _targets(bwd)), "attention recomputed in backward"


def test_selective_policy_errors_and_custom_function():
    with pytest.raises(ValueError, match="unknown policy='mlp'"):
        torch_offload.compile(_tiny_llama("cpu"), "selective", policy="mlp")
    compiled = torch_offload.compile(_tiny_llama("cpu", dropout=0.0), "selective",
                                     policy=torch_offload.policies.attention,
                                     min_bytes=BOUNDARY_BYTES, backend="aot_eager")
    _grads(compiled, torch.randint(0, 256, (2, 32)), "cpu")
    assert len(compiled.offload_partitioner.offloaded[0]) == 6


def test_cuda_graphs_are_refused_with_the_setting_named():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="compile_mode='reduce-overhead'.*CUDA graphs"):
        torch_offload.compile(model, "all", compile_mode="reduce-overhead")
    with pytest.raises(ValueError, match="triton.cudagraphs"):
        torch_offload.compile(model, "all", options={"triton.cudagraphs": True})
    with pytest.raises(ValueError, match="compile_mode is for backend='inductor'"):
        torch_offload.compile(model, "all", compile_mode="max-autotune", backend="aot_eager")


def test_compile_mode_options_reach_inductor():
    from torch_offload.compiler.compile_model import _inductor_options

    merged = _inductor_options("max-autotune-no-cudagraphs", {"epilogue_fusion": False}, "inductor")
    assert merged["max_autotune"] and merged["epilogue_fusion"] is False
    assert not merged.get("triton.cudagraphs")
    # Our graphs free each buffer at its last use unless the user asks for inductor's reuse.
    assert merged["allow_buffer_reuse"] is False
    assert _inductor_options(None, {"allow_buffer_reuse": True}, "inductor")["allow_buffer_reuse"] is True


def test_dynamic_shapes_one_compile_serves_several_lengths():
    base = _tiny_llama("cpu", dropout=0.0)
    eager = copy.deepcopy(base)
    eager.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    compiled = torch_offload.compile(copy.deepcopy(base), "hidden_states",
                                     fullgraph=True, dynamic=True, backend="aot_eager")
    for seq in (32, 48, 40):
        ids = torch.randint(0, 256, (2, seq))
        loss_e, grads_e = _grads(eager, ids, "cpu")
        loss_c, grads_c = _grads(compiled, ids, "cpu")
        torch.testing.assert_close(loss_c, loss_e, rtol=0, atol=0)
        for a, b in zip(grads_c, grads_e):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    partitioner = compiled.offload_partitioner
    assert len(partitioner.graphs) == 1, "expected one dynamic compile for all lengths"
    assert sum(name.startswith("add") or name == "embedding" for name in partitioner.offloaded[0]) >= 3
    stats = partitioner.manager.stats()
    assert stats["saves"] == stats["restores"] > 0 and stats["live_handles"] == 0


def _checkpointing_state(model):
    return {name: (m.__dict__.get("gradient_checkpointing"), m.__dict__.get("_gradient_checkpointing_func"))
            for name, m in model.named_modules()}


def test_offload_changes_remove_puts_a_hugging_face_model_back():
    model = _tiny_llama("cpu", dropout=0.0)
    model.config.use_cache = True
    before = _checkpointing_state(model)
    embedding_hooks = dict(model.model.embed_tokens._forward_hooks)
    compiled = torch_offload.compile(model, "hidden_states", sdpa_is_causal=True, detach_logits=True,
                                     backend="aot_eager")
    # What compile() changes on the caller's model.
    assert model.is_gradient_checkpointing and model.config.use_cache is False
    assert model.config._attn_implementation == "torch_offload_sdpa" and "forward" in model.__dict__
    assert model._forward_pre_hooks and model._forward_hooks
    assert len(model.model.embed_tokens._forward_hooks) > len(embedding_hooks)  # enable_input_require_grads
    compiled.offload_changes.remove()
    assert _checkpointing_state(model) == before and not model.is_gradient_checkpointing
    assert model.config.use_cache is True and model.config._attn_implementation == "sdpa"
    assert "forward" not in model.__dict__ and not model._forward_pre_hooks and not model._forward_hooks
    assert dict(model.model.embed_tokens._forward_hooks) == embedding_hooks
    assert "_require_grads_hooks" not in model.__dict__ and "_require_grads_hook" not in model.__dict__
    compiled.offload_changes.remove()  # a second remove() changes nothing
    # The model trains as one compile() never touched.
    ids = torch.randint(0, 256, (2, 32))
    loss, grads = _grads(model, ids, "cpu")
    loss_plain, grads_plain = _grads(_tiny_llama("cpu", dropout=0.0), ids, "cpu")
    assert torch.equal(loss, loss_plain) and all(torch.equal(a, b) for a, b in zip(grads, grads_plain))


def test_offload_changes_remove_keeps_the_checkpointing_the_model_had():
    model = _tiny_llama("cpu", dropout=0.0)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    before = _checkpointing_state(model)
    hooks_before = list(model._require_grads_hooks)
    compiled = torch_offload.compile(model, "selective", backend="aot_eager")
    assert model.model.layers[0]._gradient_checkpointing_func is not before["model.layers.0"][1]
    compiled.offload_changes.remove()
    assert _checkpointing_state(model) == before and model.is_gradient_checkpointing
    assert model._require_grads_hooks == hooks_before
    assert len(model.model.embed_tokens._forward_hooks) == len(hooks_before)


def test_offload_changes_remove_unwraps_the_blocks():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8))
    own_forward = model[2].forward  # a forward of the block's own (an instance attribute) stays
    model[2].forward = own_forward
    compiled = torch_offload.compile(model, "hidden_states", blocks=[model[0], model[2]], backend="aot_eager")
    assert model[0].__dict__["forward"] is not None and model[2].__dict__["forward"] is not own_forward
    compiled.offload_changes.remove()
    assert "forward" not in model[0].__dict__ and model[2].__dict__["forward"] is own_forward
