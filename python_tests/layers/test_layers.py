"""Layer (frozen-weight) offloading: frozen weights live in host memory, visit the device only while
their layer runs, and training gives the gradients of plain training, bit for bit (fp32)."""
import copy
import gc
import warnings

import pytest
import torch

import torch_offload
from python_tests.support.devices import DEVICES, cuda_only
from python_tests.support.gloo_ranks import single_rank_mesh
from python_tests.support.grads import assert_same_grads
from python_tests.support.llama import _freeze_layer_weights, _llama_step, _steps_match_plain, _tiny_llama

# Every test here runs with the C save hooks and with the Python ones (conftest.save_hooks).
pytestmark = pytest.mark.usefixtures("save_hooks")

IDS_SHAPE = (2, 32)


def _nothing_offloaded_at(record) -> list:
    """Where each NothingOffloadedWarning of `record` points (torch warns of its own too)."""
    return [w.filename for w in record if w.category is torch_offload.NothingOffloadedWarning]


def _peft():
    return pytest.importorskip("peft")


def _lora_llama(device):
    """The tiny Llama with PEFT LoRA adapters on q, v and down projections (lora_B made non-zero so
    every adapter weight gets a gradient)."""
    peft = _peft()
    model = peft.get_peft_model(
        _tiny_llama(device, dropout=0.0),
        peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"], lora_dropout=0.0),
    )
    torch.manual_seed(1)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02)
    return model


def _frozen_base_llama(device):
    return _freeze_layer_weights(_tiny_llama(device, dropout=0.0))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", [None, "hidden_states", "all"])
def test_lora_model_matches_plain_training(device, mode):
    plain = _lora_llama(device)
    ours = copy.deepcopy(plain)
    options = {"min_bytes": 0} if mode == "all" else {}
    handle = torch_offload.apply(ours, mode=mode, layer_offloading=True, **options)
    _steps_match_plain(ours, plain, device)
    stats = handle.layers.stats()
    assert stats["bytes_to_device"] > 0 and stats["live_handles"] == 3 * 9  # 7 linears, 2 norms
    for name, p in ours.named_parameters():
        if ".layers." in name and not p.requires_grad:
            assert p.device.type == "cpu", name
            assert p.is_pinned() == (device == "cuda"), name
        else:
            assert p.device.type == device, name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("checkpointing", [False, True])
def test_frozen_base_matches_plain_training(device, checkpointing):
    plain = _frozen_base_llama(device)
    ours = copy.deepcopy(plain)
    if checkpointing:  # the model's own (torch) checkpointing: the recompute needs the weights too
        for m in (ours, plain):
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    handle = torch_offload.offload_layers(ours)
    _steps_match_plain(ours, plain, device)
    assert handle.offloaded_bytes == sum(
        p.numel() * p.element_size() for n, p in plain.named_parameters() if ".layers." in n and "norm" not in n
    )


def _live_device_copies(handle):
    return [w.qualified for layer in handle.layers for w in layer.weights
            if w.source._live is not None and w.source._live() is not None]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", [None, "all"])
def test_no_weight_copy_outlives_its_use(device, mode):
    # Autograd keeps tokens, not the device copies: after forward no copy of any layer is alive
    # (the last layer's is prefetched for backward inside the manager, not held by autograd).
    # In "all" mode the activation hooks, innermost, must make the tokens.
    model = _frozen_base_llama(device)
    options = {"min_bytes": 0} if mode == "all" else {}
    handle = torch_offload.apply(model, mode, layer_offloading=True, **options).layers
    ids = torch.randint(0, 256, IDS_SHAPE, device=device)
    loss = model(input_ids=ids, labels=ids).loss
    gc.collect()
    assert _live_device_copies(handle) == []
    loss.backward()
    del loss
    gc.collect()
    assert _live_device_copies(handle) == []
    stats = handle.stats()
    if device == "cuda":
        # Forward: each layer was prefetched by the one before (the first by nobody); backward:
        # the last layer was prefetched at the end of forward, each next one by the one after it.
        assert stats["prefetch_hits"] >= 2 * len(handle.layers[0].weights) * (len(handle.layers) - 1)


