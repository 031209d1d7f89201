"""Offloading inside torch.compile graphs: fullgraph, no graph breaks, our ops in the forward and
backward graphs, gradients equal to eager."""
import copy

import pytest
import torch
import torch._dynamo

import torch_offload
from conftest import DEVICES
from test_models import _deterministic_attention, _tiny_llama

# One layer boundary of the tiny Llama at batch 2 x 32 tokens (fp32): the size threshold that keeps
# smaller checkpoint inputs (the attention mask on CUDA, scalars) resident.
BOUNDARY_BYTES = 2 * 32 * 64 * 4
_SAVE = torch.ops.offload.offload_save.default
_RESTORE = torch.ops.offload.offload_restore.default


@pytest.fixture(autouse=True)
def fresh_dynamo():
    # The tests inspect the graphs our partitioner rewrites, so it must run: with inductor's and
    # AOTAutograd's on-disk caches on, a graph compiled by an earlier pytest run is loaded instead
    # (test_cache_hit_still_offloads covers that path).
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with torch.compiler.config.patch(force_disable_caches=True):
        yield
    torch._dynamo.reset()


def _grads(model, ids, device):
    model.zero_grad(set_to_none=True)
    with _deterministic_attention(device):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def _two_steps_bit_equal(eager, compiled, device):
    """Two training steps of each: losses and gradients equal bit for bit, no graph break."""
    ids = torch.randint(0, 256, (2, 32), device=device)
    for _ in range(2):
        loss_e, grads_e = _grads(eager, ids, device)
        loss_c, grads_c = _grads(compiled, ids, device)
        assert torch.equal(loss_e, loss_c)
        assert all(torch.equal(a, b) for a, b in zip(grads_e, grads_c))
    assert not torch._dynamo.utils.counters["graph_break"]


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _check_graphs(partitioner, expect_boundaries=None):
    assert partitioner.graphs, "the partitioner never ran"
    for (fwd, bwd), names in zip(partitioner.graphs, partitioner.offloaded):
        assert _targets(fwd).count(_SAVE) == len(names) > 0
        assert _targets(bwd).count(_RESTORE) == len(names)
        assert _SAVE not in _targets(bwd) and _RESTORE not in _targets(fwd)
        if expect_boundaries is not None:
            assert len(names) == expect_boundaries, names


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["hidden_states", "all"])
def test_compiled_matches_eager_bit_for_bit(device, mode):
    # aot_eager runs the same partitioned, rewritten graphs with eager kernels: any difference from
    # eager would come from our rewrite.
    base = _tiny_llama(device, dropout=0.0)
    eager = copy.deepcopy(base)
    eager.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    compiled = torch_offload.compile(copy.deepcopy(base), mode, min_bytes=BOUNDARY_BYTES,
                                     fullgraph=True, backend="aot_eager")
    _two_steps_bit_equal(eager, compiled, device)
    partitioner = compiled.offload_partitioner
    # hidden_states: the 3 layer inputs (the first is the embedding output) and nothing else.
    _check_graphs(partitioner, expect_boundaries=3 if mode == "hidden_states" else None)
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
    compiled = torch_offload.compile(copy.deepcopy(base), "hidden_states", min_bytes=BOUNDARY_BYTES,
                                     fullgraph=True)
    ids = torch.randint(0, 256, (2, 32), device=device)
    loss_r, grads_r = _grads(reference, ids, device)
    loss_c, grads_c = _grads(compiled, ids, device)
    torch.testing.assert_close(loss_c, loss_r, rtol=1e-6, atol=1e-6)
    for a, b in zip(grads_c, grads_r):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch._dynamo.utils.counters["graph_break"]
    # Inductor's graphs on CUDA also save a materialised constant (a mask) that feeds the recompute;
    # it is offloaded too once it is over the threshold. The three layer inputs always are.
    _check_graphs(compiled.offload_partitioner)
    offloaded = compiled.offload_partitioner.offloaded[0]
    assert "embedding" in offloaded and sum(name.startswith("add") for name in offloaded) == 2
    assert compiled.offload_partitioner.manager.stats()["bytes_to_host"] >= 3 * BOUNDARY_BYTES


def test_min_bytes_keeps_small_tensors_resident():
    base = _tiny_llama("cpu", dropout=0.0)
    compiled = torch_offload.compile(base, "all", min_bytes=1 << 30, backend="aot_eager")
    ids = torch.randint(0, 256, (1, 16))
    _grads(compiled, ids, "cpu")
    assert compiled.offload_partitioner.offloaded == [[]]
    assert compiled.offload_partitioner.manager.stats()["saves"] == 0


def test_unknown_mode_and_backend_are_errors():
    with pytest.raises(ValueError, match="unknown mode 'disk'"):
        torch_offload.compile(torch.nn.Linear(2, 2), "disk")
    with pytest.raises(ValueError, match="backend must be"):
        torch_offload.compile(torch.nn.Linear(2, 2), "all", backend="cudagraphs")


def test_cache_hit_still_offloads(tmp_path, monkeypatch):
    # A second process compiling the same model loads the graphs from inductor's cache and skips the
    # partitioner; the cached graphs must still call our ops (the manager id is in the cache key).
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    base = _tiny_llama("cpu", dropout=0.0)
    manager = torch_offload.OffloadManager()
    ids = torch.randint(0, 256, (2, 32))
    with torch.compiler.config.patch(force_disable_caches=False):
        first = torch_offload.compile(copy.deepcopy(base), "hidden_states", manager=manager,
                                      min_bytes=BOUNDARY_BYTES, fullgraph=True)
        loss_first, grads_first = _grads(first, ids, "cpu")
        assert first.offload_partitioner.graphs, "the first compile must partition"
        torch._dynamo.reset()
        manager.reset_stats()
        second = torch_offload.compile(copy.deepcopy(base), "hidden_states", manager=manager,
                                       min_bytes=BOUNDARY_BYTES, fullgraph=True)
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
    compiled = torch_offload.compile(copy.deepcopy(base), "hidden_states", min_bytes=0,
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
