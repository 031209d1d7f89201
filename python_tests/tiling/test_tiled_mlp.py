"""Sequence-tiled MLPs (torch_offload.tile_mlp, tiled_compute): the same training as untiled, every
gradient bit-equal but the tiled modules' parameters', which are sums over tiles (bounded here), inside
every checkpointing mode and with LoRA adapters; the memory a tile saves; clear errors."""
import copy

import pytest
import torch
from torch import nn

import torch_offload
from python_tests.support.devices import DEVICES
from python_tests.support.llama import _tiny_llama
from python_tests.support.tiled_training import TILE_SUM_RTOL, _assert_same_training, _step


def _mlp_names(model):
    return [name + "." for name, module in model.named_modules() if name.endswith(".mlp")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", [None, "hidden_states", "selective", "all"])
def test_tiled_mlp_trains_like_the_untiled_model(device, mode):
    base = _tiny_llama(device, 0.0)
    ids = torch.randint(0, 256, (2, 300), device=device)
    reference = copy.deepcopy(base)
    if mode not in (None, "all"):
        reference.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ours = copy.deepcopy(base)
    handle = torch_offload.apply(ours, mode, min_bytes=0) if mode == "all" else (
        torch_offload.apply(ours, mode) if mode else None)
    tiles = torch_offload.tile_mlp(ours, tile_tokens=128)  # 3 tiles of 300 tokens
    assert len(tiles.mlps) == len(ours.model.layers)
    _assert_same_training(_step(reference, ids), _step(ours, ids), _mlp_names(ours))
    tiles.remove()
    if handle is not None:
        handle.remove()
    assert all("forward" not in layer.mlp.__dict__ for layer in ours.model.layers)


def test_lora_adapters_on_the_projections_train_tiled():
    peft = pytest.importorskip("peft")
    base = _tiny_llama("cpu", 0.0)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["gate_proj", "up_proj", "down_proj", "q_proj"],
                             init_lora_weights=False)  # B not zero: every adapter gets a gradient
    reference = peft.get_peft_model(copy.deepcopy(base), config)
    ours = copy.deepcopy(reference)
    torch_offload.apply(ours, "hidden_states")
    reference.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    reference.enable_input_require_grads()
    torch_offload.tile_mlp(ours, tile_tokens=100)
    ids = torch.randint(0, 256, (1, 260))
    ref, got = _step(reference, ids), _step(ours, ids)
    assert got[1] and all("lora_" in name for name in got[1])  # only the adapters train
    _assert_same_training(ref, got, [n + "." for n, m in ours.named_modules() if n.endswith(".mlp")])


def test_tiled_compute_on_its_own():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))
    x = torch.randn(3, 50, 16, requires_grad=True)
    out = torch_offload.tiled_compute(mlp, x, tile_tokens=7, params=list(mlp.parameters()))
    expected = mlp(x)
    # A tile's rows are computed as the whole's but by a product of another size, whose kernel may
    # block its sums differently: equal to rounding.
    torch.testing.assert_close(out, expected, rtol=TILE_SUM_RTOL, atol=1e-7)
    grad = torch.randn_like(out)
    mine = torch.autograd.grad(out, [x, *mlp.parameters()], grad)
    theirs = torch.autograd.grad(expected, [x, *mlp.parameters()], grad)
    for a, b in zip(mine, theirs):
        assert ((a - b).norm() / b.norm()).item() <= TILE_SUM_RTOL
    with torch.no_grad():  # nothing to differentiate: tiles one after another, the same output
        assert torch.equal(torch_offload.tiled_compute(mlp, x, tile_tokens=7), out.detach())


