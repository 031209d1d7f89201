"""find_blocks: the repeated blocks of every architecture in model_zoo, PEFT-wrapped too, both stacks
of a model with two, in the order they run; the ModuleList rule for models no library marks; an
error naming the model where there are none."""
import pytest
import torch
from torch import nn

import torch_offload
from python_tests.support.model_zoo import ARCHITECTURES, loss

pytest.importorskip("peft")
pytest.importorskip("diffusers")

BUILD = {arch.name: arch.build for arch in ARCHITECTURES}
EXPECTED = {
    "Llama": ["model.layers.0", "model.layers.1"],
    "GPT-2": ["transformer.h.0", "transformer.h.1"],
    "Qwen2.5-VL": ["model.visual.blocks.0", "model.visual.blocks.1", "model.language_model.layers.0",
                   "model.language_model.layers.1"],
    "BERT": ["bert.encoder.layer.0", "bert.encoder.layer.1"],
    "T5": ["encoder.block.0", "encoder.block.1", "decoder.block.0", "decoder.block.1"],
    "Flux": ["transformer_blocks.0", "transformer_blocks.1", "single_transformer_blocks.0",
             "single_transformer_blocks.1"],
    "Wan": ["blocks.0", "blocks.1"],
}


def _names(model, blocks) -> list:
    names = {id(module): name for name, module in model.named_modules()}
    return [names[id(block)] for block in blocks]


@pytest.mark.parametrize("name", list(EXPECTED))
def test_the_blocks_of_each_architecture(name):
    model, _ = BUILD[name]()
    assert _names(model, torch_offload.find_blocks(model)) == EXPECTED[name]


@pytest.mark.parametrize("arch", ARCHITECTURES, ids=[arch.name for arch in ARCHITECTURES])
def test_the_blocks_are_listed_in_the_order_they_run(arch):
    # Layer offloading prefetches the next block in this order; "all" leaves the last one's saves.
    model, batch = arch.build()
    blocks = torch_offload.find_blocks(model)
    ran = []
    hooks = [block.register_forward_pre_hook(lambda block, args: ran.append(block)) for block in blocks]
    with torch.no_grad():
        loss(model, batch)
    for hook in hooks:
        hook.remove()
    assert len(blocks) >= 2 and [id(b) for b in ran] == [id(b) for b in blocks]


@pytest.mark.parametrize("name", ["T5", "Qwen2.5-VL", "Flux"])
def test_peft_wrapped_models_have_the_same_blocks(name):
    import peft
    model, _ = BUILD[name]()
    blocks = torch_offload.find_blocks(model)
    targets = ["to_q", "to_v"] if name == "Flux" else "all-linear"
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=targets))
    assert [id(b) for b in torch_offload.find_blocks(wrapped)] == [id(b) for b in blocks]


def test_diffusers_adapters_in_place_keep_the_blocks():
    import peft
    model, _ = BUILD["Flux"]()
    model.add_adapter(peft.LoraConfig(r=4, target_modules=["to_q", "to_v"]))
    assert _names(model, torch_offload.find_blocks(model)) == EXPECTED["Flux"]


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention, self.mlp = nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))

    def forward(self, x):
        return x + self.mlp(x + self.attention(x))


class _Unmarked(nn.Module):
    """No library marks these blocks: found by the ModuleList rule."""

    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])  # no submodules: not blocks
        self.encoder = nn.ModuleList([_Block() for _ in range(2)])
        self.mixed = nn.ModuleList([_Block(), nn.ModuleList([_Block(), _Block()])])  # not looked into
        self.decoder = nn.ModuleList([_Block() for _ in range(3)])


def test_module_lists_of_repeated_blocks_when_no_library_marks_them():
    model = _Unmarked()
    expected = [f"encoder.{i}" for i in range(2)] + [f"decoder.{i}" for i in range(3)]
    assert _names(model, torch_offload.find_blocks(model)) == expected


class _Declared(nn.Module):
    """A model naming its block class in _repeated_blocks (diffusers' convention) finds them even
    outside a ModuleList, and only them."""

    _repeated_blocks = ["_Block"]

    def __init__(self):
        super().__init__()
        self.first, self.others = _Block(), nn.ModuleList([nn.Sequential(nn.Linear(4, 4), nn.GELU()) for _ in range(2)])
        self.last = _Block()


def test_blocks_a_model_declares_repeated():
    model = _Declared()
    assert _names(model, torch_offload.find_blocks(model)) == ["first", "last"]


def test_no_blocks_is_an_error_naming_the_model_and_blocks():
    with pytest.raises(ValueError, match=r"could not find the blocks of Sequential.*pass them explicitly with blocks="):
        torch_offload.find_blocks(nn.Sequential(nn.Linear(2, 2), nn.ModuleList([nn.Linear(2, 2)] * 2)))
