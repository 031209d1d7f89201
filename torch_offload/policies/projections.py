"""The named selective policies' projection groups: "attention+<group>+..." names the products of a
block's Linear modules that are offloaded beside the attention outputs ("keep_<group>": kept on the
device instead), by module preset (targets/presets.py).

PROJECTION_GROUPS: "qkv" the query/key/value projections, "out_proj" the attention's output
projection, "fc1" the MLP's up/gate projections, "fc2" its down projection; "attention_qkv" is
"attention+qkv". The products worth moving are those whose recompute costs most per byte: a
Linear's costs 2 x in_features FLOPs per output element, so the MLP's down projection (in_features =
the MLP width) pays most after the attention itself. The MLP's up/gate products are too large for
the link to carry in the time their recompute takes, but where the memory budget leaves room (the
last blocks of a large model, whose backward comes before most gradients exist) keeping them spares
that recompute at a third of the memory of not checkpointing the block at all (mode="auto" plans it).
"""
import functools
import weakref

from torch import nn

from ..targets.presets import PRESETS, preset_modules
from .named_policies import SAVES_PER_BLOCK

PROJECTION_GROUPS = ("qkv", "out_proj", "fc1", "fc2")
KEEP = "keep_"  # "keep_fc1": the group's products stay on the device (not offloaded, not recomputed)
_ALIASES = {"attention_qkv": "attention+qkv"}
# block -> {group: weak references to its Linear modules}. Weak values too: a strong reference to a
# block's submodule would keep the block, the key, alive, and with it the whole model.
_projections = weakref.WeakKeyDictionary()


def projection_groups(policy):
    """The projection groups of a named policy ("attention": none; "attention+fc2+out_proj": fc2,
    out_proj), or None when `policy` is not such a name. Raises ValueError for an unknown group."""
    if not isinstance(policy, str):
        return None
    return _parse_named(policy)


@functools.lru_cache(maxsize=256)  # asked on every checkpointed call: parse each name once
def _parse_named(policy: str):
    head, *groups = _ALIASES.get(policy, policy).split("+")
    if head != "attention" or (policy != "attention" and not groups):
        return None
    bases = [_base_group(g) for g in groups]
    unknown = [g for g in bases if g not in PROJECTION_GROUPS]
    if unknown or len(set(bases)) != len(bases):
        raise ValueError(f"torch_offload selective policy={policy!r}: after 'attention', join with '+' distinct "
                         f"projection groups among {PROJECTION_GROUPS}, each offloaded or, prefixed {KEEP!r}, kept "
                         "on the device (e.g. 'attention+fc2+out_proj', 'attention+qkv+keep_fc1')")
    return tuple(groups)


def _base_group(group: str) -> str:
    """The module preset a group names: "keep_fc1" -> "fc1"."""
    return group[len(KEEP):] if group.startswith(KEEP) else group


def split_kept(groups) -> tuple:
    """(offloaded groups, kept groups without their prefix) of projection_groups' answer."""
    groups = groups or ()
    return (tuple(g for g in groups if not g.startswith(KEEP)),
            tuple(_base_group(g) for g in groups if g.startswith(KEEP)))


def is_fast_policy(policy) -> bool:
    return projection_groups(policy) is not None


def projection_weights(block: nn.Module, groups=("qkv",)) -> tuple:
    """The weights of the Linear modules of `groups` (module presets) in `block`, read now (FSDP2
    swaps a module's parameters between sharded and unsharded ones)."""
    found = _projections.setdefault(block, {})
    weights = []
    for group in map(_base_group, groups):
        modules = [module() for module in found.get(group, ())]
        if not modules or None in modules:  # not looked up yet, or a module since replaced
            try:
                names = preset_modules(block, group).include
            except ValueError:  # selects nothing
                names = []
            modules = [m for name in names for m in block.get_submodule(name).modules() if isinstance(m, nn.Linear)]
            if not modules:
                raise ValueError(f"torch_offload selective policy with {group!r}: {type(block).__name__} has no "
                                 f"Linear modules in module preset {group!r} ({PRESETS[group][0]}); "
                                 "leave the group out of the policy (or use policy='attention')")
            found[group] = tuple(map(weakref.ref, modules))
        weights.extend(module.weight for module in modules)
    return tuple(weights)


def saves_per_block(policy, block: nn.Module) -> int:
    """Tensors one block saves under a named policy: the prefetch depth that keeps backward from
    waiting on each copy."""
    groups = projection_groups(policy)
    projection_weights(block, groups)  # raises for a group the block lacks, kept ones too
    return SAVES_PER_BLOCK + len(projection_weights(block, split_kept(groups)[0]))