def test_a_tile_saves_only_the_input():
    mlp = nn.Sequential(nn.Linear(32, 512), nn.GELU(), nn.Linear(512, 32))
    x = torch.randn(1, 1000, 32, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        torch_offload.tiled_compute(mlp, x, tile_tokens=100, params=list(mlp.parameters())).sum().backward()
    # x and the parameters, nothing of width 512 per token; untiled, the intermediates are saved.
    assert max(saved) < 1000 * 512
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        mlp(x).sum()
    assert max(saved) == 1000 * 512


def test_default_tile_keeps_a_tiles_intermediates_within_the_input():
    tile = torch_offload.tiling.sequence_tiles.default_tile_tokens(524288, 4096, 14336)
    assert 3 * tile * 14336 <= 524288 * 4096 and tile >= 1024
    assert torch_offload.tiling.sequence_tiles.default_tile_tokens(1000, 64, 128) == 1000  # one tile
    assert torch_offload.tiling.sequence_tiles.default_tile_tokens(3000, 64, 128) == 1000  # equal tiles


def test_errors_name_the_argument():
    model = _tiny_llama("cpu", 0.0)
    with pytest.raises(ValueError, match="tile_tokens=0"):
        torch_offload.tile_mlp(model, tile_tokens=0)
    handle = torch_offload.tile_mlp(model)
    with pytest.raises(ValueError, match="tiled already"):
        torch_offload.tile_mlp(model)
    handle.remove()
    with pytest.raises(ValueError, match="tile_tokens=-1"):
        torch_offload.tiled_compute(nn.Identity(), torch.randn(2, 3), tile_tokens=-1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["hidden_states", "all"])
def test_lora_with_layer_offloading_trains_tiled(device, mode):
    # The frozen base lives in host memory and is on the device only while a block runs: each tile's
    # backward computes with the weights of its forward, fetched again as a Linear's saved weight is.
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["gate_proj", "up_proj", "down_proj", "q_proj"],
                             init_lora_weights=False)
    reference = peft.get_peft_model(_tiny_llama(device, 0.0), config)
    ours = copy.deepcopy(reference)
    if mode == "hidden_states":
        reference.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        reference.enable_input_require_grads()
    handle = torch_offload.apply(ours, mode, layer_offloading=True, **({"min_bytes": 0} if mode == "all" else {}))
    tiles = torch_offload.tile_mlp(ours, tile_tokens=100)
    ids = torch.randint(0, 256, (1, 260), device=device)
    for _ in range(2):  # the second step runs on the pooled host copies
        ref, got = _step(reference, ids), _step(ours, ids)
        assert got[1] and all("lora_" in name for name in got[1])
        _assert_same_training(ref, got, [n + "." for n, m in ours.named_modules() if n.endswith(".mlp")])
    assert handle.layers.offloaded_bytes > 0 and handle.layers.stats()["restores"] > 0
    frozen = [p for layer in handle.layers.layers for p in layer.block.parameters() if not p.requires_grad]
    assert frozen and all(p.device.type == "cpu" for p in frozen)  # the blocks' base stays in host memory
    tiles.remove()
    handle.remove()


def test_tiles_compute_with_the_parameters_of_their_forward():
    # The backward recomputes each tile with the tensors the module had when the forward ran, not
    # with what is installed when backward runs (layer offloading and FSDP2 swap them in between).
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))
    mlp[0].weight.requires_grad_(False)
    reference = copy.deepcopy(mlp)
    torch_offload.tile_mlp(None, mlps=[mlp], tile_tokens=4)
    x = torch.randn(2, 10, 8, requires_grad=True)
    out = mlp(x)
    original = mlp[0].weight
    mlp[0]._parameters["weight"] = nn.Parameter(torch.zeros_like(original), requires_grad=False)
    out.sum().backward()
    mlp[0]._parameters["weight"] = original
    x_ref = x.detach().clone().requires_grad_()
    reference(x_ref).sum().backward()
    assert ((x.grad - x_ref.grad).norm() / x_ref.grad.norm()).item() <= TILE_SUM_RTOL
    for name, p in mlp.named_parameters():
        if p.requires_grad:
            q = dict(reference.named_parameters())[name]
            assert ((p.grad - q.grad).norm() / q.grad.norm()).item() <= TILE_SUM_RTOL, name


def test_a_module_returning_more_than_a_tensor_is_refused():
    class TwoOutputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)

        def forward(self, x):
            return self.proj(x), x.sum()

    module = TwoOutputs()
    torch_offload.tile_mlp(None, mlps=[module], tile_tokens=2)
    with pytest.raises(TypeError, match="returned tuple, not one tensor"):
        module(torch.randn(1, 5, 8, requires_grad=True))


def test_a_norm_tiles_without_a_float32_copy_of_the_whole_input():
    # LlamaRMSNorm upcasts to float32 and saves that copy for backward (twice the input's bytes in
    # bf16); tiled, at most one tile's copy exists and only the input is saved.
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    norm = LlamaRMSNorm(64)
    reference = copy.deepcopy(norm)
    assert torch_offload.tiling.tiled_mlp.find_norms([nn.ModuleList([norm])]) == [norm]
    torch_offload.tile_mlp(None, mlps=[norm])
    x = torch.randn(1, 4096, 64, dtype=torch.bfloat16).requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel() * t.element_size()) or t,
                                                  lambda t: t):
        out = norm(x)
    assert max(saved) == x.numel() * x.element_size()  # the input; untiled, a float32 copy of it
    grad = torch.randn_like(out)
    (grad_x,) = torch.autograd.grad(out, x, grad)
    x_ref = x.detach().clone().requires_grad_()
    out_ref = reference(x_ref)
    assert torch.equal(out, out_ref)  # each row as untiled
    torch.testing.assert_close(grad_x, torch.autograd.grad(out_ref, x_ref, grad)[0])


def test_a_compiled_model_trains_tiled():
    # torch.compile runs the tiles' autograd function outside its graphs (Dynamo cannot trace the
    # backward's own autograd.grad: a graph break at each tiled module), with the same gradients.
    torch._dynamo.reset()
    base = _tiny_llama("cpu", 0.0)
    reference = copy.deepcopy(base)
    ours = copy.deepcopy(base)
    torch_offload.tile_mlp(ours, tile_tokens=100)
    compiled = torch.compile(ours, backend="aot_eager")
    ids = torch.randint(0, 256, (1, 300))
    loss, grads = _step(compiled, ids)
    grads = {name.removeprefix("_orig_mod."): grad for name, grad in grads.items()}
    _assert_same_training(_step(reference, ids), (loss, grads), [""])
