"""The package's public names and the shape of its tree: every public name imports from
torch_offload, no two modules share a name, import chains stay short, and mode "auto" composes the
other modes' wrappers without importing their modules."""
import ast
import dataclasses
import functools
from pathlib import Path

import pytest

import torch_offload

PACKAGE = Path(torch_offload.__file__).resolve().parent
PUBLIC = [
    "ActivationsOptions", "AutoOptions", "ChunkedLossOptions", "DiskOptions", "HiddenStatesOptions",
    "LayerOffloadingOptions", "LongContextOptions", "ModulesOptions", "OffloadConfig", "SelectiveOptions",
    "SyncOptions", "TilingOptions",
    "ChunkedLossHandle", "LayerOffloadHandle", "ModuleOffloadHandle", "NothingOffloadedWarning", "OffloadHandle",
    "OffloadManager", "OffloadPartitioner", "apply", "checkpoint", "chunk_lm_loss", "chunked_causal_lm_loss",
    "compile", "default_manager", "detach_logits", "find_blocks", "gather_stats", "library_path",
    "offload_activations", "offload_layers", "offload_modules", "offload_restore", "offload_save", "reset_stats",
    "sdpa_is_causal", "select_modules", "selective_checkpoint", "selective_offload_contexts", "stats",
    "TiledMLPHandle", "tile_mlp", "tiled_compute",
]
# Modules in the longest chain of imports inside the package: the package, the front door (apply),
# its installer, a mode, and the checkpoint it runs down to the engine's glue.
MAX_CHAIN = 8


def test_every_public_name_imports_from_the_package():
    assert sorted(torch_offload.__all__) == sorted(PUBLIC)
    for name in PUBLIC:
        assert getattr(torch_offload, name) is not None, name
    from torch_offload.integrations import OffloadCallback, apply_prepared, enable, from_config  # noqa: F401
    from torch_offload.modes import (ActivationsOptions, AutoOptions, HiddenStatesOptions, ModulesOptions,  # noqa: F401
                                     SelectiveOptions)
    from torch_offload.policies import attention, attention_save  # noqa: F401
    assert callable(torch_offload.checkpoint) and callable(torch_offload.compile)  # not shadowed by subpackages


def _modules():
    """module name -> path, for every module of the package."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(modules: dict) -> dict:
    """module -> the package's modules it imports (explicitly, at any depth of its code)."""
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def test_module_names_are_unique():
    names = {}
    for name in _modules():
        leaf = name.rpartition(".")[2]
        if leaf not in ("__main__",) and name != "torch_offload":
            names.setdefault(leaf, []).append(name)
    assert {k: v for k, v in names.items() if len(v) > 1} == {}


def test_import_chains_are_short_and_acyclic():
    graph = _imports(_modules())

    @functools.lru_cache(maxsize=None)
    def longest(name, path=()):
        """The longest chain of imports from `name` (a tuple of modules, `name` first)."""
        assert name not in path, f"import cycle: {' -> '.join(path + (name,))}"
        below = [longest(dep, path + (name,)) for dep in graph[name]]
        return (name,) + max(below, key=len, default=())

    chain = max((longest(name) for name in graph), key=len)
    assert len(chain) <= MAX_CHAIN, " -> ".join(chain)


def test_auto_composes_the_modes_without_importing_them():
    graph = _imports(_modules())
    auto = [name for name in graph if name.startswith("torch_offload.modes.auto")]
    others = {f"torch_offload.modes.{mode}" for mode in ("hidden_states", "selective", "activations", "modules")}
    assert auto and all(not (graph[name] & others) for name in auto), {name: graph[name] & others for name in auto}


@pytest.mark.parametrize("options", ["HiddenStatesOptions", "SelectiveOptions", "ActivationsOptions", "SyncOptions",
                                     "DiskOptions", "ModulesOptions", "AutoOptions", "LayerOffloadingOptions",
                                     "ChunkedLossOptions", "TilingOptions", "LongContextOptions", "OffloadConfig"])
def test_each_option_class_is_frozen_and_documented(options):
    cls = getattr(torch_offload, options)
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
    documented = "".join(c.__doc__ or "" for c in cls.__mro__)
    for field in dataclasses.fields(cls):
        assert field.name in documented, f"{options}.{field.name} is not documented"