@cuda_only
def test_every_restore_of_a_training_step_is_prefetched():
    # Forward: the first layer by the last backward's recompute of it, each other by the one
    # before; backward: the last layer by the end of forward, each other by the one after it. So
    # from the second step on no restore waits for a copy it started itself.
    model = _frozen_base_llama("cuda")
    handle = torch_offload.apply(model, "hidden_states", layer_offloading=True).layers
    ids = torch.randint(0, 256, IDS_SHAPE, device="cuda")
    model(input_ids=ids, labels=ids).loss.backward()
    handle.manager.synchronize()
    handle.manager.reset_stats()
    model(input_ids=ids, labels=ids).loss.backward()
    stats = handle.stats()
    assert stats["restores"] == 2 * sum(len(layer.weights) for layer in handle.layers)
    assert stats["prefetch_hits"] == stats["restores"]


def _assert_same_state(ours, plain):
    assert list(ours.state_dict()) == list(plain.state_dict())
    for (name, a), (_, b) in zip(ours.state_dict().items(), plain.state_dict().items()):
        assert torch.equal(a, b), name


# Frozen weights of _frozen_base_llama's layers: q, k, v, o, gate, up, down of 3 layers (fp32).
FROZEN_BYTES = 3 * 4 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128)
LAST_WEIGHT_BYTES = 4 * 64 * 128  # layers.2.mlp.down_proj, saved last


