"""The configuration is the API: apply(model, OffloadConfig(...)) for every mode trains as the keywords
that build the same config do, every entry point takes the same config object, a wrong value names
the field or keyword written, a failed install leaves the model as it was, and the mode names and
their aliases live in one table."""
import ast
import copy
import dataclasses
from pathlib import Path

import pytest
import torch

import torch_offload
from python_tests.support.grads import assert_same_grads
from python_tests.support.llama import _llama_step, _tiny_llama
from torch_offload import (ActivationsOptions, AutoOptions, DiskOptions, HiddenStatesOptions, ModulesOptions,
                           OffloadConfig, SelectiveOptions, SyncOptions)
from torch_offload.config.aliases import ALIASES

PACKAGE = Path(torch_offload.__file__).resolve().parent

# Each mode as a config object, and as the keywords apply() builds the same config from.
MODES = [
    (HiddenStatesOptions(max_in_flight=2), ("hidden_states", {"max_in_flight": 2})),
    (SelectiveOptions(policy="attention+qkv"), ("selective", {"policy": "attention+qkv"})),
    (ActivationsOptions(min_bytes=0), ("all", {"min_bytes": 0})),
    (SyncOptions(min_bytes=0), ("legacy", {"min_bytes": 0})),
    (DiskOptions(min_bytes=0), ("disk", {"min_bytes": 0})),
    (ModulesOptions(targets=("*.self_attn",), min_bytes=0), ("modules", {"targets": ("*.self_attn",), "min_bytes": 0})),
    (AutoOptions(trial_steps=1), ("auto", {"trial_steps": 1})),
]


@pytest.mark.parametrize("options, keywords", MODES, ids=[type(o).__name__ for o, _ in MODES])
def test_a_config_object_trains_as_the_keywords_that_build_it(options, keywords, tmp_path):
    if isinstance(options, DiskOptions):
        options = dataclasses.replace(options, disk_dir=str(tmp_path))
        keywords = (keywords[0], dict(keywords[1], disk_dir=str(tmp_path)))
    by_config, by_keywords = _tiny_llama("cpu", 0.1), _tiny_llama("cpu", 0.1)
    mode, options_as_keywords = keywords
    first = torch_offload.apply(by_config, OffloadConfig(options))
    second = torch_offload.apply(by_keywords, mode, **options_as_keywords)
    assert first.config == second.config and first.config.activations == options
    ids = torch.randint(0, 256, (2, 32))
    for _ in range(5 if isinstance(options, AutoOptions) else 2):  # auto: every trial, then its choice
        for model in (by_config, by_keywords):
            model.zero_grad(set_to_none=True)
        assert torch.equal(_llama_step(by_config, ids, "cpu"), _llama_step(by_keywords, ids, "cpu"))
        assert_same_grads(by_config, by_keywords)
    assert first.manager is None or first.stats()["saves"] > 0  # auto may keep torch's checkpointing
    for handle in (first, second):
        handle.remove()
    assert all("forward" not in module.__dict__ for module in by_config.modules())


def test_a_mode_options_object_and_a_mode_name_are_configs_too():
    model = _tiny_llama("cpu", 0.0)
    handle = torch_offload.apply(model, SelectiveOptions(), layer_offloading=False, chunked_loss=True)
    assert handle.config == OffloadConfig(SelectiveOptions(), layer_offloading=False, chunked_loss=True, tiling=False,
                                          long_context=False)
    assert handle.chunked_loss is not None
    handle.remove()
    assert OffloadConfig("legacy").activations == SyncOptions() and OffloadConfig(True).mode_name == "all"
    assert OffloadConfig().activations == HiddenStatesOptions() and OffloadConfig(None).mode_name is None


def test_every_entry_point_takes_the_same_config(tmp_path):
    from transformers import TrainingArguments

    from torch_offload.integrations import OffloadCallback, gradient_checkpointing_enable

    config = OffloadConfig(SelectiveOptions(policy="attention", min_bytes=0))
    model = _tiny_llama("cpu", 0.0)
    handle = torch_offload.apply(model, config)
    assert handle.config.activations == config.activations and isinstance(handle.manager, torch.ScriptObject)
    handle.remove()

    callback = OffloadCallback(config)
    assert callback.config == config
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    callback.on_train_begin(args, None, None, model=model)
    assert callback.handle.config.activations == config.activations and len(callback.handle.blocks) == 3
    callback.on_train_end(args, None, None)

    handle = gradient_checkpointing_enable(model, config)
    assert handle.config.activations == config.activations
    assert model.model.layers[0]._gradient_checkpointing_func.keywords["min_bytes"] == 0
    _llama_step(model, torch.randint(0, 256, (2, 32)), "cpu")
    assert handle.stats()["saves"] > 0
    handle.remove()

    compiled = torch_offload.compile(model, config, backend="aot_eager")
    assert compiled.offload_partitioner.mode == "selective" and compiled.offload_partitioner.min_bytes == 0
    compiled.offload_changes.remove()


