"""Named presets of mode="modules" (presets=["qkv", "core_attn", ...]): each selects the expected
modules of Llama, Qwen2 and MoE models (Mixtral, Qwen2-MoE, Qwen3-MoE, built from tiny configs);
training with a preset gives the gradients of plain training and offloads something; "core_attn"
leaves the projections inside self_attn to the hooks outside it."""
import copy

import pytest
import torch
from torch import nn
from transformers import MixtralConfig, MixtralForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

import torch_offload
from python_tests.support.grads import assert_same_grads
from python_tests.support.llama import _freeze_layer_weights, _steps_match_plain, _tiny_llama
from torch_offload.targets.presets import PRESETS, preset_modules
from torch_offload.targets.selection import plan_modules

LAYERS = 2
_SHAPE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
              attn_implementation="sdpa", use_cache=False)
_MOE = dict(num_experts_per_tok=2, moe_intermediate_size=32)


def _tiny(config_class, model_class, **extra):
    torch.manual_seed(0)
    return model_class(config_class(**_SHAPE, **extra)).train()


MODELS = {
    "llama": lambda: _tiny_llama("cpu"),  # 3 layers, dropout 0.1 in attention
    "qwen2": lambda: _tiny(Qwen2Config, Qwen2ForCausalLM),
    "mixtral": lambda: _tiny(MixtralConfig, MixtralForCausalLM, num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": lambda: _tiny(Qwen2MoeConfig, Qwen2MoeForCausalLM, num_experts=4,
                               shared_expert_intermediate_size=64, **_MOE),
    "qwen3_moe": lambda: _tiny(Qwen3MoeConfig, Qwen3MoeForCausalLM, num_experts=4, **_MOE),
}
DENSE_MLP = ["mlp.gate_proj", "mlp.up_proj"]
QKV = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]
OUT = {"out_proj": ["self_attn.o_proj"]}
# Per model and preset: the names selected in each decoder layer (None: selects nothing).
EXPECTED = {
    "llama": {"attn": ["self_attn"], "core_attn": ["self_attn"], "qkv": QKV, **OUT, "mlp": ["mlp"],
              "fc1": DENSE_MLP, "fc2": ["mlp.down_proj"], "moe_router": None, "moe_experts": None},
    "qwen2": {"attn": ["self_attn"], "core_attn": ["self_attn"], "qkv": QKV, **OUT, "mlp": ["mlp"],
              "fc1": DENSE_MLP, "fc2": ["mlp.down_proj"], "moe_router": None, "moe_experts": None},
    "mixtral": {"attn": ["self_attn"], "core_attn": ["self_attn"], "qkv": QKV, **OUT, "mlp": ["mlp"],
                "fc1": None, "fc2": None, "moe_router": ["mlp.gate"], "moe_experts": ["mlp.experts"]},
    "qwen2_moe": {"attn": ["self_attn"], "core_attn": ["self_attn"], "qkv": QKV, **OUT, "mlp": ["mlp"],
                  "fc1": ["mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj"],
                  "fc2": ["mlp.shared_expert.down_proj"],
                  "moe_router": ["mlp.gate"], "moe_experts": ["mlp.experts"]},
    "qwen3_moe": {"attn": ["self_attn"], "core_attn": ["self_attn"], "qkv": QKV, **OUT, "mlp": ["mlp"],
                  "fc1": None, "fc2": None, "moe_router": ["mlp.gate"], "moe_experts": ["mlp.experts"]},
}


def _in_layers(model, suffixes):
    layers = model.config.num_hidden_layers
    return [f"model.layers.{i}.{s}" for i in range(layers) for s in suffixes]


