"""The support matrix: every architecture of model_zoo.ARCHITECTURES under every configuration of
CONFIGURATIONS, one test per cell, on tiny fp32 models on the CPU.

A cell passes when apply() either refuses the configuration with an error of ours (ValueError,
TypeError or NotImplementedError starting with "torch_offload"), or trains two steps whose losses and
fp32 gradients equal, bit for bit, those of the same model under its own gradient checkpointing
(transformers' gradient_checkpointing_enable, diffusers' enable_gradient_checkpointing: torch's
non-reentrant checkpoint of every block), having offloaded something. Then its outcome ("exact",
the long_context parts handle.explain() reports off, or the refusal) must be what
docs/reference/support-matrix.md shows. The document is this test's output: regenerate it with

    TORCH_OFFLOAD_WRITE_SUPPORT_MATRIX=1 python -m pytest python_tests/models/test_support_matrix.py -p no:cacheprovider

(cells left out by -k keep what the document says). Adding an architecture is one line in
model_zoo.ARCHITECTURES, then the command above.
"""
import copy
import os
import warnings
from pathlib import Path

import pytest
import torch

import torch_offload
from python_tests.support.grads import assert_same_grads
from python_tests.support.model_zoo import ARCHITECTURES, enable_own_checkpointing, is_diffusers, loss

pytest.importorskip("peft")
pytest.importorskip("diffusers")

DOC = Path(__file__).resolve().parents[2] / "docs" / "reference" / "support-matrix.md"
WRITE = os.environ.get("TORCH_OFFLOAD_WRITE_SUPPORT_MATRIX") == "1"
REGENERATE = "TORCH_OFFLOAD_WRITE_SUPPORT_MATRIX=1 python -m pytest python_tests/models/test_support_matrix.py -p no:cacheprovider"
STEPS = 2  # the second runs on the engine's reused buffers

# Column -> (LoRA adapters?, apply() keywords, the reference: the model's own gradient checkpointing,
# or plain training where nothing is recomputed: checkpointing's recompute in backward can change
# the order in which a tied weight's gradients add up, GPT-2's embedding's). min_bytes=0: the tiny
# models' activations are far below the default thresholds, and a cell must offload something.
CONFIGURATIONS = {
    "hidden_states": (False, {"mode": "hidden_states"}, "checkpointing"),
    "selective": (False, {"mode": "selective", "min_bytes": 0}, "checkpointing"),
    "all": (False, {"mode": "all", "min_bytes": 0}, "plain"),
    "long_context=True": (False, {"long_context": True}, "checkpointing"),
    "LoRA + hidden_states": (True, {"mode": "hidden_states"}, "checkpointing"),
    "LoRA + hidden_states + layer offloading": (True, {"mode": "hidden_states", "layer_offloading": True},
                                                "checkpointing"),
}
# long_context parts that the configuration, not the model, turns off (full-parameter training has
# no frozen weights to offload): not shown.
_NOT_SHOWN_OFF = {"layer offloading"}


def _with_lora(model, arch):
    """PEFT LoRA adapters (r=4, no dropout, lora_B non-zero so that every adapter weight gets a
    gradient): a diffusers model takes them in place (add_adapter, as diffusers' trainers do), a
    transformers model is wrapped (get_peft_model)."""
    import peft
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=arch.lora_targets)
    with warnings.catch_warnings():  # PEFT's notes on GPT-2's Conv1D and on MoE experts' patterns
        warnings.simplefilter("ignore")
        if is_diffusers(model):
            model.add_adapter(config)
        else:
            model = peft.get_peft_model(model, config)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.02)
    return model


def _parts_off(handle) -> list:
    """The long_context parts handle.explain() reports off (its table: | part | chosen | why |)."""
    rows = [line.split("|")[1:-1] for line in handle.explain().splitlines() if line.startswith("| ")]
    return [part.strip() for part, chosen, _ in rows[1:] if chosen.strip() == "off"
            and part.strip() not in _NOT_SHOWN_OFF]


def _refusal(error: Exception) -> str:
    first = str(error).split("; ")[0].split(". ")[0]
    return f"refused: {type(error).__name__}: {first}".replace("|", "/")


def measure(arch, config: str):
    """(the outcome of one cell, the model's class name); fails (AssertionError, or the error raised)
    where there is no outcome."""
    lora, keywords, reference_runs = CONFIGURATIONS[config]
    model, batch = arch.build()
    model_class = type(model).__name__
    if lora:
        model = _with_lora(model, arch)
    reference = copy.deepcopy(model)
    if reference_runs == "checkpointing":
        enable_own_checkpointing(reference)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*use_cache=False")
            handle = torch_offload.apply(model, **keywords)
    except (ValueError, TypeError, NotImplementedError) as error:
        if not str(error).startswith("torch_offload"):
            raise
        return _refusal(error), model_class
    try:
        for step in range(STEPS):
            for m in (model, reference):
                m.zero_grad(set_to_none=True)
            torch.manual_seed(step)  # dropout: the same masks in both
            ours = loss(model, batch)
            ours.backward()
            torch.manual_seed(step)
            expected = loss(reference, batch)
            expected.backward()
            assert torch.equal(ours, expected), f"step {step}: loss {ours.item()} != {expected.item()}"
            assert_same_grads(model, reference)
        stats, blocks = handle.stats(), len(torch_offload.find_blocks(model))
        # At least a tensor per block (both stacks counted) per step: in the modes that offload each
        # block's input, a stack left unwrapped falls short.
        assert stats["saves"] >= STEPS * blocks and stats["live_handles"] == 0, (blocks, stats)
        if handle.layers is not None:
            assert handle.layers.stats()["bytes_to_device"] > 0
        off = _parts_off(handle) if keywords.get("long_context") else []
    finally:
        handle.remove()
    return "exact" + (f" ({', '.join(off)} off)" if off else ""), model_class