@pytest.mark.parametrize("tier", ["host", "disk"])
def test_weights_round_trip_through_state_dict_and_remove(tier, tmp_path):
    # With a host budget of a quarter of the weights, the rest spills to the disk tier.
    options = {"host_budget_bytes": FROZEN_BYTES // 4, "disk_dir": str(tmp_path)} if tier == "disk" else {}
    plain = _frozen_base_llama("cpu")
    ours = copy.deepcopy(plain)
    handle = torch_offload.offload_layers(ours, manager=torch_offload.OffloadManager(**options))
    assert (handle.stats()["spills"] > 0) == (tier == "disk")
    _assert_same_state(ours, plain)
    handle.remove()
    assert all("forward" not in block.__dict__ for block in ours.model.layers)
    _assert_same_state(ours, plain)
    _steps_match_plain(ours, plain, "cpu", steps=1)
    assert handle.stats()["live_handles"] == 0


def test_a_failed_disk_write_keeps_state_dict_and_remove_exact(tmp_path):
    # Only the last weight spills, and its write fails: no later save reports the error, so
    # offload_layers succeeds with that weight's data in host memory. Its parameter read as the
    # zeros of the reserved file: state_dict() and remove() gave zeros for the weight.
    manager = torch_offload.OffloadManager(host_budget_bytes=FROZEN_BYTES - LAST_WEIGHT_BYTES,
                                           disk_dir=str(tmp_path))
    plain = _frozen_base_llama("cpu")
    ours = copy.deepcopy(plain)
    manager._simulate_full_disk(True)
    handle = torch_offload.offload_layers(ours, manager=manager)
    assert handle.stats()["spills"] == 1
    _assert_same_state(ours, plain)
    handle.remove()
    manager._simulate_full_disk(False)
    _assert_same_state(ours, plain)
    _steps_match_plain(ours, plain, "cpu", steps=1)


def test_frozen_weight_modified_in_place_is_an_error():
    model = _frozen_base_llama("cpu")
    torch_offload.offload_layers(model)
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight.mul_(2)
    ids = torch.randint(0, 256, IDS_SHAPE)
    with pytest.raises(RuntimeError, match=r"model\.layers\.1\.mlp\.up_proj\.weight was modified in place"):
        model(input_ids=ids, labels=ids)


def test_frozen_weight_modified_during_forward_is_an_error():
    model = _frozen_base_llama("cpu")
    torch_offload.offload_layers(model)
    layer = model.model.layers[0]

    def zero_down_proj(module, args):
        with torch.no_grad():
            module.down_proj.weight.zero_()

    hook = layer.mlp.register_forward_pre_hook(zero_down_proj)
    ids = torch.randint(0, 256, IDS_SHAPE)
    with pytest.raises(RuntimeError, match="modified in place during the forward"):
        model(input_ids=ids, labels=ids)
    hook.remove()
    assert model.model.layers[0].mlp.down_proj.weight.abs().sum() > 0, "the host weight was kept"


def test_requires_grad_change_after_wrapping_is_an_error():
    model = _frozen_base_llama("cpu")
    torch_offload.offload_layers(model)
    model.model.layers[2].self_attn.o_proj.weight.requires_grad_(True)
    ids = torch.randint(0, 256, IDS_SHAPE)
    with pytest.raises(RuntimeError, match="requires_grad or the parameter set"):
        model(input_ids=ids, labels=ids)


def test_replaced_weight_is_an_error():
    model = _frozen_base_llama("cpu")
    torch_offload.offload_layers(model)
    weight = model.model.layers[0].self_attn.q_proj.weight
    weight.data = weight.data.clone()
    ids = torch.randint(0, 256, IDS_SHAPE)
    with pytest.raises(RuntimeError, match="moved or replaced"):
        model(input_ids=ids, labels=ids)


def test_not_enough_host_memory_leaves_the_model_unchanged(monkeypatch):
    model = _frozen_base_llama("cpu")
    before = {n: p.data_ptr() for n, p in model.named_parameters()}
    monkeypatch.setattr(torch_offload.layers.frozen_weights, "available_host_bytes", lambda: 1 << 10)
    with pytest.raises(RuntimeError, match="need .* GiB of host memory, but only"):
        torch_offload.offload_layers(model)
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == before
    assert all("forward" not in block.__dict__ for block in model.model.layers)


def test_host_budget_exceeded_leaves_the_model_unchanged():
    model = _frozen_base_llama("cpu")
    before = {n: p.data_ptr() for n, p in model.named_parameters()}
    with pytest.raises(RuntimeError, match="host_budget_bytes"):
        torch_offload.offload_layers(model, host_budget_bytes=64 << 10)
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == before
    plain = _frozen_base_llama("cpu")
    _steps_match_plain(model, plain, "cpu", steps=1)


def test_blocks_without_frozen_weights_warn_that_nothing_is_offloaded():
    # Every parameter trains: layer offloading has nothing to move, and says so where it is asked for.
    model = _tiny_llama("cpu", dropout=0.0)
    expected = (r"^torch_offload.offload_layers: nothing to offload: no frozen parameter in the 3 blocks "
                r"\(LlamaDecoderLayer\): all 27 of their parameters require grad\. Layer offloading moves frozen "
                r"weights .*freeze the base or turn layer offloading off")
    with pytest.warns(torch_offload.NothingOffloadedWarning, match=expected) as record:
        layers = torch_offload.offload_layers(model)
    assert _nothing_offloaded_at(record) == [__file__]  # the caller's line, not ours
    assert layers.offloaded_bytes == 0
    layers.remove()
    with pytest.warns(torch_offload.NothingOffloadedWarning, match="no frozen parameter in the 3 blocks") as record:
        handle = torch_offload.apply(model, None, layer_offloading=True)
    assert _nothing_offloaded_at(record) == [__file__]
    handle.remove()
    with pytest.warns(torch_offload.NothingOffloadedWarning, match=r"in the 1 blocks \(Linear\)"):
        torch_offload.offload_layers(model, [model.lm_head]).remove()
    # One frozen weight is enough: no warning.
    model.model.layers[1].mlp.up_proj.weight.requires_grad_(False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch_offload.NothingOffloadedWarning)
        layers = torch_offload.offload_layers(model)
    assert layers.offloaded_bytes == model.model.layers[1].mlp.up_proj.weight.numel() * 4
    layers.remove()


def test_wrapping_order_is_checked():
    model = _frozen_base_llama("cpu")
    handle = torch_offload.apply(model, "hidden_states")
    with pytest.raises(ValueError, match="call offload_layers first"):
        torch_offload.offload_layers(model)
    handle.remove()
    layers = torch_offload.offload_layers(model)
    with pytest.raises(ValueError, match="already offloaded"):
        torch_offload.offload_layers(model)
    # apply() after offload_layers goes around the weight wrapper, so it still works.
    handle = torch_offload.apply(model, "hidden_states")
    _steps_match_plain(model, _frozen_base_llama("cpu"), "cpu", steps=1)
    handle.remove()
    layers.remove()


def test_users_saved_tensor_hooks_still_get_the_activations():
    # offload_layers' own hooks hand every tensor that is not an offloaded weight to the hooks that
    # were active around the model call (here a counting pair standing in for save_on_cpu).
    plain = _frozen_base_llama("cpu")
    ours = copy.deepcopy(plain)
    handle = torch_offload.offload_layers(ours)
    seen = []

    def pack(t):
        is_weight = t.untyped_storage().data_ptr() in torch_offload.hooks.weight_tokens._installed
        seen.append(is_weight)
        return t.clone()

    ids = torch.randint(0, 256, IDS_SHAPE)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = _llama_step(ours, ids, "cpu")
    assert torch.equal(loss, _llama_step(plain, ids, "cpu"))
    assert_same_grads(ours, plain)
    assert len(seen) > 10 and not any(seen), "weights reached the user's hooks"
    assert handle.stats()["restores"] > 0


def test_exception_inside_a_layer_puts_the_host_weights_back():
    model = _frozen_base_llama("cpu")
    torch_offload.offload_layers(model)
    host_weight = model.model.layers[1].mlp.gate_proj.weight

    def fail(module, args):
        raise ValueError("boom")

    hook = model.model.layers[1].mlp.register_forward_pre_hook(fail)
    ids = torch.randint(0, 256, IDS_SHAPE)
    with pytest.raises(ValueError, match="boom"):
        model(input_ids=ids, labels=ids)
    hook.remove()
    assert model.model.layers[1].mlp.gate_proj.weight is host_weight
    assert not torch_offload.hooks.weight_tokens._installed
    _steps_match_plain(model, _frozen_base_llama("cpu"), "cpu", steps=1)


def test_inference_and_retained_graphs():
    plain = _frozen_base_llama("cpu")
    ours = copy.deepcopy(plain)
    torch_offload.offload_layers(ours)
    ids = torch.randint(0, 256, IDS_SHAPE)
    with torch.no_grad():
        assert torch.equal(ours.eval()(input_ids=ids).logits, plain.eval()(input_ids=ids).logits)
    ours.train(), plain.train()
    # backward twice over one graph: the weight tokens are fetched again the second time
    for m in (ours, plain):
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward(retain_graph=True)
        loss.backward()
    assert_same_grads(ours, plain)


def _wide_frozen_llama(device):
    """Layers whose weights (12.6 MB each in fp32) dwarf the activations of a short sequence."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=512, intermediate_size=1536, num_hidden_layers=6,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=64,
                         attn_implementation="sdpa", use_cache=False)
    return _freeze_layer_weights(LlamaForCausalLM(config).to(device).train())


def _step_peak_bytes(model, ids):
    """Peak allocated above the pre-step level during one training step (after a warm-up)."""
    for measured in (False, True):
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        model(input_ids=ids, labels=ids).loss.backward()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - start
        model.zero_grad(set_to_none=True)
    return peak


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("checkpointing", [False, True])
def test_cuda_holds_only_a_few_layers_of_frozen_weights(checkpointing):
    plain = _wide_frozen_llama("cuda")
    ours = copy.deepcopy(plain)
    layer_bytes = sum(p.numel() * p.element_size() for p in plain.model.layers[0].parameters()
                      if not p.requires_grad)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    handle = torch_offload.apply(ours, "hidden_states" if checkpointing else None, layer_offloading=True)
    torch.cuda.synchronize()
    assert before - torch.cuda.memory_allocated() >= handle.layers.offloaded_bytes == 6 * layer_bytes
    if checkpointing:
        torch_offload.apply(plain, "hidden_states")
    ids = torch.randint(0, 256, (1, 16), device="cuda")
    plain_peak, ours_peak = _step_peak_bytes(plain, ids), _step_peak_bytes(ours, ids)
    # The installed layer, the next one prefetched, and the last layer prefetched for backward.
    assert ours_peak <= plain_peak + 3 * layer_bytes + layer_bytes // 4, (ours_peak, plain_peak, layer_bytes)
    assert handle.layers.stats()["prefetch_hits"] > 0


def test_fsdp2_sharded_layers_are_refused_with_a_clear_error():
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    with single_rank_mesh():
        model = _frozen_base_llama("cpu")
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        with pytest.raises(ValueError, match=r"offload_layers: parameter .* is a DTensor .*CPUOffloadPolicy"):
            torch_offload.apply(model, "hidden_states", layer_offloading=True)
        # Nothing changed: the model still trains under FSDP2.
        assert all(isinstance(p, DTensor) for p in model.parameters())
        ids = torch.randint(0, 256, IDS_SHAPE)
        model(input_ids=ids, labels=ids).loss.backward()


def test_fully_shard_after_offload_layers_is_a_clear_error():
    from torch.distributed.fsdp import fully_shard

    with single_rank_mesh():
        model = _frozen_base_llama("cpu")
        torch_offload.offload_layers(model)
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        ids = torch.randint(0, 256, IDS_SHAPE)
        with pytest.raises(RuntimeError, match=r"replaced in its module .*fully_shard.*CPUOffloadPolicy"):
            model(input_ids=ids, labels=ids)