@pytest.mark.parametrize("arch", list(MODELS))
def test_each_preset_selects_the_expected_modules(arch):
    model = MODELS[arch]()
    assert set(EXPECTED[arch]) == set(PRESETS)
    for preset, suffixes in EXPECTED[arch].items():
        if suffixes is None:
            with pytest.raises(ValueError, match=f"preset '{preset}' selects nothing in {type(model).__name__}"):
                torch_offload.select_modules(model, presets=[preset])
            continue
        names = [n for n, _ in torch_offload.select_modules(model, presets=[preset])]
        assert names == _in_layers(model, suffixes), preset
    # core_attn leaves the projections (and Qwen3's q/k norms) out of self_attn
    left_out = QKV + ["self_attn.o_proj"] + (["self_attn.q_norm", "self_attn.k_norm"] if arch == "qwen3_moe" else [])
    assert sorted(preset_modules(model, "core_attn").exclude) == sorted(_in_layers(model, left_out))


def test_core_attn_takes_a_core_submodule_where_there_is_one():
    model = nn.Module()
    model.self_attn = nn.Module()
    model.self_attn.q_proj, model.self_attn.core_attention = nn.Linear(2, 2), nn.Identity()
    assert preset_modules(model, "core_attn") == (["self_attn.core_attention"], [])


def test_presets_combine_with_each_other_and_with_targets():
    model = MODELS["llama"]()
    # qkv puts back what core_attn leaves out of self_attn: only o_proj stays out
    plan = plan_modules(model, presets=["qkv", "core_attn"])
    assert [n for n, _ in plan.selected] == _in_layers(model, ["self_attn"])
    assert [n for n, _ in plan.excluded] == _in_layers(model, ["self_attn.o_proj"])
    # the whole block wins over core_attn's exclusions; a pattern adds to a preset
    plan = plan_modules(model, ["*.layers.0.mlp"], presets=["core_attn", "attn"])
    assert [n for n, _ in plan.selected] == _in_layers(model, ["self_attn"])[:1] + ["model.layers.0.mlp"] \
        + _in_layers(model, ["self_attn"])[1:]
    assert plan.excluded == []


def test_preset_errors_name_what_was_written():
    model = MODELS["llama"]()
    with pytest.raises(ValueError, match="unknown module preset 'qkv_proj'; known presets: core_attn, qkv, out_proj, attn"):
        torch_offload.select_modules(model, presets=["qkv_proj"])
    with pytest.raises(ValueError, match="preset 'moe_router' selects nothing in LlamaForCausalLM"):
        torch_offload.apply(model, "modules", presets=["moe_router"])
    # a preset name written as a pattern: the error says where it goes
    with pytest.raises(ValueError, match=r"'qkv' is a preset: presets=\['qkv'\]"):
        torch_offload.apply(model, "modules", targets=["qkv"])
    # one name is one preset (or one pattern), not a list of its characters
    assert torch_offload.select_modules(model, presets="attn") == torch_offload.select_modules(model, "*.self_attn")
    with pytest.raises(ValueError, match="needs targets=.*and/or presets="):
        torch_offload.apply(model, "modules", presets=[])
    with pytest.raises(TypeError, match="presets is for mode='modules'"):
        torch_offload.apply(model, "all", presets=["qkv"])
    mixtral = MODELS["mixtral"]()
    with pytest.raises(ValueError, match=r"'fc1' selects nothing in MixtralForCausalLM.*presets=\['moe_experts'\]"):
        torch_offload.select_modules(mixtral, presets=["fc1"])


TRAINED = [("llama", p) for p in ("core_attn", "qkv", "attn", "fc1", "mlp")] + [
    ("qwen2", "core_attn"), ("qwen2", "fc1"),
    ("mixtral", "moe_router"), ("mixtral", "moe_experts"), ("mixtral", "core_attn"),
    ("qwen2_moe", "fc1"), ("qwen2_moe", "moe_experts"), ("qwen3_moe", "core_attn"), ("qwen3_moe", "moe_router"),
]


