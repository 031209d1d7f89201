"""Megatron-style named presets for mode="modules": a preset name -> the submodules it selects in a
given model (and, for "core_attn", the submodules inside those that it leaves out).

Presets go by the module names of Hugging Face decoder models (Llama, Qwen2, Mistral, Mixtral,
Qwen2-MoE, Qwen3-MoE and similar, PEFT-wrapped too): a module is recognised by the last part of
its qualified name ("model.layers.0.self_attn" is an attention block), so that no model class has
to be listed here.

Hugging Face computes the attention core (SDPA, eager softmax and dropout, flash attention) in a
function that self_attn calls, not in a submodule. Where no core submodule exists, "core_attn" is
self_attn with its projections and q/k norms left out: what it offloads is what self_attn saves
between them (RoPE's cos/sin, the attention function's query, key, value, output and logsumexp).
"""
from typing import Callable, Dict, List, NamedTuple, Set, Tuple

from torch import nn

ATTENTION = ("self_attn", "self_attention", "attention", "attn")
# Inside an attention block: a submodule that computes the attention core itself.
CORE_ATTENTION = ("core_attention", "core_attn", "inner_attn", "attn")
QKV = ("q_proj", "k_proj", "v_proj", "qkv_proj", "query_key_value", "c_attn", "Wqkv", "wqkv", "qkv",
       "query", "key", "value", "wq", "wk", "wv", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj")
OUT_PROJ = ("o_proj", "out_proj", "c_proj", "dense", "wo")
QK_NORMS = ("q_norm", "k_norm", "q_layernorm", "k_layernorm", "q_a_layernorm", "kv_a_layernorm")
MLP = ("mlp", "block_sparse_moe", "feed_forward", "ffn")
FC1 = ("gate_proj", "up_proj", "gate_up_proj", "fc1", "c_fc", "w1", "w3", "dense_h_to_4h")
FC2 = ("down_proj", "fc2", "c_proj", "w2", "dense_4h_to_h")
EXPERTS = ("experts",)
ROUTER = ("gate", "router")  # a child of a block that also has "experts"


class PresetModules(NamedTuple):
    include: List[str]  # qualified names of the modules the preset selects
    exclude: List[str]  # modules inside those that stay unselected


def _leaf(name: str) -> str:
    return name.rpartition(".")[2]


def _parent(name: str) -> str:
    return name.rpartition(".")[0]


def _ancestors(name: str):
    parts = name.split(".")
    return (".".join(parts[:i]) for i in range(1, len(parts)))


def _outermost(names: List[str]) -> List[str]:
    """`names` (in named_modules order) without those inside another one of them."""
    kept: Set[str] = set()
    for name in names:
        if not any(a in kept for a in _ancestors(name)):
            kept.add(name)
    return [n for n in names if n in kept]


def _named(model: nn.Module, leaves) -> List[str]:
    return _outermost([n for n, _ in model.named_modules() if n and _leaf(n) in leaves])


def _inside(model: nn.Module, blocks: List[str], leaves) -> List[str]:
    """Outermost modules named one of `leaves` below one of `blocks`."""
    blocks = set(blocks)
    return _outermost([n for n, _ in model.named_modules()
                       if _leaf(n) in leaves and any(a in blocks for a in _ancestors(n))])


def _attn(model):
    return PresetModules(_named(model, ATTENTION), [])


def _qkv(model):
    return PresetModules(_inside(model, _named(model, ATTENTION), QKV), [])


def _core_attn(model):
    blocks = _named(model, ATTENTION)
    cores = _inside(model, blocks, CORE_ATTENTION)
    with_core = {a for core in cores for a in _ancestors(core)}
    plain = [b for b in blocks if b not in with_core]  # the core is a function: leave the rest out
    order = {n: i for i, (n, _) in enumerate(model.named_modules())}
    return PresetModules(sorted(cores + plain, key=order.get), _inside(model, plain, QKV + OUT_PROJ + QK_NORMS))


def _out_proj(model):
    return PresetModules(_inside(model, _named(model, ATTENTION), OUT_PROJ), [])


def _fc2(model):
    return PresetModules(_inside(model, _named(model, MLP), FC2), [])


def _mlp(model):
    return PresetModules(_named(model, MLP), [])


def _fc1(model):
    return PresetModules(_inside(model, _named(model, MLP), FC1), [])


def _moe_router(model):
    moe = {_parent(n) for n in _moe_experts(model).include}
    return PresetModules([n for n, _ in model.named_modules() if _leaf(n) in ROUTER and _parent(n) in moe], [])


def _moe_experts(model):
    return PresetModules(_named(model, EXPERTS), [])


# name -> (what it selects, in words for errors and the README; how to find it)
PRESETS: Dict[str, Tuple[str, Callable[[nn.Module], PresetModules]]] = {
    "core_attn": ("the attention core: a core submodule of the attention block if it has one, else the "
                  "attention block without its q/k/v/output projections and q/k norms", _core_attn),
    "qkv": ("the q/k/v projections (or a fused qkv projection) inside an attention block (%s)" % ", ".join(QKV),
            _qkv),
    "out_proj": ("the output projection inside an attention block (%s)" % ", ".join(OUT_PROJ), _out_proj),
    "attn": ("the whole attention block (a module named %s)" % ", ".join(ATTENTION), _attn),
    "fc1": ("the up/gate projections inside an MLP block (%s)" % ", ".join(FC1), _fc1),
    "fc2": ("the down projection inside an MLP block (%s)" % ", ".join(FC2), _fc2),
    "mlp": ("the whole MLP or MoE block (a module named %s)" % ", ".join(MLP), _mlp),
    "moe_router": ("the router of an MoE block (a module named gate or router beside one named experts)",
                   _moe_router),
    "moe_experts": ("the routed experts of an MoE block (a module named experts)", _moe_experts),
}


def preset_modules(model: nn.Module, preset: str) -> PresetModules:
    """The qualified names the preset selects in `model` (and leaves out inside them). Raises
    ValueError for an unknown preset or one that selects nothing in this model."""
    if not isinstance(preset, str) or preset not in PRESETS:
        raise ValueError(f"torch_offload: unknown module preset {preset!r}; known presets: {', '.join(PRESETS)}")
    what, find = PRESETS[preset]
    found = find(model)
    if not found.include:
        hint = ""
        if preset == "fc1" and _moe_experts(model).include:
            hint = ("; this model's experts hold their up/gate projections as parameters of one module, "
                    "not as submodules: presets=['moe_experts'] selects them")
        raise ValueError(f"torch_offload: preset {preset!r} selects nothing in {type(model).__name__} "
                         f"(it looks for {what}){hint}")
    return found