def test_entry_points_refuse_what_they_cannot_run_from_a_config():
    from torch_offload.integrations import gradient_checkpointing_enable

    model = _tiny_llama("cpu", 0.0)
    with pytest.raises(TypeError, match=r"compile: the config turns on layer_offloading"):
        torch_offload.compile(model, OffloadConfig(layer_offloading=True))
    with pytest.raises(TypeError, match=r"compile: HiddenStatesOptions sets max_in_flight, which compiled graphs"):
        torch_offload.compile(model, HiddenStatesOptions(max_in_flight=2))
    with pytest.raises(TypeError, match=r"compile: AutoOptions is not one of the modes compiled graphs offload"):
        torch_offload.compile(model, AutoOptions())
    with pytest.raises(ValueError, match=r"ActivationsOptions offloads saved activations and recomputes nothing"):
        gradient_checkpointing_enable(model, ActivationsOptions())
    with pytest.raises(TypeError, match=r"beside a config object"):
        torch_offload.apply(model, OffloadConfig(), min_bytes=0)
    with pytest.raises(TypeError, match=r"beside a config object"):
        torch_offload.apply(model, OffloadConfig(), chunked_loss=True)
    with pytest.raises(TypeError, match=r"got the mode twice"):
        torch_offload.apply(model, "all", mode="sync")
    assert all("forward" not in module.__dict__ for module in model.modules())


def test_wrong_values_name_the_field_or_keyword():
    with pytest.raises(TypeError, match=r"^max_in_flight=2\.5; expected an int >= 0"):
        HiddenStatesOptions(max_in_flight=2.5)
    with pytest.raises(ValueError, match=r"^chunk_tokens=0; expected an int >= 1"):
        OffloadConfig(chunked_loss=0)
    with pytest.raises(TypeError, match=r"activations='everything': unknown mode 'everything'"):
        OffloadConfig("everything")
    with pytest.raises(TypeError, match=r"activations=<object"):
        OffloadConfig(object())
    with pytest.raises(ValueError, match=r"disk_dir='/tmp/a\\x00b' contains a NUL character"):
        ActivationsOptions(disk_dir="/tmp/a\0b")
    model = _tiny_llama("cpu", 0.0)
    # Built from keywords, the error starts with the call as written.
    with pytest.raises(ValueError, match=r"^torch_offload.apply\(mode='sync'\): keep_on_device_bytes='auto' sizes"):
        torch_offload.apply(model, "sync", keep_on_device_bytes="auto")
    with pytest.raises(ValueError, match=r"^torch_offload.apply\(\): chunked_loss='yes'; expected True, False"):
        torch_offload.apply(model, chunked_loss="yes")
    with pytest.raises(ValueError, match=r"^torch_offload.apply\(SelectiveOptions\(\.\.\.\)\): block_policies has 1 "
                                         r"entries for 3 blocks"):
        torch_offload.apply(model, SelectiveOptions(block_policies=["attention"]))


def test_a_failed_install_leaves_the_model_as_it_was():
    model = _tiny_llama("cpu", 0.0)
    for name, p in model.named_parameters():
        p.requires_grad_("norm" in name)  # a frozen base for layer offloading
    before = copy.deepcopy(model.state_dict())
    loss_function = model.loss_function
    # Chunked loss, layer offloading and the tiling install before the activation mode, which fails.
    with pytest.raises(ValueError, match="block_policies has 1 entries"):
        torch_offload.apply(model, "selective", block_policies=["attention"], layer_offloading=True, chunked_loss=True,
                            tiling=True)
    assert all("forward" not in module.__dict__ for module in model.modules())
    assert not model._forward_pre_hooks and not model._forward_hooks
    assert model.loss_function == loss_function
    assert all(p.device.type == "cpu" and not p.is_pinned() for p in model.parameters())
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_remove_undoes_every_part_in_reverse_and_twice_is_harmless():
    model = _tiny_llama("cpu", 0.0)
    for name, p in model.named_parameters():
        p.requires_grad_("norm" in name)
    model.config.use_cache = True
    with pytest.warns(UserWarning, match="use_cache=False"):
        handle = torch_offload.apply(model, "hidden_states", layer_offloading=True, chunked_loss=True, tiling=True)
    assert handle.layers and handle.chunked_loss and handle.tiled_mlp and handle.tiled_norms
    assert model.config.use_cache is False
    handle.remove()
    handle.remove()
    assert model.config.use_cache is True
    assert all("forward" not in module.__dict__ for module in model.modules())
    assert handle.layers is None and handle.chunked_loss is None


def test_one_block_in_mode_all_says_nothing_would_be_offloaded():
    model = _tiny_llama("cpu", 0.0)
    with pytest.warns(torch_offload.NothingOffloadedWarning, match=r"mode='all'\): the model has one block"):
        handle = torch_offload.apply(model, "all", blocks=[model.model.layers[0]])
    handle.remove()


def _string_constants(path: Path):
    """The string constants of a module that are not docstrings."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_each_mode_alias_is_defined_once():
    aliases = [alias for alias in ALIASES if isinstance(alias, str)]
    found = {alias: [] for alias in aliases}
    for path in PACKAGE.rglob("*.py"):
        for value in _string_constants(path):
            if value in found:
                found[value].append(path.relative_to(PACKAGE).as_posix())
    assert found == {alias: ["config/aliases.py"] for alias in aliases}


def test_no_table_keyed_by_mode_names_besides_the_registry():
    # A dict literal keyed by two or more mode names would be a second registry of modes.
    names = set(torch_offload.config.mode_options.OPTIONS_BY_NAME)
    tables = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                if len(keys & names) >= 2:
                    tables.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert tables == []