@pytest.mark.parametrize("arch,preset", TRAINED)
def test_training_with_a_preset_matches_plain_training(arch, preset):
    plain = MODELS[arch]()
    ours = copy.deepcopy(plain)
    handle = torch_offload.apply(ours, mode="modules", presets=[preset], min_bytes=0)
    _steps_match_plain(ours, plain, "cpu", steps=1)  # (two steps, reused buffers: test_modules.py)
    stats = handle.stats()
    assert stats["bytes_to_host"] > 0 and stats["saves"] == stats["restores"]
    assert stats["live_handles"] == 0
    assert handle.report()["expected_bytes"] > 0  # the last forward's, still there after backward


def test_core_attn_offloads_less_than_attn_and_qkv_adds_to_it():
    offloaded = {}
    for presets in (["core_attn"], ["attn"], ["qkv", "core_attn"], ["qkv"]):
        model = MODELS["llama"]()
        handle = torch_offload.apply(model, "modules", presets=presets, min_bytes=0)
        ids = torch.randint(0, 256, (2, 32))
        loss = model(input_ids=ids, labels=ids).loss
        offloaded[tuple(presets)] = handle.report()["expected_bytes"]
        loss.backward()
    # qkv adds the projections' input, the normed hidden state. Whether o_proj's input is one more
    # storage depends on the attention kernel (a flash kernel's output is o_proj's input, viewed).
    assert 0 < offloaded[("core_attn",)] < offloaded[("qkv", "core_attn")] <= offloaded[("attn",)]
    assert offloaded[("qkv",)] < offloaded[("qkv", "core_attn")]


class _SavesItsInput(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.w = nn.Parameter(torch.full((width,), 0.5))

    def forward(self, x):
        return x * self.w  # saves x and w


class _Attention(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.q_proj = _SavesItsInput(width)
        self.o_proj = _SavesItsInput(width)

    def forward(self, x):
        q = self.q_proj(x)
        return self.o_proj(torch.sin(q))  # the "core", a function: sin saves q


class _ToyModel(nn.Module):
    def __init__(self, width=4096):
        super().__init__()
        self.self_attn = _Attention(width)

    def forward(self, x):
        return self.self_attn(x).sum()


def _outer_saves(model, x):
    """Saves the caller's own saved-tensor hooks see in one training step."""
    seen = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: seen.append(t.shape) or t, lambda t: t):
        model(x).backward()
    return len(seen)


def test_core_attn_leaves_the_projections_to_the_hooks_outside():
    x = torch.randn(4096)
    plain = _ToyModel()
    ours = copy.deepcopy(plain)
    handle = torch_offload.apply(ours, "modules", presets=["core_attn"], min_bytes=0)
    loss = ours(x)
    assert handle.report() == {"expected_bytes": 4096 * 4, "storages": 1, "freed_bytes": 4096 * 4}  # q only
    loss.backward()
    plain(x).backward()
    assert_same_grads(ours, plain)
    # q_proj's and o_proj's saves (x; sin(q) and w) reach the caller's hooks as without offloading
    assert _outer_saves(plain, x) == 4 and _outer_saves(ours, x) == 3
    with torch.no_grad():  # nothing is offloaded without grad, inside or outside the left-out modules
        ours(x)
    assert handle.stats()["saves"] == 2


def test_core_attn_with_layer_offloading():
    # The frozen weights that q/k/v/o_proj save still go back to the host as layer tokens.
    plain = _freeze_layer_weights(_tiny_llama("cpu", dropout=0.0))
    restores = {}
    for presets in (["attn"], ["core_attn"]):
        ours = copy.deepcopy(plain)
        handle = torch_offload.apply(ours, mode="modules", presets=presets, min_bytes=0, layer_offloading=True)
        _steps_match_plain(ours, plain, "cpu", steps=1)
        assert handle.stats()["saves"] > 0
        restores[presets[0]] = handle.layers.stats()["restores"]
    assert restores["core_attn"] == restores["attn"] > 0