def documented() -> dict:
    """The document's table: {architecture: {column: cell}}, with the columns "family" and "model"."""
    if not DOC.exists():
        return {}
    lines = DOC.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("| architecture |")), None)
    if start is None:
        return {}
    lines = [line for line in lines[start:] if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].split("|")[1:-1]]
    table = {}
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        table[cells[0]] = dict(zip(header[1:], cells[1:]))
    return table


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: a second thread only waits (and spins) on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def measured():
    """{(architecture, column): outcome} and {architecture: model class} of the cells run; with
    TORCH_OFFLOAD_WRITE_SUPPORT_MATRIX=1 written to the document once the module's tests ran."""
    cells, classes = {}, {}
    yield cells, classes
    if WRITE:
        DOC.write_text(render(cells, classes, documented()))


@pytest.mark.parametrize("config", list(CONFIGURATIONS))
@pytest.mark.parametrize("arch", ARCHITECTURES, ids=[arch.name for arch in ARCHITECTURES])
def test_cell(arch, config, measured):
    cells, classes = measured
    outcome, classes[arch.name] = measure(arch, config)
    cells[(arch.name, config)] = outcome
    if WRITE:
        return
    shown = documented().get(arch.name, {}).get(config)
    assert shown == outcome, (f"{DOC.name} shows {shown!r} for {arch.name} under {config}, measured {outcome!r}. "
                              f"If the measured outcome is right, regenerate the document: {REGENERATE}")


def test_document_lists_every_architecture_and_configuration():
    if WRITE:
        pytest.skip("the document is being written")
    table = documented()
    assert list(table) == [arch.name for arch in ARCHITECTURES], f"regenerate {DOC.name}: {REGENERATE}"
    for name, row in table.items():
        assert list(row) == ["family", "model"] + list(CONFIGURATIONS), f"{name}: regenerate: {REGENERATE}"


def render(cells: dict, classes: dict, old: dict) -> str:
    """The document: the legend and the table, measured cells over what `old` showed."""
    columns = list(CONFIGURATIONS)
    rows = ["| architecture | family | model | " + " | ".join(columns) + " |",
            "|" + "---|" * (3 + len(columns))]
    for arch in ARCHITECTURES:
        shown = old.get(arch.name, {})
        row = [arch.name, arch.family, classes.get(arch.name, shown.get("model", "?"))]
        row += [cells.get((arch.name, column), shown.get(column, "not measured")) for column in columns]
        rows.append("| " + " | ".join(row) + " |")
    return _LEGEND.format(table="\n".join(rows), command=REGENERATE)


_LEGEND = """# Support matrix

What `torch_offload.apply` does on the architectures users train, by configuration. Every cell is
measured by `python_tests/models/test_support_matrix.py` in CI, on a tiny random model of the architecture
(2 blocks per stack, width 32, 16 tokens, fp32, the library's default dropout, CPU): two training
steps under the configuration against two steps of the same model under its own gradient
checkpointing (transformers' `gradient_checkpointing_enable`, diffusers'
`enable_gradient_checkpointing`: torch's non-reentrant checkpoint of every block), or, for `all`,
which recomputes nothing, plain training.

- **exact**: the losses and every parameter's gradient are equal bit for bit, and each step
  offloaded at least as many tensors as the model has blocks (both stacks counted).
- **exact (... off)**: with `long_context=True`, the parts `handle.explain()` reports off for this
  model, each with its reason there: the chunked loss is a causal LM's whose logits reach the loss
  unchanged (not a masked LM's, an encoder-decoder's, soft-capped logits' or a diffusers model's
  loss); the tiled MLP needs an MLP module in the blocks (`mlp`, `feed_forward`, `ffn`), the tiled
  norms RMSNorm or LayerNorm children of the blocks. Layer offloading, off in every cell of that
  column (full-parameter training has no frozen weights), is not shown.
- **refused**: `apply` raises an error naming why; nothing was changed.

The blocks are found by `torch_offload.find_blocks` (no `blocks=`): the layers the model's own
gradient checkpointing checkpoints (an encoder's and a decoder's, a vision tower's and a language
model's), a diffusers model's declared repeated blocks (Flux's double- and single-stream blocks).

| column | `apply` keywords |
|---|---|
| hidden_states | `mode="hidden_states"` |
| selective | `mode="selective", min_bytes=0` |
| all | `mode="all", min_bytes=0` |
| long_context=True | `long_context=True` |
| LoRA + hidden_states | `mode="hidden_states"` on a PEFT LoRA model (r=4; all linear layers of a transformers model, MoE experts included; attention projections of a diffusers model) |
| LoRA + hidden_states + layer offloading | the same with `layer_offloading=True` |

`min_bytes=0` because the tiny models' activations are below the default thresholds.

<!-- Generated by python_tests/models/test_support_matrix.py; to update after a change, run:
{command} -->

{table}
"""
